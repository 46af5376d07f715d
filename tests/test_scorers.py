"""The judges as mlflow.genai scorers, end to end through mlflow.genai.evaluate on a SQLite store."""

from __future__ import annotations

import json

import mlflow
import pytest
from fakellm import Reply

from mlflow_ragjudge.adapters.scorers import Correctness, Faithfulness, LexicalOverlap, RetrievalMetrics


def _verdicts(req):
    text = req.prompt_text  # the whole conversation, so a re-ask is answered for the same row
    if "ans-good" in text:
        return "Feedback: right. [RESULT] 5"
    if "ans-unsure" in text:
        return "Feedback: says it does not know. [RESULT] 0"
    if "ans-broken" in text:
        return "I refuse to grade in the requested format."
    return "Feedback: half right. [RESULT] 3"


DATA = [
    {"inputs": {"question": "q1"}, "outputs": "ans-good", "expectations": {"expected_response": "ref1"}},
    {"inputs": {"question": "q2"}, "outputs": "ans-unsure", "expectations": {"expected_response": "ref2"}},
    {"inputs": {"question": "q3"}, "outputs": "ans-broken", "expectations": {"expected_response": "ref3"}},
    {"inputs": {"question": "q4"}, "outputs": "ans-half", "expectations": {"expected_response": "ref4"}},
]


def test_correctness_scorer_three_states_direct(fake_llm, judge_uri):
    fake_llm.set_handler(_verdicts)
    scorer = Correctness(judge=judge_uri, cache=False)
    good = scorer(inputs={"question": "q1"}, outputs="ans-good", expectations={"expected_response": "r"})
    assert good.value == 5 and good.rationale == "right." and good.metadata["status"] == "scored"
    unsure = scorer(inputs={"question": "q2"}, outputs="ans-unsure", expectations={"expected_response": "r"})
    assert unsure.value is None and unsure.metadata["status"] == "abstained"
    assert unsure.metadata["reason"] == "not_sure" and unsure.metadata["level"] == 0
    broken = scorer(inputs={"question": "q3"}, outputs="ans-broken", expectations={"expected_response": "r"})
    assert broken.value is None and broken.error.error_code == "parse_error"
    assert fake_llm.request_count == 8  # the unparseable reply was re-asked five times (the attempts budget)


def test_correctness_scorer_missing_reference_is_a_failed_feedback(fake_llm, judge_uri):
    fb = Correctness(judge=judge_uri, cache=False)(inputs={"question": "q"}, outputs="a", expectations={})
    assert fb.error.error_code == "invalid_input" and "expected_response" in fb.error.error_message
    assert fake_llm.request_count == 0


def test_correctness_scorer_e3_from_expectations(fake_llm, judge_uri):
    fake_llm.set_handler(lambda r: "Feedback: ok [RESULT] 4")
    fb = Correctness(judge=judge_uri, cache=False)(
        inputs={"question": "q"}, outputs={"answer": "a", "contexts": ["gen-ctx"]},
        expectations={"expected_response": "r", "reference_contexts": ["ref-ctx"]})
    assert fb.value == 4 and fb.metadata["context_mode"] == "reference"
    assert "ref-ctx" in fake_llm.requests[0].last_user_text
    assert "gen-ctx" not in fake_llm.requests[0].last_user_text


def test_genai_evaluate_with_ragjudge_scorers(fake_llm, judge_uri, tmp_tracking):
    fake_llm.set_handler(_verdicts)
    result = mlflow.genai.evaluate(data=DATA, scorers=[Correctness(judge=judge_uri, cache=False), LexicalOverlap()])
    # MLflow's mean over numeric values: the abstention (None) and the failure are not numbers
    assert result.metrics["correctness/mean"] == pytest.approx((5 + 3) / 2)
    traces = mlflow.search_traces(run_id=result.run_id, return_type="list")
    # (MLflow 3.17 occasionally records one extra trace in the run under load: key by the row's output)
    by_output = {}
    for t in traces:
        fbs = {a.name: a for a in t.info.assessments}
        if "correctness" in fbs:
            by_output[str(t.data.response)] = fbs
    assert len(by_output) == 4
    unsure = next(v for k, v in by_output.items() if "ans-unsure" in k)
    assert unsure["correctness"].value is None and unsure["correctness"].metadata["status"] == "abstained"
    broken = next(v for k, v in by_output.items() if "ans-broken" in k)
    assert broken["correctness"].error is not None
    assert "word_recall" in unsure and "rougeL" in unsure


