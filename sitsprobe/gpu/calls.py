"""Run driver calls on a worker thread, each with a deadline.

A hung driver (a GPU falling off the bus can block NVML for minutes) must not
hang the agent: the caller waits at most ``timeout_s`` and gets CallTimeout.
The stuck worker is abandoned (a thread in a C call cannot be stopped) and a
fresh one takes the next call; past ``max_stuck`` stuck workers every call
fails fast with DriverHung instead of leaking more threads.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class CallTimeout(Exception):
    def __init__(self, name: str, timeout_s: float):
        self.name, self.timeout_s = name, timeout_s
        super().__init__(f"{name} did not return within {timeout_s:g}s")


class DriverHung(Exception):
    def __init__(self, stuck: int):
        self.stuck = stuck
        super().__init__(f"{stuck} driver calls are stuck; not calling the driver again")


class _Job:
    __slots__ = ("fn", "args", "done", "value", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class CallRunner:
    def __init__(self, timeout_s: float = 1.0, max_stuck: int = 3, name: str = "nvml"):
        self.timeout_s, self.max_stuck, self.name = timeout_s, max_stuck, name
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue | None = None
        self._threads: dict[int, threading.Thread] = {}  # id(its queue) -> live worker
        self._stuck: list[threading.Thread] = []

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the worker; its exception is re-raised here."""
        with self._lock:
            self._stuck = [t for t in self._stuck if t.is_alive()]
            if len(self._stuck) >= self.max_stuck:
                raise DriverHung(len(self._stuck))
            if self._jobs is None:
                self._jobs = self._spawn()
            jobs = self._jobs
        job = _Job(fn, args)
        jobs.put(job)
        if not job.done.wait(self.timeout_s):
            with self._lock:
                if self._jobs is jobs:  # abandon this worker: it is inside job
                    self._jobs = None
                    jobs.put(None)  # it exits when (if) the call returns
                    self._stuck.append(self._threads.pop(id(jobs)))
            raise CallTimeout(getattr(fn, "__name__", repr(fn)), self.timeout_s)
        if job.error is not None:
            raise job.error
        return job.value

    def _spawn(self) -> queue.SimpleQueue:
        jobs: queue.SimpleQueue = queue.SimpleQueue()
        t = threading.Thread(target=_work, args=(jobs,), name=self.name, daemon=True)
        self._threads[id(jobs)] = t
        t.start()
        return jobs

    def close(self) -> None:
        with self._lock:
            if self._jobs is not None:
                self._jobs.put(None)
                self._threads.pop(id(self._jobs), None)
                self._jobs = None

    @property
    def stuck(self) -> int:
        return sum(t.is_alive() for t in self._stuck)


def _work(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        try:
            job.value = job.fn(*job.args)
        except BaseException as e:  # handed to the caller
            job.error = e
        job.done.set()
