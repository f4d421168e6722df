"""A service that calls others for each request it answers, as RAG front ends
do: Redis, then another HTTP service. Written the way their users write them,
with clients no one here wrote.

    python calls_app.py flask|fastapi --tag TAG --redis PORT --backend URL [--grpc HOST:PORT]

prints its port on stdout's first line, then serves until killed.

  GET /work/N   GET and SET key "work:N" in Redis, GET {backend}/ (the
                backend's own page); answers {"calls": 3} (its own tally)
  GET /rpc/N    (with --grpc) one gRPC call, /demo.Echo/Say (h2_peers.py's);
                answers {"calls": 1}

flask: the threaded development server (werkzeug), the handler on the thread
that read the request, with redis-py and requests. fastapi: uvicorn's event
loop, an async handler, with redis.asyncio and httpx.
"""
from __future__ import annotations

import argparse
import socket
import sys


def flask_app(redis_port: int, backend: str, grpc_target: str | None):
    import flask
    import redis
    import requests

    app = flask.Flask(__name__)
    cache = redis.Redis(port=redis_port)
    http = requests.Session()
    if grpc_target:
        import grpc

        say = grpc.insecure_channel(grpc_target).unary_unary("/demo.Echo/Say")

        @app.get("/rpc/<int:n>")
        def rpc(n: int):
            assert say(b"%d" % n, timeout=10) == b"%d" % n
            return {"calls": 1}

    @app.get("/work/<int:n>")
    def work(n: int):
        cache.get(f"work:{n}")
        cache.set(f"work:{n}", n)
        http.get(backend + "/").raise_for_status()
        return {"calls": 3}

    return app


def fastapi_app(redis_port: int, backend: str):
    import fastapi
    import httpx
    import redis.asyncio

    app = fastapi.FastAPI()
    cache = redis.asyncio.Redis(port=redis_port)
    http = httpx.AsyncClient()

    @app.get("/work/{n}")
    async def work(n: int):
        await cache.get(f"work:{n}")
        await cache.set(f"work:{n}", n)
        (await http.get(backend + "/")).raise_for_status()
        return {"calls": 3}

    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("framework", choices=("flask", "fastapi"))
    ap.add_argument("--tag", default="sitsprobe-testserver")
    ap.add_argument("--redis", type=int, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--grpc", help="flask: a gRPC server for /rpc/N")
    a = ap.parse_args()
    if a.framework == "flask":
        from werkzeug.serving import make_server

        server = make_server("127.0.0.1", 0, flask_app(a.redis, a.backend, a.grpc), threaded=True)
        print(server.server_port, flush=True)
        server.serve_forever()
    else:
        import uvicorn

        sock = socket.create_server(("127.0.0.1", 0))
        print(sock.getsockname()[1], flush=True)
        config = uvicorn.Config(fastapi_app(a.redis, a.backend), log_level="warning", access_log=False,
                                lifespan="off")
        uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
