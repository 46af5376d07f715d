"""Seed 004's output checks as metrics of any run (SPEC 2.8), no judge model, deterministic:

* ``output_contract`` -- with ``output_schema`` set: 1 when the answer (or, when the data has one, the system's
  ``raw_output`` the answer was extracted from) is a JSON document valid against that JSON Schema (draft
  2020-12, checked with ``jsonschema``), else 0 with the first violation (``output_contract/violation`` in the
  per-row table). Format adherence, as the seed asks of the generator.
"""

from __future__ import annotations

import json
from typing import Any

from ..core.types import JudgeResult, Row
from .spec import MetricSpec, Option, Outputs, RunContext, RunSettings

__all__ = ['check_output_schema', 'contract_violation', 'METRICS', 'SCHEMA']


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

def _contract(state: Any, row: Row, ctx: RunContext) -> JudgeResult:
    schema = SCHEMA.read(ctx.cfg)
    assert schema is not None  # check= refuses a run without one
    raw = row.raw_output if row.raw_output is not None else row.answer
    violation = contract_violation(raw or "", schema)
    if violation is None:
        return JudgeResult.scored(1.0, "the answer follows the output contract")
    return JudgeResult.scored(0.0, violation, details={"violation": violation})

def _check_schema_set(cfg: RunSettings) -> str | None:
    return None if SCHEMA.read(cfg) is not None else (
        "Metric 'output_contract' checks answers against your output contract: set output_schema=<JSON Schema>, "
        "e.g. {'type': 'object', 'required': ['answer']}.")


#: the output contract's setting
#: the schema the answers must follow (None: the metric does not run by default)
SCHEMA: Option[dict[str, Any] | None] = Option("output_schema", None, lambda v: v is None or isinstance(v, dict),
                  "a JSON Schema (dict) the answers must follow", "{'type': 'object', 'required': ['answer']}",
                  check=lambda v: None if v is None else check_output_schema(v))


def _spec() -> MetricSpec[None]:
    return MetricSpec(
        "output_contract",
        options=(SCHEMA,),
        requires=(("answer",),),
        default=lambda cfg: SCHEMA.read(cfg) is not None,
        check=_check_schema_set,
        score=_contract,
        outputs=Outputs(columns={
            "output_contract/violation": lambda res: res["output_contract"].details.get("violation")}),
        description="output-contract adherence (seed 004): 1 when the answer is JSON valid against output_schema",
    )


METRICS = (_spec(),)
