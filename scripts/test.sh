#!/usr/bin/env bash
# The test suite: set up .venv with the dev and local extras, lint, then run pytest (offline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh "dev,local"
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true MLFLOW_MODEL_CATALOG_URI= HF_HUB_OFFLINE=1
export MLFLOW_TRACKING_URI="sqlite:///$(mktemp -d)/mlflow.db"
.venv/bin/ruff check mlflow_ragjudge tests benchmarks experiments
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
