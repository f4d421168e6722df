"""TLS from the library: uprobes on the OpenSSL (libssl) each traced process
maps, so HTTPS and gRPC over TLS are framed from their plaintext exactly as
cleartext is, and the ciphertext of the same connection is not reported
again (bpf/net.c: CF_TLS, ssl_enter/ssl_leave).

Python's ssl module, nginx and curl load libssl; Node's official builds
carry OpenSSL in the executable and export its functions (for native addons). The probes go
on that file (through the process's mount namespace) for that process alone:
a uprobe traps whatever runs the probed code, and every process on the node
that is not traced (a load generator, a sidecar) must not pay for it
(bench/bench_protocols.py measured +31 µs a request in an untraced client
when the probes held for every process). What cannot be seen this way is
said: a process that speaks TLS through neither (Go's crypto/tls, BoringSSL
linked into the binary, as grpcio's wheels do) keeps opaque `tls`
exchanges, and `tls_status` tells which it is.
"""
from __future__ import annotations

import ctypes as ct
import logging
import os
import re
import threading
import time
from collections.abc import Callable

from ..errors import ProbeAttachError
from . import side_by_side
from .libs import MappedLibrary, mapped_libraries
from .memory import release_compiler
from .retry import Retry, refused_for_now

log = logging.getLogger(__name__)

OPENSSL = "openssl"
_LIBRARY = {OPENSSL: re.compile(r"^libssl\.so(\.\d+)*$")}
# symbol -> entry program; every return goes to ssl_leave
SYMBOLS = {"SSL_read": "ssl_read_enter", "SSL_read_ex": "ssl_read_ex_enter",
           "SSL_write": "ssl_write_enter", "SSL_write_ex": "ssl_write_ex_enter"}
GO_BUILDINFO = b"\xff Go buildinf:"  # the magic of a Go binary's .go.buildinfo section


class TlsHooks:
    """The TLS probes of the net program: which libraries carry them, and
    which traced processes they cover (the kernel's `tls_procs`).

    Their programs are a module of their own (bpf/net.c with TLS_MODULE),
    compiled and loaded by ``load_module()`` on a thread of this class once
    the first traced process that maps a libssl is found: about a second of
    a core that no start pays before its socket probes are on, and none at
    all where no TLS is traced. A process found meanwhile waits for it
    (`attach_waiting`); where the kernel refused the load for the moment
    (probes/retry.py), it waits on while the load is tried again later: a
    process whose TLS stays opaque meanwhile is not given up."""

    def __init__(self, procs, load_module: Callable[[], object], proc: str = "/proc",
                 clock: Callable[[], float] = time.monotonic):
        self._procs = procs
        self._load_module = load_module
        self._proc = proc
        self._bpf = None  # the TLS programs' bcc module, once loaded
        self._detacher: side_by_side.Detacher | None = None  # its probes of processes gone
        self._loading: threading.Thread | None = None
        self._load_failed: str | None = None
        self._refused: str | None = None  # why the last load was refused for the moment
        self._retry = Retry(clock)  # after such a refusal, when the load is tried again
        self._waiting: set[int] = set()  # pids that map a libssl, until the module is loaded
        self._events: dict[int, list[bytes]] = {}  # pid -> its probes (bcc's event names)
        self.failed: dict[int, str] = {}  # pid -> why its libssl could not be probed
        self.covered: dict[int, str] = {}  # pid -> the library path its TLS is read through
        self._programs: dict[tuple[int, int], bool] = {}  # an executable (st_dev, st_ino) -> it carries OpenSSL

    @property
    def programs(self) -> str:
        """Where the TLS programs stand: "not needed yet", "loading", "loaded"
        or why they did not load."""
        if self._load_failed is not None:
            return self._load_failed
        if self._bpf is not None:
            return "loaded"
        if self._loading is None:
            return "not needed yet"
        if self._refused is not None and not self._loading.is_alive():
            return f"{self._refused}; trying again"
        return "loading"

    def attach(self, pid: int) -> str | None:
        """Cover pid if it maps a libssl, or its executable carries OpenSSL:
        that file's path, or None (not now: call again, it may load one, or
        the programs are still loading; or it failed, and said why once)."""
        if pid in self.covered or pid in self.failed:
            return self.covered.get(pid)
        libs = mapped_libraries(pid, _LIBRARY, "/libssl", self._proc)
        if not libs:
            program = program_with_openssl(pid, self._proc, self._programs)
            libs = [program] if program is not None else []
        if not libs:
            return None
        if self._bpf is None and self._load_failed is None:
            self._waiting.add(pid)
            self._start_loading()
            return None
        try:
            if self._load_failed is not None:
                raise ProbeAttachError("tls", libs[0].path, self._load_failed)
            self._attach(libs[0], pid)
        except ProbeAttachError as e:
            self.failed[pid] = str(e)
            log.warning("%s", e)
            return None
        self._procs[ct.c_uint(pid)] = ct.c_ubyte(1)
        self.covered[pid] = libs[0].path
        return libs[0].path

    def attach_waiting(self) -> None:
        """Put the probes on the processes that waited for the programs, once
        those are loaded (or say why they are not); after a load refused for
        the moment, once its retry is due. Cheap when none wait."""
        if self._waiting and not self._loading.is_alive() and self._retry.due():
            waiting, self._waiting = self._waiting, set()
            for pid in sorted(waiting):
                self.attach(pid)

    def _start_loading(self) -> None:
        if self._loading is not None and (self._refused is None or self._loading.is_alive()
                                          or not self._retry.due()):
            return

        def load() -> None:
            t = time.monotonic()
            try:
                self._bpf = self._load_module()
            except Exception as e:  # noqa: BLE001 (bcc raises Exception) said by each waiting process, or retried
                log.debug("tls programs", exc_info=True)
                why = f"the TLS programs did not load: {str(e) or type(e).__name__}"
                if not refused_for_now(e):
                    self._load_failed = why
                    return
                wait, self._refused = self._retry.refused(), why
                log.warning("%s; trying again in %.0f s (traced processes' TLS is opaque until then)", why, wait)
                return
            self._refused = None
            release_compiler()  # the compiler's pages go again
            log.info("tls programs loaded in %.2f s", time.monotonic() - t)

        self._loading = threading.Thread(target=load, name="tls-load", daemon=True)
        self._loading.start()

    def _attach(self, lib: MappedLibrary, pid: int) -> None:
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
        self._waiting.discard(pid)
        self.covered.pop(pid, None)
        self.failed.pop(pid, None)
        self._procs.pop(ct.c_uint(pid), None)
        events = self._events.pop(pid, ())
        if events:
            if self._detacher is None:
                self._detacher = side_by_side.Detacher(self._bpf)
            self._detacher.detach(events)

    def close(self) -> None:
        """Every probe off and the programs freed (a load under way first ends)."""
        if self._loading is not None:
            self._loading.join()
        if self._detacher is not None:
            self._detacher.close()
            self._detacher = None
        if self._bpf is not None:
            side_by_side.close(self._bpf)
            self._bpf = None


