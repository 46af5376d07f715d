"""Statement (claim) extraction shared by the claim-based judges, with an in-memory memo.

One LLM call splits a text into short, self-contained claims (one fact each, no pronouns). The
faithfulness judge splits the *response*; context recall splits the *reference*. The extractor
keeps what it extracted in a per-process memo keyed by (question, text), so every metric that
needs the statements of the same text in the same row -- and every variant of a sweep that
shares the reference -- pays for one extraction. The memo is thread-safe and also merges
concurrent requests for the same text: while one thread is extracting, the others wait for
its result instead of sending the same request (MLflow calls scorers from thread pools).

Only successful extractions are memoised; a failed one is retried by the next caller. On a
memo hit no request is sent and no transcript record is repeated: the result carries the
``call_ids`` of the records that produced it, so the transcript stays one record per request.

The second half of the module holds the small helpers the claim-based judges share: numbering
passages, a strict parser for numbered verdict lists, mapping a failed call to a
:class:`~mlflow_ragjudge.types.JudgeResult`, and rough token estimates.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from ..backends import ChatRequest, ChatResponse, JsonSchema
from ..client import CallResult, JudgeClient
from ..parsing import ParseError, extract_json_object, validate_schema
from ..prompts import Prompt, load_prompt
from ..text import is_cjk_char
from ..types import FailureReason, JudgeResult

__all__ = [
    "Extraction",
    "StatementExtractor",
    "INCONSISTENT",
    "prompt_version",
    "number_items",
    "numbered_verdicts_parser",
    "failed_result",
    "approx_tokens",
    "estimate_messages",
    "add_estimates",
]

#: prefix of a parse error that means "well-formed JSON whose items do not match what was asked"
#: (a verdict list shorter or longer than the claims, a repeated or missing number). The client
#: re-asks once like for any unreadable reply and never caches it; a judge reports what is still
#: inconsistent after the re-ask as ``failed("inconsistent")``.
INCONSISTENT = "inconsistent: "

TRUNCATION_MARK = " [...truncated]"


def prompt_version(prompt: Prompt) -> str:
    """The version label recorded with results and used in the cache key: ``<name>-v<version>-<language>``."""
    return f"{prompt.name}-v{prompt.version}-{prompt.language}"


# --------------------------------------------------------------------------- extraction


@dataclass(frozen=True)
class Extraction:
    """What :meth:`StatementExtractor.extract` produced for one text.

    Attributes:
        ok: True when the statements are known (possibly none).
        statements: the claims, in the order the model gave them (blank and repeated ones dropped).
        failure: the failure reason code when not ``ok``.
        error: the failure message.
        raw: the last raw reply (kept on failure).
        records: transcript records of the requests made *for this caller* (empty on a memo hit
            and when no request was needed).
        call_ids: ids of the transcript records that produced the statements (also on a memo hit).
        memo_hit: the statements came from the memo (or from a concurrent identical extraction).
        skipped: the text was empty, so no request was made.
    """

    ok: bool
    statements: tuple[str, ...] = ()
    failure: str | None = None
    error: str = ""
    raw: str | None = None
    records: tuple[dict[str, Any], ...] = ()
    call_ids: tuple[str, ...] = ()
    memo_hit: bool = False
    skipped: bool = False


class StatementExtractor:
    """Split texts into short self-contained claims, one LLM call per distinct (question, text).

    Args:
        client: the judge client.
        language: prompt language (``en`` or ``ja``; texts in any language work, and the
            claims are written in the text's language).
        max_tokens: reply budget of the extraction call.
        memo_size: how many extractions the memo keeps (least recently used are dropped).

    Example:
        >>> ext = StatementExtractor(client)                  # doctest: +SKIP
        >>> ext.extract("Paris is the capital of France.", question="Capital?").statements  # doctest: +SKIP
        ('Paris is the capital of France.',)
    """

    def __init__(
        self, client: JudgeClient, *, language: str = "en", max_tokens: int = 2048, memo_size: int = 4096
    ) -> None:
        if memo_size < 1:
            raise ValueError(f"memo_size must be >= 1, got {memo_size}")
        self.client = client
        self.language = language
        self.max_tokens = max_tokens
        self.memo_size = memo_size
        self.prompt = load_prompt("statements", language)
        self.schema: dict[str, Any] = self.prompt.schema or {}
        self._lock = threading.Lock()
        self._memo: OrderedDict[tuple[str, str], Extraction] = OrderedDict()
        self._pending: dict[tuple[str, str], Future[Extraction]] = {}
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

    def clear(self) -> None:
        """Forget every memoised extraction."""
        with self._lock:
            self._memo.clear()

    def extract(self, text: str, *, question: str = "") -> Extraction:
        """The claims of ``text`` (read in the light of ``question``). Never raises for model failures.

        An empty or blank text has no claims and costs no request.
        """
        text = (text or "").strip()
        question = (question or "").strip()
        if not text:
            return Extraction(ok=True, skipped=True)
        key = (question, text)
        with self._lock:
            done = self._memo.get(key)
            if done is not None:
                self._memo.move_to_end(key)
                self.hits += 1
                return replace(done, records=(), memo_hit=True)
            pending = self._pending.get(key)
            owner = pending is None
            if owner:
                pending = self._pending[key] = Future()
                self.misses += 1
            else:
                self.hits += 1
        assert pending is not None
        if not owner:
            return replace(pending.result(), records=(), memo_hit=True)
        result = Extraction(ok=False, failure=FailureReason.INTERNAL_ERROR.value, error="extraction did not finish")
        try:
            result = self._extract(text, question)
        finally:
            with self._lock:
                self._pending.pop(key, None)
                if result.ok:
                    self._memo[key] = result
                    while len(self._memo) > self.memo_size:
                        self._memo.popitem(last=False)
            pending.set_result(result)
        return result

    def _parse(self, response: ChatResponse) -> list[str]:
        obj = response.data if response.data is not None else extract_json_object(response.text)
        validate_schema(obj, self.schema)
        out: list[str] = []
        seen: set[str] = set()
        for s in obj["statements"]:
            s = " ".join(s.split())
            if s and s not in seen:
                seen.add(s)
                out.append(s)
        return out

    def _extract(self, text: str, question: str) -> Extraction:
        request = ChatRequest.of(
            self.messages(text, question),
            max_tokens=self.max_tokens,
            json_schema=JsonSchema("statements", self.schema),
        )
        call = self.client.call(request, parse=self._parse, prompt_version=self.prompt_version, purpose="statements")
        records = tuple(call.records)
        ids = tuple(str(r.get("call_id")) for r in records)
        if not call.ok:
            failure = call.failure.value if call.failure is not None else FailureReason.INTERNAL_ERROR.value
            return Extraction(ok=False, failure=failure, error=call.error, raw=call.raw, records=records, call_ids=ids)
        return Extraction(ok=True, statements=tuple(call.parsed), raw=call.raw, records=records, call_ids=ids)

    def estimate(self, text: str, question: str = "") -> dict[str, int]:
        """Upper-bound cost of extracting ``text`` (0 calls when it is memoised or empty)."""
        text = (text or "").strip()
        with self._lock:
            memoised = (question.strip(), text) in self._memo
        if not text or memoised:
            return {"calls": 0, "input_tokens": 0, "output_tokens": 0}
        out = min(self.max_tokens, math.ceil(1.5 * approx_tokens(text)) + 16)
        return estimate_messages(self.messages(text, question), out)


# --------------------------------------------------------------------------- shared helpers


def number_items(items: Sequence[str], *, max_chars: int | None = None, empty: str = "(empty)") -> tuple[str, dict]:
    """Number items ``[1] ...`` one per line, whitespace collapsed, each cut at ``max_chars``.

    Every item is shown (the judges need one verdict per item, so none may be dropped); an item
    longer than ``max_chars`` is cut and marked ``[...truncated]``.

    Returns:
        The text and a record ``{"n", "n_truncated", "truncated": [item numbers], "chars"}``.
    """
    lines: list[str] = []
    cut: list[int] = []
    for i, item in enumerate(items, 1):
        body = " ".join(str(item or "").split()) or empty
        if max_chars is not None and len(body) > max_chars:
            body = body[: max(0, max_chars - len(TRUNCATION_MARK))] + TRUNCATION_MARK
            cut.append(i)
        lines.append(f"[{i}] {body}")
    text = "\n".join(lines)
    return text, {"n": len(lines), "n_truncated": len(cut), "truncated": cut, "chars": len(text)}


def numbered_verdicts_parser(
    schema: dict[str, Any],
    *,
    list_key: str,
    index_key: str,
    n: int,
    noun: str,
    lowercase: Sequence[str] = (),
) -> Callable[[ChatResponse], list[dict[str, Any]]]:
    """A ``parse=`` function for a reply holding one numbered verdict per item.

    The reply must be a JSON object that validates against ``schema`` (after lower-casing the
    string fields named in ``lowercase``) whose ``list_key`` list has exactly one entry for each
    number ``1..n`` under ``index_key``. A schema violation raises :class:`ParseError`; a list
    that is shorter or longer, repeats a number, skips one or names one outside ``1..n`` raises a
    :class:`ParseError` starting with :data:`INCONSISTENT`. Nothing is padded or guessed.

    Returns:
        The entries sorted by their number.
    """

    def parse(response: ChatResponse) -> list[dict[str, Any]]:
        obj = response.data if response.data is not None else extract_json_object(response.text)
        entries = obj.get(list_key) if isinstance(obj, dict) else None
        if isinstance(entries, list):
            for e in entries:
                if isinstance(e, dict):
                    for f in lowercase:
                        if isinstance(e.get(f), str):
                            e[f] = e[f].strip().lower()
        validate_schema(obj, schema)
        items: list[dict[str, Any]] = obj[list_key]
        nums = [e[index_key] for e in items]
        problems: list[str] = []
        if len(items) != n:
            problems.append(f"{len(items)} entries for {n} {noun}s")
        repeated = sorted(x for x, count in Counter(nums).items() if count > 1)
        if repeated:
            problems.append(f"{noun} number(s) {repeated} repeated")
        missing = sorted(set(range(1, n + 1)) - set(nums))
        if missing:
            problems.append(f"{noun} number(s) {missing} missing")
        outside = sorted(x for x in set(nums) if not 1 <= x <= n)
        if outside:
            problems.append(f"number(s) {outside} are not {noun}s (valid: 1..{n})")
        if problems:
            raise ParseError(
                f"{INCONSISTENT}{'; '.join(problems)}: give exactly one entry for each {noun} 1..{n}"
            )
        return sorted(items, key=lambda e: e[index_key])

    return parse


def failed_result(
    call: CallResult | Extraction,
    *,
    stage: str,
    details: dict[str, Any],
    calls: list[dict[str, Any]],
) -> JudgeResult:
    """A failed :class:`JudgeResult` from a failed call, keeping the raw reply.

    A parse failure whose message starts with :data:`INCONSISTENT` becomes reason
    ``inconsistent``; every other failure keeps the client's reason (``parse_error``,
    ``timeout``, ``rate_limited``, ...).
    """
    error = call.error or ""
    if isinstance(call, CallResult):
        reason: str = call.failure.value if call.failure is not None else FailureReason.INTERNAL_ERROR.value
    else:
        reason = call.failure or FailureReason.INTERNAL_ERROR.value
    if reason == FailureReason.PARSE_ERROR.value and error.startswith(INCONSISTENT):
        reason = FailureReason.INCONSISTENT.value
        error = error[len(INCONSISTENT):]
    details = {**details, "failed_stage": stage}
    return JudgeResult.failed(reason, f"{stage}: {error}", raw=call.raw, details=details, calls=calls)


def approx_tokens(text: str) -> int:
    """A deliberately high estimate of a text's token count, with no tokenizer.

    CJK characters count 1.5 tokens each, any other character 1/3 of a token (BPE tokenizers
    average about 4 characters per token on English prose and 1-2 tokens per CJK character).
    """
    if not text:
        return 0
    cjk = sum(1 for ch in text if is_cjk_char(ch))
    return math.ceil(cjk * 1.5 + (len(text) - cjk) / 3)


def estimate_messages(messages: Sequence[dict[str, str]], output_tokens: int, calls: int = 1) -> dict[str, int]:
    """Estimate for ``calls`` requests of ``messages`` (4 tokens of overhead per message)."""
    inp = sum(approx_tokens(m["content"]) + 4 for m in messages)
    return {"calls": calls, "input_tokens": inp * calls, "output_tokens": output_tokens * calls}


def add_estimates(*parts: dict[str, int]) -> dict[str, int]:
    """Sum estimate dicts."""
    return {k: sum(p.get(k, 0) for p in parts) for k in ("calls", "input_tokens", "output_tokens")}
