"""What the kernel counts of a response write longer than its peek
(bpf/write_scan.h, a byte at a time), counted here with regexes for the
writes the agent frames itself (HTTP/2 DATA frames,
:mod:`.protocols.http2_payload`) and for the tests that stand in for the
kernel; tests/unit/test_write_scan.py builds the C with gcc and holds the two
to the same counts."""
from __future__ import annotations

import re
from typing import NamedTuple

SCAN = 4096  # bytes of a write counted (bpf/sitsprobe.h WRITE_SCAN)

# an output key's non-empty string begun, spaces aside: its last 8 bytes (the C's OUT_KEY)
OUTPUT = re.compile(rb'(?:ntent|"text|ponse|oning|nking|fusal|ments) *" *: *"[^"]')
DELTA = re.compile(rb'\.delta"|k_delta"')  # a typed event's output: its type's end
_SPECIAL = re.compile(rb'al *" *: *true')


class Counted(NamedTuple):
    """A write's lines, as request.Write carries them."""

    data_lines: int  # that begin "data:" (SSE events)
    json_lines: int  # that end "}" (NDJSON objects)
    scanned: int  # bytes counted
    delta_lines: int  # typed events that carry output (`.delta"`, `k_delta"`)
    output_lines: int  # output keys' non-empty strings begun
    special_lines: int  # special tokens ("special":true)


def counted(write: bytes) -> Counted:
    """The kernel's counts of ``write`` (its first SCAN bytes), which begins a line."""
    seen = write[:SCAN]
    return Counted((b"\n" + seen).count(b"\ndata:"), seen.count(b"}\n"), len(seen),
                   len(DELTA.findall(seen)), len(OUTPUT.findall(seen)),
                   len(_SPECIAL.findall(seen)))
