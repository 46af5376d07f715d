"""Evaluate a DataFrame of RAG outputs: the engine behind the MLflow evaluator, the CLI and plain Python. No mlflow
here, and no metric names: every metric is a :class:`~mlflow_ragjudge.metrics.spec.MetricSpec` from the registry,
and what is particular to a metric (its judge contexts, its level shares, its settings) it does in its own hooks.

Four steps, each in a module of its own:

1. **validate** (:mod:`.select`, :mod:`.inputs`) -- the config, the metrics (by default every registered one whose
   columns are there), every row, each metric's ``prepare`` hook (the judge contexts, E3 retrieval) and its own row
   checks: all before any judge call;
2. **prepare** (:mod:`.prepare`) -- the judge client, the embeddings and each metric's state;
3. **schedule** (:mod:`.schedule`) -- every (row, metric) task in one pool, the provider gate bounding the calls in
   flight; no barrier between metrics, so a slow or hung call delays only its own row;
4. **aggregate** (:mod:`.aggregate`, :mod:`.human`, :mod:`.record`) -- overall and per-group metrics, the per-row
   table, meta-evaluation and calibrated estimates, usage, the run record.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any

import pandas as pd

from ..core.constants import VERSION, is_offline_judge
from ..core.errors import InputError, Interrupted, JudgeFailureWarning, LoggingFailed
from ..core.stop import stop_on_signals, stop_reason, stop_requested
from ..core.text import Repairs
from ..core.types import JudgeResult, Row
from ..llm.client import JudgeClient
from ..llm.pricing import cost_usd
from ..metrics.spec import Finish, MetricSpec, Prepared, RunContext, metric_names
from .aggregate import (
    OutputSummary,
    build_table,
    gate_outcome,
    group_positions,
    run_metrics,
    summarize_output,
    usage_by_metric,
    usage_metrics,
)
from .config import RagJudgeConfig
from .human import calibrated_estimates, meta_evaluation
from .inputs import check_human_labels, read_rows
from .ppi import MIN_LABELS
from .prepare import build_client, run_embeddings, setup_metrics
from .record import judge_params, judge_uri, offline_identity, offline_params, save_partial
from .schedule import by_output, prepare_metrics, schedule
from .select import check_gate_names, check_metric_name_parts, labelled_outputs, select_metrics

__all__ = ["evaluate_frame", "EvalOutput", "available_metrics"]

_CALLS = attrgetter("calls")


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
    #: the validated input rows (question, answer, contexts, ...), for the per-row traces; not saved with the run
    rows: list[Row] = field(default_factory=list, repr=False)
    #: metric -> output -> the sums and counts behind its aggregates (they merge over parts of the data)
    summaries: dict[str, dict[str, OutputSummary]] = field(default_factory=dict, repr=False)
    #: metric -> the counts its ``finish`` hook added (they add up over parts of the data)
    counts: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)

    @property
    def gate_passed(self) -> bool:
        return all(g["passed"] for g in self.gate)


@dataclass
class _Run:
    """One evaluation as it goes through its steps."""

    cfg: RagJudgeConfig
    data: pd.DataFrame
    specs: list[MetricSpec]
    skipped: dict[str, str]
    rows: list[Row]
    ctx: RunContext
    prepared: Prepared
    repairs: Repairs
    renamed: dict[str, str]
    states: dict[str, Any] = field(default_factory=dict)
    t0: float = 0.0


def _config(config: RagJudgeConfig | dict[str, Any] | None, overrides: dict[str, Any]) -> RagJudgeConfig:
    if isinstance(config, RagJudgeConfig):
        if not overrides:
            return config
        return RagJudgeConfig.from_dict({**config.as_dict(), **overrides})
    return RagJudgeConfig.from_dict({**(config or {}), **overrides})


def _validate(data: Any, cfg: RagJudgeConfig, first_row: int = 0) -> _Run:
    """Step 1: everything that can refuse the input, before any judge call (``first_row``: where ``data`` starts in
    the whole data, when it is one part of it)."""
    if not isinstance(data, pd.DataFrame):
        raise InputError(f"data must be a pandas DataFrame, got {type(data).__name__}.")
    if len(data) == 0:
        raise InputError("The data has no rows: pass at least one row with question/answer/reference columns.")
    specs, skipped = select_metrics(data, cfg)
    check_gate_names(cfg.fail_under, specs)
    if cfg.batch and (cfg.judge is None or is_offline_judge(cfg.judge)):
        raise InputError("batch=True sends judge calls through a provider's batch API, but this run has no LLM judge "
                         f"({'the offline judge sends nothing' if cfg.judge else 'judge is not set'}); drop batch, or "
                         "set judge='openai:/...' or 'anthropic:/...'.")
    if cfg.human_labels:
        check_human_labels(data, cfg, labelled_outputs(specs), min_labelled=MIN_LABELS)
    repairs = Repairs()
    rows = read_rows(data, cfg, required_text={c for s in specs for c in s.text_columns(cfg)}, repairs=repairs,
                     first_row=first_row)
    renamed = check_metric_name_parts(rows, cfg)
    ctx = RunContext(None, cfg, metrics=tuple(s.name for s in specs), rows=rows,
                     columns=frozenset(map(str, data.columns)), repairs=repairs)
    prepared = prepare_metrics(specs, ctx)
    repairs.announce()
    for spec in specs:
        if spec.validate is not None:
            spec.validate(rows, cfg)
    return _Run(cfg, data, specs, skipped, rows, ctx, prepared, repairs, renamed)


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

    Ctrl-C or SIGTERM while it runs (in the main thread) stops it without losing what was paid for: no new judge
    request is sent, the replies in flight are awaited for ``RAGJUDGE_STOP_GRACE`` seconds (default 10) and cached,
    and the output holds what was done, the rest failed ``interrupted`` and ``config["interrupted"]`` set. A second
    Ctrl-C exits the process at once. (docs/failure-modes.md, "Stopping a run")

    Raises:
        InputError: bad data, found before any judge call.
        ValueError: bad configuration.
    """
    with stop_on_signals():
        return _evaluate(data, config, client, overrides)


