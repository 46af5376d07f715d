"""The metric registry: one :class:`MetricSpec` per metric, LLM-judged or not.

A spec says everything the engine (:mod:`mlflow_ragjudge.engine.evaluate`) needs to run a metric without knowing
its name: which columns it needs, whether it needs the judge, embeddings or the six-level judge's contexts, how
it checks its inputs and builds its state before any call, how it scores one row into
:class:`~mlflow_ragjudge.core.types.JudgeResult` values (one per sub-metric it logs), how it estimates a row's cost,
and which table columns, run-level metrics, artifacts and params it adds. The metric list of the config, the
CLI and the docs comes from here.

A metric lives in its own module, which defines its spec; registering it is one line: a built-in one in the list of
:mod:`mlflow_ragjudge.metrics` (which registers them in order when the package is imported, and which every import of
this module imports first), your own with :func:`register_metric`. See docs/extending.md.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..core.errors import MetricUnavailable
from ..core.text import Repairs
from ..core.types import JudgeResult, Row
from .offline_evidence import OfflineEvidence

if TYPE_CHECKING:
    from ..llm.client import JudgeClient

__all__ = [
    "MetricSpec",
    "RunContext",
    "RunSettings",
    "Finish",
    "Option",
    "all_options",
    "Prepared",
    "MetricUnavailable",
    "register_metric",
    "get_metric",
    "metric_names",
]

class RunSettings(Protocol):
    """What a metric reads of the run's configuration: a few keys of the run's own, the data's column names, and
    every registered metric's :class:`Option` by its name (``settings.multiturn_turns``). The engine's
    :class:`~mlflow_ragjudge.engine.config.RagJudgeConfig` is one; the metrics never import it (it sits a layer
    above them, since it validates their options)."""

    judge: Any
    language: str
    context_mode: Any
    retriever: Any
    relevance_threshold: float

    def column(self, logical: str) -> str:
        """The data's column for a logical column (``question`` ...), after ``col_mapping``."""
        ...

    def __getattr__(self, name: str) -> Any:
        """A metric's option by its name."""
        ...


@dataclass(frozen=True)
class Option:
    """A setting of one metric, given in the evaluator config (``evaluator_config``, ``--config``, scorer keyword
    arguments) like any other key, and read back as ``ctx.cfg.<name>``; the metric declares it, with its check.

    Attributes:
        name: the config key (prefix it with the metric's name when it is not obviously the metric's own).
        default: the value when it is not given.
        accepts: whether a value has the right type and range (a bad one is refused naming ``what`` and ``example``).
        what, example: what the value must be, and an example, for that message.
        normalize: turns an accepted value into the form the metric reads (a phrase into a list of phrases ...).
        check: deeper validation after ``accepts``; raises ``ValueError`` naming the problem and the fix.
        public: the value as recorded in the run's params (default: as it is; a callable by its name).
    """

    name: str
    default: Any = None
    accepts: Callable[[Any], bool] = lambda v: True
    what: str = ""
    example: str = ""
    normalize: Callable[[Any], Any] | None = None
    check: Callable[[Any], None] | None = None
    public: Callable[[Any], Any] | None = None

    def validate(self, value: Any) -> Any:
        """The value as the metric reads it, or a ``ValueError`` naming the key, the value and the fix."""
        if not self.accepts(value):
            shown = repr(value) if not callable(value) else type(value).__name__
            raise ValueError(f"Config {self.name}={shown[:80]} is not valid: it must be {self.what}, e.g. "
                             f"{self.name}={self.example}.")
        if self.normalize is not None:
            value = self.normalize(value)
        if self.check is not None:
            self.check(value)
        return value

    def recorded(self, value: Any) -> Any:
        if self.public is not None:
            return self.public(value)
        if callable(value):
            return getattr(value, "__name__", type(value).__name__)
        return value


@dataclass
class Prepared:
    """What a metric's ``prepare`` hook found out about the run, before any judge call: entries for the run record
    (``ragjudge/config.json``) and MLflow params."""

    record: dict[str, Any] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


@dataclass
class Finish:
    """What a metric adds once all its rows are scored."""

    metrics: dict[str, float] = field(default_factory=dict)  # logged as they are
    #: counts logged as they are that add up over parts of the data (an evaluation split over partitions sums them)
    counts: dict[str, float] = field(default_factory=dict)
    columns: dict[str, list[Any]] = field(default_factory=dict)  # extra per-row table columns
    artifacts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # JSONL artifacts
    skipped: dict[str, str] = field(default_factory=dict)


