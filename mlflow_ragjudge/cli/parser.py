"""The command line's arguments, one function per command."""

from __future__ import annotations

import argparse

from ..core.constants import CONTEXT_MODES, DEFAULT_OFFLINE_JUDGE, PANEL_RULES


def kv(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"{what} takes NAME=VALUE pairs, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragjudge", description="RAG evaluation judges for MLflow.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _evaluate,
        _estimate,
        _testset,
        _sweep,
        _metrics,
        _quickstart,
        _label_sample,
        _calibrate,
        _log_saved,
        _judge_report,
        _plan,
        _monitor,
    ):
        add(sub)
    return parser


def _evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="evaluate a dataset file and log an MLflow run")
    p.add_argument("data", help="dataset file (.jsonl, .csv, .parquet); with --spark a Parquet path or a table name")
    p.add_argument(
        "--judge",
        action="append",
        help="judge model URI, e.g. openai:/gpt-4o-mini (default: offline:/lexical, the "
        "offline judge: calibrated lexical evidence, no LLM); repeat it for a panel of judges",
    )
    judge_noise_options(p)
    p.add_argument(
        "--metrics", help="comma-separated metric names (default: all the data supports); `ragjudge metrics` lists them"
    )
    p.add_argument("--context-mode", default="auto", choices=list(CONTEXT_MODES))
    p.add_argument("--group-column", help="column for per-group breakdowns")
    p.add_argument(
        "--human-columns",
        help="comma-separated human-score columns to correlate with every metric "
        "(meta-evaluation), e.g. one overall rating",
    )
    p.add_argument(
        "--human-labels",
        action="append",
        metavar="METRIC=COLUMN",
        help="human labels of a metric on its own scale, empty where unlabelled (repeatable): logs the "
        "calibrated <metric>/ppi_mean with its 95%% interval from >= 30 random labels",
    )
    p.add_argument("--col", action="append", metavar="LOGICAL=COLUMN", help="map a logical column to yours")
    p.add_argument("--language", default="en", help="judge prompt language (en, ja)")
    p.add_argument("--k", help="retrieval cut-offs, e.g. 1,3,5,10")
    model_options(p)
    plugin_option(p)
    traces_option(p)
    p.add_argument("--config", help="extra evaluator_config as a JSON object")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the judge-call cache")
    p.add_argument("--max-concurrency", type=int)
    p.add_argument(
        "--batch",
        action="store_true",
        help="send the judge calls through the provider's batch API (OpenAI, Anthropic): half the price, "
        "outside the synchronous rate limits, results usually within minutes (at most 24 h); a killed "
        "run re-attaches to its batches",
    )
    p.add_argument(
        "--max-error-rate",
        type=float,
        metavar="SHARE",
        help="exit 3 when a judged metric fails on more than this share of rows (default 0.2)",
    )
    p.add_argument(
        "--fail-under",
        action="append",
        metavar="METRIC=VALUE",
        help="quality gate, repeatable: exit 4 when METRIC's 95%% interval (e.g. correctness, faithfulness/mean) "
        "lies below VALUE, 6 when it straddles VALUE (undecided: the message says how many more rows would decide "
        "it), 0 when it lies at or above it",
    )
    p.add_argument(
        "--gate-rule",
        choices=("interval", "point"),
        help="how --fail-under decides: on the interval of the mean (default: pass, fail or undecided) or on the "
        "mean alone (point: pass or fail, the rule before intervals)",
    )
    p.add_argument("--experiment", help="MLflow experiment name (created if missing)")
    p.add_argument("--run-name", help="MLflow run name")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    p.add_argument("--spark", action="store_true",
                   help="score the rows on Spark, in the executors (the spark extra; docs/scaling.md): DATA is a "
                        "Parquet path or a table name")
    p.add_argument("--spark-master", help="with --spark: the master of a new session (default: the session's own "
                                          "configuration, else local[*])")
    p.add_argument("--spark-output", metavar="PATH",
                   help="with --spark: write every row with its results to PATH as Parquet")
    p.add_argument("--table-rows", default=None, metavar="N|all",
                   help="with --spark: rows of the per-row table logged with the run (a seeded sample; default "
                        "1000), or 'all'")


def _estimate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("estimate", help="estimate judge calls and tokens for a dataset, calling nothing")
    p.add_argument("data")
    p.add_argument("--judge", required=True, action="append",
                   help="judge model URI; repeat it for a panel (every judge's calls are counted)")
    judge_noise_options(p)
    p.add_argument("--metrics")
    p.add_argument("--context-mode", default="auto", choices=list(CONTEXT_MODES))
    p.add_argument("--col", action="append", metavar="LOGICAL=COLUMN")
    p.add_argument("--language", default="en")
    model_options(p)
    plugin_option(p)
    p.add_argument("--config")


