"""The sitsprobe reference inference engine: a tiny GPT served over an
OpenAI-compatible HTTP API, with a KV cache, dynamic (continuous) batching,
a prefix cache and an optional Redis completion cache.

It uses nothing of sitsprobe but ``sitsprobe.markers``. Run it with

    python examples/engine/serve.py --host 127.0.0.1 --port 8000
"""
