"""Layout reads a ctypes struct in one unpack: every field must come out as
ctypes itself reads it, whatever the padding and nesting."""
import ctypes as ct

import pytest

from sitsprobe.probes.layout import Layout


class Tuple(ct.Structure):
    _fields_ = [("family", ct.c_ushort), ("lport", ct.c_ushort), ("rport", ct.c_ushort),
                ("laddr", ct.c_ubyte * 16), ("raddr", ct.c_ubyte * 16)]


class Conn(ct.Structure):  # the shape bcc gives struct conn: nesting, arrays, padding
    _fields_ = [("tgid", ct.c_uint), ("fd", ct.c_uint), ("start_ns", ct.c_ulonglong),
                ("t", Tuple), ("state", ct.c_ubyte), ("delta", ct.c_int),
                ("comm", ct.c_char * 16), ("n", ct.c_ushort), ("statuses", ct.c_ushort * 4),
                ("seq", ct.c_uint), ("signed", ct.c_longlong), ("req", ct.c_ubyte * 7)]


def filled() -> Conn:
    c = Conn()
    c.tgid, c.fd, c.start_ns = 4242, 7, 2**63 + 5
    c.t.family, c.t.lport, c.t.rport = 2, 8000, 51234
    c.t.laddr[:4] = [127, 0, 0, 1]
    c.t.raddr[:4] = [10, 1, 2, 3]
    c.state, c.delta, c.comm, c.n = 2, -17, b"nginx", 3
    c.statuses[:] = [200, 404, 503, 0]
    c.seq, c.signed = 9, -(2**40)
    c.req[:] = list(b"GET / H")
    return c


def test_every_field_reads_as_ctypes_reads_it():
    c = filled()
    layout = Layout(Conn)
    v = layout.unpack_from(bytes(c))
    assert layout.struct.size == ct.sizeof(Conn)
    assert v[layout.at["tgid"]] == 4242 and v[layout.at["fd"]] == 7
    assert v[layout.at["start_ns"]] == 2**63 + 5
    assert v[layout.at["t.family"]] == 2
    assert (v[layout.at["t.lport"]], v[layout.at["t.rport"]]) == (8000, 51234)
    assert v[layout.at["t.laddr"]] == bytes(c.t.laddr)
    assert v[layout.at["t.raddr"]][:4] == bytes([10, 1, 2, 3])
    assert v[layout.at["state"]] == 2
    assert v[layout.at["delta"]] == -17  # after 3 bytes of padding, signed
    assert v[layout.at["comm"]] == b"nginx" + b"\0" * 11
    assert v[layout.at["n"]] == 3
    assert v[layout.at["statuses"]] == (200, 404, 503, 0)
    assert v[layout.at["seq"]] == 9 and v[layout.at["signed"]] == -(2**40)
    assert v[layout.at["req"]] == b"GET / H"


def test_reads_a_ctypes_object_in_place():
    """Map entries come as ctypes objects: no copy needed to unpack them."""
    c = filled()
    layout = Layout(Conn)
    assert layout.unpack_from(c) == layout.unpack_from(bytes(c))


def test_non_integer_field_is_refused_by_name():
    class F(ct.Structure):
        _fields_ = [("ratio", ct.c_double)]

    with pytest.raises(TypeError, match="c_double"):
        Layout(F)


def test_subset_reads_only_the_named_fields_at_their_offsets():
    c = filled()
    layout = Layout(Conn)
    head = layout.subset("fd", "t.rport", "delta", "seq")
    assert head.size == ct.sizeof(Conn)
    assert head.unpack_from(bytes(c)) == (7, 51234, -17, 9)
    assert [v for v in head.iter_unpack(bytes(c) * 3)] == [(7, 51234, -17, 9)] * 3
    with pytest.raises(ValueError, match="order"):
        layout.subset("seq", "fd")