Requirement = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class MetricSpec:
    """One metric.

    Attributes:
        name: the metric's name (``metrics=[...]``); its results are logged as ``<output>/mean`` ...
        requires: alternatives of logical columns that together let it run (the first is the one named in
            errors), or a function of the config returning them.
        outputs: the names of the results it produces per row (a name ending in ``_`` is a prefix, for
            families such as ``precision_at_``); default: just ``name``.
        judged: it calls the judge model (needs ``judge``; abstain and error rates are logged and failures
            reported).
        needs_embeddings: it needs the run's embeddings.
        required_text: the text columns every row must fill; default: the text columns of ``requires[0]``.
        default: runs by default when its columns are there (a function of the config may say no).
        check: a reason it cannot run with this config, or None (asked for by name: an input error).
        prepare: run-level work on the rows before any call and before ``setup`` (the judge contexts and their E3
            retrieval, :func:`mlflow_ragjudge.metrics.contexts.prepare_judge_contexts`); returns what to record
            (:class:`Prepared`). Metrics that share the work share the function, which does it once per run.
        setup: builds the metric's state for a run (a judge object ...), before any call; may raise
            :class:`MetricUnavailable` or an input error.
        validate: checks the rows before any call (raise an input error naming the row and the fix).
        score: one row -> ``{output name: JudgeResult}`` (or one JudgeResult for ``name``); never raises for
            model failures (an exception is recorded as the row's ``internal_error``).
        score_batch: all rows at once (for batched models such as BERTScore), instead of ``score``.
        estimate: one row's ``{"calls", "input_tokens", "output_tokens"}`` with nothing sent.
        columns: extra per-row table columns: column name -> function of one row's results.
        finish: run-level metrics, columns, artifacts and skips once all rows are scored.
        headline: its first output is the per-row table's headline score (shown first).
        levels: outputs on the six-level scale (the engine logs their level shares ``<output>/share_level_<n>`` and
            shows level 0 as 0).
        prompt_versions: the prompt versions its state uses.
        record: entries for the run's config record (``ragjudge/config.json``).
        params: extra MLflow params.
        description: one line for ``ragjudge metrics`` and the docs.
        offline: how the offline judge (``offline:/lexical``, :mod:`mlflow_ragjudge.metrics.offline`) scores one row
            of a judged metric: ``(OfflineEvidence, row, ctx) -> JudgeResult | {output: JudgeResult}``; None when it
            cannot (the metric is then skipped under the offline judge, with ``offline_unavailable`` as the reason).
        offline_unavailable: why the offline judge cannot score this metric.
        scale: the (lowest, highest) value of its outputs that are not on the six-level scale (human labels given
            with ``human_labels`` must lie in it); None when it has no fixed range. Outputs in ``levels`` are on
            1..5 (0 = "not sure").
        batchable: with ``batch`` on, its judge calls may go through the provider's batch API (False: they stay
            synchronous, as multi-turn's, where each turn needs the last).
        options: the metric's own settings (:class:`Option`), given in the evaluator config with the run's.
        sentences_of: the row's texts (``Row`` fields: ``contexts``, ``answer``, ``reference``, ``references``) it
            reads sentence by sentence. When a run is scored on one worker (the offline judge, metrics without a
            judge), the engine cuts them into sentences once per row before the row's metrics run
            (:func:`~mlflow_ragjudge.core.matching.cut_by_sentence`), so that every metric reading those texts
            reads one cut instead of cutting the text whole and again by sentence. Changes no result.
    """

    name: str
    requires: Requirement | Callable[[RunSettings], Requirement]
    outputs: tuple[str, ...] = ()
    judged: bool = False
    needs_embeddings: bool = False
    required_text: tuple[str, ...] | None = None
    default: bool | Callable[[RunSettings], bool] = True
    check: Callable[[RunSettings], str | None] | None = None
    prepare: Callable[[RunContext], Prepared | None] | None = None
    setup: Callable[[RunContext], Any] | None = None
    validate: Callable[[Sequence[Row], RunSettings], None] | None = None
    score: Callable[[Any, Row, RunContext], dict[str, JudgeResult] | JudgeResult] | None = None
    score_batch: Callable[[Any, Sequence[Row], RunContext], list[dict[str, JudgeResult]]] | None = None
    estimate: Callable[[Any, Row, RunContext], dict[str, int]] | None = None
    columns: dict[str, Callable[[dict[str, JudgeResult]], Any]] = field(default_factory=dict)
    finish: Callable[[Any, Sequence[Row], list[dict[str, JudgeResult]], RunContext], Finish] | None = None
    headline: bool = False
    levels: tuple[str, ...] = ()
    prompt_versions: Callable[[Any], dict[str, str]] | None = None
    record: Callable[[Any, RunContext], dict[str, Any]] | None = None
    params: Callable[[Any, RunContext], dict[str, str]] | None = None
    description: str = ""
    offline: Callable[[Any, Row, RunContext], dict[str, JudgeResult] | JudgeResult] | None = None
    offline_unavailable: str = "it needs a language model"
    scale: tuple[float, float] | None = (0.0, 1.0)
    batchable: bool = True
    options: tuple[Option, ...] = ()
    sentences_of: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.score is None) == (self.score_batch is None):
            raise ValueError(f"metric {self.name!r}: give exactly one of score= and score_batch=")
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"metric name {self.name!r}: use letters, digits and underscores")

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.outputs or (self.name,)

    def requirements(self, cfg: RunSettings) -> Requirement:
        return self.requires(cfg) if callable(self.requires) else self.requires

    def text_columns(self, cfg: RunSettings) -> tuple[str, ...]:
        if self.required_text is not None:
            return self.required_text
        return tuple(c for c in self.requirements(cfg)[0] if c in ("question", "answer", "reference"))

    def runs_by_default(self, cfg: RunSettings) -> bool:
        return self.default(cfg) if callable(self.default) else self.default

    def offline_reason(self) -> str | None:
        """Why the offline judge cannot score this metric, or None when it can (or the metric needs no judge)."""
        if not self.judged or self.offline is not None:
            return None
        return (f"the offline judge (offline:/lexical, not an LLM) cannot score '{self.name}': "
                f"{self.offline_unavailable}; set judge='openai:/gpt-4o-mini' (or any judge URI) to run it")

    def for_offline_judge(self) -> MetricSpec:
        """This metric as the offline judge runs it: its offline scorer, the run's one :class:`OfflineEvidence` as
        state, no judge calls (so a zero estimate) and the calibration as its prompt version. A metric that needs
        no judge is returned as it is.

        Raises:
            ValueError: the offline judge cannot score this metric (:meth:`offline_reason`).
        """
        if not self.judged:
            return self
        reason = self.offline_reason()
        if reason is not None:
            raise ValueError(reason)
        return dataclasses.replace(
            self, setup=_offline_setup, score=self.offline, score_batch=None, needs_embeddings=False,
            estimate=lambda state, row, ctx: {"calls": 0, "input_tokens": 0, "output_tokens": 0},
            prompt_versions=lambda judge: {"offline_judge": judge.version},
        )

    def scale_of(self, output: str) -> tuple[float, float] | None:
        """The range of one output's values: 1..5 on the six-level scale, else :attr:`scale`."""
        if any(output == lv or (lv.endswith("_") and output.startswith(lv)) for lv in self.levels):
            return (1.0, 5.0)
        return self.scale

    def produces(self, name: str) -> bool:
        """Whether a logged metric's first segment (``faithfulness`` of ``faithfulness/mean``) is one of its outputs."""
        return any(name == o or (o.endswith("_") and name.startswith(o)) for o in (*self.output_names, self.name))


