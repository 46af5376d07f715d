"""What logging every row as an MLflow trace costs (issue 28).

Usage (from the repository root, the project's venv)::

    python benchmarks/bench_traces.py                 # 2,000 rows, SQLite and a real `mlflow server`
    python benchmarks/bench_traces.py --rows 500 --stores sqlite
    python benchmarks/bench_traces.py --json out.json

One evaluation (the offline judge on the bundled sample, repeated to ``--rows`` rows) is logged into fresh runs
three ways, interleaved over ``--rounds`` rounds on each store:

* ``traces=0``: metrics, params, the per-row table, transcripts, config (what a run logged before traces);
* ``traces=N``: the same, then every row as a trace with its assessments (``mlflow_ragjudge.adapters.traces``:
  one ``start_trace`` per row carrying its assessments, spans batched);
* MLflow's own way, on ``--peer-rows`` rows: a trace per row through ``mlflow.start_span`` and one
  ``mlflow.log_assessment`` per assessment (what ``mlflow.genai.evaluate`` does for a static dataset), scaled to
  per-row time.

Two metric sets: ``judged`` (correctness, faithfulness, context precision / recall / relevance, the lexical
metrics: 11 assessments and the reference per row) and ``all`` (everything the sample supports, with retrieval
at k = 1, 3, 5, 10: 36 assessments and the reference). The trace cost is reported per row and against the time
the offline evaluation itself took.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_MODEL_CATALOG_URI", "")
# MLflow's way writes each trace synchronously, so that its time is the trace's (and a SQLite store is not written
# from the exporter's thread while the next row starts)
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")

JUDGED = ["correctness", "faithfulness", "context_precision", "context_recall", "context_relevance", "lexical"]


def frame(n: int):
    import pandas as pd

    from mlflow_ragjudge.workflows import example_rag

    base = example_rag.sample_questions()
    df = pd.concat([base] * (n // len(base) + 1)).head(n).reset_index(drop=True)
    df["question"] = [f"{q} (#{i})" for i, q in enumerate(df["question"])]
    outs = [example_rag.answer(q) for q in df["question"]]
    for key in ("answer", "contexts", "retrieved_doc_ids"):
        df[key] = [o[key] for o in outs]
    return df


def with_traces(out, n: int):
    import copy

    other = copy.copy(out)
    other.config = {**out.config, "config": {**out.config["config"], "traces": n}}
    return other


def log_once(out, experiment: str) -> float:
    import mlflow

    from mlflow_ragjudge.adapters.run_log import log_output

    mlflow.set_experiment(experiment)
    with mlflow.start_run() as run:
        t0 = time.perf_counter()
        log_output(out, run.info.run_id)
        return time.perf_counter() - t0


def mlflow_way(out, rows: int, experiment: str) -> float:
    """A trace per row as MLflow's own evaluation writes one: a span, then one log_assessment per assessment."""
    import math

    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType, Expectation, Feedback

    mlflow.set_experiment(experiment)
    table = out.table
    scores = [c for c in table.columns if c.endswith("/score")]
    with mlflow.start_run():
        t0 = time.perf_counter()
        for i in range(rows):
            with mlflow.start_span(name="row", span_type="CHAIN") as span:
                span.set_inputs({"question": table["question"].iloc[i]})
                span.set_outputs(table["answer"].iloc[i])
            tid = span.trace_id
            for col in scores:
                v = table[col].iloc[i]
                v = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
                if v is None:
                    continue
                mlflow.log_assessment(tid, Feedback(name=col[:-6], value=v, source=AssessmentSource(
                    source_type=AssessmentSourceType.CODE, source_id="bench")))
            mlflow.log_assessment(tid, Expectation(name="expected_response", value=table["reference"].iloc[i]))
        return time.perf_counter() - t0


def run_store(label: str, uri: str, outs: dict, args, results: dict) -> None:
    import mlflow

    mlflow.set_tracking_uri(uri)
    os.environ["MLFLOW_TRACKING_URI"] = uri
    for set_name, (out, eval_seconds) in outs.items():
        base, traced, peer = [], [], []
        for r in range(args.rounds):
            base.append(log_once(with_traces(out, 0), f"bench-{set_name}-base"))
            traced.append(log_once(with_traces(out, args.rows), f"bench-{set_name}-traced"))
            if args.peer_rows:
                peer.append(mlflow_way(out, args.peer_rows, f"bench-{set_name}-mlflow"))
            print(f"  [{label} {set_name} round {r + 1}] base {base[-1]:.2f} s, with traces {traced[-1]:.2f} s"
                  + (f", MLflow's way {peer[-1]:.2f} s for {args.peer_rows} rows" if peer else ""), flush=True)
        b, t = statistics.median(base), statistics.median(traced)
        cost = (t - b) / args.rows
        entry = {"store": label, "metrics": set_name, "rows": args.rows, "assessments_per_row": out_assessments(out),
                 "log_without_traces_s": round(b, 2), "log_with_traces_s": round(t, 2),
                 "traces_ms_per_row": round(cost * 1000, 2), "offline_evaluation_s": round(eval_seconds, 2),
                 "traces_vs_evaluation": round((t - b) / eval_seconds, 2)}
        if peer:
            per_row = statistics.median(peer) / args.peer_rows
            entry["mlflow_way_ms_per_row"] = round(per_row * 1000, 2)
            entry["ours_vs_mlflow_way"] = round(cost / per_row, 3)
        results.setdefault("results", []).append(entry)
        print(json.dumps(entry), flush=True)


def out_assessments(out) -> int:
    return sum(1 for c in out.table.columns if c.endswith("/score")) + ("reference" in out.table.columns)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--peer-rows", type=int, default=50, help="rows logged MLflow's way (0: skip)")
    ap.add_argument("--stores", default="sqlite,server")
    ap.add_argument("--json")
    args = ap.parse_args()

    from mlflow_ragjudge.engine.evaluate import evaluate_frame

    df = frame(args.rows)
    outs = {}
    for set_name, metrics in (("judged", JUDGED), ("all", None)):
        t0 = time.perf_counter()
        out = evaluate_frame(df, {"judge": "offline:/lexical", "progress": False, "bertscore": False,
                                  **({"metrics": metrics} if metrics else {})})
        outs[set_name] = (out, time.perf_counter() - t0)
        print(f"evaluated {args.rows} rows ({set_name}: {out_assessments(out)} assessments per row) in "
              f"{outs[set_name][1]:.1f} s", flush=True)
    results: dict = {"rows": args.rows, "rounds": args.rounds, "python": sys.version.split()[0]}
    import mlflow

    results["mlflow"] = mlflow.__version__
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RAGJUDGE_OUTPUT_DIR"] = str(Path(tmp) / "outputs")
        stores = args.stores.split(",")
        if "sqlite" in stores:
            run_store("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}", outs, args, results)
        if "server" in stores:
            from mlflow_ui import start_server

            work = Path(tmp) / "server"
            work.mkdir()
            proc, url = start_server(work)
            try:
                run_store("server", url, outs, args, results)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
