"""The three agents that converse with the RAG system under test, turn by turn (T1..T7 of the package docstring)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...core.text import clean_text, nonblank_passages
from ...core.types import FailureReason, Status
from ...llm.backends import ChatRequest, ChatResponse, JsonSchema
from ...llm.client import CallResult, JudgeClient
from ...llm.parsing import ParseError, reply_object, validate_schema
from ...llm.prompts import Prompt, load_prompt
from ..correctness import CorrectnessJudge
from ..spec import Estimate
from ..statements import add_estimates, approx_tokens, estimate_messages, prompt_version
from .scores import FINAL_SCORE_MODES, SYSTEM_ERROR, TRUNCATION_MARK, MultiTurnResult, RagSystem

__all__ = ["MultiTurnRunner", "format_history"]


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
        max_context_chars: context budget of the default judge (see
            :func:`~mlflow_ragjudge.metrics.correctness.format_contexts`).
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
        contexts = nonblank_passages(judge_contexts)
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
        contexts = nonblank_passages(judge_contexts)
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
    ) -> Estimate:
        """Upper-bound cost of one item without calling any model: the worst case, where every question
        the budget allows is asked and the conversation ends through T6/T7.

        Calls: ``3 * max_questions + 1`` (compose + judge per question, decide after every question but
        the last, then rewrite + final judge): ``3n - 2`` with ``final_score="append"`` (13 for n = 5),
        ``3n + 1`` with ``"replace"``. The best case is 2 (the first tentative answer scores 5). Tokens
        are rough (:func:`~mlflow_ragjudge.metrics.statements.approx_tokens`): each system answer, tentative and final
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
        parts: list[Estimate] = []
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


