"""Evaluate a DataFrame of RAG outputs: the engine behind the MLflow evaluator,
the scorers' aggregation and the CLI. No mlflow import here.

Steps, in order: resolve columns and metrics -> validate every row (before any
judge call) -> prepare E3 contexts through the retriever (before any judge call)
-> run the metrics, rows in parallel under the client's limits -> aggregate
(overall and per group) -> build the per-row table -> meta-evaluation.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from . import __version__
from .backends import safe_url
from .client import JudgeClient
from .config import BUILT_METRICS, LOGICAL_COLUMNS, RagJudgeConfig
from .judged import JUDGED_METRICS, EmbeddingsUnavailable, JudgeContext, JudgedMetric, resolve_embedder
from .multiturn import MultiTurnRunner
from .text import clean_text
from .types import JudgeResult, Status, aggregate, metric_name_parts, metric_name_safe

__all__ = ["evaluate_frame", "EvalOutput", "InputError", "JudgeFailureWarning", "LoggingFailed", "metric_name_safe"]


class JudgeFailureWarning(UserWarning):
    """A judged metric failed on more than ``max_error_rate`` of its rows."""


class LoggingFailed(RuntimeError):
    """Logging an evaluation to MLflow failed; its results are saved locally at ``saved_to``
    (``ragjudge evaluate`` exits with code 5)."""

    def __init__(self, message: str, saved_to: Any = None) -> None:
        super().__init__(message)
        self.saved_to = saved_to


class InputError(ValueError):
    """Bad input data, found before any judge call. The message names the column,
    the row and the fix."""


@dataclass
class EvalOutput:
    """Everything one evaluation produced.

    Attributes:
        metrics: aggregate metrics as logged (``correctness/mean`` ...).
        table: the per-row table (question first, the headline score second).
        results: metric name -> per-row :class:`JudgeResult` list.
        transcripts: every judge call's record.
        params: configuration as logged params (strings).
        config: the full configuration record (JSON-able).
        meta: meta-evaluation table (Figure 2 layout) or None.
        skipped: metric -> reason, for metrics that were asked for or defaulted but could not run.
    """

    metrics: dict[str, float]
    table: pd.DataFrame
    results: dict[str, list[JudgeResult]]
    transcripts: list[dict[str, Any]]
    params: dict[str, str]
    config: dict[str, Any]
    meta: pd.DataFrame | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    #: extra JSONL artifacts: file name -> records (the multi-turn conversations)
    artifacts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: judged metrics that failed on more than ``max_error_rate`` of their rows:
    #: ``{"metric", "error_rate", "failed", "rows", "reasons": {reason: count}, "message"}``
    failures: list[dict[str, Any]] = field(default_factory=list)
    #: the ``fail_under`` quality gate: ``{"metric", "threshold", "value", "passed"}`` per entry
    gate: list[dict[str, Any]] = field(default_factory=list)

    @property
    def gate_passed(self) -> bool:
        return all(g["passed"] for g in self.gate)


# --------------------------------------------------------------------------- input


def _as_list(value: Any, column: str, row: int, *, mapping_ok: bool = False) -> Any:
    """Coerce a cell to a list (or dict) of items, or raise naming the fix."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if mapping_ok and isinstance(value, dict):
        return value
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("[") or (mapping_ok and s.startswith("{")):
            try:  # JSON text, as lists arrive from CSV files
                return _as_list(json.loads(s), column, row, mapping_ok=mapping_ok)
            except ValueError:
                pass
        raise InputError(
            f"Column '{column}' row {row} holds a string ({value[:60]!r}); it must be a list, e.g. "
            f"['first passage', 'second passage']. Wrap single passages in a list."
        )
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = value.tolist()  # numpy arrays from parquet
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise InputError(
            f"Column '{column}' row {row} holds a {type(value).__name__}; it must be a list"
            + (" or a dict of id -> grade." if mapping_ok else ".")
        )
    return value


def _as_text(value: Any, column: str, row: int, *, required: bool) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        if required:
            raise InputError(
                f"Column '{column}' row {row} is empty; every row needs {LOGICAL_COLUMNS.get(column, 'a value')}."
            )
        return None
    if not isinstance(value, str):
        raise InputError(
            f"Column '{column}' row {row} holds a {type(value).__name__} ({str(value)[:40]!r}); it must be text (str)."
        )
    return value


@dataclass
class Row:
    index: int
    question: str | None = None
    answer: str | None = None
    reference: str | None = None
    contexts: list[str] | None = None
    retrieved_doc_ids: list[Any] | None = None
    relevant_doc_ids: Any = None
    reference_contexts: list[str] | None = None
    gold_documents: list[str] | None = None
    group: str | None = None
    judge_contexts: list[str] | None = None  # what the correctness judge sees
    relevance_threshold: float = 1

    @property
    def retrieval_hit(self) -> bool:
        """A relevant document (grade >= threshold) is among the retrieved ones."""
        if not self.relevant_doc_ids or not self.retrieved_doc_ids:
            return False
        rel = self.relevant_doc_ids
        if isinstance(rel, dict):
            gold = {str(k) for k, g in rel.items() if g is not None and float(g) >= self.relevance_threshold}
        else:
            gold = {str(k) for k in rel}
        return any(str(d) in gold for d in self.retrieved_doc_ids)


def _present(df: pd.DataFrame, cfg: RagJudgeConfig, logical: str) -> bool:
    return cfg.column(logical) in df.columns


def _requirements(metric: str, cfg: RagJudgeConfig) -> tuple[tuple[str, ...], ...]:
    """Alternatives of logical columns that together let ``metric`` run."""
    if metric == "faithfulness":
        evidence = "gold_documents" if cfg.faithfulness_evidence == "gold" else "contexts"
        base: tuple[str, ...] = ("answer", evidence)
        if cfg.faithfulness_require_retrieval_hit:
            base = (*base, "retrieved_doc_ids", "relevant_doc_ids")
        return (base,)
    if metric in JUDGED_METRICS:
        return (JUDGED_METRICS[metric].requires,)
    if metric == "multiturn":
        return (("question", "reference"),)
    return _REQUIRES[metric]


