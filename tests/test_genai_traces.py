"""``mlflow.genai.evaluate`` over the traces apps already log: small RAG apps traced by MLflow's own autologging
(the real ``openai`` and ``anthropic`` SDKs against the local fake server) and by ``@mlflow.trace``, judged with our
scorers. Every row is read and scored; the evaluation run holds exactly one trace per row (the judge's own requests
are never traced, whatever autologging is on); on a SQLite store and on a real ``mlflow server``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import mlflow
import pytest
from compliant_model import CompliantModel
from fakellm import FakeLLMServer
from mlflow.entities import Document, SpanType

from mlflow_ragjudge.adapters.scorers import (
    ContextPrecision,
    ContextRelevance,
    Correctness,
    Faithfulness,
    LexicalOverlap,
    RetrievalMetrics,
)

ANSWER = "Paris is the capital of France. It lies on the Seine."
DOCS = [("d1", "Paris is the capital and the largest city of France."),
        ("d2", "The Seine flows through Paris before it reaches the sea."),
        ("d3", "Lyon is known for its cuisine.")]
QUESTIONS = ["What is the capital of France?", "Which river flows through Paris?", "Where is the Seine?",
             "Name the French capital.", "What city lies on the Seine?"]
JUDGE_MODEL = "judge-m"


@pytest.fixture
def app_llm() -> Iterator[FakeLLMServer]:
    """The app's own model: answers every request with :data:`ANSWER` (a separate server from the judge's)."""
    server = FakeLLMServer().start()
    server.set_handler(lambda request: ANSWER)
    yield server
    server.stop()


@pytest.fixture
def judge_mode() -> str:
    """How the judge's server takes structured output (CompliantModel's modes); a test may parametrize it."""
    return "json_schema"


@pytest.fixture
def judge_llm(monkeypatch, judge_mode) -> Iterator[FakeLLMServer]:
    """The judge's server: the independent schema-following model, which knows none of our prompts."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-judge")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-judge")
    server = FakeLLMServer().start()
    server.set_handler(CompliantModel(judge_mode))
    yield server
    server.stop()


@pytest.fixture
def autologs() -> Iterator[None]:
    yield
    mlflow.openai.autolog(disable=True)
    mlflow.anthropic.autolog(disable=True)


@mlflow.trace(span_type=SpanType.RETRIEVER)
def retrieve(query: str) -> list[Document]:
    return [Document(page_content=text, metadata={"doc_uri": doc_id}) for doc_id, text in DOCS[:2]]


def _system(docs: list[Document]) -> str:
    return "Answer from these passages:\n" + "\n".join(d.page_content for d in docs)


def _openai_chat_app(base_url: str) -> Callable[..., Any]:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="sk-app")

    @mlflow.trace
    def chat_app(messages: list[dict[str, Any]]) -> Any:
        docs = retrieve(messages[-1]["content"])
        return client.chat.completions.create(model="app-model",
                                              messages=[{"role": "system", "content": _system(docs)}, *messages])

    return chat_app


def _anthropic_app(base_url: str) -> Callable[..., Any]:
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-app")

    @mlflow.trace
    def messages_app(messages: list[dict[str, Any]]) -> Any:
        docs = retrieve(messages[-1]["content"][0]["text"])
        return client.messages.create(model="app-claude", max_tokens=200, system=_system(docs), messages=messages)

    return messages_app


def _app_traces(experiment: str, call: Callable[[str], Any]) -> tuple[str, Any]:
    """Run the app on every question in ``experiment`` (a new one: a server is shared by a module's tests); its
    traces as ``mlflow.search_traces`` gives them."""
    exp_id = mlflow.set_experiment(f"{experiment}-{uuid.uuid4().hex[:8]}").experiment_id
    for q in QUESTIONS:
        call(q)
    mlflow.flush_trace_async_logging()
    traces = mlflow.search_traces(locations=[exp_id], return_type="pandas")
    assert len(traces) == len(QUESTIONS)
    return exp_id, traces


def _judge_uri(server: FakeLLMServer, provider: str = "openai") -> str:
    base = server.openai_base_url if provider == "openai" else server.anthropic_base_url
    return f"{provider}:/{JUDGE_MODEL}?base_url={base}"


