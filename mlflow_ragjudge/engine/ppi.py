"""Human-calibrated estimates: prediction-powered inference (PPI, PPI++) for the mean of a judged metric and for
the mean difference between two variants scored on the same rows.

A judge scores every row; humans label a small **uniform random** sample of them. The judge's bias is measured on
the labelled rows and subtracted from its mean over the rest, which gives an interval for the *human* mean that is
valid whatever the judge's quality (a good judge only makes it narrower). With ``n`` labelled rows (human ``Y``,
judge ``Ŷ``) and ``N`` unlabelled rows (judge ``Ŷ'``), and a weight ``λ`` in [0, 1]:

    θ̂_λ   = λ · mean(Ŷ') + mean(Y − λ·Ŷ)
    se²    = Var₀(λ·Ŷ') / N + Var₀(Y − λ·Ŷ) / n            (Var₀: population variance, ddof 0)
    CI     = θ̂_λ ± z_{1−α/2} · se                          (the normal interval)

``λ = 1`` is plain PPI (Angelopoulos, Bates, Fannjiang, Jordan & Zrnic, *Science* 2023). ``lam=None`` is PPI++
(Angelopoulos, Duchi & Zrnic 2023), which picks the λ that minimises the variance, estimated at the plain-PPI
point estimate θ̂₁ and clipped to [0, 1]:

    λ̂ = Ĉov(Y, Ŷ) / ((1 + n/N) · V̂ar(Ŷ ∪ Ŷ'))

with ``Ĉov = (1/n) Σ (Y_i − Ȳ)(Ŷ_i − mean(Ŷ))`` over the labelled rows and ``V̂ar`` the sample variance (ddof 1) of
the judge's scores over all ``n + N`` rows. ``λ = 0`` is the classical interval from the labels alone, which every
result reports beside the calibrated one. These are the formulas of ``ppi_py.ppi_mean_ci`` (package
``ppi-python``), which the tests check this module against to 1e-8; the package does not need it at run time.

For two variants A and B judged on the same rows, :func:`ppi_paired_diff` applies the same estimator to the per-row
differences ``Ŷ = Ŷ_A − Ŷ_B`` and ``Y = Y_A − Y_B`` (a row is labelled when both of its answers are).

What the guarantee needs: the labelled rows are a uniform random sample of the scored rows (``ragjudge
label-sample`` draws one), labels and judge scores on the same scale, and enough labels for the normal
approximation -- this module refuses fewer than 30 (:class:`TooFewLabels`).

Labels that carry no variance (every labelled row has the same human label, e.g. 40 labels of 5, or a paired
difference of 0 on every row) make the normal interval's variance estimate 0 and its "95 %" interval a point
([5.000, 5.000]). The labels do not support that. What ``n`` identical labels ``v`` do support is a statement about
the share ``p`` of rows whose label is ``v``: with ``n`` of ``n`` labelled rows at ``v``, the exact binomial
(Clopper-Pearson) bound is ``p >= (α/2)^(1/n)`` (about ``1 - 3.7/n`` at α = 0.05, the "rule of three"). Every other
row lies somewhere on the scale ``[lo, hi]``, so the mean lies in

    [v - (1 - p_low)(v - lo),  v + (1 - p_low)(hi - v)]

which is the Clopper-Pearson interval itself on a binary (0/1) scale. In that case the estimate reports this bound
as its interval (widened, never narrowed: it also covers the normal interval and the point estimate), sets
``interval = "exact_no_variance"`` and says so in ``warning``. The scale comes from ``scale=``; without it a 0/1
column is taken as binary and otherwise the smallest and largest value seen (which the warning names).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from ..core.errors import TooFewLabels

__all__ = ["CalibratedEstimate", "LabelsOnlyEstimate", "TooFewLabels", "ppi_mean", "ppi_paired_diff",
           "labels_only_mean", "labels_needed", "MIN_LABELS"]

#: fewer labelled rows than this and no interval is given: the normal approximation the interval rests on (and the
#: estimate of λ) is not trustworthy with so few labels
MIN_LABELS = 30


@dataclass(frozen=True)
class CalibratedEstimate:
    """A human-calibrated estimate of a mean (or of a mean difference) with its interval.

    Attributes:
        mean: the calibrated estimate θ̂_λ of the human mean.
        ci_low, ci_high: its ``1 - alpha`` normal interval.
        se: its standard error.
        lam: the λ used (PPI++'s estimate when ``lam=None`` was asked).
        alpha: the interval's error level.
        n_labelled: rows with a judge score and a human label.
        n_unlabelled: rows with a judge score and no label.
        n_excluded: rows left out because the judge gave no score (failed, abstained, correctness 0 "not sure");
            ``n_excluded_labelled`` of them had a label.
        judge_mean: the judge's mean over every scored row (labelled and not), uncalibrated.
        judge_mean_labelled: the judge's mean over the labelled rows only.
        classical_mean, classical_ci_low, classical_ci_high, classical_se: the mean of the labels alone and its
            normal interval (what the labels say without the judge).
        effective_labels: how many labels the classical interval would need to be as narrow as this one
            (``n_labelled · classical_se² / se²``).
        selection_p: p-value of a Welch test that the judge's scores on the labelled rows have the same mean as on
            the unlabelled ones (small: the labels were probably not drawn at random); None when not computable.
        var_rectifier, var_judge_unlabelled: the two variance components, ``Var₀(Y − λŶ)`` and ``Var₀(λŶ')``
            (``se² = var_rectifier / n_labelled + var_judge_unlabelled / n_unlabelled``), used for planning.
        warning: None, or what the user must know about the interval (the labels carry no variance: see the module
            docstring); printed by ``ragjudge calibrate`` and ``ragjudge evaluate --human-labels``.
        interval: ``"normal"``, or ``"exact_no_variance"`` when the labels are all the same and both intervals are
            the exact bound of the module docstring instead of a zero-width normal interval.
    """

    mean: float
    ci_low: float
    ci_high: float
    se: float
    lam: float
    alpha: float
    n_labelled: int
    n_unlabelled: int
    n_excluded: int
    n_excluded_labelled: int
    judge_mean: float
    judge_mean_labelled: float
    classical_mean: float
    classical_ci_low: float
    classical_ci_high: float
    classical_se: float
    effective_labels: float | None
    selection_p: float | None
    var_rectifier: float = 0.0
    var_judge_unlabelled: float = 0.0
    warning: str | None = None
    interval: str = "normal"

    @property
    def width(self) -> float:
        return self.ci_high - self.ci_low

    @property
    def classical_width(self) -> float:
        return self.classical_ci_high - self.classical_ci_low

    def as_metrics(self, metric: str) -> dict[str, float]:
        """The MLflow metrics a run logs for this estimate of ``metric``."""
        return {f"{metric}/ppi_mean": self.mean, f"{metric}/ppi_ci_low": self.ci_low,
                f"{metric}/ppi_ci_high": self.ci_high, f"{metric}/n_labelled": float(self.n_labelled),
                f"{metric}/ppi_lam": self.lam, f"{metric}/labels_only_ci_low": self.classical_ci_low,
                f"{metric}/labels_only_ci_high": self.classical_ci_high}

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "width": self.width, "classical_width": self.classical_width}


def _array(values: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be numbers (NaN where missing): {e}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one value per row), got shape {arr.shape}")
    if np.isinf(arr).any():
        raise ValueError(f"{name} holds an infinite value; scores must be finite (NaN where missing)")
    return arr


def _z(alpha: float) -> float:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha!r} must be between 0 and 1, e.g. 0.05")
    return NormalDist().inv_cdf(1 - alpha / 2)


def _ppi_lambda(y: np.ndarray, yhat: np.ndarray, yhat_u: np.ndarray) -> float:
    """PPI++'s power-tuning λ for a mean (see the module docstring), clipped to [0, 1]."""
    n, big_n = len(y), len(yhat_u)
    if big_n == 0:
        return 0.0
    theta1 = float(yhat_u.mean() + (y - yhat).mean())  # plain PPI's point estimate, where the gradients are taken
    g, gh = y - theta1, yhat - theta1
    cov = float(((g - g.mean()) * (gh - gh.mean())).sum() / n)
    var = float(np.var(np.concatenate([yhat, yhat_u]) - theta1, ddof=1))
    if var <= 0:
        return 0.0  # a constant judge carries no information
    return float(np.clip(cov / ((1 + n / big_n) * var), 0.0, 1.0))


def _selection_p(yhat: np.ndarray, yhat_u: np.ndarray) -> float | None:
    if len(yhat) < 2 or len(yhat_u) < 2 or (np.ptp(yhat) == 0 and np.ptp(yhat_u) == 0):
        return None
    from scipy import stats

    p = float(stats.ttest_ind(yhat, yhat_u, equal_var=False).pvalue)
    return p if math.isfinite(p) else None


def _range(scale: tuple[float, float] | None, values: np.ndarray, *, paired: bool) -> tuple[float, float, str]:
    """The range a label (``paired``: a difference of two labels) can take, and where that range came from."""
    if scale is not None:
        lo, hi = float(scale[0]), float(scale[1])
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"scale={scale!r} must be (lowest, highest) with lowest < highest, e.g. (0, 1)")
        if paired:
            return lo - hi, hi - lo, f"{lo - hi:g}..{hi - lo:g} (differences of labels on the scale {lo:g}..{hi:g})"
        return lo, hi, f"the metric's scale {lo:g}..{hi:g}"
    seen = values[~np.isnan(values)]
    if seen.size and np.isin(seen, (-1.0, 0.0, 1.0) if paired else (0.0, 1.0)).all():
        return (-1.0, 1.0, "-1..1 (differences of binary labels)") if paired else (0.0, 1.0, "a binary (0/1) scale")
    lo, hi = (float(seen.min()), float(seen.max())) if seen.size else (0.0, 1.0)
    if paired:  # a difference can go either way
        lo, hi = min(lo, -hi), max(hi, -lo)
    return lo, hi, (f"{lo:g}..{hi:g}, the values seen (no scale= given: pass the metric's scale for a bound that "
                    "holds whatever the other rows' labels)")


def _no_variance_bound(value: float, n: int, alpha: float, lo: float, hi: float) -> tuple[float, float, float]:
    """``n`` labels all equal to ``value``: the exact (Clopper-Pearson) lower bound on the share of rows labelled
    ``value`` and the bound on the mean that follows on the range ``[lo, hi]`` (module docstring)."""
    share = (alpha / 2) ** (1 / n)
    return share, value - (1 - share) * (value - lo), value + (1 - share) * (hi - value)


def _no_variance_warning(paired: bool, value: float, n: int, alpha: float, share: float, low: float, high: float,
                         where: str, binary: bool) -> str:
    level = f"{100 * (1 - alpha):g} %"
    labels = "label differences" if paired else "labels"
    if binary:
        kind = "On this binary scale that is the exact binomial (Clopper-Pearson) interval."
    elif paired:
        kind = (f"{n} identical differences do not support a normal-approximation interval; this bound holds "
                "whatever the other rows' differences.")
    else:
        kind = (f"On a multi-level scale {n} identical labels do not support a normal-approximation interval; this "
                "bound holds whatever labels the other rows would get.")
    return (f"The {n} human {labels} are all {value:g}: they carry no variance, so the normal {level} interval "
            f"would be [{value:.3f}, {value:.3f}], a certainty the labels do not give. What they support: with "
            f"{level} confidence at least {share:.1%} of rows have {value:g} (exact binomial bound for {n} of {n}, "
            f"about 1 - {-math.log(alpha / 2):.1f}/n: the rule of three), so the mean lies in [{low:.3f}, {high:.3f}] "
            f"on {where}; that is the interval reported. {kind} Label more randomly drawn rows for a narrower "
            "interval.")


def _estimate(judge: np.ndarray, human: np.ndarray, *, alpha: float, lam: float | None, min_labelled: int,
              what: str, scale: tuple[float, float] | None = None) -> CalibratedEstimate:
    z = _z(alpha)
    if len(judge) != len(human):
        raise ValueError(f"judge and human scores must be aligned by row: {len(judge)} judge scores, "
                         f"{len(human)} human values (NaN where a row has no label)")
    if isinstance(min_labelled, bool) or not isinstance(min_labelled, numbers.Integral) or min_labelled < 2:
        raise ValueError(f"min_labelled={min_labelled!r} must be a whole number >= 2 (default {MIN_LABELS})")
    if lam is not None and (isinstance(lam, bool) or not isinstance(lam, numbers.Real) or not 0 <= lam <= 1):
        raise ValueError(f"lam={lam!r} must be None (PPI++: estimated) or a number in [0, 1] (1: plain PPI)")
    scored = ~np.isnan(judge)
    labelled = scored & ~np.isnan(human)
    unlabelled = scored & np.isnan(human)
    excluded_labelled = int((~scored & ~np.isnan(human)).sum())
    n, big_n = int(labelled.sum()), int(unlabelled.sum())
    if n < min_labelled:
        lost = f" ({excluded_labelled} labelled row(s) had no judge score)" if excluded_labelled else ""
        raise TooFewLabels(
            f"{what}: {n} labelled row(s) with a judge score, fewer than the {min_labelled} a calibrated interval "
            "needs (the normal interval and the estimate of the judge's bias are not trustworthy below that). Label "
            f"more randomly sampled rows{lost}.", n_usable=n, n_labels=n + excluded_labelled,
            n_excluded_labelled=excluded_labelled, n_unlabelled=big_n, min_labelled=min_labelled)
    y, yhat, yhat_u = human[labelled], judge[labelled], judge[unlabelled]
    lam_used = _ppi_lambda(y, yhat, yhat_u) if lam is None else float(lam)
    if big_n == 0:
        lam_used = 0.0  # every scored row labelled: the labels alone are the estimate
    rect = y - lam_used * yhat
    mean = float((lam_used * yhat_u).mean() if big_n else 0.0) + float(rect.mean())
    se = math.sqrt((float(np.var(lam_used * yhat_u)) / big_n if big_n else 0.0) + float(np.var(rect)) / n)
    c_mean, c_se = float(y.mean()), math.sqrt(float(np.var(y)) / n)
    low, high, c_low, c_high = mean - z * se, mean + z * se, c_mean - z * c_se, c_mean + z * c_se
    warning, interval = None, "normal"
    if np.ptp(y) == 0:  # the labels carry no variance: the exact bound instead of a zero-width interval
        paired = what == "ppi_paired_diff"
        lo, hi, where = _range(scale, np.concatenate([human, judge]), paired=paired)
        share, c_low, c_high = _no_variance_bound(float(y[0]), n, alpha, lo, hi)
        low, high = min(low, c_low, mean), max(high, c_high, mean)
        warning = _no_variance_warning(paired, float(y[0]), n, alpha, share, c_low, c_high, where,
                                       binary=not paired and (lo, hi) == (0.0, 1.0))
        interval = "exact_no_variance"
    all_judge = judge[scored]
    return CalibratedEstimate(
        mean=mean, ci_low=low, ci_high=high, se=se, lam=lam_used, alpha=alpha,
        n_labelled=n, n_unlabelled=big_n, n_excluded=int((~scored).sum()), n_excluded_labelled=excluded_labelled,
        judge_mean=float(all_judge.mean()), judge_mean_labelled=float(yhat.mean()),
        classical_mean=c_mean, classical_ci_low=c_low, classical_ci_high=c_high,
        classical_se=c_se, effective_labels=(n * c_se ** 2 / se ** 2) if se > 0 and interval == "normal" else None,
        selection_p=_selection_p(yhat, yhat_u), var_rectifier=float(np.var(rect)),
        var_judge_unlabelled=float(np.var(lam_used * yhat_u)) if big_n else 0.0, warning=warning, interval=interval,
    )


def ppi_mean(judge: Sequence[float] | np.ndarray, human: Sequence[float] | np.ndarray, *, alpha: float = 0.05,
             lam: float | None = None, min_labelled: int = MIN_LABELS,
             scale: tuple[float, float] | None = None) -> CalibratedEstimate:
    """The human-calibrated mean of a metric (PPI++ by default; ``lam=1``: plain PPI; ``lam=0``: labels only).

    Args:
        judge: the judge's score per row; NaN where the judge gave none (failed, abstained, or correctness 0
            "not sure"): such rows are left out of both sets and counted in ``n_excluded``.
        human: the human label per row on the metric's own scale, aligned with ``judge``; NaN where unlabelled.
        alpha: error level of the interval (0.05: a 95% interval).
        lam: None for PPI++'s estimated λ, or a fixed λ in [0, 1].
        min_labelled: refuse an interval below this many labelled rows.
        scale: the (lowest, highest) label the metric allows; used only when every label is the same (the exact
            bound of the module docstring). None: 0/1 labels are binary, otherwise the values seen.

    Returns:
        A :class:`CalibratedEstimate` (the formula is in the module docstring).

    Raises:
        TooFewLabels: fewer than ``min_labelled`` labelled rows with a judge score.
        ValueError: misaligned arrays, ``alpha`` outside (0, 1), ``lam`` outside [0, 1].

    Example:
        >>> import numpy as np
        >>> judge = np.r_[np.ones(60), np.zeros(40)]
        >>> human = np.full(100, np.nan); human[:30] = 1; human[60:90] = 0
        >>> round(ppi_mean(judge, human).mean, 3)
        0.6
    """
    return _estimate(_array(judge, "judge"), _array(human, "human"), alpha=alpha, lam=lam,
                     min_labelled=min_labelled, what="ppi_mean", scale=scale)


def ppi_paired_diff(judge_a: Sequence[float] | np.ndarray, judge_b: Sequence[float] | np.ndarray,
                    human_a: Sequence[float] | np.ndarray, human_b: Sequence[float] | np.ndarray, *,
                    alpha: float = 0.05, lam: float | None = None,
                    min_labelled: int = MIN_LABELS, scale: tuple[float, float] | None = None) -> CalibratedEstimate:
    """The human-calibrated mean of ``a - b`` over the same rows: PPI on the per-row differences.

    A row counts as scored when the judge scored both answers, and as labelled when humans labelled both; a row
    labelled on one side only is used as unlabelled. All four arrays are aligned by row (NaN: missing). ``scale``
    is the labels' own (lowest, highest), as for :func:`ppi_mean`; when every labelled difference is the same, the
    interval is the exact bound on differences of two labels, ``[lowest - highest, highest - lowest]``.

    Raises:
        TooFewLabels: fewer than ``min_labelled`` rows labelled on both sides with both judge scores.
        ValueError: misaligned arrays, ``alpha`` outside (0, 1), ``lam`` outside [0, 1].
    """
    ja, jb = _array(judge_a, "judge_a"), _array(judge_b, "judge_b")
    ha, hb = _array(human_a, "human_a"), _array(human_b, "human_b")
    if not len(ja) == len(jb) == len(ha) == len(hb):
        raise ValueError(f"the four arrays must be aligned by row; lengths {len(ja)}, {len(jb)}, {len(ha)}, {len(hb)}")
    return _estimate(ja - jb, ha - hb, alpha=alpha, lam=lam, min_labelled=min_labelled, what="ppi_paired_diff",
                     scale=scale)


@dataclass(frozen=True)
class LabelsOnlyEstimate:
    """The mean of human labels alone with its normal interval (no judge involved): ``mean ± z · sd₀ / √n``.

    What to report when a calibrated interval cannot be had -- every row labelled but the judge abstained on too
    many, or no judge score at all. It estimates the mean over the rows the labels are a random sample of, judge
    abstentions included (a calibrated estimate leaves those rows out). ``warning`` and ``interval`` as in
    :class:`CalibratedEstimate`: labels that are all the same get the exact bound, not a zero-width interval.
    """

    mean: float
    ci_low: float
    ci_high: float
    se: float
    alpha: float
    n_labelled: int
    warning: str | None = None
    interval: str = "normal"

    def as_metrics(self, metric: str) -> dict[str, float]:
        return {f"{metric}/labels_only_mean": self.mean, f"{metric}/labels_only_ci_low": self.ci_low,
                f"{metric}/labels_only_ci_high": self.ci_high, f"{metric}/labels_only_n": float(self.n_labelled)}

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "method": "labels_only"}


