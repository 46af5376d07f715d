"""The input and output contracts of seed 004 (SPEC 2.8), validated with errors that name the field and the fix.

Input (what the generator may be given)::

    {"query": str (1..256 characters),
     "contexts": [{"doc_id": str, "text": str (<= 2048 tokens), "score": float (optional)}, ...] (0..5 documents,
                 sorted by relevance: when scores are given they must not increase),
     "language": "ja" | "en"}

Tokens are approximated by :func:`experiments.text_utils.approx_tokens` (whitespace words, one token per CJK
character).

Output (what the generator must reply)::

    {"answer": str, "confidence_score": float in [0, 1],
     "sources": [{"doc_id": str (one of the context ids), "snippet": str (non-empty)}, ...],
     "status": "success" | "failure",
     "error_message": str (required, non-empty, when status is "failure"; then answer is "")}

When the context does not contain the answer, the reply is a *success* whose answer is exactly the fixed
not-found phrase of the language and whose sources are empty. The seed spells the source id
``document_id``; this contract calls it ``doc_id`` (the error for ``document_id`` says so).

A chain-of-thought reply may put its reasoning first; the contract object then follows the last
``FINAL JSON:`` line. Otherwise the reply must be the JSON object alone (a surrounding ```json fence is
tolerated, nothing else).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from experiments.text_utils import approx_tokens

__all__ = [
    "CONTRACT_JSON_SCHEMA",
    "COT_MARKER",
    "ContextDoc",
    "ContractError",
    "GenerationInput",
    "LANGUAGES",
    "MAX_CONTEXTS",
    "MAX_DOC_TOKENS",
    "MAX_QUERY_CHARS",
    "NOT_FOUND",
    "OUTPUT_FIELDS",
    "OutputCheck",
    "check_output",
    "is_refusal",
    "lenient_answer",
    "lenient_object",
    "validate_input",
]

MAX_QUERY_CHARS = 256
MAX_CONTEXTS = 5
MAX_DOC_TOKENS = 2048
LANGUAGES = ("ja", "en")
NOT_FOUND = {
    "en": "I cannot find the answer in the provided documents.",
    "ja": "提供された情報には回答が見つかりませんでした。",  # the seed's own phrase
}
COT_MARKER = "FINAL JSON:"
OUTPUT_FIELDS = ("answer", "confidence_score", "sources", "status", "error_message")

CONTRACT_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "confidence_score": {"type": "number", "minimum": 0, "maximum": 1},
        "sources": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"doc_id": {"type": "string"}, "snippet": {"type": "string"}},
                "required": ["doc_id", "snippet"],
                "additionalProperties": False,
            },
        },
        "status": {"type": "string", "enum": ["success", "failure"]},
        "error_message": {"type": "string"},
    },
    "required": ["answer", "confidence_score", "sources", "status"],
    "additionalProperties": False,
}


class ContractError(ValueError):
    """A contract violation: ``field`` is the offending field (``contexts[2].text``), ``fix`` what to do."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}. Fix: {fix}.")


@dataclass(frozen=True)
class ContextDoc:
    doc_id: str
    text: str
    score: float | None = None


@dataclass(frozen=True)
class GenerationInput:
    """A validated input: build it with :func:`validate_input`."""

    query: str
    contexts: tuple[ContextDoc, ...]
    language: str

    def to_json(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "contexts": [{"doc_id": c.doc_id, "text": c.text} for c in self.contexts],
            "language": self.language,
        }


def _context(item: Any, i: int) -> ContextDoc:
    where = f"contexts[{i}]"
    if isinstance(item, ContextDoc):
        doc_id, text, score = item.doc_id, item.text, item.score
    elif isinstance(item, Mapping):
        missing = [k for k in ("doc_id", "text") if k not in item]
        if missing:
            raise ContractError(
                where, f"missing key(s) {missing}", "give every context as {'doc_id': str, 'text': str}"
            )
        doc_id, text, score = item["doc_id"], item["text"], item.get("score")
    else:
        raise ContractError(
            where, f"is a {type(item).__name__}", "give every context as {'doc_id': str, 'text': str} or a ContextDoc"
        )
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise ContractError(f"{where}.doc_id", f"is {doc_id!r}", "give each document a non-empty string id")
    if not isinstance(text, str) or not text.strip():
        raise ContractError(f"{where}.text", "is empty or not a string", "drop empty documents before generation")
    n = approx_tokens(text)
    if n > MAX_DOC_TOKENS:
        raise ContractError(
            f"{where}.text",
            f"document {doc_id!r} has ~{n} tokens, more than the limit of {MAX_DOC_TOKENS} (tokens approximated as "
            "whitespace words, one per CJK character)",
            f"split the document into chunks of at most {MAX_DOC_TOKENS} tokens or truncate it",
        )
    if score is not None and (
        isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score)
    ):
        raise ContractError(f"{where}.score", f"is {score!r}", "give a finite relevance score or leave it out")
    return ContextDoc(doc_id, text, None if score is None else float(score))


