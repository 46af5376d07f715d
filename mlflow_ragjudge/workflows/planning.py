"""``ragjudge plan``: rows, repeats and labels for a target, planned from a run (docs/planning.md).

:func:`plan` reads a ``ragjudge`` run (or two, or a sweep's parent) as a pilot and hands its variance components,
its cost per judged row and, when the run was calibrated, its human labels to
:func:`~mlflow_ragjudge.engine.planning.plan_evaluation`.

Where the numbers come from:

* **Variance components.** With repeats the per-row table holds each row's draws (``<output>/draws``, a JSON list,
  null where a draw did not score). From them, with ``r_i`` draws and mean ``m_i`` on row ``i``:
  ``σ²_w = Σ_i Σ_j (x_ij − m_i)² / Σ_i (r_i − 1)`` (the pooled within-row variance, one-way ANOVA's mean square
  within) and ``σ²_b = Var(m_i) − σ²_w · mean(1 / r_i)`` (method of moments, clipped at 0). A run with repeats but
  no draws column falls back on its ``<output>/judge_variance`` and ``<output>/repeats`` metrics. Without repeats the
  row scores' variance is ``σ²_b + σ²_w`` unsplit.
* **A comparison** (two runs judged on the same rows, matched by ``row_id``): the components of the per-row
  differences ``D_i = m_{A,i} − m_{B,i}``: ``σ²_w(D) = σ²_w(A) + σ²_w(B)`` (independent draws) and
  ``σ²_b(D) = Var(D_i) − mean(σ²_w(A) / r_{A,i} + σ²_w(B) / r_{B,i})``. A sweep's parent: every variant against the
  baseline, and the plan of the comparison that needs the most rows (which then settles every other).
* **Cost per row-draw**, from the judge transcripts of the output's metric: the calls a cold run sends (cache hits
  included, calls another metric of the run shared excluded) per row per draw, and the tokens and dollars of the
  calls that were sent, averaged per call; without transcripts, the ``judge/<metric>/requests_per_row`` metric.
* **Labels**, when ``ragjudge calibrate`` stored human labels with the run (``ragjudge/human_labels.json``): the
  calibrated pilot estimate (PPI++ as ``calibrate`` computes it) that ``labels_needed`` plans from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..adapters import tracking
from ..adapters.run_load import load_output
from ..core.constants import is_offline_judge
from ..core.errors import InputError, TooFewLabels
from ..engine.draws import read_draws
from ..engine.evaluate import EvalOutput
from ..engine.planning import (
    DEFAULT_REPEATS,
    DrawCost,
    Plan,
    VarianceComponents,
    check_target,
    plan_evaluation,
)
from ..engine.ppi import CalibratedEstimate, ppi_mean, ppi_paired_diff
from ..metrics.spec import all_specs
from .calibration import LABELS_FILE, _judge_scores, _runs_of, scale_of

__all__ = ["plan", "variance_components", "paired_components", "draw_cost", "row_draws"]


def _check_metric(out: EvalOutput, metric: str, where: str) -> None:
    if f"{metric}/score" not in out.table.columns:
        have = sorted(c[: -len("/score")] for c in out.table.columns if c.endswith("/score"))
        raise InputError(f"--metric {metric!r} is not in {where}'s per-row table; its outputs with a score are: "
                         f"{', '.join(have) or 'none'}. Pass one of them, e.g. --metric {have[0] if have else 'NAME'}.")


def _draw_values(cell: Any, record: dict[str, Any] | None = None) -> list[float] | None:
    """One ``<output>/draws`` cell as its scored draws (nulls dropped; a panel's: the first judge's); None when the
    cell holds no list."""
    values = read_draws(cell, record)
    if values is None:
        return None
    out = []
    for v in values:
        if v is None or isinstance(v, bool):
            continue
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x):
            out.append(x)
    return out


def row_draws(out: EvalOutput, metric: str) -> pd.Series:
    """Each scored row's draws for ``metric``: row id -> list of values (one value per row without repeats).

    Rows with no scored draw (failed, abstained) are left out. Without a ``<metric>/draws`` column the row's score is
    its one draw (a failed or abstained row -- status other than ``scored`` -- has none). A panel's run: the first
    judge's draws only (the run's ``draws`` record names the judges and the repeats).
    """
    t = out.table
    ids = t["row_id"].astype(str) if "row_id" in t.columns else pd.Series([str(i) for i in range(len(t))])
    score = pd.to_numeric(t[f"{metric}/score"], errors="coerce")
    if f"{metric}/status" in t.columns:
        score = score.where(t[f"{metric}/status"].astype(str) == "scored")
    draws_col = t[f"{metric}/draws"] if f"{metric}/draws" in t.columns else None
    drawn = out.config.get("draws") or {}
    values: dict[str, list[float]] = {}
    for i in range(len(t)):
        got = _draw_values(draws_col.iloc[i], drawn) if draws_col is not None else None
        if got is None:
            s = score.iloc[i]
            got = [float(s)] if pd.notna(s) else []
        if got:
            values[ids.iloc[i]] = got
    return pd.Series(values, dtype=object)


def _within(draws: pd.Series) -> float | None:
    """The pooled within-row variance of the draws (module docstring); None when no row has two draws."""
    dof = sum(len(d) - 1 for d in draws)
    if dof == 0:
        return None
    return float(sum(((np.asarray(d) - np.mean(d)) ** 2).sum() for d in draws) / dof)


def _pilot_repeats(draws: pd.Series) -> int:
    counts = pd.Series([len(d) for d in draws])
    return int(counts.mode().max()) if len(counts) else 1


def _metric_within(out: EvalOutput, metric: str) -> tuple[float, int] | None:
    """The run's own ``<metric>/judge_variance`` and ``<metric>/repeats`` (runs with repeats), when logged."""
    w, r = out.metrics.get(f"{metric}/judge_variance"), out.metrics.get(f"{metric}/repeats")
    if w is None or r is None or not math.isfinite(w) or r < 2:
        return None
    return float(w), int(r)


