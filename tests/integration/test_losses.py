"""Losses under a full ring, with the agent held still (SIGSTOP) so that the
1 MiB ring must fill: a loss is said in the agent's log, once, and its total
at exit equals the exported counter; a flood of stream writes gives way to the
requests' records."""
from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import TAG, Nginx, free_port, require_root, running_agent, wait_until
from .test_wire_truth import Peer


def test_a_full_ring_buffer_is_said_in_the_log(tmp_path: Path):
    require_root()
    if not shutil.which("ab"):
        pytest.skip("ab (apache2-utils) is needed: .ci/run installs it")
    (tmp_path / "agent").mkdir()
    with (running_agent(tmp_path / "agent", {}, {"max_per_second": 50, "cpu_budget": 0}, {"ring_buffer_mib": 1}) as agent,
          Nginx(agent, tmp_path / "nginx") as n):
        os.kill(agent.proc.pid, signal.SIGSTOP)  # nothing drains the ring now
        try:
            subprocess.run(["ab", "-k", "-q", "-n", "20000", "-c", "8",
                            f"http://127.0.0.1:{n.port}/index.html"],
                           capture_output=True, timeout=120, check=True)
        finally:
            os.kill(agent.proc.pid, signal.SIGCONT)
        said = wait_until(
            lambda: re.search(r"WARNING losing events: ring_buffer_full, (\d+) so far; "
                              r"raise ring_buffer_mib", agent.log.read_text()), 10,
            "the loss to be said in the log")
        lost = agent.metric("sitsprobe_events_lost_total", reason="ring_buffer_full")
        assert 0 < int(said.group(1)) <= lost
    log = agent.log.read_text()
    assert log.count("losing events: ring_buffer_full") == 1
    final = re.search(r"WARNING events lost while running: ring_buffer_full (\d+)", log)
    assert final and int(final.group(1)) == lost, log


@pytest.mark.parametrize("server", ["uvicorn", "aiohttp"])
def test_a_flood_of_stream_writes_never_costs_a_request_its_record(tmp_path: Path, server: str):
    """40 OpenAI chat streams of 300 tokens, a write each, while nothing
    drains the ring: some 12,000 write events, several times what 1 MiB
    holds. The write events give way (counted as write_ring_full); every
    request's own record still arrives, the agent stitching as many as httpx
    got answers, and so does every stream's first token, which the kernel
    keeps before the rest: each has its time to first token."""
    require_root()
    httpx = pytest.importorskip("httpx")
    (tmp_path / "agent").mkdir()
    with (running_agent(tmp_path / "agent", {}, {}, {"ring_buffer_mib": 1}) as agent,
          Peer(agent, server, f"flood-{server[:3]}") as peer):
        os.kill(agent.proc.pid, signal.SIGSTOP)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{peer.port}", timeout=30) as client:
                tokens = [client.post("/v1/chat/completions", params={"events": 300},
                                      json={"model": "flood-1", "stream": True, "messages": [
                                          {"role": "user", "content": f"n{i}"}]}).text.count('"content"')
                          for i in range(40)]
        finally:
            os.kill(agent.proc.pid, signal.SIGCONT)
        assert tokens == [300] * 40
        wait_until(lambda: agent.metric("http_server_request_duration_seconds_count",
                                        http_route="/v1/chat/completions") == 40 or None, 20,
                   "every request stitched")
        assert agent.metric("sitsprobe_events_lost_total", reason="ring_buffer_full") == 0
        # the flood was real: more write events lost than the whole ring holds (about 2,400)
        assert agent.metric("sitsprobe_events_lost_total", reason="write_ring_full") > 6_000
        assert agent.metric("gen_ai_server_time_to_first_token_seconds_count") == 40


def test_every_response_write_is_read_or_counted_lost(tmp_path: Path):
    """Python's ThreadingHTTPServer streaming N SSE events (bench_genai's
    server) writes N + 4 times a response, one send each: its head, the
    events, the final event, [DONE] and the last chunk. At a gentle pace the
    agent reads every one of them (sitsprobe_write_events_received_total);
    held still under a flood, what it read and what the kernel counted lost
    (write_ring_full) add up to what the server wrote."""
    require_root()
    from bench.bench_genai import EXTRA_WRITES, PATH, request_body, start_server

    events, port = 64, free_port()
    writes = events + EXTRA_WRITES
    (tmp_path / "agent").mkdir()
    server = start_server(tmp_path, port, events, TAG)  # its own check request: before the agent
    try:
        with running_agent(tmp_path / "agent", {}, {}, {"ring_buffer_mib": 1}) as agent:
            wait_until(lambda: agent.tracks(server.pid), 15, "the agent to track the server")

            def stream(n: int) -> None:
                for _ in range(n):
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    c.request("POST", PATH, body=request_body(), headers={"Content-Type": "application/json"})
                    assert b"data: [DONE]" in c.getresponse().read()
                    c.close()

            def read_and_lost() -> tuple[float, float]:
                return (agent.metric("sitsprobe_write_events_received_total"),
                        agent.metric("sitsprobe_events_lost_total", reason="write_ring_full"))

            stream(20)
            wait_until(lambda: read_and_lost() == (20 * writes, 0) or None, 15,
                       f"{20 * writes} write events read, none lost; seen {read_and_lost()}")
            os.kill(agent.proc.pid, signal.SIGSTOP)  # nothing drains the ring now
            try:
                stream(60)
            finally:
                os.kill(agent.proc.pid, signal.SIGCONT)
            wait_until(lambda: sum(read_and_lost()) == 80 * writes or None, 15,
                       f"{80 * writes} write events read or lost; seen {read_and_lost()}")
            read, lost = read_and_lost()
            assert lost > 1_000  # the flood was real: a 1 MiB ring holds some 2,400 writes' events
    finally:
        server.kill()
        server.wait()
