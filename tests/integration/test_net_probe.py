"""The network probe on its own: the hooks each socket tier puts on, a full
connection table, the compile that follows the plan (and a guess at it),
the TLS programs, tracking and run-queue waits. What it reports of a
server's exchanges: test_net_probe_exchanges.py."""
from __future__ import annotations

import ctypes as ct
import errno
import json
import marshal
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter

import pytest

from sitsprobe import config
from sitsprobe.probes import capability, net_plan, probe_aside
from sitsprobe.probes.kept import KeptPrograms
from sitsprobe.probes.net import NetProbe, cflags, pid_bitmap_words

from .conftest import Server, made_as_keys_come, require_root, wait_until
from .test_net import Client


# the socket tier follows connections by their first call and TCP state where
# the kernel's BTF allows (what the agent does), else by the accept, connect
# and close syscall tracepoints (its fallback): both are run here
TIERS = {"socket": ("socket", True), "socket-syscall-conns": ("socket", False), "syscall": ("syscall", False)}


def make_probe(tier: str, by_state: bool, max_connections: int = 1024, pid_words: int | None = None,
               task_offsets: tuple[int, int] | None = None, kept: KeptPrograms | None = None) -> NetProbe:
    require_root()
    pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is not importable")
    plan = capability.plan(capability.probe_all(), socket_hooks=tier)["net"]
    if plan["socket_io"] is None:
        pytest.skip(f"the {tier} tier does not load here (see `sitsprobe doctor`)")
    offsets = net_plan.connection_offsets() if by_state else None
    if by_state and offsets is None:
        pytest.skip("the kernel's BTF has no struct sock family/type or unix_sock addr")
    seen = []
    p = NetProbe(cflags(request_bytes=256, response_bytes=64, max_connections=max_connections,
                        ring_buffer_mib=1, socket_io=plan["socket_io"], tcp_sendmsg=plan.get("tcp_sendmsg"),
                        sock_offsets=offsets, pid_words=pid_words, task_offsets=task_offsets),
                 seen.append, lambda _notice: None, kept=kept)
    p.seen = seen
    return p


def _paths(probe: NetProbe) -> list[bytes]:
    probe.poll(0)
    return [ex.req.split(b" ")[1] for ex in probe.seen if ex.req]


def _syscall_tracepoints() -> set[str]:
    """The syscall tracepoints this process has programs on (bpftool perf)."""
    out = subprocess.run(["bpftool", "-j", "perf", "show"], capture_output=True, text=True, check=True)
    return {e.get("tracepoint", "") for e in json.loads(out.stdout or "[]")
            if e.get("pid") == os.getpid() and e.get("tracepoint", "").startswith("sys_")}


def test_the_socket_tier_puts_no_syscall_tracepoint_on_where_btf_allows():
    """Any enabled syscall tracepoint sends every syscall of every task on the
    node through the kernel's tracing slow path (bench/bench_floor.py)."""
    if shutil.which("bpftool") is None:
        pytest.skip("bpftool is not installed")
    p = make_probe("socket", True)
    try:
        assert _syscall_tracepoints() == set()
    finally:
        p.close()
    p = make_probe("socket", False)  # the fallback: the connection syscalls' tracepoints
    try:
        assert {"sys_enter_close", "sys_exit_accept4", "sys_exit_connect"} <= _syscall_tracepoints()
    finally:
        p.close()


def test_every_syscall_the_syscall_tier_enters_it_also_leaves():
    """The exits share programs (net.SHARED_EXITS: one format, one program),
    which userspace attaches to each: none may be left out."""
    if shutil.which("bpftool") is None:
        pytest.skip("bpftool is not installed")
    p = make_probe("syscall", False)
    try:
        on = _syscall_tracepoints()
    finally:
        p.close()
    entered = {t.removeprefix("sys_enter_") for t in on if t.startswith("sys_enter_")}
    left = {t.removeprefix("sys_exit_") for t in on if t.startswith("sys_exit_")}
    assert {"read", "sendfile64", "accept4", "connect"} <= entered
    assert left == entered - {"close"}  # a close is done at its entry


