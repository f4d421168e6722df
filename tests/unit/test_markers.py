"""The marker API and its native library, without root: build and cache,
fallback, what reaches C, NVTX, and the agent-side pieces that need no BPF
(library discovery on a fixture /proc, event decoding, batch joining)."""
from __future__ import annotations

import ctypes as ct
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from sitsprobe import markers
from sitsprobe.abi import MK_BATCH, MK_CACHE_GET, MK_RANGE, MK_REQUEST_BEGIN, MK_REQUEST_END, MK_USAGE
from sitsprobe.markers import _native
from sitsprobe.probes.markers import Batches, decode, find_marker_libraries

ROOT = Path(__file__).resolve().parents[2]
HAVE_CC = shutil.which(os.environ.get("CC") or "cc") is not None
needs_cc = pytest.mark.skipif(not HAVE_CC,
                              reason="no C compiler here: the library cannot be built")

USE_EVERYTHING = """
from sitsprobe import markers
with markers.request(1, 5, model="tiny"):
    with markers.range("prefill", request_id=1):
        pass
    with markers.range("decode", batch_id=2, request_ids=[1, 2**63, -1]):
        pass
    markers.cache_get("prefix", "key", True, request_id=1)
    markers.cache_get("prefix", b"\\x00raw", False)
    markers.usage(1, input_tokens=3, output_tokens=2**40, kv_bytes=1 << 20)
"""


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "default", "-c", textwrap.dedent(code)],
                          cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