def _default_metrics(df: pd.DataFrame, cfg: RagJudgeConfig) -> tuple[list[str], dict[str, str]]:
    chosen: list[str] = []
    skipped: dict[str, str] = {}
    for m in BUILT_METRICS:
        if not any(all(_present(df, cfg, c) for c in alt) for alt in _requirements(m, cfg)):
            continue
        if (m in JUDGED_METRICS or m == "multiturn") and cfg.judge is None:
            skipped[m] = "no judge configured (set judge='openai:/gpt-4o-mini' or similar)"
            continue
        if m == "multiturn" and cfg.multiturn_system is None:
            continue  # needs a live system to converse with; not a default without one
        chosen.append(m)
    return chosen, skipped


_REQUIRES: dict[str, tuple[tuple[str, ...], ...]] = {
    # metric -> alternatives, each a tuple of logical columns that together suffice
    "lexical": (("answer", "reference"),),
    "retrieval": (("retrieved_doc_ids", "relevant_doc_ids"), ("contexts", "reference")),
}


def _check_metric_name_parts(rows: Sequence[Row], cfg: RagJudgeConfig) -> dict[str, str]:
    """Groups and human-score columns become metric name segments: refuse two that would share one, before
    any call, and return the ones logged under a changed name (recorded in the run's config)."""
    renamed: dict[str, str] = {}
    for texts, what in (({r.group for r in rows if r.group is not None}, "group"),
                        (set(cfg.human_columns), "human-score column")):
        try:
            names = metric_name_parts(sorted(texts), what)
        except ValueError as e:
            raise InputError(str(e)) from e
        renamed.update({k: v for k, v in names.items() if k != v})
    return renamed


def _check_required(df: pd.DataFrame, cfg: RagJudgeConfig, metrics: Sequence[str]) -> None:
    for m in metrics:
        alternatives = _requirements(m, cfg)
        if any(all(_present(df, cfg, c) for c in alt) for alt in alternatives):
            continue
        alt = alternatives[0]
        missing = [cfg.column(c) for c in alt if not _present(df, cfg, c)]
        what = [LOGICAL_COLUMNS[c] for c in alt if not _present(df, cfg, c)]
        raise InputError(
            f"Metric '{m}' needs column(s) {missing} ({'; '.join(what)})"
            f", but the data has {list(df.columns)}. Add the column, or map yours with "
            f"col_mapping={{'{alt[0]}': '<your column>'}}."
            + (
                " Alternatively: " + " or ".join(str(list(a)) for a in alternatives[1:])
                if len(alternatives) > 1
                else ""
            )
        )
    needs_judge = [m for m in metrics if m in JUDGED_METRICS or m == "multiturn"]
    if "multiturn" in metrics and cfg.multiturn_system is None:
        raise InputError(
            "Metric 'multiturn' converses with the RAG system under test: pass multiturn_system=<callable "
            "(query, history) -> answer>, where history is the list of earlier {'question', 'answer'} exchanges."
        )
    if needs_judge and cfg.judge is None:
        raise InputError(
            f"Metric(s) {needs_judge} need a judge model: set judge='openai:/gpt-4o-mini' (or any judge URI)."
        )


