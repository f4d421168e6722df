"""What the BPF sources may spell, for the agent's start: every compile pays
for each kernel header it parses (three times, bcc's passes) and for each call
bcc's rewriter checks against the kernel's symbols."""
import re
from pathlib import Path

import pytest

BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
SOURCES = sorted(BPF_DIR.glob("*.c"))
# uapi/linux/ptrace.h: struct pt_regs; asm/unistd.h: the syscall numbers (a
# flat list). Everything else a program needs it defines itself (AF_INET_ ...).
LIGHT_HEADERS = {"uapi/linux/ptrace.h", "asm/unistd.h"}


def test_there_are_sources_to_check():
    assert {p.name for p in SOURCES} >= {"net.c", "cache.c", "markers.c", "cuda.c"}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_only_light_kernel_headers_are_included(source):
    # <linux/sched.h>, <linux/socket.h> or <linux/in.h> each pull most of the
    # kernel's headers: 0.9 s of net.c's 2.6 s compile on the machines here.
    system = re.findall(r'^\s*#\s*include\s*<([^>]+)>', source.read_text(), re.M)
    assert set(system) <= LIGHT_HEADERS, f"{source.name} includes {sorted(set(system) - LIGHT_HEADERS)}"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_user_memory_is_read_under_the_names_bcc_does_not_check(source):
    # bcc looks bpf_probe_read_user{,_str} up in the kernel's symbols at every
    # call site, about 20 ms each; bpf/user_read.h has the same helpers.
    text = source.read_text()
    assert not re.search(r"\bbpf_probe_read_user(_str)?\s*\(", text), source.name
    if re.search(r"\bread_user(_str)?\s*\(", text):
        assert '#include "user_read.h"' in text, source.name
