"""Evaluate a DataFrame of RAG outputs: the engine behind the MLflow evaluator, the scorers' aggregation
and the CLI. No mlflow import here, and no metric names: every metric is a
:class:`~mlflow_ragjudge.registry.MetricSpec` from the registry.

Four steps:

1. **validate** -- the config, the metrics (from the registry; by default every one whose columns are there),
   every row (:mod:`mlflow_ragjudge.inputs`), each metric's own row checks: all before any judge call;
2. **prepare** -- the six-level judge's contexts (E3 retrieval) for metrics that need them, embeddings, the
   judge client and each metric's state;
3. **schedule** -- every (row, metric) task goes into one pool; the judge client's provider gate bounds the
   calls in flight. There is no barrier between metrics: a slow or hung call delays only its own row;
4. **aggregate** -- overall and per-group metrics, the per-row table, meta-evaluation, usage, the run record.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.constants import CONTEXT_PROVENANCE, LOGICAL_COLUMNS, is_offline_judge
from ..core.constants import VERSION as __version__
from ..core.errors import (
    CalibrationWarning,
    EmbeddingsUnavailable,
    InputError,
    InvalidTextWarning,
    JudgeFailureWarning,
    LoggingFailed,
    MetricUnavailable,
    TooFewLabels,
)
from ..core.types import JudgeResult, Row, Status, aggregate, metric_name_parts, metric_name_safe
from ..llm.backends import safe_url
from ..llm.cache import default_cache_dir
from ..llm.client import JudgeClient
from ..llm.embeddings import embeddings_fix, resolve_embedder
from ..llm.pricing import cost_usd
from ..metrics.offline import resolve_offline
from ..metrics.spec import Finish, MetricSpec, RunContext, all_specs, get_metric, metric_names
from . import meta
from .config import RagJudgeConfig
from .inputs import (
    Repairs,
    check_human_labels,
    e3_query,
    primary_mode,
    read_rows,
    resolve_context_modes,
    resolve_row_contexts,
    row_ids,
)
from .ppi import MIN_LABELS, labels_only_mean, ppi_mean

__all__ = [
    "evaluate_frame",
    "EvalOutput",
    "InputError",
    "InvalidTextWarning",
    "JudgeFailureWarning",
    "LoggingFailed",
    "Row",
    "e3_query",
    "metric_name_safe",
]


@dataclass
class EvalOutput:
    """Everything one evaluation produced.

    Attributes:
        metrics: aggregate metrics as logged (``correctness/mean`` ...).
        table: the per-row table (question first, the headline score second).
        results: result name -> per-row :class:`JudgeResult` list.
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


# --------------------------------------------------------------------------- 1. validate


def _present(df: pd.DataFrame, cfg: RagJudgeConfig, logical: str) -> bool:
    return cfg.column(logical) in df.columns


def _has_columns(spec: MetricSpec, df: pd.DataFrame, cfg: RagJudgeConfig) -> bool:
    return any(all(_present(df, cfg, c) for c in alt) for alt in spec.requirements(cfg))


def _select(df: pd.DataFrame, cfg: RagJudgeConfig) -> tuple[list[MetricSpec], dict[str, str]]:
    """The metrics of the run and, for defaulted ones that cannot run, why. Under the offline judge, a judged
    metric is run by its offline scorer (:meth:`MetricSpec.for_offline_judge`), and one the offline judge cannot
    score is skipped with the reason (asked for by name: an input error)."""
    skipped: dict[str, str] = {}
    offline = is_offline_judge(cfg.judge)
    if cfg.metrics is None:
        chosen = []
        for spec in all_specs():
            if not _has_columns(spec, df, cfg) or not spec.runs_by_default(cfg):
                continue
            if spec.judged and cfg.judge is None:
                skipped[spec.name] = ("no judge configured (set judge='openai:/gpt-4o-mini' or similar, or "
                                      "judge='offline:/lexical' for the offline judge, no LLM)")
                continue
            if offline and spec.offline_reason():
                skipped[spec.name] = str(spec.offline_reason())
                continue
            reason = spec.check(cfg) if spec.check is not None else None
            if reason:
                skipped[spec.name] = reason
                continue
            chosen.append(spec)
        if not chosen:
            raise InputError(
                f"No metric can run on columns {list(df.columns)}: add question/answer/reference (correctness, "
                "lexical), retrieved_doc_ids/relevant_doc_ids (retrieval), or map yours with col_mapping."
            )
        return [s.for_offline_judge() for s in chosen] if offline else chosen, skipped
    chosen = [get_metric(m) for m in dict.fromkeys(cfg.metrics)]
    for spec in chosen:
        if _has_columns(spec, df, cfg):
            continue
        alternatives = spec.requirements(cfg)
        alt = alternatives[0]
        missing = [cfg.column(c) for c in alt if not _present(df, cfg, c)]
        what = [LOGICAL_COLUMNS[c] for c in alt if not _present(df, cfg, c)]
        raise InputError(
            f"Metric '{spec.name}' needs column(s) {missing} ({'; '.join(what)})"
            f", but the data has {list(df.columns)}. Add the column, or map yours with "
            f"col_mapping={{'{alt[0]}': '<your column>'}}."
            + (" Alternatively: " + " or ".join(str(list(a)) for a in alternatives[1:]) if len(alternatives) > 1
               else "")
        )
    for spec in chosen:
        reason = spec.check(cfg) if spec.check is not None else None
        if reason:
            raise InputError(reason)
    needs_judge = [s.name for s in chosen if s.judged]
    if needs_judge and cfg.judge is None:
        raise InputError(
            f"Metric(s) {needs_judge} need a judge model: set judge='openai:/gpt-4o-mini' (or any judge URI), or "
            "judge='offline:/lexical' for the offline judge (no LLM)."
        )
    if offline:
        for spec in chosen:
            reason = spec.offline_reason()
            if reason:
                raise InputError(reason[0].upper() + reason[1:] + ".")
        chosen = [s.for_offline_judge() for s in chosen]
    return chosen, skipped


