"""Multi-turn sessions an app recorded (traces grouped by MLflow's session metadata) judged per session by
``MultiTurnSession`` in ``mlflow.genai.evaluate``, as docs/multiturn.md shows it: a chat app traced by OpenAI
autologging against the fake server, each turn's trace holding the whole conversation so far."""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import mlflow
import pytest
from compliant_model import CompliantModel
from fakellm import FakeLLMServer
from mlflow.entities import AssessmentSource, AssessmentSourceType, Document, SpanType

from mlflow_ragjudge.adapters.scorers import MultiTurnSession
from mlflow_ragjudge.core.errors import MultiTurnContextWarning

SESSIONS = {
    "chat-41": ["Who designed the Eiffel Tower?", "When was it completed?"],
    "chat-42": ["How tall is the Eiffel Tower?", "Was it ever the tallest structure?", "Until when?"],
}
GOLD = {"chat-41": "Gustave Eiffel's company; completed in 1889.", "chat-42": "330 metres; the tallest until 1930."}


@pytest.fixture
def servers(monkeypatch) -> Iterator[tuple[FakeLLMServer, FakeLLMServer]]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-judge")
    app, judge = FakeLLMServer().start(), FakeLLMServer().start()
    app.set_handler(lambda r: f"About '{r.last_user_text}': the tower was finished in 1889 and is 330 m tall.")
    judge.set_handler(CompliantModel("json_schema"))
    yield app, judge
    app.stop()
    judge.stop()
    mlflow.openai.autolog(disable=True)


def _record(app_url: str) -> str:
    """The chat app: each turn an ``@mlflow.trace`` call with the conversation so far, a RETRIEVER span and the
    autologged completion; the session id in the trace's metadata. The gold answer is logged as a session-level
    expectation on each session's first trace, as MLflow's own session judges read it."""
    import openai

    client = openai.OpenAI(base_url=app_url, api_key="sk-app")

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(query: str) -> list[Document]:
        return [Document(page_content="The Eiffel Tower, 330 m tall, was completed in 1889 by Eiffel's company.",
                         metadata={"doc_uri": "eiffel.txt"})]

    @mlflow.trace
    def chat(messages: list[dict[str, Any]], session: str) -> Any:
        mlflow.update_current_trace(metadata={"mlflow.trace.session": session})
        retrieve(messages[-1]["content"])
        return client.chat.completions.create(model="app", messages=messages)

    mlflow.openai.autolog()
    exp_id = mlflow.set_experiment(f"chat-app-{uuid.uuid4().hex[:8]}").experiment_id  # a server is shared
    first: dict[str, str] = {}
    for session, questions in SESSIONS.items():
        messages: list[dict[str, Any]] = []
        for q in questions:
            messages.append({"role": "user", "content": q})
            reply = chat(list(messages), session)
            first.setdefault(session, mlflow.get_last_active_trace_id())
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    mlflow.openai.autolog(disable=True)
    mlflow.flush_trace_async_logging()
    for session, trace_id in first.items():
        mlflow.log_expectation(trace_id=trace_id, name="expected_response", value=GOLD[session],
                               metadata={"mlflow.trace.session": session},
                               source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="annotator"))
    return exp_id


def _session_feedbacks(run_id: str, exp_id: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for t in mlflow.search_traces(run_id=run_id, locations=[exp_id], return_type="list"):
        for a in t.info.assessments:
            if a.name in ("wscore", "lscore", "mscore") and (a.metadata or {}).get(
                    "mlflow.assessment.sourceRunId") == run_id:
                out.setdefault(t.info.trace_metadata["mlflow.trace.session"], {})[a.name] = a
    return out


def test_the_docs_example_judges_every_recorded_session(store, servers):
    app, judge = servers
    exp_id = _record(app.openai_base_url)
    # docs/multiturn.md, as written
    traces = mlflow.search_traces(locations=[exp_id], return_type="list")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = mlflow.genai.evaluate(
            data=traces, scorers=[MultiTurnSession(f"openai:/judge-m?base_url={judge.openai_base_url}")])
    fbs = _session_feedbacks(result.run_id, exp_id)
    assert set(fbs) == set(SESSIONS)  # one judgment per session
    for session, by_name in fbs.items():
        assert set(by_name) == {"wscore", "lscore", "mscore"}
        assert all(a.error is None and a.value is not None for a in by_name.values()), session
        meta = by_name["wscore"].metadata
        assert meta["context_mode"] == "generation"  # the session's own retrieved documents, said so
        assert int(meta["n_exchanges"]) == len(SESSIONS[session])
        assert 1 <= by_name["lscore"].value <= len(SESSIONS[session])
        assert len(json.loads(meta["sigma"])) == by_name["lscore"].value
    assert any(isinstance(w.message, MultiTurnContextWarning) for w in caught)  # not silently without E3
    # MLflow averages the sessions' scores into the run's metrics
    for name in ("wscore", "lscore", "mscore"):
        values = [by_name[name].value for by_name in fbs.values()]
        assert result.metrics[f"{name}/mean"] == pytest.approx(sum(values) / len(values))
    # each exchange was read from its trace: the turn's own question (the last user turn), not the conversation
    composer = [r.prompt_text for r in judge.requests]
    assert any("Until when?" in p for p in composer)
    assert any(GOLD["chat-42"] in p for p in composer)  # the gold answer came from the logged expectation


@pytest.mark.slow
def test_sessions_with_e3_contexts_from_a_retriever(tmp_tracking, servers):
    app, judge = servers
    exp_id = _record(app.openai_base_url)
    traces = mlflow.search_traces(locations=[exp_id], return_type="list")
    queries: list[str] = []

    def retriever(query: str) -> list[str]:
        queries.append(query)
        return ["Eiffel's company built it; completed 1889; 330 m; tallest until the Chrysler Building, 1930."]

    with warnings.catch_warnings():
        warnings.simplefilter("error", MultiTurnContextWarning)  # E3: no warning
        result = mlflow.genai.evaluate(data=traces, scorers=[MultiTurnSession(
            f"openai:/judge-m?base_url={judge.openai_base_url}", retriever=retriever, context_mode="reference")])
    fbs = _session_feedbacks(result.run_id, exp_id)
    assert set(fbs) == set(SESSIONS)
    assert {a.metadata["context_mode"] for by_name in fbs.values() for a in by_name.values()} == {"reference"}
    # E3: each session's target question with its gold answer
    assert sorted(queries) == sorted(f"{SESSIONS[s][0]} {GOLD[s]}" for s in SESSIONS) or all(
        any(SESSIONS[s][0] in q and GOLD[s] in q for q in queries) for s in SESSIONS)
