"""The interval of a run's mean, and the gate decided on it.

Each output's mean gets the Student-t interval of the mean over its scored rows (:func:`mean_interval`)::

    mean +- t_{1 - (1 - level) / 2, n - 1} * s / sqrt(n)

``s`` the sample standard deviation of the per-row values, computed from the output's mergeable sums
(:attr:`~mlflow_ragjudge.core.types.Aggregate.variance`), so that an evaluation split over Spark partitions gives the
interval one process gives. With repeats a row's value is its mean over the draws, so ``s**2`` estimates
``sigma_b**2 + sigma_w**2 / r`` (the rows' own spread plus the judge's noise over ``r`` draws): the interval covers the
sampling of the questions and the judge's randomness both.

A ``fail_under`` gate (:func:`decide_gate`) on that interval passes when its lower bound is at least the threshold,
fails when its upper bound is below it, and is undecided in between, with how many more rows (or repeats) would
decide it; the point rule (the mean against the threshold) stays available by name (``gate_rule="point"``).

The difference of two samples' means (:func:`difference_interval`, a monitor's drop test against a baseline) is
paired where the same questions recur in both -- the t-interval of the per-question differences -- and otherwise
Welch's unpaired interval, with the Welch-Satterthwaite degrees of freedom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..core.types import Aggregate

__all__ = ["LEVEL", "GATE_RULES", "MeanInterval", "mean_interval", "t_quantile", "more_rows", "more_repeats",
           "decide_gate", "gate_status", "difference_interval", "MIN_PAIRS"]

#: the level of every interval a run logs (``<name>/ci_low``, ``<name>/ci_high``) and its gates use
LEVEL = 0.95
#: ``gate_rule`` values: ``interval`` (pass / fail / undecided on the 95 % interval) and ``point`` (the mean alone)
GATE_RULES = ("interval", "point")


@lru_cache(maxsize=1024)
def t_quantile(df: int, q: float = 0.5 + LEVEL / 2) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (``scipy.special.stdtrit``, what
    ``scipy.stats.t.ppf`` computes)."""
    from scipy.special import stdtrit  # start-up time: only a run that logs a mean needs it (0.1 s)

    return float(stdtrit(df, q))


@dataclass(frozen=True)
class MeanInterval:
    """The interval of a mean over ``n`` rows whose values have sample variance ``variance``; ``t`` the quantile
    used."""

    mean: float
    low: float
    high: float
    n: int
    variance: float
    t: float

    @property
    def half_width(self) -> float:
        return self.t * math.sqrt(self.variance / self.n)


def mean_interval(agg: Aggregate, level: float = LEVEL) -> MeanInterval | None:
    """The Student-t interval of ``agg``'s mean over its scored rows; None with fewer than two scored rows or an
    unknown spread (never NaN). A constant column gives the point (``low == high == mean``)."""
    variance = agg.variance
    if agg.mean is None or variance is None:
        return None
    n = agg.n_scored
    t = t_quantile(n - 1, 0.5 + level / 2)
    half = t * math.sqrt(variance / n)
    return MeanInterval(agg.mean, agg.mean - half, agg.mean + half, n, variance, t)


def more_rows(n: int, half_width: float, distance: float) -> int | None:
    """About how many rows to add, at the same spread, for an interval of half-width ``half_width`` over ``n`` rows
    to leave out a value ``distance`` from its centre: ``ceil(n * (half_width / distance)**2) - n`` (the half-width
    shrinks as ``1 / sqrt(n)``; the t quantile's own small change is left out). None when ``distance`` is 0: no
    number of rows at this mean decides it."""
    if distance <= 0:
        return None
    return max(1, math.ceil(n * (half_width / distance) ** 2) - n)


def more_repeats(iv: MeanInterval, distance: float, judge_variance: float, repeats: int) -> int | None:
    """The smallest number of repeats per row ``r'`` (more than ``repeats``) whose interval would leave out a value
    ``distance`` from the mean, at the same rows: with ``s**2`` the variance of a row's mean over ``repeats`` draws
    and ``sigma_w**2`` the judge's variance of one draw, the rows' own variance is ``sigma_b**2 = max(0, s**2 -
    sigma_w**2 / repeats)`` and ``r'`` the smallest with ``t * sqrt((sigma_b**2 + sigma_w**2 / r') / n) < distance``.
    None when no number of repeats does it (``t * sqrt(sigma_b**2 / n) >= distance``: the questions' own spread
    alone is too wide; more rows are needed)."""
    if distance <= 0 or judge_variance <= 0 or repeats < 1:
        return None
    between = max(0.0, iv.variance - judge_variance / repeats)
    room = iv.n * (distance / iv.t) ** 2 - between  # what sigma_w**2 / r' must stay under
    if room <= 0:
        return None
    return max(repeats + 1, math.floor(judge_variance / room) + 1)


def _num(v: float) -> str:
    return f"{v:.4f}"


