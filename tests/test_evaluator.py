"""The correctness judge end to end: mlflow.models.evaluate on a SQLite store, against the fake server."""

from __future__ import annotations

import json
import re

import mlflow
import pandas as pd
import pytest
from fakellm import Reply
from mlflow.tracking import MlflowClient

from mlflow_ragjudge import InputError, evaluate_frame

SECRET = "sk-test-evaluator-SECRET-42"


def _section(prompt: str, name: str) -> str:
    """The value of a prompt section (unfenced: values sit between <data-...> tags)."""
    m = re.search(rf"{name}:\n<(data-[0-9a-f]+) name=\"\w+\">\n(.*?)\n</\1>", prompt, re.S)
    return m.group(2) if m else ""


def verdict_by_response(table: dict[str, object]):
    """A fake-judge handler: the verdict depends on the RESPONSE in the prompt."""

    def handler(req):
        response = _section(req.last_user_text, "RESPONSE")
        for needle, verdict in table.items():
            if needle in response:
                return verdict
        return "Feedback: default [RESULT] 3"

    return handler


@pytest.fixture
def judge_api_key():
    return SECRET


@pytest.fixture
def data():
    return pd.DataFrame(
        {
            "question": ["q-five", "q-zero", "q-fail", "q-two", "q-four"],
            "answer": ["ans-five", "ans-zero", "ans-fail", "ans-two", "ans-four"],
            "reference": ["ref a", "ref b", "ref c", "ref d", "ref e"],
            "contexts": [["ctx a1", "ctx a2"], ["ctx b"], ["ctx c"], ["ctx d"], []],
            "group": ["g1", "g1", "g2", "g2", "g2"],
        }
    )


VERDICTS = {
    "ans-five": "Feedback: complete. [RESULT] 5",
    "ans-zero": "Feedback: it says it is not sure. [RESULT] 0",
    "ans-fail": Reply.error(400, "context length exceeded"),
    "ans-two": "Feedback: mostly wrong. [RESULT] 2",
    "ans-four": "Feedback: incomplete. [RESULT] 4",
}


def _artifact_json(run_id: str, path: str):
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path)
    with open(local, encoding="utf-8") as fh:
        if path.endswith(".jsonl"):
            return [json.loads(line) for line in fh]
        return json.load(fh)


