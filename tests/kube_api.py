"""A Kubernetes API server on loopback, as far as the agent reads it: the pod
list and watch (field selector honoured), and GET of a ReplicaSet, answering
with the API's real JSON shapes (tests/fixtures/k8s). Watches stream the
events `push` queues, then end after a second, as a server's timeout would."""
from __future__ import annotations

import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "k8s"


class FakeKubeApi:
    def __init__(self, pods: dict | None = None):
        self.pods = pods or json.loads((FIXTURES / "pods.json").read_text())
        rs = json.loads((FIXTURES / "replicaset.json").read_text())
        self.replicasets = {(rs["metadata"]["namespace"], rs["metadata"]["name"]): rs}
        self.requests: list[str] = []
        self._events: queue.Queue = queue.Queue()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                api.requests.append(self.path)
                url = urlsplit(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                parts = url.path.strip("/").split("/")
                if url.path == "/api/v1/pods":
                    node = q.get("fieldSelector", "").removeprefix("spec.nodeName=")
                    if q.get("watch") in ("true", "1"):
                        return self._watch(node)
                    items = [p for p in api.pods["items"] if p["spec"].get("nodeName") == node]
                    return self._json({**api.pods, "items": items})
                if parts[:3] == ["apis", "apps", "v1"] and len(parts) == 7 and parts[5] == "replicasets":
                    rs = api.replicasets.get((parts[4], parts[6]))
                    if rs is not None:
                        return self._json(rs)
                self._json({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                            "code": 404}, 404)

            def end_headers(self):  # a connection per request: once closed, the API is gone for all
                self.send_header("Connection", "close")
                self.close_connection = True
                super().end_headers()

            def _json(self, body: dict, code: int = 200):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _watch(self, node: str):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                deadline = time.monotonic() + 1.0
                while time.monotonic() < deadline:
                    try:
                        kind, pod = api._events.get(timeout=0.1)
                    except queue.Empty:
                        continue
                    if pod["spec"].get("nodeName") != node:
                        continue
                    line = json.dumps({"type": kind, "object": pod}).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def push(self, kind: str, pod: dict) -> None:
        """An event for the next (or current) watch; the pod list follows it."""
        items = [p for p in self.pods["items"] if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        self.pods = {**self.pods, "items": items + ([pod] if kind != "DELETED" else [])}
        self._events.put((kind, pod))

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "agent", "user": {"token": "not-checked"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "agent"}}]}))
        return path

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
