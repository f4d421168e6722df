"""The kernel's count of a long write (bpf/write_scan.h, a byte at a time,
built here by gcc) and the agent's (stitch/write_scan.py, regexes, for HTTP/2
frames and the tests that stand in for the kernel) agree on every recorded
answer, cut anywhere, on the spellings servers use, and on random bytes."""
from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from sitsprobe.stitch.write_scan import SCAN, counted

from .test_genai import INDEX, written

GCC = shutil.which("gcc")
BPF = Path(__file__).resolve().parents[2] / "bpf"
MAIN = r"""
#include <stdio.h>
typedef unsigned long long __u64;
typedef unsigned int __u32;
#define __always_inline inline __attribute__((always_inline))
#include "write_scan.h"

int main(void) {  /* writes on stdin, each a 4-byte length then its bytes; a line of counts each */
    unsigned char b[1 << 16];
    unsigned int n;
    while (fread(&n, 4, 1, stdin) == 1 && n <= sizeof(b) && fread(b, 1, n, stdin) == n) {
        struct scan s;
        scan_start(&s);
        __u64 w = s.w, o = s.o;
        __u32 data = 0, json = 0, delta = 0, output = 0, special = 0;
        for (__u64 i = 0; i < n && i < %(scan)d; i++)
            SCAN_BYTE((__u64)b[i], 1, w, o, data, json, delta, output, special);
        printf("%%u %%u %%u %%u %%u\n", data, json, delta, output, special);
    }
    return 0;
}
"""

SPELLINGS = [
    b'data: {"choices":[{"delta":{"content":" Hello"}}]}\n\n',  # a token that begins with a space
    b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n',  # json.dumps' separators
    b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',  # empty: no output
    b'data: {"choices":[{"delta":{"content":null}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"   "}}]}\n\n',  # spaces only: output
    b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n',
    b'data: {"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\\"a"}}]}}]}\n\n',
    b'{"message":{"role":"assistant","thinking":"t"},"done":false}\n{"response":"r","done":false}\n',
    b'data:{"token":{"text":"</s>","special":true},"generated_text":"abc"}\n\n',
    b'data:{"token":{"text":"a","special" : false}}\n\n',
    b'data:{"token": {"text": "<|eot|>", "special": true}}\n\n',  # json.dumps' separators
    b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}\n\n',
    b'data: {"content":"\\"quoted\\""}\n\n',  # an escaped quote is still output
]


def kernel_counts(writes: list[bytes], tmp_path) -> list[tuple[int, ...]]:
    src, exe = tmp_path / "scan.c", tmp_path / "scan"
    src.write_text(MAIN % {"scan": SCAN})
    subprocess.run([GCC, "-O2", "-I", str(BPF), "-o", str(exe), str(src)], check=True)
    feed = b"".join(len(w).to_bytes(4, "little") + w for w in writes)
    out = subprocess.run([str(exe)], input=feed, capture_output=True, check=True).stdout.decode()
    return [tuple(map(int, line.split())) for line in out.splitlines()]


def agents_counts(write: bytes) -> tuple[int, ...]:
    c = counted(write)
    return c.data_lines, c.json_lines, c.delta_lines, c.output_lines, c.special_lines


@pytest.mark.skipif(GCC is None, reason="gcc not on PATH: this test builds the kernel's write scan")
def test_the_kernel_and_the_agent_count_a_write_alike(tmp_path):
    bodies = [b"".join(written(name)[1:]) for name in sorted(INDEX)]
    rng = random.Random(7)
    writes = [*SPELLINGS, *bodies, b"".join(bodies)]  # the last is longer than SCAN: its first SCAN counted
    writes += [b[rng.randrange(len(b)):] for b in bodies for _ in range(4)]  # cut anywhere
    alphabet = b'"ntexpoeigkusalmr :{}\n\\data'
    writes += [bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 300))) for _ in range(300)]
    got = kernel_counts(writes, tmp_path)
    assert len(got) == len(writes)
    wrong = [(w[:80], k, agents_counts(w)) for w, k in zip(writes, got) if k != agents_counts(w)]
    assert not wrong, wrong[:5]
    # the spellings as they read: output, but for an empty or null string and a special token
    assert [k[3] - k[4] for k in got[:len(SPELLINGS)]] == [1, 1, 0, 0, 1, 1, 1, 2, 0, 1, 0, 1, 1]
