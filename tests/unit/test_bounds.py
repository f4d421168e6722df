"""bpf/bounds.h, built here by gcc: MASK_OF is the least 2^k - 1 at least its
argument (net.c masks a copy's place and size with it, where a mask that
drops a bit the value has corrupts the copy and the verifier cannot tell),
FORGET keeps the value it hides, BOUND clamps."""
from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

GCC = shutil.which("gcc")
BPF = Path(__file__).resolve().parents[2] / "bpf"
MAIN = r"""
#include <stdio.h>
typedef unsigned long long __u64;
#include "bounds.h"

int main(void) {  /* a number a line in; MASK_OF, FORGET's and BOUND(v, 384)'s results a line out */
    __u64 v, cell;
    while (scanf("%llu", &v) == 1) {
        __u64 kept = v, clamped = v;
        FORGET(kept, &cell);
        BOUND(clamped, 384);
        printf("%llu %llu %llu\n", (__u64)MASK_OF(v), kept, clamped);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    if GCC is None:
        pytest.skip("gcc is not installed (scripts/setup.sh installs it)")
    d = tmp_path_factory.mktemp("bounds")
    (d / "main.c").write_text(MAIN)
    subprocess.run([GCC, "-O2", "-I", str(BPF), "-o", str(d / "bounds"), str(d / "main.c")], check=True)
    return d / "bounds"


def test_mask_of_is_the_least_all_ones_at_least_its_argument_and_forget_and_bound_keep_their_word(built):
    rnd = random.Random(7)
    values = [*range(1, 4097), *(1 << k for k in range(32)), *((1 << k) - 1 for k in range(1, 33)),
              *(rnd.randrange(1, 1 << 32) for _ in range(2000))]
    out = subprocess.run([str(built)], input="\n".join(map(str, values)), capture_output=True, text=True,
                         check=True).stdout.split("\n")
    wrong = []
    for v, line in zip(values, out):
        mask, kept, clamped = map(int, line.split())
        if mask != (1 << v.bit_length()) - 1 or kept != v or clamped != min(v, 384):
            wrong.append((v, mask, kept, clamped))
    assert len(out) == len(values) + 1 and wrong == [], wrong[:10]
