"""Tests for mlflow_ragjudge.engine.agreement: each kappa against its reference implementation and by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mlflow_ragjudge.engine.agreement import (
    cohen_kappa,
    complete_pairs,
    confusion,
    fleiss_kappa,
    is_missing,
    krippendorff_alpha,
    per_label_precision_recall,
)
from mlflow_ragjudge.engine.meta import agreement

sklearn_metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is in the dev extra")
inter_rater = pytest.importorskip("statsmodels.stats.inter_rater", reason="statsmodels is in the dev extra")
krippendorff = pytest.importorskip("krippendorff", reason="krippendorff is in the dev extra: pip install -e .[dev]")


def _random_pairs(seed: int, n: int = 200, k: int = 5, noise: float = 0.35) -> tuple[list[int], list[int]]:
    """A rater on 1..k and a second one that copies it, or guesses, or is one level off."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, k + 1, size=n)
    b = np.where(rng.random(n) < noise, rng.integers(1, k + 1, size=n), a)
    b = np.clip(b + (rng.random(n) < 0.2) * rng.choice([-1, 1], size=n), 1, k)
    return a.tolist(), b.tolist()


# ---------------------------------------------------------------------------------------------
# Cohen's kappa
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weights", [None, "linear", "quadratic"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cohen_kappa_equals_sklearn(weights: str | None, seed: int) -> None:
    a, b = _random_pairs(seed)
    ours = cohen_kappa(a, b, weights=weights)  # type: ignore[arg-type]
    ref = sklearn_metrics.cohen_kappa_score(a, b, weights=weights)
    assert ours == pytest.approx(float(ref), abs=1e-12)


@pytest.mark.parametrize("weights", [None, "linear", "quadratic"])
def test_cohen_kappa_with_unused_scale_labels_equals_sklearn(weights: str | None) -> None:
    # nobody used 3 or 6: the whole scale still sets the distances of the weighted kappas
    a = [1, 2, 2, 4, 5, 5, 1, 4]
    b = [1, 2, 4, 4, 5, 4, 2, 5]
    scale = [1, 2, 3, 4, 5, 6]
    ours = cohen_kappa(a, b, weights=weights, labels=scale)  # type: ignore[arg-type]
    ref = sklearn_metrics.cohen_kappa_score(a, b, weights=weights, labels=scale)
    assert ours == pytest.approx(float(ref), abs=1e-12)


def test_cohen_kappa_by_hand() -> None:
    # judge:  Y Y Y N N N Y N ;  people: Y Y N N N Y Y N
    judge = ["Y", "Y", "Y", "N", "N", "N", "Y", "N"]
    people = ["Y", "Y", "N", "N", "N", "Y", "Y", "N"]
    # p_o = 6/8 (rows 3 and 6 differ); each side says Y 4 times of 8: p_e = .5*.5 + .5*.5 = .5
    # kappa = (.75 - .5) / (1 - .5) = .5
    assert cohen_kappa(judge, people) == pytest.approx(0.5)


def test_weighted_kappa_by_hand() -> None:
    # scale 1..3; pairs (1,1) (2,3) (3,3) (1,3)
    a, b = [1, 2, 3, 1], [1, 3, 3, 3]
    # confusion (rows a, cols b): [[1,0,1],[0,0,1],[0,0,1]]; margins a = (2,1,1), b = (1,0,3)
    # linear w=|i-j|: observed = 1*1 (2,3) + 2*1 (1,3) = 3 ; n*observed = 12
    # expected = sum w * a_i * b_j = |0-2|*2*3 + |1-0|*1*1 + |1-2|*1*3 + |2-0|*1*1 = 12+1+3+2 = 18
    # kappa_lin = 1 - 12/18 = 1/3
    assert cohen_kappa(a, b, weights="linear") == pytest.approx(1 / 3)
    # quadratic w=(i-j)^2: observed = 1 + 4 = 5 ; n*observed = 20 ; expected = 4*6 + 1 + 3 + 4*1 = 32
    # kappa_quad = 1 - 20/32 = 0.375
    assert cohen_kappa(a, b, weights="quadratic") == pytest.approx(0.375)


