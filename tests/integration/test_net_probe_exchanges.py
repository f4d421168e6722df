"""What the network probe reports of a real server's exchanges, and what the
agent's /proc seeding and idle flush may and may not do to connections the
kernel already follows: each on every socket tier, with one probe a tier
(compiling one is 3 s), fresh to each test (a test's processes are
forgotten after it, as the agent forgets those that exit)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from sitsprobe import procs
from sitsprobe.probes.net import ST_READING, ST_RESPONDING

from .conftest import Server, wait_until
from .test_net import Client
from .test_net_probe import TIERS, _paths, make_probe


@pytest.fixture(scope="module", params=list(TIERS), ids=lambda t: f"{t}-tier")
def tier_probe(request):
    p = make_probe(*TIERS[request.param])
    yield p
    p.close()


@pytest.fixture
def probe(tier_probe):
    """The tier's probe, with nothing seen yet; after the test, what it
    tracked is untracked, and the connections of its processes (gone, or
    killed without a close() the syscall tier would see) are forgotten."""
    tier_probe.poll(0)
    tier_probe.seen.clear()
    yield tier_probe
    for key in list(tier_probe._tracked.keys()):
        tier_probe.untrack(key.value)
    for tgid in {key >> 32 for key, _ in tier_probe._entries()}:
        tier_probe.forget(tgid)


def test_seeding_takes_old_connections_and_leaves_followed_ones_alone(probe):
    server = Server(None)
    try:
        old = Client(server.port)
        old.request("GET", "/before-tracking")
        probe.track(server.pid)
        new = Client(server.port)  # accepted while tracked: the kernel follows it
        new.request("GET", "/first")
        # What the agent's _track does, slowly, after track(): seed from /proc.
        # The kernel's entry for `new` holds /first, answered and not yet reported.
        listening = procs.listening_ports(server.pid)
        for fd, local, peer in procs.established(server.pid):
            if local.port in listening:
                probe.seed(server.pid, fd, "server", local, peer)
        new.request("GET", "/second")
        # The server's thread for `old` entered recv() before tracking. On the
        # syscall tier that read's bytes are not seen (there was no entry half
        # to remember its buffer: its exchange has a response only, unless the
        # agent adopts the read); the socket tier reads the buffer from the
        # read's registers when it returns.
        old.request("GET", "/before-seen")
        old.request("GET", "/after-seeding")
        new.close()
        old.close()
        want = [b"/after-seeding", *([b"/before-seen"] if probe.socket_tier else []), b"/first", b"/second"]
        wait_until(lambda: set(want) <= set(_paths(probe)), 10, "every exchange after tracking to be reported")
        assert sorted(_paths(probe)) == want
    finally:
        server.stop()


def test_an_open_exchange_is_given_as_responding_only_when_settled(probe):
    server = Server(None)
    try:
        probe.track(server.pid)
        c = Client(server.port)
        c.request("GET", "/quiet")
        time.sleep(0.05)
        open_ = list(probe.open_exchanges())
        assert [(ex.req.split(b" ")[1], state) for ex, state in open_] == [(b"/quiet", ST_RESPONDING)]
        ex = open_[0][0]
        key = probe._conns.Key((ex.tgid << 32) | ex.fd)
        entry = probe._conns[key]
        entry.seq += 1  # as the kernel leaves it while it updates the entry
        probe._conns[key] = entry
        assert [state for _, state in probe.open_exchanges()] == [ST_READING]
        c.close()
    finally:
        server.stop()


def test_an_exchange_the_agent_reported_is_passed_over_until_the_next_begins(probe):
    """A quiet keep-alive connection keeps its answered exchange in the map
    until its next request: bench/bench_idle.py's 8,000 of them, each
    already reported by the agent's flush, cost the agent 11-14 % of a core
    being decoded and looked at every tick. Dismissed, an entry is not given
    again (nor counted in flight), however often its seq moves, until
    another exchange begins on its connection: a new request, or the next
    response of pipelined ones (the same start, the next pipeline index)."""
    server = Server(None)
    try:
        probe.track(server.pid)
        quiet, busy = Client(server.port), Client(server.port)
        quiet.request("GET", "/quiet")
        busy.request("GET", "/busy")

        def paths() -> list[bytes]:
            return sorted(ex.req.split(b" ")[1] for ex, _ in probe.open_exchanges())
        wait_until(lambda: paths() == [b"/busy", b"/quiet"], 5, "both answered exchanges to be open")
        [ex] = [ex for ex, _ in probe.open_exchanges() if ex.req.startswith(b"GET /quiet")]
        probe.dismiss(ex)
        assert paths() == [b"/busy"]
        key = probe._conns.Key((ex.tgid << 32) | ex.fd)
        entry = probe._conns[key]
        entry.seq += 2  # a late write to the same exchange: still the one reported
        probe._conns[key] = entry
        assert paths() == [b"/busy"]
        entry.pipeline += 1  # the next response of pipelined requests: their common start
        probe._conns[key] = entry
        assert paths() == [b"/busy", b"/quiet"]
        entry.pipeline -= 1
        probe._conns[key] = entry
        quiet.request("GET", "/again")  # the next exchange on the same connection
        wait_until(lambda: paths() == [b"/again", b"/busy"], 5, "the next exchange to be open")
        quiet.close()
        busy.close()
    finally:
        server.stop()


@pytest.mark.parametrize("connect", ["blocking", "nonblocking"])
def test_an_answer_that_came_before_its_calls_send_returned_is_counted_for_that_call(probe, tmp_path, connect):
    """nginx answers a POST from its head (``return``) while the caller's one
    send of the head and a 64 MiB body still blocks: the kernel sees the
    answer before the call begins, as it does whenever the caller
    waits for a CPU between moving its bytes and the send's hook. The answer
    must still count for that call (``calls``: how the agent keeps a call for
    a callee reported after it, stitch.join), name the caller's connection
    and begin after the call, and the body nginx reads after its answer is
    that request's.
    The first POST is the connection's first call, answered before that call's
    hook: the kernel knows the connection from its handshake inside
    connect(). ``nonblocking``: made as an event loop makes it (redis.asyncio,
    aiohttp): connect() returns EINPROGRESS, and on loopback the handshake
    still completes inside it."""
    if not shutil.which("nginx"):
        pytest.skip("no nginx on PATH: .ci/run installs it")
    from tests.nginx import static_site

    from .conftest import HERE, children, free_port

    port, posts = free_port(), 4
    early = 'location = /early { client_max_body_size 100m; return 200 "early\\n"; }'
    nginx = subprocess.Popen(static_site(tmp_path, port, early))
    caller = subprocess.Popen([sys.executable, str(HERE / "early_caller.py"), str(port), str(posts),
                               f"--{connect}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        [worker] = wait_until(lambda: children(nginx.pid), 10, "the nginx worker")
        probe.track(worker)
        probe.track(caller.pid)
        time.sleep(0.2)  # nginx listening
        out, _ = caller.communicate("go\n", timeout=60)  # it closes its connection as it exits
        assert out.split() == ["200", "6"] * posts, out

        def calls():
            probe.poll(0)
            return [ex for ex in probe.seen if ex.tgid == caller.pid and ex.req.startswith(b"POST")]
        made = wait_until(lambda: len(c := calls()) == posts and c, 10, f"the caller's {posts} calls")
        assert [ex.calls for ex in made] == [1] * posts
        # nginx reads each body after its answer: more of that request, not one of its own
        answers = wait_until(lambda: len(a := [ex for ex in probe.seen if ex.tgid == worker]) >= posts and a,
                             10, "nginx's answers")
        assert [ex.req.split(b" ")[:2] for ex in answers] == [[b"POST", b"/early"]] * posts
        assert all(ex.bytes_in > 64 << 20 for ex in answers), [ex.bytes_in for ex in answers]
        assert {ex.link_key for ex in answers} == {(ex.tgid << 32) | ex.fd for ex in made}
        # a call begins before its answer (the socket tier sees a send once it has moved the bytes)
        assert all(call.start_ns <= answer.start_ns for call, answer in zip(made, answers))
    finally:
        caller.kill()
        nginx.terminate()
        nginx.wait(10)
