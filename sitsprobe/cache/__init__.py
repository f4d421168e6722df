"""Cache look-ups: probe specs, key prefixes, bounded top-K aggregation and
heatmaps (the probe-free RESP side is sitsprobe.stitch.protocols.resp). Imports neither bcc nor matplotlib
(render_png imports matplotlib when called)."""
from .heavy import OTHER, HeavyHitters
from .lookup import KernelCacheCounts, KeyLookup
from .prefix import PrefixExtractor
from .render import HeatmapData, heatmap_data, render_png, render_text
from .spec import CacheProbeSpec, redis_spec, specs_from_list
from .stats import CacheStats, subnet_of

__all__ = [
    "OTHER", "HeavyHitters", "KernelCacheCounts", "KeyLookup", "PrefixExtractor",
    "HeatmapData", "heatmap_data", "render_png", "render_text",
    "CacheProbeSpec", "redis_spec", "specs_from_list", "CacheStats", "subnet_of",
]
