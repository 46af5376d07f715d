"""Reading the question, the answer and the retrieved documents out of what apps log: the traces real autologging
recorded (tests/data/traces, see its README), and a table of the shapes each library writes."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from mlflow.entities import SpanType, Trace

from mlflow_ragjudge.adapters.scorer_inputs import read_scorer_args
from mlflow_ragjudge.adapters.scorers import Correctness, Faithfulness, RetrievalMetrics
from mlflow_ragjudge.adapters.trace_fields import answer_of, question_of, retrieved, root_span

TRACES = Path(__file__).parent / "data" / "traces"
Q = "When was the Eiffel Tower completed?"
A = "The Eiffel Tower was completed in 1889."
IDS = ["doc-1", "doc-2", "doc-3"]
URIS = ["eiffel.txt", "paris.txt", "eiffel.txt"]  # the metadata's doc_uri, MLflow's document id


def _trace(name: str) -> Trace:
    return Trace.from_json((TRACES / f"{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(("name", "question", "ids", "spans"), [
    pytest.param("langchain_lcel_str", Q, IDS, ["EiffelRetriever (3 documents)"], id="langchain-chain-string"),
    pytest.param("langchain_lcel_dict", Q, IDS, ["EiffelRetriever (3 documents)"], id="langchain-chain-dict"),
    pytest.param("langchain_chat_model", Q, None, [], id="langchain-chat-model"),
    # two RETRIEVER spans nested in each other: the outer one's documents, once
    pytest.param("llama_index_query_engine", Q, IDS, ["VectorIndexRetriever.retrieve (3 documents)"],
                 id="llamaindex-query-engine"),
    pytest.param("llama_index_chat_engine", "When was it completed?", IDS,
                 ["VectorIndexRetriever.retrieve (3 documents)"], id="llamaindex-chat-engine"),
    pytest.param("openai_chat_app", "When was it completed?", URIS, ["retrieve (3 documents)"],
                 id="openai-chat-in-a-traced-app"),
    pytest.param("openai_responses", Q, None, [], id="openai-responses-api"),
    pytest.param("openai_chat_content_parts", Q, None, [], id="openai-content-parts"),
    pytest.param("anthropic_messages", Q, None, [], id="anthropic-messages"),
    pytest.param("anthropic_app", Q, URIS, ["retrieve (3 documents)"], id="anthropic-in-a-traced-app"),
    pytest.param("openai_session_turn2", "When was it completed?", URIS, ["retrieve (3 documents)"],
                 id="a-conversations-last-user-turn"),
])
def test_recorded_autolog_traces_are_read(name, question, ids, spans):
    trace = _trace(name)
    root = root_span(trace)
    assert question_of(root.inputs) == question
    assert answer_of(root.outputs) == A
    docs = retrieved(trace)
    assert docs.spans == spans
    assert [d.id for d in docs.documents] == (ids or [])
    if ids:
        assert docs.documents[0].text.startswith("The Eiffel Tower was completed in 1889")
    # the way mlflow.genai.evaluate hands a trace to a scorer: the root span's inputs and outputs, and the trace
    found = read_scorer_args(root.inputs, root.outputs, {"expected_response": "1889"}, trace)
    assert (found.row.question, found.row.answer) == (question, A)
    assert found.sources["question"] == "inputs" and found.sources["answer"] == "outputs"
    assert (found.row.contexts is not None) == bool(ids)


def test_a_scorer_reads_a_recorded_trace_alone(fake_llm, judge):
    """A scorer given nothing but the trace (MLflow's ``trace`` argument) reads all of it from the root span."""
    fb = Faithfulness(judge=judge, cache=False)(trace=_trace("langchain_lcel_dict"))
    assert fb.error is None and fb.value is not None, fb.error
    assert fb.metadata["question_from"] == "the trace's root span inputs"
    assert fb.metadata["answer_from"] == "the trace's root span outputs"
    assert fb.metadata["contexts_from"] == "RETRIEVER spans: EiffelRetriever (3 documents)"
    sent = "\n".join(r.prompt_text for r in fake_llm.requests)
    assert "1889 for the Exposition Universelle" in sent  # the retriever's document reached the judge


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"}, {"role": "user", "content": "the question"}]


@pytest.mark.parametrize(("inputs", "expected"), [
    pytest.param("the question", "the question", id="a-string"),
    pytest.param({"question": "the question", "top_k": 3}, "the question", id="question-key"),
    pytest.param({"q": "the question", "k": 3}, "the question", id="a-functions-one-text-argument"),
    pytest.param({"messages": MESSAGES, "model": "m"}, "the question", id="chat-last-user-turn"),
    pytest.param({"messages": [{"role": "user", "content": [{"type": "text", "text": "the question"},
                                                              {"type": "image_url", "image_url": {"url": "x"}}]}]},
                 "the question", id="content-parts"),
    pytest.param({"input": [{"role": "user", "content": [{"type": "input_text", "text": "the question"}]}],
                  "instructions": "Be brief.", "model": "m"}, "the question", id="responses-api-messages"),
    pytest.param({"input": "the question", "instructions": "Be brief."}, "the question", id="responses-api-text"),
    pytest.param([[{"content": "Be brief.", "type": "system"}, {"content": "the question", "type": "human"}]],
                 "the question", id="langchain-message-batch"),
    pytest.param({"request": {"input": [{"role": "user", "content": "the question"}]}}, "the question",
                 id="responses-agent-request"),
    pytest.param({"str_or_query_bundle": {"query_str": "the question"}}, "the question", id="llamaindex-bundle"),
    pytest.param({"messages": [{"role": "user", "blocks": [{"block_type": "text", "text": "the question"}]}]},
                 "the question", id="llamaindex-blocks"),
    pytest.param({"first": "a", "second": "b"}, None, id="two-texts-neither-named-is-ambiguous"),
    pytest.param({"messages": [{"role": "assistant", "content": "hi"}]}, None, id="no-user-turn"),
    pytest.param(None, None, id="nothing"),
])
def test_question_shapes(inputs, expected):
    assert question_of(inputs) == expected


@pytest.mark.parametrize(("outputs", "expected"), [
    pytest.param("the answer", "the answer", id="a-string"),
    pytest.param({"answer": "the answer", "contexts": ["c"]}, "the answer", id="answer-key"),
    pytest.param({"choices": [{"message": {"role": "assistant", "content": "the answer"}}]}, "the answer",
                 id="chat-completion"),
    pytest.param({"choices": [{"text": "the answer", "index": 0}]}, "the answer", id="completions-api"),
    pytest.param({"output": [{"type": "reasoning", "summary": []},
                             {"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": "the answer"}]}]},
                 "the answer", id="responses-api"),
    pytest.param({"type": "message", "role": "assistant",
                  "content": [{"type": "text", "text": "the "}, {"type": "text", "text": "answer"}]},
                 "the \nanswer", id="anthropic-text-blocks"),
    pytest.param({"messages": [*MESSAGES, {"role": "assistant", "content": "the answer"}]}, "the answer",
                 id="agent-state-last-assistant-turn"),
    pytest.param({"generations": [[{"text": "the answer", "message": {"content": "the answer", "type": "ai"}}]]},
                 "the answer", id="langchain-chat-result"),
    pytest.param({"content": "the answer", "type": "ai", "response_metadata": {}}, "the answer",
                 id="langchain-ai-message"),
    pytest.param({"response": "the answer", "source_nodes": []}, "the answer", id="llamaindex-response"),
    pytest.param({"message": {"role": "assistant", "blocks": [{"block_type": "text", "text": "the answer"}]}},
                 "the answer", id="llamaindex-chat-response"),
    pytest.param(["the answer"], "the answer", id="a-pyfunc-list-of-one"),
    pytest.param({"output": {"answer": "the answer"}}, "the answer", id="nested-answer"),
    pytest.param({"score": 1, "tokens": 3}, None, id="no-text"),
])
def test_answer_shapes(outputs, expected):
    assert answer_of(outputs) == expected