def _scorers(judge: str) -> list[Any]:
    return [Faithfulness(judge=judge, cache=False), ContextRelevance(judge=judge, cache=False),
            ContextPrecision(judge=judge, cache=False), Correctness(judge=judge, cache=False), LexicalOverlap(),
            RetrievalMetrics(ks=(1, 2))]


def _with_expectations(traces: Any) -> Any:
    """The reference answers and gold documents, as a team adds them to its traces' rows."""
    traces = traces.copy()
    traces["expectations"] = [{"expected_response": "Paris", "relevant_doc_ids": ["d1"]}] * len(traces)
    return traces


def _all_spans_everywhere(experiment_ids: list[str]) -> list[Any]:
    traces = mlflow.search_traces(locations=experiment_ids, return_type="list", max_results=1000)
    return [s for t in traces for s in t.data.spans]


def _check_every_row_scored(result: Any, experiment_id: str, n: int) -> dict[str, list[Any]]:
    """Every row scored by every scorer (no failure, no missing field); exactly ``n`` traces in the run; returns the
    Feedbacks by name."""
    traces = mlflow.search_traces(run_id=result.run_id, locations=[experiment_id], return_type="list")
    assert len(traces) == n, [t.info.trace_id for t in traces]
    found: dict[str, list[Any]] = {}
    for t in traces:
        for a in t.info.assessments:  # this evaluation's (the traces keep every evaluation's Feedbacks)
            if getattr(a, "feedback", None) is not None and (a.metadata or {}).get(
                    "mlflow.assessment.sourceRunId") == result.run_id:
                found.setdefault(a.name, []).append(a)
    for name in ("faithfulness", "context_relevance", "context_precision", "correctness", "word_recall",
                 "precision_at_1"):
        fbs = found.get(name, [])
        assert len(fbs) == n, (name, len(fbs))
        errors = [a.error.error_message for a in fbs if a.error is not None]
        assert not errors, (name, errors[:2])
        assert all(a.value is not None or a.metadata.get("status") == "abstained" for a in fbs), name
    return found


def _judge_never_traced(*experiment_ids: str) -> None:
    """No span of any trace in the app's experiment or the evaluation runs' (the active one) holds a judge request."""
    active = mlflow.tracking.fluent._get_experiment_id()
    ids = sorted({*experiment_ids, *([active] if active else [])})
    judge_spans = [s for s in _all_spans_everywhere(ids) if JUDGE_MODEL in json.dumps(s.inputs, default=str)]
    assert judge_spans == [], [s.name for s in judge_spans]


@pytest.mark.slow
@pytest.mark.parametrize("rounds", [3])
def test_openai_autologged_app_judged_over_its_traces(store, app_llm, judge_llm, autologs, rounds):
    mlflow.openai.autolog()
    app = _openai_chat_app(app_llm.openai_base_url)
    exp_id, traces = _app_traces("openai-app", lambda q: app([{"role": "user", "content": "Hello."},
                                                             {"role": "assistant", "content": "Hi! Ask away."},
                                                             {"role": "user", "content": q}]))
    data = _with_expectations(traces)
    for _ in range(rounds):  # the judge's requests polluted some runs only: several evaluations, each checked
        result = mlflow.genai.evaluate(data=data, scorers=_scorers(_judge_uri(judge_llm)))
        found = _check_every_row_scored(result, exp_id, len(QUESTIONS))
    fb = found["faithfulness"][0]
    # read from a chat conversation: its last user turn, the completion's text, the RETRIEVER span's documents
    assert fb.metadata["question_from"] == "inputs" and fb.metadata["answer_from"] == "outputs"
    assert fb.metadata["contexts_from"] == "RETRIEVER spans: retrieve (2 documents)"
    prompts = [r.prompt_text for r in judge_llm.requests]
    assert all(any(q in p for p in prompts) for q in QUESTIONS)
    assert not any("Hi! Ask away." in p for p in prompts)  # the question is the last turn, not the conversation
    assert all(f.value == 1.0 for f in found["precision_at_1"])  # d1 first, from the span's doc_uri
    assert result.metrics["faithfulness/mean"] >= 0
    _judge_never_traced(exp_id)


