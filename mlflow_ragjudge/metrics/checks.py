"""Seed 004's output checks on your own data, as metrics of any run (SPEC 2.8). No judge model; deterministic.

* ``output_contract`` -- with ``output_schema`` set: 1 when the answer (or, when the data has one, the system's
  ``raw_output`` the answer was extracted from) is a JSON document valid against that JSON Schema (draft
  2020-12, checked with ``jsonschema``), else 0 with the first violation (``output_contract/violation`` in the
  per-row table). Format adherence, as the seed asks of the generator.
* ``refusal`` -- with an ``answerable`` column (False: the corpus does not hold the answer):
  ``refusal_correct`` on unanswerable rows (1 when the system refused, 0 when it answered anyway: the seed's
  "refusal failure") and ``false_refusal`` on answerable rows (1 when it refused what it could answer). A refusal
  is an answer containing one of ``refusal_phrases`` (case and spacing ignored), or, without phrases, an answer
  that as a whole declines (:func:`mlflow_ragjudge.offline.declines_to_answer`). When the answer is a JSON
  object with a string ``answer`` field (the seed's output contract), that field is what is read.
* ``citations`` -- with ``citations`` and ``retrieved_doc_ids``: ``citation_validity`` = cited ids that are among
  the retrieved ones / cited ids (an answer citing nothing abstains) and ``context_utilisation`` = distinct
  retrieved ids the answer cites / distinct retrieved ids (the seed's "sources used / contexts given").
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ..core.matching import declines_to_answer
from ..core.types import JudgeResult
from .spec import MetricSpec

__all__ = ["check_output_schema", "is_refusal", "contract_violation", "METRICS"]


def check_output_schema(schema: dict[str, Any]) -> None:
    """Refuse a schema that is not valid JSON Schema, naming the problem (before any call)."""
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ValueError(f"output_schema is not a valid JSON Schema: {e.message} (at "
                         f"{'/'.join(str(p) for p in e.absolute_path) or 'the top'}).") from None


def contract_violation(answer: str, schema: dict[str, Any]) -> str | None:
    """Why ``answer`` breaks the output contract ``schema``, or None when it keeps it."""
    import jsonschema

    try:
        value = json.loads(answer)
    except json.JSONDecodeError as e:
        head = answer.strip()[:60]
        return f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno}; the answer starts {head!r})"
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(p) for p in first.absolute_path) or "the top level"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"at {where}: {first.message}{more}"


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


# --------------------------------------------------------------------------- the metrics


def _contract(state: Any, row: Any, ctx: Any) -> JudgeResult:
    schema = ctx.cfg.output_schema
    raw = row.raw_output if row.raw_output is not None else row.answer
    violation = contract_violation(raw or "", schema)
    if violation is None:
        return JudgeResult.scored(1.0, "the answer follows the output contract")
    return JudgeResult.scored(0.0, violation, details={"violation": violation})


def _refusal(state: Any, row: Any, ctx: Any) -> dict[str, JudgeResult]:
    if row.answerable is None:
        why = "the row does not say whether it is answerable"
        return {"refusal_correct": JudgeResult.abstained("answerable_unknown", why),
                "false_refusal": JudgeResult.abstained("answerable_unknown", why)}
    refused = is_refusal(row.answer or "", ctx.cfg.refusal_phrases)
    said = "refused" if refused else "answered"
    if row.answerable:
        return {"refusal_correct": JudgeResult.abstained("answerable", "an answerable row (see false_refusal)"),
                "false_refusal": JudgeResult.scored(float(refused), f"answerable, and the system {said}")}
    return {"refusal_correct": JudgeResult.scored(float(refused), f"not answerable, and the system {said}"),
            "false_refusal": JudgeResult.abstained("not_answerable", "a row that should be refused")}


def _citations(state: Any, row: Any, ctx: Any) -> dict[str, JudgeResult]:
    retrieved = [str(d) for d in (row.retrieved_doc_ids or [])]
    cited = [str(c) for c in (row.citations or [])]
    given = set(retrieved)
    out: dict[str, JudgeResult] = {}
    if not cited:
        out["citation_validity"] = JudgeResult.abstained("no_citations", "the answer cites nothing")
    else:
        bad = [c for c in cited if c not in given]
        out["citation_validity"] = JudgeResult.scored(
            (len(cited) - len(bad)) / len(cited),
            "every cited id was retrieved" if not bad else f"cited but not retrieved: {bad[:5]}",
            details={"invalid": bad})
    if not given:
        out["context_utilisation"] = JudgeResult.abstained("no_contexts", "nothing was retrieved")
    else:
        used = given & set(cited)
        out["context_utilisation"] = JudgeResult.scored(len(used) / len(given),
                                                        f"{len(used)} of {len(given)} retrieved documents cited")
    return out


def _check_schema_set(cfg: Any) -> str | None:
    return None if cfg.output_schema is not None else (
        "Metric 'output_contract' checks answers against your output contract: set output_schema=<JSON Schema>, "
        "e.g. {'type': 'object', 'required': ['answer']}.")


def _specs() -> tuple[Any, ...]:
    return (
        MetricSpec(
            "output_contract",
            requires=(("answer",),),
            default=lambda cfg: cfg.output_schema is not None,
            check=_check_schema_set,
            score=_contract,
            columns={"output_contract/violation": lambda res: res["output_contract"].details.get("violation")},
            description="output-contract adherence (seed 004): 1 when the answer is JSON valid against output_schema",
        ),
        MetricSpec(
            "refusal",
            requires=(("answer", "answerable"),),
            outputs=("refusal_correct", "false_refusal"),
            score=_refusal,
            description="refusals (seed 004): refusal_correct on answerable=False rows, false_refusal on the others",
        ),
        MetricSpec(
            "citations",
            requires=(("citations", "retrieved_doc_ids"),),
            outputs=("citation_validity", "context_utilisation"),
            score=_citations,
            columns={"citations/invalid": lambda res: json.dumps(res["citation_validity"].details.get("invalid"))
                     if "invalid" in res["citation_validity"].details else None},
            description="citations (seed 004): cited ids among the retrieved ones; retrieved documents cited / given",
        ),
    )


METRICS = _specs()
