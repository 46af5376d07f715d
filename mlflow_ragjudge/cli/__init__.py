"""Command line: ``ragjudge evaluate <file> --judge <URI> ...`` and ``ragjudge quickstart``.

``evaluate`` reads JSONL, CSV or Parquet (list columns in CSV as JSON text),
creates an MLflow run with metrics, the per-row table, transcripts and config,
and prints a short summary and the run's location.

Exit codes (docs/judge-client.md):

* 0 -- the run completed and every gate passed;
* 2 -- bad input or configuration, found before any judge call (nothing was sent);
* 3 -- the run completed and was logged, but a judged metric failed on more than
  ``--max-error-rate`` of its rows (the judge is not working: see the warning);
* 4 -- the run completed and was logged, but a ``--fail-under METRIC=VALUE`` gate was not met;
* 5 -- the evaluation completed but could not be logged to MLflow; the message names the local folder
  where its results (table, transcripts, config, metrics) were saved first.

When both 3 and 4 apply the exit code is 3: a gate measured by a failing judge means nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.constants import CONTEXT_MODES, DEFAULT_OFFLINE_JUDGE, is_offline_judge
from ..core.errors import InputError, LoggingFailed

__all__ = ["main", "read_table", "EXIT_OK", "EXIT_BAD_INPUT", "EXIT_JUDGE_FAILURES", "EXIT_GATE_FAILED",
           "EXIT_NOT_LOGGED"]

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_JUDGE_FAILURES = 3
EXIT_GATE_FAILED = 4
EXIT_NOT_LOGGED = 5


def _clean(value: Any, counter: list[int]) -> Any:
    """Lone surrogates (``"\\ud800"`` escapes) replaced in every string of a parsed JSON value."""
    from ..core.text import clean_text

    if isinstance(value, str):
        value, n = clean_text(value)
        counter[0] += n
        return value
    if isinstance(value, list):
        return [_clean(v, counter) for v in value]
    if isinstance(value, dict):
        return {_clean(k, counter): _clean(v, counter) for k, v in value.items()}
    return value


def _read_jsonl(p: Path) -> list[dict[str, Any]]:
    """JSON Lines, one object per line; a line that is not an object is an error naming the line. Invalid
    Unicode (lone surrogates) is replaced with U+FFFD, with a warning naming the lines."""
    from ..core.errors import InvalidTextWarning

    rows: list[dict[str, Any]] = []
    repaired: list[int] = []
    with open(p, encoding="utf-8", errors="surrogateescape") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as e:
                raise InputError(f"{p.name} line {n} is not valid JSON ({e}); each line must be one JSON object, "
                                 'e.g. {"question": "...", "answer": "...", "reference": "..."}.') from None
            if not isinstance(value, dict):
                raise InputError(f"{p.name} line {n} is a JSON {type(value).__name__}, not an object; each line must "
                                 'be one row as an object, e.g. {"question": "...", "answer": "..."}.')
            counter = [0]
            rows.append(_clean(value, counter))
            if counter[0]:
                repaired.append(n)
    if not rows:
        raise InputError(f"{p.name} has no rows.")
    if repaired:
        warnings.warn(f"{p.name}: invalid characters (lone surrogates, which UTF-8 cannot encode) were replaced with "
                      f"U+FFFD on line(s) {repaired[:10]}{' ...' if len(repaired) > 10 else ''}.",
                      InvalidTextWarning, stacklevel=2)
    return rows


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a dataset file: ``.jsonl``/``.json``, ``.csv`` or ``.parquet``.

    Raises:
        InputError: the file is missing, of an unknown type, or not readable as that type (the message
            names the line or the problem).
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"No such file: {p}")
    suffix = p.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            return pd.DataFrame(_read_jsonl(p))
        if suffix == ".json":
            data = json.loads(p.read_text(encoding="utf-8"))
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise InputError(f"{p.name} must hold a JSON list of row objects; for one object per line use .jsonl.")
            return pd.DataFrame(data)
        if suffix == ".csv":
            return pd.read_csv(p, keep_default_na=False, na_values=[""])
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(p)
    except InputError:
        raise
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p.name} could not be read as {suffix} ({type(e).__name__}: {e}).") from None
    raise InputError(f"{p.name}: unsupported file type {suffix!r}; use .jsonl, .csv or .parquet")


def _read_corpus(path: str) -> dict[str, str]:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"No such file: {p}")
    if p.suffix.lower() in (".jsonl", ".ndjson"):
        rows = _read_jsonl(p)
        missing = [i for i, r in enumerate(rows) if "id" not in r or not isinstance(r.get("text"), str)]
        if missing:
            raise InputError(f"{p.name} row {missing[0] + 1} needs an 'id' and a 'text' (str) field")
        return {str(r["id"]): r["text"] for r in rows}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise InputError(f"{p.name} is not valid JSON ({e}).") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise InputError(f"{p.name} must be a JSON object {{doc_id: text}} with text values")
    return {str(k): v for k, v in data.items()}


def _kv(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"{what} takes NAME=VALUE pairs, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragjudge", description="RAG evaluation judges for MLflow.")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("evaluate", help="evaluate a dataset file and log an MLflow run")
    ev.add_argument("data", help="dataset file (.jsonl, .csv, .parquet)")
    ev.add_argument("--judge", help="judge model URI, e.g. openai:/gpt-4o-mini (default: offline:/lexical, the "
                    "offline judge: calibrated lexical evidence, no LLM)")
    ev.add_argument("--metrics", help="comma-separated metric names (default: all the data supports); "
                    "`ragjudge metrics` lists them")
    ev.add_argument("--context-mode", default="auto", choices=list(CONTEXT_MODES))
    ev.add_argument("--group-column", help="column for per-group breakdowns")
    ev.add_argument("--human-columns", help="comma-separated human-score columns to correlate with every metric "
                    "(meta-evaluation), e.g. one overall rating")
    ev.add_argument("--human-labels", action="append", metavar="METRIC=COLUMN",
                    help="human labels of a metric on its own scale, empty where unlabelled (repeatable): logs the "
                         "calibrated <metric>/ppi_mean with its 95%% interval from >= 30 random labels")
    ev.add_argument("--col", action="append", metavar="LOGICAL=COLUMN", help="map a logical column to yours")
    ev.add_argument("--language", default="en", help="judge prompt language (en, ja)")
    ev.add_argument("--k", help="retrieval cut-offs, e.g. 1,3,5,10")
    _model_options(ev)
    ev.add_argument("--config", help="extra evaluator_config as a JSON object")
    ev.add_argument("--no-cache", action="store_true", help="do not read or write the judge-call cache")
    ev.add_argument("--max-concurrency", type=int)
    ev.add_argument("--batch", action="store_true",
                    help="send the judge calls through the provider's batch API (OpenAI, Anthropic): half the price, "
                         "outside the synchronous rate limits, results usually within minutes (at most 24 h); a killed "
                         "run re-attaches to its batches")
    ev.add_argument("--max-error-rate", type=float, metavar="SHARE",
                    help="exit 3 when a judged metric fails on more than this share of rows (default 0.2)")
    ev.add_argument("--fail-under", action="append", metavar="METRIC=VALUE",
                    help="quality gate, repeatable: exit 4 when METRIC (e.g. correctness, faithfulness/mean) "
                         "is below VALUE")
    ev.add_argument("--experiment", help="MLflow experiment name (created if missing)")
    ev.add_argument("--run-name", help="MLflow run name")
    ev.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    es = sub.add_parser("estimate", help="estimate judge calls and tokens for a dataset, calling nothing")
    es.add_argument("data")
    es.add_argument("--judge", required=True)
    es.add_argument("--metrics")
    es.add_argument("--context-mode", default="auto", choices=list(CONTEXT_MODES))
    es.add_argument("--col", action="append", metavar="LOGICAL=COLUMN")
    es.add_argument("--language", default="en")
    _model_options(es)
    es.add_argument("--config")
    ts = sub.add_parser("testset", help="generate (question, answer, gold document) rows from a corpus")
    ts.add_argument("corpus", help="a JSON object {doc_id: text}, or JSONL rows with 'id' and 'text'")
    ts.add_argument("--judge", required=True, help="the model that writes the questions (URI)")
    ts.add_argument("--out", required=True, help="output .jsonl (the evaluator's columns)")
    ts.add_argument("--sample", type=int, help="ask only this many documents (the rest stay distractors)")
    ts.add_argument("--seed", type=int, default=0)
    ts.add_argument("--language", default="en")
    ts.add_argument("--min-positive-chars", type=int, default=0,
                    help="never ask documents shorter than this (they stay distractors)")
    ts.add_argument("--distractors-per-positive", type=int,
                    help="also write the corpus to index: the positives mixed with this many distractors each")
    ts.add_argument("--corpus-out", help="where that corpus goes (.jsonl rows with 'id' and 'text'; needs "
                    "--distractors-per-positive)")
    sw = sub.add_parser("sweep", help="run every variant of your RAG pipeline over a dataset, each as a child run, "
                        "and compare them (parent run: ragjudge/comparison.json)")
    sw.add_argument("data", help="questions (.jsonl, .csv, .parquet): question, and reference etc. for the metrics")
    sw.add_argument("--pipeline", required=True, metavar="MODULE:FUNCTION",
                    help="your RAG system, pipeline(question, **params) -> answer or dict (a module importable from "
                         "the current directory, or path/to/file.py:function)")
    sw.add_argument("--grid", required=True, metavar="FILE",
                    help="the variants: JSON or YAML, a list of parameter dicts or a grid {param: [values]}; a prompt "
                         "template is {\"name\": ..., \"template\": ...} or \"prompts:/name/version\"")
    sw.add_argument("--retriever", metavar="MODULE:FUNCTION",
                    help="the E3 retriever, retriever(query, **params) -> passages")
    sw.add_argument("--judge", help="judge URI (default: offline:/lexical, the offline judge)")
    sw.add_argument("--metrics", help="comma-separated metric names (default: all the data supports)")
    sw.add_argument("--compare", help="comma-separated metrics to compare (default: all but near-duplicates)")
    sw.add_argument("--baseline", default="0", help="the baseline variant: its index in the grid or its name")
    _model_options(sw)
    sw.add_argument("--config", help="extra evaluator_config as a JSON object")
    sw.add_argument("--col", action="append", metavar="LOGICAL=COLUMN", help="map a logical column to yours")
    sw.add_argument("--data-name", help="the dataset's name in MLflow (default: the data file's name)")
    sw.add_argument("--workers", type=int, default=1, help="questions answered in parallel (default 1)")
    sw.add_argument("--batch", action="store_true", help="judge calls through the provider's batch API (see evaluate)")
    sw.add_argument("--experiment", help="MLflow experiment name (created if missing)")
    sw.add_argument("--run-name", help="the parent run's name")
    sw.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    sub.add_parser("metrics", help="list the registered metrics: columns they need, whether they call a judge")
    qs = sub.add_parser("quickstart", help="a small sweep: three variants of the bundled example RAG system over the "
                        "bundled questions, judged by the offline judge (no LLM), compared in MLflow")
    qs.add_argument("--experiment", default="ragjudge-quickstart")
    qs.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite:///ragjudge-quickstart.db)")
    qs.add_argument("--judge", default=DEFAULT_OFFLINE_JUDGE,
                    help=f"judge URI (default: {DEFAULT_OFFLINE_JUDGE}, the offline judge)")
    qs.add_argument("--run-name", help="the parent run's name (default: quickstart-<judge>-<time>)")
    ls = sub.add_parser("label-sample", help="draw a seeded random sample of a run's (or a sweep's) rows to label "
                        "blind, for calibrated estimates")
    ls.add_argument("run_id", help="a ragjudge run, or a sweep's parent run (the same questions in every variant)")
    ls.add_argument("--n", type=int, default=100, help="rows to draw (default 100; at least 30 labels per interval)")
    ls.add_argument("--seed", type=int, default=0)
    ls.add_argument("--metrics", help="comma-separated metrics to label (default: the run's judged metrics)")
    ls.add_argument("--out", help="the file to label (.csv, .jsonl, .xlsx); not needed with --review-queue")
    ls.add_argument("--review-queue", action="store_true",
                    help="an mlflow.genai.evaluate run: put the sampled traces into an MLflow review queue instead")
    ls.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    ca = sub.add_parser("calibrate", help="read human labels and log calibrated estimates (PPI) into the run(s)")
    ca.add_argument("run_id", help="the run, or the sweep's parent run, that label-sample drew from")
    ca.add_argument("--labels", help="the filled label file (without it: human feedback on the run's traces)")
    ca.add_argument("--metrics", help="with traces: comma-separated metrics whose human feedback to read")
    ca.add_argument("--alpha", type=float, default=0.05, help="error level of the intervals (default 0.05: 95%%)")
    ca.add_argument("--ppi", action="store_true", help="plain PPI (lambda = 1) instead of PPI++")
    ca.add_argument("--labels-only", action="store_true",
                    help="the classical interval of the labels alone (no judge score needed: rows the judge "
                         "abstained on or failed count too), logged as <metric>/labels_only_*")
    ca.add_argument("--target-width", type=float,
                    help="also say about how many random labels give an interval this wide")
    ca.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    lg = sub.add_parser("log-saved", help="log an evaluation saved locally (after exit 5: the tracking store was "
                        "unavailable) into MLflow, now that the store answers")
    lg.add_argument("folder", help="the folder the failed run named (under RAGJUDGE_OUTPUT_DIR)")
    lg.add_argument("--run-id", help="log into this existing run (e.g. the sweep child that could not be logged); "
                    "default: a new run")
    lg.add_argument("--experiment", help="MLflow experiment name for the new run (created if missing)")
    lg.add_argument("--run-name", help="the new run's name")
    lg.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    oj = sub.add_parser("offline-judge", add_help=False,
                        help="fit or measure the offline judge on public human labels (fit|report --data DIR)")
    oj.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _model_options(p: argparse.ArgumentParser) -> None:
    """The options that pick models besides the judge."""
    p.add_argument("--embeddings", metavar="URI",
                   help="embedding model for answer relevancy, e.g. openai:/text-embedding-3-small or "
                        "'openai:/<embedding model>?base_url=http://host:port/v1' (default: the local MiniLM when "
                        "the 'local' extra is installed, else answer relevancy is skipped, saying so)")
    p.add_argument("--bertscore", action="store_true",
                   help="also compute BERTScore F1 (a local transformer over every row; needs the 'local' extra)")


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


def _config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    try:
        cfg: dict[str, Any] = json.loads(args.config) if args.config else {}
    except ValueError as e:
        raise ValueError(f"--config is not valid JSON ({e}); give a JSON object, e.g. "
                         "--config '{\"max_context_chars\": 8000}'") from None
    if not isinstance(cfg, dict):
        raise ValueError("--config must be a JSON object, e.g. --config '{\"max_context_chars\": 8000}'")
    if args.judge:
        cfg["judge"] = args.judge
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
        cfg["human_labels"] = _kv(args.human_labels, "--human-labels")
    if args.col:
        cfg["col_mapping"] = _kv(args.col, "--col")
    cfg["language"] = args.language
    _model_config(args, cfg)
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
        gates: dict[str, float] = {}
        for name, value in _kv(args.fail_under, "--fail-under").items():
            try:
                gates[name] = float(value)
            except ValueError:
                raise ValueError(f"--fail-under {name}={value!r}: the threshold must be a number, "
                                 f"e.g. --fail-under {name}=3.5") from None
        cfg["fail_under"] = gates
    return cfg


def _model_config(args: argparse.Namespace, cfg: dict[str, Any]) -> None:
    if getattr(args, "embeddings", None):
        cfg["embeddings"] = args.embeddings
    if getattr(args, "bertscore", False):
        cfg["bertscore"] = True


def run_evaluation(
    df: pd.DataFrame, cfg: dict[str, Any], *, experiment: str | None, run_name: str | None, tracking_uri: str | None
) -> tuple[str, Any]:
    import mlflow

    from ..adapters.evaluator import log_output, save_local
    from ..adapters.tracking import check_tracking_store
    from ..core.errors import CalibrationWarning, JudgeFailureWarning
    from ..engine.evaluate import evaluate_frame

    # the tracking store must answer before a judge call is paid for
    check_tracking_store(tracking_uri, experiment, nothing="Nothing was sent to the judge.")
    with warnings.catch_warnings():
        # the CLI names failing metrics itself, after the summary (see _exit_code), and the summary says what
        # became of each calibrated estimate
        warnings.simplefilter("ignore", JudgeFailureWarning)
        warnings.simplefilter("ignore", CalibrationWarning)
        out = evaluate_frame(df, cfg)  # validates before starting a run: bad input leaves no empty run
    saved = save_local(out, run_name or "cli")  # before MLflow sees anything: a failing store cannot lose it
    try:
        with mlflow.start_run(run_name=run_name) as run:
            log_output(out, run.info.run_id, saved=saved)
    except LoggingFailed:
        raise
    except Exception as e:  # the run could not even be created (store unreachable, bad experiment ...)
        raise LoggingFailed(f"Could not create an MLflow run ({type(e).__name__}: {e}); the results are not lost: "
                            + (f"they are saved at {saved}." if saved else "they could not be saved locally."),
                            saved) from e
    return run.info.run_id, out


_AT_K = re.compile(r"_at_(\d+)/")


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4f}"


def _summary(run_id: str, out: Any) -> str:
    """The headline first: each judged metric's mean, count, error and abstain rates; then the metrics
    that need no judge (retrieval @k only at the middle cut-off); judge bookkeeping last."""
    import mlflow

    m = out.metrics
    lines = [f"rows: {out.config['rows']}   metrics: {', '.join(out.config['metrics_run'])}"]
    offline = is_offline_judge(out.params.get("ragjudge.judge"))
    if offline:
        held = (out.config.get("judge") or {}).get("held_out") or {}
        nq = held.get("nq301") or {}
        lines.append(
            f"judge: {out.params['ragjudge.judge']} -- the OFFLINE judge (calibrated lexical evidence, not an LLM): "
            "the judged numbers below are offline estimates"
            + (f" (held-out agreement with humans: {nq['agreement']:.1%} on NQ301, Spearman "
               f"{held['mtrag_faithfulness_spearman']:.2f} with MTRAG faithfulness; docs/offline-judge.md)"
               if nq and "mtrag_faithfulness_spearman" in held else ""))
    elif out.params.get("ragjudge.judge", "none") != "none":
        structured = out.params.get("ragjudge.judge.structured")
        judge = f"judge: {out.params['ragjudge.judge']} (structured output: {structured})"
        if out.config.get("context_mode"):
            judge += f"   context mode: {out.config['context_mode']}"
        lines.append(judge)
    judged = [name for name in out.results if f"{name}/error_rate" in m]
    if judged:
        # counts, not rates: the mean is over the scored rows; abstained and failed rows are not in it
        lines.append(f"  {'metric':<22} {'mean':>8} {'scored':>7} {'abstained':>10} {'failed':>7}   (of rows)")
        for name in judged:
            failing = {f["metric"] for f in out.failures}
            flag = "   <-- FAILING" if name in failing or (name in ("wscore", "lscore", "mscore")
                                                          and "multiturn" in failing) else ""
            rows = int(m.get(f"{name}/count", 0))
            counts = [int(m.get(f"{name}/{k}", 0)) for k in ("n_scored", "n_abstained", "n_failed")]
            lines.append(f"  {name:<22} {_fmt(m.get(f'{name}/mean')):>8} {counts[0]:>7} {counts[1]:>10} "
                         f"{counts[2]:>7}   ({rows}){flag}")
    if out.skipped:
        lines.append("skipped (not in this run):")
        for name, reason in out.skipped.items():
            lines.append(f"  {name}: {reason}")
    for name, cal in (out.config.get("calibration") or {}).items():
        if "error" in cal:
            lines.append(f"  {name}: no calibrated estimate -- {cal['error']}")
        else:
            alone = f"[{cal['classical_ci_low']:.3f}, {cal['classical_ci_high']:.3f}]"
            lines.append(f"  {name}: calibrated by {int(cal['n_labelled'])} human labels: {cal['mean']:.3f} "
                         f"[{cal['ci_low']:.3f}, {cal['ci_high']:.3f}] (95%; labels alone {alone})"
                         + (f"  warning: {cal['warning']}" if "warning" in cal else ""))
    ks = sorted({int(mt.group(1)) for k in m if (mt := _AT_K.search(k))})
    shown_k = ks[len(ks) // 2] if ks else None
    plain = []
    for k in sorted(m):
        at = _AT_K.search(k)
        if k.count("/") != 1 or not k.endswith("/mean") or k.split("/")[0] in judged or k.startswith("judge/"):
            continue
        if at and int(at.group(1)) != shown_k:
            continue
        plain.append(f"  {k:<34} {m[k]:.4f}")
    if plain:
        lines.append("no judge needed:")
        lines += plain
        if shown_k is not None and len(ks) > 1:
            lines.append(f"  (retrieval shown at k={shown_k}; k={ks} are all logged)")
    if "judge/calls" in m:
        cost = m.get("judge/cost_usd")
        usage = out.config.get("usage") or {}
        shared = int(m.get("judge/shared", 0))
        lines.append(
            f"judge usage: {int(usage.get('requests', 0))} requests sent, {int(m['judge/cache_hits'])} answered from "
            f"the cache" + (f", {shared} shared by identical calls of this run" if shared else "")
            + f", {int(m['judge/input_tokens'])} input / {int(m['judge/output_tokens'])} output tokens"
            + (f", ${cost:.4f}" if cost is not None else "")
        )
    for g in out.gate:
        verdict = "passed" if g["passed"] else "FAILED"
        value = "not produced" if g["value"] is None else f"{g['value']:.4f}"
        lines.append(f"gate {verdict}: {g['metric']} = {value} (threshold {g['threshold']:g})")
    if offline:
        lines.append("For LLM judgements: --judge openai:/gpt-4o-mini (OPENAI_API_KEY set), or any OpenAI-compatible "
                     "server: --judge 'openai:/<model>?base_url=http://host:port/v1'.")
    from ..adapters.tracking import safe_tracking_uri, ui_hint

    run = mlflow.get_run(run_id)
    lines.append(f"MLflow run {run_id} ({run.info.run_name}) in experiment {run.info.experiment_id} at "
                 f"{safe_tracking_uri(mlflow.get_tracking_uri())}")
    lines.append(f"  {ui_hint(run_id, experiment_id=run.info.experiment_id)}")
    return "\n".join(lines)


#: the quickstart's three variants of the bundled example RAG system (the first is the baseline)
QUICKSTART_VARIANTS = ({"chunk_size": 64, "top_k": 3}, {"chunk_size": 16, "top_k": 1}, {"chunk_size": 8, "top_k": 1})


def _quickstart(args: argparse.Namespace) -> int:
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
    return EXIT_JUDGE_FAILURES if failing else EXIT_OK


def _import_callable(spec: str, what: str) -> Any:
    """``module:function`` (importable from the current directory) or ``path/to/file.py:function``.

    A file is loaded as Python runs a script: its own directory goes first on the import path, so it can import
    the modules beside it. Any failure to import it (a missing module, a syntax error, an exception at import) is
    a :class:`ValueError` naming the file or module and the error, which the CLI turns into exit 2.
    """
    import importlib
    import importlib.util
    import traceback

    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--{what} {spec!r}: give MODULE:FUNCTION, e.g. my_rag:answer")

    def failed(where: str, e: BaseException) -> ValueError:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
        at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        if isinstance(e, SyntaxError) and e.filename:
            at = f" at {Path(e.filename).name}:{e.lineno}"
        hint = ""
        if isinstance(e, ModuleNotFoundError):
            hint = (f"; install {e.name!r} in this environment ({sys.executable} -m pip install ...) or put the module "
                    "beside the pipeline file")
        return ValueError(f"--{what} {spec!r}: importing {where} failed{at}: {type(e).__name__}: {e}{hint}")

    if module_name.endswith(".py"):
        path = Path(module_name).expanduser()
        if not path.is_file():
            raise ValueError(f"--{what} {spec!r}: no such file {path}")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # as `python path/to/file.py` does: the modules beside it import
        name = f"_ragjudge_{what}_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"--{what} {spec!r}: cannot load {path}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module  # pickling, dataclasses and typing look the module up by name
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(name, None)
            raise failed(str(path), e) from None
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and module_name.split(".")[0] == e.name.split(".")[0]:
                raise ValueError(f"--{what} {spec!r}: no module {module_name!r} here ({e}); run from the directory "
                                 "that holds it, or give path/to/file.py:function") from None
            raise failed(f"module {module_name!r}", e) from None
        except Exception as e:
            raise failed(f"module {module_name!r}", e) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"--{what} {spec!r}: {module_name} has no function {attr!r}")
    return fn


def read_grid(path: str | Path) -> Any:
    """A grid file (JSON, or YAML for .yaml/.yml): a list of parameter dicts or ``{param: [values]}``; a value
    ``{"name": ..., "template": ...}`` is a :class:`~mlflow_ragjudge.sweep.PromptTemplate`."""
    from ..workflows.sweep import PromptTemplate

    p = Path(path)
    if not p.is_file():
        raise InputError(f"No such grid file: {p}")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            grid = yaml.safe_load(text)
        else:
            grid = json.loads(text)
    except Exception as e:
        raise InputError(f"{p.name} could not be read ({type(e).__name__}: {e}).") from None

    def convert(v: Any) -> Any:
        if isinstance(v, dict) and {"name", "template"} <= set(v) and set(v) <= {"name", "template", "commit_message"}:
            return PromptTemplate(v["name"], v["template"], v.get("commit_message"))
        return v

    if isinstance(grid, dict):
        return {k: [convert(x) for x in vals] if isinstance(vals, list) else vals for k, vals in grid.items()}
    if isinstance(grid, list):
        return [{k: convert(x) for k, x in v.items()} if isinstance(v, dict) else v for v in grid]
    raise InputError(f"{p.name} must hold a list of parameter dicts or a grid {{param: [values]}}.")


def _sweep_command(args: argparse.Namespace) -> int:

    from ..core.errors import JudgeFailureWarning
    from ..workflows.sweep import sweep

    try:
        config: dict[str, Any] = json.loads(args.config) if args.config else {}
    except ValueError as e:
        raise ValueError(f"--config is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ValueError("--config must be a JSON object")
    config.setdefault("judge", args.judge or DEFAULT_OFFLINE_JUDGE)
    if args.judge:
        config["judge"] = args.judge
    if args.metrics:
        config["metrics"] = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if args.col:
        config["col_mapping"] = _kv(args.col, "--col")
    _model_config(args, config)
    config.setdefault("progress", False)
    if args.batch and not config.get("batch"):
        config["batch"] = True
    baseline: int | str = int(args.baseline) if args.baseline.isdigit() else args.baseline
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JudgeFailureWarning)
        result = sweep(_import_callable(args.pipeline, "pipeline"), read_grid(args.grid), read_table(args.data),
                       evaluator_config=config, experiment=args.experiment, baseline=baseline,
                       run_name=args.run_name, data_name=args.data_name or Path(args.data).stem, workers=args.workers,
                       retriever=_import_callable(args.retriever, "retriever") if args.retriever else None,
                       compare=[m.strip() for m in args.compare.split(",")] if args.compare else None,
                       tracking_uri=args.tracking_uri, verbose=True)
    print(sweep_summary(result))
    failing = [name for name, out in result.outputs.items() if out is not None and out.failures]
    for name in failing:
        for f in result.outputs[name].failures:  # type: ignore[union-attr]
            print(f"WARNING: variant {name!r}: {f['message']}", file=sys.stderr)
    from ..adapters.tracking import ui_hint

    print(f"  {ui_hint(result.parent_run_id)}")
    return EXIT_JUDGE_FAILURES if failing else EXIT_OK


def sweep_summary(result: Any) -> str:
    """A sweep's outcome as text (:meth:`mlflow_ragjudge.SweepResult.summary`)."""
    return str(result.summary())