def test_retrieval_scorer_reads_retriever_span_document_ids(tmp_tracking):
    from mlflow.entities import Document, SpanType

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(query: str):
        return [Document(page_content=f"text {i}", metadata={"doc_uri": f"d{i}"}) for i in (3, 1, 7)]

    @mlflow.trace
    def rag(question: str) -> str:
        retrieve(question)
        return "answer"

    rag("q")
    mlflow.flush_trace_async_logging()
    trace = mlflow.get_trace(mlflow.get_last_active_trace_id())
    assert trace is not None
    fbs = RetrievalMetrics()(outputs="answer", expectations={"relevant_doc_ids": ["d1", "d9"]}, trace=trace)
    got = {f.name: f.value for f in fbs}
    assert got["precision_at_3"] == pytest.approx(1 / 3)
    assert got["recall_at_3"] == pytest.approx(1 / 2)
    assert got["mrr"] == pytest.approx(1 / 2)
    assert got["hit_rate_at_1"] == 0.0


def test_retrieval_scorer_without_gold_ids_abstains():
    fbs = RetrievalMetrics()(outputs={"retrieved_doc_ids": ["a"]}, expectations={})
    assert fbs[0].value is None and fbs[0].metadata["status"] == "abstained"


def test_failed_feedback_reason_from_provider(fake_llm, judge_uri):
    fake_llm.set_handler(lambda r: Reply.error(401, "bad key"))
    fb = Correctness(judge=judge_uri, cache=False)(inputs="q", outputs="a", expectations={"expected_response": "r"})
    assert fb.error.error_code == "provider_error" and "401" in fb.error.error_message


def test_feedback_carries_the_judge_identity_ragjudge_monitor_computes(fake_llm, judge):
    """Every Feedback names its judge identity (mlflow_ragjudge.engine.identity): the id is judge_id of the metric's
    result name, the judge URI, the prompts the metric uses at their versions and the score-changing options, so
    `ragjudge monitor` and MLflow's online scoring recognise each other's judgments. Computed here by hand from the
    prompt files and the options given."""
    from mlflow_ragjudge.engine.identity import judge_id
    from mlflow_ragjudge.llm.backends import resolve_backend
    from mlflow_ragjudge.llm.prompts import load_prompt

    uri = resolve_backend(judge).uri  # the judge's URI as the package names it (no credentials)
    versions = {name: f"{p.name}-v{p.version}-{p.language}"
                for name, p in (("statements", load_prompt("statements", "en")),
                                ("faithfulness", load_prompt("faithfulness", "en")))}
    row = {"inputs": {"question": "Where is the Eiffel Tower?"},
           "outputs": {"answer": "The Eiffel Tower is in Paris.", "contexts": ["The Eiffel Tower is in Paris."]}}
    fb = Faithfulness(judge=judge, cache=False)(**row)
    assert fb.name == "faithfulness" and fb.metadata["status"] == "scored", fb.metadata
    assert fb.metadata["ragjudge.judge_id"] == judge_id("faithfulness", uri, versions, {})
    assert fb.metadata["ragjudge.judge"] == uri
    assert json.loads(fb.metadata["ragjudge.prompt_versions"]) == versions
    # a score-changing option is part of the identity, under whatever name the scorer gives its Feedback
    fb3 = Faithfulness(judge=judge, cache=False, name="faith_x3", repeats=3)(**row)
    assert fb3.name == "faith_x3"
    assert fb3.metadata["ragjudge.judge_id"] == judge_id("faithfulness", uri, versions, {"repeats": 3})
    assert fb3.metadata["ragjudge.judge_id"] != fb.metadata["ragjudge.judge_id"]
    # a metric that calls no judge: judge None, one id per result
    lex = LexicalOverlap()(inputs={"question": "q"}, outputs="a b", expectations={"expected_response": "a b c"})
    assert {f.name: f.metadata["ragjudge.judge_id"] for f in lex} == {
        "word_recall": judge_id("word_recall", None), "rougeL": judge_id("rougeL", None)}
    assert {f.metadata["ragjudge.judge"] for f in lex} == {"none"}


def test_online_scorer_form_same_identity_no_secrets(fake_llm, judge):
    """The @scorer form (MLflow's online scoring stores it as text): the same judgment and identity as the class-based
    scorer; a judge URI with credentials or a setting that is not JSON is refused when it is made."""
    from mlflow_ragjudge.adapters.online import online_scorer

    row = {"inputs": {"question": "Where is the Eiffel Tower?"},
           "outputs": {"answer": "The Eiffel Tower is in Paris.", "contexts": ["The Eiffel Tower is in Paris."]}}
    fn = online_scorer("faithfulness", judge)
    assert fn.name == "faithfulness"
    a, b = fn.run(**row), Faithfulness(judge=judge, cache=False)(**row)
    assert (a.value, a.metadata["ragjudge.judge_id"]) == (b.value, b.metadata["ragjudge.judge_id"])
    assert "sk-secret" not in json.dumps(fn.model_dump())
    with pytest.raises(ValueError, match="without credentials"):
        online_scorer("faithfulness", "openai:/m?api_key=sk-secret")
    with pytest.raises(ValueError, match="JSON values; not: retriever"):
        online_scorer("correctness", judge, retriever=lambda q: [])
