"""probes.retry.soon and compiler.kernel_load: which failures are tried again, how
often, and what is raised. The kernel's refusals are given as bcc words them."""
from __future__ import annotations

import errno
import os
import threading

import pytest

from sitsprobe.errors import ProbeLoadError
from sitsprobe.probes import retry
from sitsprobe.probes.compiler import StderrRead, kernel_load


class Attempt:
    def __init__(self, *failures: str):
        self.failures, self.calls = list(failures), 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise Exception(self.failures.pop(0))
        return "loaded"


def bcc_says(code: int, program: str = "sock_io") -> str:
    return f"Failed to load BPF program b'{program}': {os.strerror(code)}"


@pytest.fixture
def waits(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", slept.append)
    return slept


def test_refusals_for_the_moment_are_tried_again_after_growing_pauses(waits):
    attempt = Attempt(bcc_says(errno.EAGAIN), bcc_says(errno.EINTR), bcc_says(errno.ENOMEM))
    assert kernel_load(attempt, "sock_io") == "loaded"
    assert attempt.calls == 4 and waits == list(retry.SOON_S[:3])


@pytest.mark.parametrize("failure", [bcc_says(errno.EACCES), bcc_says(errno.EINVAL), bcc_says(errno.E2BIG),
                                     "Need super-user privileges to run", "Failed to compile BPF module b'x.c'"])
def test_other_failures_are_raised_at_once(waits, failure):
    attempt = Attempt(failure)
    with pytest.raises(Exception) as e:
        kernel_load(attempt, "sock_io")
    assert attempt.calls == 1 and waits == []
    if failure.startswith("Failed to load BPF program"):  # one line for the CLI, the kernel's words last
        assert type(e.value) is ProbeLoadError and e.value.program == "sock_io"
        assert str(e.value) == failure.replace("b'sock_io'", "sock_io")
    else:
        assert type(e.value) is Exception and str(e.value) == failure


def test_a_refusal_through_every_try_is_raised_as_the_kernel_said_it(waits):
    attempt = Attempt(*[bcc_says(errno.EBUSY)] * 10)
    with pytest.raises(ProbeLoadError) as e:
        kernel_load(attempt, "sock_io")
    assert attempt.calls == len(retry.SOON_S) + 1 and waits == list(retry.SOON_S)
    assert e.value.reason == os.strerror(errno.EBUSY) and retry.refused_for_now(e.value)


def test_what_is_printed_on_stderr_while_it_is_read_is_kept_and_printed_again(capfd):
    """compiler.StderrRead: bcc's C code says which map the kernel did not
    make on fd 2 only; what was printed there within the block (by any
    thread) is kept for the agent to read and still reaches stderr, after it."""
    said = StderrRead()
    with said:
        os.write(2, b"could not open bpf map: bodies, error: Cannot allocate memory\n")
        meanwhile = threading.Thread(target=os.write, args=(2, b"a log line meanwhile\n"))
        meanwhile.start()
        meanwhile.join()
    os.write(2, b"after\n")
    assert said.text == b"could not open bpf map: bodies, error: Cannot allocate memory\na log line meanwhile\n"
    assert capfd.readouterr().err == said.text.decode() + "after\n"
