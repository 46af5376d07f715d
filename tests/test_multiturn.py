"""Multi-turn ("continuous response") evaluation: pure scores, the agent loop against the fake server
(through the real openai SDK), failures, QA vs MQA in miniature, the Japanese prompts, estimates."""

from __future__ import annotations

import json
import math
import re

import pytest
from fakellm import Reply

from mlflow_ragjudge.core.types import Status, metric_name_part
from mlflow_ragjudge.llm.client import JudgeClient
from mlflow_ragjudge.llm.prompts import load_prompt
from mlflow_ragjudge.metrics.multiturn import (
    MultiTurnResult,
    MultiTurnRunner,
    format_history,
    lscore,
    mscore,
    summarize,
    wscore,
)

# --------------------------------------------------------------------------- pure scores


def test_paper_worked_example():
    # seed 000 section 3.1: n = 3, sigma' = [1, 5] -> (3*1 + 2*5 + 1*5) / (3+2+1) = 3; lscore 2, mscore 5
    assert wscore([1, 5], 3) == 3
    assert lscore([1, 5]) == 2 and mscore([1, 5]) == 5


@pytest.mark.parametrize(
    ("sigma", "n", "expected"),
    [
        pytest.param([5], 5, 5.0, id="first-answer-perfect"),
        pytest.param([0], 1, 0.0, id="single-not-sure"),
        pytest.param([2], 4, 2.0, id="constant-padding"),
        pytest.param([1, 2, 3], 3, (3 * 1 + 2 * 2 + 1 * 3) / 6, id="full-length-no-padding"),
        pytest.param([3, 5], 5, (5 * 3 + 4 * 5 + 3 * 5 + 2 * 5 + 1 * 5) / 15, id="mqa-script"),
        pytest.param([3, 3, 5], 5, (5 * 3 + 4 * 3 + 3 * 5 + 2 * 5 + 1 * 5) / 15, id="qa-script"),
        pytest.param([4, 0, 5], 4, (4 * 4 + 3 * 0 + 2 * 5 + 1 * 5) / 10, id="zero-inside-counts-as-0"),
        pytest.param([5, 1], 2, (2 * 5 + 1 * 1) / 3, id="later-worse"),
    ],
)
def test_wscore_padding(sigma, n, expected):
    assert wscore(sigma, n) == pytest.approx(expected)
    padded = list(sigma) + [sigma[-1]] * (n - len(sigma))
    assert wscore(padded, n) == pytest.approx(expected)  # padding with the last score is the definition


def test_wscore_earlier_is_better():
    assert wscore([5], 5) > wscore([3, 5], 5) > wscore([3, 3, 5], 5) > wscore([3, 3, 3], 5)


@pytest.mark.parametrize(
    ("sigma", "n", "match"),
    [
        pytest.param([], 3, "empty", id="empty"),
        pytest.param([1, 2, 3, 4], 3, "len\\(sigma\\) <= n", id="longer-than-n"),
        pytest.param([1], 0, "n \\(the maximum", id="n-zero"),
        pytest.param([1], True, "n \\(the maximum", id="n-bool"),
        pytest.param([1, float("nan")], 3, "finite", id="nan"),
        pytest.param(["3"], 3, "finite", id="string-score"),
    ],
)
def test_wscore_validation(sigma, n, match):
    with pytest.raises(ValueError, match=match):
        wscore(sigma, n)


def test_lscore_mscore_empty():
    with pytest.raises(ValueError, match="empty"):
        lscore([])
    with pytest.raises(ValueError, match="empty"):
        mscore([])


def test_format_history():
    text = format_history([{"question": "q one", "answer": "line1\nline2"}, {"question": "q two", "answer": ""}])
    assert text == "Q1: q one\nA1: line1\n    line2\nQ2: q two\nA2: (empty reply)"
    assert format_history([]) == "(no exchanges yet)"
    long = format_history([{"question": "q", "answer": "x" * 500}], max_answer_chars=100)
    assert long.endswith("[...truncated]") and len(long.splitlines()[1]) == len("A1: ") + 100


# --------------------------------------------------------------------------- the fake agents

Q = "What do UNION and UNION ALL do, and how do they differ?"
REF = "Both combine the results of SELECT statements. UNION eliminates duplicates, UNION ALL does not."
E3 = ["UNION and UNION ALL combine the results of two SELECT statements. UNION removes duplicate rows."]
FOLLOW_UP = "Which of the two removes duplicate rows?"
EXPLICIT = "Does UNION eliminate duplicates, and does UNION ALL?"

