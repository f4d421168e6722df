"""probes/kept.py: a compile's programs kept under a key of everything that
made them, and given back only whole, unchanged and written by this user."""
from __future__ import annotations

import logging
import marshal
import os

import pytest

from sitsprobe.probes import apart
from sitsprobe.probes.kept import KeptPrograms, key

MADE = ({3: "conns", 4: "exchanges"}, {b"sock_io": bytes(range(16)), b"scan_head": b"\x18" + bytes(15)})


@pytest.fixture
def sources(tmp_path):
    d = tmp_path / "bpf"
    d.mkdir()
    (d / "net.c").write_text('#include "sitsprobe.h"\n')
    (d / "sitsprobe.h").write_text("#define CAP 256\n")
    return d


@pytest.fixture
def maps(tmp_path):
    """A /proc/self/maps naming a libbcc and an LLVM that exist."""
    libs = tmp_path / "lib"
    libs.mkdir()
    for name in ("libbcc.so.0.26.0", "libLLVM-14.so.1"):
        (libs / name).write_bytes(b"ELF")
    path = tmp_path / "maps"
    path.write_text("".join(f"7f00-7f10 r-xp 00000000 08:01 1 {libs / n}\n"
                            for n in ("libbcc.so.0.26.0", "libLLVM-14.so.1", "libLLVM-14.so.1")))
    return path


def test_the_key_changes_with_the_source_the_flags_and_the_compiler(sources, maps, tmp_path):
    flags = ["-DREQ_CAP=256", "-DNET_TIER=1"]
    k = key(sources, flags, str(maps))
    assert k == key(sources, list(flags), str(maps))  # the same inputs, the same key
    assert key(sources, ["-DREQ_CAP=512", "-DNET_TIER=1"], str(maps)) != k
    assert key(sources, flags[::-1], str(maps)) != k  # a -D given twice: the last wins
    (sources / "sitsprobe.h").write_text("#define CAP 512\n")  # a header net.c includes
    k2 = key(sources, flags, str(maps))
    assert k2 != k
    llvm = tmp_path / "lib" / "libLLVM-14.so.1"
    llvm.write_bytes(b"ELF, rebuilt")  # another build of LLVM: another size
    assert key(sources, flags, str(maps)) != k2


def test_the_compiler_s_libraries_are_read_from_the_process_maps(maps, tmp_path):
    from sitsprobe.probes.kept import libraries

    seen = libraries(str(maps))
    assert [s.split()[0] for s in seen] == [str(tmp_path / "lib" / n) for n in ("libLLVM-14.so.1", "libbcc.so.0.26.0")]
    assert libraries(str(tmp_path / "no-maps")) == []


def test_kept_programs_come_back_as_they_were_kept(tmp_path):
    kept = KeptPrograms(str(tmp_path / "compiled"))
    assert kept.get("k") is None
    kept.put("k", *MADE)
    assert kept.get("k") == MADE
    assert kept.get("another") is None
    assert os.stat(tmp_path / "compiled").st_mode & 0o777 == 0o700
    assert os.stat(tmp_path / "compiled" / "k").st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path / "compiled") == ["k"]  # no partial file left


def test_the_files_used_last_are_kept_the_rest_go(tmp_path):
    from sitsprobe.probes.kept import AT_MOST

    kept = KeptPrograms(str(tmp_path))
    for i in range(AT_MOST):
        kept.put(f"k{i}", *MADE)
        os.utime(tmp_path / f"k{i}", ns=(i * 10**9, i * 10**9))  # k0 the oldest
    assert kept.get("k0") == MADE  # used now: the newest
    kept.put("new", *MADE)
    assert sorted(os.listdir(tmp_path)) == sorted(["new", "k0", *(f"k{i}" for i in range(2, AT_MOST))])


@pytest.mark.parametrize("content", [
    b"", marshal.dumps(MADE)[:-5], b"\x00not marshal at all", marshal.dumps(["a", "list"]),
    marshal.dumps(({"3": "conns"}, MADE[1])), marshal.dumps((MADE[0], {b"sock_io": b"\x18" * 7})),
])
def test_a_kept_file_that_is_not_a_compile_s_is_compiled_instead(tmp_path, content, caplog):
    kept = KeptPrograms(str(tmp_path))
    (tmp_path / "k").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="sitsprobe"):
        assert kept.get("k") is None
    assert "compiling instead" in caplog.text


def test_a_kept_file_others_could_write_is_not_loaded(tmp_path, caplog):
    kept = KeptPrograms(str(tmp_path))
    kept.put("k", *MADE)
    os.chmod(tmp_path / "k", 0o620)
    with caplog.at_level(logging.WARNING, logger="sitsprobe"):
        assert kept.get("k") is None
    assert "mode 620" in caplog.text and "compiling instead" in caplog.text


def test_a_folder_that_cannot_be_written_keeps_nothing_and_says_so(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    kept = KeptPrograms(str(tmp_path / "file" / "compiled"))  # a folder under a file
    with caplog.at_level(logging.INFO, logger="sitsprobe"):
        kept.put("k", *MADE)
    assert "not kept for the next start" in caplog.text and kept.get("k") is None


def test_only_programs_put_on_tracepoints_are_movable():
    assert apart.movable({b"sock_io": b"", b"tracepoint__sock__inet_sock_set_state": b"",
                          b"raw_tracepoint__sched_switch": b""})
    assert not apart.movable({b"sock_io": b"", b"kfunc__tcp_sendmsg": b""})
    assert not apart.movable({b"kprobe__tcp_sendmsg": b""})
