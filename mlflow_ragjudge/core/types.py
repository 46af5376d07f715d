"""Result types shared by every judge and metric.

Every judged value is one of three things (DESIGN point 1):

* **scored** -- the judge produced a value;
* **abstained** -- there was nothing to judge, or the judge said it is not sure
  (level 0 of the six-level rubric, a response with no claims, ...);
* **failed** -- the judge could not produce a value, with a machine-readable
  ``reason`` (``parse_error``, ``timeout``, ``rate_limited``, ``provider_error``,
  ``refused``, ...) and the raw text kept.

Aggregates skip abstained and failed results and report their shares beside the
mean, so a NaN never leaks into a logged metric.
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from itertools import repeat
from operator import add, attrgetter, is_, mul
from typing import Any

from .constants import CONTEXT_PROVENANCE

__all__ = [
    "metric_name_part",
    "metric_name_parts",
    "Status",
    "FailureReason",
    "JudgeResult",
    "Aggregate",
    "aggregate",
    "Row",
]


class Status(str, enum.Enum):
    """The three states of a judged value."""

    SCORED = "scored"
    ABSTAINED = "abstained"
    FAILED = "failed"


class FailureReason(str, enum.Enum):
    """Why a judged value could not be produced."""

    PARSE_ERROR = "parse_error"
    TIMEOUT = "timeout"
    RATE_LIMITED = "rate_limited"
    PROVIDER_ERROR = "provider_error"
    CONNECTION_ERROR = "connection_error"
    REFUSED = "refused"
    INVALID_INPUT = "invalid_input"
    INCONSISTENT = "inconsistent"  # e.g. a verdict list whose length does not match the claims
    AMBIGUOUS = "ambiguous"  # the reply carries two different final verdicts
    INTERNAL_ERROR = "internal_error"
    INTERRUPTED = "interrupted"  # not sent, or not awaited: the evaluation was stopped (Ctrl-C, SIGTERM)


@dataclass(slots=True)
class JudgeResult:
    """One judged value with its evidence. (Slotted: a run keeps one per row and output, some forty per row for
    the offline metrics with retrieval -- made a sixth faster and smaller without a ``__dict__`` each.)

    Attributes:
        status: scored, abstained or failed.
        value: the score when ``status`` is scored, else ``None``.
        rationale: the judge's feedback / explanation (or the failure message).
        reason: for failed results the failure reason code; for abstentions a
            short code such as ``not_sure`` or ``no_claims``.
        raw: the raw model reply that produced this result (kept on failure too).
        details: metric-specific evidence (claims and verdicts, contexts shown, ...).
        calls: transcript records (dicts) of every model call behind this result.
    """

    status: Status
    value: float | None = None
    rationale: str = ""
    reason: str | None = None
    raw: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.status is Status.SCORED:
            if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
                raise ValueError("a scored JudgeResult needs a finite value, not None/NaN")
        elif self.value is not None:
            raise ValueError(f"a {self.status.value} JudgeResult carries no value")

    @classmethod
    def scored(cls, value: float, rationale: str = "", **kw: Any) -> JudgeResult:
        return cls(Status.SCORED, float(value), rationale, **kw)

    @classmethod
    def scored_each(cls, values: Iterable[float]) -> list[JudgeResult]:
        """``[JudgeResult.scored(v) for v in values]`` -- the same results, the same check (a number, not NaN) --
        made without the dataclass's call chain per result (constructor, ``__post_init__``, keyword arguments): a
        metric with many outputs per row (retrieval's 28 document-id measures) makes them at a third of the cost
        (-15 % CPU per row of a retrieval run: docs/scaling.md, "Speed tricks on the main path")."""
        out: list[JudgeResult] = []
        new, scored = object.__new__, Status.SCORED
        for v in values:
            value = float(v)
            if math.isnan(value):
                raise ValueError("a scored JudgeResult needs a finite value, not None/NaN")
            r = new(cls)
            r.status, r.value, r.rationale, r.reason, r.raw, r.details, r.calls = scored, value, "", None, None, {}, []
            out.append(r)
        return out

    @classmethod
    def abstained(cls, reason: str, rationale: str = "", **kw: Any) -> JudgeResult:
        return cls(Status.ABSTAINED, None, rationale, reason=reason, **kw)

    @classmethod
    def failed(cls, reason: FailureReason | str, rationale: str = "", **kw: Any) -> JudgeResult:
        code = reason.value if isinstance(reason, FailureReason) else str(reason)
        return cls(Status.FAILED, None, rationale, reason=code, **kw)

    @property
    def is_scored(self) -> bool:
        return self.status is Status.SCORED

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "value": self.value,
            "rationale": self.rationale,
            "reason": self.reason,
            "raw": self.raw,
            "details": self.details,
        }


@dataclass(frozen=True)
class Aggregate:
    """Summary of many judged values.

    ``mean`` is over scored values only (``None`` when there are none, never NaN);
    ``abstain_rate`` and ``error_rate`` are shares of all rows; ``count`` is the
    number of rows the metric was asked to score, ``n_scored`` the number behind the mean
    (``count == n_scored + n_abstained + n_failed``).
    """

    mean: float | None
    count: int
    n_scored: int
    n_abstained: int
    n_failed: int
    distribution: dict[str, int]
    #: the sum of the scored values (``mean * n_scored``), kept so that summaries of parts of the data add up
    total: float = 0.0
    #: failed rows per failure reason, and the first non-empty rationale of each reason
    reasons: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)
    #: the sum of the squared scored values, kept (like ``total``) so that the spread, and with it the mean's
    #: interval, of parts of the data adds up; None when unknown (a summary saved before it was kept)
    total_sq: float | None = 0.0

    @property
    def abstain_rate(self) -> float:
        return self.n_abstained / self.count if self.count else 0.0

    @property
    def error_rate(self) -> float:
        return self.n_failed / self.count if self.count else 0.0

    def as_metrics(self, name: str) -> dict[str, float]:
        """Metric dict as the evaluator logs it: ``<name>/mean`` etc.

        ``<name>/count`` is the number of rows (SPEC 3.2's name, kept); ``<name>/n_scored``, ``<name>/n_abstained``
        and ``<name>/n_failed`` say what became of them, ``n_scored`` being the number of rows behind the mean.
        ``<name>/mean`` is left out (not NaN) when nothing was scored.
        """
        out: dict[str, float] = {
            f"{name}/count": float(self.count),
            f"{name}/n_scored": float(self.n_scored),
            f"{name}/n_abstained": float(self.n_abstained),
            f"{name}/n_failed": float(self.n_failed),
            f"{name}/abstain_rate": self.abstain_rate,
            f"{name}/error_rate": self.error_rate,
        }
        if self.mean is not None:
            out[f"{name}/mean"] = self.mean
        return out

    @property
    def variance(self) -> float | None:
        """The sample variance of the scored values (``n - 1`` in the denominator), from the sums: None with fewer
        than two scored values or an unknown ``total_sq``; 0.0 for a constant column.

        ``(total_sq - total**2 / n) / (n - 1)`` loses about ``n * eps * total_sq`` to rounding (eps = 2.2e-16), so a
        spread below ``1e-12 * total_sq`` is that rounding, not the data: read as 0 (a constant column of 0.1 is
        not given a spread of 1e-18).
        """
        n = self.n_scored
        if n < 2 or self.total_sq is None:
            return None
        spread = self.total_sq - self.total * self.total / n
        return 0.0 if spread <= 1e-12 * abs(self.total_sq) else spread / (n - 1)

    def merge(self, other: Aggregate) -> Aggregate:
        """The summary of both parts' rows together (the mean re-derived from the sums, never a mean of means)."""
        n_scored = self.n_scored + other.n_scored
        total = self.total + other.total
        total_sq = None if self.total_sq is None or other.total_sq is None else self.total_sq + other.total_sq
        return Aggregate(total / n_scored if n_scored else None, self.count + other.count, n_scored,
                         self.n_abstained + other.n_abstained, self.n_failed + other.n_failed,
                         dict(Counter(self.distribution) + Counter(other.distribution)), total,
                         dict(Counter(self.reasons) + Counter(other.reasons)), {**other.examples, **self.examples},
                         total_sq)

    @classmethod
    def abstentions(cls, n: int) -> Aggregate:
        """``n`` rows with no result: abstained, as :func:`aggregate` counts a row an output did not score."""
        return cls(None, n, 0, n, 0, {"abstained": n} if n else {})

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "n_scored": self.n_scored, "n_abstained": self.n_abstained,
                "n_failed": self.n_failed, "total": self.total, "total_sq": self.total_sq,
                "distribution": self.distribution, "reasons": self.reasons, "examples": self.examples}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Aggregate:
        """The inverse of :meth:`to_dict`; a summary saved before ``total_sq`` was kept loads with it unknown (no
        interval), not as 0 (which would read as a constant column)."""
        n_scored, total = int(d["n_scored"]), float(d["total"])
        total_sq = d.get("total_sq")
        return cls(total / n_scored if n_scored else None, int(d["count"]), n_scored, int(d["n_abstained"]),
                   int(d["n_failed"]), dict(d.get("distribution") or {}), total, dict(d.get("reasons") or {}),
                   dict(d.get("examples") or {}), None if total_sq is None else float(total_sq))


def _level_key(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


_STATUS, _VALUE = attrgetter("status"), attrgetter("value")


def _all_scored(values: list[float], levels: bool) -> Aggregate:
    """:func:`aggregate` of results that are all scored (most of a run's outputs), read in C: the same sum, added in
    the same order, and the same level counts in the order the levels first occur."""
    total = reduce(add, values, 0.0)
    total_sq = reduce(add, map(mul, values, values), 0.0)
    dist: dict[str, int] = {}
    if levels:
        for value, count in Counter(values).items():  # (each distinct value formatted once)
            key = _level_key(value)
            dist[key] = dist.get(key, 0) + count
    n = len(values)
    return Aggregate(total / n, n, n, 0, 0, dist, total, {}, {}, total_sq)


def aggregate(
    results: Iterable[JudgeResult],
    *,
    exclude_values: Sequence[float] = (),
    levels: bool = False,
) -> Aggregate:
    """Aggregate judged values.

    Args:
        results: the per-row results.
        exclude_values: scored values that count as abstentions for the mean
            (not needed when the judge already returns level 0 as abstained).
        levels: record the distribution of (integer) score levels as well as
            the status counts.
    """
    results = results if isinstance(results, list) else list(results)
    if not exclude_values and results:
        values = list(map(_VALUE, results))
        if all(map(is_, map(_STATUS, results), repeat(Status.SCORED))) and None not in values:
            return _all_scored(values, levels)
    n = n_scored = n_abst = n_fail = 0
    total = total_sq = 0.0
    dist: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}
    keys: dict[float, str] = {}  # each value's level key, formatted once (a run repeats a few values many times)
    for r in results:
        n += 1
        value = r.value
        if r.status is Status.SCORED and value is not None and value not in exclude_values:
            n_scored += 1
            total += value
            total_sq += value * value
            if levels:
                key = keys.get(value)
                if key is None:
                    key = keys[value] = _level_key(value)
                dist[key] += 1
        elif r.status is Status.FAILED:
            n_fail += 1
            dist["failed"] += 1
            reason = r.reason or "unknown"
            reasons[reason] += 1
            if r.rationale and reason not in examples:
                examples[reason] = r.rationale
        else:
            n_abst += 1
            dist["abstained"] += 1
    mean = total / n_scored if n_scored else None
    return Aggregate(mean, n, n_scored, n_abst, n_fail, dict(dist), total, dict(reasons), examples, total_sq)


# One segment of an MLflow metric name: MLflow accepts word characters (any script), "_", "-", ".", space, ":"
# and "/" in names; ":" is refused on Windows and "/" separates segments, so a segment keeps the rest.
_NAME_PART_OK = re.compile(r"^[\w.\- ]+$")
_NAME_PART_BAD = re.compile(r"[^\w.\- ]")
#: longest user text kept as it is in a metric name segment (MLflow's limit is 250 for the whole name)
MAX_NAME_PART = 100


def metric_name_part(text: Any) -> str:
    """A user-given text (a group, a human-score column) as one segment of an MLflow metric name, injectively.

    The text is kept as it is when MLflow accepts it (word characters in any script -- ``日本語`` too --
    ``_``, ``-``, ``.``, space), it is not ``.``/``..``, has no surrounding spaces and is at most
    100 characters. Otherwise the characters MLflow refuses become ``_``, the result is cut to 88
    characters and ``__`` plus the first 8 hex digits of the text's SHA-256 are appended: ``a:b`` becomes
    ``a_b__<hash>``, never the same name as the group ``a_b``, and a 300-character name stays recognisable.
    (A text that already has exactly such a shape could still meet its twin: callers that name many texts
    check the set with :func:`metric_name_parts`.)
    """
    s = str(text)
    if _NAME_PART_OK.match(s) and s not in (".", "..") and s == s.strip() and len(s) <= MAX_NAME_PART:
        return s
    digest = hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    cleaned = _NAME_PART_BAD.sub("_", s).strip()[:88] or "_"
    return f"{cleaned}__{digest}"


def metric_name_parts(texts: Iterable[Any], what: str) -> dict[str, str]:
    """:func:`metric_name_part` for several texts, refusing two texts that would share a name.

    Raises:
        ValueError: naming both texts (``what`` says what they are, e.g. "group").
    """
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for t in texts:
        key = str(t)
        name = metric_name_part(key)
        if name in seen and seen[name] != key:
            raise ValueError(f"The {what}s {seen[name]!r} and {key!r} would be logged under the same metric name "
                             f"{name!r}; rename one of them.")
        seen[name] = key
        out[key] = name
    return out


@dataclass
class Row:
    """One evaluation row as every metric sees it, whichever way it arrived (a DataFrame row of the
    evaluator or the CLI, or a scorer's inputs / outputs / expectations / trace): the input layer
    (:mod:`mlflow_ragjudge.engine.inputs`) builds and validates it, metrics only read it.

    ``reference`` is the reference answer; when the data gives several acceptable answers (a list, as NQ and
    TriviaQA do), ``references`` holds them all and ``reference`` is the first. :attr:`acceptable_answers` is
    the list either way: every judge uses all of them (LLM judges see them all as acceptable, the lexical and
    offline ones keep the best match).

    ``judge_contexts`` is what the six-level judge sees (resolved from the context mode: E3 passages
    retrieved with question + reference, E2 generation contexts, gold documents, or none), and
    ``context_mode`` the mode they came from.
    """

    index: int
    question: str | None = None
    answer: str | None = None
    reference: str | None = None
    references: list[str] | None = None
    contexts: list[str] | None = None
    retrieved_doc_ids: list[Any] | None = None
    relevant_doc_ids: Any = None
    reference_contexts: list[str] | None = None
    evidence_contexts: list[str] | None = None
    gold_documents: list[str] | None = None
    group: str | None = None
    #: whether the question can be answered from the corpus (seed 004's refusal check), when the data says
    answerable: bool | None = None
    #: ids of the documents the answer cites
    citations: list[Any] | None = None
    #: the system's raw reply, when ``answer`` was extracted from it (a JSON contract object ...)
    raw_output: str | None = None
    judge_contexts: list[str] | None = None
    context_mode: str | None = None
    #: with several context modes: mode -> that mode's judge contexts (``judge_contexts`` is the primary mode's)
    judge_contexts_by_mode: dict[str, list[str]] = field(default_factory=dict)

    @property
    def acceptable_answers(self) -> list[str]:
        """Every acceptable reference answer (one for a plain reference, none without a reference)."""
        if self.references:
            return list(self.references)
        return [self.reference] if self.reference is not None else []

    @property
    def context_provenance(self) -> str | None:
        """Where ``judge_contexts`` came from (``retrieved_with_question_and_reference``, ``generation_contexts``,
        ``evidence_from_testset``, ``gold``, ``none``), or None before they are resolved."""
        return CONTEXT_PROVENANCE.get(self.context_mode) if self.context_mode else None
    relevance_threshold: float = 1

    @property
    def retrieval_hit(self) -> bool:
        """A relevant document (grade >= threshold) is among the retrieved ones."""
        if not self.relevant_doc_ids or not self.retrieved_doc_ids:
            return False
        rel = self.relevant_doc_ids
        if isinstance(rel, dict):
            gold = {str(k) for k, g in rel.items() if g is not None and float(g) >= self.relevance_threshold}
        else:
            gold = {str(k) for k in rel}
        return any(str(d) in gold for d in self.retrieved_doc_ids)
