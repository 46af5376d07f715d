"""Claim-based faithfulness (RAGAS, Es et al. 2023; seeds 001, 002, 003; SPEC 2.3).

Two LLM calls per row, however many claims the response makes:

1. the shared :class:`~mlflow_ragjudge.metrics.statements.StatementExtractor` splits the response
   into short self-contained claims (one fact each, pronouns resolved);
2. one verification call shows the evidence as numbered passages and *all* the claims, and gets
   back one ``{claim, reason, verdict}`` per claim, ``verdict`` being ``supported`` or
   ``unsupported``.

``faithfulness = supported claims / all claims`` (:func:`mlflow_ragjudge.core.claims.faithfulness`).

States (DESIGN point 1):

* no evidence passages -> ``abstained("no_evidence")``, no call: faithfulness is grounding in the
  evidence given; with none, a 0 would blame the generator for a retrieval miss;
* a response with no claims (empty, a refusal, "I don't know") -> ``abstained("no_claims")``
  after the extraction call, and the verification call is skipped -- never NaN, never 1.0;
* the verification call's schema is built per call: exactly one entry per claim, claim numbers
  limited to ``1..N`` (:func:`~mlflow_ragjudge.metrics.statements.numbered_list_schema`);
* verdicts are read by claim number, never by position; a reply that misses some numbers (or
  gives one two different verdicts) is salvaged: one follow-up asks about those claims only and
  the answers are merged; what is still missing fails the row ``inconsistent`` (or
  ``ambiguous``) with the raw replies kept -- never padded, never truncated to fit;
* an unreadable reply -> re-asked (within the attempts budget, up to 5 times, `max_reasks`), then
  ``failed("parse_error")`` with the raw reply.

Every claim is kept with its verdict and reason in ``details["claims"]``; ``calls`` holds the
transcript records of both calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..core import claims as claim_math
from ..core.json_text import dumps_text
from ..core.matching import TextCut, content_union, declines_to_answer, text_cut
from ..core.text import nonblank_passages, split_sentences, word_set
from ..core.types import JudgeResult, Row
from ..core.values import is_int
from ..llm.client import JudgeClient
from ..llm.prompts import load_prompt
from .claim_check import Calls, ClaimCheck, ClaimRow, Claims, Details, check_claims
from .offline_evidence import OfflineEvidence, is_claim_sentence
from .offline_reading import Support, number_forms
from .spec import Estimate, MetricSpec, Needs, Option, Outputs, RunContext, RunSettings
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

__all__ = ["FaithfulnessJudge"]

#: estimated output tokens per verdict entry (number, a one-sentence reason, the verdict)
TOKENS_PER_VERDICT = 48


def split_passage(text: str, max_chars: int) -> list[str]:
    """A passage cut into pieces of at most ``max_chars`` at sentence boundaries (a longer sentence is cut
    at the limit), in order: nothing is left out."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return [text]

    pieces: list[str] = []
    current = ""
    for sentence in split_sentences(text) or [text]:
        while len(sentence) > max_chars:
            if current:
                pieces.append(current)
                current = ""
            pieces.append(sentence[:max_chars])
            sentence = sentence[max_chars:]
        if current and len(current) + 1 + len(sentence) > max_chars:
            pieces.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}".strip()
    if current:
        pieces.append(current)
    return pieces