def _retrieval_trace() -> Trace:
    """retrieve (RETRIEVER) > dense (RETRIEVER) nested, then rerank (RETRIEVER) beside it, under a CHAIN."""
    with mlflow.start_span(name="app", span_type=SpanType.CHAIN) as root:
        root.set_inputs({"question": "q"})
        with mlflow.start_span(name="pipeline", span_type=SpanType.CHAIN):
            with mlflow.start_span(name="retrieve", span_type=SpanType.RETRIEVER) as r:
                with mlflow.start_span(name="dense", span_type=SpanType.RETRIEVER) as inner:
                    inner.set_outputs([{"page_content": "inner only", "metadata": {"doc_uri": "x"}}])
                r.set_outputs([{"page_content": "one", "metadata": {"doc_uri": "a"}},
                               {"page_content": "two", "id": "b"},
                               {"page_content": "three", "metadata": {"chunk_id": "c"}}])
        with mlflow.start_span(name="rerank", span_type=SpanType.RETRIEVER) as rr:
            rr.set_outputs([{"page_content": "two", "id": "b"}, {"page_content": "four", "metadata": {"source": "d"}}])
        root.set_outputs("answer")
    mlflow.flush_trace_async_logging()
    return mlflow.get_trace(mlflow.get_last_active_trace_id())


def test_retriever_spans_anywhere_nested_and_several(tmp_tracking):
    trace = _retrieval_trace()
    every = retrieved(trace)
    assert every.spans == ["retrieve (3 documents)", "rerank (2 documents)"]  # "dense" is inside "retrieve"
    assert [d.id for d in every.documents] == ["a", "b", "c", "d"]  # de-duplicated, in the order the spans ran
    assert [d.text for d in retrieved(trace, "last").documents] == ["two", "four"]
    assert [d.text for d in retrieved(trace, "first").documents] == ["one", "two", "three"]
    assert retrieved(trace, ["rerank"]).spans == ["rerank (2 documents)"]
    fbs = RetrievalMetrics(ks=(1,), retriever_spans="last")(outputs="answer", expectations={"relevant_doc_ids": ["d"]},
                                                            trace=trace)
    assert {f.name: f.value for f in fbs}["mrr"] == pytest.approx(0.5)
    missing = Faithfulness(judge="offline:/lexical", retriever_spans=["nope"])(outputs="answer", trace=trace)
    assert missing.error is not None and "['retrieve', 'rerank']" in missing.error.error_message


def test_a_missing_question_says_what_was_looked_for_and_the_form_that_works(fake_llm, judge):
    fb = Correctness(judge=judge, cache=False)(inputs={"first": "a", "second": "b"}, outputs="x",
                                              expectations={"expected_response": "r"})
    msg = fb.error.error_message
    assert fb.error.error_code == "invalid_input" and fake_llm.request_count == 0
    assert "['first', 'second']" in msg and "last user turn of 'messages'" in msg
    assert "data=[{'inputs': {'question': ...}" in msg and "predict_fn" in msg
    fb = Correctness(judge=judge, cache=False)(inputs="q", outputs={"score": 3},
                                              expectations={"expected_response": "r"})
    assert "no answer in the outputs (a dict with keys ['score'])" in fb.error.error_message
    assert "'outputs': 'the answer'" in fb.error.error_message
