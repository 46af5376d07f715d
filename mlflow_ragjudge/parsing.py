"""Strict parsing of judge replies.

Two reply forms are read:

* the Prometheus form ``Feedback: <text> [RESULT] <n>`` used by open judge
  models (prometheus-eval, and any model told to answer that way);
* JSON, from schema-constrained output (OpenAI ``json_schema``, Anthropic tool
  use) or from a model told to reply with a JSON object.

The rules are designed against two known bugs: a regex that matched the score
placeholder echoed from the prompt (prometheus-eval #58: every score read as 5)
and a grade read from the prefix of a longer token (inspect_ai #4872: ``CI`` read
as ``C``). So: the *last* ``[RESULT]`` marker wins; what follows it must be a
whole integer standing alone (``[RESULT] 5``, ``[RESULT]: 5``, ``[RESULT] (5)``,
``[RESULT] 5/5``) and one of the values the prompt offered; anything else fails the
parse with the raw text kept by the caller. Nothing is guessed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any

from .backends.base import ChatResponse
from .client import ParseError

__all__ = [
    "ParseError",
    "parse_prometheus",
    "extract_json_object",
    "validate_schema",
    "parse_json_reply",
    "parse_score_reply",
]

_RESULT_MARK = re.compile(r"\[\s*RESULT\s*\]", re.IGNORECASE)
# A whole number standing alone after the marker: optional ":" / "=", optional "(",
# then digits that are not followed by more digits, a decimal part or a letter.
_RESULT_VALUE = re.compile(
    r"\s*[:=]?\s*[\(\[]?\s*(?P<num>[+-]?\d+)(?P<tail>(?:\.\d+)?)\s*(?:/\s*(?P<den>\d+))?\s*[\)\]]?"
    r"(?=$|[\s.,;!)\]*_`\"'])"
)


def parse_prometheus(text: str, allowed: Collection[int]) -> tuple[int, str]:
    """Read ``Feedback: ... [RESULT] n``.

    Args:
        text: the raw reply.
        allowed: the values the prompt offered (e.g. ``range(0, 6)``).

    Returns:
        ``(score, feedback)``: the feedback is the text before the last marker,
        with a leading ``Feedback:`` removed.

    Raises:
        ParseError: no marker; the last marker is not followed by a lone integer;
            the integer is not allowed (``[RESULT] 7``); a fraction whose
            denominator is not the top of the scale.
    """
    if not text or not text.strip():
        raise ParseError("empty reply")
    marks = list(_RESULT_MARK.finditer(text))
    if not marks:
        raise ParseError("no '[RESULT] <score>' found in the reply")
    last = marks[-1]
    m = _RESULT_VALUE.match(text, last.end())
    if m is None:
        snippet = text[last.end(): last.end() + 30].strip()
        raise ParseError(f"the last [RESULT] is not followed by a whole score (found {snippet!r})")
    if m.group("tail"):
        raise ParseError(f"score {m.group('num')}{m.group('tail')} is not a whole number")
    value = int(m.group("num"))
    den = m.group("den")
    if den is not None and int(den) != max(allowed):
        raise ParseError(f"score {value}/{den} is not on the 0-{max(allowed)} scale")
    if value not in allowed:
        raise ParseError(f"score {value} is not one of the allowed values {sorted(allowed)}")
    rest = text[m.end():].strip()
    if re.search(r"\d", rest):
        # "[RESULT] 3 or 4" / "[RESULT] 3 \n [RESULT-ish] 5": not one verdict
        raise ParseError(f"more text with numbers after the verdict: {rest[:40]!r}")
    feedback = text[: last.start()]
    # keep what follows the last "Feedback:" label (drops an echoed prompt before it)
    labels = list(re.finditer(r"\**feedback\**\s*:\**", feedback, flags=re.IGNORECASE))
    if labels:
        feedback = feedback[labels[-1].end():]
    feedback = feedback.strip().strip("*").strip()
    return value, feedback


_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


def extract_json_object(text: str) -> dict[str, Any]:
    """The JSON object in a reply: the whole text, a fenced block, or the last
    balanced ``{...}``. Raises :class:`ParseError` when none parses (truncated JSON,
    prose only, an array)."""
    if not text or not text.strip():
        raise ParseError("empty reply")
    candidates = [text.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)][::-1]
    last_err = "no JSON object in the reply"
    for cand in candidates:
        try:
            obj = json.loads(cand)
        except json.JSONDecodeError as e:
            last_err = f"invalid JSON ({e.msg} at position {e.pos})"
            continue
        if isinstance(obj, dict):
            return obj
        last_err = f"expected a JSON object, got {type(obj).__name__}"
    # last balanced object in running text
    end = text.rfind("}")
    while end != -1:
        depth = 0
        for start in range(end, -1, -1):
            ch = text[start]
            if ch == "}":
                depth += 1
            elif ch == "{":
                depth -= 1
                if depth == 0:
                    try:
                        obj = json.loads(text[start: end + 1])
                    except ValueError:
                        break
                    if isinstance(obj, dict):
                        return obj
                    break
        end = text.rfind("}", 0, end)
    raise ParseError(last_err)


_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def validate_schema(value: Any, schema: dict[str, Any], path: str = "$") -> None:
    """Check ``value`` against the subset of JSON Schema our prompts use
    (type, properties, required, items, enum, minimum, maximum, minItems, maxItems).
    Raises :class:`ParseError` naming the path."""
    t = schema.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        ok = False
        for name in types:
            if name == "null" and value is None:
                ok = True
            elif name in _TYPES and isinstance(value, _TYPES[name]):
                # bool is an int in Python; JSON does not agree
                ok = not (name in ("integer", "number") and isinstance(value, bool))
                if name == "integer" and isinstance(value, float):
                    ok = False
            if ok:
                break
        if not ok:
            raise ParseError(f"{path}: expected {t}, got {type(value).__name__} {value!r}"[:200])
    if "enum" in schema and value not in schema["enum"]:
        raise ParseError(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ParseError(f"{path}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise ParseError(f"{path}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, dict):
        for req in schema.get("required", []):
            if req not in value:
                raise ParseError(f"{path}: missing field {req!r}")
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                validate_schema(value[k], sub, f"{path}.{k}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise ParseError(f"{path}: expected at least {schema['minItems']} items, got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise ParseError(f"{path}: expected at most {schema['maxItems']} items, got {len(value)}")
        if "items" in schema:
            for i, item in enumerate(value):
                validate_schema(item, schema["items"], f"{path}[{i}]")


def parse_json_reply(response: ChatResponse, schema: dict[str, Any]) -> dict[str, Any]:
    """The structured reply (provider-parsed data, else JSON in the text), validated."""
    obj = response.data if response.data is not None else extract_json_object(response.text)
    validate_schema(obj, schema)
    return obj


def parse_score_reply(
    response: ChatResponse,
    *,
    allowed: Collection[int],
    schema: dict[str, Any] | None = None,
    score_field: str = "score",
    feedback_field: str = "feedback",
) -> dict[str, Any]:
    """Read a score from either form: structured JSON (``{"feedback", "score"}``)
    when the provider returned data or the text is JSON, else Prometheus text.

    Returns ``{"score": int, "feedback": str}``.
    """
    text = response.text or ""
    if response.data is not None or (not _RESULT_MARK.search(text) and "{" in text):
        obj = parse_json_reply(response, schema or {"type": "object", "required": [score_field]})
        score = obj.get(score_field)
        if isinstance(score, bool) or not isinstance(score, int):
            if isinstance(score, str) and score.strip().lstrip("+-").isdigit():
                score = int(score.strip())
            else:
                raise ParseError(f"field {score_field!r} is not a whole number: {score!r}")
        if score not in allowed:
            raise ParseError(f"score {score} is not one of the allowed values {sorted(allowed)}")
        return {"score": score, "feedback": str(obj.get(feedback_field, "")).strip()}
    score, feedback = parse_prometheus(text, allowed)
    return {"score": score, "feedback": feedback}
