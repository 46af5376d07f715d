"""Tests for mlflow_ragjudge.engine.meta: correlations, bootstrap intervals, kappa, Figure-2 table."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from mlflow_ragjudge.core.types import JudgeResult, metric_name_part
from mlflow_ragjudge.engine.meta import COEFFICIENTS, agreement, correlations, meta_evaluate, meta_metrics

MLFLOW_NAME_RE = re.compile(r"^[/\w.\- ]*$")  # mlflow.utils.validation._VALID_PARAM_AND_METRIC_NAMES


def _no_nan(obj: Any) -> bool:
    if isinstance(obj, dict):
        return all(_no_nan(v) for v in obj.values())
    if isinstance(obj, float):
        return not math.isnan(obj)
    return True


@pytest.fixture
def paired() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.integers(1, 6, size=80).astype(float)  # a 1-5 judge: many ties
    y = x + rng.normal(scale=1.5, size=80)
    return x, y


# ---------------------------------------------------------------------------------------------
# correlations
# ---------------------------------------------------------------------------------------------


def test_point_estimates_and_p_values_equal_scipy(paired: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = paired
    out = correlations(x, y, n_boot=0)
    for name, fn in (
        ("pearson", stats.pearsonr),
        ("spearman", stats.spearmanr),
        ("kendall", stats.kendalltau),
    ):
        ref = fn(x, y)
        assert out[name] == pytest.approx(float(ref.statistic), abs=1e-12)
        assert out[f"{name}_p"] == pytest.approx(float(ref.pvalue), rel=1e-9)
        assert out[f"{name}_ci_low"] is None and out[f"{name}_ci_high"] is None
    assert out["n"] == 80 and out["n_dropped"] == 0 and out["reason"] is None


def test_known_correlations() -> None:
    x = [1, 2, 3, 4, 5]
    assert correlations(x, [2, 4, 6, 8, 10], n_boot=0)["pearson"] == pytest.approx(1.0)
    out = correlations(x, [5, 4, 3, 2, 1], n_boot=0)
    assert out["spearman"] == pytest.approx(-1.0) and out["kendall"] == pytest.approx(-1.0)
    # monotone but not linear: rank correlations are 1, Pearson is not
    out = correlations(x, [1, 4, 9, 16, 100], n_boot=0)
    assert out["spearman"] == pytest.approx(1.0) and out["pearson"] < 0.95


def test_bootstrap_is_deterministic_with_a_seed(paired: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = paired
    a = correlations(x, y, n_boot=300, seed=11)
    b = correlations(x, y, n_boot=300, seed=11)
    c = correlations(x, y, n_boot=300, seed=12)
    assert a == b
    assert a["spearman_ci_low"] != c["spearman_ci_low"]
    g = correlations(x, y, n_boot=300, seed=np.random.default_rng(11))
    assert g["pearson_ci_low"] == a["pearson_ci_low"]


def test_bootstrap_interval_brackets_the_estimate(paired: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = paired
    out = correlations(x, y, n_boot=500, seed=0, ci=0.9)
    for name in COEFFICIENTS:
        assert out[f"{name}_ci_low"] < out[name] < out[f"{name}_ci_high"]
        assert out["n_boot_valid"][name] == 500
    wide = correlations(x, y, n_boot=500, seed=0, ci=0.99)
    assert wide["pearson_ci_high"] - wide["pearson_ci_low"] > out["pearson_ci_high"] - out["pearson_ci_low"]


@pytest.mark.slow
@pytest.mark.parametrize("coef", ["pearson", "spearman"])
def test_bootstrap_interval_agrees_with_scipy_bootstrap(
    coef: str, paired: tuple[np.ndarray, np.ndarray]
) -> None:
    """Our percentile interval vs scipy.stats.bootstrap's (different draws, same method)."""
    x, y = paired
    fn = stats.pearsonr if coef == "pearson" else stats.spearmanr
    ref = stats.bootstrap(
        (x, y), lambda a, b: fn(a, b).statistic, paired=True, vectorized=False,
        n_resamples=2000, method="percentile", confidence_level=0.95, rng=np.random.default_rng(3),
    )  # fmt: skip
    ours = correlations(x, y, n_boot=2000, seed=5)
    assert ours[f"{coef}_ci_low"] == pytest.approx(ref.confidence_interval.low, abs=0.03)
    assert ours[f"{coef}_ci_high"] == pytest.approx(ref.confidence_interval.high, abs=0.03)


