#!/usr/bin/env bash
# The main job: set up .venv, then evaluate the bundled sample dataset, logging an MLflow run
# (SQLite store ./ragjudge-quickstart.db). Uses the offline demo judge unless JUDGE is set,
# e.g. JUDGE=openai:/gpt-4o-mini with OPENAI_API_KEY in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh local
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true MLFLOW_MODEL_CATALOG_URI= HF_HUB_OFFLINE=1
exec .venv/bin/ragjudge quickstart --judge "${JUDGE:-demo:/overlap}" "$@"
