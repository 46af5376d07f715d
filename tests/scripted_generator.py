"""A SCRIPTED generator for the prompt-iteration example's tests: a fake-server handler, not a model.

It answers the Aurora-3 scenarios of ``experiments/data`` as a table written by hand says, one prompt style at a
time, to exercise seed 004's failure modes through the real example, the sweep, the checks and MLflow:

* ``zero_shot`` wraps the long-context answer in prose (broken format), invents a price and a reset procedure
  (refusal failures), answers half of the multi-document and ambiguous questions, picks one side of the
  conflict, and refuses the Japanese question with the English phrase;
* ``few_shot`` keeps the format but claims Bluetooth support, and stays one-sided on the ambiguous and
  conflicting questions;
* ``cot`` handles everything but refuses the ambiguous question (a false refusal).

It finds the scenario by its question in the request, and tells the style by what the prompt asks for (a
``FINAL JSON:`` line, a worked example): a script for a generator, so it may read the generator's prompt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fakellm import Request

DATA = Path(__file__).resolve().parents[1] / "experiments" / "data"
NOT_FOUND = {"en": "I cannot find the answer in the provided documents.",
             "ja": "提供された情報には回答が見つかりませんでした。"}

BEHAVIOUR = {
    "zero_shot": {"s03-multi-doc": "partial", "s05-ambiguous": "partial", "s06-long-context": "prose_wrapped",
                  "s07-no-answer": "hallucinate", "s09-conflicting": "one_sided", "s10-irrelevant": "hallucinate",
                  "s12-no-answer-ja": "refuse_in_english"},
    "few_shot": {"s05-ambiguous": "partial", "s08-no-answer": "hallucinate", "s09-conflicting": "one_sided"},
    "cot": {"s05-ambiguous": "refuse"},
}
_MADE_UP = {"s07-no-answer": "The Aurora-3 costs 249 euros, including the hub.",
            "s08-no-answer": "Yes, the Aurora-3 pairs with a phone over Bluetooth.",
            "s10-irrelevant": "Hold the reset button for 10 seconds to restore the factory settings."}


def _scenarios() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / "aurora_scenarios.jsonl").read_text("utf-8").splitlines() if line]


def _reply(s: dict[str, Any], behaviour: str) -> dict[str, Any]:
    sources = [{"doc_id": e["doc_id"], "snippet": e["snippet"]} for e in s["evidence"]]
    refuse = {"answer": NOT_FOUND[s["language"]], "confidence_score": 0.1, "sources": [], "status": "success"}
    if behaviour == "good":
        return refuse if not s["answerable"] else {"answer": s["reference"], "confidence_score": 0.9,
                                                   "sources": sources, "status": "success"}
    if behaviour in ("partial", "one_sided"):
        first = s["reference"].split(";")[0].split(", which")[0].rstrip(".") + "."
        return {"answer": first, "confidence_score": 0.85, "sources": sources[:1], "status": "success"}
    if behaviour == "hallucinate":
        return {"answer": _MADE_UP[s["scenario_id"]], "confidence_score": 0.8, "sources": [], "status": "success"}
    if behaviour == "refuse":
        return refuse
    if behaviour == "refuse_in_english":
        return {**refuse, "answer": NOT_FOUND["en"]}
    raise ValueError(behaviour)


class ScriptedGenerator:
    """The fake server's handler: ``fake_llm.set_handler(ScriptedGenerator())``; counts replies per style."""

    def __init__(self) -> None:
        self.scenarios = _scenarios()
        self.calls: dict[str, int] = {}

    def __call__(self, request: Request) -> str:
        prompt = request.last_user_text
        style = "cot" if "FINAL JSON:" in prompt else "few_shot" if "# Example" in prompt else "zero_shot"
        self.calls[style] = self.calls.get(style, 0) + 1
        hits = [s for s in self.scenarios if f"\n{s['question']}" in prompt]
        if len(hits) != 1:
            raise ValueError("the scripted generator found no scenario question in the request")
        s = hits[0]
        behaviour = BEHAVIOUR[style].get(s["scenario_id"], "good")
        body = json.dumps(_reply(s, "good" if behaviour == "prose_wrapped" else behaviour), ensure_ascii=False)
        if behaviour == "prose_wrapped":
            return f"Here is the answer based on the context:\n{body}\nLet me know if you need more."
        if style == "cot":
            return f"1. Relevant passages: {len(s['evidence'])}\n2. Integration: done\n3. Check: done\n" \
                   f"4. Final answer given below.\nFINAL JSON:\n{body}"
        return body
