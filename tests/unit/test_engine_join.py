"""Engine markers joined to network requests: stages, batches, cache, usage."""
from __future__ import annotations

import json

from sitsprobe.clock import WallClock
from sitsprobe.events import MarkerEvent
from sitsprobe.export.otlp import TraceExporter
from sitsprobe.export.prom import RequestMetrics
from sitsprobe.request import GpuUse, Request
from sitsprobe.stitch.engine import EngineJoin
from sitsprobe.stitch.genai import from_markers

PID, FD = 4242, 9


def m(kind, ts, **kw):
    return MarkerEvent(kind=kind, ts_ns=ts, tgid=PID, tid=PID, **kw)


def stage(name, begin, end, **kw):
    """A range as the kernel sends it: one event at its end, with its begin."""
    return m("range", end, begin_ns=begin, name=name, **kw)


def request(start, end, fd=FD, path="/v1/completions"):
    return Request(pid=PID, comm="engine", fd=fd, start_ns=start, end_ns=end, first_out_ns=end - 10,
                   bytes_in=100, bytes_out=200, method="POST", path=path, route=path, status=200)


def with_genai(rs: list[Request]) -> list[Request]:
    """Joined requests with what their markers say as GenAI, as the stitcher makes them."""
    return [r._replace(genai=from_markers(r)) for r in rs]


def two_requests_in_one_batch(j: EngineJoin):
    for rid, fd, t0 in ((1, FD, 1000), (2, FD + 1, 1100)):
        j.on_marker(m("request_begin", t0, request_id=rid, fd=fd, name="tiny"))
        j.on_marker(m("cache_get", t0 + 20, request_id=rid, name="prefix", key="ab12", hit=rid == 2))
        j.on_marker(stage("prefill", t0 + 10, t0 + 300, request_id=rid))
    for step, t in ((7, 2000), (8, 3000)):
        j.on_marker(m("batch", t, batch_id=step, request_ids=(1, 2)))
        j.on_marker(stage("decode", t, t + 500, batch_id=step))
    for rid in (1, 2):
        j.on_marker(m("usage", 4000, request_id=rid, input_tokens=5, output_tokens=3, kv_bytes=4096))
        j.on_marker(m("request_end", 4100, request_id=rid))


def test_a_batched_step_appears_under_every_request_it_served():
    j = EngineJoin()
    two_requests_in_one_batch(j)
    [r1] = with_genai(j.on_request(request(900, 5000), now_ns=5000))
    [r2] = with_genai(j.on_request(request(950, 5000, fd=FD + 1), now_ns=5000))
    for r in (r1, r2):
        names = [s.name for s in r.inference.stages]
        assert names == ["prefill", "decode", "decode"]
        assert [s.batch_size for s in r.inference.stages if s.name == "decode"] == [2, 2]
        assert r.inference.output_tokens == 3 and r.inference.kv_bytes == 4096
    assert r1.inference.cache[0].hit is False and r2.inference.cache[0].hit is True
    assert r1.ttft_ns == 1300 - 900  # end of prefill minus first byte in
    assert r1.tpot_ns == (3500 - 1300) / 2
    assert j.batch_sizes == [2, 2]


def test_a_request_waits_for_its_markers_then_goes_without_them():
    j = EngineJoin(hold_ns=1000)
    j.on_marker(m("request_begin", 10, request_id=1, fd=FD))  # the process is instrumented
    early = request(5, 50)
    assert j.on_request(early, now_ns=100) == []  # held: request_end not seen yet
    j.on_marker(m("request_end", 40, request_id=1))
    [joined] = j.due(now_ns=200)
    assert joined.inference.request_id == 1
    lonely = request(500, 600, fd=FD + 5)
    assert j.on_request(lonely, now_ns=700) == []
    assert j.due(now_ns=1699) == []
    assert j.due(now_ns=1700) == [lonely]


def test_uninstrumented_processes_pass_straight_through():
    j = EngineJoin()
    r = request(1, 2)
    assert j.on_request(r, now_ns=3) == [r]


