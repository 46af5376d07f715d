"""Context relevance, the original RAGAS metric (SPEC 2.4): the contexts are split into sentences
(:func:`mlflow_ragjudge.core.text.split_sentences`, which also cuts at ``。！？``), one call selects the sentences
needed to answer the question by number; the score is selected / total sentences, 0 when the model selects nothing
("insufficient information"). The offline judge's rule is beside it (:func:`offline_context_relevance`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core import claims as claim_math
from ..core.matching import content_tokens, content_union, text_cut
from ..core.text import as_text_list, split_context_sentences
from ..core.types import FailureReason, JudgeResult
from ..llm.backends import ChatRequest, ChatResponse, JsonSchema
from ..llm.client import JudgeClient
from ..llm.parsing import ParseError, reply_object, validate_schema
from ..llm.prompts import item_fencer, load_prompt
from .context_verdicts import (
    json_column,
)
from .offline_evidence import OfflineEvidence
from .spec import Estimate, MetricSpec, Needs, Outputs
from .statements import (
    estimate_messages,
    failed_result,
    index_schema,
    prompt_version,
)

__all__ = ["ContextRelevanceJudge", "offline_context_relevance"]


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
        texts = [" ".join(sentence.split()) for _, sentence in sentences]
        # each sentence fenced on its own, one marker for all: a sentence holding "[2] ..." cannot look like sentence 2
        fence = item_fencer(texts, kind="sentence")
        for n, (passage, _) in enumerate(sentences, 1):
            if passage != current:
                lines.append(f"Passage {passage}:")
                current = passage
            lines.append(fence(n, texts[n - 1]))
        return self.prompt.render(
            "json", question=question.strip(), sentences="\n".join(lines), n_sentences=str(len(sentences))
        )

    def call_schema(self, total: int) -> dict[str, Any]:
        """The per-call schema: sentence numbers limited to ``1..total``, each at most once."""
        arr = {**self.schema["properties"]["sentences"], "items": index_schema(range(1, total + 1)), "maxItems": total}
        return {**self.schema, "properties": {**self.schema["properties"], "sentences": arr}}

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

    def estimate(self, question: str, contexts: Sequence[str] | None) -> Estimate:
        """Upper-bound cost of one row: 1 call (0 when the contexts have no sentence)."""
        sentences = split_context_sentences(contexts)
        if not sentences:
            return {"calls": 0, "input_tokens": 0, "output_tokens": 0}
        out_tokens = min(self.max_tokens, 24 + 4 * len(sentences))
        return estimate_messages(self._messages(question or "", sentences), out_tokens)


# --------------------------------------------------------------------------- the offline judge (no LLM)


def offline_context_relevance(ev: OfflineEvidence, question: str, references: Sequence[str],
                              contexts: Sequence[str] | None) -> JudgeResult:
    """Share of the context sentences that carry the question's and the reference's words."""
    # the sentences of every passage in order (split_context_sentences), read from the passages' cuts
    sentences = [part for passage in as_text_list(contexts) for part in text_cut(passage).parts]
    if not sentences:
        return JudgeResult.abstained("no_contexts", "The contexts have no sentence.", details=ev.details())
    asked = text_cut(question).content_set if isinstance(question, str) else frozenset(content_tokens(question))
    ref = content_union(references)
    wanted = asked | ref
    chosen = []
    for n, part in enumerate(sentences, 1):
        toks = part.content_set
        if len(toks & wanted) >= 2 and (not ref or toks & ref):
            chosen.append(n)
    score = len(chosen) / len(sentences)
    rationale = (f"(offline judge, word overlap) {len(chosen)} of {len(sentences)} context sentences share at "
                 "least two content words with the question and the reference.")
    return JudgeResult.scored(score, rationale, details=ev.details(selected=chosen, n_sentences=len(sentences)))


def _spec() -> MetricSpec[ContextRelevanceJudge]:
    return MetricSpec(
        "context_relevance",
        requires=(("question", "contexts"),),
        judged=True,
        setup=lambda ctx: ContextRelevanceJudge(ctx.judge_client, language=ctx.cfg.language),
        score=lambda j, r, ctx: j.judge(r.question or "", r.contexts),
        estimate=lambda j, r, ctx: j.estimate(r.question or "", r.contexts),
        outputs=Outputs(columns={"context_relevance/selected": json_column("context_relevance", "selected")}),
        prompt_versions=lambda j: j.prompt_versions,
        description="context relevance: share of context sentences needed to answer the question (original RAGAS)",
        offline=lambda ev, r, ctx: offline_context_relevance(ev, r.question or "", r.acceptable_answers, r.contexts),
        needs=Needs(sentences=("contexts",)),
    )


METRICS = (_spec(),)
