#!/usr/bin/env bash
# Set up (idempotently) and run the whole test suite: unit tests, then the
# integration tests that load real BPF programs and drive real servers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
