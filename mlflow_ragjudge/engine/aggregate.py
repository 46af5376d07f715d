"""Step 4 of an evaluation: per-row results into the run's output (:func:`aggregate_run`, an :class:`EvalOutput`) --
each metric's ``finish`` hook; each output's mean with what became of its rows (scored, abstained, failed), per
group; the per-row table; a judged metric that failed too often, reported loudly with the likely fix; meta-evaluation
and calibrated estimates (:mod:`.human`); the ``fail_under`` gate; what each metric cost; the run record
(:mod:`.record`)."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any

import pandas as pd

from ..core.constants import is_offline_judge
from ..core.errors import JudgeFailureWarning
from ..core.stop import stop_reason
from ..core.types import Aggregate, JudgeResult, Row, Status, aggregate, metric_name_part
from ..llm.client import JudgeClient
from ..metrics.spec import Finish, MetricSpec
from .config import RagJudgeConfig
from .draws import Draws, draws_record
from .human import calibrated_estimates, meta_evaluation
from .inputs import row_ids
from .intervals import decide_gate, gate_status, mean_interval
from .noise import draw_columns, escalation_metrics, noise_metrics, noise_sums, panel_metrics, panel_sums
from .prepare import Plan
from .record import judge_params, offline_params, run_record
from .schedule import ERROR_KEY, by_output
from .select import gate_metric_name
from .validate import Checked

__all__ = ["EvalOutput", "aggregate_run", "aggregate_metric", "build_table",
           "failure_report", "gate_outcome", "gate_status", "usage_by_metric", "LIKELY_FIX",
           "OutputSummary", "summarize_output", "group_positions", "output_metrics", "level_shares", "run_metrics",
           "usage_metrics"]


@dataclass(frozen=True)
class OutputSummary:
    """What one output's per-row results add up to, over all rows and per group: the sums and counts its metrics
    are computed from. Summaries of parts of the data merge (:meth:`merge`) into the summary of the whole, so an
    evaluation split over partitions logs the numbers one process would."""

    all: Aggregate
    groups: dict[str, Aggregate] = field(default_factory=dict)

    def merge(self, other: OutputSummary) -> OutputSummary:
        groups = dict(self.groups)
        for g, agg in other.groups.items():
            groups[g] = groups[g].merge(agg) if g in groups else agg
        return OutputSummary(self.all.merge(other.all), groups)

    def to_dict(self) -> dict[str, Any]:
        return {"all": self.all.to_dict(), "groups": {g: a.to_dict() for g, a in self.groups.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OutputSummary:
        return cls(Aggregate.from_dict(d["all"]), {g: Aggregate.from_dict(a) for g, a in d["groups"].items()})


def summarize_output(results: Sequence[JudgeResult], rows: Sequence[Row],
                     groups: dict[str, list[int]] | None = None) -> OutputSummary:
    """One output's per-row results as sums and counts, over all rows and per group (``groups``: each group's row
    positions, :func:`group_positions` of ``rows``, when the caller has them for all its outputs)."""
    if groups is None:
        groups = group_positions(rows)
    return OutputSummary(aggregate(results, levels=True),
                         {g: aggregate([results[i] for i in at], levels=True) for g, at in groups.items()})


def group_positions(rows: Sequence[Row]) -> dict[str, list[int]]:
    """The positions of each group's rows, groups in the order they first occur (rows without a group: in none)."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        if r.group is not None:
            groups.setdefault(r.group, []).append(i)
    return groups


def output_metrics(name: str, summary: OutputSummary, judged: bool) -> dict[str, float]:
    """One output's metrics: ``<name>/mean`` over the scored rows, ``<name>/ci_low`` and ``<name>/ci_high`` its 95 %
    Student-t interval (:func:`~.intervals.mean_interval`: none with fewer than two scored rows) and, for a judged
    output, what became of the rows (:meth:`~mlflow_ragjudge.core.types.Aggregate.as_metrics`); per group too
    (``<name>/ci_low/<group>``)."""
    agg = summary.all
    out: dict[str, float] = {}
    if judged:
        out.update(agg.as_metrics(name))
    elif agg.mean is not None:
        out[f"{name}/mean"] = agg.mean
    iv = mean_interval(agg)
    if iv is not None:
        out[f"{name}/ci_low"], out[f"{name}/ci_high"] = iv.low, iv.high
    for g in sorted(summary.groups):
        gagg = summary.groups[g]
        gname = metric_name_part(g)
        if gagg.mean is not None:
            out[f"{name}/mean/{gname}"] = gagg.mean
        giv = mean_interval(gagg)
        if giv is not None:
            out[f"{name}/ci_low/{gname}"], out[f"{name}/ci_high/{gname}"] = giv.low, giv.high
        if judged:
            out[f"{name}/count/{gname}"] = float(gagg.count)
            out[f"{name}/n_scored/{gname}"] = float(gagg.n_scored)
    return out