def _evaluate(data: Any, config: RagJudgeConfig | dict[str, Any] | None, client: JudgeClient | None,
              overrides: dict[str, Any], first_row: int = 0) -> EvalOutput:
    cfg = _config(config, overrides)
    run = _validate(data, cfg, first_row)  # 1
    specs, ctx = run.specs, run.ctx
    # 2. prepare: the client, embeddings and each metric's state
    if client is None and cfg.judge is not None and not is_offline_judge(cfg.judge) and any(s.judged for s in specs):
        client = build_client(cfg)
    ctx.client = client
    ctx.embed = run_embeddings(specs, cfg, client, run.skipped)
    run.states = setup_metrics(specs, ctx, run.skipped, asked=cfg.metrics is not None)
    ctx.metrics = tuple(s.name for s in specs)
    if cfg.dry_run:
        return _dry_run(run.cfg, run.rows, specs, run.states, ctx, run.prepared, run.skipped)
    if stop_requested():  # Ctrl-C / SIGTERM while the input was checked: nothing paid for, nothing to log
        raise Interrupted(f"Stopped by {stop_reason()} before any judge call: nothing was sent or logged.",
                          stop_reason() or "SIGINT")
    run.t0 = time.perf_counter()
    per_row: dict[str, list[dict[str, JudgeResult]]] = {}
    try:
        per_row = schedule(specs, run.states, run.rows, ctx)  # 3
        return _assemble(run, per_row)  # 4
    except Exception as e:
        if client is None or client.summary()["requests"] == 0:
            raise  # nothing was paid for: the error as it is
        # A failure after judge calls were paid for (a bug, or a metric that could not finish): the per-row
        # results and transcripts so far are written to disk before the error goes up, and the client's cache
        # keeps every reply, so a re-run pays only for what was not finished.
        saved = save_partial(per_row, client)
        raise LoggingFailed(
            f"The evaluation stopped after its judge calls ({type(e).__name__}: {e}); the results so far are not "
            + (f"lost: they are saved at {saved}" if saved else "saved locally (no writable folder)")
            + ("; a re-run takes the paid replies from the judge-call cache." if client.cache is not None else "."),
            saved,
        ) from e


def _finish_metrics(run: _Run, results: dict[str, dict[str, list[JudgeResult]]]) -> dict[str, Finish]:
    """Each metric's ``finish`` hook, on its per-row results."""
    finishes: dict[str, Finish] = {}
    for spec in run.specs:
        if spec.finish is None:
            finishes[spec.name] = Finish()
            continue
        outputs = results[spec.name]
        names = list(outputs)
        by_row = ([dict(zip(names, values)) for values in zip(*outputs.values())] if names
                  else [{} for _ in run.rows])
        finishes[spec.name] = spec.finish(run.states[spec.name], run.rows, by_row, run.ctx)
        run.skipped.update(finishes[spec.name].skipped)
    return finishes


def _metrics(run: _Run, results: dict[str, dict[str, list[JudgeResult]]], finishes: dict[str, Finish]
             ) -> tuple[dict[str, float], list[dict[str, Any]], dict[str, dict[str, OutputSummary]]]:
    """Every output's aggregates (from its summary: the sums and counts that also merge over partitions), each
    metric's finishing metrics and counts, and the judged metrics that failed too often."""
    groups = group_positions(run.rows)
    summaries = {spec.name: {name: summarize_output(res, run.rows, groups) for name, res in results[spec.name].items()}
                 for spec in run.specs}
    metrics_out, failures = run_metrics(run.specs, summaries, run.cfg.max_error_rate)
    for report in failures:
        warnings.warn(report["message"], JudgeFailureWarning, stacklevel=5)
    for spec in run.specs:
        metrics_out.update(finishes[spec.name].metrics)
        metrics_out.update(finishes[spec.name].counts)
    return metrics_out, failures, summaries


