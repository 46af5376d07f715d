"""Run the quickstart's sweep against a real local `mlflow server` and screenshot the MLflow UI (docs/img).

Usage (needs Debian's chromium: `apt-get install chromium`):

    .venv/bin/python scripts/screenshot_ui.py [--out-dir docs/img]

Writes ``sweep-runs.png`` (the experiment's runs view, the parent run expanded to its three children, with their
metrics), ``sweep-charts.png`` (the experiment's chart view, opening on the headline metrics),
``sweep-comparison.png`` (the parent run's ``ragjudge/comparison.json`` as the UI shows it),
``mlflow-compare-runs.png`` (the UI's run comparison of the three children), ``traces-tab.png`` (a variant's rows as
traces with their assessments) and ``compare-to-baseline.png`` (the Evaluation runs page comparing that variant to
the baseline row by row). Everything runs on 127.0.0.1 with the
offline judge (offline:/lexical); the server and its store live in a temp dir and are removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from mlflow_ui import CLOSE_ASSISTANT, EXPAND_PARENT_RUN, browse, start_server  # noqa: E402


def run_sweep(url: str) -> tuple[str, str, list[str]]:
    """The quickstart's sweep; returns the experiment, the parent run and the children (the baseline first)."""
    import mlflow

    from mlflow_ragjudge import sweep
    from mlflow_ragjudge.cli import QUICKSTART_VARIANTS
    from mlflow_ragjudge.workflows import example_rag

    result = sweep(example_rag.answer, list(QUICKSTART_VARIANTS), example_rag.sample_questions(),
                   retriever=example_rag.retrieve, data_name="ragjudge-sample", experiment="ragjudge-quickstart",
                   evaluator_config={"judge": "offline:/lexical", "bertscore": False, "progress": False},
                   tracking_uri=url, run_name="quickstart-offline-lexical")
    exp = mlflow.get_experiment_by_name("ragjudge-quickstart").experiment_id
    return exp, result.parent_run_id, list(result.run_ids.values())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default="docs/img")
    args = ap.parse_args()
    out = Path(args.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RAGJUDGE_CACHE_DIR"] = str(Path(tmp) / "cache")
        proc, url = start_server(Path(tmp))
        try:
            exp, parent, children = run_sweep(url)
            browse(f"{url}/#/experiments/{exp}/runs", clicks=(CLOSE_ASSISTANT, EXPAND_PARENT_RUN),
                   screenshot=out / "sweep-runs.png", width=2100, height=520)
            browse(f"{url}/#/experiments/{exp}/runs?compareRunsMode=CHART", clicks=(CLOSE_ASSISTANT, EXPAND_PARENT_RUN),
                   until=("_headline/correctness",), screenshot=out / "sweep-charts.png", width=1900, height=820)
            browse(f"{url}/#/experiments/{exp}/runs/{parent}/artifacts/ragjudge/comparison.json",
                   clicks=(CLOSE_ASSISTANT,), screenshot=out / "sweep-comparison.png", width=2300, height=900)
            page = f"{url}/#/compare-runs?runs={json.dumps(children)}&experiments={json.dumps([exp])}"
            browse(page.replace(" ", ""), clicks=(CLOSE_ASSISTANT,), screenshot=out / "mlflow-compare-runs.png",
                   width=1600, height=2300)
            # every row a trace: a variant's Traces tab, and the variant compared to the baseline row by row
            browse(f"{url}/#/experiments/{exp}/runs/{children[-1]}/traces", clicks=(CLOSE_ASSISTANT,),
                   screenshot=out / "traces-tab.png", width=1900, height=1000, until=("correctness",))
            browse(f"{url}/#/experiments/{exp}/evaluation-runs?selectedRunUuid={children[-1]}"
                   f"&compareToRunUuid={children[0]}", clicks=(CLOSE_ASSISTANT,),
                   screenshot=out / "compare-to-baseline.png", width=1900, height=1000, until=("Comparing",))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"wrote {out / 'sweep-runs.png'}, {out / 'sweep-charts.png'}, {out / 'sweep-comparison.png'}, "
          f"{out / 'mlflow-compare-runs.png'}, {out / 'traces-tab.png'}, {out / 'compare-to-baseline.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
