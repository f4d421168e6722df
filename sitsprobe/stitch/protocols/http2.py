"""HTTP/2 (gRPC included): the streams of one connection, rebuilt from the
bytes of its reads and writes in the order the kernel saw them.

A `Connection` is fed every chunk (one syscall: ``size`` bytes moved, the
first ``len(data)`` of them copied; the rest is a *gap* at the chunk's end)
and parses frames per direction, incrementally, holding at most one partial
frame per direction and never a DATA payload. What it can and cannot know:

- A gap inside a DATA payload or inside padding is skipped: it costs only,
  where it hides a gRPC length prefix, that stream's message count (None).
  A gap anywhere else loses the framing of that direction: the rest of it is
  counted in `skipped_bytes`, never guessed from misaligned bytes. So a write
  of several frames copied only in part (a big response in 16 KiB DATA frames)
  ends what can be followed of that direction.
- Seen only after it started (``started=False``), a direction is picked up at
  the first chunk that starts at a plausible frame header. HPACK decoding then
  works until a block refers to an entry added before we looked. It fails
  then, and cannot decode wrongly before: our dynamic table holds the newest
  entries of the real one. After any failure a direction's header blocks are
  not decoded (its table is unknown); a stream whose headers were not decoded
  has no method, path or status.
- Flow control is followed for what the traced process sends: a stream whose
  DATA leaves its window (the lesser of the connection's and its own) at zero
  or below waits until the peer's WINDOW_UPDATE or SETTINGS opens it again.
  Unknown (None) once a direction's framing is lost or when seen late.
"""
from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

from hpack import Decoder, HPACKError

from ...request import CLIENT_CLOSED, Payload
from .http2_payload import Kept

NAME = "http/2"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Connection.partial and Stream.partial reasons; and CLIENT_CLOSED, a stream a server's client
# reset before its answer ended (RST_STREAM: a cancelled call)
BYTES_NOT_CAPTURED = "bytes_not_captured"
CONNECTION_START_MISSED = "connection_start_missed"
HPACK_ERROR = "hpack_error"
HEADERS_TOO_LARGE = "headers_too_large"
MALFORMED_FRAME = "malformed_frame"  # a header block cut by another frame, or bad padding
HEADERS_NOT_DECODED = "headers_not_decoded"
REQUEST_MISSED = "request_missed"  # the stream's first header block had no :method
TOO_MANY_STREAMS = "too_many_streams"

MAX_BLOCK = 64 * 1024  # a header block (or any non-DATA frame) past this is not read
MAX_TABLE = 64 * 1024  # the largest HPACK table we keep, whatever SETTINGS allow
MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE's initial value
MAX_HEADER_LIST = 256 * 1024  # decoded size of one header block (hpack's guard)
MAX_OPEN = 1024  # open streams; past this the oldest is given up
GRPC_MESSAGE_CHARS = 128
INITIAL_WINDOW = 65535

(DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE,
 CONTINUATION) = range(10)
FRAME_NAMES = ("DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING",
               "GOAWAY", "WINDOW_UPDATE", "CONTINUATION", "UNKNOWN")
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
_DEFINED_FLAGS = (0x09, 0x2D, 0, 0, 0x01, 0x0C, 0x01, 0, 0, 0x04)
_ON_STREAM_0 = (False, False, False, False, True, False, True, True, None, False)  # None: either
_FIXED_LEN = {PRIORITY: 5, RST_STREAM: 4, PING: 8, WINDOW_UPDATE: 4}
_BLOCK_TYPES = (HEADERS, PUSH_PROMISE, CONTINUATION)

_HEAD = struct.Struct(">HBBBL")  # length (24 bits as 16 + 8), type, flags, R + stream id
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")
_DIR = {"in": 0, "out": 1}
IN, OUT = 0, 1
REQ, RESP = 0, 1
_BUF, _DATA, _SKIP = 0, 1, 2  # how a frame's payload is read
_WANTED = frozenset((b":method", b":path", b":authority", b":scheme", b":status", b"content-type",
                     b"grpc-status", b"grpc-message", b"user-agent", b"traceparent",
                     b"tracestate"))