class _Repairs:
    """Text repairs made while reading the data: recorded in the run's config and announced once."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def text(self, value: Any, column: str, row: int) -> Any:
        if isinstance(value, str):
            value, n = clean_text(value)
            if n:
                self.items.append({"row": row, "column": column, "replaced": n})
        return value

    def announce(self) -> None:
        if self.items:
            total = sum(i["replaced"] for i in self.items)
            where = ", ".join(f"row {i['row']} '{i['column']}'" for i in self.items[:5])
            more = f" and {len(self.items) - 5} more" if len(self.items) > 5 else ""
            warnings.warn(
                f"{total} invalid character(s) (lone surrogates, which UTF-8 cannot encode) were replaced with "
                f"U+FFFD in {where}{more}; fix the data's encoding to keep the original text.",
                InvalidTextWarning, stacklevel=3,
            )


class InvalidTextWarning(UserWarning):
    """Invalid Unicode in the data was replaced before any judge call."""


def _read_rows(df: pd.DataFrame, cfg: RagJudgeConfig, metrics: Sequence[str],
               repairs: _Repairs | None = None) -> list[Row]:
    repairs = repairs if repairs is not None else _Repairs()
    rows: list[Row] = []
    need_text = {
        col: any(col in alt for m in metrics if m != "retrieval" for alt in _requirements(m, cfg)[:1])
        for col in ("question", "answer", "reference")
    }
    group_col = cfg.group_column or ("group" if _present(df, cfg, "group") else None)
    if group_col and group_col != "group" and group_col not in df.columns:
        raise InputError(f"group_column={group_col!r} is not a column of the data ({list(df.columns)}).")
    for col in cfg.human_columns:
        if col not in df.columns:
            raise InputError(f"human_columns names {col!r}, which is not a column of the data ({list(df.columns)}).")
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = df[col][vals.isna() & df[col].notna()]
        if len(bad):
            raise InputError(
                f"Human-score column {col!r} row {df.index.get_loc(bad.index[0])} holds {bad.iloc[0]!r}; it must be "
                "a number (leave the cell empty where a row has no human score)."
            )
        inf = vals[vals.isin([float("inf"), float("-inf")])]
        if len(inf):
            raise InputError(
                f"Human-score column {col!r} row {df.index.get_loc(inf.index[0])} holds {inf.iloc[0]}; human scores "
                "must be finite numbers (leave the cell empty where a row has no human score)."
            )
    for pos, (_, rec) in enumerate(df.iterrows()):
        r = Row(index=pos, relevance_threshold=cfg.relevance_threshold)
        for logical in ("question", "answer", "reference"):
            if _present(df, cfg, logical):
                setattr(
                    r,
                    logical,
                    repairs.text(
                        _as_text(rec[cfg.column(logical)], cfg.column(logical), pos, required=need_text[logical]),
                        cfg.column(logical), pos),
                )
        for logical in ("contexts", "reference_contexts", "gold_documents"):
            if _present(df, cfg, logical):
                items = _as_list(rec[cfg.column(logical)], cfg.column(logical), pos)
                if items is not None:
                    for j, it in enumerate(items):
                        if not isinstance(it, str):
                            raise InputError(
                                f"Column '{cfg.column(logical)}' row {pos} item {j} is a {type(it).__name__}; "
                                "passages must be strings."
                            )
                    items = [repairs.text(it, cfg.column(logical), pos) for it in items]
                setattr(r, logical, items)
        for logical in ("retrieved_doc_ids", "relevant_doc_ids"):
            if _present(df, cfg, logical):
                setattr(
                    r,
                    logical,
                    _as_list(
                        rec[cfg.column(logical)], cfg.column(logical), pos, mapping_ok=logical == "relevant_doc_ids"
                    ),
                )
        if group_col:
            g = rec[group_col] if group_col in df.columns else rec[cfg.column("group")]
            r.group = None if g is None or (isinstance(g, float) and math.isnan(g)) else repairs.text(
                str(g), group_col, pos)
        rows.append(r)
    return rows


def _passages_from_retriever(out: Any, row: int) -> list[str]:
    if out is None:
        return []
    if isinstance(out, (str, bytes)):
        raise InputError(f"The retriever returned a string for row {row}; it must return a list of passages.")
    if isinstance(out, dict):
        raise InputError(
            f"The retriever returned a dict for row {row} (keys {list(out)[:3]}); it must return a list of passages "
            "(str, dicts with 'text', or (id, text) pairs), e.g. [{'id': 'd1', 'text': '...'}] -- its keys would "
            "otherwise be judged as passages."
        )
    if not isinstance(out, Iterable) or hasattr(out, "page_content"):
        raise InputError(
            f"The retriever returned a {type(out).__name__} for row {row}; it must return a list of passages "
            "(str, dicts with 'text', or (id, text) pairs)."
        )
    passages = []
    for item in out:
        if isinstance(item, str):
            passages.append(item)
        elif isinstance(item, dict) and isinstance(text := item.get("text", item.get("page_content")), str):
            passages.append(text)
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], str):
            passages.append(item[1])
        elif hasattr(item, "page_content"):  # LangChain / MLflow Document
            passages.append(str(item.page_content))
        else:
            raise InputError(
                f"The retriever returned {type(item).__name__} items for row {row}; return str passages, "
                "dicts with 'text', or (id, text) pairs."
            )
    return passages


def resolve_context_mode(cfg: RagJudgeConfig, rows: Sequence[Row], df: pd.DataFrame) -> str:
    mode = cfg.context_mode
    if mode == "auto":
        if cfg.retriever is not None or _present(df, cfg, "reference_contexts"):
            return "reference"
        if _present(df, cfg, "contexts"):
            return "generation"
        return "none"
    if mode == "reference" and cfg.retriever is None and not _present(df, cfg, "reference_contexts"):
        raise InputError(
            "context_mode='reference' (E3) needs contexts retrieved with question + reference answer: pass "
            "retriever=<callable query -> passages> or add a 'reference_contexts' column."
        )
    if mode == "generation" and not _present(df, cfg, "contexts"):
        raise InputError("context_mode='generation' (E2) needs a 'contexts' column (the passages the RAG used).")
    if mode == "gold" and not _present(df, cfg, "gold_documents"):
        raise InputError("context_mode='gold' needs a 'gold_documents' column (list of gold document texts).")
    return mode


def e3_query(question: str, reference: str) -> str:
    """The E3 retrieval query: question and reference answer concatenated (seed 000, section 2)."""
    return f"{question}\n{reference}"


def _prepare_judge_contexts(mode: str, cfg: RagJudgeConfig, rows: Sequence[Row],
                            repairs: _Repairs | None = None) -> None:
    repairs = repairs if repairs is not None else _Repairs()
    for r in rows:
        if mode == "reference":
            if cfg.retriever is not None:
                try:
                    out = cfg.retriever(e3_query(r.question or "", r.reference or ""))
                except Exception as e:
                    raise InputError(
                        f"The retriever raised on row {r.index} ({type(e).__name__}: {e}); fix the retriever or "
                        "precompute a 'reference_contexts' column."
                    ) from e
                r.judge_contexts = [repairs.text(p, "retriever output", r.index)
                                    for p in _passages_from_retriever(out, r.index)]
            else:
                r.judge_contexts = r.reference_contexts or []
        elif mode == "generation":
            r.judge_contexts = r.contexts or []
        elif mode == "gold":
            r.judge_contexts = r.gold_documents or []
        else:
            r.judge_contexts = []


# --------------------------------------------------------------------------- metrics


@dataclass
class MetricRun:
    """What one metric produced: per sub-metric results, extra table columns."""

    results: dict[str, list[JudgeResult]]
    judged: bool  # LLM-judged: log abstain/error rates and count
    headline: str | None = None  # the sub-metric whose score is the table's headline
    columns: dict[str, list[Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)  # logged as they are
    artifacts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _progress_bar(total: int, desc: str, setting: bool | str) -> Any:
    """A tqdm bar on stderr (``progress='auto'``: only on a terminal), or None."""
    if setting is False or (setting == "auto" and not sys.stderr.isatty()):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="row", file=sys.stderr)


def _parallel(
    fn: Callable[[Row], JudgeResult], rows: Sequence[Row], workers: int, *, desc: str = "", progress: bool | str = False
) -> list[JudgeResult]:
    bar = _progress_bar(len(rows), desc, progress)

    def safe(r: Row) -> JudgeResult:
        try:
            return fn(r)
        except Exception as e:  # a bug must not lose the row or the run
            return JudgeResult.failed("internal_error", f"{type(e).__name__}: {e}")
        finally:
            if bar is not None:
                bar.update(1)

    try:
        if workers <= 1 or len(rows) <= 1:
            return [safe(r) for r in rows]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(safe, rows))
    finally:
        if bar is not None:
            bar.close()


def _run_judged(metric: JudgedMetric, rows: Sequence[Row], ctx: JudgeContext) -> MetricRun:
    """Run one LLM-judged metric over the rows, in parallel under the client's provider gate."""
    judge = ctx.judge(metric)
    workers = min(32, 2 * (ctx.client.gate.limit or 1))
    res = _parallel(
        lambda r: metric.apply(judge, r, ctx.cfg), rows, workers, desc=metric.name, progress=ctx.cfg.progress
    )
    columns = {name: build(res) for name, build in metric.columns.items()}
    return MetricRun(
        {metric.name: res},
        judged=True,
        headline="correctness" if metric.name == "correctness" else None,
        columns=columns,
    )


