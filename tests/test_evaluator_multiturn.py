"""The multi-turn evaluation through the evaluator: wscore / lscore / mscore logged per run and per group."""

from __future__ import annotations

import json
import re

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from mlflow_ragjudge import InputError, evaluate_frame
from mlflow_ragjudge.core.errors import MultiTurnContextWarning

FACTS = {"part one": "The first half is A.", "part two": "The second half is B."}


def router(req):
    """Judge and agents for a target whose full answer needs two facts (A and B)."""
    text = req.prompt_text
    last = req.last_user_text
    if "Judge how correct the RESPONSE is" in last:
        response = re.search(r"RESPONSE:\n(.*?)\n\n", last, re.S).group(1)
        has_a, has_b = bool(re.search(r"\bA\b", response)), bool(re.search(r"\bB\b", response))
        if has_a and has_b:
            return "Feedback: complete [RESULT] 5"
        return "Feedback: half of it [RESULT] 3" if (has_a or has_b) else "Feedback: wrong [RESULT] 1"
    history_answers = re.findall(r"^A\d+: (.*)$", last, re.M)
    joined = " ".join(history_answers)
    if "next_question" in text:
        return {"explanation": "half missing", "need_more": True, "next_question": "And what is the second half?"}
    return {"explanation": "from the replies", "answer": joined or "unknown"}


def make_system(history_aware: bool):
    calls = []

    def system(query: str, history: list[dict[str, str]]) -> str:
        calls.append((query, len(history)))
        if "second half" in query:
            return FACTS["part two"] if history_aware and history else "I am not sure."
        return "A " + FACTS["part one"]

    system.calls = calls  # type: ignore[attr-defined]
    return system


@pytest.fixture
def judge_handler():
    return router


def df(n=2):
    return pd.DataFrame({"question": ["What are the two halves?"] * n, "reference": ["A and B."] * n,
                         "reference_contexts": [["The two halves are A and B."]] * n,  # E3
                         "group": ["p1", "p2"][:n]})


def test_multiturn_logged_through_mlflow(fake_llm, judge_uri, tmp_tracking):
    system = make_system(history_aware=True)
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=df(), model_type="rag", evaluators="ragjudge",
                               evaluator_config={"judge": judge_uri, "metrics": ["multiturn"], "cache": False,
                                                 "multiturn_system": system, "multiturn_turns": 5})
    m = MlflowClient().get_run(run.info.run_id).data.metrics
    for name in ("wscore", "lscore", "mscore"):
        assert f"{name}/mean" in m and f"{name}/mean/p1" in m and m[f"{name}/error_rate"] == 0
    assert m["mscore/mean"] == 5
    # the system saw the history on its second turn
    assert any(n_hist > 0 for _, n_hist in system.calls)
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id,
                                                artifact_path="ragjudge/multiturn_conversations.jsonl")
    convs = [json.loads(line) for line in open(local)]
    assert len(convs) == 2 and convs[0]["sigma"][-1] == 5 and convs[0]["transcript"]
    params = MlflowClient().get_run(run.info.run_id).data.params
    assert json.loads(params["ragjudge.multiturn"])["n_turns"] == 5


def test_history_aware_beats_single_turn(fake_llm, judge_uri):
    aware = evaluate_frame(df(1), judge=judge_uri, metrics=["multiturn"], cache=False,
                           multiturn_system=make_system(True))
    single = evaluate_frame(df(1), judge=judge_uri, metrics=["multiturn"], cache=False,
                            multiturn_system=make_system(False))
    assert aware.metrics["wscore/mean"] > single.metrics["wscore/mean"]
    assert aware.metrics["mscore/mean"] == 5 and single.metrics["mscore/mean"] < 5


def test_multiturn_needs_a_system_and_a_judge(fake_llm, judge_uri):
    with pytest.raises(InputError, match="multiturn_system"):
        evaluate_frame(df(1), judge=judge_uri, metrics=["multiturn"])
    with pytest.raises(InputError, match="judge"):
        evaluate_frame(df(1), metrics=["multiturn"], multiturn_system=make_system(True))
    assert fake_llm.request_count == 0


def test_system_that_raises_fails_the_row_not_the_run(fake_llm, judge_uri):
    def broken(query, history):
        raise RuntimeError("index down")

    out = evaluate_frame(df(2), judge=judge_uri, metrics=["multiturn"], cache=False, multiturn_system=broken)
    assert out.metrics["wscore/error_rate"] == 1 and "wscore/mean" not in out.metrics
    assert out.results["wscore"][0].reason == "system_error"


def test_multiturn_dry_run(fake_llm, judge_uri):
    out = evaluate_frame(df(2), judge=judge_uri, metrics=["multiturn"], multiturn_system=make_system(True),
                         dry_run=True)
    assert fake_llm.request_count == 0
    assert out.table.set_index("metric").loc["multiturn", "calls"] == 2 * 13  # worst case 3n - 2, n = 5


def _record_session(session_id: str, exchanges: list[tuple[str, str]]):
    @mlflow.trace
    def chat(question: str) -> str:
        mlflow.update_current_trace(metadata={"mlflow.trace.session": session_id})
        return answers[question]

    answers = dict(exchanges)
    for q, _ in exchanges:
        chat(q)
    mlflow.flush_trace_async_logging()
    return mlflow.search_traces(filter_string=f"metadata.`mlflow.trace.session` = '{session_id}'",
                                return_type="list")