def gate_metric_name(name: str) -> str:
    """``correctness`` -> ``correctness/mean``; a full metric name is kept."""
    name = name.strip()
    return name if "/" in name else f"{name}/mean"


def _check_gate_names(fail_under: dict[str, float], specs: Sequence[MetricSpec]) -> None:
    for raw in fail_under:
        base = gate_metric_name(raw).split("/", 1)[0]
        if not any(s.produces(base) for s in specs):
            raise InputError(
                f"fail_under names {raw!r}, which this run does not produce (metrics: "
                f"{', '.join(s.name for s in specs)}). Use a metric's name (e.g. 'correctness', 'faithfulness', "
                "'wscore') or a logged metric name such as 'correctness/mean'."
            )


def _check_metric_name_parts(rows: Sequence[Row], cfg: RagJudgeConfig) -> dict[str, str]:
    """Groups and human-score columns become metric name segments: refuse two that would share one, before
    any call, and return the ones logged under a changed name (recorded in the run's config)."""
    renamed: dict[str, str] = {}
    for texts, what in (({r.group for r in rows if r.group is not None}, "group"),
                        (set(cfg.human_columns) | set(cfg.human_labels.values()), "human-score column")):
        try:
            names = metric_name_parts(sorted(texts), what)
        except ValueError as e:
            raise InputError(str(e)) from e
        renamed.update({k: v for k, v in names.items() if k != v})
    return renamed


def labelled_outputs(specs: Sequence[MetricSpec]) -> dict[str, tuple[float, float] | None]:
    """Output name -> its scale, for the outputs of ``specs`` that human labels can be given for."""
    return {o: s.scale_of(o) for s in specs for o in s.output_names if not o.endswith("_")}


# --------------------------------------------------------------------------- 2. prepare


def _prepare_judge_contexts(specs: Sequence[MetricSpec], cfg: RagJudgeConfig, rows: Sequence[Row],
                            df: pd.DataFrame, repairs: Repairs) -> str | None:
    """Resolve the context mode and every row's judge contexts (E3 retrieval included), for the metrics that
    judge with them; None when no metric does."""
    if not any(s.needs_judge_contexts for s in specs):
        return None
    modes = resolve_context_modes(cfg.context_mode, retriever=cfg.retriever, has=lambda c: _present(df, cfg, c))
    if ("reference" in modes and cfg.retriever is None and _present(df, cfg, "reference_contexts")
            and {"source_doc_id", "generation_status"} <= set(df.columns)):
        # a test set written by an earlier `ragjudge testset`, which put its writer's evidence there
        raise InputError(
            f"Column '{cfg.column('reference_contexts')}' of this test set (it has source_doc_id and "
            "generation_status, as `ragjudge testset` writes) holds the question writer's evidence, not passages "
            "retrieved with question + reference answer (E3). Rename it to 'evidence_contexts' to judge with it "
            "(context_mode='evidence'), or pass retriever=<callable query -> passages> for E3.")
    for r in rows:
        resolve_row_contexts(r, modes, cfg.retriever, repairs)
    return primary_mode(modes)


def _build_client(cfg: RagJudgeConfig) -> JudgeClient:
    return JudgeClient(
        cfg.judge,  # type: ignore[arg-type]  # checked by _select: judged metrics need a judge
        cache=cfg.cache,
        max_concurrency=cfg.max_concurrency,
        requests_per_minute=cfg.requests_per_minute,
        timeout=cfg.timeout,
        max_attempts=cfg.max_attempts,
        check_ready=not cfg.dry_run,  # an estimate sends nothing, so it needs no API key
        dedupe=True,  # metrics that need the same reply share it
        batch=cfg.batch if cfg.batch and not cfg.dry_run else None,
    )


def _setup(specs: list[MetricSpec], ctx: RunContext, skipped: dict[str, str], asked: bool) -> dict[str, Any]:
    """Each metric's state, built before any call; a metric that cannot run here is an input error when asked
    for by name, else skipped with the reason."""
    states: dict[str, Any] = {}
    for spec in list(specs):
        try:
            states[spec.name] = spec.setup(ctx) if spec.setup is not None else None
        except MetricUnavailable as e:
            if asked:
                raise InputError(f"Metric '{spec.name}' cannot run: {e}") from e
            skipped[spec.name] = str(e)
            specs.remove(spec)
    return states


