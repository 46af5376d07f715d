"""Planning an evaluation: how many rows (questions), repeats (judge draws per row) and human labels an interval of a
given width, or a difference of a given size, needs -- and what each option costs.

A judged metric's mean over ``N`` rows, each judged ``r`` times and averaged, varies for two reasons: which questions
were drawn (the rows' true means differ: the between-row variance ``σ²_b``) and the judge's own randomness (one draw
scatters around its row's true mean: the within-row variance ``σ²_w``). Under that two-level model

    Var(mean) = (σ²_b + σ²_w / r) / N

so for an interval ``mean ± h`` (``width = 2h``) at level ``α`` the rows needed with ``r`` repeats are

    N(r) = ⌈ z²_{1−α/2} · (σ²_b + σ²_w / r) / h² ⌉

and to detect a difference ``δ`` with power ``1 − β`` (two-sided test at level ``α``) the multiplier is
``(z_{1−α/2} + z_{1−β})²`` and the target ``δ`` instead of ``z²`` and ``h``. For two variants judged on the same rows
(a *paired* comparison) the same formulas hold with the variance components of the per-row differences (``σ²_w`` of
a difference is the sum of both sides' judge variances); for a pilot of one variant planning a comparison with
another on *different* rows (unpaired) the variance of a difference is twice one side's, ``2 (σ²_b + σ²_w / r)``,
and ``N`` counts rows per variant. Judging the same questions for both variants is paired and usually needs fewer.

**The floor.** Repeats only shrink the ``σ²_w / r`` term: with ``N`` rows no number of repeats gets the half-width
below ``h_floor = z · √(σ²_b / N)``. When the target is below that floor only more rows help; above it, the
repeats that reach the target with the current ``N`` rows are ``r* = ⌈σ²_w / (N h² / z² − σ²_b)⌉``.

**Without repeats** the pilot measures only the sum ``σ²_b + σ²_w`` (the variance of single-draw row scores), not its
split: ``N(1)`` is known, ``N(r)`` for ``r > 1`` is only bracketed, between ``N(1) / r`` (all of the variance is the
judge's) and ``N(1)`` (none is). A pilot with ``repeats=3`` measures the split.

**Labels** answer a different question: the interval of the *human* mean (the judge's bias removed, by PPI:
:mod:`~mlflow_ragjudge.engine.ppi`). Given a calibrated pilot estimate,
:func:`~mlflow_ragjudge.engine.ppi.labels_needed` plans them; a detection target is turned into the equivalent
width ``2 δ z_{1−α/2} / (z_{1−α/2} + z_{1−β})`` (divided by ``√2`` when unpaired), so the
labels sit in the same table as rows and draws.

Every planned number is at least :data:`MIN_ROWS` (30): a normal interval on fewer rows is not trustworthy, the same
floor :func:`~mlflow_ragjudge.engine.ppi.labels_needed` uses for labels. The plan holds the pilot's variances fixed;
a plan from a small pilot is itself noisy (plan, run, and let the run's own interval say what you got).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import pandas as pd

from .ppi import MIN_LABELS, CalibratedEstimate, labels_needed

__all__ = ["VarianceComponents", "DrawCost", "PlanOption", "LabelPlan", "Plan", "plan_evaluation", "check_target",
           "MIN_ROWS", "DEFAULT_REPEATS"]

#: no plan asks for fewer rows than this: the normal interval the plan rests on needs them (as labels_needed's floor)
MIN_ROWS = MIN_LABELS
#: the repeats every plan lists
DEFAULT_REPEATS = (1, 2, 3, 5, 10)


@dataclass(frozen=True)
class VarianceComponents:
    """What a pilot measured about one output (or about the per-row differences of two variants).

    Attributes:
        row_variance: the sample variance (ddof 1) of the pilot's per-row scores, each the mean of its ``repeats``
            draws: an estimate of ``σ²_b + σ²_w / repeats``.
        within: ``σ²_w``, one judge draw's variance around its row's mean (for a difference: the sum of both
            sides'); None when the pilot had no repeats (unknown, not 0).
        rows: the pilot's rows ``N`` (with a score; for a comparison, scored on both sides).
        repeats: the pilot's draws per row ``r`` (1 without repeats).
        paired: the components are of per-row differences between two variants judged on the same rows.
        source: where the numbers came from, for the message (e.g. ``"the per-row draws of run abc"``).
    """

    row_variance: float
    within: float | None
    rows: int
    repeats: int = 1
    paired: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("row_variance", "within"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0):
                raise ValueError(f"{name}={v!r} must be a finite variance >= 0")
        if isinstance(self.rows, bool) or not isinstance(self.rows, numbers.Integral) or self.rows < 2:
            raise ValueError(f"rows={self.rows!r}: a pilot needs at least 2 scored rows to measure a variance")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, numbers.Integral) or self.repeats < 1:
            raise ValueError(f"repeats={self.repeats!r} must be a whole number >= 1")

    @property
    def between(self) -> float | None:
        """``σ²_b = row_variance − σ²_w / repeats`` (clipped at 0); None when ``σ²_w`` is unknown."""
        if self.within is None:
            return None
        return max(0.0, self.row_variance - self.within / self.repeats)

    @property
    def judge_share(self) -> float | None:
        """``σ²_w / (σ²_w + σ²_b)``: the share of one draw's variance that is the judge's own noise."""
        b = self.between
        if b is None or self.within is None or b + self.within == 0:
            return None
        return self.within / (self.within + b)


@dataclass(frozen=True)
class DrawCost:
    """What judging one row once (one draw) costs, for one output, on average over the pilot.

    Attributes:
        requests: judge requests per row per draw (a metric may send several per row).
        tokens: input + output tokens per row per draw; None when unknown.
        usd: dollars per row per draw; None when the model's price is unknown.
    """

    requests: float
    tokens: float | None = None
    usd: float | None = None


@dataclass(frozen=True)
class PlanOption:
    """One way to reach the target: ``rows`` rows judged ``repeats`` times each.

    ``rows`` is None when it cannot be planned (repeats > 1 without a measured ``σ²_w``); ``rows_range`` then
    brackets it. ``draws`` = rows x repeats x variants, the judged row-draws; ``requests``, ``tokens``, ``usd`` their
    cost (None when unknown)."""

    repeats: int
    rows: int | None
    rows_range: tuple[int, int] | None = None
    draws: int | None = None
    requests: float | None = None
    tokens: float | None = None
    usd: float | None = None


@dataclass(frozen=True)
class LabelPlan:
    """Human labels for the calibrated (PPI) interval of the human mean, per variant.

    Attributes:
        ppi: ``(judged rows M, labels)`` pairs: the labels PPI needs with the judge scoring ``M`` rows (None: even
            labelling all ``M`` would not reach it). PPI's interval shrinks with both (``se² ≈ σ²_r / n + σ²_u /
            (M − n)``), so the rows are listed at the pilot's count and at 2 and 4 times the rows the judge alone
            needs with one draw: more judged rows, fewer labels.
        classical: the labels alone (no judge).
        equivalent_width: the interval width asked of :func:`~mlflow_ragjudge.engine.ppi.labels_needed`.
        pilot_labels: the labels the pilot had.
    """

    ppi: tuple[tuple[int, int | None], ...]
    classical: int | None
    equivalent_width: float
    pilot_labels: int


@dataclass(frozen=True)
class Plan:
    """The answer of :func:`plan_evaluation`; :meth:`to_frame` and :meth:`text` render it.

    Attributes:
        metric: the output planned for.
        goal: ``"width"`` (an interval ``width`` wide) or ``"detect"`` (a difference ``detect`` with ``power``).
        multiplier: ``z_{1−α/2}`` (width) or ``z_{1−α/2} + z_{1−β}`` (detect).
        target: the half-width ``h`` or the difference ``δ``.
        factor: 2 for an unpaired comparison (the variance of a difference of two independent means), else 1.
        variants: how many variants are judged (1 for one run's interval, 2 for a comparison): multiplies the cost.
        components: the pilot's variance components.
        options: one :class:`PlanOption` per repeats asked.
        floor: with the pilot's rows, the smallest half-width (width goal) or difference (detect goal) any number
            of repeats can reach; None when ``σ²_w`` is unknown.
        rows_unlimited_repeats: ``⌈m² f σ²_b / t²⌉``, the rows needed however many repeats (None: unknown).
        repeats_at_pilot_rows: the repeats that reach the target with the pilot's rows; None when none do (the
            target is below the floor) or ``σ²_w`` is unknown; 1 when the pilot's rows already suffice.
        labels: the human labels for the calibrated interval, when a calibrated pilot was given.
        notes: what the user must know (the floor, the unknown split, a pilot with no variance ...).
    """

    metric: str
    goal: str
    width: float | None
    detect: float | None
    power: float
    alpha: float
    multiplier: float
    target: float
    factor: float
    variants: int
    components: VarianceComponents
    options: tuple[PlanOption, ...]
    floor: float | None
    rows_unlimited_repeats: int | None
    repeats_at_pilot_rows: int | None
    labels: LabelPlan | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    cost: DrawCost | None = None

    def judging_cost(self, rows: int, repeats: int) -> PlanOption:
        """What judging ``rows`` rows ``repeats`` times costs (every variant), as a :class:`PlanOption`."""
        draws = rows * repeats * self.variants
        c = self.cost
        if c is None:
            return PlanOption(repeats, rows, None, draws)
        return PlanOption(repeats, rows, None, draws, draws * c.requests,
                          draws * c.tokens if c.tokens is not None else None,
                          draws * c.usd if c.usd is not None else None)

    def option(self, repeats: int) -> PlanOption:
        """The option with ``repeats`` draws per row."""
        for o in self.options:
            if o.repeats == repeats:
                return o
        raise KeyError(f"no option with repeats={repeats}; the plan lists {[o.repeats for o in self.options]}")

    def to_frame(self) -> pd.DataFrame:
        """One line per option (``r=1``, ``r=2``, ...) and, with a calibrated pilot, one per kind of labels."""
        lines: list[dict[str, Any]] = [
            {"option": f"{o.repeats} draw(s) per row", "repeats": o.repeats, "rows": o.rows,
             "rows_low": o.rows_range[0] if o.rows_range else o.rows,
             "rows_high": o.rows_range[1] if o.rows_range else o.rows, "judged_draws": o.draws,
             "judge_requests": o.requests, "tokens": o.tokens, "usd": o.usd, "labels": None}
            for o in self.options]
        if self.labels is not None:
            r0 = self.components.repeats
            for m, n in self.labels.ppi:
                o = self.judging_cost(m, r0)
                lines.append({"option": f"human labels + judge (PPI), {m} rows x {r0} draw(s)", "repeats": r0,
                              "rows": m, "rows_low": m, "rows_high": m, "judged_draws": o.draws,
                              "judge_requests": o.requests, "tokens": o.tokens, "usd": o.usd, "labels": n})
            lines.append({"option": "human labels alone", "repeats": None, "rows": None, "rows_low": None,
                          "rows_high": None, "judged_draws": None, "judge_requests": None, "tokens": None,
                          "usd": None, "labels": self.labels.classical})
        return pd.DataFrame(lines)

    def text(self) -> str:
        """The plan as the CLI prints it: the goal, the table, then what the numbers mean."""
        return _render(self)


def _quantile(value: Any, name: str, *, upper: bool) -> float:
    """``z_{1−α/2}`` (``upper``: ``value`` is α) or ``z_{power}``; a value outside (0, 1) is refused by name."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < 1:
        return _bad(name, value)
    v = float(value)
    return NormalDist().inv_cdf(1 - v / 2 if upper else v)


