"""Paired comparison of variants: every statistic against scipy.stats on the same per-row scores."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from mlflow_ragjudge.core.types import JudgeResult
from mlflow_ragjudge.workflows.compare import (
    COLUMNS,
    comparison_figures,
    default_metrics,
    headline_metrics,
    holm,
    paired_comparison,
    plotted_metrics,
    scores_by_row,
)


def test_holm_against_its_definition():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, None, 0.9]) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    assert holm([]) == []


@pytest.fixture
def scores():
    rng = np.random.default_rng(7)
    base = rng.integers(1, 6, 40).astype(float)
    better = np.clip(base + rng.choice([0, 1, 1, 2], 40), 1, 5)
    same = base.copy()
    noisy = np.clip(base + rng.choice([-1, 0, 1], 40), 1, 5)
    # rows 3 and 11 unscored in the baseline, row 20 unscored in "better": they drop out of those pairs
    b = {i: v for i, v in enumerate(base) if i not in (3, 11)}
    return {
        "base": {"correctness": b, "lscore": {i: 3.0 for i in range(40)}},
        "better": {"correctness": {i: v for i, v in enumerate(better) if i != 20},
                   "lscore": {i: 2.0 for i in range(40)}},
        "same": {"correctness": dict(enumerate(same)), "lscore": {i: 3.0 for i in range(40)}},
        "noisy": {"correctness": dict(enumerate(noisy))},
    }


def test_each_statistic_equals_scipy_on_the_paired_rows(scores):
    table = paired_comparison(scores, "base", n_boot=999, seed=3)
    assert list(table.columns) == COLUMNS and COLUMNS[:2] == ["variant", "metric"]  # what MLflow groups, compares
    for variant in ("better", "noisy"):
        row = table[(table["metric"] == "correctness") & (table["variant"] == variant)].iloc[0]
        keys = [k for k in scores[variant]["correctness"] if k in scores["base"]["correctness"]]
        x = np.array([scores[variant]["correctness"][k] for k in keys])
        y = np.array([scores["base"]["correctness"][k] for k in keys])
        d = x - y
        assert row["n"] == len(keys) == (37 if variant == "better" else 38)
        assert row["mean"] == pytest.approx(x.mean()) and row["baseline_mean"] == pytest.approx(y.mean())
        assert row["mean_diff"] == pytest.approx(d.mean())
        assert row["p_value"] == pytest.approx(stats.wilcoxon(d, zero_method="wilcox").pvalue, rel=1e-12)
        ci = stats.bootstrap((d,), np.mean, n_resamples=999, confidence_level=0.95, method="percentile",
                             random_state=np.random.default_rng(3)).confidence_interval
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-12)
        assert (row["wins"], row["ties"], row["losses"]) == (int((d > 0).sum()), int((d == 0).sum()),
                                                              int((d < 0).sum()))
    ps = table["p_value"].tolist()
    assert table["p_holm"].tolist() == pytest.approx(holm(ps))
    better = table[(table["metric"] == "correctness") & (table["variant"] == "better")].iloc[0]
    assert better["significant"] and better["ci_low"] > 0 and better["test"] == "wilcoxon"


def test_no_difference_is_p_one_and_lower_is_better_is_oriented(scores):
    table = paired_comparison(scores, "base")
    same = table[(table["metric"] == "correctness") & (table["variant"] == "same")].iloc[0]
    assert same["p_value"] == 1.0 and same["mean_diff"] == 0 and (same["ci_low"], same["ci_high"]) == (0.0, 0.0)
    assert same["test"] == "wilcoxon: all differences zero" and not same["significant"]
    lscore = table[(table["metric"] == "lscore") & (table["variant"] == "better")].iloc[0]
    assert lscore["mean_diff"] == -1.0 and lscore["wins"] == 40 and lscore["losses"] == 0  # fewer turns is better
    assert not ((table["metric"] == "lscore") & (table["variant"] == "noisy")).any()  # no such metric: no row


def test_too_few_rows_gives_no_statistic_not_nan():
    table = paired_comparison({"a": {"m": {0: 1.0}}, "b": {"m": {0: 2.0, 1: 3.0}}}, "a")
    row = table.iloc[0]
    assert row["n"] == 1 and row["p_value"] is None and row["ci_low"] is None and row["p_holm"] is None
    assert row["test"].startswith("none") and row["significant"] is False


def test_bad_arguments():
    with pytest.raises(ValueError, match="baseline 'x' is not one of"):
        paired_comparison({"a": {}}, "x")
    with pytest.raises(ValueError, match="alpha"):
        paired_comparison({"a": {}}, "a", alpha=1.5)


def test_scores_by_row_keeps_only_scored_rows():
    res = {"correctness": [JudgeResult.scored(4), JudgeResult.abstained("not_sure"), JudgeResult.failed("timeout"),
                           JudgeResult.scored(2)]}
    assert scores_by_row(res) == {"correctness": {0: 4.0, 3: 2.0}}


def test_default_metrics_drop_near_duplicates():
    names = ["correctness", "precision_at_1", "recall_at_5", "map", "recall", "context_rougeL_recall",
             "context_rougeL_f1", "ndcg", "ndcg_at_10"]
    assert default_metrics(names) == ["correctness", "map", "recall", "context_rougeL_recall", "ndcg"]


# ------------------------------------------------------------------------------------------------ headline and plots


def test_headline_metrics_are_correctness_and_faithfulness_or_what_was_asked():
    assert headline_metrics(["answer_relevancy", "faithfulness", "context_recall", "correctness"]) == [
        "correctness", "faithfulness"]
    assert headline_metrics(["faithfulness", "map"]) == ["faithfulness"]
    assert headline_metrics(["precision_at_1", "map", "mrr", "ndcg"]) == ["map", "mrr"]  # no @k family first
    assert headline_metrics(["map", "correctness"], ["map", "nope", "map"]) == ["map"]


def _table_with_many_metrics():
    rng = np.random.default_rng(1)
    base = {f"m{i:02d}": dict(enumerate(rng.integers(1, 6, 30).astype(float))) for i in range(14)}
    base["correctness"] = {i: 3.0 for i in range(30)}
    better = {m: {i: min(5.0, v + 1) for i, v in vals.items()} for m, vals in base.items()}
    better["correctness"] = dict(base["correctness"])  # no difference at all in the headline metric
    return {"baseline-with-a-long-name=" + "x" * 30: base, "better": better}


def test_the_headline_metric_is_plotted_first_even_without_a_difference_and_past_any_cap():
    scores = _table_with_many_metrics()
    base = next(iter(scores))
    table = paired_comparison(scores, base, n_boot=200)
    assert plotted_metrics(table, max_plots=3)[:1] != ["correctness"]  # unchanged: it would not be plotted
    assert plotted_metrics(table, ["correctness"], max_plots=3)[0] == "correctness"
    assert len(plotted_metrics(table, ["correctness"], max_plots=3)) == 4  # the headline is not counted in the cap
    figures = comparison_figures(scores, table, base, n_boot=200, max_plots=2)
    assert list(figures)[0] == "ragjudge/plots/correctness.png" and len(figures) == 3


def test_plot_titles_fit_in_their_figure():
    import matplotlib.pyplot as plt

    scores = _table_with_many_metrics()
    base = next(iter(scores))
    table = paired_comparison(scores, base, n_boot=200)
    figures = comparison_figures(scores, table, base, n_boot=200, max_plots=1)
    try:
        for fig in figures.values():
            renderer = fig.canvas.get_renderer()
            box = fig.bbox
            texts = [fig._suptitle] + [ax.title for ax in fig.axes]
            assert all(t is not None and t.get_text() for t in texts)
            for t in texts:
                extent = t.get_window_extent(renderer)
                assert box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1, t.get_text()
                assert box.y0 - 1 <= extent.y0 and extent.y1 <= box.y1 + 1, t.get_text()
            assert "baseline-with-a-long-name=" in fig.axes[1].get_title().replace("\n", "")
    finally:
        for fig in figures.values():
            plt.close(fig)
