"""`sitsprobe top`: a live view of one node, from its agent's metrics page."""
from .app import TopApp, once
from .source import ScrapeError, Source

__all__ = ["ScrapeError", "Source", "TopApp", "once"]