def test_cohen_kappa_drops_missing_pairs() -> None:
    a = ["Y", None, "N", float("nan"), "Y", "N"]
    b = ["Y", "N", np.nan, "Y", pd.NA, "N"]
    # complete: (Y,Y) (N,N): perfect agreement over two labels
    assert cohen_kappa(a, b) == pytest.approx(1.0)
    assert complete_pairs(a, b)[1] == 4


@pytest.mark.parametrize(
    "a, b",
    [
        pytest.param([], [], id="empty"),
        pytest.param([None, None], ["Y", "N"], id="no-complete-pairs"),
        pytest.param(["Y", "Y", "Y"], ["Y", "Y", "Y"], id="one-label-both-sides"),
    ],
)
@pytest.mark.parametrize("weights", [None, "linear", "quadratic"])
def test_cohen_kappa_undefined_is_none(a: list, b: list, weights: str | None) -> None:
    assert cohen_kappa(a, b, weights=weights) is None  # type: ignore[arg-type]


def test_cohen_kappa_one_constant_side_is_zero_like_sklearn() -> None:
    a, b = ["Y", "Y", "Y", "Y"], ["Y", "N", "Y", "N"]
    # p_o = .5, p_e = 1*.5 + 0*.5 = .5 -> kappa = 0 (defined: people's labels vary)
    assert cohen_kappa(a, b) == pytest.approx(0.0)
    assert cohen_kappa(a, b) == pytest.approx(float(sklearn_metrics.cohen_kappa_score(a, b)))


def test_cohen_kappa_bad_input_names_the_fix() -> None:
    with pytest.raises(ValueError, match="aligned row by row, got 2 and 3"):
        cohen_kappa([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match=r"\[7\] are not among labels"):
        cohen_kappa([1, 7], [1, 2], labels=[1, 2, 3])
    with pytest.raises(ValueError, match="weights='cubic'"):
        cohen_kappa([1, 2], [1, 2], weights="cubic")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a single string"):
        cohen_kappa("YN", "YN")


def test_meta_agreement_reuses_cohen_kappa() -> None:
    a, b = _random_pairs(5, k=2)
    out = agreement(a, b)
    assert out["cohen_kappa"] == cohen_kappa(a, b)
    assert out["agreement"] == pytest.approx(np.mean(np.array(a) == np.array(b)))
    undefined = agreement(["x", "x"], ["x", "x"])
    assert undefined["cohen_kappa"] is None and "chance agreement is 1" in undefined["reason"]


# ---------------------------------------------------------------------------------------------
# Confusion matrix, precision, recall
# ---------------------------------------------------------------------------------------------


def test_confusion_equals_sklearn() -> None:
    a, b = _random_pairs(3, n=120)
    labels, matrix = confusion(a, b)
    assert labels == [1, 2, 3, 4, 5]
    assert matrix == sklearn_metrics.confusion_matrix(a, b, labels=labels).tolist()


def test_per_label_precision_recall_by_hand_and_against_sklearn() -> None:
    judge = ["Y", "Y", "Y", "N", "N", "N", "Y", "N", "Y"]
    human = ["Y", "Y", "N", "N", "N", "Y", "Y", "N", None]
    out = per_label_precision_recall(judge, human)
    # complete pairs: 8. Judge said Y on rows 0,1,2,6 -> people Y on 0,1,6: precision 3/4.
    # People said Y on rows 0,1,5,6 -> judge Y on 0,1,6: recall 3/4.
    assert out["Y"] == {"precision": 0.75, "recall": 0.75, "support": 4, "predicted": 4, "correct": 3}
    ref_p, ref_r, _, _ = sklearn_metrics.precision_recall_fscore_support(human[:8], judge[:8], labels=["N", "Y"])
    assert [out["N"]["precision"], out["Y"]["precision"]] == pytest.approx(ref_p.tolist())
    assert [out["N"]["recall"], out["Y"]["recall"]] == pytest.approx(ref_r.tolist())


def test_precision_recall_of_a_label_nobody_used_is_none() -> None:
    out = per_label_precision_recall([1, 1, 2], [1, 2, 2], labels=[1, 2, 3])
    assert out[3] == {"precision": None, "recall": None, "support": 0, "predicted": 0, "correct": 0}
    # label 1: judge said it twice, right once; people said it once, the judge found it
    assert out[1]["precision"] == 0.5 and out[1]["recall"] == 1.0


# ---------------------------------------------------------------------------------------------
# Fleiss' kappa
# ---------------------------------------------------------------------------------------------


def _counts_table(ratings: list[list[int]], cats: list[int]) -> np.ndarray:
    return np.array([[row.count(c) for c in cats] for row in ratings])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_fleiss_kappa_equals_statsmodels(seed: int) -> None:
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 3, size=60)
    ratings = [[int(t) if rng.random() < 0.7 else int(rng.integers(0, 3)) for _ in range(4)] for t in truth]
    ref = inter_rater.fleiss_kappa(_counts_table(ratings, [0, 1, 2]), method="fleiss")
    assert fleiss_kappa(ratings) == pytest.approx(float(ref), abs=1e-12)


