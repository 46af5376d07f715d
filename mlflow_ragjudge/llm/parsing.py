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
from ..core.json_text import MAX_JSON_DEPTH, brackets, loads, too_deep
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

_RESULT_MARK = re.compile(r"\[\s*+RESULT\s*+\]", re.IGNORECASE)
# "Score: 4", "**Final score:** 4/5", "Rating = 4" -- a label, then ":" or "=", at a word start.
_SCORE_LABEL = re.compile(
    r"(?<![A-Za-z_])(?:final\s++)?(?:score|rating)\**+\s*+(?:[:=])\**+", re.IGNORECASE
)
# A whole number standing alone after a marker: optional ":" / "=", optional "(", then digits not
# followed by more digits, a decimal part or a letter; optionally "/ 5" or "out of 5"; then what may
# close it (see _value_end). Every repeat is possessive (``*+``): each is followed by something it
# cannot match, so giving back never finds another match -- and without it a run of n spaces after
# "Score:" cost n**4 steps (276 characters took 16 s). Linear (tests/test_linear_parsing.py).
_VALUE_HEAD = re.compile(
    r"\s*+[:=]?\s*+\**+\s*+[\(\[]?\s*+(?P<num>[+-]?\d++)(?P<tail>(?:[.,]\d++)?)"
    r"(?P<frac>\s*+(?:/|out\s++of)\s*+(?P<den>\d++))?",
    re.IGNORECASE,
)
_VALUE_CLOSE = re.compile(r"\s*+[\)\]]?+\**+")
_VALUE_FOLLOW = re.compile(r"$|[\s.,;!)\]*_`\"'~\-–]")
_STARTS_NUMERIC = re.compile(r"\s*+[:=]?\s*+\**+\s*+[\(\[]?\s*+[+-]?\d")
# "[RESULT] 3 or 4", "Score: 3-4", "Score: 3 to 4": two values offered as one verdict, on the same line
_SECOND_VALUE = re.compile(r"[^\S\n]*+(?:or|to|and|-|–|~)[^\S\n]*+\d", re.IGNORECASE)


def _value_end(text: str, pos: int) -> int | None:
    """Where a value read up to ``pos`` ends: after optional whitespace, ``)`` / ``]`` and ``**``, at a
    character that may follow a value (whitespace, punctuation, the end). When the longest such tail
    is followed by something else (``4 points``, ``**4**x``), the tail one character shorter ends it
    (it then stops before a space, a bracket or a star, each of which may follow a value), as the one
    backtracking pattern of earlier versions did; ``None`` when there is no tail and no such character."""
    m = _VALUE_CLOSE.match(text, pos)
    assert m is not None  # every part is optional
    if _VALUE_FOLLOW.match(text, m.end()):
        return m.end()
    return m.end() - 1 if m.end() > pos else None


def _read_value(text: str, pos: int) -> tuple[str, str, str | None, int] | None:
    """``(number, decimal tail, denominator, end)`` of the value after a marker ending at ``pos``."""
    m = _VALUE_HEAD.match(text, pos)
    if m is None:
        return None
    if m.group("frac") is not None:
        end = _value_end(text, m.end())
        if end is not None:
            return m.group("num"), m.group("tail"), m.group("den"), end
    end = _value_end(text, m.end("tail"))  # "4/5x": read as 4 followed by "/", which then fails
    if end is not None:
        return m.group("num"), m.group("tail"), None, end
    if m.group("tail"):  # "5,4+": the number 5, followed by "," (which may follow a value)
        return m.group("num"), "", None, m.end("num")
    return None


#: how far after a marker a malformed value is quoted in the error
_SNIPPET = 30


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
        read = _read_value(text, mark.end())
        if read is None:
            snippet = text[mark.end(): mark.end() + _SNIPPET].strip()
            raise ParseError(f"the {label} marker is not followed by a whole score (found {snippet!r})")
        num, tail, den, end = read
        if tail:
            raise ParseError(f"score {num}{tail} is not a whole number")
        value = int(num)
        if den is not None and int(den) != top:
            raise ParseError(f"score {value}/{den} is not on the 0-{top} scale")
        if value not in allowed:
            raise ParseError(f"score {value} is not one of the allowed values {sorted(allowed)}")
        if _SECOND_VALUE.match(text, end):  # never copies the rest of the reply (one copy per marker was n**2)
            shown = text[end: end + 20].split("\n", 1)[0].rstrip()
            raise ParseError(f"two values given as one verdict ({label} {value}{shown}): give one score",
                             FailureReason.AMBIGUOUS)
        found.append((value, mark.start(), end, label))
    return found