def select_evidence(passages: Sequence[str], claims: Sequence[str], *, max_passage_chars: int,
                    budget_chars: int) -> tuple[list[str], dict[str, Any]]:
    """The evidence shown to the verifier, for documents longer than one passage (seed 001's gold documents).

    Every passage longer than ``max_passage_chars`` is split into pieces at sentence boundaries
    (:func:`split_passage`), so no claim is checked against a document cut short. When all pieces fit in
    ``budget_chars`` they are all shown. Otherwise the pieces that match the claims are shown: each claim's
    best piece first (the share of the claim's words found in it), then the next best pieces for any claim,
    until the budget is used; shown in document order. The record says what was split and left out.
    """
    pieces = [p for passage in passages for p in split_passage(passage, max_passage_chars)]
    info: dict[str, Any] = {"n_passages": len(passages), "n_pieces": len(pieces),
                            "split": len(pieces) > len(passages)}
    total = sum(len(p) for p in pieces)
    if total <= budget_chars:
        info.update(n_shown=len(pieces), selected_by_overlap=False, chars=total)
        return pieces, info
    words = [word_set(p) for p in pieces]
    claim_words = [w for w in (word_set(c) for c in claims) if w]
    score = [[len(cw & pw) / len(cw) for cw in claim_words] for pw in words]
    order: list[int] = []
    for j in range(len(claim_words)):  # each claim's best piece first
        best = max(range(len(pieces)), key=lambda i: (score[i][j], -i))
        if best not in order:
            order.append(best)
    rest = sorted(range(len(pieces)), key=lambda i: (-max(score[i], default=0.0), i))
    order += [i for i in rest if i not in order]
    chosen: list[int] = []
    used = 0
    for i in order:
        if used + len(pieces[i]) <= budget_chars or not chosen:
            chosen.append(i)
            used += len(pieces[i])
    chosen.sort()
    info.update(n_shown=len(chosen), selected_by_overlap=True, chars=used, shown_pieces=[i + 1 for i in chosen])
    return [pieces[i] for i in chosen], info