def test_a_full_table_lets_go_of_every_connection_that_closes():
    """The socket tier ends a connection when TCP says it closed, found by its
    socket (`sk_conns`). With the table full that index holds as many entries
    as it has room for: were it an LRU map, the kernel would evict some early
    (its free lists are per CPU), their closes would go unseen, and an
    exchange still open on one would never be reported nor its slot freed.
    The connections it refused are still counted, as their keys come: the
    per-CPU counts are not made for every possible CPU at the start."""
    room = 64
    p = make_probe("socket", True, max_connections=room)
    server = Server(None)
    try:
        p.track(server.pid)
        for round_ in range(3):  # each round: the table filled, then emptied
            clients = [Client(server.port) for _ in range(room + 8)]  # the last few are refused
            for i, c in enumerate(clients):
                c.request("GET", f"/{round_}/{i}")
            wait_until(lambda: len(p._conns) == room, 10, "the table to fill")
            for c in clients:
                c.close()
            wait_until(lambda: len(p._conns) == 0, 10, f"every closed connection to leave the table ({round_})")
        p.poll(0)
        assert sorted(ex.req.split(b" ")[1] for ex in p.seen if ex.req) == sorted(
            f"/{r}/{i}".encode() for r in range(3) for i in range(room)), "the connections the table took"
        assert p.status_counts().get((server.pid, 200)) == 3 * (room + 8)
        assert p.untracked_counts() == {server.pid: 3 * 8}
        assert made_as_keys_come(p._bpf["http_status"]) and made_as_keys_come(p._bpf["untracked"])
    finally:
        server.stop()
        p.close()


def test_the_tail_programs_are_compiled_here_when_the_second_process_fails(monkeypatch, caplog):
    """net.c's tail-called half is compiled in a second process (probes.apart);
    where that fails, it is compiled in this one, said, and works the same:
    a closed connection's exchange is reported (end_conn_tp, of that half)."""
    with monkeypatch.context() as m:
        m.setattr(sys, "executable", "/bin/false")  # the second process exits 1
        p = make_probe("socket", True)
    assert "in a second process failed (exit status 1" in caplog.text
    _ends_a_closed_connection(p, "/apart")


def _by_name(made: tuple[dict[int, str], dict[bytes, bytes]]) -> dict[bytes, bytes]:
    """A compile's programs (with its maps by fd), each map they name by fd
    named by its name's place among the maps' names: two compiles' alike."""
    from sitsprobe.probes import apart

    theirs, progs = made
    named = {name: i for i, name in enumerate(sorted(set(theirs.values())))}
    return {fn: apart.relocate(code, theirs, named) for fn, code in progs.items()}


@pytest.mark.parametrize("which", ["socket", "syscall"])  # the ladder's ends
def test_the_two_halves_programs_are_the_whole_s_instruction_for_instruction(which):
    """net.c's halves (NET_PART 1 here, 2 in the second process, with one-entry
    maps of its own) make exactly the programs a whole compile makes, each
    the same instructions once its maps are named alike."""
    from sitsprobe.probes import apart
    from sitsprobe.probes.net import bpf_dir

    require_root()
    pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is not importable")
    hook, by_state = TIERS[which]
    plan = capability.plan(capability.probe_all(), socket_hooks=hook)["net"]
    if plan["socket_io"] is None:
        pytest.skip(f"the {hook} tier does not load here (see `sitsprobe doctor`)")
    offsets = net_plan.connection_offsets() if by_state else None
    flags = cflags(request_bytes=256, response_bytes=64, max_connections=1024, ring_buffer_mib=1,
                   socket_io=plan["socket_io"], tcp_sendmsg=plan.get("tcp_sendmsg"), sock_offsets=offsets)

    def programs(part: str) -> dict[bytes, bytes]:
        return _by_name(apart.compiled(str(bpf_dir() / "net.c"), [*flags, part]))

    whole, first, second = (programs(f"-DNET_PART={n}") for n in (0, 1, 2))
    assert not first.keys() & second.keys() and first.keys() | second.keys() == whole.keys()
    assert [fn for fn, code in (first | second).items() if code != whole[fn]] == [], "not the whole's"
    assert b"sock_io" in first if hook == "socket" else b"sys_exit_io" in first
    assert b"scan_head" in second and (b"end_conn_tp" in second) == by_state


# The settings that size what net.c compiles: its maps' values, and the
# loops and copies the verifier walks (capture.max_payloads, the number of
# bodies' entries, and capture.max_writes, a count, size neither)
SIZED = ("capture.request_bytes", "capture.response_bytes", "capture.body_bytes", "capture.tail_bytes",
         "capture.write_peek_bytes", "capture.stream_bytes")
