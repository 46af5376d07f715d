"""Seed 004's output checks as metrics of any run (SPEC 2.8), no judge model, deterministic:

* ``citations`` -- with ``citations`` and ``retrieved_doc_ids``: ``citation_validity`` = cited ids that are among
  the retrieved ones / cited ids (an answer citing nothing abstains) and ``context_utilisation`` = distinct
  retrieved ids the answer cites / distinct retrieved ids (the seed's "sources used / contexts given").
"""

from __future__ import annotations

import json
from typing import Any

from ..core.types import JudgeResult, Row
from .spec import MetricSpec, Outputs, RunContext

__all__ = ['METRICS']


def _citations(state: Any, row: Row, ctx: RunContext) -> dict[str, JudgeResult]:
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




def _spec() -> MetricSpec[None]:
    return MetricSpec(
        "citations",
        requires=(("citations", "retrieved_doc_ids"),),
        outputs=Outputs(("citation_validity", "context_utilisation"), columns={
            "citations/invalid": lambda res: json.dumps(res["citation_validity"].details.get("invalid"))
            if "invalid" in res["citation_validity"].details else None}),
        score=_citations,
        description="citations (seed 004): cited ids among the retrieved ones; retrieved documents cited / given",
    )


METRICS = (_spec(),)
