"""The context-aware six-level correctness judge (IBM Research; SPEC 2.1).

The judge writes feedback, then an integer score:
5 correct and complete; 4 largely correct but incomplete; 3 partly correct, partly
wrong; 2 mostly wrong but not fatally; 1 completely, fatally wrong; 0 the response
says it is not sure. Level 0 is an abstention, not a quality level: it is returned
as ``abstained`` (reason ``not_sure``) and left out of the mean, as in the paper.

What the judge sees as context is the paper's key variable (see ``context_mode`` in
the evaluator): E3 ``reference`` contexts retrieved with question + reference
answer (the paper's proposal), E2 ``generation`` contexts, ``gold`` documents, or
``none``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.constants import CONTEXT_PROVENANCE
from ..core.matching import declines_to_answer
from ..core.text import nonblank_passages
from ..core.types import JudgeResult, Row
from ..core.values import is_int
from ..llm.backends import ChatRequest, JsonSchema
from ..llm.client import JudgeClient
from ..llm.parsing import parse_score_reply
from ..llm.prompts import Prompt, fence_items, load_prompt, reference_text
from .contexts import prepare_judge_contexts
from .offline_evidence import (
    LEVEL_WORDS,
    OfflineEvidence,
    answer_features,
    answer_found,
    code_conflict,
    is_long_answer,
    name_conflict,
    unit_conflict,
)
from .offline_reading import unasserted
from .spec import Estimate, MetricSpec, Option, Outputs, RunContext
from .statements import add_estimates, estimate_messages

__all__ = ["CorrectnessJudge", "format_contexts", "LEVELS"]

LEVELS = {
    5: "correct and complete",
    4: "largely correct, but incomplete",
    3: "partially correct and partially wrong",
    2: "mostly wrong, but not fatally",
    1: "completely wrong, fatally so",
    0: "not sure (abstention)",
}
TRUNCATION_MARK = " [...truncated]"
MIN_PARTIAL_CHARS = 200


def format_contexts(contexts: Sequence[str] | None, max_chars: int) -> tuple[str, dict[str, Any]]:
    """The passages in rank order within a character budget, each between its own numbered tags
    (:func:`~mlflow_ragjudge.llm.prompts.fence_items`: a passage holding ``[2] ...`` cannot look like passage 2).

    Truncation rule (documented in docs/correctness.md): passages are kept whole in
    rank order while they fit in ``max_chars``; the first passage that does not fit
    is cut to the remaining budget (marked ``[...truncated]``) if at least 200
    characters remain, else dropped; every later passage is dropped. Higher-ranked
    passages are the ones a retriever trusts most, so they are the ones kept.

    Returns the text and a record: passages given, shown, cut, dropped, characters.
    """
    contexts = nonblank_passages(contexts)
    info: dict[str, Any] = {"n_given": len(contexts), "n_shown": 0, "truncated": False, "n_dropped": 0}
    if not contexts:
        info["chars"] = 0
        return "(no context passages)", info
    parts: list[str] = []
    used = 0
    for i, ctx in enumerate(contexts, 1):
        text = " ".join(str(ctx).split())
        fence = len(fence_items([""], numbers=[i]))  # the passage's own tags count in the budget
        remaining = max_chars - used - fence
        if len(text) <= remaining:
            parts.append(text)
            used += fence + len(text) + 1
            continue
        info["truncated"] = True
        if remaining >= MIN_PARTIAL_CHARS:
            parts.append(text[: remaining - len(TRUNCATION_MARK)] + TRUNCATION_MARK)
            info["n_cut"] = 1
            info["n_dropped"] = len(contexts) - i
        else:
            info["n_dropped"] = len(contexts) - i + 1
        break
    info["n_shown"] = len(parts)
    out = fence_items(parts, kind="passage")
    info["chars"] = len(out)
    return out, info


@dataclass
class CorrectnessJudge:
    """Score one response on the six-level rubric.

    Args:
        client: the judge client (model, cache, limits).
        language: prompt language, ``en`` or ``ja`` (inputs in any language work).
        output: ``json`` (structured output), ``prometheus`` (``Feedback: ... [RESULT] n``)
            or ``auto``: the Prometheus form for Prometheus-family models (a model name
            containing ``prometheus``; the form they were trained on, as the paper's judges
            used it) and for backends that cannot return JSON; JSON otherwise -- enforced
            by the server where it can, with the schema in the prompt where it cannot
            (see docs/judge-client.md). The parser reads every form whatever was asked.
        max_context_chars: the context budget, see :func:`format_contexts`.
        max_tokens: reply budget.
    """

    client: JudgeClient
    language: str = "en"
    output: str = "auto"
    max_context_chars: int = 12_000
    max_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.output not in ("auto", "json", "prometheus"):
            raise ValueError(f"output must be 'auto', 'json' or 'prometheus', not {self.output!r}")
        self.prompt: Prompt = load_prompt("correctness", self.language)

    @property
    def prompt_version(self) -> str:
        return f"correctness-v{self.prompt.version}-{self.prompt.language}"

    @property
    def prompt_versions(self) -> dict[str, str]:
        return {"correctness": self.prompt_version}

    def _format(self) -> str:
        if self.output != "auto":
            return self.output
        backend = self.client.backend
        if "prometheus" in backend.model.lower() or not backend.supports_json_schema:
            return "prometheus"
        return "json"

    #: expected reply length (feedback + score) for cost estimates
    ESTIMATED_REPLY_TOKENS = 200

    def estimate(self, question: str, response: str, reference: str,
                 contexts: Sequence[str] | None = None) -> Estimate:
        """Cost of judging one row without calling the model: 1 call, rough tokens."""
        ctx_text, _ = format_contexts(contexts, self.max_context_chars)
        messages = self.prompt.render(self._format(), question=question, reference=reference, contexts=ctx_text,
                                      response=response or "(empty response)")
        return estimate_messages(messages, self.ESTIMATED_REPLY_TOKENS)

    def judge(
        self,
        question: str,
        response: str,
        reference: str,
        contexts: Sequence[str] | None = None,
    ) -> JudgeResult:
        """Judge one row. Never raises for model failures: they come back as failed results."""
        ctx_text, ctx_info = format_contexts(contexts, self.max_context_chars)
        fmt = self._format()
        messages = self.prompt.render(
            fmt, question=question, reference=reference, contexts=ctx_text, response=response or "(empty response)"
        )
        schema = self.prompt.schema
        request = ChatRequest.of(
            messages,
            max_tokens=self.max_tokens,
            json_schema=JsonSchema("correctness_verdict", schema) if fmt == "json" and schema else None,
        )
        call = self.client.call(
            request,
            parse=lambda r: parse_score_reply(r, allowed=LEVELS.keys(), schema=schema if fmt == "json" else None),
            prompt_version=self.prompt_version,
            purpose="correctness",
        )
        details = {"contexts_shown": ctx_text, "context_info": ctx_info, "format": fmt}
        if not call.ok:
            assert call.failure is not None
            return JudgeResult.failed(call.failure, call.error, raw=call.raw, details=details, calls=call.records)
        score, feedback = call.parsed["score"], call.parsed["feedback"]
        details["level"] = score
        if score == 0:
            return JudgeResult.abstained("not_sure", feedback, raw=call.raw, details=details, calls=call.records)
        return JudgeResult.scored(score, feedback, raw=call.raw, details=details, calls=call.records)


# --------------------------------------------------------------------------- the metric


def shared_correctness_judge(ctx: RunContext) -> CorrectnessJudge:
    """The run's six-level judge (one per run: the multi-turn judge uses the same prompt, format and budget)."""
    cfg = ctx.cfg
    return ctx.shared("judge:correctness", lambda: CorrectnessJudge(
        ctx.judge_client, language=cfg.language, output=JUDGE_OUTPUT.read(cfg),
        max_context_chars=MAX_CONTEXT_CHARS.read(cfg)))