def tls_status(pid: int, proc: str = "/proc") -> tuple[bool, str]:
    """Whether pid's TLS can be read here, and through what or why not (doctor)."""
    libs = mapped_libraries(pid, _LIBRARY, "/libssl", proc)
    boring = _static_boringssl(pid, proc)
    if libs and boring:
        return False, (f"libssl mapped ({libs[0].path}): TLS through it is read; but BoringSSL is linked "
                       "into one of its modules (grpcio's cygrpc): that TLS stays opaque")
    if libs:
        return True, f"libssl mapped: {libs[0].path}"
    program = program_with_openssl(pid, proc)
    if program is not None:
        return True, f"OpenSSL linked into the program, its functions exported: {program.path}"
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


def program_with_openssl(pid: int, proc: str = "/proc",
                         seen: dict[tuple[int, int], bool] | None = None) -> MappedLibrary | None:
    """pid's executable, where OpenSSL is linked into it and exports SSL_read
    and SSL_write (Node's: for its native addons), as a library to probe;
    else None. ``seen``: what is known of executables already looked at, by
    file (a process that exec'd is looked at again)."""
    try:
        path = os.readlink(f"{proc}/{pid}/exe")  # as the process sees it
        st = os.stat(f"{proc}/{pid}/exe")
    except OSError:
        return None
    file = (st.st_dev, st.st_ino)
    found = seen.get(file) if seen is not None else None
    if found is None:
        via = f"{proc}/{pid}/root{path}"
        found = not path.endswith(" (deleted)") and all(exports(via, sym) for sym in ("SSL_read", "SSL_write"))
        if seen is not None:
            seen[file] = found
    return MappedLibrary(OPENSSL, path, f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}",
                         st.st_ino) if found else None


def exports(path: str, symbol: str) -> bool:
    """Whether the ELF file at path defines ``symbol`` (libbcc's look-up, as
    attach_uprobe makes it: a few ms in Node's 100 MB executable)."""
    from bcc.libbcc import bcc_symbol, bcc_symbol_option, lib

    sym = bcc_symbol()
    if lib.bcc_resolve_symname(path.encode(), symbol.encode(), 0, 0,
                               ct.cast(None, ct.POINTER(bcc_symbol_option)), ct.byref(sym)) < 0:
        return False
    lib.bcc_procutils_free(sym.module)
    return True


def _static_boringssl(pid: int, proc: str) -> bool:
    """A module such as grpcio's cygrpc carries BoringSSL inside it."""
    try:
        with open(f"{proc}/{pid}/maps") as f:
            return any("cygrpc" in line or "boringssl" in line.lower() for line in f)
    except OSError:
        return False