VERIFIER_LIMIT = 1_000_000  # instructions the kernel's verifier follows in one program, at most
BPF_LOG_STATS = 4


def _bounds(key: str) -> tuple[int, int]:
    """The least and the most the config allows for key (its rule's own words)."""
    lo, hi = re.search(r"(\d+)\.\.(\d+)", config._RULES[key].desc).groups()
    return int(lo), int(hi)


def _verified(bpf, name: bytes, prog_type: int) -> int:
    """Instructions the verifier followed to load bpf's program `name`."""
    from bcc.libbcc import lib

    log = ct.create_string_buffer(1 << 16)
    fd = lib.bcc_func_load(bpf.module, prog_type, name, lib.bpf_function_start(bpf.module, name),
                           lib.bpf_function_size(bpf.module, name), lib.bpf_module_license(bpf.module),
                           lib.bpf_module_kern_version(bpf.module), BPF_LOG_STATS, log, len(log), None, -1)
    text = log.value.decode(errors="replace")
    assert fd >= 0, f"{name.decode()} refused: {os.strerror(ct.get_errno())}\n{text[-1500:]}"
    os.close(fd)
    return int(re.search(r"processed (\d+) insns", text)[1])


@pytest.mark.parametrize(("hook", "end"), [("socket", 1), ("syscall", 1), ("socket", 0)],
                         ids=["socket-widest", "syscall-widest", "socket-narrowest"])
