"""Find the server processes to trace, and their sockets, by reading /proc.

Every function takes the /proc root as ``proc`` so tests can point it at a
fixture tree. Processes come and go while we read: a pid whose files vanish
or turn unreadable mid-read is skipped, never raised.
"""
from __future__ import annotations

import ipaddress
import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Container, Iterable, Iterator

from sitsprobe.abi import K_FLAT, K_IOV, K_MSG
from sitsprobe.request import Endpoint

# Errors a /proc read gets when the process exits, or isn't ours, mid-read.
_GONE = (FileNotFoundError, ProcessLookupError, PermissionError)
_COMM_LEN = 15  # the kernel truncates comm to TASK_COMM_LEN - 1 bytes
TCP_ESTABLISHED = 0x01
TCP_LISTEN = 0x0A


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    comm: str
    cmdline: str  # NUL-separated args joined by spaces


@dataclass(frozen=True, slots=True)
class TcpRow:
    local: Endpoint
    remote: Endpoint
    state: int
    inode: int  # 0 for sockets no process holds yet (unaccepted)


@dataclass(frozen=True, slots=True)
class Selector:
    """Which processes to trace: one matching criterion is enough."""

    pids: tuple[int, ...] = ()
    comms: tuple[str, ...] = ()
    cmdline: tuple[str, ...] = ()  # regexes, re.search'd against ProcInfo.cmdline
    ports: tuple[int, ...] = ()  # listening TCP ports
    _comms: frozenset[str] = field(init=False, repr=False, compare=False)
    _patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("pids", "comms", "cmdline", "ports"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "_comms", frozenset(c[:_COMM_LEN] for c in self.comms))
        object.__setattr__(self, "_patterns", tuple(re.compile(p) for p in self.cmdline))

    def empty(self) -> bool:
        return not (self.pids or self.comms or self.cmdline or self.ports)

    def matches(self, info: ProcInfo, listening: frozenset[int] = frozenset()) -> bool:
        return (
            info.pid in self.pids
            or info.comm in self._comms
            or any(p.search(info.cmdline) for p in self._patterns)
            or not listening.isdisjoint(self.ports)
        )


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except _GONE:
        return None


def _comm(pid: int, proc: str) -> str | None:
    raw = _read(f"{proc}/{pid}/comm")
    return None if raw is None else raw.rstrip(b"\n").decode(errors="replace")


def _cmdline(pid: int, proc: str) -> str | None:
    raw = _read(f"{proc}/{pid}/cmdline")
    return None if raw is None else raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def _pids(proc: str) -> Iterator[int]:
    try:
        names = os.listdir(proc)
    except _GONE:
        return
    yield from (int(n) for n in names if n.isdigit())


def read_info(pid: int, proc: str = "/proc") -> ProcInfo | None:
    """The process's comm and cmdline; None if it is gone."""
    comm = _comm(pid, proc)
    cmdline = None if comm is None else _cmdline(pid, proc)
    return None if cmdline is None else ProcInfo(pid, comm, cmdline)


def processes(proc: str = "/proc") -> Iterator[ProcInfo]:
    """Every live user process; kernel threads (empty cmdline) and zombies are skipped."""
    for pid in _pids(proc):
        info = read_info(pid, proc)
        if info is not None and info.cmdline:
            yield info


def socket_inodes(pid: int, proc: str = "/proc") -> dict[int, int]:
    """Socket inode -> fd for the pid's open sockets (lowest fd for dup'ed ones)."""
    fd_dir = f"{proc}/{pid}/fd"
    try:
        fds = sorted(int(n) for n in os.listdir(fd_dir) if n.isdigit())
    except _GONE:
        return {}
    inodes: dict[int, int] = {}
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except _GONE:
            continue  # closed since listdir
        if target.startswith("socket:[") and target.endswith("]"):
            inodes.setdefault(int(target[8:-1]), fd)
    return inodes


def _endpoint(hex_endpoint: str) -> Endpoint:
    # The kernel prints each 32-bit word of the address in host byte order
    # (little-endian on every platform we run on); the port is plain hex.
    addr_hex, port_hex = hex_endpoint.split(":")
    raw = bytes.fromhex(addr_hex)
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(packed)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return Endpoint(str(addr), int(port_hex, 16))


def tcp_table(pid: int, proc: str = "/proc", tables: dict | None = None,
              state: int | None = None) -> list[TcpRow]:
    """TCP sockets (v4 and v6) of the network namespace the pid lives in;
    with ``state``, only those in that state.

    Reading them walks the kernel's whole socket hash, milliseconds on a
    large host: give a ``tables`` dict to read each namespace once. Only the
    rows kept have their endpoints decoded: most of a busy host's are in
    TIME_WAIT, which no caller asks for."""
    if tables is not None:
        try:
            netns = os.readlink(f"{proc}/{pid}/ns/net")
        except (*_GONE, OSError):  # a fixture tree has none: read as usual
            netns = None
        if netns is not None:
            if (netns, state) not in tables:
                tables[netns, state] = tcp_table(pid, proc, state=state)
            return tables[netns, state]
    want = None if state is None else f"{state:02X}"  # as the kernel prints it
    rows = []
    for name in ("tcp", "tcp6"):  # tcp6 is absent when IPv6 is disabled
        raw = _read(f"{proc}/{pid}/net/{name}")
        for line in (raw or b"").decode().splitlines()[1:]:
            f = line.split()
            if want is None or f[3] == want:
                rows.append(TcpRow(_endpoint(f[1]), _endpoint(f[2]), int(f[3], 16), int(f[9])))
    return rows


