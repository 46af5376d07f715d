"""Strict parsing of judge replies.

Reply forms that real judges write, all read:

* JSON, from schema-constrained output (OpenAI ``json_schema``, Anthropic tool use) or from a
  model told to reply with a JSON object -- bare, inside a ```json fence, or inside prose;
* the Prometheus form ``Feedback: <text> [RESULT] <n>`` used by open judge models
  (prometheus-eval, and any model told to answer that way);
* a labelled score line: ``Score: 4``, ``score: 4/5``, ``**Final score:** 4``, ``Rating = 4``.

The rules are designed against three known bugs:

* a regex that matched the score placeholder echoed from the prompt (prometheus-eval #58: every
  score read as 5) -- a marker followed by a placeholder such as ``<score>`` is not a verdict;
* a grade read from the prefix of a longer token (inspect_ai #4872: ``GRADE: CI`` read as ``C``)
  -- a value must be a whole number standing alone (``[RESULT] 5a`` and ``4.5`` are refused);
* "the last one wins": a reply that carries two *different* final verdicts (``[RESULT] 1`` and
  an echoed ``[RESULT] 5``, a JSON verdict followed by a second JSON object with another score,
  ``[RESULT] 3 or 4``) is **ambiguous**: a :class:`ParseError` with reason ``ambiguous``, which
  the client re-asks once and then records as the row's failure. Verdicts that agree are one
  verdict.

Every value must be one the prompt offered; a fraction's denominator must be the top of the
scale. Anything else fails the parse with the raw text kept by the caller. Nothing is guessed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from typing import Any

from ..core.errors import ParseError
from ..core.types import FailureReason
from .backends.base import ChatResponse

__all__ = [
    "ParseError",
    "parse_prometheus",
    "iter_json_objects",
    "extract_json_object",
    "validate_schema",
    "parse_json_reply",
    "parse_score_reply",
]

AMBIGUOUS = FailureReason.AMBIGUOUS

_RESULT_MARK = re.compile(r"\[\s*RESULT\s*\]", re.IGNORECASE)
# "Score: 4", "**Final score:** 4/5", "Rating = 4" -- a label, then ":" or "=", at a word start.
_SCORE_LABEL = re.compile(
    r"(?<![A-Za-z_])(?:final\s+)?(?:score|rating)\**\s*(?:[:=])\**", re.IGNORECASE
)
# A whole number standing alone after a marker: optional ":" / "=", optional "(", then digits not
# followed by more digits, a decimal part or a letter; optionally "/ 5" or "out of 5".
_VALUE = re.compile(
    r"\s*[:=]?\s*\**\s*[\(\[]?\s*(?P<num>[+-]?\d+)(?P<tail>(?:[.,]\d+)?)\s*"
    r"(?:(?:/|out\s+of)\s*(?P<den>\d+))?\s*[\)\]]?\**"
    r"(?=$|[\s.,;!)\]*_`\"'~\-–])",
    re.IGNORECASE,
)
_STARTS_NUMERIC = re.compile(r"\s*[:=]?\s*\**\s*[\(\[]?\s*[+-]?\d")
# "[RESULT] 3 or 4", "Score: 3-4", "Score: 3 to 4": two values offered as one verdict
_SECOND_VALUE = re.compile(r"\s*(?:or|to|and|-|–|~)\s*\d", re.IGNORECASE)


def _text_verdicts(text: str, allowed: Collection[int]) -> list[tuple[int, int, int, str]]:
    """Every ``[RESULT] n`` / ``Score: n`` verdict in ``text``: ``(value, start, end, label)``.

    A marker followed by something that is not a number (an echoed ``<score>`` placeholder, prose)
    is not a verdict and is skipped; a marker followed by a malformed number is an error.
    """
    found: list[tuple[int, int, int, str]] = []
    marks = [(m, "[RESULT]") for m in _RESULT_MARK.finditer(text)]
    marks += [(m, "Score:") for m in _SCORE_LABEL.finditer(text)]
    top = max(allowed)
    for mark, label in sorted(marks, key=lambda t: t[0].start()):
        if not _STARTS_NUMERIC.match(text, mark.end()):
            continue  # "[RESULT] <score>", "Score: high": not a verdict
        m = _VALUE.match(text, mark.end())
        if m is None:
            snippet = text[mark.end(): mark.end() + 30].strip()
            raise ParseError(f"the {label} marker is not followed by a whole score (found {snippet!r})")
        if m.group("tail"):
            raise ParseError(f"score {m.group('num')}{m.group('tail')} is not a whole number")
        value = int(m.group("num"))
        den = m.group("den")
        if den is not None and int(den) != top:
            raise ParseError(f"score {value}/{den} is not on the 0-{top} scale")
        if value not in allowed:
            raise ParseError(f"score {value} is not one of the allowed values {sorted(allowed)}")
        line_rest = text[m.end():].split("\n", 1)[0]
        if _SECOND_VALUE.match(line_rest):
            raise ParseError(
                f"two values given as one verdict ({label} {value}{line_rest[:20].rstrip()}): give one score",
                AMBIGUOUS,
            )
        found.append((value, mark.start(), m.end(), label))
    return found


def _feedback_before(text: str, end: int) -> str:
    feedback = text[:end]
    # keep what follows the last "Feedback:" label (drops an echoed prompt before it)
    labels = list(re.finditer(r"\**feedback\**\s*:\**", feedback, flags=re.IGNORECASE))
    if labels:
        feedback = feedback[labels[-1].end():]
    return feedback.strip().strip("*").strip()


def _one_value(verdicts: list[tuple[int, str]]) -> int:
    values = sorted({v for v, _ in verdicts})
    if len(values) > 1:
        shown = ", ".join(f"{label} {v}" for v, label in verdicts)
        raise ParseError(f"the reply gives different verdicts ({shown}); give exactly one final score", AMBIGUOUS)
    return values[0]


def parse_prometheus(text: str, allowed: Collection[int]) -> tuple[int, str]:
    """Read ``Feedback: ... [RESULT] n`` (or a ``Score: n`` line).

    Args:
        text: the raw reply.
        allowed: the values the prompt offered (e.g. ``range(0, 6)``).

    Returns:
        ``(score, feedback)``: the feedback is the text before the last verdict, with a leading
        ``Feedback:`` removed.

    Raises:
        ParseError: no verdict; a malformed or disallowed value (``[RESULT] 7``, ``4.5``,
            ``3/10``); reason ``ambiguous`` when verdicts disagree or one offers two values.
    """
    if not text or not text.strip():
        raise ParseError("empty reply")
    verdicts = _text_verdicts(text, allowed)
    if not verdicts:
        raise ParseError("no verdict found: expected '[RESULT] <score>' (or 'Score: <score>') in the reply")
    value = _one_value([(v, label) for v, _, _, label in verdicts])
    return value, _feedback_before(text, verdicts[-1][1])


_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


def iter_json_objects(text: str) -> Iterator[tuple[dict[str, Any], int, int]]:
    """Every top-level JSON object in ``text`` (bare, fenced or inside prose), with its span.

    Braces inside JSON strings are respected; spans that do not parse are skipped.
    """
    i, n = 0, len(text)
    while i < n:
        start = text.find("{", i)
        if start == -1:
            return
        depth, in_str, esc, end = 0, False, False, -1
        for j in range(start, n):
            ch = text[j]
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    end = j
                    break
        if end == -1:
            return  # unbalanced to the end: a cut-off reply
        try:
            obj = json.loads(text[start: end + 1])
        except ValueError:
            i = start + 1  # not JSON (prose in braces): look inside it
            continue
        if isinstance(obj, dict):
            yield obj, start, end + 1
        i = end + 1


def extract_json_object(text: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON object a reply holds: the whole text, or the one object in a fence or in prose.

    With ``schema``, only objects holding the schema's required top-level fields count (an echoed
    schema or an example does not). Two *different* such objects are ambiguous (never "the last
    one wins"); identical repeats are one.

    Raises:
        ParseError: no JSON object (truncated JSON, prose only, an array); reason ``ambiguous``
            for two different candidate objects.
    """
    if not text or not text.strip():
        raise ParseError("empty reply")
    try:
        whole = json.loads(text.strip())
    except ValueError as e:
        whole = None
        first_err = f"invalid JSON ({getattr(e, 'msg', e)} at position {getattr(e, 'pos', '?')})"
    else:
        if isinstance(whole, dict):
            return whole
        first_err = f"expected a JSON object, got {type(whole).__name__}"
    objects = [obj for obj, _, _ in iter_json_objects(text)]
    required = [k for k in (schema or {}).get("required", [])]
    candidates = [o for o in objects if all(k in o for k in required)] if required else objects
    if not candidates:
        if objects:
            return objects[-1]  # the validator names what is missing
        raise ParseError(first_err if "{" in text else "no JSON object in the reply")
    distinct = []
    for c in candidates:
        if c not in distinct:
            distinct.append(c)
    if len(distinct) > 1:
        raise ParseError(
            f"the reply holds {len(distinct)} different JSON answers; give exactly one JSON object", AMBIGUOUS
        )
    return distinct[0]


