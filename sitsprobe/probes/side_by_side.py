"""bcc's slow steps, done side by side: the kernel does each on its own and
bcc's calls into it drop the GIL, so a start and a stop wait for the
slowest step, not for their sum."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from .. import cpus
from . import apart
from .compiler import free_module


def _each(steps: list[Callable[[], object]], name: str, workers: int | None = None) -> list:
    """Each step's result, in order; the steps begin in that order, on
    ``workers`` threads (default: one each)."""
    if len(steps) < 2:
        return [step() for step in steps]
    with ThreadPoolExecutor(max_workers=workers or len(steps), thread_name_prefix=name) as pool:
        return list(pool.map(lambda step: step(), steps))


def load(bpf, names: Iterable[bytes], prog_type: int, compiled_apart: apart.Programs | None = None) -> list:
    """The programs loaded side by side, the largest first, on as many
    threads as this process has CPUs to run on (cpus.usable): verifying is CPU work, and one thread
    more than the CPUs only slows the longest (sock_io) down. Here net.c's
    socket tier: 0.27 s against 0.39 with a thread each, and 0.65 one after
    the other. Those in ``compiled_apart`` are loaded from its instructions
    (probes/apart.py)."""
    from bcc.libbcc import lib

    names, made = list(names), compiled_apart or {}
    order = sorted(range(len(names)), key=lambda i: -(len(made[names[i]]) if names[i] in made else
                                                      lib.bpf_function_size(bpf.module, names[i])))
    loaded = _each([lambda name=names[i]: apart.load_func(bpf, name, prog_type, made) for i in order],
                   "bpf-load", workers=min(len(names), cpus.usable()))
    out = [None] * len(names)
    for i, fn in zip(order, loaded):
        out[i] = fn
    return out


def close(bpf) -> None:
    """Every probe off at once, then the rest of bcc's cleanup: closing a
    tracepoint's or a uprobe's perf event waits for the kernel to be sure no
    CPU still runs its program, some 70 ms each, one after the other in
    cleanup() (net.c's: 0.36-0.41 s at once against 0.72 s)."""
    _each([*(lambda k=k: bpf.detach_tracepoint(k) for k in list(bpf.tracepoint_fds)),
           *(lambda k=k: bpf.detach_raw_tracepoint(k) for k in list(bpf.raw_tracepoint_fds)),
           *(lambda k=k: bpf.detach_uprobe_event(k) for k in list(bpf.uprobe_fds)),
           *(lambda k=k: bpf.detach_kprobe_event(k) for k in list(bpf.kprobe_fds))], "bpf-detach")
    free_module(bpf)