def _owned(pid: int, proc: str, state: int, tables: dict | None = None,
           inodes: dict[int, int] | None = None) -> list[tuple[int, TcpRow]]:
    """(fd, row) for the pid's own sockets in ``state``, by fd."""
    if inodes is None:
        inodes = socket_inodes(pid, proc)
    if not inodes:
        return []  # skip reading the (large) net tables
    owned = [(inodes[r.inode], r) for r in tcp_table(pid, proc, tables, state) if r.inode in inodes]
    return sorted(owned, key=lambda pair: pair[0])


def listening_ports(pid: int, proc: str = "/proc", tables: dict | None = None) -> frozenset[int]:
    return frozenset(row.local.port for _, row in _owned(pid, proc, TCP_LISTEN, tables))


class Names(dict):
    """pid -> process name, for every traced process and the last ``keep``
    that exited (their alerts and folded counts still name them): bounded,
    however many processes come and go. A pid traced again is kept anew."""

    def __init__(self, keep: int = 4096):
        super().__init__()
        self.keep = keep
        self._gone: dict[int, None] = {}  # retired pids, oldest first

    def __setitem__(self, pid: int, name: str) -> None:
        self._gone.pop(pid, None)
        super().__setitem__(pid, name)

    def retire(self, pid: int) -> None:
        """pid exited: its name is kept until ``keep`` later ones have."""
        if pid in self:
            self._gone.pop(pid, None)
            self._gone[pid] = None
        while len(self._gone) > self.keep:
            oldest = next(iter(self._gone))
            del self._gone[oldest]
            self.pop(oldest, None)


