"""Engine markers end to end: real uprobes on the real library, engines in
subprocesses making a known, odd number of each call. Other engines on the
machine may call markers too (the probe accepts every process that loads the
library), so each check keeps only the events of its own engine."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from sitsprobe import markers, tracefs

from .conftest import ROOT, require_root, wait_until

pytestmark = pytest.mark.integration

ENGINE = """
import sys
from sitsprobe import markers
assert markers.library_path(), "the marker library did not build"
print(markers.library_path(), flush=True)
sys.stdin.readline()  # wait until told to go
for i in range(1, 8):  # 7 requests
    with markers.request(1000 + i, 40 + i, model="tiny-gpt"):
        markers.usage(1000 + i, input_tokens=i, output_tokens=2 * i, kv_bytes=i << 20)
for i in range(13):  # 13 ranges, the first one over a batch of 20 requests
    ids = [1000 + j for j in range(20)] if i == 0 else ()
    with markers.range(f"stage-{i}", request_id=0 if ids else 1001, batch_id=77 if ids else 0,
                       request_ids=ids):
        pass
for i in range(5):  # 5 cache look-ups, 2 hits
    markers.cache_get("prefix", f"tenant/{i}", hit=i in (1, 3), request_id=1001)
markers.cache_get("prefix", "k" * 100, hit=False, request_id=2**63 + 5)
with markers.range("wide", batch_id=2**64 - 1, request_ids=list(range(300))):
    pass
markers._range_end(1001, 0, b"never-begun")  # counted in the kernel, not sent
markers._range_begin(1001, 0, b"queue")  # left open: the kernel holds it
"""


class Engine:
    """An engine subprocess that maps the library, then makes its calls on go()."""

    def __init__(self, env: dict | None = None):
        self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(ENGINE)], cwd=ROOT,
                                     env={**os.environ, **(env or {})}, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.library = self.proc.stdout.readline().strip()
        self.pid = self.proc.pid
        assert self.library, "the engine did not start"

    def go(self):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.wait(60) == 0


class Seen:
    def __init__(self):
        self.events = []

    def __call__(self, e):
        self.events.append(e)

    def of(self, pid: int) -> list:
        return [e for e in self.events if e.tgid == pid]


@pytest.fixture(scope="module")
def probe():
    require_root()
    from sitsprobe.probes.markers import MarkerProbe

    assert markers.library_path(), "the marker library did not build in the test process"
    seen = Seen()
    p = MarkerProbe(markers.library_path(), seen)
    p.seen = seen
    yield p
    p.close()


def collect(probe, pid: int, n: int) -> list:
    def enough():
        probe.poll(50)
        return len(probe.seen.of(pid)) >= n

    wait_until(enough, 15, f"{n} marker events from pid {pid} (have {len(probe.seen.of(pid))})")
    probe.poll(50)
    return probe.seen.of(pid)


# 7 x (request_begin, usage, request_end) + 13 ranges (one event each, its begin
# joined in the kernel) + 1 batch + 6 cache gets + the wide batch and its range
EXPECTED = 21 + 13 + 1 + 6 + 2


def check_engine_events(events: list) -> None:
    kinds = Counter(e.kind for e in events)
    assert kinds == {"request_begin": 7, "request_end": 7, "usage": 7, "range": 14, "batch": 2,
                     "cache_get": 6}, kinds
    begins = [e for e in events if e.kind == "request_begin"]
    assert [(e.request_id, e.fd, e.name) for e in begins] == \
        [(1000 + i, 40 + i, "tiny-gpt") for i in range(1, 8)]
    usage = [e for e in events if e.kind == "usage"]
    assert [(e.request_id, e.input_tokens, e.output_tokens, e.kv_bytes) for e in usage] == \
        [(1000 + i, i, 2 * i, i << 20) for i in range(1, 8)]
    batches = [e for e in events if e.kind == "batch"]
    assert batches[0].batch_id == 77 and batches[0].request_ids == tuple(range(1000, 1020))
    assert batches[1].batch_id == 2**64 - 1 and batches[1].request_ids == tuple(range(256))
    ranges = [e for e in events if e.kind == "range"]
    assert [(e.name, e.request_id, e.batch_id) for e in ranges] == \
        [("stage-0", 0, 77)] + [(f"stage-{i}", 1001, 0) for i in range(1, 13)] + [("wide", 0, 2**64 - 1)]
    requests_done = max(e.ts_ns for e in events if e.kind == "request_end")
    assert all(requests_done < e.begin_ns <= e.ts_ns for e in ranges), ranges  # both times, each its own
    gets = [e for e in events if e.kind == "cache_get"]
    assert [(e.name, e.key, e.hit, e.request_id) for e in gets[:5]] == \
        [("prefix", f"tenant/{i}", i in (1, 3), 1001) for i in range(5)]
    assert gets[5].key == "k" * 64 and gets[5].request_id == 2**63 + 5
    assert all(e.ts_ns > 0 and e.tid == e.tgid for e in events)
    assert [e.ts_ns for e in events] == sorted(e.ts_ns for e in events)


def test_an_engine_started_after_the_probe_is_seen_exactly(probe):
    before = probe.counters()
    engine = Engine()
    engine.go()
    check_engine_events(collect(probe, engine.pid, EXPECTED))
    after = probe.counters()
    assert after["lost"] == before["lost"]
    assert after["batch_ids_dropped"] - before["batch_ids_dropped"] == 300 - 256
    assert after["keys_cut"] - before["keys_cut"] >= 1
    assert after["ranges_unmatched"] - before["ranges_unmatched"] == 1
    assert (engine.pid, "queue") in probe.open_ranges()


def test_an_engine_already_running_when_the_probe_attaches_is_seen(probe, tmp_path):
    """Its library was built in its own cache folder: the agent finds it in
    /proc/<pid>/maps and attaches to it while the engine runs."""
    engine = Engine({"SITSPROBE_MARKERS_DIR": str(tmp_path)})
    assert Path(engine.library).parent == tmp_path
    assert engine.library in wait_until(lambda: markers_libraries_with(engine.library), 10,
                                        "the engine's library in /proc/*/maps")
    assert probe.attach(engine.library) is True
    assert probe.attach(engine.library) is False  # the same file: attached once
    engine.go()
    check_engine_events(collect(probe, engine.pid, EXPECTED))
    os.unlink(engine.library)  # the engine is gone and its cache cleaned: detach still works
    assert probe.detach(engine.library) and engine.library not in probe.libraries
    assert not probe.detach(engine.library)


def test_a_library_without_every_marker_is_refused_whole(probe, tmp_path):
    src = tmp_path / "half.c"
    src.write_text("void sitsprobe_request_begin(void) {}\nvoid sitsprobe_request_end(void) {}\n")
    lib = tmp_path / "libsitsprobe_markers-half.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    from sitsprobe.errors import ProbeAttachError

    events = set(probe._bpf.uprobe_fds)
    with pytest.raises(ProbeAttachError, match="sitsprobe_range_begin"):
        probe.attach(str(lib))
    assert set(probe._bpf.uprobe_fds) == events and str(lib) not in probe.libraries


def markers_libraries_with(path: str):
    from sitsprobe.probes.markers import find_marker_libraries

    found = find_marker_libraries()
    return found if path in found else None


def test_close_leaves_nothing_behind():
    require_root()
    from sitsprobe.probes.markers import MarkerProbe

    fds_before = len(tracefs.bpf_fds())
    p = MarkerProbe(markers.library_path(), lambda e: None)
    assert len(tracefs.bpf_fds()) > fds_before
    p.close()
    assert len(tracefs.bpf_fds()) == fds_before
    assert tracefs.leftovers() == []
    with open(os.path.join(tracefs.tracefs_path(), "uprobe_events")) as f:
        assert "libsitsprobe_markers" not in f.read()


CALLER = """
import os, sys
from sitsprobe import markers
os.sched_setaffinity(0, {0})  # one CPU: its count of the ring's bytes is what wakes
print(markers.library_path(), flush=True)
for line in sys.stdin:
    for i in range(int(line)):
        markers.cache_get("prefix", f"key/{i}", hit=True, request_id=7)
    print("done", flush=True)