def exported(tmp_path, r: Request) -> tuple[dict, list[dict]]:
    """(server span, its children) as the OTLP/JSON file has them, attributes flattened."""
    out = tmp_path / "t.jsonl"
    e = TraceExporter(clock=WallClock(), traces_file=str(out))
    e.export(r)
    e.shutdown()
    spans = [s for line in out.read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    for s in spans:
        s["attrs"] = {kv["key"]: list(kv["value"].values())[0] for kv in s["attributes"]}
    server = next(s for s in spans if s["kind"] == 2)
    return server, [s for s in spans if s.get("parentSpanId") == server["spanId"]]


def test_stage_spans_and_gen_ai_attributes_are_exported(tmp_path):
    j = EngineJoin()
    two_requests_in_one_batch(j)
    [r1] = with_genai(j.on_request(request(900, 5000), now_ns=5000))
    server, children = exported(tmp_path, r1)
    assert sorted(s["name"] for s in children) == ["cache_get prefix", "decode", "decode", "prefill"]
    assert server["attrs"]["gen_ai.request.model"] == "tiny"
    assert server["attrs"]["gen_ai.usage.output_tokens"] == "3"  # int64 as a JSON string
    decode = next(s for s in children if s["name"] == "decode")
    assert decode["attrs"]["sitsprobe.batch.size"] == "2"


def test_gpu_use_goes_on_the_request_and_its_compute_stages(tmp_path):
    j = EngineJoin()
    two_requests_in_one_batch(j)
    [r1] = j.on_request(request(900, 5000), now_ns=5000)
    on_gpu = tuple({"sitsprobe.gpu.index": 0, "sitsprobe.gpu.busy_percent": 40.0 + i}
                   for i, _ in enumerate(r1.inference.stages))
    server, children = exported(tmp_path, r1._replace(gpu=GpuUse(
        {"sitsprobe.cuda.launches": 12.5, "sitsprobe.cuda.copy_bytes": 4096}, on_gpu)))
    assert server["attrs"]["sitsprobe.cuda.launches"] == 12.5
    assert server["attrs"]["sitsprobe.cuda.copy_bytes"] == "4096"
    by_start = sorted((s for s in children if s["name"] != "cache_get prefix"),
                      key=lambda s: int(s["startTimeUnixNano"]))
    assert [(s["name"], s["attrs"]["sitsprobe.gpu.busy_percent"]) for s in by_start] == [
        ("prefill", 40.0), ("decode", 41.0), ("decode", 42.0)]


def test_gen_ai_metrics():
    j = EngineJoin()
    two_requests_in_one_batch(j)
    metrics = RequestMetrics()
    for fd, start in ((FD, 900), (FD + 1, 950)):
        for r in with_genai(j.on_request(request(start, 5000, fd=fd), now_ns=5000)):
            metrics.observe(r)
    metrics.observe_batches(j.batch_sizes)
    fams = {f.name: f for f in metrics.collect()}
    ttft = fams["gen_ai_server_time_to_first_token_seconds"]
    assert [s.value for s in ttft.samples if s.name.endswith("_count")] == [2]
    ratio = fams["sitsprobe_engine_cache_hit_ratio"].samples[0].value
    assert ratio == 0.5
    batch = fams["sitsprobe_engine_batch_size"]
    assert [s.value for s in batch.samples if s.name.endswith("_count")] == [2]


def test_an_idle_exchange_is_reported_once_however_often_it_is_flushed():
    from sitsprobe.events import Exchange
    from sitsprobe.routes import RouteMapper
    from sitsprobe.stitch.exchange import Stitcher

    ex = Exchange(tgid=1, fd=3, comm="redis-server", reason=3, start_ns=10, last_in_ns=10,
                  first_out_ns=20, last_out_ns=30, bytes_in=20, bytes_out=5, flags=3, local=None,
                  peer=None, status=0, pipeline=0, req=b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
                  resp=b"$-1\r\n")
    st = Stitcher(RouteMapper())
    assert len(st.on_flush(ex)) == 1
    assert st.on_flush(ex) == [] and st.on_flush(ex) == []
    assert st.on_exchange(ex._replace(reason=1)) == []  # the kernel's own copy, later
    assert len(st.on_exchange(ex._replace(start_ns=40))) == 1  # the next one is new


def test_a_redacted_header_is_never_exported():
    from sitsprobe.stitch.exchange import enrich

    r = request(1, 2)._replace(head=b"GET / HTTP/1.1\r\nUser-Agent: secret-client/1\r\n\r\n")
    assert enrich(r).user_agent == "secret-client/1"
    assert enrich(r, frozenset({"user-agent"})).user_agent is None
    assert enrich(r).head == b""  # the captured bytes never travel further


def test_demand_counts_requests_in_the_engine_and_those_queued():
    j = EngineJoin()
    for rid in (1, 2, 3):
        j.on_marker(m("request_begin", rid, request_id=rid, fd=FD + rid, name="tiny"))
    # the ranges open now, as the kernel keeps them: 1 is served, 2 and 3 wait
    # (and a dead engine's queue, whose requests the join no longer holds)
    assert j.demand([(PID, "prefill"), (PID, "queue"), (PID, "queue"), (PID + 1, "queue")]) == {PID: (3, 2)}
    j.on_marker(m("request_end", 40, request_id=1))
    assert j.demand([(PID, "decode"), (PID, "decode")]) == {PID: (2, 0)}
    for rid in (2, 3):
        j.on_marker(m("request_end", 50, request_id=rid))
    assert j.demand() == {}
