"""Context precision, context recall and context relevance (RAGAS, Es et al. 2023; SPEC 2.4).

Each judge makes one verdict call per row, however many chunks, statements or sentences there
are (ragas asks once per chunk for context precision):

* :class:`ContextPrecisionJudge` -- one call returns a relevant / not-relevant verdict for every
  retrieved chunk, given the question and the reference answer; the score is the average
  precision ``Σ_k (precision@k · rel_k) / (number of relevant chunks)``, 0 when no chunk is
  relevant (:func:`mlflow_ragjudge.claims.average_precision`).
* :class:`ContextRecallJudge` -- the reference is split into statements by the shared
  :class:`~mlflow_ragjudge.judges.statements.StatementExtractor` (memoised: the same reference
  is split once), then one call attributes each statement to the contexts or not; the score is
  attributed / all statements.
* :class:`ContextRelevanceJudge` -- the original RAGAS metric: the contexts are split into
  sentences (:func:`mlflow_ragjudge.text.split_sentences`, which also cuts at ``。！？``), one
  call selects the sentences needed to answer the question by number; the score is selected /
  total sentences, 0 when the model selects nothing ("insufficient information").

Each call's schema is built for the row: exactly one verdict per chunk / statement, numbers
limited to the ones shown, sentence numbers limited to ``1..N``. Verdicts are read by number;
a reply that misses some is salvaged with one follow-up about those items only
(:func:`~mlflow_ragjudge.judges.statements.ask_numbered`); what is still missing fails the row
``inconsistent`` with the raw replies -- never padded.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from ..core import claims as claim_math
from ..core.text import as_text_list, split_context_sentences
from ..core.types import FailureReason, JudgeResult
from ..llm.backends import ChatRequest, ChatResponse, JsonSchema
from ..llm.client import JudgeClient
from ..llm.parsing import ParseError, reply_object, validate_schema
from ..llm.prompts import load_prompt, reference_text
from .faithfulness import shared_extractor
from .spec import MetricSpec
from .statements import (
    Extraction,
    NumberedVerdicts,
    StatementExtractor,
    add_estimates,
    approx_tokens,
    ask_numbered,
    estimate_messages,
    failed_result,
    index_schema,
    number_items,
    numbered_list_schema,
    numbered_parser,
    prompt_version,
)

__all__ = ["ContextPrecisionJudge", "ContextRecallJudge", "ContextRelevanceJudge", "split_context_sentences"]

TOKENS_PER_VERDICT = 40


_as_list = as_text_list


def _nonblank(contexts: Sequence[str] | str | None) -> list[str]:
    return [c for c in _as_list(contexts) if c.strip()]


def _answers(reference: str | Sequence[str] | None) -> list[str]:
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
    return out


class ContextPrecisionJudge:
    """Are the relevant chunks ranked first? Average precision of the retrieved chunks.

    Args:
        client: the judge client.
        language: prompt language, ``en`` or ``ja``.
        max_tokens: reply budget.
        max_passage_chars: each chunk is cut to this many characters (every chunk is shown, so
            each gets a verdict and keeps its rank).
    """

    def __init__(
        self, client: JudgeClient, *, language: str = "en", max_tokens: int = 2048, max_passage_chars: int = 8000,
        combined: CombinedContextVerdicts | None = None, extractor: StatementExtractor | None = None,
    ) -> None:
        self.client = client
        self.language = language
        self.max_tokens = max_tokens
        self.max_passage_chars = max_passage_chars
        self.prompt = load_prompt("context_precision", language)
        self.schema: dict[str, Any] = self.prompt.schema or {}
        #: with context recall in the same run: one call for both metrics' verdicts (see CombinedContextVerdicts)
        self.combined = combined
        self.extractor = extractor or (StatementExtractor(client, language=language) if combined else None)

    @property
    def prompt_versions(self) -> dict[str, str]:
        out = {"context_precision": prompt_version(self.prompt)}
        if self.combined is not None and self.extractor is not None:
            out.update(statements=self.extractor.prompt_version, context_verdicts=self.combined.prompt_version)
        return out

    def _ask(self, question: str, reference: str, chunks: Sequence[str], nums: Sequence[int]) -> NumberedVerdicts:
        return ask_numbered(
            self.client,
            numbers=nums,
            render=lambda ns: self._messages(question, reference, [chunks[n - 1] for n in ns], ns)[0],
            schema=self.schema, schema_name="context_precision_verdicts", list_key="verdicts", index_key="passage",
            noun="passage", prompt_version=prompt_version(self.prompt), purpose="context_precision",
            max_tokens=self.max_tokens,
        )

    def _via_combined(self, question: str, answers: Sequence[str], reference: str,
                      chunks: Sequence[str]) -> tuple[NumberedVerdicts | None, list[dict[str, Any]]]:
        assert self.combined is not None and self.extractor is not None
        extraction = answer_statements(self.extractor, answers, question)
        if extraction.failed is not None or not extraction.statements:  # nothing to combine with: the single call
            return None, list(extraction.records)
        call = self.combined.ask(question, reference, chunks, extraction.statements)
        got = complete_from_combined(call, "passages", range(1, len(chunks) + 1),
                                     lambda missing: self._ask(question, reference, chunks, missing))
        if got is None:
            return None, list(extraction.records) + list(call.records)
        return got, list(extraction.records)

    def _messages(self, question: str, reference: str, chunks: Sequence[str],
                  numbers: Sequence[int] | None = None) -> tuple[list[dict[str, str]], dict]:
        text, info = number_items(chunks, max_chars=self.max_passage_chars, empty="(empty passage)", numbers=numbers)
        msgs = self.prompt.render(
            "json", question=question.strip(), reference=reference.strip(), passages=text, n_passages=str(len(chunks))
        )
        return msgs, info

    def judge(self, question: str, reference: str | Sequence[str], contexts: Sequence[str] | None) -> JudgeResult:
        """Judge the ranked ``contexts`` (rank 1 first) of one row against the reference answer (or a list of
        acceptable answers, shown to the judge as alternatives). Never raises for model failures."""
        chunks = _as_list(contexts)
        details: dict[str, Any] = {"prompt_versions": self.prompt_versions, "n_chunks": len(chunks)}
        if not any(c.strip() for c in chunks):
            return JudgeResult.abstained("no_contexts", "No contexts were retrieved; there is nothing to rank.",
                                         details=details)
        answers = _answers(reference)
        if not answers:
            return JudgeResult.abstained("no_reference", "Context precision needs a reference answer; it is empty.",
                                         details=details)
        reference = reference_text(answers, self.language)
        _, info = self._messages(question or "", reference, chunks)
        details["chunk_info"] = info
        got, calls = (self._via_combined(question or "", answers, reference, chunks) if self.combined is not None
                      else (None, []))
        if got is None:
            got = self._ask(question or "", reference, chunks, range(1, len(chunks) + 1))
        else:
            details["combined_call"] = True
        calls += got.records
        got.note(details)
        if not got.ok:
            return failed_result(got, stage="chunk relevance", details=details, calls=calls)
        verdicts = [got.entries[i] for i in range(1, len(chunks) + 1)]
        rels = [bool(v["relevant"]) for v in verdicts]
        details["chunks"] = [
            {"rank": i, "relevant": rel, "reason": v["reason"].strip()}
            for i, (rel, v) in enumerate(zip(rels, verdicts), 1)
        ]
        details["n_relevant"] = sum(rels)
        score = claim_math.average_precision(rels)
        assert score is not None
        ranks = [i for i, r in enumerate(rels, 1) if r]
        if ranks:
            rationale = (
                f"{len(ranks)} of {len(rels)} chunks relevant, at rank(s) {ranks}; average precision {score:.3f}."
            )
        else:
            rationale = f"None of the {len(rels)} chunks is relevant to the reference answer; score 0."
        return JudgeResult.scored(score, rationale, raw=got.raw, details=details, calls=calls)

    def estimate(self, question: str, reference: str | Sequence[str], contexts: Sequence[str] | None) -> dict[str, int]:
        """Upper-bound cost of one row without calling the model: 1 call (0 with no contexts or reference).
        With context recall in the run it is the combined call, which carries recall's attributions too
        (the reference's statement extraction is counted by context recall)."""
        chunks = _as_list(contexts)
        answers = _answers(reference)
        if not any(c.strip() for c in chunks) or not answers:
            return {"calls": 0, "input_tokens": 0, "output_tokens": 0}
        reference = reference_text(answers, self.language)
        if self.combined is not None:
            n = max(1, math.ceil(approx_tokens(reference) / 8))  # about one statement per 8 tokens
            est = estimate_messages(self.combined.messages(question or "", reference, chunks, []),
                                    min(self.combined.max_tokens, TOKENS_PER_VERDICT * (len(chunks) + n)))
            est["input_tokens"] += math.ceil(1.5 * approx_tokens(reference)) + 16 + 4 * n
            return est
        messages, _ = self._messages(question or "", reference, chunks)
        return estimate_messages(messages, min(self.max_tokens, TOKENS_PER_VERDICT * len(chunks)))


class ContextRecallJudge:
    """Share of the reference answer's statements that the contexts support.

    Args:
        client: the judge client.
        language: prompt language, ``en`` or ``ja``.
        max_tokens: reply budget of each call.
        extractor: a shared :class:`StatementExtractor` (its memo makes the reference's
            statements one extraction per row, reused by every metric and variant that needs
            them); default: a new one on ``client``.
        max_passage_chars: each context passage is cut to this many characters.
    """

    def __init__(
        self,
        client: JudgeClient,
        *,
        language: str = "en",
        max_tokens: int = 2048,
        extractor: StatementExtractor | None = None,
        max_passage_chars: int = 8000,
        combined: CombinedContextVerdicts | None = None,
    ) -> None:
        self.client = client
        self.language = language
        self.max_tokens = max_tokens
        self.max_passage_chars = max_passage_chars
        self.extractor = extractor or StatementExtractor(client, language=language, max_tokens=max_tokens)
        self.prompt = load_prompt("context_recall", language)
        self.schema: dict[str, Any] = self.prompt.schema or {}
        #: with context precision in the same run: one call for both metrics' verdicts
        self.combined = combined

    @property
    def prompt_versions(self) -> dict[str, str]:
        out = {"statements": self.extractor.prompt_version, "context_recall": prompt_version(self.prompt)}
        if self.combined is not None:
            out["context_verdicts"] = self.combined.prompt_version
        return out

    def _messages(self, question: str, statements: Sequence[str], passages: Sequence[str],
                  numbers: Sequence[int] | None = None) -> list[dict[str, str]]:
        ctx_text, _ = number_items(passages, max_chars=self.max_passage_chars)
        st_text, _ = number_items(statements, numbers=numbers)
        return self.prompt.render(
            "json", question=question.strip(), contexts=ctx_text, statements=st_text, n_statements=str(len(statements))
        )

    def judge(self, question: str, reference: str | Sequence[str], contexts: Sequence[str] | None) -> JudgeResult:
        """Judge one row. Never raises for model failures.

        An empty reference is ``abstained("no_reference")`` (no call); a reference with no
        statements is ``abstained("no_statements")``; no contexts at all scores 0 with no call
        (nothing can be attributed to an empty retrieval). With several acceptable answers, each is split into
        statements, all statements are attributed in one call, and the answer the contexts support best counts
        (recall is max over the answers of attributed / its statements).
        """
        passages = _nonblank(contexts)
        details: dict[str, Any] = {"prompt_versions": self.prompt_versions, "n_contexts": len(passages)}
        answers = _answers(reference)
        if not answers:
            return JudgeResult.abstained("no_reference", "Context recall needs a reference answer; it is empty.",
                                         details=details)
        if not passages:
            details["statements"] = []
            return JudgeResult.scored(
                0.0, "No contexts were retrieved, so no statement of the reference can be attributed to them.",
                details=details,
            )
        extraction = answer_statements(self.extractor, answers, question or "")
        calls: list[dict[str, Any]] = list(extraction.records)
        details["statements_memo_hit"] = extraction.memo_hit
        details["statements_call_ids"] = list(extraction.call_ids)
        if extraction.failed is not None:
            return failed_result(extraction.failed, stage="reference statement extraction", details=details,
                                 calls=calls)
        statements = list(extraction.statements)
        details["n_statements"] = len(statements)
        if not statements:
            details["statements"] = []
            return JudgeResult.abstained(
                "no_statements", "The reference answer makes no statement to look for in the contexts.",
                raw=None, details=details, calls=calls,
            )

        def ask(nums: Sequence[int]) -> NumberedVerdicts:
            return ask_numbered(
                self.client,
                numbers=nums,
                render=lambda ns: self._messages(question or "", [statements[n - 1] for n in ns], passages, ns),
                schema=self.schema, schema_name="context_recall_verdicts", list_key="verdicts", index_key="statement",
                noun="statement", prompt_version=prompt_version(self.prompt), purpose="context_recall",
                max_tokens=self.max_tokens,
            )

        got = None
        if self.combined is not None:
            call = self.combined.ask(question or "", reference_text(answers, self.language), _as_list(contexts),
                                     statements)
            got = complete_from_combined(call, "statements", range(1, len(statements) + 1), ask)
            if got is None:
                calls += call.records
            else:
                details["combined_call"] = True
        if got is None:
            got = ask(range(1, len(statements) + 1))
        calls += got.records
        got.note(details)
        several = len(answers) > 1
        if not got.ok:
            details["statements"] = [
                {"statement": s, "attributed": bool(got.entries[i]["attributed"]) if i in got.entries else None,
                 "reason": got.entries[i]["reason"].strip() if i in got.entries else None,
                 **({"answer": extraction.owner[i - 1] + 1} if several else {})}
                for i, s in enumerate(statements, 1)
            ]
            return failed_result(got, stage="statement attribution", details=details, calls=calls)
        rows = [
            {"statement": s, "attributed": bool(got.entries[i]["attributed"]),
             "reason": got.entries[i]["reason"].strip(), **({"answer": extraction.owner[i - 1] + 1} if several else {})}
            for i, s in enumerate(statements, 1)
        ]
        details["statements"] = rows
        # the best-supported acceptable answer counts
        per_answer: dict[int, list[bool]] = {}
        for owner, r in zip(extraction.owner, rows):
            per_answer.setdefault(owner, []).append(r["attributed"])
        best = max(per_answer, key=lambda a: (claim_math.context_recall(per_answer[a]) or 0.0, -a))
        flags = per_answer[best]
        details["n_attributed"] = sum(flags)
        if several:
            details["answer_recalls"] = {str(a + 1): claim_math.context_recall(f) for a, f in per_answer.items()}
            details["matched_reference"] = answers[best]
        score = claim_math.context_recall(flags)
        assert score is not None
        counted = [r for r, owner in zip(rows, extraction.owner) if owner == best]
        missing = [r["statement"] for r in counted if not r["attributed"]]
        rationale = f"{sum(flags)} of {len(counted)} reference statements are found in the contexts"
        rationale += f" (best of {len(answers)} acceptable answers: #{best + 1})." if several else "."
        if missing:
            rationale += " Not found: " + "; ".join(f"\"{m}\"" for m in missing[:3])
            rationale += f"; and {len(missing) - 3} more." if len(missing) > 3 else "."
        return JudgeResult.scored(score, rationale, raw=got.raw, details=details, calls=calls)

    def estimate(self, question: str, reference: str | Sequence[str], contexts: Sequence[str] | None) -> dict[str, int]:
        """Upper-bound cost of one row: 2 calls (1 when the client already holds the reference's statements,
        0 without reference or contexts); with context precision in the run, only the extraction (the
        attributions ride in precision's combined call). Assumes about one statement per 8 tokens of
        reference. Several acceptable answers: one extraction each."""
        passages = _nonblank(contexts)
        answers = _answers(reference)
        if not answers or not passages:
            return {"calls": 0, "input_tokens": 0, "output_tokens": 0}
        extract = add_estimates(*(self.extractor.estimate(a.strip(), question or "") for a in answers))
        if self.combined is not None:  # the attributions ride in context precision's combined call
            return extract
        text = " ".join(answers)
        n = max(1, math.ceil(approx_tokens(text) / 8))
        attrib = estimate_messages(
            self._messages(question or "", [], passages), min(self.max_tokens, n * TOKENS_PER_VERDICT)
        )
        attrib["input_tokens"] += math.ceil(1.5 * approx_tokens(text)) + 16 + 4 * n
        return add_estimates(extract, attrib)


class ContextRelevanceJudge:
    """Share of the context sentences needed to answer the question (the original RAGAS metric).

    Args:
        client: the judge client.
        language: prompt language, ``en`` or ``ja``.
        max_tokens: reply budget.
    """

    def __init__(self, client: JudgeClient, *, language: str = "en", max_tokens: int = 1024) -> None:
        self.client = client
        self.language = language
        self.max_tokens = max_tokens
        self.prompt = load_prompt("context_relevance", language)
        self.schema: dict[str, Any] = self.prompt.schema or {}

    @property
    def prompt_versions(self) -> dict[str, str]:
        return {"context_relevance": prompt_version(self.prompt)}

    def _messages(self, question: str, sentences: Sequence[tuple[int, str]]) -> list[dict[str, str]]:
        lines: list[str] = []
        current = None
        for n, (passage, sentence) in enumerate(sentences, 1):
            if passage != current:
                lines.append(f"Passage {passage}:")
                current = passage
            lines.append(f"[{n}] {' '.join(sentence.split())}")
        return self.prompt.render(
            "json", question=question.strip(), sentences="\n".join(lines), n_sentences=str(len(sentences))
        )

    def call_schema(self, total: int) -> dict[str, Any]:
        """The per-call schema: sentence numbers limited to ``1..total``, each at most once."""
        schema = copy.deepcopy(self.schema)
        arr = schema["properties"]["sentences"]
        arr["items"] = index_schema(range(1, total + 1))
        arr["maxItems"] = total
        return schema

    def _parser(self, total: int, schema: dict[str, Any]) -> Callable[[ChatResponse], dict[str, Any]]:
        item = {"type": "integer"}

        def parse(response: ChatResponse) -> dict[str, Any]:
            obj = reply_object(response, schema)
            validate_schema(obj, {**schema, "properties": {"sentences": {"type": "array", "items": item}}})
            numbers = obj["sentences"]
            outside = sorted({x for x in numbers if not 1 <= x <= total})
            if outside:
                raise ParseError(f"sentence number(s) {outside} do not exist (valid: 1..{total})",
                                 FailureReason.INCONSISTENT)
            return {"sentences": sorted(set(numbers)), "insufficient_information": not numbers,
                    "n_repeated": len(numbers) - len(set(numbers))}

        return parse

    def judge(self, question: str, contexts: Sequence[str] | None) -> JudgeResult:
        """Judge one row. Never raises for model failures.

        Contexts with no sentence are ``abstained("no_contexts")`` with no call.
        """
        sentences = split_context_sentences(contexts)
        details: dict[str, Any] = {"prompt_versions": self.prompt_versions, "n_sentences": len(sentences)}
        if not sentences:
            return JudgeResult.abstained("no_contexts", "The contexts contain no sentence to select from.",
                                         details=details)
        schema = self.call_schema(len(sentences))
        request = ChatRequest.of(
            self._messages(question or "", sentences),
            max_tokens=self.max_tokens,
            json_schema=JsonSchema("context_relevance_selection", schema),
        )
        call = self.client.call(
            request, parse=self._parser(len(sentences), schema), prompt_version=prompt_version(self.prompt),
            purpose="context_relevance",
        )
        calls = list(call.records)
        if not call.ok:
            return failed_result(call, stage="sentence selection", details=details, calls=calls)
        chosen: list[int] = call.parsed["sentences"]
        details["insufficient_information"] = call.parsed["insufficient_information"]
        details["selected"] = [
            {"n": n, "passage": sentences[n - 1][0], "sentence": sentences[n - 1][1]} for n in chosen
        ]
        if call.parsed["n_repeated"]:
            details["n_repeated_numbers"] = call.parsed["n_repeated"]
        if call.parsed["insufficient_information"]:
            return JudgeResult.scored(
                0.0, "The judge selected no sentence: the contexts are insufficient to answer the question (score 0).",
                raw=call.raw, details=details, calls=calls,
            )
        score = claim_math.context_relevance(chosen, len(sentences))
        assert score is not None
        rationale = f"{len(chosen)} of {len(sentences)} context sentences are needed to answer the question."
        return JudgeResult.scored(score, rationale, raw=call.raw, details=details, calls=calls)

    def estimate(self, question: str, contexts: Sequence[str] | None) -> dict[str, int]:
        """Upper-bound cost of one row: 1 call (0 when the contexts have no sentence)."""
        sentences = split_context_sentences(contexts)
        if not sentences:
            return {"calls": 0, "input_tokens": 0, "output_tokens": 0}
        out_tokens = min(self.max_tokens, 24 + 4 * len(sentences))
        return estimate_messages(self._messages(question or "", sentences), out_tokens)


# --------------------------------------------------------------------------- the metrics


def _json_column(metric: str, key: str) -> Callable[[dict[str, JudgeResult]], Any]:
    def build(res: dict[str, JudgeResult]) -> Any:
        d = res[metric].details
        return json.dumps(d[key], ensure_ascii=False) if key in d else None

    return build


def _combined(ctx: Any, sibling: str) -> CombinedContextVerdicts | None:
    """The run's combined precision + recall call, when both metrics are in the run (and the client merges
    identical requests, so the one call is shared)."""
    if sibling not in ctx.metrics or not getattr(ctx.judge_client, "dedupe", False):
        return None
    return ctx.shared("context_verdicts", lambda: CombinedContextVerdicts(ctx.judge_client, language=ctx.cfg.language))


def _specs() -> tuple[Any, ...]:
    def q(r: Any) -> str:
        return r.question or ""

    def ref(r: Any) -> list[str]:
        return r.acceptable_answers

    return (
        MetricSpec(
            "context_precision",
            requires=(("question", "reference", "contexts"),),
            judged=True,
            setup=lambda ctx: ContextPrecisionJudge(ctx.judge_client, language=ctx.cfg.language,
                                                    combined=_combined(ctx, "context_recall"),
                                                    extractor=shared_extractor(ctx)),
            score=lambda j, r, ctx: j.judge(q(r), ref(r), r.contexts),
            estimate=lambda j, r, ctx: j.estimate(q(r), ref(r), r.contexts),
            columns={"context_precision/chunks": _json_column("context_precision", "chunks")},
            prompt_versions=lambda j: j.prompt_versions,
            description="context precision: average precision of the chunks useful for the reference answer",
            offline=lambda j, r, ctx: j.context_precision(q(r), ref(r), r.contexts),
        ),
        MetricSpec(
            "context_recall",
            requires=(("reference", "contexts"),),
            judged=True,
            setup=lambda ctx: ContextRecallJudge(ctx.judge_client, language=ctx.cfg.language,
                                                 extractor=shared_extractor(ctx),
                                                 combined=_combined(ctx, "context_precision")),
            score=lambda j, r, ctx: j.judge(q(r), ref(r), r.contexts),
            estimate=lambda j, r, ctx: j.estimate(q(r), ref(r), r.contexts),
            columns={"context_recall/statements": _json_column("context_recall", "statements")},
            prompt_versions=lambda j: j.prompt_versions,
            description="context recall: reference statements attributable to the contexts / all of them",
            offline=lambda j, r, ctx: j.context_recall(ref(r), r.contexts),
        ),
        MetricSpec(
            "context_relevance",
            requires=(("question", "contexts"),),
            judged=True,
            setup=lambda ctx: ContextRelevanceJudge(ctx.judge_client, language=ctx.cfg.language),
            score=lambda j, r, ctx: j.judge(q(r), r.contexts),
            estimate=lambda j, r, ctx: j.estimate(q(r), r.contexts),
            columns={"context_relevance/selected": _json_column("context_relevance", "selected")},
            prompt_versions=lambda j: j.prompt_versions,
            description="context relevance: share of context sentences needed to answer the question (original RAGAS)",
            offline=lambda j, r, ctx: j.context_relevance(q(r), ref(r), r.contexts),
        ),
    )


METRICS = _specs()


# --------------------------------------------------------------------------- precision and recall in one call


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
        passages, _ = number_items(chunks, max_chars=self.max_passage_chars, empty="(empty passage)")
        st_text, _ = number_items(statements)
        return self.prompt.render("json", question=question.strip(), reference=reference.strip(), passages=passages,
                                  n_passages=str(len(chunks)), statements=st_text, n_statements=str(len(statements)))

    def _list_schema(self, key: str) -> dict[str, Any]:
        return {"type": "object", "properties": {key: copy.deepcopy(self.schema["properties"][key])},
                "required": [key], "additionalProperties": True}

    def call_schema(self, n_chunks: int, n_statements: int) -> dict[str, Any]:
        schema = copy.deepcopy(self.schema)
        for key, index, n in (("passages", "passage", n_chunks), ("statements", "statement", n_statements)):
            one = numbered_list_schema(self._list_schema(key), list_key=key, index_key=index,
                                       numbers=range(1, n + 1))
            schema["properties"][key] = one["properties"][key]
        return schema

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
