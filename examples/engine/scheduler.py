"""The engine loop: one thread that batches requests and runs the model.

Submitted requests wait in a queue. When the engine is idle, the first arrival opens a
batching window (see ``Scheduler.window``) to gather more; then each admitted request is
prefilled (through the prefix cache) and all active requests advance together, one token
per batched decode step. Requests that arrive while a batch decodes join it between
steps (continuous batching), up to ``max_batch_size``.
"""
from __future__ import annotations

import itertools
import os
import queue
import secrets
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass

import torch

from sitsprobe import markers

from .kvcache import RequestKV
from .model import GPT
from .prefix_cache import PrefixCache
from .tokenizer import EOS


@dataclass(frozen=True)
class GenParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    seed: int | None = None


class EngineError(RuntimeError):
    pass


class Overloaded(EngineError):
    pass


_DONE = object()
# A fault to inject on purpose (bench/gpu_check.py): CPU-bound host work of this
# many ms per request, in the scheduler thread, before prefill: the GPU starves.
CPU_BURN_S = float(os.environ.get("SITSPROBE_ENGINE_CPU_BURN_MS") or 0) / 1000


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Handle:
    """What a submitter holds: admission, the generated token ids as they come, the outcome."""

    def __init__(self, request_id: int, prompt: list[int], params: GenParams):
        self.request_id, self.prompt, self.params = request_id, prompt, params
        self.admitted = threading.Event()  # set when the request leaves the queue
        self.finish_reason: str | None = None  # "stop" (EOS), "length", "cancelled"
        self.kv_bytes = 0  # peak KV bytes the request held
        self.prefix_tokens = 0  # prompt tokens whose K/V came from the prefix cache
        self.error: str | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def tokens(self, timeout: float = 60.0):
        """Yield the generated token ids; raises EngineError if the engine failed."""
        while True:
            try:
                item = self._events.get(timeout=timeout)
            except queue.Empty:
                self.cancel()
                raise EngineError(f"request {self.request_id}: no token from the engine in {timeout}s") from None
            if item is _DONE:
                if self.error:
                    raise EngineError(self.error)
                return
            yield item


class _Running:
    def __init__(self, handle: Handle, kv: RequestKV):
        self.handle, self.kv = handle, kv
        self.last = EOS
        self.generated = 0
        seed = handle.params.seed if handle.params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(seed)