def validate_input(query: Any, contexts: Any, language: Any) -> GenerationInput:
    """Check a generation input against the contract; raise :class:`ContractError` at the first violation."""
    if not isinstance(query, str) or not query.strip():
        raise ContractError("query", f"is {query!r}", "pass the user's question as a non-empty string")
    if len(query) > MAX_QUERY_CHARS:
        raise ContractError(
            "query",
            f"has {len(query)} characters, more than the limit of {MAX_QUERY_CHARS}",
            f"shorten the question to at most {MAX_QUERY_CHARS} characters",
        )
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, Sequence):
        raise ContractError(
            "contexts", f"is a {type(contexts).__name__}", "pass a list of up to 5 documents sorted by relevance"
        )
    if len(contexts) > MAX_CONTEXTS:
        raise ContractError(
            "contexts",
            f"has {len(contexts)} documents, more than the limit of {MAX_CONTEXTS}",
            f"keep only the {MAX_CONTEXTS} most relevant documents (the list is sorted by relevance, so its first "
            f"{MAX_CONTEXTS})",
        )
    docs = tuple(_context(c, i) for i, c in enumerate(contexts))
    seen: set[str] = set()
    for i, d in enumerate(docs):
        if d.doc_id in seen:
            raise ContractError(f"contexts[{i}].doc_id", f"repeats {d.doc_id!r}", "give each document a unique id")
        seen.add(d.doc_id)
    scores = [d.score for d in docs]
    if all(s is not None for s in scores):
        for i in range(1, len(scores)):
            if scores[i] > scores[i - 1]:  # type: ignore[operator]
                raise ContractError(
                    f"contexts[{i}].score",
                    f"{scores[i]} is higher than the score before it ({scores[i - 1]}): the documents are not "
                    "sorted by relevance",
                    "sort the contexts by descending relevance before generation",
                )
    if language not in LANGUAGES:
        raise ContractError("language", f"{language!r} is not supported", "use 'ja' or 'en'")
    return GenerationInput(query, docs, language)


# --------------------------------------------------------------------------- output

_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.S)


@dataclass
class OutputCheck:
    """The result of checking one reply against the output contract.

    ``violations`` are :class:`ContractError`\\ s; ``data`` is the parsed object when the reply was JSON.
    ``reasoning`` is the chain-of-thought text before the ``FINAL JSON:`` line, if any.
    """

    raw: str
    data: dict[str, Any] | None = None
    violations: list[ContractError] = field(default_factory=list)
    reasoning: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def messages(self) -> list[str]:
        return [str(v) for v in self.violations]


def _extract_json_text(raw: str, cot: bool) -> tuple[str, str]:
    text = raw.strip()
    reasoning = ""
    if cot:
        idx = text.rfind(COT_MARKER)
        if idx < 0:
            raise ContractError(
                "reply",
                f"the chain-of-thought reply has no '{COT_MARKER}' line",
                f"write the reasoning, then a line '{COT_MARKER}' followed by the JSON object and nothing after it",
            )
        reasoning, text = text[:idx].strip(), text[idx + len(COT_MARKER) :].strip()
    m = _FENCE.match(text)
    if m:
        text = m.group(1).strip()
    return text, reasoning


