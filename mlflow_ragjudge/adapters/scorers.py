"""The same judges as ``mlflow.genai`` scorers (MLflow 3).

::

    from mlflow_ragjudge.adapters.scorers import Correctness, LexicalOverlap, RetrievalMetrics
    mlflow.genai.evaluate(data=records, scorers=[Correctness(judge="openai:/gpt-4o-mini")])

Each scorer returns ``Feedback`` per row: the value and rationale for a scored row;
``value=None`` with ``metadata["status"] == "abstained"`` (and the reason) for an
abstention, so it never counts as a number; an ``error`` whose code is the failure
reason (``parse_error``, ``timeout`` ...) for a failure.

Where the data comes from (:mod:`~mlflow_ragjudge.adapters.trace_fields` reads the shapes apps log):

* question: ``inputs`` -- ``{"question": ...}`` and the like, the last user turn of a chat's ``messages`` (OpenAI,
  Anthropic, LangChain), the Responses API's ``input``, a LlamaIndex query, a traced function's text argument --
  else the trace's root span inputs;
* response: ``outputs`` -- a string, a chat completion, an Anthropic message, the Responses API's output, a
  LangChain message or generation, ``{"answer": ...}`` and the like -- else the trace's root span outputs;
* reference: ``expectations["expected_response"]`` or ``["reference"]``;
* contexts: ``outputs["contexts"]``, else the documents of the trace's RETRIEVER spans, wherever they are
  (``retriever_spans`` picks among several);
* E3 contexts: ``expectations["reference_contexts"]`` or a ``retriever`` callable.

Where each field was found is in the Feedback's metadata (``question_from``, ``answer_from``, ``contexts_from``).

**Names.** A scorer's results are named after its metric (``correctness``), or ``<metric>_offline`` on the offline
judge; ``name=`` sets another. MLflow merges the results of scorers that share a name, so two scorers of one name in
one ``mlflow.genai.evaluate`` (two judges of one metric) are refused: their rows fail with ``duplicate_name`` and a
message that says to give each a ``name=``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from mlflow.entities import AssessmentError, AssessmentSource, AssessmentSourceType, Feedback
from mlflow.genai.evaluation import context as eval_context
from mlflow.genai.scorers import Scorer
from pydantic import PrivateAttr

from ..core.constants import LOGICAL_COLUMNS, is_offline_judge
from ..core.errors import EmbeddingsUnavailable, InputError, MultiTurnContextWarning
from ..core.types import JudgeResult, Status
from ..engine.config import RagJudgeConfig
from ..engine.draws import combine_draws
from ..engine.identity import JUDGE_ID_KEY, JUDGE_KEY, PROMPTS_KEY, judge_id, score_options
from ..engine.prepare import prepare_metrics
from ..engine.schedule import by_output, score_row
from ..llm.client import JudgeClient
from ..llm.embeddings import embeddings_fix, resolve_embedder
from ..llm.prompts import reference_text
from ..metrics.contexts import e3_query, passages_from_retriever
from ..metrics.multiturn import MultiTurnRunner
from ..metrics.offline import resolve_offline
from ..metrics.spec import MetricSpec, RunContext, get_metric
from .scorer_inputs import ScorerRow, missing_fields, read_scorer_args, references_of
from .trace_fields import answer_of, question_of, retrieved, root_span, where_question

__all__ = [
    "AnswerRelevancy",
    "ContextPrecision",
    "ContextRecall",
    "ContextRelevance",
    "Correctness",
    "Faithfulness",
    "LexicalOverlap",
    "MetricScorer",
    "MultiTurnSession",
    "RetrievalMetrics",
    "identity_metadata",
    "to_feedback",
]

FRAMEWORK = "mlflow-ragjudge"
_log = logging.getLogger(__name__)


def to_feedback(name: str, result: JudgeResult, source_id: str, extra: dict[str, Any] | None = None) -> Feedback:
    """Convert a :class:`JudgeResult` to MLflow ``Feedback`` (three states kept apart). The source is an LLM
    judge named by its URI, or code (``"code"``, and the offline judge ``offline:/lexical``, which is not an
    LLM)."""
    is_code = source_id == "code" or is_offline_judge(source_id)
    source = AssessmentSource(
        source_type=AssessmentSourceType.CODE if is_code else AssessmentSourceType.LLM_JUDGE,
        source_id=source_id,
    )
    metadata: dict[str, Any] = {"framework": FRAMEWORK, "status": result.status.value}
    if result.reason:
        metadata["reason"] = result.reason
    for k in ("level", "context_mode", "format", "probability", "matched_reference", "calibration", "draws", "spread"):
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


def identity_metadata(output: str, judge: str | None, prompt_versions: dict[str, str],
                      options: dict[str, Any]) -> dict[str, Any]:
    """The judge-identity metadata of one Feedback (:mod:`~mlflow_ragjudge.engine.identity`): the id that
    ``ragjudge monitor`` and MLflow's online scoring both use to never judge a trace twice for the same output and
    judge, and the parts it was made of."""
    meta: dict[str, Any] = {JUDGE_ID_KEY: judge_id(output, judge, prompt_versions, options),
                            JUDGE_KEY: judge if judge is not None else "none"}
    if prompt_versions:
        meta[PROMPTS_KEY] = dict(sorted(prompt_versions.items()))
    return meta


def _flat(meta: dict[str, Any]) -> dict[str, Any]:
    # Feedback metadata is stored as strings in some stores: keep values scalar.
    return {k: (v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v)) for k, v in meta.items()}


def default_name(metric: str, judge: Any) -> str:
    """A scorer's default name: the metric's, with ``_offline`` on the offline judge (its numbers are labelled as
    offline estimates wherever they appear, and an LLM judge's scorer of the same metric keeps its own name)."""
    return f"{metric}_offline" if is_offline_judge(judge) else metric


def _evaluation_run() -> str | None:
    """The run of the ``mlflow.genai.evaluate`` call this scorer runs in (MLflow's evaluation context, set in its
    scorer threads), or None outside one."""
    try:
        return eval_context.get_context().get_mlflow_run_id()
    except Exception:  # another MLflow, or no evaluation
        return None


class _Names:
    """Which scorers are at work under each name in each evaluation run. MLflow merges the Feedbacks of scorers that
    share a name into one metric, so two scorers at work under one name in one run (two judges of one metric) are a
    conflict: both are refused with the fix. MLflow calls every scorer on each row at the same time, so in an
    evaluation both are at work together all along; a scorer counts as at work while a call is in flight and for
    :attr:`WINDOW` seconds after (MLflow's evaluation context keeps the last run's id after the evaluation ends, and
    a scorer called on its own later must not meet the ones of that run). Checked when a call starts and when it
    ends, so a call that was judging while the other scorer started fails too."""

    WINDOW = 5.0
    #: a run's first calls under a name wait up to this long for another scorer of that name to start: MLflow starts a
    #: row's scorers together, but a fast first call could end before its sibling's thread began
    GRACE = 0.3

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (run, name) -> scorer id -> [calls in flight, when the last one ended, its judge]
        self._work: dict[tuple[str, str], dict[int, list[Any]]] = {}
        self._first: dict[tuple[str, str], float] = {}  # (run, name) -> when its first call started
        self._warned: set[tuple[str, str]] = set()

    def settle(self, run: str | None, name: str, scorer: int) -> None:
        """Before an early call of a run returns, give another scorer of the same name the time to start."""
        if run is None:
            return
        key = (run, name)
        while True:
            with self._lock:
                alone = set(self._work.get(key, {})) <= {scorer}
                left = self._first.get(key, 0.0) + self.GRACE - time.monotonic()
            if not alone or left <= 0:
                return
            time.sleep(min(left, 0.01))

    def check(self, run: str | None, name: str, scorer: int, judge: str, delta: int) -> str | None:
        """Count a call of ``scorer`` starting (``delta`` 1) or ending (-1); the refusal when another scorer of the
        same name is at work in the same run."""
        if run is None:
            return None
        now = time.monotonic()
        key = (run, name)
        with self._lock:
            if len(self._work) > 1000:  # runs long finished
                self._work = {k: v for k, v in self._work.items()
                              if any(w[0] > 0 or now - w[1] < self.WINDOW for w in v.values())}
                self._first = {k: t for k, t in self._first.items() if k in self._work}
            self._first.setdefault(key, now)
            work = self._work.setdefault(key, {})
            mine = work.setdefault(scorer, [0, now, judge])
            mine[0] += delta
            if delta < 0:
                mine[1] = now
            others = [w[2] for s, w in work.items() if s != scorer and (w[0] > 0 or now - w[1] < self.WINDOW)]
            if not others:
                return None
            judges = sorted({judge, *others})
            warn = key not in self._warned
            self._warned.add(key)
        if warn:
            _log.warning("two scorers named %r in one evaluation (judges: %s): MLflow would merge their results, "
                         "so both are refused; give each its own name=", name, ", ".join(judges))
        return (f"two scorers are named {name!r} in this evaluation (judges: {', '.join(judges)}); MLflow merges the "
                "results of scorers that share a name into one metric, so both are refused. Give each its own name, "
                f"e.g. name='{name}_a' and name='{name}_b'")


_NAMES = _Names()


class MetricScorer(Scorer):
    """Any registered metric as an ``mlflow.genai`` scorer: a thin mapper from MLflow's
    ``inputs`` / ``outputs`` / ``expectations`` / ``trace`` to the evaluator's :class:`Row` (the same input
    layer, so the same checks and the same context-mode rules), and from its results to ``Feedback``.

    A row the metric cannot score (a missing field, a retriever that raises) gets a failed Feedback with
    ``invalid_input`` and the message the evaluator would have refused the run with.

    ``judge="offline:/lexical"`` runs a judged metric on the offline judge (no LLM, no call); a metric it
    cannot score (answer relevancy) is refused when the scorer is built, with the reason.

    Args:
        metric: the registered metric's name.
        judge: judge URI or Backend (for judged metrics), or ``offline:/lexical``.
        cache, max_concurrency: the judge client's settings.
        name: the Feedback name for a single-output metric (default: the metric's, ``<metric>_offline`` on the
            offline judge). Two scorers of one name in one evaluation are refused (module docstring).
        retriever_spans: which RETRIEVER spans of a trace give the contexts when several ran: ``"all"`` (the
            default: every top-level one, documents de-duplicated), ``"first"``, ``"last"``, or span names.
        pass_if: ``value -> bool``, what counts as passing for MLflow's ``EvaluationResult.passed``, e.g.
            ``lambda v: v >= 4`` for correctness; an abstention (no value) is neither.
        **config: any evaluator setting (``language``, ``context_mode``, ``retriever``, ``embeddings`` ...);
            ``repeats=n`` judges each row n times and gives the draws' combination (``panel_rule``), its Feedback's
            metadata holding every draw's value (``draws``) and their ``spread`` (docs/judge-noise.md).
    """

    metric: str = ""
    _spec: MetricSpec = PrivateAttr()
    _ctx: RunContext = PrivateAttr()
    _state: Any = PrivateAttr(default=None)
    _source: str = PrivateAttr(default="code")
    _retriever_spans: str | Sequence[str] = PrivateAttr(default="all")
    #: with ``repeats``: each draw's context (a view of the client) and judge object
    _draws: list[tuple[RunContext, Any]] = PrivateAttr(default_factory=list)
    _rule: str = PrivateAttr(default="auto")
    #: the judge identity's parts (:func:`identity_metadata`): the judge URI (None: no judge), the metric's prompt
    #: versions, the score-changing options
    _identity: tuple[str | None, dict[str, str], dict[str, Any]] = PrivateAttr(default=(None, {}, {}))

    def __init__(self, metric: str | None = None, judge: Any = None, *, cache: Any = True,
                 max_concurrency: int | None = None, name: str | None = None,
                 retriever_spans: str | Sequence[str] = "all", pass_if: Callable[[Any], bool] | None = None,
                 **config: Any) -> None:
        metric = metric or type(self).__dict__.get("default_metric", "")
        spec = get_metric(metric)
        if isinstance(judge, (list, tuple)):
            raise ValueError(f"a scorer has one judge, got a list of {len(judge)}: for a panel in "
                             "mlflow.genai.evaluate, give one scorer per judge, each named after it (e.g. "
                             f"{type(self).__name__}(judge='openai:/gpt-4o-mini', name='{metric}_gpt-4o-mini')), or "
                             "judge=[...] with mlflow_ragjudge.evaluate_frame / ragjudge evaluate")
        if not (isinstance(retriever_spans, str) or (isinstance(retriever_spans, Sequence)
                                                     and all(isinstance(n, str) for n in retriever_spans))):
            raise ValueError(f"retriever_spans must be 'all', 'first', 'last' or span names, got {retriever_spans!r}")
        super().__init__(name=name or default_name(metric, judge), metric=metric)  # type: ignore[call-arg]
        cfg = RagJudgeConfig.from_dict({"judge": judge, **config})
        reason = spec.check(cfg) if spec.check is not None else None
        if reason:
            raise ValueError(reason)
        client = None
        if spec.judged and is_offline_judge(judge):
            spec = spec.for_offline_judge()  # raises ValueError with the reason when it cannot
            self._source = resolve_offline(judge).uri
        elif spec.judged:
            if judge is None:
                raise ValueError(f"the {metric} scorer needs a judge, e.g. judge='openai:/gpt-4o-mini', or "
                                 "judge='offline:/lexical' for the offline judge (no LLM)")
            client = JudgeClient(judge, cache=cache, max_concurrency=max_concurrency, dedupe=True)
            self._source = client.backend.uri
        embed = None
        if spec.needs.embeddings:
            try:
                embed = resolve_embedder(cfg.embeddings, client=client)
            except EmbeddingsUnavailable as e:
                raise ValueError(f"the {metric} scorer needs embeddings ({e.reason}); {embeddings_fix(judge)}") from e
        self._spec = spec
        self._retriever_spans = retriever_spans
        if pass_if is not None:
            self._pass_if = pass_if  # EvaluationResult.passed asks it of every row's value
        self._ctx = RunContext(client, cfg, embed, metrics=(metric,))
        if spec.judged:  # a judge object per scorer; deterministic metrics are set up per row (they are cheap)
            self._state = spec.setup(self._ctx) if spec.setup is not None else None
        self._rule = cfg.panel_rule
        versions = (dict(spec.prompt_versions(self._state))
                    if spec.prompt_versions is not None and self._state is not None else {})
        self._identity = (None if self._source == "code" else self._source, versions, score_options(cfg.as_dict()))
        if client is not None and cfg.repeats > 1:  # each draw: a view of the client, a judge object around it
            for k in range(cfg.repeats):
                view = RunContext(client.for_draw(k, cfg.repeat_temperature), cfg, embed, metrics=(metric,))
                self._draws.append((view, spec.setup(view) if spec.setup is not None else None))

    def _row(self, inputs: Any, outputs: Any, expectations: dict[str, Any] | None, trace: Any) -> ScorerRow:
        spec, cfg = self._spec, self._ctx.cfg
        found = read_scorer_args(inputs, outputs, expectations, trace, relevance_threshold=cfg.relevance_threshold,
                                 retriever_spans=self._retriever_spans)
        row = found.row
        alternatives = spec.requirements(cfg)
        if not any(all(getattr(row, c, None) is not None for c in alt) for alt in alternatives):
            raise InputError("missing " + "; ".join(missing_fields(row, alternatives[0], found.looked)))
        if spec.validate is not None:
            spec.validate([row], cfg)
        return found

    def _score_row(self, inputs: Any, outputs: Any, expectations: dict[str, Any] | None,
                   trace: Any) -> tuple[dict[str, JudgeResult], dict[str, str]]:
        spec = self._spec
        try:
            found = self._row(inputs, outputs, expectations, trace)
        except (InputError, ValueError) as e:
            return {o: JudgeResult.failed("invalid_input", str(e)) for o in self._single_names()}, {}
        row = found.row
        cfg = self._ctx.cfg
        # the row as a one-row run: its fields are the columns it has; the metric's prepare hook (the judge
        # contexts: the same context-mode and E3 rules as the evaluator) runs on it, then the engine's row path
        present = frozenset(cfg.column(f) for f in LOGICAL_COLUMNS if getattr(row, f, None) is not None)
        one = RunContext(None, cfg, rows=[row], columns=present)
        try:
            prepare_metrics([spec], one)
        except (InputError, ValueError) as e:
            return {o: JudgeResult.failed("invalid_input", str(e)) for o in self._single_names()}, found.sources
        if self._draws:  # repeats: the row judged once per draw, the draws combined (docs/judge-noise.md)
            per_draw = []
            for view, state in self._draws:
                ctx = RunContext(view.client, cfg, self._ctx.embed, metrics=self._ctx.metrics,
                                 context_mode=one.context_mode, rows=[row], columns=present, _shared=view._shared)
                per_draw.append({n: res[0] for n, res in by_output(spec, [score_row(spec, state, row, ctx)]).items()})
            return combine_draws(per_draw, self._rule, spec.outputs.levels), found.sources
        ctx = RunContext(self._ctx.client, cfg, self._ctx.embed, metrics=self._ctx.metrics,
                         context_mode=one.context_mode, rows=[row], columns=present, _shared=self._ctx._shared)
        state = self._state if spec.judged else (spec.setup(ctx) if spec.setup is not None else None)
        results = by_output(spec, [score_row(spec, state, row, ctx)])
        return {name: res[0] for name, res in results.items()}, found.sources

    def _single_names(self) -> list[str]:
        names = [o for o in self._spec.output_names if not o.endswith("_")]
        return names if len(names) > 1 else [self._spec.name]

    def __call__(self, *, inputs: Any = None, outputs: Any = None, expectations: dict[str, Any] | None = None,
                 trace: Any = None, **kwargs: Any) -> Feedback | list[Feedback]:
        run = _evaluation_run() if trace is not None else None  # MLflow's evaluation always passes a trace
        clash = _NAMES.check(run, self.name, id(self), self._source, 1)
        try:
            if clash is None:
                results, sources = self._score_row(inputs, outputs, expectations, trace)
                _NAMES.settle(run, self.name, id(self))
        finally:
            clash = _NAMES.check(run, self.name, id(self), self._source, -1) or clash  # another one started meanwhile
        if clash is not None:
            results, sources = {o: JudgeResult.failed("duplicate_name", clash) for o in self._single_names()}, {}
        extra = {f"{k}_from": v for k, v in sources.items() if k in ("question", "answer", "contexts")}
        if list(results) == [self._spec.name] and self._spec.name in self._spec.output_names:
            # the metric's own single result: one Feedback under the scorer's name
            (res,) = results.values()
            if "context_mode" in res.details:
                extra["context_mode"] = res.details["context_mode"]
            return to_feedback(self.name, res, self._source, {**extra, **self.identity(self._spec.name)})
        if not results:
            return [to_feedback(self._spec.name, JudgeResult.abstained(
                "nothing_to_score", "the row has nothing this metric scores"), self._source,
                {**extra, **self.identity(self._spec.name)})]
        return [to_feedback(n, r, self._source, {**extra, **self.identity(n)}) for n, r in results.items()]

    def identity(self, output: str) -> dict[str, Any]:
        """The judge-identity metadata of this scorer's Feedback for the metric result ``output`` (e.g.
        ``faithfulness``; under whatever name the scorer gives it): ``ragjudge.judge_id`` is
        ``judge_id(output, judge URI, the metric's prompt versions, score_options(config))``, the id ``ragjudge
        monitor`` computes for the same judgment, plus ``ragjudge.judge`` and ``ragjudge.prompt_versions``."""
        return identity_metadata(output, *self._identity)


class Correctness(MetricScorer):
    """The context-aware six-level correctness judge as an ``mlflow.genai`` scorer.

    Args:
        judge: judge URI or Backend.
        context_mode: ``auto`` (E3 if reference contexts or a retriever are given,
            else E2 from the outputs or trace, else none), ``reference``,
            ``generation``, ``gold``, ``none``.
        retriever: ``query -> passages`` for E3.
        language, judge_output, max_context_chars: as in the evaluator.
        repeats, repeat_temperature, panel_rule: judge each row ``repeats`` times and give the draws' combination
            (the majority level by default), every draw's value in the Feedback's ``draws`` metadata
            (docs/judge-noise.md).
    """

    def __init__(self, judge: Any, *, context_mode: str = "auto", retriever: Callable[[str], Any] | None = None,
                 language: str = "en", judge_output: str = "auto", max_context_chars: int = 12_000,
                 cache: Any = True, max_concurrency: int | None = None, name: str | None = None,
                 retriever_spans: str | Sequence[str] = "all", pass_if: Callable[[Any], bool] | None = None,
                 repeats: int = 1, repeat_temperature: float | None = None, panel_rule: str = "auto") -> None:
        super().__init__("correctness", judge, cache=cache, max_concurrency=max_concurrency, name=name,
                         retriever_spans=retriever_spans, pass_if=pass_if,
                         context_mode=context_mode, retriever=retriever, language=language,
                         judge_output=judge_output, max_context_chars=max_context_chars, repeats=repeats,
                         repeat_temperature=repeat_temperature, panel_rule=panel_rule)


class LexicalOverlap(MetricScorer):
    """Word recall and ROUGE-L F1 of the response against the reference (no LLM; BERTScore with
    ``bertscore=True`` or ``"auto"``)."""

    def __init__(self, *, bertscore: bool | str = False, name: str = "lexical") -> None:
        super().__init__("lexical", name=name, bertscore=bertscore)

    def _single_names(self) -> list[str]:
        return ["word_recall", "rougeL"]


class RetrievalMetrics(MetricScorer):
    """Document-level retrieval metrics from the trace's RETRIEVER span.

    Retrieved ids come from ``outputs["retrieved_doc_ids"]`` or, as MLflow's own
    retrieval judges read them, from the documents of the trace's top-level
    RETRIEVER spans (``doc_uri`` / ``id`` in the document metadata). Gold ids come
    from ``expectations["relevant_doc_ids"]`` (or ``expected_document_ids``).
    """

    def __init__(self, *, ks: Any = (1, 3, 5, 10), relevance_threshold: float = 1, name: str = "retrieval",
                 retriever_spans: str | Sequence[str] = "all") -> None:
        super().__init__("retrieval", name=name, k=list(ks), relevance_threshold=relevance_threshold,
                         retriever_spans=retriever_spans)

    def _single_names(self) -> list[str]:
        return ["retrieval"]

    def _score_row(self, inputs: Any, outputs: Any, expectations: dict[str, Any] | None,
                   trace: Any) -> tuple[dict[str, JudgeResult], dict[str, str]]:
        exp = expectations or {}
        if not exp.get("relevant_doc_ids", exp.get("expected_document_ids")):
            return {"retrieval": JudgeResult.abstained("no_gold_ids", "expectations has no relevant_doc_ids")}, {}
        return super()._score_row(inputs, outputs, expectations, trace)


class _JudgedScorer(MetricScorer):
    """A judge of the faithfulness / RAGAS family as a scorer."""

    default_metric: ClassVar[str] = ""

    def __init__(self, judge: Any, *, language: str = "en", cache: Any = True, max_concurrency: int | None = None,
                 embeddings: Any = "auto", name: str | None = None, **config: Any) -> None:
        super().__init__(self.default_metric, judge, cache=cache, max_concurrency=max_concurrency, name=name,
                         language=language, embeddings=embeddings, **config)


class Faithfulness(_JudgedScorer):
    """Claim-based faithfulness: supported claims / all claims (no claims: abstained)."""

    default_metric: ClassVar[str] = "faithfulness"


class AnswerRelevancy(_JudgedScorer):
    """Answer relevancy: mean cosine similarity of generated questions to the real one."""

    default_metric: ClassVar[str] = "answer_relevancy"


class ContextPrecision(_JudgedScorer):
    """Average precision of per-chunk relevance verdicts (one call per row)."""

    default_metric: ClassVar[str] = "context_precision"


class ContextRecall(_JudgedScorer):
    """Share of the reference's statements attributable to the contexts."""

    default_metric: ClassVar[str] = "context_recall"


class ContextRelevance(_JudgedScorer):
    """Share of context sentences needed to answer (the original RAGAS definition)."""

    default_metric: ClassVar[str] = "context_relevance"


def _exchange(trace: Any) -> dict[str, str]:
    """One recorded exchange of a session: the question and answer of a trace's root span, in whatever shape the
    app logged them (:mod:`~mlflow_ragjudge.adapters.trace_fields`: a chat's last user turn, a completion ...)."""
    root = root_span(trace)
    return {"question": (question_of(root.inputs) if root is not None else None) or "",
            "answer": (answer_of(root.outputs) if root is not None else None) or ""}


#: MultiTurnSession's context modes: where the judge's contexts come from
SESSION_CONTEXT_MODES = ("auto", "reference", "generation", "none")


class MultiTurnSession(Scorer):
    """The multi-turn scores for a recorded conversation, as an ``mlflow.genai`` session-level scorer.

    For a session (the traces sharing MLflow's session metadata, ``mlflow.trace.session``, oldest first) it replays
    the exchanges through the composer and the six-level judge (see ``MultiTurnRunner.replay``): sigma holds one
    score per exchange until the first 5, and the scorer returns ``wscore``, ``lscore`` and ``mscore`` Feedbacks.
    Each exchange is read from its trace's root span in whatever shape the app logged it (a chat's last user turn,
    a completion object, ...). The target question is the session's first question; the gold answer comes from
    ``expectations["expected_response"]`` or an ``expected_response`` expectation logged on the session's traces.

    The judge's contexts (``context_mode``): the paper's E3, passages retrieved with the target question and the
    gold answer, from ``retriever=`` or an expectation ``reference_contexts`` (``"reference"`` insists on them);
    ``"generation"``, the documents the session's own RETRIEVER spans retrieved (E2, which the paper found to
    inflate scores); ``"none"``. ``"auto"`` (the default) takes E3 where it is given, else E2 where the traces have
    retrieved documents, else none, and says which in each Feedback's ``context_mode``.
    """

    name: str = "multiturn"
    _runner: Any = PrivateAttr()
    _retriever: Callable[[str], Any] | None = PrivateAttr(default=None)
    _context_mode: str = PrivateAttr(default="auto")
    _retriever_spans: str | Sequence[str] = PrivateAttr(default="all")
    #: with ``repeats``: each draw's context (a view of the client) and judge object
    _draws: list[tuple[RunContext, Any]] = PrivateAttr(default_factory=list)
    _rule: str = PrivateAttr(default="auto")

    def __init__(
        self,
        judge: Any,
        *,
        n_turns: int = 5,
        language: str = "en",
        retriever: Callable[[str], Any] | None = None,
        context_mode: str = "auto",
        retriever_spans: str | Sequence[str] = "all",
        cache: Any = True,
        max_concurrency: int | None = None,
        name: str = "multiturn",
    ) -> None:
        if context_mode not in SESSION_CONTEXT_MODES:
            raise ValueError(f"context_mode must be one of {SESSION_CONTEXT_MODES}, got {context_mode!r}")
        super().__init__(name=name)
        self._runner = MultiTurnRunner(
            JudgeClient(judge, cache=cache, max_concurrency=max_concurrency), n_turns=n_turns, language=language
        )
        self._retriever = retriever
        self._context_mode = context_mode
        self._retriever_spans = retriever_spans

    @property
    def is_session_level_scorer(self) -> bool:
        return True

    def _contexts(self, question: str, answers: list[str], exp: dict[str, Any],
                  traces: Sequence[Any]) -> tuple[list[str], str]:
        """The judge's contexts and their mode (class docstring); raises InputError when the mode cannot be met."""
        mode = self._context_mode
        if mode in ("auto", "reference"):
            if exp.get("reference_contexts"):
                return [str(c) for c in exp["reference_contexts"]], "reference"
            if self._retriever is not None:
                try:
                    found = self._retriever(e3_query(question, answers))
                except Exception as e:  # the evaluator refuses such a run; a scorer sees one session: it fails
                    raise InputError(f"the retriever raised ({type(e).__name__}: {e})") from e
                return passages_from_retriever(found, 0), "reference"
            if mode == "reference":
                raise InputError("context_mode='reference' judges every turn with passages retrieved with question + "
                                 "gold answer (E3): pass retriever= or expectations={'reference_contexts': [...]}")
        if mode in ("auto", "generation"):
            docs: list[str] = []
            for t in traces:
                docs.extend(d.text for d in retrieved(t, self._retriever_spans).documents if d.text not in docs)
            if docs:
                return docs, "generation"
            if mode == "generation":
                raise InputError("context_mode='generation' judges with the documents the session's traces retrieved, "
                                 "and its traces have no RETRIEVER span with documents")
        return [], "none"

    def __call__(
        self, *, session: list[Any] | None = None, expectations: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Feedback]:
        src = self._runner.judge.client.backend.uri
        traces = sorted(session or [], key=lambda t: t.info.timestamp_ms)
        history = [_exchange(t) for t in traces]
        names = ("wscore", "lscore", "mscore")
        versions = dict(self._runner.prompt_versions)
        options = score_options({"language": self._runner.language})

        def failed(why: str) -> list[Feedback]:
            _log.warning("%s: a session was not judged: %s", self.name, why)
            return [to_feedback(n, JudgeResult.failed("invalid_input", why), src,
                                identity_metadata(n, src, versions, options)) for n in names]

        exp = expectations
        try:
            if references_of(exp) is None and traces:  # the gold answer logged as an expectation on the session
                logged: dict[str, Any] = {}
                for t in traces:
                    for a in t.search_assessments(type="expectation"):
                        logged.setdefault(a.name, getattr(a, "value", None))
                exp = {**logged, **(exp or {})}
            answers = references_of(exp)
        except InputError as e:
            return failed(str(e))
        # several acceptable answers: shown to the agents as alternatives (and all in the E3 query)
        reference = reference_text(answers, self._runner.language) if answers else None
        if not history:
            return failed("the session has no traces")
        if not history[0]["question"]:
            return failed("the session's first trace has no question: " + where_question(root_span(traces[0]).inputs
                                                                                        if root_span(traces[0])
                                                                                        else None))
        if reference is None:
            return failed("no gold answer: log an 'expected_response' expectation on the session's first trace "
                          "(mlflow.log_expectation) or pass expectations={'expected_response': ...}")
        question = history[0]["question"]
        try:
            contexts, mode = self._contexts(question, answers or [], exp or {}, traces)
        except InputError as e:
            return failed(str(e))
        if mode != "reference" and self._context_mode == "auto":  # never silently without the paper's E3
            used = ("the documents the session retrieved (E2, which the paper found to inflate scores)"
                    if mode == "generation" else "no contexts")
            warnings.warn(MultiTurnContextWarning(
                f"{self.name}: judged with {used}, not passages retrieved with question + gold answer (E3): pass "
                f"retriever= or an expectation 'reference_contexts' for E3, or context_mode='{mode}' to say this is "
                "meant"), stacklevel=2)
        result = self._runner.replay(history, question, reference, contexts)
        extra = {"sigma": json.dumps(result.sigma), "stop": result.stop, "n_exchanges": len(history),
                 "context_mode": mode}
        return [to_feedback(n, r, src, {**extra, **identity_metadata(n, src, versions, options)})
                for n, r in result.to_judge_results().items()]
