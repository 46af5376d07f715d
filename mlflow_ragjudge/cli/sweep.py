"""``ragjudge sweep`` and ``ragjudge quickstart`` (the main job: a small sweep of the bundled example system)."""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from ..core.constants import DEFAULT_OFFLINE_JUDGE
from .common import config_json, judge_config, model_config
from .exits import EXIT_JUDGE_FAILURES, EXIT_OK
from .parser import kv
from .reading import import_callable, read_grid, read_table

#: the quickstart's three variants of the bundled example RAG system (the first is the baseline)
QUICKSTART_VARIANTS = ({"chunk_size": 64, "top_k": 3}, {"chunk_size": 16, "top_k": 1}, {"chunk_size": 8, "top_k": 1})

def quickstart_command(args: argparse.Namespace) -> int:
    """The main job: a small sweep -- three variants of the bundled example RAG system over the bundled
    questions, judged by the offline judge unless ``--judge`` says otherwise -- logged as a parent run with its
    comparison and three child runs."""
    import time

    import mlflow

    from ..adapters.tracking import absolute_store_uri, env_command, safe_tracking_uri, ui_hint
    from ..core.errors import JudgeFailureWarning
    from ..workflows import example_rag
    from ..workflows.sweep import sweep

    tracking = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///ragjudge-quickstart.db"
    judge_name = re.sub(r"[^\w.-]+", "-", args.judge.split("?", 1)[0]).strip("-")
    questions = example_rag.sample_questions()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JudgeFailureWarning)
        result = sweep(example_rag.answer, list(QUICKSTART_VARIANTS), questions,
                       retriever=example_rag.retrieve, data_name="ragjudge-sample",
                       evaluator_config={"judge": args.judge, "progress": False},
                       experiment=args.experiment, tracking_uri=tracking,
                       run_name=args.run_name or f"quickstart-{judge_name}-{time.strftime('%Y%m%d-%H%M%S')}",
                       verbose=True)
    print("The bundled example RAG system (BM25 + an extractive generator, not an LLM), three variants, over the "
          f"{len(questions)} bundled questions:")
    print(sweep_summary(result))
    uri = mlflow.get_tracking_uri()
    exp = mlflow.get_run(result.parent_run_id).info.experiment_id
    print(f"MLflow: parent run {result.parent_run_id} in experiment {exp} ({args.experiment}) at "
          f"{safe_tracking_uri(uri)}")
    print(f"  {ui_hint(result.parent_run_id, experiment_id=exp)}; the parent run's Artifacts tab holds "
          "ragjudge/comparison.json")
    store = f" --tracking-uri {absolute_store_uri(safe_tracking_uri(uri))}"
    print(f"  next, calibrate the judge with your own labels (docs/calibration.md): {env_command('ragjudge')} "
          f"label-sample {result.parent_run_id} --n {len(questions)} --metrics correctness --out labels.csv{store}")
    failing = [n for n, out in result.outputs.items() if out is not None and out.failures]
    return EXIT_JUDGE_FAILURES if failing or result.generation_failures else EXIT_OK

def sweep_command(args: argparse.Namespace) -> int:

    from ..core.errors import JudgeFailureWarning
    from ..workflows.sweep import sweep

    config = config_json(args.config)
    config.setdefault("judge", DEFAULT_OFFLINE_JUDGE)
    judge_config(args, config)
    if args.metrics:
        config["metrics"] = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if args.col:
        config["col_mapping"] = kv(args.col, "--col")
    model_config(args, config)
    config.setdefault("progress", False)
    if args.batch and not config.get("batch"):
        config["batch"] = True
    baseline: int | str = int(args.baseline) if args.baseline.isdigit() else args.baseline
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JudgeFailureWarning)
        result = sweep(import_callable(args.pipeline, "pipeline"), read_grid(args.grid),
                       read_table(args.data, config.get("col_mapping")),
                       evaluator_config=config, experiment=args.experiment, baseline=baseline,
                       run_name=args.run_name, data_name=args.data_name or Path(args.data).stem, workers=args.workers,
                       retriever=import_callable(args.retriever, "retriever") if args.retriever else None,
                       compare=[m.strip() for m in args.compare.split(",")] if args.compare else None,
                       tracking_uri=args.tracking_uri, verbose=True)
    print(sweep_summary(result))
    failing = [name for name, out in result.outputs.items() if out is not None and out.failures]
    for name in failing:
        for f in result.outputs[name].failures:  # type: ignore[union-attr]
            print(f"WARNING: variant {name!r}: {f['message']}", file=sys.stderr)
    for name, why in result.generation_failures.items():  # rows that failed before the judge saw them
        print(f"WARNING: variant {name!r}: {why}", file=sys.stderr)
    from ..adapters.tracking import ui_hint

    print(f"  {ui_hint(result.parent_run_id)}")
    if result.stopped:
        from ..core.stop import EXIT_SIGNAL

        print(f"stopped by {result.stopped} after {len(result.run_ids)} of {len(result.variants)} variants; the parent "
              f"run and the variant under way are KILLED. Run the same command again to finish: answers and judge "
              "replies already paid for come from the cache.", file=sys.stderr)
        return EXIT_SIGNAL.get(result.stopped, EXIT_SIGNAL["SIGINT"])
    return EXIT_JUDGE_FAILURES if failing or result.generation_failures else EXIT_OK

def sweep_summary(result: Any) -> str:
    """A sweep's outcome as text (:meth:`mlflow_ragjudge.SweepResult.summary`)."""
    return str(result.summary())