# --------------------------------------------------------------------------- 3. schedule


def _progress_bar(total: int, desc: str, setting: bool | str) -> Any:
    """A tqdm bar on stderr (``progress='auto'``: only on a terminal), or None."""
    if setting is False or (setting == "auto" and not sys.stderr.isatty()):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="task", file=sys.stderr)


_ERROR_KEY = "__error__"


def _as_results(spec: MetricSpec, value: Any) -> dict[str, JudgeResult]:
    if isinstance(value, JudgeResult):
        return {spec.name: value}
    if not isinstance(value, dict) or not all(isinstance(v, JudgeResult) for v in value.values()):
        raise TypeError(f"metric {spec.name!r} returned {type(value).__name__}; it must return a JudgeResult "
                        "or a dict of output name -> JudgeResult")
    return value


def _crash(e: BaseException) -> dict[str, JudgeResult]:
    return {_ERROR_KEY: JudgeResult.failed("internal_error", f"{type(e).__name__}: {e}")}


def _workers(ctx: RunContext, tasks: int) -> int:
    """Threads for the pool: enough to keep the provider gate full while some tasks wait on earlier calls of
    their row (a task makes one to three calls in a row); the gate, not the pool, bounds what is in flight."""
    if ctx.client is None:
        return 1
    limit = ctx.client.max_concurrency or ctx.client.gate.ceiling
    return max(1, min(tasks, 256, max(8, 2 * limit)))


def _schedule(specs: Sequence[MetricSpec], states: dict[str, Any], rows: Sequence[Row],
              ctx: RunContext) -> dict[str, list[dict[str, JudgeResult]]]:
    """Score every (row, metric) in one pool; returns metric -> per-row results. Never raises for a metric's
    exception: it fails that row (``internal_error``) and the run goes on."""
    out: dict[str, list[dict[str, JudgeResult]]] = {s.name: [{} for _ in rows] for s in specs}
    per_row = [s for s in specs if s.score is not None]
    batched = [s for s in specs if s.score_batch is not None]
    total = len(rows) * len(per_row) + len(batched)
    names = ", ".join(s.name for s in specs)
    bar = _progress_bar(total, f"ragjudge ({names})" if len(names) <= 60 else "ragjudge", ctx.cfg.progress)

    runner = ctx.client.batch if ctx.client is not None else None

    def one(spec: MetricSpec, i: int) -> None:
        try:
            assert spec.score is not None
            with _task(runner, spec):
                out[spec.name][i] = _as_results(spec, spec.score(states[spec.name], rows[i], ctx))
        except Exception as e:  # a bug must not lose the row or the run
            out[spec.name][i] = _crash(e)
        finally:
            if bar is not None:
                bar.update(1)

    def batch(spec: MetricSpec) -> None:
        try:
            assert spec.score_batch is not None
            with _task(runner, spec):
                got = spec.score_batch(states[spec.name], rows, ctx)
            if len(got) != len(rows):
                raise ValueError(f"metric {spec.name!r} returned {len(got)} results for {len(rows)} rows")
            out[spec.name] = [_as_results(spec, g) for g in got]
        except Exception as e:
            out[spec.name] = [_crash(e) for _ in rows]
        finally:
            if bar is not None:
                bar.update(1)

    jobs: list[Callable[[], None]] = [lambda s=s: batch(s) for s in batched]  # type: ignore[misc]
    # row-major: a row's metrics start together, so work they share (one statement extraction, one combined
    # call) is asked for once and its row finishes early
    jobs += [lambda s=s, i=i: one(s, i) for i in range(len(rows)) for s in per_row]  # type: ignore[misc]
    try:
        workers = _workers(ctx, len(jobs))
        if runner is not None:  # every running task may add a line to the next batch: run them all at once
            workers = max(1, min(len(jobs), runner.options.threads))
        if workers <= 1:
            for job in jobs:
                job()
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ragjudge") as pool:
                for f in [pool.submit(job) for job in jobs]:
                    f.result()
    finally:
        if bar is not None:
            bar.close()
        if runner is not None:
            runner.close()
    return out


def _task(runner: Any, spec: MetricSpec) -> Any:
    """The context a task runs in: inside the batch runner for a batchable metric, synchronous otherwise."""
    import contextlib

    if runner is None:
        return contextlib.nullcontext()
    return runner.task() if spec.batchable else runner.synchronous()


