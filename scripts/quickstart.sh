#!/usr/bin/env bash
# The main job: set up .venv (no PyTorch, no model download), then run a variant sweep -- three variants of the
# bundled example RAG system (BM25 + an extractive generator) over the 40 bundled questions, judged by the offline
# judge (offline:/lexical: calibrated lexical evidence, not an LLM) -- logged to the SQLite store
# ./ragjudge-quickstart.db as a parent run with the paired comparison and one child run per variant. It ends with
# the command that opens the MLflow UI and the label-sample command that starts calibrating the judge with your own
# labels (docs/calibration.md). For an LLM judge set JUDGE, e.g. JUDGE=openai:/gpt-4o-mini with OPENAI_API_KEY set.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true MLFLOW_MODEL_CATALOG_URI= HF_HUB_OFFLINE=1
exec .venv/bin/ragjudge quickstart --judge "${JUDGE:-offline:/lexical}" "$@"
