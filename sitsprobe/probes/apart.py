"""Part of a bcc module's programs compiled in a second process while this one
compiles the rest, then loaded here on this one's maps.

LLVM's work is most of the agent's start, and bcc's compiler runs one compile
at a time in a process (compiler.py). net.c's socket tier took 1.4-1.9 s to
compile here; its two halves (bpf/net.c's NET_PART) about 1.0 s each, side by
side on two cores. The second process makes maps of its own, unused: its
programs name them by their fds in their 64-bit immediate loads, so each is
rewritten to the fd of this module's map of the same name before the program
is loaded here. Nothing of the second process outlives the compile.

    python -m sitsprobe.probes.apart SOURCE [CFLAG...]

is that process: its programs and its maps' names, marshalled on stdout."""
from __future__ import annotations

import ctypes as ct
import logging
import marshal
import os
import struct
import subprocess
import sys
from pathlib import Path

from . import child
from .compiler import Tables, compile_module, free_module, kernel_load, lib, tables

log = logging.getLogger("sitsprobe")

BPF_LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW: two instructions, the second's imm the high half
MAP_BY_FD = (1, 2)  # its src_reg: BPF_PSEUDO_MAP_FD, BPF_PSEUDO_MAP_VALUE (imm: the map's fd)

Programs = dict[bytes, bytes]  # program name -> its instructions


# bcc loads and puts on, at a compile, the programs named for their hook; of
# those kinds, put_on does the tracepoints' for programs compiled elsewhere
HOOKED = (b"tracepoint__", b"raw_tracepoint__")
_AUTOLOADED = (b"kprobe__", b"kretprobe__", b"tracepoint__", b"raw_tracepoint__", b"kfunc__", b"kretfunc__",
               b"lsm__")  # bcc's BPF._trace_autoload


def programs_of(bpf) -> Programs:
    """Every program of a compiled module, its instructions as compiled."""
    bcc = lib()
    names = [bcc.bpf_function_name(bpf.module, i) for i in range(bcc.bpf_num_functions(bpf.module))]
    return {name: ct.string_at(bcc.bpf_function_start(bpf.module, name), bcc.bpf_function_size(bpf.module, name))
            for name in names}


def compiled(src: str, flags: list[str]) -> tuple[Tables, Programs]:
    """``src`` compiled with ``flags`` in this process: its maps and every
    program's instructions; the module freed."""
    bpf = compile_module(src, flags)
    try:
        return tables(bpf), programs_of(bpf)
    finally:
        free_module(bpf)


def relocate(code: bytes, theirs: Tables, ours: dict[str, int]) -> bytes:
    """``code`` with each map it names by fd (in ``theirs``) named by the fd of
    our map of that name (``ours``)."""
    out = bytearray(code)
    i = 0
    while i + 16 <= len(out):
        if out[i] != BPF_LD_IMM64:
            i += 8
            continue
        if out[i + 1] >> 4 in MAP_BY_FD:
            fd, = struct.unpack_from("<i", out, i + 4)
            try:
                struct.pack_into("<i", out, i + 4, ours[theirs[fd]])
            except KeyError:
                raise ValueError(f"instruction {i // 8} loads map fd {fd}, "
                                 f"{'a map named ' + theirs[fd] if fd in theirs else 'no map'} "
                                 f"of the other compile, which this module does not have") from None
        i += 16
    return bytes(out)


def onto(bpf, made: tuple[Tables, Programs]) -> Programs:
    """Another compile's programs (``made``: its maps and programs), each on
    ``bpf``'s map of the same name."""
    theirs, progs = made
    ours = {name: fd for fd, name in tables(bpf).items()}
    return {name: relocate(code, theirs, ours) for name, code in progs.items()}


def movable(programs: Programs) -> bool:
    """Whether every program of ``programs`` that bcc would put on at a
    compile is one put_on puts on: a tracepoint's, the kind these machines
    load and test (a kfunc's would need the kernel BTF id bcc finds at a
    compile; a kprobe's was never tried)."""
    return all(name.startswith(tuple(HOOKED)) for name in programs if name.startswith(_AUTOLOADED))


def put_on(bpf, programs: Programs) -> None:
    """What bcc does at a compile for the programs named for their hook
    (``tracepoint__sched__sched_process_exec``,
    ``raw_tracepoint__sched_switch``), for those of ``programs`` not loaded
    yet: each loaded and put on."""
    from bcc import BPF

    for name in programs:
        if name in bpf.funcs:
            continue
        if name.startswith(b"tracepoint__"):
            load_func(bpf, name, BPF.TRACEPOINT, programs)
            bpf.attach_tracepoint(tp=name[len(b"tracepoint__"):].replace(b"__", b":"), fn_name=name)
        elif name.startswith(b"raw_tracepoint__"):
            load_func(bpf, name, BPF.RAW_TRACEPOINT, programs)
            bpf.attach_raw_tracepoint(tp=name[len(b"raw_tracepoint__"):], fn_name=name)


class Apart:
    """``src``'s compile with ``flags``, begun in a second process."""

    def __init__(self, src: str, flags: list[str]):
        self._src, self._flags = src, flags
        try:
            self._child: subprocess.Popen | None = child.start(__name__, src, *flags)
            self._why = ""
        except OSError as e:
            self._child, self._why = None, f"{sys.executable}: {e.strerror}"

    def programs(self, bpf) -> Programs:
        """The second compile's programs, on ``bpf``'s maps. Where the second
        process failed, compiled in this one (after the first: slower), and
        the failure logged."""
        made, why = None, self._why
        if self._child is not None:
            try:
                made = marshal.loads(child.answer(self._child))
            except child.ChildFailed as e:
                why = str(e)
            except (ValueError, EOFError, TypeError) as e:
                why = f"unreadable answer ({e})"
        if made is None:
            log.warning("compiling %s's tail-called programs in a second process failed (%s); compiling "
                        "them here, after the rest: the start is slower", Path(self._src).name, why)
            made = compiled(self._src, self._flags)
        return onto(bpf, made)

    def close(self) -> None:
        """A compile not taken: the second process stopped."""
        if self._child is not None:
            child.stop(self._child)


def load_func(bpf, name: bytes, prog_type: int, apart: Programs):
    """bcc's ``bpf.load_func``, for a program of ``apart`` too (bcc's
    Function, kept in ``bpf.funcs``: bcc's cleanup closes it); tried again
    while the kernel refuses it for the moment, else a ProbeLoadError
    (compiler.kernel_load)."""
    return kernel_load(lambda: _load_func(bpf, name, prog_type, apart), name.decode())


def _load_func(bpf, name: bytes, prog_type: int, apart: Programs):
    if name not in apart or name in bpf.funcs:
        return bpf.load_func(name, prog_type)
    from bcc import BPF

    bcc = lib()
    code = ct.create_string_buffer(apart[name], len(apart[name]))
    fd = bcc.bcc_func_load(bpf.module, prog_type, name, code, len(apart[name]), bcc.bpf_module_license(bpf.module),
                           bcc.bpf_module_kern_version(bpf.module), 0, None, 0, None, -1)
    if fd < 0:  # as bcc's load_func says it
        raise Exception(f"Failed to load BPF program {name.decode()}: {os.strerror(ct.get_errno())}")
    bpf.funcs[name] = fn = BPF.Function(bpf, name, fd)
    return fn


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    made = compiled(argv[0], argv[1:])
    sys.stdout.buffer.write(marshal.dumps(made))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
