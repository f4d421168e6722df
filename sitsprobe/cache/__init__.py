"""Cache look-ups: probe specs, key prefixes, bounded top-K aggregation,
probe-free RESP parsing and heatmaps. Imports neither bcc nor matplotlib
(render_png imports matplotlib when called)."""
from .heavy import OTHER, HeavyHitters
from .lookup import KernelCacheCounts, KeyLookup
from .prefix import PrefixExtractor
from .render import HeatmapData, heatmap_data, render_png, render_text
from .resp import resp_get_results
from .spec import CacheProbeSpec, redis_spec, specs_from_list
from .stats import CacheStats, subnet_of

__all__ = [
    "OTHER", "HeavyHitters", "KernelCacheCounts", "KeyLookup", "PrefixExtractor",
    "HeatmapData", "heatmap_data", "render_png", "render_text", "resp_get_results",
    "CacheProbeSpec", "redis_spec", "specs_from_list", "CacheStats", "subnet_of",
]
