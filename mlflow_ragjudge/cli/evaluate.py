"""``ragjudge evaluate``, ``estimate``, ``testset`` and ``metrics``: one evaluation as an MLflow run."""

from __future__ import annotations

import argparse
import shlex
import warnings
from typing import Any

import pandas as pd

from ..core.constants import DEFAULT_OFFLINE_JUDGE, is_offline_judge
from ..core.errors import InputError, LoggingFailed
from .common import config_json, judge_config, model_config, numbers, store_stopped
from .parser import kv
from .reading import SPARK_DATA, check_spark_output, read_corpus, read_table, spark_data_kind


def metrics_table() -> str:
    """The registered metrics as a text table (from the registry, so a metric added with register_metric is
    listed too)."""
    from ..engine.config import RagJudgeConfig
    from ..metrics.spec import all_specs

    cfg = RagJudgeConfig()
    lines = ["metric               judge  needs columns                            what it measures"]
    for spec in all_specs():
        cols = " or ".join("+".join(alt) for alt in spec.requirements(cfg))
        lines.append(f"{spec.name:<20} {'yes' if spec.judged else 'no':<6} {cols:<40} {spec.description}")
    return "\n".join(lines)

def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    cfg = config_json(args.config)
    if args.judge:
        judge_config(args, cfg)
    elif args.command == "evaluate":
        cfg.setdefault("judge", DEFAULT_OFFLINE_JUDGE)  # no model configured: the offline judge, labelled as such
    if args.metrics:
        cfg["metrics"] = [m.strip() for m in args.metrics.split(",") if m.strip()]
    cfg["context_mode"] = args.context_mode
    if getattr(args, "group_column", None):
        cfg["group_column"] = args.group_column
    if getattr(args, "human_columns", None):
        cfg["human_columns"] = [c.strip() for c in args.human_columns.split(",") if c.strip()]
    if getattr(args, "human_labels", None):
        cfg["human_labels"] = kv(args.human_labels, "--human-labels")
    if args.col:
        cfg["col_mapping"] = kv(args.col, "--col")
    cfg["language"] = args.language
    model_config(args, cfg)
    if getattr(args, "k", None):
        cfg["k"] = [int(x) for x in args.k.split(",")]
    if getattr(args, "no_cache", False):
        cfg["cache"] = False
    if getattr(args, "batch", False) and not cfg.get("batch"):
        cfg["batch"] = True  # options given in --config stay
    if getattr(args, "max_concurrency", None) is not None:
        cfg["max_concurrency"] = args.max_concurrency  # 0 is refused by the config check, not ignored
    if getattr(args, "max_error_rate", None) is not None:
        cfg["max_error_rate"] = args.max_error_rate
    if getattr(args, "fail_under", None):
        cfg["fail_under"] = numbers(args.fail_under, "--fail-under")
    if getattr(args, "gate_rule", None):
        cfg["gate_rule"] = args.gate_rule
    return cfg

def run_evaluation(
    df: pd.DataFrame, cfg: dict[str, Any], *, experiment: str | None, run_name: str | None, tracking_uri: str | None
) -> tuple[str, Any]:
    import mlflow

    from ..adapters.run_log import log_output, save_local
    from ..adapters.tracking import check_tracking_store, mark_killed
    from ..core.errors import CalibrationWarning, JudgeFailureWarning
    from ..engine.evaluate import evaluate_frame

    # the tracking store must answer before a judge call is paid for
    check_tracking_store(tracking_uri, experiment, nothing="Nothing was sent to the judge.")
    with warnings.catch_warnings():
        # the CLI names failing metrics itself, after the summary (see exit_code), and the summary says what
        # became of each calibrated estimate
        warnings.simplefilter("ignore", JudgeFailureWarning)
        warnings.simplefilter("ignore", CalibrationWarning)
        out = evaluate_frame(df, cfg)  # validates before starting a run: bad input leaves no empty run
    saved = save_local(out, run_name or "cli")  # before MLflow sees anything: a failing store cannot lose it
    run_id = None
    try:
        with mlflow.start_run(run_name=run_name) as run:
            run_id = run.info.run_id
            log_output(out, run_id, saved=saved)
    except LoggingFailed:
        raise
    except Exception as e:  # the run could not even be created (store unreachable, bad experiment ...)
        if store_stopped(run_id):  # logged; the store stopped answering before the run's end: the summary says so
            return str(run_id), out
        raise LoggingFailed(f"Could not create an MLflow run ({type(e).__name__}: {e}); the results are not lost: "
                            + (f"they are saved at {saved}." if saved else "they could not be saved locally."),
                            saved) from e
    if out.config.get("interrupted") and not store_stopped(run_id):
        mark_killed(run.info.run_id)
    return run.info.run_id, out


