#!/usr/bin/env bash
# The main job: set up .venv (no PyTorch, no model download), then evaluate the bundled sample dataset with the
# offline judge (offline:/lexical: calibrated lexical evidence, not an LLM), logging an MLflow run to the SQLite
# store ./ragjudge-quickstart.db. For an LLM judge set JUDGE, e.g. JUDGE=openai:/gpt-4o-mini with
# OPENAI_API_KEY in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true MLFLOW_MODEL_CATALOG_URI= HF_HUB_OFFLINE=1
exec .venv/bin/ragjudge quickstart --judge "${JUDGE:-offline:/lexical}" "$@"
