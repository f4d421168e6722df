"""Plain, immutable records of what the kernel saw. Kernel clock (CLOCK_MONOTONIC ns)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# Exchange.reason and Exchange.flags values, read here by stitch and the tests
from .abi import (CF_BINNED, CF_CHUNK_END, CF_INTERIM, CF_MISSED, CF_SEEDED, CF_TCP,  # noqa: F401
                  CF_TUPLE, END_CLOSE, END_EXIT, END_FLUSH, END_NEXT, END_RESPONSE)
from .request import Endpoint, Payload, Write


class Exchange(NamedTuple):
    """A run of reads followed by a run of writes on one connection; with
    pipelined HTTP requests, one response of such a run each (``pipeline``
    counts the responses before it since the reads).

    Per-event records are NamedTuples: immutable like a frozen dataclass,
    and about ten times cheaper to build at this many fields."""

    tgid: int
    fd: int
    comm: str
    reason: int
    start_ns: int
    last_in_ns: int
    first_out_ns: int  # 0: nothing was written
    last_out_ns: int
    bytes_in: int
    bytes_out: int
    flags: int
    local: Endpoint | None
    peer: Endpoint | None
    status: int  # HTTP/1.x status of the response, 0: none began with a status line
    pipeline: int  # responses reported before this one since the run of reads began
    req: bytes  # first bytes of the request
    resp: bytes  # first bytes of the response
    traceparent: bytes = b""  # what followed "traceparent:" in a head longer than req
    tracestate: bytes = b""
    payload: Payload | None = None  # a POST's payload pieces (CF_BODY), its writes joined by stitch
    send_ns: int = 0  # time inside the response's send calls
    runq_ns: int = 0  # the serving thread's run-queue wait during the exchange
    read_wait_ns: int = 0  # ... and its time in reads of anything but its tracked connections
    cache_wait_ns: int = 0  # ... of which, reads of a Redis reply
    link_key: int = 0  # struct conn.link_key: what the exchange belongs to (stitch.join)
    link_start: int = 0
    calls: int = 0  # exchanges the kernel linked to this one
    shape: int = 0  # the kernel's hash of its method and path (probes.bins), 0: none
    peer_ended: int = 0  # 1: the peer ended its side while it was under way (struct conn.peer_ended)

    @property
    def key(self) -> tuple[int, int, int, int]:
        """Identifies one exchange across the ring and a userspace flush."""
        return (self.tgid, self.fd, self.start_ns, self.pipeline)


class Chunk(NamedTuple):
    """One read or write (or the close) of an HTTP/2 connection (struct chunk)."""

    tgid: int
    fd: int
    ts_ns: int
    dir: int  # CH_IN, CH_OUT, CH_CLOSE
    size: int  # bytes the call moved; data holds the first of them
    flags: int  # the connection's (CF_CLIENT)
    local: Endpoint | None
    peer: Endpoint | None
    data: bytes
    link_key: int = 0  # struct chunk_head.link_key/link_start: what the streams it begins belong to
    link_start: int = 0
    peer_ended: int = 0  # 1: the peer ended its side before the process closed (struct conn.peer_ended)


class Beat(NamedTuple):
    """One response write of a POST exchange, reported before the exchange."""

    key: tuple[int, int, int, int]  # the exchange's Exchange.key
    write: Write
    peek_at: int = 0  # >0: more of the peek of the write before it, from this byte (bpf/net.c send_more)


@dataclass(frozen=True, slots=True)
class ProcessNotice:
    """A process exec'd (kind "exec"), began listening on a selected port
    ("listen": the kernel tracks it already) or a tracked one exited ("exit")."""

    kind: str
    tgid: int
    comm: str


class MarkerEvent(NamedTuple):
    """One call of the engine's marker API, seen by the agent.

    kind: "request_begin" (fd, name=model), "request_end", "range" (at its
    end: name=stage, begin_ns its begin; batch_id set for a batch-level range),
    "batch" (batch_id, request_ids = every request the batch serves),
    "cache_get" (name=cache, key, hit), "usage" (input_tokens,
    output_tokens, kv_bytes).
    """

    kind: str
    ts_ns: int
    tgid: int
    tid: int
    request_id: int = 0
    batch_id: int = 0
    fd: int = -1
    name: str = ""
    key: str = ""
    hit: bool | None = None
    request_ids: tuple[int, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    kv_bytes: int = 0
    begin_ns: int = 0
