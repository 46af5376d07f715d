#!/usr/bin/env bash
# The MLflow-facing tests on the other MLflow versions the package admits (docs/mlflow.md#mlflow-versions); run by
# scripts/test.sh after the whole suite, which runs on the MLflow the package resolves to (3.17.2 from the registries
# we use). Skip with RAGJUDGE_MLFLOW_MATRIX=0.
#
# * The newest, MLflow 3.18.0, laid over: the registries serve its `mlflow` wheel (which holds the whole code) but not
#   its `mlflow-skinny` / `mlflow-tracing` 3.18.0, so a plain install resolves to 3.17.2. The wheel goes into a folder
#   of its own (pip --target, no dependencies) put first on PYTHONPATH for .venv's python: `import mlflow` (and the
#   `mlflow server` the tests start) is then 3.18.0's code, beside 3.17.2's dependencies, as
#   `pip install --no-deps mlflow==3.18.0` would lay it over.
# * The oldest we claim, MLflow 3.14.0 (pyproject.toml: mlflow>=3.14), in a venv of its own, resolved as pip resolves it.
#
# The two steps run side by side (each its own store and log, printed in turn when both are done): most of their time
# is spent waiting on mlflow servers, SQLite and subprocesses, not on the CPU. `--prepare` only lays the overlay and
# builds the 3.14.0 venv (scripts/test.sh runs it in the background while the main suite runs), then exits.
#
# Usage: bash scripts/test_mlflow_versions.sh [--prepare | pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
NEWEST=${RAGJUDGE_MLFLOW_NEWEST:-3.18.0}
OLDEST=${RAGJUDGE_MLFLOW_OLDEST:-3.14.0}
TESTS=(tests/test_scorers.py tests/test_genai_traces.py tests/test_trace_fields.py tests/test_trace_fixtures.py
       tests/test_mlflow_compare.py tests/test_sessions.py tests/test_traces.py tests/test_evaluator.py
       tests/test_relogging.py tests/test_tracking_store.py tests/test_store_creation.py tests/test_versions.py
       tests/test_judge_noise.py tests/test_judge_report.py tests/test_monitor.py tests/test_online_scoring.py
       tests/test_hostile_labels.py)
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true MLFLOW_MODEL_CATALOG_URI= HF_HUB_OFFLINE=1

overlay=".mlflow-overlay/$NEWEST"
venv=".venv-mlflow-$OLDEST"
stamp="$venv/.ragjudge-installed-$(sha256sum pyproject.toml | cut -c1-12)"
prepare() {
  if [ ! -f "$overlay/.done" ]; then
    rm -rf "$overlay"
    .venv/bin/python -m pip install -q --no-deps --target "$overlay" "mlflow==$NEWEST"
    touch "$overlay/.done"
  fi
  if [ ! -f "$stamp" ]; then
    [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -e . "mlflow==$OLDEST" pytest pytest-timeout pytest-xdist
    touch "$stamp"
  fi
}
if [ "${1:-}" = "--prepare" ]; then
  prepare
  exit 0
fi
prepare

logs=$(mktemp -d)
run_step() {  # name python extra-env... -- pytest args
  local name=$1 python=$2
  shift 2
  MLFLOW_TRACKING_URI="sqlite:///$(mktemp -d)/mlflow.db" env "$@" \
    "$python" -m pytest -n logical --maxprocesses=4 --dist worksteal -q "${TESTS[@]}" "${ARGS[@]}" \
    > "$logs/$name.log" 2>&1
}
ARGS=("$@")
run_step newest .venv/bin/python PYTHONPATH="$PWD/$overlay${PYTHONPATH:+:$PYTHONPATH}" \
  RAGJUDGE_EXPECT_MLFLOW="$NEWEST" &
newest=$!
run_step oldest "$venv/bin/python" RAGJUDGE_EXPECT_MLFLOW="$OLDEST" &
oldest=$!
status=0
wait "$newest" || status=$?
s_newest=$status
wait "$oldest" || status=$?
echo "== the MLflow-facing tests on MLflow $NEWEST (laid over)"
cat "$logs/newest.log"
echo "== the MLflow-facing tests on MLflow $OLDEST (the oldest admitted)"
cat "$logs/oldest.log"
[ "$s_newest" -eq 0 ] || status=$s_newest
rm -rf "$logs"
exit "$status"
