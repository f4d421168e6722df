"""sitsprobe.export.semconv and prom.RequestMetrics for what is not an HTTP/1.1
server request: the calls a traced process makes (HTTP, Redis), HTTP/2
streams and gRPC calls, either way. The span side reads as the conventions'
tables (name, kind, the attribute set); the metric side is scraped through
prometheus_client, as Prometheus would read it."""
from __future__ import annotations

import pytest
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sitsprobe.export import semconv
from sitsprobe.export.prom import DURATION_BUCKETS, FOLDED, MAX_METHODS, MAX_SERVERS, RequestMetrics
from sitsprobe.export.semconv import span_attributes, span_kind, span_name
from sitsprobe.request import H2, Endpoint, Request

MS = 1_000_000
T0 = 5_000 * MS
OWN = Endpoint("10.0.0.5", 40112)  # a client's own end of the connection it opened
CALLED = Endpoint("10.0.0.7", 8080)  # the server it called
SERVING = Endpoint("10.0.0.5", 8000)  # a server's own end
CALLER = Endpoint("10.0.0.9", 51234)  # the client that called it
H2_KEYS = {"sitsprobe.http2.stream_id", "sitsprobe.http2.flow_control_wait_s",
           "sitsprobe.http2.connection_window_updates"}
COMMON = {"process.pid", "sitsprobe.fd", "sitsprobe.complete", "network.transport",
          "sitsprobe.time_to_first_byte_s", "network.peer.address", "network.peer.port",
          "server.address", "server.port"}


def served(**kw) -> Request:
    """An HTTP/1.1 request the traced process answered."""
    fields = dict(pid=4242, comm="api", fd=17, start_ns=T0, end_ns=T0 + 20 * MS, first_out_ns=T0 + 15 * MS,
                  bytes_in=300, bytes_out=1200, local=SERVING, peer=CALLER, method="GET",
                  target="/v1/items/42?token=REDACTED", path="/v1/items/42", route="/v1/items/{id}",
                  status=200, user_agent="curl/8.5.0")
    fields.update(kw)
    return Request(**fields)


def call(**kw) -> Request:
    """An HTTP/1.1 request the traced process sent (its target as enrich() redacted it)."""
    fields = dict(local=OWN, peer=CALLED, direction="client", user_agent="python-requests/2.31",
                  bytes_in=120, bytes_out=900)
    fields.update(kw)
    return served(**fields)


def grpc(status: int | None = 0, **kw) -> Request:
    """A gRPC call the traced process served (direction="client": made)."""
    h2 = H2(stream_id=5, authority=kw.pop("authority", None), scheme="http", grpc=True, grpc_status=status,
            grpc_message=None if status == 0 else "no such item", request_messages=1, response_messages=3,
            flow_control_wait_ns=kw.pop("wait_ns", 0))
    fields = dict(protocol="http/2", method="POST", target="/shop.v1.Catalog/GetItem",
                  path="/shop.v1.Catalog/GetItem", route="/shop.v1.Catalog/GetItem", status=200, h2=h2,
                  user_agent="grpc-python/1.62")
    fields.update(kw)
    return served(**fields)


def redis(**kw) -> Request:
    """A GET the traced process sent to Redis."""
    fields = dict(protocol="resp", method="GET", target=None, path=None, route=None, status=None,
                  user_agent=None, local=OWN, peer=Endpoint("10.0.0.8", 6379), direction="client",
                  head=b"*2\r\n$3\r\nGET\r\n$6\r\nuser:1\r\n")
    fields.update(kw)
    return served(**fields)


# -- HTTP client spans ----------------------------------------------------------------


def test_an_http_call_is_a_client_span_named_for_its_method_about_the_server_it_called():
    r = call()
    assert span_kind(r) is SpanKind.CLIENT
    assert span_name(r) == "GET"  # {http.request.method}: a client has no route template
    a = span_attributes(r)
    assert set(a) == COMMON | {"http.request.method", "http.response.status_code", "http.request.size",
                               "http.response.size", "network.protocol.name", "network.protocol.version",
                               "user_agent.original", "url.full"}
    assert (a["server.address"], a["server.port"]) == ("10.0.0.7", 8080)  # the server, never our own end
    assert (a["network.peer.address"], a["network.peer.port"]) == ("10.0.0.7", 8080)
    assert a["url.full"] == "http://10.0.0.7:8080/v1/items/42?token=REDACTED"
    assert a["network.protocol.version"] == "1.1"
    assert (a["http.request.size"], a["http.response.size"]) == (120, 900)  # sent, then read


