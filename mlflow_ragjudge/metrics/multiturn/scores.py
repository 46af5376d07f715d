"""Multi-turn scores: sigma (one six-level score per judged answer) into wscore, lscore and mscore, an item's result,
and their means over a data set, overall and per group (seed 000 section 3; SPEC 2.2)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.types import FailureReason, JudgeResult, Status, aggregate, metric_name_part

__all__ = ["MULTITURN_METRICS", "STEPS", "STOP_REASONS", "FINAL_SCORE_MODES", "SYSTEM_ERROR", "TRUNCATION_MARK",
           "RagSystem", "wscore", "lscore", "mscore", "MultiTurnResult", "summarize"]

#: the three per-item scores, in the order the evaluator reports them
MULTITURN_METRICS = ("wscore", "lscore", "mscore")
#: the steps a transcript is made of
STEPS = ("ask", "compose", "judge", "decide", "rewrite", "judge_final")
#: why a conversation ended (``MultiTurnResult.stop``)
STOP_REASONS = ("score_5", "no_more_questions", "repeated_question", "turn_limit", "end_of_session")
#: how the T7 score enters sigma
FINAL_SCORE_MODES = ("append", "replace")
#: failure reason of an item whose system under test raised
SYSTEM_ERROR = "system_error"

#: the system under test: ``system(query, history) -> str | {"answer": str, ...}``, where ``history``
#: is the list of earlier exchanges ``[{"question": ..., "answer": ...}, ...]``, oldest first
RagSystem = Callable[[str, list[dict[str, str]]], Any]

TRUNCATION_MARK = " [...truncated]"


# --------------------------------------------------------------------------- pure scores


def _check_sigma(sigma: Sequence[float]) -> list[float]:
    values = list(sigma)
    if not values:
        raise ValueError("sigma is empty: a conversation has at least one judged answer")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"sigma holds judge scores (finite numbers), got {v!r} in {values}")
    return values


def wscore(sigma: Sequence[float], n: int) -> float:
    """Weighted score: how early in the conversation a good answer appears (higher is better).

    Formula (seed 000 section 3.1; SPEC 2.2), for sigma = [s_0, ..., s_k] with k < n::

        wscore = (n*s_0 + (n-1)*s_1 + ... + (n-k)*s_k + sum_{i=1}^{n-k-1} (n-k-i)*s_k) / (n + (n-1) + ... + 1)

    i.e. sigma padded to length ``n`` with its last score, weighted ``n, n-1, ..., 1`` and normalised by
    ``n(n+1)/2``. A conversation that ends early keeps its last score for the remaining turns. The
    paper's example: ``wscore([1, 5], 3) == (3*1 + 2*5 + 1*5) / 6 == 3``.

    Args:
        sigma: the judge scores, one per judged answer, in order (level 0 counts as 0).
        n: the maximum number of turns the conversation was given.

    Raises:
        ValueError: ``n < 1``; sigma empty, longer than ``n``, or holding a non-number.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (the maximum number of turns) must be an integer >= 1, got {n!r}")
    values = _check_sigma(sigma)
    if len(values) > n:
        raise ValueError(f"sigma has {len(values)} scores but n = {n}: the paper requires len(sigma) <= n")
    padded = values + [values[-1]] * (n - len(values))
    return sum((n - i) * s for i, s in enumerate(padded)) / (n * (n + 1) / 2)


def lscore(sigma: Sequence[float]) -> float:
    """Length score: ``len(sigma)``, the number of judged answers before the conversation ended
    (lower is better). Raises ValueError for an empty sigma."""
    return float(len(_check_sigma(sigma)))


def mscore(sigma: Sequence[float]) -> float:
    """Max score: ``max(sigma)``, the best answer the conversation produced (higher is better).
    Raises ValueError for an empty sigma."""
    return float(max(_check_sigma(sigma)))


# --------------------------------------------------------------------------- result


