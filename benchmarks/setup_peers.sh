#!/usr/bin/env bash
# Create the peer tools' virtualenvs for benchmarks/bench_vs_peers.py (idempotent) and print their pythons.
# ragas, deepeval and MLflow's own genai judges (mlflow.genai built-in scorers).
#
#   bash benchmarks/setup_peers.sh            # both peers
#   bash benchmarks/setup_peers.sh ragas      # one of them
#
# Where: ${PEERS_DIR:-$HOME/.cache/ragjudge-peers}/{ragas,deepeval}. Each venv is separate from the
# project's .venv (the peers bring their own openai, langchain, instructor ... versions).
#   ragas    : ragas==0.4.3 langchain-community==0.4.1 (0.4.2 dropped chat_models.vertexai, which
#              ragas 0.4.3 imports at start-up)
#   deepeval : deepeval==4.3.1
#   mlflow   : mlflow==3.17.2 (its genai built-in scorers; a venv of its own, like the others, so the peer runs
#              exactly the pinned release and nothing of ours)
# A venv is (re)installed only when its stamp file for these pins is missing, so a second run is quick.
# PYTHON picks the interpreter the venvs are made from (default python3).
#
# Telemetry: the benchmark's workers run with DEEPEVAL_TELEMETRY_OPT_OUT=YES, RAGAS_DO_NOT_TRACK=true (and
# the other switches listed in bench_vs_peers.py); this script only installs packages from PyPI.
set -euo pipefail

PEERS_DIR=${PEERS_DIR:-$HOME/.cache/ragjudge-peers}
PY=${PYTHON:-python3}
export DEEPEVAL_TELEMETRY_OPT_OUT=YES RAGAS_DO_NOT_TRACK=true DO_NOT_TRACK=1 PIP_DISABLE_PIP_VERSION_CHECK=1

declare -A PINS=(
  [ragas]="ragas==0.4.3 langchain-community==0.4.1"
  [deepeval]="deepeval==4.3.1"
  [mlflow]="mlflow==3.17.2"
)

wanted=("$@")
if [ ${#wanted[@]} -eq 0 ]; then
  wanted=(ragas deepeval mlflow)
fi

for tool in "${wanted[@]}"; do
  pins=${PINS[$tool]:-}
  if [ -z "$pins" ]; then
    echo "unknown peer '$tool' (known: ${!PINS[*]})" >&2
    exit 2
  fi
  venv="$PEERS_DIR/$tool"
  stamp="$venv/.installed-$(printf '%s' "$pins" | sha256sum | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    mkdir -p "$PEERS_DIR"
    if [ ! -x "$venv/bin/python" ]; then
      "$PY" -m venv "$venv"
    fi
    echo "installing $pins into $venv ..." >&2
    # shellcheck disable=SC2086 # the pins are separate words
    "$venv/bin/python" -m pip install -q $pins >&2
    touch "$stamp"
  fi
  # the import must work offline (ragas and deepeval both import a lot at start-up)
  "$venv/bin/python" -c "import $tool" >&2
  echo "$tool=$venv/bin/python"
done
