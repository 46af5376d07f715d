"""Prediction-powered inference (mlflow_ragjudge.engine.ppi) against its reference implementation and its guarantees.

(a) the values ``ppi_py`` (package ppi-python) gave on fixed cases, pinned in ``tests/data/ppi_reference.json`` by
    ``scripts/pin_ppi_reference.py`` -- run always, ppi_py not needed;
(b) live ``ppi_py`` on freshly drawn random data, many seeds (skipped when ppi_py is not installed);
(c) behaviour: refusals, row bookkeeping, the classical interval, λ's edge cases, the selection check;
(d) a coverage simulation: the PPI++ interval covers the human mean about as often as it says, a biased judge alone
    does not;
(e) ``labels_needed``: labelling the planned number of rows gives about the planned width.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from mlflow_ragjudge.core.errors import TooFewLabels
from mlflow_ragjudge.engine.ppi import MIN_LABELS, CalibratedEstimate, labels_needed, ppi_mean, ppi_paired_diff

REFERENCE = json.loads((Path(__file__).parent / "data" / "ppi_reference.json").read_text(encoding="utf-8"))
TOL = 1e-8


def _close(got: float, want: float, tol: float = TOL) -> bool:
    return abs(got - want) <= tol


def _arr(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


# ---------------------------------------------------------------------------------------------
# synthetic data
# ---------------------------------------------------------------------------------------------

LIKERT_P = [0.08, 0.12, 0.2, 0.32, 0.28]


def _truth(rng: np.random.Generator, kind: str, m: int) -> np.ndarray:
    if kind == "binary":
        return (rng.random(m) < 0.6).astype(float)
    return rng.choice([1.0, 2.0, 3.0, 4.0, 5.0], size=m, p=LIKERT_P)


def _judge(rng: np.random.Generator, kind: str, quality: str, y: np.ndarray) -> np.ndarray:
    m = len(y)
    if kind == "binary":
        flip_yes, flip_no = {"good": (0.05, 0.05), "biased": (0.05, 0.45), "random": (0.5, 0.5)}[quality]
        return (rng.random(m) < np.where(y == 1, 1 - flip_yes, flip_no)).astype(float)
    if quality == "good":
        return np.clip(y + rng.choice([-1.0, 0.0, 1.0], size=m, p=[0.1, 0.8, 0.1]), 1, 5)
    if quality == "biased":
        return np.clip(y + rng.choice([0.0, 1.0, 2.0], size=m, p=[0.25, 0.6, 0.15]), 1, 5)
    return rng.integers(1, 6, size=m).astype(float)


def _labels(rng: np.random.Generator, y: np.ndarray, n: int) -> np.ndarray:
    """``y`` on ``n`` uniformly drawn rows, NaN elsewhere."""
    human = np.full(len(y), np.nan)
    idx = rng.choice(len(y), size=n, replace=False)
    human[idx] = y[idx]
    return human


def _population(seed: int, kind: str = "binary", quality: str = "good", m: int = 600) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    y = _truth(rng, kind, m)
    return rng, y, _judge(rng, kind, quality, y)


# ---------------------------------------------------------------------------------------------
# (a) pinned ppi_py values
# ---------------------------------------------------------------------------------------------


def _check_against_pinned(est: CalibratedEstimate, case: dict) -> None:
    ref = case["ppi_py"]
    assert _close(est.mean, ref["mean"]), (est.mean, ref["mean"])
    assert _close(est.ci_low, ref["ci_low"]), (est.ci_low, ref["ci_low"])
    assert _close(est.ci_high, ref["ci_high"]), (est.ci_high, ref["ci_high"])
    assert _close(est.lam, ref["lam"]), (est.lam, ref["lam"])
    assert est.alpha == case["alpha"]
    assert (est.n_labelled, est.n_unlabelled, est.n_excluded, est.n_excluded_labelled) == (
        case["n_labelled"], case["n_unlabelled"], case["n_excluded"], case["n_excluded_labelled"])


@pytest.mark.parametrize("case", REFERENCE["mean"], ids=lambda c: c["name"])
def test_ppi_mean_matches_pinned_ppi_py(case: dict) -> None:
    est = ppi_mean(_arr(case["judge"]), _arr(case["human"]), alpha=case["alpha"], lam=case["lam"])
    _check_against_pinned(est, case)


@pytest.mark.parametrize("case", REFERENCE["paired_diff"], ids=lambda c: c["name"])
def test_ppi_paired_diff_matches_pinned_ppi_py(case: dict) -> None:
    est = ppi_paired_diff(_arr(case["judge_a"]), _arr(case["judge_b"]), _arr(case["human_a"]),
                          _arr(case["human_b"]), alpha=case["alpha"], lam=case["lam"])
    _check_against_pinned(est, case)


def test_pinned_reference_covers_the_cases_it_should() -> None:
    """The pinned file holds what the tests above are meant to exercise (a regenerated file could lose some)."""
    cases = REFERENCE["mean"]
    assert {c["lam"] for c in cases} >= {None, 1.0, 0.5}
    assert {c["alpha"] for c in cases} == {0.05, 0.1, 0.2}
    assert {c["n_labelled"] for c in cases} >= {30, 60, 150}
    assert all(c["n_excluded_labelled"] > 0 for c in cases)
    lams = [c["ppi_py"]["lam"] for c in cases if c["lam"] is None]
    assert min(lams) == 0.0 and any(0 < lam < 1 for lam in lams)  # PPI++ clipped at 0 and interior
    assert len(REFERENCE["paired_diff"]) >= 4
    assert any(c["lam"] is None for c in REFERENCE["paired_diff"])


# ---------------------------------------------------------------------------------------------
# (b) live ppi_py on fresh random data
# ---------------------------------------------------------------------------------------------


def _random_case(seed: int) -> tuple[np.ndarray, np.ndarray, float, float | None]:
    """Random kind, judge, sizes, missing judge scores (some on labelled rows), alpha and lam."""
    rng = np.random.default_rng(10_000 + seed)
    kind = ("binary", "likert")[seed % 2]
    quality = ("good", "biased", "random")[(seed // 2) % 3]
    n, big_n = int(rng.integers(30, 200)), int(rng.integers(40, 900))
    m = n + big_n
    y = _truth(rng, kind, m)
    judge = _judge(rng, kind, quality, y)
    human = _labels(rng, y, n)
    # extra rows the judge did not score, a few of them labelled: they must change nothing
    n_extra = int(rng.integers(0, 12))
    extra_h = np.where(rng.random(n_extra) < 0.5, _truth(rng, kind, n_extra), np.nan)
    order = rng.permutation(m + n_extra)
    judge, human = np.r_[judge, np.full(n_extra, np.nan)][order], np.r_[human, extra_h][order]
    alpha = float(rng.uniform(0.01, 0.3))
    lam = (None, None, 1.0, float(rng.uniform(0, 1)))[seed % 4]
    return judge, human, alpha, lam


def _ppi_py_reference(ppi_py, y, yhat, yhat_u, alpha, lam) -> tuple[float, float, float, float]:
    from ppi_py.ppi import _calc_lam_glm

    low, high = ppi_py.ppi_mean_ci(y, yhat, yhat_u, alpha=alpha, lam=lam)
    point = ppi_py.ppi_mean_pointestimate(y, yhat, yhat_u, lam=lam)
    if lam is None:
        theta1 = ppi_py.ppi_mean_pointestimate(y, yhat, yhat_u, lam=1)
        lam = float(_calc_lam_glm((y[:, None] - theta1), (yhat[:, None] - theta1), (yhat_u[:, None] - theta1),
                                  np.eye(1), clip=True))
    return float(np.ravel(low)[0]), float(np.ravel(high)[0]), float(np.ravel(point)[0]), lam


@pytest.mark.parametrize("seed", range(48))
def test_ppi_mean_matches_live_ppi_py(seed: int) -> None:
    ppi_py = pytest.importorskip("ppi_py")
    judge, human, alpha, lam = _random_case(seed)
    est = ppi_mean(judge, human, alpha=alpha, lam=lam)
    scored = ~np.isnan(judge)
    lab, unl = scored & ~np.isnan(human), scored & np.isnan(human)
    low, high, point, ref_lam = _ppi_py_reference(ppi_py, human[lab], judge[lab], judge[unl], alpha, lam)
    assert _close(est.ci_low, low) and _close(est.ci_high, high), (est.ci_low, est.ci_high, low, high)
    assert _close(est.mean, point), (est.mean, point)
    assert _close(est.lam, ref_lam), (est.lam, ref_lam)
    assert 0.0 <= est.lam <= 1.0
    if lam is None:  # the λ reported is the one the interval was computed with
        again = ppi_mean(judge, human, alpha=alpha, lam=est.lam)
        assert _close(again.ci_low, est.ci_low) and _close(again.ci_high, est.ci_high)


@pytest.mark.parametrize("seed", range(16))
def test_ppi_paired_diff_matches_live_ppi_py(seed: int) -> None:
    ppi_py = pytest.importorskip("ppi_py")
    rng = np.random.default_rng(20_000 + seed)
    kind, quality = ("binary", "likert")[seed % 2], ("good", "biased", "random")[seed % 3]
    m = int(rng.integers(200, 800))
    ya = _truth(rng, kind, m)
    yb = np.where(rng.random(m) < 0.3, _truth(rng, kind, m), ya)  # B differs from A on some rows
    ja, jb = _judge(rng, kind, quality, ya), _judge(rng, kind, quality, yb)
    ja[rng.random(m) < 0.05] = np.nan
    jb[rng.random(m) < 0.05] = np.nan
    lab = np.zeros(m, dtype=bool)
    lab[rng.choice(m, size=int(rng.integers(45, 160)), replace=False)] = True
    ha = np.where(lab | (rng.random(m) < 0.05), ya, np.nan)  # some rows labelled on A's side only
    hb = np.where(lab, yb, np.nan)
    alpha, lam = float(rng.uniform(0.02, 0.25)), (None, 1.0, 0.3)[seed % 3]
    est = ppi_paired_diff(ja, jb, ha, hb, alpha=alpha, lam=lam)
    dj, dh = ja - jb, ha - hb
    both = ~np.isnan(dj) & ~np.isnan(dh)
    low, high, point, ref_lam = _ppi_py_reference(ppi_py, dh[both], dj[both], dj[~np.isnan(dj) & np.isnan(dh)],
                                                  alpha, lam)
    assert _close(est.ci_low, low) and _close(est.ci_high, high), (est.ci_low, est.ci_high, low, high)
    assert _close(est.mean, point) and _close(est.lam, ref_lam)
    assert est.n_labelled == int(both.sum())


# ---------------------------------------------------------------------------------------------
# (c) behaviour
# ---------------------------------------------------------------------------------------------


def test_too_few_labels_names_the_count() -> None:
    rng, y, judge = _population(1)
    human = _labels(rng, y, 29)
    with pytest.raises(TooFewLabels, match=r"\b29 labelled row\(s\)") as info:
        ppi_mean(judge, human)
    assert isinstance(info.value, ValueError)
    assert str(MIN_LABELS) in str(info.value)
    # one more label and it goes through
    extra = np.flatnonzero(np.isnan(human))[0]
    human[extra] = y[extra]
    assert ppi_mean(judge, human).n_labelled == 30


def test_too_few_labels_counts_only_rows_with_a_judge_score() -> None:
    rng, y, judge = _population(2)
    human = _labels(rng, y, 35)
    judge[np.flatnonzero(~np.isnan(human))[:6]] = np.nan  # 6 labelled rows lose their judge score: 29 left
    with pytest.raises(TooFewLabels, match=r"\b29 labelled row\(s\).*6 labelled row\(s\) had no judge score"):
        ppi_mean(judge, human)


def test_min_labelled_is_honoured() -> None:
    rng, y, judge = _population(3)
    human = _labels(rng, y, 40)
    with pytest.raises(TooFewLabels, match=r"\b40 labelled"):
        ppi_mean(judge, human, min_labelled=50)
    assert ppi_mean(judge, human, min_labelled=40).n_labelled == 40


def test_paired_diff_needs_both_sides_labelled() -> None:
    rng, ya, ja = _population(4)
    _, yb, jb = _population(5)
    ha, hb = _labels(rng, ya, 60), np.full(len(yb), np.nan)
    both = np.flatnonzero(~np.isnan(ha))[:29]
    hb[both] = yb[both]  # A labelled on 60 rows, B on 29 of them
    with pytest.raises(TooFewLabels, match=r"ppi_paired_diff: 29 labelled"):
        ppi_paired_diff(ja, jb, ha, hb)
    hb[np.flatnonzero(~np.isnan(ha))[29:40]] = yb[np.flatnonzero(~np.isnan(ha))[29:40]]
    est = ppi_paired_diff(ja, jb, ha, hb)
    assert (est.n_labelled, est.n_unlabelled) == (40, len(ya) - 40)  # one-sided labels count as unlabelled


def test_rows_without_a_judge_score_are_counted_and_left_out() -> None:
    rng, y, judge = _population(6, "likert", "biased")
    human = _labels(rng, y, 80)
    lab_rows, unl_rows = np.flatnonzero(~np.isnan(human)), np.flatnonzero(np.isnan(human))
    drop = np.r_[lab_rows[:3], unl_rows[:5]]
    judge_missing = judge.copy()
    judge_missing[drop] = np.nan
    est = ppi_mean(judge_missing, human)
    assert (est.n_excluded, est.n_excluded_labelled) == (8, 3)
    assert (est.n_labelled, est.n_unlabelled) == (77, len(y) - 80 - 5)
    keep = np.setdiff1d(np.arange(len(y)), drop)
    same = ppi_mean(judge[keep], human[keep])  # as if those rows had never been there
    assert (same.n_excluded, same.n_excluded_labelled) == (0, 0)
    for field in ("mean", "ci_low", "ci_high", "lam", "judge_mean", "classical_mean", "classical_ci_low"):
        assert _close(getattr(est, field), getattr(same, field)), field
    assert _close(est.judge_mean, float(np.nanmean(judge_missing)))


def test_paired_diff_excluded_counts() -> None:
    rng, ya, ja = _population(7)
    _, yb, jb = _population(8)
    lab = _labels(rng, ya, 70)
    ha, hb = lab.copy(), np.where(np.isnan(lab), np.nan, yb)
    lab_rows, unl_rows = np.flatnonzero(~np.isnan(lab)), np.flatnonzero(np.isnan(lab))
    ja[lab_rows[:2]] = np.nan  # labelled rows, A not scored
    jb[lab_rows[2:4]] = np.nan  # labelled rows, B not scored
    ja[unl_rows[:3]] = np.nan
    jb[unl_rows[:3]] = np.nan  # both missing on the same rows: counted once
    jb[unl_rows[3:5]] = np.nan
    est = ppi_paired_diff(ja, jb, ha, hb)
    assert (est.n_excluded, est.n_excluded_labelled, est.n_labelled) == (9, 4, 66)
    assert est.n_unlabelled == len(ya) - 70 - 5


def test_misaligned_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="aligned"):
        ppi_mean(np.ones(100), np.ones(99))
    with pytest.raises(ValueError, match="aligned"):
        ppi_paired_diff(np.ones(100), np.ones(100), np.ones(100), np.ones(101))
    with pytest.raises(ValueError, match="aligned"):
        ppi_paired_diff(np.ones(99), np.ones(100), np.ones(100), np.ones(100))


@pytest.mark.parametrize("alpha", [0, 1, -0.1, 1.5, float("nan")])
def test_alpha_out_of_range_is_refused(alpha: float) -> None:
    rng, y, judge = _population(9)
    human = _labels(rng, y, 50)
    with pytest.raises(ValueError, match="alpha"):
        ppi_mean(judge, human, alpha=alpha)
    with pytest.raises(ValueError, match="alpha"):
        ppi_paired_diff(judge, judge, human, human, alpha=alpha)


@pytest.mark.parametrize("lam", [-0.1, 1.01, 2, float("nan"), "1"])
def test_lam_out_of_range_is_refused(lam) -> None:
    rng, y, judge = _population(10)
    human = _labels(rng, y, 50)
    with pytest.raises(ValueError, match="lam"):
        ppi_mean(judge, human, lam=lam)


def test_bad_arrays_are_refused() -> None:
    with pytest.raises(ValueError, match="one-dimensional"):
        ppi_mean(np.ones((10, 2)), np.ones((10, 2)))
    with pytest.raises(ValueError, match="infinite"):
        ppi_mean(np.r_[np.ones(40), np.inf], np.ones(41))
    with pytest.raises(TypeError, match="numbers"):
        ppi_mean(["good"] * 40, np.ones(40))


def _classical(y: np.ndarray, alpha: float) -> tuple[float, float, float]:
    z = stats.norm.ppf(1 - alpha / 2)
    half = z * np.std(y, ddof=0) / math.sqrt(len(y))
    return float(y.mean()), float(y.mean() - half), float(y.mean() + half)


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_classical_interval_is_mean_plus_minus_z_std_over_sqrt_n(alpha: float) -> None:
    rng, y, judge = _population(11, "likert", "biased")
    human = _labels(rng, y, 90)
    est = ppi_mean(judge, human, alpha=alpha)
    mean, low, high = _classical(human[~np.isnan(human)], alpha)
    assert _close(est.classical_mean, mean) and _close(est.classical_ci_low, low)
    assert _close(est.classical_ci_high, high)
    assert _close(est.classical_width, high - low)
    # lam=0 is the classical interval, whatever the judge
    zero = ppi_mean(judge, human, alpha=alpha, lam=0)
    assert _close(zero.mean, mean) and _close(zero.ci_low, low) and _close(zero.ci_high, high)


@pytest.mark.parametrize("lam", [None, 1.0, 0.5])
def test_every_scored_row_labelled_gives_the_classical_interval(lam: float | None) -> None:
    _, y, judge = _population(12, "binary", "biased", m=120)
    human = y.copy()
    human[:5] = np.nan
    judge[:5] = np.nan  # unlabelled rows, but not scored either: N = 0
    est = ppi_mean(judge, human, alpha=0.1, lam=lam)
    mean, low, high = _classical(y[5:], 0.1)
    assert est.n_unlabelled == 0 and est.lam == 0.0
    assert _close(est.mean, mean) and _close(est.ci_low, low) and _close(est.ci_high, high)
    assert est.effective_labels is not None and _close(est.effective_labels, est.n_labelled, 1e-6)


def test_constant_judge_gets_lambda_zero_under_ppi_plus_plus() -> None:
    rng, y, _ = _population(13, "likert")
    judge = np.full(len(y), 4.0)
    human = _labels(rng, y, 60)
    est = ppi_mean(judge, human, alpha=0.1)
    assert est.lam == 0.0
    mean, low, high = _classical(human[~np.isnan(human)], 0.1)
    assert _close(est.mean, mean) and _close(est.ci_low, low) and _close(est.ci_high, high)
    assert est.selection_p is None  # nothing to compare: the judge said the same everywhere


def test_good_judge_is_worth_more_labels_than_it_has() -> None:
    rng, y, judge = _population(14, "likert", "good", m=1500)
    human = _labels(rng, y, 60)
    est = ppi_mean(judge, human)
    assert est.effective_labels is not None and est.effective_labels > 1.5 * est.n_labelled
    assert est.width < est.classical_width
    assert _close(est.effective_labels, est.n_labelled * est.classical_se ** 2 / est.se ** 2, 1e-6)
    assert _close(est.se ** 2, est.var_rectifier / est.n_labelled + est.var_judge_unlabelled / est.n_unlabelled)
    d = est.as_dict()
    assert d["width"] == est.width and d["classical_width"] == est.classical_width and d["mean"] == est.mean


def test_selection_p_flags_labels_chosen_by_judge_score() -> None:
    for seed in range(10):
        rng, y, judge = _population(100 + seed, "likert", "good", m=800)
        # labels drawn with the judge's score as weight: high-scored rows much more likely to be labelled
        weight = judge ** 3 / (judge ** 3).sum()
        idx = rng.choice(len(y), size=80, replace=False, p=weight)
        human = np.full(len(y), np.nan)
        human[idx] = y[idx]
        est = ppi_mean(judge, human)
        assert est.selection_p is not None and est.selection_p < 1e-3, (seed, est.selection_p)


def test_selection_p_is_not_small_for_random_labels() -> None:
    ps = []
    for seed in range(60):
        rng, y, judge = _population(200 + seed, "likert", "good", m=800)
        est = ppi_mean(judge, _labels(rng, y, 80))
        assert est.selection_p is not None
        ps.append(est.selection_p)
    # under random labelling the p-value is about uniform: few small ones, median near 0.5
    assert np.mean(np.array(ps) < 0.05) <= 0.15
    assert 0.3 <= float(np.median(ps)) <= 0.7


# ---------------------------------------------------------------------------------------------
# (d) coverage
# ---------------------------------------------------------------------------------------------


def test_ppi_interval_covers_the_human_mean_a_biased_judge_misses() -> None:
    """Rows from a population whose human mean is 0.6, judged by a lenient judge (says yes to 45% of the "no"s:
    its mean is 0.75). Over 300 label draws the 90% PPI++ interval should cover 0.6 about 90% of the time; the
    judge's own mean should be far off."""
    true_mean, m, n, alpha = 0.6, 600, 80, 0.1
    covered, naive_covered, estimates, judge_means = 0, 0, [], []
    z = stats.norm.ppf(1 - alpha / 2)
    for seed in range(300):
        rng = np.random.default_rng(50_000 + seed)
        y = (rng.random(m) < true_mean).astype(float)
        judge = _judge(rng, "binary", "biased", y)
        est = ppi_mean(judge, _labels(rng, y, n), alpha=alpha)
        covered += est.ci_low <= true_mean <= est.ci_high
        estimates.append(est.mean)
        judge_means.append(est.judge_mean)
        naive_half = z * np.std(judge) / math.sqrt(m)
        naive_covered += abs(est.judge_mean - true_mean) <= naive_half
    coverage = covered / 300
    assert 0.85 <= coverage <= 0.95, coverage
    assert abs(np.mean(estimates) - true_mean) < 0.01  # unbiased
    assert abs(np.mean(judge_means) - true_mean) > 0.1  # the judge alone is not
    assert naive_covered / 300 < 0.05