def _reference(row: Row, ctx: RunContext) -> str:
    """The prompt's reference: the answer, or every acceptable answer shown as alternatives."""
    return reference_text(row.acceptable_answers, ctx.cfg.language)


def _per_context_mode(row: Row, one: Any) -> JudgeResult | dict[str, JudgeResult]:
    """``one(contexts)`` for the row's context mode, or for each of its modes (E2 vs E3 ...), with the mode and
    its provenance recorded on each result."""
    if len(row.judge_contexts_by_mode) > 1:  # several context modes: one judgement per mode
        out = {}
        for mode, contexts in row.judge_contexts_by_mode.items():
            res = one(contexts)
            res.details.update(context_mode=mode, context_provenance=CONTEXT_PROVENANCE.get(mode))
            out[f"correctness_{mode}"] = res
        return out
    res = one(row.judge_contexts)
    res.details["context_mode"] = row.context_mode
    res.details["context_provenance"] = row.context_provenance
    return res


def _score(judge: CorrectnessJudge, row: Row, ctx: RunContext) -> JudgeResult | dict[str, JudgeResult]:
    reference = _reference(row, ctx)
    return _per_context_mode(row, lambda contexts: judge.judge(row.question or "", row.answer or "", reference,
                                                               contexts))


def _offline_score(judge: OfflineEvidence, row: Row, ctx: RunContext) -> JudgeResult | dict[str, JudgeResult]:
    return _per_context_mode(row, lambda contexts: offline_correctness(judge, row.question or "", row.answer or "",
                                                                     row.acceptable_answers, contexts))


def _estimate(judge: CorrectnessJudge, row: Row, ctx: RunContext) -> Estimate:
    modes = row.judge_contexts_by_mode if len(row.judge_contexts_by_mode) > 1 else {None: row.judge_contexts}
    reference = _reference(row, ctx)
    parts = [judge.estimate(row.question or "", row.answer or "", reference, c) for c in modes.values()]
    return add_estimates(*parts)


def _per_mode(key: str) -> Any:
    """A per-row column: the detail of the single judgement, or ``{mode: detail}`` with several modes."""
    import json

    def build(res: dict[str, JudgeResult]) -> Any:
        if "correctness" in res:
            return res["correctness"].details.get(key)
        return json.dumps({name[len("correctness_"):]: r.details.get(key) for name, r in res.items()},
                          ensure_ascii=False, default=str)

    return build


