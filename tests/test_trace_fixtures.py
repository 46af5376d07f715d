"""The recorded traces in tests/data/traces (real MLflow autologging of small RAG apps, see its README.md) load
with the installed MLflow, and hold the shapes the README describes: the root span, where the question and the
answer are, and every RETRIEVER span with its documents."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow.entities import Span, Trace

TRACES = Path(__file__).parent / "data" / "traces"

QUESTION = "When was the Eiffel Tower completed?"
FIRST_QUESTION = "Who built the Eiffel Tower?"
FOLLOW_UP = "When was it completed?"
ANSWER = "The Eiffel Tower was completed in 1889."
FIRST_ANSWER = "Gustave Eiffel's engineering company built it."
DOC_IDS = ["doc-1", "doc-2", "doc-3"]


def _last_message(inputs: Any) -> Any:
    return inputs["messages"][-1]["content"]


def _choice(outputs: Any) -> Any:
    return outputs["choices"][0]["message"]["content"]


@dataclass(frozen=True)
class Shape:
    root: tuple[str, str]
    """(name, span type) of the root span"""
    question: Callable[[Any], Any]
    """root span inputs -> the question"""
    answer: Callable[[Any], Any]
    """root span outputs -> the answer"""
    retrievers: tuple[tuple[str, str], ...] = ()
    """(name, parent's name) of every RETRIEVER span"""
    doc_metadata: frozenset[str] = frozenset()
    """the metadata keys of each retrieved document"""
    asked: str = QUESTION
    answered: str = ANSWER


SHAPES: dict[str, Shape] = {
    "langchain_lcel_str": Shape(("RunnableSequence", "CHAIN"), lambda i: i, lambda o: o,
                                (("EiffelRetriever", "RunnableSequence"),), frozenset({"id", "source"})),
    "langchain_lcel_dict": Shape(("RunnableSequence", "CHAIN"), lambda i: i["question"], lambda o: o,
                                 (("EiffelRetriever", "RunnableSequence"),), frozenset({"id", "source"})),
    "langchain_chat_model": Shape(("ChatOpenAI", "CHAT_MODEL"), _last_message, _choice),
    "llama_index_query_engine": Shape(
        ("RetrieverQueryEngine.query", "CHAIN"), lambda i: i["str_or_query_bundle"], lambda o: o["response"],
        (("VectorIndexRetriever.retrieve", "RetrieverQueryEngine._query"),
         ("VectorIndexRetriever._retrieve", "VectorIndexRetriever.retrieve")), frozenset({"score", "source"})),
    "llama_index_chat_engine": Shape(
        ("CondensePlusContextChatEngine.chat", "CHAIN"), lambda i: i["message"], lambda o: o["response"],
        (("VectorIndexRetriever.retrieve", "CondensePlusContextChatEngine.chat"),
         ("VectorIndexRetriever._retrieve", "VectorIndexRetriever.retrieve")), frozenset({"score", "source"}),
        asked=FOLLOW_UP),
    "openai_chat_app": Shape(("rag_app", "UNKNOWN"), _last_message, _choice, (("retrieve", "rag_app"),),
                             frozenset({"doc_uri", "chunk_id"}), asked=FOLLOW_UP),
    "openai_responses": Shape(("Responses", "CHAT_MODEL"), lambda i: i["input"],
                              lambda o: o["output"][0]["content"][0]["text"]),
    "openai_chat_content_parts": Shape(("Completions", "CHAT_MODEL"), lambda i: _last_message(i)[0]["text"], _choice),
    "anthropic_messages": Shape(("Messages.create", "CHAT_MODEL"), _last_message, lambda o: o["content"][0]["text"]),
    "anthropic_app": Shape(("rag_app", "UNKNOWN"), lambda i: i["question"], lambda o: o, (("retrieve", "rag_app"),),
                           frozenset({"doc_uri", "chunk_id"})),
    "openai_session_turn1": Shape(("chat_turn", "UNKNOWN"), _last_message, lambda o: o, (("retrieve", "chat_turn"),),
                                  frozenset({"doc_uri", "chunk_id"}), asked=FIRST_QUESTION, answered=FIRST_ANSWER),
    "openai_session_turn2": Shape(("chat_turn", "UNKNOWN"), _last_message, lambda o: o, (("retrieve", "chat_turn"),),
                                  frozenset({"doc_uri", "chunk_id"}), asked=FOLLOW_UP),
}


def _load(name: str) -> Trace:
    return Trace.from_json((TRACES / f"{name}.json").read_text())


def test_every_fixture_is_described() -> None:
    assert sorted(p.stem for p in TRACES.glob("*.json")) == sorted(SHAPES)
    readme = (TRACES / "README.md").read_text()
    assert all(f"`{name}.json`" in readme for name in SHAPES)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_fixture_shape(name: str) -> None:
    shape = SHAPES[name]
    trace = _load(name)
    spans = trace.data.spans
    by_id = {span.span_id: span for span in spans}
    [root] = [span for span in spans if span.parent_id is None]
    assert (root.name, root.span_type) == shape.root
    assert shape.question(root.inputs) == shape.asked
    assert shape.answer(root.outputs) == shape.answered
    # trace.data.request / .response are the root span's inputs / outputs as JSON text
    assert json.loads(trace.data.request) == root.inputs
    assert json.loads(trace.data.response) == root.outputs

    retrievers: list[Span] = [span for span in spans if span.span_type == "RETRIEVER"]
    assert sorted((span.name, by_id[span.parent_id].name) for span in retrievers) == sorted(shape.retrievers)
    for span in retrievers:
        docs = span.outputs
        assert [doc["id"] for doc in docs] == DOC_IDS
        assert all(set(doc) == {"page_content", "metadata", "id"} for doc in docs)
        assert all(set(doc["metadata"]) == shape.doc_metadata for doc in docs)
        assert docs[0]["page_content"].startswith("The Eiffel Tower was completed in 1889")


def test_session_traces_carry_the_session_metadata() -> None:
    first, second = _load("openai_session_turn1"), _load("openai_session_turn2")
    for trace in (first, second):
        assert trace.info.trace_metadata["mlflow.trace.session"] == "s1"
        assert trace.info.trace_metadata["mlflow.trace.user"] == "u1"
    assert first.info.request_time < second.info.request_time
    assert "mlflow.trace.session" not in _load("openai_chat_app").info.trace_metadata
