"""The same judges as ``mlflow.genai`` scorers (MLflow 3).

::

    from mlflow_ragjudge.scorers import Correctness, LexicalOverlap, RetrievalMetrics
    mlflow.genai.evaluate(data=records, scorers=[Correctness(judge="openai:/gpt-4o-mini")])

Each scorer returns ``Feedback`` per row: the value and rationale for a scored row;
``value=None`` with ``metadata["status"] == "abstained"`` (and the reason) for an
abstention, so it never counts as a number; an ``error`` whose code is the failure
reason (``parse_error``, ``timeout`` ...) for a failure.

Where the data comes from:

* question: ``inputs["question"]`` (or ``query``/``input``/``inputs`` as a string);
* response: ``outputs`` as a string, or ``outputs["answer"]``/``["response"]``;
* reference: ``expectations["expected_response"]`` or ``["reference"]``;
* contexts: ``outputs["contexts"]``, else the trace's top-level RETRIEVER spans;
* E3 contexts: ``expectations["reference_contexts"]`` or a ``retriever`` callable.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar

from mlflow.entities import AssessmentError, AssessmentSource, AssessmentSourceType, Feedback
from mlflow.genai.scorers import Scorer
from pydantic import PrivateAttr

from .client import JudgeClient
from .config import RagJudgeConfig
from .evaluation import Row, e3_query
from .judged import JUDGED_METRICS, JudgeContext, resolve_embedder
from .judges.correctness import CorrectnessJudge
from .types import JudgeResult, Status

__all__ = [
    "AnswerRelevancy",
    "ContextPrecision",
    "ContextRecall",
    "ContextRelevance",
    "Correctness",
    "Faithfulness",
    "LexicalOverlap",
    "MultiTurnSession",
    "RetrievalMetrics",
    "to_feedback",
]

FRAMEWORK = "mlflow-ragjudge"


def to_feedback(name: str, result: JudgeResult, source_id: str, extra: dict[str, Any] | None = None) -> Feedback:
    """Convert a :class:`JudgeResult` to MLflow ``Feedback`` (three states kept apart)."""
    source = AssessmentSource(
        source_type=AssessmentSourceType.LLM_JUDGE if source_id != "code" else AssessmentSourceType.CODE,
        source_id=source_id,
    )
    metadata: dict[str, Any] = {"framework": FRAMEWORK, "status": result.status.value}
    if result.reason:
        metadata["reason"] = result.reason
    for k in ("level", "context_mode", "format"):
        if k in result.details:
            metadata[k] = result.details[k]
    if extra:
        metadata.update(extra)
    if result.calls:
        metadata["prompt_version"] = result.calls[-1].get("prompt_version")
        metadata["input_tokens"] = sum(c.get("input_tokens") or 0 for c in result.calls)
        metadata["output_tokens"] = sum(c.get("output_tokens") or 0 for c in result.calls)
        metadata["cache_hit"] = all(c.get("cache_hit") for c in result.calls)
    if result.status is Status.FAILED:
        return Feedback(
            name=name,
            error=AssessmentError(error_code=result.reason or "failed", error_message=result.rationale or "failed"),
            source=source,
            metadata=_flat(metadata),
        )
    return Feedback(
        name=name, value=result.value, rationale=result.rationale or None, source=source, metadata=_flat(metadata)
    )


def _flat(meta: dict[str, Any]) -> dict[str, Any]:
    # Feedback metadata is stored as strings in some stores: keep values scalar.
    return {k: (v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v)) for k, v in meta.items()}


def _question(inputs: Any) -> str | None:
    if isinstance(inputs, str):
        return inputs
    if isinstance(inputs, dict):
        for key in ("question", "query", "input", "inputs", "request"):
            v = inputs.get(key)
            if isinstance(v, str):
                return v
        if len(inputs) == 1:
            v = next(iter(inputs.values()))
            return v if isinstance(v, str) else None
    return None


def _answer(outputs: Any) -> str | None:
    if isinstance(outputs, str):
        return outputs
    if isinstance(outputs, dict):
        for key in ("answer", "response", "output", "outputs"):
            v = outputs.get(key)
            if isinstance(v, str):
                return v
    return None


def _reference(expectations: dict[str, Any] | None) -> str | None:
    if not expectations:
        return None
    for key in ("expected_response", "reference", "expected_answer", "ground_truth"):
        v = expectations.get(key)
        if isinstance(v, str):
            return v
    return None


def _trace_documents(trace: Any) -> list[dict[str, Any]]:
    """Documents of the trace's top-level RETRIEVER spans: ``{"text", "id"}``."""
    if trace is None:
        return []
    from mlflow.genai.utils.trace_utils import extract_retrieval_context_from_trace

    docs: list[dict[str, Any]] = []
    for chunks in extract_retrieval_context_from_trace(trace).values():
        for c in chunks:
            if isinstance(c, dict):
                meta = c.get("metadata") or {}
                docs.append(
                    {
                        "text": c.get("content") or c.get("page_content") or c.get("text") or "",
                        "id": c.get("doc_uri")
                        or c.get("id")
                        or meta.get("doc_uri")
                        or meta.get("id")
                        or meta.get("doc_id")
                        or meta.get("chunk_id"),
                    }
                )
            elif isinstance(c, str):
                docs.append({"text": c, "id": None})
    return docs