def test_mlflow_evaluate_logs_metrics_table_transcripts_params(fake_llm, judge_uri, data, tmp_tracking):
    fake_llm.set_handler(verdict_by_response(VERDICTS))
    with mlflow.start_run() as run:
        result = mlflow.models.evaluate(
            data=data,
            predictions="answer",
            targets="reference",
            model_type="rag",
            evaluators="ragjudge",
            evaluator_config={"judge": judge_uri, "metrics": ["correctness"], "cache": False},
        )
    run_id = run.info.run_id
    logged = MlflowClient().get_run(run_id).data
    m = logged.metrics
    # mean over the rows scored 1-5: (5 + 2 + 4) / 3; the 0 and the failure are excluded
    assert m["correctness/mean"] == pytest.approx(11 / 3)
    assert m["correctness/abstain_rate"] == pytest.approx(1 / 5)
    assert m["correctness/error_rate"] == pytest.approx(1 / 5)
    assert m["correctness/count"] == 5
    assert m["correctness/mean/g1"] == 5 and m["correctness/mean/g2"] == pytest.approx(3.0)
    assert m["correctness/share_level_0"] == pytest.approx(0.2)
    assert result.metrics["correctness/mean"] == pytest.approx(11 / 3)
    # params: the judge, the context mode, the prompt version, the package version
    p = logged.params
    assert p["ragjudge.judge"] == "openai:/judge-model"
    assert p["ragjudge.context_mode"] == "generation"  # contexts present, no retriever
    assert "correctness-v4-en" in p["ragjudge.prompt_versions"]
    assert p["ragjudge.version"]
    # the per-row table: question first, the headline score second
    table = _artifact_json(run_id, "ragjudge/eval_results_table.json")
    assert table["columns"][:4] == ["question", "correctness/score", "correctness/justification",
                                    "correctness/status"]
    rows = {r[0]: dict(zip(table["columns"], r)) for r in table["data"]}
    assert rows["q-five"]["correctness/score"] == 5
    # an abstention has no score (NaN: nothing averages it as one); the paper's level 0 is in its own column
    assert rows["q-zero"]["correctness/score"] is None and rows["q-zero"]["correctness/status"] == "abstained:not_sure"
    assert rows["q-zero"]["correctness/level"] == 0 and rows["q-five"]["correctness/level"] == 5
    assert rows["q-fail"]["correctness/score"] is None and rows["q-fail"]["correctness/level"] is None
    assert rows["q-fail"]["correctness/status"] == "failed:provider_error"
    assert "context length exceeded" in rows["q-fail"]["correctness/justification"]
    # transcripts: one record per judge call, prompt and raw reply kept, no secret anywhere
    transcripts = _artifact_json(run_id, "ragjudge/judge_transcripts.jsonl")
    assert len(transcripts) == 5
    five = next(t for t in transcripts if "ans-five" in t["messages"][-1]["content"])
    assert five["raw_reply"] == "Feedback: complete. [RESULT] 5" and five["parsed"]["score"] == 5
    assert five["model"] == "judge-model" and five["latency_s"] >= 0 and five["input_tokens"] > 0
    assert ' n="1">\nctx a1\n</passage-' in five["messages"][-1]["content"]
    config = _artifact_json(run_id, "ragjudge/config.json")
    assert config["context_mode"] == "generation" and config["usage"]["calls"] == 5
    artifacts_blob = json.dumps([table, transcripts, config, dict(p)])
    assert SECRET not in artifacts_blob
    # the table is registered as an MLflow evaluation table (visible in the UI's evaluation view)
    tags = MlflowClient().get_run(run_id).data.tags
    assert "ragjudge/eval_results_table.json" in tags.get("mlflow.loggedArtifacts", "")
    # the rows' traces: the abstention's Feedback has no value (the level in its metadata), the failure an error; the
    # mean of the Feedback values is the run's mean
    traces = mlflow.search_traces(run_id=run_id, return_type="list")
    fbs = {t.data.request: next(a for a in t.info.assessments if a.name == "correctness") for t in traces}
    zero = next(fb for req, fb in fbs.items() if "q-zero" in req)
    assert zero.value is None and zero.error is None and zero.metadata["ragjudge.level"] == "0"
    assert zero.metadata["ragjudge.status"] == "abstained" and zero.rationale
    values = [fb.value for fb in fbs.values() if fb.value is not None]
    assert sorted(values) == [2, 4, 5] and sum(values) / len(values) == pytest.approx(m["correctness/mean"])


def test_nested_config_with_evaluator_list_and_model_callable(fake_llm, judge_uri, tmp_tracking):
    fake_llm.set_handler(lambda r: "Feedback: fine [RESULT] 4")
    df = pd.DataFrame({"question": ["a?", "b?"], "reference": ["A", "B"]})
    calls = []

    def rag(inputs: pd.DataFrame):
        calls.append(len(inputs))
        return [f"answer to {q}" for q in inputs["question"]]

    with mlflow.start_run() as run:
        mlflow.models.evaluate(
            model=rag,
            data=df,
            targets="reference",
            model_type="rag",
            evaluators=["ragjudge"],
            evaluator_config={"ragjudge": {"judge": judge_uri, "metrics": ["correctness"], "cache": False}},
        )
    assert calls == [2]
    m = MlflowClient().get_run(run.info.run_id).data.metrics
    assert m["correctness/mean"] == 4 and m["correctness/count"] == 2
    prompts = [r.last_user_text for r in fake_llm.requests]
    assert any("answer to a?" in p for p in prompts)
    assert all("(no context passages)" in p for p in prompts)  # no contexts: mode none


def test_ragjudge_claims_only_rag_model_type():
    from mlflow_ragjudge.adapters.evaluator import RagJudgeEvaluator

    assert RagJudgeEvaluator.can_evaluate(model_type="rag", evaluator_config={})
    for other in ("question-answering", "text", "classifier", "regressor", "retriever", None):
        assert not RagJudgeEvaluator.can_evaluate(model_type=other, evaluator_config={})


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="mlflow.model_evaluator")}
    assert eps.get("ragjudge") == "mlflow_ragjudge.adapters.evaluator:RagJudgeEvaluator"


