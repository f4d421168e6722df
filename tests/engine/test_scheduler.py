"""The scheduler in-process: batching, continuous joins, the prefix cache, the window."""
from __future__ import annotations

import threading

import pytest

from examples.engine import tokenizer
from examples.engine.prefix_cache import PrefixCache
from examples.engine.scheduler import GenParams, Scheduler

GREEDY = GenParams(max_tokens=24, temperature=0.0)


@pytest.fixture
def scheduler(model):
    made = []

    def make(**kw):
        s = Scheduler(model, **kw)
        s.start()
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def run(s: Scheduler, rid: int, text: str, params: GenParams = GREEDY):
    handle = s.submit(rid, tokenizer.encode(text), params)
    return handle, list(handle.tokens(timeout=30))


def test_batched_requests_give_the_same_tokens_as_alone(model, scheduler):
    s = scheduler(max_batch_size=8, max_window_ms=300)
    # different lengths; the second ends (EOS) after one token while the others run on
    prompts = ["x", "a prompt of some length", "a prompt of medium length",
               "another, rather longer, prompt than that", "mid prompt"]
    handles = [s.submit(i, tokenizer.encode(p), GREEDY) for i, p in enumerate(prompts)]
    got = [list(h.tokens(timeout=30)) for h in handles]
    assert s.stats()["decode_batch_max"] == len(prompts)  # one window gathered them all
    for p, tokens, h in zip(prompts, got, handles):
        assert tokens == model.generate_greedy(tokenizer.encode(p), GREEDY.max_tokens, tokenizer.EOS)
        assert h.finish_reason in ("stop", "length")
        assert h.kv_bytes == (len(tokenizer.encode(p)) + len(tokens) - (h.finish_reason == "length")) \
            * model.new_kv(1).bytes_per_token


def test_a_request_joins_a_running_batch_between_decode_steps(model, scheduler):
    s = scheduler(max_batch_size=4, max_window_ms=0)
    long = s.submit(1, tokenizer.encode("a long generation"), GenParams(max_tokens=120))
    stream = long.tokens(timeout=30)
    next(stream)  # it is decoding now
    _, joined = run(s, 2, "a late arrival")
    rest = list(stream)
    assert s.stats()["decode_batch_max"] == 2 and s.stats()["batches"] == 1
    assert joined == model.generate_greedy(tokenizer.encode("a late arrival"), GREEDY.max_tokens, tokenizer.EOS)
    assert len(rest) + 1 == 120 or long.finish_reason == "stop"


def test_prefix_cache_hit_gives_the_same_tokens_as_a_miss(model, scheduler):
    s = scheduler(prefix_cache=PrefixCache(block_size=16))
    system = "<|system|>You are a terse assistant for a test of the prefix cache.\n"
    first, miss = run(s, 1, system + "<|user|>first question\n<|assistant|>")
    second, hit = run(s, 2, system + "<|user|>second question\n<|assistant|>")
    stats = s.stats()
    pc = s.prefix_cache.stats()
    assert (pc["hits"], pc["misses"]) == (1, 1) and second.prefix_tokens >= 64 and first.prefix_tokens == 0
    for text, tokens in ((system + "<|user|>first question\n<|assistant|>", miss),
                         (system + "<|user|>second question\n<|assistant|>", hit)):
        assert tokens == model.generate_greedy(tokenizer.encode(text), GREEDY.max_tokens, tokenizer.EOS)
    _, again = run(s, 3, system + "<|user|>second question\n<|assistant|>")
    assert again == hit and s.prefix_cache.stats()["hits"] == 2
    assert stats["requests_completed"] == 2


def test_seeded_sampling_is_reproducible(scheduler):
    s = scheduler()
    params = GenParams(max_tokens=16, temperature=1.0, seed=7)
    assert run(s, 1, "sample me", params)[1] == run(s, 2, "sample me", params)[1]
    assert run(s, 3, "sample me", params)[1] != run(s, 4, "sample me", GenParams(16, 1.0, seed=8))[1]


def test_window_shrinks_as_arrivals_speed_up_and_grows_when_thin(model):
    s = Scheduler(model, max_batch_size=8, max_window_ms=10)  # not started: nothing drains the queue
    s._gap_s = 1.0  # a request a second: the window is the cap
    assert s.window() == pytest.approx(0.010)
    s._gap_s = 0.0005  # 2000 requests/s: 8 free slots fill in 4 ms
    assert s.window() == pytest.approx(0.004)
    for i in range(6):  # six already queued: two slots left
        s._waiting.append(object())
    assert s.window() == pytest.approx(0.001)
    s._waiting.clear()
    s._gap_s = 0.0
    threads = [threading.Thread(target=s.submit, args=(i, [256, 1], GREEDY)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.stats()["queued"] == 4 and s.window() < 0.010


def test_a_cancelled_request_stops_decoding(scheduler):
    s = scheduler()
    handle = s.submit(1, tokenizer.encode("cancel me"), GenParams(max_tokens=128))
    stream = handle.tokens(timeout=30)
    next(stream)
    handle.cancel()
    list(stream)
    assert handle.finish_reason in ("cancelled", "stop")
    assert s.stats()["tokens_generated"] < 128