def test_missing_values_drop_pairs() -> None:
    metric = [
        1.0,
        None,
        3.0,
        float("nan"),
        5.0,
        JudgeResult.failed("timeout"),
        JudgeResult.scored(2),
        4,
        pd.NA,
    ]
    human = [1.0, 2.0, None, 4.0, 5.5, 6.0, 2.5, 4.5, 1.0]
    out = correlations(metric, human, n_boot=0)
    assert out["n"] == 4 and out["n_dropped"] == 5
    kept_x, kept_y = [1.0, 5.0, 2.0, 4.0], [1.0, 5.5, 2.5, 4.5]
    assert out["pearson"] == pytest.approx(stats.pearsonr(kept_x, kept_y).statistic)


def test_constant_input_gives_none_with_reason() -> None:
    out = correlations([3, 3, 3, 3], [1, 2, 3, 4], n_boot=100)
    assert all(out[k] is None for k in ("pearson", "spearman", "kendall", "pearson_p", "kendall_ci_low"))
    assert "constant metric" in out["reason"]
    assert "constant human" in correlations([1, 2, 3], [2, 2, 2])["reason"]
    assert _no_nan(out)


def test_too_few_pairs_gives_none_with_reason() -> None:
    out = correlations([1, 2, None], [1, 2, 3])
    assert out["pearson"] is None and "fewer than 3" in out["reason"] and out["n"] == 2
    assert correlations([], [])["n"] == 0


def test_small_samples_never_produce_nan() -> None:
    # With 3 pairs many bootstrap resamples are constant; they are skipped, not NaN.
    out = correlations([1, 2, 3], [1, 3, 2], n_boot=200, seed=1)
    assert _no_nan(out)
    assert 0 < out["n_boot_valid"]["pearson"] < 200


def test_correlation_input_errors() -> None:
    with pytest.raises(ValueError, match="aligned"):
        correlations([1, 2, 3], [1, 2])
    with pytest.raises(TypeError, match="expected a number"):
        correlations([1, 2, "4"], [1, 2, 3])
    with pytest.raises(ValueError, match="ci"):
        correlations([1, 2, 3], [1, 2, 3], ci=95)
    with pytest.raises(ValueError, match="n_boot"):
        correlations([1, 2, 3], [1, 2, 3], n_boot=-1)
    with pytest.raises(TypeError, match="seed"):
        correlations([1, 2, 3], [1, 2, 3], seed=1.5)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# agreement / Cohen's kappa
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_kappa_equals_sklearn(seed: int) -> None:
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    a = rng.choice(["yes", "no", "unsure"], size=200, p=[0.5, 0.4, 0.1]).tolist()
    b = [x if rng.random() < 0.7 else rng.choice(["yes", "no", "unsure"]) for x in a]
    out = agreement(a, b)
    assert out["cohen_kappa"] == pytest.approx(sk.cohen_kappa_score(a, b), abs=1e-12)
    assert out["agreement"] == pytest.approx(sk.accuracy_score(a, b), abs=1e-12)
    assert out["n"] == 200 and out["n_dropped"] == 0


def test_kappa_hand_computed() -> None:
    # 2x2 table: yes/yes 20, yes/no 5, no/yes 10, no/no 15 -> p_o = 0.7, p_e = 0.5*0.6 + 0.5*0.4 = 0.5
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    out = agreement(a, b)
    assert out["agreement"] == pytest.approx(0.7)
    assert out["cohen_kappa"] == pytest.approx(0.4)


def test_agreement_missing_and_degenerate() -> None:
    out = agreement(["a", None, "b", float("nan")], ["a", "b", None, "b"])
    assert out["n"] == 1 and out["n_dropped"] == 3
    same = agreement(["x", "x", "x"], ["x", "x", "x"])
    assert same["agreement"] == 1.0 and same["cohen_kappa"] is None and "undefined" in same["reason"]
    empty = agreement([None], [None])
    assert empty["agreement"] is None and empty["n"] == 0
    with pytest.raises(ValueError, match="aligned"):
        agreement(["a"], ["a", "b"])