def _testset(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("testset", help="generate (question, answer, gold document) rows from a corpus")
    p.add_argument("corpus", help="a JSON object {doc_id: text}, or JSONL rows with 'id' and 'text'")
    p.add_argument("--judge", required=True, help="the model that writes the questions (URI)")
    p.add_argument("--out", required=True, help="output .jsonl (the evaluator's columns)")
    p.add_argument("--sample", type=int, help="ask only this many documents (the rest stay distractors)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--language", default="en")
    p.add_argument(
        "--min-positive-chars",
        type=int,
        default=0,
        help="never ask documents shorter than this (they stay distractors)",
    )
    p.add_argument(
        "--distractors-per-positive",
        type=int,
        help="also write the corpus to index: the positives mixed with this many distractors each",
    )
    p.add_argument(
        "--corpus-out",
        help="where that corpus goes (.jsonl rows with 'id' and 'text'; needs --distractors-per-positive)",
    )


def _sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run every variant of your RAG pipeline over a dataset, each as a child run, "
        "and compare them (parent run: ragjudge/comparison.json)",
    )
    p.add_argument("data", help="questions (.jsonl, .csv, .parquet): question, and reference etc. for the metrics")
    p.add_argument(
        "--pipeline",
        required=True,
        metavar="MODULE:FUNCTION",
        help="your RAG system, pipeline(question, **params) -> answer or dict (a module importable from "
        "the current directory, or path/to/file.py:function)",
    )
    p.add_argument(
        "--grid",
        required=True,
        metavar="FILE",
        help="the variants: JSON or YAML, a list of parameter dicts or a grid {param: [values]}; a prompt "
        'template is {"name": ..., "template": ...} or "prompts:/name/version"',
    )
    p.add_argument(
        "--retriever", metavar="MODULE:FUNCTION", help="the E3 retriever, retriever(query, **params) -> passages"
    )
    p.add_argument("--judge", action="append",
                   help="judge URI (default: offline:/lexical, the offline judge); repeat it for a panel")
    judge_noise_options(p)
    p.add_argument("--metrics", help="comma-separated metric names (default: all the data supports)")
    p.add_argument("--compare", help="comma-separated metrics to compare (default: all but near-duplicates)")
    p.add_argument("--baseline", default="0", help="the baseline variant: its index in the grid or its name")
    model_options(p)
    plugin_option(p)
    traces_option(p)
    p.add_argument("--config", help="extra evaluator_config as a JSON object")
    p.add_argument("--col", action="append", metavar="LOGICAL=COLUMN", help="map a logical column to yours")
    p.add_argument("--data-name", help="the dataset's name in MLflow (default: the data file's name)")
    p.add_argument("--workers", type=int, default=1, help="questions answered in parallel (default 1)")
    p.add_argument("--batch", action="store_true", help="judge calls through the provider's batch API (see evaluate)")
    p.add_argument("--experiment", help="MLflow experiment name (created if missing)")
    p.add_argument("--run-name", help="the parent run's name")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")


def _metrics(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("metrics", help="list the registered metrics: columns they need, whether they call a judge")
    plugin_option(p)


def _quickstart(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "quickstart",
        help="a small sweep: three variants of the bundled example RAG system over the "
        "bundled questions, judged by the offline judge (no LLM), compared in MLflow",
    )
    p.add_argument("--experiment", default="ragjudge-quickstart")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite:///ragjudge-quickstart.db)")
    p.add_argument(
        "--judge",
        default=DEFAULT_OFFLINE_JUDGE,
        help=f"judge URI (default: {DEFAULT_OFFLINE_JUDGE}, the offline judge)",
    )
    p.add_argument("--run-name", help="the parent run's name (default: quickstart-<judge>-<time>)")


def _label_sample(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "label-sample",
        help="draw a seeded random sample of a run's (or a sweep's) rows to label blind, for calibrated estimates",
    )
    p.add_argument("run_id", help="a ragjudge run, or a sweep's parent run (the same questions in every variant)")
    p.add_argument("--n", type=int, default=100, help="rows to draw (default 100; at least 30 labels per interval)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics", help="comma-separated metrics to label (default: the run's judged metrics)")
    p.add_argument("--out", help="the file to label (.csv, .jsonl, .xlsx); not needed with --review-queue")
    p.add_argument(
        "--review-queue",
        action="store_true",
        help="an mlflow.genai.evaluate run: put the sampled traces into an MLflow review queue instead",
    )
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")


def _calibrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="read human labels and log calibrated estimates (PPI) into the run(s)")
    p.add_argument("run_id", help="the run, or the sweep's parent run, that label-sample drew from")
    p.add_argument("--labels", help="the filled label file (without it: human feedback on the run's traces)")
    p.add_argument("--metrics", help="with traces: comma-separated metrics whose human feedback to read")
    p.add_argument("--alpha", type=float, default=0.05, help="error level of the intervals (default 0.05: 95%%)")
    p.add_argument("--ppi", action="store_true", help="plain PPI (lambda = 1) instead of PPI++")
    p.add_argument(
        "--labels-only",
        action="store_true",
        help="the classical interval of the labels alone (no judge score needed: rows the judge "
        "abstained on or failed count too), logged as <metric>/labels_only_*",
    )
    p.add_argument(
        "--target-width", type=float, help="also say about how many random labels give an interval this wide"
    )
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")