def _multiturn_runner(ctx: JudgeContext) -> MultiTurnRunner:
    """The three-agent runner, judging with the run's correctness judge (same prompt, format, budget)."""
    cfg = ctx.cfg
    return MultiTurnRunner(
        ctx.client,
        n_turns=cfg.multiturn_turns,
        language=cfg.language,
        judge=ctx.judge(JUDGED_METRICS["correctness"]),
        max_context_chars=cfg.max_context_chars,
        final_score=cfg.multiturn_final_score,
    )


def _run_multiturn(rows: Sequence[Row], runner: MultiTurnRunner, ctx: JudgeContext) -> MetricRun:
    """Converse with the system under test for every row (SPEC 2.2); wscore, lscore, mscore per row."""
    system = ctx.cfg.multiturn_system
    assert system is not None
    workers = min(32, 2 * (ctx.client.gate.limit or 1))
    outcomes: list[Any] = [None] * len(rows)

    def one(r: Row) -> JudgeResult:
        outcomes[r.index] = runner.run(system, r.question or "", r.reference or "", r.judge_contexts)
        return outcomes[r.index].to_judge_results()["wscore"]

    wres = _parallel(one, rows, workers, desc="multiturn", progress=ctx.cfg.progress)
    results: dict[str, list[JudgeResult]] = {"wscore": wres, "lscore": [], "mscore": []}
    for i, out in enumerate(outcomes):
        if out is None:  # the runner itself broke on this row: keep the row, failed
            results["lscore"].append(JudgeResult.failed(wres[i].reason or "internal_error", wres[i].rationale))
            results["mscore"].append(JudgeResult.failed(wres[i].reason or "internal_error", wres[i].rationale))
            continue
        jr = out.to_judge_results()
        results["lscore"].append(jr["lscore"])
        results["mscore"].append(jr["mscore"])
    columns = {
        "multiturn/sigma": [json.dumps(o.sigma) if o is not None else None for o in outcomes],
        "multiturn/stop": [o.stop if o is not None else None for o in outcomes],
        "multiturn/final_answer": [o.final_answer if o is not None else None for o in outcomes],
    }
    conversations = [{"row": i, **o.to_dict()} for i, o in enumerate(outcomes) if o is not None]
    return MetricRun(results, judged=True, columns=columns, artifacts={"multiturn_conversations.jsonl": conversations})


def _dry_run(
    rows: Sequence[Row],
    metrics: list[str],
    judged: list[str],
    ctx: JudgeContext | None,
    cfg: RagJudgeConfig,
    mode: str,
    skipped: dict[str, str],
    runner: MultiTurnRunner | None = None,
) -> EvalOutput:
    """Estimate judge calls and tokens per metric; nothing is sent."""
    from .pricing import cost_usd

    lines = []
    for m in judged:
        assert ctx is not None
        spec = JUDGED_METRICS[m]
        judge = ctx.judge(spec)
        est = [spec.estimate(judge, r, cfg) for r in rows]
        lines.append(
            {
                "metric": m,
                "rows": len(rows),
                "calls": sum(e["calls"] for e in est),
                "input_tokens": sum(e["input_tokens"] for e in est),
                "output_tokens": sum(e["output_tokens"] for e in est),
            }
        )
    if runner is not None:
        est = [runner.estimate(r.question or "", r.reference or "", r.judge_contexts) for r in rows]
        lines.append(
            {
                "metric": "multiturn",
                "rows": len(rows),
                "calls": sum(e["calls"] for e in est),
                "input_tokens": sum(e["input_tokens"] for e in est),
                "output_tokens": sum(e["output_tokens"] for e in est),
            }
        )
    for m in metrics:
        if m not in JUDGED_METRICS and m != "multiturn":
            lines.append({"metric": m, "rows": len(rows), "calls": 0, "input_tokens": 0, "output_tokens": 0})
    table = pd.DataFrame(lines, columns=["metric", "rows", "calls", "input_tokens", "output_tokens"])
    table["calls_per_row"] = table["calls"] / max(1, len(rows))
    out: dict[str, float] = {}
    for line in lines:
        for k in ("calls", "input_tokens", "output_tokens"):
            out[f"estimate/{line['metric']}/{k}"] = float(line[k])  # type: ignore[arg-type]
    for k in ("calls", "input_tokens", "output_tokens"):
        out[f"estimate/total/{k}"] = float(table[k].sum())
    model = ctx.client.model if ctx is not None else ""
    cost = cost_usd(model, int(out["estimate/total/input_tokens"]), int(out["estimate/total/output_tokens"]))
    if cost is not None and ctx is not None:
        out["estimate/total/cost_usd"] = cost
    record = {
        "package_version": __version__,
        "config": cfg.public_params(),
        "metrics_run": metrics,
        "dry_run": True,
        "context_mode": mode if "correctness" in metrics else None,
        "estimate": lines,
        "skipped": skipped,
        "rows": len(rows),
        "judge": ctx.client.identity() if ctx is not None else None,
    }
    params = {
        "ragjudge.version": __version__,
        "ragjudge.metrics": ",".join(metrics),
        "ragjudge.dry_run": "true",
        "ragjudge.judge": ctx.client.backend.uri if ctx is not None else "none",
    }
    return EvalOutput(out, table, {}, [], params, record, None, skipped)


def _value(v: float | None, abstain_reason: str) -> JudgeResult:
    """A deterministic metric's value; ``None`` (undefined, e.g. empty reference) is an abstention."""
    return JudgeResult.scored(v) if v is not None else JudgeResult.abstained(abstain_reason)