def test_fleiss_kappa_by_hand() -> None:
    # three units, three raters: (Y,Y,Y) (Y,Y,N) (N,N,N)
    ratings = [["Y", "Y", "Y"], ["Y", "Y", "N"], ["N", "N", "N"]]
    # P_u = 1, (2*1 + 0)/(3*2) = 1/3, 1 ; P_bar = 7/9
    # p_Y = 5/9, p_N = 4/9 ; P_e = 25/81 + 16/81 = 41/81
    # kappa = (7/9 - 41/81) / (1 - 41/81) = (63/81 - 41/81) / (40/81) = 22/40 = 0.55
    assert fleiss_kappa(ratings) == pytest.approx(0.55)


def test_fleiss_kappa_missing_ratings_keep_each_units_own_count() -> None:
    # unit 2 lost a rating, unit 4 has one rating left and is dropped
    ratings = [["Y", "Y", "Y"], ["Y", None, "N"], ["N", "N", "N"], [None, "Y", None]]
    # units kept: (Y,Y,Y) (Y,N) (N,N,N): P_u = 1, 0, 1 ; P_bar = 2/3
    # ratings pooled: Y 4, N 4 of 8 -> P_e = 1/2 ; kappa = (2/3 - 1/2) / (1/2) = 1/3
    assert fleiss_kappa(ratings) == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "ratings",
    [
        pytest.param([], id="empty"),
        pytest.param([["Y"], ["N", None]], id="no-unit-with-two-ratings"),
        pytest.param([["Y", "Y"], ["Y", "Y", "Y"]], id="one-category"),
    ],
)
def test_fleiss_kappa_undefined_is_none(ratings: list) -> None:
    assert fleiss_kappa(ratings) is None


def test_fleiss_kappa_accepts_a_dataframe_and_an_array() -> None:
    ratings = [[1, 1, 2], [2, 2, 2], [1, 2, 1], [1, 1, 1]]
    expected = fleiss_kappa(ratings)
    assert fleiss_kappa(pd.DataFrame(ratings)) == expected
    assert fleiss_kappa(np.array(ratings, dtype=float)) == expected
    with pytest.raises(TypeError, match="one row per unit"):
        fleiss_kappa([1, 2, 3])


# ---------------------------------------------------------------------------------------------
# Krippendorff's alpha
# ---------------------------------------------------------------------------------------------


def _krippendorff_example() -> list[list[float | None]]:
    """Krippendorff (2011)'s example C: 4 observers x 12 units, with missing values (here units x raters)."""
    n = None
    by_rater = [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, n, n, n],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, n, 3],
        [n, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, n],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, n],
    ]
    return [list(col) for col in zip(*by_rater, strict=True)]


