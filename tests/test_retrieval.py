"""Hand-computed checks of the document-level retrieval metrics (mlflow_ragjudge.metrics.retrieval).

Every expected value below is worked out by hand from the definitions in docs/retrieval.md; the agreement
with trec_eval's own outputs is in test_retrieval_trec_eval.py.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlflow_ragjudge.metrics.retrieval import (
    TREC_EVAL_MEASURES,
    aggregate_queries,
    metric_names,
    rank_run,
    read_qrels,
    read_run,
    score_queries,
    score_query,
    validate_ks,
    validate_retrieval_columns,
    validate_retrieval_row,
)

L2 = math.log2  # the DCG discount of rank r is log2(r + 1)


# ---------------------------------------------------------------------------------------------------------
# Measures, by hand
# ---------------------------------------------------------------------------------------------------------

# retrieved d1..d5, relevant {d2, d4, d9}: relevant at ranks 2 and 4, one relevant never retrieved.
BINARY_IDEAL_3 = 1 + 1 / L2(3) + 1 / L2(4)

HAND_CASES = [
    pytest.param(
        ["d1", "d2", "d3", "d4", "d5"],
        ["d2", "d4", "d9"],
        {},
        {
            "precision_at_1": 0.0,
            "precision_at_3": 1 / 3,
            "precision_at_5": 2 / 5,
            "precision_at_10": 2 / 10,  # k > N: missing ranks count as non-relevant
            "recall_at_1": 0.0,
            "recall_at_3": 1 / 3,
            "recall_at_5": 2 / 3,
            "recall_at_10": 2 / 3,
            "f1_at_1": 0.0,
            "f1_at_3": 1 / 3,
            "f1_at_5": 1 / 2,
            "f1_at_10": 4 / 13,
            "hit_rate_at_1": 0.0,
            "hit_rate_at_3": 1.0,
            "mrr": 1 / 2,
            "map": (1 / 2 + 2 / 4) / 3,
            "ndcg_at_1": 0.0,
            "ndcg_at_3": (1 / L2(3)) / BINARY_IDEAL_3,
            "ndcg_at_5": (1 / L2(3) + 1 / L2(5)) / BINARY_IDEAL_3,
            "ndcg": (1 / L2(3) + 1 / L2(5)) / BINARY_IDEAL_3,
            "num_retrieved": 5,
            "num_relevant": 3,
            "num_relevant_retrieved": 2,
        },
        id="binary-list",
    ),
    pytest.param(
        ["a", "b", "c", "d"],
        {"a": 1, "b": 0, "c": 3, "e": 2},
        {"ks": (1, 4)},
        {
            # gains are the raw grades: a=1 at rank 1, c=3 at rank 3; ideal order 3, 2, 1.
            "ndcg_at_1": 1 / 3,
            "ndcg_at_4": (1 / L2(2) + 3 / L2(4)) / (3 / L2(2) + 2 / L2(3) + 1 / L2(4)),
            "ndcg": (1 / L2(2) + 3 / L2(4)) / (3 / L2(2) + 2 / L2(3) + 1 / L2(4)),
            "precision_at_4": 2 / 4,
            "recall_at_4": 2 / 3,
            "mrr": 1.0,
            "map": (1 / 1 + 2 / 3) / 3,
            "num_relevant": 3,
            "num_relevant_retrieved": 2,
        },
        id="graded-ndcg",
    ),
    pytest.param(
        ["a", "b", "c", "d"],
        {"a": 1, "b": 0, "c": 3, "e": 2},
        {"ks": (1, 4), "relevance_threshold": 2},
        {
            # threshold 2: only c and e are relevant for the binary measures; nDCG ignores the threshold
            # (trec_eval's ndcg / ndcg_cut ignore -l), so it is the same as without a threshold.
            "precision_at_1": 0.0,
            "precision_at_4": 1 / 4,
            "recall_at_4": 1 / 2,
            "hit_rate_at_1": 0.0,
            "mrr": 1 / 3,
            "map": (1 / 3) / 2,
            "ndcg_at_1": 1 / 3,
            "ndcg": (1 / L2(2) + 3 / L2(4)) / (3 / L2(2) + 2 / L2(3) + 1 / L2(4)),
            "num_relevant": 2,
            "num_relevant_retrieved": 1,
        },
        id="graded-threshold-2",
    ),
    pytest.param(
        ["x", "a"],
        {"x": 1},
        {"ks": (1,), "relevance_threshold": 2},
        {
            # nothing reaches the threshold: binary measures 0, but the grade-1 document still has gain 1.
            "precision_at_1": 0.0,
            "mrr": 0.0,
            "map": 0.0,
            "ndcg_at_1": 1.0,
            "ndcg": 1.0,
            "num_relevant": 0,
        },
        id="threshold-above-every-grade",
    ),
    pytest.param(
        ["u", "r"],
        {"u": -1, "r": 1, "n": 0},
        {"ks": (1, 2)},
        {
            # a negative grade (trec_eval: in the pool but unjudged) is never relevant and has gain 0.
            "precision_at_1": 0.0,
            "precision_at_2": 1 / 2,
            "mrr": 1 / 2,
            "ndcg_at_2": (1 / L2(3)) / 1.0,
            "num_relevant": 1,
        },
        id="negative-grade",
    ),
    pytest.param(
        ["u", "n", "r"],
        {"u": -1, "n": 0, "r": 1},
        {"ks": (1, 3), "relevance_threshold": 0},
        {
            # threshold 0 (trec_eval -l0): judged non-relevant documents count as relevant, negatives never.
            "precision_at_1": 0.0,
            "precision_at_3": 2 / 3,
            "mrr": 1 / 2,
            "map": (1 / 2 + 2 / 3) / 2,
            "num_relevant": 2,
            "ndcg": (1 / L2(4)) / 1.0,
        },
        id="threshold-zero",
    ),
    pytest.param(
        ["a", "a", "b", "a"],
        ["b"],
        {"ks": (1, 2, 3)},
        {
            # the repeated "a" is dropped: the ranking is [a, b], so b is at rank 2, not 3.
            "precision_at_2": 1 / 2,
            "precision_at_3": 1 / 3,
            "mrr": 1 / 2,
            "map": 1 / 2,
            "ndcg_at_2": 1 / L2(3),
            "num_retrieved": 2,
            "num_relevant_retrieved": 1,
        },
        id="duplicate-irrelevant",
    ),
    pytest.param(
        ["b", "b", "c"],
        ["b"],
        {"ks": (2, 3)},
        {
            # a relevant document repeated is credited once: P@2 is 1/2, recall never exceeds 1.
            "precision_at_2": 1 / 2,
            "recall_at_3": 1.0,
            "ndcg_at_2": 1.0,
            "map": 1.0,
            "num_retrieved": 2,
            "num_relevant_retrieved": 1,
        },
        id="duplicate-relevant",
    ),
    pytest.param(
        ["a"],
        ["a"],
        {"ks": (10,)},
        {
            "precision_at_10": 1 / 10,
            "recall_at_10": 1.0,
            "f1_at_10": 2 * 0.1 * 1.0 / 1.1,
            "hit_rate_at_10": 1.0,
            "ndcg_at_10": 1.0,
            "ndcg": 1.0,
            "mrr": 1.0,
            "map": 1.0,
        },
        id="k-larger-than-list",
    ),
    pytest.param(
        ["a", "b"],
        ["c", "d", "e"],
        {"ks": (1,)},
        {
            # ideal DCG at a cutoff uses only the first k ideal gains.
            "ndcg_at_1": 0.0,
            "recall_at_1": 0.0,
            "num_relevant": 3,
            "num_relevant_retrieved": 0,
        },
        id="nothing-relevant-retrieved",
    ),
    pytest.param(
        [3, 1, 2],
        {1: 2, 2: 1},
        {"ks": (2,)},
        {
            "precision_at_2": 1 / 2,
            "mrr": 1 / 2,
            "ndcg_at_2": (2 / L2(3)) / (2 / L2(2) + 1 / L2(3)),
            "ndcg": (2 / L2(3) + 1 / L2(4)) / (2 / L2(2) + 1 / L2(3)),
        },
        id="int-ids",
    ),
    pytest.param(
        ["a", "b"],
        {"a": 0.5, "b": 1.5},
        {"ks": (2,), "relevance_threshold": 1.0},
        {
            "precision_at_2": 1 / 2,
            "mrr": 1 / 2,
            "ndcg": (0.5 / L2(2) + 1.5 / L2(3)) / (1.5 / L2(2) + 0.5 / L2(3)),
        },
        id="float-grades",
    ),
]


@pytest.mark.parametrize(("retrieved", "relevant", "options", "expected"), HAND_CASES)
def test_score_query_by_hand(
    retrieved: list[Any], relevant: Any, options: dict[str, Any], expected: dict[str, float]
) -> None:
    scores = score_query(retrieved, relevant, **options)
    for name, value in expected.items():
        assert scores[name] == pytest.approx(value, rel=1e-12, abs=1e-15), name


@pytest.mark.parametrize(
    ("relevant", "expected_num_relevant"),
    [
        pytest.param([], 0, id="empty-list"),
        pytest.param({}, 0, id="empty-dict"),
        pytest.param({"a": 0, "b": 0}, 0, id="only-grade-0"),
    ],
)
def test_query_without_relevant_scores_zero(relevant: Any, expected_num_relevant: int) -> None:
    scores = score_query(["a", "b", "c"], relevant)
    assert scores["num_relevant"] == expected_num_relevant
    assert scores["num_retrieved"] == 3
    assert all(value == 0 for name, value in scores.items() if name != "num_retrieved")


def test_empty_run_scores_zero() -> None:
    scores = score_query([], {"a": 2, "b": 1})
    assert scores["num_retrieved"] == 0
    assert scores["num_relevant"] == 2
    assert all(value == 0 for name, value in scores.items() if name != "num_relevant")


def test_list_and_grade_one_mapping_agree() -> None:
    retrieved = ["d5", "d1", "d7", "d2", "d3"]
    assert score_query(retrieved, ["d1", "d2", "d2"]) == score_query(retrieved, {"d1": 1, "d2": 1})
    assert score_query(retrieved, {"d1", "d2"}) == score_query(retrieved, ("d1", "d2"))


def test_numpy_inputs() -> None:
    retrieved = ["d5", "d1", "d7", "d2"]
    expected = score_query(retrieved, ["d1", "d2"])
    assert score_query(np.array(retrieved), np.array(["d1", "d2"])) == expected
    assert score_query(np.array([5, 1, 7]), np.array([1])) == score_query([5, 1, 7], [1])


def test_metric_names_match_result_keys_in_order() -> None:
    scores = score_query(["a"], ["a"], ks=[5, 1])
    assert list(scores) == metric_names([1, 5])
    assert metric_names(3) == [
        "precision_at_3",
        "recall_at_3",
        "f1_at_3",
        "hit_rate_at_3",
        "ndcg_at_3",
        "mrr",
        "map",
        "ndcg",
        "precision",
        "recall",
        "f1",
        "num_retrieved",
        "num_relevant",
        "num_relevant_retrieved",
    ]
    assert TREC_EVAL_MEASURES["precision_at_{k}"].format(k=5) == "P_5"


def test_set_f_equals_f1_at_num_retrieved() -> None:
    # trec_eval's set_F: 2PR/(P+R) with P = rel_ret/ret, R = rel_ret/rel.
    scores = score_query(["a", "b", "c", "d"], ["a", "c", "z"], ks=4)
    precision, recall = 2 / 4, 2 / 3
    assert scores["f1_at_4"] == pytest.approx(2 * precision * recall / (precision + recall))


# ---------------------------------------------------------------------------------------------------------
# trec_eval's ranking of a scored run
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scored", "expected"),
    [
        pytest.param({"a": 1.0, "b": 2.0, "c": 0.5}, ["b", "a", "c"], id="by-score"),
        pytest.param({"a": 1.0, "b": 2.0, "c": 1.0}, ["b", "c", "a"], id="tie-docno-descending"),
        pytest.param({"D-10": 1, "D-9": 1, "D-100": 1}, ["D-9", "D-100", "D-10"], id="tie-is-text-order"),
        pytest.param({9: 1.0, 10: 1.0, 2: 3.0}, [2, 9, 10], id="int-ids-compared-as-text"),
        pytest.param({"x": -1.0, "y": -2.5}, ["x", "y"], id="negative-scores"),
        pytest.param({}, [], id="empty"),
    ],
)
def test_rank_run(scored: dict[Any, float], expected: list[Any]) -> None:
    assert rank_run(scored) == expected


def test_rank_run_rejects_nan_and_non_numbers() -> None:
    with pytest.raises(ValueError, match=r"score of 'a' is nan"):
        rank_run({"a": float("nan")})
    with pytest.raises(ValueError, match=r"score of 'b' is '0.3'"):
        rank_run({"a": 1.0, "b": "0.3"})  # type: ignore[dict-item]


# ---------------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------------


def test_aggregate_is_the_mean_over_queries() -> None:
    per_query = [
        score_query(["a", "b"], ["a"], ks=1),  # P@1 = 1, mrr 1
        score_query(["a", "b"], ["b"], ks=1),  # P@1 = 0, mrr 1/2
        score_query(["a", "b"], [], ks=1),  # no relevant: zeros
    ]
    means = aggregate_queries(per_query)
    assert means["num_queries"] == 3
    assert means["precision_at_1"] == pytest.approx(1 / 3)
    assert means["mrr"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    assert means["num_retrieved"] == pytest.approx(2.0)

    kept = aggregate_queries(per_query, skip_without_relevant=True)
    assert kept["num_queries"] == 2
    assert kept["mrr"] == pytest.approx((1 + 1 / 2) / 2)


def test_aggregate_accepts_columns_and_handles_nothing() -> None:
    columns = score_queries([["a", "b"], ["b"]], [["b"], ["b"]], ks=1)
    means = aggregate_queries(columns)
    assert means["mrr"] == pytest.approx((1 / 2 + 1) / 2)
    assert means["num_queries"] == 2
    assert aggregate_queries([]) == {"num_queries": 0.0}
    assert aggregate_queries([score_query(["a"], [], ks=1)], skip_without_relevant=True) == {
        "num_queries": 0.0
    }


def test_aggregate_rejects_queries_scored_differently() -> None:
    with pytest.raises(ValueError, match="score every query with the same ks"):
        aggregate_queries([score_query(["a"], ["a"], ks=1), score_query(["a"], ["a"], ks=5)])


# ---------------------------------------------------------------------------------------------------------
# The batch path gives identical numbers
# ---------------------------------------------------------------------------------------------------------


def _random_rows(seed: int, n: int) -> tuple[list[list[Any]], list[Any]]:
    rng = random.Random(seed)
    retrieved_rows: list[list[Any]] = []
    relevant_rows: list[Any] = []
    for i in range(n):
        universe = [f"d{j}" for j in range(rng.randint(1, 40))]
        depth = rng.choice([0, 1, 3, 10, 25, 60])
        retrieved = [rng.choice(universe) for _ in range(depth)]  # repeats on purpose
        kind = i % 4
        judged = rng.sample(universe, rng.randint(0, len(universe)))
        if kind == 0:
            relevant: Any = judged
        elif kind == 1:
            relevant = {doc: rng.choice([-1, 0, 0, 1, 2, 3]) for doc in judged}
        elif kind == 2:
            relevant = {doc: rng.choice([0.0, 0.25, 1.0, 2.5]) for doc in judged}
        else:
            relevant = []
        retrieved_rows.append(retrieved)
        relevant_rows.append(relevant)
    return retrieved_rows, relevant_rows


@pytest.mark.parametrize(
    ("ks", "threshold", "chunk_size"),
    [
        pytest.param((1, 3, 5, 10), 1, 8192, id="defaults"),
        pytest.param((1, 2, 7, 50, 100), 2, 37, id="threshold-2-small-chunks"),
        pytest.param((4,), 0.25, 1, id="float-threshold-chunk-1"),
        pytest.param((1000,), 0, 64, id="k-beyond-every-list-threshold-0"),
    ],
)
def test_score_queries_identical_to_score_query(
    ks: tuple[int, ...], threshold: float, chunk_size: int
) -> None:
    retrieved_rows, relevant_rows = _random_rows(seed=len(ks) + chunk_size, n=400)
    columns = score_queries(
        retrieved_rows, relevant_rows, ks=ks, relevance_threshold=threshold, chunk_size=chunk_size
    )
    assert list(columns) == metric_names(ks)
    for row, (retrieved, relevant) in enumerate(zip(retrieved_rows, relevant_rows, strict=True)):
        expected = score_query(retrieved, relevant, ks=ks, relevance_threshold=threshold)
        got = {name: columns[name][row].item() for name in columns}
        assert got == expected, f"row {row}"  # exact equality, not approx


def test_score_queries_empty_input() -> None:
    columns = score_queries([], [], ks=(1, 5))
    assert list(columns) == metric_names((1, 5))
    assert all(len(values) == 0 for values in columns.values())


def test_score_queries_validates_rows() -> None:
    with pytest.raises(ValueError, match=r"row 1, column 'relevant_doc_ids': got a string"):
        score_queries([["a"], ["b"]], [["a"], "b"])
    with pytest.raises(ValueError, match=r"has 2 rows but 'relevant_doc_ids' has 1"):
        score_queries([["a"], ["b"]], [["a"]])


# ---------------------------------------------------------------------------------------------------------
# Bad input: clear errors naming the row, the column and the fix
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retrieved", "relevant", "message"),
    [
        pytest.param(
            '["d1", "d2"]',
            ["d1"],
            r"row 3, column 'retrieved_doc_ids': got a string .*json\.loads",
            id="retrieved-string",
        ),
        pytest.param(
            None, ["d1"], r"row 3, column 'retrieved_doc_ids': the value is missing", id="retrieved-none"
        ),
        pytest.param(
            {"d1": 0.9},
            ["d1"],
            r"row 3, column 'retrieved_doc_ids': got a dict.*rank_run",
            id="retrieved-dict",
        ),
        pytest.param(
            {"d1"}, ["d1"], r"row 3, column 'retrieved_doc_ids': got a set, which has no order", id="set"
        ),
        pytest.param(
            ["d1", None],
            ["d1"],
            r"row 3, column 'retrieved_doc_ids': item 1 is None.*remove the None",
            id="none-in-retrieved",
        ),
        pytest.param(
            ["d1", 2.5],
            ["d1"],
            r"row 3, column 'retrieved_doc_ids': item 1 is 2\.5 \(float\); document ids must be str or int",
            id="float-id",
        ),
        pytest.param(
            [True],
            [1],
            r"row 3, column 'retrieved_doc_ids': item 0 is True \(bool\)",
            id="bool-id",
        ),
        pytest.param(
            ["d1"], "d1", r"row 3, column 'relevant_doc_ids': got a string 'd1'", id="relevant-string"
        ),
        pytest.param(
            ["d1"],
            float("nan"),
            r"row 3, column 'relevant_doc_ids': the value is missing \(nan\).*empty list \[\]",
            id="relevant-nan",
        ),
        pytest.param(
            ["d1"],
            ["d1", None],
            r"row 3, column 'relevant_doc_ids': item 1 is None",
            id="none-in-relevant",
        ),
        pytest.param(
            ["d1"],
            {"d1": "high"},
            r"row 3, column 'relevant_doc_ids': the grade of 'd1' is 'high' \(str\); grades must be finite",
            id="grade-str",
        ),
        pytest.param(
            ["d1"],
            {"d1": float("inf")},
            r"the grade of 'd1' is inf \(float\)",
            id="grade-inf",
        ),
        pytest.param(["d1"], {"d1": True}, r"the grade of 'd1' is True \(bool\)", id="grade-bool"),
        pytest.param(["d1"], {None: 1}, r"column 'relevant_doc_ids': key 0 is None", id="key-none"),
        pytest.param(
            [1, 2],
            ["1"],
            r"row 3: 'retrieved_doc_ids' and 'relevant_doc_ids' mix str and int document ids.*str\(\)",
            id="mixed-id-types",
        ),
        pytest.param(
            np.zeros((2, 2), dtype=int), [1], r"expected a flat list of document ids", id="2d-array"
        ),
        pytest.param(42, [1], r"expected a list of document ids.*got 42 \(int\)", id="scalar"),
    ],
)
def test_validate_retrieval_row_errors(retrieved: Any, relevant: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_retrieval_row(retrieved, relevant, 3)


def test_validation_messages_use_renamed_columns_and_omit_missing_row() -> None:
    with pytest.raises(ValueError, match=r"^row 7, column 'docs': got a string"):
        validate_retrieval_row("d1", [], 7, retrieved_column="docs", relevant_column="gold")
    with pytest.raises(ValueError, match=r"^column 'relevant_doc_ids': got a string"):
        score_query(["d1"], "d1")


def test_valid_rows_pass() -> None:
    validate_retrieval_row(["a", "b"], {"a": 2, "b": 0.5}, 0)
    validate_retrieval_row((1, 2), {1, 2}, 0)
    validate_retrieval_row(np.array(["a"]), np.array(["a"]), 0)
    validate_retrieval_row(np.array([1, 2]), {np.int64(1): np.float32(1.0)}, 0)
    validate_retrieval_row([], [], 0)


def test_validate_columns_names_the_bad_row() -> None:
    with pytest.raises(ValueError, match=r"^row 2, column 'relevant_doc_ids': item 0 is None"):
        validate_retrieval_columns([["a"], ["b"], ["c"]], [["a"], [], [None]])
    with pytest.raises(ValueError, match=r"'retrieved_doc_ids' has 1 rows but 'relevant_doc_ids' has 2"):
        validate_retrieval_columns([["a"]], [["a"], ["b"]])


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        pytest.param(5, (5,), id="int"),
        pytest.param([10, 1, 5, 1], (1, 5, 10), id="list-sorted-deduplicated"),
        pytest.param((3,), (3,), id="tuple"),
        pytest.param(np.int64(4), (4,), id="numpy-int"),
    ],
)
def test_validate_ks_accepts(k: Any, expected: tuple[int, ...]) -> None:
    assert validate_ks(k) == expected


@pytest.mark.parametrize(
    ("k", "message"),
    [
        pytest.param(0, r"k must be a positive integer \(a rank cutoff of 1 or more\); got 0", id="zero"),
        pytest.param(-3, r"got -3", id="negative"),
        pytest.param([1, 0], r"got 0", id="zero-in-list"),
        pytest.param(2.5, r"got 2\.5 \(float\)", id="float"),
        pytest.param("5", r"got '5' \(str\)", id="string"),
        pytest.param(True, r"got True \(bool\)", id="bool"),
        pytest.param([], r"at least one cutoff", id="empty"),
        pytest.param(None, r"got None \(NoneType\)", id="none"),
    ],
)
def test_validate_ks_rejects(k: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_ks(k)


@pytest.mark.parametrize("threshold", [-1, float("nan"), float("inf"), "1", True])
def test_bad_relevance_threshold(threshold: Any) -> None:
    with pytest.raises(ValueError, match="relevance_threshold must be a finite number >= 0"):
        score_query(["a"], ["a"], relevance_threshold=threshold)


def test_score_query_without_validation_skips_the_checks() -> None:
    # validate=False is for inputs already checked; a good row scores the same either way.
    assert score_query(["a", "b"], ["b"], validate=False) == score_query(["a", "b"], ["b"])


# ---------------------------------------------------------------------------------------------------------
# trec_eval file readers
# ---------------------------------------------------------------------------------------------------------


def test_read_qrels_and_run(tmp_path: Path) -> None:
    qrels_path = tmp_path / "qrels"
    qrels_path.write_text("# a comment\n1 0 a 2\n\n1 0 b 0\n2 0 c 1\n2 0 d 0.5\n3 0 e 0\n")
    assert read_qrels(qrels_path) == {"1": {"a": 2, "b": 0}, "2": {"c": 1, "d": 0.5}, "3": {"e": 0}}

    run_path = tmp_path / "run"
    run_path.write_text("1 Q0 a 1 0.5 run extra fields\n# comment\n1 Q0 b 2 0.5 run\n2 Q0 c 1 -3e-1 run\n")
    run = read_run(run_path)
    assert run == {"1": {"a": 0.5, "b": 0.5}, "2": {"c": -0.3}}
    assert rank_run(run["1"]) == ["b", "a"]


@pytest.mark.parametrize(
    ("reader", "text", "message"),
    [
        pytest.param(read_qrels, "1 0 a\n", r"line 1: a qrels line has 4 fields", id="qrels-short"),
        pytest.param(read_qrels, "1 0 a x\n", r"line 1: the grade 'x' is not a number", id="qrels-grade"),
        pytest.param(
            read_qrels, "1 0 a 1\n1 0 a 0\n", r"line 2: document 'a' is judged twice", id="qrels-dup"
        ),
        pytest.param(read_run, "1 Q0 a 1 0.5\n", r"line 1: a run line has 6 fields", id="run-short"),
        pytest.param(read_run, "1 Q0 a 1 high r\n", r"the score 'high' is not a number", id="run-score"),
        pytest.param(
            read_run,
            "1 Q0 a 1 0.5 r\n1 Q0 a 2 0.4 r\n",
            r"line 2: document 'a' is retrieved twice",
            id="run-dup",
        ),
    ],
)
def test_readers_reject_malformed_files(tmp_path: Path, reader: Any, text: str, message: str) -> None:
    path = tmp_path / "file"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        reader(path)