@dataclass
class MultiTurnResult:
    """One item's conversation and scores.

    Attributes:
        question: the target question Q.
        reference: the gold answer A.
        n_turns: ``n``, the bound on ``len(sigma)``.
        sigma: the judge scores, one per judged answer (partial when the item failed).
        status: ``Status.SCORED`` or ``Status.FAILED``.
        stop: why the conversation ended (one of :data:`STOP_REASONS`; ``None`` when failed).
        reason: the failure reason code when failed (``system_error``, ``parse_error``, ``timeout``, ...).
        error: the failure message.
        failed_step: the step that failed (one of :data:`STEPS`).
        final_answer: the answer the last score judged (``None`` when failed).
        history: the exchanges with the system, ``[{"question", "answer"}, ...]``.
        transcript: one dict per step: ``turn``, ``step``, ``input``, ``output`` and ``calls`` (the
            client's records of that step's model calls: rendered prompt, raw reply, parsed result,
            tokens, latency), plus ``error``/``reason`` on a failed step.
        records: every call record of the item, in order (for cost accounting and the transcript artifact).
        final_score_mode: ``append`` or ``replace`` (how the T7 score entered sigma).
    """

    question: str
    reference: str
    n_turns: int
    sigma: list[int] = field(default_factory=list)
    status: Status = Status.SCORED
    stop: str | None = None
    reason: str | None = None
    error: str = ""
    failed_step: str | None = None
    final_answer: str | None = None
    history: list[dict[str, str]] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    final_score_mode: str = "append"

    @property
    def is_scored(self) -> bool:
        return self.status is Status.SCORED

    @property
    def wscore(self) -> float | None:
        return wscore(self.sigma, self.n_turns) if self.is_scored else None

    @property
    def lscore(self) -> float | None:
        return lscore(self.sigma) if self.is_scored else None

    @property
    def mscore(self) -> float | None:
        return mscore(self.sigma) if self.is_scored else None

    @property
    def n_questions(self) -> int:
        """How many questions went to the system."""
        return len(self.history)

    def rationale(self) -> str:
        if not self.is_scored:
            return f"{self.failed_step}: {self.error}" if self.failed_step else self.error
        return (
            f"sigma = {self.sigma} (n = {self.n_turns}) after {self.n_questions} question"
            f"{'s' if self.n_questions != 1 else ''} to the system; ended: {self.stop}."
        )

    def to_judge_results(self) -> dict[str, JudgeResult]:
        """``{"wscore", "lscore", "mscore"}`` as :class:`JudgeResult` values, for aggregation.

        Scored items give three scored results; a failed item gives three failed results with its
        reason. The call records and the transcript are attached to the ``wscore`` result only, so a
        transcript artifact built from ``JudgeResult.calls`` holds each call once.
        """
        base = {"sigma": list(self.sigma), "n_turns": self.n_turns, "stop": self.stop,
                "n_questions": self.n_questions, "final_score_mode": self.final_score_mode}
        out: dict[str, JudgeResult] = {}
        for name in MULTITURN_METRICS:
            details = dict(base)
            calls: list[dict[str, Any]] = []
            if name == "wscore":
                details.update(final_answer=self.final_answer, history=list(self.history),
                               transcript=list(self.transcript))
                calls = list(self.records)
            if self.is_scored:
                value = getattr(self, name)
                out[name] = JudgeResult.scored(value, self.rationale(), details=details, calls=calls)
            else:
                details["failed_step"] = self.failed_step
                out[name] = JudgeResult.failed(self.reason or FailureReason.INTERNAL_ERROR, self.rationale(),
                                               details=details, calls=calls)
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything (scores included)."""
        return {
            "question": self.question, "reference": self.reference, "n_turns": self.n_turns,
            "status": self.status.value, "sigma": list(self.sigma), "wscore": self.wscore,
            "lscore": self.lscore, "mscore": self.mscore, "stop": self.stop, "reason": self.reason,
            "error": self.error, "failed_step": self.failed_step, "final_answer": self.final_answer,
            "final_score_mode": self.final_score_mode, "history": list(self.history),
            "transcript": list(self.transcript),
        }


# --------------------------------------------------------------------------- aggregation


def summarize(results: Sequence[MultiTurnResult], groups: Sequence[str | None] | None = None) -> dict[str, float]:
    """Data-set metrics, named as the evaluator logs them (SPEC 3.2).

    For each of ``wscore``, ``lscore``, ``mscore``: ``<m>/mean`` (over scored items; left out, not NaN,
    when none scored), ``<m>/count`` (all items), ``<m>/n_scored`` / ``<m>/n_failed`` / ``<m>/n_abstained`` (what
    became of them), ``<m>/error_rate`` (share of failed items) and
    ``<m>/abstain_rate`` (always 0: a conversation never abstains; kept for the common layout). With
    ``groups`` (one label per result, ``None`` = no group): ``<m>/mean/<group>``, ``<m>/count/<group>``,
    ``<m>/n_scored/<group>`` and ``<m>/error_rate/<group>`` per label, the group name made MLflow-safe as the
    evaluator does.
    This per-group breakdown is how the paper compares a single-turn system (QA) with a history-aware one
    (MQA) on each of its 10 product subsets.
    """
    results = list(results)
    if groups is not None and len(groups) != len(results):
        raise ValueError(f"groups has {len(groups)} labels for {len(results)} results; give one per result")
    per_item = [r.to_judge_results() for r in results]
    out: dict[str, float] = {}
    for name in MULTITURN_METRICS:
        out.update(aggregate([jr[name] for jr in per_item]).as_metrics(name))
    if groups is not None:
        for g in sorted({str(g) for g in groups if g is not None}):
            idx = [i for i, lab in enumerate(groups) if lab is not None and str(lab) == g]
            gname = metric_name_part(g)
            for name in MULTITURN_METRICS:
                agg = aggregate([per_item[i][name] for i in idx])
                if agg.mean is not None:
                    out[f"{name}/mean/{gname}"] = agg.mean
                out[f"{name}/count/{gname}"] = float(agg.count)
                out[f"{name}/n_scored/{gname}"] = float(agg.n_scored)
                out[f"{name}/error_rate/{gname}"] = agg.error_rate
    return out


