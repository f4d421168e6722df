"""Cache look-ups: probe specs, key prefixes, bounded top-K aggregation and
heatmaps (the probe-free RESP side is sitsprobe.stitch.protocols.resp). Imports neither bcc nor matplotlib
(render_png imports matplotlib when called).

Each name is imported from its module when first asked for (PEP 562): the
config reads ``sitsprobe.cache.spec`` before the agent begins its compile,
and the heatmap's and the top-K tables' modules (prometheus_client with them,
about 65 ms here) would otherwise come with it."""
from __future__ import annotations

import importlib

_MODULES = {
    "heavy": ("OTHER", "HeavyHitters"),
    "lookup": ("KernelCacheCounts", "KeyLookup"),
    "prefix": ("PrefixExtractor",),
    "render": ("HeatmapData", "heatmap_data", "render_png", "render_text"),
    "spec": ("CacheProbeSpec", "redis_spec", "specs_from_list"),
    "stats": ("CacheStats", "subnet_of"),
}
_FROM = {name: module for module, names in _MODULES.items() for name in names}

__all__ = list(_FROM)


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_FROM[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
