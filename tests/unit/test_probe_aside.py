"""The guess a start compiles for while the kernel is probed aside: what the
last probe of this boot found, kind by kind, else every hook working."""
from __future__ import annotations

import pytest

from sitsprobe.probes import probe_aside
from sitsprobe.probes.capability import KINDS, Capability


@pytest.fixture
def boot(tmp_path, monkeypatch):
    path = tmp_path / "boot_id"
    path.write_text("1f0e\n")
    monkeypatch.setattr(probe_aside, "BOOT_ID", str(path))
    return path


def test_nothing_kept_guesses_every_hook_working(tmp_path, boot):
    caps = probe_aside.guess(("main", "fentry"), str(tmp_path / "none.json"))
    assert set(caps) == {"btf", *KINDS["main"], "fentry"}
    assert all(c.ok for k, c in caps.items() if k != "btf")


def test_what_a_probe_found_is_the_next_guess_kind_by_kind(tmp_path, boot):
    path = str(tmp_path / "run" / "caps.json")  # its folder made on the way
    no_kprobe = Capability("kprobe", False, "kprobes unavailable", "CONFIG_KPROBES unset")
    probe_aside.remember({"kprobe": no_kprobe, "uprobe": Capability("uprobe", True, "fired 1x")}, path)
    probe_aside.remember({"fentry": Capability("fentry", False, "fentry unavailable", "EPERM")}, path)
    caps = probe_aside.guess(("main", "fentry"), path)
    assert caps["kprobe"] == no_kprobe and not caps["fentry"].ok and caps["uprobe"].detail == "fired 1x"
    assert caps["sock_tracepoint"].ok and caps["sock_tracepoint"].detail == "assumed, not yet probed"


def test_another_boots_or_a_broken_file_is_no_guess(tmp_path, boot):
    path = tmp_path / "caps.json"
    probe_aside.remember({"kprobe": Capability("kprobe", False, "kprobes unavailable", "x")}, str(path))
    boot.write_text("2a2a\n")  # rebooted: perhaps another kernel
    assert probe_aside.guess(("main",), str(path))["kprobe"].ok
    for junk in ("", "[]", '{"boot": "2a2a", "caps": {"kprobe": {"nope": 1}}}', '{"boot": "2a2a"}'):
        path.write_text(junk)
        assert probe_aside.guess(("main",), str(path))["kprobe"].ok, junk


def test_a_guess_that_cannot_be_kept_is_no_error(tmp_path, boot):
    (tmp_path / "file").write_text("")
    path = str(tmp_path / "file" / "caps.json")  # under a file: no folder can be made
    probe_aside.remember({"kprobe": Capability("kprobe", False, "kprobes unavailable", "x")}, path)
    assert probe_aside.guess(("main",), path)["kprobe"].detail == "assumed, not yet probed"