def test_e3_calls_the_retriever_with_question_and_reference(fake_llm, judge_uri):
    fake_llm.set_handler(lambda r: "Feedback: ok [RESULT] 5")
    queries: list[str] = []

    def retriever(query: str):
        queries.append(query)
        return [{"id": "d9", "text": f"passage for <{query.splitlines()[0]}>"}]

    df = pd.DataFrame({"question": ["What is X?"], "answer": ["X is Y."], "reference": ["X is Y and Z."],
                       "contexts": [["generation ctx"]]})
    out = evaluate_frame(df, judge=judge_uri, metrics=["correctness"], retriever=retriever, cache=False)
    assert queries == ["What is X?\nX is Y and Z."]
    assert out.config["context_mode"] == "reference"
    prompt = fake_llm.requests[0].last_user_text
    assert "passage for <What is X?>" in prompt and "generation ctx" not in prompt


@pytest.mark.parametrize(
    "mode, column, expected",
    [
        pytest.param("generation", "contexts", "ctx-gen", id="E2"),
        pytest.param("reference", "reference_contexts", "ctx-ref", id="E3-column"),
        pytest.param("gold", "gold_documents", "ctx-gold", id="gold"),
        pytest.param("none", None, "(no context passages)", id="none"),
    ],
)
def test_context_modes_route_the_right_passages(fake_llm, judge_uri, mode, column, expected):
    fake_llm.set_handler(lambda r: "Feedback: ok [RESULT] 5")
    df = pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"], "contexts": [["ctx-gen"]],
                       "reference_contexts": [["ctx-ref"]], "gold_documents": [["ctx-gold"]]})
    out = evaluate_frame(df, judge=judge_uri, metrics=["correctness"], context_mode=mode, cache=False)
    context = _section(fake_llm.requests[0].last_user_text, "CONTEXT")
    assert expected in context
    assert out.config["context_mode"] == mode


def test_figure8_union_vs_union_all_e2_inflates_e3_corrects(fake_llm, judge_uri):
    """The paper's Figure 8, scripted: the RAG followed a wrong passage, so with its own (E2) contexts
    the judge is misled; with contexts retrieved by question + reference (E3) it sees the truth."""
    wrong = "UNION keeps duplicate rows, while UNION ALL removes them."
    right = "UNION removes duplicate rows; UNION ALL keeps all rows, including duplicates."

    def judge(req):
        context = _section(req.last_user_text, "CONTEXT")
        if right in context:
            return "Feedback: The response swaps the two operators; the context says the opposite. [RESULT] 1"
        return "Feedback: Consistent with the context. [RESULT] 4"

    fake_llm.set_handler(judge)
    df = pd.DataFrame({
        "question": ["What is the difference between UNION and UNION ALL?"],
        "answer": ["UNION keeps all rows including duplicates, while UNION ALL removes duplicate rows."],
        "reference": ["UNION removes duplicates; UNION ALL keeps them."],
        "contexts": [[wrong]],
        "reference_contexts": [[right]],
    })
    e2 = evaluate_frame(df, judge=judge_uri, metrics=["correctness"], context_mode="generation", cache=False)
    e3 = evaluate_frame(df, judge=judge_uri, metrics=["correctness"], context_mode="reference", cache=False)
    assert e2.metrics["correctness/mean"] == 4
    assert e3.metrics["correctness/mean"] == 1


def test_japanese_prompt_variant_and_japanese_inputs(fake_llm, judge_uri):
    fake_llm.set_handler(lambda r: "Feedback: 正しい。 [RESULT] 5")
    df = pd.DataFrame({"question": ["UNION と UNION ALL の違いは?"], "answer": ["UNION は重複を除きます。"],
                       "reference": ["UNION は重複行を除き、UNION ALL は残します。"]})
    out = evaluate_frame(df, judge=judge_uri, metrics=["correctness"], language="ja", cache=False)
    assert "参照回答" in fake_llm.requests[0].last_user_text
    assert out.table["correctness/justification"][0] == "正しい。"
    assert json.loads(out.params["ragjudge.prompt_versions"]) == {"correctness": "correctness-v3-ja"}


