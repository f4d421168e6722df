"""HTTP/1.x message heads from the first bytes the kernel captured.

The input is a prefix of whatever a connection carried: cut at any byte,
possibly several pipelined requests, possibly not HTTP at all. Nothing here
raises on any bytes, and every scan is bounded (lines, heads, header count).
LF is accepted as a line end as well as CRLF.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from sitsprobe.request import TraceParent

MAX_HEADERS = 64  # header fields kept per head (the first ones)
MAX_TARGET = 2048  # request-target characters kept
_MAX_LINE = 8192  # start-line bytes looked at
_MAX_HEAD = 32768  # head bytes looked at
_MAX_REASON = 256

_METHODS = frozenset(
    (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH")
)
_VERSIONS = {b"HTTP/1.0": "1.0", b"HTTP/1.1": "1.1"}
_TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# a field line: token ":" OWS value; others (folded continuations, junk) are skipped
_FIELD = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*)$", re.MULTILINE)
_CTL = bytes(range(0x20)) + b"\x7f"
# token SP target SP version, ended by LF (CRs before it allowed); no CTLs anywhere
_REQUEST_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+) ([^\x00-\x20\x7f]+) HTTP/1\.[01]\r*\n")
_LOWER_HEX = "0123456789abcdef"


class RequestHead(NamedTuple):  # NamedTuples: one of each is made per exchange
    method: str
    target: str  # as sent, latin-1, at most MAX_TARGET characters
    path: str  # target without query or fragment; origin path of an absolute-form target
    version: str  # "1.1", "1.0", or "" when the request line was cut before it
    headers: dict[str, str]  # lower-cased names, first occurrence wins
    complete: bool  # the blank line ending the head was captured
    content_length: int | None
    chunked: bool
    traceparent: TraceParent | None
    size: int | None = None  # head and Content-Length body in bytes, when both are known


class ResponseHead(NamedTuple):
    version: str
    status: int
    reason: str
    headers: dict[str, str]
    complete: bool
    content_length: int | None
    chunked: bool
    event_stream: bool  # Content-Type text/event-stream (server-sent events)
    head_size: int | None = None  # bytes up to and including the blank line, if captured


def looks_like_request(data: bytes) -> bool:
    """Cheap test: ``data`` starts with a standard HTTP/1 method and a space."""
    sp = data.find(b" ", 0, 8)
    return sp > 0 and data[:sp] in _METHODS


def request_line(data: bytes) -> tuple[str, str] | None:
    """(method, target) of the request ``data`` starts with: the cheap path for
    the one-request exchanges that are nearly all of them (one regex match, a
    third of the split-and-check it replaced). None if not HTTP/1."""
    m = _REQUEST_LINE.match(data)
    if m is None or m.end() > _MAX_LINE:
        return None
    return m[1].decode("ascii"), m[2][:MAX_TARGET].decode("latin-1")


def parse_request_heads(data: bytes, limit: int = 16) -> list[RequestHead]:
    """Every request head that starts within ``data`` (at most ``limit``), in order.

    After a complete head its Content-Length body is skipped to reach the next
    pipelined request; a head that is cut, or a body framed by
    Transfer-Encoding, ends the scan. A request line cut after the method and
    part of the target still yields a head (``complete=False``) if the method
    is a standard one.
    """
    heads: list[RequestHead] = []
    pos = 0
    while pos < len(data) and len(heads) < limit:
        pos = _past_empty_line(data, pos)
        head, end = _request(data, pos)
        if head is None:
            break
        chunked = "transfer-encoding" in head.headers
        if end >= 0 and not chunked:
            head = head._replace(size=end - pos + (head.content_length or 0))
        heads.append(head)
        if end < 0 or chunked:
            break
        pos = end + (head.content_length or 0)
    return heads


def request_headers(data: bytes) -> dict[str, str] | None:
    """The header fields of the first request head in ``data``, as
    :func:`parse_request_heads` reads them (no more: what a traced request
    needs of a head already parsed once); None if there is none."""
    line = _request_line(data, _past_empty_line(data, 0))
    if line is None:
        return None
    nl = line[3]
    return _headers(data, nl)[0] if nl >= 0 else {}


def _past_empty_line(data: bytes, pos: int) -> int:
    """RFC 9112 2.2: an empty line before a request is ignored."""
    if data.startswith(b"\r\n", pos):
        return pos + 2
    return pos + 1 if data.startswith(b"\n", pos) else pos


def _request_line(data: bytes, pos: int) -> tuple[bytes, bytes, bytes, int] | None:
    """(method, target, version, the index of its LF or -1 if cut) of the
    request line at ``pos``; None if it is not one."""
    nl = data.find(b"\n", pos, pos + _MAX_LINE)
    line = (data[pos:nl] if nl >= 0 else data[pos : pos + _MAX_LINE]).rstrip(b"\r")
    method, _, rest = line.partition(b" ")
    target, _, version = rest.partition(b" ")
    if (
        not method
        or not target
        or method.translate(None, _TCHAR)
        or len(line.translate(None, _CTL)) != len(line)
    ):
        return None
    if nl >= 0:
        if version not in _VERSIONS:
            return None
    elif method not in _METHODS or not (  # request line cut: ask for more evidence that this is HTTP
        b"HTTP/1.1".startswith(version) or b"HTTP/1.0".startswith(version)
    ):
        return None
    return method, target, version, nl


def _request(data: bytes, pos: int) -> tuple[RequestHead | None, int]:
    line = _request_line(data, pos)
    if line is None:
        return None, -1
    method, target, version, nl = line
    headers, end = _headers(data, nl) if nl >= 0 else ({}, -1)
    target_s = target[:MAX_TARGET].decode("latin-1")
    tp = headers.get("traceparent")
    head = RequestHead(
        method=method.decode("ascii"),
        target=target_s,
        path=path_of(target_s),
        version=_VERSIONS.get(version, ""),
        headers=headers,
        complete=end >= 0,
        content_length=_content_length(headers),
        chunked=_chunked(headers),
        traceparent=parse_traceparent(tp) if tp else None,
    )
    return head, end


def parse_response_head(data: bytes) -> ResponseHead | None:
    """The head of the response ``data`` starts with; None unless it starts ``HTTP/1.x NNN``."""
    version = _VERSIONS.get(data[:8])
    code = data[9:12]
    if (
        version is None
        or data[8:9] != b" "
        or len(code) != 3
        or not code.isdigit()
        or code.startswith(b"0")
        or data[12:13] not in (b"", b" ", b"\r", b"\n")
    ):
        return None
    nl = data.find(b"\n", 12, 12 + _MAX_LINE)
    reason = data[12:nl] if nl >= 0 else data[12 : 12 + _MAX_LINE]
    headers, end = _headers(data, nl) if nl >= 0 else ({}, -1)
    return ResponseHead(
        version=version,
        status=int(code),
        reason=reason.strip(b" \t\r")[:_MAX_REASON].decode("latin-1"),
        headers=headers,
        complete=end >= 0,
        content_length=_content_length(headers),
        chunked=_chunked(headers),
        event_stream=headers.get("content-type", "").lower().startswith("text/event-stream"),
        head_size=end if end >= 0 else None,
    )


def head_apart(status: int | None, headers: dict[str, str]) -> ResponseHead:
    """A response head that came apart from its body (HTTP/2's HEADERS
    frame: no chunking, the body's bytes are all body), as parse_response_head
    gives one; ``headers`` with lower-case names."""
    return ResponseHead(
        version="2", status=status or 0, reason="", headers=headers, complete=True,
        content_length=_content_length(headers), chunked=False,
        event_stream=headers.get("content-type", "").lower().startswith("text/event-stream"),
        head_size=0,
    )


def _headers(data: bytes, nl: int) -> tuple[dict[str, str], int]:
    """Header fields after the start line ending at ``data[nl]`` (a LF), and
    the index just past the blank line ending the head (-1 if not captured).
    Only lines whose line end was captured count."""
    stop = min(len(data), nl + _MAX_HEAD)
    crlf = data.find(b"\n\r\n", nl, stop)
    lf = data.find(b"\n\n", nl, stop)
    if lf >= 0 and (crlf < 0 or lf < crlf):
        last, end = lf, lf + 2
    elif crlf >= 0:
        last, end = crlf, crlf + 3
    else:
        last, end = data.rfind(b"\n", nl, stop), -1
    headers: dict[str, str] = {}
    for name, value in _FIELD.findall(data[nl + 1 : last].decode("latin-1"))[:MAX_HEADERS]:
        key = name.lower()
        if key not in headers:
            headers[key] = value.rstrip(" \t\r")
    return headers, end


def _content_length(headers: dict[str, str]) -> int | None:
    v = headers.get("content-length", "")
    return int(v) if v.isascii() and v.isdigit() and len(v) <= 18 else None


def _chunked(headers: dict[str, str]) -> bool:
    te = headers.get("transfer-encoding", "")
    return te.rpartition(",")[2].strip().lower() == "chunked"


def path_of(target: str) -> str:
    path = target.partition("?")[0].partition("#")[0]
    if path.startswith("/"):
        return path
    _, scheme_sep, rest = path.partition("://")
    if not scheme_sep:
        return path  # "*" or authority-form (CONNECT host:port)
    slash = rest.find("/")
    return rest[slash:] if slash >= 0 else "/"


def parse_traceparent(value: str) -> TraceParent | None:
    """A W3C Trace Context (level 1) ``traceparent`` value, or None if invalid.

    Versions above 00 are parsed by their 00 prefix, extra fields ignored.
    """
    v = value.strip(" \t")
    if len(v) < 55 or (len(v) > 55 and (v[:2] == "00" or v[55] != "-")):
        return None
    if v[2] != "-" or v[35] != "-" or v[52] != "-" or v[:2] == "ff":
        return None
    version, trace, span, flags = v[:2], v[3:35], v[36:52], v[53:55]
    if (version + trace + span + flags).strip(_LOWER_HEX):
        return None  # a character outside lowercase hex
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return TraceParent(trace_id=trace_id, span_id=span_id, flags=int(flags, 16))