def _by_output(spec: MetricSpec, per_row: list[dict[str, JudgeResult]]) -> dict[str, list[JudgeResult]]:
    """Per-row results of one metric, as output name -> list over rows; a row whose scoring crashed fails each
    output with the error."""
    names: list[str] = []
    for res in per_row:
        for name in res:
            if name != _ERROR_KEY and name not in names:
                names.append(name)
    if not names and any(_ERROR_KEY in r for r in per_row):
        names = [o for o in spec.output_names if not o.endswith("_")] or [spec.name]
    out: dict[str, list[JudgeResult]] = {n: [] for n in names}
    for res in per_row:
        for n in names:
            if n in res:
                out[n].append(res[n])
            elif _ERROR_KEY in res:
                err = res[_ERROR_KEY]
                out[n].append(JudgeResult.failed(err.reason or "internal_error", err.rationale))
            else:
                out[n].append(JudgeResult.abstained("not_applicable", f"{spec.name} gave no {n} for this row"))
    return out


# --------------------------------------------------------------------------- dry run


def _dry_run(rows: Sequence[Row], specs: Sequence[MetricSpec], states: dict[str, Any], ctx: RunContext,
             mode: str | None, skipped: dict[str, str]) -> EvalOutput:
    """Estimate judge calls and tokens per metric; nothing is sent."""
    cfg, client = ctx.cfg, ctx.client
    lines = []
    for spec in specs:
        est = [spec.estimate(states[spec.name], r, ctx) for r in rows] if spec.estimate is not None else []
        lines.append({"metric": spec.name, "rows": len(rows),
                      **{k: sum(e[k] for e in est) for k in ("calls", "input_tokens", "output_tokens")}})
    table = pd.DataFrame(lines, columns=["metric", "rows", "calls", "input_tokens", "output_tokens"])
    table["calls_per_row"] = table["calls"] / max(1, len(rows))
    out: dict[str, float] = {}
    for line in lines:
        for k in ("calls", "input_tokens", "output_tokens"):
            out[f"estimate/{line['metric']}/{k}"] = float(line[k])  # type: ignore[arg-type]
    for k in ("calls", "input_tokens", "output_tokens"):
        out[f"estimate/total/{k}"] = float(table[k].sum())
    model = client.model if client is not None else ""
    cost = cost_usd(model, int(out["estimate/total/input_tokens"]), int(out["estimate/total/output_tokens"]))
    if cost is not None and client is not None:
        out["estimate/total/cost_usd"] = cost
        if client.backend.supports_batch:  # the same calls through the provider's batch API
            out["estimate/total/batch_cost_usd"] = cost_usd(
                model, int(out["estimate/total/input_tokens"]), int(out["estimate/total/output_tokens"]),
                batch_provider=client.backend.provider) or 0.0
    names = [s.name for s in specs]
    record = {
        "package_version": __version__,
        "config": cfg.public_params(),
        "metrics_run": names,
        "dry_run": True,
        "context_mode": mode,
        "estimate": lines,
        "skipped": skipped,
        "rows": len(rows),
        "judge": client.identity() if client is not None else None,
    }
    params = {
        "ragjudge.version": __version__,
        "ragjudge.metrics": ",".join(names),
        "ragjudge.dry_run": "true",
        "ragjudge.judge": _judge_uri(client, cfg),
    }
    return EvalOutput(out, table, {}, [], params, record, None, skipped)


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
            out[f"{name}/n_scored/{gname}"] = float(gagg.n_scored)
    return out


def _on_levels(spec: MetricSpec, name: str) -> bool:
    """Whether an output is on the six-level scale (``levels`` lists names, or prefixes ending in ``_``)."""
    return any(name == lv or (lv.endswith("_") and name.startswith(lv)) for lv in spec.levels)


def _safe_cell(build: Callable[[dict[str, JudgeResult]], Any], res: dict[str, JudgeResult]) -> Any:
    try:
        return build(res)
    except Exception:  # an extra column never costs the table
        return None


def _cell(res: JudgeResult, level: bool = False) -> Any:
    if res.status is Status.SCORED:
        return res.value
    if level and res.status is Status.ABSTAINED and res.details.get("level") == 0:
        return 0.0
    return None


def _build_table(rows: Sequence[Row], specs: Sequence[MetricSpec], results: dict[str, dict[str, list[JudgeResult]]],
                 per_row: dict[str, list[dict[str, JudgeResult]]], finishes: dict[str, Finish],
                 df: pd.DataFrame, cfg: RagJudgeConfig) -> pd.DataFrame:
    cols: dict[str, list[Any]] = {}
    cols["question"] = [r.question if r.question is not None else f"row {r.index}" for r in rows]
    ordered = sorted(specs, key=lambda s: not s.headline)  # the headline score right after the question
    for spec in ordered:
        for name, res in results[spec.name].items():
            cols[f"{name}/score"] = [_cell(x, level=_on_levels(spec, name)) for x in res]
            if spec.judged:
                cols[f"{name}/justification"] = [x.rationale for x in res]
                cols[f"{name}/status"] = [x.status.value + (f":{x.reason}" if x.reason else "") for x in res]
    for spec in specs:
        for column, build in spec.columns.items():
            cols[column] = [None if _ERROR_KEY in res else _safe_cell(build, res) for res in per_row[spec.name]]
        cols.update(finishes[spec.name].columns)
    if any(r.answer is not None for r in rows):
        cols["answer"] = [r.answer for r in rows]
    if any(r.reference is not None for r in rows):
        # several acceptable answers are shown as a JSON list, one answer as its text
        cols["reference"] = [json.dumps(r.references, ensure_ascii=False) if r.references else r.reference
                             for r in rows]
    if any(r.group is not None for r in rows):
        cols["group"] = [r.group for r in rows]
    cols["row_id"] = row_ids(df, cfg, rows)
    for hc in dict.fromkeys([*cfg.human_columns, *cfg.human_labels.values()]):
        cols[hc] = pd.to_numeric(df[hc], errors="coerce").tolist()
    return pd.DataFrame(cols)