_GRPC_PATH = re.compile(r"/([A-Za-z_][\w.]*/[A-Za-z_]\w*)")


@dataclass(frozen=True, slots=True)
class Stream:
    """One request and its response. Requests are what the client sent and
    responses what the server sent, whichever side is traced. Bytes are DATA
    bytes without padding, gaps included; messages are gRPC messages (None:
    not gRPC, or a gap hid a length prefix). `content_type` is the response's,
    else the request's. `complete`: the response was seen to its END_STREAM.
    `flow_control_wait_ns` is None where the windows are not known."""
    stream_id: int
    start_ns: int
    end_ns: int
    first_response_ns: int | None
    method: str | None
    path: str | None
    authority: str | None
    scheme: str | None
    status: int | None
    content_type: str | None
    grpc_status: int | None
    grpc_message: str | None
    request_bytes: int
    response_bytes: int
    request_messages: int | None
    response_messages: int | None
    reset_code: int | None
    flow_control_wait_ns: int | None
    complete: bool
    partial: str | None
    user_agent: str | None
    traceparent: str | None
    tracestate: str | None
    payload: Payload | None = None  # the pieces kept for stitch.genai, where its owner asked


class _Live:
    """A stream being followed; lists are indexed by REQ/RESP."""
    __slots__ = ("authority", "blocked", "ctype", "end", "ended", "first", "gpre", "grpc_message",
                 "grpc_status", "gskip", "kept", "method", "msgs", "nbytes", "partial", "path",
                 "reset", "scheme", "sid", "start", "status", "tp", "tstate", "ua", "wait", "win")

    def __init__(self, sid: int, ts: int, win: int, wait: int | None):
        self.sid, self.start, self.end, self.first = sid, ts, ts, None
        self.method = self.path = self.authority = self.scheme = self.status = None
        self.grpc_status = self.grpc_message = self.reset = self.blocked = None
        self.partial = self.ua = self.tp = self.tstate = self.kept = None
        self.ctype, self.msgs = [None, None], [None, None]
        self.nbytes, self.gskip, self.gpre = [0, 0], [0, 0], [b"", b""]
        self.ended = [False, False]
        self.win, self.wait = win, wait


class _Half:
    """One direction: where its framing stands, and its HPACK decoder."""
    __slots__ = ("block", "block_bad", "block_end", "block_push", "block_sid", "block_ts", "buf",
                 "d", "data_left", "data_ts", "decoder", "flags", "head", "hpack_ok", "left",
                 "length", "lost", "max_frame", "mode", "pad", "pre", "role", "sid", "st", "synced",
                 "t")

    def __init__(self, d: int, role: int, started: bool):
        self.d, self.role = d, role
        self.synced = started and role == RESP  # the client's bytes start with the preface
        self.lost, self.pre, self.head, self.buf = False, 0, bytearray(), bytearray()
        self.left = self.length = self.mode = self.t = self.flags = self.sid = 0
        self.pad = self.data_left = self.data_ts = 0
        self.st = self.block = self.block_bad = None
        self.block_sid = self.block_end = self.block_ts = 0
        self.block_push = False
        self.decoder = Decoder(max_header_list_size=MAX_HEADER_LIST)
        # the largest frame its receiver accepts: SETTINGS_MAX_FRAME_SIZE, 16384 until it says
        # more (the receiver's SETTINGS go the other way); any, when they were missed
        self.max_frame = MAX_FRAME if started else 0xFFFFFF
        if not started:  # its SETTINGS were missed: a larger table than the real one is still right
            self.decoder.max_allowed_table_size = MAX_TABLE
        self.hpack_ok = True