def test_session_level_scorer_replays_a_recorded_conversation(fake_llm, judge_uri, tmp_tracking):
    from mlflow_ragjudge.adapters.scorers import MultiTurnSession

    traces = _record_session("s1", [("What are the two halves?", "The first half is A."),
                                    ("And the second half?", "The second half is B.")])
    assert len(traces) == 2
    scorer = MultiTurnSession(judge_uri, n_turns=5, cache=False)
    assert scorer.is_session_level_scorer
    e3 = {"expected_response": "A and B.", "reference_contexts": ["The two halves are A and B."]}
    fbs = {f.name: f for f in scorer(session=traces, expectations=e3)}
    # turn 1 composes "A" only -> 3; turn 2 composes "A ... B" -> 5 and stops: sigma [3, 5]
    assert json.loads(fbs["wscore"].metadata["sigma"]) == [3, 5]
    assert fbs["lscore"].value == 2 and fbs["mscore"].value == 5
    assert fbs["wscore"].value == pytest.approx((5 * 3 + 4 * 5 + 3 * 5 + 2 * 5 + 1 * 5) / 15)
    missing = scorer(session=traces, expectations={})
    assert missing[0].error.error_code == "invalid_input"
    # never silently without E3: context_mode="reference" insists on it (refused before any call); the default judges
    # with what the session has (here no RETRIEVER span: no contexts), warns, and says so in each Feedback
    n = fake_llm.request_count
    no_e3 = MultiTurnSession(judge_uri, cache=False, context_mode="reference")(
        session=traces, expectations={"expected_response": "A and B."})
    assert no_e3[0].error.error_code == "invalid_input" and "E3" in no_e3[0].error.error_message
    assert fake_llm.request_count == n
    with pytest.warns(MultiTurnContextWarning, match="E3"):
        allowed = scorer(session=traces, expectations={"expected_response": "A and B."})
    assert {f.name for f in allowed if f.value is not None} == {"wscore", "lscore", "mscore"}
    assert {f.metadata["context_mode"] for f in allowed} == {"none"}
    assert fbs["wscore"].metadata["context_mode"] == "reference"


def test_session_scorer_in_genai_evaluate(fake_llm, judge_uri, tmp_tracking):
    from mlflow_ragjudge.adapters.scorers import MultiTurnSession

    traces = _record_session("s2", [("What are the two halves?", "The first half is A. The second half is B.")])
    mlflow.log_expectation(trace_id=traces[0].info.trace_id, name="expected_response", value="A and B.")
    traces = mlflow.search_traces(filter_string="metadata.`mlflow.trace.session` = 's2'", return_type="list")
    result = mlflow.genai.evaluate(data=traces, scorers=[MultiTurnSession(judge_uri, cache=False,
                                                                          retriever=lambda q: ["A and B."])])
    # MLflow 3.17 attaches session-level feedback to the session's first trace (no run-level aggregate)
    scored = {a.name: a.value for t in mlflow.search_traces(run_id=result.run_id, return_type="list")
              for a in t.info.assessments if a.name in ("wscore", "lscore", "mscore")}
    assert scored == {"wscore": 5, "lscore": 1, "mscore": 5}


def test_multiturn_never_silently_judges_without_e3(fake_llm, judge_uri):
    """Without a retriever or reference contexts the run is refused before any call; with
    multiturn_require_e3=False it runs with a warning and the context mode recorded."""
    from mlflow_ragjudge.core.errors import MultiTurnContextWarning

    e2 = df(1).drop(columns=["reference_contexts"]).assign(contexts=[["The first half is A."]])
    with pytest.raises(InputError, match="E3"):
        evaluate_frame(e2, judge=judge_uri, metrics=["multiturn"], cache=False, multiturn_system=make_system(True))
    assert fake_llm.request_count == 0
    with pytest.warns(MultiTurnContextWarning, match="E2"):
        out = evaluate_frame(e2, judge=judge_uri, metrics=["multiturn"], cache=False,
                             multiturn_system=make_system(True), multiturn_require_e3=False)
    assert out.config["multiturn"]["context_mode"] == "generation"
    assert out.results["wscore"][0].status.value == "scored"


def test_multiturn_with_repeats_keeps_the_first_draws_conversations(fake_llm, judge_uri):
    """Each draw holds its own conversation with the system; the table and the conversations artifact show the
    first judge's first draw's (its finish reads that draw's state), the scores combine every draw."""
    system = make_system(history_aware=True)
    out = evaluate_frame(df(2), judge=judge_uri, metrics=["multiturn"], cache=False, multiturn_system=system,
                         repeats=2)
    assert out.metrics["mscore/repeats"] == 2 and out.metrics["mscore/mean"] == 5
    assert all(s is not None for s in out.table["multiturn/sigma"])
    assert len(out.artifacts["multiturn_conversations.jsonl"]) == 2
    assert [len(json.loads(d)) for d in out.table["wscore/draws"]] == [2, 2]
    # the system was asked once per row and draw (at least the first turn of each conversation)
    assert sum(1 for _, n_hist in system.calls if n_hist == 0) == 4
