"""Loads bpf/net.c: socket syscalls of tracked processes -> Exchange events."""
from __future__ import annotations

import contextlib
import ctypes as ct
import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from operator import itemgetter
from pathlib import Path

from .. import cpus
from ..abi import (C_NOTICES_LOST, CF_BODY, CF_CLIENT, CF_SEEDED, CF_TCP, CF_TUPLE, END_FLUSH, N_EXEC, N_LISTEN,
                   NET_COUNTERS as COUNTERS, NET_TIER_SOCK, NET_TIER_SYSCALL, ST_IDLE, ST_READING,
                   ST_RESPONDING, TCP_SENDMSG_FENTRY, TCP_SENDMSG_KPROBE, TCP_SENDMSG_TRACEPOINT)
from ..errors import MapCreateError
from ..procs import BlockedRead
from ..events import Beat, Chunk, Exchange, ProcessNotice
from ..request import Endpoint, Payload, Write
from . import apart, side_by_side
from .compiler import Tables, compile_module, free_module, lib, tables
from .kept import KeptPrograms, key as kept_key
from .bins import BPF_NOEXIST, KernelBins
from .hooks import FENTRY, KPROBE, RAW_TRACEPOINT, TRACEPOINT, Hook
from .layout import Layout
from .maps import MapCopy, discard
from .pins import pinned
from .ring import DrainBudget, RingReader, wake_bytes
from .tls import SYMBOLS as TLS_SYMBOLS, TlsHooks

log = logging.getLogger("sitsprobe")
_HOOK_CODE = {FENTRY: TCP_SENDMSG_FENTRY, KPROBE: TCP_SENDMSG_KPROBE, TRACEPOINT: TCP_SENDMSG_TRACEPOINT}
_TIER_CODE = {RAW_TRACEPOINT: NET_TIER_SOCK, TRACEPOINT: NET_TIER_SYSCALL}
# bpf/net.c's tail calls made by every program, the TLS library's too, by index
TAILS = {0: b"scan_head", 1: b"send_beat", 2: b"send_chunk", 3: b"keep_payload", 4: b"split_body", 8: b"send_more"}
# bpf/net.c's programs for several syscalls' exits (one format: one program),
# where its tier has them: the tracepoints syscalls:sys_exit_<call> each goes on
SHARED_EXITS = {b"sys_exit_io": (b"read", b"recvfrom", b"readv", b"recvmsg", b"write", b"sendto",
                                 b"writev", b"sendmsg", b"sendfile64"),
                b"sys_exit_accepted": (b"accept", b"accept4")}
_KEY = struct.Struct("=Q")  # conns key: tgid << 32 | fd
_FAMILIES = {socket.AF_INET: (socket.AF_INET, 4), socket.AF_INET6: (socket.AF_INET6, 16)}


def bpf_dir() -> Path:
    """The BPF sources, found through the package (a wheel carries them)."""
    return Path(str(resources.files("sitsprobe") / "_bpf"))


def source_flags() -> list[str]:
    """What every compile of a bpf/ source takes: the folder of its headers,
    and no debug information. bcc asks clang for DWARF (-g) to give the
    programs BTF of their own, which ours do not use (no global functions,
    spin locks or kernel pointers in maps; the kernel's BTF is another
    matter): it cost a seventh of net.c's compile, 0.2 s of every start."""
    return [f"-I{bpf_dir()}", "-g0"]


@dataclass(frozen=True)
class NetModule:
    """bpf/net.c compiled, no program loaded yet: bcc's module, and the
    programs made elsewhere and moved onto its maps: the tail-called ones
    compiled in a second process, or all of them kept from an earlier start
    (none where the module was compiled whole here). ``keep``, once its
    programs are loaded: keeps them for the next start; ``kept_at``: the
    file they came from, where they were kept."""

    bpf: object
    moved: apart.Programs
    keep: Callable[[], None] = lambda: None
    kept_at: Path | None = None


# The settings the size of each of net.c's largest maps comes from: a map the
# kernel did not make (the agent's memory limit reached) is said with them
SIZED_BY = {"exchanges": ("ring_buffer_mib",), "streams": ("ring_buffer_mib",),
            "conns": ("stitch.max_connections", "capture.request_bytes", "capture.response_bytes"),
            "bodies": ("capture.max_payloads", "capture.body_bytes", "capture.tail_bytes"),
            "chunk_bufs": ("capture.stream_bytes",)}