def test_import_pulls_in_neither_bcc_nor_torch():
    r = run_python("""
        import sys
        import sitsprobe.markers
        heavy = [m for m in ("bcc", "torch", "sitsprobe.probes") if m in sys.modules]
        print(heavy)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@needs_cc
def test_library_is_built_and_every_call_works(tmp_path):
    r = run_python(USE_EVERYTHING + "print(markers.library_path())",
                   SITSPROBE_MARKERS_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "disabled" not in r.stderr
    path = Path(r.stdout.strip())
    assert path.parent == tmp_path and path.name.startswith("libsitsprobe_markers-")
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left


def test_without_a_compiler_markers_are_noops_with_one_warning(tmp_path):
    r = run_python(USE_EVERYTHING + USE_EVERYTHING + "print(markers.library_path())",
                   SITSPROBE_MARKERS_DIR=str(tmp_path), CC=str(tmp_path / "no-such-cc"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "None"
    assert r.stderr.count("sitsprobe.markers disabled") == 1
    assert "no C compiler" in r.stderr and "no-such-cc" in r.stderr


@needs_cc
def test_switched_off_nothing_is_built_loaded_or_said(tmp_path):
    r = run_python(USE_EVERYTHING + "print(markers.library_path())",
                   SITSPROBE_MARKERS_DIR=str(tmp_path), SITSPROBE_MARKERS="off")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "None" and r.stderr == ""
    assert list(tmp_path.iterdir()) == []


def test_without_sdt_h_the_warning_says_what_to_install(tmp_path):
    cc = tmp_path / "cc"  # a compiler that cannot find the header, as one would
    cc.write_text("#!/bin/sh\necho 'markers.c:18:10: fatal error: sys/sdt.h: "
                  "No such file or directory' >&2\nexit 1\n")
    cc.chmod(0o755)
    r = run_python(USE_EVERYTHING, SITSPROBE_MARKERS_DIR=str(tmp_path / "build"), CC=str(cc))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("sitsprobe.markers disabled") == 1
    assert "systemtap-sdt-dev" in r.stderr


@needs_cc
def test_changed_source_builds_a_new_library_and_same_source_reuses_it(tmp_path):
    source = tmp_path / "markers.c"
    shutil.copy(_native.SOURCE, source)
    env = {_native.ENV_DIR: str(tmp_path / "cache")}
    first = _native.build(env, source)
    mtime = first.stat().st_mtime_ns
    assert _native.build(env, source) == first
    assert first.stat().st_mtime_ns == mtime  # not compiled again
    source.write_text(source.read_text() + "\n/* changed */\n")
    second = _native.build(env, source)
    assert second != first and second.is_file() and first.is_file()
    assert not [p for p in first.parent.iterdir() if p.suffix == ".tmp"]


@needs_cc
def test_an_existing_build_needs_no_compiler(tmp_path):
    env = {_native.ENV_DIR: str(tmp_path)}
    built = _native.build(env)
    assert _native.build({**env, "CC": str(tmp_path / "gone")}) == built


def test_cache_folders_in_order(tmp_path):
    assert _native.cache_dirs({_native.ENV_DIR: str(tmp_path)}) == [tmp_path]
    assert _native.cache_dirs({"XDG_CACHE_HOME": str(tmp_path)}) == [
        _native.SOURCE.parent / "_build", tmp_path / "sitsprobe"]


@needs_cc
def test_nowhere_to_write_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    lib, path, why = _native.load({_native.ENV_DIR: str(blocker / "sub")})
    assert lib is None and path is None
    assert "nowhere to build" in why and _native.ENV_DIR in why


@needs_cc
def test_values_reach_c_as_exact_64_bit_integers(tmp_path):
    """The library is called without argtypes: what markers passes for an id
    must arrive in C as the same uint64 that argtypes would have made."""
    src = tmp_path / "echo.c"
    src.write_text("#include <stdint.h>\nuint64_t echo(uint64_t a, int32_t b, uint64_t c)"
                   " { return a ^ (uint64_t)(int64_t)b ^ c; }\n")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(tmp_path / "e.so"), str(src)],
                   check=True)
    echo = ct.PyDLL(str(tmp_path / "e.so")).echo
    echo.restype = ct.c_uint64
    for value in (0, 5, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32 + 5, 2**63 + 7,
                  2**64 - 1, True):
        assert echo(markers._u64(value), 0, 0) == value & (2**64 - 1), value
        assert echo(0, 0, markers._u64(value)) == value & (2**64 - 1), value
    assert echo(0, -1, 0) == 2**64 - 1  # an fd of -1 is sign-extended like int32_t


class ArrayLike:
    """Like a numpy array or tensor: iterable, but no truth value."""

    def __init__(self, *values):
        self.values = values

    def __iter__(self):
        return iter(self.values)

    def __bool__(self):
        raise ValueError("ambiguous")


def test_batch_ids_from_any_iterable_reach_the_library_as_uint64(monkeypatch):
    calls = []
    monkeypatch.setattr(markers, "_batch", lambda b, ids, n: calls.append((b, list(ids), n)))
    for ids in ([1, 2**63, -1], ArrayLike(1, 2**63, -1), (i for i in (1, 2**63, -1))):
        with markers.range("decode", batch_id=7, request_ids=ids):
            pass
    with markers.range("decode", batch_id=7, request_ids=[]):
        pass
    with markers.range("decode", batch_id=7):
        pass
    assert calls == [(7, [1, 2**63, 2**64 - 1], 3)] * 3


def test_names_are_encoded_once():
    with markers.range("a-stage-name-for-the-cache-test"):
        pass
    assert markers._names["a-stage-name-for-the-cache-test"] == b"a-stage-name-for-the-cache-test"


class FakeNvtx:
    def __init__(self):
        self.calls = []

    def range_push(self, name):
        self.calls.append(("push", name))

    def range_pop(self):
        self.calls.append(("pop",))


def fake_torch(cuda: bool):
    asked = []
    nvtx = FakeNvtx()

    def is_available():
        asked.append(1)
        return cuda

    torch = SimpleNamespace(cuda=SimpleNamespace(is_available=is_available, nvtx=nvtx))
    return torch, nvtx, asked


def test_ranges_are_nvtx_ranges_when_torch_has_cuda(monkeypatch):
    torch, nvtx, asked = fake_torch(cuda=True)
    monkeypatch.setattr(markers, "_nvtx", None)
    monkeypatch.setitem(sys.modules, "torch", torch)
    with markers.range("prefill", request_id=1):
        with markers.range("attention", request_id=1):
            pass
    with markers.range("decode", batch_id=3, request_ids=[1, 2]):
        pass
    assert nvtx.calls == [("push", "prefill"), ("push", "attention"), ("pop",), ("pop",),
                          ("push", "decode"), ("pop",)]
    assert len(asked) == 1  # is_available() asked once, then remembered


def test_no_nvtx_without_cuda_or_before_torch_is_imported(monkeypatch):
    monkeypatch.setattr(markers, "_nvtx", None)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with markers.range("prefill"):
        pass
    assert markers._nvtx is None  # undecided until torch shows up
    torch, nvtx, asked = fake_torch(cuda=False)
    monkeypatch.setitem(sys.modules, "torch", torch)
    with markers.range("prefill"):
        pass
    with markers.range("decode"):
        pass
    assert nvtx.calls == [] and len(asked) == 1 and markers._nvtx is False


def test_a_range_pops_only_what_it_pushed(monkeypatch):
    monkeypatch.setattr(markers, "_nvtx", None)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    torch, nvtx, _ = fake_torch(cuda=True)
    with markers.range("outer"):  # torch arrives inside the range
        monkeypatch.setitem(sys.modules, "torch", torch)
        with markers.range("inner"):
            pass
    assert nvtx.calls == [("push", "inner"), ("pop",)]


# ---- agent side, no BPF ----

def write_maps(proc: Path, pid: int, lines: list[str], root: str = "/") -> None:
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "maps").write_text("".join(ln + "\n" for ln in lines))
    (d / "root").symlink_to(root)


def maps_line(path: str) -> str:
    return f"7f5e1c000000-7f5e1c001000 r-xp 00001000 fe:00 2188076                    {path}"


def test_find_marker_libraries_on_a_fixture_proc(tmp_path):
    lib_a = tmp_path / "cache a" / "libsitsprobe_markers-aaaa.so"
    lib_b = tmp_path / "b" / "libsitsprobe_markers-bbbb.so"
    for lib in (lib_a, lib_b):
        lib.parent.mkdir()
        lib.write_bytes(b"\x7fELF")
    proc = tmp_path / "proc"
    write_maps(proc, 100, [maps_line("/usr/lib/libc.so.6"), maps_line(str(lib_a)),
                           maps_line(str(lib_a))])
    write_maps(proc, 200, [maps_line(str(lib_b)), maps_line(str(lib_a) + " (deleted)"),
                           maps_line("/tmp/libsitsprobe_markers-cccc.so.bak"), "[heap]"])
    write_maps(proc, 300, [maps_line(str(tmp_path / "gone" / "libsitsprobe_markers-d.so"))])
    (proc / "self").mkdir()
    (proc / "400").mkdir()  # no maps: a process mid-exit
    assert find_marker_libraries(str(proc)) == {str(lib_a), str(lib_b)}


def test_find_marker_libraries_reaches_into_another_mount_namespace(tmp_path):
    container = tmp_path / "container"
    inside = container / "cache" / "libsitsprobe_markers-eeee.so"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"\x7fELF")
    proc = tmp_path / "proc"
    write_maps(proc, 500, [maps_line("/cache/libsitsprobe_markers-eeee.so")], root=str(container))
    expected = f"{proc}/500/root/cache/libsitsprobe_markers-eeee.so"
    assert find_marker_libraries(str(proc)) == {expected}


def event(kind: int, **fields):
    base = dict(ts=10, tgid=7, tid=8, kind=kind, fd=-1, request_id=0, batch_id=0,
                input_tokens=0, output_tokens=0, kv_bytes=0, begin_ts=0, hit=0, key_len=0, n_total=0,
                first=0, n_ids=0, ids=[0] * 16, name=b"", key=[0] * 64)
    return SimpleNamespace(**{**base, **fields})


def test_decode_each_kind():
    e = decode(event(MK_REQUEST_BEGIN, request_id=5, fd=9, name=b"tiny"))
    assert (e.kind, e.request_id, e.fd, e.name, e.ts_ns, e.tgid, e.tid) == \
        ("request_begin", 5, 9, "tiny", 10, 7, 8)
    assert decode(event(MK_REQUEST_END, request_id=5)).kind == "request_end"
    e = decode(event(MK_RANGE, request_id=5, batch_id=3, name=b"decode", begin_ts=4))
    assert (e.kind, e.batch_id, e.name, e.fd, e.begin_ns, e.ts_ns) == ("range", 3, "decode", -1, 4, 10)
    key = list(b"\x00\xffab") + [0] * 60
    e = decode(event(MK_CACHE_GET, name=b"prefix", key=key, key_len=4, hit=1))
    assert (e.kind, e.name, e.key, e.hit) == ("cache_get", "prefix", "\x00\\xffab", True)
    assert decode(event(MK_CACHE_GET, hit=0)).hit is False
    e = decode(event(MK_USAGE, input_tokens=1, output_tokens=2, kv_bytes=3))
    assert (e.input_tokens, e.output_tokens, e.kv_bytes, e.hit) == (1, 2, 3, None)


def batch_parts(ids: list[int], ts: int = 10, tid: int = 8, max_ids: int = 256):
    sent = ids[:max_ids]
    for first in range(0, max(len(sent), 1), 16):
        chunk = sent[first:first + 16]
        yield event(MK_BATCH, ts=ts, tid=tid, batch_id=4, n_total=len(ids), first=first,
                    n_ids=len(chunk), ids=chunk + [0] * (16 - len(chunk)))


def test_batch_parts_join_into_one_event():
    b = Batches(256)
    ids = list(range(100, 140))
    out = [m for part in batch_parts(ids) for m in b.add(part)]
    assert len(out) == 1 and out[0].request_ids == tuple(ids) and out[0].batch_id == 4
    assert not b.pending
    assert [m.request_ids for p in batch_parts([]) for m in b.add(p)] == [()]


def test_batch_past_the_cap_keeps_what_was_sent():
    b = Batches(32)
    out = [m for part in batch_parts(list(range(50)), max_ids=32) for m in b.add(part)]
    assert [m.request_ids for m in out] == [tuple(range(32))]


def test_a_lost_part_leaves_a_partial_batch_when_the_thread_moves_on():
    b = Batches(256)
    parts = list(batch_parts(list(range(40))))
    assert b.add(parts[0]) == []  # then the middle part is lost
    assert [m.request_ids for m in b.add(parts[2])] == [tuple(range(16)), tuple(range(32, 40))]
    b.add(parts[0])  # then the thread starts another batch
    first, = batch_parts([0, 1, 2], ts=20)
    assert [m.request_ids for m in b.add(first)] == [tuple(range(16)), (0, 1, 2)]
    b.add(parts[0])  # then the thread does something else
    assert b.interrupt(8).request_ids == tuple(range(16)) and not b.pending
