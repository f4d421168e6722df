"""Exchanges no protocol here frames: one connection-level Request each,
named for what the first bytes look like, so that TLS and HTTP/2 (gRPC)
connections are counted as themselves, never as HTTP/1.1 requests with
empty labels. Framing them is other modules' work to come.

Each exchange is recognised on its own (a connection whose start the agent
missed is recognised all the same):
  tls     a TLS record header: type 20..23, version 3.0..3.4, a length a
          record can have, on either side
  http2   the client connection preface, or a frame header on both sides
          (each of the first frames captured well formed: a known type, a
          length within the default maximum and one its type can have, on
          the stream its type must be on)
  websocket  RFC 6455 frames, as a connection carries them once an HTTP
          request's 101 Switching Protocols upgraded it: the client's masked
          and the server's not (each of the first frames captured well formed:
          a known opcode, no reserved bit but compression's, a control frame
          whole and short). The upgrade itself is an HTTP/1.1 request.
"""
from __future__ import annotations

from ...events import Exchange
from ...request import Request
from .common import end_ns, transport

NAMES = ("tls", "http2", "websocket", "unknown")
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_TLS_MAX_RECORD = (1 << 14) + 2048  # TLSCiphertext.length at most
_H2_MAX_FRAME = 1 << 14  # SETTINGS_MAX_FRAME_SIZE's initial value
_H2_TYPES = range(0x0A)  # DATA .. CONTINUATION
_H2_FIXED_LENGTH = {2: 5, 3: 4, 6: 8, 8: 4}  # PRIORITY, RST_STREAM, PING, WINDOW_UPDATE
_H2_CONNECTION_TYPES = frozenset({4, 6, 7})  # SETTINGS, PING, GOAWAY: on stream 0 only
_H2_ANY_STREAM = 8  # WINDOW_UPDATE: on the connection or on a stream


def claims(ex: Exchange) -> bool:
    return True


def complete(ex: Exchange) -> bool:
    return False


def _tls_record(b: bytes) -> bool:
    return (len(b) >= 5 and 20 <= b[0] <= 23 and b[1] == 3 and b[2] <= 4
            and int.from_bytes(b[3:5], "big") <= _TLS_MAX_RECORD)


def _h2_frames(b: bytes, most: int = 4) -> bool:
    """The first frames the bytes hold (up to ``most``) are each well formed:
    a known type, a length that type can have, the stream it must be on."""
    pos = 0
    while pos + 9 <= len(b) and most:
        length, kind, stream = int.from_bytes(b[pos:pos + 3], "big"), b[pos + 3], \
            int.from_bytes(b[pos + 5:pos + 9], "big")
        if length > _H2_MAX_FRAME or kind not in _H2_TYPES or stream >> 31:
            return False
        fixed = _H2_FIXED_LENGTH.get(kind)
        if (fixed is not None and length != fixed) or (kind == 4 and length % 6) \
                or (kind != _H2_ANY_STREAM and (stream == 0) != (kind in _H2_CONNECTION_TYPES)):
            return False
        pos += 9 + length
        most -= 1
    return pos > 0


_WS_OPCODES = frozenset({0, 1, 2, 8, 9, 10})  # continuation, text, binary; close, ping, pong
_WS_CONTROL = 8  # opcodes from 8 on: whole (FIN) and at most 125 bytes
_WS_RESERVED = 0x30  # RSV2, RSV3: no extension in use sets them (RSV1: permessage-deflate)


def _ws_frames(b: bytes, masked: bool, most: int = 4) -> bool:
    """The first frames the bytes hold (up to ``most``) are each well formed,
    masked as the side that sent them must: a client always, a server never."""
    pos, seen = 0, 0
    while pos + 2 <= len(b) and seen < most:
        first, second = b[pos], b[pos + 1]
        opcode, length = first & 0x0F, second & 0x7F
        if opcode not in _WS_OPCODES or first & _WS_RESERVED or bool(second & 0x80) != masked \
                or (opcode >= _WS_CONTROL and (not first & 0x80 or length > 125)):
            return False
        seen += 1
        size = {126: 2, 127: 8}.get(length, 0)
        if pos + 2 + size > len(b):
            break  # its length cut by the capture: its start is good
        if size:
            length = int.from_bytes(b[pos + 2:pos + 2 + size], "big")
        pos += 2 + size + 4 * masked + length
    return seen > 0


def name_of(ex: Exchange) -> str:
    req, resp = ex.req, ex.resp
    if _tls_record(req) or (not req and _tls_record(resp)):
        return "tls"
    if len(req) >= 3 and H2_PREFACE.startswith(req[: len(H2_PREFACE)]):  # the preface, maybe cut
        return "http2"
    if (req or resp) and (not req or _h2_frames(req)) and (not resp or _h2_frames(resp)):
        return "http2"  # frames both ways; or one way: the server's SETTINGS, sent first
    if (req or resp) and (not req or _ws_frames(req, True)) and (not resp or _ws_frames(resp, False)):
        return "websocket"
    return "unknown"


def requests(ex: Exchange, routes) -> list[Request]:
    # never incomplete: without framing there is no telling a closed
    # connection's last exchange from a cut one
    return [Request(ex.tgid, ex.comm, ex.fd, ex.start_ns, end_ns(ex), ex.first_out_ns or None,
                    ex.bytes_in, ex.bytes_out, ex.local, ex.peer, name_of(ex),
                    transport=transport(ex))]