COMPOSE = "Compose the best answer to the TARGET QUESTION"
DECIDE = "Decide whether another question to the QA system is needed"
REWRITE = "Rewrite the CURRENT ANSWER into the final answer"
JUDGE = "Judge how correct the RESPONSE is"


def first_user(req) -> str:
    return next(m["content"] for m in req.messages if m["role"] == "user")


def history_of(prompt: str) -> tuple[list[str], list[str]]:
    return re.findall(r"^Q\d+: (.*)$", prompt, re.M), re.findall(r"^A\d+: (.*)$", prompt, re.M)


def judged_response(prompt: str) -> str:
    return prompt.split("RESPONSE:\n", 1)[1].split("\n\nGive your feedback first", 1)[0]


def grade_union(resp: str) -> int:
    r = resp.lower()
    if "not sure" in r and "combine" not in r:
        return 0
    return 5 if "combine" in r and "eliminates duplicates" in r else 3 if "combine" in r else 1


def compose_join(prompt: str) -> str:
    """The composer keeps every reply that says something (drops 'not sure' replies)."""
    _, answers = history_of(prompt)
    return " ".join(a for a in answers if "not sure" not in a.lower()) or "Not known."


def decide_union(prompt: str) -> dict:
    questions, _ = history_of(prompt)
    nxt = {1: FOLLOW_UP, 2: EXPLICIT}.get(len(questions))
    return {"explanation": "the duplicate handling is missing", "need_more": nxt is not None,
            "next_question": nxt or ""}


def make_router(grade=grade_union, decide=decide_union, compose=compose_join, rewrite=None):
    def route(req):
        text = first_user(req)
        if COMPOSE in text:
            return {"explanation": "from the replies", "answer": compose(text)}
        if DECIDE in text:
            return decide(text)
        if REWRITE in text:
            tentative = text.split("CURRENT ANSWER composed from the conversation:\n", 1)[1].split("\n\n")[0]
            return {"explanation": "trimmed", "answer": rewrite(tentative) if rewrite else tentative}
        if JUDGE in text:
            score = grade(judged_response(text))
            return f"Feedback: graded {score} against the reference. [RESULT] {score}"
        return Reply.error(400, f"unexpected prompt: {text[:80]}")

    return route


def base_system(query: str, history: list[dict[str, str]]) -> str:
    """A small RAG stand-in: answers the target question partly; a follow-up that says 'the two' can
    only be resolved with the history."""
    if query == Q:
        return "They combine the results of SELECT statements."
    if query == FOLLOW_UP:
        if any("SELECT" in ex["answer"] or "UNION" in ex["question"] for ex in history):
            return "UNION eliminates duplicates; UNION ALL keeps them."
        return "I am not sure which statements you mean."
    if query == EXPLICIT:
        return "Yes: UNION eliminates duplicates, UNION ALL does not."
    return "I am not sure."


class Recorder:
    """Wraps a system and records what it was called with."""

    def __init__(self, fn, *, history_aware=True):
        self.fn, self.history_aware, self.calls = fn, history_aware, []

    def __call__(self, query, history):
        self.calls.append((query, [dict(h) for h in history]))
        return self.fn(query, history if self.history_aware else [])