def test_context_budget_truncates_and_records_it(fake_llm, judge_uri):
    fake_llm.set_handler(lambda r: "Feedback: ok [RESULT] 5")
    long = ["x" * 900, "y" * 900, "z" * 900]
    df = pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"], "contexts": [long]})
    out = evaluate_frame(df, judge=judge_uri, metrics=["correctness"], max_context_chars=1500, cache=False)
    info = out.results["correctness"][0].details["context_info"]
    assert info == {"n_given": 3, "n_shown": 2, "truncated": True, "n_dropped": 1, "n_cut": 1,
                    "chars": info["chars"]}
    assert info["chars"] <= 1500
    shown = out.table["correctness/contexts_shown"][0]
    assert shown.startswith("<passage-") and ' n="1">\nxxx' in shown
    assert "[...truncated]" in shown and "zzz" not in shown


def test_anthropic_judge_uses_tool_use_structured_output(fake_llm, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-" + SECRET)
    fake_llm.set_handler(lambda r: Reply(json={"feedback": "largely right, misses a detail", "score": 4}))
    df = pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"]})
    out = evaluate_frame(df, judge=f"anthropic:/claude-test?base_url={fake_llm.anthropic_base_url}",
                         metrics=["correctness"], cache=False)
    body = fake_llm.requests[0].body
    assert body["tool_choice"]["type"] == "tool" and body["tools"][0]["input_schema"]["required"] == [
        "feedback", "score"]
    assert out.metrics["correctness/mean"] == 4
    assert out.table["correctness/justification"][0] == "largely right, misses a detail"
    assert out.results["correctness"][0].details["format"] == "json"


def test_prometheus_judge_behind_openai_compatible_server(fake_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    fake_llm.set_handler(lambda r: "Feedback: The response is correct and complete. [RESULT] 5")
    df = pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"]})
    judge = f"openai:/prometheus-eval/prometheus-7b-v2.0?base_url={fake_llm.openai_base_url}"
    out = evaluate_frame(df, judge=judge, metrics=["correctness"], cache=False)
    # the Prometheus form a Prometheus-family model was trained on: plain text, no response_format
    assert "response_format" not in fake_llm.requests[0].body
    assert "[RESULT] <score>" in fake_llm.requests[0].last_user_text
    assert out.metrics["correctness/mean"] == 5
    assert out.params["ragjudge.judge.structured"] == "none"


def test_other_models_get_json_with_a_schema(fake_llm, judge_uri):
    fake_llm.set_handler(lambda r: {"feedback": "fine", "score": 4})
    df = pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"]})
    out = evaluate_frame(df, judge=judge_uri, metrics=["correctness"], cache=False)
    assert fake_llm.requests[0].body["response_format"]["type"] == "json_schema"
    assert out.metrics["correctness/mean"] == 4 and out.params["ragjudge.judge.structured"] == "json_schema"


def test_cache_makes_a_rerun_free(fake_llm, judge_uri, data):
    fake_llm.set_handler(verdict_by_response(VERDICTS))
    first = evaluate_frame(data, judge=judge_uri, metrics=["correctness"])
    n = fake_llm.request_count
    second = evaluate_frame(data, judge=judge_uri, metrics=["correctness"])
    # only the failed row is asked again: failures are never cached
    assert fake_llm.request_count == n + 1
    assert second.metrics["judge/cache_hits"] == 4
    assert second.metrics["correctness/mean"] == first.metrics["correctness/mean"]


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "frame, config, message",
    [
        pytest.param(pd.DataFrame({"question": ["q"], "answer": ["a"]}), {"metrics": ["correctness"]},
                     r"needs column\(s\) \['reference'\].*col_mapping", id="missing-column"),
        pytest.param(pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"], "contexts": ["one"]}),
                     {"metrics": ["correctness"]}, r"Column 'contexts' row 0 holds a string.*must be a list",
                     id="string-contexts"),
        pytest.param(pd.DataFrame({"question": [], "answer": [], "reference": []}), {},
                     "no rows", id="empty-frame"),
        pytest.param(pd.DataFrame({"question": ["q"], "answer": [3], "reference": ["r"]}),
                     {"metrics": ["correctness"]}, r"Column 'answer' row 0 holds a int", id="wrong-type"),
        pytest.param(pd.DataFrame({"question": ["q"], "answer": [None], "reference": ["r"]}),
                     {"metrics": ["correctness"]}, r"Column 'answer' row 0 is empty", id="null-answer"),
        pytest.param(pd.DataFrame({"q": ["q"], "answer": ["a"], "reference": ["r"]}),
                     {"metrics": ["correctness"], "context_mode": "reference"},
                     r"needs column\(s\) \['question'\]", id="renamed-without-mapping"),
        pytest.param(pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"]}),
                     {"metrics": ["correctness"], "context_mode": "reference"},
                     "retriever=.*reference_contexts", id="e3-without-source"),
    ],
)
def test_bad_input_fails_before_any_judge_call(fake_llm, judge_uri, frame, config, message):
    with pytest.raises(InputError, match=message):
        evaluate_frame(frame, judge=judge_uri, **config)
    assert fake_llm.request_count == 0


def test_col_mapping_renames(fake_llm, judge_uri):
    fake_llm.set_handler(lambda r: "Feedback: ok [RESULT] 5")
    df = pd.DataFrame({"query": ["q"], "response": ["a"], "gold": ["r"]})
    out = evaluate_frame(df, judge=judge_uri, metrics=["correctness"], cache=False,
                         col_mapping={"question": "query", "answer": "response", "reference": "gold"})
    assert out.metrics["correctness/mean"] == 5 and out.table["question"][0] == "q"


def test_retriever_that_raises_is_a_clear_error_before_judge_calls(fake_llm, judge_uri):
    def broken(query):
        raise ConnectionError("index offline")

    df = pd.DataFrame({"question": ["q1", "q2"], "answer": ["a", "b"], "reference": ["r", "s"]})
    with pytest.raises(InputError, match=r"retriever raised on row 0 \(ConnectionError: index offline\)"):
        evaluate_frame(df, judge=judge_uri, metrics=["correctness"], retriever=broken)
    assert fake_llm.request_count == 0


@pytest.mark.parametrize(
    "config, message",
    [
        pytest.param({"judge": "mistral:/large"}, "unknown provider 'mistral'", id="unknown-provider"),
        pytest.param({"judgee": "openai:/x"}, r"Unknown ragjudge config key\(s\) \['judgee'\]. Valid keys: judge",
                     id="unknown-key"),
        pytest.param({"ragjudge": {}}, "nested", id="nested-with-flat"),
        pytest.param({"metrics": ["correctnes"]}, r"Unknown metric\(s\) \['correctnes'\]", id="unknown-metric"),
        pytest.param({"metrics": ["multiturn"], "judge": "offline:/lexical"}, "multiturn_system",
                     id="multiturn-without-system"),
        pytest.param({"context_mode": "E3"}, "context_mode='E3' is not one of", id="bad-mode"),
    ],
)
def test_bad_config(fake_llm, config, message):
    df = pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"]})
    with pytest.raises(ValueError, match=message):
        evaluate_frame(df, {"metrics": ["correctness"], **config} if "metrics" not in config else config)
    assert fake_llm.request_count == 0


def test_no_judge_configured_skips_correctness_by_default_with_reason():
    df = pd.DataFrame({"question": ["q"], "answer": ["a b"], "reference": ["a c"]})
    out = evaluate_frame(df, bertscore=False)
    assert "correctness" in out.skipped and "judge" in out.skipped["correctness"]
    assert "correctness/mean" not in out.metrics and out.metrics["word_recall/mean"] == 0.5


def test_meta_evaluation_against_human_columns(fake_llm, judge_uri, tmp_tracking):
    levels = [5, 4, 1, 2, 0, 3, 5, 1]
    fake_llm.set_handler(lambda r: f"Feedback: f [RESULT] {levels[int(_section(r.last_user_text, 'RESPONSE'))]}")
    df = pd.DataFrame({
        "question": [f"q{i}" for i in range(8)],
        "answer": [str(i) for i in range(8)],
        "reference": [str(i) for i in range(8)],
        "expert": [5, 4, 2, 2, 3, 3, 4, 1],
    })
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=df, predictions="answer", targets="reference", model_type="rag",
                               evaluators="ragjudge",
                               evaluator_config={"judge": judge_uri, "metrics": ["correctness"], "cache": False,
                                                 "human_columns": ["expert"], "n_boot": 200, "seed": 7})
    m = MlflowClient().get_run(run.info.run_id).data.metrics
    from scipy.stats import spearmanr

    kept = [i for i, lv in enumerate(levels) if lv != 0]
    expected = spearmanr([levels[i] for i in kept], [df["expert"][i] for i in kept]).statistic
    assert m["meta/correctness/expert/no_abstentions/spearman"] == pytest.approx(expected)
    assert m["meta/correctness/expert/spearman"] == pytest.approx(spearmanr(levels, df["expert"]).statistic)
    low, high = (m["meta/correctness/expert/no_abstentions/spearman_ci_low"],
                 m["meta/correctness/expert/no_abstentions/spearman_ci_high"])
    assert low <= expected <= high
    fig2 = _artifact_json(run.info.run_id, "ragjudge/meta_evaluation.json")
    cols = fig2["columns"]
    assert cols[:3] == ["metric", "human", "subset"] and "mean" in cols and "spearman" in cols
    rows = [dict(zip(cols, r)) for r in fig2["data"]]
    no_abs = next(r for r in rows if r["subset"] == "no_abstentions")
    assert no_abs["n"] == 7 and no_abs["mean"] == pytest.approx(sum(levels) / 7)


