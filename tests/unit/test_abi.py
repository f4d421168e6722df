"""sitsprobe.abi against bpf/sitsprobe.h, the header compiled.

gcc builds a small program that includes the header and prints every
enumerator and every valued #define it finds (found by parsing the header, so
a new one is picked up unasked). Then: each constant abi shares a name with
has the header's value; every enum of the header is in abi whole, and so is
every run of #defines abi has a part of; each ordered name tuple has one name
per enumerator, at the enumerator's value. A mutated copy of the header
proves that a swap of two values, or a new constant, fails the check.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sitsprobe import abi

HEADER = Path(__file__).resolve().parents[2] / "bpf" / "sitsprobe.h"
GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(
    GCC is None, reason="gcc not on PATH: this test compiles bpf/sitsprobe.h to read its constants")

# What the kernel headers would give the BPF programs.
PRELUDE = """#include <stdio.h>
typedef unsigned char __u8, u8;
typedef unsigned short __u16, u16;
typedef unsigned int __u32, u32;
typedef unsigned long long __u64, u64;
typedef signed char __s8, s8;
typedef short __s16, s16;
typedef int __s32, s32;
typedef long long __s64, s64;
"""
# abi's ordered name tuples, by the enum whose values index them; the enum's
# last enumerator is the count (C_COUNTERS), the others each name a position
ORDERED = {"NET_COUNTERS": "counter", "CUDA_FN_NAMES": "cuda_fn", "CUDA_COUNTERS": "cuda_counter",
           "CACHE_COUNTERS": "cache_counter", "MARKER_COUNTERS": "marker_counter"}
# abi's maps by the enum whose every value they must hold, as keys or as values
MAPS = {"MARKER_KINDS": ("marker_kind", dict.keys), "CACHE_KEY_KINDS": ("cache_key_kind", dict.values),
        "CACHE_HIT_OPS": ("cache_hit_op", dict.values)}

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_ENUM = re.compile(r"\benum\s+(\w+)\s*\{(.*?)\}", re.S)
_ENUMERATOR = re.compile(r"^\s*([A-Za-z_]\w*)")
_DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)\s+\S")  # valued, not function-like
_IFNDEF = re.compile(r"^\s*#\s*ifndef\s+(\w+)")


def parse(text: str) -> tuple[dict[str, list[str]], list[list[str]]]:
    """The header's enums (name -> enumerators, in order) and its runs of
    consecutive #defines, leaving out the load-time settings (the -D ones,
    each a default under its own #ifndef)."""
    text = _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text)
    enums = {name: [m.group(1) for part in body.split(",") if (m := _ENUMERATOR.match(part))]
             for name, body in _ENUM.findall(text)}
    runs: list[list[str]] = [[]]
    before = ""
    for line in text.splitlines():
        m = _DEFINE.match(line)
        guard = _IFNDEF.match(before)
        if m and not (guard and guard.group(1) == m.group(1)):
            runs[-1].append(m.group(1))
        elif runs[-1]:
            runs.append([])
        before = line if line.strip() else before
    return enums, [r for r in runs if r]


def compiled(header: Path, names: list[str], workdir: Path) -> dict[str, int]:
    """Each name's value as a C compiler sees it with the header included."""
    lines = [f'    printf("%s %lld\\n", "{n}", (long long)({n}));' for n in names]
    src = workdir / "abi_dump.c"
    src.write_text(f'{PRELUDE}#include "{header}"\nint main(void)\n{{\n' + "\n".join(lines)
                   + "\n    return 0;\n}\n")
    exe = workdir / "abi_dump"
    built = subprocess.run([GCC, "-std=gnu11", "-o", str(exe), str(src)], capture_output=True, text=True)
    if built.returncode:
        pytest.fail(f"gcc could not build {src} with {header}:\n{built.stderr}")
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {name: int(value) for name, value in (ln.rsplit(" ", 1) for ln in out.splitlines())}


def disagreements(header: Path, workdir: Path) -> list[str]:
    """Every way sitsprobe.abi and the header differ, each naming its constants."""
    enums, runs = parse(header.read_text())
    names = [n for members in enums.values() for n in members] + [n for run in runs for n in run]
    value = compiled(header, names, workdir)
    ours = {n: v for n, v in vars(abi).items() if n.isupper() and type(v) is int}
    problems = [f"{n}: {header.name} has {value[n]}, sitsprobe.abi {ours[n]}"
                for n in names if n in ours and ours[n] != value[n]]
    problems += [f"{n}: in sitsprobe.abi, not in {header.name}"
                 for n in ours if n not in value]
    for enum, members in enums.items():
        if missing := [n for n in members if n not in ours]:
            problems.append(f"enum {enum}: {', '.join(missing)} not in sitsprobe.abi")
    for run in runs:
        if (missing := [n for n in run if n not in ours]) and len(missing) < len(run):
            problems.append(f"#define {', '.join(missing)}: not in sitsprobe.abi with the rest of "
                            f"{', '.join(n for n in run if n in ours)}")
    for tuple_name, enum in ORDERED.items():
        names_at = getattr(abi, tuple_name)
        *labelled, count = enums[enum]
        if len(names_at) != value[count]:
            problems.append(f"{tuple_name}: {len(names_at)} names, {count} is {value[count]}")
        for n in labelled:
            if n in ours and value[n] < len(names_at) and names_at[value[n]] != names_at[ours[n]]:
                problems.append(f"{tuple_name}[{value[n]}] is {n} in {header.name}, "
                                f"but named {names_at[value[n]]!r}")
    for map_name, (enum, held) in MAPS.items():
        if missing := [n for n in enums[enum] if value[n] not in held(getattr(abi, map_name))]:
            problems.append(f"{map_name}: no entry for {', '.join(missing)}")
    return problems


