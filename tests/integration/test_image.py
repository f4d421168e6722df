"""Issue 14, "the image is built and run here": scripts/image.sh builds
deploy/Dockerfile with Debian's podman on a Debian base made with mmdebstrap,
runs the Helm chart's pod with it (scripts/daemonset_podman.py) against a
server on the host, and checks /healthz and the agent's count of that
server's requests."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from .conftest import ROOT

TOOLS = ("podman", "runc", "mmdebstrap")


def test_the_image_is_built_and_run_as_the_daemonset_and_counts_a_host_servers_requests():
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"the image is not built: {', '.join(missing)} not installed (scripts/setup.sh installs them)")
    r = subprocess.run(["bash", "scripts/image.sh"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    print(r.stdout, r.stderr[-3000:], sep="\n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^image: build .* MB$", r.stdout, re.M), r.stdout
    assert re.search(r"^image: run .*/healthz 200", r.stdout, re.M), r.stdout
    counted = re.search(r"^image: check .* (\d+) of (\d+) requests counted for pid \d+$", r.stdout, re.M)
    assert counted and counted[1] == counted[2], r.stdout
