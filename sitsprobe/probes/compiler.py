"""bcc's compiler, one module at a time in this process.

clang and LLVM inside bcc must not run twice at once (iovisor/bcc#4500), and
making or freeing a module writes the one table storage bcc keeps for every
module of the process (a std::map, not locked). The TLS half of net.c is
compiled on a thread of its own while the agent runs (probes/tls.py), so
every compile and every free of a module holds this lock.

Each compile runs on a thread of its own, whose /proc/kallsyms is two lines
(:func:`short_kallsyms`): bcc's frontend reads the whole of it into a table
at every compile (some 120,000 symbols, 0.13-0.16 s here) to learn whether
the kernel has ``bpf_probe_read_kernel``, and ``bpf_probe_read_user`` for a
call spelled so. Every kernel sitsprobe's programs load on has both: each of
them needs a ring buffer (Linux 5.8), and those helpers came in 5.5.
"""
from __future__ import annotations

import ctypes as ct
import logging
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Callable, TypeVar

from ..errors import MapCreateError, ProbeLoadError
from .retry import soon

log = logging.getLogger(__name__)

LOCK = threading.Lock()
T = TypeVar("T")
KALLSYMS = b"ffffffff81000000 T bpf_probe_read_kernel\nffffffff81000010 T bpf_probe_read_user\n"
_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_SLAVE = 0x20000, 0x1000, 0x4000, 1 << 19
_said: list[OSError] = []  # why no compile here could see the short kallsyms
Tables = dict[int, str]  # a module's maps: their fds in this process -> their names
_LOAD_FAILED = re.compile(r"Failed to load BPF program b?'?([^':]*)'?: (.*)", re.S)  # as bcc says it


def lib():
    """libbcc, with the calls on a module's maps declared (bcc's Python leaves them out)."""
    from bcc.libbcc import lib  # the probes layer is the only one that imports bcc

    lib.bpf_num_tables.restype, lib.bpf_num_tables.argtypes = ct.c_size_t, [ct.c_void_p]
    lib.bpf_table_name.restype, lib.bpf_table_name.argtypes = ct.c_char_p, [ct.c_void_p, ct.c_size_t]
    lib.bpf_table_fd_id.restype, lib.bpf_table_fd_id.argtypes = ct.c_int, [ct.c_void_p, ct.c_size_t]
    return lib


def tables(bpf) -> Tables:
    """A module's maps: their fds in this process, and their names."""
    bcc = lib()
    return {bcc.bpf_table_fd_id(bpf.module, i): bcc.bpf_table_name(bpf.module, i).decode()
            for i in range(bcc.bpf_num_tables(bpf.module))}


_COMPILE_FAILED = "Failed to compile BPF module"  # bcc's words, for a map the kernel did not make too
_MAP_FAILED = re.compile(rb"could not open bpf map: (\S+), error: ([^\n]*)")  # and what its C code prints then


def compile_module(src_file: str, cflags: list[str]):
    """``bcc.BPF`` of one source file: compiled, its maps made (and the
    programs named for their hook loaded and put on, as bcc does). A map the
    kernel did not make (its memory limit reached) is a MapCreateError."""
    from bcc import BPF  # the probes layer is the only one that imports bcc

    with LOCK:
        said = StderrRead()
        try:
            with said:
                return kernel_load(lambda: short_kallsyms(lambda: BPF(src_file=src_file.encode(), cflags=cflags)),
                                   Path(src_file).name)
        except Exception as e:  # noqa: BLE001 (bcc raises Exception)
            failed = _MAP_FAILED.search(said.text) if str(e).startswith(_COMPILE_FAILED) else None
            if failed is None:
                raise
            raise MapCreateError(Path(src_file).name, failed[1].decode(errors="replace"),
                                 failed[2].decode(errors="replace").strip()) from e


class StderrRead:
    """What this process prints on its stderr (fd 2) within the with block,
    kept in ``text`` and printed there again when the block ends: bcc's C
    code says which map the kernel did not make there, and nowhere else.
    Every child the agent starts has a stderr of its own (a pipe, or none),
    so none inherits the file that stands in for it meanwhile."""

    text = b""

    def __enter__(self) -> StderrRead:
        self._saved, self._file = os.dup(2), tempfile.TemporaryFile()
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)
        with self._file as f:
            f.seek(0)
            self.text = f.read()
        view = memoryview(self.text)
        while view:
            view = view[os.write(2, view):]


def kernel_load(attempt: Callable[[], T], what: str) -> T:
    """``attempt()``: a compile that loads programs, or one program's load;
    tried again while the kernel refuses it for the moment (retry.soon). A
    program the kernel did not take is raised as a ProbeLoadError, which the
    CLI says in one line."""
    try:
        return soon(attempt, what)
    except Exception as e:  # noqa: BLE001 (bcc raises Exception)
        failed = _LOAD_FAILED.fullmatch(str(e))
        if failed is None:
            raise
        raise ProbeLoadError(failed[1], failed[2]) from e


def short_kallsyms(make: Callable[[], T]) -> T:
    """``make()``, on a thread of its own that sees :data:`KALLSYMS` as
    /proc/kallsyms: a mount namespace of its own (CLONE_NEWNS on one thread:
    its mounts follow the host's and none goes back), there a file with those
    lines bound over /proc/kallsyms; it ends with the thread. Where the
    namespace cannot be made (no CAP_SYS_ADMIN, a seccomp filter), ``make()``
    sees the kernel's own, as before. What ``make()`` raises is raised here.

    Nothing else may run there: bcc keeps the first table of kernel symbols a
    process reads (``BPF.ksymname``, ``BPF.support_raw_tracepoint``), so one
    read from these lines would answer every later question; a table made
    meanwhile is dropped."""
    from bcc import BPF

    caches = getattr(BPF, "_sym_caches", {})  # bcc's, class-wide: pid -> SymbolCache
    had_table = -1 in caches
    box: dict[str, object] = {}

    def run() -> None:
        try:
            _see_short_kallsyms()
        except OSError as e:
            (log.debug if _said else log.info)(
                "each compile reads all of /proc/kallsyms (0.1-0.2 s), not two lines of it: %s", e)
            _said.append(e)
        try:
            box["made"] = make()
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            box["error"] = e
        finally:
            if not had_table:
                caches.pop(-1, None)

    thread = threading.Thread(target=run, name=f"{threading.current_thread().name}-compile")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["made"]


def kallsyms_seen() -> str:
    """What a compile here reads as /proc/kallsyms, in words (`run --ebpf`)."""
    def head() -> bytes:
        with open("/proc/kallsyms", "rb") as f:
            return f.read(len(KALLSYMS) + 1)
    lines = short_kallsyms(head)
    if lines == KALLSYMS:
        return "two lines (in a mount namespace of the compile's thread)"
    return f"all of it ({_said[-1] if _said else 'no mount namespace of its own'})"


def _see_short_kallsyms() -> None:
    """This thread, in a mount namespace of its own, sees KALLSYMS as /proc/kallsyms."""
    libc = ct.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ct.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")
    fd, path = tempfile.mkstemp(prefix="sitsprobe-kallsyms-")
    try:
        with open(fd, "wb") as f:
            f.write(KALLSYMS)
        check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        check(libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None), "mount --make-rslave /")
        check(libc.mount(path.encode(), b"/proc/kallsyms", None, _MS_BIND, None),
              "mount --bind over /proc/kallsyms")
    finally:
        os.unlink(path)


def free_module(bpf) -> None:
    """bcc's cleanup of a module whose probes are off: its maps and programs go."""
    with LOCK:
        bpf.cleanup()