def _meta(table: pd.DataFrame, cfg: RagJudgeConfig) -> tuple[pd.DataFrame | None, dict[str, float]]:
    """Agreement with humans: every metric against every ``human_columns`` column, and each metric of
    ``human_labels`` against its own label column."""
    if not cfg.human_columns and not cfg.human_labels:
        return None, {}

    names = [c[: -len("/score")] for c in table.columns if c.endswith("/score")]
    frame = pd.DataFrame({name: table[f"{name}/score"] for name in names})
    humans = list(dict.fromkeys([*cfg.human_columns, *cfg.human_labels.values()]))
    for hc in humans:
        frame[hc] = table[hc]
    # each metric's own abstentions (e.g. correctness level 0), for the "no_abstentions" subset
    masks = {
        name: table[f"{name}/status"].str.startswith("abstained").tolist()
        for name in names
        if f"{name}/status" in table.columns
    }
    pairs = [(names, list(cfg.human_columns))] if cfg.human_columns else []
    pairs += [([m], [c]) for m, c in cfg.human_labels.items() if m in names and c not in cfg.human_columns]
    parts = [
        meta.meta_evaluate(
            frame, ms, hs, abstain_mask=masks or None, n_boot=cfg.n_boot, seed=cfg.seed,
            human_not_sure={hc: human_not_sure_values(cfg.human_not_sure, frame[hc]) for hc in hs},
        )
        for ms, hs in pairs
    ]
    if not parts:
        return None, {}
    result = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return result, meta.meta_metrics(result)