_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def validate_schema(value: Any, schema: dict[str, Any], path: str = "$") -> None:
    """Check ``value`` against the subset of JSON Schema our prompts use (type, properties,
    required, items, enum, minimum, maximum, minItems, maxItems, minLength).
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
        shown = schema["enum"] if len(schema["enum"]) <= 12 else f"{schema['enum'][:6]} ... {schema['enum'][-2:]}"
        raise ParseError(f"{path}: {value!r} is not one of {shown}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ParseError(f"{path}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise ParseError(f"{path}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, str) and "minLength" in schema and len(value.strip()) < schema["minLength"]:
        raise ParseError(f"{path}: the text is empty" if schema["minLength"] == 1 else
                         f"{path}: shorter than {schema['minLength']} characters")
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


def reply_object(response: ChatResponse, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON object of a reply: the provider's parsed structured output, else the one in the text."""
    if response.data is not None:
        return response.data
    return extract_json_object(response.text, schema)


def parse_json_reply(response: ChatResponse, schema: dict[str, Any]) -> dict[str, Any]:
    """The structured reply (provider-parsed data, else JSON in the text), validated."""
    obj = reply_object(response, schema)
    validate_schema(obj, schema)
    return obj


def _json_score(obj: dict[str, Any], allowed: Collection[int], score_field: str) -> int:
    score = obj.get(score_field)
    if isinstance(score, bool) or not isinstance(score, int):
        if isinstance(score, str) and score.strip().lstrip("+-").isdigit():
            score = int(score.strip())
        else:
            raise ParseError(f"field {score_field!r} is not a whole number: {score!r}")
    if score not in allowed:
        raise ParseError(f"score {score} is not one of the allowed values {sorted(allowed)}")
    return score