# ---------------------------------------------------------------------------------------------
# (e) labels_needed
# ---------------------------------------------------------------------------------------------


def _likert_good_population(rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
    y = _truth(rng, "likert", m)
    return y, _judge(rng, "likert", "good", y)


def test_labels_needed_plans_about_the_target_width() -> None:
    m, alpha, target = 3000, 0.1, 0.12
    rng = np.random.default_rng(77)
    y, judge = _likert_good_population(rng, m)
    pilot = ppi_mean(judge, _labels(rng, y, 300), alpha=alpha)
    plan = labels_needed(pilot, target)
    assert plan["rows"] == m and plan["pilot_labels"] == 300 and plan["lam"] == pilot.lam
    assert plan["ppi"] is not None and MIN_LABELS <= plan["ppi"] < plan["classical"] < m
    widths, classical_widths = [], []
    for seed in range(80):
        rng = np.random.default_rng(80_000 + seed)
        y, judge = _likert_good_population(rng, m)
        widths.append(ppi_mean(judge, _labels(rng, y, plan["ppi"]), alpha=alpha).width)
        classical_widths.append(ppi_mean(judge, _labels(rng, y, plan["classical"]), alpha=alpha).classical_width)
    assert abs(np.mean(widths) / target - 1) < 0.15, np.mean(widths)
    assert abs(np.mean(classical_widths) / target - 1) < 0.15, np.mean(classical_widths)


def test_labels_needed_orders_and_edges() -> None:
    rng = np.random.default_rng(78)
    y, judge = _likert_good_population(rng, 2000)
    pilot = ppi_mean(judge, _labels(rng, y, 100), alpha=0.05)
    wide, narrow = labels_needed(pilot, 0.3), labels_needed(pilot, 0.15)
    for plan in (wide, narrow):
        assert plan["classical"] >= plan["ppi"]  # a good judge never needs more labels than no judge
    assert narrow["ppi"] > wide["ppi"] and narrow["classical"] > wide["classical"]
    # the plan is the smallest n with var_r / n + var_u / (rows - n) <= (width / 2z)^2
    h2 = (0.15 / 2 / stats.norm.ppf(0.975)) ** 2

    def se2(n: int, rows: int) -> float:
        return pilot.var_rectifier / n + pilot.var_judge_unlabelled / (rows - n)

    assert se2(narrow["ppi"], 2000) <= h2 < se2(narrow["ppi"] - 1, 2000)
    assert narrow["classical"] == math.ceil(pilot.classical_se ** 2 * pilot.n_labelled / h2)
    # more scored rows help PPI (more unlabelled rows), not the labels alone
    bigger = labels_needed(pilot, 0.15, n_rows=20_000)
    assert bigger["rows"] == 20_000 and bigger["ppi"] < narrow["ppi"]
    assert se2(bigger["ppi"], 20_000) <= h2 < se2(bigger["ppi"] - 1, 20_000)
    assert bigger["classical"] == narrow["classical"]
    # narrower than labelling every row could give: no plan
    assert labels_needed(pilot, 0.001)["ppi"] is None
    for bad in (0, -0.1):
        with pytest.raises(ValueError, match="target_width"):
            labels_needed(pilot, bad)


# ---------------------------------------------------------------------------------------------
# (f) labels that carry no variance: no zero-width "95 %" interval, an exact bound and a warning instead
# ---------------------------------------------------------------------------------------------


def _identical(n_labelled: int, value: float, judge: np.ndarray) -> np.ndarray:
    human = np.full(len(judge), np.nan)
    human[:n_labelled] = value
    return human


@pytest.mark.parametrize("n", [30, 40, 100])
def test_identical_binary_labels_give_the_clopper_pearson_interval_and_a_warning(n: int) -> None:
    judge = np.r_[np.ones(n + 50), np.zeros(30)]
    for value, (want_low, want_high) in [(1.0, stats.binomtest(n, n).proportion_ci(method="exact")),
                                         (0.0, stats.binomtest(0, n).proportion_ci(method="exact"))]:
        est = ppi_mean(judge, _identical(n, value, judge))
        assert est.interval == "exact_no_variance"
        assert est.ci_high - est.ci_low > 0  # before: [v, v]
        # the exact binomial (Clopper-Pearson) interval for n of n (0 of n): what the labels support
        assert (est.ci_low, est.ci_high) == pytest.approx((want_low, want_high), abs=1e-9)
        assert (est.classical_ci_low, est.classical_ci_high) == pytest.approx((want_low, want_high), abs=1e-9)
        assert est.warning and "carry no variance" in est.warning and "Clopper-Pearson" in est.warning
        assert f"all {value:g}" in est.warning and est.as_dict()["warning"] == est.warning


def test_identical_labels_on_a_multi_level_scale_get_a_bound_valid_for_any_other_labels() -> None:
    n = 40
    judge = np.r_[np.full(60, 5.0), np.full(40, 3.0)]
    est = ppi_mean(judge, _identical(n, 5.0, judge), scale=(1.0, 5.0))
    share = 0.025 ** (1 / n)  # Clopper-Pearson lower bound on the share of rows a person would label 5
    assert est.ci_low == pytest.approx(5 - (1 - share) * 4) and est.ci_high == 5.0
    assert est.ci_low < 5.0 and est.interval == "exact_no_variance"
    assert "multi-level scale" in est.warning and "normal-approximation interval" in est.warning
    assert "1..5" in est.warning
    # the bound holds: a population where just under 1 - share of rows are 1s (the worst case) has its mean inside
    assert est.ci_low <= share * 5 + (1 - share) * 1 + 1e-12
    # a label set with variance keeps its normal interval, without a warning
    varied = _identical(n, 5.0, judge)
    varied[0] = 4.0
    normal = ppi_mean(judge, varied, scale=(1.0, 5.0))
    assert normal.warning is None and normal.interval == "normal"


def test_identical_paired_differences_get_a_bound_and_a_warning() -> None:
    n = 40
    ja = np.r_[np.full(50, 5.0), np.full(50, 2.0)]
    jb = np.r_[np.full(70, 4.0), np.full(30, 1.0)]
    ha = _identical(n, 5.0, ja)
    est = ppi_paired_diff(ja, jb, ha, ha.copy(), scale=(1.0, 5.0))  # every labelled row: the same label, diff 0
    assert est.interval == "exact_no_variance"
    share = 0.025 ** (1 / n)
    assert (est.ci_low, est.ci_high) == pytest.approx((-(1 - share) * 4, (1 - share) * 4))  # before: [0, 0]
    assert est.ci_low < 0 < est.ci_high
    assert "label differences are all 0" in est.warning
    # on a binary scale the differences lie in -1..1
    binary = ppi_paired_diff(ja / 5, jb / 5, ha / 5, ha / 5, scale=(0.0, 1.0))
    assert (binary.ci_low, binary.ci_high) == pytest.approx((-(1 - share), 1 - share))


def test_labels_only_with_identical_labels_gives_the_bound_too() -> None:
    from mlflow_ragjudge.engine.ppi import labels_only_mean

    only = labels_only_mean(np.r_[np.ones(40), np.full(10, np.nan)])
    assert (only.ci_low, only.ci_high) == pytest.approx(stats.binomtest(40, 40).proportion_ci(method="exact"))
    assert only.warning and only.interval == "exact_no_variance"
    diff = labels_only_mean(np.zeros(40), scale=(1.0, 5.0), paired=True)
    assert diff.ci_low < 0 < diff.ci_high and "label differences" in diff.warning