def _calibrate(table: pd.DataFrame, specs: Sequence[MetricSpec], results: dict[str, list[JudgeResult]],
               cfg: RagJudgeConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """The human-calibrated estimate of each metric of ``human_labels`` (PPI++, :func:`mlflow_ragjudge.ppi_mean`):
    logged metrics and the run record's ``calibration`` entry. A metric whose labelled rows the judge did not score
    enough of gets no estimate, with the reason recorded and warned about, never a NaN."""
    out: dict[str, float] = {}
    record: dict[str, Any] = {}
    scales = labelled_outputs(specs)
    for metric, col in cfg.human_labels.items():
        if metric not in results:
            continue
        judge = [float(r.value) if r.is_scored and r.value is not None else float("nan") for r in results[metric]]
        human = pd.to_numeric(table[col], errors="coerce").astype(float)
        unsure = 0
        if scales.get(metric) == (1.0, 5.0):  # a human "not sure" (0) on the six-level scale is no label
            unsure = int((human == 0).sum())
            human = human.where(human != 0)
        try:
            est = ppi_mean(judge, human.to_numpy(), alpha=CALIBRATION_ALPHA)
        except TooFewLabels as e:
            # say what happened -- the judge gave no score on labelled rows -- and give what the labels alone say
            why = (f"{e.n_usable} labelled row(s) have a judge score, fewer than the {e.min_labelled} a calibrated "
                   f"interval needs ({e.n_labels} labelled, {e.n_excluded_labelled} of them not scored by the judge)")
            entry: dict[str, Any] = {"labels": col, "error": why, "n_human_not_sure": unsure}
            try:
                only = labels_only_mean(human.to_numpy(), alpha=CALIBRATION_ALPHA)
            except TooFewLabels:
                why += "; the labels alone are too few for an interval too"
            else:
                out.update(only.as_metrics(metric))
                entry["labels_only"] = only.as_dict()
                why += (f"; the labels alone (every labelled row, judge or not): {only.mean:.3f} "
                        f"[{only.ci_low:.3f}, {only.ci_high:.3f}] from {only.n_labelled} labels")
            entry["error"] = why
            record[metric] = entry
            warnings.warn(f"No calibrated estimate for {metric!r}: {why}", CalibrationWarning, stacklevel=4)
            continue
        out.update(est.as_metrics(metric))
        record[metric] = {"labels": col, **est.as_dict(), "n_human_not_sure": unsure,
                          "method": "PPI++ (mlflow_ragjudge.ppi.ppi_mean)"}
        if est.selection_p is not None and est.selection_p < SELECTION_P:
            message = (f"The labelled rows of {metric!r} do not look like a random sample: the judge's mean on them "
                       f"({est.judge_mean_labelled:.3f}) differs from the rest's (p = {est.selection_p:.2g}). The "
                       "calibrated interval is valid only for randomly chosen rows; draw them with "
                       "`ragjudge label-sample`.")
            record[metric]["warning"] = message
            warnings.warn(message, CalibrationWarning, stacklevel=4)
    return out, record


#: the level of the calibrated intervals logged by a run
CALIBRATION_ALPHA = 0.05
#: below this p-value of the judge's scores on labelled vs unlabelled rows, the labels are said not to look random
SELECTION_P = 0.01


def human_not_sure_values(setting: Any, column: pd.Series) -> list[float]:
    """The human scores that mean "not sure" in one column: ``"auto"`` is ``[0]`` for a column on the six-level
    scale (whole numbers 0..5 that reach 2 or more) and nothing otherwise (a 0/1 or a continuous column, where
    0 is a judgement); a list is taken as it is; None keeps every score."""
    if setting is None:
        return []
    if setting != "auto":
        return [float(x) for x in setting]
    values = pd.to_numeric(column, errors="coerce").dropna()
    six_level = len(values) > 0 and bool(values.isin([0, 1, 2, 3, 4, 5]).all()) and values.max() >= 2
    return [0.0] if six_level else []


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


def _gate(fail_under: dict[str, float], metrics_out: dict[str, float]) -> list[dict[str, Any]]:
    out = []
    for raw, threshold in fail_under.items():
        key = gate_metric_name(raw)
        value = metrics_out.get(key)
        out.append({"metric": key, "threshold": float(threshold), "value": value,
                    "passed": value is not None and value >= threshold})
    return out


# --------------------------------------------------------------------------- entry point


def _config(config: RagJudgeConfig | dict[str, Any] | None, overrides: dict[str, Any]) -> RagJudgeConfig:
    if isinstance(config, RagJudgeConfig):
        if not overrides:
            return config
        return RagJudgeConfig.from_dict({**{f: getattr(config, f) for f in config.__dataclass_fields__}, **overrides})
    return RagJudgeConfig.from_dict({**(config or {}), **overrides})


def _embeddings(specs: list[MetricSpec], cfg: RagJudgeConfig, client: JudgeClient | None,
                skipped: dict[str, str]) -> Callable[[list[str]], list[list[float]]] | None:
    """The run's embeddings, when a metric needs them; a metric asked for by name without them is an input
    error, a defaulted one is skipped with the reason."""
    wanting = [s for s in specs if s.needs_embeddings]
    if not wanting:
        return None
    try:
        return resolve_embedder(cfg.embeddings, client=client, check_ready=not cfg.dry_run)
    except EmbeddingsUnavailable as e:
        fix = embeddings_fix(cfg.judge)
        if cfg.metrics is not None:
            raise InputError(f"Metric '{wanting[0].name}' needs embeddings ({e.reason}); {fix}.") from e
        for s in wanting:
            specs.remove(s)
            skipped[s.name] = f"needs embeddings ({e.reason}); {fix}"
        return None


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
    cfg = _config(config, overrides)
    if not isinstance(data, pd.DataFrame):
        raise InputError(f"data must be a pandas DataFrame, got {type(data).__name__}.")
    if len(data) == 0:
        raise InputError("The data has no rows: pass at least one row with question/answer/reference columns.")
    # 1. validate: metrics, rows, each metric's own checks -- before any call
    specs, skipped = _select(data, cfg)
    _check_gate_names(cfg.fail_under, specs)
    if cfg.batch and (cfg.judge is None or is_offline_judge(cfg.judge)):
        raise InputError("batch=True sends judge calls through a provider's batch API, but this run has no LLM judge "
                         f"({'the offline judge sends nothing' if cfg.judge else 'judge is not set'}); drop batch, or "
                         "set judge='openai:/...' or 'anthropic:/...'.")
    if cfg.human_labels:
        check_human_labels(data, cfg, labelled_outputs(specs), min_labelled=MIN_LABELS)
    repairs = Repairs()
    required = {c for s in specs for c in s.text_columns(cfg)}
    rows = read_rows(data, cfg, required_text=required, repairs=repairs)
    renamed = _check_metric_name_parts(rows, cfg)
    mode = _prepare_judge_contexts(specs, cfg, rows, data, repairs)
    repairs.announce()
    for spec in specs:
        if spec.validate is not None:
            spec.validate(rows, cfg)
    # 2. prepare: the client, embeddings and each metric's state
    if client is None and cfg.judge is not None and not is_offline_judge(cfg.judge) and any(s.judged for s in specs):
        client = _build_client(cfg)
    embed = _embeddings(specs, cfg, client, skipped)
    ctx = RunContext(client, cfg, embed, metrics=tuple(s.name for s in specs), context_mode=mode, rows=rows)
    states = _setup(specs, ctx, skipped, asked=cfg.metrics is not None)
    ctx.metrics = tuple(s.name for s in specs)
    if cfg.dry_run:
        return _dry_run(rows, specs, states, ctx, mode, skipped)
    t0 = time.perf_counter()
    per_row: dict[str, list[dict[str, JudgeResult]]] = {}
    try:
        # 3. schedule
        per_row = _schedule(specs, states, rows, ctx)
        # 4. aggregate
        return _assemble(specs, states, per_row, rows, ctx, data, mode, skipped, repairs, renamed, t0)
    except Exception as e:
        if client is None or client.summary()["requests"] == 0:
            raise  # nothing was paid for: the error as it is
        # A failure after judge calls were paid for (a bug, or a metric that could not finish): the per-row
        # results and transcripts so far are written to disk before the error goes up, and the client's cache
        # keeps every reply, so a re-run pays only for what was not finished.
        saved = _save_partial(per_row, client)
        raise LoggingFailed(
            f"The evaluation stopped after its judge calls ({type(e).__name__}: {e}); the results so far are not "
            + (f"lost: they are saved at {saved}" if saved else "saved locally (no writable folder)")
            + ("; a re-run takes the paid replies from the judge-call cache." if client.cache is not None else "."),
            saved,
        ) from e


def _assemble(specs: Sequence[MetricSpec], states: dict[str, Any], per_row: dict[str, list[dict[str, JudgeResult]]],
              rows: Sequence[Row], ctx: RunContext, data: pd.DataFrame, mode: str | None, skipped: dict[str, str],
              repairs: Repairs, renamed: dict[str, str], t0: float) -> EvalOutput:
    cfg, client = ctx.cfg, ctx.client
    results = {s.name: _by_output(s, per_row[s.name]) for s in specs}
    finishes: dict[str, Finish] = {}
    for spec in specs:
        outputs = results[spec.name]
        by_row = [{name: outputs[name][i] for name in outputs} for i in range(len(rows))]
        finishes[spec.name] = spec.finish(states[spec.name], rows, by_row, ctx) if spec.finish else Finish()
        skipped.update(finishes[spec.name].skipped)
    metrics_out: dict[str, float] = {}
    all_results: dict[str, list[JudgeResult]] = {}
    failures: list[dict[str, Any]] = []
    for spec in specs:
        for name, res in results[spec.name].items():
            all_results[name] = res
            metrics_out.update(_aggregate_metric(name, res, rows, spec.judged, levels=_on_levels(spec, name)))
        if spec.judged and results[spec.name]:  # one report per metric (multi-turn's three scores fail together)
            report = _failure_report(spec.name, next(iter(results[spec.name].values())), cfg.max_error_rate)
            if report is not None:
                failures.append(report)
                warnings.warn(report["message"], JudgeFailureWarning, stacklevel=3)
        metrics_out.update(finishes[spec.name].metrics)
    table = _build_table(rows, specs, results, per_row, finishes, data, cfg)
    meta_frame, meta_metrics = _meta(table, cfg)
    metrics_out.update(meta_metrics)
    calibrated, calibration = _calibrate(table, specs, all_results, cfg) if cfg.human_labels else ({}, {})
    metrics_out.update(calibrated)
    usage = client.summary() if client is not None else {}
    if client is not None:
        for k in ("input_tokens", "output_tokens", "calls", "cache_hits"):
            metrics_out[f"judge/{k}"] = float(usage[k])
        metrics_out["judge/shared"] = float(usage["merged"])  # identical calls of this run, sent once
        if client.batch is not None:
            for k in ("batches", "batch_lines"):
                metrics_out[f"judge/{k}"] = float(usage[k])
        if usage.get("cost_usd") is not None:
            metrics_out["judge/cost_usd"] = float(usage["cost_usd"])
    prompt_versions: dict[str, str] = {}
    for spec in specs:
        if spec.prompt_versions is not None:
            prompt_versions.update(spec.prompt_versions(states[spec.name]))
    names = [s.name for s in specs]
    record: dict[str, Any] = {
        "package_version": __version__,
        "config": cfg.public_params(),
        "metrics_run": names,
        "context_mode": mode,
        "context_modes": list(rows[0].judge_contexts_by_mode) if rows and rows[0].judge_contexts_by_mode else None,
        "context_provenance": CONTEXT_PROVENANCE.get(mode) if mode else None,
        "judge": client.identity() if client is not None else _offline_identity(cfg),
        "prompt_versions": prompt_versions,
        "usage": usage,
        "skipped": skipped,
        "rows": len(rows),
        "seconds": round(time.perf_counter() - t0, 3),
        "failures": failures,
        "cache": (client.cache.status() if client.cache is not None else {"mode": "off"}) if client else None,
        "text_repairs": repairs.items,
        "metric_name_parts": renamed,
        "calibration": calibration,
    }
    params = {
        "ragjudge.version": __version__,
        "ragjudge.metrics": ",".join(names),
        "ragjudge.judge": _judge_uri(client, cfg),
        "ragjudge.context_mode": mode or "n/a",
        "ragjudge.context_provenance": CONTEXT_PROVENANCE.get(mode, "n/a") if mode else "n/a",
        "ragjudge.context_modes": ",".join(record["context_modes"] or []) or (mode or "n/a"),
        "ragjudge.prompt_versions": json.dumps(prompt_versions, sort_keys=True),
        "ragjudge.language": cfg.language,
        "ragjudge.k": json.dumps(cfg.k),
    }
    for spec in specs:
        if spec.record is not None:
            record.update(spec.record(states[spec.name], ctx))
        if spec.params is not None:
            params.update(spec.params(states[spec.name], ctx))
    artifacts = {name: recs for f in finishes.values() for name, recs in f.artifacts.items()}
    transcripts = [
        {"metric": spec.name, "row": i, **call}
        for spec in specs
        for res in results[spec.name].values()
        for i, r in enumerate(res)
        for call in r.calls
    ]
    per_metric = _usage_by_metric(transcripts, len(rows))
    for name, u in per_metric.items():
        for k, v in u.items():
            metrics_out[f"judge/{name}/{k}"] = v
    record["usage_by_metric"] = per_metric
    if client is None and is_offline_judge(cfg.judge):
        params.update(_offline_params(cfg))
    if client is not None:
        params.update(_judge_params(client, transcripts))
        record["structured_modes_used"] = sorted({t["structured_mode"] for t in transcripts
                                                  if t.get("structured_mode")})
    gate = _gate(cfg.fail_under, metrics_out)
    record["gate"] = gate
    return EvalOutput(metrics_out, table, all_results, transcripts, params, record, meta_frame, skipped, artifacts,
                      failures, gate)


def local_output_root() -> Path:
    """Where results are saved before they are logged: ``$RAGJUDGE_OUTPUT_DIR``, else ``outputs/`` beside the
    judge-call cache."""
    env = os.environ.get("RAGJUDGE_OUTPUT_DIR")
    if env:
        return Path(env).expanduser()

    return default_cache_dir() / "outputs"


def _save_partial(per_row: dict[str, list[dict[str, JudgeResult]]], client: JudgeClient | None) -> Path | None:
    """Write what the metrics produced so far (per-row results with their judge calls) to a local folder."""
    import tempfile

    stamp = time.strftime("%Y%m%d-%H%M%S")
    for root in (local_output_root(), Path(tempfile.gettempdir()) / "ragjudge-outputs"):
        folder = root / f"{stamp}-{os.getpid()}-partial"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / "results.jsonl", "w", encoding="utf-8", errors="backslashreplace") as fh:
                for metric, rows in per_row.items():
                    for i, res in enumerate(rows):
                        for name, r in res.items():
                            rec = {"metric": metric, "output": name, "row": i, **r.to_dict(), "calls": r.calls}
                            fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            if client is not None:
                with open(folder / "usage.json", "w", encoding="utf-8") as fh:
                    json.dump(client.summary(), fh, default=str)
            return folder
        except OSError:
            continue
    return None