def _not_judged(out: EvalOutput, metric: str) -> bool:
    return f"{metric}/status" not in out.table.columns


def _deterministic(out: EvalOutput, metric: str) -> str | None:
    """Why ``metric`` has no judge noise in this run (computed, or the offline judge's), or None."""
    if _not_judged(out, metric):
        return f"{metric} is computed, not judged"
    if is_offline_judge(out.params.get("ragjudge.judge")):
        return "the offline judge is deterministic"
    return None


def variance_components(out: EvalOutput, metric: str, *, name: str = "the run") -> VarianceComponents:
    """The variance components of one run's ``metric`` (module docstring).

    Raises:
        InputError: ``metric`` has no score column, or fewer than 2 rows scored.
    """
    _check_metric(out, metric, name)
    draws = row_draws(out, metric)
    if len(draws) < 2:
        raise InputError(f"{name}: {len(draws)} row(s) with a {metric} score; a plan needs a pilot of at least 2 "
                         "scored rows (30 or more for a plan worth trusting).")
    means = np.array([np.mean(d) for d in draws])
    var_means = float(np.var(means, ddof=1))
    within, r0 = _within(draws), _pilot_repeats(draws)
    source = f"the per-row draws of {name}"
    if within is None and (why := _deterministic(out, metric)):
        within, source = 0.0, f"{name} ({why}: no judge noise, repeats change nothing)"
    if within is None and (logged := _metric_within(out, metric)) is not None:
        within, r0 = logged
        source = f"{name}'s {metric}/judge_variance and /repeats metrics"
        return VarianceComponents(var_means, within, len(draws), r0, source=source)
    if within is None:
        return VarianceComponents(var_means, None, len(draws), r0, source=f"the row scores of {name}")
    between = max(0.0, var_means - within * float(np.mean([1 / len(d) for d in draws])))
    return VarianceComponents(between + within / r0, within, len(draws), r0, source=source)


