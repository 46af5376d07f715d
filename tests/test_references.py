"""Several acceptable answers in ``reference`` (NQ, TriviaQA style): read and checked before any call, shown to
LLM judges as alternatives, best-matched by the lexical and offline metrics, and kept in the per-row table."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mlflow_ragjudge import InputError, evaluate_frame
from mlflow_ragjudge.engine.config import RagJudgeConfig
from mlflow_ragjudge.engine.inputs import read_rows
from mlflow_ragjudge.llm.prompts import reference_text


def _rows(refs):
    df = pd.DataFrame({"question": ["q"] * len(refs), "answer": ["a"] * len(refs), "reference": refs})
    return read_rows(df, RagJudgeConfig(), required_text={"reference"})


def test_a_list_is_every_acceptable_answer():
    one, several, from_csv = _rows(["Paris", ["Paris", "City of Paris"], '["Madison", "James Madison"]'])
    assert one.reference == "Paris" and one.references is None and one.acceptable_answers == ["Paris"]
    assert several.reference == "Paris" and several.acceptable_answers == ["Paris", "City of Paris"]
    assert from_csv.acceptable_answers == ["Madison", "James Madison"]  # JSON text, as lists arrive from CSV
    assert _rows(['[1] is a footnote marker'])[0].acceptable_answers == ["[1] is a footnote marker"]


@pytest.mark.parametrize(
    "cell, message",
    [
        pytest.param([], r"Column 'reference' row 0 is an empty list", id="empty-list"),
        pytest.param(["Paris", 3], r"Column 'reference' row 0 item 1 is a int", id="number-in-list"),
        pytest.param(["Paris", "  "], r"Column 'reference' row 0 item 1 is empty", id="blank-item"),
        pytest.param(5, r"must be text \(str\), or a list of acceptable answers", id="number"),
    ],
)
def test_bad_lists_are_refused_before_any_call(fake_llm, judge, cell, message):
    df = pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": [cell]})
    with pytest.raises(InputError, match=message):
        evaluate_frame(df, judge=judge, metrics=["correctness"])
    assert fake_llm.request_count == 0


def test_reference_text():
    assert reference_text(["Paris"]) == "Paris" and reference_text("Paris") == "Paris"
    text = reference_text(["Paris", "City of Paris"])
    assert text.splitlines() == [text.splitlines()[0], "- Paris", "- City of Paris"]
    assert "Any one of these answers is correct" in text
    assert "いずれも" in reference_text(["パリ", "巴里"], "ja")


@pytest.fixture
def df():
    return pd.DataFrame({
        "question": ["Who was the 4th US president?", "Capital of France?"],
        "answer": ["James Madison was.", "Paris."],
        "reference": [["Madison", "James Madison"], "Paris"],
        "contexts": [["James Madison served from 1809 to 1817.", "Washington was first."], ["Paris is the capital."]],
    })


def test_llm_judges_see_every_answer_as_acceptable(fake_llm, judge, df):
    out = evaluate_frame(df, judge=judge, metrics=["correctness", "context_precision"], cache=False)
    assert out.metrics["correctness/error_rate"] == 0 and out.metrics["context_precision/error_rate"] == 0
    texts = [r.prompt_text for r in fake_llm.requests_for("openai_chat")]
    several = [t for t in texts if "Who was the 4th" in t]
    single = [t for t in texts if "Capital of France" in t]
    assert several and all("Any one of these answers is correct" in t and "- James Madison" in t for t in several)
    assert single and not any("Any one of these answers" in t for t in single)  # one answer: the prompt as ever


@pytest.mark.parametrize("mode", ["json_schema", "json_object", "text"])
def test_llm_context_recall_counts_the_best_answer_in_one_attribution_call(fake_llm, monkeypatch, df, mode):
    from compliant_model import CompliantModel

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    fake_llm.set_handler(CompliantModel(mode))  # servers that enforce a schema, take JSON mode only, or answer text
    judge = f"openai:/m?base_url={fake_llm.openai_base_url}"
    out = evaluate_frame(df.iloc[:1], judge=judge, metrics=["context_recall"], cache=False)
    res = out.results["context_recall"][0]
    assert res.is_scored, res.rationale
    purposes = [c["purpose"] for c in res.calls]
    assert purposes.count("statements") == 2 and purposes.count("context_recall") == 1  # one extraction per answer
    recalls = res.details["answer_recalls"]
    assert set(recalls) == {"1", "2"} and res.value == max(recalls.values())
    rows = res.details["statements"]
    assert {r["answer"] for r in rows} == {1, 2}
    best = int(max(recalls, key=lambda k: (recalls[k], -int(k))))
    assert res.details["matched_reference"] == ["Madison", "James Madison"][best - 1]


@pytest.mark.inprocess_judge
def test_precision_and_recall_still_share_their_combined_call(fake_llm, judge, df):
    out = evaluate_frame(df.iloc[:1], judge=judge, metrics=["context_precision", "context_recall"], cache=False)
    assert out.metrics["context_precision/error_rate"] == 0 and out.metrics["context_recall/error_rate"] == 0
    purposes = [r["purpose"] for r in out.transcripts if not r.get("shared")]
    assert purposes.count("context_verdicts") == 1 and purposes.count("statements") == 2


def test_lexical_and_chunk_rouge_keep_the_best_match(df):
    out = evaluate_frame(df, metrics=["lexical", "retrieval"], bertscore=False)
    assert out.results["word_recall"][0].value == 1.0  # "James Madison" is all there; "Madison" too
    assert out.table["rougeL/matched_reference"].tolist()[0] in ("Madison", "James Madison")
    assert json.loads(out.table["reference"][0]) == ["Madison", "James Madison"]
    assert out.table["reference"][1] == "Paris"
    first_only = evaluate_frame(df.assign(reference=["Madison", "Paris"]), metrics=["lexical", "retrieval"],
                                bertscore=False)
    assert out.metrics["context_rougeL_recall/mean"] >= first_only.metrics["context_rougeL_recall/mean"]
    assert out.metrics["rougeL/mean"] > first_only.metrics["rougeL/mean"]


def test_the_e3_query_carries_every_answer(df):
    seen = []

    def retriever(query):
        seen.append(query)
        return ["passage"]

    evaluate_frame(df, judge="offline:/lexical", metrics=["correctness"], retriever=retriever)
    assert seen[0] == "Who was the 4th US president?\nMadison\nJames Madison"
    assert seen[1] == "Capital of France?\nParis"


def test_scorer_expectations_may_list_answers(fake_llm, judge):
    from mlflow_ragjudge.adapters.scorers import Correctness, LexicalOverlap

    fbs = LexicalOverlap()(inputs="q", outputs="James Madison", expectations={"expected_response": ["Madison",
                                                                                                   "James Madison"]})
    assert {f.name: f.value for f in fbs}["rougeL"] == 1.0
    fb = Correctness(judge=judge)(inputs={"question": "Who?"}, outputs="James Madison",
                                  expectations={"expected_response": ["Madison", "James Madison"]})
    assert fb.error is None
    assert "- James Madison" in fake_llm.last_request.prompt_text
    bad = Correctness(judge=judge)(inputs={"question": "Who?"}, outputs="x", expectations={"expected_response": [1]})
    assert bad.error.error_code == "invalid_input" and "item 0" in bad.error.error_message


def test_cli_reads_a_list_reference_from_csv(tmp_path, tmp_tracking, capsys):
    from mlflow_ragjudge.cli import main

    path = tmp_path / "d.csv"
    pd.DataFrame({"question": ["Who was the 4th US president?"], "answer": ["James Madison"],
                  "reference": ['["Madison", "James Madison"]']}).to_csv(path, index=False)
    assert main(["evaluate", str(path), "--judge", "offline:/lexical", "--metrics", "correctness,lexical"]) == 0
    assert "correctness" in capsys.readouterr().out


def test_mlflow_evaluate_takes_list_targets(tmp_tracking):
    import mlflow

    import mlflow_ragjudge as rj

    data = pd.DataFrame({"question": ["Who was the 4th US president?", "Capital?"],
                         "answer": ["James Madison", "Paris"], "reference": [["Madison", "James Madison"], ["Paris"]]})
    with mlflow.start_run() as run:
        res = mlflow.models.evaluate(data=data, predictions="answer", targets="reference", model_type="rag",
                                     evaluators="ragjudge",
                                     evaluator_config={"judge": "offline:/lexical", "bertscore": False})
    assert res.metrics["correctness/mean"] == 5.0 and res.metrics["rougeL/mean"] == 1.0
    table = rj.load_output(run.info.run_id).table
    assert json.loads(table["reference"][0]) == ["Madison", "James Madison"] and table["reference"][1] == "Paris"
