import os
import random
import time

import pytest

from sitsprobe.request import TraceParent
from sitsprobe.stitch.http import (
    MAX_HEADERS,
    MAX_TARGET,
    RequestHead,
    ResponseHead,
    looks_like_request,
    parse_request_heads,
    parse_response_head,
    parse_traceparent,
    request_headers,
)

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TP_PARSED = TraceParent(
    trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736, span_id=0x00F067AA0BA902B7, flags=1
)

PIPELINED = (
    b"POST /v1/chat/completions?stream=1 HTTP/1.1\r\n"
    b"Host: api.local:8000\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: 17\r\n"
    b"traceparent: " + TP.encode() + b"\r\n"
    b"\r\n"
    b'{"model":"llama"}'
    b"GET /health HTTP/1.1\r\n"
    b"Host: api.local:8000\r\n"
    b"User-Agent: kube-probe/1.29\r\n"
    b"\r\n"
)

RESPONSE = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: text/event-stream; charset=utf-8\r\n"
    b"Transfer-Encoding: chunked\r\n"
    b"Cache-Control: no-cache\r\n"
    b"\r\n"
    b"1a\r\ndata: {\"choices\": []}\r\n\r\n"
)


def one(data: bytes) -> RequestHead:
    heads = parse_request_heads(data)
    assert len(heads) == 1, heads
    return heads[0]


# --- requests ------------------------------------------------------------


def test_get_with_headers():
    h = one(
        b"GET /a/b?x=1&y=2#frag HTTP/1.1\r\n"
        b"Host: example.com\r\n"
        b"USER-Agent:   curl/8.5.0  \r\n"
        b"Accept: */*\r\n"
        b"accept: text/html\r\n"
        b"X-Empty:\r\n"
        b"\r\n"
    )
    assert h.method == "GET"
    assert h.target == "/a/b?x=1&y=2#frag"
    assert h.path == "/a/b"
    assert h.version == "1.1"
    assert h.headers == {
        "host": "example.com",
        "user-agent": "curl/8.5.0",
        "accept": "*/*",
        "x-empty": "",
    }
    assert h.complete
    assert h.content_length is None and not h.chunked and h.traceparent is None


def test_post_body_then_pipelined_get():
    post, get = parse_request_heads(PIPELINED)
    assert (post.method, post.target, post.path) == (
        "POST",
        "/v1/chat/completions?stream=1",
        "/v1/chat/completions",
    )
    assert post.content_length == 17 and post.complete
    assert post.traceparent == TP_PARSED
    assert (get.method, get.path) == ("GET", "/health")
    assert get.headers["user-agent"] == "kube-probe/1.29"
    assert get.complete and get.content_length is None


def test_pipelined_limit_and_default_bound():
    data = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n" * 40
    assert len(parse_request_heads(data)) == 16
    assert len(parse_request_heads(data, limit=3)) == 3
    assert parse_request_heads(data, limit=0) == []


def test_body_running_past_the_capture_stops_the_scan():
    data = b"PUT /blob HTTP/1.1\r\nContent-Length: 100000\r\n\r\nGET / HTTP/1.1\r\n\r\n"
    h = one(data)
    assert h.content_length == 100000 and h.complete


def test_empty_line_between_pipelined_requests_is_ignored():
    data = b"POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi\r\nGET /b HTTP/1.1\r\n\r\n"
    assert [h.path for h in parse_request_heads(data)] == ["/a", "/b"]


