"""One trace per inference request, across the calls it makes and the
processes it crosses, from what the kernel linked (``Request.link``).

- A client request belongs to the server request its thread was serving
  when it began, if it began before that one's response ended (sync and
  threaded servers; from a thread that read none, a worker pool's, its
  process's latest request; on an event loop, the request that last began
  reading on that thread: right when requests do not overlap, a guess when
  they do).
- A server request whose connection's other end is a client connection of
  a process we trace belongs to the client request made on it meanwhile,
  even when the caller forwarded no ``traceparent`` (the gateway case).
- A call that carries a ``traceparent`` belongs to the server request of
  its process that carried the same one, if one began before it and ended
  after: a gateway that forwards the header unchanged (nginx, HAProxy,
  Node's proxies do) names the request each call is for, exact where the
  thread's guess is not. A call whose ``traceparent`` no request of its
  process carried (an instrumented caller's own span) is that span's child.
- A server request that carries one is still the child of the traced call
  it answers (the call's span is the header's span's, or its child).

Children usually finish first: a finished request waits here for the one it
belongs to, ``wait_ns`` at most, then goes out on a trace of its own
(counted as ``timed_out``). A parent that finished first is remembered, only
when the kernel counted calls linked to it (``Request.calls``), so a child
that comes later joins the trace it went out on. Nothing else waits: a
request nothing links to is a trace of its own at once.
"""
from __future__ import annotations

import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ..request import Request


def new_id(bits: int) -> int:
    """A random trace or span id, never 0, drawn as the SDK's id generator
    draws them (random.getrandbits: unique, not secret; os.urandom through
    SystemRandom cost ten times as much, a syscall per id)."""
    return random.getrandbits(bits) or 1


@dataclass(slots=True)
class Span:
    """A request with its place in a trace; ``parent_id`` None: the root,
    whose parent (if any) is the caller's ``traceparent``."""

    req: Request
    trace_id: int
    span_id: int
    parent_id: int | None = None
    via: str | None = None  # how the parent was found: "thread", "process", "connection" or "traceparent"


@dataclass(slots=True)
class Trace:
    """What goes out together: a root and what was found to belong to it, or,
    with ``late``, more of a trace that already went out. The sampler sees
    its root's duration and errors."""

    spans: list[Span]
    late: bool = False
    exported: bool = False
    flags: int = 1  # W3C trace-flags the spans carry: the root's caller's, else sampled

    @property
    def root(self) -> Request:
        return self.spans[0].req

    @property
    def duration_ns(self) -> int:
        return self.root.duration_ns

    @property
    def is_error(self) -> bool:
        return self.root.is_error


@dataclass(slots=True)
class _Node:
    req: Request
    since_ns: int
    children: list[tuple[_Node, str]] = field(default_factory=list)
    after_ns: int = 0  # a call's: the earliest its answer may have begun (Joiner._after)


@dataclass(slots=True)
class _Placed:
    """A request that went out, for the ones that come later and belong to it."""

    trace: Trace
    span_id: int
    start_ns: int
    end_ns: int
    stream: int = 0  # an HTTP/2 call's stream id
    after_ns: int = 0  # a call's: the earliest its answer may have begun (Joiner._after)


def _header(r: Request) -> tuple[int, int, int] | None:
    """What ties a call to the request it was made for when the header was
    forwarded: its process and the ``traceparent``'s ids."""
    tp = r.traceparent
    return None if tp is None else (r.pid, tp.trace_id, tp.span_id)


def _via(call: Request) -> str:
    return "process" if call.link.by_process else "thread"


def _stream(call: Request) -> int:
    return call.h2.stream_id if call.h2 is not None else 0


# On the socket tier a call's start is taken when its send has returned (the
# hook runs once the bytes moved), and on loopback the server may have read
# the request before then: microseconds, or as long as the caller waited
# for a CPU meanwhile (a woken server's preemption, a stalled vCPU). So a
# call's answer is the server request that began after the call before it on
# that connection ended; where that one is not known (the connection's first
# call, or calls that overlap: HTTP/2 streams, pipelining) SEND_LAG_NS before
# the call's start at most. The calls of one connection are tried oldest
# first, so an earlier call's answer goes to that call.
SEND_LAG_NS = 5_000_000


def _answers(served: Request, after_ns: int, end_ns: int, stream: int) -> bool:
    """Whether a server request on a traced caller's connection answers the call
    made on it until end_ns: it began meanwhile (from after_ns), on the same
    HTTP/2 stream where it has one."""
    return (after_ns <= served.start_ns <= end_ns
            and (not served.link.stream or served.link.stream == stream))


