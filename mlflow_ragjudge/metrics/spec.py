"""The metric registry: one :class:`MetricSpec` per metric, LLM-judged or not.

A spec says everything the engine (:mod:`mlflow_ragjudge.engine`) needs to run a metric without knowing its name:
which columns it needs, whether it needs the judge, embeddings or the six-level judge's contexts, how it checks its
inputs and builds its state before any call, how it scores one row into
:class:`~mlflow_ragjudge.core.types.JudgeResult` values (one per sub-metric it logs), how it estimates a row's cost,
and which table columns, run-level metrics, artifacts and params it adds. The metric list of the config, the CLI and
the docs comes from here.

The contract is typed: ``MetricSpec[StateT]`` is generic in the metric's state (what ``setup`` builds), every hook
takes that state with the :class:`~mlflow_ragjudge.core.types.Row` and the :class:`RunContext` and returns one shape
(:data:`Scores`, :class:`Estimate`, :class:`Finish` ...). Related fields are small values: :class:`Outputs` (what it
produces and how it is shown), :class:`Needs` (what it needs of the run besides its columns), and its
options (:class:`Option`), which are per metric (see there).

A metric lives in its own module, which defines its spec; registering it is one line: a built-in one in the list of
:mod:`mlflow_ragjudge.metrics` (which registers them in order when the package is imported, and which every import of
this module imports first), your own with :func:`register_metric`. See docs/extending.md.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar, cast

from ..core.errors import MetricUnavailable
from ..core.text import Repairs
from ..core.types import JudgeResult, Row
from ..llm.backends import Backend
from .offline_evidence import OfflineEvidence

if TYPE_CHECKING:
    from ..llm.client import JudgeClient

__all__ = [
    "MetricSpec",
    "Needs",
    "Outputs",
    "Scores",
    "Estimate",
    "RunContext",
    "RunSettings",
    "Finish",
    "Option",
    "Prepared",
    "MetricUnavailable",
    "register_metric",
    "get_metric",
    "metric_names",
    "option_keys",
    "validate_options",
    "recorded_options",
]

#: a metric's state for one run: what its ``setup`` hook builds (a judge object ...) and its other hooks receive
StateT = TypeVar("StateT")
T = TypeVar("T")

#: one row's results: one :class:`JudgeResult` for the metric's own name, or one per output
Scores = JudgeResult | dict[str, JudgeResult]


class Estimate(TypedDict):
    """One row's cost with nothing sent (``dry_run``): judge calls and rough token counts."""

    calls: int
    input_tokens: int
    output_tokens: int


class RunSettings(Protocol):
    """What a metric reads of the run's configuration: a few keys of the run's own, the data's column names, and
    the metrics' options as the user gave them (read each through its :class:`Option`: ``TURNS.read(settings)``).
    The engine's :class:`~mlflow_ragjudge.engine.config.RagJudgeConfig` is one; the metrics never import it (it
    sits a layer above them, since it validates their options)."""

    @property
    def judge(self) -> str | Backend | None: ...

    @property
    def language(self) -> str: ...

    @property
    def context_mode(self) -> str | list[str]: ...

    @property
    def retriever(self) -> Callable[[str], Any] | None: ...

    @property
    def relevance_threshold(self) -> float: ...

    @property
    def progress(self) -> bool | str: ...

    @property
    def options(self) -> Mapping[str, object]:
        """The metrics' option keys the user gave, by key, as given (validated by every metric declaring them)."""
        ...

    def column(self, logical: str) -> str:
        """The data's column for a logical column (``question`` ...), after ``col_mapping``."""
        ...