def aggregate_metric(name: str, results: list[JudgeResult], rows: Sequence[Row], judged: bool) -> dict[str, float]:
    """One output's metrics from its per-row results (:func:`output_metrics` of :func:`summarize_output`)."""
    return output_metrics(name, summarize_output(results, rows), judged)


def level_shares(name: str, agg: Aggregate) -> dict[str, float]:
    """The distribution of the six levels over all rows, as the paper reports it: ``<name>/share_level_<n>`` for
    n = 1..5, and ``share_level_0`` for the rows the judge was not sure about (abstained); failed rows are in
    neither, so the shares add up to one minus the error rate."""
    return {f"{name}/share_level_{lvl}": (agg.distribution.get("abstained" if lvl == 0 else str(lvl), 0) / agg.count
                                          if agg.count else 0.0) for lvl in range(0, 6)}


def run_metrics(specs: Sequence[MetricSpec], summaries: dict[str, dict[str, OutputSummary]], max_error_rate: float
                ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Every output's metrics and the level shares of the six-level ones, from the outputs' summaries; and the
    judged metrics that failed on more than ``max_error_rate`` of their rows (one report per metric: multi-turn's
    three scores fail together). A metric that is not judged but whose rows failed (its code raised, or returned
    something that is not a result: ``internal_error``) is held to the same rule: its rows are counted
    (``error_rate`` ...) and it is reported over ``max_error_rate``."""
    out: dict[str, float] = {}
    failures: list[dict[str, Any]] = []
    for spec in specs:
        outputs = summaries.get(spec.name, {})
        accounted = spec.judged or any(s.all.n_failed for s in outputs.values())
        for name, summary in outputs.items():
            out.update(output_metrics(name, summary, accounted))
        for name, summary in outputs.items():
            if _on_levels(spec, name):
                out.update(level_shares(name, summary.all))
        if accounted and outputs:
            report = failure_report(spec.name, next(iter(outputs.values())).all, max_error_rate)
            if report is not None:
                failures.append(report)
    return out, failures


def _on_levels(spec: MetricSpec, name: str) -> bool:
    """Whether an output is on the six-level scale (it gets a ``/level`` column: the paper's level, 0 = not sure)."""
    return spec.scale_of(name) == (1.0, 5.0) and bool(spec.outputs.levels)

def _safe_cell(build: Callable[[dict[str, JudgeResult]], Any], res: dict[str, JudgeResult]) -> Any:
    try:
        return build(res)
    except Exception:  # an extra column never costs the table
        return None

def _score_column(results: Sequence[JudgeResult]) -> list[Any]:
    """An output's ``/score`` column: each scored value; no value (NaN in the table) for an abstention or a
    failure, whose ``/status`` says which -- an abstention is not a score, and a 0 here would be averaged as one by
    anything that reads the column (the run's means skip it)."""
    scored = Status.SCORED
    return [r.value if r.status is scored else None for r in results]


def _level_column(results: Sequence[JudgeResult]) -> list[Any]:
    """A six-level output's ``/level`` column: the paper's level -- 1..5 for a scored row, 0 where the judge said it
    was not sure -- and no value for a failure or another abstention (no claims, nothing to judge)."""
    out: list[Any] = []
    for r in results:
        if r.status is Status.SCORED:
            out.append(r.value)
        elif r.status is Status.ABSTAINED and r.details.get("level") == 0:
            out.append(0)
        else:
            out.append(None)
    return out


#: a status as the ``/status`` column writes it
_STATUS_TEXT = {s: s.value for s in Status}

def build_table(rows: Sequence[Row], specs: Sequence[MetricSpec], results: dict[str, dict[str, list[JudgeResult]]],
                 per_row: dict[str, list[dict[str, JudgeResult]]], finishes: dict[str, Finish],
                 df: pd.DataFrame, cfg: RagJudgeConfig) -> pd.DataFrame:
    cols: dict[str, list[Any]] = {}
    cols["question"] = [r.question if r.question is not None else f"row {r.index}" for r in rows]
    ordered = sorted(specs, key=lambda s: not s.outputs.headline)  # the headline score right after the question
    for spec in ordered:
        for name, res in results[spec.name].items():
            cols[f"{name}/score"] = _score_column(res)
            if spec.judged or any(x.status is Status.FAILED for x in res):  # (a failing plain metric says why)
                cols[f"{name}/justification"] = [x.rationale for x in res]
                cols[f"{name}/status"] = [_STATUS_TEXT[x.status] + (f":{x.reason}" if x.reason else "") for x in res]
            if _on_levels(spec, name):
                cols[f"{name}/level"] = _level_column(res)
    for spec in specs:
        for column, build in spec.outputs.columns.items():
            cols[column] = [None if ERROR_KEY in res else _safe_cell(build, res) for res in per_row[spec.name]]
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
    "internal_error": "an error inside mlflow-ragjudge, or in a metric's own code (a plugin's score function: see the "
                      "first error); one of ours, please report it with the transcript",
    "system_error": "the RAG system under test raised; see ragjudge/multiturn_conversations.jsonl",
    "interrupted": "the evaluation was stopped (Ctrl-C or SIGTERM) before these rows were judged; run the same "
                   "command again: the judge-call cache holds every reply that arrived, so only the rest is sent",
}

def failure_report(name: str, agg: Aggregate, max_error_rate: float) -> dict[str, Any] | None:
    """A judged metric that failed on more than ``max_error_rate`` of its rows: how often, why, the likely fix."""
    if not agg.count or agg.n_failed / agg.count <= max_error_rate:
        return None
    reasons = Counter(agg.reasons)
    top = reasons.most_common(1)[0][0]
    shown = ", ".join(f"{reason} x{count}" for reason, count in reasons.most_common())
    rate = agg.n_failed / agg.count
    message = (
        f"'{name}' failed on {agg.n_failed} of {agg.count} rows (error rate {rate:.2f} > "
        f"max_error_rate {max_error_rate:g}): {shown}. Likely fix: {LIKELY_FIX.get(top, 'see the transcripts')}."
    )
    example = agg.examples.get(top, "")
    if example:
        message += f" First error: {example[:200]}"
    return {"metric": name, "error_rate": rate, "failed": agg.n_failed, "rows": agg.count,
            "reasons": dict(reasons), "message": message}

def _gated(key: str, summaries: dict[str, dict[str, OutputSummary]] | None) -> tuple[Aggregate | None, str]:
    """The summary behind a gated metric name (``<output>/mean`` or ``<output>/mean/<group>``), or why it has none."""
    output, _, rest = key.partition("/")
    stat, _, group = rest.partition("/")
    if stat != "mean":
        return None, f"{key} is not an output's mean"
    found = next((outs[output] for outs in (summaries or {}).values() if output in outs), None)
    if found is None:
        return None, f"no per-row values behind {key}"
    if not group:
        return found.all, ""
    agg = next((a for g, a in found.groups.items() if metric_name_part(g) == group), None)
    return (agg, "") if agg is not None else (None, f"no group {group!r} behind {key}")


def gate_outcome(fail_under: dict[str, float], metrics_out: dict[str, float],
                 summaries: dict[str, dict[str, OutputSummary]] | None = None, rule: str = "interval"
                 ) -> list[dict[str, Any]]:
    """The ``fail_under`` gates (:func:`~.intervals.decide_gate`, one entry each): on the 95 % interval of the gated
    mean, computed from its output's summary in ``summaries`` (metric -> output -> summary, the same sums its
    ``ci_low``/``ci_high`` come from, merged over partitions on Spark), with ``rule="interval"``; on the mean alone
    with ``rule="point"``. A gate on a whole output's mean in a run with repeats also says how many repeats would
    decide it (from ``<output>/judge_variance`` and ``<output>/repeats``)."""
    out = []
    for raw, threshold in fail_under.items():
        key = gate_metric_name(raw)
        agg, why = _gated(key, summaries)
        iv = mean_interval(agg) if agg is not None else None
        if agg is not None and iv is None:
            why = (f"{agg.n_scored} scored row(s), an interval needs 2" if agg.n_scored < 2
                   else "the spread of its rows is unknown (a summary saved by an older version)")
        output, _, rest = key.partition("/")
        noise, reps = metrics_out.get(f"{output}/judge_variance"), metrics_out.get(f"{output}/repeats")
        judge = (noise, int(reps)) if rest == "mean" and noise is not None and reps is not None else None
        out.append(decide_gate(key, threshold, metrics_out.get(key), iv, rule=rule, no_interval=why, judge=judge))
    return out

def usage_metrics(usage: dict[str, Any], batch: bool) -> dict[str, float]:
    """The ``judge/...`` metrics of a run's judge usage (a client's summary, or the sum of several)."""
    out = {f"judge/{k}": float(usage[k]) for k in ("input_tokens", "output_tokens", "calls", "cache_hits")}
    out["judge/shared"] = float(usage["merged"])  # identical calls of this run, sent once
    if batch:
        out.update({f"judge/{k}": float(usage[k]) for k in ("batches", "batch_lines")})
    if usage.get("cost_usd") is not None:
        out["judge/cost_usd"] = float(usage["cost_usd"])
    return out


def usage_by_metric(transcripts: Sequence[dict[str, Any]], n_rows: int) -> dict[str, dict[str, float]]:
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


# --------------------------------------------------------------------------- the step

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
    #: the ``fail_under`` quality gate, one entry per threshold (:func:`~.intervals.decide_gate`): ``{"metric",
    #: "threshold", "value", "ci_low", "ci_high", "n", "rule", "outcome": "pass" | "fail" | "undecided", "passed",
    #: "message"}``, with ``"more_rows"`` (and with repeats ``"more_repeats"``) when undecided
    gate: list[dict[str, Any]] = field(default_factory=list)
    #: the validated input rows (question, answer, contexts, ...), for the per-row traces; not saved with the run
    rows: list[Row] = field(default_factory=list, repr=False)
    #: metric -> output -> the sums and counts behind its aggregates (they merge over parts of the data)
    summaries: dict[str, dict[str, OutputSummary]] = field(default_factory=dict, repr=False)
    #: metric -> the counts its ``finish`` hook added (they add up over parts of the data)
    counts: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)
    #: every draw of a run with repeats, a panel or a cascade (:mod:`.draws`); None for one draw per row
    draws: Draws | None = field(default=None, repr=False)

    @property
    def gate_passed(self) -> bool:
        """Every gate passed (an undecided gate has not)."""
        return all(g["passed"] for g in self.gate)

    @property
    def gate_status(self) -> str | None:
        """``passed``, ``failed`` (any gate failed), ``undecided`` (none failed, some undecided), or None without
        gates (:func:`~.intervals.gate_status`)."""
        return gate_status(self.gate)