def spark_session(app: str, master: str | None) -> Any:
    """The Spark session of ``--spark``: ``--spark-master``, else the session's own configuration, else
    ``local[*]``."""
    import os

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    elif not os.environ.get("SPARK_MASTER") and "spark.master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        builder = builder.master("local[*]")
    return builder.getOrCreate()


def run_spark_evaluation(args: argparse.Namespace, cfg: dict[str, Any]) -> tuple[str, Any]:
    """``ragjudge evaluate DATA --spark``: DATA (a Parquet path, or a table of the session's catalog) scored in the
    Spark executors, one run logged from here (:func:`mlflow_ragjudge.spark.evaluate_spark`). A local DATA that is
    missing or not Parquet is refused before Spark starts; what Spark itself cannot read is said in one line too."""
    from ..adapters.tracking import check_tracking_store
    from ..core.stop import reclaim_signals

    kind = spark_data_kind(args.data)  # before the session starts: a bad path costs no JVM and no Java traceback
    if args.spark_output:
        check_spark_output(args.spark_output)  # and an output it could not write costs no judge call
    try:
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import AnalysisException
    except ImportError:
        raise InputError("--spark needs pyspark and pyarrow: pip install 'mlflow-ragjudge[spark]'") from None
    from ..adapters.spark import DEFAULT_TABLE_ROWS, evaluate_spark, pandas_support_note

    table_rows: int | str = DEFAULT_TABLE_ROWS
    if args.table_rows is not None:
        table_rows = "all" if args.table_rows == "all" else int(args.table_rows)
    check_tracking_store(args.tracking_uri, args.experiment, nothing="Nothing was sent to the judge.")
    with pandas_support_note():  # PySpark's warning about pandas 3, at session start too: once, in our words
        spark = spark_session("ragjudge evaluate", args.spark_master)
        reclaim_signals()  # PySpark's context put its SIGINT handler in place of ours (core.stop)
        data = args.data
        try:
            sdf = spark.read.parquet(data) if kind == "path" else spark.table(data)
        except (AnalysisException, Py4JJavaError) as e:  # a URI or table Spark cannot read: its reason, in one line
            # (a Py4JJavaError's own text is the Java stack trace; its Java exception's text is the reason)
            reason = _first_line(str(e.java_exception) if isinstance(e, Py4JJavaError) else str(e))
            raise InputError(f"--spark could not read {data}: {reason} ({SPARK_DATA}).") from None
        result = evaluate_spark(sdf, cfg, experiment=args.experiment, run_name=args.run_name, table_rows=table_rows)
        if args.spark_output:
            try:
                result.rows.write.mode("overwrite").parquet(args.spark_output)
            except Exception as e:  # noqa: BLE001 - the run is logged: say where its results are, after the summary
                reason = _first_line(str(e.java_exception) if isinstance(e, Py4JJavaError) else str(e))
                result.unwritten = (
                    f"--spark-output {args.spark_output} could not be written ({reason}). The run "
                    f"{result.run_id} is logged: its per-row table (ragjudge/eval_results_table.json) holds "
                    f"{result.config['spark']['table']} (of {result.config['rows']}; --table-rows all logs every "
                    "row); run again with --spark-output to a path Spark can write to have every row there (the "
                    "judge-call cache answers the calls already paid for).")
            else:
                print(f"every row with its results: {args.spark_output}")
        result.unpersist()
    assert result.run_id is not None
    return result.run_id, result


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[0] if lines else "no reason given")[:500]


