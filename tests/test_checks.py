"""Seed 004's output checks on the user's own data: output contract, refusals, citations (no judge)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mlflow_ragjudge import InputError, evaluate_frame
from mlflow_ragjudge.metrics.output_contract import contract_violation
from mlflow_ragjudge.metrics.refusal import is_refusal

SCHEMA = {
    "type": "object",
    "required": ["answer", "status"],
    "properties": {"answer": {"type": "string"}, "status": {"enum": ["success", "failure"]},
                   "sources": {"type": "array", "items": {"type": "object", "required": ["doc_id"]}}},
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "answer, problem",
    [
        pytest.param('{"answer": "x", "status": "success"}', None, id="valid"),
        pytest.param('{"answer": "x"}', "'status' is a required property", id="missing-field"),
        pytest.param('{"answer": "x", "status": "done"}', "at status: 'done' is not one of", id="bad-enum"),
        pytest.param('{"answer": "x", "status": "success", "extra": 1}', "Additional properties", id="extra-field"),
        pytest.param('{"answer": "x", "status": "success", "sources": [{}]}', "at sources/0:", id="nested"),
        pytest.param('Here you go: {"answer": "x"}', "not valid JSON", id="prose-around-json"),
    ],
)
def test_contract_violation(answer, problem):
    got = contract_violation(answer, SCHEMA)
    assert (got is None) if problem is None else (problem in got), got


def test_refusal_detection():
    assert is_refusal("The documents do not contain the answer.", ["the documents do NOT contain the answer"])
    assert not is_refusal("Paris.", ["the documents do not contain the answer"])
    assert is_refusal('{"answer": "I do not know.", "status": "success"}')  # the contract's answer field
    assert is_refusal("I'm not sure.") and not is_refusal("UNION ALL keeps duplicates.")


@pytest.fixture
def df():
    return pd.DataFrame({
        "question": ["q1", "q2", "q3", "q4"],
        "answer": ['{"answer": "Paris", "status": "success"}', "Not in the documents.",
                   '{"answer": "Lyon", "status": "success"}', "Not in the documents."],
        "answerable": [True, False, "false", 1],
        "citations": [["d1", "d9"], [], ["d2"], ["d3"]],
        "retrieved_doc_ids": [["d1", "d2"], ["d3"], ["d2"], ["d3", "d4"]],
    })


def test_checks_as_metrics_of_a_run(df):
    out = evaluate_frame(df, output_schema=SCHEMA, refusal_phrases="Not in the documents")
    assert out.config["metrics_run"] == ["output_contract", "refusal", "citations"]
    m = out.metrics
    assert m["output_contract/mean"] == 0.5
    assert out.table["output_contract/violation"][1].startswith("not valid JSON")
    # refusal_correct over the two unanswerable rows: row 1 refused, row 2 answered anyway
    assert out.table["refusal_correct/score"].tolist()[1:3] == [1.0, 0.0] and m["refusal_correct/mean"] == 0.5
    # false_refusal over the answerable rows: row 0 answered, row 3 refused
    assert m["false_refusal/mean"] == 0.5
    # citation validity: 1/2, (no citations: abstained), 1, 1 ; utilisation: 1/2, 0, 1, 1/2
    assert out.table["citation_validity/score"].tolist()[0] == 0.5 and m["citation_validity/mean"] == pytest.approx(
        (0.5 + 1 + 1) / 3)
    assert m["context_utilisation/mean"] == pytest.approx((0.5 + 0 + 1 + 0.5) / 4)
    assert json.loads(out.table["citations/invalid"][0]) == ["d9"]


def test_output_contract_runs_only_with_a_schema(df):
    out = evaluate_frame(df)
    assert "output_contract" not in out.config["metrics_run"]
    with pytest.raises(InputError, match="set output_schema"):
        evaluate_frame(df, metrics=["output_contract"])


def test_bad_schema_and_flags_are_refused_before_anything(fake_llm, judge, df):
    with pytest.raises(ValueError, match="output_schema is not a valid JSON Schema"):
        evaluate_frame(df, judge=judge, output_schema={"type": "objekt"})
    with pytest.raises(InputError, match=r"Column 'answerable' row 0 holds 'maybe'"):
        evaluate_frame(df.assign(answerable=["maybe", True, True, True]), judge=judge)
    assert fake_llm.request_count == 0


def test_the_refusal_check_without_phrases_uses_the_whole_answer(df):
    out = evaluate_frame(df.assign(answer=["Paris.", "I don't know.", "Lyon, I think.", "I'm not sure."]),
                         metrics=["refusal"])
    assert out.table["refusal_correct/score"].tolist()[1:3] == [1.0, 0.0]
    assert out.table["false_refusal/score"].tolist()[0] == 0.0 and out.table["false_refusal/score"].tolist()[3] == 1.0


def test_checks_as_scorers():
    from mlflow_ragjudge.adapters.scorers import MetricScorer

    fbs = MetricScorer("citations")(inputs="q", outputs={"answer": "a", "citations": ["d1"],
                                                         "retrieved_doc_ids": ["d1", "d2"]})
    assert {f.name: f.value for f in fbs} == {"citation_validity": 1.0, "context_utilisation": 0.5}
    fbs = MetricScorer("refusal")(inputs="q", outputs="I don't know.", expectations={"answerable": False})
    assert {f.name: f.value for f in fbs}["refusal_correct"] == 1.0