@dataclass(frozen=True)
class Option(Generic[T]):
    """A setting of one metric, given in the evaluator config (``evaluator_config``, ``--config``, scorer keyword
    arguments) like any other key; the metric declares it in its spec, with its default and its check, and reads it
    with :meth:`read`.

    Options are per metric: each metric validates a key it declares with its own :class:`Option` and, when the key
    is not given, reads its own default. The user's config has one flat set of keys, so two metrics that declare
    the same key (correctness and multi-turn both declare ``max_context_chars``) both read it from that one key; a
    value either metric refuses is an error naming that metric. A key no registered metric declares is an error.

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
    default: T
    accepts: Callable[[Any], bool] = lambda v: True
    what: str = ""
    example: str = ""
    normalize: Callable[[Any], T] | None = None
    check: Callable[[T], None] | None = None
    public: Callable[[T], object] | None = None

    def validate(self, value: object, metric: str = "") -> T:
        """The value as the metric reads it, or a ``ValueError`` naming the key, the metric, the value and the fix."""
        if not self.accepts(value):
            shown = repr(value) if not callable(value) else type(value).__name__
            of = f" for metric {metric!r}" if metric else ""
            raise ValueError(f"Config {self.name}={shown[:80]} is not valid{of}: it must be {self.what}, e.g. "
                             f"{self.name}={self.example}.")
        out = self.normalize(value) if self.normalize is not None else cast(T, value)
        if self.check is not None:
            self.check(out)
        return out

    def read(self, settings: RunSettings) -> T:
        """This option's value in a run: the user's value (normalized), else this option's default (a copy)."""
        return self.read_from(settings.options)

    def read_from(self, given: Mapping[str, object]) -> T:
        """This option's value among the option keys given: the value (normalized), else the default (a copy)."""
        if self.name in given:
            value = given[self.name]
            return self.normalize(value) if self.normalize is not None else cast(T, value)
        return copy.deepcopy(self.default)

    def recorded(self, value: T) -> object:
        if self.public is not None:
            return self.public(value)
        if callable(value):
            return getattr(value, "__name__", type(value).__name__)
        return value


@dataclass
class Prepared:
    """What a metric's ``prepare`` hook found out about the run, before any judge call: entries for the run record
    (``ragjudge/config.json``) and MLflow params."""

    record: dict[str, object] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


@dataclass
class Finish:
    """What a metric adds once all its rows are scored."""

    metrics: dict[str, float] = field(default_factory=dict)  # logged as they are
    #: counts logged as they are that add up over parts of the data (an evaluation split over partitions sums them)
    counts: dict[str, float] = field(default_factory=dict)
    columns: dict[str, list[object]] = field(default_factory=dict)  # extra per-row table columns
    artifacts: dict[str, list[dict[str, object]]] = field(default_factory=dict)  # JSONL artifacts
    skipped: dict[str, str] = field(default_factory=dict)


Requirement = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Outputs:
    """What a metric produces per row, and how the results are shown.

    Attributes:
        names: the results per row (a name ending in ``_`` is a prefix, for families such as ``precision_at_``);
            default: just the metric's name. Each is logged as ``<output>/mean`` ...
        levels: the outputs on the six-level scale (the engine logs their level shares
            ``<output>/share_level_<n>`` and shows level 0 as 0).
        scale: the (lowest, highest) value of the outputs not on the six-level scale (human labels given with
            ``human_labels`` must lie in it); None when there is no fixed range. Outputs in ``levels`` are on 1..5.
        headline: the first output is the per-row table's headline score (shown first).
        columns: extra per-row table columns: column name -> function of one row's results.
    """

    names: tuple[str, ...] = ()
    levels: tuple[str, ...] = ()
    scale: tuple[float, float] | None = (0.0, 1.0)
    headline: bool = False
    columns: Mapping[str, Callable[[dict[str, JudgeResult]], object]] = field(default_factory=dict)


@dataclass(frozen=True)
class Needs:
    """What a metric needs of a run besides its columns (``MetricSpec.requires``).

    Attributes:
        embeddings: the run's embeddings (``RunContext.embed``).
        text: the text columns every row must fill; default: the text columns of ``requires[0]``.
        sentences: the row's texts (``Row`` fields: ``contexts``, ``answer``, ``reference``, ``references``) it
            reads sentence by sentence. When a run is scored on one worker (the offline judge, metrics without a
            judge), the engine cuts them into sentences once per row before the row's metrics run
            (:func:`~mlflow_ragjudge.core.matching.cut_by_sentence`), so that every metric reading those texts
            reads one cut instead of cutting the text whole and again by sentence. Changes no result.
        synchronous: its judge calls must be answered one after another, never through the provider's batch API
            (multi-turn: each turn needs the last).
    """

    embeddings: bool = False
    text: tuple[str, ...] | None = None
    sentences: tuple[str, ...] = ()
    synchronous: bool = False