def paired_components(out_a: EvalOutput, out_b: EvalOutput, metric: str, *, names: tuple[str, str] = ("A", "B"),
                      ) -> VarianceComponents:
    """The variance components of the per-row differences ``a − b`` of two runs on the same rows (by ``row_id``).

    Raises:
        InputError: ``metric`` missing from either run, fewer than 2 rows scored in both.
    """
    for out, n in zip((out_a, out_b), names):
        _check_metric(out, metric, n)
    da, db = row_draws(out_a, metric), row_draws(out_b, metric)
    common = da.index.intersection(db.index)
    if len(common) < 2:
        raise InputError(f"{names[0]} and {names[1]} share {len(common)} row(s) with a {metric} score (matched by "
                         "row_id); a paired plan needs two runs over the same questions (a sweep's variants, or the "
                         "same data set evaluated twice).")
    da, db = da[common], db[common]
    diffs = np.array([np.mean(a) - np.mean(b) for a, b in zip(da, db)])
    var_d = float(np.var(diffs, ddof=1))
    r0 = max(_pilot_repeats(da), _pilot_repeats(db))
    source = f"the per-row differences {names[0]} − {names[1]} on {len(common)} shared rows"
    wa, wb = (0.0 if _deterministic(o, metric) else _within(d) for d, o in ((da, out_a), (db, out_b)))
    if wa is None or wb is None:
        return VarianceComponents(var_d, None, len(common), r0, paired=True, source=source)
    noise = float(np.mean([wa / len(a) + wb / len(b) for a, b in zip(da, db)]))
    between = max(0.0, var_d - noise)
    return VarianceComponents(between + (wa + wb) / r0, wa + wb, len(common), r0, paired=True, source=source)


def _spec_name(metric: str) -> str:
    for spec in all_specs():
        if spec.produces(metric):
            return spec.name
    return metric


def draw_cost(out: EvalOutput, metric: str, repeats: int = 1) -> DrawCost | None:
    """What judging one row once costs for ``metric`` in this run (module docstring); None when nothing says."""
    spec, rows = _spec_name(metric), max(1, len(out.table))
    records = [r for r in out.transcripts if r.get("metric") == spec]
    if not records:
        per_row = out.metrics.get(f"judge/{spec}/requests_per_row")
        if per_row is None:
            return DrawCost(0.0, 0.0, 0.0) if _deterministic(out, metric) else None
        hits = out.metrics.get(f"judge/{spec}/cache_hits", 0.0) / rows
        return DrawCost((per_row + hits) / repeats)
    calls = [r for r in records if not (r.get("cache_hit") and r.get("shared"))]
    sent = [r for r in records if not r.get("cache_hit")]
    per_call_tokens = per_call_usd = None
    if sent:
        per_call_tokens = sum(float(r.get("input_tokens") or 0) + float(r.get("output_tokens") or 0)
                              for r in sent) / len(sent)
        costs = [c for r in sent if isinstance(c := r.get("cost_usd"), (int, float))]
        if len(costs) == len(sent):  # one call of unknown price and the total is unknown
            per_call_usd = sum(float(c) for c in costs) / len(sent)
    per_draw = len(calls) / rows / repeats
    return DrawCost(per_draw, per_call_tokens * per_draw if per_call_tokens is not None else None,
                    per_call_usd * per_draw if per_call_usd is not None else None)


def _stored_labels(run_id: str, metric: str) -> pd.Series | None:
    """Human labels ``ragjudge calibrate`` stored with the run: row id -> label; None when there are none."""
    raw = tracking.read_json_artifact(run_id, LABELS_FILE)
    if not isinstance(raw, dict) or metric not in (raw.get("columns") or []):
        return None
    frame = pd.DataFrame(raw.get("data") or [], columns=raw["columns"])
    labels = pd.to_numeric(frame[metric], errors="coerce")
    return pd.Series(labels.to_numpy(dtype=float), index=frame["row_id"].astype(str)).dropna()


def _calibrated(outs: Sequence[tuple[str, EvalOutput]], metric: str, alpha: float,
                notes: list[str]) -> CalibratedEstimate | None:
    """The calibrated pilot estimate from the runs' stored labels (one run: its mean; two: their difference)."""
    judged, human = [], []
    for rid, out in outs:
        if not rid or "row_id" not in out.table.columns or _not_judged(out, metric):
            return None  # (an EvalOutput in hand has no stored labels)
        labels = _stored_labels(rid, metric)
        if labels is None:
            return None
        j = _judge_scores(out, metric)
        judged.append(j.to_numpy())
        human.append(labels.reindex(j.index).to_numpy(dtype=float))
    try:
        if len(outs) == 1:
            return ppi_mean(judged[0], human[0], alpha=alpha, scale=scale_of(metric))
        return ppi_paired_diff(judged[0], judged[1], human[0], human[1], alpha=alpha, scale=scale_of(metric))
    except (TooFewLabels, ValueError) as e:
        notes.append(f"the run's human labels give no calibrated pilot ({e}); the labels are not planned")
        return None