def labels_only_mean(human: Sequence[float] | np.ndarray, *, alpha: float = 0.05,
                     min_labelled: int = MIN_LABELS, scale: tuple[float, float] | None = None,
                     paired: bool = False) -> LabelsOnlyEstimate:
    """The mean of the labels (NaN: unlabelled) and its classical normal interval, the same interval
    :class:`CalibratedEstimate` reports as ``classical_*`` (population variance, ``z_{1−α/2}``). ``paired``: the
    values are per-row differences of two labels on ``scale``. Labels that are all the same get the exact bound of
    the module docstring, with a ``warning``.

    Raises:
        TooFewLabels: fewer than ``min_labelled`` labels.
    """
    z = _z(alpha)
    y = _array(human, "human")
    y = y[~np.isnan(y)]
    if len(y) < min_labelled:
        raise TooFewLabels(f"labels_only_mean: {len(y)} label(s), fewer than the {min_labelled} a normal interval "
                           "needs; label more randomly sampled rows.", n_usable=len(y), n_labels=len(y),
                           min_labelled=min_labelled)
    mean, se = float(y.mean()), math.sqrt(float(np.var(y)) / len(y))
    if np.ptp(y) == 0:
        lo, hi, where = _range(scale, y, paired=paired)
        share, low, high = _no_variance_bound(mean, len(y), alpha, lo, hi)
        warning = _no_variance_warning(paired, mean, len(y), alpha, share, low, high, where,
                                       binary=not paired and (lo, hi) == (0.0, 1.0))
        return LabelsOnlyEstimate(mean, low, high, se, alpha, int(len(y)), warning, "exact_no_variance")
    return LabelsOnlyEstimate(mean, mean - z * se, mean + z * se, se, alpha, int(len(y)))


