"""Loads bpf/net.c: socket syscalls of tracked processes -> Exchange events."""
from __future__ import annotations

import ctypes as ct
import socket
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

from ..events import CF_SEEDED, CF_TUPLE, END_FLUSH, Exchange, ProcessNotice
from ..request import Endpoint
from .hooks import FENTRY, KPROBE, TRACEPOINT, Hook
from .ring import DrainBudget

# bpf/sitsprobe.h
ST_IDLE, ST_READING, ST_RESPONDING = 0, 1, 2
BPF_NOEXIST = 1  # map update flag: create only
COUNTERS = ("exchanges", "lost", "conn_overflow", "notices_lost", "inflight_lost")
_HOOK_CODE = {FENTRY: 1, KPROBE: 2, TRACEPOINT: 3}
_FAMILIES = {socket.AF_INET: (socket.AF_INET, 4), socket.AF_INET6: (socket.AF_INET6, 16)}


def bpf_dir() -> Path:
    """The BPF sources, found through the package (a wheel carries them)."""
    return Path(str(resources.files("sitsprobe") / "_bpf"))


def cflags(*, request_bytes: int, response_bytes: int, max_connections: int,
           ring_buffer_mib: int, tcp_sendmsg: Hook) -> list[str]:
    """Load-time settings as -D constants (never string templating)."""
    return [
        f"-I{bpf_dir()}",
        f"-DREQ_CAP={request_bytes}",
        f"-DRESP_CAP={response_bytes}",
        f"-DMAX_CONNS={max_connections}",
        f"-DRINGBUF_PAGES={ring_buffer_mib * 256}",
        f"-DTCP_SENDMSG_HOOK={_HOOK_CODE[tcp_sendmsg.kind]}",
    ]


def _endpoint(family: int, addr, port: int) -> Endpoint | None:
    fam = _FAMILIES.get(family)
    if fam is None:
        return None
    raw = bytes(addr)[: fam[1]]
    if fam[0] == socket.AF_INET6 and raw[:12] == b"\0" * 10 + b"\xff\xff":
        return Endpoint(socket.inet_ntop(socket.AF_INET, raw[12:]), port)
    return Endpoint(socket.inet_ntop(fam[0], raw), port)


def _fill(addr, ep: Endpoint) -> int:
    family = socket.AF_INET6 if ":" in ep.address else socket.AF_INET
    raw = socket.inet_pton(family, ep.address)
    ct.memmove(addr, raw, len(raw))
    return family


def decode(c, reason: int | None = None) -> Exchange:
    """A `struct conn` (bcc's ctypes view of the C struct) as an Exchange."""
    t = c.t
    has_tuple = c.flags & CF_TUPLE or t.family
    local = _endpoint(t.family, t.laddr, t.lport) if c.flags & CF_TUPLE else None
    peer = _endpoint(t.family, t.raddr, t.rport) if has_tuple else None
    n = c.n_responses
    return Exchange(
        tgid=c.tgid, fd=c.fd, comm=c.comm.decode(errors="replace"),
        reason=c.reason if reason is None else reason,
        start_ns=c.start_ns, last_in_ns=c.last_in_ns,
        first_out_ns=c.first_out_ns, last_out_ns=c.last_out_ns,
        bytes_in=c.bytes_in, bytes_out=c.bytes_out, flags=c.flags,
        local=local, peer=peer,
        statuses=tuple(c.statuses[: min(n, len(c.statuses))]), n_responses=n,
        req=ct.string_at(ct.addressof(c.req), min(c.req_len, len(c.req))),
        resp=ct.string_at(ct.addressof(c.resp), min(c.resp_len, len(c.resp))),
    )