def _run_lexical(rows: Sequence[Row], cfg: RagJudgeConfig) -> MetricRun:
    from . import lexical

    wr, rl = [], []
    for r in rows:
        v = lexical.word_recall(r.answer or "", r.reference or "")
        wr.append(JudgeResult.scored(v) if v is not None else JudgeResult.abstained("empty_reference"))
        rl.append(_value(lexical.rouge_l(r.answer or "", r.reference or "")["f1"], "empty_reference"))
    out = MetricRun({"word_recall": wr, "rougeL": rl}, judged=False)
    if cfg.bertscore is False:
        out.skipped["bertscore_f1"] = "disabled by config (bertscore=False)"
        return out
    try:
        scorer = lexical.BertScorer.load()
    except lexical.BertScoreUnavailable as e:
        if cfg.bertscore is True:
            raise InputError(f"bertscore=True but BERTScore is unavailable: {e}") from e
        out.skipped["bertscore_f1"] = str(e)
        return out
    scores = scorer.score([r.answer or "" for r in rows], [r.reference or "" for r in rows])
    out.results["bertscore_f1"] = [_value(s["f1"], "empty_reference") for s in scores]
    return out


def _run_retrieval(rows: Sequence[Row], cfg: RagJudgeConfig) -> MetricRun:
    from . import lexical, retrieval

    ks = retrieval.validate_ks(cfg.k)
    results: dict[str, list[JudgeResult]] = {}
    skipped: dict[str, str] = {}
    extra: dict[str, float] = {}
    have_ids = any(r.retrieved_doc_ids is not None or r.relevant_doc_ids is not None for r in rows)
    if have_ids:
        # Rows without gold ids are skipped and counted (not averaged in as 0): a RAG dataset row with no
        # labelled documents is unlabelled, not a query that trec_eval's qrels say has no relevant document.
        scored = [r for r in rows if r.relevant_doc_ids]
        per_query = {
            r.index: retrieval.score_query(
                r.retrieved_doc_ids or [],
                r.relevant_doc_ids,
                ks=ks,
                relevance_threshold=cfg.relevance_threshold,
                validate=False,
            )
            for r in scored
        }
        keys = [k for k in next(iter(per_query.values()), {}) if not k.startswith("num_")]
        for key in keys:
            results[key] = [
                JudgeResult.scored(per_query[r.index][key])
                if r.index in per_query
                else JudgeResult.abstained("no_gold_ids")
                for r in rows
            ]
        extra["retrieval/rows_scored"] = float(len(scored))
        extra["retrieval/rows_without_gold_ids"] = float(len(rows) - len(scored))
        if len(scored) < len(rows):
            skipped["retrieval_rows_without_gold_ids"] = f"{len(rows) - len(scored)} row(s) have no relevant_doc_ids"
    have_chunks = any(r.contexts is not None for r in rows) and any(r.reference for r in rows)
    if have_chunks:
        p: list[JudgeResult] = []
        rc: list[JudgeResult] = []
        f: list[JudgeResult] = []
        for r in rows:
            if r.contexts is None or not r.reference:
                for lst in (p, rc, f):
                    lst.append(JudgeResult.abstained("no_contexts_or_reference"))
                continue
            s = lexical.context_rouge_l(r.contexts, r.reference)
            p.append(_value(s["precision"], "empty_reference"))
            rc.append(_value(s["recall"], "empty_reference"))
            f.append(_value(s["f1"], "empty_reference"))
        results.update({"context_rougeL_recall": rc, "context_rougeL_precision": p, "context_rougeL_f1": f})
    return MetricRun(results, judged=False, skipped=skipped, extra=extra)


# --------------------------------------------------------------------------- aggregation and table


def _aggregate_metric(
    name: str, results: list[JudgeResult], rows: Sequence[Row], judged: bool, levels: bool
) -> dict[str, float]:
    agg = aggregate(results, levels=levels)
    out: dict[str, float] = {}
    if judged:
        out.update(agg.as_metrics(name))
        if levels:
            for lvl in range(0, 6):
                key = "abstained" if lvl == 0 else str(lvl)
                out[f"{name}/share_level_{lvl}"] = agg.distribution.get(key, 0) / agg.count if agg.count else 0.0
    elif agg.mean is not None:
        out[f"{name}/mean"] = agg.mean
    groups = sorted({r.group for r in rows if r.group is not None})
    for g in groups:
        sub = [res for res, r in zip(results, rows) if r.group == g]
        gagg = aggregate(sub)
        gname = metric_name_safe(g)
        if gagg.mean is not None:
            out[f"{name}/mean/{gname}"] = gagg.mean
        if judged:
            out[f"{name}/count/{gname}"] = float(gagg.count)
    return out


def _cell(res: JudgeResult, level: bool = False) -> Any:
    if res.status is Status.SCORED:
        return res.value
    if level and res.status is Status.ABSTAINED and res.details.get("level") == 0:
        return 0.0
    return None


def _build_table(
    rows: Sequence[Row], runs: dict[str, MetricRun], df: pd.DataFrame, cfg: RagJudgeConfig
) -> pd.DataFrame:
    cols: dict[str, list[Any]] = {}
    cols["question"] = [r.question if r.question is not None else f"row {r.index}" for r in rows]
    headline = None
    for run in runs.values():
        if run.headline:
            headline = run.headline
            break
    if headline is None:
        for run in runs.values():
            if run.results:
                headline = next(iter(run.results))
                break
    ordered: list[tuple[str, JudgeResult | None, MetricRun]] = []
    for run in runs.values():
        for name in run.results:
            ordered.append((name, None, run))
    if headline is not None:
        ordered.sort(key=lambda t: t[0] != headline)
    for name, _, run in ordered:
        results = run.results[name]
        cols[f"{name}/score"] = [_cell(res, level=name == "correctness") for res in results]
        if run.judged:
            cols[f"{name}/justification"] = [res.rationale for res in results]
            cols[f"{name}/status"] = [res.status.value + (f":{res.reason}" if res.reason else "") for res in results]
    for run in runs.values():
        cols.update(run.columns)
    for logical in ("answer", "reference"):
        if any(getattr(r, logical) is not None for r in rows):
            cols[logical] = [getattr(r, logical) for r in rows]
    if any(r.group is not None for r in rows):
        cols["group"] = [r.group for r in rows]
    for hc in cfg.human_columns:
        cols[hc] = pd.to_numeric(df[hc], errors="coerce").tolist()
    return pd.DataFrame(cols)


