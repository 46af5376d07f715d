"""Claim-based faithfulness end to end against the fake LLM server, through the real SDKs."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from fakellm import Reply

from mlflow_ragjudge.core.types import Status
from mlflow_ragjudge.llm.client import JudgeClient
from mlflow_ragjudge.llm.prompts import load_prompt
from mlflow_ragjudge.metrics.faithfulness import FaithfulnessJudge
from mlflow_ragjudge.metrics.statements import StatementExtractor

CLAIMS_MARK = "Break the TEXT into claims"
VERIFY_MARK = "Decide for each numbered CLAIM whether the EVIDENCE supports it"

QUESTION = "How tall is Tokyo Tower and when did it open?"
RESPONSE = "Tokyo Tower is 333 metres tall. It opened in 1958 and it is painted blue."
EVIDENCE = [
    "Tokyo Tower is a communications and observation tower in Minato, Tokyo. It is 333 metres tall.",
    "The tower opened to the public in 1958.",
]
CLAIMS = [
    "Tokyo Tower is 333 metres tall.",
    "Tokyo Tower opened in 1958.",
    "Tokyo Tower is painted blue.",
]


def verdicts(*flags: bool, start: int = 1) -> dict:
    return {
        "verdicts": [
            {"claim": i, "reason": f"reason {i}", "verdict": "supported" if f else "unsupported"}
            for i, f in enumerate(flags, start)
        ]
    }


def router(claims=None, verify=None):
    """A fake-judge handler answering the extraction and the verification prompts."""

    def handler(req):
        text = req.last_user_text
        if CLAIMS_MARK in text:
            value = claims(req) if callable(claims) else claims
            return value if value is not None else {"statements": CLAIMS}
        if VERIFY_MARK in text or "Your previous reply could not be read" in text:
            value = verify(req) if callable(verify) else verify
            return value if value is not None else verdicts(True, True, False)
        return Reply.error(400, f"unexpected prompt: {text[:80]}")

    return handler


def chat_requests(fake_llm):
    return [r for r in fake_llm.requests if r.api in ("openai_chat", "anthropic_messages")]


@pytest.fixture
def openai_client(fake_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-faithfulness-0001")
    return JudgeClient(f"openai:/judge-model?base_url={fake_llm.openai_base_url}", cache=False)


@pytest.fixture
def anthropic_client(fake_llm, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-anthropic-key-0001")
    return JudgeClient(f"anthropic:/claude-judge?base_url={fake_llm.anthropic_base_url}", cache=False)


def test_claims_and_verdicts_through_openai(fake_llm, openai_client):
    fake_llm.set_handler(router())
    judge = FaithfulnessJudge(openai_client)
    result = judge.judge(QUESTION, RESPONSE, EVIDENCE)

    assert result.status is Status.SCORED
    assert result.value == pytest.approx(2 / 3)
    assert result.details["claims"] == [
        {"claim": CLAIMS[0], "supported": True, "reason": "reason 1"},
        {"claim": CLAIMS[1], "supported": True, "reason": "reason 2"},
        {"claim": CLAIMS[2], "supported": False, "reason": "reason 3"},
    ]
    assert result.details["n_supported"] == 2 and result.details["n_claims"] == 3
    assert "2 of 3 claims supported" in result.rationale and "painted blue" in result.rationale
    # two requests, and the transcript records both
    assert len(chat_requests(fake_llm)) == 2
    assert [c["purpose"] for c in result.calls] == ["statements", "faithfulness"]
    assert [c["prompt_version"] for c in result.calls] == ["statements-v3-en", "faithfulness-v4-en"]
    assert judge.prompt_versions == {"statements": "statements-v3-en", "faithfulness": "faithfulness-v4-en"}
    # the extraction prompt carries the question and the response; the verification prompt numbers
    # every passage and every claim
    first, second = (r.last_user_text for r in chat_requests(fake_llm))
    assert QUESTION in first and RESPONSE in first
    assert ' n="1">\nTokyo Tower is a communications' in second and ' n="2">\nThe tower opened' in second
    assert "CLAIMS (3):" in second and "[1] Tokyo Tower is 333 metres tall.\n[2]" in second
    assert result.raw is not None and '"verdicts"' in result.raw


def test_claims_and_verdicts_through_anthropic_tool_use(fake_llm, anthropic_client):
    fake_llm.set_handler(router(verify=verdicts(True, False, False)))
    result = FaithfulnessJudge(anthropic_client).judge(QUESTION, RESPONSE, EVIDENCE)

    assert result.status is Status.SCORED and result.value == pytest.approx(1 / 3)
    reqs = chat_requests(fake_llm)
    assert [r.api for r in reqs] == ["anthropic_messages", "anthropic_messages"]
    # structured output through a forced tool whose input schema is the prompt's schema
    assert reqs[0].tool_choice == {"type": "tool", "name": "statements"}
    assert reqs[1].tool_choice == {"type": "tool", "name": "faithfulness_verdicts"}
    # the per-call schema: one verdict per claim, claim numbers 1..3
    schema = reqs[1].json_schema
    assert schema["properties"]["verdicts"]["minItems"] == schema["properties"]["verdicts"]["maxItems"] == 3
    assert schema["properties"]["verdicts"]["items"]["properties"]["claim"] == {"type": "integer", "enum": [1, 2, 3]}
    assert schema["properties"]["verdicts"]["items"]["properties"]["verdict"] == (
        load_prompt("faithfulness").schema["properties"]["verdicts"]["items"]["properties"]["verdict"])


def test_openai_strict_json_schema_is_sent(fake_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-faithfulness-0002")
    client = JudgeClient(
        f"openai:/judge-model?base_url={fake_llm.openai_base_url}&structured=json_schema", cache=False
    )
    fake_llm.set_handler(router())
    result = FaithfulnessJudge(client).judge(QUESTION, RESPONSE, EVIDENCE)
    assert result.status is Status.SCORED
    formats = [r.response_format for r in chat_requests(fake_llm)]
    assert [f["json_schema"]["name"] for f in formats] == ["statements", "faithfulness_verdicts"]
    assert all(f["json_schema"]["strict"] is True for f in formats)


def _strict_ok(schema: dict) -> None:
    """OpenAI strict mode: every object closes its properties and requires all of them."""
    if schema.get("type") == "object":
        assert schema.get("additionalProperties") is False
        assert set(schema["required"]) == set(schema["properties"])
        for sub in schema["properties"].values():
            _strict_ok(sub)
    if schema.get("type") == "array":
        _strict_ok(schema["items"])


@pytest.mark.parametrize(
    "name", ["statements", "faithfulness", "context_precision", "context_recall", "context_relevance",
             "answer_relevancy"]
)
@pytest.mark.parametrize("language", ["en", "ja"])
def test_prompt_files_are_versioned_and_strict(name, language):
    prompt = load_prompt(name, language)
    # version 2: every untrusted value fenced; 3: each passage (or sentence) fenced on its own; then the English
    # instructions shortened (issue 38: prompt tokens per row): one more in English
    expected = {"statements": "2", "answer_relevancy": "2"}.get(name, "3")
    if language == "en":
        expected = str(int(expected) + 1)
    assert prompt.language == language and prompt.version == expected
    assert set(prompt.formats) == {"json"}
    _strict_ok(prompt.schema)
    assert load_prompt(name, "en").schema == prompt.schema  # one schema, whatever the language


def test_malformed_verdict_json_is_reasked_then_fails_with_raw_kept(fake_llm, openai_client):
    fake_llm.set_handler(router(verify='{"verdicts": [{"claim": 1, "reason": "cut off'))
    result = FaithfulnessJudge(openai_client).judge(QUESTION, RESPONSE, EVIDENCE)

    assert result.status is Status.FAILED and result.reason == "parse_error"
    assert result.raw == '{"verdicts": [{"claim": 1, "reason": "cut off'
    assert result.value is None
    reqs = chat_requests(fake_llm)
    assert len(reqs) == 7  # extraction, verification, five re-asks (an unreadable reply is a transient fault)
    assert "Your previous reply could not be read" in reqs[2].last_user_text
    assert [c["purpose"] for c in result.calls] == ["statements", "faithfulness"] + ["faithfulness:reask"] * 5
    assert result.details["failed_stage"] == "claim verification"
    assert [c["claim"] for c in result.details["claims"]] == CLAIMS  # the claims are kept


def test_malformed_once_then_readable_is_scored(fake_llm, openai_client):
    fake_llm.script({"statements": CLAIMS}, "Sure! Here are the verdicts.", verdicts(True, True, True))
    result = FaithfulnessJudge(openai_client).judge(QUESTION, RESPONSE, EVIDENCE)
    assert result.status is Status.SCORED and result.value == 1.0
    assert len(chat_requests(fake_llm)) == 3


def test_missing_claims_are_asked_again_alone_and_merged_by_number(fake_llm, openai_client):
    """Salvage, not discard: claim 2 is missing from the first reply (which also lists claim 3 before claim 1);
    one follow-up asks about claim 2 only, under its own number, and the verdicts are merged by number."""
    first = {"verdicts": [{"claim": 3, "reason": "not in the evidence", "verdict": "unsupported"},
                          {"claim": 1, "reason": "passage 1", "verdict": "supported"}]}
    follow_up = {"verdicts": [{"claim": 2, "reason": "passage 2", "verdict": "supported"}]}
    fake_llm.script({"statements": CLAIMS}, first, follow_up)
    result = FaithfulnessJudge(openai_client).judge(QUESTION, RESPONSE, EVIDENCE)

    assert result.status is Status.SCORED and result.value == pytest.approx(2 / 3)
    assert [c["supported"] for c in result.details["claims"]] == [True, True, False]
    assert [c["reason"] for c in result.details["claims"]] == ["passage 1", "passage 2", "not in the evidence"]
    assert result.details["salvaged"]["missing_in_first_reply"] == [2]
    assert result.details["salvaged"]["recovered"] == [2]
    assert [c["purpose"] for c in result.calls] == ["statements", "faithfulness", "faithfulness:missing"]
    again = chat_requests(fake_llm)[2]
    assert "[2] Tokyo Tower opened in 1958." in again.last_user_text
    assert "[1] Tokyo Tower is 333" not in again.last_user_text
    assert "[3] Tokyo Tower is painted" not in again.last_user_text
    assert "CLAIMS (1):" in again.last_user_text
    items = again.json_schema["properties"]["verdicts"]
    assert items["minItems"] == items["maxItems"] == 1 and items["items"]["properties"]["claim"]["enum"] == [2]


def test_extra_entries_for_claims_that_do_not_exist_are_set_aside_and_recorded(fake_llm, openai_client):
    fake_llm.set_handler(router(verify=verdicts(True, True, False, True)))  # a 4th verdict for 3 claims
    result = FaithfulnessJudge(openai_client).judge(QUESTION, RESPONSE, EVIDENCE)
    assert result.status is Status.SCORED and result.value == pytest.approx(2 / 3)
    assert result.details["reply_problems"] == [{"reply": 1, "not_asked": [4]}]
    assert len(chat_requests(fake_llm)) == 2


@pytest.mark.parametrize(
    "reply, reason, problem",
    [
        pytest.param(verdicts(True, True), "inconsistent", "no verdict for claim number(s) [3]", id="shorter"),
        pytest.param(verdicts(True, True, True, start=2), "inconsistent", "no verdict for claim number(s) [1]",
                     id="shifted"),
        pytest.param(
            {"verdicts": [{"claim": 1, "reason": "r", "verdict": "supported"},
                          {"claim": 2, "reason": "r", "verdict": "supported"},
                          {"claim": 2, "reason": "r", "verdict": "unsupported"},
                          {"claim": 3, "reason": "r", "verdict": "supported"}]},
            "ambiguous", "conflicting verdicts for claim number(s) [2]", id="conflicting-duplicate",
        ),
    ],
)
def test_claims_still_missing_after_asking_again_fail_the_row_never_padded(
        fake_llm, openai_client, reply, reason, problem):
    fake_llm.set_handler(router(verify=reply))  # the same list every time, also for the follow-up
    result = FaithfulnessJudge(openai_client).judge(QUESTION, RESPONSE, EVIDENCE)

    assert result.status is Status.FAILED and result.reason == reason
    assert problem in result.rationale
    assert result.raw is not None and '"verdicts"' in result.raw
    missing = int(problem.split("[")[1].split("]")[0])
    assert result.details["claims"][missing - 1]["supported"] is None  # nothing guessed
    purposes = [c["purpose"] for c in result.calls]
    # the follow-up asked about the missing claim alone; its reply named none of it, so it was re-asked, and the
    # same unusable answer a second time is the model's answer
    assert purposes == ["statements", "faithfulness", "faithfulness:missing", "faithfulness:missing:reask"]


def test_an_inconsistent_reply_is_kept_and_asked_about_again_on_a_rerun(fake_llm, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-faithfulness-0003")
    uri = f"openai:/judge-model?base_url={fake_llm.openai_base_url}"
    fake_llm.set_handler(router(verify=verdicts(True)))
    first = FaithfulnessJudge(JudgeClient(uri, cache=tmp_path / "c.sqlite")).judge(QUESTION, RESPONSE, EVIDENCE)
    assert first.reason == "inconsistent"
    fake_llm.reset()
    fake_llm.set_handler(router())
    second = FaithfulnessJudge(JudgeClient(uri, cache=tmp_path / "c.sqlite")).judge(QUESTION, RESPONSE, EVIDENCE)
    assert second.status is Status.SCORED
    # the extraction and the paid inconsistent verdicts came from the cache (every reply is stored as it arrives);
    # the one request is a fresh re-ask about them, not the verification bought again
    (request,) = chat_requests(fake_llm)
    assert "could not be read" in request.last_user_text


@pytest.mark.parametrize(
    "response",
    ["I'm sorry, I don't know the answer to that.", "The provided documents do not say."],
)
def test_a_refusal_abstains_with_one_request(fake_llm, openai_client, response):
    fake_llm.set_handler(router(claims={"statements": []}))
    result = FaithfulnessJudge(openai_client).judge(QUESTION, response, EVIDENCE)
    assert result.status is Status.ABSTAINED and result.reason == "no_claims"
    assert result.value is None  # never NaN, never 1.0
    assert result.details["claims"] == []
    assert len(chat_requests(fake_llm)) == 1 and len(result.calls) == 1


@pytest.mark.parametrize("response", ["", "   ", None])
def test_an_empty_response_abstains_without_a_request(fake_llm, openai_client, response):
    result = FaithfulnessJudge(openai_client).judge(QUESTION, response, EVIDENCE)
    assert result.status is Status.ABSTAINED and result.reason == "no_claims"
    assert fake_llm.request_count == 0


@pytest.mark.parametrize("evidence", [[], None, ["", "  "]])
def test_no_evidence_abstains_without_a_request(fake_llm, openai_client, evidence):
    result = FaithfulnessJudge(openai_client).judge(QUESTION, RESPONSE, evidence)
    assert result.status is Status.ABSTAINED and result.reason == "no_evidence"
    assert fake_llm.request_count == 0


def test_at_most_two_requests_per_row_however_many_claims(fake_llm, openai_client):
    def claims_for(req):
        n = int(re.search(r"row (\d+)", req.last_user_text).group(1))
        return {"statements": [f"Fact number {i} of row {n}." for i in range(1, n + 1)]}

    def verdicts_for(req):
        n = int(re.search(r"CLAIMS \((\d+)\)", req.last_user_text).group(1))
        return verdicts(*[i % 2 == 0 for i in range(n)])

    fake_llm.set_handler(router(claims=claims_for, verify=verdicts_for))
    judge = FaithfulnessJudge(openai_client)
    for n in (1, 2, 5, 12, 40):
        fake_llm.reset()
        # a response long enough to make n claims (a 5-word one is cut at statements.statement_cap)
        result = judge.judge("q", f"A response for row {n}." + " It states a fact." * n, EVIDENCE)
        assert result.status is Status.SCORED and result.details["n_claims"] == n
        assert "statements_cut" not in result.details
        assert len(chat_requests(fake_llm)) == 2


def test_extraction_failure_fails_the_row_at_the_first_stage(fake_llm, openai_client):
    fake_llm.set_handler(lambda req: Reply.error(400, "context length exceeded"))
    result = FaithfulnessJudge(openai_client).judge(QUESTION, RESPONSE, EVIDENCE)
    assert result.status is Status.FAILED and result.reason == "provider_error"
    assert result.details["failed_stage"] == "claim extraction"
    assert "context length exceeded" in result.rationale
    assert fake_llm.request_count == 1  # a 400 is not retried


def test_verdict_labels_are_read_case_insensitively_but_nothing_else(fake_llm, openai_client):
    fake_llm.set_handler(router(verify={"verdicts": [
        {"claim": 1, "reason": "a", "verdict": "Supported"},
        {"claim": 2, "reason": "b", "verdict": " SUPPORTED "},
        {"claim": 3, "reason": "c", "verdict": "Unsupported"},
    ]}))
    assert FaithfulnessJudge(openai_client).judge(QUESTION, RESPONSE, EVIDENCE).value == pytest.approx(2 / 3)
    fake_llm.reset()
    fake_llm.set_handler(router(verify={"verdicts": [
        {"claim": i, "reason": "r", "verdict": "partially"} for i in (1, 2, 3)
    ]}))
    result = FaithfulnessJudge(openai_client).judge(QUESTION, RESPONSE, EVIDENCE)
    assert result.reason == "parse_error" and "partially" in result.rationale


def test_shared_extractor_memo_spares_the_extraction(fake_llm, openai_client):
    openai_client.dedupe = True  # as in the evaluator and the scorers: identical requests are sent once
    fake_llm.set_handler(router())
    extractor = StatementExtractor(openai_client)
    a = FaithfulnessJudge(openai_client, extractor=extractor).judge(QUESTION, RESPONSE, EVIDENCE)
    b = FaithfulnessJudge(openai_client, extractor=extractor).judge(QUESTION, RESPONSE, EVIDENCE[:1])
    assert a.value == b.value
    assert [c["purpose"] for c in b.calls] == ["faithfulness"]  # no repeated transcript record
    assert b.details["statements_memo_hit"] is True
    assert b.details["statements_call_ids"] == [a.calls[0]["call_id"]]
    assert len(chat_requests(fake_llm)) == 3


def test_japanese_prompt_and_response(fake_llm, openai_client):
    ja_claims = ["東京タワーの高さは333メートルである。", "東京タワーは1958年に開業した。"]
    fake_llm.set_handler(lambda req: {"statements": ja_claims} if "主張(クレーム)のリストに分解" in req.last_user_text
                         else verdicts(True, True))
    judge = FaithfulnessJudge(openai_client, language="ja")
    result = judge.judge("東京タワーの高さは?", "東京タワーは高さ333メートルで、1958年に開業しました。",
                         ["東京タワーは高さ333メートルの電波塔です。1958年に開業しました。"])
    assert result.status is Status.SCORED and result.value == 1.0
    assert judge.prompt_versions == {"statements": "statements-v2-ja", "faithfulness": "faithfulness-v3-ja"}
    assert "[1] 東京タワーの高さは333メートルである。" in chat_requests(fake_llm)[1].last_user_text


def test_estimate_is_an_upper_bound_without_calling_the_model(fake_llm, openai_client):
    openai_client.dedupe = True  # so the estimate knows what the client already holds
    judge = FaithfulnessJudge(openai_client)
    est = judge.estimate(QUESTION, RESPONSE, EVIDENCE)
    assert fake_llm.request_count == 0
    assert est["calls"] == 2 and est["input_tokens"] > 0 and est["output_tokens"] > 0
    assert judge.estimate(QUESTION, RESPONSE, []) == {"calls": 0, "input_tokens": 0, "output_tokens": 0}
    assert judge.estimate(QUESTION, "", EVIDENCE)["calls"] == 0

    fake_llm.set_handler(router())
    judge.judge(QUESTION, RESPONSE, EVIDENCE)
    prompt_words = sum(len(r.prompt_text.split()) for r in chat_requests(fake_llm))
    assert est["input_tokens"] >= prompt_words  # the fake server counts words, a lower bound on tokens
    # once the response's claims are memoised only the verification remains
    assert judge.estimate(QUESTION, RESPONSE, EVIDENCE)["calls"] == 1


def test_long_gold_documents_are_split_never_cut():
    from mlflow_ragjudge.metrics.faithfulness import select_evidence, split_passage

    filler = " ".join(f"Sentence number {i} talks about the weather in town {i}." for i in range(600))
    doc = filler + " The bridge opened in 1932 and is 503 metres long."
    pieces = split_passage(doc, 8000)
    assert len(pieces) > 1 and all(len(p) <= 8000 for p in pieces)
    assert " ".join(pieces) == " ".join(doc.split())  # nothing left out
    # all pieces fit the budget: all shown
    shown, info = select_evidence([doc], ["The bridge is 503 metres long."], max_passage_chars=8000,
                                  budget_chars=100_000)
    assert shown == pieces and info["split"] and not info["selected_by_overlap"]
    # over budget: the piece that matches the claim is kept, even from the end of the document
    shown, info = select_evidence([doc], ["The bridge is 503 metres long."], max_passage_chars=8000,
                                  budget_chars=8000)
    assert info["selected_by_overlap"] and len(shown) == 1 and "503 metres" in shown[0]


def test_faithfulness_sees_a_claim_from_late_in_a_long_gold_document(fake_llm, judge):
    import mlflow_ragjudge as rj

    filler = " ".join(f"Sentence number {i} talks about the weather in town {i}." for i in range(600))
    doc = filler + " The bridge opened in 1932 and is 503 metres long."
    df = pd.DataFrame({"answer": ["The bridge is 503 metres long."], "gold_documents": [[doc]],
                       "question": ["How long is the bridge?"]})
    out = rj.evaluate_frame(df, judge=judge, metrics=["faithfulness"], faithfulness_evidence="gold", cache=False,
                            faithfulness_evidence_chars=20_000)
    res = out.results["faithfulness"][0]
    assert res.status.value == "scored" and res.details["evidence_selection"]["split"]
    verify = [r for r in fake_llm.requests if "faithfulness_verdicts" in json.dumps(r.response_format or {})]
    assert verify and "503 metres long" in json.dumps(verify[0].messages)
    assert res.details["evidence_info"]["n_truncated"] == 0
