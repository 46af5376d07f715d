"""Claim arithmetic (mlflow_ragjudge.core.claims): our own vectors, and RAGChecker's recorded example outputs.

The RAGChecker files (amazon-science/RAGChecker @ 6091f08c ``examples/``) hold, per query, the claims
extracted from the response and from the reference answer, the four entailment checks
(``answer2response``, ``response2answer``, ``retrieved2response``, ``retrieved2answer``), and the metrics
RAGChecker computed from them. We recompute every metric from the recorded verdicts alone, with no LLM.
"""

from __future__ import annotations

import json
import math

import pytest

from mlflow_ragjudge.core import claims

# --------------------------------------------------------------------------- our vectors (always run)


@pytest.mark.parametrize(
    "verdicts, expected",
    [
        pytest.param([True, True, False, True, False], 0.6, id="seed-002-paris"),  # 3 of 5 (seed 002's example)
        pytest.param([True], 1.0, id="one-supported"),
        pytest.param([False, False], 0.0, id="none-supported"),
        pytest.param([1, 0, 1, 1], 0.75, id="ints"),
        pytest.param([], None, id="no-claims-is-undefined"),
    ],
)
def test_faithfulness(verdicts, expected):
    assert claims.faithfulness(verdicts) == expected


@pytest.mark.parametrize(
    "rels, expected",
    [
        pytest.param([True, False, True], (1 + 2 / 3) / 2, id="ranks-1-3"),
        pytest.param([False, True], 0.5, id="rank-2"),
        pytest.param([True, True, False, False], 1.0, id="all-first"),
        pytest.param([False, False, False, True, True], (1 / 4 + 2 / 5) / 2, id="all-last"),
        pytest.param([False, False], 0.0, id="none-relevant-is-0"),
        pytest.param([1, 0, 0, 1], (1 + 2 / 4) / 2, id="ints"),
        pytest.param([], None, id="no-chunks"),
    ],
)
def test_average_precision(rels, expected):
    got = claims.average_precision(rels)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_average_precision_matches_the_ragas_formula():
    """ragas: Σ_i (sum(v[:i+1]) / (i+1)) · v_i / (sum(v) + 1e-10)."""
    for v in ([1, 0, 1, 1, 0], [0, 1, 0, 0, 1, 1], [1], [0, 0, 0, 1]):
        ragas = sum(sum(v[: i + 1]) / (i + 1) * v[i] for i in range(len(v))) / (sum(v) + 1e-10)
        assert claims.average_precision(v) == pytest.approx(ragas, abs=1e-9)


def test_precision_at_k():
    assert claims.precision_at_k([True, False, True], 1) == 1.0
    assert claims.precision_at_k([True, False, True], 3) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="between 1 and 3"):
        claims.precision_at_k([True, False, True], 4)


def test_context_recall_and_relevance():
    assert claims.context_recall([True, False, True, True]) == 0.75
    assert claims.context_recall([]) is None
    assert claims.context_relevance([1, 3, 3], 4) == 0.5  # repeats count once
    assert claims.context_relevance([], 4) == 0.0
    assert claims.context_relevance([], 0) is None
    # seed 003's Tokyo Tower example: one sentence of two is needed
    assert claims.context_relevance([1], 2) == 0.5
    with pytest.raises(ValueError, match="not between 1 and 4"):
        claims.context_relevance([5], 4)
    with pytest.raises(ValueError):
        claims.context_relevance([True], 4)


def test_bad_flags_are_rejected():
    with pytest.raises(ValueError, match=r"flags\[1\]"):
        claims.fraction([True, "yes"])
    with pytest.raises(ValueError):
        claims.average_precision([2])


def test_cosine_and_mean_cosine():
    assert claims.cosine([1, 0], [1, 0]) == 1.0
    assert claims.cosine([1, 0], [0, 3]) == 0.0
    assert claims.cosine([1, 1], [-1, -1]) == pytest.approx(-1.0)
    assert claims.cosine([0, 0], [1, 0]) == 0.0
    assert claims.mean_cosine([1, 0], [[1, 0], [0, 1], [1, 1]]) == pytest.approx((1 + 0 + math.sqrt(0.5)) / 3)
    assert claims.mean_cosine([1, 0], []) is None
    with pytest.raises(ValueError, match="different lengths"):
        claims.cosine([1, 0], [1, 0, 0])
    with pytest.raises(ValueError, match="non-finite"):
        claims.cosine([float("nan"), 0], [1, 0])


E, N, C = "Entailment", "Neutral", "Contradiction"