def check_output(raw: str, context_ids: Sequence[str], *, cot: bool = False) -> OutputCheck:
    """Check a generator reply against the output contract; never raises, every problem is a violation."""
    out = OutputCheck(raw=raw)
    try:
        text, out.reasoning = _extract_json_text(raw or "", cot)
    except ContractError as e:
        out.violations.append(e)
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        out.violations.append(
            ContractError(
                "reply",
                f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}; reply starts {text[:60]!r})",
                "reply with the JSON object only: no prose before or after it",
            )
        )
        return out
    if not isinstance(data, dict):
        out.violations.append(
            ContractError("reply", f"is a JSON {type(data).__name__}, not an object", "reply with one JSON object")
        )
        return out
    out.data = data
    v = out.violations
    extra = sorted(set(data) - set(OUTPUT_FIELDS))
    if extra:
        v.append(ContractError("reply", f"has unexpected field(s) {extra}", f"use only {list(OUTPUT_FIELDS)}"))
    for name in ("answer", "confidence_score", "sources", "status"):
        if name not in data:
            v.append(ContractError(name, "is missing", f"add '{name}' (see the output contract)"))
    status = data.get("status")
    if "status" in data and status not in ("success", "failure"):
        v.append(ContractError("status", f"is {status!r}", "use 'success' or 'failure'"))
    if "answer" in data and not isinstance(data["answer"], str):
        v.append(ContractError("answer", f"is a {type(data['answer']).__name__}", "give the answer as a string"))
    conf = data.get("confidence_score")
    if "confidence_score" in data:
        if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not math.isfinite(conf):
            v.append(ContractError("confidence_score", f"is {conf!r}", "give a number from 0.0 to 1.0"))
        elif not 0.0 <= conf <= 1.0:
            v.append(
                ContractError("confidence_score", f"{conf} is out of range", "give a number from 0.0 to 1.0")
            )
    if status == "failure":
        msg = data.get("error_message")
        if not isinstance(msg, str) or not msg.strip():
            v.append(
                ContractError("error_message", "is missing or empty with status 'failure'", "say why generation failed")
            )
        if data.get("answer"):
            v.append(ContractError("answer", "is not empty with status 'failure'", "leave answer '' on failure"))
    elif "error_message" in data and status == "success":
        v.append(ContractError("error_message", "is present with status 'success'", "drop it, or set 'failure'"))
    sources = data.get("sources")
    if "sources" in data:
        if not isinstance(sources, list):
            v.append(ContractError("sources", f"is a {type(sources).__name__}", "give a list (empty if none)"))
        else:
            ids = set(context_ids)
            for i, s in enumerate(sources):
                where = f"sources[{i}]"
                if not isinstance(s, dict):
                    v.append(ContractError(where, f"is a {type(s).__name__}", "give {'doc_id': ..., 'snippet': ...}"))
                    continue
                if "doc_id" not in s and "document_id" in s:
                    v.append(ContractError(f"{where}.document_id", "is the seed's spelling", "name the key 'doc_id'"))
                elif s.get("doc_id") not in ids:
                    v.append(
                        ContractError(
                            f"{where}.doc_id",
                            f"{s.get('doc_id')!r} is not one of the given context ids {sorted(ids)}",
                            "cite only the documents you were given, by their id",
                        )
                    )
                snippet = s.get("snippet")
                if not isinstance(snippet, str) or not snippet.strip():
                    v.append(ContractError(f"{where}.snippet", "is missing or empty", "quote the passage you used"))
                extra_keys = sorted(set(s) - {"doc_id", "snippet", "document_id"})
                if extra_keys:
                    v.append(ContractError(where, f"has unexpected key(s) {extra_keys}", "use doc_id and snippet only"))
    return out


_ANY_OBJECT = re.compile(r"\{.*\}", re.S)


def lenient_object(check: OutputCheck) -> dict[str, Any] | None:
    """The contract object as a reader would take it even from a broken reply.

    The parsed object when the reply was JSON; else the outermost ``{...}`` found anywhere in the reply, when
    that parses as a JSON object; else None. Used so that one broken format is not counted again as a wrong
    refusal, a hallucination or unused context.
    """
    if check.data is not None:
        return check.data
    m = _ANY_OBJECT.search(check.raw or "")
    if m:
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) else None
    return None


def lenient_answer(check: OutputCheck) -> str:
    """``answer`` of :func:`lenient_object`; failing that, the reply text (after ``FINAL JSON:``, if any)."""
    obj = lenient_object(check)
    if obj is not None and isinstance(obj.get("answer"), str):
        return obj["answer"]
    return (check.raw or "").rsplit(COT_MARKER, 1)[-1].strip()


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def is_refusal(answer: str, language: str | None = None) -> bool:
    """True when the answer is exactly the fixed not-found phrase of ``language`` (whitespace-normalised).

    With ``language=None``, the phrase of either language counts.
    """
    phrases = NOT_FOUND.values() if language is None else (NOT_FOUND[language],)
    return _norm(answer) in phrases