# starts only at the first "*" of a run (a run of n stars was tried from each of its n positions: n**2)
_FEEDBACK_LABEL = re.compile(r"(?:(?<!\*)\*++)?feedback\**+\s*+:\**+", re.IGNORECASE)


def _feedback_before(text: str, end: int) -> str:
    feedback = text[:end]
    # keep what follows the last "Feedback:" label (drops an echoed prompt before it)
    labels = list(_FEEDBACK_LABEL.finditer(feedback))
    if labels:
        feedback = feedback[labels[-1].end():]
    return feedback.strip().strip("*").strip()


def _one_value(verdicts: list[tuple[int, str]]) -> int:
    values = sorted({v for v, _ in verdicts})
    if len(values) > 1:
        shown = ", ".join(f"{label} {v}" for v, label in verdicts)
        raise ParseError(f"the reply gives different verdicts ({shown}); give exactly one final score",
                         FailureReason.AMBIGUOUS)
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

_DECODER = json.JSONDecoder()


class _Span:
    """A ``{ ... }`` span of a reply, with the spans directly inside it."""

    __slots__ = ("open", "close", "inner")

    def __init__(self, open_: int) -> None:
        self.open, self.close = open_, -1
        self.inner: list[_Span] = []


def _outer_span(text: str, start: int) -> _Span | None:
    """The span of the ``{`` at ``start`` and every span inside it, matched in one pass (braces inside
    JSON strings do not count); ``None`` when it is not closed before the end (a cut-off reply)."""
    stack: list[_Span] = []
    arrays = 0
    for j, ch in brackets(text, start):
        if ch == "{":
            span = _Span(j)
            if stack:
                stack[-1].inner.append(span)
            stack.append(span)
            if len(stack) + arrays > MAX_JSON_DEPTH:
                raise too_deep(len(stack) + arrays)
        elif ch == "}":
            span = stack.pop()
            span.close = j
            if not stack:
                return span
        elif ch == "[":
            arrays += 1
            if len(stack) + arrays > MAX_JSON_DEPTH:
                raise too_deep(len(stack) + arrays)
        elif arrays:
            arrays -= 1
    return None


def _objects_in(text: str, span: _Span, failed_at: int | None, out: list[tuple[dict[str, Any], int, int]]) -> None:
    """The JSON objects of ``span``: itself when it decodes, else the objects inside it (prose in braces).

    Each span is decoded at most once: when the decoder stopped at ``failed_at`` inside an inner span, it
    had read that span's start as an object and would stop at the same place in it, so that span is not
    decoded again (only what lies inside it). So the work is linear in the reply, however deep the
    braces nest (decoding every span again, as earlier versions did, was quadratic)."""
    if failed_at is None:
        try:
            obj, end = _DECODER.raw_decode(text, span.open)
        except json.JSONDecodeError as e:
            failed_at = e.pos
        except RecursionError:
            raise too_deep(MAX_JSON_DEPTH) from None
        else:
            if end == span.close + 1 and isinstance(obj, dict):
                out.append((obj, span.open, end))
                return
            failed_at = min(end, span.close)
    for inner in span.inner:
        _objects_in(text, inner, failed_at if inner.open < failed_at <= inner.close else None, out)


def iter_json_objects(text: str) -> Iterator[tuple[dict[str, Any], int, int]]:
    """Every top-level JSON object in ``text`` (bare, fenced or inside prose), with its span.

    Braces inside JSON strings are respected; a span that does not parse is looked inside. One pass
    over the text, and each span is decoded at most once (linear, tests/test_linear_parsing.py).

    Raises:
        ParseError: the reply nests JSON deeper than :data:`MAX_JSON_DEPTH`.
    """
    i = 0
    while True:
        start = text.find("{", i)
        if start == -1:
            return
        span = _outer_span(text, start)
        if span is None:
            return  # unbalanced to the end: a cut-off reply
        found: list[tuple[dict[str, Any], int, int]] = []
        _objects_in(text, span, None, found)
        yield from found
        i = span.close + 1


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
        whole = loads(text.strip())
    except ParseError:
        raise
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
    distinct = [candidates[0]]
    for c in candidates:
        if c != distinct[0]:  # stop at the first different one (comparing with every one kept was n**2)
            distinct.append(c)
            break
    if len(distinct) > 1:
        n = max(2, len({json.dumps(c, sort_keys=True, default=str) for c in candidates}))
        raise ParseError(
            f"the reply holds {n} different JSON answers; give exactly one JSON object", FailureReason.AMBIGUOUS
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