def test_progress_bar_on_request(fake_llm, judge_uri, capsys):
    fake_llm.set_handler(lambda r: "Feedback: ok [RESULT] 5")
    df = pd.DataFrame({"question": ["a", "b", "c"], "answer": ["x", "y", "z"], "reference": ["x", "y", "z"]})
    evaluate_frame(df, judge=judge_uri, metrics=["correctness"], cache=False, progress=True)
    err = capsys.readouterr().err
    assert "correctness" in err and "3/3" in err
    evaluate_frame(df, judge=judge_uri, metrics=["correctness"], cache=False, progress=False)
    assert "correctness" not in capsys.readouterr().err


def test_deprecated_mlflow_evaluate_entry_point_works_too(fake_llm, judge_uri, tmp_tracking):
    fake_llm.set_handler(lambda r: "Feedback: ok [RESULT] 5")
    df = pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"]})
    with mlflow.start_run() as run:
        result = mlflow.evaluate(data=df, predictions="answer", targets="reference", model_type="rag",
                                 evaluators="ragjudge",
                                 evaluator_config={"judge": judge_uri, "metrics": ["correctness"], "cache": False})
    assert result.metrics["correctness/mean"] == 5
    assert MlflowClient().get_run(run.info.run_id).data.metrics["correctness/mean"] == 5


