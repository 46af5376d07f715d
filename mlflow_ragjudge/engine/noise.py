"""The judge's own noise, from a run's draws (:mod:`.draws`): how often a judge changes its verdict on the same row,
how much of the scores' variance is the judge's rather than the questions', and how far the judges of a panel agree
-- docs/judge-noise.md.

For one judge and one output, with ``v_ik`` the k-th scored draw of row i (``n_i`` of them) and ``m_i`` their mean:

* ``flip_rate``: the share of rows with two or more scored draws whose draws are not all equal (a verdict or level
  that changes from one call to the next), with its Wilson score interval;
* ``judge_variance`` (sigma^2_w): the mean over those rows of ``w_i = sum_k (v_ik - m_i)^2 / (n_i - 1)``, each
  ``w_i`` an unbiased estimate of one draw's variance around its row's mean -- the judge's noise; with a Student-t
  interval over the rows;
* ``between_variance`` (sigma^2_b): the variance of the rows' own means, ``s^2(m_i) - sigma^2_w * mean(1 / n_i)``
  (the one-way random-effects estimate, floored at 0);
* ``judge_share`` = sigma^2_w / (sigma^2_w + sigma^2_b): the judge's share of one draw's variance.

The run's interval of a mean needs nothing from here: each row's value is its draws' combination, so the rows'
spread already holds the judge's noise (``Var(m_i) = sigma^2_b + sigma^2_w / n``), the same as a two-level
bootstrap over questions and draws gives.

A panel's agreement per output: Krippendorff's alpha over the judges' per-row values (ordinal on the six-level
scale, interval elsewhere); where the values are categories (levels, pass/fail), Fleiss' kappa (nominal) and Cohen's
kappa of each pair of judges (quadratic-weighted on the five levels, all five counted as the scale) -- the functions
of :mod:`.agreement`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from itertools import combinations
from typing import Any

from ..core.types import Status, metric_name_part
from .agreement import FleissSums, alpha_of_coincidences, coincidences, confusion, kappa_of_confusion
from .draws import Draws, spread

__all__ = ["NoiseSums", "PanelSums", "noise_stats", "noise_sums", "noise_metrics", "panel_sums", "panel_metrics",
           "draw_columns", "escalation_metrics"]

#: the normal quantile of the 95 % intervals here
_Z = 1.959963984540054


def _wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson score interval of a share ``k / n`` (95 %)."""
    p = k / n
    centre = (p + _Z * _Z / (2 * n)) / (1 + _Z * _Z / n)
    half = _Z * math.sqrt(p * (1 - p) / n + _Z * _Z / (4 * n * n)) / (1 + _Z * _Z / n)
    low, high = centre - half, centre + half
    # at k = 0 or k = n the bound is exactly 0 or 1; the formula leaves a rounding error there (5.6e-17)
    return (0.0 if low < 1e-12 else low), (1.0 if high > 1 - 1e-12 else high)


def _t_half(n: int, sd: float) -> float:
    """The half-width of the Student-t 95 % interval of a mean of ``n`` values with standard deviation ``sd``."""
    from scipy import stats  # (here: only a run with repeats reads it)

    return float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def _var(total: float, squares: float, n: int) -> float:
    """The sample variance (n - 1) of ``n`` values from their sum and the sum of their squares (never below 0)."""
    return max(0.0, (squares - total * total / n) / (n - 1))


