"""Replies no parser should die on, through the real SDKs and the fake server (issue 24, item 6).

* A reply nested 3,000 levels deep made Python's JSON decoder raise ``RecursionError``: the row failed as
  ``internal_error`` with 0 tokens and no raw reply, although the server had served (and billed) it. Now JSON
  deeper than ``MAX_JSON_DEPTH`` is an unreadable reply like any other: ``parse_error``, re-asked, with its
  raw text and its tokens in the transcript and the run's usage.
* An extraction of 5,000 claims for a 4-word answer sent all 5,000 to verification (184k output tokens). Now
  the statements of a text are capped (``statement_cap``: 10 + one per word) and the cut is recorded in the
  row's details and rationale.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from compliant_model import CompliantModel
from fakellm import Reply

import mlflow_ragjudge as rj
from mlflow_ragjudge.core.errors import JudgeFailureWarning
from mlflow_ragjudge.core.json_text import MAX_JSON_DEPTH
from mlflow_ragjudge.metrics.statements import MIN_STATEMENTS, statement_cap

ANSWER = "The box is blue."  # 4 words
ROW = pd.DataFrame({"question": ["What colour is the box?"], "answer": [ANSWER], "reference": [ANSWER],
                    "contexts": [["The box is blue.", "It stands in the hall."]]})
OUTPUT_TOKENS = 6007


def _deep(depth: int) -> str:
    return '{"score": 4, "feedback": "fine", "statements": ["x"], "x": ' + "[" * depth + "]" * depth + "}"


def _anthropic_body(request, text: str, tool: bool) -> Reply:
    """An Anthropic message written by hand: the fake server's own encoder cannot write JSON this deep."""
    tools = request.tools or []
    if tool and tools:
        block = f'{{"type": "tool_use", "id": "toolu_1", "name": {json.dumps(tools[0]["name"])}, "input": {text}}}'
    else:
        block = json.dumps({"type": "text", "text": text})
    body = (f'{{"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [{block}], '
            f'"stop_reason": "end_turn", "stop_sequence": null, '
            f'"usage": {{"input_tokens": 11, "output_tokens": {OUTPUT_TOKENS}}}}}')
    return Reply(raw_body=body.encode())


def _judge(fake_llm, provider: str) -> str:
    base = fake_llm.openai_base_url if provider == "openai" else fake_llm.anthropic_base_url
    return f"{provider}:/m?base_url={base}"


@pytest.mark.filterwarnings(f"ignore::{JudgeFailureWarning.__module__}.{JudgeFailureWarning.__name__}")
@pytest.mark.parametrize("metric", ["correctness", "faithfulness"])
@pytest.mark.parametrize("form, depth", [
    ("openai-text", 3000), ("anthropic-text", 3000), ("anthropic-tool-use", 3000),
    # decoded by the SDK, but past the cap: written out cut at the cap, then refused by the parser
    ("anthropic-tool-use", 400),
])
def test_a_reply_nested_too_deep_is_a_parse_error_with_its_text_and_tokens(fake_llm, monkeypatch, metric, form,
                                                                           depth):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-000001")
    provider = form.split("-")[0]
    text = _deep(depth)
    if provider == "openai":
        fake_llm.set_handler(lambda req: Reply(text=text, completion_tokens=OUTPUT_TOKENS))
    else:
        fake_llm.set_handler(lambda req: _anthropic_body(req, text, tool=form.endswith("tool-use")))
    out = rj.evaluate_frame(ROW, judge=_judge(fake_llm, provider), metrics=[metric], progress=False, cache=False)

    result = out.results[metric][0]
    assert result.status.value == "failed" and result.reason == "parse_error", (result.reason, result.rationale)
    assert f"more than {MAX_JSON_DEPTH} levels deep" in result.rationale
    assert result.raw and "[[[[" in result.raw  # the reply as served
    served = len(fake_llm.requests)
    assert served == 6  # the first ask and five re-asks (the attempts budget), each a served reply
    assert [c["outcome"] for c in result.calls] == ["parse_error"] * served
    assert all(c["output_tokens"] == OUTPUT_TOKENS and c["raw_reply"] for c in result.calls)
    assert out.metrics["judge/output_tokens"] == served * OUTPUT_TOKENS


def _runaway_extraction(n_claims: int):
    """Extraction requests get ``n_claims`` statements; everything else is answered by the compliant model."""
    model = CompliantModel("json_schema")

    def handler(request):
        props = (request.json_schema or {}).get("properties", {})
        if props.get("statements", {}).get("items", {}).get("type") == "string":
            return Reply(json={"statements": [f"The box has property number {i}." for i in range(n_claims)]})
        return model(request)

    return handler


@pytest.mark.parametrize("metric, checked", [("faithfulness", "claims"), ("context_recall", "statements")])
def test_5000_claims_for_a_4_word_answer_are_not_all_verified(fake_llm, metric, checked):
    fake_llm.set_handler(_runaway_extraction(5000))
    out = rj.evaluate_frame(ROW, judge=_judge(fake_llm, "openai"), metrics=[metric], progress=False, cache=False)

    cap = statement_cap(ANSWER)
    assert cap == MIN_STATEMENTS + 4
    result = out.results[metric][0]
    assert result.status.value == "scored", result.rationale
    assert len(fake_llm.requests) == 2  # one extraction, one verification of the kept claims
    verification = fake_llm.requests[1]
    assert verification.last_user_text.count("[5000]") == 0 and f"[{cap}] " in verification.last_user_text
    assert f"[{cap + 1}] " not in verification.last_user_text
    assert len(result.details[checked]) == cap
    cut = result.details["statements_cut"]
    cut = cut[0] if isinstance(cut, list) else cut
    assert (cut["extracted"], cut["kept"], cut["cap"]) == (5000, cap, cap)
    assert f"first {cap} of the 5000" in result.rationale


def test_an_honest_extraction_is_not_cut(fake_llm):
    fake_llm.set_handler(_runaway_extraction(3))
    out = rj.evaluate_frame(ROW, judge=_judge(fake_llm, "openai"), metrics=["faithfulness"], progress=False,
                            cache=False)
    result = out.results["faithfulness"][0]
    assert result.details["n_claims"] == 3 and "statements_cut" not in result.details
    assert "first" not in result.rationale