def _contexts(outputs: Any, trace: Any) -> list[str] | None:
    if isinstance(outputs, dict) and isinstance(outputs.get("contexts"), list):
        return [str(c) for c in outputs["contexts"]]
    docs = _trace_documents(trace)
    return [d["text"] for d in docs] if docs else None


class Correctness(Scorer):
    """The context-aware six-level correctness judge as an ``mlflow.genai`` scorer.

    Args:
        judge: judge URI or Backend.
        context_mode: ``auto`` (E3 if reference contexts or a retriever are given,
            else E2 from the outputs or trace, else none), ``reference``,
            ``generation``, ``gold``, ``none``.
        retriever: ``query -> passages`` for E3.
        language, judge_output, max_context_chars: as in the evaluator.
    """

    name: str = "correctness"
    _judge: CorrectnessJudge = PrivateAttr()
    _client: JudgeClient = PrivateAttr()
    _mode: str = PrivateAttr()
    _retriever: Callable[[str], Any] | None = PrivateAttr(default=None)

    def __init__(
        self,
        judge: Any,
        *,
        context_mode: str = "auto",
        retriever: Callable[[str], Any] | None = None,
        language: str = "en",
        judge_output: str = "auto",
        max_context_chars: int = 12_000,
        cache: Any = True,
        max_concurrency: int | None = None,
        name: str = "correctness",
    ) -> None:
        super().__init__(name=name)
        if context_mode not in ("auto", "reference", "generation", "gold", "none"):
            raise ValueError(f"context_mode={context_mode!r} is not one of auto, reference, generation, gold, none.")
        self._client = JudgeClient(judge, cache=cache, max_concurrency=max_concurrency)
        self._judge = CorrectnessJudge(
            self._client, language=language, output=judge_output, max_context_chars=max_context_chars
        )
        self._mode = context_mode
        self._retriever = retriever

    def __call__(
        self,
        *,
        inputs: Any = None,
        outputs: Any = None,
        expectations: dict[str, Any] | None = None,
        trace: Any = None,
        **kwargs: Any,
    ) -> Feedback:
        src = self._client.backend.uri
        question, answer, reference = _question(inputs), _answer(outputs), _reference(expectations)
        missing = [
            n
            for n, v in (
                ("question (inputs['question'])", question),
                ("response (outputs)", answer),
                ("reference (expectations['expected_response'])", reference),
            )
            if v is None
        ]
        if missing:
            return to_feedback(self.name, JudgeResult.failed("invalid_input", f"missing {', '.join(missing)}"), src)
        exp = expectations or {}
        mode = self._mode
        if mode == "auto":
            if self._retriever is not None or exp.get("reference_contexts") is not None:
                mode = "reference"
            elif _contexts(outputs, trace) is not None:
                mode = "generation"
            else:
                mode = "none"
        contexts: list[str] | None
        try:
            if mode == "reference":
                if self._retriever is not None:
                    contexts = [
                        p if isinstance(p, str) else str(p.get("text", p)) if isinstance(p, dict) else str(p)
                        for p in self._retriever(e3_query(question or "", reference or ""))
                    ]
                else:
                    contexts = list(exp.get("reference_contexts") or [])
            elif mode == "generation":
                contexts = _contexts(outputs, trace) or []
            elif mode == "gold":
                contexts = list(exp.get("gold_documents") or [])
            else:
                contexts = []
        except Exception as e:
            return to_feedback(self.name, JudgeResult.failed("invalid_input", f"retriever raised: {e}"), src)
        result = self._judge.judge(question or "", answer or "", reference or "", contexts)
        return to_feedback(self.name, result, src, {"context_mode": mode})