def test_keep_alive_versions():
    h10 = one(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    h11 = one(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert (h10.version, h10.headers["connection"]) == ("1.0", "keep-alive")
    assert (h11.version, h11.headers["connection"]) == ("1.1", "close")
    two = parse_request_heads(b"GET /1 HTTP/1.0\r\n\r\nGET /2 HTTP/1.0\r\n\r\n")
    assert [h.path for h in two] == ["/1", "/2"]


@pytest.mark.parametrize(
    "target, path",
    [
        ("http://example.com/p/q?x=1", "/p/q"),
        ("https://user@example.com:8443/p#f", "/p"),
        ("http://example.com", "/"),
        ("http://example.com?x=1", "/"),
        ("/", "/"),
        ("/?x", "/"),
        ("*", "*"),
        ("example.com:443", "example.com:443"),
        ("/a/http://b/c", "/a/http://b/c"),
    ],
)
def test_target_forms(target, path):
    h = one(b"OPTIONS " + target.encode() + b" HTTP/1.1\r\n\r\n")
    assert (h.target, h.path) == (target, path)


@pytest.mark.parametrize(
    "te, chunked", [("chunked", True), ("gzip, Chunked", True), ("chunked, gzip", False)]
)
def test_transfer_encoding(te, chunked):
    data = (
        b"POST /upload HTTP/1.1\r\nTransfer-Encoding: " + te.encode() + b"\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\nGET /next HTTP/1.1\r\n\r\n"
    )
    h = one(data)  # a body framed by Transfer-Encoding ends the scan
    assert h.chunked is chunked


def test_extension_method_needs_a_complete_request_line():
    h = one(b"PROPFIND /dav HTTP/1.1\r\nDepth: 1\r\n\r\n")
    assert h.method == "PROPFIND" and h.headers == {"depth": "1"}
    assert parse_request_heads(b"PROPFIND /dav HTT") == []
    assert one(b"GET /dav HTT").target == "/dav"


def test_cut_request_line():
    h = one(b"GET /v1/mod")
    assert (h.method, h.target, h.path) == ("GET", "/v1/mod", "/v1/mod")
    assert h.version == "" and not h.complete
    assert h.headers == {} and h.content_length is None
    assert one(b"GET /v1/models HTTP/1.1").version == "1.1"
    assert one(b"GET /v1/models HTTP/1.1\r").version == "1.1"
    assert one(b"GET /v1/models HTTP/1.").version == ""
    for data in (b"GET", b"GET ", b"G", b"", b"GET  /x HTTP/1.1\r\n\r\n"):
        assert parse_request_heads(data) == [], data


def test_cut_headers_keep_only_whole_lines():
    h = one(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 12")
    assert h.headers == {"host": "a"} and not h.complete and h.content_length is None
    assert one(b"GET / HTTP/1.1\r\n").headers == {}


def test_target_is_capped():
    long = b"/" + b"a" * 5000
    h = one(b"GET " + long + b" HTTP/1.1\r\n\r\n")
    assert len(h.target) == MAX_TARGET and h.target == long[:MAX_TARGET].decode()
    assert h.complete and h.version == "1.1"
    h = one(b"GET " + long * 4 + b" HTTP/1.1\r\n\r\n")  # a request line past 8 KiB is cut there
    assert len(h.target) == MAX_TARGET and not h.complete


def test_bare_lf_line_ends():
    data = b"POST /a HTTP/1.1\nHost: h\nContent-Length: 3\n\nabcGET /b HTTP/1.0\n\n"
    a, b = parse_request_heads(data)
    assert a.headers == {"host": "h", "content-length": "3"} and a.complete
    assert (b.path, b.version, b.complete) == ("/b", "1.0", True)
    assert one(b"GET / HTTP/1.1\r\nHost: h\n\r\n").complete


@pytest.mark.parametrize(
    "value", ["abc", "-1", "+5", "1e3", "\u00b2", "\u0663", "1 2", "9" * 19, ""]
)
def test_bad_content_length_is_none(value):
    h = one(b"POST / HTTP/1.1\r\nContent-Length: " + value.encode("utf-8") + b"\r\n\r\n")
    assert h.content_length is None


def test_header_traceparent_invalid_is_none():
    h = one(b"GET / HTTP/1.1\r\ntraceparent: " + TP.upper().encode() + b"\r\n\r\n")
    assert h.traceparent is None and h.headers["traceparent"] == TP.upper()


def test_truncation_at_every_offset_is_monotone():
    for data in (PIPELINED, PIPELINED.replace(b"\r\n", b"\n")):
        full = parse_request_heads(data)
        assert len(full) == 2 and all(h.complete for h in full)
        previous = 0
        for i in range(len(data) + 1):
            heads = parse_request_heads(data[:i])
            assert previous <= len(heads) <= len(full), i
            previous = len(heads)
            for got, want in zip(heads, full):
                assert got.method == want.method
                assert want.target.startswith(got.target)
                assert want.path.startswith(got.path)
                assert got.version in ("", want.version)
                assert got.headers.items() <= want.headers.items()
                assert got.content_length in (None, want.content_length)
                assert got.traceparent in (None, want.traceparent)
                if got.complete:
                    assert got == want
        assert parse_request_heads(data) == full


# --- looks_like_request --------------------------------------------------


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"GET / HTTP/1.1\r\n", True),
        (b"OPTIONS * HTTP/1.1", True),
        (b"PATCH ", True),
        (b"DELETE /x", True),
        (b"GET", False),
        (b"GET/", False),
        (b"get / HTTP/1.1", False),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", False),
        (b"PROPFIND / HTTP/1.1", False),
        (b"HTTP/1.1 200 OK", False),
        (b"\x16\x03\x01\x02\x00\x01", False),
        (b"", False),
        (b" GET /", False),
    ],
)
def test_looks_like_request(data, expected):
    assert looks_like_request(data) is expected


