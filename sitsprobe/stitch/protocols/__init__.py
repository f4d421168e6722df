"""Wire protocols: each one knows itself from an exchange's first bytes and
frames the exchange into :class:`~sitsprobe.request.Request` records.

A protocol is a module with:
  NAME          what ``Request.protocol`` says for it ("http/1.1", "resp")
  claims(ex)    whether the exchange's first bytes are its own (cheap)
  requests(ex, routes) -> list[Request]
  complete(ex)  whether the exchange's own framing says its response ended
                (then it can be reported before the connection moves on)

They are asked in PROTOCOLS' order; `opaque` claims whatever is left, as one
connection-level exchange named for what it looks like (TLS, HTTP/2) or
"unknown", counted apart from the framed protocols' metrics.
"""
from __future__ import annotations

from types import ModuleType

from . import http1, opaque, resp

PROTOCOLS: tuple[ModuleType, ...] = (http1, resp, opaque)
UNFRAMED = opaque.NAMES  # Request.protocol of exchanges no protocol frames


def protocol_of(ex) -> ModuleType:
    for p in PROTOCOLS:
        if p.claims(ex):
            return p
    return opaque


__all__ = ["PROTOCOLS", "UNFRAMED", "protocol_of", "http1", "opaque", "resp"]