class NetProbe:
    """The loaded network program and its maps. Only this class touches them."""

    def __init__(self, flags: list[str], on_exchange: Callable[[Exchange], None],
                 on_notice: Callable[[ProcessNotice], None]):
        from bcc import BPF  # the probes layer is the only one that imports bcc

        self._bpf = BPF(src_file=str(bpf_dir() / "net.c").encode(), cflags=flags)
        self._conns = self._bpf["conns"]
        self._tracked = self._bpf["tracked"]
        self._conn_type = self._conns.Leaf
        self._notice_map = self._bpf["notices"]

        self._budget = DrainBudget()

        def exchange_cb(_ctx, data, _size):
            on_exchange(decode(self._conn_type.from_address(data)))
            return self._budget.take()

        def notice_cb(_ctx, data, _size):
            n = self._notice_map.event(data)
            on_notice(ProcessNotice("exec" if n.kind == 1 else "exit", n.tgid,
                                    n.comm.decode(errors="replace")))

        self._bpf["exchanges"].open_ring_buffer(exchange_cb)
        self._notice_map.open_ring_buffer(notice_cb)

    def track(self, tgid: int) -> None:
        self._tracked[ct.c_uint(tgid)] = ct.c_ubyte(1)

    def untrack(self, tgid: int) -> None:
        self._tracked.pop(ct.c_uint(tgid), None)

    def seed(self, tgid: int, fd: int, comm: str, local: Endpoint, peer: Endpoint) -> None:
        """Track a connection that was accepted before the agent started."""
        c = self._conn_type()
        c.tgid, c.fd, c.comm = tgid, fd, comm.encode()[:15]
        c.t.family = _fill(c.t.laddr, local)
        _fill(c.t.raddr, peer)
        c.t.lport, c.t.rport = local.port, peer.port
        c.flags = CF_TUPLE | CF_SEEDED
        key = self._conns.Key((tgid << 32) | fd)
        # BPF_NOEXIST: the process is already tracked while we read /proc, so
        # the kernel may have taken this connection, mid-exchange, meanwhile.
        # Its entry is the truth; a fresh one over it would lose that exchange.
        # A full map or an entry already there: nothing to do either way.
        from bcc.libbcc import lib

        lib.bpf_update_elem(self._conns.map_fd, ct.byref(key), ct.byref(c), BPF_NOEXIST)

    def poll(self, timeout_ms: int) -> None:
        """Wait up to timeout_ms (exchanges never wake us: a wakeup per event
        would cost the traced server microseconds per request), then drain."""
        self._budget.refill()
        self._bpf.ring_buffer_poll(timeout_ms)
        self._budget.refill()
        self._bpf.ring_buffer_consume()

    def open_exchanges(self) -> Iterator[tuple[Exchange, int]]:
        """Every connection with an exchange in progress, with its state.

        The kernel may be updating an entry while we copy it. A responding
        exchange is given as ST_RESPONDING (which the agent may flush) only
        when no update was in progress (even `seq`) and a second read finds
        `seq` unchanged: no update overlapped the first copy. A torn copy
        would be flushed with the wrong bytes and the kernel's own report of
        it then dropped as a duplicate. Otherwise it is given as ST_READING:
        still in flight, looked at again on the next tick."""
        for key, c in list(self._conns.items()):
            if c.state == ST_IDLE:
                continue
            state = c.state
            if state == ST_RESPONDING and not self._settled(key, c.seq):
                state = ST_READING
            yield decode(c, END_FLUSH), state

    def _settled(self, key, seq: int) -> bool:
        if seq % 2:
            return False
        again = self._conns.get(key)
        return again is not None and again.seq == seq

    def forget(self, tgid: int) -> list[Exchange]:
        """Drop a dead process's connections, returning its open exchanges."""
        pending = []
        for key, c in list(self._conns.items()):
            if c.tgid == tgid:
                if c.state != ST_IDLE:
                    pending.append(decode(c, END_FLUSH))
                self._conns.pop(key, None)
        return pending

    def counters(self) -> dict[str, int]:
        table = self._bpf["counters"]
        return {name: sum(table[ct.c_int(i)]) for i, name in enumerate(COUNTERS)}

    def status_counts(self) -> dict[tuple[int, int], int]:
        """Exact in-kernel HTTP response counts by (tgid, status)."""
        return {(k.tgid, k.status): sum(v) for k, v in self._bpf["http_status"].items()}

    def close(self) -> None:
        self._bpf.cleanup()
