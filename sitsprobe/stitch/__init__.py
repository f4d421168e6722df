"""Turns captured bytes and kernel events into :class:`sitsprobe.request.Request` records."""