def test_ragchecker_metrics_on_a_hand_made_row():
    # 3 response claims, 4 reference claims, 2 passages
    record = {
        "answer2response": [E, N, C],  # response claims checked against the reference
        "response2answer": [E, E, N, N],  # reference claims checked against the response
        "retrieved2response": [[E, N], [N, N], [N, E]],
        "retrieved2answer": [[E, N], [N, N], [N, N], [E, N]],
    }
    m = claims.ragchecker_metrics(record)
    assert m["precision"] == pytest.approx(1 / 3)
    assert m["recall"] == pytest.approx(2 / 4)
    assert m["f1"] == pytest.approx(2 * (1 / 3) * 0.5 / (1 / 3 + 0.5))
    assert m["claim_recall"] == pytest.approx(2 / 4)  # reference claims 1 and 4 are in passage 1
    assert m["context_precision"] == pytest.approx(1 / 2)  # only passage 1 entails a reference claim
    assert m["context_utilization"] == pytest.approx(1 / 2)  # of claims 1 and 4, only 1 is in the response
    assert m["faithfulness"] == pytest.approx(2 / 3)  # response claims 1 and 3 are in a passage
    assert m["hallucination"] == pytest.approx(1 / 3)  # claim 2: in no passage and wrong
    assert m["self_knowledge"] == 0.0
    # claim 3 is wrong and entailed only by passage 2, which entails no reference claim
    assert m["noise_sensitivity_in_relevant"] == 0.0
    assert m["noise_sensitivity_in_irrelevant"] == pytest.approx(1 / 3)


def test_ragchecker_undefined_cases_are_none_not_zero():
    m = claims.ragchecker_metrics(
        {"answer2response": [], "response2answer": [N], "retrieved2response": [], "retrieved2answer": [[N]]}
    )
    assert m["precision"] is None and m["faithfulness"] is None and m["f1"] is None
    assert m["context_utilization"] is None  # no reference claim is recalled
    assert m["claim_recall"] == 0.0


@pytest.mark.parametrize(
    "record, message",
    [
        ({"answer2response": [E]}, "no 'response2answer'"),
        ({"answer2response": [E], "response2answer": [E], "retrieved2response": [[E, N], [N]],
          "retrieved2answer": [[E, N]]}, "ragged"),
        ({"answer2response": [E], "response2answer": [E], "retrieved2response": [[E, N]],
          "retrieved2answer": [[E]]}, "2 passages"),
        ({"answer2response": [E, E], "response2answer": [E], "retrieved2response": [[E]],
          "retrieved2answer": [[E]]}, "1 rows but answer2response 2"),
        ({"answer2response": [1], "response2answer": [E], "retrieved2response": [[E]],
          "retrieved2answer": [[E]]}, "label"),
    ],
    ids=["missing-key", "ragged", "passage-count", "row-count", "not-a-label"],
)
def test_ragchecker_bad_records(record, message):
    with pytest.raises(ValueError, match=message):
        claims.ragchecker_metrics(record)


def test_ragchecker_report_rounds_like_ragchecker():
    rows = [{"faithfulness": 1 / 3, "precision": None}, {"faithfulness": 0.5, "precision": None}]
    report = claims.ragchecker_report(rows)
    assert report["generator"]["faithfulness"] == round((1 / 3 + 0.5) / 2 * 100, 1) == 41.7
    assert report["overall"]["precision"] is None


# --------------------------------------------------------------------------- RAGChecker's recorded outputs


@pytest.fixture
def ragchecker(shared_data):
    folder = shared_data / "ragchecker"
    if not (folder / "checking_outputs.json").is_file():
        pytest.skip(f"RAGChecker reference outputs not found in {folder}")
    outputs = json.loads((folder / "checking_outputs.json").read_text(encoding="utf-8"))
    inputs = json.loads((folder / "checking_inputs.json").read_text(encoding="utf-8"))
    return inputs, outputs


def test_ragchecker_per_row_metrics_from_recorded_verdicts(ragchecker):
    _, outputs = ragchecker
    assert len(outputs["results"]) == 2
    for row in outputs["results"]:
        ours = claims.ragchecker_metrics(row)
        recorded = row["metrics"]
        assert set(recorded) == set(ours)
        for name, value in recorded.items():
            assert ours[name] == pytest.approx(value, abs=1e-12), (row["query_id"], name)


def test_ragchecker_faithfulness_is_the_share_of_claims_some_passage_entails(ragchecker):
    _, outputs = ragchecker
    for row in outputs["results"]:
        supported = [any(v == E for v in per_passage) for per_passage in row["retrieved2response"]]
        assert len(supported) == len(row["response_claims"])
        assert claims.faithfulness(supported) == pytest.approx(row["metrics"]["faithfulness"])
    # query 0: 4 of its 11 response claims are entailed by a retrieved passage
    q0 = outputs["results"][0]
    assert claims.faithfulness([any(v == E for v in r) for r in q0["retrieved2response"]]) == pytest.approx(4 / 11)


def test_ragchecker_overall_report(ragchecker):
    _, outputs = ragchecker
    rows = [claims.ragchecker_metrics(r) for r in outputs["results"]]
    assert claims.ragchecker_report(rows) == outputs["metrics"]


def test_ragchecker_inputs_match_outputs(ragchecker):
    inputs, outputs = ragchecker
    by_id = {r["query_id"]: r for r in inputs["results"]}
    for row in outputs["results"]:
        src = by_id[row["query_id"]]
        assert src["response"] == row["response"] and src["gt_answer"] == row["gt_answer"]
        n_passages = len(src["retrieved_context"])
        assert all(len(v) == n_passages for v in row["retrieved2answer"] + row["retrieved2response"])
