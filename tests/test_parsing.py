"""Tables of good and bad judge outputs."""

from __future__ import annotations

import pytest

from mlflow_ragjudge.backends import ChatResponse
from mlflow_ragjudge.parsing import (
    ParseError,
    extract_json_object,
    parse_prometheus,
    parse_score_reply,
    validate_schema,
)

SCALE = range(0, 6)


@pytest.mark.parametrize(
    "text, score, feedback",
    [
        pytest.param("Feedback: Matches the reference. [RESULT] 5", 5, "Matches the reference.", id="plain"),
        pytest.param("Feedback: ok\n[RESULT] 4\n", 4, "ok", id="newline"),
        pytest.param("Feedback: says unsure [RESULT] 0", 0, "says unsure", id="zero-abstain"),
        pytest.param("Feedback: a [RESULT]: 3", 3, "a", id="colon"),
        pytest.param("Feedback: a [RESULT] (2).", 2, "a", id="parens-dot"),
        pytest.param("Feedback: a [RESULT] 5/5", 5, "a", id="fraction-of-top"),
        pytest.param("feedback: lower [result] 1", 1, "lower", id="case-insensitive"),
        pytest.param("Feedback: first try [RESULT] 3\nOn reflection: [RESULT] 4", 4,
                     "first try [RESULT] 3\nOn reflection:", id="two-results-last-wins"),
        pytest.param(
            "Respond as 'Feedback: <text> [RESULT] <an integer from 0 to 5>'\nFeedback: fine [RESULT] 2",
            2, "fine", id="echoed-template-then-real"),
        pytest.param("**Feedback:** good **[RESULT] 5**", 5, "good", id="markdown-bold"),
        pytest.param("Feedback: 日本語の回答は正しい。 [RESULT] 5", 5, "日本語の回答は正しい。", id="japanese"),
    ],
)
def test_prometheus_good(text, score, feedback):
    assert parse_prometheus(text, SCALE) == (score, feedback)


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param("Feedback: great [RESULT] 7", "not one of the allowed", id="out-of-range"),
        pytest.param("Feedback: meh [RESULT] -1", "not one of the allowed", id="negative"),
        pytest.param("Feedback: meh [RESULT] 4.5", "not a whole number", id="decimal"),
        pytest.param("Feedback: meh [RESULT] 3/10", "not on the 0-5 scale", id="other-scale"),
        pytest.param("Feedback: it is good. Score: 5", "no '\\[RESULT\\]", id="no-marker"),
        pytest.param("Feedback: x [RESULT] <score>", "not followed by a whole score", id="echoed-placeholder-last"),
        pytest.param("Feedback: x [RESULT] 3 or 4", "more text with numbers", id="two-values"),
        pytest.param("Feedback: x [RESULT] 45", "not one of the allowed", id="digits-run-together"),
        pytest.param("Feedback: x [RESULT] 5a", "not followed by a whole score", id="letter-suffix"),
        pytest.param("", "empty reply", id="empty"),
        pytest.param("Feedback: cut off before the verd", "no '\\[RESULT\\]", id="truncated"),
    ],
)
def test_prometheus_bad(text, message):
    with pytest.raises(ParseError, match=message):
        parse_prometheus(text, SCALE)


SCHEMA = {
    "type": "object",
    "properties": {"feedback": {"type": "string"}, "score": {"type": "integer", "enum": list(SCALE)}},
    "required": ["feedback", "score"],
}


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param('{"feedback": "ok", "score": 4}', {"score": 4, "feedback": "ok"}, id="json"),
        pytest.param('```json\n{"feedback": "ok", "score": 3}\n```', {"score": 3, "feedback": "ok"}, id="fenced"),
        pytest.param('Here you go: {"feedback": "ok", "score": 1} Thanks', {"score": 1, "feedback": "ok"},
                     id="embedded"),
        pytest.param("Feedback: json-less reply [RESULT] 2", {"score": 2, "feedback": "json-less reply"},
                     id="prometheus-fallback"),
    ],
)
def test_score_reply_good(text, expected):
    assert parse_score_reply(ChatResponse(text), allowed=SCALE, schema=SCHEMA) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param('{"feedback": "ok", "score": 4', "no '\\[RESULT\\]|invalid JSON|no JSON", id="truncated-json"),
        pytest.param('{"feedback": "ok", "score": 9}', "not one of", id="json-out-of-range"),
        pytest.param('{"feedback": "ok", "score": "five"}', "expected integer", id="json-string-score"),
        pytest.param('{"feedback": "ok", "score": true}', "expected integer", id="json-bool-score"),
        pytest.param('{"feedback": "ok"}', "missing field 'score'", id="json-missing-score"),
        pytest.param('{"feedback": "ok", "score": 4.0}', "expected integer", id="json-float-score"),
        pytest.param("[1, 2]", "no '\\[RESULT\\]|expected a JSON object", id="array"),
    ],
)
def test_score_reply_bad(text, message):
    with pytest.raises(ParseError, match=message):
        parse_score_reply(ChatResponse(text), allowed=SCALE, schema=SCHEMA)


def test_structured_data_wins_over_text():
    resp = ChatResponse(text="ignored", data={"feedback": "tool", "score": 5})
    assert parse_score_reply(resp, allowed=SCALE, schema=SCHEMA)["score"] == 5


def test_extract_json_prefers_last_fenced_block():
    text = '```json\n{"a": 1}\n```\nCorrected:\n```json\n{"a": 2}\n```'
    assert extract_json_object(text) == {"a": 2}


def test_validate_schema_paths():
    schema = {"type": "object", "required": ["claims"],
              "properties": {"claims": {"type": "array", "items": {"type": "string"}, "maxItems": 2}}}
    validate_schema({"claims": ["a", "b"]}, schema)
    with pytest.raises(ParseError, match=r"\$\.claims\[1\]: expected string"):
        validate_schema({"claims": ["a", 3]}, schema)
    with pytest.raises(ParseError, match="at most 2"):
        validate_schema({"claims": ["a", "b", "c"]}, schema)