@pytest.mark.slow
def test_anthropic_autologged_app_judged_with_an_anthropic_judge(store, app_llm, judge_llm, autologs):
    mlflow.anthropic.autolog()
    mlflow.openai.autolog()  # on as well: neither SDK's judge requests may be traced
    app = _anthropic_app(app_llm.anthropic_base_url)
    exp_id, traces = _app_traces("anthropic-app", lambda q: app([{"role": "user",
                                                                  "content": [{"type": "text", "text": q}]}]))
    root = json.loads(traces["response"].iloc[0]) if isinstance(traces["response"].iloc[0], str) else None
    assert root is None or "content" in root  # an Anthropic message object, not text
    for judge in (_judge_uri(judge_llm, "anthropic"), _judge_uri(judge_llm)):
        result = mlflow.genai.evaluate(data=_with_expectations(traces), scorers=_scorers(judge))
        found = _check_every_row_scored(result, exp_id, len(QUESTIONS))
        assert all(f.metadata["answer_from"] == "outputs" for f in found["faithfulness"])
    assert judge_llm.requests_for("anthropic_messages") and judge_llm.requests_for("openai_chat")
    _judge_never_traced(exp_id)


@pytest.mark.parametrize("judge_mode", ["json_schema", "json_object", "text"])
def test_plain_traced_functions_positional_and_keyword(store, judge_llm, judge_mode):
    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def search(text: str, k: int = 2) -> list[dict[str, Any]]:
        return [{"page_content": t, "metadata": {"id": i}} for i, t in DOCS[:k]]

    @mlflow.trace(span_type=SpanType.CHAIN)
    def rerank_and_answer(q: str, passages: list[dict[str, Any]]) -> str:
        return ANSWER

    @mlflow.trace
    def rag(q: str, top_k: int = 2) -> dict[str, Any]:  # its one text argument is the question
        docs = search(q, k=top_k)
        return {"answer": rerank_and_answer(q, docs), "latency_ms": 12}

    exp_id = mlflow.set_experiment(f"plain-app-{uuid.uuid4().hex[:8]}").experiment_id
    for i, q in enumerate(QUESTIONS):
        rag(q) if i % 2 else rag(q=q, top_k=2)  # positional and keyword calls
    mlflow.flush_trace_async_logging()
    traces = mlflow.search_traces(locations=[exp_id], return_type="pandas")
    result = mlflow.genai.evaluate(data=_with_expectations(traces), scorers=_scorers(_judge_uri(judge_llm)))
    found = _check_every_row_scored(result, exp_id, len(QUESTIONS))
    assert all(f.value == 1.0 for f in found["precision_at_1"])  # the document ids from the metadata's "id"


@pytest.mark.slow
def test_langchain_shaped_traces(store, judge_llm):
    """The shapes LangChain's autologging records (a chain's dict input, a chat model's message dicts with
    ``type``, an ``AIMessage``-like output, retriever documents with ``page_content`` / ``metadata`` / ``id``), logged
    with MLflow's own span API."""
    exp_id = mlflow.set_experiment(f"langchain-shaped-{uuid.uuid4().hex[:8]}").experiment_id
    for q in QUESTIONS:
        with mlflow.start_span(name="RunnableSequence", span_type=SpanType.CHAIN) as root:
            root.set_inputs({"question": q})
            with mlflow.start_span(name="VectorStoreRetriever", span_type=SpanType.RETRIEVER) as r:
                r.set_inputs({"input": q})
                r.set_outputs([{"page_content": t, "metadata": {"source": f"kb/{i}.md"}, "id": i, "type": "Document"}
                               for i, t in DOCS[:2]])
            with mlflow.start_span(name="ChatOpenAI", span_type=SpanType.CHAT_MODEL) as llm:
                llm.set_inputs([[{"content": "Use the context.", "type": "system"}, {"content": q, "type": "human"}]])
                llm.set_outputs({"generations": [[{"text": ANSWER, "message": {"content": ANSWER, "type": "ai"}}]]})
            root.set_outputs({"content": ANSWER, "type": "ai", "id": "run-1", "response_metadata": {}})
    mlflow.flush_trace_async_logging()
    traces = mlflow.search_traces(locations=[exp_id], return_type="pandas")
    result = mlflow.genai.evaluate(data=_with_expectations(traces), scorers=_scorers(_judge_uri(judge_llm)))
    found = _check_every_row_scored(result, exp_id, len(QUESTIONS))
    assert all(f.value == 1.0 for f in found["precision_at_1"])  # LangChain's document id


