"""Seed 004's output checks as metrics of any run (SPEC 2.8), no judge model, deterministic:

* ``refusal`` -- with an ``answerable`` column (False: the corpus does not hold the answer):
  ``refusal_correct`` on unanswerable rows (1 when the system refused, 0 when it answered anyway: the seed's
  "refusal failure") and ``false_refusal`` on answerable rows (1 when it refused what it could answer). A refusal
  is an answer containing one of ``refusal_phrases`` (case and spacing ignored), or, without phrases, an answer
  that as a whole declines (:func:`mlflow_ragjudge.metrics.offline.declines_to_answer`). When the answer is a JSON
  object with a string ``answer`` field (the seed's output contract), that field is what is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ..core.matching import declines_to_answer
from ..core.types import JudgeResult, Row
from ..core.values import is_str_list
from .spec import MetricSpec, Option, Outputs, RunContext

__all__ = ['is_refusal', 'answer_text', 'METRICS', 'PHRASES']


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())

def answer_text(answer: str) -> str:
    """The text to read for a refusal: a JSON object's string ``answer`` field, else the answer itself."""
    s = answer.strip()
    if s.startswith("{"):
        try:
            value = json.loads(s)
        except ValueError:
            return answer
        if isinstance(value, dict) and isinstance(value.get("answer"), str):
            return value["answer"]
    return answer

def is_refusal(answer: str, phrases: Sequence[str] | None = None) -> bool:
    """Whether ``answer`` refuses: it contains one of ``phrases`` (case, punctuation and spacing ignored), or,
    without phrases, it declines as a whole."""
    text = answer_text(answer or "")
    if phrases:
        norm = _normal(text)
        return any(_normal(p) and _normal(p) in norm for p in phrases)

    return declines_to_answer(text)

def _refusal(state: Any, row: Row, ctx: RunContext) -> dict[str, JudgeResult]:
    if row.answerable is None:
        why = "the row does not say whether it is answerable"
        return {"refusal_correct": JudgeResult.abstained("answerable_unknown", why),
                "false_refusal": JudgeResult.abstained("answerable_unknown", why)}
    refused = is_refusal(row.answer or "", PHRASES.read(ctx.cfg))
    said = "refused" if refused else "answered"
    if row.answerable:
        return {"refusal_correct": JudgeResult.abstained("answerable", "an answerable row (see false_refusal)"),
                "false_refusal": JudgeResult.scored(float(refused), f"answerable, and the system {said}")}
    return {"refusal_correct": JudgeResult.scored(float(refused), f"not answerable, and the system {said}"),
            "false_refusal": JudgeResult.abstained("not_answerable", "a row that should be refused")}


#: the refusal check's setting: the phrases that mark a refusal (None: the built-in ones)
PHRASES: Option[list[str] | None] = Option(
    "refusal_phrases", None, lambda v: v is None or (isinstance(v, str) and bool(v.strip())) or is_str_list(v),
    "a refusal phrase or a list of them", "'The documents do not say.'",
    normalize=lambda v: [v] if isinstance(v, str) else v)


def _spec() -> MetricSpec[None]:
    return MetricSpec(
        "refusal",
        options=(PHRASES,),
        requires=(("answer", "answerable"),),
        outputs=Outputs(("refusal_correct", "false_refusal")),
        score=_refusal,
        description="refusals (seed 004): refusal_correct on answerable=False rows, false_refusal on the others",
    )


METRICS = (_spec(),)