def _usage(client: JudgeClient | None) -> tuple[dict[str, Any], dict[str, float]]:
    """The judge client's usage, and the ``judge/...`` metrics it gives."""
    if client is None:
        return {}, {}
    usage = client.summary()
    return usage, usage_metrics(usage, client.batch is not None)


def _assemble(run: _Run, per_row: dict[str, list[dict[str, JudgeResult]]]) -> EvalOutput:
    """Step 4: the run's numbers, table, record and params from the per-row results."""
    cfg, client, specs = run.cfg, run.ctx.client, run.specs
    results = {s.name: by_output(s, per_row[s.name]) for s in specs}
    finishes = _finish_metrics(run, results)
    metrics_out, failures, summaries = _metrics(run, results, finishes)
    all_results = {name: res for s in specs for name, res in results[s.name].items()}
    table = build_table(run.rows, specs, results, per_row, finishes, run.data, cfg)
    meta_frame, meta_metrics = meta_evaluation(table, cfg)
    metrics_out.update(meta_metrics)
    calibrated, calibration = calibrated_estimates(table, specs, all_results, cfg) if cfg.human_labels else ({}, {})
    metrics_out.update(calibrated)
    usage, usage_metrics = _usage(client)
    metrics_out.update(usage_metrics)
    prompt_versions: dict[str, str] = {}
    for spec in specs:
        if spec.prompt_versions is not None:
            prompt_versions.update(spec.prompt_versions(run.states[spec.name]))
    names = [s.name for s in specs]
    record: dict[str, Any] = {
        "package_version": VERSION, "config": cfg.public_params(), "metrics_run": names, **run.prepared.record,
        "judge": client.identity() if client is not None else offline_identity(cfg),
        "prompt_versions": prompt_versions, "usage": usage, "skipped": run.skipped, "rows": len(run.rows),
        "seconds": round(time.perf_counter() - run.t0, 3), "failures": failures,
        "cache": (client.cache.status() if client.cache is not None else {"mode": "off"}) if client else None,
        "text_repairs": run.repairs.items, "metric_name_parts": run.renamed, "calibration": calibration,
    }
    params = {"ragjudge.version": VERSION, "ragjudge.metrics": ",".join(names),
              "ragjudge.judge": judge_uri(client, cfg), **run.prepared.params,
              "ragjudge.prompt_versions": json.dumps(prompt_versions, sort_keys=True),
              "ragjudge.language": cfg.language}
    for spec in specs:
        if spec.record is not None:
            record.update(spec.record(run.states[spec.name], run.ctx))
        if spec.params is not None:
            params.update(spec.params(run.states[spec.name], run.ctx))
    artifacts = {name: recs for f in finishes.values() for name, recs in f.artifacts.items()}
    # (the results that carry calls picked in C: an offline run's 36 results per row carry none)
    transcripts = [{"metric": spec.name, "row": i, **call} for spec in specs for res in results[spec.name].values()
                   for i, r in compress(enumerate(res), map(_CALLS, res)) for call in r.calls]
    per_metric = usage_by_metric(transcripts, len(run.rows))
    metrics_out.update({f"judge/{name}/{k}": v for name, u in per_metric.items() for k, v in u.items()})
    record["usage_by_metric"] = per_metric
    if client is None and is_offline_judge(cfg.judge):
        params.update(offline_params(cfg))
    if client is not None:
        params.update(judge_params(client, transcripts))
        record["structured_modes_used"] = sorted({t["structured_mode"] for t in transcripts
                                                  if t.get("structured_mode")})
    gate = gate_outcome(cfg.fail_under, metrics_out)
    record["gate"] = gate
    if stop_reason() is not None:
        stopped = sum(1 for res in all_results.values() for r in res if r.reason == "interrupted")
        record["interrupted"] = {"by": stop_reason(), "results_not_judged": stopped,
                                 "results": sum(len(res) for res in all_results.values())}
    return EvalOutput(metrics_out, table, all_results, transcripts, params, record, meta_frame, run.skipped,
                      artifacts, failures, gate, list(run.rows), summaries,
                      {name: dict(f.counts) for name, f in finishes.items()})


def _dry_run(cfg: RagJudgeConfig, rows: Sequence[Row], specs: Sequence[MetricSpec], states: dict[str, Any],
             ctx: RunContext, prepared: Prepared, skipped: dict[str, str]) -> EvalOutput:
    """Estimate judge calls and tokens per metric; nothing is sent."""
    client = ctx.client
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
        "package_version": VERSION,
        "config": cfg.public_params(),
        "metrics_run": names,
        "dry_run": True,
        **prepared.record,
        "estimate": lines,
        "skipped": skipped,
        "rows": len(rows),
        "judge": client.identity() if client is not None else None,
    }
    params = {
        "ragjudge.version": VERSION,
        "ragjudge.metrics": ",".join(names),
        "ragjudge.dry_run": "true",
        "ragjudge.judge": judge_uri(client, cfg),
    }
    return EvalOutput(out, table, {}, [], params, record, None, skipped)


def available_metrics() -> tuple[str, ...]:
    """Every registered metric name."""
    return metric_names()
