"""The CLI as a user runs it: stops by itself or on a signal, flushing
everything, and leaves no BPF program behind; bad input is one clear line."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from sitsprobe.probes import net_plan

from .conftest import ROOT, Nginx, RedisServer, Server, TraceFile, free_port, require_root, running_agent, wait_until


def sitsprobe(*args: str, log=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sitsprobe.cli", *args], cwd=ROOT,
                            stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def prog_ids() -> set[int]:
    out = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True, text=True,
                         check=True).stdout
    return {p["id"] for p in json.loads(out)}


def uprobe_and_kprobe_events() -> str:
    text = ""
    for name in ("uprobe_events", "kprobe_events"):
        try:
            text += open(f"/sys/kernel/tracing/{name}").read()
        except OSError:
            pass
    return text


@pytest.mark.parametrize("stop", ["duration", "SIGINT", "SIGTERM"])
def test_run_stops_flushes_and_leaves_nothing_behind(tmp_path, stop):
    require_root()
    before_progs, before_events = prog_ids(), uprobe_and_kprobe_events()
    traces = TraceFile(tmp_path / "t.jsonl")
    with Server(None) as server:
        # select by pid, or (SIGTERM case) by the port the server listens on
        by = ["--port", str(server.port)] if stop == "SIGTERM" else ["--pid", str(server.pid)]
        args = ["run", *by, "--traces-file", str(traces.path), "--metrics-port", "0"]
        log = tmp_path / "agent.log"
        agent = sitsprobe(*args, *(["--duration", "4"] if stop == "duration" else []),
                          log=log.open("w"))
        wait_until(lambda: "tracing 1 process" in log.read_text(), 60, "the agent to start")
        for i in range(5):
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/cli/{i}", timeout=5).read()
        if stop != "duration":
            agent.send_signal(getattr(signal, stop))
        agent.wait(60)
        out = log.read_text()
    assert agent.returncode == 0, out
    assert len(traces.for_port(server.port)) == 5, out
    wait_until(lambda: not (prog_ids() - before_progs), 10, "every program of ours to be unloaded")
    assert uprobe_and_kprobe_events() == before_events


def test_bad_config_is_one_line_naming_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("capture:\n  request_bytes: 99999\n")
    p = sitsprobe("run", "-c", str(bad), "--pid", "1")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2
    assert out.strip() == (f"sitsprobe: {bad}: capture.request_bytes: "
                           "expected an integer 16..4096, got 99999")


@contextlib.contextmanager
def memory_cgroup(limit: int):
    """A memory cgroup of `limit` bytes (cgroup v1's memory controller, or v2's
    where the root hands it down): the path of its procs file."""
    v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    if (v1 / "memory.limit_in_bytes").exists():
        d, limit_file = v1 / f"sitsprobe-test-{os.getpid()}", "memory.limit_in_bytes"
    elif "memory" in (v2 / "cgroup.subtree_control").read_text().split():
        d, limit_file = v2 / f"sitsprobe-test-{os.getpid()}", "memory.max"
    else:
        pytest.skip("no memory cgroup to put the agent in (cgroup v1's memory controller or v2's memory.max)")
    d.mkdir()
    try:
        (d / limit_file).write_text(str(limit))
        yield d / "cgroup.procs"
    finally:
        wait_until(lambda: not (d / "cgroup.procs").read_text().split(), 30, "the cgroup's processes to end")
        d.rmdir()


def test_a_map_the_kernel_cannot_make_within_the_memory_limit_is_one_line_naming_what_sizes_it(tmp_path):
    """A config that asks for more kernel memory than the agent's cgroup may
    take (capture.max_payloads 131,072 with 4 KiB bodies and tails: 2.6 GiB
    of POST payload entries, under the chart's limit of 1 GiB) stops the
    agent with one line naming the map and the settings its size comes
    from, after one compile: a second, for the probe's plan, was killed by
    the OOM killer. bcc said only "Failed to compile BPF module", under a
    traceback."""
    require_root()
    conf = tmp_path / "big.yaml"
    conf.write_text(f"capture: {{max_payloads: 131072, body_bytes: 4096, tail_bytes: 4096}}\n"
                    f"metrics: {{address: 127.0.0.1, port: {free_port()}}}\nkubernetes: {{metadata: 'off'}}\n")
    with memory_cgroup(1 << 30) as procs:  # on one CPU: net.c compiled whole, no second process beside it
        r = subprocess.run(["bash", "-c", f'echo $$ > {procs} && exec taskset -c 0 "$@"', "-", sys.executable,
                            "-m", "sitsprobe.cli", "run", "-c", str(conf), "--pid", "1", "--duration", "1"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    if r.returncode == -signal.SIGKILL:  # while the kernel filled the cgroup with the map it then refused
        pytest.skip("the OOM killer took the agent before the kernel refused its map")
    last = r.stderr.strip().splitlines()[-1]
    assert (r.returncode, last) == (2, "sitsprobe: net.c: the kernel did not make its map bodies: Cannot allocate "
                                       "memory; its size comes from capture.max_payloads, capture.body_bytes, "
                                       "capture.tail_bytes: lower them, or raise the agent's memory limit (BPF "
                                       "maps are kernel memory charged to its cgroup)"), r.stderr[-3000:]
    assert "Traceback" not in r.stderr and r.stderr.count("could not open bpf map") == 1, r.stderr[-3000:]


def test_nothing_selected_is_a_clear_error():
    p = sitsprobe("run", "--duration", "1")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2
    assert "nothing to trace" in out and "--pid" in out


def test_a_mistyped_option_suggests_the_one_meant_with_the_commands_usage():
    p = sitsprobe("run", "--prot", "8000")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2
    assert out.startswith("usage: sitsprobe run ")
    assert "unrecognized arguments: --prot 8000; did you mean --port?" in out


def test_heatmap_without_an_agent_says_what_to_run():
    p = sitsprobe("heatmap", "--url", "http://127.0.0.1:9")  # discard: nothing answers
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2 and "sitsprobe run --cache-probe redis" in out, out


def test_a_cache_probe_alone_traces_the_program_it_probes(tmp_path):
    """`run --cache-probe redis` with no selector: redis-server is what it traces."""
    require_root()
    with RedisServer() as redis:
        port = free_port()
        p = sitsprobe("run", "--cache-probe", "redis", "--metrics-port", str(port), "--duration", "30",
                      log=(tmp_path / "agent.log").open("w"))
        try:
            def tracked():
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                        page = r.read().decode()
                except OSError:
                    return False
                return f'pid="{redis.proc.pid}",process="redis-server"' in page
            wait_until(tracked, 40, "the agent to trace redis-server")
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(60)


def test_a_second_start_loads_the_programs_the_first_compiled(tmp_path):
    """The first start keeps net.c's programs (compiled_dir), and the TLS
    module's once nginx's libssl is hooked; the next, with the same
    settings, makes only the maps, loads those programs onto them and traces
    nginx as the first did: a span for each of the client's requests, with
    its path and nginx's status."""
    require_root()
    kept = tmp_path / "compiled"
    for run in ("first", "second"):
        d = tmp_path / run
        d.mkdir()
        with running_agent(d, {}, {}, {"compiled_dir": str(kept)}) as agent, Nginx(agent, d) as nginx:
            statuses = [urllib.request.urlopen(f"http://127.0.0.1:{nginx.port}/index.html?{run}{i}=x",
                                               timeout=5).status for i in range(7)]
            spans = agent.traces.wait_for_port(nginx.port, 7, pid=nginx.workers[0])
            assert sorted(s["attrs"]["url.query"] for s in spans) == [f"{run}{i}=REDACTED" for i in range(7)]
            assert [s["attrs"]["http.response.status_code"] for s in spans] == statuses
            # Debian's nginx maps libssl: the TLS module is loaded (and kept) too
            wait_until(lambda: agent.metric("sitsprobe_tls_processes", pid=nginx.workers[0]) == 1, 10,
                       "the agent to hook nginx's libssl")
        said = (d / "agent.log").read_text()
        assert ("net.c: its programs kept from an earlier start" in said) == (run == "second"), said
        assert ("tls programs kept from an earlier start" in said) == (run == "second"), said
        assert len(list(kept.iterdir())) == 2  # net.c's, and the TLS module's


def test_ebpf_lists_what_run_would_load_here():
    require_root()
    help_text, _ = sitsprobe("run", "--help").communicate(timeout=60)
    assert "--ebpf" in help_text
    p = sitsprobe("run", "--ebpf")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    for line in ("-DNET_TIER=", "-DBINS=1", "socket_io", "tail calls: scan_head", "kept", "/run/sitsprobe/compiled/",
                 "/proc/kallsyms as bcc's frontend reads it: two lines"):
        assert line in out, line
    # connections: by their first call and TCP state on the socket tier where
    # the kernel's BTF allows, else by the syscall tracepoints of close and the rest
    by_state = "-DNET_TIER=1" in out and net_plan.connection_offsets() is not None
    assert ("connections        tracepoint sock:inet_sock_set_state" in out) == by_state, out
    assert ("close              tracepoint syscalls:sys_enter_close" in out) != by_state, out


def test_doctor_json_says_what_loads_here():
    require_root()
    p = sitsprobe("doctor", "--json")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    report = json.loads(out)
    assert report["ok"] is True
    assert report["plan"]["net"]["socket_io"]