@dataclass(frozen=True)
class NoiseSums:
    """What one judge's draws of one output add up to, over the rows with two or more scored draws: the sums the
    judge-noise statistics are computed from (:meth:`stats`). Sums of parts of the data merge (:meth:`merge`), so
    an evaluation split over partitions logs the numbers one process would.

    ``w`` is each row's draws' sample variance, ``m`` their mean, ``n`` their number."""

    rows: int = 0
    flips: int = 0
    w: float = 0.0
    w2: float = 0.0
    m: float = 0.0
    m2: float = 0.0
    inv_n: float = 0.0

    @classmethod
    def of(cls, draws_by_row: Sequence[Sequence[float]]) -> NoiseSums:
        """The sums of one judge's draws (per row, its scored draws' values)."""
        rows = flips = 0
        w = w2 = m = m2 = inv_n = 0.0
        for values in draws_by_row:
            n = len(values)
            if n < 2:
                continue
            mean = math.fsum(values) / n
            var = math.fsum((x - mean) ** 2 for x in values) / (n - 1)
            rows += 1
            flips += len(set(values)) > 1
            w, w2, m, m2, inv_n = w + var, w2 + var * var, m + mean, m2 + mean * mean, inv_n + 1 / n
        return cls(rows, flips, w, w2, m, m2, inv_n)

    def merge(self, other: NoiseSums) -> NoiseSums:
        return NoiseSums(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def stats(self) -> dict[str, float]:
        """The judge-noise statistics (see the module docstring); empty without a row of two scored draws."""
        n = self.rows
        if not n:
            return {}
        out: dict[str, float] = {"rows_with_repeats": float(n), "flip_rate": self.flips / n}
        out["flip_rate_ci_low"], out["flip_rate_ci_high"] = _wilson(self.flips, n)
        sigma_w = self.w / n
        out["judge_variance"] = sigma_w
        if n >= 2:
            half = _t_half(n, math.sqrt(_var(self.w, self.w2, n)))
            out["judge_variance_ci_low"], out["judge_variance_ci_high"] = max(0.0, sigma_w - half), sigma_w + half
            sigma_b = max(0.0, _var(self.m, self.m2, n) - sigma_w * self.inv_n / n)
            out["between_variance"] = sigma_b
            if sigma_w + sigma_b > 0:
                out["judge_share"] = sigma_w / (sigma_w + sigma_b)
        return out


def noise_stats(draws_by_row: Sequence[Sequence[float]]) -> dict[str, float]:
    """The judge-noise statistics of one judge's draws of one output (per row, its scored draws' values); see the
    module docstring. Empty with no row of two scored draws."""
    return NoiseSums.of(draws_by_row).stats()


def _judge_draws(draws: Draws, name: str, judge: int) -> list[list[float]]:
    return [[float(r.value) for r in per_judge[judge] if r.status is Status.SCORED and r.value is not None]
            for per_judge in draws.results[name]]


def noise_sums(draws: Draws) -> dict[str, list[NoiseSums]]:
    """Per judged output, each judge's :class:`NoiseSums` (a run with repeats; empty without)."""
    if draws.repeats < 2:
        return {}
    return {name: [NoiseSums.of(_judge_draws(draws, name, j)) for j in range(len(draws.judges))]
            for name in draws.results}


def noise_metrics(sums: dict[str, list[NoiseSums]], judges: Sequence[str], repeats: int) -> dict[str, float]:
    """``<output>/repeats`` and the judge-noise statistics of every judged output, for a run with repeats: the run's
    (first) judge's as ``<output>/<stat>``, every other judge's as ``<output>/by_judge/<judge>/<stat>``."""
    out: dict[str, float] = {}
    for name, per_judge in sums.items():
        out[f"{name}/repeats"] = float(repeats)
        for j, (label, judge_sums) in enumerate(zip(judges, per_judge)):
            prefix = name if j == 0 else f"{name}/by_judge/{metric_name_part(label)}"
            out.update({f"{prefix}/{k}": v for k, v in judge_sums.stats().items()})
    return out


@dataclass(frozen=True)
class PanelSums:
    """What a panel's numbers for one output are computed from (:func:`panel_output_metrics`): each judge's sum and
    count of scored values, the judges' coincidence matrix (Krippendorff's alpha), and -- while every value is a
    category of ``scale`` -- Fleiss' sums and each pair of judges' confusion matrix. Sums of parts of the data merge
    (:meth:`merge`), so an evaluation split over partitions logs the numbers one process would."""

    levels: bool
    means: tuple[tuple[float, int], ...]
    coincidences: dict[tuple[Any, Any], float]
    scale: tuple[float, ...] | None
    fleiss: FleissSums
    pairs: tuple[tuple[tuple[int, ...], ...], ...]

    @classmethod
    def of(cls, per_judge: Sequence[Sequence[float | None]], levels: bool) -> PanelSums:
        units = [list(row) for row in zip(*per_judge)]
        scale = _categories([v for values in per_judge for v in values if v is not None], levels)
        means = tuple((math.fsum(v for v in vs if v is not None), sum(v is not None for v in vs)) for vs in per_judge)
        pairs: tuple[tuple[tuple[int, ...], ...], ...] = ()
        fleiss = FleissSums()
        if scale is not None:
            fleiss = FleissSums.of(units)
            pairs = tuple(tuple(tuple(row) for row in confusion(a, b, labels=list(scale))[1])
                          for a, b in combinations(per_judge, 2))
        return cls(levels, means, coincidences(units), tuple(scale) if scale else None, fleiss, pairs)

    def merge(self, other: PanelSums) -> PanelSums:
        o = dict(self.coincidences)
        for key, w in other.coincidences.items():
            o[key] = o.get(key, 0.0) + w
        means = tuple((a[0] + b[0], a[1] + b[1]) for a, b in zip(self.means, other.means))
        if self.scale is None or self.scale != other.scale:  # a part with a continuous value: no categories
            return PanelSums(self.levels, means, o, None, FleissSums(), ())
        pairs = tuple(tuple(tuple(x + y for x, y in zip(ra, rb)) for ra, rb in zip(ma, mb))
                      for ma, mb in zip(self.pairs, other.pairs))
        return PanelSums(self.levels, means, o, self.scale, self.fleiss.merge(other.fleiss), pairs)

    def to_json(self) -> dict[str, Any]:
        return {"levels": self.levels, "means": [list(m) for m in self.means],
                "coincidences": [[c, d, w] for (c, d), w in self.coincidences.items()],
                "scale": list(self.scale) if self.scale is not None else None,
                "fleiss": [self.fleiss.units, self.fleiss.agreement, [list(t) for t in self.fleiss.totals]],
                "pairs": [[list(row) for row in m] for m in self.pairs]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PanelSums:
        units, agreement, totals = d["fleiss"]
        return cls(d["levels"], tuple((float(a), int(b)) for a, b in d["means"]),
                   {(c, k): float(w) for c, k, w in d["coincidences"]},
                   tuple(d["scale"]) if d["scale"] is not None else None,
                   FleissSums(int(units), float(agreement), tuple((v, int(c)) for v, c in totals)),
                   tuple(tuple(tuple(int(x) for x in row) for row in m) for m in d["pairs"]))


def panel_sums(draws: Draws) -> dict[str, PanelSums]:
    """Per judged output of a panel (or a cascade), its :class:`PanelSums`; empty for one judge."""
    if len(draws.judges) < 2:
        return {}
    return {name: PanelSums.of([draws.judge_values(name, j) for j in range(len(draws.judges))],
                               draws.on_levels(name)) for name in draws.results}


def panel_metrics(sums: dict[str, PanelSums], judges: Sequence[str], cascade: bool) -> dict[str, float]:
    """A panel's agreement and each judge's own mean, per output: ``<output>/by_judge/<judge>/mean``,
    ``<output>/panel/alpha`` and, where the values are categories, ``<output>/panel/fleiss_kappa`` and
    ``<output>/panel/kappa/<a>__<b>``. Under a cascade, each judge's mean on the rows it scored (no agreement: the
    judges saw different rows)."""
    out: dict[str, float] = {}
    for name, ps in sums.items():
        for label, (total, n) in zip(judges, ps.means):
            if n:
                out[f"{name}/by_judge/{metric_name_part(label)}/mean"] = total / n
        if cascade:
            continue
        alpha = alpha_of_coincidences(ps.coincidences, level="ordinal" if ps.levels else "interval")
        if alpha is not None:
            out[f"{name}/panel/alpha"] = alpha
        if ps.scale is None:  # a continuous score (a share of claims): no categories to count agreement on
            continue
        fleiss = ps.fleiss.kappa()
        if fleiss is not None:
            out[f"{name}/panel/fleiss_kappa"] = fleiss
        for (a, b), matrix in zip(combinations(judges, 2), ps.pairs):
            kappa = kappa_of_confusion(matrix, weights="quadratic" if ps.levels else None)
            if kappa is not None:
                out[f"{name}/panel/kappa/{metric_name_part(a)}__{metric_name_part(b)}"] = kappa
    return out


def _categories(values: Sequence[float], levels: bool) -> list[float] | None:
    """The scale a panel's values are categories of: the five levels of a six-level output whose values are all
    levels (the majority rule keeps them so), 0 and 1 for a pass/fail output; None for a continuous score."""
    if levels and all(v in (1, 2, 3, 4, 5) for v in values):
        return [1.0, 2.0, 3.0, 4.0, 5.0]
    if all(v in (0, 1) for v in values):
        return [0.0, 1.0]
    return None


def escalation_metrics(draws: Draws, transcripts: Sequence[dict[str, Any]], n_rows: int) -> dict[str, float]:
    """A cascade's cost: per metric the rows escalated (``<metric>/escalated``), and for the run the second judge's
    requests (``judge/escalation/requests``) and those it did not send (``judge/escalation/requests_saved``: its
    requests per escalated row times the rows it was not sent, what judging every row with it would have added)."""
    if not draws.cascade:
        return {}
    second = draws.judges[-1]
    sent = sum(float(t.get("attempts") or 0) for t in transcripts if t.get("judge") == second)
    escalated = sum(len(rows) for rows in draws.escalated.values())
    not_sent = sum(n_rows - len(rows) for rows in draws.escalated.values())
    out = {f"{m}/escalated": float(len(rows)) for m, rows in draws.escalated.items()}
    out["judge/escalation/requests"] = sent
    out["judge/escalation/requests_saved"] = sent / escalated * not_sent if escalated else 0.0
    return out


def draw_columns(draws: Draws, n_rows: int) -> dict[str, list[Any]]:
    """The per-row table's columns of a run's draws: ``<output>/draws`` (every draw's value, a JSON list, null where
    a draw did not score), ``<output>/draws_mean`` and ``<output>/spread`` (their mean and standard deviation) with
    repeats; ``<output>/score@<judge>``
    (each judge's own value) for a panel or a cascade, and ``<metric>/escalated`` for a cascade."""
    cols: dict[str, list[Any]] = {}
    for name in draws.results:
        values = draws.draw_values(name)
        if draws.repeats > 1 or len(draws.judges) > 1:
            cols[f"{name}/draws"] = [json.dumps(v) for v in values]
        if draws.repeats > 1:
            scored = [[x for x in v if x is not None] for v in values]
            cols[f"{name}/draws_mean"] = [math.fsum(v) / len(v) if v else None for v in scored]
            cols[f"{name}/spread"] = [spread(v) for v in scored]
        if len(draws.judges) > 1:
            for j, label in enumerate(draws.judges):
                cols[f"{name}/score@{label}"] = draws.judge_values(name, j)
    for metric, rows in draws.escalated.items():
        chosen = set(rows)
        cols[f"{metric}/escalated"] = [i in chosen for i in range(n_rows)]
    return cols