def _meta(
    table: pd.DataFrame, runs: dict[str, MetricRun], cfg: RagJudgeConfig
) -> tuple[pd.DataFrame | None, dict[str, float]]:
    if not cfg.human_columns:
        return None, {}
    from . import meta

    names = [c[: -len("/score")] for c in table.columns if c.endswith("/score")]
    frame = pd.DataFrame({name: table[f"{name}/score"] for name in names})
    for hc in cfg.human_columns:
        frame[hc] = table[hc]
    # each metric's own abstentions (e.g. correctness level 0), for the "no_abstentions" subset
    masks = {
        name: table[f"{name}/status"].str.startswith("abstained").tolist()
        for name in names
        if f"{name}/status" in table.columns
    }
    result = meta.meta_evaluate(
        frame, names, cfg.human_columns, abstain_mask=masks or None, n_boot=cfg.n_boot, seed=cfg.seed
    )
    return result, meta.meta_metrics(result)


# --------------------------------------------------------------------------- failing loudly

#: what most often causes each failure reason, and what to do about it
LIKELY_FIX: dict[str, str] = {
    "parse_error": "the judge's replies could not be read in the requested format; look at raw_reply in "
                   "ragjudge/judge_transcripts.jsonl, use a model that follows JSON instructions, or pin "
                   "structured=json_object (or text) in the judge URI if the server mishandles JSON schemas",
    "inconsistent": "the judge's verdict lists did not cover every item even after asking again; use a stronger "
                    "judge model, or a server that enforces JSON schemas (structured=json_schema)",
    "ambiguous": "the judge gave two different verdicts in one reply; use a stronger judge model (with "
                 "Prometheus-style output, one that writes a single [RESULT])",
    "timeout": "judge requests timed out; raise timeout= (seconds per request) or lower max_concurrency",
    "rate_limited": "the provider kept rate-limiting; lower max_concurrency or set requests_per_minute to your "
                    "provider's limit",
    "connection_error": "the judge server could not be reached; check the base_url and that the server is running",
    "provider_error": "the provider answered with errors; check the model name and API key, and the 'error' field "
                      "of the transcripts",
    "refused": "the model refused to judge (content policy); try another judge model",
    "invalid_input": "rows lack what the metric needs; see the justification column of the per-row table",
    "internal_error": "an error inside mlflow-ragjudge; please report it with the transcript",
    "system_error": "the RAG system under test raised; see ragjudge/multiturn_conversations.jsonl",
}


def _failure_report(name: str, results: Sequence[JudgeResult], max_error_rate: float) -> dict[str, Any] | None:
    failed = [r for r in results if r.status is Status.FAILED]
    if not results or len(failed) / len(results) <= max_error_rate:
        return None
    reasons = Counter(r.reason or "unknown" for r in failed)
    top = reasons.most_common(1)[0][0]
    shown = ", ".join(f"{reason} x{count}" for reason, count in reasons.most_common())
    message = (
        f"'{name}' failed on {len(failed)} of {len(results)} rows (error rate {len(failed) / len(results):.2f} > "
        f"max_error_rate {max_error_rate:g}): {shown}. Likely fix: {LIKELY_FIX.get(top, 'see the transcripts')}."
    )
    example = next((r.rationale for r in failed if r.reason == top and r.rationale), "")
    if example:
        message += f" First error: {example[:200]}"
    return {"metric": name, "error_rate": len(failed) / len(results), "failed": len(failed), "rows": len(results),
            "reasons": dict(reasons), "message": message}


_OUTPUT_FAMILIES: dict[str, tuple[str, ...]] = {
    # metric -> the names (or name prefixes, ending in "_") of what it logs
    "multiturn": ("wscore", "lscore", "mscore"),
    "lexical": ("word_recall", "rougeL", "bertscore_f1"),
    "retrieval": ("precision_at_", "recall_at_", "f1_at_", "hit_rate_at_", "ndcg_at_", "mrr", "map",
                  "context_rougeL_"),
}


def gate_metric_name(name: str) -> str:
    """``correctness`` -> ``correctness/mean``; a full metric name is kept."""
    name = name.strip()
    return name if "/" in name else f"{name}/mean"


def _check_gate_names(fail_under: dict[str, float], metrics: Sequence[str]) -> None:
    for raw in fail_under:
        base = gate_metric_name(raw).split("/", 1)[0]
        known = any(
            base == f or (f.endswith("_") and base.startswith(f))
            for m in metrics for f in _OUTPUT_FAMILIES.get(m, (m,))
        )
        if not known:
            raise InputError(
                f"fail_under names {raw!r}, which this run does not produce (metrics: {', '.join(metrics)}). "
                "Use a metric's name (e.g. 'correctness', 'faithfulness', 'wscore') or a logged metric name "
                "such as 'correctness/mean'."
            )


def _gate(fail_under: dict[str, float], metrics_out: dict[str, float]) -> list[dict[str, Any]]:
    out = []
    for raw, threshold in fail_under.items():
        key = gate_metric_name(raw)
        value = metrics_out.get(key)
        out.append({"metric": key, "threshold": float(threshold), "value": value,
                    "passed": value is not None and value >= threshold})
    return out


# --------------------------------------------------------------------------- entry point