"""


def test_the_ring_wakes_the_agent_when_it_could_fill_not_per_event():
    """bpf/ring_wake.h: a few events leave the agent asleep (they wait for its
    tick); a CPU writing more than ring.wake_bytes wakes it at once."""
    require_root()
    from sitsprobe.probes.markers import MarkerProbe
    from sitsprobe.probes.ring import RingWait, wake_bytes

    seen = Seen()
    pages = 16  # 64 KiB: a wakeup every 8 KiB a CPU writes on 2 CPUs
    p = MarkerProbe(markers.library_path(), seen, ring_pages=pages)
    rings = RingWait(p.ring_fds())
    caller = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CALLER)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert caller.stdout.readline().strip() == markers.library_path()

        def calls(n: int) -> None:
            caller.stdin.write(f"{n}\n")
            caller.stdin.flush()
            assert caller.stdout.readline() == "done\n"

        calls(3)
        assert rings.wait(0.3) is False, "three events woke the agent"
        p.consume()
        assert len(seen.of(caller.pid)) == 3
        # struct marker_event is 224 to 512 bytes: this many write more than a
        # wakeup's worth, so cross its threshold, and fill less than half the ring
        n = wake_bytes(pages * 4096) // 224 + 1
        assert n * 512 < pages * 4096 // 2
        calls(n)
        assert rings.wait(5) is True, f"{n} events on one CPU did not wake the agent"
        p.consume()
        assert len(seen.of(caller.pid)) == 3 + n and p.counters()["lost"] == 0
    finally:
        caller.stdin.close()
        caller.wait(10)
        rings.close()
        p.close()