@pytest.mark.parametrize("level", ["nominal", "ordinal", "interval"])
def test_krippendorff_alpha_equals_the_krippendorff_package(level: str) -> None:
    units = _krippendorff_example()
    reliability = np.array([[np.nan if v is None else v for v in row] for row in units], dtype=float).T
    ref = krippendorff.alpha(reliability_data=reliability, level_of_measurement=level)
    assert krippendorff_alpha(units, level=level) == pytest.approx(float(ref), abs=1e-12)  # type: ignore[arg-type]


def test_krippendorff_alpha_the_papers_own_numbers() -> None:
    # Krippendorff (2011), example C: nominal 0.743, interval 0.849 (ordinal: 0.815)
    units = _krippendorff_example()
    assert krippendorff_alpha(units, level="nominal") == pytest.approx(0.743, abs=5e-4)
    assert krippendorff_alpha(units, level="interval") == pytest.approx(0.849, abs=5e-4)
    assert krippendorff_alpha(units, level="ordinal") == pytest.approx(0.815, abs=5e-4)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("level", ["nominal", "ordinal", "interval"])
def test_krippendorff_alpha_random_tables_equal_the_package(seed: int, level: str) -> None:
    rng = np.random.default_rng(seed)
    truth = rng.integers(1, 6, size=40)
    table = np.array([[t if rng.random() < 0.6 else rng.integers(1, 6) for _ in range(3)] for t in truth], dtype=float)
    table[rng.random(table.shape) < 0.15] = np.nan
    ref = krippendorff.alpha(reliability_data=table.T, level_of_measurement=level)
    assert krippendorff_alpha(table, level=level) == pytest.approx(float(ref), abs=1e-12)  # type: ignore[arg-type]


def test_krippendorff_alpha_by_hand() -> None:
    # two units, two raters, nominal: (a,a) (a,b)
    # coincidences: unit 1 adds o[a][a] = 2 (two ordered pairs, 1/(2-1) each); unit 2 adds o[a][b] = o[b][a] = 1
    # n_a = 3, n_b = 1, n = 4 ; D_o = 2/4 ; D_e = (3*1 + 1*3) / (4*3) = 1/2 ; alpha = 1 - (1/2)/(1/2) = 0
    assert krippendorff_alpha([["a", "a"], ["a", "b"]]) == pytest.approx(0.0)


@pytest.mark.parametrize(
    "ratings",
    [
        pytest.param([], id="empty"),
        pytest.param([[1, None], [None, 2]], id="no-pairable-unit"),
        pytest.param([[3, 3], [3, 3, None]], id="one-value"),
    ],
)
@pytest.mark.parametrize("level", ["nominal", "ordinal", "interval"])
def test_krippendorff_alpha_undefined_is_none(ratings: list, level: str) -> None:
    assert krippendorff_alpha(ratings, level=level) is None  # type: ignore[arg-type]


def test_krippendorff_alpha_bad_input_names_the_fix() -> None:
    with pytest.raises(TypeError, match="needs numbers"):
        krippendorff_alpha([["low", "high"]], level="interval")
    with pytest.raises(TypeError, match="rank on the scale"):
        krippendorff_alpha([[1, "high"], [1, 1]], level="ordinal")
    with pytest.raises(ValueError, match="level='ratio'"):
        krippendorff_alpha([[1, 1]], level="ratio")  # type: ignore[arg-type]


def test_missing_values_recognised() -> None:
    assert all(is_missing(v) for v in (None, float("nan"), np.float32("nan"), pd.NA, pd.NaT))
    assert not any(is_missing(v) for v in (0, 0.0, "", False, np.int64(3)))
    kappa = cohen_kappa([1, 2, np.nan, 1], [1, 2, 2, 2])
    assert kappa is not None and not math.isnan(kappa)
