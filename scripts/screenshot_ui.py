"""Log two RAG variants to a real local `mlflow server` and screenshot the UI's run comparison.

Usage (needs Debian's chromium: `apt-get install chromium`):

    .venv/bin/python scripts/screenshot_ui.py [--out docs/img/mlflow-compare-runs.png]

Everything runs on 127.0.0.1 with the offline judge (offline:/lexical); the server and its store live in a temp
dir and are removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from importlib import resources
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from mlflow_ui import chromium, start_server  # noqa: E402


def log_variants(url: str) -> tuple[str, list[str]]:
    import mlflow

    mlflow.set_tracking_uri(url)
    exp = mlflow.set_experiment("ragjudge-variants")
    with resources.as_file(resources.files("mlflow_ragjudge") / "data" / "sample_rag.jsonl") as p:
        df = pd.read_json(p, lines=True, dtype=False).drop(columns=["group"])
    better = df.copy()
    # variant B: a generator that follows the reference more closely (stands in for a better prompt)
    better["answer"] = [r if i % 2 == 0 else a for i, (a, r) in enumerate(zip(df["answer"], df["reference"]))]
    run_ids = []
    for name, data in (("prompt=zero-shot", df), ("prompt=cot", better)):
        with mlflow.start_run(run_name=name) as run:
            mlflow.models.evaluate(data=data, predictions="answer", targets="reference", model_type="rag",
                                   evaluators="ragjudge",
                                   evaluator_config={"judge": "offline:/lexical", "cache": False, "bertscore": False,
                                                     "metrics": ["correctness", "lexical"]})
            run_ids.append(run.info.run_id)
    return exp.experiment_id, run_ids


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/img/mlflow-compare-runs.png")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RAGJUDGE_CACHE_DIR"] = str(Path(tmp) / "cache")
        proc, url = start_server(Path(tmp))
        try:
            exp_id, run_ids = log_variants(url)
            page = (f"{url}/#/compare-runs?runs={json.dumps(run_ids)}&experiments={json.dumps([exp_id])}")
            chromium(page.replace(" ", ""), screenshot=out, height=2300)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