def test_every_size_the_config_allows_compiles_and_verifies_well_within_the_verifiers_limit(hook, end):
    """With every size setting at the most (or the least) the config allows,
    net.c compiles and each of its loops' programs verifies in under half
    the instructions the verifier follows, so that a kernel whose verifier
    walks more still loads them. Found wanting: request_bytes past 1,791 was
    refused ("the sequence of 8193 jumps is too complex"), stream_bytes
    16384 made a map value larger than a per-CPU one may be, and send_beat
    took 830k at the defaults."""
    from bcc import BPF

    from sitsprobe.probes.net import SHARED_EXITS, bpf_dir, tail_calls

    require_root()
    conf = config.load(overrides={**{k: _bounds(k)[end] for k in SIZED}, "socket_hooks": hook})
    flags = net_plan.plan_net(conf).flags
    bpf = BPF(src_file=str(bpf_dir() / "net.c").encode(), cflags=flags)
    try:
        kind = BPF.RAW_TRACEPOINT if hook == "socket" else BPF.TRACEPOINT
        names = [*tail_calls(flags).values(), *([b"sock_io"] if hook == "socket" else SHARED_EXITS)]
        walked = {name.decode(): _verified(bpf, name, kind) for name in names}
    finally:
        bpf.cleanup()
    assert {n: w for n, w in walked.items() if w >= VERIFIER_LIMIT // 2} == {}, walked


def test_on_one_cpu_net_c_is_compiled_whole_here():
    """With one CPU to run on (a container's limit; here this thread's
    affinity), the halves would only take turns: net.c is compiled whole in
    this process, no second one, and ends a closed connection the same."""
    cpu = min(os.sched_getaffinity(0))
    was = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        p = make_probe("socket", True)
    finally:
        os.sched_setaffinity(0, was)
    whole = p._moved == {} and p._bpf.funcs.get(b"end_conn") is not None  # loaded from this module
    _ends_a_closed_connection(p, "/whole")
    assert whole


def _hooks(p: NetProbe) -> set[str]:
    """Where ``p``'s programs are put on: bcc's record of its tracepoints and
    raw tracepoints, and the kernel's of the tracepoints (bpftool perf)."""
    out = subprocess.run(["bpftool", "-j", "perf", "show"], capture_output=True, text=True, check=True)
    perf = {f"kernel: {e['tracepoint']}" for e in json.loads(out.stdout or "[]")
            if e.get("pid") == os.getpid() and "tracepoint" in e}
    return perf | {f"bcc: {tp!r}" for tp in [*p._bpf.tracepoint_fds, *p._bpf.raw_tracepoint_fds]}


@pytest.mark.parametrize("which", list(TIERS))
def test_programs_kept_by_a_start_are_the_next_one_s_on_maps_made_anew(which, tmp_path):
    """A start keeps net.c's programs once they are loaded (probes/kept.py);
    the next, with the same flags, compiles only the maps, loads the kept
    programs onto them and puts each on the hook the compiled one was on:
    its connections are followed and ended as before, and its counts are
    the client's."""
    if shutil.which("bpftool") is None:
        pytest.skip("bpftool is not installed")
    kept = KeptPrograms(str(tmp_path))
    first = make_probe(*TIERS[which], kept=kept)
    compiled_on = _hooks(first)
    first.close()
    assert len(list(tmp_path.iterdir())) == 1, "kept once loaded"
    p = make_probe(*TIERS[which], kept=kept)
    from bcc.libbcc import lib
    assert lib.bpf_num_functions(p._bpf.module) == 0 and p._moved, "every program from the kept file"
    assert _hooks(p) == compiled_on and any(h.startswith("kernel: ") for h in compiled_on)
    server = Server(None)
    try:
        p.track(server.pid)
        c = Client(server.port)
        for i in range(5):
            c.request("GET", f"/kept/{i}")
        c.close()
        wait_until(lambda: len(p._conns) == 0, 10, "the closed connection to leave the table")
        assert _paths(p) == [t["path"].encode() for t in c.tally]
        assert p.status_counts() == dict(Counter((server.pid, t["status"]) for t in c.tally))
    finally:
        server.stop()
        p.close()


SPOILED = {  # a kept file's programs, spoiled two ways
    "refused": lambda tables, programs: (tables, {**programs, b"sock_io": b"\x95" + bytes(7)}),  # BPF_EXIT, r0 unset
    "unknown-map": lambda tables, programs: ({fd: f"{name}_v0" if name == "conns" else name
                                              for fd, name in tables.items()}, programs),
}


@pytest.mark.parametrize("spoiled", list(SPOILED))
def test_kept_programs_that_do_not_load_are_compiled_afresh_and_kept_again(spoiled, tmp_path, caplog):
    """A kept file whose program the verifier refuses (sock_io's code cut to
    an exit that never set its return value), or whose programs name a map
    net.c does not make: the probe says so, compiles net.c instead, works,
    and keeps the compiled programs in its place."""
    kept = KeptPrograms(str(tmp_path))
    make_probe("socket", True, kept=kept).close()
    path, = tmp_path.iterdir()
    good = marshal.loads(path.read_bytes())
    path.write_bytes(marshal.dumps(SPOILED[spoiled](*good)))
    p = make_probe("socket", True, kept=kept)
    assert "did not load" in caplog.text and "compiling them instead" in caplog.text
    assert _by_name(marshal.loads(path.read_bytes())) == _by_name(good), "kept in its place"
    _ends_a_closed_connection(p, f"/{spoiled}")


TLS_SPOILED = {  # the TLS module's kept programs, spoiled the same two ways
    "refused": lambda tables, programs: (tables, {**programs, b"ssl_leave": b"\x95" + bytes(7)}),
    "unknown-map": SPOILED["unknown-map"],
}


@pytest.mark.parametrize("spoiled", list(TLS_SPOILED))
def test_kept_tls_programs_that_do_not_load_are_compiled_afresh_and_kept_again(spoiled, tmp_path, caplog):
    """The TLS module's programs, kept beside net.c's by the first probe that
    loaded them: spoiled, the next probe says so, compiles the module
    instead, loads its programs, and keeps them in the file's place."""
    from sitsprobe.probes import side_by_side
    from sitsprobe.probes.kept import key
    from sitsprobe.probes.net import bpf_dir

    kept = KeptPrograms(str(tmp_path))
    p = make_probe("socket", True, kept=kept)
    try:
        path = tmp_path / key(bpf_dir(), [*p._flags, "-DTLS_MODULE=1"])
        side_by_side.close(p._load_tls())
    finally:
        p.close()
    good = marshal.loads(path.read_bytes())
    path.write_bytes(marshal.dumps(TLS_SPOILED[spoiled](*good)))
    p = make_probe("socket", True, kept=kept)
    try:
        tls = p._load_tls()
        try:
            assert f"programs kept at {path} did not load" in caplog.text
            assert {b"ssl_leave", b"uscan_head"} <= set(tls.funcs)
        finally:
            side_by_side.close(tls)
    finally:
        p.close()
    assert _by_name(marshal.loads(path.read_bytes())) == _by_name(good), "kept in its place"


def _ends_a_closed_connection(p: NetProbe, path: str) -> None:
    """A request on a connection then closed: its exchange reported and the
    connection let go (end_conn_tp, a tail call), then ``p`` closed."""
    server = Server(None)
    try:
        p.track(server.pid)
        c = Client(server.port)
        c.request("GET", path)
        c.close()
        wait_until(lambda: len(p._conns) == 0, 10, "the closed connection to leave the table")
        assert _paths(p) == [path.encode()]
    finally:
        server.stop()
        p.close()


class _Loads:
    """load_net's ``load``: the real probe on each set of flags, each kept."""

    def __init__(self) -> None:
        self.flags, self.made = [], []

    def __call__(self, flags: list[str]) -> NetProbe:
        self.flags.append(flags)
        self.made.append(NetProbe(flags, lambda _ex: None, lambda _notice: None))
        return self.made[-1]


def _load_net(socket_hooks: str) -> tuple:
    from sitsprobe import config
    from sitsprobe.probes.net_plan import load_net

    loads = _Loads()
    net, probe = load_net(config.load(overrides={"select.ports": [8080], "socket_hooks": socket_hooks}), loads)
    assert probe is loads.made[-1] and net.flags == loads.flags[-1]
    assert all(p._bpf.module is None for p in loads.made[:-1])  # a wrong guess closed: nothing of it loaded
    return net, probe, loads


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """The guesses kept apart from the machine's (probe_aside.GUESSES)."""
    require_root()
    pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is not importable")
    monkeypatch.setattr(probe_aside, "GUESSES", str(tmp_path / "caps.json"))
    return tmp_path / "caps.json"


def test_a_guess_the_probe_belies_is_closed_and_net_c_compiled_for_the_plan(kept, monkeypatch):
    """load_net compiles for a guess while the kernel is probed in a child
    process; where the probe says the socket tier cannot load, the guess is
    closed and net.c compiled again, for the syscall tier."""
    probed = probe_aside.ProbeAside.result
    if not probed(probe_aside.ProbeAside())["sock_tracepoint"].ok:
        pytest.skip("the socket tier does not load here (see `sitsprobe doctor`)")

    def result(self, timeout_s=60):
        return probed(self, timeout_s) | {"sock_tracepoint": capability.Capability(
            "sock_tracepoint", False, "sock_tracepoint: failed (as this test says)", "test")}
    monkeypatch.setattr(probe_aside.ProbeAside, "result", result)
    net, probe, loads = _load_net("auto")
    try:
        assert len(loads.made) == 2 and "-DNET_TIER=1" in loads.flags[0] and not probe.socket_tier
        assert "-DNET_TIER=1" not in net.flags and str(net.hooks["socket_io"]).startswith("tracepoint")
    finally:
        probe.close()


def test_the_next_start_guesses_what_the_probe_found(kept):
    """The syscall tier's tcp_sendmsg hook depends on fentry and kprobes,
    which a first guess takes as working; a start's probe keeps its answer
    (here a probe aside of its own: no start's compile before it), so the
    next start guesses right and compiles once."""
    probe_aside.ProbeAside(("main", "fentry")).result()
    assert kept.exists()
    net, probe, loads = _load_net("syscall")
    probe.close()
    assert len(loads.made) == 1 and not probe.socket_tier and net.hooks["tcp_sendmsg"]


def test_a_kernel_with_no_hook_for_the_plan_leaves_nothing_of_the_guess_attached(kept, monkeypatch):
    def result(self, timeout_s=60):
        return {k: capability.Capability(k, False, f"{k}: failed (as this test says)", "test")
                for k in ("btf", *capability.KINDS["main"], "fentry")}
    monkeypatch.setattr(probe_aside.ProbeAside, "result", result)
    loads = _Loads()
    from sitsprobe import config
    from sitsprobe.errors import SitsprobeError
    from sitsprobe.probes.net_plan import load_net

    with pytest.raises(SitsprobeError, match="no hook for the bytes of socket calls"):
        load_net(config.load(overrides={"select.ports": [8080]}), loads)
    assert len(loads.made) == 1 and loads.made[0]._bpf.module is None


def test_a_compile_begun_ahead_is_loaded_for_the_guess_and_taken_once(kept, caplog):
    """`sitsprobe run` begins net.c's compile before the agent imports
    (probes.ahead): load_net's first load takes that module, and it is
    given once, and only for the flags it was compiled with. Its tail-called
    half came from the second process (probes.apart), not the fallback."""
    from sitsprobe import config
    from sitsprobe.probes.ahead import NetAhead
    from sitsprobe.probes.net_plan import load_net

    probe_aside.ProbeAside(("main",)).result()  # this boot's answer kept: the guess is the plan
    conf = config.load(overrides={"select.ports": [8080], "compiled_dir": None})  # compiled, not kept
    ahead, given = NetAhead(conf), []
    try:
        assert ahead.take([*ahead.flags, "-DSOMETHING_ELSE=1"]) is None

        def load(flags):
            given.append(ahead.take(flags))
            return NetProbe(flags, lambda _ex: None, lambda _notice: None, compiled=given[-1])
        net, probe = load_net(conf, load)
        try:
            assert net.flags == ahead.flags and len(given) == 1 and probe._bpf is given[0].bpf
            assert given[0].moved and "second process failed" not in caplog.text
            assert ahead.take(ahead.flags) is None  # given once
        finally:
            probe.close()
    finally:
        ahead.close()


def test_a_compile_begun_ahead_that_failed_says_why_when_taken(kept, monkeypatch):
    from sitsprobe import config
    from sitsprobe.probes import ahead

    def fails(flags, kept):
        raise Exception("net.c: 1 error generated")  # what bcc raises
    monkeypatch.setattr(ahead, "compile_net", fails)
    early = ahead.NetAhead(config.load(overrides={"select.ports": [8080]}))
    assert early.take([*early.flags, "-DSOMETHING_ELSE=1"]) is None
    with pytest.raises(Exception, match="1 error generated"):
        early.take(early.flags)
    early.close()


def _idle(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(list(argv), stdin=subprocess.PIPE)


def _maps_libssl(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any("/libssl" in line for line in f)


@pytest.fixture
def processes():
    """(an idle process that maps a libssl, one that does not)"""
    ssl = _idle(sys.executable, "-c", "import ssl, sys; sys.stdin.read()")  # Python's ssl loads libssl
    plain = _idle("cat")
    wait_until(lambda: _maps_libssl(ssl.pid), 10, "the child to load libssl")
    yield ssl.pid, plain.pid
    for proc in (ssl, plain):
        proc.kill()
        proc.wait()


def _covered(probe: NetProbe, pid: int) -> bool:
    probe.tls.attach_waiting()  # what the agent's loop does
    return pid in probe.tls.covered or pid in probe.tls.failed


def test_the_tls_programs_are_compiled_only_once_a_process_maps_libssl(processes):
    """A start where no traced process maps a libssl compiles none of them;
    the first that does waits for their compile, on a thread of its own."""
    ssl, plain = processes
    p = make_probe("socket", True)
    try:
        assert p.tls.attach(plain) is None
        assert p.tls.programs == "not needed yet"
        assert p.tls.attach(ssl) is None
        assert p.tls.programs == "loading"
        wait_until(lambda: _covered(p, ssl), 30, "the TLS probes on the process")
        assert p.tls.programs == "loaded", p.tls.failed
        assert "/libssl" in p.tls.attach(ssl)
        assert ssl in p.tls.covered and plain not in p.tls.covered
    finally:
        p.close()


def _map_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return int(re.search(r"map_id:\s*(\d+)", f.read())[1])


def test_the_tls_programs_are_on_their_net_programs_maps_with_others_made_and_freed(processes):
    """load_net closes a guess the probe belies and compiles net.c again,
    and tests make many: the TLS programs compiled later must use the maps
    of the net program they belong to, whatever was made and freed before
    (bcc's extern tables would have found the first one's stale fds)."""
    ssl, _ = processes
    make_probe("socket", True).close()
    other = make_probe("syscall", False)
    p = make_probe("socket", True)
    try:
        assert p.tls.attach(ssl) is None
        wait_until(lambda: _covered(p, ssl), 30, "the TLS probes on the process")
        assert p.tls.programs == "loaded", p.tls.failed
        names = (b"conns", b"exchanges", b"streams", b"tls_procs", b"tls_threads", b"uscan_prog", b"counters")
        ours = {n: _map_id(p._bpf[n].map_fd) for n in names}
        assert {n: _map_id(p.tls._bpf[n].map_fd) for n in names} == ours  # the TLS module's own handles
        assert not set(ours.values()) & {_map_id(other._bpf[n].map_fd) for n in names}
        assert not any(name.startswith(f"sitsprobe-{os.getpid()}-") for name in os.listdir("/sys/fs/bpf"))
    finally:
        p.close()
        other.close()


def test_tls_programs_the_kernel_refused_for_the_moment_load_when_tried_again(processes, monkeypatch, caplog):
    """The kernel refuses a program for the moment where a signal comes while
    its verifier runs (EAGAIN: a profiler attaching to the agent does it):
    the whole TLS module goes, its compile and load are done again a while
    later, and the process that waited is covered then, never given up."""
    from sitsprobe.probes import net as net_module
    from sitsprobe.probes import retry

    ssl, _ = processes
    monkeypatch.setattr(retry, "FIRST_S", 1.0)
    p = make_probe("socket", True)
    real, refused = net_module.side_by_side.load, []

    def load(bpf, names, *rest):
        if b"ssl_leave" in names and not refused:  # the TLS module's, compiled: the kernel says no
            refused.append(bpf)
            raise Exception(f"Failed to load BPF program b'ssl_leave': {os.strerror(errno.EAGAIN)}")
        return real(bpf, names, *rest)
    monkeypatch.setattr(net_module.side_by_side, "load", load)
    try:
        assert p.tls.attach(ssl) is None
        wait_until(lambda: _covered(p, ssl) or p.tls.programs.endswith("; trying again"), 30,
                   "the first TLS load to end")
        assert refused and ssl not in p.tls.failed and ssl not in p.tls.covered, p.tls.failed
        assert p.tls.programs.endswith("Resource temporarily unavailable; trying again"), p.tls.programs
        wait_until(lambda: _covered(p, ssl), 30, "the TLS load tried again")
        assert p.tls.programs == "loaded" and "/libssl" in p.tls.covered[ssl], p.tls.failed
        assert len(refused) == 1 and refused[0] is not p.tls._bpf
        said = [r.getMessage() for r in caplog.records if "TLS programs did not load" in r.getMessage()]
        assert len(said) == 1 and "trying again in 1 s" in said[0], said
    finally:
        p.close()
    assert not any(name.startswith(f"sitsprobe-{os.getpid()}-") for name in os.listdir("/sys/fs/bpf"))


def test_tls_programs_that_cannot_load_say_why_and_the_rest_still_traces(processes, monkeypatch, tmp_path,
                                                                        caplog):
    """The TLS compile needs the BPF file system to pin the net program's
    maps in: where it cannot, the process that waited is told why, once,
    and the socket probes carry on."""
    from sitsprobe.probes import net as net_module

    ssl, _ = processes
    not_bpffs = tmp_path / "not-bpffs"
    not_bpffs.mkdir()
    real = net_module.pinned
    monkeypatch.setattr(net_module, "pinned", lambda bpf: real(bpf, root=str(not_bpffs)))
    p = make_probe("socket", True)
    try:
        assert p.tls.attach(ssl) is None
        wait_until(lambda: _covered(p, ssl), 30, "the TLS load to end")
        assert p.tls.programs.startswith("the TLS programs did not load: "), p.tls.programs
        assert ssl in p.tls.failed and ssl not in p.tls.covered
        assert f"pins need a BPF file system mounted at {not_bpffs}" in p.tls.failed[ssl], p.tls.failed[ssl]
        p.tls.attach(ssl)  # asked again, as every rescan does: said once
        assert sum("the TLS programs did not load" in r.getMessage() for r in caplog.records) == 1
        server = Server(None)  # plaintext is still framed
        try:
            p.track(server.pid)
            c = Client(server.port)
            c.request("GET", "/after")
            c.close()
            wait_until(lambda: b"/after" in _paths(p), 10, "the request after the failed TLS load")
        finally:
            server.stop()
    finally:
        p.close()
    assert os.listdir(not_bpffs) == []  # nothing of the attempt stays


@pytest.mark.parametrize("pid_words", [None, 1], ids=["pid-in-bitmap", "pid-past-bitmap"])
def test_tracking_follows_track_and_untrack_whether_the_bitmap_covers_the_pid(pid_words):
    """The kernel's first test of a call is a bitmap of tracked pids, as long
    as pid_max; a pid past it (pid_max raised after the start; here, a
    bitmap of 64 pids) asks the hash. Either way a process is traced from
    track() and not after untrack()."""
    p = make_probe("socket", True, pid_words=pid_words)
    server = Server(None)
    try:
        assert (server.pid // 64 < (pid_words or pid_bitmap_words())) == (pid_words is None)  # the case named

        def get(path: str) -> None:  # a connection each: one accepted while tracked is followed
            c = Client(server.port)
            c.request("GET", path)
            c.close()

        get("/before")
        p.track(server.pid)
        get("/tracked")
        wait_until(lambda: b"/tracked" in _paths(p), 10, "the request once tracked")
        p.untrack(server.pid)
        get("/untracked")
        p.track(server.pid)
        get("/again")
        wait_until(lambda: b"/again" in _paths(p), 10, "the request once tracked again")
        assert sorted(_paths(p)) == [b"/again", b"/tracked"]
    finally:
        server.stop()
        p.close()


SPIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); print(flush=True)\nwhile True: pass"


def test_a_thread_waiting_to_run_as_its_process_is_untracked_leaves_no_wait_behind():
    """On the raw run-queue hooks the kernel asks the woken or next thread's
    process (its bit) before it looks for the thread in `runnable`, so it
    takes a thread out as it runs only while its process is tracked. A
    traced process spinning on one CPU beside two others is preempted again
    and again: its thread waits to run most of the time. Untracked at such a
    moment, none of its threads stays in `runnable`, where a later traced
    thread given its id would take its wait."""
    offsets = net_plan.task_offsets()
    if offsets is None:
        pytest.skip("the kernel's BTF has no task_struct pid or tgid")
    p = make_probe("socket", True, task_offsets=offsets)
    cpu = max(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)], stdout=subprocess.PIPE) for _ in range(3)]
    try:
        for s in spinners:
            s.stdout.readline()
        traced = spinners[0].pid
        runnable, runq = p._bpf["runnable"], p._bpf["runq"]

        def waiting() -> set[int]:
            return {k.value for k in runnable.keys()} & {int(t) for t in os.listdir(f"/proc/{traced}/task")}

        assert not waiting()
        for _ in range(5):  # each time, a third of a chance that it was running as it was untracked
            p.track(traced)
            wait_until(waiting, 5, "the traced thread to wait for its CPU")
            p.untrack(traced)
            time.sleep(0.05)
            assert not waiting()
        assert runq[runq.Key(traced)].value > 0  # its waits were counted while it was traced
        assert {k.value for k in runq.keys()} <= {traced}  # and no other's
    finally:
        for s in spinners:
            s.kill()
            s.wait()
        p.close()


