"""What every protocol's framing reads the same way off an exchange."""
from __future__ import annotations

from ...events import CF_TCP, CF_TUPLE, END_CLOSE, END_EXIT, Exchange


def end_ns(ex: Exchange) -> int:
    """The last byte out, or the last byte in for an exchange with no answer."""
    return ex.last_out_ns if ex.first_out_ns else ex.last_in_ns


def ended_early(ex: Exchange) -> bool:
    """No answer, and the connection or the process went away."""
    return not ex.first_out_ns and ex.reason in (END_EXIT, END_CLOSE)


def transport(ex: Exchange) -> str | None:
    """"tcp" when the kernel saw the socket's 4-tuple or a tcp_sendmsg on it.
    An answer sent without tcp_sendmsg went over another kind of socket (a
    Unix one, most likely): None."""
    return "tcp" if ex.flags & (CF_TCP | CF_TUPLE) or not ex.first_out_ns else None