def evaluate_frame(
    data: pd.DataFrame,
    config: RagJudgeConfig | dict[str, Any] | None = None,
    *,
    client: JudgeClient | None = None,
    **overrides: Any,
) -> EvalOutput:
    """Evaluate a DataFrame of RAG outputs with the configured metrics.

    Args:
        data: one row per question; columns per SPEC 3.1 (rename with ``col_mapping``).
        config: a :class:`RagJudgeConfig` or its dict form; keyword overrides win.
        client: an existing judge client (default: one built from ``config.judge``).

    Raises:
        InputError: bad data, found before any judge call.
        ValueError: bad configuration.
    """
    if isinstance(config, RagJudgeConfig):
        cfg = config
        if overrides:
            cfg = RagJudgeConfig.from_dict({**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, **overrides})
    else:
        cfg = RagJudgeConfig.from_dict({**(config or {}), **overrides})
    if not isinstance(data, pd.DataFrame):
        raise InputError(f"data must be a pandas DataFrame, got {type(data).__name__}.")
    if len(data) == 0:
        raise InputError("The data has no rows: pass at least one row with question/answer/reference columns.")
    if cfg.metrics is None:
        metrics, skipped = _default_metrics(data, cfg)
        if not metrics:
            raise InputError(
                f"No metric can run on columns {list(data.columns)}: add question/answer/reference (correctness, "
                "lexical), retrieved_doc_ids/relevant_doc_ids (retrieval), or map yours with col_mapping."
            )
    else:
        metrics, skipped = list(dict.fromkeys(cfg.metrics)), {}
        _check_required(data, cfg, metrics)
    _check_gate_names(cfg.fail_under, metrics)
    repairs = _Repairs()
    rows = _read_rows(data, cfg, metrics, repairs)
    renamed = _check_metric_name_parts(rows, cfg)
    mode = "none"
    if "correctness" in metrics or "multiturn" in metrics:  # both judge with the six-level rubric
        mode = resolve_context_mode(cfg, rows, data)
        _prepare_judge_contexts(mode, cfg, rows, repairs)
    repairs.announce()
    if "retrieval" in metrics:  # validate ids before any judge call
        from . import retrieval

        retrieval.validate_ks(cfg.k)
        for r in rows:
            if r.relevant_doc_ids:
                retrieval.validate_retrieval_row(r.retrieved_doc_ids or [], r.relevant_doc_ids, r.index)
    judged = [m for m in metrics if m in JUDGED_METRICS]
    if "lexical" in metrics and cfg.bertscore is True:  # required: find out now, not after the judge calls
        from .lexical import BertScorer, BertScoreUnavailable

        try:
            BertScorer.load()
        except BertScoreUnavailable as e:
            raise InputError(f"bertscore=True but BERTScore is unavailable: {e}") from e
    embed = None
    if any(JUDGED_METRICS[m].needs_embeddings for m in judged):
        try:
            embed = resolve_embedder(cfg.embeddings, check_ready=not cfg.dry_run)
        except EmbeddingsUnavailable as e:
            if cfg.metrics is not None:  # asked for by name: an error, before any call
                raise InputError(f"Metric 'answer_relevancy' needs embeddings: {e}") from e
            metrics = [m for m in metrics if m != "answer_relevancy"]
            judged = [m for m in judged if m != "answer_relevancy"]
            skipped["answer_relevancy"] = str(e)
    if client is None and cfg.judge is not None and (judged or "multiturn" in metrics):
        client = JudgeClient(
            cfg.judge,
            cache=cfg.cache,
            max_concurrency=cfg.max_concurrency,
            requests_per_minute=cfg.requests_per_minute,
            timeout=cfg.timeout,
            max_attempts=cfg.max_attempts,
            check_ready=not cfg.dry_run,  # an estimate sends nothing, so it needs no API key
        )
    ctx = JudgeContext(client, cfg, embed) if client is not None else None
    runner = _multiturn_runner(ctx) if ctx is not None and "multiturn" in metrics else None
    if cfg.dry_run:
        assert ctx is not None or not judged
        return _dry_run(rows, metrics, judged, ctx, cfg, mode, skipped, runner)
    t0 = time.perf_counter()
    runs: dict[str, MetricRun] = {}
    try:
        for m in metrics:
            if m in JUDGED_METRICS:
                assert ctx is not None
                runs[m] = _run_judged(JUDGED_METRICS[m], rows, ctx)
            elif m == "multiturn":
                assert runner is not None and ctx is not None
                runs[m] = _run_multiturn(rows, runner, ctx)
            elif m == "lexical":
                runs[m] = _run_lexical(rows, cfg)
            elif m == "retrieval":
                runs[m] = _run_retrieval(rows, cfg)
            skipped.update(runs[m].skipped if m in runs else {})
        if "correctness" in runs:
            for res in runs["correctness"].results["correctness"]:
                res.details["context_mode"] = mode
        metrics_out: dict[str, float] = {}
        all_results: dict[str, list[JudgeResult]] = {}
        failures: list[dict[str, Any]] = []
        for m, run in runs.items():
            for name, results in run.results.items():
                all_results[name] = results
                metrics_out.update(_aggregate_metric(name, results, rows, run.judged, levels=name == "correctness"))
            if run.judged and run.results:  # one report per metric (multi-turn's three scores fail together)
                report = _failure_report(m, next(iter(run.results.values())), cfg.max_error_rate)
                if report is not None:
                    failures.append(report)
                    warnings.warn(report["message"], JudgeFailureWarning, stacklevel=2)
            metrics_out.update(run.extra)
        table = _build_table(rows, runs, data, cfg)
        meta_frame, meta_metrics = _meta(table, runs, cfg)
        metrics_out.update(meta_metrics)
        usage = client.summary() if client is not None else {}
        if client is not None:
            metrics_out["judge/input_tokens"] = float(usage["input_tokens"])
            metrics_out["judge/output_tokens"] = float(usage["output_tokens"])
            metrics_out["judge/calls"] = float(usage["calls"])
            metrics_out["judge/cache_hits"] = float(usage["cache_hits"])
            if usage.get("cost_usd") is not None:
                metrics_out["judge/cost_usd"] = float(usage["cost_usd"])
        prompt_versions: dict[str, str] = {}
        if ctx is not None:
            for m in judged:
                prompt_versions.update(ctx.judge(JUDGED_METRICS[m]).prompt_versions)
        if runner is not None:
            prompt_versions.update(runner.prompt_versions)
        record: dict[str, Any] = {
            "package_version": __version__,
            "config": cfg.public_params(),
            "metrics_run": metrics,
            "context_mode": mode if ("correctness" in metrics or "multiturn" in metrics) else None,
            "multiturn": {k: v for k, v in runner.settings.items() if k != "prompt_versions"} if runner else None,
            "faithfulness_evidence": cfg.faithfulness_evidence if "faithfulness" in metrics else None,
            "judge": client.identity() if client is not None else None,
            "prompt_versions": prompt_versions,
            "usage": usage,
            "skipped": skipped,
            "rows": len(rows),
            "seconds": round(time.perf_counter() - t0, 3),
            "failures": failures,
            "cache": (client.cache.status() if client.cache is not None else {"mode": "off"}) if client else None,
            "text_repairs": repairs.items,
            "metric_name_parts": renamed,
        }
        params = {
            "ragjudge.version": __version__,
            "ragjudge.metrics": ",".join(metrics),
            "ragjudge.judge": (client.backend.uri if client is not None else "none"),

            "ragjudge.context_mode": record["context_mode"] or "n/a",
            "ragjudge.prompt_versions": json.dumps(prompt_versions, sort_keys=True),
            "ragjudge.language": cfg.language,
            "ragjudge.k": json.dumps(cfg.k),
        }
        if runner is not None:
            params["ragjudge.multiturn"] = json.dumps(record["multiturn"], sort_keys=True)
        artifacts = {name: data for run in runs.values() for name, data in run.artifacts.items()}
        transcripts = [
            {"metric": "multiturn" if name == "wscore" else name, "row": i, **call}  # multi-turn calls ride on wscore
            for name, results in all_results.items()
            for i, res in enumerate(results)
            for call in res.calls
        ]
        per_metric = _usage_by_metric(transcripts, len(rows))
        for name, u in per_metric.items():
            for k, v in u.items():
                metrics_out[f"judge/{name}/{k}"] = v
        record["usage_by_metric"] = per_metric
        if client is not None:
            params.update(_judge_params(client, transcripts))
            record["structured_modes_used"] = sorted({t["structured_mode"] for t in transcripts
                                                      if t.get("structured_mode")})
        gate = _gate(cfg.fail_under, metrics_out)
        record["gate"] = gate
        return EvalOutput(metrics_out, table, all_results, transcripts, params, record, meta_frame, skipped, artifacts,
                          failures, gate)
    except Exception as e:
        if client is None or client.summary()["requests"] == 0:
            raise  # nothing was paid for: the error as it is
        # A failure after judge calls were paid for (a bug, or a metric that could not finish): the per-row
        # results and transcripts so far are written to disk before the error goes up, and the client's cache
        # keeps every reply, so a re-run pays only for what was not finished.
        saved = _save_partial(runs, client)
        raise LoggingFailed(
            f"The evaluation stopped after its judge calls ({type(e).__name__}: {e}); the results so far are not "
            + (f"lost: they are saved at {saved}" if saved else "saved locally (no writable folder)")
            + ("; a re-run takes the paid replies from the judge-call cache." if client is not None and
               client.cache is not None else "."),
            saved,
        ) from e