@dataclass(frozen=True)
class MetricSpec(Generic[StateT]):
    """One metric: what the engine needs to run it without knowing its name.

    ``StateT`` is the metric's state for a run (what ``setup`` builds, a judge object ...; None without ``setup``);
    every per-row hook receives it with the :class:`~mlflow_ragjudge.core.types.Row` and the :class:`RunContext`.

    Attributes:
        name: the metric's name (``metrics=[...]``); its results are logged as ``<output>/mean`` ...
        requires: alternatives of logical columns that together let it run (the first is the one named in
            errors), or a function of the config returning them.
        judged: it calls the judge model (needs ``judge``; abstain and error rates are logged and failures
            reported).
        setup: builds the metric's state for a run (a judge object ...), before any call; may raise
            :class:`MetricUnavailable` or an input error.
        score: one row -> :data:`Scores` (one JudgeResult for ``name``, or ``{output name: JudgeResult}``); never
            raises for model failures (an exception is recorded as the row's ``internal_error``).
        score_batch: all rows at once (for batched models such as BERTScore), instead of ``score``.
        estimate: one row's :class:`Estimate` with nothing sent.
        offline: how the offline judge (``offline:/lexical``, :mod:`mlflow_ragjudge.metrics.offline`) scores one
            row of a judged metric: ``(OfflineEvidence, row, ctx) -> Scores``; or, when it cannot, why not (the
            metric is then skipped under the offline judge with that reason).
        options: the metric's own settings (:class:`Option`), given in the evaluator config with the run's.
        outputs: what it produces per row and how it is shown (:class:`Outputs`).
        needs: what it needs besides its columns (:class:`Needs`).
        default: runs by default when its columns are there (a function of the config may say no).
        check: a reason it cannot run with this config, or None (asked for by name: an input error).
        prepare: run-level work on the rows before any call and before ``setup`` (the judge contexts and their E3
            retrieval, :func:`mlflow_ragjudge.metrics.contexts.prepare_judge_contexts`); returns what to record
            (:class:`Prepared`). Metrics that share the work share the function, which does it once per run.
        validate: checks the rows before any call (raise an input error naming the row and the fix).
        finish: run-level metrics, columns, artifacts and skips once all rows are scored.
        prompt_versions: the prompt versions its state uses.
        record: entries for the run's config record (``ragjudge/config.json``).
        params: extra MLflow params.
        description: one line for ``ragjudge metrics`` and the docs.
    """

    name: str
    requires: Requirement | Callable[[RunSettings], Requirement]
    judged: bool = False
    setup: Callable[[RunContext], StateT] | None = None
    score: Callable[[StateT, Row, RunContext], Scores] | None = None
    score_batch: Callable[[StateT, Sequence[Row], RunContext], list[dict[str, JudgeResult]]] | None = None
    estimate: Callable[[StateT, Row, RunContext], Estimate] | None = None
    offline: Callable[[OfflineEvidence, Row, RunContext], Scores] | str = "it needs a language model"
    options: tuple[Option[Any], ...] = ()
    outputs: Outputs = Outputs()
    needs: Needs = Needs()
    default: bool | Callable[[RunSettings], bool] = True
    check: Callable[[RunSettings], str | None] | None = None
    prepare: Callable[[RunContext], Prepared | None] | None = None
    validate: Callable[[Sequence[Row], RunSettings], None] | None = None
    finish: Callable[[StateT, Sequence[Row], list[dict[str, JudgeResult]], RunContext], Finish] | None = None
    prompt_versions: Callable[[StateT], dict[str, str]] | None = None
    record: Callable[[StateT, RunContext], dict[str, object]] | None = None
    params: Callable[[StateT, RunContext], dict[str, str]] | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if (self.score is None) == (self.score_batch is None):
            raise ValueError(f"metric {self.name!r}: give exactly one of score= and score_batch=")
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"metric name {self.name!r}: use letters, digits and underscores")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"metric {self.name!r}: an option is declared twice ({names})")

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.outputs.names or (self.name,)

    def option(self, name: str) -> Option[Any]:
        """This metric's option ``name``; a ``KeyError`` naming the metric and its options when it has none."""
        for opt in self.options:
            if opt.name == name:
                return opt
        known = ", ".join(o.name for o in self.options) or "none"
        raise KeyError(f"metric {self.name!r} has no option {name!r} (its options: {known})")

    def requirements(self, cfg: RunSettings) -> Requirement:
        return self.requires(cfg) if callable(self.requires) else self.requires

    def text_columns(self, cfg: RunSettings) -> tuple[str, ...]:
        if self.needs.text is not None:
            return self.needs.text
        return tuple(c for c in self.requirements(cfg)[0] if c in ("question", "answer", "reference"))

    def runs_by_default(self, cfg: RunSettings) -> bool:
        return self.default(cfg) if callable(self.default) else self.default

    def offline_reason(self) -> str | None:
        """Why the offline judge cannot score this metric, or None when it can (or the metric needs no judge)."""
        if not self.judged or callable(self.offline):
            return None
        return (f"the offline judge (offline:/lexical, not an LLM) cannot score '{self.name}': "
                f"{self.offline}; set judge='openai:/gpt-4o-mini' (or any judge URI) to run it")

    def for_offline_judge(self) -> MetricSpec[Any]:
        """This metric as the offline judge runs it: its offline scorer, the run's one :class:`OfflineEvidence` as
        state, no judge calls (so a zero estimate) and the calibration as its prompt version. A metric that needs
        no judge is returned as it is.

        Raises:
            ValueError: the offline judge cannot score this metric (:meth:`offline_reason`).
        """
        if not self.judged:
            return self
        reason = self.offline_reason()
        if reason is not None or not callable(self.offline):
            raise ValueError(reason)
        offline: MetricSpec[OfflineEvidence] = dataclasses.replace(
            cast("MetricSpec[Any]", self), setup=_offline_setup, score=self.offline, score_batch=None,
            needs=dataclasses.replace(self.needs, embeddings=False), estimate=_no_calls,
            prompt_versions=lambda judge: {"offline_judge": judge.version},
        )
        return offline

    def scale_of(self, output: str) -> tuple[float, float] | None:
        """The range of one output's values: 1..5 on the six-level scale, else ``outputs.scale``."""
        if any(output == lv or (lv.endswith("_") and output.startswith(lv)) for lv in self.outputs.levels):
            return (1.0, 5.0)
        return self.outputs.scale

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
    _shared: dict[str, object] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def has_column(self, logical: str) -> bool:
        """Whether the data has the column a logical name maps to (``col_mapping``)."""
        return self.cfg.column(logical) in self.columns

    def has_raw_columns(self, *names: str) -> bool:
        return set(names) <= self.columns

    def shared(self, key: str, factory: Callable[[], T]) -> T:
        """The run's one object under ``key``, built by ``factory`` on first use (thread-safe)."""
        with self._lock:
            if key not in self._shared:
                self._shared[key] = factory()
            return cast(T, self._shared[key])

    def shared_now(self) -> dict[str, object]:
        """A copy of the run's shared objects as they are now."""
        with self._lock:
            return dict(self._shared)

    def for_client(self, client: JudgeClient, shared: dict[str, object]) -> RunContext:
        """This run's context for another judge (or another draw of one): the same config, rows and embeddings,
        ``client`` instead, and ``shared`` (what was built before any client) instead of what this one shared since
        -- so each judge's metrics build their own judge objects around their own client."""
        return dataclasses.replace(self, client=client, _shared=dict(shared), _lock=threading.RLock())

    @property
    def judge_client(self) -> JudgeClient:
        if self.client is None:
            raise RuntimeError("this metric needs a judge client")
        return self.client


