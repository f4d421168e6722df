#!/usr/bin/env bash
# Set up (idempotently) and run the demo: the agent watching a local server
# under load, traces to ./sitsprobe-traces.jsonl, metrics on :9102.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