DATA = [{"inputs": {"question": q}, "outputs": ANSWER, "expectations": {"expected_response": "Paris"}}
        for q in QUESTIONS]


def _means(result: Any) -> dict[str, float]:
    return {k: v for k, v in result.metrics.items() if k.endswith("/mean")}


@pytest.mark.slow
def test_two_judges_of_one_metric_get_distinct_names_or_are_refused(tmp_tracking, judge_llm):
    """MLflow merges the Feedbacks of scorers that share a name: the offline judge's scorer has its own name by
    default; two LLM judges under one name are refused on every row, with the fix; ``name=`` tells them apart."""
    llm = _judge_uri(judge_llm)
    other = f"openai:/another-judge?base_url={judge_llm.openai_base_url}"
    apart = mlflow.genai.evaluate(data=DATA, scorers=[Correctness(judge=llm, cache=False),
                                                      Correctness(judge="offline:/lexical")])
    assert {"correctness/mean", "correctness_offline/mean"} <= set(_means(apart))
    clash = mlflow.genai.evaluate(data=DATA, scorers=[Correctness(judge=llm, cache=False),
                                                      Correctness(judge=other, cache=False)])
    assert "correctness/mean" not in clash.metrics  # no merged mean of two judges
    traces = mlflow.search_traces(run_id=clash.run_id, return_type="list")
    fbs = [a for t in traces for a in t.info.assessments if a.name == "correctness"]
    assert len(fbs) == 2 * len(DATA) and all(a.error is not None for a in fbs)
    assert {a.error.error_code for a in fbs} == {"duplicate_name"}
    assert "name=" in fbs[0].error.error_message and "another-judge" in fbs[0].error.error_message
    named = mlflow.genai.evaluate(data=DATA, scorers=[Correctness(judge=llm, cache=False, name="correctness_m"),
                                                      Correctness(judge=other, cache=False, name="correctness_o")])
    assert {"correctness_m/mean", "correctness_o/mean"} <= set(_means(named))
    # a scorer called on its own right after an evaluation is not taken for the evaluation's other scorer
    assert Correctness(judge=other, cache=False)(inputs="q", outputs="a", expectations={"expected_response": "a"},
                                                 trace=None).error is None


@pytest.mark.slow
def test_the_judge_is_never_traced_whatever_autologging_is_on(tmp_tracking, judge_llm, autologs):
    """With OpenAI and Anthropic autologging on (a user's notebook, or mlflow.genai.evaluate's own): a scorer called
    directly, a plain-Python evaluation and an mlflow.genai.evaluate send their judge requests, and none of them
    becomes a trace or a span (MLflow's clean-up of an evaluation's extra traces cannot hide one: the first two have
    none)."""
    import pandas as pd

    from mlflow_ragjudge import evaluate_frame

    mlflow.openai.autolog()
    mlflow.anthropic.autolog()
    exp_id = mlflow.set_experiment(f"notebook-{uuid.uuid4().hex[:8]}").experiment_id
    frame = pd.DataFrame({"question": QUESTIONS[:2], "answer": [ANSWER] * 2, "reference": ["Paris"] * 2,
                          "contexts": [[t for _, t in DOCS[:2]]] * 2})
    for provider in ("openai", "anthropic"):
        judge = _judge_uri(judge_llm, provider)
        fb = Faithfulness(judge=judge, cache=False)(inputs={"question": QUESTIONS[0]},
                                                    outputs={"answer": ANSWER, "contexts": [DOCS[0][1]]})
        assert fb.error is None
        out = evaluate_frame(frame, judge=judge, metrics=["correctness", "faithfulness"], cache=False)
        assert out.metrics["correctness/error_rate"] == 0
        mlflow.genai.evaluate(data=DATA[:2], scorers=[Correctness(judge=judge, cache=False)])
    assert judge_llm.requests_for("openai_chat") and judge_llm.requests_for("anthropic_messages")
    mlflow.flush_trace_async_logging()
    _judge_never_traced(exp_id)
