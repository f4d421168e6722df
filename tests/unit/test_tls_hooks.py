"""probes.tls.TlsHooks: when the TLS programs load, and what a failed load leaves.

The load (bcc's compile and the kernel's verifier) is replaced by a callable
that fails as bcc says a failure; the rest, the waiting processes read from a
/proc tree, is the real class."""
from __future__ import annotations

import errno
import logging
import os

import pytest

from sitsprobe.probes import tls
from sitsprobe.probes.retry import FIRST_S as RETRY_FIRST_S
from sitsprobe.probes.retry import MOST_S as RETRY_MOST_S
from sitsprobe.probes.tls import TlsHooks

LIBSSL = "/usr/lib/x86_64-linux-gnu/libssl.so.3"
PID = 4242


class FakeModule:
    """What TlsHooks uses of a loaded bcc module: its uprobes."""

    def __init__(self) -> None:
        self.uprobe_fds: dict[bytes, int] = {}
        self.probed: list[tuple[str, int]] = []

    def attach_uprobe(self, name: bytes, sym: bytes, fn_name: bytes, pid: int) -> None:
        self.uprobe_fds[b"p_" + sym + str(pid).encode()] = 1
        self.probed.append((sym.decode(), pid))

    def attach_uretprobe(self, name: bytes, sym: bytes, fn_name: bytes, pid: int) -> None:
        self.uprobe_fds[b"r_" + sym + str(pid).encode()] = 1


class ProcsMap(dict):
    """The kernel's tls_procs (a bcc table, keyed by ctypes values): pid -> 1."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key.value, value.value)

    def pop(self, key, default=None):
        return super().pop(key.value, default)


class Loads:
    """The load: each call fails with the next of ``failures`` (an errno, or a
    message) until none are left, then returns a FakeModule."""

    def __init__(self, *failures: int | str) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> FakeModule:
        self.calls += 1
        if self.failures:
            what = self.failures.pop(0)
            # as bcc's BPF.load_func (and probes/apart.py's) says a program the kernel did not take
            raise Exception(what if isinstance(what, str) else
                            f"Failed to load BPF program b'ssl_leave': {os.strerror(what)}")
        return FakeModule()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def proc(tmp_path):
    d = tmp_path / str(PID)
    d.mkdir()
    (d / "maps").write_text(f"7f00-7f10 r-xp 00000000 08:01 4242 {LIBSSL}\n")
    (d / "exe").write_bytes(b"\x7fELF plain")
    return str(tmp_path)


def settle(hooks: TlsHooks) -> None:
    """The load's thread has ended, and the agent's loop has looked at the waiting."""
    hooks._loading.join(10)
    hooks.attach_waiting()


@pytest.mark.parametrize("code", [errno.EAGAIN, errno.EINTR, errno.ENOMEM, errno.EBUSY])
def test_a_load_refused_for_the_moment_is_tried_again_and_the_process_covered(proc, code, caplog, monkeypatch):
    """A signal while the verifier runs (EAGAIN: a profiler attaching, the
    agent's own stop) or memory short for a moment must not leave a traced
    process's TLS opaque for the agent's whole life."""
    looked, real = [], tls.mapped_libraries  # the processes' maps read
    monkeypatch.setattr(tls, "mapped_libraries", lambda pid, *a: looked.append(pid) or real(pid, *a))
    clock, load, procs = Clock(), Loads(code), ProcsMap()
    hooks = TlsHooks(procs, load, proc, clock=clock)
    with caplog.at_level(logging.WARNING, logger=tls.log.name):
        assert hooks.attach(PID) is None  # the load begins; the process waits
        settle(hooks)
    assert load.calls == 1 and PID not in hooks.failed and PID not in hooks.covered
    assert hooks.programs == f"the TLS programs did not load: Failed to load BPF program b'ssl_leave': " \
                             f"{os.strerror(code)}; trying again"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].endswith(f"trying again in {RETRY_FIRST_S:.0f} s "
                                               "(traced processes' TLS is opaque until then)"), said

    clock.now += RETRY_FIRST_S - 1  # not yet: neither a load nor, from the agent's loop, a look at the process
    reads = len(looked)
    for _ in range(3):
        settle(hooks)
    assert len(looked) == reads
    assert hooks.attach(PID) is None  # a rescan's
    settle(hooks)
    assert load.calls == 1

    clock.now += 1
    settle(hooks)  # the retry begins ...
    settle(hooks)  # ... and its end puts the probes on
    assert load.calls == 2 and hooks.programs == "loaded"
    assert hooks.covered == {PID: LIBSSL} and procs == {PID: 1} and not hooks.failed
    assert sorted(hooks._bpf.probed) == sorted((sym, PID) for sym in tls.SYMBOLS)


def test_each_retry_waits_twice_as_long_as_the_last(proc):
    clock, load = Clock(), Loads(errno.EAGAIN, errno.EAGAIN, errno.EAGAIN)
    hooks = TlsHooks(ProcsMap(), load, proc, clock=clock)
    hooks.attach(PID)
    settle(hooks)
    waits = []
    for _ in range(3):
        began, calls = clock.now, load.calls
        while load.calls == calls and clock.now - began <= RETRY_MOST_S:
            clock.now += 1
            settle(hooks)
            hooks._loading.join(10)  # a retry begun has ended
        waits.append(clock.now - began)
    assert waits == [RETRY_FIRST_S, 2 * RETRY_FIRST_S, 4 * RETRY_FIRST_S]
    settle(hooks)
    assert hooks.covered == {PID: LIBSSL}


@pytest.mark.parametrize("failure", [
    f"Failed to load BPF program b'ssl_leave': {os.strerror(errno.EACCES)}",  # the verifier's verdict
    f"Failed to load BPF program b'ssl_leave': {os.strerror(errno.EINVAL)}",
    "Need super-user privileges to run",  # bcc's words for EPERM
    "pins need a BPF file system mounted at /sys/fs/bpf",
])
def test_a_load_that_failed_for_good_is_not_tried_again(proc, failure, caplog):
    clock, load = Clock(), Loads(failure)
    hooks = TlsHooks(ProcsMap(), load, proc, clock=clock)
    with caplog.at_level(logging.WARNING, logger=tls.log.name):
        hooks.attach(PID)
        settle(hooks)
        clock.now += 100 * RETRY_FIRST_S
        hooks.attach(PID)  # as every rescan asks: said once
        settle(hooks)
    assert load.calls == 1
    assert hooks.programs == f"the TLS programs did not load: {failure}"
    assert PID in hooks.failed and failure in hooks.failed[PID] and not hooks.covered
    assert sum(failure in r.getMessage() for r in caplog.records) == 1