def _finish_metrics(checked: Checked, plan: Plan, results: dict[str, dict[str, list[JudgeResult]]]
                    ) -> dict[str, Finish]:
    """Each metric's ``finish`` hook, on its per-row results."""
    finishes: dict[str, Finish] = {}
    for spec in plan.specs:
        if spec.finish is None:
            finishes[spec.name] = Finish()
            continue
        outputs = results[spec.name]
        names = list(outputs)
        by_row = ([dict(zip(names, values)) for values in zip(*outputs.values())] if names
                  else [{} for _ in checked.rows])
        finishes[spec.name] = spec.finish(plan.states[spec.name], checked.rows, by_row, plan.ctx)
    return finishes


def _metrics(checked: Checked, specs: Sequence[MetricSpec], results: dict[str, dict[str, list[JudgeResult]]],
             finishes: dict[str, Finish]
             ) -> tuple[dict[str, float], list[dict[str, Any]], dict[str, dict[str, OutputSummary]]]:
    """Every output's aggregates (from its summary: the sums and counts that also merge over partitions), each
    metric's finishing metrics and counts, and the judged metrics that failed too often."""
    groups = group_positions(checked.rows)
    summaries = {spec.name: {name: summarize_output(res, checked.rows, groups)
                             for name, res in results[spec.name].items()} for spec in specs}
    metrics_out, failures = run_metrics(specs, summaries, checked.cfg.max_error_rate)
    for report in failures:
        warnings.warn(report["message"], JudgeFailureWarning, stacklevel=5)
    for spec in specs:
        metrics_out.update(finishes[spec.name].metrics)
        metrics_out.update(finishes[spec.name].counts)
    return metrics_out, failures, summaries