def _plausible(b, pos: int) -> bool:
    """A frame header any peer would send: a known type with only its own
    flags, the reserved bit clear, on stream 0 exactly when the type says so,
    the length a fixed-size type must have, and no longer than every peer
    accepts (SETTINGS_MAX_FRAME_SIZE's initial value: longer frames exist, but
    a chunk starting with one is not taken as a frame boundary)."""
    hi, lo, t, flags, sid = _HEAD.unpack_from(b, pos)
    if t > CONTINUATION or sid >> 31 or flags & ~_DEFINED_FLAGS[t]:
        return False
    length, zero, fixed = hi << 8 | lo, _ON_STREAM_0[t], _FIXED_LEN.get(t)
    return ((zero is None or (sid == 0) == zero) and (fixed is None or length == fixed)
            and not (t == SETTINGS and length % 6) and length <= 16384)


def _aligned(b) -> bool:
    """Whether b starts at a frame boundary: the first frame headers it holds
    (up to four, each found past the previous one's payload) are plausible."""
    pos = 0
    for _ in range(4):
        if len(b) - pos < 9 or not _plausible(b, pos):
            return pos > 0 and len(b) - pos < 9
        pos += 9 + (b[pos] << 16 | b[pos + 1] << 8 | b[pos + 2])
    return True


def looks_like_h2(first: bytes, seeded: bool) -> bool:
    """Whether a connection's first captured bytes are HTTP/2: the client
    preface; or, for a connection seen only after it started (seeded), bytes
    that start at a plausible frame header."""
    head = bytes(first[:len(PREFACE)])
    if len(head) >= 3 and PREFACE.startswith(head):
        return True
    return seeded and _aligned(memoryview(first))


def grpc_method(path: str | None) -> str | None:
    """"pkg.Service/Method" for the path "/pkg.Service/Method" of a gRPC call,
    None for a path of any other shape."""
    m = _GRPC_PATH.fullmatch(path) if path else None
    return m.group(1) if m else None


def _text(v: bytes | None) -> str | None:
    return None if v is None else v.decode("latin-1")


