"""The GenAI server metrics carry the conventions' attributes: the operation
and the provider on every one (Required), error.type on the request duration
(where the request ended in one, as its span says it), so that a chat its user
stopped, one the server cut off and one the server refused are told apart.
The slow tail's p99 is still a model's, whatever the error types."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sitsprobe.export.genai_metrics import EngineMetrics
from sitsprobe.export.prom import RequestMetrics
from sitsprobe.export.semconv import span_attributes, span_kind, span_name
from sitsprobe.request import CLIENT_CLOSED, Endpoint, GenAI, Request

MS = 1_000_000


def chat(model: str, ms: float, *, status: int = 200, complete: bool = True, partial: str | None = None,
         error: str | None = None, provider: str | None = "openai") -> Request:
    g = GenAI(source="wire", operation="chat", provider=provider, request_model=model, input_tokens=5,
              output_tokens=3, error_type=error)
    return Request(pid=7, comm="vllm", fd=9, start_ns=0, end_ns=int(ms * MS), first_out_ns=MS, bytes_in=100,
                   bytes_out=200, local=Endpoint("127.0.0.1", 8000), peer=Endpoint("127.0.0.1", 50000),
                   method="POST", target="/v1/chat/completions", path="/v1/chat/completions",
                   route="/v1/chat/completions", status=status, complete=complete, partial=partial,
                   genai=g, segments=(int(ms * MS), 0, 0, 0, 0))


def samples(m: EngineMetrics | RequestMetrics, name: str) -> dict[tuple, float]:
    reg = CollectorRegistry()
    reg.register(m if isinstance(m, RequestMetrics) else type("C", (), {"collect": lambda self: m.families()})())
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_the_duration_says_each_requests_error_type_as_its_span_does():
    m = EngineMetrics()
    requests = [chat("m", 20), chat("m", 30),
                chat("m", 900, complete=False, partial=CLIENT_CLOSED),  # its user pressed stop
                chat("m", 400, complete=False, partial="response_cut_off"),  # the server gave up
                chat("m", 2, status=400, error="invalid_request_error"),  # refused, the body says why
                chat("m", 3, status=503, error="overloaded_error"),  # the provider's word wins
                chat("m", 4, status=502)]  # no word: the status
    for r in requests:
        m.observe(r)
    got = samples(m, "gen_ai_server_request_duration_seconds_count")
    base = (("gen_ai_operation_name", "chat"), ("gen_ai_provider_name", "openai"), ("gen_ai_request_model", "m"))
    want = {"": 2, "client_closed": 1, "incomplete": 1, "invalid_request_error": 1, "overloaded_error": 1, "502": 1}
    assert got == {tuple(sorted((*base, ("error_type", e), ("process", "vllm")))): float(n)
                   for e, n in want.items()}
    for r in requests:  # the label is the span's error.type
        assert span_attributes(r).get("error.type", "") in want
    assert {span_attributes(r).get("error.type", "") for r in requests} == set(want)


@pytest.mark.parametrize("name", ["gen_ai_server_time_to_first_token_seconds_count",
                                  "gen_ai_server_tokens_total"])
def test_every_genai_metric_names_the_operation_and_the_provider(name):
    m = EngineMetrics()
    m.observe(chat("m", 20)._replace(genai=chat("m", 20).genai._replace(first_token_ns=5 * MS)))
    m.observe(chat("n", 20, provider=None))  # the markers of an engine whose path is not an API's
    labels = {dict(k)["gen_ai_request_model"]: (dict(k)["gen_ai_operation_name"], dict(k)["gen_ai_provider_name"])
              for k in samples(m, name)}
    assert labels["m"] == ("chat", "openai")
    if name == "gen_ai_server_tokens_total":
        assert labels["n"] == ("chat", "")


def test_the_slow_tail_is_a_models_whatever_the_error_types():
    """Model a is slow (2 s), model b fast (10 ms, half of them stopped by their
    users). b's p99 is b's own, over both error types: a 1 s b request is in
    b's slow tail, b's 1 ms ones after the p99 was read are not."""
    m = EngineMetrics()
    for i in range(64):
        m.observe(chat("a", 2000))
        m.observe(chat("b", 10) if i % 2 else chat("b", 10, complete=False, partial=CLIENT_CLOSED))
    for _ in range(10):
        m.observe(chat("b", 1))
    m.observe(chat("b", 1000, complete=False, partial=CLIENT_CLOSED))
    tail = {dict(k)["gen_ai_request_model"]: v for k, v in
            samples(m, "sitsprobe_gen_ai_slow_tail_segment_seconds_total").items() if ("segment", "network") in k}
    # every 10 ms one is at its own bucket's p99 or above (its bucket read alone), the 1 ms ones are below
    assert tail["b"] == pytest.approx(64 * 0.010 + 1.0)


def call(model: str, ms: float, first_ms: float | None = 40, **kw) -> Request:
    """A traced client's streamed chat to 10.0.0.7:8000, as chat() is the server's."""
    r = chat(model, ms, **kw)
    g = r.genai._replace(streaming=True, first_token_ns=None if first_ms is None else int(first_ms * MS))
    return r._replace(direction="client", comm="gateway", local=Endpoint("10.0.0.5", 41000),
                      peer=Endpoint("10.0.0.7", 8000), route=None, genai=g, segments=None)


def test_a_traced_clients_calls_are_gen_ai_client_metrics_never_the_servers():
    """A gateway traced on both sides: the request it served counts once in
    gen_ai.server.*, its call upstream once in gen_ai.client.*, by the server
    called; a non-stream call has no time to first chunk."""
    m = RequestMetrics()
    m.observe(chat("m", 120))
    m.observe(call("m", 100))
    m.observe(call("m", 90, status=503, error="overloaded_error"))
    m.observe(call("m", 30, first_ms=None)._replace(genai=call("m", 30).genai._replace(streaming=False)))
    server = (("gen_ai_operation_name", "chat"), ("gen_ai_provider_name", "openai"), ("gen_ai_request_model", "m"))
    called = (*server, ("process", "gateway"), ("server_address", "10.0.0.7"), ("server_port", "8000"))
    assert samples(m, "gen_ai_server_request_duration_seconds_count") == {
        tuple(sorted((*server, ("error_type", ""), ("process", "vllm")))): 1.0}
    assert samples(m, "gen_ai_client_operation_duration_seconds_count") == {
        tuple(sorted((*called, ("error_type", "")))): 2.0,
        tuple(sorted((*called, ("error_type", "overloaded_error")))): 1.0}
    assert samples(m, "gen_ai_client_operation_time_to_first_chunk_seconds_sum") == {
        tuple(sorted(called)): pytest.approx(0.080)}  # the two streams', 40 ms each
    tokens = samples(m, "gen_ai_client_token_usage_sum")
    assert tokens == {tuple(sorted((*called, ("gen_ai_token_type", t)))): float(n * 3) for t, n in
                      (("input", 5), ("output", 3))}
    assert samples(m, "gen_ai_client_token_usage_bucket")[
        tuple(sorted((*called, ("gen_ai_token_type", "input"), ("le", "4"))))] == 0.0  # 5 tokens: above 4


def test_a_calls_span_has_its_time_to_first_chunk_not_a_servers_times():
    a = span_attributes(call("m", 100)._replace(genai=call("m", 100).genai._replace(last_token_ns=90 * MS)))
    assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.040)
    assert "gen_ai.server.time_to_first_token" not in a and "gen_ai.server.time_per_output_token" not in a
    served = span_attributes(chat("m", 100)._replace(genai=chat("m", 100).genai._replace(
        streaming=True, first_token_ns=40 * MS, last_token_ns=90 * MS)))
    assert served["gen_ai.server.time_to_first_token"] == pytest.approx(0.040)
    assert served["gen_ai.server.time_per_output_token"] == pytest.approx(0.025)
    assert "gen_ai.response.time_to_first_chunk" not in served


def test_a_call_to_a_model_is_named_as_an_inference_its_server_span_for_its_route():
    """The GenAI conventions name an inference call {operation} {model}; an
    unknown model leaves the operation; a call that is no GenAI keeps its
    method, and the server's span its route (the HTTP conventions')."""
    assert (span_name(call("llama-3.1-8b", 100)), span_kind(call("m", 100)).name) == ("chat llama-3.1-8b", "CLIENT")
    assert span_name(call("m", 100)._replace(genai=call("m", 100).genai._replace(request_model=None))) == "chat"
    assert span_name(call("m", 100)._replace(genai=None)) == "POST"
    assert span_name(chat("m", 100)) == "POST /v1/chat/completions"


def test_a_streamed_calls_chunks_each_observe_the_time_since_the_one_before():
    """gen_ai.client.operation.time_per_output_chunk: one observation for each
    chunk with output after the first (two read together: 0); none for a call
    that did not stream, nor for a server's answer."""
    m = RequestMetrics()
    m.observe(call("m", 100)._replace(genai=call("m", 100).genai._replace(chunk_gaps_ns=(10 * MS, 0, 30 * MS))))
    m.observe(call("m", 30, first_ms=None)._replace(genai=call("m", 30).genai._replace(
        streaming=False, chunk_gaps_ns=(5 * MS,))))
    m.observe(chat("m", 120)._replace(genai=chat("m", 120).genai._replace(streaming=True, first_token_ns=MS,
                                                                           chunk_gaps_ns=(7 * MS,))))
    called = (("gen_ai_operation_name", "chat"), ("gen_ai_provider_name", "openai"), ("gen_ai_request_model", "m"),
              ("process", "gateway"), ("server_address", "10.0.0.7"), ("server_port", "8000"))
    name = "gen_ai_client_operation_time_per_output_chunk_seconds"
    assert samples(m, f"{name}_count") == {tuple(sorted(called)): 3.0}
    assert samples(m, f"{name}_sum") == {tuple(sorted(called)): pytest.approx(0.040)}
    buckets = samples(m, f"{name}_bucket")
    assert buckets[tuple(sorted((*called, ("le", "5e-05"))))] == 1.0  # the 0
    assert buckets[tuple(sorted((*called, ("le", "0.01"))))] == 2.0  # and the 10 ms