def _offline_setup(ctx: RunContext) -> OfflineEvidence:
    return ctx.shared("offline_judge", OfflineEvidence)


def _no_calls(state: object, row: Row, ctx: RunContext) -> Estimate:
    return {"calls": 0, "input_tokens": 0, "output_tokens": 0}


#: every registered metric by name; their states differ, so the registry holds them as MetricSpec[Any]
_REGISTRY: dict[str, MetricSpec[Any]] = {}
_LOCK = threading.RLock()


def register_metric(spec: MetricSpec[StateT], *, replace: bool = False) -> MetricSpec[StateT]:
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


def get_metric(name: str) -> MetricSpec[Any]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"Unknown metric {name!r}. Known metrics: {', '.join(metric_names())}.") from None


def metric_names() -> tuple[str, ...]:
    """Every registered metric, built-in ones first, in run order."""
    return tuple(_REGISTRY)


def all_specs() -> list[MetricSpec[Any]]:
    return list(_REGISTRY.values())


def option_keys() -> dict[str, list[tuple[str, Option[Any]]]]:
    """Every option key the registered metrics declare -> ``(metric, its Option)`` for each metric declaring it,
    in registration order."""
    out: dict[str, list[tuple[str, Option[Any]]]] = {}
    for spec in all_specs():
        for opt in spec.options:
            out.setdefault(opt.name, []).append((spec.name, opt))
    return out


def validate_options(given: Mapping[str, object]) -> None:
    """Check every given option key with each metric that declares it (its own ``Option``: type, range, check).

    Raises:
        ValueError: a key no registered metric declares, or a value one of its metrics refuses (naming the key,
            the metric, the value and the fix).
    """
    keys = option_keys()
    for name, value in given.items():
        if name not in keys:
            raise ValueError(f"Unknown ragjudge config key {name!r}: no registered metric declares it.")
        for metric, opt in keys[name]:
            opt.validate(value, metric)


def recorded_options(given: Mapping[str, object]) -> dict[str, object]:
    """Every option key's value as recorded in the run's params: the given value, else the default, as the first
    metric declaring the key reads and records it (metrics that share a key are expected to share its default)."""
    out: dict[str, object] = {}
    for name, owners in option_keys().items():
        opt = owners[0][1]
        out[name] = opt.recorded(opt.read_from(given))
    return out
