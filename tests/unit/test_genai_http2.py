"""GenAI over HTTP/2: every recorded answer (tests/fixtures/genai) served over
an HTTP/2 connection that the h2 library frames on both ends, fed to
stitch.streams as the kernel hands over a traced server's reads and writes,
must read as tests/unit/test_genai.py's table says it reads over HTTP/1.1:
the same record, the same times (each DATA frame its own write, 1 ms apart).
"""
from __future__ import annotations

import json

import h2.config
import h2.connection
import pytest

from sitsprobe.abi import CF_CLIENT, CF_TUPLE, CH_CLOSE, CH_IN, CH_OUT
from sitsprobe.events import Chunk
from sitsprobe.request import GenAI, Endpoint
from sitsprobe.routes import RouteMapper
from sitsprobe.stitch import genai
from sitsprobe.stitch.protocols.http2_payload import Kept, Limits
from sitsprobe.stitch.streams import StreamStitcher
from sitsprobe.stitch.write_scan import counted

from .test_genai import AS_WRITTEN, EXACT, INDEX, SHARED, T0, at, request_body, written

LIMITS = Limits(body=512, tail=512, peek=1024, writes=4096)  # every fixture write seen whole
_NOT_IN_H2 = {"transfer-encoding", "connection", "keep-alive"}


