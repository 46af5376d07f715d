"""A metric of a user's own, written as docs/extending.md says: one module, one registration line at its end.

``answer_brevity`` scores 0 without asking the judge when the answer is longer than ``brevity_max_words`` (its own
setting), else asks the judge to rate the answer's concision from 1 to 3 and maps that to 0.5, 0.75 or 1. Under the
offline judge it scores from the word count alone. The tests load this file three ways: imported before
``mlflow.models.evaluate``, before an ``mlflow.genai`` ``MetricScorer``, and as ``ragjudge evaluate --plugin``.
"""

from __future__ import annotations

import json

from mlflow_ragjudge.core.types import JudgeResult, Row
from mlflow_ragjudge.llm.backends import ChatRequest, JsonSchema
from mlflow_ragjudge.metrics.spec import MetricSpec, Option, Outputs, RunContext, register_metric

#: its setting: the most words an answer may have (its own key, validated and defaulted by this metric)
MAX_WORDS = Option("brevity_max_words", 40, lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
                   "a whole number > 0", "25")

RATING = {"type": "object", "properties": {"rating": {"type": "integer", "enum": [1, 2, 3]},
                                           "why": {"type": "string"}},
          "required": ["rating", "why"], "additionalProperties": False}


def _words(row: Row) -> int:
    return len((row.answer or "").split())


def _too_long(row: Row, ctx: RunContext) -> JudgeResult | None:
    limit = MAX_WORDS.read(ctx.cfg)
    if _words(row) > limit:
        return JudgeResult.scored(0.0, f"{_words(row)} words, over the limit of {limit}")
    return None


def score(state: None, row: Row, ctx: RunContext) -> JudgeResult:
    over = _too_long(row, ctx)
    if over is not None:
        return over
    request = ChatRequest.of(
        [{"role": "user", "content": "How concise is this answer to the question, from 1 (padded) to 3 (to the "
                                     f"point)?\nQuestion: {row.question}\nAnswer: {row.answer}"}],
        max_tokens=80, json_schema=JsonSchema("brevity_rating", RATING))
    call = ctx.judge_client.call(request, parse=lambda r: r.data or json.loads(r.text), purpose="answer_brevity")
    if not call.ok:  # recorded with its reason; the run goes on
        return JudgeResult.failed(call.failure or "internal_error", call.error, calls=call.records)
    rating = int(call.parsed["rating"])
    return JudgeResult.scored(0.25 + rating / 4, str(call.parsed["why"]), calls=call.records)


def offline(evidence: object, row: Row, ctx: RunContext) -> JudgeResult:
    over = _too_long(row, ctx)
    return over if over is not None else JudgeResult.scored(1.0, f"{_words(row)} words")


SPEC = MetricSpec(
    "answer_brevity",
    requires=(("question", "answer"),),
    judged=True,
    score=score,
    offline=offline,
    estimate=lambda state, row, ctx: {"calls": 1, "input_tokens": 80, "output_tokens": 30},
    options=(MAX_WORDS,),
    outputs=Outputs(columns={
        "answer_brevity/over_limit": lambda results: "over the limit" in results["answer_brevity"].rationale}),
    description="0 when the answer is over brevity_max_words, else the judge's concision rating (0.5..1)",
)

register_metric(SPEC, replace=True)