def _log_saved(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "log-saved",
        help="log an evaluation saved locally (after exit 5: the tracking store was "
        "unavailable) into MLflow, now that the store answers",
    )
    p.add_argument("folder", help="the folder the failed run named (under RAGJUDGE_OUTPUT_DIR)")
    p.add_argument(
        "--run-id",
        help="log into this existing run (e.g. the sweep child that could not be logged); default: a new run",
    )
    p.add_argument("--experiment", help="MLflow experiment name for the new run (created if missing)")
    p.add_argument("--run-name", help="the new run's name")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")


def _judge_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "judge-report",
        help="how well the run's judge agrees with human labels: agreement, Cohen's kappa, the confusion matrix, the "
        "rows where they disagree, self-consistency over repeats, a panel's judges (docs/judge-report.md)",
    )
    p.add_argument("run_id", help="a ragjudge run (its per-row table has row_id and <metric>/score)")
    p.add_argument("--labels", help="human labels: .csv, .tsv, .jsonl or .xlsx with a row id column and a label "
                                     "column (without it: human feedback on the run's traces)")
    p.add_argument("--metric", help="the judged metric (default: the run's only one, or the one the labels name)")
    p.add_argument("--label-column", help="the labels' column (default: the metric's name, else 'label' or 'human')")
    p.add_argument("--row-id-column", default="row_id", help="the labels' row id column (default row_id)")
    p.add_argument("--threshold", type=float, help="pass/fail metrics: a judge score >= this passes (default 0.5 "
                                                   "for scores in [0, 1])")
    p.add_argument("--log-to", metavar="RUN", help="log the report into this run instead of RUN")
    p.add_argument("--no-log", action="store_true", help="print the report only, log nothing")
    p.add_argument("--show", type=int, default=20, metavar="N", help="disagreeing rows to print (default 20; all "
                                                                      "are in ragjudge/judge_report.json)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")


def _plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="how many rows, repeats (judge draws per row) and labels a target needs, planned from a run; "
        "docs/planning.md",
    )
    p.add_argument("run_id", help="the pilot run (or a sweep's parent run: its variants against the baseline)")
    p.add_argument("run_b", nargs="?", help="a second run over the same rows: plan the paired comparison RUN - RUN_B")
    p.add_argument("--metric", required=True, help="the output to plan for, e.g. correctness")
    goal = p.add_mutually_exclusive_group(required=True)
    goal.add_argument("--width", type=float, help="reach an interval this wide (ci_high - ci_low), e.g. 0.2")
    goal.add_argument("--detect", type=float, help="detect a difference this large between two variants, e.g. 0.1")
    p.add_argument("--power", type=float, default=0.8, help="with --detect: the power (default 0.8)")
    p.add_argument("--alpha", type=float, default=0.05, help="error level (default 0.05: 95%% intervals)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")