def _exit_code(out: Any) -> int:
    """3 when a judged metric failed on too many rows (each named on stderr), 4 when a gate failed, else 0."""
    for f in out.failures:
        print(f"WARNING: {f['message']}", file=sys.stderr)
    if out.failures:
        print(f"error: {len(out.failures)} judged metric(s) failed on more than max_error_rate of their rows; "
              f"the run was logged, but its judged numbers are not usable (exit {EXIT_JUDGE_FAILURES})",
              file=sys.stderr)
        return EXIT_JUDGE_FAILURES
    failed = [g for g in out.gate if not g["passed"]]
    for g in failed:
        value = "was not produced" if g["value"] is None else f"= {g['value']:.4f}"
        print(f"error: gate failed: {g['metric']} {value}, below {g['threshold']:g}", file=sys.stderr)
    return EXIT_GATE_FAILED if failed else EXIT_OK


def _labels_command(args: argparse.Namespace) -> int:
    """``ragjudge label-sample`` and ``ragjudge calibrate``."""
    from ..adapters.tracking import check_tracking_store, env_command
    from ..workflows import calibration, calibration_traces

    check_tracking_store(args.tracking_uri, None, nothing="Nothing was read or logged.")
    store = f" --tracking-uri {args.tracking_uri}" if args.tracking_uri else ""
    ragjudge = env_command("ragjudge")
    metrics = [m.strip() for m in (args.metrics or "").split(",") if m.strip()] or None
    if args.command == "label-sample":
        if args.review_queue:
            if not metrics:
                raise InputError("--review-queue needs --metrics (the metrics people label, e.g. correctness)")
            queue = calibration_traces.queue_for_review(args.run_id, metrics, args.n, seed=args.seed)
            print(f"review queue {queue.name} ({queue.queue_id}): sampled traces of run {args.run_id} to label "
                  f"for {', '.join(metrics)} in the MLflow UI; then: {ragjudge} calibrate {args.run_id} --metrics "
                  f"{','.join(metrics)}{store}")
            return 0
        if not args.out:
            raise InputError("label-sample needs --out FILE (.csv, .jsonl or .xlsx), or --review-queue")
        frame = calibration.label_sample(args.run_id, args.n, seed=args.seed, metrics=metrics, path=args.out)
        label_cols = [c for c in frame.columns if c not in calibration.INFO_COLUMNS]
        print(f"{len(frame)} rows to label -> {args.out} ({frame['row_id'].nunique()} questions x "
              f"{frame['run_id'].nunique()} run(s), shuffled, no judge verdicts). Fill {', '.join(label_cols)} on each "
              f"metric's scale (leave blank what you skip), then: {ragjudge} calibrate {args.run_id} --labels "
              f"{args.out}{store}")
        return 0
    lam = 1.0 if args.ppi else None
    if args.labels:
        result = calibration.calibrate(args.run_id, args.labels, alpha=args.alpha, lam=lam,
                                       target_width=args.target_width, labels_only=args.labels_only)
        print(result.summary())
        return 0
    if not metrics:
        raise InputError("calibrate needs --labels FILE, or --metrics to read human feedback on the run's traces")
    estimates = calibration_traces.calibrate_traces(args.run_id, metrics, alpha=args.alpha, lam=lam)
    for m, e in estimates.items():
        print(f"{m}: calibrated {e.mean:.3f} [{e.ci_low:.3f}, {e.ci_high:.3f}] from {e.n_labelled} human labels "
              f"(judge alone {e.judge_mean:.3f})")
    return 0