def test_other_model_types_never_run_ragjudge(fake_llm, judge_uri, tmp_tracking):
    df = pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"]})
    with mlflow.start_run() as run:
        # even when named, ragjudge declines another model type, so MLflow finds no evaluator at all
        with pytest.raises(mlflow.exceptions.MlflowException, match="could not be evaluated"):
            mlflow.models.evaluate(data=df, predictions="answer", targets="reference",
                                   model_type="question-answering", evaluators=["ragjudge"],
                                   evaluator_config={"ragjudge": {"judge": judge_uri}})
    metrics = MlflowClient().get_run(run.info.run_id).data.metrics
    assert not any(k.startswith(("correctness/", "ragjudge")) for k in metrics)
    assert fake_llm.request_count == 0


@pytest.mark.inprocess_judge
def test_context_provenance_never_calls_testset_evidence_e3(fake_llm, judge):
    """A test set's quoted evidence is its own mode ('evidence'), never E3; every run and row records where the
    judge's contexts came from."""
    df = pd.DataFrame({"question": ["q1?", "q2?"], "answer": ["a1", "a2"], "reference": ["r1", "r2"],
                       "evidence_contexts": [["e1"], ["e2"]]})
    out = evaluate_frame(df, judge=judge, metrics=["correctness"], cache=False)
    assert out.config["context_mode"] == "evidence" and out.params["ragjudge.context_mode"] == "evidence"
    assert out.config["context_provenance"] == "evidence_from_testset"
    assert out.params["ragjudge.context_provenance"] == "evidence_from_testset"
    assert set(out.table["correctness/context_provenance"]) == {"evidence_from_testset"}
    with_contexts = evaluate_frame(df.assign(contexts=[["c1"], ["c2"]]), judge=judge, metrics=["correctness"],
                                   cache=False)
    assert with_contexts.config["context_provenance"] == "generation_contexts"
    e3 = evaluate_frame(df, judge=judge, metrics=["correctness"], cache=False, retriever=lambda q: ["p"])
    assert e3.config["context_mode"] == "reference"
    assert e3.config["context_provenance"] == "retrieved_with_question_and_reference"
    with pytest.raises(InputError, match="evidence_contexts"):
        evaluate_frame(df.drop(columns=["evidence_contexts"]), judge=judge, metrics=["correctness"],
                       context_mode="evidence")