class Joiner:
    def __init__(self, wait_ns: int, max_remembered: int = 65536):
        self.wait_ns = wait_ns
        self._max = max_remembered
        self._for_request: dict[tuple[int, int, int], list[_Node]] = {}  # waiting for a server request
        self._for_call: dict[tuple[int, int], list[_Node]] = {}  # waiting for a call on a connection
        self._for_header: dict[tuple[int, int, int], list[_Node]] = {}  # calls waiting for their traceparent's request
        self._open_servers: dict[tuple[int, int, int], _Node] = {}  # waiting, with calls linked or a header
        self._open_headers: dict[tuple[int, int, int], _Node] = {}  # ... those with a header, by _header
        self._open_calls: dict[tuple[int, int], list[_Node]] = {}
        self._servers: OrderedDict[tuple[int, int, int], _Placed] = OrderedDict()
        self._calls: dict[tuple[int, int], deque[_Placed]] = {}
        self._headers: OrderedDict[tuple[int, int, int], deque[_Placed]] = OrderedDict()  # servers', by _header
        self._ended: dict[tuple[int, int], int] = {}  # a caller's connection: its latest call's end
        self.joined = {"thread": 0, "process": 0, "connection": 0, "traceparent": 0}  # given a parent, by how
        self.timed_out = 0  # went out alone: what they belong to never came

    def waiting(self) -> int:
        return sum(len(nodes) for w in (self._for_request, self._for_call, self._for_header) for nodes in w.values())

    def add(self, req: Request, now_ns: int) -> list[Trace]:
        """``req`` finished: the traces ready to go out because of it."""
        after = self._after(req) if req.direction == "client" else 0
        if req.link is None and not req.calls and req.traceparent is None:
            return [self._release(_Node(req, now_ns))]
        node = _Node(req, now_ns, after_ns=after)
        out = self._adopt(node)
        link, header = req.link, _header(req)
        if req.direction == "client" and header is not None:
            parent = self._open_headers.get(header)
            placed = None if parent is not None else next(
                (p for p in self._headers.get(header, ()) if p.start_ns <= req.start_ns <= p.end_ns), None)
            if placed is not None:
                return out + self._late(node, placed, "traceparent")
            if parent is not None and parent.req.start_ns <= req.start_ns <= parent.req.end_ns:
                parent.children.append((node, "traceparent"))
            else:
                self._for_header.setdefault(header, []).append(node)
        elif link is None:
            return out + [self._release(node)]
        elif req.direction == "client":
            key = (link.pid, link.fd, link.start_ns)
            parent = self._open_servers.get(key)
            placed = self._servers.get(key) if parent is None else None
            span = parent.req if parent is not None else placed
            if span is not None and not span.start_ns <= req.start_ns <= span.end_ns:
                return out + [self._release(node)]  # begun after it ended
            if placed is not None:
                return out + self._late(node, placed, _via(req))
            if parent is None:
                self._for_request.setdefault(key, []).append(node)
            else:  # it waits for what it belongs to: so do its own
                parent.children.append((node, _via(req)))
        else:
            conn = (link.pid, link.fd)
            parent = next((n for n in self._open_calls.get(conn, ()) if _answers(req, n.after_ns,
                           n.req.end_ns, _stream(n.req))), None)
            placed = None if parent is not None else next(
                (p for p in self._calls.get(conn, ()) if _answers(req, p.after_ns, p.end_ns, p.stream)), None)
            if placed is not None:
                return out + self._late(node, placed, "connection")
            if parent is None:
                self._for_call.setdefault(conn, []).append(node)
            else:
                parent.children.append((node, "connection"))
        self._open(node)
        return out

    def _after(self, call: Request) -> int:
        """The earliest an answer to ``call`` may have begun: where the call
        before it on its connection ended, if that was before this one began
        (the calls come in the order they end: the kernel reports a call when
        its connection's next one begins, or at its close)."""
        conn = (call.pid, call.fd)
        before = self._ended.pop(conn, None)  # re-inserted: the dict stays in order of use
        self._ended[conn] = call.end_ns
        if len(self._ended) > self._max:
            del self._ended[next(iter(self._ended))]
        if before is not None and before <= call.start_ns and _stream(call) == 0:
            return before
        return call.start_ns - SEND_LAG_NS

    def _open(self, node: _Node) -> None:
        """``node`` waits, and later requests may belong to it: they wait with
        it. A server request, if the kernel linked calls to it or it carried a
        ``traceparent``; any call (a callee may read a call before the
        caller's hook shows it sending, and the kernel then counts it for no
        call, or for the next)."""
        r = node.req
        if r.direction == "client":
            self._open_calls.setdefault((r.pid, r.fd), []).append(node)
        elif r.calls or r.traceparent is not None:
            self._open_servers[(r.pid, r.fd, r.start_ns)] = node
            if (header := _header(r)) is not None:
                self._open_headers[header] = node

    def _close(self, r: Request) -> None:
        """``r`` is placed: no longer open."""
        if r.direction == "server":
            self._open_servers.pop((r.pid, r.fd, r.start_ns), None)
            header = _header(r)
            if header is not None and (n := self._open_headers.get(header)) is not None and n.req is r:
                del self._open_headers[header]
            return
        nodes = self._open_calls.get((r.pid, r.fd))
        if nodes:
            nodes[:] = [n for n in nodes if n.req is not r]
            if not nodes:
                del self._open_calls[(r.pid, r.fd)]

    def expire(self, now_ns: int, everything: bool = False) -> list[Trace]:
        """Requests that waited ``wait_ns`` (all, with ``everything``) go out
        alone; a call that waited for its ``traceparent``'s request goes out
        as the child of that header's span, not counted as alone."""
        out = []
        for waiting in (self._for_request, self._for_call, self._for_header):
            for key in list(waiting):
                nodes = waiting[key]
                gone = [n for n in nodes if everything or now_ns - n.since_ns >= self.wait_ns]
                if not gone:
                    continue
                self.timed_out += len(gone) if waiting is not self._for_header else 0
                out += [self._release(n) for n in gone]
                if len(gone) == len(nodes):
                    del waiting[key]
                else:
                    waiting[key] = [n for n in nodes if n not in gone]
        # a call comes within wait_ns of its request's end: every request that
        # was sent a traceparent is remembered for that long, not 65,536 of them
        while self._headers and next(iter(self._headers.values()))[-1].end_ns < now_ns - self.wait_ns:
            self._headers.popitem(last=False)
        return out

    def _adopt(self, node: _Node) -> list[Trace]:
        """The requests waiting for ``node`` become its children; those that
        turn out not to be (a call begun after its response ended) go out alone."""
        r, out = node.req, []
        if r.direction == "client":
            conn = (r.pid, r.fd)
            waiting = self._for_call.get(conn, [])
            candidates = [n for n in waiting if _answers(n.req, node.after_ns, r.end_ns, _stream(r))]
            if candidates:
                rest = [n for n in waiting if n not in candidates]
                if rest:
                    self._for_call[conn] = rest
                else:
                    del self._for_call[conn]
            node.children += [(child, "connection") for child in candidates]
            return out
        for child in self._for_request.pop((r.pid, r.fd, r.start_ns), ()):
            if r.start_ns <= child.req.start_ns <= r.end_ns:
                node.children.append((child, _via(child.req)))
            else:
                out.append(self._release(child))
        header = _header(r)
        if header is not None and header in self._for_header:
            for child in self._for_header.pop(header):  # those begun outside it: another's with that header
                if r.start_ns <= child.req.start_ns <= r.end_ns:
                    node.children.append((child, "traceparent"))
                else:
                    self._for_header.setdefault(header, []).append(child)
        return out

    def _release(self, node: _Node) -> Trace:
        tp = node.req.traceparent
        trace = Trace([], flags=tp.flags if tp is not None else 1)
        self._place(trace, node, tp.trace_id if tp is not None else new_id(128), None, None)
        return trace

    def _late(self, node: _Node, parent: _Placed, via: str) -> list[Trace]:
        """``node`` belongs to a trace that went out (or waits in the sampler)."""
        self.joined[via] += 1
        trace = parent.trace
        if not trace.exported:  # held by the sampler, or dropped by it: goes with it
            self._place(trace, node, trace.spans[0].trace_id, parent.span_id, via)
            return []
        late = Trace([], late=True, exported=True, flags=trace.flags)
        self._place(late, node, trace.spans[0].trace_id, parent.span_id, via)
        return [late]

    def _place(self, trace: Trace, node: _Node, trace_id: int, parent_id: int | None, via: str | None) -> None:
        r = node.req
        span = Span(r, trace_id, new_id(64), parent_id, via)
        trace.spans.append(span)
        if r.calls or r.direction == "client" or r.traceparent is not None:  # later ones may belong to it
            self._close(r)
            self._remember(r, _Placed(trace, span.span_id, r.start_ns, r.end_ns, _stream(r), node.after_ns))
        for child, how in node.children:
            self.joined[how] += 1
            self._place(trace, child, trace_id, span.span_id, how)

    def _remember(self, r: Request, placed: _Placed) -> None:
        if r.direction == "server":
            if r.calls:
                self._servers[(r.pid, r.fd, r.start_ns)] = placed
                if len(self._servers) > self._max:
                    self._servers.popitem(last=False)
            if (header := _header(r)) is not None:  # a client may send one header on several (retries)
                self._headers.setdefault(header, deque(maxlen=8)).append(placed)
                self._headers.move_to_end(header)
                if len(self._headers) > self._max:
                    self._headers.popitem(last=False)
            return
        calls = self._calls.setdefault((r.pid, r.fd), deque(maxlen=64))  # an HTTP/2 connection's, many
        calls.append(placed)
        if len(self._calls) > self._max:
            self._calls.pop(next(iter(self._calls)))

    def forget(self, pid: int) -> None:
        """A process exited: what it left waiting goes at the next expire; what it placed, now."""
        for key in [k for k in self._servers if k[0] == pid]:
            del self._servers[key]
        for key in [k for k in self._calls if k[0] == pid]:
            del self._calls[key]
        for key in [k for k in self._headers if k[0] == pid]:
            del self._headers[key]
        for key in [k for k in self._ended if k[0] == pid]:
            del self._ended[key]
        # what it left waiting (and open) goes out at the next expire, wherever it waits