class FaithfulnessJudge:
    """Share of the response's claims that the evidence supports.

    Args:
        client: the judge client.
        language: prompt language, ``en`` or ``ja`` (inputs in any language work).
        max_tokens: reply budget of each of the two calls.
        extractor: a shared :class:`StatementExtractor` (so several judges reuse one memo);
            default: a new one on ``client``.
        max_passage_chars: each evidence passage is cut to this many characters (all passages
            are always shown; see :func:`~mlflow_ragjudge.metrics.statements.number_items`).

    The evidence is what the caller passes: the retrieved contexts (RAGAS's definition) or the
    gold documents (seed 001's variant, which then also reflects retrieval quality).
    """

    def __init__(
        self,
        client: JudgeClient,
        *,
        language: str = "en",
        max_tokens: int = 2048,
        extractor: StatementExtractor | None = None,
        max_passage_chars: int = 8000,
        max_evidence_chars: int = 24_000,
    ) -> None:
        self.client = client
        self.language = language
        self.max_tokens = max_tokens
        self.max_passage_chars = max_passage_chars
        self.max_evidence_chars = max_evidence_chars
        self.extractor = extractor or StatementExtractor(client, language=language, max_tokens=max_tokens)
        self.prompt = load_prompt("faithfulness", language)
        self.schema: dict[str, Any] = self.prompt.schema or {}

    @property
    def prompt_versions(self) -> dict[str, str]:
        """Prompt name -> version label of every prompt this judge uses."""
        return {"statements": self.extractor.prompt_version, "faithfulness": prompt_version(self.prompt)}

    def _verify_messages(self, claims: Sequence[str], evidence_text: str,
                         numbers: Sequence[int] | None = None) -> list[dict[str, str]]:
        claims_text, _ = number_items(claims, numbers=numbers)
        return self.prompt.render("json", evidence=evidence_text, claims=claims_text, n_claims=str(len(claims)))

    def judge(self, question: str, response: str, evidence: Sequence[str] | None) -> JudgeResult:
        """Judge one row. Never raises for model failures: they come back as failed results.

        Args:
            question: the user's question (helps resolve what the response's pronouns refer to).
            response: the RAG system's answer.
            evidence: the passages to check the claims against.
        """
        passages = nonblank_passages(evidence)
        details: Details = {"prompt_versions": self.prompt_versions, "n_evidence": len(passages)}
        if not passages:
            return JudgeResult.abstained(
                "no_evidence", "No evidence passages were given, so there is nothing to check the claims against.",
                details=details,
            )
        extraction = self.extractor.extract(response or "", question=question or "")
        claims = Claims(extraction.statements, extraction.records, extraction.call_ids, extraction.memo_hit,
                        failed=None if extraction.ok else extraction, raw=extraction.raw, cut=extraction.cut)

        def verify(claims: Sequence[str], details: Details, calls: Calls) -> NumberedVerdicts:
            shown = passages
            if any(len(" ".join(p.split())) > self.max_passage_chars for p in passages):
                # long documents (gold documents): split, never cut; the pieces that match the claims when too long
                shown, selection = select_evidence(passages, claims, max_passage_chars=self.max_passage_chars,
                                                   budget_chars=self.max_evidence_chars)
                details["evidence_selection"] = selection
            evidence_text, info = number_items(shown, max_chars=self.max_passage_chars, fence="passage")
            details["evidence_info"] = info
            return ask_numbered(
                self.client,
                numbers=range(1, len(claims) + 1),
                render=lambda nums: self._verify_messages([claims[n - 1] for n in nums], evidence_text, nums),
                schema=self.schema, schema_name="faithfulness_verdicts", list_key="verdicts", index_key="claim",
                noun="claim", prompt_version=prompt_version(self.prompt), purpose="faithfulness",
                max_tokens=self.max_tokens, lowercase=("verdict",),
            )

        def score(rows: list[ClaimRow], got: NumberedVerdicts, details: Details, calls: Calls) -> JudgeResult:
            supported = [r["supported"] for r in rows]
            details["n_supported"] = sum(supported)
            value = claim_math.faithfulness(supported)
            assert value is not None  # there is at least one claim
            rationale = _rationale(rows)
            cut = extraction.cut
            if cut is not None:
                rationale += (f" Only the first {cut['kept']} of the {cut['extracted']} claims extracted were "
                              f"verified (at most {cut['cap']} for this response).")
            return JudgeResult.scored(value, rationale, raw=got.raw, details=details, calls=calls)

        return check_claims(CHECK, claims, details, row=_claim_row, verify=verify, score=score)

    def estimate(self, question: str, response: str, evidence: Sequence[str] | None) -> Estimate:
        """Upper-bound cost of judging one row, without calling the model.

        Returns ``{"calls", "input_tokens", "output_tokens"}``: 0 calls without evidence or with an
        empty response, else 2 (1 when the response's claims are already memoised). Tokens are
        rough (:func:`~mlflow_ragjudge.metrics.statements.approx_tokens`) and assume about one
        claim per 8 tokens of response; a re-ask (only after an unreadable reply) is not counted.
        """
        passages = nonblank_passages(evidence)
        response = (response or "").strip()
        if not passages or not response:
            return {"calls": 0, "input_tokens": 0, "output_tokens": 0}
        extract = self.extractor.estimate(response, question or "")
        claim_tokens = math.ceil(1.5 * approx_tokens(response)) + 16
        n_claims = max(1, math.ceil(approx_tokens(response) / 8))
        evidence_text, _ = number_items(passages, max_chars=self.max_passage_chars, fence="passage")
        verify = estimate_messages(
            self._verify_messages([], evidence_text), min(self.max_tokens, n_claims * TOKENS_PER_VERDICT)
        )
        verify["input_tokens"] += claim_tokens + 4 * n_claims
        return add_estimates(extract, verify)


#: faithfulness in the words of the claim-checking skeleton
CHECK = ClaimCheck(
    noun="claims", extraction_stage="claim extraction", verification_stage="claim verification",
    no_claims=("no_claims",
               "The response makes no factual claim (empty, a refusal, or 'I don't know'); faithfulness is undefined."),
)


def _claim_row(number: int, claim: str, entry: Mapping[str, Any] | None) -> ClaimRow:
    return {"claim": claim, "supported": entry["verdict"] == "supported" if entry is not None else None,
            "reason": entry["reason"].strip() if entry is not None else None}


