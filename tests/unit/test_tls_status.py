"""probes.tls.tls_status: what doctor says of a process's TLS, from its /proc maps and executable."""
from __future__ import annotations

from sitsprobe.probes.tls import GO_BUILDINFO, tls_status

LIBSSL = "7f00-7f10 r-xp 00000000 08:01 4242 /usr/lib/x86_64-linux-gnu/libssl.so.3\n"
CYGRPC = "7e00-7e10 r-xp 00000000 08:01 77 /venv/lib/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so\n"


def proc(tmp_path, pid: int, maps: str, exe: bytes = b"\x7fELF plain") -> str:
    d = tmp_path / str(pid)
    d.mkdir()
    (d / "maps").write_text(maps)
    (d / "exe").write_bytes(exe)
    return str(tmp_path)


def test_a_process_with_libssl_is_readable(tmp_path):
    ok, detail = tls_status(1, proc(tmp_path, 1, LIBSSL))
    assert ok and "/usr/lib/x86_64-linux-gnu/libssl.so.3" in detail


def test_grpcio_carries_boringssl_even_beside_libssl(tmp_path):
    ok, detail = tls_status(2, proc(tmp_path, 2, LIBSSL + CYGRPC))
    assert not ok and "BoringSSL" in detail


def test_a_go_binary_is_named(tmp_path):
    ok, detail = tls_status(3, proc(tmp_path, 3, "", b"\x7fELF" + b"\0" * 100 + GO_BUILDINFO))
    assert not ok and "Go" in detail


def test_no_library_yet(tmp_path):
    ok, detail = tls_status(4, proc(tmp_path, 4, "", b"\x7fELF"))
    assert not ok and "no libssl mapped" in detail
    assert not tls_status(5, str(tmp_path))[0]  # gone
