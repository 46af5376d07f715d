"""Retrieval and chunk-level metrics through the evaluator and mlflow.models.evaluate."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from mlflow_ragjudge import InputError, evaluate_frame


@pytest.fixture
def df():
    return pd.DataFrame({
        "question": ["q1", "q2", "q3", "q4"],
        "retrieved_doc_ids": [["a", "b", "c"], ["x", "y"], ["m"], ["p", "q"]],
        "relevant_doc_ids": [["b"], {"y": 2, "x": 1}, ["n"], None],
        "contexts": [["alpha beta"], ["gamma"], ["delta"], ["eps"]],
        "reference": ["alpha", "gamma delta", "zeta", "eps"],
        "group": ["g1", "g1", "g2", "g2"],
    })


def test_retrieval_metrics_logged_with_spec_names(df, tmp_tracking):
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=df, model_type="rag", evaluators="ragjudge",
                               evaluator_config={"metrics": ["retrieval"], "k": [1, 2]})
    m = MlflowClient().get_run(run.info.run_id).data.metrics
    # q4 has no gold ids: skipped and counted, not averaged in as 0
    assert m["retrieval/rows_without_gold_ids"] == 1 and m["retrieval/rows_scored"] == 3
    assert m["precision_at_1/mean"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["recall_at_2/mean"] == pytest.approx((1 + 1 + 0) / 3)
    assert m["hit_rate_at_1/mean"] == pytest.approx(1 / 3)
    assert m["mrr/mean"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert m["map/mean"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert "ndcg_at_2/mean" in m and "f1_at_2/mean" in m
    assert m["mrr/mean/g1"] == pytest.approx(0.75) and m["mrr/mean/g2"] == 0
    # chunk level: ROUGE-L between the contexts and the reference
    assert m["context_rougeL_recall/mean"] == pytest.approx((1 + 0.5 + 0 + 1) / 4)
    assert "context_rougeL_precision/mean" in m and "context_rougeL_f1/mean" in m
    # no judged-metric rates for deterministic metrics
    assert "mrr/abstain_rate" not in m
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id,
                                                artifact_path="ragjudge/eval_results_table.json")
    table = json.load(open(local))
    assert table["columns"][0] == "question" and "precision_at_1/score" in table["columns"]


def test_graded_threshold_changes_binary_measures_not_ndcg(df):
    low = evaluate_frame(df, metrics=["retrieval"], k=[1], relevance_threshold=1)
    high = evaluate_frame(df, metrics=["retrieval"], k=[1], relevance_threshold=2)
    # q2: x (grade 1) at rank 1 counts relevant only at threshold 1
    assert low.results["precision_at_1"][1].value == 1 and high.results["precision_at_1"][1].value == 0
    assert low.results["ndcg_at_1"][1].value == high.results["ndcg_at_1"][1].value


@pytest.mark.parametrize(
    "retrieved, relevant, k, message",
    [
        pytest.param([["a", None]], [["a"]], 1, "retrieved_doc_ids", id="none-in-list"),
        pytest.param([["a", 1.5]], [["a"]], 1, "retrieved_doc_ids", id="float-id"),
        pytest.param([["a"]], [{"a": "high"}], 1, "relevant_doc_ids", id="non-numeric-grade"),
        pytest.param([["a"]], [["a"]], 0, "k", id="k-zero"),
    ],
)
def test_bad_retrieval_input_is_a_clear_error(retrieved, relevant, k, message):
    bad = pd.DataFrame({"question": ["q"], "retrieved_doc_ids": retrieved, "relevant_doc_ids": relevant})
    with pytest.raises(ValueError, match=message):
        evaluate_frame(bad, metrics=["retrieval"], k=k)


def test_string_where_list_expected():
    bad = pd.DataFrame({"question": ["q"], "retrieved_doc_ids": ["a,b"], "relevant_doc_ids": [["a"]]})
    with pytest.raises(InputError, match="retrieved_doc_ids' row 0 holds a string"):
        evaluate_frame(bad, metrics=["retrieval"])


def test_precision_and_recall_without_cutoff_measure_a_thresholded_reranker():
    """A reranker that keeps only documents above a score threshold returns fewer than k: precision@k
    counts the missing ranks as misses, precision over the returned list does not (trec_eval's set_P)."""
    df = pd.DataFrame({
        "retrieved_doc_ids": [["d1"], ["d3", "d4", "x"]],
        "relevant_doc_ids": [["d1", "d2"], ["d3"]],
    })
    out = evaluate_frame(df, metrics=["retrieval"], k=[5])
    assert out.metrics["precision/mean"] == pytest.approx((1 / 1 + 1 / 3) / 2)
    assert out.metrics["precision_at_5/mean"] == pytest.approx((1 / 5 + 1 / 5) / 2)
    assert out.metrics["recall/mean"] == pytest.approx((1 / 2 + 1) / 2)
    assert out.metrics["f1/mean"] == pytest.approx((2 * 1 * 0.5 / 1.5 + 2 * (1 / 3) * 1 / (4 / 3)) / 2)
    assert list(out.table["precision/score"]) == pytest.approx([1.0, 1 / 3])
    with pytest.raises(InputError, match="fail_under"):
        evaluate_frame(df, metrics=["retrieval"], fail_under={"precisionx": 0.5})
    # (two rows give no decisive interval: the gate's name resolution is checked on the point rule)
    gated = evaluate_frame(df, metrics=["retrieval"], fail_under={"precision": 0.5}, gate_rule="point")
    assert gated.gate_passed
