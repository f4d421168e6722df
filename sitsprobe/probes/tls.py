"""TLS from the library: uprobes on the OpenSSL (libssl) each traced process
maps, so HTTPS and gRPC over TLS are framed from their plaintext exactly as
cleartext is, and the ciphertext of the same connection is not reported
again (bpf/net.c: CF_TLS, ssl_enter/ssl_leave).

Python's ssl module, nginx, curl and Node's addons load libssl; the probes go
on the library file (through the process's mount namespace) for that process
alone: a uprobe traps whatever runs the probed code, and every process on the
node that is not traced (a load generator, a sidecar) must not pay for it
(bench/bench_protocols.py measured +31 µs a request in an untraced client
when the probes held for every process). What cannot be seen this way is said: a
process that speaks TLS without a libssl mapped (Go's crypto/tls, BoringSSL
linked into the binary, as grpcio's wheels do) keeps opaque `tls` exchanges,
and `tls_status` tells which it is.
"""
from __future__ import annotations

import ctypes as ct
import logging
import re

from ..errors import ProbeAttachError
from .libs import MappedLibrary, mapped_libraries

log = logging.getLogger(__name__)

OPENSSL = "openssl"
_LIBRARY = {OPENSSL: re.compile(r"^libssl\.so(\.\d+)*$")}
# symbol -> entry program; every return goes to ssl_leave
SYMBOLS = {"SSL_read": "ssl_read_enter", "SSL_read_ex": "ssl_read_ex_enter",
           "SSL_write": "ssl_write_enter", "SSL_write_ex": "ssl_write_ex_enter"}
GO_BUILDINFO = b"\xff Go buildinf:"  # the magic of a Go binary's .go.buildinfo section


class TlsHooks:
    """The TLS probes of the net program (its ``bpf``): which libraries carry
    them, and which traced processes they cover (the kernel's `tls_procs`)."""

    def __init__(self, bpf, proc: str = "/proc", prepare=lambda: None):
        """``prepare()`` runs before the first probe goes on (loading what
        only the probes need: nothing of it is paid where no TLS is traced)."""
        self._bpf = bpf
        self._proc = proc
        self._prepare = prepare
        self._procs = bpf["tls_procs"]
        self._events: dict[int, list[bytes]] = {}  # pid -> its probes (bcc's event names)
        self.failed: dict[int, str] = {}  # pid -> why its libssl could not be probed
        self.covered: dict[int, str] = {}  # pid -> the library path its TLS is read through

    def attach(self, pid: int) -> str | None:
        """Cover pid if it maps a libssl: the library's path, or None (not now:
        call again, it may load one; or it failed, and said why once)."""
        if pid in self.covered or pid in self.failed:
            return self.covered.get(pid)
        for lib in mapped_libraries(pid, _LIBRARY, "/libssl", self._proc):
            try:
                self._attach(lib, pid)
            except ProbeAttachError as e:
                self.failed[pid] = str(e)
                log.warning("%s", e)
                return None
            self._procs[ct.c_uint(pid)] = ct.c_ubyte(1)
            self.covered[pid] = lib.path
            return lib.path
        return None

    def _attach(self, lib: MappedLibrary, pid: int) -> None:
        self._prepare()
        via = f"{self._proc}/{pid}/root{lib.path}"  # the file in the process's mount namespace
        before, done = set(self._bpf.uprobe_fds), []
        for sym, entry in SYMBOLS.items():
            try:
                self._bpf.attach_uprobe(name=via.encode(), sym=sym.encode(), fn_name=entry.encode(), pid=pid)
                self._bpf.attach_uretprobe(name=via.encode(), sym=sym.encode(), fn_name=b"ssl_leave", pid=pid)
            except Exception as e:  # noqa: BLE001 (bcc raises Exception) the others may still attach
                log.warning("%s", ProbeAttachError("tls", f"{lib.path}:{sym}", str(e)))
                continue
            done.append(sym)
        self._events[pid] = [ev for ev in self._bpf.uprobe_fds if ev not in before]
        if not done:
            raise ProbeAttachError("tls", lib.path, "none of " + ", ".join(SYMBOLS) + " could be probed")
        log.info("tls probes on %s for pid %d: %s", lib.path, pid, ", ".join(done))

    def forget(self, pid: int) -> None:
        """pid exited (or is no longer traced): its probes go."""
        self.covered.pop(pid, None)
        self.failed.pop(pid, None)
        self._procs.pop(ct.c_uint(pid), None)
        for ev in self._events.pop(pid, ()):
            try:
                self._bpf.detach_uprobe_event(ev)
            except Exception as e:  # noqa: BLE001 (bcc raises Exception) the rest still go
                log.debug("tls probe %s: %s", ev.decode(errors="replace"), e)


def tls_status(pid: int, proc: str = "/proc") -> tuple[bool, str]:
    """Whether pid's TLS can be read here, and through what or why not (doctor)."""
    libs = mapped_libraries(pid, _LIBRARY, "/libssl", proc)
    boring = _static_boringssl(pid, proc)
    if libs and boring:
        return False, (f"libssl mapped ({libs[0].path}): TLS through it is read; but BoringSSL is linked "
                       "into one of its modules (grpcio's cygrpc): that TLS stays opaque")
    if libs:
        return True, f"libssl mapped: {libs[0].path}"
    exe = f"{proc}/{pid}/exe"
    try:
        with open(exe, "rb") as f:
            head = f.read(1 << 22)
    except OSError as e:
        return False, f"no libssl mapped, and {exe} cannot be read ({e.strerror})"
    if GO_BUILDINFO in head:
        return False, "a Go binary: its crypto/tls is not OpenSSL; its TLS stays opaque"
    if b"BoringSSL" in head or boring:
        return False, "BoringSSL linked into the program or one of its modules; its TLS stays opaque"
    return False, "no libssl mapped (it may load one later); its TLS stays opaque until then"


def _static_boringssl(pid: int, proc: str) -> bool:
    """A module such as grpcio's cygrpc carries BoringSSL inside it."""
    try:
        with open(f"{proc}/{pid}/maps") as f:
            return any("cygrpc" in line or "boringssl" in line.lower() for line in f)
    except OSError:
        return False