def parse_score_reply(
    response: ChatResponse,
    *,
    allowed: Collection[int],
    schema: dict[str, Any] | None = None,
    score_field: str = "score",
    feedback_field: str = "feedback",
) -> dict[str, Any]:
    """Read a score from any of the forms in the module docstring.

    Provider-parsed structured data is authoritative. Otherwise every verdict in the text is
    collected -- JSON objects holding ``score_field`` and ``[RESULT]`` / ``Score:`` markers outside
    them -- and they must agree (else ``ambiguous``).

    Returns ``{"score": int, "feedback": str}``.
    """
    if response.data is not None:
        validate_schema(response.data, schema or {"type": "object", "required": [score_field]})
        obj = response.data
        return {"score": _json_score(obj, allowed, score_field), "feedback": str(obj.get(feedback_field, "")).strip()}
    text = response.text or ""
    if not text.strip():
        raise ParseError("empty reply")
    json_objs = [(o, s, e) for o, s, e in iter_json_objects(text) if score_field in o]
    # markers inside a JSON object's strings (a quoted "[RESULT] 5" in the feedback) are not verdicts
    masked = list(text)
    for _, s, e in json_objs:
        masked[s:e] = " " * (e - s)
    text_verdicts = _text_verdicts("".join(masked), allowed)
    verdicts: list[tuple[int, str]] = []
    for obj, _, _ in json_objs:
        if schema is not None:
            validate_schema(obj, schema)
        verdicts.append((_json_score(obj, allowed, score_field), "JSON score"))
    verdicts += [(v, label) for v, _, _, label in text_verdicts]
    if not verdicts:
        if "{" in text:  # a JSON reply that lost its score, or was cut off: say what is wrong with it
            obj = extract_json_object(text, schema)
            validate_schema(obj, schema or {"type": "object", "required": [score_field]})
        raise ParseError(
            "no verdict found: expected a JSON object with a 'score' field, or '[RESULT] <score>' / 'Score: <score>'"
        )
    value = _one_value(verdicts)
    if json_objs:
        feedback = str(json_objs[-1][0].get(feedback_field, "")).strip()
    else:
        feedback = _feedback_before(text, text_verdicts[-1][1])
    return {"score": value, "feedback": feedback}