# --- traceparent (W3C Trace Context level 1) ------------------------------


def test_traceparent_valid():
    assert parse_traceparent(TP) == TP_PARSED
    assert parse_traceparent(" " + TP + "\t") == TP_PARSED
    unsampled = parse_traceparent(TP[:-2] + "00")
    assert unsampled is not None and unsampled.flags == 0
    assert parse_traceparent(TP[:-2] + "ff").flags == 0xFF


def test_traceparent_future_versions():
    future = "cc" + TP[2:]
    assert parse_traceparent(future) == TP_PARSED
    assert parse_traceparent(future + "-what-the-future-will-be-like") == TP_PARSED
    assert parse_traceparent(future + ".what") is None
    assert parse_traceparent(future + "what") is None


@pytest.mark.parametrize(
    "value",
    [
        "",
        "00",
        "ff" + TP[2:],  # version ff is invalid
        TP + "-extra",  # version 00 allows nothing after flags
        TP + "0",
        TP.upper(),
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",  # misplaced delimiter
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".replace("4b", "\u0664b"),
    ],
)
def test_traceparent_invalid(value):
    assert parse_traceparent(value) is None


# --- responses -----------------------------------------------------------


def test_response_200_with_headers():
    r = parse_response_head(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 42\r\n"
        b"Server: uvicorn\r\n\r\n{}"
    )
    assert r == ResponseHead(
        version="1.1",
        status=200,
        reason="OK",
        headers={
            "content-type": "application/json",
            "content-length": "42",
            "server": "uvicorn",
        },
        complete=True,
        content_length=42,
        chunked=False,
        event_stream=False,
        head_size=88,  # through the blank line: the body starts here
    )


def test_response_reasons():
    assert parse_response_head(b"HTTP/1.0 404 Not Found\r\n\r\n").reason == "Not Found"
    r = parse_response_head(b"HTTP/1.1 204\r\n\r\n")
    assert (r.status, r.reason, r.complete) == (204, "", True)
    r = parse_response_head(b"HTTP/1.1 503 Service Unavailable\nRetry-After: 5\n\n")
    assert (r.status, r.headers, r.complete) == (503, {"retry-after": "5"}, True)