def local_output_root() -> Path:
    """Where results are saved before they are logged: ``$RAGJUDGE_OUTPUT_DIR``, else ``outputs/`` beside the
    judge-call cache."""
    env = os.environ.get("RAGJUDGE_OUTPUT_DIR")
    if env:
        return Path(env).expanduser()
    from .cache import default_cache_dir

    return default_cache_dir() / "outputs"


def _save_partial(runs: dict[str, MetricRun], client: JudgeClient | None) -> Path | None:
    """Write what the finished metrics produced (per-row results with their judge calls) to a local folder."""
    import tempfile

    stamp = time.strftime("%Y%m%d-%H%M%S")
    for root in (local_output_root(), Path(tempfile.gettempdir()) / "ragjudge-outputs"):
        folder = root / f"{stamp}-{os.getpid()}-partial"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / "results.jsonl", "w", encoding="utf-8", errors="backslashreplace") as fh:
                for run in runs.values():
                    for name, results in run.results.items():
                        for i, res in enumerate(results):
                            rec = {"metric": name, "row": i, **res.to_dict(), "calls": res.calls}
                            fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            if client is not None:
                with open(folder / "usage.json", "w", encoding="utf-8") as fh:
                    json.dump(client.summary(), fh, default=str)
            return folder
        except OSError:
            continue
    return None


def _judge_params(client: JudgeClient, transcripts: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Params that tell runs apart by judge: provider, model, server host (no credentials) and the
    structured-output mode the run's structured requests ended up using (``none`` if it sent none)."""
    url = safe_url(client.backend.base_url)
    structured = any(t.get("structured_mode") for t in transcripts)
    return {
        "ragjudge.judge.provider": client.backend.provider,
        "ragjudge.judge.model": client.backend.model,
        "ragjudge.judge.base_url_host": url.split("://", 1)[-1].split("/", 1)[0] if url else "default",
        "ragjudge.judge.structured": client.structured_mode if structured else "none",
    }


def _usage_by_metric(transcripts: Sequence[dict[str, Any]], n_rows: int) -> dict[str, dict[str, float]]:
    """Requests sent, cache hits and tokens per metric, and requests per row: what each metric costs."""
    out: dict[str, dict[str, float]] = {}
    for rec in transcripts:
        u = out.setdefault(rec["metric"], {"requests": 0.0, "cache_hits": 0.0, "input_tokens": 0.0,
                                           "output_tokens": 0.0})
        if rec.get("cache_hit"):
            u["cache_hits"] += 1
        else:
            u["requests"] += float(rec.get("attempts") or 0)
        u["input_tokens"] += float(rec.get("input_tokens") or 0)
        u["output_tokens"] += float(rec.get("output_tokens") or 0)
    for u in out.values():
        u["requests_per_row"] = u["requests"] / max(1, n_rows)
    return out


def available_metrics() -> tuple[str, ...]:
    return BUILT_METRICS