def compile_net(flags: list[str], kept: KeptPrograms | None = None) -> NetModule:
    """bpf/net.c compiled with ``flags``: its programs taken from ``kept``
    where an earlier start loaded them with the same key (only the maps made
    here: probes/kept.py); else compiled, in two halves side by side
    (probes/apart.py) where this process has two CPUs to run them on, else
    whole here (on one CPU the halves would take turns, each paying for its
    own parse of the source and bcc's kernel symbol table: a start 0.6-1.0 s
    slower here)."""
    try:
        return _compile_net(flags, kept)
    except MapCreateError as e:
        raise MapCreateError(e.module, e.table, e.reason, SIZED_BY.get(e.table, ())) from e


def _compile_net(flags: list[str], kept: KeptPrograms | None) -> NetModule:
    src = str(bpf_dir() / "net.c")
    if kept is None:
        return _compiled(src, flags)
    lib()  # bcc and its LLVM loaded: their builds are part of the key
    k = kept_key(bpf_dir(), flags)
    if (made := kept.get(k)) is not None:
        bpf = compile_module(src, [*flags, "-DNET_PART=3"])  # the maps, no program
        try:
            module = NetModule(bpf, apart.onto(bpf, made), kept_at=kept.folder / k)
        except ValueError as e:  # a map net.c does not make
            free_module(bpf)
            forget(kept.folder / k, e)
        except BaseException:
            free_module(bpf)
            raise
        else:
            log.info("net.c: its programs kept from an earlier start (%s)", module.kept_at)
            return module
    module = _compiled(src, flags)
    programs = apart.programs_of(module.bpf) | module.moved
    if not apart.movable(programs):
        return module
    return replace(module, keep=lambda: kept.put(k, tables(module.bpf), programs))


def forget(kept_at: Path, why: Exception) -> None:
    """Kept programs that did not load: said, and their file gone (the next
    compile keeps its own)."""
    log.warning("net.c's programs kept at %s did not load (%s); compiling them instead", kept_at, why)
    with contextlib.suppress(OSError):
        kept_at.unlink()


def _compiled(src: str, flags: list[str]) -> NetModule:
    if cpus.usable() < 2:
        return NetModule(compile_module(src, flags), {})
    tails = apart.Apart(src, [*flags, "-DNET_PART=2"])
    try:
        bpf = compile_module(src, [*flags, "-DNET_PART=1"])
    except BaseException:
        tails.close()
        raise
    try:
        return NetModule(bpf, tails.programs(bpf))
    except BaseException:
        free_module(bpf)
        raise


PID_MAX_DEFAULT = 4_194_304  # PID_MAX_LIMIT on 64-bit: what systemd sets pid_max to