def _log_saved_command(args: argparse.Namespace) -> int:
    """``ragjudge log-saved FOLDER``: an evaluation saved locally when MLflow could not take it (exit 5), logged now
    into a new run (or ``--run-id``), with the same summary and exit code as ``ragjudge evaluate``."""
    import mlflow

    from ..adapters.evaluator import load_local, log_output
    from ..adapters.tracking import check_tracking_store

    out = load_local(args.folder)
    check_tracking_store(args.tracking_uri, args.experiment, nothing="Nothing was logged; the saved folder is kept.")
    if args.run_id:
        mlflow.tracking.MlflowClient().get_run(args.run_id)  # an unknown run fails here, before anything is logged
        log_output(out, args.run_id, saved=Path(args.folder), keep_local=True)
        run_id = args.run_id
    else:
        with mlflow.start_run(run_name=args.run_name) as run:
            log_output(out, run.info.run_id, saved=Path(args.folder), keep_local=True)
            mlflow.set_tag("ragjudge.logged_from", str(Path(args.folder).resolve()))
        run_id = run.info.run_id
    print(_summary(run_id, out))
    print(f"(logged from {args.folder}; that folder is kept and can be deleted now)")
    return _exit_code(out)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no progress bars between our lines
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["offline-judge"]:
        from ..workflows.offline_fit import main as offline_main

        return offline_main(argv[1:])
    args = _build_parser().parse_args(argv)

    try:
        if args.command == "metrics":
            print(metrics_table())
            return 0
        if args.command == "evaluate":
            df = read_table(args.data)
            cfg = _config_from_args(args)
            run_id, out = run_evaluation(
                df, cfg, experiment=args.experiment, run_name=args.run_name, tracking_uri=args.tracking_uri
            )
        elif args.command == "sweep":
            return _sweep_command(args)
        elif args.command in ("label-sample", "calibrate"):
            return _labels_command(args)
        elif args.command == "log-saved":
            return _log_saved_command(args)
        elif args.command == "testset":
            from ..llm.client import JudgeClient
            from ..workflows.testset import generate_testset

            corpus = _read_corpus(args.corpus)
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
        elif args.command == "estimate":
            from ..engine.evaluate import evaluate_frame

            cfg = _config_from_args(args)
            cfg["dry_run"] = True
            out = evaluate_frame(read_table(args.data), cfg)
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
        else:
            return _quickstart(args)
    except (InputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LoggingFailed as e:
        print(f"error: {e}", file=sys.stderr)
        if e.saved_to is not None:
            from ..adapters.tracking import env_command

            where = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in (
                ("experiment", getattr(args, "experiment", None)), ("run_name", getattr(args, "run_name", None)),
                ("tracking_uri", getattr(args, "tracking_uri", None))) if v)
            print(f"when the tracking store answers again, log them with: {env_command('ragjudge')} log-saved "
                  f"{e.saved_to}{' ' + where if where else ''}", file=sys.stderr)
        return EXIT_NOT_LOGGED
    print(_summary(run_id, out))
    return _exit_code(out)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
