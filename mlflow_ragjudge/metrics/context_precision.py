"""Context precision (RAGAS, Es et al. 2023; SPEC 2.4): are the relevant chunks ranked first? One call returns a
relevant / not-relevant verdict for every retrieved chunk, given the question and the reference answer; the score is
the average precision ``Σ_k (precision@k · rel_k) / (number of relevant chunks)``, 0 when no chunk is relevant
(:func:`mlflow_ragjudge.core.claims.average_precision`). With context recall in the same run both metrics' verdicts
ride in one call (:mod:`.context_verdicts`). The offline judge's rule is beside it (:func:`offline_context_precision`).

The call's schema is built for the row: exactly one verdict per chunk, numbers limited to the ones shown; a reply that
misses some is salvaged with one follow-up about those items only; what is still missing fails the row
``inconsistent`` with the raw replies -- never padded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..core import claims as claim_math
from ..core.claims import average_precision
from ..core.matching import match_tokens
from ..core.text import nonblank_passages
from ..core.types import JudgeResult
from ..llm.client import JudgeClient
from ..llm.prompts import load_prompt, reference_text
from .context_verdicts import (
    TOKENS_PER_VERDICT,
    CombinedContextVerdicts,
    answer_statements,
    answers_of,
    as_list,
    combined_verdicts,
    complete_from_combined,
    json_column,
)
from .faithfulness import shared_extractor
from .offline_evidence import OfflineEvidence
from .spec import Estimate, MetricSpec, Outputs
from .statements import (
    NumberedVerdicts,
    StatementExtractor,
    approx_tokens,
    ask_numbered,
    estimate_messages,
    failed_result,
    number_items,
    prompt_version,
)

__all__ = ["ContextPrecisionJudge", "offline_context_precision"]


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
        text, info = number_items(chunks, max_chars=self.max_passage_chars, empty="(empty passage)", numbers=numbers,
                                  fence="passage")
        msgs = self.prompt.render(
            "json", question=question.strip(), reference=reference.strip(), passages=text, n_passages=str(len(chunks))
        )
        return msgs, info

    def judge(self, question: str, reference: str | Sequence[str], contexts: Sequence[str] | None) -> JudgeResult:
        """Judge the ranked ``contexts`` (rank 1 first) of one row against the reference answer (or a list of
        acceptable answers, shown to the judge as alternatives). Never raises for model failures."""
        chunks = as_list(contexts)
        details: dict[str, Any] = {"prompt_versions": self.prompt_versions, "n_chunks": len(chunks)}
        if not nonblank_passages(chunks):
            return JudgeResult.abstained("no_contexts", "No contexts were retrieved; there is nothing to rank.",
                                         details=details)
        answers = answers_of(reference)
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

    def estimate(self, question: str, reference: str | Sequence[str], contexts: Sequence[str] | None) -> Estimate:
        """Upper-bound cost of one row without calling the model: 1 call (0 with no contexts or reference).
        With context recall in the run it is the combined call, which carries recall's attributions too
        (the reference's statement extraction is counted by context recall)."""
        chunks = as_list(contexts)
        answers = answers_of(reference)
        if not nonblank_passages(chunks) or not answers:
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


# --------------------------------------------------------------------------- the offline judge (no LLM)


def offline_context_precision(ev: OfflineEvidence, question: str, references: Sequence[str],
                              contexts: Sequence[str] | None) -> JudgeResult:
    """Average precision of the ranked chunks, a chunk being relevant when it supports an acceptable
    answer."""
    chunks = list(contexts or [])
    if not nonblank_passages(chunks):
        return JudgeResult.abstained("no_contexts", "No contexts were retrieved; there is nothing to rank.",
                                     details=ev.details())
    refs = [r for r in references if match_tokens(r)]
    if not refs:
        return JudgeResult.abstained("no_reference", "Context precision needs a reference answer; it is empty.",
                                     details=ev.details())
    rels = [any(ev.supports_answer(c or "", r) for r in refs) for c in chunks]
    score = average_precision(rels)
    assert score is not None
    ranks = [i for i, r in enumerate(rels, 1) if r]
    rationale = (f"(offline judge, word overlap) {len(ranks)} of {len(rels)} chunks support the reference"
                 + (f", at rank(s) {ranks}" if ranks else "") + f"; average precision {score:.3f}.")
    return JudgeResult.scored(score, rationale, details=ev.details(
        chunks=[{"rank": i, "relevant": r} for i, r in enumerate(rels, 1)], n_relevant=len(ranks)))


def _spec() -> MetricSpec[ContextPrecisionJudge]:
    return MetricSpec(
        "context_precision",
        requires=(("question", "reference", "contexts"),),
        judged=True,
        setup=lambda ctx: ContextPrecisionJudge(ctx.judge_client, language=ctx.cfg.language,
                                                combined=combined_verdicts(ctx, "context_recall"),
                                                extractor=shared_extractor(ctx)),
        score=lambda j, r, ctx: j.judge(r.question or "", r.acceptable_answers, r.contexts),
        estimate=lambda j, r, ctx: j.estimate(r.question or "", r.acceptable_answers, r.contexts),
        outputs=Outputs(columns={"context_precision/chunks": json_column("context_precision", "chunks")}),
        prompt_versions=lambda j: j.prompt_versions,
        description="context precision: average precision of the chunks useful for the reference answer",
        offline=lambda ev, r, ctx: offline_context_precision(ev, r.question or "", r.acceptable_answers, r.contexts),
    )


METRICS = (_spec(),)