def test_a_client_span_never_names_its_own_end():
    a = span_attributes(call())
    assert not {k for k in a if k.startswith("client.")}
    assert OWN.address not in a.values() and OWN.port not in a.values()
    # a server span keeps what it had: server.* its own end, client.* the caller
    s = span_attributes(served())
    assert (s["server.address"], s["server.port"]) == (SERVING.address, SERVING.port)
    assert (s["client.address"], s["client.port"]) == (CALLER.address, CALLER.port)


def test_a_server_span_is_as_it_was():
    assert span_name(served()) == "GET /v1/items/{id}"
    assert span_attributes(served()) == {
        "process.pid": 4242, "sitsprobe.fd": 17, "sitsprobe.complete": True, "network.transport": "tcp",
        "sitsprobe.time_to_first_byte_s": 0.015,
        "server.address": "10.0.0.5", "server.port": 8000,
        "client.address": "10.0.0.9", "client.port": 51234,
        "network.peer.address": "10.0.0.9", "network.peer.port": 51234,
        "http.request.method": "GET", "http.route": "/v1/items/{id}", "http.response.status_code": 200,
        "http.request.size": 300, "http.response.size": 1200, "url.scheme": "http",
        "url.path": "/v1/items/42", "url.query": "token=REDACTED", "network.protocol.name": "http",
        "network.protocol.version": "1.1", "user_agent.original": "curl/8.5.0"}


@pytest.mark.parametrize("status, complete, server, client", [
    (200, True, None, None),
    (404, True, None, "404"),  # a client's error from 400, a server's from 500
    (503, True, "503", "503"),
    (None, False, "incomplete", "incomplete"),
])
def test_error_type_of_http_by_side(status, complete, server, client):
    assert span_attributes(served(status=status, complete=complete)).get("error.type") == server
    assert span_attributes(call(status=status, complete=complete)).get("error.type") == client
    # and the span's status is ERROR where there is one
    assert (served(status=status, complete=complete).is_error, call(status=status, complete=complete).is_error) \
        == (server is not None, client is not None)


def test_an_unknown_method_is_other_and_names_the_span_http():
    r = call(method="PURGE")
    a = span_attributes(r)
    assert span_name(r) == "HTTP"
    assert (a["http.request.method"], a["http.request.method_original"]) == ("_OTHER", "PURGE")


@pytest.mark.parametrize("kw, url", [
    ({"peer": Endpoint("::1", 8080)}, "http://[::1]:8080/v1/items/42?token=REDACTED"),
    ({"target": "http://proxy.example/v1/x"}, "http://proxy.example/v1/x"),  # absolute-form, to a proxy
    ({"target": "*", "method": "OPTIONS"}, None),
    ({"target": None, "path": None}, None),  # the request was not seen
    ({"peer": None}, None),  # nor where it went
])
def test_url_full_of_a_call(kw, url):
    assert span_attributes(call(**kw)).get("url.full") == url


def test_an_http2_call_names_the_server_by_its_authority():
    h2 = H2(stream_id=3, authority="api.example.com:8443", scheme="https")
    r = call(protocol="http/2", target="/search?q=shoes", path="/search", h2=h2)
    a = span_attributes(r)
    assert span_name(r) == "GET"
    assert (a["server.address"], a["server.port"]) == ("api.example.com", 8443)
    assert (a["network.peer.address"], a["network.peer.port"]) == ("10.0.0.7", 8080)  # where it connected
    # no enrich() step redacts an HTTP/2 :path: semconv redacts every query value itself
    assert a["url.full"] == "https://api.example.com:8443/search?q=REDACTED"
    assert (a["network.protocol.name"], a["network.protocol.version"]) == ("http", "2")
    assert H2_KEYS <= set(a) and "client.address" not in a
    # an :authority without a port: the port connected to
    a = span_attributes(r._replace(h2=H2(stream_id=3, authority="api.example.com")))
    assert (a["server.address"], a["server.port"]) == ("api.example.com", 8080)


# -- Redis client spans ---------------------------------------------------------------


def test_a_redis_call_is_named_for_its_command_and_never_shows_a_key():
    r = redis()
    assert span_kind(r) is SpanKind.CLIENT
    assert span_name(r) == "GET"
    a = span_attributes(r)
    assert set(a) == COMMON | {"db.system.name", "db.operation.name", "sitsprobe.bytes_in",
                               "sitsprobe.bytes_out"}
    assert (a["db.system.name"], a["db.operation.name"]) == ("redis", "GET")
    assert (a["server.address"], a["server.port"]) == ("10.0.0.8", 6379)
    assert "user:1" not in repr(a)


