"""What context precision and context recall share: reading the reference's acceptable answers and the passages,
the reference's statements (one extraction per answer), and -- when a run has both metrics -- their verdicts asked
for in **one** call (:class:`CombinedContextVerdicts`), which the judge client sends once and both metrics read."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..core.json_text import dumps_text
from ..core.text import as_text_list
from ..core.types import FailureReason, JudgeResult
from ..llm.backends import ChatRequest, ChatResponse, JsonSchema
from ..llm.client import JudgeClient
from ..llm.parsing import ParseError, reply_object
from ..llm.prompts import load_prompt
from .spec import RunContext
from .statements import (
    Extraction,
    NumberedVerdicts,
    StatementExtractor,
    number_items,
    numbered_list_schema,
    numbered_parser,
    prompt_version,
)

__all__ = ["as_list", "answers_of", "AnswerStatements", "answer_statements", "json_column",
           "combined_verdicts", "CombinedContextVerdicts", "complete_from_combined", "TOKENS_PER_VERDICT"]


TOKENS_PER_VERDICT = 40

as_list = as_text_list

def answers_of(reference: str | Sequence[str] | None) -> list[str]:
    """The acceptable answers of a reference given as one str or a list (blank ones dropped)."""
    items = [reference] if isinstance(reference, str) or reference is None else list(reference)
    return [a for a in items if a and a.strip()]

@dataclasses.dataclass
class AnswerStatements:
    """The statements of every acceptable answer, in one list (``owner[i]`` is the answer index of statement
    ``i``); ``failed`` is the first extraction that failed, if any."""

    statements: list[str]
    owner: list[int]
    records: list[dict[str, Any]]
    call_ids: list[str]
    memo_hit: bool
    failed: Extraction | None = None
    cut: list[dict[str, Any]] = dataclasses.field(default_factory=list)

def answer_statements(extractor: StatementExtractor, answers: Sequence[str], question: str) -> AnswerStatements:
    """Split each acceptable answer into statements (one extraction per answer; with one answer exactly the
    single extraction context recall always made). Context precision's combined call and context recall build
    the same list, so their combined request stays identical and is sent once."""
    out = AnswerStatements([], [], [], [], True)
    for i, answer in enumerate(answers):
        ex = extractor.extract(answer, question=question)
        out.records += list(ex.records)
        out.call_ids += list(ex.call_ids)
        out.memo_hit = out.memo_hit and ex.memo_hit
        if not ex.ok:
            out.failed = ex
            return out
        out.statements += list(ex.statements)
        out.owner += [i] * len(ex.statements)
        if ex.cut is not None:  # a runaway extraction, cut at statement_cap
            out.cut.append({"answer": i, **ex.cut})
    return out

def json_column(metric: str, key: str) -> Callable[[dict[str, JudgeResult]], Any]:
    def build(res: dict[str, JudgeResult]) -> Any:
        d = res[metric].details
        return dumps_text(d[key]) if key in d else None

    return build

def combined_verdicts(ctx: RunContext, sibling: str) -> CombinedContextVerdicts | None:
    """The run's combined precision + recall call, when both metrics are in the run (and the client merges
    identical requests, so the one call is shared)."""
    if sibling not in ctx.metrics or not getattr(ctx.judge_client, "dedupe", False):
        return None
    return ctx.shared("context_verdicts", lambda: CombinedContextVerdicts(ctx.judge_client, language=ctx.cfg.language))

class CombinedContextVerdicts:
    """Context precision's chunk verdicts and context recall's statement verdicts in **one** call.

    When a run has both metrics, each row needs relevance verdicts for its ranked chunks (given the question
    and the reference) and attribution verdicts for the reference's statements (against the same chunks). The
    two lists are asked for together (prompt ``context_verdicts``), with the same definitions, numbering and
    per-call schema rules as the two single prompts; each metric then scores from its own list exactly as
    before. Both judges build the identical request, so the judge client (``dedupe``) sends it once and both
    read the reply. A list the reply leaves incomplete is completed with that metric's own follow-up about the
    missing numbers only; if the combined call fails, each metric asks on its own.
    """

    def __init__(self, client: JudgeClient, *, language: str = "en", max_tokens: int = 4096,
                 max_passage_chars: int = 8000) -> None:
        self.client = client
        self.max_tokens = max_tokens
        self.max_passage_chars = max_passage_chars
        self.prompt = load_prompt("context_verdicts", language)
        self.schema: dict[str, Any] = self.prompt.schema or {}

    @property
    def prompt_version(self) -> str:
        return prompt_version(self.prompt)

    def messages(self, question: str, reference: str, chunks: Sequence[str],
                 statements: Sequence[str]) -> list[dict[str, str]]:
        passages, _ = number_items(chunks, max_chars=self.max_passage_chars, empty="(empty passage)", fence="passage")
        st_text, _ = number_items(statements)
        return self.prompt.render("json", question=question.strip(), reference=reference.strip(), passages=passages,
                                  n_passages=str(len(chunks)), statements=st_text, n_statements=str(len(statements)))

    def _list_schema(self, key: str) -> dict[str, Any]:
        return {"type": "object", "properties": {key: self.schema["properties"][key]},
                "required": [key], "additionalProperties": True}

    def call_schema(self, n_chunks: int, n_statements: int) -> dict[str, Any]:
        properties = dict(self.schema["properties"])  # schemas are values: copied where changed, never in place
        for key, index, n in (("passages", "passage", n_chunks), ("statements", "statement", n_statements)):
            one = numbered_list_schema(self._list_schema(key), list_key=key, index_key=index,
                                       numbers=range(1, n + 1))
            properties[key] = one["properties"][key]
        return {**self.schema, "properties": properties}

    def ask(self, question: str, reference: str, chunks: Sequence[str], statements: Sequence[str]) -> Any:
        """The call; ``parsed`` is ``{"passages": {"entries", "problems"} | None, "statements": ... | None}``
        (None for a list with no usable entry)."""
        schema = self.call_schema(len(chunks), len(statements))
        parsers = {
            key: numbered_parser(self._list_schema(key) | {"properties": {key: schema["properties"][key]}},
                                 list_key=key, index_key=index, numbers=range(1, n + 1), noun=index)
            for key, index, n in (("passages", "passage", len(chunks)), ("statements", "statement", len(statements)))
        }

        def parse(response: ChatResponse) -> dict[str, Any]:
            obj = reply_object(response, schema)
            as_data = dataclasses.replace(response, data=obj)
            out: dict[str, Any] = {}
            errors: list[ParseError] = []
            for key, p in parsers.items():
                try:
                    out[key] = p(as_data)
                except ParseError as e:
                    out[key] = None
                    errors.append(e)
            if len(errors) == len(parsers):
                raise errors[0]
            return out

        request = ChatRequest.of(self.messages(question, reference, chunks, statements), max_tokens=self.max_tokens,
                                 json_schema=JsonSchema("context_verdicts", schema))
        return self.client.call(request, parse=parse, prompt_version=self.prompt_version, purpose="context_verdicts")

def complete_from_combined(call: Any, key: str, wanted: Sequence[int], follow_up: Callable[[list[int]], Any]) -> Any:
    """The verdicts of one list of a combined call, completed with ``follow_up(missing numbers)`` (the metric's
    own prompt, asking about those items only) when the reply left some out; None when the combined call gave
    nothing usable for this list (the metric then asks on its own)."""
    if not call.ok or call.parsed.get(key) is None:
        return None
    got = call.parsed[key]
    entries: dict[int, dict[str, Any]] = dict(got["entries"])
    problems = [{"reply": 1, **{k: v for k, v in got["problems"].items() if v}}] if any(
        got["problems"].values()) else []
    missing = [n for n in wanted if n not in entries]
    records = list(call.records)
    if not missing:
        return NumberedVerdicts(True, {n: entries[n] for n in wanted}, records, call.raw, problems=problems)
    more = follow_up(missing)
    records += more.records
    entries.update({n: e for n, e in more.entries.items() if n in missing})
    salvage = {"missing_in_first_reply": missing, "asked_again": missing, "recovered": sorted(more.entries),
               "first_reply_problems": got["problems"]}
    problems += more.problems
    still = [n for n in wanted if n not in entries]
    if still:
        return NumberedVerdicts(False, dict(sorted(entries.items())), records, more.raw or call.raw,
                                more.failure or FailureReason.INCONSISTENT,
                                more.error or f"no verdict for number(s) {still} even after asking again",
                                salvage, problems)
    return NumberedVerdicts(True, {n: entries[n] for n in wanted}, records, more.raw or call.raw, salvage=salvage,
                            problems=problems)
