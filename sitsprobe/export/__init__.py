"""Sinks that carry stitched requests out of the agent: OTLP traces."""
