"""probes.apart.relocate: a program compiled in another process, its maps
named by that process's fds, rewritten to name this one's maps of the same name."""
from __future__ import annotations

import struct

import pytest

from sitsprobe.probes.apart import relocate


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, src << 4 | dst, off, imm)


def ld_map(dst: int, fd: int, src: int = 1) -> bytes:
    """BPF_LD_MAP_FD (src 1) or BPF_LD_MAP_VALUE (src 2): two instructions."""
    return insn(0x18, dst, src, imm=fd) + insn(0)


MOV_IMM, CALL, EXIT = 0xb7, 0x85, 0x95


def test_each_map_named_by_its_fd_there_is_named_by_ours():
    theirs = {7: "conns", 9: "exchanges", 12: "scan_prog"}
    ours = {"conns": 31, "exchanges": 40, "scan_prog": 5, "unused": 7}
    program = b"".join([
        ld_map(1, 7), insn(CALL, imm=1),  # bpf_map_lookup_elem(conns, ...)
        insn(MOV_IMM, 2, imm=9),  # an immediate that happens to equal a map's fd: not a map
        ld_map(1, 9, src=2),  # a value's address in exchanges
        ld_map(2, 12), insn(CALL, imm=12),  # bpf_tail_call(ctx, scan_prog, ...)
        ld_map(3, 7),
        insn(0x18, 4, 0, imm=9) + insn(0, imm=1),  # a 64-bit constant (src 0): left alone
        insn(EXIT)])
    out = relocate(program, theirs, ours)
    assert len(out) == len(program)
    want = b"".join([
        ld_map(1, 31), insn(CALL, imm=1),
        insn(MOV_IMM, 2, imm=9),
        ld_map(1, 40, src=2),
        ld_map(2, 5), insn(CALL, imm=12),
        ld_map(3, 31),
        insn(0x18, 4, 0, imm=9) + insn(0, imm=1),
        insn(EXIT)])
    assert out == want


def test_a_map_this_module_lacks_is_named_in_the_error():
    with pytest.raises(ValueError, match="a map named bodies"):
        relocate(ld_map(1, 4) + insn(EXIT), {4: "bodies"}, {"conns": 3})
    with pytest.raises(ValueError, match="map fd 5, no map"):
        relocate(ld_map(1, 5) + insn(EXIT), {4: "bodies"}, {"bodies": 3})