def test_response_sse_chunked():
    r = parse_response_head(RESPONSE)
    assert r.event_stream and r.chunked and r.complete and r.content_length is None
    r = parse_response_head(b"HTTP/1.1 200 OK\r\ncontent-type: Text/Event-Stream\r\n\r\n")
    assert r.event_stream


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"HTTP/1.1",
        b"HTTP/1.1 ",
        b"HTTP/1.1 20",
        b"HTTP/1.1 2000 OK\r\n",
        b"HTTP/1.1 abc OK\r\n",
        b"HTTP/1.1 099 Low\r\n",
        b"HTTP/1.2 200 OK\r\n",
        b"HTTP/2 200\r\n",
        b"HTTP/1.1  200 OK\r\n",
        b"http/1.1 200 OK\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x00" * 64,
    ],
)
def test_not_a_response(data):
    assert parse_response_head(data) is None


def test_truncated_status_line():
    r = parse_response_head(b"HTTP/1.1 200")
    assert (r.status, r.reason, r.headers, r.complete) == (200, "", {}, False)
    r = parse_response_head(b"HTTP/1.1 404 Not Fo")
    assert (r.status, r.reason, r.complete) == (404, "Not Fo", False)


def test_response_truncation_at_every_offset():
    full = parse_response_head(RESPONSE)
    for i in range(len(RESPONSE) + 1):
        r = parse_response_head(RESPONSE[:i])
        if i < len(b"HTTP/1.1 200"):
            assert r is None, i
            continue
        assert (r.version, r.status) == ("1.1", 200)
        assert full.reason.startswith(r.reason)
        assert r.headers.items() <= full.headers.items()
        if r.complete:
            assert r == full


# --- hostile input ---------------------------------------------------------


def check_request_heads(data: bytes, limit: int = 16) -> None:
    heads = parse_request_heads(data, limit)
    assert len(heads) <= limit
    for h in heads:
        assert isinstance(h, RequestHead)
        assert h.method and h.target and len(h.target) <= MAX_TARGET
        assert len(h.headers) <= MAX_HEADERS
        assert h.version in ("", "1.0", "1.1")
        assert h.content_length is None or h.content_length >= 0
    assert heads[:-1] == [h for h in heads[:-1] if h.complete]


def check_response_head(data: bytes) -> None:
    r = parse_response_head(data)
    assert r is None or (100 <= r.status <= 999 and len(r.headers) <= MAX_HEADERS)


def test_random_bytes():
    for _ in range(2000):
        data = os.urandom(random.randrange(0, 600))
        check_request_heads(data)
        check_response_head(data)
        check_request_heads(b"GET /" + data)
        check_request_heads(b"GET / HTTP/1.1\r\n" + data)
        check_response_head(b"HTTP/1.1 200 OK\r\n" + data)
        assert isinstance(looks_like_request(data), bool)
        assert parse_traceparent(data.decode("latin-1")) is None or len(data) >= 55


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 8)):
        i = rng.randrange(len(b) + 1)
        op = rng.randrange(4)
        if op == 0 and i < len(b):
            b[i] = rng.choice(b"\x00\r\n :/?-\xff aZ0")
        elif op == 1:
            b[i:i] = rng.choice([b"\r\n", b"\n", b"\r\n\r\n", b":", b" ", b"\x00", b"HTTP/1.1"])
        elif op == 2:
            del b[i : i + rng.randrange(1, 16)]
        else:
            b[i:i] = b[i : i + rng.randrange(1, 64)]
    return bytes(b)


def test_mutated_messages():
    rng = random.Random(1234)
    for _ in range(5000):
        data = mutate(rng, PIPELINED)
        check_request_heads(data[: rng.randrange(len(data) + 1)], limit=rng.randrange(0, 4))
        check_response_head(mutate(rng, RESPONSE))