def decide_gate(metric: str, threshold: float, value: float | None, iv: MeanInterval | None, *, rule: str,
                no_interval: str = "", judge: tuple[float, int] | None = None) -> dict[str, Any]:
    """One gate's entry: ``{"metric", "threshold", "value", "ci_low", "ci_high", "n", "rule", "outcome",
    "passed", "message"}`` and, when undecided, ``"more_rows"`` and (with ``judge`` = the output's judge variance
    and repeats) ``"more_repeats"``.

    ``rule="interval"`` passes when ``ci_low >= threshold``, fails when ``ci_high < threshold``, else is undecided;
    a metric with no interval (``iv`` None: not a mean, fewer than two scored rows; ``no_interval`` says why) is
    decided by the point rule, and the entry says so. ``rule="point"``: ``value >= threshold`` passes, else fails.
    A metric the run did not produce fails."""
    entry: dict[str, Any] = {"metric": metric, "threshold": float(threshold), "value": value,
                             "ci_low": iv.low if iv is not None else None,
                             "ci_high": iv.high if iv is not None else None,
                             "n": iv.n if iv is not None else None, "rule": rule}
    if value is None:
        return {**entry, "outcome": "fail", "passed": False,
                "message": f"{metric} was not produced by this run: failed"}
    shown = f"{metric} = {_num(value)}"
    if iv is not None:
        shown += f", {LEVEL:.0%} interval [{_num(iv.low)}, {_num(iv.high)}] over {iv.n} rows"
    if rule == "point" or iv is None:
        why = "point rule" if rule == "point" else f"no interval: {no_interval}; the point rule decided"
        ok = value >= threshold
        return {**entry, "rule": "point", "outcome": "pass" if ok else "fail", "passed": ok,
                "message": f"{shown}; the mean is {'at or above' if ok else 'below'} {threshold:g} ({why}): "
                           f"{'passed' if ok else 'failed'}"}
    if iv.low >= threshold:
        return {**entry, "outcome": "pass", "passed": True, "message": f"{shown}, all of it >= {threshold:g}: passed"}
    if iv.high < threshold:
        return {**entry, "outcome": "fail", "passed": False,
                "message": f"{shown}, all of it below {threshold:g}: failed"}
    distance = abs(iv.mean - threshold)
    rows = more_rows(iv.n, iv.half_width, distance)
    entry.update(outcome="undecided", passed=False, more_rows=rows)
    if rows is None:
        advice = "the mean sits on the threshold: no number of rows at this mean decides it"
    else:
        advice = f"about {rows} more rows ({iv.n + rows} in all) at the same spread would decide it"
    if judge is not None:
        reps = more_repeats(iv, distance, *judge)
        entry["more_repeats"] = reps
        advice += (f", or repeats={reps} per row (now {judge[1]})" if reps is not None else
                   "; no number of repeats decides it (the questions' own spread is too wide): more rows are needed")
    entry["message"] = f"{shown} straddles {threshold:g}: undecided; {advice}"
    return entry


def gate_status(gate: list[dict[str, Any]]) -> str | None:
    """A run's gates in one word: ``failed`` when any failed (a failure outranks an undecided gate),
    ``undecided`` when any is undecided, ``passed`` when all passed; None without gates."""
    if not gate:
        return None
    outcomes = {g.get("outcome", "pass" if g.get("passed") else "fail") for g in gate}
    return "failed" if "fail" in outcomes else "undecided" if "undecided" in outcomes else "passed"


#: questions both samples must share for the paired interval (fewer: the unpaired one)
MIN_PAIRS = 10


def difference_interval(now_by_key: dict[Any, float], base_by_key: dict[Any, float], now: list[float],
                        base: list[float], level: float = LEVEL) -> dict[str, Any] | None:
    """The ``level`` interval of mean(now) - mean(base): paired on the keys (questions) both have when at least
    :data:`MIN_PAIRS` recur (``now_by_key`` / ``base_by_key``: a key's mean value in each), else unpaired (Welch) on
    the values ``now`` and ``base``. ``{"diff", "low", "high", "n", "kind"}``; None with fewer than two values on a
    side (or two pairs)."""
    shared = [k for k in now_by_key if k in base_by_key]
    if len(shared) >= MIN_PAIRS:
        d = [now_by_key[k] - base_by_key[k] for k in shared]
        n = len(d)
        mean = sum(d) / n
        var = sum((x - mean) ** 2 for x in d) / (n - 1)
        half = t_quantile(n - 1, 0.5 + level / 2) * math.sqrt(var / n)
        return {"diff": mean, "low": mean - half, "high": mean + half, "n": n, "kind": "paired"}
    if len(now) < 2 or len(base) < 2:
        return None
    n1, n2 = len(now), len(base)
    m1, m2 = sum(now) / n1, sum(base) / n2
    v1 = sum((x - m1) ** 2 for x in now) / (n1 - 1)
    v2 = sum((x - m2) ** 2 for x in base) / (n2 - 1)
    se2 = v1 / n1 + v2 / n2
    diff = m1 - m2
    if se2 == 0:
        return {"diff": diff, "low": diff, "high": diff, "n": n1 + n2, "kind": "unpaired"}
    df = se2 ** 2 / ((v1 / n1) ** 2 / (n1 - 1) + (v2 / n2) ** 2 / (n2 - 1))
    half = t_quantile(max(1, int(df)), 0.5 + level / 2) * math.sqrt(se2)
    return {"diff": diff, "low": diff - half, "high": diff + half, "n": n1 + n2, "kind": "unpaired"}
