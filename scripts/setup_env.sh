#!/usr/bin/env bash
# Create ./.venv (if missing) and install mlflow-ragjudge with the given extras into it.
# Usage: source-free; called by quickstart.sh and test.sh.  EXTRAS defaults to "local".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${1:-local}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=".venv/.ragjudge-installed-$EXTRAS-$(cat pyproject.toml | sha256sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first, pinned to the CPU build (a bare "torch" would pull a multi-GB CUDA build)
  if [[ "$EXTRAS" == *local* ]]; then
    .venv/bin/python -m pip install -q "torch==2.13.0"
  fi
  .venv/bin/python -m pip install -q -e ".[$EXTRAS]"
  touch "$stamp"
fi
