"""The kernel's histogram buckets (probes.bins.bin_flags) are the agent's own:
the C expression the kernel compiles, built by gcc here, puts every value in
the bucket bisect puts it in, at and around every bound."""
from __future__ import annotations

import bisect
import shutil
import subprocess

import pytest

from sitsprobe.export.buckets import DURATION_BUCKETS, SEGMENT_BUCKETS
from sitsprobe.probes.bins import bin_flags

GCC = shutil.which("gcc")


def kernel_slots(flags: list[str], macro: str, values: list[int], tmp_path) -> list[int]:
    src = tmp_path / "slots.c"
    src.write_text("#include <stdio.h>\n#include <stdlib.h>\nint main(int argc, char **argv) {\n"
                   "  for (int i = 1; i < argc; i++) { unsigned long long ns = strtoull(argv[i], 0, 10);\n"
                   f"    printf(\"%d\\n\", (int){macro}(ns)); }}\n  return 0;\n}}\n")
    exe = tmp_path / "slots"
    subprocess.run([GCC, *flags, "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe), *map(str, values)], capture_output=True, text=True, check=True).stdout
    return [int(line) for line in out.split()]


@pytest.mark.skipif(GCC is None, reason="gcc not on PATH: this test compiles the kernel's bucket expressions")
@pytest.mark.parametrize("macro, buckets", [("DUR_SLOT", DURATION_BUCKETS), ("SEG_SLOT", SEGMENT_BUCKETS)])
def test_the_kernels_bucket_is_bisects(tmp_path, macro, buckets):
    flags = [f for f in bin_flags(DURATION_BUCKETS, SEGMENT_BUCKETS) if f.startswith(("-DDUR_SLOT(", "-DSEG_SLOT("))]
    values = [0, 1, 10**13, 2**63] + [round(b * 1e9) + d for b in buckets for d in (-1, 0, 1)]
    want = [bisect.bisect_left(buckets, v / 1e9) for v in values]
    assert kernel_slots(flags, macro, values, tmp_path) == want
    assert max(want) == len(buckets)  # the +Inf bucket is reached
