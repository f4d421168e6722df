"""RESP (Redis): an exchange is the commands a client sent and the replies
that came back; and the probe-free Redis hits and misses read off them.

A RESP exchange is framed as one Request named for its first command; it
ends when the client sends more or closes, or earlier when every command's
reply was captured whole (`complete`).

``resp_get_results(request, reply)`` pairs the commands a client sent with
the replies Redis sent back, in order, and reports each GET (and GETEX) key
and each MGET key with whether it was found: a bulk string is a hit, a null
(RESP2 ``$-1``/``*-1``, RESP3 ``_``) a miss. It goes as far as the captured
bytes allow (a bulk reply whose ``$N`` header arrived is a hit even if its
body was cut off; a key cut off keeps its head) and stops, without raising,
at the first thing it cannot follow.

Handled: RESP2 and RESP3 replies (push frames and attributes skipped),
inline commands, pipelines, MULTI/EXEC (queued commands paired with the
EXEC array), CLIENT REPLY OFF/ON/SKIP. Not followed: subscribe and MONITOR
streams (pairing stops there).

Differences from Redis's own keyspace_hits/misses (what the uprobe counts):
a GET on a key of another type answers an error (skipped here, a hit for
Redis), and MGET answers null for such a key (a miss here, a hit for Redis).
"""
from __future__ import annotations

import re

from ...events import Exchange
from ...request import Request
from .common import end_ns, ended_early, transport

NAME = "resp"

SINGLE = frozenset({b"GET", b"GETEX"})
MULTI_KEY = frozenset({b"MGET"})
_STOP = frozenset({b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"MONITOR", b"SYNC", b"PSYNC"})
MAX_DEPTH = 32
MAX_LEN = 512 * 1024 * 1024  # Redis's proto-max-bulk-len default
_INT = re.compile(rb"[-+]?\d{1,19}")

_NULL = ("null", None)


class _Garbage(Exception):
    pass


class _Cut(Exception):
    """The bytes ended inside a value; ``partial`` is what was read of it."""

    def __init__(self, partial=None):
        self.partial = partial


def _line(buf: bytes, pos: int) -> tuple[bytes, int]:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Cut()
    return buf[pos:end], end + 2


def _int(raw: bytes, lo: int = -1, hi: int = MAX_LEN) -> int:
    if not _INT.fullmatch(raw):
        raise _Garbage()
    n = int(raw)
    if not lo <= n <= hi:
        raise _Garbage()
    return n


def _value(buf: bytes, pos: int, depth: int = 0):
    """One RESP2/RESP3 value at pos: ((kind, payload), next pos)."""
    if depth > MAX_DEPTH:
        raise _Garbage()
    if pos >= len(buf):
        raise _Cut()
    t = buf[pos : pos + 1]
    line, nxt = _line(buf, pos + 1)
    if t in (b"+", b",", b"#", b"("):
        return ("simple", line), nxt
    if t == b"-":
        return ("err", line), nxt
    if t == b":":
        return ("int", _int(line, -(1 << 63), (1 << 63) - 1)), nxt
    if t == b"_":
        if line:
            raise _Garbage()
        return _NULL, nxt
    if t in (b"$", b"!", b"="):
        n = _int(line)
        if n < 0:
            if t != b"$":
                raise _Garbage()
            return _NULL, nxt
        if nxt + n + 2 > len(buf):
            raise _Cut(("err" if t == b"!" else "bulk", None))  # the length arrived: it exists
        if buf[nxt + n : nxt + n + 2] != b"\r\n":
            raise _Garbage()
        return ("err" if t == b"!" else "bulk", buf[nxt : nxt + n]), nxt + n + 2
    if t in (b"*", b"~", b">", b"%", b"|"):
        n = _int(line, -1, 1 << 32)
        if n < 0:
            if t != b"*":
                raise _Garbage()
            return _NULL, nxt
        count = 2 * n if t in (b"%", b"|") else n
        items: list = []
        for _ in range(count):  # each item takes >= 3 bytes: a bogus count ends in _Cut
            try:
                item, nxt = _value(buf, nxt, depth + 1)
            except _Cut as cut:
                if cut.partial is not None:
                    items.append(cut.partial)
                raise _Cut(("array", items)) from None
            items.append(item)
        if t == b"|":  # an attribute: the value it describes follows
            return _value(buf, nxt, depth + 1)
        kind = {b"*": "array", b"~": "array", b">": "push", b"%": "map"}[t]
        return (kind, items), nxt
    raise _Garbage()


def _replies(buf: bytes):
    """Top-level replies in order, push frames left out; a cut one last."""
    pos = 0
    while pos < len(buf):
        try:
            v, pos = _value(buf, pos)
        except _Cut as cut:
            if cut.partial is not None:
                yield cut.partial
            return
        except _Garbage:
            return
        if v[0] != "push":
            yield v