def test_a_redis_server_span_is_as_it_was():
    r = redis(direction="server", local=Endpoint("10.0.0.8", 6379), peer=CALLER)
    a = span_attributes(r)
    assert span_kind(r) is SpanKind.SERVER and span_name(r) == "GET"
    assert (a["server.address"], a["server.port"]) == ("10.0.0.8", 6379)
    assert (a["client.address"], a["client.port"]) == (CALLER.address, CALLER.port)


# -- HTTP/2 server spans --------------------------------------------------------------


def test_an_http2_server_span_is_an_http1_one_with_its_stream():
    h1 = served(target="/v1/items/42?token=abc")
    h2 = H2(stream_id=7, authority="shop.example", scheme="https", flow_control_wait_ns=1_500_000)
    r = h1._replace(protocol="http/2", h2=h2)
    assert span_name(r) == span_name(h1) and span_kind(r) is SpanKind.SERVER
    a, b = span_attributes(r), span_attributes(h1)
    assert a["network.protocol.version"] == "2" and a["url.scheme"] == "https"
    assert a["sitsprobe.http2.stream_id"] == 7
    assert a["sitsprobe.http2.flow_control_wait_s"] == pytest.approx(0.0015)
    assert "sitsprobe.http2.reset_code" not in a
    assert a["url.query"] == "token=REDACTED"  # redacted here: no enrich() step for HTTP/2 yet
    changed = H2_KEYS | {"network.protocol.version", "url.scheme", "url.query"}
    assert {k: v for k, v in a.items() if k not in changed} == {k: v for k, v in b.items() if k not in changed}


def test_an_http2_stream_always_says_its_flow_control_wait_and_a_reset_when_there_was_one():
    r = served(protocol="http/2", h2=H2(stream_id=9, reset_code=8), complete=False)
    a = span_attributes(r)
    assert a["sitsprobe.http2.flow_control_wait_s"] == 0.0
    assert a["sitsprobe.http2.reset_code"] == 8
    assert a["url.scheme"] == "http"  # :scheme not known


# -- gRPC ---------------------------------------------------------------------------------


def test_a_grpc_call_served_is_named_for_its_method():
    r = grpc(5)
    assert span_kind(r) is SpanKind.SERVER
    assert span_name(r) == "shop.v1.Catalog/GetItem"
    a = span_attributes(r)
    assert set(a) == COMMON | H2_KEYS | {
        "client.address", "client.port", "rpc.system.name", "rpc.method", "rpc.response.status_code",
        "sitsprobe.rpc.request_messages", "sitsprobe.rpc.response_messages", "network.protocol.name",
        "network.protocol.version", "sitsprobe.bytes_in", "sitsprobe.bytes_out"}
    assert a["rpc.system.name"] == "grpc"
    assert a["rpc.method"] == "shop.v1.Catalog/GetItem"
    assert a["rpc.response.status_code"] == "NOT_FOUND"
    assert "error.type" not in a  # NOT_FOUND is the caller's error, not the server's
    assert (a["sitsprobe.rpc.request_messages"], a["sitsprobe.rpc.response_messages"]) == (1, 3)
    assert (a["server.address"], a["server.port"]) == (SERVING.address, SERVING.port)
    assert "no such item" not in repr(a)  # the status message may carry user data


def test_a_grpc_call_made_is_a_client_span_about_the_server():
    r = grpc(5, direction="client", local=OWN, peer=CALLED, authority="catalog.shop:50051")
    a = span_attributes(r)
    assert span_kind(r) is SpanKind.CLIENT and span_name(r) == "shop.v1.Catalog/GetItem"
    assert a["error.type"] == "NOT_FOUND"  # a client counts every code but OK
    assert (a["server.address"], a["server.port"]) == ("catalog.shop", 50051)
    assert (a["network.peer.address"], a["network.peer.port"]) == ("10.0.0.7", 8080)
    assert not {k for k in a if k.startswith("client.")}
    a = span_attributes(grpc(0, direction="client", local=OWN, peer=CALLED))  # no :authority: the peer
    assert (a["server.address"], a["server.port"]) == ("10.0.0.7", 8080) and "error.type" not in a