#: the highest level of a response that names a short answer without asserting it (:func:`.offline_reading.unasserted`):
#: the level of an answer that has only part of what was asked
UNASSERTED_LEVEL = 2


def offline_correctness(ev: OfflineEvidence, question: str, response: str, references: Sequence[str],
                        contexts: Sequence[str] | None = None) -> JudgeResult:
    """Six-level correctness of ``response`` against the acceptable answers ``references`` (the best one
    counts), with the context mode's passages as trusted evidence."""
    if declines_to_answer(response, question):
        return JudgeResult.abstained("not_sure", "(offline judge) The response declines to answer.",
                                     details=ev.details(level=0))
    best: tuple[float, int, dict[str, float]] | None = None
    features = [answer_features(question, response, ref, contexts or ()) for ref in references]
    for i, f in enumerate(features):
        if f is None:
            continue
        p = ev.calibration.probability(f)
        if best is None or p > best[0]:
            best = (p, i, f)
    if best is None:
        return JudgeResult.failed("invalid_input", "the reference has no words to compare with",
                                  details=ev.details())
    p, i, f = best
    level = ev.calibration.level(p, f["recall"], f)
    # hard rules on top of the fitted model (issue 27): no passing level for a response that contains none of any
    # acceptable answer, and a number or formula that disagrees with the reference's counts against it
    # (answer_found reads the features that do not depend on the contexts: the ones computed above serve)
    found = any(g is not None and answer_found(g, response, r) for g, r in zip(features, references))
    conflict = (code_conflict(question, response, references[i]) or unit_conflict(response, references[i])
                or name_conflict(question, response, references[i]))
    # a short answer named but not asserted: denied, one of several alternatives, or only inside a question
    unsaid = unasserted(question, response, references[i]) if found and not is_long_answer(f) else None
    if not found:
        level = min(level, ev.calibration.level(0.0, f["recall"], f))
    if conflict:
        level = min(level, 3)
    if unsaid:
        level = min(level, UNASSERTED_LEVEL)
    shown = {k: round(v, 3) for k, v in f.items()}
    rationale = (f"(offline judge, lexical evidence, not an LLM) level {level} ({LEVEL_WORDS[level]}): "
                 f"P(acceptable)={p:.2f}; {f['recall']:.0%} of the reference's content words found"
                 + (", as a phrase" if f["phrase"] else "")
                 + ("; a number of the reference is missing" if f["number_missing"] else "")
                 + ("; the response gives other numbers" if f["number_conflict"] else "")
                 + (f"; the response gives {_shown_code(conflict)}, the reference does not" if conflict else "")
                 + ("; none of any acceptable answer is in the response (beyond the question's own words), so not "
                    "a passing level" if not found else "")
                 + (f"; the response names the answer but does not assert it: {unsaid}, so at most level "
                    f"{UNASSERTED_LEVEL}" if unsaid else "")
                 + f"; {f['support']:.0%} of the response is backed by the reference, contexts or question"
                 + (f" (best of {len(references)} acceptable answers: #{i + 1})" if len(references) > 1 else "")
                 + ".")
    return JudgeResult.scored(level, rationale, details=ev.details(
        level=level, probability=round(p, 4), features=shown, matched_reference=references[i],
        matched_reference_index=i, **({"unasserted": unsaid} if unsaid else {}),
        **({"conflict": _shown_code(conflict)} if conflict else {})))


def _shown_code(code: str) -> str:
    """A conflicting number or date part as the justification shows it (``month:6`` -> ``month 6``)."""
    return code.replace("month:", "month ")


#: correctness's own settings (given in the evaluator config with the run's): the reply format, the context budget
#: (multi-turn declares the same budget: its judge is this one)
JUDGE_OUTPUT = Option("judge_output", "auto", lambda v: v in ("auto", "json", "prometheus"),
                      "'auto', 'json' or 'prometheus' (auto: the Prometheus form for Prometheus-family models, JSON "
                      "otherwise)", "'json'")
MAX_CONTEXT_CHARS = Option("max_context_chars", 12_000, lambda v: is_int(v) and v >= 500,
                           "a whole number of characters >= 500 (the judge's context budget)", "12000")


def _spec() -> MetricSpec[CorrectnessJudge]:
    return MetricSpec(
        "correctness",
        options=(JUDGE_OUTPUT, MAX_CONTEXT_CHARS),
        requires=(("question", "answer", "reference"),),
        judged=True,
        prepare=prepare_judge_contexts,
        setup=shared_correctness_judge,
        score=_score,
        estimate=_estimate,
        outputs=Outputs(("correctness", "correctness_"), levels=("correctness", "correctness_"), headline=True,
                        columns={"correctness/contexts_shown": _per_mode("contexts_shown"),
                                 "correctness/context_provenance": _per_mode("context_provenance")}),
        prompt_versions=lambda j: j.prompt_versions,
        description="context-aware six-level correctness (5..1, 0 = not sure), judged with the context mode's passages",
        offline=_offline_score,
    )


METRICS = (_spec(),)