def _usage(client: JudgeClient | None, others: Sequence[JudgeClient] = ()) -> tuple[dict[str, Any], dict[str, float]]:
    """The judge clients' usage (the run's client and a panel's or cascade's other judges, summed), and the
    ``judge/...`` metrics it gives."""
    if client is None:
        return {}, {}
    usage = client.summary()
    for other in others:
        for k, v in other.summary().items():
            if k in ("peak_in_flight", "connection_limit"):
                usage[k] = max(usage.get(k) or 0, v or 0)
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(usage.get(k), (int, float)):
                usage[k] += v
            elif k == "cost_usd":  # a price unknown for one judge: the total is unknown
                usage[k] = None
    return usage, usage_metrics(usage, client.batch is not None)


def aggregate_run(checked: Checked, plan: Plan, per_row: dict[str, list[dict[str, JudgeResult]]], seconds: float,
                  draws: Draws | None = None) -> EvalOutput:
    """Step 4: the run's numbers, table, record and params from the per-row results of step 3 (``seconds``: how
    long step 3 took; ``draws``: every draw of a run with repeats, a panel or a cascade, :mod:`.draws`)."""
    cfg, client, specs, ctx = checked.cfg, plan.ctx.client, plan.specs, plan.ctx
    results = {s.name: by_output(s, per_row[s.name]) for s in specs}
    finishes = _finish_metrics(checked, plan, results)
    skipped = {**plan.skipped, **{k: v for f in finishes.values() for k, v in f.skipped.items()}}
    metrics_out, failures, summaries = _metrics(checked, specs, results, finishes)
    all_results = {name: res for s in specs for name, res in results[s.name].items()}
    table = build_table(checked.rows, specs, results, per_row, finishes, checked.data, cfg)
    if draws is not None:
        table = pd.concat([table, pd.DataFrame(draw_columns(draws, len(checked.rows)), index=table.index)], axis=1)
        metrics_out.update(noise_metrics(noise_sums(draws), draws.judges, draws.repeats))
        metrics_out.update(panel_metrics(panel_sums(draws), draws.judges, draws.cascade))
    meta_frame, meta_metrics = meta_evaluation(table, cfg)
    metrics_out.update(meta_metrics)
    calibrated, calibration = calibrated_estimates(table, specs, all_results, cfg) if cfg.human_labels else ({}, {})
    metrics_out.update(calibrated)
    usage, judge_metrics = _usage(client, [c for _, c in plan.judges[1:]])
    metrics_out.update(judge_metrics)
    record, params = run_record(cfg, plan, len(checked.rows), skipped)
    prompt_versions = record["prompt_versions"]
    record.update({
        "usage": usage, "seconds": round(seconds, 3), "failures": failures,
        "cache": (client.cache.status() if client.cache is not None else {"mode": "off"}) if client else None,
        "text_repairs": checked.repairs.items, "metric_name_parts": checked.renamed, "calibration": calibration,
    })
    params.update({**plan.found.params, "ragjudge.prompt_versions": json.dumps(prompt_versions, sort_keys=True),
                   "ragjudge.language": cfg.language})
    for spec in specs:
        if spec.record is not None:
            record.update(spec.record(plan.states[spec.name], ctx))
        if spec.params is not None:
            params.update(spec.params(plan.states[spec.name], ctx))
    artifacts = {name: recs for f in finishes.values() for name, recs in f.artifacts.items()}
    # (the results that carry calls picked in C: an offline run's 36 results per row carry none)
    transcripts = [{"metric": spec.name, "row": i, **call} for spec in specs for res in results[spec.name].values()
                   for i, r in compress(enumerate(res), map(_CALLS, res)) for call in r.calls]
    per_metric = usage_by_metric(transcripts, len(checked.rows))
    metrics_out.update({f"judge/{name}/{k}": v for name, u in per_metric.items() for k, v in u.items()})
    record["usage_by_metric"] = per_metric
    if draws is not None:
        metrics_out.update(escalation_metrics(draws, transcripts, len(checked.rows)))
        record["draws"] = draws_record(draws)
        params.update({"ragjudge.repeats": str(draws.repeats), "ragjudge.judges": ",".join(draws.judges),
                       "ragjudge.panel_rule": draws.rule})
    if client is None and is_offline_judge(cfg.judge):
        params.update(offline_params(cfg))
    if client is not None:
        params.update(judge_params(client, transcripts))
        record["structured_modes_used"] = sorted({t["structured_mode"] for t in transcripts
                                                  if t.get("structured_mode")})
    gate = gate_outcome(cfg.fail_under, metrics_out, summaries, cfg.gate_rule)
    record["gate"] = gate
    if stop_reason() is not None:
        stopped = sum(1 for res in all_results.values() for r in res if r.reason == "interrupted")
        record["interrupted"] = {"by": stop_reason(), "results_not_judged": stopped,
                                 "results": sum(len(res) for res in all_results.values())}
    return EvalOutput(metrics_out, table, all_results, transcripts, params, record, meta_frame, skipped,
                      artifacts, failures, gate, list(checked.rows), summaries,
                      {name: dict(f.counts) for name, f in finishes.items()}, draws)
