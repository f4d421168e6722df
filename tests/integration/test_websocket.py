"""WebSockets: an HTTP/1.1 request upgraded by 101 Switching Protocols, then
frames both ways on the same connection. Two servers no one here wrote
(aiohttp's, and uvicorn's through wsproto) and two clients (aiohttp's and the
`websockets` library, which offers permessage-deflate) echo messages in turn.

The upgrade is one HTTP span (status 101, as long as the handshake); every
turn after it (a message and its echo, then the closing handshake) is one
exchange named `websocket`, never an HTTP request and never `unknown`, and the
metrics count as many as the client made.
"""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from .conftest import HERE, TAG, require_root, running_agent, wait_until

pytestmark = pytest.mark.integration
RUN_TAG = f"{TAG}-websocket-{os.getpid()}"
SERVERS = {"aiohttp": "ws-aiohttp", "uvicorn": "ws-uvicorn"}  # server -> its process's name
TURNS = 12  # messages a connection echoes, text and binary in turn, some long


def messages(client: str) -> list[str | bytes]:
    return [f"{client} {i} " * (1 + 500 * (i % 4 == 3)) if i % 2 else os.urandom(40 + 3000 * (i % 5 == 4))
            for i in range(TURNS)]


async def aiohttp_client(url: str) -> int:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        for m in messages("aiohttp"):
            await (ws.send_str(m) if isinstance(m, str) else ws.send_bytes(m))
            assert (await ws.receive()).data == m
    return TURNS


async def websockets_client(url: str) -> int:
    import websockets

    async with websockets.connect(url, ping_interval=None) as ws:  # no keepalive pings mid-test
        for m in messages("websockets"):
            await ws.send(m)
            assert await ws.recv() == m
    return TURNS


CLIENTS = {"aiohttp": aiohttp_client, "websockets": websockets_client}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    require_root()
    servers = {}
    try:
        for kind, name in SERVERS.items():
            proc = subprocess.Popen([sys.executable, str(HERE / "peers.py"), kind, "--tag", RUN_TAG,
                                     "--name", name], stdout=subprocess.PIPE, text=True)
            servers[kind] = (proc, int(proc.stdout.readline()))
        d = tmp_path_factory.mktemp("agent")
        with running_agent(d, {"cmdline": [re.escape(RUN_TAG)], "comms": []}, {}, {}) as agent:
            for proc, _ in servers.values():
                wait_until(lambda p=proc: agent.tracks(p.pid), 15, "the agent to track the servers")
            yield agent, servers
    finally:
        for proc, _ in servers.values():
            proc.kill()
            proc.wait()


def counts(agent, name: str) -> tuple[float, float, float]:
    """(websocket exchanges, unknown ones, upgrades answered 101) of a server, as the metrics say."""
    page = agent.scrape()
    return (agent.metric("sitsprobe_unframed_exchanges_total", page, process=name, protocol="websocket"),
            agent.metric("sitsprobe_unframed_exchanges_total", page, process=name, protocol="unknown"),
            agent.metric("http_server_request_duration_seconds_count", page, process=name,
                         http_response_status_code="101"))


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("server", SERVERS)
def test_frames_after_an_upgrade_are_websocket_exchanges_one_a_turn(traced, server, client):
    agent, servers = traced
    (proc, port), name = servers[server], SERVERS[server]
    before_spans, before = {s["spanId"] for s in agent.traces.for_pid(proc.pid)}, counts(agent, name)
    turns = asyncio.run(CLIENTS[client](f"ws://127.0.0.1:{port}/ws"))
    closing = 1  # the client's close frame and the server's answer: one more turn
    spans = wait_until(lambda: (s := [x for x in agent.traces.for_pid(proc.pid) if x["spanId"] not in before_spans])
                       and len(s) >= 1 + turns + closing and s, 15, "the upgrade's and the turns' spans")
    [upgrade] = [s for s in spans if "http.response.status_code" in s["attrs"]]
    assert (upgrade["name"], upgrade["attrs"]["http.response.status_code"]) == ("GET /ws", 101)
    frames = [s for s in spans if s is not upgrade]
    assert Counter(s["name"] for s in frames) == {f"{name} websocket exchange": turns + closing}
    assert all(s["attrs"]["sitsprobe.protocol"] == "websocket" and s["attrs"]["sitsprobe.bytes_in"] > 0
               and int(s["startTimeUnixNano"]) >= int(upgrade["endTimeUnixNano"]) for s in frames)
    want = (before[0] + turns + closing, before[1], before[2] + 1)
    got = wait_until(lambda: (c := counts(agent, name)) == want and c, 10, f"the metrics to say {want}")
    assert got == want