def pid_bitmap_words(path: str = "/proc/sys/kernel/pid_max") -> int:
    """Words of 64 pids in net.c's tracked-process bitmaps: pid_max's (a pid
    past them, after pid_max is raised, is looked up in the hash instead)."""
    try:
        with open(path) as f:
            pid_max = int(f.read())
    except (OSError, ValueError):
        pid_max = PID_MAX_DEFAULT
    return max(1, -(-min(pid_max, PID_MAX_DEFAULT) // 64))


def conn_by_state(flags: list[str]) -> bool:
    """Whether net.c compiled with ``flags`` follows connections by their TCP
    state (its CONN_BY_STATE: cflags gives struct sock's offsets on the socket tier only)."""
    return any(f.startswith("-DSOCK_FAMILY_OFF=") for f in flags)


def tail_calls(flags: list[str]) -> dict[int, bytes]:
    """net.c's tail calls by their index in scan_prog, as compiled with ``flags``
    (7, sock_io itself, is the attached program's)."""
    calls = dict(TAILS)
    if "-DBINS=1" in flags:
        calls[5] = b"find_shape"
    if conn_by_state(flags):
        calls[6] = b"end_conn"
    return calls


def cflags(*, request_bytes: int, response_bytes: int, max_connections: int,
           ring_buffer_mib: int, socket_io: Hook, tcp_sendmsg: Hook | None = None,
           run_queue: bool = True, task_offsets: tuple[int, int] | None = None, read_waits: bool = True,
           outgoing: bool = True, stream_bytes: int = 4096,
           genai: bool = True, body_bytes: int = 512,
           tail_bytes: int = 512, write_peek_bytes: int = 384, max_writes: int = 4096,
           max_payloads: int = 4096, bins: Iterable[str] = (),
           sock_offsets: tuple[int, int, int] | None = None, pid_words: int | None = None) -> list[str]:
    """Load-time settings as -D constants (never string templating).
    ``socket_io`` is the tier chosen for the bytes of socket calls
    (hooks.SOCKET_TIER or SYSCALL_TIER); ``tcp_sendmsg`` matters on the
    syscall tier only. With ``task_offsets`` (struct task_struct's pid and
    tgid, from the kernel's BTF), the run-queue hooks are raw tracepoints. ``bins``:
    in-kernel counting's own constants (probes.bins.bin_flags); none: no such counting.
    ``sock_offsets`` (struct sock's family and type, struct unix_sock's addr,
    from the kernel's BTF) on
    the socket tier: connections followed with no syscall tracepoint
    (CONN_BY_STATE in bpf/net.c). ``pid_words``: the tracked-process
    bitmaps' size in 64-bit words (default: this kernel's pid_max)."""
    tier = _TIER_CODE[socket_io.kind]
    if tier == NET_TIER_SYSCALL and tcp_sendmsg is None:
        raise ValueError("the syscall tier needs a tcp_sendmsg hook")
    return [
        *source_flags(),
        f"-DREQ_CAP={request_bytes}",
        f"-DRESP_CAP={response_bytes}",
        f"-DMAX_CONNS={max_connections}",
        f"-DRINGBUF_PAGES={ring_buffer_mib * 256}",
        f"-DSTREAM_PAGES={ring_buffer_mib * 256}",
        f"-DRING_WAKE_BYTES={wake_bytes(ring_buffer_mib << 20)}",
        f"-DNET_TIER={tier}",
        *([f"-DTCP_SENDMSG_HOOK={_HOOK_CODE[tcp_sendmsg.kind]}"] if tier == NET_TIER_SYSCALL else []),
        f"-DRUNQ={int(run_queue)}",
        f"-DPID_WORDS={pid_words or pid_bitmap_words()}",
        *([f"-DTASK_PID_OFF={task_offsets[0]}", f"-DTASK_TGID_OFF={task_offsets[1]}"]
          if run_queue and task_offsets is not None else []),
        f"-DREAD_WAITS={int(read_waits)}",
        f"-DOUTGOING={int(outgoing)}",
        f"-DCHUNK_CAP={stream_bytes}",
        f"-DGENAI={int(genai)}",
        f"-DBODY_CAP={body_bytes}",
        f"-DTAIL_CAP={tail_bytes}",
        f"-DPEEK_CAP={write_peek_bytes}",
        f"-DMAX_WRITES={max_writes}",
        f"-DMAX_BODIES={max_payloads}",
        *bins,
        *([f"-DSOCK_FAMILY_OFF={sock_offsets[0]}", f"-DSOCK_TYPE_OFF={sock_offsets[1]}",
           f"-DUNIX_ADDR_OFF={sock_offsets[2]}"]
          if sock_offsets is not None and tier == NET_TIER_SOCK else []),
    ]


@lru_cache(maxsize=1 << 16)  # a connection's events repeat its addresses
def _endpoint(family: int, addr: bytes, port: int) -> Endpoint | None:
    fam = _FAMILIES.get(family)
    if fam is None:
        return None
    raw = addr[: fam[1]]
    if fam[0] == socket.AF_INET6 and raw[:12] == b"\0" * 10 + b"\xff\xff":
        return Endpoint(socket.inet_ntop(socket.AF_INET, raw[12:]), port)
    return Endpoint(socket.inet_ntop(fam[0], raw), port)


@lru_cache(maxsize=4096)
def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def _fill(addr, ep: Endpoint) -> int:
    family = socket.AF_INET6 if ":" in ep.address else socket.AF_INET
    raw = socket.inet_pton(family, ep.address)
    ct.memmove(addr, raw, len(raw))
    return family


class ExchangeDecoder:
    """A `struct conn` (the ring's copy, or a map entry) as an Exchange, read
    in one unpack through the layout bcc derived from the C struct."""

    _FIELDS = ("tgid", "fd", "comm", "reason", "start_ns", "last_in_ns", "first_out_ns",
               "last_out_ns", "bytes_in", "bytes_out", "flags", "t.family", "t.laddr",
               "t.lport", "t.raddr", "t.rport", "status", "pipeline", "req_len",
               "resp_len", "req", "resp", "tp_len", "tp", "ts_len", "ts", "send_ns", "runq_ns", "rwait_ns",
               "cwait_ns", "link_key", "link_start", "calls", "shape", "peer_ended")

    def __init__(self, conn_type, name_of: Callable[[int, str], str] | None = None):
        """name_of(tgid, thread's comm): the process's name for its exchanges,
        in place of the name of the thread that made the syscall (an I/O
        thread's "event_engine" is not the server's name)."""
        self.name_of = name_of or (lambda _tgid, thread: thread)
        self.layout = layout = Layout(conn_type)
        self.size = layout.struct.size
        self.iter_unpack = layout.struct.iter_unpack  # a buffer of many -> their tuples
        self.tgid_at, self.state_at = layout.at["tgid"], layout.at["state"]
        self._unpack = layout.unpack_from
        self._pick = itemgetter(*(layout.at[f] for f in self._FIELDS))

    def __call__(self, buf, reason: int | None = None) -> Exchange:
        return self.values(self._unpack(buf), reason)

    def values(self, v: tuple, reason: int | None = None) -> Exchange:
        """An Exchange from a conn already unpacked (by iter_unpack)."""
        (tgid, fd, comm, reported, start_ns, last_in_ns, first_out_ns, last_out_ns, bytes_in,
         bytes_out, flags, family, laddr, lport, raddr, rport, status, pipeline, req_len, resp_len,
         req, resp, tp_len, tp, ts_len, ts, send_ns, runq_ns, rwait_ns, cwait_ns, link_key, link_start,
         calls, shape, peer_ended) = self._pick(v)
        return Exchange(
            tgid=tgid, fd=fd, comm=self.name_of(tgid, _comm(comm)),
            reason=reported if reason is None else reason,
            start_ns=start_ns, last_in_ns=last_in_ns,
            first_out_ns=first_out_ns, last_out_ns=last_out_ns,
            bytes_in=bytes_in, bytes_out=bytes_out, flags=flags,
            local=_endpoint(family, laddr, lport) if flags & CF_TUPLE else None,
            peer=_endpoint(family, raddr, rport) if flags & CF_TUPLE or family else None,
            status=status, pipeline=pipeline,
            req=req[:req_len], resp=resp[:resp_len],
            traceparent=tp[:tp_len], tracestate=ts[:ts_len],
            send_ns=send_ns, runq_ns=runq_ns, read_wait_ns=rwait_ns, cache_wait_ns=cwait_ns,
            link_key=link_key, link_start=link_start, calls=calls, shape=shape, peer_ended=peer_ended,
        )


def _tail(ring: bytes, pos: int, cap: int) -> bytes:
    """The last bytes a tail ring of struct body holds, in order."""
    if pos <= cap:
        return ring[:pos]
    off = pos % cap
    return ring[off:cap] + ring[:off]


class PayloadDecoder:
    """The records the exchanges ring carries besides a bare `struct conn`:
    `struct conn_body` (an exchange with its payload pieces) and `struct
    beat` (one response write), told apart by their size."""

    def __init__(self, body_type, beat_type):
        body = Layout(body_type)
        self.tail_cap = body_type.req_tail.size // 2  # a ring, and the room the verifier asks for
        self._body = body.subset("req_tail_pos", "resp_tail_pos", "writes", "body_len", "body",
                                 "req_tail", "resp_tail")
        beat = Layout(beat_type)
        self.beat_size = beat.struct.size
        self._beat = beat.subset("tgid", "fd", "start_ns", "ts_ns", "size", "pipeline", "peek_len",
                                 "data_lines", "json_lines", "scanned", "delta_lines", "output_lines",
                                 "special_lines", "peek_at", "peek")

    def payload(self, buf: bytes) -> Payload:
        """The `struct body` at the end of a conn_body record."""
        req_pos, resp_pos, writes, body_len, body, req_tail, resp_tail = self._body.unpack_from(
            buf, len(buf) - self._body.size)
        cap = self.tail_cap
        return Payload(request_body=body[:body_len], request_tail=_tail(req_tail, req_pos, cap),
                       response_tail=_tail(resp_tail, resp_pos, cap), writes_total=writes)

    def beat(self, buf: bytes) -> Beat:
        tgid, fd, start_ns, ts_ns, size, pipeline, peek_len, *lines, peek_at, peek = self._beat.unpack_from(buf)
        return Beat((tgid, fd, start_ns, pipeline), Write(ts_ns, size, peek[:peek_len], *lines), peek_at)


class ChunkDecoder:
    """A `struct chunk` ring record (its head, then the bytes copied) as a Chunk."""

    _FIELDS = ("tgid", "fd", "ts_ns", "size", "len", "flags", "dir", "t.family", "t.lport",
               "t.rport", "t.laddr", "t.raddr", "link_key", "link_start", "peer_ended")

    def __init__(self, chunk_type):
        head = dict(chunk_type._fields_)["h"]
        layout = Layout(head)
        self._size = layout.struct.size
        self._unpack = layout.unpack_from
        self._pick = itemgetter(*(layout.at[f] for f in self._FIELDS))

    def __call__(self, buf: bytes) -> Chunk:
        tgid, fd, ts_ns, size, n, flags, direction, family, lport, rport, laddr, raddr, link_key, \
            link_start, peer_ended = self._pick(self._unpack(buf))
        tuple_ok = flags & CF_TUPLE
        return Chunk(tgid, fd, ts_ns, direction, size, flags,
                     _endpoint(family, laddr, lport) if tuple_ok else None,
                     _endpoint(family, raddr, rport) if tuple_ok else None,
                     buf[self._size:self._size + n], link_key, link_start, peer_ended)


class NetProbe(RingReader):
    """The loaded network program and its maps. Only this class touches them."""

    RINGS = ("exchanges", "notices", "streams")

    def __init__(self, flags: list[str], on_exchange: Callable[[Exchange], None],
                 on_notice: Callable[[ProcessNotice], None],
                 name_of: Callable[[int, str], str] | None = None,
                 on_beat: Callable[[Beat], None] = lambda _beat: None,
                 on_chunk: Callable[[Chunk], None] = lambda _chunk: None, compiled=None,
                 proc: str = "/proc", kept: KeptPrograms | None = None):
        """compiled: compile_net(flags), already made (probes.ahead); else
        compiled here, with ``kept``; proc: where an untracked process's
        threads are listed."""
        from bcc.libbcc import lib  # the probes layer is the only one that imports bcc

        self._lib = lib
        self._flags = flags
        self._kept = kept
        self.socket_tier = f"-DNET_TIER={NET_TIER_SOCK}" in flags
        module = compiled if compiled is not None else compile_net(flags, kept)
        try:
            self._load(module)
        except Exception as e:  # bcc raises Exception
            if module.kept_at is None:
                raise
            forget(module.kept_at, e)
            module = compile_net(flags, kept)
            self._load(module)
        module.keep()
        self.tls = TlsHooks(self._bpf["tls_procs"], self._load_tls)
        self.bins = KernelBins(self._bpf) if "-DBINS=1" in flags else None
        self._conns = self._bpf["conns"]
        self._tracked = self._bpf["tracked"]
        self._user_bits = self._bpf["user_bits"]
        self._runnable = self._bpf["runnable"] if "-DRUNQ=1" in flags else None
        self._proc = proc
        self._conn_type = self._conns.Leaf
        self._decode = decode = ExchangeDecoder(self._conn_type, name_of)
        self._copy = MapCopy(self._conns, "conns")
        # a quiet keep-alive connection stays in the map for good: the flush tick
        # glances at (start_ns, state, pipeline, seq) and decodes only entries
        # that changed since. start_ns tells a new connection on the same fd
        # from the old one, whose seq may have been the same.
        self._glance = self._decode.layout.subset("start_ns", "state", "pipeline", "seq")
        self._last_seen: dict[int, tuple[int, Exchange]] = {}  # key -> (seq, decoded)
        # and one the agent reported itself (dismiss) is passed over at a glance
        # until another exchange begins on it: most of a gateway's thousands
        self._dismissed: dict[int, tuple[int, int]] = {}  # key -> the reported (start_ns, pipeline)
        self._notice_map = self._bpf["notices"]

        self._bodies = self._bpf["bodies"]
        self._payloads = payloads = PayloadDecoder(self._bodies.Leaf, self._bpf["beat_layout"].Leaf)
        self._budget = DrainBudget()

        self._beats_read = self._beats_told = 0
        self._beats_read_fd = self._bpf["beats_read"].map_fd

        def exchange_cb(_ctx, data, size):
            if size == decode.size:
                on_exchange(decode(ct.string_at(data, size)))
            elif size == payloads.beat_size:
                on_beat(payloads.beat(ct.string_at(data, size)))
                self._beats_read += 1
                return 0  # a write is not an exchange: it spends no drain budget
            else:
                buf = ct.string_at(data, size)
                on_exchange(decode(buf)._replace(payload=payloads.payload(buf)))
            return self._budget.take()

        def notice_cb(_ctx, data, _size):
            n = self._notice_map.event(data)
            kind = {N_EXEC: "exec", N_LISTEN: "listen"}.get(n.kind, "exit")
            on_notice(ProcessNotice(kind, n.tgid, n.comm.decode(errors="replace")))

        chunk = ChunkDecoder(self._bpf["chunk_bufs"].sLeaf)  # a per-CPU array: sLeaf is one entry

        def chunk_cb(_ctx, data, size):
            on_chunk(chunk(ct.string_at(data, size)))
            return 0

        self._bpf["exchanges"].open_ring_buffer(exchange_cb)
        self._notice_map.open_ring_buffer(notice_cb)
        self._bpf["streams"].open_ring_buffer(chunk_cb)

    def _load(self, module: NetModule) -> None:
        self._bpf, self._moved = module.bpf, module.moved
        try:
            self._attach()
        except BaseException:  # nothing of it stays: its exported maps would shadow the next one's
            side_by_side.close(self._bpf)
            raise

    def _attach(self) -> None:
        """Load the kernel's programs (verified side by side) and put them on."""
        from bcc import BPF

        # tail-called, never attached; each of the type of the programs that call it
        caller = BPF.RAW_TRACEPOINT if self.socket_tier else BPF.TRACEPOINT
        tails = tail_calls(self._flags)
        exits = [fn for fn in SHARED_EXITS
                 if fn in self._moved or self._lib.bpf_function_start(self._bpf.module, fn)]
        apart.put_on(self._bpf, self._moved)  # programs kept from an earlier start: bcc put on none
        loaded = side_by_side.load(self._bpf, (*tails.values(), b"sock_io") if self.socket_tier
                                   else (*tails.values(), *exits), caller, self._moved)
        for i, fn in zip(tails, loaded):
            self._bpf[b"scan_prog"][ct.c_int(i)] = ct.c_int(fn.fd)
        if conn_by_state(self._flags):  # end_conn's: sock_io again; inet_sock_set_state's two
            self._bpf[b"scan_prog"][ct.c_int(7)] = ct.c_int(loaded[len(tails)].fd)
            for i, fn in enumerate((b"end_conn_tp", b"tracepoint__sock__inet_sock_set_state")):
                self._bpf[b"state_prog"][ct.c_int(i)] = ct.c_int(
                    apart.load_func(self._bpf, fn, BPF.TRACEPOINT, self._moved).fd)
        if self.socket_tier:
            for tp in (b"sock_send_length", b"sock_recv_length"):  # one program, both ways
                self._bpf.attach_raw_tracepoint(tp=tp, fn_name=b"sock_io")
        for fn in exits:
            apart.load_func(self._bpf, fn, BPF.TRACEPOINT, self._moved)  # loaded already on the syscall tier
            for call in SHARED_EXITS[fn]:
                self._bpf.attach_tracepoint(tp=b"syscalls:sys_exit_" + call, fn_name=fn)

    def _load_tls(self):
        """The TLS library's programs: net.c again, with -DTLS_MODULE, on this
        module's maps (pinned for the compile); compiled and loaded (about a
        second: TlsHooks runs it on a thread, once a traced process maps a
        libssl), then kept; or loaded as an earlier start kept them, onto the
        TLS module's maps made anew (-DNET_PART=3: a third of the time)."""
        flags = [*self._flags, "-DTLS_MODULE=1"]
        if self._kept is None:
            return self._tls_module(flags)
        k = kept_key(bpf_dir(), flags)  # the pins' folder is no part of it: a fresh one each time
        made = self._kept.get(k)
        if made is not None:
            try:
                tls = self._tls_module(flags, made)
            except Exception as e:  # bcc raises Exception; ValueError: a map net.c does not make
                forget(self._kept.folder / k, e)
            else:
                log.info("tls programs kept from an earlier start (%s)", self._kept.folder / k)
                return tls
        tls = self._tls_module(flags)
        self._kept.put(k, tables(tls), apart.programs_of(tls))
        return tls

    def _tls_module(self, flags: list[str], made: tuple[Tables, apart.Programs] | None = None):
        """The TLS module compiled with ``flags``, its programs loaded: its own,
        or ``made`` (kept from an earlier start) moved onto its maps."""
        from bcc import BPF

        with pinned(self._bpf) as pins:  # opened from there by the TLS module's BPF_TABLE_PINNED
            tls = compile_module(str(bpf_dir() / "net.c"), [*flags, f'-DTLS_PINS="{pins}"',
                                                            *(["-DNET_PART=3"] if made is not None else [])])
        try:
            moved = apart.onto(tls, made) if made is not None else {}
            entries = [entry.encode() for entry in TLS_SYMBOLS.values()]
            user_tails = [b"u" + name for name in TAILS.values()]
            loaded = side_by_side.load(tls, [*user_tails, b"ssl_leave", *entries], BPF.KPROBE, moved)
            for i, fn in zip(TAILS, loaded):
                self._bpf[b"uscan_prog"][ct.c_int(i)] = ct.c_int(fn.fd)
        except BaseException:
            side_by_side.close(tls)
            raise
        return tls

    def track(self, tgid: int) -> None:
        self._user_bit(tgid, True)  # first: a set bit sends the kernel's test on to the hash
        self._tracked[ct.c_uint(tgid)] = ct.c_ubyte(1)

    def select_ports(self, ports: Iterable[int]) -> None:
        """A process that begins listening on one of these is tracked by the
        kernel at once (and notified): no rescan interval of requests unseen."""
        for port in ports:
            self._bpf["ports"][ct.c_ushort(port)] = ct.c_ubyte(1)

    def untrack(self, tgid: int) -> None:
        discard(self._tracked, ct.c_uint(tgid))
        self._user_bit(tgid, False)
        self._forget_waits(tgid)

    def _forget_waits(self, tgid: int) -> None:
        """Take tgid's threads out of the kernel's `runnable` (bpf/net.c): on
        the raw run-queue hooks the kernel takes a thread out as it runs only
        while its process is tracked, so one that was waiting to run as it
        was untracked would stay, and hand its wait to a later thread of a
        traced process given its id. A process that is gone has none there:
        each of its threads ran to its exit while it was tracked."""
        if self._runnable is None:
            return
        try:
            tids = os.listdir(f"{self._proc}/{tgid}/task")
        except OSError:
            return
        for tid in tids:
            if tid.isdigit():
                discard(self._runnable, ct.c_uint(int(tid)))

    def _user_bit(self, tgid: int, on: bool) -> None:
        """tgid's bit in user_bits (bpf/net.c): only this thread writes it."""
        word, bit = divmod(tgid, 64)
        if word >= self._user_bits.max_entries:
            return
        key = ct.c_int(word)
        value = self._user_bits[key].value
        self._user_bits[key] = ct.c_ulonglong(value | 1 << bit if on else value & ~(1 << bit))

    def seed(self, tgid: int, fd: int, comm: str, local: Endpoint, peer: Endpoint, client: bool = False) -> None:
        """Track a connection the process had before it was tracked: one it
        accepted, or with ``client`` one it opened (its calls to come)."""
        c = self._conn_type()
        c.tgid, c.fd, c.comm = tgid, fd, comm.encode()[:15]
        c.t.family = _fill(c.t.laddr, local)
        _fill(c.t.raddr, peer)
        c.t.lport, c.t.rport = local.port, peer.port
        c.flags = CF_TUPLE | CF_TCP | CF_SEEDED | (CF_CLIENT if client else 0)  # from /proc/net/tcp: TCP
        key = self._conns.Key((tgid << 32) | fd)
        # BPF_NOEXIST: the process is already tracked while we read /proc, so
        # the kernel may have taken this connection, mid-exchange, meanwhile.
        # Its entry is the truth; a fresh one over it would lose that exchange.
        # A full map or an entry already there: nothing to do either way.
        self._lib.bpf_update_elem(self._conns.map_fd, ct.byref(key), ct.byref(c), BPF_NOEXIST)

    def adopt_reads(self, tgid: int, reads: list[BlockedRead], still: Callable[[], list[BlockedRead]]) -> int:
        """Follow reads that began before the process was tracked (a thread
        blocked on a seeded connection): give each the entry record its
        syscall's enter half would have made, so its exit frames the request.
        ``still()`` reads them again: a thread that returned meanwhile leaves
        a record no syscall of its own will take, which is removed. The
        socket tier needs no entry record: the read's registers say it all."""
        if self.socket_tier:
            return len(reads)
        inflight = self._bpf["inflight"]
        now = time.monotonic_ns()
        for r in reads:
            inflight[inflight.Key((tgid << 32) | r.tid)] = inflight.Leaf(r.buf, now, r.fd, r.kind)
        waiting = set(still())
        for r in reads:
            if r not in waiting:
                discard(inflight, inflight.Key((tgid << 32) | r.tid))
        return len(waiting & set(reads))

    def consume(self) -> None:
        super().consume()
        if self._beats_read != self._beats_told:  # the kernel's write events may use the room again
            self._beats_told = self._beats_read
            self._lib.bpf_update_elem(self._beats_read_fd, ct.byref(ct.c_int(0)),
                                      ct.byref(ct.c_uint64(self._beats_read)), 0)

    def open_exchanges(self) -> list[tuple[Exchange, int]]:
        """Every connection with an exchange in progress, with its state.

        The kernel may be updating an entry while we copy it. A responding
        exchange is given as ST_RESPONDING (which the agent may flush) only
        when no update was in progress (even `seq`) and a second read finds
        `seq` unchanged: no update overlapped the first copy. A torn copy
        would be flushed with the wrong bytes and the kernel's own report of
        it then dropped as a duplicate. Otherwise it is given as ST_READING:
        still in flight, looked at again on the next tick."""
        _, keys, values = self._copy.read()
        size, last, now = self._decode.size, self._last_seen, {}
        dismissed, still = self._dismissed, {}
        out = []
        glance = zip(_KEY.iter_unpack(keys), self._glance.iter_unpack(values))
        for i, ((key,), (start, state, pipeline, seq)) in enumerate(glance):
            if state == ST_IDLE:
                continue
            if dismissed.get(key) == (start, pipeline):
                still[key] = start, pipeline
                continue
            seen = last.get(key)
            if seen is not None and seen[0] == (start, seq) and not seq % 2:
                ex = seen[1]  # untouched since the last tick: settled, and already decoded
            else:
                ex = self._with_payload(key, self._decode(values[i * size:(i + 1) * size], END_FLUSH))
                if state == ST_RESPONDING and not self._settled(key, seq):
                    state = ST_READING
            now[key] = ((start, seq), ex)
            out.append((ex, state))
        self._last_seen, self._dismissed = now, still
        return out

    def dismiss(self, ex: Exchange) -> None:
        """The agent reported the open exchange ``ex`` itself (its framing
        said it ended): open_exchanges passes its connection over from now
        on, until another exchange begins there (a new start, or the next
        response of pipelined requests) or the connection goes. A quiet
        keep-alive connection then costs a tick a glance at its entry."""
        self._dismissed[(ex.tgid << 32) | ex.fd] = ex.start_ns, ex.pipeline

    def _with_payload(self, key: int, ex: Exchange) -> Exchange:
        """An open exchange with the payload pieces the kernel keeps beside it."""
        if not ex.flags & CF_BODY:
            return ex
        b = self._bodies.get(self._bodies.Key(key))
        if b is None or b.start_ns != ex.start_ns:
            return ex
        return ex._replace(payload=self._payloads.payload(bytes(ct.string_at(ct.byref(b), ct.sizeof(b)))))

    def _entries(self) -> list[tuple[int, tuple]]:
        """(key, unpacked conn) for every connection in the map now: copied
        out in a syscall or a few, and unpacked while the buffers are ours."""
        _, keys, values = self._copy.read()
        return list(zip((k for (k,) in _KEY.iter_unpack(keys)), self._decode.iter_unpack(values)))

    def claim(self, ex: Exchange) -> bool:
        """Whether the agent may count an open CF_BINNED exchange it flushes
        (KernelBins.claim); False: the kernel counts it and reports it."""
        key = (ex.tgid << 32) | ex.fd
        seen = self._last_seen.get(key)
        if seen is None or self.bins is None:
            return False

        def unchanged() -> bool:
            again = self._conns.get(self._conns.Key(key))
            return again is not None and (again.start_ns, again.seq) == seen[0]
        return self.bins.claim(key, ex.start_ns, unchanged)

    def _settled(self, key: int, seq: int) -> bool:
        if seq % 2:
            return False
        again = self._conns.get(self._conns.Key(key))
        return again is not None and again.seq == seq

    def forget(self, tgid: int) -> list[Exchange]:
        """Drop a dead process's connections, returning its open exchanges."""
        pending = []
        at_tgid, at_state = self._decode.tgid_at, self._decode.state_at
        for key, v in self._entries():
            if v[at_tgid] == tgid:
                if v[at_state] != ST_IDLE:
                    pending.append(self._with_payload(key, self._decode.values(v, END_FLUSH)))
                discard(self._conns, self._conns.Key(key))  # the kernel may close it meanwhile
                discard(self._bodies, self._bodies.Key(key))
        return pending

    def counters(self) -> dict[str, int]:
        """The kernel's counters, and the write events read (those lost: writes_lost)."""
        table = self._bpf["counters"]
        return {name: sum(table[ct.c_int(i)]) for i, name in enumerate(COUNTERS)} | {
            "writes_read": self._beats_read}

    def notices_lost(self) -> int:
        """Process notices (exec, exit, listen) the kernel could not send: its ring was full."""
        return sum(self._bpf["counters"][ct.c_int(C_NOTICES_LOST)])

    def take_counts(self, tgid: int) -> tuple[dict[int, int], int]:
        """A dead process's final kernel counts, removed from the maps:
        (responses by status, of which on untracked connections)."""
        statuses, table = {}, self._bpf["http_status"]
        for k in [k for k in table.keys() if k.tgid == tgid]:
            per_cpu = table.get(k)
            if per_cpu is not None:
                statuses[k.status] = sum(per_cpu)
            discard(table, k)
        untracked = self._bpf["untracked"]
        key = untracked.Key(tgid)
        per_cpu = untracked.get(key)
        discard(untracked, key)
        return statuses, sum(per_cpu) if per_cpu is not None else 0

    def untracked_counts(self) -> dict[int, int]:
        """HTTP responses counted on connections the full table could not take, by tgid."""
        return {k.value: sum(v) for k, v in self._bpf["untracked"].items()}

    def status_counts(self) -> dict[tuple[int, int], int]:
        """Exact in-kernel HTTP response counts by (tgid, status)."""
        return {(k.tgid, k.status): sum(v) for k, v in self._bpf["http_status"].items()}

    def close(self) -> None:
        self.tls.close()  # its programs first: they use this module's maps
        side_by_side.close(self._bpf)