def _judge_uri(client: JudgeClient | None, cfg: RagJudgeConfig) -> str:
    if client is not None:
        return client.backend.uri
    if is_offline_judge(cfg.judge):
        return resolve_offline(str(cfg.judge)).uri
    return "none"


def _offline_identity(cfg: RagJudgeConfig) -> dict[str, Any] | None:
    """The offline judge's identity in the run record: what it is, its calibration and its measured agreement."""
    if not is_offline_judge(cfg.judge):
        return None
    judge = resolve_offline(str(cfg.judge))
    return {"uri": judge.uri, "kind": "offline judge: calibrated lexical evidence, not an LLM",
            "calibration": judge.calibration.version, "held_out": judge.calibration.fit.get("held_out"),
            "docs": "docs/offline-judge.md"}


def _offline_params(cfg: RagJudgeConfig) -> dict[str, str]:
    judge = resolve_offline(str(cfg.judge))
    return {"ragjudge.judge.provider": "offline", "ragjudge.judge.model": judge.uri.partition(":/")[2],
            "ragjudge.judge.kind": "offline (not an LLM)", "ragjudge.offline.calibration": judge.calibration.version}


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
    """Requests sent, cache hits and tokens per metric, and requests per row: what each metric costs.

    ``cache_hits`` are answers read from the persistent cache (an earlier run paid for them; the metrics' counts add
    up to the run's ``judge/cache_hits``); ``shared`` are this metric's recorded calls answered by an identical call
    of this run (sent once: the verdicts context precision and recall share). The run's ``judge/shared`` counts
    every such call, also those no metric records twice (a statement extraction another metric already made)."""
    out: dict[str, dict[str, float]] = {}
    for rec in transcripts:
        u = out.setdefault(rec["metric"], {"requests": 0.0, "cache_hits": 0.0, "shared": 0.0, "input_tokens": 0.0,
                                           "output_tokens": 0.0})
        if rec.get("cache_hit") and rec.get("shared"):
            u["shared"] += 1
        elif rec.get("cache_hit"):
            u["cache_hits"] += 1
        elif rec.get("via") == "batch":
            u["batch_lines"] = u.get("batch_lines", 0.0) + float(rec.get("batch_rounds") or 0)
        else:
            u["requests"] += float(rec.get("attempts") or 0)
        u["input_tokens"] += float(rec.get("input_tokens") or 0)
        u["output_tokens"] += float(rec.get("output_tokens") or 0)
    for u in out.values():
        u["requests_per_row"] = u["requests"] / max(1, n_rows)
    return out


def available_metrics() -> tuple[str, ...]:
    """Every registered metric name."""
    return metric_names()