def test_e2_and_e3_side_by_side_in_one_run(fake_llm, judge):
    """context_mode=['generation', 'reference']: correctness judged once per mode in the same run (the
    paper's central comparison), each logged under its own name, both in the per-row table, meta-evaluated
    each against the human scores; multi-turn and single readers get the E3 contexts."""
    df = pd.DataFrame({"question": ["q1?", "q2?", "q3?"], "answer": ["a1", "a2", "a3"],
                       "reference": ["r1", "r2", "r3"], "contexts": [["gen 1"], ["gen 2"], ["gen 3"]],
                       "expert": [5, 3, 4]})
    seen: list[str] = []
    out = evaluate_frame(df, judge=judge, metrics=["correctness"], cache=False, human_columns=["expert"], n_boot=0,
                         context_mode=["generation", "reference"], retriever=lambda q: seen.append(q) or ["e3 p"])
    assert len(seen) == 3 and all("\n" in q for q in seen)  # E3 queries: question + reference
    for mode in ("generation", "reference"):
        assert f"correctness_{mode}/mean" in out.metrics and f"correctness_{mode}/share_level_5" in out.metrics
        assert out.table[f"correctness_{mode}/status"].notna().all()
        assert {r.details["context_mode"] for r in out.results[f"correctness_{mode}"]} == {mode}
    prov = json.loads(out.table["correctness/context_provenance"][0])
    assert prov == {"generation": "generation_contexts", "reference": "retrieved_with_question_and_reference"}
    assert out.config["context_modes"] == ["generation", "reference"] and out.config["context_mode"] == "reference"
    assert out.params["ragjudge.context_modes"] == "generation,reference"
    assert set(out.meta["metric"]) >= {"correctness_generation", "correctness_reference"}
    chats = [r for r in fake_llm.requests if r.api == "openai_chat"]
    assert len(chats) == 2 * len(df)  # one judgement per row and mode
    assert sum("gen 1" in json.dumps(r.messages) for r in chats) == 1
    est = evaluate_frame(df, judge=judge, metrics=["correctness"], context_mode=["generation", "reference"],
                         retriever=lambda q: ["e3 p"], dry_run=True)
    assert est.metrics["estimate/correctness/calls"] == 2 * len(df)
    gated = evaluate_frame(df, judge=judge, metrics=["correctness"], cache=False, context_mode=["generation", "none"],
                           fail_under={"correctness_none": 0}, gate_rule="point")
    assert gated.gate_passed  # (the gate names a mode's output; three rows give no decisive interval)
    with pytest.raises(ValueError, match="not allowed in a list"):
        evaluate_frame(df, judge=judge, metrics=["correctness"], context_mode=["auto", "reference"])


def test_an_old_testset_file_is_not_taken_for_e3(fake_llm, judge):
    old = pd.DataFrame({"question": ["q?"], "answer": ["a"], "reference": ["r"], "reference_contexts": [["quoted"]],
                        "source_doc_id": ["d1"], "generation_status": ["generated"]})
    with pytest.raises(InputError, match="evidence_contexts"):
        evaluate_frame(old, judge=judge, metrics=["correctness"], cache=False)
    assert fake_llm.request_count == 0
    renamed = old.rename(columns={"reference_contexts": "evidence_contexts"})
    assert evaluate_frame(renamed, judge=judge, metrics=["correctness"], cache=False).config["context_mode"] == \
        "evidence"
