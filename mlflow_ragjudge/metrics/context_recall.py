"""Context recall (RAGAS, Es et al. 2023; SPEC 2.4): the reference is split into statements by the shared
:class:`~mlflow_ragjudge.metrics.statements.StatementExtractor` (memoised: the same reference is split once), then one
call attributes each statement to the contexts or not; the score is attributed / all statements, the best acceptable
answer counting. With context precision in the same run both metrics' verdicts ride in one call
(:mod:`.context_verdicts`). The offline judge's rule is beside it (:func:`offline_context_recall`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..core import claims as claim_math
from ..core.matching import content_tokens, content_union, text_cut
from ..core.text import nonblank_passages
from ..core.types import JudgeResult
from ..llm.client import JudgeClient
from ..llm.prompts import load_prompt, reference_text
from .claim_check import Calls, ClaimCheck, ClaimRow, Claims, Details, check_claims
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
from .offline_evidence import OfflineEvidence, support_share
from .spec import Estimate, MetricSpec, Needs, Outputs
from .statements import (
    NumberedVerdicts,
    StatementExtractor,
    add_estimates,
    approx_tokens,
    ask_numbered,
    estimate_messages,
    number_items,
    prompt_version,
)

__all__ = ["ContextRecallJudge", "offline_context_recall"]


#: context recall in the words of the claim-checking skeleton
CHECK = ClaimCheck(
    noun="statements", extraction_stage="reference statement extraction", verification_stage="statement attribution",
    no_claims=("no_statements", "The reference answer makes no statement to look for in the contexts."),
)


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
        ctx_text, _ = number_items(passages, max_chars=self.max_passage_chars, fence="passage")
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
        passages = nonblank_passages(contexts)
        details: Details = {"prompt_versions": self.prompt_versions, "n_contexts": len(passages)}
        answers = answers_of(reference)
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
        claims = Claims(extraction.statements, extraction.records, extraction.call_ids, extraction.memo_hit,
                        failed=extraction.failed, cut=extraction.cut)
        several = len(answers) > 1

        def row(number: int, statement: str, entry: Mapping[str, Any] | None) -> ClaimRow:
            return {"statement": statement, "attributed": bool(entry["attributed"]) if entry is not None else None,
                    "reason": entry["reason"].strip() if entry is not None else None,
                    **({"answer": extraction.owner[number - 1] + 1} if several else {})}

        def verify(statements: Sequence[str], details: Details, calls: Calls) -> NumberedVerdicts:
            def ask(nums: Sequence[int]) -> NumberedVerdicts:
                return ask_numbered(
                    self.client,
                    numbers=nums,
                    render=lambda ns: self._messages(question or "", [statements[n - 1] for n in ns], passages, ns),
                    schema=self.schema, schema_name="context_recall_verdicts", list_key="verdicts",
                    index_key="statement", noun="statement", prompt_version=prompt_version(self.prompt),
                    purpose="context_recall", max_tokens=self.max_tokens,
                )

            if self.combined is not None:
                call = self.combined.ask(question or "", reference_text(answers, self.language), as_list(contexts),
                                         list(statements))
                got = complete_from_combined(call, "statements", range(1, len(statements) + 1), ask)
                if got is not None:
                    details["combined_call"] = True
                    return got
                calls += call.records
            return ask(range(1, len(statements) + 1))

        def score(rows: list[ClaimRow], got: NumberedVerdicts, details: Details, calls: Calls) -> JudgeResult:
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
            value = claim_math.context_recall(flags)
            assert value is not None
            counted = [r for r, owner in zip(rows, extraction.owner) if owner == best]
            missing = [r["statement"] for r in counted if not r["attributed"]]
            rationale = f"{sum(flags)} of {len(counted)} reference statements are found in the contexts"
            rationale += f" (best of {len(answers)} acceptable answers: #{best + 1})." if several else "."
            if missing:
                rationale += " Not found: " + "; ".join(f"\"{m}\"" for m in missing[:3])
                rationale += f"; and {len(missing) - 3} more." if len(missing) > 3 else "."
            for cut in extraction.cut:
                rationale += (f" Only the first {cut['kept']} of the {cut['extracted']} statements extracted from"
                              f" acceptable answer #{cut['answer'] + 1} were checked (at most {cut['cap']}).")
            return JudgeResult.scored(value, rationale, raw=got.raw, details=details, calls=calls)

        return check_claims(CHECK, claims, details, row=row, verify=verify, score=score)

    def estimate(self, question: str, reference: str | Sequence[str], contexts: Sequence[str] | None) -> Estimate:
        """Upper-bound cost of one row: 2 calls (1 when the client already holds the reference's statements,
        0 without reference or contexts); with context precision in the run, only the extraction (the
        attributions ride in precision's combined call). Assumes about one statement per 8 tokens of
        reference. Several acceptable answers: one extraction each."""
        passages = nonblank_passages(contexts)
        answers = answers_of(reference)
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


# --------------------------------------------------------------------------- the offline judge (no LLM)


def offline_context_recall(ev: OfflineEvidence, references: Sequence[str],
                           contexts: Sequence[str] | None) -> JudgeResult:
    """Share of an acceptable answer's sentences the contexts support (the best answer counts)."""
    refs = [r for r in references if r and content_tokens(r)]
    if not refs:
        return JudgeResult.abstained("no_reference", "Context recall needs a reference answer; it is empty.",
                                     details=ev.details())
    passages = nonblank_passages(contexts)
    backed = content_union(passages)
    tau = ev.calibration.support_threshold
    best: tuple[float, int, list[dict[str, Any]]] | None = None
    for i, ref in enumerate(refs):
        whole = text_cut(ref)
        statements = [(s, part) for s, part in zip(whole.sentences, whole.parts) if part.content] or [(ref, whole)]
        rows: list[dict[str, Any]] = []
        for s, part in statements:
            share, missing = support_share(part.content, backed)
            rows.append({"statement": s, "attributed": share >= tau, "support": round(share, 4),
                         "reason": "all content words found" if not missing else "not in the contexts: "
                         + ", ".join(missing[:8])})
        score = sum(r["attributed"] for r in rows) / len(rows)
        if best is None or score > best[0]:
            best = (score, i, rows)
    assert best is not None
    score, i, rows = best
    rationale = (f"(offline judge, word overlap) {sum(r['attributed'] for r in rows)} of {len(rows)} reference "
                 f"statements found in the contexts (support >= {tau:.2f})"
                 + (f"; best of {len(refs)} acceptable answers: #{i + 1}" if len(refs) > 1 else "") + ".")
    return JudgeResult.scored(score, rationale, details=ev.details(statements=rows, matched_reference=refs[i]))


def _spec() -> MetricSpec[ContextRecallJudge]:
    return MetricSpec(
        "context_recall",
        requires=(("reference", "contexts"),),
        judged=True,
        setup=lambda ctx: ContextRecallJudge(ctx.judge_client, language=ctx.cfg.language,
                                             extractor=shared_extractor(ctx),
                                             combined=combined_verdicts(ctx, "context_precision")),
        score=lambda j, r, ctx: j.judge(r.question or "", r.acceptable_answers, r.contexts),
        estimate=lambda j, r, ctx: j.estimate(r.question or "", r.acceptable_answers, r.contexts),
        outputs=Outputs(columns={"context_recall/statements": json_column("context_recall", "statements")}),
        prompt_versions=lambda j: j.prompt_versions,
        description="context recall: reference statements attributable to the contexts / all of them",
        offline=lambda ev, r, ctx: offline_context_recall(ev, r.acceptable_answers, r.contexts),
        needs=Needs(sentences=("reference", "references")),
    )


METRICS = (_spec(),)
