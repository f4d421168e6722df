"""A traced process's TLS probes, once it exited, detached on real uprobes
(probes.side_by_side.Detacher): each leaves bcc's table and its count of
open probes at once, the kernel closes each on the detacher's thread, and
none is left open. Closing a uprobe waits for the kernel (100-130 ms each
here); done in the agent's loop, the 8 probes of every exiting process stopped
it for 0.8 s, its rings unread."""
from __future__ import annotations

import os
import subprocess
import sys

import bcc
from bcc.libbcc import lib as libbcc

from sitsprobe.probes.libs import mapped_libraries
from sitsprobe.probes.side_by_side import Detacher
from sitsprobe.probes.tls import _LIBRARY, OPENSSL, SYMBOLS

from .conftest import require_root


class Recorded:
    """libbcc's two calls as they are, with the threads that made them."""

    def __init__(self) -> None:
        self.threads: set[str] = set()

    def bpf_close_perf_event_fd(self, fd: int) -> int:
        import threading

        self.threads.add(threading.current_thread().name)
        return libbcc.bpf_close_perf_event_fd(fd)

    def bpf_detach_uprobe(self, ev: bytes) -> int:
        return libbcc.bpf_detach_uprobe(ev)


def _perf_events(fds) -> set[int]:
    """Those of fds that are still open perf events of this process."""
    out = set()
    for fd in fds:
        try:
            if "perf_event" in os.readlink(f"/proc/self/fd/{fd}"):
                out.add(fd)
        except FileNotFoundError:
            pass
    return out


def test_the_probes_of_a_process_that_exited_are_all_closed_off_the_callers_thread():
    require_root()
    target = subprocess.Popen([sys.executable, "-c", "import ssl, sys; print(flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    target.stdout.readline()  # ssl imported: libssl mapped
    bpf = bcc.BPF(text="int probe(void *ctx) { return 0; }")
    try:
        (libssl,) = mapped_libraries(target.pid, {OPENSSL: _LIBRARY[OPENSSL]}, "/libssl")
        for sym in SYMBOLS:
            bpf.attach_uprobe(name=libssl.path.encode(), sym=sym.encode(), fn_name=b"probe", pid=target.pid)
            bpf.attach_uretprobe(name=libssl.path.encode(), sym=sym.encode(), fn_name=b"probe", pid=target.pid)
        events, open_before = dict(bpf.uprobe_fds), bcc._get_num_open_probes()
        assert len(events) == 2 * len(SYMBOLS) and _perf_events(events.values()) == set(events.values())
        target.kill()
        target.wait()
        recorded = Recorded()
        d = Detacher(bpf, lib=recorded)
        d.detach(list(events))
        assert bpf.uprobe_fds == {} and bcc._get_num_open_probes() == open_before - len(events)
        d.close()
        assert recorded.threads == {"uprobe-detach"}
        assert _perf_events(events.values()) == set(), "every probe's perf event closed"
    finally:
        target.kill()
        bpf.cleanup()
