"""The model's cached paths against plain recomputation (float32, CPU).

Tolerance: logits agree within atol 1e-5 (they are O(0.1-1); float32 rounding from the
different reduction order of cached, padded and unpadded attention is ~1e-7)."""
from __future__ import annotations

import torch

from examples.engine import tokenizer
from examples.engine.prefix_cache import PrefixCache

ATOL = 1e-5


def tokens(text: str) -> list[int]:
    return tokenizer.encode(text)


@torch.inference_mode()
def test_kv_cache_decode_matches_recompute(model):
    seq = tokens("The KV cache must not change what the model computes, only how fast.")
    prompt_len = 20
    kv = model.new_kv(len(seq))
    steps = [model.extend(torch.tensor([seq[:prompt_len]]), [kv])]  # prefill
    for t in seq[prompt_len:]:  # decode, one token at a time, reading the cache
        steps.append(model.extend(torch.tensor([[t]]), [kv]))
    cached = torch.cat(steps, dim=1)
    full = model(torch.tensor([seq]))  # no cache at all
    assert kv.length == len(seq)
    assert kv.nbytes == len(seq) * 2 * model.cfg.n_layer * model.cfg.d_model * 4
    torch.testing.assert_close(cached, full, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_batched_decode_matches_each_request_alone(model):
    prompts = [tokens("a"), tokens("a longer prompt, of another length"), tokens("mid-sized prompt")]
    steps = 12
    alone = []
    for p in prompts:  # each request by itself
        kv = model.new_kv(len(p) + steps)
        logits = [model.extend(torch.tensor([p]), [kv])[0, -1]]
        for _ in range(steps - 1):
            logits.append(model.extend(torch.tensor([[int(logits[-1].argmax())]]), [kv])[0, -1])
        alone.append(torch.stack(logits))
    kvs = [model.new_kv(len(p) + steps) for p in prompts]
    first = [model.extend(torch.tensor([p]), [kv])[0, -1] for p, kv in zip(prompts, kvs)]
    batched = [[f] for f in first]
    for _ in range(steps - 1):  # all three together, padded to the longest and masked
        last = torch.tensor([[int(b[-1].argmax())] for b in batched])
        out = model.extend(last, kvs)[:, -1]
        for b, row in zip(batched, out):
            b.append(row)
    for a, b in zip(alone, batched):
        torch.testing.assert_close(torch.stack(b), a, atol=ATOL, rtol=0)
        assert torch.stack(b).argmax(-1).tolist() == a.argmax(-1).tolist()


@torch.inference_mode()
def test_prefix_cache_reuse_matches_full_prefill(model):
    cache = PrefixCache(block_size=8)
    first = tokens("a shared system prompt, then question one")
    second = tokens("a shared system prompt, then another question")
    kv = model.new_kv(len(first))
    assert cache.lookup(first, kv).hit is False
    model.extend(torch.tensor([first]), [kv])
    cache.insert(first, kv)

    kv = model.new_kv(len(second))
    found = cache.lookup(second, kv)
    common = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert found.hit and found.tokens == common // 8 * 8 == kv.length
    reused = model.extend(torch.tensor([second[kv.length:]]), [kv])[0]
    full = model(torch.tensor([second]))[0, found.tokens:]
    torch.testing.assert_close(reused, full, atol=ATOL, rtol=0)
    assert cache.stats()["hits"] == 1 and cache.stats()["misses"] == 1


@torch.inference_mode()
def test_prefix_cache_is_a_bounded_lru(model):
    cache = PrefixCache(block_size=4, max_entries=3)
    seq = tokens("0123456789abcdefghij")
    kv = model.new_kv(len(seq))
    model.extend(torch.tensor([seq]), [kv])
    cache.insert(seq, kv)  # 5 blocks, 3 kept: the last three inserted
    s = cache.stats()
    assert (s["entries"], s["evictions"]) == (3, 2)
    assert s["bytes"] == 3 * 4 * kv.bytes_per_token
    assert cache.lookup(seq, model.new_kv(len(seq))).hit is False  # the chain's head was evicted
    assert PrefixCache(max_bytes=1).lookup(seq, model.new_kv(len(seq))).key != \
        PrefixCache(max_bytes=1).lookup(tokens("other text entirely"), model.new_kv(30)).key


def test_weights_are_seeded(model):
    from examples.engine.model import GPT

    again, other = GPT(seed=0), GPT(seed=1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    assert not torch.equal(model.head.weight, other.head.weight)


def test_detokenizer_keeps_utf8_characters_whole():
    ids = tokenizer.encode("é→x")[1:]
    d = tokenizer.Detokenizer()
    pieces = [d.feed(t) for t in ids] + [d.flush()]
    assert "".join(pieces) == "é→x" and "" in pieces
    assert tokenizer.decode([tokenizer.EOS, *ids]) == "é→x"