# ---------------------------------------------------------------------------------------------
# meta_evaluate / meta_metrics
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def judged() -> pd.DataFrame:
    abstained, two, failed = (
        JudgeResult.abstained("not_sure"),
        JudgeResult.scored(2),
        JudgeResult.failed("timeout"),
    )
    return pd.DataFrame(
        {
            "correctness": [5, 4, 0, 3, abstained, two, failed, 1, 4, 5],
            "rouge": [0.9, 0.7, 0.2, 0.5, 0.4, 0.3, 0.1, 0.2, 0.6, 0.8],
            "expert": [5, 4, 3, 3, 2, 2, 1, None, 4, 5],
            "novice": [4, 4, 2, 3, 3, 2, 2, 1, 3, 5],
        }
    )  # fmt: skip


def test_meta_evaluate_layout(judged: pd.DataFrame) -> None:
    table = meta_evaluate(
        judged, ["correctness", "rouge"], ["expert", "novice"], abstain_values={"correctness": [0]}, n_boot=50
    )
    assert len(table) == 2 * 2 * 2
    assert list(table.columns[:9]) == [
        "metric",
        "human",
        "subset",
        "n",
        "n_dropped",
        "n_abstained",
        "n_human_not_sure",
        "mean",
        "human_mean",
    ]
    for coef in COEFFICIENTS:
        assert {coef, f"{coef}_p", f"{coef}_ci_low", f"{coef}_ci_high"} <= set(table.columns)
    assert list(table["subset"][:2]) == ["all", "no_abstentions"]
    assert all(_no_nan(v) for v in table.to_numpy().ravel())  # undefined values are None, never NaN


def test_meta_evaluate_subsets_and_counts(judged: pd.DataFrame) -> None:
    table = meta_evaluate(judged, "correctness", "expert", abstain_values=[0], n_boot=0).set_index("subset")
    # all: rows 4 (abstained result), 6 (failed), 7 (no expert) drop -> 7 pairs; the 0 stays as a number
    assert table.loc["all", "n"] == 7 and table.loc["all", "n_dropped"] == 3
    x_all = [5, 4, 0, 3, 2, 4, 5]
    y_all = [5, 4, 3, 3, 2, 4, 5]
    assert table.loc["all", "mean"] == pytest.approx(np.mean(x_all))
    assert table.loc["all", "spearman"] == pytest.approx(stats.spearmanr(x_all, y_all).statistic)
    # no_abstentions: also without row 2 (value 0) and row 4 (abstained result)
    assert table.loc["no_abstentions", "n_abstained"] == 2
    assert table.loc["no_abstentions", "n"] == 6 and table.loc["no_abstentions", "n_dropped"] == 2
    x, y = [5, 4, 3, 2, 4, 5], [5, 4, 3, 2, 4, 5]
    assert table.loc["no_abstentions", "mean"] == pytest.approx(np.mean(x))
    assert table.loc["no_abstentions", "human_mean"] == pytest.approx(np.mean(y))
    assert table.loc["no_abstentions", "pearson"] == pytest.approx(1.0)


def test_meta_evaluate_matches_correlations(judged: pd.DataFrame) -> None:
    table = meta_evaluate(judged, ["rouge"], ["novice"], n_boot=200, seed=3)
    direct = correlations(judged["rouge"], judged["novice"], n_boot=200, seed=3)
    row = table[table["subset"] == "all"].iloc[0]
    for key in ("n", "pearson", "spearman_p", "kendall_ci_low", "pearson_ci_high"):
        assert row[key] == pytest.approx(direct[key])


def test_meta_evaluate_abstain_mask(judged: pd.DataFrame) -> None:
    df = judged.assign(flag=[False, True, False, False, False, False, False, False, False, False])
    by_col = meta_evaluate(df, "rouge", "novice", abstain_mask="flag", n_boot=0)
    by_map = meta_evaluate(df, "rouge", "novice", abstain_mask={"rouge": df["flag"].to_numpy()}, n_boot=0)
    for table in (by_col, by_map):
        rows = table.set_index("subset")
        assert rows.loc["all", "n"] == 10 and rows.loc["no_abstentions", "n"] == 9


