"""probes.side_by_side.Detacher, its bookkeeping: bcc's module and its C
library are stand-ins here (tests/integration/test_uprobe_detach.py puts it
on real uprobes)."""
from __future__ import annotations

import logging
import threading

from sitsprobe.probes.side_by_side import Detacher


class Module:
    """What Detacher uses of a bcc module: its uprobes' table and bcc's count."""

    def __init__(self, events: dict[bytes, int]) -> None:
        self.uprobe_fds = dict(events)
        self.open = len(events)

    def _del_uprobe_fd(self, ev: bytes) -> None:
        del self.uprobe_fds[ev]
        self.open -= 1


class Lib:
    """libbcc's two calls, recording which thread made them; ``release``
    holds every close until the test lets them go."""

    def __init__(self, failing: set[int] = frozenset()) -> None:
        self.calls: list[tuple[str, str, object]] = []
        self.failing = failing
        self.release = threading.Event()

    def bpf_close_perf_event_fd(self, fd: int) -> int:
        self.release.wait(10)
        self.calls.append(("close", threading.current_thread().name, fd))
        return -1 if fd in self.failing else 0

    def bpf_detach_uprobe(self, ev: bytes) -> int:
        self.calls.append(("detach", threading.current_thread().name, ev))
        return 0


def test_events_leave_the_table_at_once_and_are_closed_on_the_detacher_s_thread():
    module, lib = Module({b"p_a": 5, b"r_a": 6, b"p_b": 7}), Lib()
    d = Detacher(module, lib=lib)
    d.detach([b"p_a", b"r_a", b"gone"])  # one bcc no longer holds: left alone
    assert module.uprobe_fds == {b"p_b": 7} and module.open == 1
    assert lib.calls == [], "the caller did not wait for the kernel"
    lib.release.set()
    d.close()
    assert lib.calls == [("close", "uprobe-detach", 5), ("detach", "uprobe-detach", b"p_a"),
                         ("close", "uprobe-detach", 6), ("detach", "uprobe-detach", b"r_a")]


def test_one_the_kernel_does_not_take_off_is_said_and_the_rest_still_go(caplog):
    module, lib = Module({b"p_a": 5, b"r_a": 6}), Lib(failing={5})
    lib.release.set()
    d = Detacher(module, lib=lib)
    with caplog.at_level(logging.DEBUG, logger="sitsprobe.probes.side_by_side"):
        d.detach([b"p_a", b"r_a"])
        d.close()
    assert [c[2] for c in lib.calls] == [5, 6, b"r_a"]
    assert "uprobe p_a: the kernel did not take it off" in caplog.text


def test_a_detacher_given_nothing_starts_no_thread_and_closes_at_once():
    d = Detacher(Module({}), lib=Lib())
    d.detach([])
    d.close()
    assert not [t for t in threading.enumerate() if t.name == "uprobe-detach"]