def labels_needed(estimate: CalibratedEstimate, target_width: float, *, n_rows: int | None = None) -> dict[str, Any]:
    """About how many random labels give an interval of ``target_width`` (``ci_high - ci_low``), from a pilot
    estimate, by PPI's variance formula with the pilot's variances and λ held fixed.

    With ``h = target_width / 2 / z``, ``σ²_r = Var(Y − λŶ)`` and ``σ²_u = Var(λŶ)`` from the pilot and ``M`` rows
    scored in all, labelling ``n`` of them gives ``se² ≈ σ²_r / n + σ²_u / (M − n)``; the smallest such ``n`` is
    returned as ``ppi`` (None when even labelling every row would not reach it), beside ``classical`` =
    ``⌈σ²_Y / h²⌉`` for the labels alone. ``n_rows`` defaults to the pilot's ``M``; give a larger one to plan a larger
    evaluation (a bigger ``M`` helps PPI only through the ``σ²_u / (M − n)`` term).
    """
    if target_width <= 0:
        raise ValueError(f"target_width={target_width!r} must be positive, e.g. 0.1")
    z = _z(estimate.alpha)
    h2 = (target_width / 2 / z) ** 2
    n0 = estimate.n_labelled
    total = n_rows if n_rows is not None else n0 + estimate.n_unlabelled
    var_r, var_u, var_y = estimate.var_rectifier, estimate.var_judge_unlabelled, estimate.classical_se ** 2 * n0
    ppi: int | None = None
    for n in range(max(2, MIN_LABELS), total + 1):
        rest = total - n
        se2 = var_r / n + (var_u / rest if rest else 0.0)
        if se2 <= h2:
            ppi = n
            break
    # the same floor for both: neither interval is given below MIN_LABELS labels
    classical = max(MIN_LABELS, math.ceil(var_y / h2)) if h2 > 0 else None
    return {"target_width": target_width, "ppi": ppi, "classical": classical, "rows": total,
            "pilot_labels": n0, "lam": estimate.lam}

