"""Serve the reference engine over the OpenAI API.

    python examples/engine/serve.py --host 127.0.0.1 --port 8000 [--device cpu|cuda]
        [--redis redis://127.0.0.1:6379/0] [--model-seed 0] [--max-batch-size 8] [--max-window-ms 10]
        [--no-markers]

Prints "listening on HOST:PORT" once it accepts requests (--port 0 picks a free port).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `examples.engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
if "--no-markers" in sys.argv[1:]:  # before the engine's modules import the markers
    os.environ["SITSPROBE_MARKERS"] = "off"

import torch  # noqa: E402

from examples.engine.api import Engine, EngineServer  # noqa: E402
from examples.engine.completion_cache import CompletionCache  # noqa: E402
from examples.engine.model import GPT, MODEL_NAME  # noqa: E402
from examples.engine.prefix_cache import PrefixCache  # noqa: E402
from examples.engine.scheduler import Scheduler  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--redis", metavar="URL", help="completion cache, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--model-seed", type=int, default=0, help="seed of the model's weights")
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-window-ms", type=float, default=10.0, help="longest batching window")
    p.add_argument("--prefix-cache-mb", type=float, default=64.0, help="0 turns the prefix cache off")
    p.add_argument("--max-queue", type=int, default=256, help="queued requests before 429")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--access-log", action="store_true", help="log each HTTP request to stderr")
    p.add_argument("--no-markers", action="store_true",
                   help="call no sitsprobe markers (SITSPROBE_MARKERS=off): the agent sees this "
                        "engine from the wire alone, like any server")
    args = p.parse_args(argv)
    if args.max_batch_size < 1 or args.max_window_ms < 0 or args.prefix_cache_mb < 0 \
            or args.max_queue < 1 or args.threads < 1:
        p.error("--max-batch-size, --max-queue and --threads must be >= 1; "
                "--max-window-ms and --prefix-cache-mb >= 0")
    return args


def build(args: argparse.Namespace) -> Engine:
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("serve: --device cuda, but torch sees no CUDA device (torch "
                 f"{torch.__version__}); use --device cpu or a CUDA build of torch")
    torch.set_num_threads(args.threads)
    model = GPT(seed=args.model_seed).to(args.device).eval()
    with torch.inference_mode():  # warm up, so the first request pays no lazy initialisation
        model.generate_greedy([256, 104, 105], 2)
    prefix = PrefixCache(max_bytes=int(args.prefix_cache_mb * (1 << 20))) if args.prefix_cache_mb > 0 else None
    scheduler = Scheduler(model, max_batch_size=args.max_batch_size, max_window_ms=args.max_window_ms,
                          prefix_cache=prefix, max_queue=args.max_queue)
    cache = None
    if args.redis:
        try:
            cache = CompletionCache(args.redis, f"{MODEL_NAME}/seed={args.model_seed}")
        except (ImportError, ValueError) as e:
            sys.exit(f"serve: --redis {args.redis}: {e} (expected redis://HOST:PORT/DB, and redis-py installed)")
    return Engine(model, scheduler, cache)


def main(argv=None) -> int:
    args = parse_args(argv)
    engine = build(args)
    try:
        server = EngineServer((args.host, args.port), engine, access_log=args.access_log)
    except OSError as e:
        sys.exit(f"serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}")
    engine.scheduler.start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    host, port = server.server_address[:2]
    print(f"listening on {host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        engine.scheduler.stop()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
