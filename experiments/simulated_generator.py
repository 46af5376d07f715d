"""SIMULATED generators for the offline prompt-optimisation loop. Not a language model; not a measurement.

Each prompt style gets a scripted :class:`mlflow_ragjudge.backends.FakeBackend` whose reply to a scenario is
fixed in the table :data:`BEHAVIOUR` below. The script was written by hand to show the failure modes seed 004
names, one style at a time, so that the loop, the contract validation, the checks and the MLflow logging can
be exercised on a machine without an LLM:

* ``zero_shot`` wraps the long-context answer in prose (broken format), invents a price and a reset procedure
  (hallucination, failed refusals), answers only half of the multi-document and ambiguous questions, picks one
  side of the conflict, and refuses the Japanese question with the English phrase;
* ``few_shot`` keeps the format and refuses correctly except that it claims Bluetooth support (hallucination),
  and still answers the ambiguous and conflicting questions one-sidedly;
* ``cot`` handles the conflict, the multi-document and the no-answer cases, but its missing-information check
  makes it refuse the ambiguous question (a false refusal).

The backend reads only the rendered prompt (it finds the scenario by its query), like a model would; the
reply then goes through the same client, contract check and metrics as a real model's. Numbers from these
runs describe this script, nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from experiments.contract import COT_MARKER, NOT_FOUND
from experiments.scenarios import SCENARIOS, Scenario
from mlflow_ragjudge.backends import ChatRequest, FakeBackend

__all__ = ["BEHAVIOUR", "simulated_backend"]

# style -> scenario id -> behaviour; scenarios not listed get "good".
BEHAVIOUR: dict[str, dict[str, str]] = {
    "zero_shot": {
        "s03-multi-doc": "partial",
        "s05-ambiguous": "partial",
        "s06-long-context": "prose_wrapped",
        "s07-no-answer": "hallucinate",
        "s09-conflicting": "one_sided",
        "s10-irrelevant": "hallucinate",
        "s12-no-answer-ja": "refuse_in_english",
    },
    "few_shot": {
        "s05-ambiguous": "partial",
        "s08-no-answer": "hallucinate",
        "s09-conflicting": "one_sided",
    },
    "cot": {
        "s05-ambiguous": "refuse",
    },
}

# Scripted texts for the non-"good" behaviours.
_PARTIAL = {
    "s03-multi-doc": ("Firmware 2.1 added support for the RG-1 rain gauge.", 1),
    "s05-ambiguous": ("Its batteries last about 14 months at the default reading interval.", 1),
}
_ONE_SIDED = {"s09-conflicting": ("The Aurora-3 operates at up to +60 °C.", 1)}
_MADE_UP = {
    "s07-no-answer": "The Aurora-3 costs 249 euros, including the hub.",
    "s08-no-answer": "Yes, the Aurora-3 pairs with a phone over Bluetooth and also sends readings over LoRa radio.",
    "s10-irrelevant": "Hold the reset button for 10 seconds to restore the factory settings.",
}


def _reply_object(s: Scenario, behaviour: str) -> dict[str, Any]:
    evidence = [{"doc_id": d, "snippet": p} for d, p in s.evidence]
    if behaviour == "good":
        if s.should_refuse:
            return {"answer": NOT_FOUND[s.language], "confidence_score": 0.1, "sources": [], "status": "success"}
        return {"answer": s.reference, "confidence_score": 0.9, "sources": evidence, "status": "success"}
    if behaviour == "partial":
        text, n = _PARTIAL[s.scenario_id]
        return {"answer": text, "confidence_score": 0.85, "sources": evidence[:n], "status": "success"}
    if behaviour == "one_sided":
        text, n = _ONE_SIDED[s.scenario_id]
        return {"answer": text, "confidence_score": 0.9, "sources": evidence[:n], "status": "success"}
    if behaviour == "hallucinate":
        return {"answer": _MADE_UP[s.scenario_id], "confidence_score": 0.8, "sources": [], "status": "success"}
    if behaviour == "refuse":
        return {"answer": NOT_FOUND[s.language], "confidence_score": 0.2, "sources": [], "status": "success"}
    if behaviour == "refuse_in_english":
        return {"answer": NOT_FOUND["en"], "confidence_score": 0.1, "sources": [], "status": "success"}
    raise ValueError(f"unknown simulated behaviour {behaviour!r}")


def _cot_reasoning(s: Scenario, obj: dict[str, Any]) -> str:
    found = "; ".join(f"[{d}] {p}" for d, p in s.evidence) or "none of the documents addresses the query"
    check = (
        "every fact above is quoted from the context"
        if obj["sources"]
        else "the context does not answer the query, so the answer is the not-found phrase"
    )
    return (
        f"1. Relevant passages: {found}\n"
        f"2. Integration: {'the passages are combined' if len(s.evidence) > 1 else 'one passage suffices'}\n"
        f"3. Hallucination and gap check: {check}\n"
        f"4. Final answer: {obj['answer']}\n"
    )


def _render(style: str, s: Scenario, behaviour: str) -> str:
    obj = _reply_object(s, "good" if behaviour == "prose_wrapped" else behaviour)
    body = json.dumps(obj, ensure_ascii=False)
    if behaviour == "prose_wrapped":  # the object is right, the prose around it breaks the contract
        return f"Here is the answer based on the context:\n{body}\nLet me know if you need more detail."
    if style == "cot":
        return f"{_cot_reasoning(s, obj)}{COT_MARKER}\n{body}"
    return body


def simulated_backend(style: str, scenarios: Sequence[Scenario] = SCENARIOS) -> FakeBackend:
    """A scripted backend (model name ``simulated-<style>``) answering the scenarios as :data:`BEHAVIOUR` says."""
    if style not in BEHAVIOUR:
        raise ValueError(f"No simulation for prompt style {style!r}; simulated styles: {', '.join(BEHAVIOUR)}.")
    by_query = {s.query: s for s in scenarios}
    table = BEHAVIOUR[style]

    def handler(request: ChatRequest) -> str:
        prompt = request.messages[-1]["content"]
        hits = [s for q, s in by_query.items() if f"\n{q}\n" in f"{prompt}\n"]
        if len(hits) != 1:
            raise ValueError("the simulated generator found no scenario query in the prompt")
        return _render(style, hits[0], table.get(hits[0].scenario_id, "good"))

    return FakeBackend(handler=handler, model=f"simulated-{style}")