SERVER_ERRORS = {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}


@pytest.mark.parametrize("code, name", list(enumerate(
    ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
     "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
     "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"])) + [(42, "42")])
def test_grpc_status_names_and_which_side_counts_them_as_errors(code, name):
    server = span_attributes(grpc(code))
    client = span_attributes(grpc(code, direction="client", local=OWN, peer=CALLED))
    assert server["rpc.response.status_code"] == client["rpc.response.status_code"] == name
    assert server.get("error.type") == (name if name in SERVER_ERRORS else None)
    assert client.get("error.type") == (None if name == "OK" else name)
    assert grpc(code).is_error == (name in SERVER_ERRORS)  # the span's status
    assert grpc(code, direction="client", local=OWN, peer=CALLED).is_error == (name != "OK")


def test_a_grpc_call_cut_short_has_no_status_and_is_incomplete():
    a = span_attributes(grpc(None, complete=False))
    assert "rpc.response.status_code" not in a and a["error.type"] == "incomplete"


def test_a_path_that_is_no_grpc_method_is_other():
    r = grpc(12, path="/", target="/")
    a = span_attributes(r)
    assert (a["rpc.method"], a["rpc.method_original"]) == ("_OTHER", "/")
    assert span_name(r) == "grpc"  # {rpc.system.name} when the method is not known


def test_the_http2_name_is_the_protocols():
    http2 = pytest.importorskip("sitsprobe.stitch.protocols.http2")
    assert semconv.HTTP2 == http2.NAME


# -- metrics --------------------------------------------------------------------------------


