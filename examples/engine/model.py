"""A small decoder-only transformer (GPT-2 shaped) with deterministic seeded weights.

Two ways to run it: ``forward`` recomputes a whole sequence (no cache), ``extend`` appends
new tokens to per-request KV caches (prefill: one request, many tokens; decode: many
requests, one token each) and is what the engine serves with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from .kvcache import RequestKV, attend_cached
from .tokenizer import VOCAB_SIZE

MODEL_NAME = "sitsprobe-tiny-gpt"


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = VOCAB_SIZE
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    context: int = 512

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


class Block(nn.Module):
    """Pre-LayerNorm block: causal multi-head self-attention, then a GELU MLP."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, keys_values) -> torch.Tensor:
        """x: [B, T, d]. keys_values(k, v) -> (K, V, mask): the keys and values to attend
        to ([B, H, L, hd]) and which of them each query may see ([B or 1, 1, T, L])."""
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        K, V, mask = keys_values(k, v)
        att = (q @ K.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ V).transpose(1, 2).reshape(B, T, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Token + position embeddings, ``n_layer`` blocks, final LayerNorm, an untied head
    (a head tied to random embeddings mostly repeats its input token)."""

    def __init__(self, cfg: GPTConfig = GPTConfig(), seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.seed = seed
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights(seed)

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        """GPT-2's scheme from a CPU generator, so a seed gives the same weights everywhere."""
        g = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:  # LayerNorm gain
                p.fill_(1.0)
            else:
                std = residual_std if name.endswith(("proj.weight", "out.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)

    @property
    def device(self) -> torch.device:
        return self.wte.weight.device

    def new_kv(self, capacity: int) -> RequestKV:
        c = self.cfg
        return RequestKV(c.n_layer, c.n_head, c.head_dim, capacity, self.device, self.wte.weight.dtype)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] for whole sequences [B, T], recomputed without a cache."""
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril().view(1, 1, T, T)
        for block in self.blocks:
            x = block(x, lambda k, v: (k, v, causal))
        return self._logits(x)

    def extend(self, tokens: torch.Tensor, kvs: list[RequestKV]) -> torch.Tensor:
        """Append tokens [B, T] (row b continues kvs[b]) to the caches; logits [B, T, vocab]."""
        T = tokens.shape[1]
        lengths = [kv.length for kv in kvs]
        if max(lengths) + T > self.cfg.context:
            raise ValueError(f"sequence longer than the model's context ({self.cfg.context})")
        starts = torch.tensor(lengths, device=tokens.device)
        x = self.wte(tokens) + self.wpe(starts[:, None] + torch.arange(T, device=tokens.device))
        for layer, block in enumerate(self.blocks):
            x = block(x, partial(attend_cached, kvs, layer))
        for kv in kvs:
            kv.length += T
        return self._logits(x)

    @torch.inference_mode()
    def generate_greedy(self, prompt: list[int], max_tokens: int, eos: int | None = None) -> list[int]:
        """Reference decoding, one request alone: prefill, then greedy token-by-token."""
        kv = self.new_kv(len(prompt) + max_tokens)
        logits = self.extend(torch.tensor([prompt], device=self.device), [kv])[0, -1]
        out: list[int] = []
        while True:
            token = int(logits.argmax())
            if token == eos:
                return out
            out.append(token)
            if len(out) == max_tokens:
                return out
            logits = self.extend(torch.tensor([[token]], device=self.device), [kv])[0, -1]