def _monitor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "monitor",
        help="judge the traces a running app logs to an MLflow experiment, attach the judgments to those traces, "
        "log a run per pass with the trend, calibrate with human feedback, gate (docs/monitoring.md)",
    )
    p.add_argument("--experiment", required=True, help="the app's experiment (name or id), where its traces are")
    p.add_argument("--judge", action="append",
                   help=f"judge model URI (default: {DEFAULT_OFFLINE_JUDGE}, the offline judge, no LLM); repeat it "
                        "for a panel")
    judge_noise_options(p)
    p.add_argument("--metrics", help="comma-separated metrics (default: faithfulness, answer_relevancy, "
                                     "context_relevance: those that need no reference answer)")
    p.add_argument("--filter", dest="filter_string", metavar="FILTER",
                   help="an MLflow trace filter the traces must match too, e.g. \"tags.env = 'prod'\"")
    p.add_argument("--since", help="look at traces from this time on: an ISO time (UTC unless it says) or a duration "
                                   "back from now (2h, 7d); later passes go on from the watermark")
    p.add_argument("--sample", help="RATE in (0, 1): keep each new trace with that probability (a seeded hash of "
                                    "its id); N: judge N of the new traces per pass (default: every new trace)")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    p.add_argument("--max-traces", type=int, default=200, metavar="N",
                   help="traces judged per pass at most, newest first; the rest wait for the next pass (default 200)")
    p.add_argument("--every", help="run a pass every DURATION (30s, 10m, 1h) until stopped (Ctrl-C / SIGTERM); "
                                   "default: one pass")
    p.add_argument("--passes", type=int, metavar="N", help="with --every: stop after N passes")
    p.add_argument("--settle", type=float, default=300.0, metavar="SECONDS",
                   help="how far behind the newest trace the next pass looks again, for traces written late "
                        "(default 300)")
    p.add_argument("--fail-under", action="append", metavar="METRIC=VALUE",
                   help="gate on each pass: exit 4 when METRIC's 95%% interval lies below VALUE, 6 when it "
                        "straddles it")
    p.add_argument("--gate-rule", choices=("interval", "point"), help="how --fail-under decides (default interval)")
    p.add_argument("--max-drop", action="append", metavar="METRIC=DROP",
                   help="with --baseline: exit 4 when METRIC fell by more than DROP against the baseline pass "
                        "(the whole 95%% interval of the change below -DROP), 6 when undecided")
    p.add_argument("--baseline", metavar="RUN|first|previous",
                   help="the pass to compare with for --max-drop: a monitor pass's run id, the monitor's first "
                        "pass, or the previous one")
    p.add_argument("--retriever-spans", default="all",
                   help="which RETRIEVER spans give the contexts: all (default), first, last, or span names, "
                        "comma-separated")
    p.add_argument("--language", help="judge prompt language (en, ja)")
    p.add_argument("--context-mode", choices=list(CONTEXT_MODES))
    p.add_argument("--embeddings", metavar="URI", help="embedding model for answer relevancy")
    p.add_argument("--config", help="extra evaluator_config as a JSON object")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the judge-call cache")
    p.add_argument("--max-concurrency", type=int)
    p.add_argument("--batch", action="store_true", help="send the judge calls through the provider's batch API")
    p.add_argument("--spark", action="store_true",
                   help="judge the rows in Spark's executors (large backlogs; the spark extra, docs/scaling.md); the "
                        "traces are read and the judgments attached from here")
    p.add_argument("--spark-master", help="with --spark: the master of a new session (default: the session's own "
                                          "configuration, else local[*])")
    plugin_option(p)
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")


def traces_option(p: argparse.ArgumentParser) -> None:
    """``--traces N``: how many rows become MLflow traces with their judgments (docs/mlflow.md)."""
    p.add_argument(
        "--traces",
        type=int,
        metavar="N",
        help="log at most N rows as MLflow traces, each with its metrics as assessments (the run's Traces tab, "
        "MLflow's evaluation UI); beyond N a seeded random sample; 0 = none (default 2000)",
    )


def plugin_option(p: argparse.ArgumentParser) -> None:
    """``--plugin``: a module that registers metrics of your own (docs/extending.md)."""
    p.add_argument(
        "--plugin",
        action="append",
        metavar="MODULE_OR_FILE",
        help="import this module (or path/to/file.py) first, for the metrics it registers with register_metric "
        "(repeatable; docs/extending.md)",
    )


def judge_noise_options(p: argparse.ArgumentParser) -> None:
    """The options about the judge's own noise: repeated draws, a panel's rule, the cascade (docs/judge-noise.md)."""
    p.add_argument("--repeats", type=int, metavar="N",
                   help="judge every judged call N times (independent draws, each cached): logs each row's "
                        "combined score and spread, the flip rate and the judge's share of the variance")
    p.add_argument("--repeat-temperature", type=float, metavar="T",
                   help="the temperature of the repeated draws (default: each metric's own, 0)")
    p.add_argument("--panel-rule", choices=list(PANEL_RULES),
                   help="how draws and a panel's judges are combined (default auto: majority on the six "
                        "levels, mean elsewhere)")
    p.add_argument("--escalate-to", metavar="URI",
                   help="a second judge for the rows the first is unsure about (abstains, draws disagree, or "
                        "at a --fail-under threshold): the cheap-first cascade")
    p.add_argument("--escalate-when", metavar="WHEN",
                   help="comma-separated: which rows are escalated, of abstain,spread,threshold (default all)")


def model_options(p: argparse.ArgumentParser) -> None:
    """The options that pick models besides the judge."""
    p.add_argument(
        "--embeddings",
        metavar="URI",
        help="embedding model for answer relevancy, e.g. openai:/text-embedding-3-small or "
        "'openai:/<embedding model>?base_url=http://host:port/v1' (default: the local MiniLM when "
        "the 'local' extra is installed, else answer relevancy is skipped, saying so)",
    )
    p.add_argument(
        "--bertscore",
        action="store_true",
        help="also compute BERTScore F1 (a local transformer over every row; needs the 'local' extra)",
    )