def test_a_heads_headers_alone_are_what_the_whole_parse_reads():
    """request_headers (what a traced request's export reads) agrees with
    parse_request_heads on mutated, cut and random heads."""
    rng = random.Random(99)
    samples = [PIPELINED, b"\r\n" + PIPELINED, b"\n" + PIPELINED, b"GET / HTTP/1.1\r\nA: 1\r\na: 2\r\n\r\n"]
    found = 0
    for i in range(5000):
        data = mutate(rng, rng.choice(samples)) if i % 10 else os.urandom(rng.randrange(0, 300))
        data = data[: rng.randrange(len(data) + 1)]
        heads = parse_request_heads(data, limit=1)
        assert request_headers(data) == (heads[0].headers if heads else None), data
        found += bool(heads and heads[0].headers)
    assert found > 1000  # most had headers to agree on


def test_huge_header_count():
    fields = b"".join(b"X-H%d: %d\r\n" % (i, i) for i in range(10_000))
    data = b"GET / HTTP/1.1\r\n" + fields + b"\r\n"
    h = one(data[:30_000])
    assert len(h.headers) == MAX_HEADERS and not h.complete
    assert h.headers["x-h63"] == "63" and "x-h64" not in h.headers
    r = parse_response_head(b"HTTP/1.1 200 OK\r\n" + b"A: b\r\n" * 5000 + b"\r\n")
    assert r.headers == {"a": "b"} and r.complete


def test_nul_bytes():
    assert parse_request_heads(b"GET /a\x00b HTTP/1.1\r\n\r\n") == []
    assert parse_request_heads(b"\x00GET / HTTP/1.1\r\n\r\n") == []
    assert parse_request_heads(b"\x00" * 4096) == []
    h = one(b"GET / HTTP/1.1\r\nX-A\x00: 1\r\nX-B: \x002\r\n\r\n")
    assert h.headers == {"x-b": "\x002"}


def test_non_utf8_is_latin1():
    h = one(b"GET /caf\xe9/\xff HTTP/1.1\r\nX-Name: \xc3\x28\xff\r\n\r\n")
    assert h.target == "/caf\xe9/\xff" and h.headers["x-name"] == "\xc3(\xff"
    r = parse_response_head(b"HTTP/1.1 200 \xff\xfe\r\n\r\n")
    assert r.reason == "\xff\xfe"


def test_lines_without_line_ends():
    assert parse_request_heads(b"GET / HTTP/1.1 Host: example.com Accept: */*") == []
    assert parse_request_heads(b"GET / HTTP/1.1\rHost: x\r\r") == []  # bare CR is no line end


@pytest.mark.parametrize(
    "data",
    [
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        b"*1\r\n$4\r\nPING\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n",
        b"\r\n\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET \r\n\r\n",
        b" GET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET / HTTP/1.1 x\r\n\r\n",
        b"G(T / HTTP/1.1\r\n\r\n",
    ],
)
def test_not_http_requests(data):
    assert parse_request_heads(data) == []


def test_100k_buffers_are_bounded_and_fast():
    cases = [
        b"GET /" + b"a" * 100_000,
        b"GET / HTTP/1.1\r\nX: " + b"v" * 100_000,
        b"GET / HTTP/1.1\r\n" + b"a:b\n" * 25_000,
        b"GET / HTTP/1.1\r\n" + b"\r" * 100_000,
        b"GET / HTTP/1.1\r\n" + b":" * 100_000 + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"a" * 100_000,
        b"GET / HTTP/1.1\r\n" + b"a\n" * 50_000,
        b"GET / HTTP/1.1\r\nA:" + b" " * 100_000 + b"x\r\n\r\n",
        b"A" * 100_000,
        b"\n" * 100_000,
        b"\r\n" * 50_000,
        b" " * 100_000,
        b"GET / HTTP/1.1\r\n\r\n" * 6000,
        b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n" * 3000,
        os.urandom(100_000),
    ]
    for data in cases:
        start = time.perf_counter()
        check_request_heads(data)
        check_response_head(b"HTTP/1.1 200 OK\r\n" + data)
        assert time.perf_counter() - start < 0.5  # linear scans: a few ms at most
    assert len(parse_request_heads(b"GET /" + b"a" * 100_000)[0].target) == MAX_TARGET