def _rationale(rows: list[ClaimRow], limit: int = 3) -> str:
    n = len(rows)
    supported = sum(r["supported"] for r in rows)
    text = f"{supported} of {n} claim{'s' if n != 1 else ''} supported by the evidence."
    unsupported = [r for r in rows if not r["supported"]]
    if unsupported:
        shown = "; ".join(f"\"{r['claim']}\" ({r['reason']})" for r in unsupported[:limit])
        more = f"; and {len(unsupported) - limit} more" if len(unsupported) > limit else ""
        text += f" Unsupported: {shown}{more}."
    return text


# --------------------------------------------------------------------------- the metric


def shared_extractor(ctx: RunContext) -> StatementExtractor:
    """The run's statement extractor (one per run, shared by every metric that splits texts into claims)."""
    return ctx.shared("statement_extractor", lambda: StatementExtractor(ctx.judge_client, language=ctx.cfg.language))


def _requires(cfg: RunSettings) -> tuple[tuple[str, ...], ...]:
    evidence = "gold_documents" if EVIDENCE.read(cfg) == "gold" else "contexts"
    base: tuple[str, ...] = ("answer", evidence)
    if REQUIRE_HIT.read(cfg):
        base = (*base, "retrieved_doc_ids", "relevant_doc_ids")
    return (base,)


def _evidence(row: Row, cfg: RunSettings) -> list[str] | None:
    return row.gold_documents if EVIDENCE.read(cfg) == "gold" else row.contexts


def _retrieval_miss(row: Row, ctx: RunContext) -> JudgeResult | None:
    if REQUIRE_HIT.read(ctx.cfg) and not row.retrieval_hit:
        return JudgeResult.abstained(
            "retrieval_miss",
            "No relevant document was retrieved, so this row is left out "
            "(faithfulness_require_retrieval_hit=True separates generation errors from retrieval misses).",
        )
    return None


def _score(judge: FaithfulnessJudge, row: Row, ctx: RunContext) -> JudgeResult:
    return _retrieval_miss(row, ctx) or judge.judge(row.question or "", row.answer or "", _evidence(row, ctx.cfg))


def _offline_score(judge: OfflineEvidence, row: Row, ctx: RunContext) -> JudgeResult:
    return _retrieval_miss(row, ctx) or offline_faithfulness(judge, row.answer or "", _evidence(row, ctx.cfg))


def _claims_column(res: dict[str, JudgeResult]) -> Any:
    d = res["faithfulness"].details
    return dumps_text(d["claims"]) if "claims" in d else None


def offline_claims(response: str | None) -> list[tuple[str, TextCut]]:
    """The claims the offline judge checks in ``response``: its claim-like sentences of two content words or more
    (not questions, courtesy or declines), numbers in one form (:func:`~.offline_reading.number_forms`, as the
    evidence's); a response of one word is one claim."""
    said = text_cut(number_forms(response or ""))
    claims = [(s, part) for s, part in zip(said.sentences, said.parts)
              if is_claim_sentence(s) and len(part.content) >= 2]
    if not claims and said.content:
        whole = said.text.strip()
        claims = [(whole, text_cut(whole))]  # a one-word answer is still a claim
    return claims


#: the share of a claim's words one passage (a window of its sentences) must hold for the claim to be supported
ONE_PASSAGE = 0.5


