#!/usr/bin/env bash
# Two virtualenvs for the benchmarks: python-redis-lock and redis-lock-py both install a
# module named `redis_lock`, so redis-lock-py gets one of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv benchmarks/.venv
benchmarks/.venv/bin/pip install --quiet --upgrade pip
benchmarks/.venv/bin/pip install --quiet -e ".[embedded]" matplotlib \
  pottery aioredlock python-redis-lock
python3 -m venv benchmarks/.venv-rlp
benchmarks/.venv-rlp/bin/pip install --quiet --upgrade pip
benchmarks/.venv-rlp/bin/pip install --quiet -e . redis-lock-py
echo "ready: benchmarks/.venv/bin/python benchmarks/run.py"