class ListenMemo:
    """Listening ports of untraced processes, remembered across rescans.

    Reading them walks the kernel's whole socket hash once per network
    namespace (milliseconds each on a big host; a node has a namespace per
    pod), every rescan. A process's ports are read again only when its set of
    sockets changes, or when they are ``max_age_s`` old: a socket made before
    one rescan may begin listening after it."""

    def __init__(self, max_age_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.max_age_s = max_age_s
        self._clock = clock
        self._memo: dict[int, tuple[frozenset[int], float, frozenset[int]]] = {}

    def ports(self, pid: int, proc: str, tables: dict) -> frozenset[int]:
        inodes = socket_inodes(pid, proc)
        if not inodes:
            self._memo.pop(pid, None)
            return frozenset()
        now, sockets = self._clock(), frozenset(inodes)
        memo = self._memo.get(pid)
        if memo is not None and memo[0] == sockets and now - memo[1] < self.max_age_s:
            return memo[2]
        ports = frozenset(row.local.port for _, row in _owned(pid, proc, TCP_LISTEN, tables, inodes))
        self._memo[pid] = (sockets, now, ports)
        return ports

    def keep(self, pids: Container[int]) -> None:
        """Forget processes not in ``pids`` (they exited)."""
        for pid in [p for p in self._memo if p not in pids]:
            del self._memo[pid]


def ports_listened_on(pid: int, proc: str = "/proc", tables: dict | None = None) -> frozenset[int]:
    """The TCP ports some socket listens on in the pid's network namespace,
    whichever process holds it: an accepted connection's local port is one."""
    return frozenset(row.local.port for row in tcp_table(pid, proc, tables, TCP_LISTEN))


def established(pid: int, proc: str = "/proc") -> list[tuple[int, Endpoint, Endpoint]]:
    """(fd, local, peer) for each established TCP connection the pid holds."""
    return [(fd, row.local, row.remote) for fd, row in _owned(pid, proc, TCP_ESTABLISHED)]


# Reads a thread may be blocked in, by syscall number: how it passes its buffer
# (enum call_kind: a flat buffer, an iovec array, a msghdr).
READ_SYSCALLS = {
    "x86_64": {0: K_FLAT, 45: K_FLAT, 19: K_IOV, 47: K_MSG},  # read, recvfrom, readv, recvmsg
    "aarch64": {63: K_FLAT, 207: K_FLAT, 65: K_IOV, 212: K_MSG},
}.get(os.uname().machine, {})


@dataclass(frozen=True, slots=True)
class BlockedRead:
    """A thread inside a read-like syscall on one of a process's fds."""

    tid: int
    fd: int
    kind: int  # READ_SYSCALLS' value
    buf: int  # the buffer (or iovec array, or msghdr) argument


def blocked_reads(pid: int, fds: Container[int], proc: str = "/proc") -> list[BlockedRead]:
    """The threads of ``pid`` blocked in a read on one of ``fds`` now, from
    /proc/PID/task/TID/syscall ("nr arg0 arg1 ..." in hex while in a syscall).
    A server thread waiting for the next request on a connection it took
    before we looked is here: its read began before any probe could see it."""
    out = []
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except _GONE:
        return []
    for tid in tids:
        raw = _read(f"{proc}/{pid}/task/{tid}/syscall")
        fields = raw.split() if raw else []
        if len(fields) < 3 or not fields[0].isdigit() or not tid.isdigit():
            continue  # "running", or not in a syscall ("-1 ...")
        kind = READ_SYSCALLS.get(int(fields[0]))
        try:
            fd, buf = int(fields[1], 16), int(fields[2], 16)
        except ValueError:
            continue
        if kind is not None and fd in fds:
            out.append(BlockedRead(int(tid), fd, kind, buf))
    return out


def select(
    selector: Selector, proc: str = "/proc", need_ports: bool | None = None,
    known: Container[int] = (), memo: ListenMemo | None = None, pids: Iterable[int] | None = None,
) -> dict[int, ProcInfo]:
    """Every process the selector matches, by pid; the agent itself only if listed by pid.

    Cheap first: comm for every pid, cmdline only with a cmdline regex, and
    fds plus net tables only with ports (or ``need_ports``) and no other match,
    each network namespace's table read once (and, with a ``memo``, only for
    processes whose sockets changed). Pids in ``known`` (already traced)
    match as long as they live: their sockets are not looked at again.
    ``pids``: look at these only (default: every process in ``proc``).
    """
    if need_ports is None:
        need_ports = bool(selector.ports)
    me = os.getpid()
    found = {}
    tables: dict = {}
    if pids is None:
        pids = list(_pids(proc))
        if memo is not None:
            memo.keep(set(pids))
    for pid in pids:
        if pid == me and pid not in selector.pids:
            continue
        if pid in known:
            if (info := read_info(pid, proc)) is not None:
                found[pid] = info
            continue
        comm = _comm(pid, proc)
        cmdline = "" if comm is None or not selector.cmdline else _cmdline(pid, proc)
        if comm is None or cmdline is None:
            continue
        info = ProcInfo(pid, comm, cmdline)
        if not selector.matches(info) and not (
            need_ports and selector.matches(info, memo.ports(pid, proc, tables) if memo
                                            else listening_ports(pid, proc, tables))
        ):
            continue
        if not selector.cmdline:  # only matches pay for reading cmdline
            info = read_info(pid, proc)
        if info is not None and info.cmdline:  # not a kernel thread or zombie
            found[pid] = info
    return found


class Rescan:
    """select() once a rescan interval, reading only the processes that may
    have changed since the last. A process's comm and cmdline change when it
    execs (which the kernel tells the agent of as it happens: bpf/net.c's
    exec notice; the agent then calls ``fresh``) or when it renames itself
    (prctl, setproctitle), which no event tells, and which a program does
    mostly as it starts. So a process found unselected is read at every scan
    for its first ``settle_s`` (from when a scan first saw it, or its exec;
    those the first scan finds are old already), then passed over; every
    ``full_every_s`` all are read again. The processes in ``known`` (traced)
    are read each time: a rename changes the name their requests carry.

    What it saves is what every node pays for the agent while nothing
    happens: a whole scan reads a file or two of every process on the node
    (about 13 µs each here; a node runs hundreds to thousands)."""

    def __init__(self, selector: Selector, proc: str = "/proc", memo: ListenMemo | None = None,
                 settle_s: float = 10.0, full_every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.selector = selector
        self.proc = proc
        self.memo = memo
        self.settle_s = settle_s
        self.full_every_s = full_every_s
        self._clock = clock
        self._next_full = clock()
        self.unselected: dict[int, float] = {}  # pid -> since when the scans have found it so
        self._scans = 0

    def read_all(self) -> None:
        """The next scan reads every process (an exec the kernel could not tell of)."""
        self._next_full = self._clock()

    def fresh(self, pid: int) -> None:
        """pid exec'd: read it at every scan again, for settle_s."""
        self.unselected.pop(pid, None)

    def __call__(self, known: Container[int] = ()) -> dict[int, ProcInfo]:
        now = self._clock()
        listed = set(_pids(self.proc))
        self.unselected = {pid: t for pid, t in self.unselected.items() if pid in listed}
        if now >= self._next_full:
            self._next_full = now + self.full_every_s
            looked = listed
        else:
            looked = listed.difference(pid for pid, t in self.unselected.items() if now - t >= self.settle_s)
        if self.memo is not None:
            self.memo.keep(listed)
        found = select(self.selector, self.proc, known=known, memo=self.memo, pids=sorted(looked))
        since = now if self._scans else now - self.settle_s
        self._scans += 1
        for pid in looked:
            if pid in found or pid in known:
                self.unselected.pop(pid, None)
            else:
                self.unselected.setdefault(pid, since)
        return found