def stopped_message(run_id: str, out: Any, argv: list[str]) -> str:
    """What a run stopped by Ctrl-C / SIGTERM did, and how to finish it."""
    from ..adapters.tracking import env_command

    stop = out.config["interrupted"]
    cache = (out.config.get("cache") or {}).get("mode", "off") != "off"
    again = f"{env_command('ragjudge')} {' '.join(shlex.quote(a) for a in argv)}"
    return (f"stopped by {stop['by']}: {stop['results'] - stop['results_not_judged']} of {stop['results']} results "
            f"judged, logged as run {run_id} (status KILLED). To finish, run the same command again:\n  {again}\n"
            + ("every reply that arrived is in the judge-call cache, so only the rest is sent."
               if cache else "the cache was off (--no-cache), so a re-run pays for every call again."))

def testset_command(args: argparse.Namespace) -> int:
    """``ragjudge testset``: (question, answer, gold document) rows from a corpus."""
    from ..llm.client import JudgeClient
    from ..workflows.testset import generate_testset

    corpus = read_corpus(args.corpus)
    if args.corpus_out and args.distractors_per_positive is None:
        raise ValueError("--corpus-out needs --distractors-per-positive (how many distractors per positive)")
    df, report = generate_testset(corpus, JudgeClient(args.judge), sample=args.sample, seed=args.seed,
                                  language=args.language, min_positive_chars=args.min_positive_chars,
                                  distractors_per_positive=args.distractors_per_positive)
    df.to_json(args.out, orient="records", lines=True, force_ascii=False)
    if args.corpus_out:
        pd.DataFrame([{"id": d, "text": corpus[d]} for d in report.corpus_ids]).to_json(
            args.corpus_out, orient="records", lines=True, force_ascii=False)
        print(f"corpus: {len(report.generated)} positives + {len(report.distractor_ids)} distractors "
              f"-> {args.corpus_out}")
    print(f"{len(report.generated)} questions from {len(corpus)} documents "
          f"({len(report.declined)} declined, {len(report.failed)} failed) -> {args.out}")
    for doc_id, why in report.failed.items():
        print(f"  failed {doc_id}: {why}")
    return 0


def estimate_command(args: argparse.Namespace) -> int:
    """``ragjudge estimate``: calls and tokens per metric, nothing sent."""
    from ..engine.evaluate import evaluate_frame

    cfg = config_from_args(args)
    cfg["dry_run"] = True
    out = evaluate_frame(read_table(args.data, cfg.get("col_mapping")), cfg)
    print(out.table.to_string(index=False))
    total = {k: int(out.metrics[f"estimate/total/{k}"]) for k in ("calls", "input_tokens", "output_tokens")}
    cost = out.metrics.get("estimate/total/cost_usd")
    if is_offline_judge(cfg.get("judge")):
        print("total: 0 calls -- the offline judge (offline:/lexical) sends nothing and costs nothing")
        return 0
    batch_cost = out.metrics.get("estimate/total/batch_cost_usd")
    print(
        f"total: {total['calls']} calls, ~{total['input_tokens']} input and ~{total['output_tokens']} "
        f"output tokens" + (f", ~${cost:.4f} synchronous" if cost is not None
                            else " (no price known for this model)")
        + (f", ~${batch_cost:.4f} through the batch API (--batch)" if batch_cost is not None else "")
    )
    print("(rough estimate: tokens from text length; re-asks and cache hits are not counted)")
    return 0