def _bad(name: str, value: Any) -> float:
    fixes = {"alpha": "a number between 0 and 1, e.g. 0.05 (a 95 % interval)",
             "power": "a number between 0 and 1, e.g. 0.8"}
    raise ValueError(f"{name}={value!r} must be {fixes[name]}")


def _positive(name: str, value: Any, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive number on the metric's scale, e.g. {example}")
    return float(value)


def _ceil_rows(x: float) -> int:
    # 1e-9 absorbs float noise so an exact fit (e.g. 96.00000000001) is not pushed to the next row
    return max(MIN_ROWS, math.ceil(x - 1e-9))


def check_target(*, width: float | None, detect: float | None, power: float = 0.8,
                 alpha: float = 0.05) -> tuple[float, float, float]:
    """The target checked: ``(t, m, z_{1−α/2})`` with ``t`` the half-width ``h`` or the difference ``δ`` and ``m``
    the multiplier ``z_{1−α/2}`` or ``z_{1−α/2} + z_{1−β}``.

    Raises:
        ValueError: neither or both of ``width`` / ``detect``, a target that is not a positive number, ``alpha`` or
            ``power`` outside (0, 1); the message names the value and an example.
    """
    if (width is None) == (detect is None):
        raise ValueError(f"give width= (an interval that wide, e.g. 0.1) or detect= (a difference to detect, e.g. "
                         f"0.05), exactly one of them (got width={width!r}, detect={detect!r})")
    z_a = _quantile(alpha, "alpha", upper=True)
    if width is not None:
        return _positive("width", width, "0.1") / 2, z_a, z_a
    return _positive("detect", detect, "0.05"), z_a + _quantile(power, "power", upper=False), z_a


def plan_evaluation(components: VarianceComponents, *, metric: str = "metric", width: float | None = None,
                    detect: float | None = None, power: float = 0.8, alpha: float = 0.05,
                    cost: DrawCost | None = None, repeats: Sequence[int] = DEFAULT_REPEATS,
                    unpaired: bool = False, labels: CalibratedEstimate | None = None,
                    variants: int | None = None) -> Plan:
    """Rows, repeats and labels for an interval ``width`` wide, or to detect a difference ``detect``.

    Args:
        components: the pilot's variance components (for a paired comparison, of the per-row differences).
        metric: the output's name, for the message.
        width: the interval's full width (``ci_high − ci_low``, ``2h``); give this or ``detect``.
        detect: the difference between two variants to detect (on the metric's scale).
        power: the chance of detecting a true difference of ``detect`` (``1 − β``); only with ``detect``.
        alpha: the error level (0.05: a 95 % interval, a two-sided 5 % test).
        cost: what one row-draw costs (per variant); None: the cost columns stay empty.
        repeats: the repeats to list.
        unpaired: ``detect`` from a one-variant pilot: plan two independent samples (variance doubled, rows per
            variant). Ignored for a paired pilot (``components.paired``), which is a comparison already.
        labels: a calibrated pilot estimate (from human labels); adds the labels
            :func:`~mlflow_ragjudge.engine.ppi.labels_needed` plans for the same target.
        variants: how many variants the cost counts (default: 2 for a comparison, else 1; a sweep of 4: 4).

    Returns:
        A :class:`Plan` (formulas in the module docstring).

    Raises:
        ValueError: neither or both of ``width`` / ``detect``, a non-positive target, ``alpha`` or ``power`` outside
            (0, 1), repeats that are not whole numbers >= 1.
    """
    target, mult, z_a = check_target(width=width, detect=detect, power=power, alpha=alpha)
    reps = sorted({_repeat(r) for r in repeats})
    factor = 2.0 if (detect is not None and unpaired and not components.paired) else 1.0
    if variants is None:
        variants = 2 if (components.paired or factor == 2) else 1
    elif isinstance(variants, bool) or not isinstance(variants, numbers.Integral) or variants < 1:
        raise ValueError(f"variants={variants!r} must be a whole number >= 1 (the variants judged)")
    k2 = mult ** 2 * factor / target ** 2
    c = components
    options = tuple(_option(c, r, k2, cost, variants) for r in reps)
    floor = rows_inf = at_pilot = None
    if c.between is not None and c.within is not None:
        floor = mult * math.sqrt(factor * c.between / c.rows)
        rows_inf = _ceil_rows(k2 * c.between)
        at_pilot = _repeats_at(c.rows, c.between, c.within, k2)
    label_plan = None
    if labels is not None:
        eq_width = 2 * target * z_a / (mult * math.sqrt(factor))
        one_draw = options[0].rows or _ceil_rows(k2 * c.row_variance)
        pilot_rows = labels.n_labelled + labels.n_unlabelled
        ms = sorted({pilot_rows, 2 * one_draw, 4 * one_draw})
        got = [labels_needed(labels, eq_width, n_rows=m) for m in ms]
        label_plan = LabelPlan(ppi=tuple((m, g["ppi"]) for m, g in zip(ms, got)), classical=got[0]["classical"],
                               equivalent_width=eq_width, pilot_labels=labels.n_labelled)
    plan = Plan(metric=metric, goal="width" if width is not None else "detect", width=width, detect=detect,
                power=power, alpha=alpha, multiplier=mult, target=target, factor=factor, variants=variants,
                components=c, options=options, floor=floor, rows_unlimited_repeats=rows_inf,
                repeats_at_pilot_rows=at_pilot, labels=label_plan, cost=cost)
    return _with_notes(plan)


def _repeat(r: Any) -> int:
    if isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 1:
        raise ValueError(f"repeats={r!r}: each must be a whole number >= 1, e.g. (1, 2, 3, 5, 10)")
    return int(r)


def _option(c: VarianceComponents, r: int, k2: float, cost: DrawCost | None, variants: int) -> PlanOption:
    rows: int | None
    rng: tuple[int, int] | None = None
    if c.within is not None and c.between is not None:
        rows = _ceil_rows(k2 * (c.between + c.within / r))
    elif r == c.repeats:
        rows = _ceil_rows(k2 * c.row_variance)
    else:
        # the split is unknown: all of the variance may be the judge's (÷ r) or none of it
        all_judge, none_judge = _ceil_rows(k2 * c.row_variance * c.repeats / r), _ceil_rows(k2 * c.row_variance)
        rows = None
        rng = (min(all_judge, none_judge), max(all_judge, none_judge))
    n = rows if rows is not None else (rng[1] if rng else None)
    draws = n * r * variants if n is not None else None
    if cost is None or draws is None:
        return PlanOption(r, rows, rng, draws)
    return PlanOption(r, rows, rng, draws, draws * cost.requests,
                      draws * cost.tokens if cost.tokens is not None else None,
                      draws * cost.usd if cost.usd is not None else None)


def _repeats_at(n: int, between: float, within: float, k2: float) -> int | None:
    """The fewest repeats with ``k2 (σ²_b + σ²_w / r) <= n``, or None when no r reaches it."""
    room = n / k2 - between
    if room <= 0:
        return None
    return max(1, math.ceil(within / room - 1e-9))


def _with_notes(p: Plan) -> Plan:
    c, notes = p.components, []
    what = "half-width" if p.goal == "width" else "detectable difference"
    if c.row_variance == 0:
        notes.append(f"the pilot's {c.rows} row scores are all the same: no variance to plan with, so every plan is "
                     f"the {MIN_ROWS}-row minimum; run a pilot whose rows differ")
    if c.within == 0 and c.row_variance > 0:
        notes.append("the judge gives every draw of a row the same score here (σ²_w = 0): repeats change nothing")
    if c.within is None:
        notes.append("the pilot judged each row once, so the judge's own noise (σ²_w) is not separated from the "
                     "rows' spread: rows for more than 1 draw are a range (all of the variance the judge's .. none of "
                     "it). Measure it with a pilot of --repeats 3")
    elif p.floor is not None and p.floor > p.target:
        notes.append(f"with the pilot's {c.rows} rows no number of repeats reaches a {what} of {p.target:.4g}: the "
                     f"rows' own spread (σ²_b) sets a floor of {p.floor:.4g}. Only more rows help: at least "
                     f"{p.rows_unlimited_repeats} (with many repeats), {p.options[0].rows} with one draw each")
    elif p.repeats_at_pilot_rows == 1:
        notes.append(f"the pilot's own {c.rows} rows already reach it with one draw per row")
    elif p.repeats_at_pilot_rows is not None:
        notes.append(f"with the pilot's {c.rows} rows, {p.repeats_at_pilot_rows} draws per row reach it (the floor "
                     f"any number of repeats reaches there is {p.floor:.4g})")
    if p.factor == 2:
        notes.append("planned as two independent samples (rows per variant); judging both variants on the same "
                     "questions is paired and usually needs fewer: plan from a comparison pilot (two runs)")
    if c.rows < MIN_ROWS:
        notes.append(f"the pilot has only {c.rows} rows: its variances, and so this plan, are rough")
    return Plan(**{**p.__dict__, "notes": tuple(notes)})


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def _render(p: Plan) -> str:
    c = p.components
    level = f"{100 * (1 - p.alpha):g} %"
    if p.goal == "width":
        goal = f"a {level} interval {p.width:g} wide (± {p.target:.4g}) on {p.metric}"
    else:
        goal = (f"detecting a difference of {p.detect:g} in {p.metric} with power {p.power:g} at α = {p.alpha:g}"
                f"{' (paired)' if c.paired else ' (unpaired)' if p.factor == 2 else ''}")
    comps = f"row variance {c.row_variance:.4g} at {c.repeats} draw(s)"
    if c.within is not None:
        comps += (f" = σ²_b {c.between:.4g} + σ²_w {c.within:.4g} / {c.repeats}"
                  f" (judge's share of one draw: {p.components.judge_share or 0:.0%})")
    else:
        comps += " (σ²_b and σ²_w not separated: no repeats)"
    head = [f"Plan for {goal}", f"pilot: {c.rows} rows{' (differences of two variants)' if c.paired else ''}; "
            f"{comps}{'; from ' + c.source if c.source else ''}"]
    per = " per variant" if p.variants > 1 else ""
    rows: list[tuple[str, ...]] = [("option", f"rows{per}", "judged draws", "requests", "tokens", "USD", "labels")]
    for o in p.options:
        n = _fmt(o.rows) if o.rows is not None else (f"{o.rows_range[0]:,}..{o.rows_range[1]:,}" if o.rows_range
                                                    else "-")
        up_to = "<= " if o.rows is None and o.draws is not None else ""  # a range: the cost of its upper end
        rows.append((f"{o.repeats} draw(s)/row", n, *(up_to + _fmt(v, d) if v is not None else "-" for v, d in
                                                      ((o.draws, 0), (o.requests, 0), (o.tokens, 0), (o.usd, 2))), ""))
    if p.labels is not None:
        for m, labels in p.labels.ppi:
            o = p.judging_cost(m, c.repeats)
            rows.append((f"labels + {c.repeats} draw(s)/row", _fmt(m), *(_fmt(v, d) for v, d in (
                (o.draws, 0), (o.requests, 0), (o.tokens, 0), (o.usd, 2))), _fmt(labels)))
        rows.append(("labels alone", "", "", "", "", "", _fmt(p.labels.classical)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    tail = [f"note: {n}" for n in p.notes]
    if c.within is not None and c.within > 0:
        tail.append("rows x draws grows with the draws: when more questions can be had, more rows cost fewer judge "
                    "requests than more draws; draws pay when the questions are what is scarce")
    if p.variants > 1:
        tail.append(f"costs count every variant's draws ({p.variants} x rows x draws)")
    if p.labels is not None:
        tail.append(f"labels are for the calibrated interval of the human mean (judge bias removed), planned from "
                    f"{p.labels.pilot_labels} pilot labels for an interval {p.labels.equivalent_width:.4g} wide, "
                    "the judge scoring the rows shown (as in the pilot); '-' = not reachable with those rows")
    else:
        tail.append("labels: no human labels on this run to plan from; label a random sample (ragjudge "
                    "label-sample RUN --n 100 --out labels.csv, then ragjudge calibrate) to see that option too")
    return "\n".join([*head, "", *table, "", *tail])