def scrape(metrics: RequestMetrics) -> dict[str, dict[frozenset, float]]:
    """sample name -> labels -> value, as Prometheus reads the exposition."""
    out: dict[str, dict[frozenset, float]] = {}
    for family in text_string_to_metric_families(generate_latest(_registry(metrics)).decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def _registry(m: RequestMetrics) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(m)
    return registry


def labels(**kw) -> frozenset:
    return frozenset(kw.items())


def test_each_kind_of_request_feeds_its_own_histogram():
    m = RequestMetrics()
    h2 = H2(stream_id=1, scheme="https")
    for r in (served(), served(protocol="http/2", h2=h2), call(), call(status=404),
              call(protocol="http/2", h2=H2(stream_id=3, authority="api.example.com:443")),
              grpc(5), grpc(0, direction="client", local=OWN, peer=CALLED),
              redis(), redis(direction="server", local=Endpoint("10.0.0.8", 6379), peer=CALLER)):
        m.observe(r)
    got = scrape(m)
    assert got["http_server_request_duration_seconds_count"] == {
        labels(process="api", http_request_method="GET", http_route="/v1/items/{id}", http_response_status_code="200"): 2}  # HTTP/1.1 and /2
    assert got["http_client_request_duration_seconds_count"] == {
        labels(process="api", http_request_method="GET", server_address="10.0.0.7", server_port="8080", http_response_status_code="200"): 1,
        labels(process="api", http_request_method="GET", server_address="10.0.0.7", server_port="8080", http_response_status_code="404"): 1,
        labels(process="api", http_request_method="GET", server_address="api.example.com", server_port="443",
               http_response_status_code="200"): 1}
    method = "shop.v1.Catalog/GetItem"
    assert got["rpc_server_call_duration_seconds_count"] == {
        labels(process="api", rpc_system_name="grpc", rpc_method=method, rpc_response_status_code="NOT_FOUND"): 1}
    assert got["rpc_client_call_duration_seconds_count"] == {
        labels(process="api", rpc_system_name="grpc", rpc_method=method, rpc_response_status_code="OK"): 1}
    assert got["db_client_operation_duration_seconds_count"] == {  # the Redis server's request is not a call
        labels(process="api", db_system_name="redis", db_operation_name="GET", server_address="10.0.0.8",
               server_port="6379"): 1}
    assert got["db_client_operation_duration_seconds_sum"] == {
        labels(process="api", db_system_name="redis", db_operation_name="GET", server_address="10.0.0.8",
               server_port="6379"): pytest.approx(0.02)}


def test_the_call_histograms_have_the_server_histograms_buckets():
    m = RequestMetrics()
    for r in (served(), call(), grpc(), grpc(direction="client"), redis()):
        m.observe(r)
    got = scrape(m)
    bounds = {name: sorted(float(dict(k)["le"]) for k in got[name + "_bucket"])
              for name in (semconv.HTTP_DURATION, semconv.HTTP_CLIENT_DURATION, semconv.RPC_SERVER_DURATION,
                           semconv.RPC_CLIENT_DURATION, semconv.DB_CLIENT_DURATION)}
    assert all(b == [*DURATION_BUCKETS, float("inf")] for b in bounds.values()), bounds


def test_no_call_is_counted_as_a_served_request():
    m = RequestMetrics()
    for r in (call(), call(protocol="http/2", h2=H2(stream_id=1)), redis(),
              grpc(direction="client", local=OWN, peer=CALLED)):
        m.observe(r)
    got = scrape(m)
    assert "http_server_request_duration_seconds_count" not in got
    assert "rpc_server_call_duration_seconds_count" not in got
    assert "sitsprobe_request_segment_seconds_count" not in got


def test_server_pairs_past_the_cap_fold_into_other_per_process():
    m = RequestMetrics()
    for port in range(MAX_SERVERS + 3):
        m.observe(call(peer=Endpoint("10.0.0.7", 9000 + port)))
    m.observe(call(peer=Endpoint("10.0.0.7", 9000)))  # kept once, kept after the cap too
    m.observe(call(comm="worker", peer=Endpoint("10.0.0.7", 9999)))  # another process, its own cap
    for port in range(MAX_SERVERS + 1):
        m.observe(redis(peer=Endpoint("10.0.0.8", 7000 + port)))  # each metric its own cap
    got = scrape(m)
    http = got["http_client_request_duration_seconds_count"]
    mine = {dict(k)["server_port"]: v for k, v in http.items() if dict(k)["process"] == "api"}
    assert len(mine) == MAX_SERVERS + 1
    assert mine["9000"] == 2 and mine[FOLDED] == 3 and "9065" not in mine
    assert all(dict(k)["server_address"] == FOLDED for k in http if dict(k)["server_port"] == FOLDED)
    assert http[labels(process="worker", http_request_method="GET", server_address="10.0.0.7", server_port="9999",
                       http_response_status_code="200")] == 1
    db = {dict(k)["server_port"]: v for k, v in got["db_client_operation_duration_seconds_count"].items()}
    assert len(db) == MAX_SERVERS + 1 and db[FOLDED] == 1
    help_text = generate_latest(_registry(m)).decode()
    assert f"the first {MAX_SERVERS} pairs a process called, the rest {FOLDED}" in help_text


def test_grpc_methods_past_the_cap_are_other():
    m = RequestMetrics()
    for i in range(MAX_METHODS + 2):
        m.observe(grpc(0, path=f"/shop.v1.Catalog/Get{i}"))
    m.observe(grpc(0, path="/"))  # not a method at all
    methods = {dict(k)["rpc_method"]: v for k, v in scrape(m)["rpc_server_call_duration_seconds_count"].items()}
    assert len(methods) == MAX_METHODS + 1 and methods["_OTHER"] == 3



def test_with_pod_metadata_every_series_names_the_pod():
    """Two pods of one process name on a node are two series (kubernetes.metadata)."""
    m = RequestMetrics(("process", "namespace", "pod", "container"))
    pods = {4242: ("inference", "vllm-a", "vllm"), 4343: ("inference", "vllm-b", "vllm")}
    m.who_of = lambda r: (r.comm, *pods[r.pid])
    for r in (served(), served(pid=4343), served(pid=4343), call(), redis()):
        m.observe(r._replace(segments=(1, 2, 3, 4, 5)))
    got = scrape(m)
    who = dict(process="api", namespace="inference", container="vllm")
    assert got["http_server_request_duration_seconds_count"] == {
        labels(**who, pod="vllm-a", http_request_method="GET", http_route="/v1/items/{id}", http_response_status_code="200"): 1,
        labels(**who, pod="vllm-b", http_request_method="GET", http_route="/v1/items/{id}", http_response_status_code="200"): 2}
    assert {dict(k)["pod"] for k in got["http_client_request_duration_seconds_count"]} == {"vllm-a"}
    assert {dict(k)["pod"] for k in got["db_client_operation_duration_seconds_count"]} == {"vllm-a"}
    assert got["sitsprobe_request_segment_seconds_count"][labels(**who, pod="vllm-b", segment="io")] == 2
    assert got["sitsprobe_request_bytes_total"][labels(**who, pod="vllm-b", protocol="http/1.1")] == 600
    # and without it, the process alone, as before
    assert RequestMetrics().labels == ("process",)
