"""Libraries found in /proc/PID/maps (sitsprobe.probes.libs): the lines a
needle picks out of a big maps file, and the marker libraries found through
them, from fixture trees."""
from __future__ import annotations

import os
import random

from sitsprobe.probes import libs
from sitsprobe.probes.markers import find_marker_libraries


def test_the_lines_with_a_needle_are_those_a_line_by_line_reading_finds():
    rng = random.Random(7)
    alphabet = ["a", "b", "/lib", "/libssl", "\n", " ", "x" * 30]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
        for needle in ("/lib", "/libssl", "a"):
            assert libs._lines_with(text, needle) == [ln for ln in text.split("\n") if needle in ln], \
                (text, needle)


def _maps(tmp_path, pid: int, lines: list[str]) -> None:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "maps").write_text("".join(f"{ln}\n" for ln in lines))


def test_marker_libraries_among_thousands_of_thread_stacks(tmp_path):
    lib = tmp_path / "libsitsprobe_markers-84acd1de.so"
    lib.write_bytes(b"\x7fELF")
    ino = os.stat(lib).st_ino
    stacks = [f"7f{i:010x}000-7f{i:010x}800 rw-p 00000000 00:00 0 " for i in range(5000)]
    _maps(tmp_path, 100, [*stacks[:2500],
                          f"7f1000000000-7f1000001000 r--p 00000000 fe:00 {ino} {lib}",
                          f"7f1000001000-7f1000002000 r-xp 00001000 fe:00 {ino} {lib}",  # the same file
                          *stacks[2500:]])
    os.symlink("/", tmp_path / "100" / "root")  # the agent's own mount namespace
    _maps(tmp_path, 200, [f"7f20-7f21 r-xp 00000000 fe:00 {ino} {lib} (deleted)",  # replaced: not ours
                          "7f30-7f31 r-xp 00000000 fe:00 9 /opt/libsitsprobe_markers.txt",
                          *stacks])
    os.symlink("/", tmp_path / "200" / "root")
    assert find_marker_libraries(str(tmp_path)) == {str(lib)}
    assert find_marker_libraries(str(tmp_path), pids=[200, 300]) == set()  # 300: gone