def offline_faithfulness(ev: OfflineEvidence, response: str, evidence: Sequence[str] | None) -> JudgeResult:
    """Mean support of the response's claim-like sentences by the evidence passages."""
    passages = nonblank_passages(evidence)
    if not passages:
        return JudgeResult.abstained("no_evidence", "No evidence passages to check the response against.",
                                     details=ev.details())
    if declines_to_answer(response):
        return JudgeResult.abstained("no_claims", "(offline judge) The response declines to answer; it makes "
                                     "no claim to check.", details=ev.details(claims=[]))
    claims = offline_claims(response)
    if not claims:
        return JudgeResult.abstained("no_claims", "(offline judge) The response makes no claim.",
                                     details=ev.details(claims=[]))
    passages = [number_forms(p) for p in passages]
    backed = content_union(passages)
    sentences = [text_cut(p).parts for p in passages]
    tau = ev.calibration.claim_cut
    rows: list[dict[str, Any]] = []
    for c, part in claims:
        s = Support(c, part.content, backed, sentences)
        # supported: by what one passage says (most of its words in a window of its sentences), not by words
        # borrowed from several
        supported = s.support >= tau and s.window_share >= max(tau, ONE_PASSAGE)
        reason = (f"contradicted: {s.contradiction}" if s.contradiction else
                  f"its words are found only across passages ({s.window_share:.0%} in one)"
                  if s.support >= tau and not supported else
                  "all content words found" if not s.missing else "not in the evidence: " + ", ".join(s.missing[:8]))
        rows.append({"claim": c, "support": round(s.support, 4), "supported": supported, "reason": reason,
                     "words_found": round(s.share, 4), "phrases_found_in_one_sentence": round(s.phrase_share, 4),
                     "words_found_in_one_passage": round(s.window_share, 4),
                     **({"missing_names_or_numbers": s.missing_keys} if s.missing_keys else {}),
                     **({"passage": s.window[:300]} if s.window else {})})
    score = math.fsum(r["support"] for r in rows) / len(rows)
    bad = [r for r in rows if not r["supported"]]
    rationale = (f"(offline judge, word overlap, not an LLM) mean support {score:.2f} over {len(rows)} "
                 f"sentence{'s' if len(rows) != 1 else ''}; {len(rows) - len(bad)} supported (>= {tau:.2f}).")
    if bad:
        rationale += " Unsupported: " + "; ".join(f"\"{r['claim'][:120]}\" ({r['reason']})" for r in bad[:3])
        rationale += f"; and {len(bad) - 3} more." if len(bad) > 3 else "."
    return JudgeResult.scored(score, rationale, details=ev.details(
        claims=rows, n_supported=len(rows) - len(bad), support_threshold=tau))


#: faithfulness's own settings: the evidence, the retrieval-hit filter, the evidence budget per call
EVIDENCE = Option("faithfulness_evidence", "contexts", lambda v: v in ("contexts", "gold"),
                  "'contexts' (RAGAS's definition) or 'gold' (the gold_documents; seed 001's variant)", "'gold'")
REQUIRE_HIT = Option("faithfulness_require_retrieval_hit", False, lambda v: isinstance(v, bool),
                     "True or False (score only rows where a relevant document was retrieved)", "True")
EVIDENCE_CHARS = Option("faithfulness_evidence_chars", 24_000, lambda v: is_int(v) and v >= 1000,
                        "a whole number of characters >= 1000 (the evidence budget per call)", "24000")


def _spec() -> MetricSpec[FaithfulnessJudge]:
    return MetricSpec(
        "faithfulness",
        options=(EVIDENCE, REQUIRE_HIT, EVIDENCE_CHARS),
        requires=_requires,
        judged=True,
        setup=lambda ctx: FaithfulnessJudge(ctx.judge_client, language=ctx.cfg.language,
                                            extractor=shared_extractor(ctx),
                                            max_evidence_chars=EVIDENCE_CHARS.read(ctx.cfg)),
        score=_score,
        estimate=lambda j, r, ctx: j.estimate(r.question or "", r.answer or "", _evidence(r, ctx.cfg)),
        outputs=Outputs(columns={"faithfulness/claims": _claims_column}),
        prompt_versions=lambda j: j.prompt_versions,
        record=lambda j, ctx: {"faithfulness_evidence": EVIDENCE.read(ctx.cfg)},
        description="claim-based faithfulness: supported claims of the response / all its claims",
        offline=_offline_score,
        needs=Needs(sentences=("answer",)),
    )


METRICS = (_spec(),)
