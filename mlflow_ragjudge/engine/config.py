"""Evaluation configuration: one flat set of keys shared by the MLflow evaluator
(``evaluator_config``), the CLI and :func:`mlflow_ragjudge.evaluate_frame`.

Unknown keys are an error that lists the valid ones, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.constants import CONTEXT_MODES, CONTEXT_PROVENANCE, LOGICAL_COLUMNS
from ..llm.backends import Backend, safe_judge_uri
from ..llm.batch import BatchOptions
from ..metrics.checks import check_output_schema
from ..metrics.retrieval import validate_ks
from ..metrics.spec import metric_names

__all__ = ["RagJudgeConfig", "LOGICAL_COLUMNS", "CONTEXT_MODES", "CONTEXT_PROVENANCE"]


def __getattr__(name: str) -> Any:
    # ALL_METRICS / BUILT_METRICS: the registered metrics (mlflow_ragjudge.registry), read when asked for, so a
    # metric added with register_metric is known to the config as well
    if name in ("ALL_METRICS", "BUILT_METRICS"):
        return metric_names()
    raise AttributeError(name)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and all(isinstance(x, str) and x for x in v)


#: key -> (accepts the value?, what it must be, an example); None is allowed where the default is None
_TYPE_RULES: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "judge": (lambda v: v is None or isinstance(v, (str, Backend)),
              "a judge URI (str) or a Backend object", "'openai:/gpt-4o-mini'"),
    "metrics": (lambda v: v is None or isinstance(v, str) or _is_str_list(v), "a list of metric names",
                "['correctness', 'faithfulness']"),
    "context_mode": (lambda v: isinstance(v, str) or (isinstance(v, (list, tuple)) and len(v) >= 1 and all(
        isinstance(x, str) for x in v)), "one of " + ", ".join(CONTEXT_MODES) + ", or a list of them",
        "'reference' or ['generation', 'reference']"),
    "col_mapping": (lambda v: isinstance(v, dict) and all(isinstance(a, str) and isinstance(b, str) and b
                                                          for a, b in v.items()),
                    "a dict {logical column: your column name}", "{'question': 'query'}"),
    "group_column": (lambda v: v is None or (isinstance(v, str) and bool(v)), "a column name", "'product'"),
    "human_columns": (lambda v: isinstance(v, str) or _is_str_list(v), "a list of column names", "['expert']"),
    "human_labels": (lambda v: isinstance(v, dict) and all(isinstance(a, str) and a and isinstance(b, str) and b
                                                           for a, b in v.items()),
                     "a dict {metric: column of human labels on that metric's scale}",
                     "{'correctness': 'human_correctness'}"),
    "human_not_sure": (lambda v: v is None or v == "auto" or (isinstance(v, (list, tuple)) and all(
        _is_number(x) for x in v)), "'auto', a list of numbers, or None", "[0]"),
    "language": (lambda v: isinstance(v, str) and bool(v), "a language code", "'en' or 'ja'"),
    "judge_output": (lambda v: isinstance(v, str), "'auto', 'json' or 'prometheus'", "'auto'"),
    "max_context_chars": (lambda v: _is_int(v) and v >= 500, "a whole number of characters >= 500", "12000"),
    "max_concurrency": (lambda v: v is None or (_is_int(v) and v >= 1),
                        "a whole number >= 1 (calls in flight per provider)", "8"),
    "requests_per_minute": (lambda v: v is None or (_is_number(v) and v >= 0),
                            "a number >= 0 (0 turns pacing off)", "500"),
    "cache": (lambda v: isinstance(v, (bool, str, os.PathLike)),
              "True, False, or a cache directory / file path", "True or '/tmp/ragjudge-cache'"),
    "timeout": (lambda v: _is_number(v) and v > 0, "a number of seconds > 0", "60"),
    "max_attempts": (lambda v: _is_int(v) and v >= 1, "a whole number >= 1", "6"),
    "relevance_threshold": (lambda v: _is_number(v) and v >= 0, "a finite number >= 0 (trec_eval -l)", "1"),
    "n_boot": (lambda v: _is_int(v) and v >= 0, "a whole number >= 0 (bootstrap resamples)", "1000"),
    "seed": (lambda v: _is_int(v), "a whole number", "0"),
    "faithfulness_require_retrieval_hit": (lambda v: isinstance(v, bool), "True or False", "True"),
    "faithfulness_evidence_chars": (lambda v: _is_int(v) and v >= 1000, "a whole number of characters >= 1000",
                                    "24000"),
    "embeddings": (lambda v: callable(v) or (isinstance(v, str) and bool(v)),
                   "'auto', 'local', an embeddings URI or a callable", "'openai:/text-embedding-3-small'"),
    "dry_run": (lambda v: isinstance(v, bool), "True or False", "True"),
    "multiturn_turns": (lambda v: _is_int(v) and v >= 2, "a whole number >= 2", "5"),
    "multiturn_require_e3": (lambda v: isinstance(v, bool), "True or False", "False"),
    "batch": (lambda v: isinstance(v, (bool, dict)), "True, False, or a dict of batch options",
              "True or {'poll_interval': 30}"),
    "output_schema": (lambda v: v is None or isinstance(v, dict), "a JSON Schema (dict) the answers must follow",
                      "{'type': 'object', 'required': ['answer']}"),
    "refusal_phrases": (lambda v: v is None or (isinstance(v, str) and bool(v.strip())) or _is_str_list(v),
                        "a refusal phrase or a list of them", "'The documents do not say.'"),
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
            sample of labelled rows, :mod:`mlflow_ragjudge.ppi`) and the meta-evaluation of that metric against
            that column. Use it when humans labelled the metric itself; ``human_columns`` for a rating that is
            not one metric's.
        human_not_sure: human scores that mean "not sure", left out of meta-evaluation as the paper's expert
            mean leaves them out: ``"auto"`` (0 in a column on the six-level scale, i.e. whole numbers 0..5
            reaching 2 or more; nothing in a 0/1 or continuous column), a list of values, or ``None`` (keep all).
        language: judge prompt language (``en``, ``ja``).
        judge_output: ``auto``, ``json`` or ``prometheus``.
        max_context_chars: context budget of the correctness judge.
        max_concurrency: a cap on this run's judge calls in flight (default: none; the provider connection's
            adaptive limit, or the one set with ``configure_provider``, bounds every run).
        requests_per_minute: pace judge calls to a provider's rate limit.
        cache: True (default on-disk cache), False, or a cache directory/file path.
        timeout: seconds per judge request.
        max_attempts: attempts per judge request.
        k: cut-offs for retrieval metrics (int or list).
        relevance_threshold: grade at which a document counts as relevant (trec_eval -l).
        bertscore: False (default: not computed -- it runs a local transformer over every row), True
            (computed; an input error when the local model is unavailable), ``auto`` (computed when the local
            model is available, else skipped with the reason).
        n_boot, seed: bootstrap resamples and seed for meta-evaluation intervals.
        faithfulness_evidence: ``contexts`` (RAGAS's definition, default) or ``gold`` (the
            ``gold_documents``; seed 001's variant, which then also reflects retrieval quality).
        faithfulness_require_retrieval_hit: score faithfulness only on rows where a relevant
            document was retrieved (needs the doc-id columns); other rows abstain (``retrieval_miss``).
        embeddings: for answer relevancy: ``auto`` (the local MiniLM when installed), ``local``, an
            embeddings URI (``openai:/text-embedding-3-small``), or a callable ``texts -> vectors``.
        answer_relevancy_n: questions generated per response.
        dry_run: estimate judge calls and tokens per metric, call nothing.
        progress: a progress bar per judged metric on stderr: ``auto`` (on a terminal), True, False.
        multiturn_system: for ``multiturn``: the RAG system under test, ``system(query, history) ->
            answer`` (history: earlier ``{"question", "answer"}`` exchanges; the answer a str or a dict
            with ``answer``).
        multiturn_turns: the turn budget n (paper: 5).
        multiturn_final_score: ``append`` (the final judgement is one more element of sigma) or
            ``replace`` (it replaces the last one); see docs/multiturn.md.
        max_error_rate: a judged metric that fails on more than this share of its rows is reported
            loudly: a warning naming the failure reasons and the likely fix, a run tag, and a non-zero
            exit of ``ragjudge evaluate`` (docs/judge-client.md). Default 0.2.
        output_schema: a JSON Schema the answers must follow (the ``output_contract`` check, seed 004); the answer
            must be a JSON document valid against it.
        refusal_phrases: the phrase(s) your system answers with when the context lacks the answer (the
            ``refusal`` check); default: any answer that as a whole declines (the offline judge's rule).
        fail_under: ``{metric: threshold}`` quality gate, e.g. ``{"correctness": 3.5}`` (a bare name
            means ``<name>/mean``; a full metric name such as ``faithfulness/mean/<group>`` works too).
            The outcome is recorded on the run; ``ragjudge evaluate --fail-under`` exits non-zero when
            a threshold is not met.
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
    judge_output: str = "auto"
    max_context_chars: int = 12_000
    max_concurrency: int | None = None
    requests_per_minute: float | None = None
    cache: bool | str = True
    timeout: float = 60.0
    max_attempts: int = 6
    k: int | list[int] = field(default_factory=lambda: [1, 3, 5, 10])
    relevance_threshold: float = 1
    bertscore: bool | str = False
    n_boot: int = 1000
    seed: int = 0
    faithfulness_evidence: str = "contexts"
    faithfulness_require_retrieval_hit: bool = False
    faithfulness_evidence_chars: int = 24_000
    embeddings: Any = "auto"
    answer_relevancy_n: int = 3
    dry_run: bool = False
    progress: bool | str = "auto"
    multiturn_system: Callable[[str, list[dict[str, str]]], Any] | None = None
    multiturn_turns: int = 5
    multiturn_require_e3: bool = True
    multiturn_final_score: str = "append"
    max_error_rate: float = 0.2
    fail_under: dict[str, float] = field(default_factory=dict)
    output_schema: dict[str, Any] | None = None
    refusal_phrases: str | list[str] | None = None
    batch: bool | dict[str, Any] = False

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None) -> RagJudgeConfig:
        cfg = dict(cfg or {})
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(cfg) - set(names))
        if unknown:
            hint = ""
            if "ragjudge" in unknown:
                hint = (
                    " (a nested {'ragjudge': {...}} config is for evaluators=[...] lists; with "
                    "evaluators='ragjudge' the config is flat)"
                )
            raise ValueError(f"Unknown ragjudge config key(s) {unknown}{hint}. Valid keys: {', '.join(names)}.")
        out = cls(**cfg)
        out.validate()
        return out

    def validate(self) -> None:
        """Check every setting's type and range; raise ``ValueError`` naming the key, the value and the fix.

        Called by :meth:`from_dict`, so the evaluator, the CLI and ``evaluate_frame`` refuse a bad
        setting before any data is read or any judge call is made.
        """
        _check_types(self)
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
        if self.judge_output not in ("auto", "json", "prometheus"):
            raise ValueError(f"judge_output={self.judge_output!r} is not one of auto, json, prometheus.")
        if self.bertscore not in ("auto", True, False):
            raise ValueError(f"bertscore={self.bertscore!r}: use 'auto', True or False.")
        if self.faithfulness_evidence not in ("contexts", "gold"):
            raise ValueError(f"faithfulness_evidence={self.faithfulness_evidence!r}: use 'contexts' or 'gold'.")
        if not isinstance(self.answer_relevancy_n, int) or self.answer_relevancy_n < 1:
            raise ValueError(f"answer_relevancy_n={self.answer_relevancy_n!r} must be a whole number >= 1.")
        if self.multiturn_system is not None and not callable(self.multiturn_system):
            raise ValueError("multiturn_system must be a callable: system(query, history) -> answer.")
        if not isinstance(self.multiturn_turns, int) or self.multiturn_turns < 2:
            raise ValueError(f"multiturn_turns={self.multiturn_turns!r} must be a whole number >= 2.")
        if self.multiturn_final_score not in ("append", "replace"):
            raise ValueError(f"multiturn_final_score={self.multiturn_final_score!r}: use 'append' or 'replace'.")
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
        if self.output_schema is not None:
            check_output_schema(self.output_schema)
        if isinstance(self.refusal_phrases, str):
            self.refusal_phrases = [self.refusal_phrases]

        validate_ks(self.k)
        if self.batch:
            BatchOptions.of(self.batch)  # unknown options are refused here

    def as_dict(self) -> dict[str, Any]:
        """Every setting as given (the inverse of :meth:`from_dict`)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def column(self, logical: str) -> str:
        return self.col_mapping.get(logical, logical)

    def public_params(self) -> dict[str, Any]:
        """Settings safe to log as params (no callables' internals, no secrets)."""
        return {
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
            "judge_output": self.judge_output,
            "max_context_chars": self.max_context_chars,
            "max_concurrency": self.max_concurrency,
            "requests_per_minute": self.requests_per_minute,
            "cache": bool(self.cache),
            "timeout": self.timeout,
            "k": self.k,
            "relevance_threshold": self.relevance_threshold,
            "bertscore": self.bertscore,
            "n_boot": self.n_boot,
            "seed": self.seed,
            "faithfulness_evidence": self.faithfulness_evidence,
            "faithfulness_require_retrieval_hit": self.faithfulness_require_retrieval_hit,
            "embeddings": self.embeddings if isinstance(self.embeddings, str) else "callable",
            "answer_relevancy_n": self.answer_relevancy_n,
            "dry_run": self.dry_run,
            "multiturn_system": getattr(self.multiturn_system, "__name__", type(self.multiturn_system).__name__)
            if self.multiturn_system is not None
            else None,
            "multiturn_turns": self.multiturn_turns,
            "multiturn_final_score": self.multiturn_final_score,
            "max_error_rate": self.max_error_rate,
            "fail_under": dict(self.fail_under),
            "output_schema": self.output_schema,
            "refusal_phrases": self.refusal_phrases,
            "batch": self.batch,
        }
