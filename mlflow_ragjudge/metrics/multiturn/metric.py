"""Multi-turn evaluation as the ``multiturn`` metric of a run: a runner per run, one conversation per row."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ...core.errors import InputError, MultiTurnContextWarning
from ...core.types import JudgeResult, Row
from ...core.values import is_int
from ...llm.prompts import reference_text
from ..contexts import prepare_judge_contexts
from ..correctness import MAX_CONTEXT_CHARS, shared_correctness_judge
from ..spec import Finish, MetricSpec, Needs, Option, Outputs, RunContext
from .runner import MultiTurnRunner
from .scores import MULTITURN_METRICS, MultiTurnResult, RagSystem

__all__ = ["METRICS", "SYSTEM", "TURNS", "REQUIRE_E3", "FINAL_SCORE"]


# --------------------------------------------------------------------------- the metric


class _MultiTurnState:
    """The runner of one evaluation run and the conversations it held, by row."""

    def __init__(self, runner: MultiTurnRunner, system: RagSystem) -> None:

        self.runner = runner
        self.system = system
        self.outcomes: dict[int, MultiTurnResult] = {}
        self._lock = threading.Lock()

    def score(self, row: Row) -> dict[str, JudgeResult]:
        out = self.runner.run(self.system, row.question or "", _gold(row, self.runner), row.judge_contexts)
        with self._lock:
            self.outcomes[row.index] = out
        return out.to_judge_results()


def _gold(row: Row, runner: Any) -> str:
    """The gold answer as the agents see it: every acceptable answer, shown as alternatives."""
    return reference_text(row.acceptable_answers, runner.language)


def _setup(ctx: RunContext) -> _MultiTurnState:
    import warnings

    cfg = ctx.cfg
    if ctx.context_mode != "reference":
        what = {"generation": "the first turn's own generation contexts (E2, the setting the paper shows inflates "
                              "scores)", "gold": "the gold documents", "none": "no context at all"}.get(
            str(ctx.context_mode), str(ctx.context_mode))
        if REQUIRE_E3.read(cfg):
            raise InputError(
                f"Metric 'multiturn' judges every turn with contexts retrieved with question + reference answer "
                f"(E3), but this run would give its judge {what}. Pass retriever=<callable query -> passages> or "
                "add a 'reference_contexts' column; or set multiturn_require_e3=False to run with these contexts "
                "(a warning, and the context mode recorded with the results).")
        warnings.warn(f"multi-turn evaluation runs without E3 contexts: its judge sees {what} "
                      f"(context_mode={ctx.context_mode!r}, recorded in the run).", MultiTurnContextWarning,
                      stacklevel=2)
    runner = MultiTurnRunner(ctx.judge_client, n_turns=TURNS.read(cfg), language=cfg.language,
                             judge=shared_correctness_judge(ctx), max_context_chars=MAX_CONTEXT_CHARS.read(cfg),
                             final_score=FINAL_SCORE.read(cfg))
    system = SYSTEM.read(cfg)
    assert system is not None  # check= refuses a run without one
    return _MultiTurnState(runner, system)


def _finish(state: _MultiTurnState, rows: Sequence[Row], results: list[dict[str, JudgeResult]],
            ctx: RunContext) -> Finish:
    import json

    outs = [state.outcomes.get(r.index) for r in rows]
    return Finish(
        columns={
            "multiturn/sigma": [json.dumps(o.sigma) if o is not None else None for o in outs],
            "multiturn/stop": [o.stop if o is not None else None for o in outs],
            "multiturn/final_answer": [o.final_answer if o is not None else None for o in outs],
        },
        artifacts={"multiturn_conversations.jsonl": [{"row": r.index, **o.to_dict()}
                                                     for r, o in zip(rows, outs) if o is not None]},
    )


def _settings(state: _MultiTurnState) -> dict[str, Any]:
    return {k: v for k, v in state.runner.settings.items() if k != "prompt_versions"}


#: multi-turn's own settings: the system under test, the turn budget, the E3 requirement, the final score's mode;
#: and the judge's context budget, declared by correctness too (the same key: multi-turn's judge is correctness's)
SYSTEM: Option[RagSystem | None] = Option("multiturn_system", None, lambda v: v is None or callable(v),
                                          "a callable: system(query, history) -> answer", "my_rag_system")
TURNS = Option("multiturn_turns", 5, lambda v: is_int(v) and v >= 2, "a whole number >= 2 (the turn budget n)", "5")
REQUIRE_E3 = Option("multiturn_require_e3", True, lambda v: isinstance(v, bool), "True or False", "False")
FINAL_SCORE = Option("multiturn_final_score", "append", lambda v: v in ("append", "replace"),
                     "'append' or 'replace'", "'replace'")


def _spec() -> MetricSpec[_MultiTurnState]:
    import json

    return MetricSpec(
        "multiturn",
        options=(SYSTEM, TURNS, REQUIRE_E3, FINAL_SCORE, MAX_CONTEXT_CHARS),
        requires=(("question", "reference"),),
        outputs=Outputs(MULTITURN_METRICS, scale=None),  # lscore counts turns: no fixed range
        judged=True,
        needs=Needs(synchronous=True),  # each turn needs the last: synchronous even with batch on
        prepare=prepare_judge_contexts,
        default=lambda cfg: SYSTEM.read(cfg) is not None,  # needs a live system: not a default without one
        check=lambda cfg: None if SYSTEM.read(cfg) is not None else (
            "Metric 'multiturn' converses with the RAG system under test: pass multiturn_system=<callable "
            "(query, history) -> answer>, where history is the list of earlier {'question', 'answer'} exchanges."),
        setup=_setup,
        score=lambda state, row, ctx: state.score(row),
        estimate=lambda state, r, ctx: state.runner.estimate(r.question or "", _gold(r, state.runner),
                                                             r.judge_contexts),
        finish=_finish,
        prompt_versions=lambda state: state.runner.prompt_versions,
        record=lambda state, ctx: {"multiturn": {**_settings(state), "context_mode": ctx.context_mode}},
        params=lambda state, ctx: {"ragjudge.multiturn": json.dumps(_settings(state), sort_keys=True)},
        description="multi-turn: three agents converse with multiturn_system; wscore, lscore, mscore (SPEC 2.2)",
        offline="its three agents are language models that write questions and answers",
    )


METRICS = (_spec(),)
