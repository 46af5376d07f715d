"""Statement (claim) extraction shared by the claim-based judges.

One LLM call splits a text into short, self-contained claims (one fact each, no pronouns). The
faithfulness judge splits the *response*; context recall (and context precision, when both run) split
the *reference*. Sharing is the judge client's policy (``dedupe``, on in the evaluator and the scorers):
an extraction identical to one in flight or done recently is not sent again, so every metric that needs
the statements of the same text pays for one extraction. Only successful replies are shared; a failed
extraction is asked again by the next caller. On a shared reply no transcript record is repeated: the
result carries the ``call_ids`` of the record that produced it, so the transcript stays one record per
request.

The second half of the module holds the small helpers the claim-based judges share: numbering
passages, per-call schemas for numbered verdict lists and the salvaging request loop that reads
them by number (:func:`ask_numbered`), mapping a failed call to a
:class:`~mlflow_ragjudge.core.types.JudgeResult`, and rough token estimates.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.text import tokenize
from ..core.types import FailureReason, JudgeResult
from ..llm.backends import ChatRequest, ChatResponse, JsonSchema
from ..llm.client import CallResult, JudgeClient
from ..llm.parsing import ParseError, reply_object, validate_schema
from ..llm.pricing import approx_tokens, messages_tokens
from ..llm.prompts import Prompt, fence_items, load_prompt
from .spec import Estimate

__all__ = [
    "MIN_STATEMENTS",
    "statement_cap",
    "Extraction",
    "StatementExtractor",
    "NumberedVerdicts",
    "prompt_version",
    "number_items",
    "index_schema",
    "numbered_list_schema",
    "numbered_parser",
    "ask_numbered",
    "failed_result",
    "approx_tokens",
    "estimate_messages",
    "add_estimates",
]

TRUNCATION_MARK = " [...truncated]"


def prompt_version(prompt: Prompt) -> str:
    """The version label recorded with results and used in the cache key: ``<name>-v<version>-<language>``."""
    return f"{prompt.name}-v{prompt.version}-{prompt.language}"


# --------------------------------------------------------------------------- extraction

#: statements kept per text: this many, plus one per word of the text (tokens as :func:`~mlflow_ragjudge.core.text.
#: tokenize` counts them: a CJK character is one). A word carries at most about one fact, so an honest extraction
#: stays well below the cap; a reply beyond it has gone wrong (5,000 claims for a 4-word answer, all of them
#: then verified: 184k output tokens). The first ones are kept and the cut is recorded (``statements_cut``).
MIN_STATEMENTS = 10


def statement_cap(text: str) -> int:
    """How many statements of ``text`` are kept (:data:`MIN_STATEMENTS` + its number of words)."""
    return MIN_STATEMENTS + len(tokenize(text or ""))



@dataclass(frozen=True)
class Extraction:
    """What :meth:`StatementExtractor.extract` produced for one text.

    Attributes:
        ok: True when the statements are known (possibly none).
        statements: the claims, in the order the model gave them (blank and repeated ones dropped).
        failure: the failure reason when not ``ok`` (a :class:`FailureReason`, never a message prefix).
        error: the failure message.
        raw: the last raw reply (kept on failure).
        records: transcript records of the requests made *for this caller* (empty on a memo hit
            and when no request was needed).
        call_ids: ids of the transcript records that produced the statements (also on a memo hit).
        memo_hit: the statements came from the memo (or from a concurrent identical extraction).
        skipped: the text was empty, so no request was made.
        n_extracted: how many statements the reply gave (more than ``statements`` holds when cut).
        cap: the most statements kept for this text (:func:`statement_cap`).
    """

    ok: bool
    statements: tuple[str, ...] = ()
    failure: FailureReason | None = None
    error: str = ""
    raw: str | None = None
    records: tuple[dict[str, Any], ...] = ()
    call_ids: tuple[str, ...] = ()
    memo_hit: bool = False
    skipped: bool = False
    n_extracted: int = 0
    cap: int = 0

    @property
    def cut(self) -> dict[str, Any] | None:
        """``{"extracted", "kept", "cap"}`` when the reply gave more statements than the cap, else None."""
        if self.n_extracted <= len(self.statements):
            return None
        return {"extracted": self.n_extracted, "kept": len(self.statements), "cap": self.cap,
                "rule": f"at most {MIN_STATEMENTS} + one per word of the text; the first ones are kept"}


class StatementExtractor:
    """Split texts into short self-contained claims, one LLM call per distinct (question, text).

    Sharing is the judge client's policy: with ``dedupe`` on (as in the evaluator and the scorers), an
    extraction identical to one in flight or done recently costs nothing, so every metric that needs the
    statements of the same text pays for one extraction. On such a shared reply the result carries no
    transcript record of its own, only the ``call_ids`` of the record that produced it (``memo_hit``), so
    the transcript stays one record per request.

    Args:
        client: the judge client.
        language: prompt language (``en`` or ``ja``; texts in any language work, and the
            claims are written in the text's language).
        max_tokens: reply budget of the extraction call.

    Example:
        >>> ext = StatementExtractor(client)                  # doctest: +SKIP
        >>> ext.extract("Paris is the capital of France.", question="Capital?").statements  # doctest: +SKIP
        ('Paris is the capital of France.',)
    """

    def __init__(self, client: JudgeClient, *, language: str = "en", max_tokens: int = 2048) -> None:
        self.client = client
        self.language = language
        self.max_tokens = max_tokens
        self.prompt = load_prompt("statements", language)
        self.schema: dict[str, Any] = self.prompt.schema or {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def prompt_version(self) -> str:
        return prompt_version(self.prompt)

    def messages(self, text: str, question: str = "") -> list[dict[str, str]]:
        """The rendered extraction prompt for ``text``."""
        return self.prompt.render(
            "json", question=question.strip() or "(no question given)", text=text.strip()
        )

    def _request(self, text: str, question: str) -> ChatRequest:
        return ChatRequest.of(self.messages(text, question), max_tokens=self.max_tokens,
                              json_schema=JsonSchema("statements", self.schema))

    def extract(self, text: str, *, question: str = "") -> Extraction:
        """The claims of ``text`` (read in the light of ``question``). Never raises for model failures.

        An empty or blank text has no claims and costs no request.
        """
        text = (text or "").strip()
        question = (question or "").strip()
        if not text:
            return Extraction(ok=True, skipped=True)
        call = self.client.call(self._request(text, question), parse=self._parse, prompt_version=self.prompt_version,
                                purpose="statements")
        records = tuple(call.records)
        shared = bool(records) and all(r.get("shared") for r in records)
        with self._lock:
            if shared:
                self.hits += 1
            else:
                self.misses += 1
        if shared:  # the reply of an identical extraction: point at its record instead of repeating one
            ids = tuple(str(r.get("shared_from")) for r in records)
            records = ()
        else:
            ids = tuple(str(r.get("call_id")) for r in records)
        if not call.ok:
            return Extraction(ok=False, failure=call.failure or FailureReason.INTERNAL_ERROR, error=call.error,
                              raw=call.raw, records=records, call_ids=ids)
        cap = statement_cap(text)
        statements = tuple(call.parsed)
        return Extraction(ok=True, statements=statements[:cap], raw=call.raw, records=records, call_ids=ids,
                          memo_hit=shared, n_extracted=len(statements), cap=cap)

    def _parse(self, response: ChatResponse) -> list[str]:
        obj = reply_object(response, self.schema)
        validate_schema(obj, self.schema)
        out: list[str] = []
        seen: set[str] = set()
        for s in obj["statements"]:
            s = " ".join(s.split())
            if s and s not in seen:
                seen.add(s)
                out.append(s)
        return out

    def estimate(self, text: str, question: str = "") -> Estimate:
        """Upper-bound cost of extracting ``text`` (0 calls when the client holds its reply, or it is empty)."""
        text = (text or "").strip()
        if not text or self.client.is_memoised(self._request(text, question.strip()), self.prompt_version):
            return {"calls": 0, "input_tokens": 0, "output_tokens": 0}
        out = min(self.max_tokens, math.ceil(1.5 * approx_tokens(text)) + 16)
        return estimate_messages(self.messages(text, question), out)


# --------------------------------------------------------------------------- shared helpers


def number_items(
    items: Sequence[str],
    *,
    max_chars: int | None = None,
    empty: str = "(empty)",
    numbers: Sequence[int] | None = None,
    fence: str | None = None,
) -> tuple[str, dict]:
    """Number items ``[1] ...`` one per line, whitespace collapsed, each cut at ``max_chars``.

    ``fence`` (e.g. ``"passage"``): each item between its own numbered tags instead
    (:func:`~mlflow_ragjudge.llm.prompts.fence_items`), for text we did not write, where an item holding
    ``[2] ...`` must not look like item 2.

    Every item is shown (the judges need one verdict per item, so none may be dropped); an item
    longer than ``max_chars`` is cut and marked ``[...truncated]``. ``numbers`` gives the items
    their own numbers (a follow-up that asks again about claims 3 and 7 shows them as [3] and [7]).

    Returns:
        The text and a record ``{"n", "n_truncated", "truncated": [item numbers], "chars"}``.
    """
    nums = list(numbers) if numbers is not None else list(range(1, len(items) + 1))
    if len(nums) != len(items):
        raise ValueError(f"{len(items)} items but {len(nums)} numbers")
    lines: list[str] = []
    cut: list[int] = []
    for i, item in zip(nums, items):
        body = " ".join(str(item or "").split()) or empty
        if max_chars is not None and len(body) > max_chars:
            body = body[: max(0, max_chars - len(TRUNCATION_MARK))] + TRUNCATION_MARK
            cut.append(i)
        lines.append(body if fence else f"[{i}] {body}")
    text = fence_items(lines, kind=fence, numbers=nums) if fence else "\n".join(lines)
    return text, {"n": len(lines), "n_truncated": len(cut), "truncated": cut, "chars": len(text)}


#: index fields list their allowed values as an enum up to this many values, a range beyond
MAX_INDEX_ENUM = 250


def index_schema(numbers: Sequence[int]) -> dict[str, Any]:
    """The schema of an item-number field: exactly the numbers asked about."""
    nums = sorted(numbers)
    if len(nums) <= MAX_INDEX_ENUM or nums != list(range(nums[0], nums[-1] + 1)):
        return {"type": "integer", "enum": nums}
    return {"type": "integer", "minimum": nums[0], "maximum": nums[-1]}


def numbered_list_schema(base: dict[str, Any], *, list_key: str, index_key: str,
                         numbers: Sequence[int]) -> dict[str, Any]:
    """A per-call copy of a verdict-list schema that says what the validator checks: exactly one
    entry per number asked about (``minItems = maxItems = len(numbers)``) and index values limited
    to those numbers. A model that follows it cannot leave a number out or invent one."""
    # copies along the changed path only (the rest is shared with ``base``: schemas are never changed in place);
    # a deep copy per call was a tenth of the client's own CPU
    arr = base["properties"][list_key]
    items = arr["items"]
    arr = {**arr, "minItems": len(numbers), "maxItems": len(numbers),
           "items": {**items, "properties": {**items["properties"], index_key: index_schema(numbers)}}}
    return {**base, "properties": {**base["properties"], list_key: arr}}


@dataclass
class NumberedVerdicts:
    """What :func:`ask_numbered` got: one entry per number, or the failure.

    Attributes:
        ok: every number has exactly one verdict.
        entries: number -> the verdict entry, in number order (on failure: the ones obtained).
        records: transcript records of every request made.
        raw: the last raw reply.
        failure, error: why it failed.
        salvage: when the first reply missed numbers: ``{"missing_in_first_reply", "asked_again",
            "recovered", "first_reply_problems"}``; else None.
        problems: what was set aside from the replies (entries that did not validate, numbers not
            asked about, conflicting repeats), when anything was.
    """

    ok: bool
    entries: dict[int, dict[str, Any]]
    records: list[dict[str, Any]]
    raw: str | None = None
    failure: FailureReason | None = None
    error: str = ""
    salvage: dict[str, Any] | None = None
    problems: list[dict[str, Any]] = field(default_factory=list)

    def note(self, details: dict[str, Any]) -> None:
        """Record the salvage and the set-aside entries in a result's ``details`` (when there were any)."""
        if self.salvage is not None:
            details["salvaged"] = self.salvage
        if self.problems:
            details["reply_problems"] = self.problems


def _entry_key(entry: dict[str, Any], index_key: str) -> str:
    return json.dumps({k: v for k, v in entry.items() if k not in (index_key, "reason")}, sort_keys=True)


def numbered_parser(
    schema: dict[str, Any], *, list_key: str, index_key: str, numbers: Sequence[int], noun: str,
    lowercase: Sequence[str] = (),
) -> Callable[[ChatResponse], dict[str, Any]]:
    """A ``parse=`` function that reads numbered verdicts **by their numbers**, never by position.

    Entries that do not validate, name a number that was not asked about, or repeat a number with
    a different verdict are set aside (recorded under ``problems``) and their numbers count as
    missing; repeats with the same verdict are one entry. Raises :class:`ParseError` only when
    the reply holds no usable entry at all (the client then re-asks with what was wrong).

    Returns:
        ``{"entries": {number: entry}, "problems": {...}}``.
    """
    items = schema["properties"][list_key]["items"]
    # the number is checked below, by value
    item_schema = {**items, "properties": {**items["properties"], index_key: {"type": "integer"}}}
    asked = set(numbers)

    def parse(response: ChatResponse) -> dict[str, Any]:
        obj = reply_object(response, schema)
        items = obj.get(list_key) if isinstance(obj, dict) else None
        if not isinstance(items, list):
            raise ParseError(f"$: missing field {list_key!r} (a list with one entry per {noun})")
        found: dict[int, dict[str, Any]] = {}
        conflicts: set[int] = set()
        invalid: list[str] = []
        outside: list[Any] = []
        for e in items:
            if isinstance(e, dict):
                for f in lowercase:
                    if isinstance(e.get(f), str):
                        e[f] = e[f].strip().lower()
            try:
                validate_schema(e, item_schema, f"$.{list_key}[]")
            except ParseError as err:
                invalid.append(str(err))
                continue
            n = e[index_key]
            if n not in asked:
                outside.append(n)
            elif n in found and _entry_key(found[n], index_key) != _entry_key(e, index_key):
                conflicts.add(n)
            else:
                found.setdefault(n, e)
        for n in conflicts:
            found.pop(n, None)
        problems = {"invalid": invalid, "not_asked": outside, "conflicting": sorted(conflicts)}
        if not found:
            why = invalid[0] if invalid else (
                f"{noun} numbers {sorted(conflicts)} have conflicting verdicts" if conflicts else
                f"no entry for any of the {noun}s asked about ({_ranges(sorted(asked))})")
            reason = (FailureReason.PARSE_ERROR if invalid else
                      FailureReason.AMBIGUOUS if conflicts else FailureReason.INCONSISTENT)
            raise ParseError(f"{why}: give exactly one entry for each {noun}", reason)
        return {"entries": found, "problems": problems}

    return parse


def _ranges(nums: Sequence[int]) -> str:
    return ", ".join(str(n) for n in nums[:20]) + (" ..." if len(nums) > 20 else "")


def ask_numbered(
    client: JudgeClient,
    *,
    numbers: Sequence[int],
    render: Callable[[list[int]], list[dict[str, str]]],
    schema: dict[str, Any],
    schema_name: str,
    list_key: str,
    index_key: str,
    noun: str,
    prompt_version: str,
    purpose: str,
    max_tokens: int,
    lowercase: Sequence[str] = (),
) -> NumberedVerdicts:
    """Get one verdict per numbered item, salvaging instead of discarding.

    The request's schema is built per call (:func:`numbered_list_schema`). When the reply misses
    some numbers (or gives one a conflicting verdict), one follow-up request asks about **those
    items only**, shown under their own numbers, and the answers are merged by number. What is
    still missing then fails the row (``inconsistent``, or ``ambiguous`` for conflicting
    verdicts), with every reply kept. Nothing is padded, reordered or guessed.
    """
    wanted = list(numbers)
    entries: dict[int, dict[str, Any]] = {}
    records: list[dict[str, Any]] = []
    salvage: dict[str, Any] | None = None
    asked = wanted
    raw: str | None = None
    conflicting: set[int] = set()
    problems: list[dict[str, Any]] = []
    for attempt in (1, 2):
        call_schema = numbered_list_schema(schema, list_key=list_key, index_key=index_key, numbers=asked)
        request = ChatRequest.of(render(asked), max_tokens=max_tokens,
                                 json_schema=JsonSchema(schema_name, call_schema))
        parse = numbered_parser(call_schema, list_key=list_key, index_key=index_key, numbers=asked, noun=noun,
                                lowercase=lowercase)
        call = client.call(request, parse=parse, prompt_version=prompt_version,
                           purpose=purpose if attempt == 1 else f"{purpose}:missing")
        records += call.records
        raw = call.raw if call.raw is not None else raw
        if not call.ok:
            error = call.error
            if attempt == 2 and call.failure in (FailureReason.INCONSISTENT, FailureReason.AMBIGUOUS):
                what = "conflicting verdicts for" if call.failure is FailureReason.AMBIGUOUS else "no verdict for"
                error = f"{what} {noun} number(s) {asked} even after asking about them again ({call.error})"
            return NumberedVerdicts(False, dict(sorted(entries.items())), records, raw, call.failure,
                                    error, salvage, problems)
        got: dict[int, dict[str, Any]] = call.parsed["entries"]
        entries.update(got)
        found_problems = {k: v for k, v in call.parsed["problems"].items() if v}
        if found_problems:
            problems.append({"reply": attempt, **found_problems})
        conflicting = set(call.parsed["problems"]["conflicting"])
        missing = [n for n in wanted if n not in entries]
        if attempt == 2 and salvage is not None:
            salvage["recovered"] = sorted(got)
        if not missing:
            break
        if attempt == 1:
            salvage = {"missing_in_first_reply": missing, "asked_again": missing,
                       "first_reply_problems": call.parsed["problems"]}
            asked = missing
    missing = [n for n in wanted if n not in entries]
    if missing:
        reason = FailureReason.AMBIGUOUS if set(missing) <= conflicting else FailureReason.INCONSISTENT
        what = "conflicting verdicts for" if reason is FailureReason.AMBIGUOUS else "no verdict for"
        return NumberedVerdicts(
            False, dict(sorted(entries.items())), records, raw, reason,
            f"{what} {noun} number(s) {missing} even after asking about them again", salvage, problems,
        )
    return NumberedVerdicts(True, {n: entries[n] for n in wanted}, records, raw, salvage=salvage, problems=problems)


def failed_result(
    call: CallResult | Extraction | NumberedVerdicts,
    *,
    stage: str,
    details: dict[str, Any],
    calls: list[dict[str, Any]],
) -> JudgeResult:
    """A failed :class:`JudgeResult` from a failed call, keeping the raw reply and the reason
    (``parse_error``, ``inconsistent``, ``ambiguous``, ``timeout``, ``rate_limited``, ...)."""
    details = {**details, "failed_stage": stage}
    return JudgeResult.failed(call.failure or FailureReason.INTERNAL_ERROR, f"{stage}: {call.error or ''}",
                              raw=call.raw, details=details, calls=calls)


def estimate_messages(messages: Sequence[dict[str, str]], output_tokens: int, calls: int = 1) -> Estimate:
    """Estimate for ``calls`` requests of ``messages`` (4 tokens of overhead per message)."""
    inp = messages_tokens(messages)
    return {"calls": calls, "input_tokens": inp * calls, "output_tokens": output_tokens * calls}


def add_estimates(*parts: Estimate) -> Estimate:
    """Sum estimates."""
    return {"calls": sum(p["calls"] for p in parts), "input_tokens": sum(p["input_tokens"] for p in parts),
            "output_tokens": sum(p["output_tokens"] for p in parts)}