@pytest.fixture
def make_client(fake_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-multiturn-test")

    def make(router, structured: str | None = None) -> JudgeClient:
        fake_llm.set_handler(router)
        uri = f"openai:/judge-model?base_url={fake_llm.openai_base_url}"
        if structured:
            uri += f"&structured={structured}"
        return JudgeClient(uri, cache=False)

    return make


def steps(res: MultiTurnResult) -> list[str]:
    return [s["step"] for s in res.transcript]


# --------------------------------------------------------------------------- the loop


def test_system_improves_over_turns(make_client, fake_llm):
    runner = MultiTurnRunner(make_client(make_router()), n_turns=5)
    system = Recorder(base_system)
    res = runner.run(system, Q, REF, judge_contexts=E3)
    assert res.status is Status.SCORED and res.stop == "score_5"
    assert res.sigma == [3, 5]
    assert res.lscore == 2 and res.mscore == 5
    assert res.wscore == pytest.approx((5 * 3 + 4 * 5 + 3 * 5 + 2 * 5 + 1 * 5) / 15)
    assert steps(res) == ["ask", "compose", "judge", "decide", "ask", "compose", "judge"]
    assert [s["turn"] for s in res.transcript] == [1, 1, 1, 1, 2, 2, 2]
    # the system saw the target question first, then the generated follow-up with the history
    assert system.calls[0] == (Q, [])
    assert system.calls[1] == (FOLLOW_UP, [{"question": Q, "answer": "They combine the results of SELECT statements."}])
    assert res.history[1]["answer"] == "UNION eliminates duplicates; UNION ALL keeps them."
    assert res.final_answer == ("They combine the results of SELECT statements. "
                                "UNION eliminates duplicates; UNION ALL keeps them.")
    # every agent's prompt and output is in the transcript; the judge saw the E3 contexts and the target Q
    judge_steps = [s for s in res.transcript if s["step"] == "judge"]
    assert [s["output"]["score"] for s in judge_steps] == [3, 5]
    judge_prompt = judge_steps[0]["calls"][0]["messages"][-1]["content"]
    assert E3[0] in judge_prompt and Q in judge_prompt and REF in judge_prompt
    decide = next(s for s in res.transcript if s["step"] == "decide")
    assert decide["output"] == {"explanation": "the duplicate handling is missing", "need_more": True,
                                "next_question": FOLLOW_UP}
    decide_prompt = decide["calls"][0]["messages"][-1]["content"]
    assert "graded 3 against the reference" in decide_prompt and REF in decide_prompt
    assert "(score 3 out of 5)" in decide_prompt
    compose2 = [s for s in res.transcript if s["step"] == "compose"][1]["calls"][0]["messages"][-1]["content"]
    assert "Q2: " + FOLLOW_UP in compose2 and REF not in compose2  # the composer never sees the reference
    # all records kept, in order, once each; 5 model calls
    assert len(res.records) == 5 == fake_llm.request_count
    assert [r["purpose"] for r in res.records] == ["multiturn:compose", "correctness", "multiturn:decide",
                                                   "multiturn:compose", "correctness"]
    assert len({r["call_id"] for r in res.records}) == 5
    json.dumps(res.to_dict())  # the whole result is JSON-ready


def test_no_more_questions_rewrite_and_final_judgement(make_client, fake_llm):
    def grade(resp):
        return 5 if "UNION ALL does not" in resp else 4

    def decide(_prompt):
        return {"explanation": "the replies cover it", "need_more": False, "next_question": "ignored"}

    def rewrite(tentative):
        return tentative + " UNION ALL does not."

    def system(query, history):
        return "They combine SELECT results. UNION eliminates duplicates; UNION ALL keeps every row."

    client = make_client(make_router(grade=grade, decide=decide, rewrite=rewrite))
    res = MultiTurnRunner(client, n_turns=5).run(system, Q, REF, judge_contexts=E3)
    assert res.stop == "no_more_questions"
    assert res.sigma == [4, 5]  # the T7 score is its own element
    assert res.lscore == 2 and res.mscore == 5
    assert steps(res) == ["ask", "compose", "judge", "decide", "rewrite", "judge_final"]
    assert res.final_answer.endswith("UNION ALL does not.")
    assert res.transcript[3]["output"]["next_question"] == ""  # a question with need_more=false is dropped
    rewrite_prompt = res.transcript[4]["calls"][0]["messages"][-1]["content"]
    assert REF in rewrite_prompt and "graded 4" in rewrite_prompt
    assert res.transcript[5]["output"]["score"] == 5 and fake_llm.request_count == 5

    replaced = MultiTurnRunner(client, n_turns=5, final_score="replace").run(system, Q, REF, judge_contexts=E3)
    assert replaced.sigma == [5] and replaced.lscore == 1 and replaced.wscore == 5
    assert [s["output"]["score"] for s in replaced.transcript if s["step"].startswith("judge")] == [4, 5]


@pytest.mark.parametrize(("mode", "n", "questions"), [("append", 3, 2), ("replace", 3, 3), ("append", 2, 1)])
def test_turn_budget_exhausted(make_client, fake_llm, mode, n, questions):
    def decide(prompt):
        asked, _ = history_of(prompt)
        return {"explanation": "still missing", "need_more": True, "next_question": f"Follow-up {len(asked)}?"}

    runner = MultiTurnRunner(make_client(make_router(grade=lambda r: 3, decide=decide)), n_turns=n,
                             final_score=mode)
    estimate = runner.estimate(Q, REF, E3)
    assert fake_llm.request_count == 0  # estimating calls nothing
    system = Recorder(lambda q, h: "They combine the results of SELECT statements.")
    res = runner.run(system, Q, REF, judge_contexts=E3)
    assert res.stop == "turn_limit"
    assert len(res.sigma) == n and res.sigma == [3] * n
    assert len(system.calls) == questions == res.n_questions == runner.max_questions
    assert [q for q, _ in system.calls] == [Q] + [f"Follow-up {i}?" for i in range(1, questions)]
    # no decide call after the last question: its question could not be used
    assert steps(res).count("decide") == questions - 1
    assert steps(res)[-2:] == ["rewrite", "judge_final"]
    assert fake_llm.request_count == estimate["calls"] == 3 * questions + 1
    assert res.wscore == 3


def test_estimate_worst_and_calls():
    from mlflow_ragjudge.llm.backends import FakeBackend

    client = JudgeClient(FakeBackend(["unused"]), cache=False)
    est = MultiTurnRunner(client, n_turns=5).estimate(Q, REF, E3)
    assert est["calls"] == 13 and est["input_tokens"] > 0 and est["output_tokens"] > 0
    assert MultiTurnRunner(client, n_turns=5, final_score="replace").estimate(Q, REF, E3)["calls"] == 16
    longer = MultiTurnRunner(client, n_turns=5).estimate(Q, REF * 5, E3)
    assert longer["input_tokens"] > est["input_tokens"]
    assert client.backend.requests == []


def test_system_raising_fails_the_item(make_client, fake_llm):
    def flaky(query, history):
        if history:
            raise RuntimeError("index offline")
        return "They combine the results of SELECT statements."

    res = MultiTurnRunner(make_client(make_router())).run(flaky, Q, REF, judge_contexts=E3)
    assert res.status is Status.FAILED and res.reason == "system_error" and res.failed_step == "ask"
    assert "RuntimeError: index offline" in res.error
    assert res.sigma == [3]  # the partial sigma is kept as evidence ...
    assert res.wscore is None and res.lscore is None and res.mscore is None  # ... but never scored
    assert res.final_answer is None and res.stop is None
    assert steps(res) == ["ask", "compose", "judge", "decide", "ask"]
    assert res.transcript[-1]["reason"] == "system_error"
    jr = res.to_judge_results()
    assert {k: (v.status, v.reason) for k, v in jr.items()} == {
        m: (Status.FAILED, "system_error") for m in ("wscore", "lscore", "mscore")}
    assert jr["wscore"].details["failed_step"] == "ask" and len(jr["wscore"].calls) == 3
    assert jr["lscore"].calls == []  # the calls are attached once


def test_system_bad_return_value(make_client):
    res = MultiTurnRunner(make_client(make_router())).run(lambda q, h: None, Q, REF)
    assert res.reason == "system_error" and "NoneType" in res.error and res.records == []
    ok = MultiTurnRunner(make_client(make_router())).run(
        lambda q, h: {"answer": "They combine SELECT results. UNION eliminates duplicates.", "contexts": ["c"]},
        Q, REF)
    assert ok.sigma == [5] and ok.transcript[0]["output"]["contexts"] == ["c"]


def test_judge_parse_failure_fails_with_partial_transcript(make_client, fake_llm):
    def route(req):
        if JUDGE in first_user(req):
            return "I think the response is fine."  # no [RESULT]: unreadable, also after the re-ask
        return make_router()(req)

    res = MultiTurnRunner(make_client(route)).run(base_system, Q, REF, judge_contexts=E3)
    assert res.status is Status.FAILED and res.reason == "parse_error" and res.failed_step == "judge"
    assert "[RESULT]" in res.error
    assert res.sigma == [] and res.wscore is None
    assert steps(res) == ["ask", "compose", "judge"]
    failed = res.transcript[-1]
    assert failed["raw"] == "I think the response is fine." and len(failed["calls"]) == 6  # five re-asks
    assert len(res.records) == 7 == fake_llm.request_count
    assert res.transcript[1]["output"]["answer"] == "They combine the results of SELECT statements."


def test_agent_failure_fails_the_item(make_client):
    def route(req):
        if COMPOSE in first_user(req):
            return Reply.error(400, "bad request")
        return make_router()(req)

    res = MultiTurnRunner(make_client(route)).run(base_system, Q, REF)
    assert res.status is Status.FAILED and res.failed_step == "compose" and res.reason == "provider_error"
    assert steps(res) == ["ask", "compose"]


def test_repeated_question_ends_the_questioning(make_client, fake_llm):
    def decide(_prompt):
        return {"explanation": "ask again", "need_more": True, "next_question": Q.upper()}

    res = MultiTurnRunner(make_client(make_router(decide=decide))).run(base_system, Q, REF, judge_contexts=E3)
    assert res.status is Status.SCORED and res.stop == "repeated_question"
    assert res.sigma == [3, 3] and res.n_questions == 1
    decide_step = res.transcript[3]
    assert len(decide_step["calls"]) == 6 and "repeats question Q1" in decide_step["calls"][1]["messages"][-1][
        "content"]
    assert steps(res) == ["ask", "compose", "judge", "decide", "rewrite", "judge_final"]


def test_level_zero_stays_zero_in_sigma(make_client):
    def grade(resp):
        return 0 if "not sure" in resp.lower() else 5

    def compose(prompt):
        _, answers = history_of(prompt)
        return answers[-1]

    def system(query, history):
        return "I am not sure." if not history else "They combine SELECT results. UNION eliminates duplicates."

    def decide(_prompt):
        return {"explanation": "nothing yet", "need_more": True, "next_question": "Could you check the manual?"}

    runner = MultiTurnRunner(make_client(make_router(grade=grade, decide=decide, compose=compose)), n_turns=3)
    res = runner.run(system, Q, REF)
    assert res.sigma == [0, 5] and res.mscore == 5
    assert res.wscore == pytest.approx((3 * 0 + 2 * 5 + 1 * 5) / 6)
    assert res.transcript[2]["output"]["status"] == "abstained"


def test_input_validation(make_client):
    client = make_client(make_router())
    with pytest.raises(ValueError, match="n_turns must be an integer >= 2"):
        MultiTurnRunner(client, n_turns=1)
    assert MultiTurnRunner(client, n_turns=1, final_score="replace").max_questions == 1
    with pytest.raises(ValueError, match="final_score"):
        MultiTurnRunner(client, final_score="extend")
    runner = MultiTurnRunner(client)
    with pytest.raises(ValueError, match="question"):
        runner.run(base_system, "  ", REF)
    with pytest.raises(ValueError, match="reference"):
        runner.run(base_system, Q, "")
    with pytest.raises(ValueError, match="callable"):
        runner.run("not a system", Q, REF)


# --------------------------------------------------------------------------- QA vs MQA


def test_history_aware_system_beats_single_turn(make_client):
    runner = MultiTurnRunner(make_client(make_router()), n_turns=5)
    qa = Recorder(base_system, history_aware=False)
    mqa = Recorder(base_system, history_aware=True)
    qa_res = runner.run(qa, Q, REF, judge_contexts=E3)
    mqa_res = runner.run(mqa, Q, REF, judge_contexts=E3)
    assert qa_res.sigma == [3, 3, 5] and mqa_res.sigma == [3, 5]
    assert qa.calls[1][0] == FOLLOW_UP and qa_res.history[1]["answer"].startswith("I am not sure")
    failed = runner.run(lambda q, h: 1 / 0, Q, REF)  # a broken item in the QA group
    out = summarize([qa_res, mqa_res, failed], groups=["QA", "MQA", "QA"])
    qa_w, mqa_w = 57 / 15, 65 / 15
    assert out["wscore/mean/QA"] == pytest.approx(qa_w) and out["wscore/mean/MQA"] == pytest.approx(mqa_w)
    assert out["wscore/mean/MQA"] > out["wscore/mean/QA"]
    assert out["lscore/mean/QA"] == 3 and out["lscore/mean/MQA"] == 2
    assert out["mscore/mean/QA"] == 5 == out["mscore/mean/MQA"]
    assert out["wscore/mean"] == pytest.approx((qa_w + mqa_w) / 2)
    assert out["wscore/count"] == 3 and out["wscore/error_rate"] == pytest.approx(1 / 3)
    assert out["wscore/count/QA"] == 2 and out["wscore/error_rate/QA"] == 0.5
    assert out["lscore/abstain_rate"] == 0
    assert not any(isinstance(v, float) and math.isnan(v) for v in out.values())


def test_summarize_edge_cases(make_client):
    failed = MultiTurnRunner(make_client(make_router())).run(lambda q, h: 1 / 0, Q, REF)
    out = summarize([failed], groups=["a/b c!"])
    assert "wscore/mean" not in out and out["wscore/error_rate"] == 1.0
    g = metric_name_part("a/b c!")
    assert g.startswith("a_b c___") and "/" not in g
    assert out[f"wscore/count/{g}"] == 1 and f"wscore/mean/{g}" not in out
    assert summarize([]) == {f"{m}/{k}": 0.0 for m in ("wscore", "lscore", "mscore")
                             for k in ("count", "n_scored", "n_abstained", "n_failed", "abstain_rate",
                                       "error_rate")}
    with pytest.raises(ValueError, match="one per result"):
        summarize([failed], groups=[])


# --------------------------------------------------------------------------- prompts


MT_PROMPTS = ("mt_compose", "mt_next_question", "mt_rewrite")


def _strict_ok(schema: dict) -> None:
    if schema.get("type") == "object":
        assert schema["additionalProperties"] is False
        assert set(schema["required"]) == set(schema["properties"])
        for sub in schema["properties"].values():
            _strict_ok(sub)
    if schema.get("type") == "array":
        _strict_ok(schema["items"])


@pytest.mark.parametrize("name", MT_PROMPTS)
def test_prompt_files_consistent_and_strict(name):
    en, ja = load_prompt(name, "en"), load_prompt(name, "ja")
    assert en.language == "en" and ja.language == "ja" and en.version == ja.version
    assert en.slots() == ja.slots() and en.schema == ja.schema and set(en.formats) == set(ja.formats) == {"json"}
    _strict_ok(en.schema)
    assert "reference" not in en.slots() or name != "mt_compose"  # the composer never sees the gold answer


def test_japanese_prompts_with_structured_output(make_client, fake_llm):
    def route(req):
        rf = req.response_format or {}
        spec = rf.get("json_schema") or {}
        assert rf.get("type") == "json_schema" and spec.get("strict") is True
        _strict_ok(spec["schema"])
        name, text = spec["name"], first_user(req)
        if name == "mt_compose":
            _, answers = history_of(text)
            return {"explanation": "回答から", "answer": " ".join(answers)}
        if name == "mt_next_question":
            return {"explanation": "重複の扱いが不明", "need_more": True, "next_question": "UNION は重複を除きますか?"}
        if name == "correctness_verdict":
            return {"feedback": "参照回答と一致", "score": 5 if "重複を除" in text.split("回答:\n")[-1] else 3}
        return Reply.error(400, f"unexpected schema {name}")

    def system(query, history):
        return "どちらも SELECT の結果を結合します。" if not history else "はい、UNION は重複を除きます。"

    runner = MultiTurnRunner(make_client(route, structured="json_schema"), language="ja", n_turns=3)
    assert all(v.endswith("-ja") for v in runner.prompt_versions.values())
    assert set(runner.prompt_versions) == {"correctness", *MT_PROMPTS}
    ref = "どちらも結果を結合する。UNION は重複を除き、ALL は除かない。"
    res = runner.run(system, "UNION と UNION ALL の違いは?", ref, judge_contexts=["UNION は重複行を除く。"])
    assert res.sigma == [3, 5] and res.stop == "score_5"
    compose_prompt = res.transcript[1]["calls"][0]["messages"][-1]["content"]
    assert "対象の質問" in compose_prompt and "Q1: UNION と UNION ALL の違いは?" in compose_prompt
    decide_prompt = res.transcript[3]["calls"][0]["messages"][-1]["content"]
    assert "5 点満点中 3 点" in decide_prompt and "参照回答" in decide_prompt
    assert fake_llm.request_count == 5
    rendered = load_prompt("mt_rewrite", "ja").render("json", question="q", history="h", tentative_answer="t",
                                                      review="r", reference="a")
    assert "参照回答の粒度" in rendered[-1]["content"] and "\"answer\"" in rendered[-1]["content"]


def test_prompt_versions_and_settings(make_client):
    runner = MultiTurnRunner(make_client(make_router()), n_turns=4)
    assert runner.prompt_versions == {"correctness": "correctness-v4-en", "mt_compose": "mt_compose-v2-en",
                                      "mt_next_question": "mt_next_question-v2-en", "mt_rewrite": "mt_rewrite-v2-en"}
    s = runner.settings
    assert s["n_turns"] == 4 and s["max_questions"] == 3 and s["final_score"] == "append"