def served(name: str, frame=lambda data: [data], request: bytes | None = None,
           writes: list[list[int]] | None = None):
    """Fixture ``name`` over HTTP/2: (what a traced server read and wrote, as
    chunks), the request in one read at T0, the response's HEADERS in the
    write at(0), its body parts (as its HTTP/1 server wrote them, chunk framing
    undone) at(1), at(2), ..., each cut into DATA frames by ``frame``, and an
    empty END_STREAM frame last. ``writes``: the parts (1, 2, ...) written
    together, each group's frames in one write at(its first part)."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    body = request_body(name) if request is None else request
    client.send_headers(1, [(":method", "POST"), (":path", INDEX[name]["path"]), (":scheme", "http"),
                            (":authority", "engine:8000"), ("content-type", "application/json")])
    client.send_data(1, body, end_stream=True)
    server.initiate_connection()
    out = client.data_to_send()
    server.receive_data(out)
    chunks = [chunk(T0, CH_IN, out)]
    head, *parts = written(name)
    lines = head.decode("latin-1").split("\r\n")
    fields = [line.partition(":") for line in lines[1:] if line]
    server.send_headers(1, [(":status", lines[0].split()[1])] + [
        (k.strip().lower(), v.strip()) for k, _, v in fields if k.strip().lower() not in _NOT_IN_H2])
    chunks.append(chunk(at(0), CH_OUT, server.data_to_send()))
    chunked = b"transfer-encoding: chunked" in head.lower()
    for group in writes or [[i] for i in range(1, len(parts) + 1)]:
        for i in group:
            data = parts[i - 1].partition(b"\r\n")[2][:-2] if chunked else parts[i - 1]
            for piece in frame(data) if data else ():
                server.send_data(1, piece)
        if out := server.data_to_send():
            chunks.append(chunk(at(group[0]), CH_OUT, out))
    server.send_data(1, b"", end_stream=True)
    chunks.append(chunk(at(len(parts)), CH_OUT, server.data_to_send()))
    return chunks


def chunk(ts: int, direction: int, data: bytes, size: int | None = None) -> Chunk:
    return Chunk(7, 9, ts, direction, len(data) if size is None else size, CF_TUPLE,
                 Endpoint("127.0.0.1", 8000), Endpoint("127.0.0.1", 50000), data)


def stitched(chunks, limits: Limits | None = LIMITS, max_payloads: int = 16):
    s = StreamStitcher(RouteMapper([], True, 100), lambda pid: "engine", limits, max_payloads)
    out = [r for ch in chunks for r in s.on_chunk(ch)]
    return out + s.close_all(chunks[-1].ts_ns + 1), s


def read_one(chunks, **kw):
    (r,), _ = stitched(chunks, **kw)
    return r, genai.read(r)


@pytest.mark.parametrize("name", sorted(AS_WRITTEN))
def test_each_api_over_http2_reads_as_over_http1(name):
    r, g = read_one(served(name))
    assert (r.protocol, r.method, r.complete) == ("http/2", "POST", True)
    assert g == GenAI(source="wire", **AS_WRITTEN[name])


def halves(data: bytes) -> list[bytes]:
    return [data[:len(data) // 2], data[len(data) // 2:]] if len(data) > 1 else [data]


@pytest.mark.parametrize("name", [n for n in sorted(AS_WRITTEN) if INDEX[n]["stream"]])
def test_an_event_in_two_frames_is_one_event_at_its_first(name):
    """h2 servers write an event as it comes, but a frame may hold part of one."""
    g = genai.read(read_one(served(name, halves))[0])
    want = AS_WRITTEN[name]
    assert (g.events, g.content_events, g.first_token_ns, g.last_token_ns, g.output_tokens) == (
        want["events"], want["content_events"], want["first_token_ns"], want["last_token_ns"],
        want["output_tokens"])


@pytest.mark.parametrize("name", [n for n in sorted(AS_WRITTEN) if INDEX[n]["stream"]])
@pytest.mark.parametrize("layout", ["two a write", "three a write", "the body at once"])
def test_frames_that_share_a_write_past_their_peek_read_as_the_stream(name, layout):
    """A server that falls behind writes several DATA frames in one call, an
    event a frame (granian, hyper's h2, in CI). Past the default 384-byte peek
    a frame's events are counted as the kernel counts a write's, and the
    frames of one call are writes 1 ns apart: told apart by their times. At
    one time, the output a whole frame showed was taken for the long frame's
    after it, and a content event was lost (llama.cpp's completion stream, 2
    of 3)."""
    groups = SHARED[layout](len(written(name)))[1:]  # the head is a write of its own
    r, g = read_one(served(name, writes=groups), limits=LIMITS._replace(peek=384))
    truth = AS_WRITTEN[name]
    assert {f: getattr(g, f) for f in EXACT} == {f: truth.get(f, getattr(GenAI("wire"), f)) for f in EXACT}
    at_frame = {at(i): at(grp[0]) + k for grp in groups for k, i in enumerate(grp)}  # part's time -> its frame's
    assert (g.first_token_ns, g.last_token_ns) == (at_frame[truth["first_token_ns"]],
                                                   at_frame[truth["last_token_ns"]])


def test_a_frame_longer_than_its_peek_counts_its_event_lines_as_the_kernel_counts_a_write():
    """Coalesced events past the peek: the lines the kernel would count in such
    a write, over what was copied of it (stitch.write_scan, its rule)."""
    name = "vllm_chat_stream"
    events = b"".join(p.partition(b"\r\n")[2][:-2] for p in written(name)[1:-1])
    kept = Kept(Limits(body=512, tail=512, peek=40, writes=4096))
    kept.response(events[:100])
    kept.response(events[100:])
    kept.frame_end(at(1))
    (w,) = kept.payload(None).writes
    assert (w.ts_ns, w.size, w.peek) == (at(1), len(events), events[:40])
    assert w[3:] == counted(events)
    assert w.data_lines == AS_WRITTEN[name]["events"] + 1  # and [DONE]
    kept = Kept(Limits(body=512, tail=512, peek=40, writes=4096))
    kept.response(events[:100])
    kept.response_gap(len(events) - 100)  # the rest not copied: counted no further
    kept.frame_end(at(1))
    (w,) = kept.payload(None).writes
    assert (w.size, w.scanned) == (len(events), 100)
    assert w[3:] == counted(events[:100])


def test_bytes_not_copied_leave_the_count_a_floor():
    """The kernel copied only the first 20 bytes of each write of the body:
    nothing is claimed that the bytes seen do not show."""
    name = "vllm_chat_stream"
    chunks = [ch if ch.dir != CH_OUT or i < 2 else chunk(ch.ts_ns, CH_OUT, ch.data[:29], len(ch.data))
              for i, ch in enumerate(served(name))]
    r, g = read_one(chunks)
    assert g.request_model == AS_WRITTEN[name]["request_model"]
    assert g.events_approximate and g.answer_empty is None
    assert g.events <= AS_WRITTEN[name]["events"]


def test_a_stream_cut_off_reads_no_end():
    chunks = served("vllm_chat_stream")[:4]  # the role's event and the first token's, then nothing
    (r,), _ = stitched(chunks)
    g = genai.read(r)
    assert (r.complete, g.stream_ended, g.events, g.content_events, g.answer_empty) == (
        False, False, 2, 1, False)


def test_only_posts_to_genai_endpoints_keep_pieces_and_at_most_max_payloads():
    two = served("vllm_chat")
    second = [c._replace(fd=10) for c in served("vllm_chat")]
    out, s = stitched([*two[:-1], *second], max_payloads=1)
    kept = [r.payload is not None for r in sorted(out, key=lambda r: r.fd)]
    assert kept == [True, False]
    assert s.counts()[("engine", "payloads_not_kept")] == 1
    out, s = stitched(two)  # the place is given back once the stream is done
    assert s._kept == 0
    out, _ = stitched(two, limits=None)  # capture.genai off
    assert out[0].payload is None


def test_a_get_keeps_nothing():
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, [(":method", "GET"), (":path", "/v1/chat/completions"), (":scheme", "http"),
                            (":authority", "engine")], end_stream=True)
    out, _ = stitched([chunk(T0, CH_IN, client.data_to_send()), chunk(T0 + 1, CH_CLOSE, b"")])
    assert out[0].payload is None


def test_a_request_whose_model_is_past_the_first_bytes_is_read_from_its_tail():
    body = json.loads(request_body("vllm_chat"))
    padded = json.dumps({**body, "messages": [*body["messages"], {"role": "user", "content": "x" * 3000}]})
    padded = padded.encode()
    assert padded.index(b'"model"') > 3000
    r, g = read_one(served("vllm_chat", request=padded))
    assert len(r.payload.request_body) == LIMITS.body and r.payload.request_size == len(padded)
    assert g.request_model == AS_WRITTEN["vllm_chat"]["request_model"]


def as_called(chunks):
    """A server's chunks as its traced client saw them: what the server read, written."""
    flip = {CH_IN: CH_OUT, CH_OUT: CH_IN}
    return [c._replace(dir=flip.get(c.dir, c.dir), flags=c.flags | CF_CLIENT) for c in chunks]


@pytest.mark.parametrize("name", sorted(AS_WRITTEN))
def test_a_traced_clients_call_reads_as_the_servers_answer(name):
    """A gateway's or an application's call to an inference API: its reads of
    the answer are the writes, at the times the client read them."""
    r, g = read_one(as_called(served(name)))
    assert (r.direction, r.protocol, r.method) == ("client", "http/2", "POST")
    assert g == GenAI(source="wire", **AS_WRITTEN[name])
