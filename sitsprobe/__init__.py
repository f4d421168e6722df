"""sitsprobe: an eBPF agent that stitches network, cache, engine and GPU events
into one trace per inference request."""

__version__ = "0.1.0"
