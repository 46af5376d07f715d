#!/usr/bin/env bash
# Create ./.venv (if missing) and install mlflow-ragjudge with the given extras into it.
# Usage: bash scripts/setup_env.sh [EXTRAS]   (e.g. "dev,local"; none by default: the main job needs no extra)
#
# The `local` extra (BERTScore, local embeddings) needs PyTorch. It is installed first, from $TORCH_SPEC
# (default torch==2.13.0). On the machines this project is built on, that pin resolves to a CPU wheel kept in a
# local wheel folder. On an ordinary Linux machine PyPI's torch is the CUDA build (several GB): install a CPU
# build into .venv first (.venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu), which
# this script then keeps, or set TORCH_SPEC. Nothing else in the package needs torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${1:-}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=".venv/.ragjudge-installed-${EXTRAS:-base}-$(cat pyproject.toml | sha256sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  if [[ "$EXTRAS" == *local* ]] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
  fi
  if [ -n "$EXTRAS" ]; then
    .venv/bin/python -m pip install -q -e ".[$EXTRAS]"
  else
    .venv/bin/python -m pip install -q -e .
  fi
  touch "$stamp"
fi