@dataclass
class RunContext:
    """What the metrics of one run share: the judge client, the config, the embeddings, the metrics in the run
    and the context mode; ``shared(key, factory)`` gives every metric the same lazily built object (one
    statement extractor per run ...)."""

    client: JudgeClient | None
    cfg: RunSettings
    embed: Callable[[list[str]], list[list[float]]] | None = None
    metrics: tuple[str, ...] = ()
    context_mode: str | None = None
    rows: Sequence[Row] = ()
    #: the data's column names (for ``has_column``) and where text repairs are recorded
    columns: frozenset[str] = frozenset()
    repairs: Repairs | None = None
    _shared: dict[str, Any] = field(default_factory=dict)
    _lock: Any = field(default_factory=threading.RLock)

    def has_column(self, logical: str) -> bool:
        """Whether the data has the column a logical name maps to (``col_mapping``)."""
        return self.cfg.column(logical) in self.columns

    def has_raw_columns(self, *names: str) -> bool:
        return set(names) <= self.columns

    def shared(self, key: str, factory: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self._shared:
                self._shared[key] = factory()
            return self._shared[key]

    @property
    def judge_client(self) -> JudgeClient:
        if self.client is None:
            raise RuntimeError("this metric needs a judge client")
        return self.client


def _offline_setup(ctx: RunContext) -> Any:
    return ctx.shared("offline_judge", OfflineEvidence)


_REGISTRY: dict[str, MetricSpec] = {}
_LOCK = threading.RLock()


def register_metric(spec: MetricSpec, *, replace: bool = False) -> MetricSpec:
    """Add a metric to the registry (``replace=True`` to override one with the same name)."""
    if not isinstance(spec, MetricSpec):
        raise TypeError(f"register_metric takes a MetricSpec, got {type(spec).__name__}")
    with _LOCK:
        if spec.name in _REGISTRY and not replace:
            raise ValueError(f"a metric named {spec.name!r} is already registered (pass replace=True to override it)")
        _REGISTRY[spec.name] = spec
    return spec


def unregister_metric(name: str) -> None:
    """Remove a metric from the registry (a built-in one too, for this process)."""
    with _LOCK:
        _REGISTRY.pop(name, None)


def get_metric(name: str) -> MetricSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"Unknown metric {name!r}. Known metrics: {', '.join(metric_names())}.") from None


def metric_names() -> tuple[str, ...]:
    """Every registered metric, built-in ones first, in run order."""
    return tuple(_REGISTRY)


def all_specs() -> list[MetricSpec]:
    return list(_REGISTRY.values())


def all_options() -> dict[str, Option]:
    """Every registered metric's options, by name (a name two metrics declare is the first one's)."""
    out: dict[str, Option] = {}
    for spec in all_specs():
        for opt in spec.options:
            out.setdefault(opt.name, opt)
    return out