def mutated(tmp_path: Path, edit) -> Path:
    copy = tmp_path / "sitsprobe.h"
    copy.write_text(edit(HEADER.read_text()))
    return copy


def swap(a: str, b: str):
    """An edit that swaps the values the header gives a and b (enumerators or #defines)."""
    def at(name: str) -> re.Pattern:
        return re.compile(rf"(\b{name}\s*=\s*|#define\s+{name}\s+)(\w+)")

    def edit(text: str) -> str:
        ma, mb = at(a).search(text), at(b).search(text)
        for (start, end), v in sorted([(ma.span(2), mb.group(2)), (mb.span(2), ma.group(2))], reverse=True):
            text = text[:start] + v + text[end:]
        return text
    return edit


@needs_gcc
def test_abi_agrees_with_the_header(tmp_path):
    assert disagreements(HEADER, tmp_path) == []


def test_the_header_is_read_whole():
    enums, runs = parse(HEADER.read_text())
    assert enums["counter"][:2] == ["C_EXCHANGES", "C_LOST"] and enums["cache_hit_op"][-1] == "HO_LE"
    assert ["CF_TUPLE", "CF_TCP", "CF_CHUNK_END", "CF_SEEDED", "CF_MISSED", "CF_INTERIM",
            "CF_BODY", "CF_BODY_NEXT", "CF_CLIENT", "CF_BY_PROCESS", "CF_STREAM", "CF_TLS", "CF_TLS_PLAIN"] in runs
    assert not any("REQ_CAP" in run or "SITSPROBE_H" in run for run in runs)  # -D settings, the guard


@needs_gcc
@pytest.mark.parametrize("a, b", [
    ("C_LOST", "C_CONN_OVERFLOW"), ("CUDA_MEMCPY", "CUDA_MEMCPY_ASYNC"), ("MK_RANGE", "MK_BATCH"),
    ("CC_HITS", "CC_MISSES"), ("CUDA_C_STATS_FULL", "CUDA_C_ALLOCS_FULL"), ("MC_IDS_DROPPED", "MC_KEYS_CUT"),
    ("K_FLAT", "K_IOV"), ("END_NEXT", "END_CLOSE"), ("CF_TUPLE", "CF_TCP"), ("CE_TRUNCATED", "CE_PEER"),
])
def test_a_swap_in_the_header_fails_naming_both(tmp_path, a, b):
    problems = disagreements(mutated(tmp_path, swap(a, b)), tmp_path)
    assert {a, b} <= {p.split(":")[0] for p in problems}, problems


@needs_gcc
@pytest.mark.parametrize("edit, named", [
    (lambda h: h.replace("    C_COUNTERS = 12,", "    C_NEW = 12,\n    C_COUNTERS = 13,"), "C_NEW"),
    (lambda h: h.replace("enum notice_kind { N_EXEC = 1, N_EXIT = 2, N_LISTEN = 3 }",
                         "enum notice_kind { N_EXEC = 1, N_EXIT = 2, N_LISTEN = 3, N_FORK = 4 }"), "N_FORK"),
    (lambda h: h.replace("#define CE_PEER 0x02", "#define CE_PEER 0x02\n#define CE_NEW 0x04"), "CE_NEW"),
])
def test_a_new_constant_fails_naming_it(tmp_path, edit, named):
    problems = disagreements(mutated(tmp_path, edit), tmp_path)
    assert any(named in p for p in problems), problems


def test_readers_take_their_names_from_abi():
    from sitsprobe.cache import spec
    from sitsprobe.gpu import cuda as gpu_cuda
    from sitsprobe.probes import cache, cuda, markers, net

    assert net.COUNTERS is abi.NET_COUNTERS and cache.COUNTERS is abi.CACHE_COUNTERS
    assert cuda.COUNTERS is abi.CUDA_COUNTERS and markers.COUNTERS is abi.MARKER_COUNTERS
    assert gpu_cuda.FUNCTIONS is abi.CUDA_FN_NAMES and markers.KINDS is abi.MARKER_KINDS
    assert cache.KEY_KINDS is abi.CACHE_KEY_KINDS and cache.HIT_OPS is abi.CACHE_HIT_OPS
    assert spec.KEY_READS == tuple(abi.CACHE_KEY_KINDS) and spec.MAX_CACHES == abi.CACHE_SLOTS