class Scheduler:
    def __init__(self, model: GPT, *, max_batch_size: int = 8, max_window_ms: float = 10.0,
                 prefix_cache: PrefixCache | None = None, max_queue: int = 256):
        if max_batch_size < 1 or max_window_ms < 0:
            raise ValueError("max_batch_size must be >= 1 and max_window_ms >= 0")
        self.model, self.prefix_cache = model, prefix_cache
        self.max_batch_size, self.max_window_s, self.max_queue = max_batch_size, max_window_ms / 1000, max_queue
        self._cond = threading.Condition()
        self._waiting: deque[Handle] = deque()
        self._active: list[_Running] = []
        self._stopping = False
        self._gap_s = self.max_window_s  # moving average of the gap between arrivals
        self._last_arrival: float | None = None
        self.window_s = self.max_window_s  # the last batching window opened
        self._step_ids = itertools.count(1)
        self.submitted = self.completed = self.cancelled = self.failed = self.batches = 0
        self.decode_steps = self.decode_rows = self.decode_batch_max = self.tokens_generated = 0
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)

    # -- the submitting side (HTTP handler threads) --

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def submit(self, request_id: int, prompt: list[int], params: GenParams) -> Handle:
        context = self.model.cfg.context
        if not prompt or len(prompt) + params.max_tokens > context:
            raise ValueError(f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) must be 1..{context} tokens")
        handle = Handle(request_id, prompt, params)
        with self._cond:
            if self._stopping:
                raise EngineError("the engine is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise Overloaded(f"{len(self._waiting)} requests already queued (limit {self.max_queue})")
            now = time.monotonic()
            if self._last_arrival is not None:
                self._gap_s += 0.2 * (min(now - self._last_arrival, 1.0) - self._gap_s)
            self._last_arrival = now
            self._waiting.append(handle)
            self.submitted += 1
            self._cond.notify()
        return handle

    def window(self) -> float:
        """Seconds to hold a new batch open: the time the recent arrival rate needs to fill
        the free slots, capped at max_window. It shrinks as arrivals speed up and grows
        when the queue is thin."""
        free = max(self.max_batch_size - len(self._waiting), 0)
        return min(self.max_window_s, free * self._gap_s)

    def stats(self) -> dict:
        with self._cond:
            queued, active = len(self._waiting), len(self._active)
        return {
            "queued": queued, "active": active,
            "max_batch_size": self.max_batch_size, "max_window_ms": self.max_window_s * 1000,
            "window_ms": round(self.window_s * 1000, 3), "arrival_gap_ms": round(self._gap_s * 1000, 3),
            "requests_submitted": self.submitted, "requests_completed": self.completed,
            "requests_cancelled": self.cancelled, "requests_failed": self.failed,
            "batches": self.batches, "decode_steps": self.decode_steps,
            "decode_batch_mean": round(self.decode_rows / self.decode_steps, 3) if self.decode_steps else 0.0,
            "decode_batch_max": self.decode_batch_max, "tokens_generated": self.tokens_generated,
        }

    # -- the engine thread --

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not (self._waiting or self._active or self._stopping):
                        self._cond.wait()
                    if self._stopping:
                        break
                    if not self._active:
                        self._collect()
                    free = self.max_batch_size - len(self._active)
                    joining = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
                for handle in joining:
                    self._admit(handle)
                if self._active:
                    self._decode_step()
        with self._cond:
            stranded = list(self._waiting) + [r.handle for r in self._active]
            self._waiting.clear()
            self._active = []
        self._fail(stranded, EngineError("the engine stopped"), log=False)

    def _collect(self) -> None:
        """Hold the batch open for the window, or until it is full (called holding _cond)."""
        self.window_s = self.window()
        self.batches += 1
        deadline = time.monotonic() + self.window_s
        while len(self._waiting) < self.max_batch_size and not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)

    def _admit(self, handle: Handle) -> None:
        """Prefill one request (reusing a cached prefix) and sample its first token."""
        if handle.cancelled:
            handle.admitted.set()
            self._finish(handle, None, "cancelled")
            return
        handle.admitted.set()
        rid = handle.request_id
        if CPU_BURN_S:
            _burn(CPU_BURN_S)
        try:
            with markers.range("prefill", request_id=rid):
                kv = self.model.new_kv(len(handle.prompt) + handle.params.max_tokens)
                if self.prefix_cache is not None:
                    with markers.range("prefix_lookup", request_id=rid):
                        found = self.prefix_cache.lookup(handle.prompt, kv)
                    if found is not None:
                        markers.cache_get("prefix", found.key, found.hit, request_id=rid)
                        handle.prefix_tokens = found.tokens
                with markers.range("h2d", request_id=rid):  # the prompt's tokens to the device
                    suffix = torch.tensor([handle.prompt[kv.length:]], device=self.model.device)
                logits = self.model.extend(suffix, [kv])[:, -1]
                if self.prefix_cache is not None:
                    self.prefix_cache.insert(handle.prompt, kv)
                running = _Running(handle, kv)
                with markers.range("d2h", request_id=rid):  # the sampled token back: waits for the device
                    token = self._sample([running], logits)[0]
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the engine
            self._fail([handle], e)
            return
        if self._advance(running, token):
            self._active.append(running)

    def _decode_step(self) -> None:
        batch = []
        for r in self._active:
            if r.handle.cancelled:
                self._finish(r.handle, r.kv, "cancelled")
            else:
                batch.append(r)
        self._active = batch
        if not batch:
            return
        step = next(self._step_ids)
        try:
            with markers.range("decode", batch_id=step, request_ids=tuple(r.handle.request_id for r in batch)):
                tokens = torch.tensor([[r.last] for r in batch], device=self.model.device)
                logits = self.model.extend(tokens, [r.kv for r in batch])[:, -1]
                next_tokens = self._sample(batch, logits)
        except Exception as e:  # noqa: BLE001
            self._active = []
            self._fail([r.handle for r in batch], e)
            return
        self.decode_steps += 1
        self.decode_rows += len(batch)
        self.decode_batch_max = max(self.decode_batch_max, len(batch))
        self._active = [r for r, t in zip(batch, next_tokens) if self._advance(r, t)]

    @staticmethod
    def _sample(batch: list[_Running], logits: torch.Tensor) -> list[int]:
        out = logits.argmax(dim=-1).tolist()
        for i, r in enumerate(batch):
            temperature = r.handle.params.temperature
            if temperature > 0:
                probs = torch.softmax(logits[i].float() / temperature, dim=-1).cpu()
                out[i] = int(torch.multinomial(probs, 1, generator=r.generator))
        return out

    def _advance(self, r: _Running, token: int) -> bool:
        """Hand a sampled token to the request; False when the request is finished."""
        if token == EOS:
            self._finish(r.handle, r.kv, "stop")
            return False
        r.generated += 1
        r.last = token
        self.tokens_generated += 1
        r.handle._events.put(token)
        if r.generated >= r.handle.params.max_tokens:
            self._finish(r.handle, r.kv, "length")
            return False
        return True

    def _finish(self, handle: Handle, kv: RequestKV | None, reason: str) -> None:
        handle.kv_bytes = kv.nbytes if kv is not None else 0
        handle.finish_reason = reason
        self.completed += 1
        self.cancelled += reason == "cancelled"
        handle._events.put(_DONE)

    def _fail(self, handles: list[Handle], error: Exception, log: bool = True) -> None:
        if log and handles:
            ids = ", ".join(str(h.request_id) for h in handles)
            print(f"engine: requests {ids} failed:", file=sys.stderr)
            traceback.print_exception(error, file=sys.stderr)
        for handle in handles:
            handle.error = f"{type(error).__name__}: {error}"
            self.failed += 1
            handle.admitted.set()
            handle._events.put(_DONE)
