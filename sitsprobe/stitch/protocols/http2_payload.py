"""What an HTTP/2 stream keeps of its payloads for :mod:`sitsprobe.stitch.genai`:
the same pieces, under the same bounds (``capture.*``), as the kernel keeps of
an HTTP/1 exchange (:class:`~sitsprobe.request.Payload`), cut along HTTP/2's
lines instead of the syscalls':

- the request's first ``body`` DATA bytes, up to the first not copied, and its
  last ``tail`` bytes (those after the last gap);
- each response DATA frame as a write: the time of the read or write its frame
  header came in (1 ns after the frame before where one call held both: the
  writes of a stream are told apart by their times, as the kernel's are), its
  size (padding aside) and its first ``peek`` bytes; in a
  frame longer than that, the lines of its copied bytes are counted as the
  kernel counts a long write's (:mod:`..write_scan`); ``writes`` frames timed
  at most, every one counted;
- the response's last ``tail`` bytes, and its header fields: with HTTP/2 the
  head comes apart from the body, so the writes are body only.

Nothing is decoded here; :mod:`.http2` feeds the bytes, and makes a stream keep
them only where its owner asks (POSTs to GenAI endpoints).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ...request import Payload, Write
from ..write_scan import SCAN, counted
MAX_FIELDS = 64  # response header fields kept
MAX_FIELD = 256  # characters of a field's value kept


def _nothing() -> None:
    pass


class Limits(NamedTuple):
    body: int  # capture.body_bytes
    tail: int  # capture.tail_bytes
    peek: int  # capture.write_peek_bytes
    writes: int  # capture.max_writes


class Kept:
    """One stream's pieces, fed by the stream's parser as its DATA comes."""

    __slots__ = ("lim", "body", "body_cut", "req_tail", "writes", "total", "frame", "frame_cut",
                 "frame_size", "resp_tail", "headers", "release", "last_ns")

    def __init__(self, lim: Limits, release: Callable[[], None] = _nothing):
        """``release``: called once, when the payload is taken (a bound on
        the streams keeping pieces at once frees a place)."""
        self.lim, self.release = lim, release
        self.body, self.body_cut, self.req_tail = bytearray(), False, bytearray()
        self.writes: list[Write] = []
        self.total = 0  # response frames with data, every one
        self.frame, self.frame_cut, self.frame_size = bytearray(), False, 0  # the frame being read
        self.resp_tail = bytearray()
        self.headers: dict[str, str] | None = None
        self.last_ns = 0  # the time of the last write kept

    def request(self, v) -> None:
        if not self.body_cut and len(self.body) < self.lim.body:
            self.body += v[:self.lim.body - len(self.body)]
        _last(self.req_tail, v, self.lim.tail)

    def request_gap(self) -> None:
        self.body_cut = True
        self.req_tail.clear()

    def response(self, v) -> None:
        """Bytes of the response's current DATA frame."""
        self.frame_size += len(v)
        if not self.frame_cut and len(self.frame) < SCAN:
            self.frame += v[:SCAN - len(self.frame)]
        _last(self.resp_tail, v, self.lim.tail)

    def response_gap(self, n: int) -> None:
        self.frame_size += n
        self.frame_cut = True
        self.resp_tail.clear()

    def frame_end(self, ts_ns: int) -> None:
        """The response's current DATA frame ended; ``ts_ns``: its header came."""
        size, seen = self.frame_size, bytes(self.frame)
        self.frame, self.frame_cut, self.frame_size = bytearray(), False, 0
        if not size:  # an empty frame (END_STREAM alone) writes nothing
            return
        self.total += 1
        if len(self.writes) >= self.lim.writes:
            return
        peek, ts_ns = seen[:self.lim.peek], max(ts_ns, self.last_ns + 1)
        self.last_ns = ts_ns
        if len(peek) == size:
            self.writes.append(Write(ts_ns, size, peek))
        else:  # what the kernel counts of a write longer than its peek
            self.writes.append(Write(ts_ns, size, peek, *counted(seen)))

    def response_headers(self, fields) -> None:
        """The final response's header block, (name, value) as HPACK decoded them."""
        if self.headers is None:
            self.headers = {n.decode("latin-1"): v[:MAX_FIELD].decode("latin-1")
                            for n, v in fields[:MAX_FIELDS] if not n.startswith(b":")}

    def payload(self, request_size: int | None) -> Payload:
        """The pieces, as stitch.genai reads them; ``request_size``: the
        request's DATA bytes, where its end was seen."""
        self.release()
        self.release = _nothing
        return Payload(bytes(self.body), bytes(self.req_tail), bytes(self.resp_tail), tuple(self.writes),
                       self.total, request_size, self.headers if self.headers is not None else {})



def _last(buf: bytearray, v, n: int) -> None:
    """buf keeps the last n bytes of what is appended to it."""
    buf += v[-n:]
    if len(buf) > n:
        del buf[:len(buf) - n]
