"""Prefix cache: reuses the K/V of token prefixes seen before.

Prompts are cut into blocks of ``block_size`` tokens. Block i is stored under a digest
of the whole prefix it ends (a hash chain over the blocks, so the key names the token
prefix, not just the block), holding that block's K and V for every layer. A look-up
walks the chain from the start and reuses blocks until the first one missing. The cache
is an LRU bounded by entries and by bytes.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .kvcache import RequestKV


@dataclass
class Lookup:
    hit: bool
    key: str  # short hex digest of the longest prefix matched (hit) or probed first (miss)
    tokens: int  # prompt tokens whose K/V came from the cache


class PrefixCache:
    def __init__(self, max_bytes: int = 64 << 20, max_entries: int = 4096, block_size: int = 16):
        self.max_bytes, self.max_entries, self.block_size = max_bytes, max_entries, block_size
        self._blocks: OrderedDict[bytes, tuple[list[torch.Tensor], list[torch.Tensor], int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = self.misses = self.hit_tokens = self.evictions = 0

    def _digests(self, tokens: list[int], n_blocks: int) -> list[bytes]:
        out, prev, bs = [], b"", self.block_size
        for i in range(n_blocks):
            block = b"".join(t.to_bytes(2, "little") for t in tokens[i * bs:(i + 1) * bs])
            prev = hashlib.blake2b(prev + block, digest_size=16).digest()
            out.append(prev)
        return out

    def lookup(self, tokens: list[int], kv: RequestKV) -> Lookup | None:
        """Fill ``kv`` (empty) with the longest cached prefix of ``tokens``, leaving at least
        one token to compute. None when the prompt is too short to have a reusable block."""
        n_blocks = (len(tokens) - 1) // self.block_size
        if n_blocks == 0:
            return None
        digests = self._digests(tokens, n_blocks)
        with self._lock:
            found = []
            for d in digests:
                entry = self._blocks.get(d)
                if entry is None:
                    break
                self._blocks.move_to_end(d)
                found.append(entry)
            n = len(found) * self.block_size
            self.hit_tokens += n
            if found:
                self.hits += 1
            else:
                self.misses += 1
        for i, (ks, vs, _) in enumerate(found):
            for layer, (k, v) in enumerate(zip(ks, vs)):
                kv.write(layer, i * self.block_size, k, v)
        kv.length = n
        return Lookup(bool(found), digests[max(len(found) - 1, 0)].hex()[:16], n)

    def insert(self, tokens: list[int], kv: RequestKV) -> None:
        """Store every full block of ``tokens`` whose K/V ``kv`` holds."""
        bs = self.block_size
        n_blocks = min(len(tokens), kv.length) // bs
        for i, d in enumerate(self._digests(tokens, n_blocks)):
            with self._lock:
                if d in self._blocks:
                    self._blocks.move_to_end(d)
                    continue
            ks = [k[:, i * bs:(i + 1) * bs].clone() for k in kv.k]
            vs = [v[:, i * bs:(i + 1) * bs].clone() for v in kv.v]
            nbytes = sum(t.numel() * t.element_size() for t in ks + vs)
            if nbytes > self.max_bytes:
                return
            with self._lock:
                self._blocks[d] = (ks, vs, nbytes)
                self.bytes += nbytes
                while self.bytes > self.max_bytes or len(self._blocks) > self.max_entries:
                    _, (_, _, freed) = self._blocks.popitem(last=False)
                    self.bytes -= freed
                    self.evictions += 1

    def stats(self) -> dict:
        with self._lock:
            return {
                "hits": self.hits, "misses": self.misses, "hit_tokens": self.hit_tokens,
                "entries": len(self._blocks), "bytes": self.bytes, "evictions": self.evictions,
                "max_bytes": self.max_bytes, "max_entries": self.max_entries,
                "block_size": self.block_size,
            }
