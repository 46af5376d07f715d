"""An evaluation split into parts (the partitions of a Spark DataFrame): what each part hands back, and how the parts
add up to the numbers one process gives on all the rows.

Each part is evaluated by :func:`evaluate_part` where its rows are (an executor), and hands back
:func:`part_summary`: the sums and counts behind every output's aggregates (:class:`~.aggregate.OutputSummary`), the
counts of the ``finish`` hooks, the judge's usage, what was skipped. :func:`merge_parts` adds them up in the order of
the data and computes the run's metrics from the totals with the same functions :func:`~.evaluate.evaluate_frame`
uses -- a mean is the sum of the scored values over their number, never a mean of the parts' means.

What needs every row at once is not split: meta-evaluation and calibrated estimates (human labels), and multi-turn
(its finish reads the conversations); :func:`check_splittable` refuses them before anything runs. With repeats or a
panel, each part hands back its judge-noise and agreement sums too (:class:`~.noise.NoiseSums`,
:class:`~.noise.PanelSums`: coincidences, confusion matrices, Fleiss' sums), which add up to the numbers one process
logs (docs/judge-noise.md)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from typing import Any

import pandas as pd

from ..core.errors import InputError
from ..core.types import Aggregate
from ..llm.client import JudgeClient
from ..metrics.spec import get_metric
from .aggregate import OutputSummary, run_metrics, usage_metrics
from .config import RagJudgeConfig
from .evaluate import EvalOutput, _evaluate
from .noise import NoiseSums, PanelSums, noise_metrics, noise_sums, panel_metrics, panel_sums
from .prepare import run_prepare_hooks
from .validate import validate

__all__ = ["evaluate_part", "validate_part", "part_summary", "merge_parts", "check_splittable", "Merged",
           "USAGE_KEYS"]

#: the judge client's counters that add up over parts (``judge/<key>`` metrics and the run record's usage)
USAGE_KEYS = ("calls", "requests", "cache_hits", "failures", "retries", "rate_limited", "format_refusals", "merged",
              "embedding_requests", "batches", "batch_lines", "input_tokens", "output_tokens")

#: metrics that need every row of the run at once
NOT_SPLITTABLE = {"multiturn": "its conversations run turn by turn and its finish reads all of them"}


def check_splittable(cfg: RagJudgeConfig) -> None:
    """Refuse, before anything runs, what an evaluation split into parts cannot compute."""
    if cfg.human_columns or cfg.human_labels:
        raise InputError(
            "human_columns / human_labels (meta-evaluation and calibrated estimates) need every labelled row in one "
            "place, which a split evaluation does not have; evaluate the labelled rows in one process "
            "(for example evaluate_frame(sdf.where(<label column>.isNotNull()).toPandas(), config)) and the rest "
            "without human columns.")
    for name in cfg.metrics or ():
        if name in NOT_SPLITTABLE:
            raise InputError(f"Metric '{name}' cannot run split over partitions: {NOT_SPLITTABLE[name]}; run it with "
                             "evaluate_frame in one process.")
    if cfg.dry_run:
        raise InputError("dry_run estimates a run's calls in one process; use evaluate_frame(..., dry_run=True) on "
                         "the rows (or a sample) to estimate.")


def validate_part(data: pd.DataFrame, cfg: RagJudgeConfig, first_row: int) -> None:
    """The checks :func:`~.evaluate.evaluate_frame` makes before any judge call, on one part (rows numbered from
    ``first_row`` in errors): step 1 and the metrics' ``prepare`` hooks (a retriever's output); raises
    :class:`InputError` as it would."""
    run_prepare_hooks(validate(data, cfg, first_row))


def evaluate_part(data: pd.DataFrame, cfg: RagJudgeConfig, *, first_row: int,
                  client: JudgeClient | None = None) -> EvalOutput:
    """One part of a split evaluation, as :func:`~.evaluate.evaluate_frame` evaluates it (no signal handlers: a
    part runs where its rows are, under the cluster's control)."""
    return _evaluate(data, cfg, client, {}, first_row=first_row)


def part_summary(out: EvalOutput, first_row: int, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """What one part hands back (JSON-able): the sums and counts its rows add to the run's numbers.

    ``usage``: the judge client's counters for this part alone (a client serving several parts gives the difference
    of its :meth:`~mlflow_ragjudge.llm.client.JudgeClient.summary` before and after)."""
    groups = Counter(r.group for r in out.rows if r.group is not None)
    return {
        "first_row": first_row,
        "rows": len(out.rows),
        "groups": dict(groups),
        "metrics": list(out.summaries),
        "summaries": {m: {o: s.to_dict() for o, s in outs.items()} for m, outs in out.summaries.items()},
        "counts": out.counts,
        "skipped": out.skipped,
        "usage": {k: usage.get(k, 0) for k in USAGE_KEYS} | {"cost_usd": usage.get("cost_usd")} if usage else {},
        "usage_by_metric": out.config.get("usage_by_metric", {}),
        "params": out.params,
        "prompt_versions": out.config.get("prompt_versions", {}),
        "seconds": out.config.get("seconds", 0.0),
        # a run with repeats: each judge's judge-noise sums per output (they add up over parts)
        "noise": {name: [astuple(j) for j in per_judge] for name, per_judge in noise_sums(out.draws).items()}
        if out.draws is not None else {},
        "panel": {name: ps.to_json() for name, ps in panel_sums(out.draws).items()} if out.draws is not None else {},
        "draws": {"judges": out.draws.judges, "repeats": out.draws.repeats, "cascade": out.draws.cascade}
        if out.draws is not None else None,
    }


@dataclass
class Merged:
    """The run's numbers from its parts."""

    metrics: dict[str, float]
    failures: list[dict[str, Any]]
    skipped: dict[str, str]
    params: dict[str, str]
    rows: int
    usage: dict[str, Any] = field(default_factory=dict)
    usage_by_metric: dict[str, dict[str, float]] = field(default_factory=dict)
    prompt_versions: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0  # the parts' own time, added up (not the wall time)
    #: metric -> output -> the merged sums and counts (what the gates' intervals are computed from)
    summaries: dict[str, dict[str, OutputSummary]] = field(default_factory=dict)


def _absent(rows: int, groups: dict[str, int]) -> OutputSummary:
    """An output a part did not produce (its rows lacked what it needs, so the part's metric set it up without
    it): each of the part's rows abstained, as one process counts a row an output gave nothing for."""
    return OutputSummary(Aggregate.abstentions(rows), {g: Aggregate.abstentions(n) for g, n in groups.items()})


_COUNTED = re.compile(r"(\d+) (.*)", re.DOTALL)


def _merge_reason(first: str, other: str) -> str:
    """One skip reason from two parts': a reason that counts rows (``3 row(s) have no relevant_doc_ids``) adds the
    parts' counts, as one process counts the whole data; any other keeps the first part's words."""
    a, b = _COUNTED.fullmatch(first), _COUNTED.fullmatch(other)
    if a and b and a.group(2) == b.group(2):
        return f"{int(a.group(1)) + int(b.group(1))} {a.group(2)}"
    return first


def merge_parts(parts: Sequence[dict[str, Any]], cfg: RagJudgeConfig) -> Merged:
    """The run's metrics from its parts' summaries (:func:`part_summary`), added up in the order of the data."""
    parts = sorted(parts, key=lambda p: p["first_row"])
    names = list(dict.fromkeys(m for p in parts for m in p["metrics"]))
    outputs = {m: list(dict.fromkeys(o for p in parts for o in p["summaries"].get(m, {}))) for m in names}
    merged: dict[str, dict[str, OutputSummary]] = {m: {} for m in names}
    counts: dict[str, float] = {}
    skipped: dict[str, str] = {}
    usage: dict[str, Any] = {}
    by_metric: dict[str, dict[str, float]] = {}
    prompt_versions: dict[str, str] = {}
    params: dict[str, str] = {}
    noise: dict[str, list[NoiseSums]] = {}
    panel: dict[str, PanelSums] = {}
    for p in parts:
        for name, d in (p.get("panel") or {}).items():
            ps = PanelSums.from_json(d)
            panel[name] = panel[name].merge(ps) if name in panel else ps
        for name, per_judge in (p.get("noise") or {}).items():
            sums = [NoiseSums(*j) for j in per_judge]
            noise[name] = [a.merge(b) for a, b in zip(noise[name], sums)] if name in noise else sums
        for m in names:
            got = p["summaries"].get(m, {})
            for o in outputs[m]:
                s = OutputSummary.from_dict(got[o]) if o in got else _absent(p["rows"], p["groups"])
                merged[m][o] = merged[m][o].merge(s) if o in merged[m] else s
        for c in p["counts"].values():
            for k, v in c.items():
                counts[k] = counts.get(k, 0.0) + float(v)
        for k, v in p["skipped"].items():
            skipped[k] = _merge_reason(skipped[k], v) if k in skipped else v
        for k, v in p["usage"].items():
            if k == "cost_usd":
                usage[k] = None if v is None or usage.get(k, 0.0) is None else usage.get(k, 0.0) + v
            else:
                usage[k] = usage.get(k, 0) + v
        for m, u in p["usage_by_metric"].items():
            acc = by_metric.setdefault(m, {})
            for k, v in u.items():
                if k != "requests_per_row":
                    acc[k] = acc.get(k, 0.0) + float(v)
        prompt_versions.update(p["prompt_versions"])
        params.update(p["params"])
    n_rows = sum(p["rows"] for p in parts)
    for u in by_metric.values():
        u["requests_per_row"] = u.get("requests", 0.0) / max(1, n_rows)
    specs = [get_metric(m) for m in names]
    metrics, failures = run_metrics(specs, merged, cfg.max_error_rate)
    metrics.update(counts)
    if usage:
        metrics.update(usage_metrics(usage, bool(cfg.batch)))
    metrics.update({f"judge/{m}/{k}": v for m, u in by_metric.items() for k, v in u.items()})
    drawn = next((p["draws"] for p in parts if p.get("draws")), None)
    if drawn is not None and noise:
        metrics.update(noise_metrics(noise, drawn["judges"], drawn["repeats"]))
    if drawn is not None and panel:
        metrics.update(panel_metrics(panel, drawn["judges"], drawn.get("cascade", False)))
    return Merged(metrics, failures, skipped, params, n_rows, usage, by_metric, prompt_versions,
                  sum(float(p["seconds"]) for p in parts), merged)