class LexicalOverlap(Scorer):
    """Word recall and ROUGE-L F1 of the response against the reference (no LLM)."""

    name: str = "lexical"

    def __call__(
        self, *, outputs: Any = None, expectations: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Feedback]:
        from . import lexical

        answer, reference = _answer(outputs), _reference(expectations)
        if answer is None or reference is None:
            err = JudgeResult.failed("invalid_input", "needs outputs (response) and expectations['expected_response']")
            return [to_feedback("word_recall", err, "code"), to_feedback("rougeL", err, "code")]
        wr = lexical.word_recall(answer, reference)
        wr_res = JudgeResult.scored(wr) if wr is not None else JudgeResult.abstained("empty_reference")
        f1 = lexical.rouge_l(answer, reference)["f1"]
        rl = JudgeResult.scored(f1) if f1 is not None else JudgeResult.abstained("empty_reference")
        return [to_feedback("word_recall", wr_res, "code"), to_feedback("rougeL", rl, "code")]


class RetrievalMetrics(Scorer):
    """Document-level retrieval metrics from the trace's RETRIEVER span.

    Retrieved ids come from ``outputs["retrieved_doc_ids"]`` or, as MLflow's own
    retrieval judges read them, from the documents of the trace's top-level
    RETRIEVER spans (``doc_uri`` / ``id`` in the document metadata). Gold ids come
    from ``expectations["relevant_doc_ids"]`` (or ``expected_document_ids``).
    """

    name: str = "retrieval"
    ks: list[int] = [1, 3, 5, 10]
    relevance_threshold: float = 1

    def __call__(
        self, *, outputs: Any = None, expectations: dict[str, Any] | None = None, trace: Any = None, **kwargs: Any
    ) -> list[Feedback]:
        from . import retrieval

        exp = expectations or {}
        relevant = exp.get("relevant_doc_ids", exp.get("expected_document_ids"))
        retrieved = outputs.get("retrieved_doc_ids") if isinstance(outputs, dict) else None
        if retrieved is None:
            retrieved = [d["id"] for d in _trace_documents(trace) if d["id"] is not None]
        if not relevant:
            return [
                to_feedback(
                    "retrieval", JudgeResult.abstained("no_gold_ids", "expectations has no relevant_doc_ids"), "code"
                )
            ]
        try:
            retrieval.validate_retrieval_row(retrieved, relevant, 0)
        except ValueError as e:
            return [to_feedback("retrieval", JudgeResult.failed("invalid_input", str(e)), "code")]
        scores = retrieval.score_query(retrieved, relevant, ks=self.ks, relevance_threshold=self.relevance_threshold)
        return [to_feedback(k, JudgeResult.scored(v), "code") for k, v in scores.items() if not k.startswith("num_")]


class _JudgedScorer(Scorer):
    """A judge of the faithfulness / RAGAS family as a scorer (see the module docstring for the fields)."""

    metric: ClassVar[str] = ""
    _ctx: JudgeContext = PrivateAttr()

    def __init__(
        self,
        judge: Any,
        *,
        language: str = "en",
        cache: Any = True,
        max_concurrency: int | None = None,
        embeddings: Any = "auto",
        name: str | None = None,
        **config: Any,
    ) -> None:
        super().__init__(name=name or self.metric)
        spec = JUDGED_METRICS[self.metric]
        cfg = RagJudgeConfig.from_dict({"judge": judge, "language": language, "embeddings": embeddings, **config})
        embed = resolve_embedder(embeddings) if spec.needs_embeddings else None
        self._ctx = JudgeContext(JudgeClient(judge, cache=cache, max_concurrency=max_concurrency), cfg, embed)

    def __call__(
        self,
        *,
        inputs: Any = None,
        outputs: Any = None,
        expectations: dict[str, Any] | None = None,
        trace: Any = None,
        **kwargs: Any,
    ) -> Feedback:
        spec = JUDGED_METRICS[self.metric]
        exp = expectations or {}
        row = Row(
            index=0,
            question=_question(inputs),
            answer=_answer(outputs),
            reference=_reference(exp),
            contexts=_contexts(outputs, trace),
            gold_documents=exp.get("gold_documents"),
            retrieved_doc_ids=outputs.get("retrieved_doc_ids") if isinstance(outputs, dict) else None,
            relevant_doc_ids=exp.get("relevant_doc_ids"),
        )
        src = self._ctx.client.backend.uri
        needed = spec.requires
        if self.metric == "faithfulness" and self._ctx.cfg.faithfulness_evidence == "gold":
            needed = ("answer", "gold_documents")
        missing = [c for c in needed if getattr(row, c) is None]
        if missing:
            where = {
                "question": "inputs['question']",
                "answer": "outputs",
                "reference": "expectations['expected_response']",
                "contexts": "outputs['contexts'] or a RETRIEVER span",
                "gold_documents": "expectations['gold_documents']",
            }
            msg = "missing " + ", ".join(f"{c} ({where[c]})" for c in missing)
            return to_feedback(self.name, JudgeResult.failed("invalid_input", msg), src)
        result = spec.apply(self._ctx.judge(spec), row, self._ctx.cfg)
        return to_feedback(self.name, result, src)


