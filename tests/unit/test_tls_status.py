"""probes.tls.tls_status: what doctor says of a process's TLS, from its /proc maps and executable."""
from __future__ import annotations

from sitsprobe.probes.tls import GO_BUILDINFO, program_with_openssl, tls_status

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


def _libssl_file() -> str:
    """The libssl this interpreter maps: an ELF file that exports SSL_read and SSL_write."""
    import ssl  # noqa: F401 (maps it)

    with open("/proc/self/maps") as f:
        return next(line.split()[5] for line in f if "/libssl.so" in line)


def program(tmp_path, pid: int, exe: str) -> str:
    """A process with no libssl mapped whose executable is ``exe`` (a real file)."""
    d = tmp_path / str(pid)
    d.mkdir(exist_ok=True)
    (d / "maps").write_text("")
    (d / "root").unlink(missing_ok=True)
    (d / "root").symlink_to("/")
    (d / "exe").unlink(missing_ok=True)
    (d / "exe").symlink_to(exe)
    return str(tmp_path)


def test_a_program_that_carries_openssl_is_readable(tmp_path):
    """Node links OpenSSL into its executable and exports its functions: that
    file is probed as a libssl is (the stand-in here: libssl's own file)."""
    exe = _libssl_file()
    ok, detail = tls_status(6, program(tmp_path, 6, exe))
    assert ok and "OpenSSL linked into the program" in detail and exe in detail
    found = program_with_openssl(6, str(tmp_path))
    assert found is not None and found.path == exe and found.kind == "openssl"


def test_a_process_that_execs_is_looked_at_again(tmp_path):
    """What is known is known of a file: the same pid after an exec is another program."""
    seen: dict = {}
    assert program_with_openssl(7, program(tmp_path, 7, "/bin/sh"), seen) is None
    assert program_with_openssl(7, program(tmp_path, 7, _libssl_file()), seen) is not None
    assert sorted(seen.values()) == [False, True]