def _run_delay_ns(pid: int) -> int:
    """The kernel's own total of the time pid's thread waited on a run queue (schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[1])


def test_the_run_queue_wait_of_a_traced_yes_equals_the_kernels_schedstat():
    """coreutils `yes`, traced, shares one CPU with two more: the wait the raw
    run-queue hooks sum for its thread while it is traced equals what the
    kernel's scheduler statistics (/proc/PID/schedstat, run_delay) counted
    over the same time, within one wait at each end."""
    offsets = net_plan.task_offsets()
    if offsets is None:
        pytest.skip("the kernel's BTF has no task_struct pid or tgid")
    if not os.path.exists("/proc/self/schedstat"):
        pytest.skip("no /proc/PID/schedstat (CONFIG_SCHED_INFO unset)")
    p = make_probe("socket", True, task_offsets=offsets)
    cpu = max(os.sched_getaffinity(0))
    yeses = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(3)]
    try:
        for y in yeses:
            os.sched_setaffinity(y.pid, {cpu})
        traced = yeses[0].pid
        time.sleep(0.3)  # sharing the CPU already
        p.track(traced)
        before = _run_delay_ns(traced)
        time.sleep(2)
        p.untrack(traced)
        kernel = _run_delay_ns(traced) - before
        runq = p._bpf["runq"]
        ours = runq[runq.Key(traced)].value
    finally:
        for y in yeses:
            y.kill()
            y.wait()
        p.close()
    assert kernel > 0.8e9, kernel  # two thirds of 2 s waiting: the case is the one named
    assert abs(ours - kernel) < 0.01 * kernel + 30e6, (ours, kernel)
