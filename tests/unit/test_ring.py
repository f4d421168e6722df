"""When the agent is woken to drain its rings: ring.wake_bytes and RingWait."""
import os

import pytest

from sitsprobe.probes.ring import RingWait, wake_bytes


@pytest.mark.parametrize("ring_bytes", [4096, 1 << 20, 3 << 20, 8 << 20, 64 << 20])
@pytest.mark.parametrize("cpus", [1, 2, 3, 16, 64, 1024])
def test_a_wakeup_comes_before_a_quarter_of_the_ring_is_used(ring_bytes, cpus):
    every = wake_bytes(ring_bytes, cpus)
    assert every & (every - 1) == 0 and every >= 8  # a power of two, at least a record's header
    if ring_bytes // (4 * cpus) >= 8:
        # every CPU one byte short of its next wakeup holds at most a quarter of the ring,
        # and not much less: the next power of two would be too many
        assert cpus * every <= ring_bytes // 4 < cpus * every * 2


def test_the_wait_ends_on_a_wakeup_and_not_on_what_is_left_unread():
    """Edge-triggered: a file that says it is readable (a ring woken) ends one
    wait; left unread, it ends none after it, as a ring's events submitted
    without a wakeup must not. A level-triggered wait would end every time."""
    r, w = os.pipe()
    rings = RingWait([r])
    try:
        assert rings.wait(0.05) is False
        os.write(w, b"x")
        assert rings.wait(5) is True
        assert rings.wait(0.05) is False  # still readable, nothing new
        os.write(w, b"y")
        assert rings.wait(5) is True
        rings.add([r])  # added twice: still one registration
        assert rings.wait(0.05) is False
    finally:
        rings.close()
        os.close(r)
        os.close(w)