def _commands(buf: bytes):
    """Commands as argument lists; a cut last command comes with what arrived of it."""
    pos = 0
    while pos < len(buf):
        if buf[pos : pos + 1] == b"*":
            try:
                line, pos2 = _line(buf, pos + 1)
                n = _int(line, 0, 1 << 20)
            except (_Cut, _Garbage):
                return
            args: list[bytes] = []
            pos = pos2
            for _ in range(n):
                if buf[pos : pos + 1] != b"$":
                    if pos < len(buf):
                        return  # not a bulk string: garbage
                    yield args, False
                    return
                try:
                    line, pos = _line(buf, pos + 1)
                    size = _int(line, 0)
                except _Cut:
                    yield args, False
                    return
                except _Garbage:
                    return
                if pos + size + 2 > len(buf):
                    args.append(buf[pos : pos + size])  # the head of a cut argument
                    yield args, False
                    return
                if buf[pos + size : pos + size + 2] != b"\r\n":
                    return
                args.append(buf[pos : pos + size])
                pos += size + 2
            if args:
                yield args, True
        else:  # inline command: words up to a newline
            end = buf.find(b"\n", pos)
            if end < 0:
                return  # an inline command is only run once its line is complete
            words = buf[pos:end].rstrip(b"\r").split()
            pos = end + 1
            if words:
                yield words, True


def _record(out: list, args: list[bytes], reply) -> None:
    name = args[0].upper()
    kind = reply[0]
    if name in SINGLE and len(args) >= 2:
        if kind == "bulk":
            out.append((args[1], True))
        elif kind == "null":
            out.append((args[1], False))
    elif name in MULTI_KEY and kind == "array":
        for key, item in zip(args[1:], reply[1]):  # a cut request: the keys that arrived
            if item[0] == "bulk":
                out.append((key, True))
            elif item[0] == "null":
                out.append((key, False))


def _pair(request: bytes, reply: bytes, out: list) -> None:
    replies = _replies(reply)
    in_multi, queued = False, []
    off = skip = False
    for args, complete in _commands(request):
        name = args[0].upper() if args else b""
        if not complete and len(args) < 2:
            return  # too little of it arrived to say anything
        if name in _STOP:
            return
        if name == b"CLIENT" and len(args) >= 3 and args[1].upper() == b"REPLY":
            mode = args[2].upper()
            if mode in (b"OFF", b"SKIP"):
                off, skip = off or mode == b"OFF", mode == b"SKIP"
                continue
            off = False  # ON: answered +OK
        elif off:
            continue
        elif skip:
            skip = False
            continue
        r = next(replies, None)
        if r is None:
            return
        if in_multi:
            if name == b"EXEC":
                in_multi = False
                if r[0] == "array":
                    for qargs, item in zip(queued, r[1]):
                        _record(out, qargs, item)
                queued = []
            elif name == b"DISCARD":
                in_multi, queued = False, []
            elif r == ("simple", b"QUEUED"):
                queued.append(args)
            continue
        if name == b"MULTI" and r == ("simple", b"OK"):
            in_multi = True
            continue
        _record(out, args, r)


def resp_get_results(request_bytes: bytes, reply_bytes: bytes) -> list[tuple[bytes, bool]]:
    """(key, hit) for each GET/GETEX/MGET key the bytes show an answer for. Never raises."""
    out: list[tuple[bytes, bool]] = []
    try:
        _pair(bytes(request_bytes or b""), bytes(reply_bytes or b""), out)
    except Exception:  # hostile bytes: keep what was read before them
        pass
    return out


def claims(ex: Exchange) -> bool:
    """A RESP array of bulk strings: what every Redis client sends."""
    return ex.req[:1] == b"*" and ex.req[1:2].isdigit()


def complete(ex: Exchange) -> bool:
    """Every command has its whole reply: both sides were captured whole
    (capture.request_bytes / response_bytes) and the reply bytes parse as at
    least as many complete replies as there are commands. A big reply is not
    captured whole: that exchange waits for the client's next command."""
    if not ex.first_out_ns or len(ex.req) != ex.bytes_in or len(ex.resp) != ex.bytes_out:
        return False
    try:
        commands = sum(1 for _, whole in _commands(ex.req) if whole)
        replies, pos = 0, 0
        while pos < len(ex.resp):
            v, pos = _value(ex.resp, pos)
            replies += v[0] != "push"
    except Exception:  # cut, or bytes that are not RESP
        return False
    return 0 < commands <= replies


def command_name(request_bytes: bytes) -> str | None:
    """The first command's name, upper-cased, if it arrived."""
    try:
        for args, _ in _commands(bytes(request_bytes)):
            name = args[0][:32] if args else b""
            return name.decode("ascii").upper() if name.isascii() and name.isalpha() else None
    except Exception:  # hostile bytes
        pass
    return None


def requests(ex: Exchange, routes) -> list[Request]:
    return [Request(ex.tgid, ex.comm, ex.fd, ex.start_ns, end_ns(ex), ex.first_out_ns or None,
                    ex.bytes_in, ex.bytes_out, ex.local, ex.peer, NAME,
                    method=command_name(ex.req), complete=not ended_early(ex),
                    transport=transport(ex))]
