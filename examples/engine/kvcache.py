"""Per-request KV cache: for each layer, K and V tensors of shape [heads, capacity, head_dim]."""
from __future__ import annotations

import torch


class RequestKV:
    """The keys and values one request holds; ``length`` positions are filled."""

    def __init__(self, n_layer: int, n_head: int, head_dim: int, capacity: int,
                 device="cpu", dtype=torch.float32):
        shape = (n_head, capacity, head_dim)
        self.k = [torch.empty(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.empty(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.capacity = capacity
        self.length = 0
        self.bytes_per_token = 2 * n_layer * n_head * head_dim * self.k[0].element_size()

    @property
    def nbytes(self) -> int:
        """Bytes of K/V filled so far (the peak, since a request's cache only grows)."""
        return self.length * self.bytes_per_token

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v ([heads, T, head_dim]) at positions start..start+T-1."""
        end = start + k.shape[1]
        if end > self.capacity:
            raise ValueError(f"KV cache overflow: {end} positions > capacity {self.capacity}")
        self.k[layer][:, start:end] = k
        self.v[layer][:, start:end] = v


def attend_cached(kvs: list[RequestKV], layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
    """Append new keys/values ([B, heads, T, head_dim], row b for kvs[b]) to each request's
    cache and return the batch's keys and values padded to the longest row, with the mask
    (True = may attend) [B, 1, T, L]: query t of row b sees keys 0..start_b + t."""
    B, H, T, hd = k_new.shape
    starts = [kv.length for kv in kvs]
    for b, kv in enumerate(kvs):
        kv.write(layer, starts[b], k_new[b], v_new[b])
    L = max(starts) + T
    if B == 1:
        K, V = kvs[0].k[layer][:, :L].unsqueeze(0), kvs[0].v[layer][:, :L].unsqueeze(0)
    else:
        K, V = k_new.new_zeros(B, H, L, hd), v_new.new_zeros(B, H, L, hd)
        for b, kv in enumerate(kvs):
            n = starts[b] + T
            K[b, :, :n] = kv.k[layer][:, :n]
            V[b, :, :n] = kv.v[layer][:, :n]
    device = k_new.device
    last_visible = torch.tensor(starts, device=device)[:, None] + torch.arange(T, device=device)
    mask = torch.arange(L, device=device)[None, None, :] <= last_visible[:, :, None]
    return K, V, mask.unsqueeze(1)
