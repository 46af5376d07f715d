"""Evaluation configuration: one flat set of keys shared by the MLflow evaluator
(``evaluator_config``), the CLI and :func:`mlflow_ragjudge.evaluate_frame`.

Unknown keys are an error that lists the valid ones, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.constants import CONTEXT_MODES, CONTEXT_PROVENANCE, ESCALATE_WHEN, LOGICAL_COLUMNS, PANEL_RULES
from ..core.values import is_int, is_number, is_str_list
from ..llm.backends import Backend, safe_judge_uri
from ..llm.batch import BatchOptions
from ..metrics.spec import metric_names, option_keys, recorded_options, validate_options

__all__ = ["RagJudgeConfig", "LOGICAL_COLUMNS", "CONTEXT_MODES", "CONTEXT_PROVENANCE"]


#: key -> (accepts the value?, what it must be, an example); None is allowed where the default is None
_TYPE_RULES: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "judge": (lambda v: v is None or isinstance(v, (str, Backend)) or (
        isinstance(v, (list, tuple)) and len(v) >= 1 and all(isinstance(x, (str, Backend)) for x in v)),
              "a judge URI (str), a Backend object, or a list of them (a panel)",
              "'openai:/gpt-4o-mini' or ['openai:/gpt-4o-mini', 'anthropic:/claude-haiku-4-5']"),
    "metrics": (lambda v: v is None or isinstance(v, str) or is_str_list(v), "a list of metric names",
                "['correctness', 'faithfulness']"),
    "context_mode": (lambda v: isinstance(v, str) or (isinstance(v, (list, tuple)) and len(v) >= 1 and all(
        isinstance(x, str) for x in v)), "one of " + ", ".join(CONTEXT_MODES) + ", or a list of them",
        "'reference' or ['generation', 'reference']"),
    "col_mapping": (lambda v: isinstance(v, dict) and all(isinstance(a, str) and isinstance(b, str) and b
                                                          for a, b in v.items()),
                    "a dict {logical column: your column name}", "{'question': 'query'}"),
    "group_column": (lambda v: v is None or (isinstance(v, str) and bool(v)), "a column name", "'product'"),
    "human_columns": (lambda v: isinstance(v, str) or is_str_list(v), "a list of column names", "['expert']"),
    "human_labels": (lambda v: isinstance(v, dict) and all(isinstance(a, str) and a and isinstance(b, str) and b
                                                           for a, b in v.items()),
                     "a dict {metric: column of human labels on that metric's scale}",
                     "{'correctness': 'human_correctness'}"),
    "human_not_sure": (lambda v: v is None or v == "auto" or (isinstance(v, (list, tuple)) and all(
        is_number(x) for x in v)), "'auto', a list of numbers, or None", "[0]"),
    "language": (lambda v: isinstance(v, str) and bool(v), "a language code", "'en' or 'ja'"),
    "max_concurrency": (lambda v: v is None or (is_int(v) and v >= 1),
                        "a whole number >= 1 (calls in flight per provider)", "8"),
    "requests_per_minute": (lambda v: v is None or (is_number(v) and v >= 0),
                            "a number >= 0 (0 turns pacing off)", "500"),
    "shared_pace": (lambda v: v is None or (isinstance(v, (str, os.PathLike)) and bool(str(v))),
                    "None or the path of a pace file every process of the job can write",
                    "'/shared/ragjudge.pace'"),
    "cache": (lambda v: isinstance(v, (bool, str, os.PathLike)),
              "True, False, or a cache directory / file path", "True or '/tmp/ragjudge-cache'"),
    "timeout": (lambda v: is_number(v) and v > 0, "a number of seconds > 0", "60"),
    "max_attempts": (lambda v: is_int(v) and v >= 1, "a whole number >= 1", "6"),
    "relevance_threshold": (lambda v: is_number(v) and v >= 0, "a finite number >= 0 (trec_eval -l)", "1"),
    "n_boot": (lambda v: is_int(v) and v >= 0, "a whole number >= 0 (bootstrap resamples)", "1000"),
    "seed": (lambda v: is_int(v), "a whole number", "0"),
    "embeddings": (lambda v: callable(v) or (isinstance(v, str) and bool(v)),
                   "'auto', 'local', an embeddings URI or a callable", "'openai:/text-embedding-3-small'"),
    "dry_run": (lambda v: isinstance(v, bool), "True or False", "True"),
    "gate_rule": (lambda v: v in ("interval", "point"), "'interval' or 'point'", "'interval'"),
    "traces": (lambda v: is_int(v) and v >= 0, "a whole number >= 0 (0 = no traces)", "2000"),
    "batch": (lambda v: isinstance(v, (bool, dict)), "True, False, or a dict of batch options",
              "True or {'poll_interval': 30}"),
    "repeats": (lambda v: is_int(v) and 1 <= v <= 100, "a whole number from 1 to 100 (judge draws per row)", "3"),
    "repeat_temperature": (lambda v: v is None or (is_number(v) and 0 <= v <= 2),
                           "None (the metric's own temperature) or a number from 0 to 2", "1.0"),
    "panel_rule": (lambda v: v in PANEL_RULES, "one of " + ", ".join(PANEL_RULES), "'majority'"),
    "escalate_to": (lambda v: v is None or isinstance(v, (str, Backend)),
                    "a judge URI (str) or a Backend object", "'openai:/gpt-4o'"),
    "escalate_when": (lambda v: isinstance(v, (list, tuple)) and len(v) >= 1 and all(x in ESCALATE_WHEN for x in v),
                      "a list of " + ", ".join(ESCALATE_WHEN), "['abstain', 'threshold']"),
}


def _check_types(cfg: RagJudgeConfig) -> None:
    for key, (ok, what, example) in _TYPE_RULES.items():
        value = getattr(cfg, key)
        if not ok(value):
            shown = repr(value) if not callable(value) else type(value).__name__
            raise ValueError(f"Config {key}={shown[:80]} is not valid: it must be {what}, e.g. {key}={example}.")


@dataclass
class RagJudgeConfig:
    """All settings of one evaluation.

    Attributes:
        judge: judge model URI (``openai:/gpt-4o-mini``) or a Backend object.
        metrics: metric names; default: every built metric the data's columns support.
        context_mode: what the correctness judge sees: ``reference`` (E3), ``generation``
            (E2), ``evidence`` (a test set's quoted evidence), ``gold``, ``none``, or ``auto``
            (reference when a retriever or a ``reference_contexts`` column is there, else
            generation when there are contexts, else evidence, else none). Recorded with its
            provenance per row and per run. A list (e.g. ``["generation", "reference"]``) judges
            correctness once per mode in the same run, logged as ``correctness_<mode>``.
        retriever: ``query -> passages`` callable for E3 (passages as str, or dicts
            with ``text`` and optional ``id``, or ``(id, text)`` pairs).
        col_mapping: logical column -> the data's column name.
        group_column: column for per-group metrics (default: ``group`` when present).
        human_columns: columns of human scores to correlate with every metric of the run (meta-evaluation), e.g.
            one overall human rating.
        human_labels: metric -> column of human labels of that metric, on its own scale, empty where a row is
            unlabelled: gives human-calibrated estimates (``<metric>/ppi_mean`` and its interval, from a random
            sample of labelled rows, :mod:`mlflow_ragjudge.engine.ppi`) and the meta-evaluation of that metric against
            that column. Use it when humans labelled the metric itself; ``human_columns`` for a rating that is
            not one metric's.
        human_not_sure: human scores that mean "not sure", left out of meta-evaluation as the paper's expert
            mean leaves them out: ``"auto"`` (0 in a column on the six-level scale, i.e. whole numbers 0..5
            reaching 2 or more; nothing in a 0/1 or continuous column), a list of values, or ``None`` (keep all).
        language: judge prompt language (``en``, ``ja``).
        max_concurrency: a cap on this run's judge calls in flight (default: none; the provider connection's
            adaptive limit, or the one set with ``configure_provider``, bounds every run).
        requests_per_minute: pace judge calls to a provider's rate limit.
        shared_pace: a pace file: every process (job, Spark task) that names it paces ``requests_per_minute``
            together (``mlflow_ragjudge.llm.shared_pace``); default ``$RAGJUDGE_SHARED_PACE``, and on Spark one
            the job picks (docs/scaling.md).
        cache: True (default on-disk cache), False, or a cache directory/file path.
        timeout: seconds per judge request.
        max_attempts: attempts per judge request.
        relevance_threshold: grade at which a document counts as relevant (trec_eval -l).
        n_boot, seed: bootstrap resamples and seed for meta-evaluation intervals.
        embeddings: for answer relevancy: ``auto`` (the local MiniLM when installed), ``local``, an
            embeddings URI (``openai:/text-embedding-3-small``), or a callable ``texts -> vectors``.
        dry_run: estimate judge calls and tokens per metric, call nothing.
        progress: a progress bar per judged metric on stderr: ``auto`` (on a terminal), True, False.
        max_error_rate: a judged metric that fails on more than this share of its rows is reported
            loudly: a warning naming the failure reasons and the likely fix, a run tag, and a non-zero
            exit of ``ragjudge evaluate`` (docs/judge-client.md). Default 0.2.
        fail_under: ``{metric: threshold}`` quality gate, e.g. ``{"correctness": 3.5}`` (a bare name
            means ``<name>/mean``; a full metric name such as ``faithfulness/mean/<group>`` works too).
            The outcome is recorded on the run; ``ragjudge evaluate --fail-under`` exits non-zero when
            a threshold is not met (4) or not decided (6), see ``gate_rule``.
        gate_rule: how ``fail_under`` decides: ``interval`` (default) passes when the 95 % interval of the mean
            lies at or above the threshold, fails when it lies below, and is undecided in between (with how many
            more rows or repeats would decide it); ``point`` compares the mean alone, as before
            (docs/judge-client.md#gates-on-intervals).
        repeats: judge every judged call this many times, as independent draws (each its own seed, and
            ``repeat_temperature`` when set; each its own cache entry, so a re-run is free): per row the draws'
            combination (``panel_rule``) and their spread, per output the flip rate and the judge's share of the
            variance (docs/judge-noise.md). Default 1.
        repeat_temperature: the temperature of the repeated draws; None (default) keeps each metric's own (0), so
            the draws measure the noise of the judge as it is configured.
        panel_rule: how a row's draws and a panel's judges are combined: ``auto`` (default: majority on six-level
            outputs, mean elsewhere), ``mean``, ``majority``, ``median``. A judge given as a list (``judge=[uri,
            uri, ...]``) is a panel: every judge scores every row, each judge's scores are kept and their agreement
            (Fleiss' kappa, Krippendorff's alpha) is logged.
        escalate_to: a second judge for the rows the first is unsure about (the cheap-first cascade): the rows it
            abstains on, whose repeated draws disagree, or whose score sits at a ``fail_under`` threshold
            (``escalate_when``); the second judge's verdict replaces the first's on those rows.
        escalate_when: which rows the cascade escalates: any of ``abstain``, ``spread``, ``threshold`` (default all).
        traces: the most rows logged as MLflow traces (each with its metrics as assessments) into the run
            by the ``ragjudge`` evaluator, ``ragjudge evaluate`` and sweeps; beyond it a seeded uniform
            sample (``seed``), and 0 logs none. Default 2000.
    """

    judge: str | Backend | None = None
    metrics: list[str] | None = None
    context_mode: str | list[str] = "auto"
    retriever: Callable[[str], Any] | None = None
    col_mapping: dict[str, str] = field(default_factory=dict)
    group_column: str | None = None
    human_columns: list[str] = field(default_factory=list)
    human_labels: dict[str, str] = field(default_factory=dict)
    human_not_sure: Any = "auto"
    language: str = "en"
    max_concurrency: int | None = None
    requests_per_minute: float | None = None
    shared_pace: str | None = None
    cache: bool | str = True
    timeout: float = 60.0
    max_attempts: int = 6
    relevance_threshold: float = 1
    n_boot: int = 1000
    seed: int = 0
    embeddings: Any = "auto"
    dry_run: bool = False
    progress: bool | str = "auto"
    max_error_rate: float = 0.2
    fail_under: dict[str, float] = field(default_factory=dict)
    gate_rule: str = "interval"
    batch: bool | dict[str, Any] = False
    traces: int = 2000
    repeats: int = 1
    repeat_temperature: float | None = None
    panel_rule: str = "auto"
    escalate_to: str | Backend | None = None
    escalate_when: list[str] = field(default_factory=lambda: list(ESCALATE_WHEN))
    #: the judges of a panel (``judge`` given as a list: its first is ``judge``); empty for one judge
    panel: list[str | Backend] = field(default_factory=list)
    #: the metrics' own settings given (every key a registered metric declares, :class:`~.metrics.spec.Option`), as
    #: given; each metric reads its own through its Option (``Option.read(cfg)``: the value, else its default)
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None) -> RagJudgeConfig:
        cfg = dict(cfg or {})
        names = [f.name for f in dataclasses.fields(cls) if f.name not in ("options", "panel")]
        opts = option_keys()
        given_options = {**dict(cfg.pop("options", None) or {}), **{k: cfg.pop(k) for k in list(cfg) if k in opts}}
        unknown = sorted(set(cfg) - set(names))
        if unknown:
            hint = ""
            if "ragjudge" in unknown:
                hint = (
                    " (a nested {'ragjudge': {...}} config is for evaluators=[...] lists; with "
                    "evaluators='ragjudge' the config is flat)"
                )
            raise ValueError(f"Unknown ragjudge config key(s) {unknown}{hint}. Valid keys: {', '.join(names)}; and "
                             f"the metrics' own: {', '.join(opts)}.")
        out = cls(**cfg, options=given_options)
        out.validate()
        return out

    def validate(self) -> None:
        """Check every setting's type and range; raise ``ValueError`` naming the key, the value and the fix.

        Called by :meth:`from_dict`, so the evaluator, the CLI and ``evaluate_frame`` refuse a bad
        setting before any data is read or any judge call is made.
        """
        _check_types(self)
        self._check_judges()
        if isinstance(self.context_mode, (list, tuple)):
            modes = list(dict.fromkeys(self.context_mode))
            bad = [m for m in modes if m not in CONTEXT_MODES or m == "auto"]
            if bad:
                raise ValueError(f"context_mode={self.context_mode!r}: {bad} not allowed in a list; use several of "
                                 f"{', '.join(m for m in CONTEXT_MODES if m != 'auto')}, e.g. ['generation', "
                                 "'reference'] for the paper's E2 vs E3 in one run.")
            self.context_mode = modes[0] if len(modes) == 1 else modes
        elif self.context_mode not in CONTEXT_MODES:
            raise ValueError(f"context_mode={self.context_mode!r} is not one of {CONTEXT_MODES}.")
        if self.metrics is not None:
            if isinstance(self.metrics, str):
                self.metrics = [self.metrics]

            known = metric_names()
            bad = [m for m in self.metrics if m not in known]
            if bad:
                raise ValueError(f"Unknown metric(s) {bad}. Known metrics: {', '.join(known)}.")
        if self.retriever is not None and not callable(self.retriever):
            raise ValueError("retriever must be a callable: query (str) -> list of passages.")
        bad_cols = sorted(set(self.col_mapping) - set(LOGICAL_COLUMNS))
        if bad_cols:
            raise ValueError(
                f"col_mapping has unknown logical column(s) {bad_cols}; map from one of "
                f"{', '.join(LOGICAL_COLUMNS)} to your column name, e.g. {{'question': 'query'}}."
            )
        if isinstance(self.human_columns, str):
            self.human_columns = [self.human_columns]
        if self.progress not in ("auto", True, False):
            raise ValueError(f"progress={self.progress!r}: use 'auto', True or False.")
        if isinstance(self.max_error_rate, bool) or not isinstance(self.max_error_rate, (int, float)) or not (
                0 <= self.max_error_rate <= 1):
            raise ValueError(f"max_error_rate={self.max_error_rate!r} must be a share between 0 and 1, e.g. 0.2.")
        if not isinstance(self.fail_under, dict):
            raise ValueError(f"fail_under={self.fail_under!r} must be a dict {{metric: threshold}}, "
                             "e.g. {'correctness': 3.5}.")
        for name, threshold in self.fail_under.items():
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"fail_under has a bad metric name {name!r}; use e.g. 'correctness' or "
                                 "'faithfulness/mean'.")
            if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold != threshold:
                raise ValueError(f"fail_under[{name!r}]={threshold!r} must be a number, e.g. 3.5.")

        if self.batch:
            BatchOptions.of(self.batch)  # unknown options are refused here
        validate_options(self.options)  # each key by every metric declaring it; kept as given

    def _check_judges(self) -> None:
        """A judge list becomes a panel (``judge`` its first); repeats and panels need LLM judges; a cascade
        starts from one judge."""
        if isinstance(self.judge, (list, tuple)):
            judges = list(self.judge)
            self.judge, self.panel = judges[0], judges if len(judges) > 1 else []
        offline = [j for j in [self.judge, *self.panel, self.escalate_to] if isinstance(j, str) and
                   j.startswith("offline:")]
        if offline and (self.repeats > 1 or self.panel or self.escalate_to is not None):
            raise ValueError(f"judge {offline[0]!r} is the offline judge: it is deterministic (repeats would all "
                             "agree) and its metrics are its own, so it cannot take part in repeats, a panel or a "
                             "cascade; use LLM judges there, e.g. judge=['openai:/gpt-4o-mini', "
                             "'anthropic:/claude-haiku-4-5'].")
        if self.panel and self.escalate_to is not None:
            raise ValueError("escalate_to (a cascade) starts from one judge, but judge is a panel of "
                             f"{len(self.panel)}; give one judge with escalate_to, or a panel without it.")
        if isinstance(self.escalate_when, tuple):
            self.escalate_when = list(self.escalate_when)

    def as_dict(self) -> dict[str, Any]:
        """Every setting as given (the inverse of :meth:`from_dict`): the run's keys and the metrics' options."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("options", "panel")}
        if self.panel:
            out["judge"] = list(self.panel)
        return {**out, **self.options}

    def column(self, logical: str) -> str:
        return self.col_mapping.get(logical, logical)

    def public_params(self) -> dict[str, Any]:
        """Settings safe to log as params (no callables' internals, no secrets): the run's keys and every
        registered metric's options (given or default)."""
        out = {
            "judge": safe_judge_uri(self.judge),  # never the credentials of a base_url
            "metrics": self.metrics,
            "context_mode": self.context_mode,
            "retriever": getattr(self.retriever, "__name__", type(self.retriever).__name__)
            if self.retriever is not None
            else None,
            "col_mapping": self.col_mapping,
            "group_column": self.group_column,
            "human_columns": self.human_columns,
            "human_labels": dict(self.human_labels),
            "language": self.language,
            "max_concurrency": self.max_concurrency,
            "requests_per_minute": self.requests_per_minute,
            "shared_pace": self.shared_pace is not None,
            "cache": bool(self.cache),
            "timeout": self.timeout,
            "relevance_threshold": self.relevance_threshold,
            "n_boot": self.n_boot,
            "seed": self.seed,
            "embeddings": safe_judge_uri(self.embeddings) if isinstance(self.embeddings, str) else "callable",
            "dry_run": self.dry_run,
            "max_error_rate": self.max_error_rate,
            "traces": self.traces,
            "fail_under": dict(self.fail_under),
            "gate_rule": self.gate_rule,
            "batch": self.batch,
            "repeats": self.repeats,
            "repeat_temperature": self.repeat_temperature,
            "panel_rule": self.panel_rule,
            "panel": [safe_judge_uri(j) for j in self.panel],
            "escalate_to": safe_judge_uri(self.escalate_to) if self.escalate_to is not None else None,
            "escalate_when": list(self.escalate_when),
        }
        out.update(recorded_options(self.options))
        return out