def _mean_cost(costs: Sequence[DrawCost | None]) -> DrawCost | None:
    if any(c is None for c in costs):
        return None
    cs = [c for c in costs if c is not None]

    def avg(vals: list[float | None]) -> float | None:
        return None if any(v is None for v in vals) else sum(v for v in vals if v is not None) / len(vals)

    return DrawCost(sum(c.requests for c in cs) / len(cs), avg([c.tokens for c in cs]), avg([c.usd for c in cs]))


def plan(run: str | EvalOutput, run_b: str | EvalOutput | None = None, *, metric: str, width: float | None = None,
         detect: float | None = None, power: float = 0.8, alpha: float = 0.05,
         repeats: Sequence[int] = DEFAULT_REPEATS) -> Plan:
    """Plan rows, repeats and labels for ``metric`` from a run as the pilot (module docstring; docs/planning.md).

    Args:
        run: a run id (or an :class:`EvalOutput`); a sweep's parent run plans its variants against the baseline.
        run_b: a second run over the same rows: plan the paired comparison ``run − run_b``.
        metric: the output, e.g. ``correctness``.
        width: the interval's full width to reach (``ci_high − ci_low``); give this or ``detect``.
        detect: the difference between two variants to detect; with one run, planned unpaired (two independent
            samples of rows), with two runs or a sweep, paired.
        power, alpha: the test's power and level (``detect``), the interval's level (``width``).
        repeats: the repeats to list.

    Raises:
        InputError: an unknown run, a metric the run does not have, too few scored rows.
        ValueError: a bad target (neither or both, or not positive), ``alpha`` or ``power`` outside (0, 1).
    """
    check_target(width=width, detect=detect, power=power, alpha=alpha)  # before any run is read
    notes: list[str] = []
    pairs = _pairs(run, run_b)
    plans = []
    for (na, a), b in pairs:
        if b is None:
            comps = variance_components(a[1], metric, name=na)
            cost = draw_cost(a[1], metric, comps.repeats)
            labelled = _calibrated([a], metric, alpha, notes)
        else:
            nb, bo = b
            comps = paired_components(a[1], bo[1], metric, names=(na, nb))
            cost = _mean_cost([draw_cost(o, metric, comps.repeats) for o in (a[1], bo[1])])
            labelled = _calibrated([a, bo], metric, alpha, notes)
        plans.append(plan_evaluation(comps, metric=metric, width=width, detect=detect, power=power, alpha=alpha,
                                     cost=cost, repeats=repeats, unpaired=b is None, labels=labelled,
                                     variants=len(pairs) + 1 if len(pairs) > 1 else None))
    worst = max(plans, key=lambda p: p.options[0].rows or (p.options[0].rows_range or (0, 0))[1])
    if len(plans) > 1:
        notes.append(f"a sweep of {len(plans) + 1} variants: planned for the comparison that needs the most rows "
                     f"({worst.components.source}); that many rows settle every variant against the baseline")
    return dataclasses.replace(worst, notes=(*worst.notes, *notes))


_Loaded = tuple[str, EvalOutput]  # (run id or "", output)


def _pairs(run: str | EvalOutput, run_b: str | EvalOutput | None
           ) -> list[tuple[tuple[str, _Loaded], tuple[str, _Loaded] | None]]:
    """What to plan: ``[(name, (run id, output)), second or None]`` per comparison."""
    def load(r: str | EvalOutput, name: str) -> tuple[str, _Loaded]:
        if isinstance(r, EvalOutput):
            return name, ("", r)
        _runs_of(r)  # an unknown run id: a clear error
        return f"run {r}", (r, load_output(r))

    if run_b is not None:
        return [(load(run, "run A"), load(run_b, "run B"))]
    if isinstance(run, EvalOutput):
        return [(load(run, "the run"), None)]
    runs = _runs_of(run)
    if runs.parent is None:
        return [(load(run, "the run"), None)]
    if runs.baseline is None or len(runs.runs) < 2:
        raise InputError(f"sweep {run} has {len(runs.runs)} evaluated variant(s) and baseline {runs.baseline!r}: a "
                         "paired plan needs a baseline and another variant; give two run ids instead.")
    base = (f"{runs.baseline} (baseline)", (runs.runs[runs.baseline], load_output(runs.runs[runs.baseline])))
    return [((name, (rid, load_output(rid))), base) for name, rid in runs.runs.items() if name != runs.baseline]
