"""Multi-turn ("continuous response") evaluation (IBM Research, seed 000 section 3; SPEC 2.2).

The question it answers: starting from a target question Q with a gold answer A, how much of A can a
reasonable questioner get out of the RAG system under test, and in how many exchanges? Three LLM agents
hold the conversation with the system:

* the **answer composer** (T2 compose a tentative answer from the Q/A history; T6 rewrite it to the gold
  answer's granularity at the end),
* the **answer judge** (T3 / T7: the six-level context-aware correctness judge of SPEC 2.1, shown the E3
  contexts retrieved with the original Q and A),
* the **question generator** (T4 decide whether more questions are needed; T5 write the next one),

and the loop is::

    T1 ask the system (the target question first, generated ones later); append (question, answer) to history
    T2 compose a tentative answer from the history          -> tentative answer
    T3 judge it                                             -> s_i appended to sigma, review
       s_i == 5: stop
    T4+T5 (one structured call) more questions needed? next question
       needed and the budget allows another turn: go to T1
    T6 rewrite the tentative answer to the gold answer's granularity (no information found only in A)
    T7 judge the final answer                               -> appended to sigma (see "sigma and n" below)

Per item the result is the list of judge scores sigma = [s_0, ..., s_k] (0 <= k < n) and the full
transcript; :func:`wscore`, :func:`lscore` and :func:`mscore` turn sigma into numbers, and
:func:`summarize` averages them over a data set (overall and per group).

**sigma and n (our reading of the paper; see docs/multiturn.md).** sigma holds one score per *judged
answer*: one per T3 and, when the conversation ends through T6, one for T7. ``n`` (``n_turns``, the
paper's maximum number of turns, 5 in its experiment) bounds ``len(sigma)``, as the paper's ``k < n``
requires. With the default ``final_score="append"`` the T7 score is an extra element, so at most ``n - 1``
questions go to the system: after a T3 score below 5 on question ``n - 1`` there is no room for another
question *and* its possible final judgement, so the conversation goes to T6/T7 (the question generator is
not asked, since its question could not be used). With ``final_score="replace"`` the T7 score replaces
the last T3 score instead (sigma then has exactly one element per question, at most ``n`` questions).

**Level 0 ("not sure").** The single-turn correctness metric treats 0 as an abstention left out of the
mean. Inside sigma a 0 is a real judged value of the tentative answer at that turn (nothing usable yet)
and is kept as 0: the paper states every score is >= 0, and dropping it would shorten sigma and change
lscore. So a tentative answer the judge calls "not sure" weighs in wscore like a score of 0.

**Failures.** An item whose system call raises (``system_error``) or whose agent / judge call fails
(``parse_error``, ``timeout``, ...) is a *failed* item with the reason, the failed step, the error and
the partial transcript; its wscore/lscore/mscore are ``None``, never made up from a partial sigma.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import InputError, MultiTurnContextWarning
from ..core.text import clean_text
from ..core.types import FailureReason, JudgeResult, Status, aggregate, metric_name_safe
from ..core.values import is_int
from ..llm.backends import ChatRequest, ChatResponse, JsonSchema
from ..llm.client import CallResult, JudgeClient
from ..llm.parsing import ParseError, reply_object, validate_schema
from ..llm.prompts import Prompt, load_prompt, reference_text
from .contexts import prepare_judge_contexts
from .correctness import CorrectnessJudge, shared_correctness_judge
from .spec import Finish, MetricSpec, Option
from .statements import add_estimates, approx_tokens, estimate_messages, prompt_version

__all__ = [
    "FINAL_SCORE_MODES",
    "MULTITURN_METRICS",
    "STEPS",
    "STOP_REASONS",
    "SYSTEM_ERROR",
    "MultiTurnResult",
    "MultiTurnRunner",
    "RagSystem",
    "format_history",
    "lscore",
    "mscore",
    "summarize",
    "wscore",
]

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


# --------------------------------------------------------------------------- helpers


def format_history(history: Sequence[dict[str, str]], max_answer_chars: int | None = None) -> str:
    """The Q/A history as the agents see it: ``Q1: ...`` / ``A1: ...``, oldest first.

    Continuation lines are indented so a multi-line answer stays under its label; an answer longer than
    ``max_answer_chars`` is cut and marked ``[...truncated]``.
    """
    if not history:
        return "(no exchanges yet)"
    blocks = []
    for i, ex in enumerate(history, 1):
        answer = str(ex.get("answer") or "").strip() or "(empty reply)"
        if max_answer_chars is not None and len(answer) > max_answer_chars:
            answer = answer[: max(0, max_answer_chars - len(TRUNCATION_MARK))] + TRUNCATION_MARK
        q = "\n    ".join(str(ex.get("question") or "").strip().splitlines())
        a = "\n    ".join(answer.splitlines())
        blocks.append(f"Q{i}: {q}\nA{i}: {a}")
    return "\n".join(blocks)


_PUNCT = re.compile(r"[\s\W_]+", re.UNICODE)


def _norm_question(text: str) -> str:
    """Case, spacing and punctuation folded: ``What is X?`` and ``what is x`` are the same question."""
    return _PUNCT.sub(" ", text.casefold()).strip()


class _Failed(Exception):
    """Internal: ends the loop with a failed item."""

    def __init__(self, step: str, reason: str, error: str) -> None:
        super().__init__(error)
        self.step, self.reason, self.error = step, reason, error


# --------------------------------------------------------------------------- runner


class MultiTurnRunner:
    """Hold the multi-turn conversation with a RAG system and score it (SPEC 2.2).

    Args:
        client: the judge client the three agents call (model, cache, limits, accounting).
        n_turns: ``n``, the maximum ``len(sigma)`` (paper: 5). At least 2 with ``final_score="append"``
            (one question plus its final judgement), at least 1 with ``"replace"``.
        language: prompt language of the agents, ``en`` or ``ja`` (inputs in any language work).
        judge: the answer judge (T3/T7); default a :class:`CorrectnessJudge` on ``client`` in ``language``.
        max_context_chars: context budget of the default judge (see :func:`~.judges.correctness.format_contexts`).
        final_score: ``append`` (default; the T7 score is its own element of sigma, so at most ``n - 1``
            questions) or ``replace`` (the T7 score replaces the last T3 score; at most ``n`` questions).
        max_answer_chars: each system answer is cut to this many characters in the agents' prompts.
        max_tokens: reply budget of each agent call.

    Example:
        >>> runner = MultiTurnRunner(JudgeClient("openai:/gpt-4o-mini"), n_turns=5)   # doctest: +SKIP
        >>> res = runner.run(my_rag, "What does UNION do?", "It combines ... and removes duplicates.",
        ...                  judge_contexts=retrieve("What does UNION do?\\nIt combines ..."))  # doctest: +SKIP
        >>> res.sigma, res.wscore                                                     # doctest: +SKIP
        ([3, 5], 4.333333333333333)
    """

    #: expected length (tokens) of an agent's explanation, for estimates
    ESTIMATED_EXPLANATION_TOKENS = 120

    def __init__(
        self,
        client: JudgeClient,
        *,
        n_turns: int = 5,
        language: str = "en",
        judge: CorrectnessJudge | None = None,
        max_context_chars: int = 12_000,
        final_score: str = "append",
        max_answer_chars: int | None = 8_000,
        max_tokens: int = 1024,
    ) -> None:
        if final_score not in FINAL_SCORE_MODES:
            raise ValueError(f"final_score must be one of {FINAL_SCORE_MODES}, not {final_score!r}")
        least = 2 if final_score == "append" else 1
        if isinstance(n_turns, bool) or not isinstance(n_turns, int) or n_turns < least:
            raise ValueError(
                f"n_turns must be an integer >= {least} with final_score={final_score!r}, got {n_turns!r}"
                + (" (one question and its final judgement already make 2 scores)" if least == 2 else "")
            )
        if max_answer_chars is not None and max_answer_chars < 100:
            raise ValueError(f"max_answer_chars must be None or >= 100, got {max_answer_chars}")
        self.client = client
        self.n_turns = n_turns
        self.language = language
        self.final_score = final_score
        self.max_answer_chars = max_answer_chars
        self.max_tokens = max_tokens
        self.judge = judge or CorrectnessJudge(client, language=language, max_context_chars=max_context_chars)
        self.compose_prompt: Prompt = load_prompt("mt_compose", language)
        self.decide_prompt: Prompt = load_prompt("mt_next_question", language)
        self.rewrite_prompt: Prompt = load_prompt("mt_rewrite", language)

    # ------------------------------------------------------------------ configuration

    @property
    def max_questions(self) -> int:
        """The most questions one conversation puts to the system."""
        return self.n_turns - 1 if self.final_score == "append" else self.n_turns

    @property
    def prompt_versions(self) -> dict[str, str]:
        """Prompt name -> version label of every prompt the runner uses (judge included)."""
        return {
            **self.judge.prompt_versions,
            "mt_compose": prompt_version(self.compose_prompt),
            "mt_next_question": prompt_version(self.decide_prompt),
            "mt_rewrite": prompt_version(self.rewrite_prompt),
        }

    @property
    def settings(self) -> dict[str, Any]:
        """Everything that changes the scores, for run params."""
        return {
            "n_turns": self.n_turns, "final_score": self.final_score, "language": self.language,
            "max_context_chars": self.judge.max_context_chars, "max_answer_chars": self.max_answer_chars,
            "max_questions": self.max_questions, "prompt_versions": self.prompt_versions,
        }

    # ------------------------------------------------------------------ the loop

    def run(
        self,
        system: RagSystem,
        question: str,
        reference: str,
        judge_contexts: Sequence[str] | None = None,
    ) -> MultiTurnResult:
        """Hold one conversation and score it. Never raises for model or system failures.

        Args:
            system: the RAG system under test, ``system(query, history)``; ``history`` is a fresh list of
                the earlier exchanges ``{"question", "answer"}`` (oldest first) that a history-aware
                system should use; it returns the answer as a str or a dict with an ``"answer"`` str.
            question: the target question Q (asked first, verbatim).
            reference: the gold answer A.
            judge_contexts: what the judge sees as context at T3 and T7: the paper's E3 passages,
                retrieved with the original Q and A concatenated (the caller retrieves them).

        Raises:
            ValueError: a blank question or reference, or a system that is not callable (input errors,
                before any call).
        """
        if not callable(system):
            raise ValueError(f"system must be a callable system(query, history) -> answer, got {type(system)!r}")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question (the target question) must be a non-empty string")
        if not isinstance(reference, str) or not reference.strip():
            raise ValueError("reference (the gold answer) must be a non-empty string")
        contexts = [str(c) for c in (judge_contexts or []) if c is not None and str(c).strip()]
        res = MultiTurnResult(question=question, reference=reference, n_turns=self.n_turns,
                              final_score_mode=self.final_score)
        try:
            self._converse(res, system, contexts)
        except _Failed as f:
            res.status, res.reason, res.error, res.failed_step = Status.FAILED, f.reason, f.error, f.step
            res.stop = None
            res.final_answer = None
        assert len(res.sigma) <= self.n_turns  # the loop's invariant: wscore is defined
        return res

    def replay(
        self,
        history: Sequence[dict[str, str]],
        question: str,
        reference: str,
        judge_contexts: Sequence[str] | None = None,
    ) -> MultiTurnResult:
        """Score a *recorded* conversation (no question generator, no system calls).

        After each recorded exchange i (at most ``n_turns``), the composer (T2) builds a tentative answer to
        ``question`` from exchanges 1..i and the judge (T3) scores it; sigma stops at the first 5. This is the
        passive counterpart of :meth:`run` for conversations that already happened (MLflow sessions): the
        scores say how fast the recorded exchanges yielded the gold answer, with the same wscore / lscore /
        mscore. ``question`` is the target question (usually the first recorded one).

        Raises:
            ValueError: an empty history, a blank question or reference (before any call).
        """
        if not history:
            raise ValueError("history must hold at least one {'question', 'answer'} exchange")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question (the target question) must be a non-empty string")
        if not isinstance(reference, str) or not reference.strip():
            raise ValueError("reference (the gold answer) must be a non-empty string")
        contexts = [str(c) for c in (judge_contexts or []) if c is not None and str(c).strip()]
        res = MultiTurnResult(question=question, reference=reference, n_turns=self.n_turns,
                              final_score_mode="replay")
        try:
            for turn, exchange in enumerate(list(history)[: self.n_turns], 1):
                res.history.append({"question": str(exchange.get("question") or ""),
                                    "answer": str(exchange.get("answer") or "")})
                tentative = self._compose(res, turn)
                score, _ = self._judge(res, turn, "judge", tentative, contexts)
                res.sigma.append(score)
                res.final_answer = tentative
                if score == 5:
                    res.stop = "score_5"
                    break
            else:
                res.stop = "turn_limit" if len(history) >= self.n_turns else "end_of_session"
        except _Failed as f:
            res.status, res.reason, res.error, res.failed_step = Status.FAILED, f.reason, f.error, f.step
            res.stop = None
            res.final_answer = None
        return res

    def _converse(self, res: MultiTurnResult, system: RagSystem, contexts: list[str]) -> None:
        asked: list[str] = []
        next_question = res.question
        turn = 0
        while True:
            turn += 1
            # T1: ask the system
            answer = self._ask(res, system, next_question, turn)
            asked.append(_norm_question(next_question))
            res.history.append({"question": next_question, "answer": answer})
            # T2: compose a tentative answer from the history
            tentative = self._compose(res, turn)
            # T3: judge it
            score, review = self._judge(res, turn, "judge", tentative, contexts)
            res.sigma.append(score)
            if score == 5:
                res.stop, res.final_answer = "score_5", tentative
                return
            if turn >= self.max_questions:
                res.stop = "turn_limit"  # no room for another question (and its final judgement)
                break
            # T4 + T5: more questions? which one?
            decision = self._decide(res, turn, tentative, score, review, asked)
            if decision is None:
                res.stop = "repeated_question"
                break
            if not decision["need_more"]:
                res.stop = "no_more_questions"
                break
            next_question = decision["next_question"].strip()
        # T6: rewrite to the gold answer's granularity; T7: judge the final answer
        final = self._rewrite(res, turn, tentative, review)
        final_score, _ = self._judge(res, turn, "judge_final", final, contexts)
        if self.final_score == "append":
            res.sigma.append(final_score)
        else:
            res.sigma[-1] = final_score
        res.final_answer = final

    # ------------------------------------------------------------------ steps

    def _ask(self, res: MultiTurnResult, system: RagSystem, query: str, turn: int) -> str:
        step: dict[str, Any] = {"turn": turn, "step": "ask",
                                "input": {"question": query, "history_turns": len(res.history)},
                                "output": None, "calls": []}
        res.transcript.append(step)
        t0 = time.perf_counter()
        try:
            reply = system(query, [dict(ex) for ex in res.history])
        except Exception as e:  # the system under test failed: this item fails, the run goes on
            step["latency_s"] = round(time.perf_counter() - t0, 6)
            msg = f"{type(e).__name__}: {e}"
            step.update(reason=SYSTEM_ERROR, error=msg)
            raise _Failed("ask", SYSTEM_ERROR, f"the system under test raised {msg}") from e
        step["latency_s"] = round(time.perf_counter() - t0, 6)
        extra: dict[str, Any] = {}
        if isinstance(reply, dict):
            extra = {k: v for k, v in reply.items() if k != "answer"}
            reply = reply.get("answer")
        if not isinstance(reply, str):
            msg = (f"the system returned {type(reply).__name__}; expected a str answer or a dict with an "
                   f"'answer' str")
            step.update(reason=SYSTEM_ERROR, error=msg)
            raise _Failed("ask", SYSTEM_ERROR, msg)
        reply, n_bad = clean_text(reply)
        step["output"] = {"answer": reply, **extra}
        if n_bad:  # invalid Unicode from the system under test: replaced, so the next prompt can be sent
            step["note"] = f"{n_bad} invalid character(s) (lone surrogates) replaced with U+FFFD"
        return reply

    def _agent_call(
        self, res: MultiTurnResult, turn: int, step_name: str, prompt: Prompt, schema_name: str,
        values: dict[str, str], parse: Callable[[ChatResponse], Any], inputs: dict[str, Any],
    ) -> tuple[dict[str, Any], CallResult]:
        messages = prompt.render("json", **values)
        request = ChatRequest.of(messages, max_tokens=self.max_tokens,
                                 json_schema=JsonSchema(schema_name, prompt.schema or {}))
        call = self.client.call(request, parse=parse, prompt_version=prompt_version(prompt),
                                purpose=f"multiturn:{step_name}")
        step: dict[str, Any] = {"turn": turn, "step": step_name, "input": inputs,
                                "output": call.parsed if call.ok else None, "calls": list(call.records)}
        res.transcript.append(step)
        res.records.extend(call.records)
        return step, call

    def _fail_call(self, step: dict[str, Any], call: CallResult) -> _Failed:
        reason = call.failure.value if call.failure is not None else FailureReason.INTERNAL_ERROR.value
        step.update(reason=reason, error=call.error, raw=call.raw)
        return _Failed(step["step"], reason, call.error)

    def _answer_parser(self, prompt: Prompt) -> Callable[[ChatResponse], dict[str, Any]]:
        schema = prompt.schema or {}

        def parse(response: ChatResponse) -> dict[str, Any]:
            obj = reply_object(response, schema)
            validate_schema(obj, schema)
            return {"explanation": obj["explanation"].strip(), "answer": obj["answer"].strip()}

        return parse

    def _history_text(self, res: MultiTurnResult) -> str:
        return format_history(res.history, self.max_answer_chars)

    def _compose(self, res: MultiTurnResult, turn: int) -> str:
        step, call = self._agent_call(
            res, turn, "compose", self.compose_prompt, "mt_compose",
            {"question": res.question, "history": self._history_text(res)},
            self._answer_parser(self.compose_prompt),
            {"question": res.question, "history_turns": len(res.history)},
        )
        if not call.ok:
            raise self._fail_call(step, call)
        return str(call.parsed["answer"])

    def _judge(
        self, res: MultiTurnResult, turn: int, step_name: str, answer: str, contexts: list[str]
    ) -> tuple[int, str]:
        result = self.judge.judge(res.question, answer, res.reference, contexts)
        step: dict[str, Any] = {
            "turn": turn, "step": step_name,
            "input": {"question": res.question, "response": answer, "n_contexts": len(contexts),
                      "context_info": result.details.get("context_info")},
            "output": None, "calls": list(result.calls),
        }
        res.transcript.append(step)
        res.records.extend(result.calls)
        if result.status is Status.FAILED:
            step.update(reason=result.reason, error=result.rationale, raw=result.raw)
            raise _Failed(step_name, result.reason or FailureReason.INTERNAL_ERROR.value, result.rationale)
        # level 0 ("not sure") comes back abstained with details["level"] == 0; in sigma it is a 0
        score = int(result.value) if result.status is Status.SCORED and result.value is not None else 0
        step["output"] = {"score": score, "status": result.status.value, "feedback": result.rationale}
        if step_name == "judge_final":
            step["output"]["sigma_effect"] = self.final_score
        return score, result.rationale

    def _decision_parser(self, asked: list[str], *, check_repeat: bool) -> Callable[[ChatResponse], dict[str, Any]]:
        schema = self.decide_prompt.schema or {}

        def parse(response: ChatResponse) -> dict[str, Any]:
            obj = reply_object(response, schema)
            validate_schema(obj, schema)
            need, nq = bool(obj["need_more"]), str(obj["next_question"]).strip()
            if need and not nq:
                # "more is needed" but no question to ask: there is nothing to put to the system, so the
                # questioning ends (T6/T7) -- recorded in the transcript, not a failure (docs/multiturn.md)
                return {"explanation": str(obj["explanation"]).strip(), "need_more": False, "next_question": "",
                        "note": "need_more was true but next_question was empty; questioning ends"}
            if need and check_repeat and _norm_question(nq) in asked:
                k = asked.index(_norm_question(nq)) + 1
                raise ParseError(f"next_question repeats question Q{k} ({nq!r}): ask something different, "
                                 "or set need_more to false")
            return {"explanation": str(obj["explanation"]).strip(), "need_more": need,
                    "next_question": nq if need else ""}

        return parse

    def _decide(
        self, res: MultiTurnResult, turn: int, tentative: str, score: int, review: str, asked: list[str]
    ) -> dict[str, Any] | None:
        """T4 + T5 in one call. ``None`` when the generator only repeats earlier questions."""
        step, call = self._agent_call(
            res, turn, "decide", self.decide_prompt, "mt_next_question",
            {"question": res.question, "history": self._history_text(res), "tentative_answer": tentative,
             "score": str(score), "review": review or "(no review)", "reference": res.reference},
            self._decision_parser(asked, check_repeat=True),
            {"tentative_answer": tentative, "score": score, "review": review},
        )
        if call.ok:
            return dict(call.parsed)
        if call.failure is FailureReason.PARSE_ERROR and call.raw is not None:
            # A reply that is well formed but, even after the re-ask, only repeats an earlier question:
            # the generator has nothing new to ask, so the questioning ends (T6/T7) rather than failing.
            try:
                lenient = self._decision_parser(asked, check_repeat=False)(
                    ChatResponse(text=call.raw, data=call.response.data if call.response else None))
            except ParseError:
                lenient = None
            if lenient is not None and lenient["need_more"]:
                step.update(output=lenient, note="the next question repeats an earlier one; questioning ends")
                return None
        raise self._fail_call(step, call)

    def _rewrite(self, res: MultiTurnResult, turn: int, tentative: str, review: str) -> str:
        step, call = self._agent_call(
            res, turn, "rewrite", self.rewrite_prompt, "mt_rewrite",
            {"question": res.question, "history": self._history_text(res), "tentative_answer": tentative,
             "review": review or "(no review)", "reference": res.reference},
            self._answer_parser(self.rewrite_prompt),
            {"tentative_answer": tentative, "review": review},
        )
        if not call.ok:
            raise self._fail_call(step, call)
        return str(call.parsed["answer"])

    # ------------------------------------------------------------------ cost

    def estimate(
        self, question: str, reference: str, judge_contexts: Sequence[str] | None = None
    ) -> dict[str, int]:
        """Upper-bound cost of one item without calling any model: the worst case, where every question
        the budget allows is asked and the conversation ends through T6/T7.

        Calls: ``3 * max_questions + 1`` (compose + judge per question, decide after every question but
        the last, then rewrite + final judge): ``3n - 2`` with ``final_score="append"`` (13 for n = 5),
        ``3n + 1`` with ``"replace"``. The best case is 2 (the first tentative answer scores 5). Tokens
        are rough (:func:`~.judges.statements.approx_tokens`): each system answer, tentative and final
        answer is assumed to be twice as long as the reference (at least 400 characters), each generated
        question as long as the target question. Re-asks after an unreadable reply are not counted, and
        the system under test's own cost is not included.

        Returns:
            ``{"calls", "input_tokens", "output_tokens"}``.
        """
        answer = reference.strip() or "x"
        while len(answer) < max(400, 2 * len(reference.strip())):
            answer = f"{answer} {reference.strip() or 'x'}"
        answer_out = min(self.max_tokens, approx_tokens(answer) + self.ESTIMATED_EXPLANATION_TOKENS)
        decide_out = min(self.max_tokens, approx_tokens(question) + self.ESTIMATED_EXPLANATION_TOKENS + 8)
        review = "x" * (self.judge.ESTIMATED_REPLY_TOKENS * 3)
        parts: list[dict[str, int]] = []
        history: list[dict[str, str]] = []
        k = self.max_questions
        for t in range(1, k + 1):
            history.append({"question": question, "answer": answer})
            hist = format_history(history, self.max_answer_chars)
            parts.append(estimate_messages(
                self.compose_prompt.render("json", question=question, history=hist), answer_out))
            parts.append(self.judge.estimate(question, answer, reference, judge_contexts))
            if t < k:
                parts.append(estimate_messages(self.decide_prompt.render(
                    "json", question=question, history=hist, tentative_answer=answer, score="3", review=review,
                    reference=reference), decide_out))
        hist = format_history(history, self.max_answer_chars)
        parts.append(estimate_messages(self.rewrite_prompt.render(
            "json", question=question, history=hist, tentative_answer=answer, review=review, reference=reference),
            answer_out))
        parts.append(self.judge.estimate(question, answer, reference, judge_contexts))
        return add_estimates(*parts)


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
            gname = metric_name_safe(g)
            for name in MULTITURN_METRICS:
                agg = aggregate([per_item[i][name] for i in idx])
                if agg.mean is not None:
                    out[f"{name}/mean/{gname}"] = agg.mean
                out[f"{name}/count/{gname}"] = float(agg.count)
                out[f"{name}/n_scored/{gname}"] = float(agg.n_scored)
                out[f"{name}/error_rate/{gname}"] = agg.error_rate
    return out


# --------------------------------------------------------------------------- the metric


class _MultiTurnState:
    """The runner of one evaluation run and the conversations it held, by row."""

    def __init__(self, runner: MultiTurnRunner, system: RagSystem) -> None:
        import threading

        self.runner = runner
        self.system = system
        self.outcomes: dict[int, MultiTurnResult] = {}
        self._lock = threading.Lock()

    def score(self, row: Any) -> dict[str, JudgeResult]:
        out = self.runner.run(self.system, row.question or "", _gold(row, self.runner), row.judge_contexts)
        with self._lock:
            self.outcomes[row.index] = out
        return out.to_judge_results()


def _gold(row: Any, runner: Any) -> str:
    """The gold answer as the agents see it: every acceptable answer, shown as alternatives."""
    return reference_text(row.acceptable_answers, runner.language)


def _setup(ctx: Any) -> _MultiTurnState:
    import warnings

    cfg = ctx.cfg
    if ctx.context_mode != "reference":
        what = {"generation": "the first turn's own generation contexts (E2, the setting the paper shows inflates "
                              "scores)", "gold": "the gold documents", "none": "no context at all"}.get(
            ctx.context_mode, str(ctx.context_mode))
        if cfg.multiturn_require_e3:
            raise InputError(
                f"Metric 'multiturn' judges every turn with contexts retrieved with question + reference answer "
                f"(E3), but this run would give its judge {what}. Pass retriever=<callable query -> passages> or "
                "add a 'reference_contexts' column; or set multiturn_require_e3=False to run with these contexts "
                "(a warning, and the context mode recorded with the results).")
        warnings.warn(f"multi-turn evaluation runs without E3 contexts: its judge sees {what} "
                      f"(context_mode={ctx.context_mode!r}, recorded in the run).", MultiTurnContextWarning,
                      stacklevel=2)
    runner = MultiTurnRunner(ctx.judge_client, n_turns=cfg.multiturn_turns, language=cfg.language,
                             judge=shared_correctness_judge(ctx), max_context_chars=cfg.max_context_chars,
                             final_score=cfg.multiturn_final_score)
    return _MultiTurnState(runner, cfg.multiturn_system)


def _finish(state: _MultiTurnState, rows: Sequence[Any], results: Any, ctx: Any) -> Any:
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


#: multi-turn's own settings
OPTIONS = (
    Option("multiturn_system", None, lambda v: v is None or callable(v),
           "a callable: system(query, history) -> answer", "my_rag_system"),
    Option("multiturn_turns", 5, lambda v: is_int(v) and v >= 2, "a whole number >= 2 (the turn budget n)", "5"),
    Option("multiturn_require_e3", True, lambda v: isinstance(v, bool), "True or False", "False"),
    Option("multiturn_final_score", "append", lambda v: v in ("append", "replace"), "'append' or 'replace'",
           "'replace'"),
)


def _spec() -> Any:
    import json

    return MetricSpec(
        "multiturn",
        options=OPTIONS,
        requires=(("question", "reference"),),
        outputs=MULTITURN_METRICS,
        judged=True,
        scale=None,  # lscore counts turns
        batchable=False,  # each turn needs the last: synchronous even with batch on
        prepare=prepare_judge_contexts,
        default=lambda cfg: cfg.multiturn_system is not None,  # needs a live system: not a default without one
        check=lambda cfg: None if cfg.multiturn_system is not None else (
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
        offline_unavailable="its three agents are language models that write questions and answers",
    )


METRICS = (_spec(),)