def test_meta_evaluate_none_not_nan_for_undefined() -> None:
    df = pd.DataFrame({"m": [1, 1, 1, 1], "h": [1, 2, 3, 4]})
    table = meta_evaluate(df, "m", "h", n_boot=10)
    assert table["pearson"].tolist() == [None, None]
    assert all("constant" in r for r in table["reason"])
    assert meta_metrics(table) == {
        "meta/m/h/n": 4.0, "meta/m/h/mean": 1.0, "meta/m/h/human_mean": 2.5,
        "meta/m/h/no_abstentions/n": 4.0, "meta/m/h/no_abstentions/mean": 1.0,
        "meta/m/h/no_abstentions/human_mean": 2.5,
    }  # fmt: skip


def test_meta_evaluate_input_errors(judged: pd.DataFrame) -> None:
    with pytest.raises(KeyError, match="'missing'.*available columns"):
        meta_evaluate(judged, ["missing"], ["expert"])
    with pytest.raises(KeyError, match="abstain_mask"):
        meta_evaluate(judged, "rouge", "expert", abstain_mask="nope")
    with pytest.raises(ValueError, match="one boolean per row"):
        meta_evaluate(judged, "rouge", "expert", abstain_mask=[True, False])
    with pytest.raises(TypeError, match="column 'h', row 0"):
        meta_evaluate(pd.DataFrame({"m": [1, 2, 3], "h": ["Yes", "No", "Yes"]}), "m", "h")


def test_meta_metrics_names_are_valid_mlflow_names(judged: pd.DataFrame) -> None:
    df = judged.rename(columns={"correctness": "correctness (E3)/v2!", "expert": "expert:avg"})
    table = meta_evaluate(
        df, ["correctness (E3)/v2!", "rouge"], ["expert:avg"], abstain_values=[0], n_boot=50
    )
    metrics = meta_metrics(table)
    assert metrics, "expected some metrics"
    for name, value in metrics.items():
        assert MLFLOW_NAME_RE.match(name), name
        assert "//" not in name and not name.startswith("/") and not name.endswith("/")
        assert isinstance(value, float) and not math.isnan(value)
    metric, human = metric_name_part("correctness (E3)/v2!"), metric_name_part("expert:avg")
    assert metric.startswith("correctness _E3__v2___") and human.startswith("expert_avg__")  # recognisable
    assert "/" not in metric and human != "expert_avg"  # one segment each; never the name of another column
    assert f"meta/{metric}/{human}/spearman" in metrics
    assert f"meta/rouge/{human}/no_abstentions/spearman_ci_low" in metrics
    assert f"meta/rouge/{human}/kendall_ci_high" in metrics
    with pytest.raises(KeyError, match="meta_evaluate"):
        meta_metrics(pd.DataFrame({"x": [1]}))


def test_human_not_sure_scores_are_left_out_as_in_the_paper():
    """A human 0 on the six-level scale means "not sure": left out of meta-evaluation by default ("auto"),
    while a 0 in a 0/1 column is a judgement and stays; None keeps every score."""
    import mlflow_ragjudge as rj

    df = pd.DataFrame({
        "answer": ["a b c", "a b", "x y", "a", "a b c d", "z"],
        "reference": ["a b c", "a b c", "a b c", "a b c", "a b c", "a b c"],
        "expert": [5, 0, 1, 2, 5, 0],  # six-level, two "not sure"
        "accept": [1, 1, 0, 0, 1, 0],  # binary: 0 is "not acceptable"
    })
    out = rj.evaluate_frame(df, metrics=["lexical"], bertscore=False, human_columns=["expert", "accept"], n_boot=0)
    meta = out.meta.set_index(["metric", "human", "subset"])
    assert meta.loc[("word_recall", "expert", "all"), "n"] == 4
    assert meta.loc[("word_recall", "expert", "all"), "n_human_not_sure"] == 2
    assert meta.loc[("word_recall", "accept", "all"), "n"] == 6
    assert meta.loc[("word_recall", "accept", "all"), "n_human_not_sure"] == 0
    kept = rj.evaluate_frame(df, metrics=["lexical"], bertscore=False, human_columns=["expert"], n_boot=0,
                             human_not_sure=None)
    assert kept.meta.set_index(["metric", "human", "subset"]).loc[("word_recall", "expert", "all"), "n"] == 6
    with pytest.raises(ValueError, match="human_not_sure"):
        rj.evaluate_frame(df, metrics=["lexical"], human_columns=["expert"], human_not_sure="zero")
