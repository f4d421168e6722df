"""The agent's metrics port: the exposition at /metrics and /metrics/inference,
/healthz, its pages, a page's bad query as a 400, and a 404 for anything else."""
from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from sitsprobe.export.prom import serve


@pytest.fixture
def server():
    registry = CollectorRegistry()
    Counter("demo_requests", "requests", registry=registry).inc(3)

    def page(query):
        if "bad" in query:
            raise ValueError("bad: not a parameter this page takes")
        return b"page\n"
    s = serve(registry, "127.0.0.1", 0, lambda: True, {"/page.txt": ("text/plain", page)})
    yield f"http://127.0.0.1:{s.server_address[1]}"
    s.close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_exposition_is_at_both_paths(server):
    for path in ("/metrics", "/metrics/inference"):
        code, body = get(server + path)
        assert code == 200 and "demo_requests_total 3.0" in body, path


def test_health_pages_and_unknown_paths(server):
    assert get(server + "/healthz") == (200, "ok\n")
    assert get(server + "/page.txt") == (200, "page\n")
    assert get(server + "/page.txt?bad=1") == (400, "bad: not a parameter this page takes\n")
    for path in ("/", "/nope", "/metricsx", "/metrics/other"):
        code, body = get(server + path)
        assert code == 404 and f"no page {path};" in body and "/metrics/inference" in body, path


def test_close_ends_the_serving_thread_and_the_port():
    s = serve(CollectorRegistry(), "127.0.0.1", 0, lambda: True)
    url = f"http://127.0.0.1:{s.server_address[1]}"
    assert get(url + "/healthz") == (200, "ok\n")
    before = {t.name for t in threading.enumerate()}
    s.close()
    assert "metrics" in before and "metrics" not in {t.name for t in threading.enumerate()}
    with pytest.raises(urllib.error.URLError):
        get(url + "/healthz")