class Connection:
    """The streams of one HTTP/2 connection; `side` is what the traced
    process is ("server" reads requests, "client" writes them). Never raises
    on the bytes it is fed; what it could not follow is counted. ``keep``:
    asked of each request's method and path, a keeper of its payload pieces
    (http2_payload.Kept), or None to keep none."""

    def __init__(self, side: str, started: bool = True,
                 keep: Callable[[str | None, str | None], Kept | None] | None = None):
        if side not in ("server", "client"):
            raise ValueError(f"side must be 'server' or 'client', not {side!r}")
        self.side, self.started, self._keep = side, started, keep
        req = IN if side == "server" else OUT
        self._half = (_Half(IN, REQ if req == IN else RESP, started),
                      _Half(OUT, REQ if req == OUT else RESP, started))
        self._by_role = (self._half[req], self._half[1 - req])
        self._send_role = RESP if side == "server" else REQ  # what the traced process sends
        self._open: dict[int, _Live] = {}
        self._done: list[Stream] = []
        self._blocked: dict[int, _Live] = {}
        self._max_id = 0
        self._refused: tuple[int, int] | None = None  # the server's GOAWAY
        self._counts = ([0] * 11, [0] * 11)
        self._flow = started
        self._conn_win = self._init_win = INITIAL_WINDOW
        self.frame_errors = self.skipped_bytes = self.headers_undecoded = 0
        self.partial: str | None = None
        self.goaway: tuple[int, int] | None = None  # (last stream id, error code), latest

    @property
    def frames(self) -> dict[str, tuple[int, int]]:
        """Frames seen, by type name: (in, out)."""
        i, o = self._counts
        return {name: (i[k], o[k]) for k, name in enumerate(FRAME_NAMES) if i[k] or o[k]}

    @property
    def window_updates_in(self) -> int:
        return self._counts[IN][WINDOW_UPDATE]

    @property
    def window_updates_out(self) -> int:
        return self._counts[OUT][WINDOW_UPDATE]

    def feed(self, ts_ns: int, direction: str, data: bytes, size: int) -> None:
        """One syscall's bytes; the last ``size - len(data)`` were not copied."""
        h = self._half[_DIR[direction]]
        gap = max(0, size - len(data))
        if h.lost:
            self.skipped_bytes += len(data) + gap
            return
        mv = memoryview(data)
        if not h.synced:
            mv = self._sync(h, mv)
            if mv is None:
                self.skipped_bytes += len(data) + gap
                return
        self._parse(h, mv, ts_ns)
        if gap:
            self._gap(h, gap, ts_ns)

    def finished(self) -> list[Stream]:
        """The streams finished since the last call, in the order they finished."""
        done, self._done = self._done, []
        return done

    def close(self, ts_ns: int, peer_ended: bool = False) -> None:
        """The connection closed: every open stream is finished incomplete.
        ``peer_ended``: the peer ended its side first; a server's client that
        left its streams open gave up on them (CLIENT_CLOSED)."""
        for st in list(self._open.values()):
            if peer_ended and self.side == "server" and not st.ended[RESP]:
                st.partial = st.partial or CLIENT_CLOSED
            self._finish(st, ts_ns, False)

    def _sync(self, h: _Half, mv):
        """The bytes of a direction's first chunks from where frames start:
        past the client preface, or at a chunk that starts at a plausible
        frame header. None: this chunk is skipped."""
        got = h.pre
        n = min(len(PREFACE) - got, len(mv))
        if n and (got or h.role == REQ) and mv[:n] == PREFACE[got:got + n]:
            h.pre = got + n
            h.synced = h.pre == len(PREFACE)
            return mv[n:]
        h.pre = 0
        if _aligned(mv):
            h.synced = True
            return mv
        self.partial = self.partial or CONNECTION_START_MISSED
        return None

    def _parse(self, h: _Half, mv, ts: int) -> None:
        pos, end = 0, len(mv)
        while pos < end:
            if h.lost:  # a frame just read made the rest unreadable
                self.skipped_bytes += end - pos
                return
            if h.left:  # inside a payload
                n = min(h.left, end - pos)
                if h.mode == _BUF:
                    if not h.buf and n == h.left:  # all of it here: read in place
                        h.left, pos = 0, pos + n
                        self._frame(h, mv[pos - n:pos], ts)
                        continue
                    h.buf += mv[pos:pos + n]
                elif h.mode == _DATA:
                    self._data(h, mv[pos:pos + n])
                h.left, pos = h.left - n, pos + n
                if not h.left:
                    self._end_payload(h, ts)
            elif h.head:  # a frame header cut by the previous chunk's end
                take = mv[pos:pos + 9 - len(h.head)]
                h.head += take
                pos += len(take)
                if len(h.head) == 9:
                    head, h.head = h.head, bytearray()
                    self._begin(h, head, 0, ts)
            elif end - pos < 9:
                h.head, pos = bytearray(mv[pos:end]), end
            else:
                self._begin(h, mv, pos, ts)
                pos += 9

    def _gap(self, h: _Half, g: int, ts: int) -> None:
        """The g bytes that end a chunk uncopied: skipped where they fall in a
        payload we need not read; anywhere else this direction's framing is lost."""
        padding = (h.mode == _BUF and h.t in (HEADERS, PUSH_PROMISE) and h.flags & PADDED
                   and h.buf and h.left <= h.buf[0])
        if not h.synced or h.head or g > h.left or (h.mode == _BUF and not padding):
            self.skipped_bytes += g
            self._lose(h, ts)
            return
        if h.mode == _DATA:
            self._data_gap(h, g)
        elif h.mode == _BUF:
            h.buf += bytes(g)  # padding: its value does not matter
        h.left -= g
        if not h.left:
            self._end_payload(h, ts)

    def _lose(self, h: _Half, ts: int) -> None:
        h.lost, h.block, h.buf, h.head = True, None, bytearray(), bytearray()
        self.partial = self.partial or BYTES_NOT_CAPTURED
        self._flow = False
        self._blocked.clear()
        for st in list(self._open.values()):
            if not st.ended[h.role]:  # what it still had to send is not seen
                st.partial = st.partial or BYTES_NOT_CAPTURED
            st.blocked = st.wait = None
            self._check(st, ts)

    def _begin(self, h: _Half, b, pos: int, ts: int) -> None:
        """A frame header: how its payload will be read."""
        hi, lo, t, flags, sid = _HEAD.unpack_from(b, pos)
        length, sid = hi << 8 | lo, sid & 0x7FFFFFFF
        if length > h.max_frame:  # RFC 9113 4.2: no peer sends it; what follows cannot be followed
            self.frame_errors += 1
            self.partial = self.partial or MALFORMED_FRAME
            self._lose(h, ts)
            return
        self._counts[h.d][min(t, 10)] += 1
        if h.block is not None and t != CONTINUATION:  # RFC 9113 6.10: nothing comes between
            self.frame_errors += 1
            h.block_bad = h.block_bad or MALFORMED_FRAME
            self._block_done(h, ts)
        h.t, h.flags, h.sid, h.left, h.length = t, flags, sid, length, length
        if t == DATA:
            h.mode, h.st, h.data_ts = _DATA, self._open.get(sid), ts
            h.pad, h.data_left = (-1, 0) if flags & PADDED else (0, length)
            if not sid:
                self.frame_errors += 1
        elif t > CONTINUATION:
            h.mode = _SKIP  # unknown types are ignored (RFC 9113 4.1)
        elif length > MAX_BLOCK:
            h.mode = _SKIP
            self.frame_errors += t not in _BLOCK_TYPES
        else:
            h.mode = _BUF
        if not length:
            self._end_payload(h, ts)

    def _end_payload(self, h: _Half, ts: int) -> None:
        if h.mode == _BUF:
            p, h.buf = h.buf, bytearray()
            self._frame(h, p, ts)
        elif h.mode == _DATA:
            self._data_end(h, ts)
        elif h.t in _BLOCK_TYPES:
            self._frame(h, None, ts)  # too large to read

    def _data(self, h: _Half, v) -> None:
        """Bytes of a DATA payload: counted, and gRPC prefixes read off them."""
        i = 0
        if h.pad < 0:
            h.pad, i = v[0], 1
            h.data_left = h.left - 1 - h.pad
            if h.data_left < 0:
                self.frame_errors += 1
                h.data_left = 0
        n = min(h.data_left, len(v) - i)
        if n <= 0:
            return
        h.data_left -= n
        st = h.st
        if st is not None:
            st.nbytes[h.role] += n
            if st.msgs[h.role] is not None:
                _grpc(st, h.role, v[i:i + n])
            if st.kept is not None and h.role == REQ:
                st.kept.request(v[i:i + n])
            elif st.kept is not None:
                st.kept.response(v[i:i + n])

    def _data_gap(self, h: _Half, g: int) -> None:
        st, r = h.st, h.role
        hidden = h.pad < 0  # the pad length: what follows is counted as data
        if hidden:
            h.pad, h.data_left = 0, h.left - 1
        n = min(h.data_left, g - hidden)
        h.data_left -= n
        if st is None:
            return
        st.nbytes[r] += n
        if st.kept is not None and n:
            if r == REQ:
                st.kept.request_gap()
            else:
                st.kept.response_gap(n)
        if st.msgs[r] is not None:
            if hidden or st.gpre[r] or st.gskip[r] < n:
                st.msgs[r] = None  # a prefix fell in the gap
            else:
                st.gskip[r] -= n

    def _data_end(self, h: _Half, ts: int) -> None:
        if h.pad < 0:
            self.frame_errors += 1  # PADDED without a pad length
        flow = self._flow and h.d == OUT
        if flow:
            self._conn_win -= h.length  # padding included (RFC 9113 6.9.1)
        st, h.st = h.st, None
        if st is None or self._open.get(h.sid) is not st:
            return
        st.end = ts
        if st.kept is not None and h.role == RESP:
            st.kept.frame_end(h.data_ts)
        if flow:
            st.win -= h.length
            if (not h.flags & END_STREAM and st.blocked is None
                    and min(self._conn_win, st.win) <= 0):
                st.blocked = ts
                self._blocked[st.sid] = st
        if h.flags & END_STREAM:
            self._end(st, h.role, ts)

    def _frame(self, h: _Half, p, ts: int) -> None:
        """A frame read whole (p: its payload; None for a header block frame too
        large to read)."""
        t, sid = h.t, h.sid
        if t in _BLOCK_TYPES:
            if t != CONTINUATION:
                self._block_start(h, p, ts)
            elif h.block is None or sid != h.block_sid:
                self.frame_errors += 1  # a CONTINUATION of nothing
            else:
                self._block_part(h, p, ts)
            return
        zero, fixed = _ON_STREAM_0[t], _FIXED_LEN.get(t)
        if (zero is not None and (sid == 0) != zero) or (fixed is not None and len(p) != fixed):
            self.frame_errors += 1
        elif t == SETTINGS:
            self._settings(h, p, ts)
        elif t == WINDOW_UPDATE:
            inc = int.from_bytes(p, "big") & 0x7FFFFFFF
            if not inc:
                self.frame_errors += 1
            elif h.d == IN and self._flow:
                self._window(sid, inc, ts)
        elif t == RST_STREAM:
            st = self._open.get(sid)
            if st is not None:
                st.reset, st.end = int.from_bytes(p, "big"), ts
                if h.role == REQ and self.side == "server" and not st.ended[RESP]:
                    st.partial = st.partial or CLIENT_CLOSED  # its client gave up on the answer
                self._finish(st, ts)
        elif t == GOAWAY:
            self._goaway(h, p, ts)

    def _block_start(self, h: _Half, p, ts: int) -> None:
        h.block, h.block_sid, h.block_ts, h.block_bad = bytearray(), h.sid, ts, None
        h.block_end, h.block_push = h.flags & END_STREAM, h.t == PUSH_PROMISE
        if p is not None:  # the fragment: past the pad length, promised id or priority
            i = 4 if h.t == PUSH_PROMISE else 5 if h.flags & PRIORITY_FLAG else 0
            j = len(p)
            if h.flags & PADDED:
                i, j = i + 1, j - (p[0] if p else j + 1)
            if i > j:
                self.frame_errors += 1
                h.block_bad = MALFORMED_FRAME
            p = p[i:j]
        self._block_part(h, p, ts)

    def _block_part(self, h: _Half, frag, ts: int) -> None:
        if h.block_bad is None:
            if frag is None or len(h.block) + len(frag) > MAX_BLOCK:
                h.block_bad = HEADERS_TOO_LARGE
                h.block = bytearray()
            elif h.flags & END_HEADERS and not h.block:
                self._block_done(h, ts, frag)  # a block in one frame: decoded in place
                return
            else:
                h.block += frag
        if h.flags & END_HEADERS:
            self._block_done(h, ts)

    def _block_done(self, h: _Half, ts: int, whole=None) -> None:
        """A header block ended: decoded (unless this direction's table is
        unknown) and given to its stream."""
        bad, block = h.block_bad, h.block if whole is None else whole
        h.block = None
        headers = None
        if bad is None and h.hpack_ok:
            try:
                headers = h.decoder.decode(block, raw=True)
            except HPACKError:  # its every error; bad indexes too
                bad = HPACK_ERROR if self.started else CONNECTION_START_MISSED
        if headers is None:
            self.headers_undecoded += 1
            if h.hpack_ok:
                h.hpack_ok = False
                self.partial = self.partial or bad
        sid = h.block_sid
        if not sid & 1 or h.block_push:  # pushes, and stream 0 (an error)
            self.frame_errors += sid == 0
        elif h.role == REQ:
            self._request_headers(sid, headers, h.block_end, h.block_ts, ts)
        else:
            self._response_headers(sid, headers, h.block_end, h.block_ts, ts)

    def _request_headers(self, sid: int, headers, end: int, ts0: int, ts: int) -> None:
        st = self._open.get(sid)
        if st is None:
            if sid <= self._max_id:
                return  # a stream already finished: a frame that crossed its end
            self._max_id = sid
            st = self._new(sid, ts0)
            if headers is None:
                st.partial = st.partial or HEADERS_NOT_DECODED
            else:
                f = {n: v for n, v in headers if n in _WANTED}
                if b":method" not in f:
                    st.partial = st.partial or REQUEST_MISSED
                st.method, st.path = _text(f.get(b":method")), _text(f.get(b":path"))
                st.authority, st.scheme = _text(f.get(b":authority")), _text(f.get(b":scheme"))
                st.ua, st.tp = _text(f.get(b"user-agent")), _text(f.get(b"traceparent"))
                st.tstate = _text(f.get(b"tracestate"))
                self._content_type(st, REQ, f.get(b"content-type"))
                if self._keep is not None:
                    st.kept = self._keep(st.method, st.path)
            if self._refused is not None and sid > self._refused[0]:
                st.reset = self._refused[1]  # the server said it will not process it
                self._finish(st, ts)
                return
        st.end = ts
        if end:
            self._end(st, REQ, ts)

    def _response_headers(self, sid: int, headers, end: int, ts0: int, ts: int) -> None:
        st = self._open.get(sid)
        if st is None:
            return
        st.end = ts
        if st.first is None:
            st.first = ts0
        if headers is None:
            st.partial = st.partial or HEADERS_NOT_DECODED
            if st.status is not None and st.status < 200:
                st.status = None  # the final status was in what could not be decoded
        else:
            f = {n: v for n, v in headers if n in _WANTED}
            status, gs = f.get(b":status"), f.get(b"grpc-status")
            if status is not None:
                st.status = int(status) if len(status) == 3 and status.isdigit() else None
            if gs is not None:
                st.grpc_status = int(gs) if 0 < len(gs) < 4 and gs.isdigit() else None
            if (gm := f.get(b"grpc-message")) is not None:
                st.grpc_message = gm.decode("latin-1")[:GRPC_MESSAGE_CHARS]
            self._content_type(st, RESP, f.get(b"content-type"))
            if st.kept is not None and (st.status or 0) >= 200:
                st.kept.response_headers(headers)
        if end:
            self._end(st, RESP, ts)

    @staticmethod
    def _content_type(st: _Live, r: int, ct: bytes | None) -> None:
        if ct is not None and st.ctype[r] is None:
            st.ctype[r] = ct.decode("latin-1")
            if ct.startswith(b"application/grpc"):
                st.msgs[r] = 0

    def _new(self, sid: int, ts: int) -> _Live:
        if len(self._open) >= MAX_OPEN:
            old = next(iter(self._open.values()))
            old.partial = old.partial or TOO_MANY_STREAMS
            self._finish(old, ts, False)
        st = _Live(sid, ts, self._init_win, 0 if self._flow else None)
        if self._by_role[RESP].lost:
            st.partial = BYTES_NOT_CAPTURED
        self._open[sid] = st
        return st

    def _end(self, st: _Live, role: int, ts: int) -> None:
        """END_STREAM from one side."""
        st.ended[role] = True
        if role == self._send_role and st.blocked is not None:
            self._unblock(st, ts)  # nothing more to send: no longer waiting
        self._check(st, ts)

    def _check(self, st: _Live, ts: int) -> None:
        """Finished once each side ended it or can no longer be followed."""
        req, resp = self._by_role
        if (st.ended[REQ] or req.lost) and (st.ended[RESP] or resp.lost):
            self._finish(st, ts)

    def _finish(self, st: _Live, ts: int, complete: bool | None = None) -> None:
        del self._open[st.sid]
        if st.blocked is not None:
            self._unblock(st, ts)
        self._done.append(Stream(
            st.sid, st.start, st.end, st.first, st.method, st.path, st.authority, st.scheme,
            st.status, st.ctype[RESP] or st.ctype[REQ], st.grpc_status, st.grpc_message,
            st.nbytes[REQ], st.nbytes[RESP], st.msgs[REQ], st.msgs[RESP], st.reset, st.wait,
            st.ended[RESP] if complete is None else complete, st.partial, st.ua, st.tp, st.tstate,
            None if st.kept is None else st.kept.payload(st.nbytes[REQ] if st.ended[REQ] else None)))

    def _settings(self, h: _Half, p, ts: int) -> None:
        """SETTINGS: a table size bounds the peer's HPACK encoder, whose table
        changes only by the updates in its blocks (RFC 7541 4.2): the largest
        announced is kept, as an encoder may grow before its ACK is read. The
        initial window, for what the traced process sends, applies on receipt
        (RFC 9113 6.9.2)."""
        if h.flags & ACK or len(p) % 6:
            self.frame_errors += bool(len(p))  # an ACK has no payload; pairs are 6 bytes
            return
        for i in range(0, len(p), 6):
            ident, value = _SETTING.unpack_from(p, i)
            if ident == 1:
                dec = self._half[1 - h.d].decoder  # decodes the blocks the sender receives
                dec.max_allowed_table_size = max(dec.max_allowed_table_size, min(value, MAX_TABLE))
            elif ident == 5 and 16384 <= value <= 0xFFFFFF:  # frames the sender accepts
                other = self._half[1 - h.d]
                other.max_frame = max(other.max_frame, value)
            elif ident == 4 and value > 0x7FFFFFFF:
                self.frame_errors += 1
            elif ident == 4 and h.d == IN and self._flow:
                delta, self._init_win = value - self._init_win, value
                for st in self._open.values():
                    st.win += delta
                self._reopen(list(self._blocked.values()), ts)

    def _window(self, sid: int, inc: int, ts: int) -> None:
        if not sid:
            self._conn_win += inc
            self._reopen(list(self._blocked.values()), ts)
        elif (st := self._open.get(sid)) is not None:
            st.win += inc
            if st.blocked is not None:
                self._reopen((st,), ts)

    def _reopen(self, streams, ts: int) -> None:
        for st in streams:
            if min(self._conn_win, st.win) > 0:
                self._unblock(st, ts)

    def _unblock(self, st: _Live, ts: int) -> None:
        if st.wait is not None:
            st.wait += ts - st.blocked
        st.blocked = None
        self._blocked.pop(st.sid, None)

    def _goaway(self, h: _Half, p, ts: int) -> None:
        if len(p) < 8:
            self.frame_errors += 1
            return
        last, code = _GOAWAY.unpack_from(p)
        self.goaway = (last & 0x7FFFFFFF, code)
        if h.role == RESP:  # the server's: requests above last are not processed
            self._refused = self.goaway
            for st in [s for s in self._open.values() if s.sid > self.goaway[0]]:
                st.reset = code
                self._finish(st, ts)


def _grpc(st: _Live, r: int, v) -> None:
    """Counts the gRPC messages whose 5-byte prefix (flag, length) is in v,
    carrying a cut prefix and the rest of a message body to the next bytes."""
    i, end, skip, pre, n = 0, len(v), st.gskip[r], st.gpre[r], st.msgs[r]
    while True:
        if skip:
            step = min(skip, end - i)
            skip, i = skip - step, i + step
        if i >= end:
            break
        if pre or end - i < 5:
            take = v[i:i + 5 - len(pre)].tobytes()
            pre, i = pre + take, i + len(take)
            if len(pre) < 5:
                break
            skip, pre = int.from_bytes(pre[1:], "big"), b""
        else:
            skip, i = int.from_bytes(v[i + 1:i + 5], "big"), i + 5
        n += 1
    st.gskip[r], st.gpre[r], st.msgs[r] = skip, pre, n


__all__ = ["NAME", "PREFACE", "Connection", "Stream", "grpc_method", "looks_like_h2"]
