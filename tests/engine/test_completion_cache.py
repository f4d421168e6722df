"""The Redis completion cache, with a real redis-server and a real engine subprocess."""
from __future__ import annotations

import time

import openai
import pytest
import redis

from .conftest import EngineProcess


@pytest.fixture(scope="module")
def cached_engine(redis_url):
    e = EngineProcess("--redis", redis_url)
    yield e
    e.stop()


def test_a_repeat_is_served_from_redis(cached_engine, redis_url):
    client = openai.OpenAI(base_url=cached_engine.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    ask = dict(model="sitsprobe-tiny-gpt", prompt="Cache me if you can.", max_tokens=12, temperature=0)
    first = client.completions.create(**ask)
    # the engine stores a completion after its response went out: wait for the store
    deadline = time.monotonic() + 10
    while (stats := cached_engine.get("/v1/engine/stats")["completion_cache"])["stores"] == 0 \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stats | {"url": None} == {"url": None, "hits": 0, "misses": 1, "stores": 1, "errors": 0}
    assert len(redis.Redis.from_url(redis_url).keys("sitsprobe:completion:*")) == 1

    second = client.completions.create(**ask)
    streamed = "".join(c.choices[0].text for c in client.completions.create(**ask, stream=True))
    stats = cached_engine.get("/v1/engine/stats")
    assert (stats["completion_cache"]["hits"], stats["completion_cache"]["misses"]) == (2, 1)
    assert stats["batching"]["requests_submitted"] == 1  # the repeats never reached the model
    assert second.choices[0].text == first.choices[0].text == streamed
    assert second.usage == first.usage

    client.completions.create(**(ask | {"temperature": 0.8}))  # sampled: neither looked up nor stored
    assert cached_engine.get("/v1/engine/stats")["completion_cache"]["misses"] == 1
    client.close()