class Faithfulness(_JudgedScorer):
    """Claim-based faithfulness: supported claims / all claims (no claims: abstained)."""

    metric: ClassVar[str] = "faithfulness"


class AnswerRelevancy(_JudgedScorer):
    """Answer relevancy: mean cosine similarity of generated questions to the real one."""

    metric: ClassVar[str] = "answer_relevancy"


class ContextPrecision(_JudgedScorer):
    """Average precision of per-chunk relevance verdicts (one call per row)."""

    metric: ClassVar[str] = "context_precision"


class ContextRecall(_JudgedScorer):
    """Share of the reference's statements attributable to the contexts."""

    metric: ClassVar[str] = "context_recall"


class ContextRelevance(_JudgedScorer):
    """Share of context sentences needed to answer (the original RAGAS definition)."""

    metric: ClassVar[str] = "context_relevance"


def _text_of(value: Any) -> str | None:
    """A question or answer out of a trace's request/response (str, JSON text, or a dict)."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        value = parsed
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return _question(value) or _answer(value)
    return None


class MultiTurnSession(Scorer):
    """The multi-turn scores for a recorded conversation, as an ``mlflow.genai`` session-level scorer.

    For a session (the traces sharing ``mlflow.trace.session`` metadata, oldest first) it replays the
    exchanges through the composer and the six-level judge (see ``MultiTurnRunner.replay``): sigma holds
    one score per exchange until the first 5, and the scorer returns ``wscore``, ``lscore`` and ``mscore``
    Feedbacks. The target question is the session's first question; the gold answer comes from
    ``expectations["expected_response"]`` (or the first trace's expectation assessments).
    """

    name: str = "multiturn"
    _runner: Any = PrivateAttr()
    _retriever: Callable[[str], Any] | None = PrivateAttr(default=None)

    def __init__(
        self,
        judge: Any,
        *,
        n_turns: int = 5,
        language: str = "en",
        retriever: Callable[[str], Any] | None = None,
        cache: Any = True,
        max_concurrency: int | None = None,
        name: str = "multiturn",
    ) -> None:
        super().__init__(name=name)
        from .multiturn import MultiTurnRunner

        self._runner = MultiTurnRunner(
            JudgeClient(judge, cache=cache, max_concurrency=max_concurrency), n_turns=n_turns, language=language
        )
        self._retriever = retriever

    @property
    def is_session_level_scorer(self) -> bool:
        return True

    def __call__(
        self, *, session: list[Any] | None = None, expectations: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Feedback]:
        src = self._runner.judge.client.backend.uri
        traces = sorted(session or [], key=lambda t: t.info.timestamp_ms)
        history = [
            {"question": _text_of(t.data.request) or "", "answer": _text_of(t.data.response) or ""} for t in traces
        ]
        exp = expectations
        if _reference(exp) is None and traces:  # the gold answer logged as an expectation on the session
            logged: dict[str, Any] = {}
            for t in traces:
                for a in t.search_assessments(type="expectation"):
                    logged.setdefault(a.name, getattr(a, "value", None))
            exp = {**logged, **(exp or {})}
        reference = _reference(exp)
        names = ("wscore", "lscore", "mscore")
        if not history or not history[0]["question"] or reference is None:
            why = (
                "the session has no traces"
                if not history
                else (
                    "the first trace has no question"
                    if not history[0]["question"]
                    else "no gold answer: pass expectations={'expected_response': ...}"
                )
            )
            return [to_feedback(n, JudgeResult.failed("invalid_input", why), src) for n in names]
        question = history[0]["question"]
        contexts = list((exp or {}).get("reference_contexts") or []) or (
            [str(p) for p in self._retriever(e3_query(question, reference))] if self._retriever else []
        )
        result = self._runner.replay(history, question, reference, contexts)
        extra = {"sigma": json.dumps(result.sigma), "stop": result.stop, "n_exchanges": len(history)}
        return [to_feedback(n, r, src, extra) for n, r in result.to_judge_results().items()]
