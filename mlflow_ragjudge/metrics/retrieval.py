"""Document-level retrieval metrics that agree with trec_eval.

Pure Python, no LLM, no heavy imports (numpy is imported lazily, only by the batch path
:func:`score_queries`). Every measure follows the conventions of NIST's ``trec_eval`` (version 10.0,
github.com/usnistgov/trec_eval) and is checked against trec_eval's own test outputs in
``tests/test_retrieval_trec_eval.py``. The formulas and conventions are collected in ``docs/retrieval.md``.

Scoring one query (:func:`score_query`, :func:`score_queries`) and averaging over queries
(:func:`aggregate_queries`) are separate steps.

Vocabulary used in the docstrings:

* ``ranking``: the retrieved document ids after removing repeated ids (first occurrence kept), rank 1 first;
  ``N = len(ranking)``.
* ``grade(d)``: the grade of ``d`` in ``relevant`` (1 for every id when ``relevant`` is a plain list);
  documents absent from ``relevant`` are unjudged and count as non-relevant with gain 0.
* ``rel(d)``: 1 when ``grade(d) >= relevance_threshold`` (trec_eval's ``-l``), else 0.
* ``R``: the number of judged documents with ``rel(d) == 1``, retrieved or not (trec_eval's ``num_rel``).
* ``hits@k``: the number of relevant documents among the first ``k`` of ``ranking``.

Example:
    >>> scores = score_query(["d3", "d1", "d9"], {"d1": 2, "d7": 1}, ks=(1, 3))
    >>> scores["precision_at_3"], scores["recall_at_3"], scores["mrr"]
    (0.3333333333333333, 0.5, 0.5)
"""

from __future__ import annotations

import bisect
import json
import math
import numbers
import threading
from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from ..core.types import JudgeResult
from . import lexical
from .spec import Finish, MetricSpec, Option

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "DEFAULT_KS",
    "DocId",
    "RankedIds",
    "Relevant",
    "TREC_EVAL_MEASURES",
    "aggregate_queries",
    "metric_names",
    "rank_run",
    "read_qrels",
    "read_run",
    "score_queries",
    "score_query",
    "validate_ks",
    "validate_retrieval_columns",
    "validate_retrieval_row",
]

DocId: TypeAlias = str | int
"""A document id. trec_eval treats ids as text; here ``7`` and ``"7"`` are different ids."""

RankedIds: TypeAlias = Collection[DocId]
"""Retrieved ids, best first: a list, tuple or 1-D numpy array (a set or dict is rejected: no order)."""

Relevant: TypeAlias = Collection[DocId] | Mapping[str, float] | Mapping[int, float]
"""Gold documents: ids (all grade 1; a list, tuple, set or numpy array) or a mapping id -> numeric grade."""

_Id = TypeVar("_Id", bound=Hashable)

DEFAULT_KS: tuple[int, ...] = (1, 3, 5, 10)
"""Cutoffs used when none are given."""

RETRIEVED_COLUMN = "retrieved_doc_ids"
RELEVANT_COLUMN = "relevant_doc_ids"

COUNT_KEYS: tuple[str, ...] = ("num_retrieved", "num_relevant", "num_relevant_retrieved")
#: the measures over the whole returned list, with no cut-off (trec_eval's set_P, set_recall, set_F)
SET_KEYS: tuple[str, ...] = ("precision", "recall", "f1")

TREC_EVAL_MEASURES: dict[str, str] = {
    "precision_at_{k}": "P_{k}",
    "recall_at_{k}": "recall_{k}",
    "hit_rate_at_{k}": "success_{k}",
    "ndcg_at_{k}": "ndcg_cut_{k}",
    "mrr": "recip_rank",
    "map": "map",
    "ndcg": "ndcg",
    "precision": "set_P",
    "recall": "set_recall",
    "f1": "set_F",
    "num_retrieved": "num_ret",
    "num_relevant": "num_rel",
    "num_relevant_retrieved": "num_rel_ret",
}
"""Our metric name -> trec_eval's measure name (``{k}`` is the cutoff).

``f1_at_{k}`` has no trec_eval measure; at ``k == num_retrieved`` it equals trec_eval's ``set_F``.
"""

# log2(rank + 1) for rank = 1, 2, ...: the DCG discount. One shared table, computed with math.log2 (the C
# library's log2, as trec_eval uses), so the per-query and batch paths divide by bit-identical numbers.
_LOG2: list[float] = [math.log2(i + 2) for i in range(1024)]
_LOG2_LOCK = threading.Lock()  # MLflow calls scorers from thread pools; grow the shared table once


def _log2_table(n: int) -> list[float]:
    """Return the discount table, grown to at least ``n`` entries."""
    if n > len(_LOG2):
        with _LOG2_LOCK:
            if n > len(_LOG2):
                _LOG2.extend(math.log2(i + 2) for i in range(len(_LOG2), max(n, 2 * len(_LOG2))))
    return _LOG2


# --------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------


def validate_ks(k: int | Iterable[int]) -> tuple[int, ...]:
    """Check rank cutoffs and return them sorted, without repeats.

    Args:
        k: One cutoff or several, each a positive integer (trec_eval: "Cutoffs must be positive").

    Returns:
        The cutoffs as a sorted tuple without duplicates, e.g. ``validate_ks([10, 1, 5, 1]) == (1, 5, 10)``.

    Raises:
        ValueError: If a cutoff is not an integer (``2.5``, ``"5"``, ``True``) or is ``<= 0``, or no cutoff
            is given.
    """
    values: list[Any] = [k] if isinstance(k, (str, bytes)) or not isinstance(k, Iterable) else list(k)
    if not values:
        raise ValueError("k must name at least one cutoff, e.g. [1, 5, 10]; got an empty list")
    for value in values:
        if not _is_int(value):
            raise ValueError(
                f"k must be a positive integer or a list of positive integers, e.g. 5 or [1, 5, 10]; "
                f"got {value!r} ({type(value).__name__})"
            )
        if value <= 0:
            raise ValueError(f"k must be a positive integer (a rank cutoff of 1 or more); got {value}")
    return tuple(sorted({int(v) for v in values}))


def _validate_threshold(relevance_threshold: float) -> float:
    if (
        isinstance(relevance_threshold, bool)
        or not isinstance(relevance_threshold, numbers.Real)
        or not math.isfinite(relevance_threshold)
        or relevance_threshold < 0
    ):
        raise ValueError(
            "relevance_threshold must be a finite number >= 0 (a document is relevant when its grade is "
            f">= relevance_threshold, like trec_eval's -l; the default is 1); got {relevance_threshold!r}"
        )
    return relevance_threshold


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_grade(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _where(row_index: Any, column: str) -> str:
    if row_index is None:
        return f"column '{column}'"
    return f"row {row_index}, column '{column}'"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_NATIVE_ID_TYPES: dict[type, str] = {str: "str", int: "int"}


def _id_kind(value: Any) -> str | None:
    """Return ``"str"`` or ``"int"`` for a valid document id, else ``None``."""
    if isinstance(value, str):
        return "str"
    if _is_int(value):
        return "int"
    return None


def _check_ids(items: Iterable[Any], row_index: Any, column: str, what: str) -> set[str]:
    """Check every id of one cell; return the id kinds seen (``{"str"}``, ``{"int"}`` or both)."""
    types = set(map(type, items))
    if types <= _NATIVE_ID_TYPES.keys():  # fast path: plain str / int ids, checked at C speed
        return {_NATIVE_ID_TYPES[t] for t in types}
    kinds: set[str] = set()
    for position, item in enumerate(items):
        kind = _id_kind(item)
        if kind is not None:
            kinds.add(kind)
            continue
        where = _where(row_index, column)
        if item is None:
            raise ValueError(
                f"{where}: {what} {position} is None. Every entry must be a document id (str or int): "
                f"remove the None or put the document's id in its place"
            )
        raise ValueError(
            f"{where}: {what} {position} is {_short(item)} ({type(item).__name__}); document ids must be "
            f"str or int. Convert them first, e.g. [str(x) for x in ids]"
        )
    return kinds


def _check_list_like(value: Any, row_index: Any, column: str, example: str) -> None:
    """Raise unless ``value`` is a list-like cell (list, tuple, numpy array, ...)."""
    if isinstance(value, (list, tuple)):
        return
    where = _where(row_index, column)
    if _is_missing(value):
        raise ValueError(
            f"{where}: the value is missing ({value!r}). Use an empty list [] for a query with no "
            f"documents, e.g. {example}"
        )
    if isinstance(value, (str, bytes)):
        raise ValueError(
            f"{where}: got a string {_short(value)} where a list of document ids is expected, "
            f"e.g. {example}. "
            f"If the column was read from CSV or JSON text, parse it first, e.g. "
            f"df['{column}'] = df['{column}'].map(json.loads)"
        )
    if not hasattr(value, "__iter__") or not hasattr(value, "__len__"):
        raise ValueError(
            f"{where}: expected a list of document ids, e.g. {example}; got {_short(value)} "
            f"({type(value).__name__})"
        )
    if getattr(value, "ndim", 1) != 1:
        raise ValueError(
            f"{where}: expected a flat list of document ids, e.g. {example}; got an array of shape "
            f"{getattr(value, 'shape', '?')}"
        )


def validate_retrieval_row(
    retrieved: Any,
    relevant: Any,
    row_index: Any = None,
    *,
    retrieved_column: str = RETRIEVED_COLUMN,
    relevant_column: str = RELEVANT_COLUMN,
) -> None:
    """Check one row's retrieved and gold ids before scoring, with errors that name the row and the fix.

    Accepted values:

    * ``retrieved``: a ranked list-like (list, tuple, 1-D numpy array) of ids, each ``str`` or ``int``
      (numpy strings and integers too). Not a dict (rank it with :func:`rank_run` first) and not a set
      (a set has no order).
    * ``relevant``: a list-like or set of ids (each grade 1), or a mapping id -> finite numeric grade.
    * The ids of both cells must be of one kind, all ``str`` or all ``int``: ``7`` never matches ``"7"``,
      so a mix is almost always a loading bug.

    Args:
        retrieved: The ranked retrieved ids of the row (best first).
        relevant: The gold ids of the row, or a mapping id -> grade.
        row_index: The row's position or label, used in the messages; ``None`` leaves it out.
        retrieved_column: The name of the retrieved-ids column, for the messages.
        relevant_column: The name of the gold-ids column, for the messages.

    Raises:
        ValueError: Naming the row, the column, the bad value and how to fix it, for: a missing value, a
            string where a list is expected, a dict or set as the ranking, an id that is ``None`` or not
            ``str``/``int``, a grade that is not a finite number, str and int ids mixed.
    """
    _check_list_like_or_mapping_guard(retrieved, row_index, retrieved_column)
    _check_list_like(retrieved, row_index, retrieved_column, "['doc-3', 'doc-1']")
    kinds = _check_ids(retrieved, row_index, retrieved_column, "item")

    if isinstance(relevant, Mapping):
        kinds |= _check_ids(relevant.keys(), row_index, relevant_column, "key")
        grade_types = set(map(type, relevant.values()))
        plain_numbers = grade_types <= {int} or (
            grade_types <= {int, float} and all(map(math.isfinite, relevant.values()))
        )
        if not plain_numbers:  # the fast check above is exact for plain Python numbers; look closer
            _check_grades(relevant, _where(row_index, relevant_column))
    else:
        if not isinstance(relevant, (set, frozenset)):
            _check_list_like(relevant, row_index, relevant_column, "['doc-1'] or {'doc-1': 2}")
        kinds |= _check_ids(relevant, row_index, relevant_column, "item")

    if len(kinds) > 1:
        prefix = "" if row_index is None else f"row {row_index}: "
        raise ValueError(
            f"{prefix}'{retrieved_column}' and '{relevant_column}' mix str and int document ids; 7 and '7' "
            f"never match. Use one type in both columns, e.g. convert every id with str()"
        )


def _check_grades(relevant: Mapping[Any, Any], where: str) -> None:
    for doc_id, grade in relevant.items():
        if not _is_grade(grade):
            raise ValueError(
                f"{where}: the grade of {doc_id!r} is {_short(grade)} ({type(grade).__name__}); grades "
                f"must be finite numbers, e.g. {{'doc-1': 2, 'doc-4': 1}} (0 = judged not relevant)"
            )


def _check_list_like_or_mapping_guard(retrieved: Any, row_index: Any, column: str) -> None:
    if isinstance(retrieved, Mapping):
        raise ValueError(
            f"{_where(row_index, column)}: got a dict; retrieved ids must be a ranked list (best "
            f"first). To rank a {{doc_id: score}} dict the way trec_eval does, use rank_run() first"
        )
    if isinstance(retrieved, (set, frozenset)):
        raise ValueError(
            f"{_where(row_index, column)}: got a set, which has no order; retrieved ids must be a "
            f"ranked list (best first), e.g. ['doc-3', 'doc-1']"
        )


def validate_retrieval_columns(
    retrieved_values: Iterable[Any],
    relevant_values: Iterable[Any],
    *,
    retrieved_column: str = RETRIEVED_COLUMN,
    relevant_column: str = RELEVANT_COLUMN,
) -> None:
    """Check a whole column pair (e.g. two DataFrame columns) row by row with :func:`validate_retrieval_row`.

    Rows are numbered from 0 in the order given (for a pandas Series, its position, not its index label).

    Args:
        retrieved_values: The retrieved-ids column.
        relevant_values: The gold-ids column.
        retrieved_column: Its name, for the messages (a column mapping may have renamed it).
        relevant_column: Its name, for the messages.

    Raises:
        ValueError: At the first bad row (see :func:`validate_retrieval_row`), or when the columns have
            different lengths.
    """
    retrieved_list = list(retrieved_values)
    relevant_list = list(relevant_values)
    if len(retrieved_list) != len(relevant_list):
        raise ValueError(
            f"'{retrieved_column}' has {len(retrieved_list)} rows but '{relevant_column}' has "
            f"{len(relevant_list)}; give one gold entry per query (use [] where a query has none)"
        )
    for row_index, (retrieved, relevant) in enumerate(zip(retrieved_list, relevant_list, strict=True)):
        validate_retrieval_row(
            retrieved,
            relevant,
            row_index,
            retrieved_column=retrieved_column,
            relevant_column=relevant_column,
        )


# --------------------------------------------------------------------------------------------------------
# Ranking a scored run (trec_eval's order)
# --------------------------------------------------------------------------------------------------------


def rank_run(scored: Mapping[_Id, float]) -> list[_Id]:
    """Rank a ``{doc_id: score}`` run the way trec_eval does.

    trec_eval ignores the rank column of a run file and sorts by score, highest first; ties are broken by
    document id in *descending* byte order (``form_res_rels.c``, ``comp_sim_docno``:
    ``strcmp(p2->docno, p1->docno)``). trec_eval reads ids as text, so ids are compared as ``str(doc_id)``:
    among tied ``int`` ids, ``9`` ranks before ``10`` (``"9" > "10"``). Python compares ``str`` by code
    point, which is the same order as C's ``strcmp`` on UTF-8 bytes.

    Args:
        scored: Document id -> retrieval score (higher is better). A mapping cannot repeat an id; trec_eval
            rejects a run that does (see :func:`read_run`).

    Returns:
        The ids, best first.

    Raises:
        ValueError: If a score is not a number or is NaN (NaN has no place in an order).

    Example:
        >>> rank_run({"a": 1.0, "b": 2.0, "c": 1.0})
        ['b', 'c', 'a']
    """
    for doc_id, score in scored.items():
        if isinstance(score, bool) or not isinstance(score, numbers.Real) or math.isnan(score):
            raise ValueError(
                f"score of {doc_id!r} is {_short(score)}; rank_run needs a number (not NaN) for every id"
            )
    return [doc_id for doc_id, _ in sorted(scored.items(), key=_score_then_docno, reverse=True)]


def _score_then_docno(item: tuple[Any, float]) -> tuple[float, str]:
    return (float(item[1]), str(item[0]))


# --------------------------------------------------------------------------------------------------------
# Scoring one query
# --------------------------------------------------------------------------------------------------------


def metric_names(ks: int | Iterable[int] = DEFAULT_KS) -> list[str]:
    """Return the keys of :func:`score_query`'s result, in order, for the given cutoffs.

    Args:
        ks: The rank cutoffs.

    Returns:
        ``precision_at_k, recall_at_k, f1_at_k, hit_rate_at_k, ndcg_at_k`` for each ``k``, then ``mrr, map,
        ndcg, precision, recall, f1, num_retrieved, num_relevant, num_relevant_retrieved``.
    """
    names: list[str] = []
    for k in validate_ks(ks):
        names += [f"precision_at_{k}", f"recall_at_{k}", f"f1_at_{k}", f"hit_rate_at_{k}", f"ndcg_at_{k}"]
    return [*names, "mrr", "map", "ndcg", *SET_KEYS, *COUNT_KEYS]


def _as_list(retrieved: Any) -> list[Any]:
    if isinstance(retrieved, list):
        return retrieved
    if hasattr(retrieved, "tolist"):  # numpy arrays: native str/int ids hash and compare fastest
        return list(retrieved.tolist())
    return list(retrieved)


_FEW = 8  # up to this many retrieved judged documents, list.index beats building a rank dict


def _locate(retrieved: list[Any], grades: dict[Any, Any]) -> tuple[int, list[tuple[int, Any]]]:
    """Find the judged documents in a ranking.

    trec_eval refuses a run that repeats a document for a query ("duplicate docs"). A RAG retriever
    repeats a document whenever two of its chunks are retrieved, so we keep the first (best-ranked)
    occurrence and let the later ones drop out; the ranks below close up. A document is thus credited once.

    Returns:
        The number of distinct retrieved ids, and ``(0-based rank, grade)`` of every retrieved judged
        document, best rank first.
    """
    unique = set(retrieved)  # hashing at C speed; most rankings have no repeats
    ranking = retrieved if len(unique) == len(retrieved) else list(dict.fromkeys(retrieved))
    if len(grades) > len(ranking):
        return len(ranking), [(rank, grades[doc]) for rank, doc in enumerate(ranking) if doc in grades]
    found = [doc for doc in grades if doc in unique]
    if len(found) <= _FEW:
        hits = [(ranking.index(doc), grades[doc]) for doc in found]
    else:
        position = dict(zip(ranking, range(len(ranking)), strict=True))
        hits = [(position[doc], grades[doc]) for doc in found]
    hits.sort()
    return len(ranking), hits


def _as_grades(relevant: Any) -> dict[Any, float]:
    if isinstance(relevant, Mapping):
        return relevant if isinstance(relevant, dict) else dict(relevant)
    return dict.fromkeys(_as_list(relevant) if not isinstance(relevant, (set, frozenset)) else relevant, 1)


def score_query(
    retrieved: RankedIds,
    relevant: Relevant,
    *,
    ks: int | Iterable[int] = DEFAULT_KS,
    relevance_threshold: float = 1,
    validate: bool = True,
) -> dict[str, float]:
    """Score one query's ranked retrieval against its gold documents, with trec_eval's conventions.

    With ``ranking``, ``grade``, ``rel``, ``R`` and ``hits@k`` as defined in the module docstring:

    * ``precision_at_k = hits@k / k`` (trec_eval ``P_k``). When ``k > N`` the missing ranks count as
      non-relevant: 4 relevant among 15 retrieved gives ``P@20 = 4 / 20``.
    * ``recall_at_k = hits@k / R`` (trec_eval ``recall_k``); 0 when ``R == 0``.
    * ``f1_at_k = 2 * P@k * R@k / (P@k + R@k)``, the harmonic mean; 0 when both are 0. (trec_eval's
      ``set_F`` is this at ``k = N``.)
    * ``hit_rate_at_k = 1 if hits@k > 0 else 0`` (trec_eval ``success_k``).
    * ``mrr = 1 / rank of the first relevant document``, 0 if none is retrieved (trec_eval ``recip_rank``;
      the "mean" is taken by :func:`aggregate_queries`).
    * ``map = sum over relevant retrieved d of (hits@rank(d) / rank(d)) / R``: average precision, with
      unretrieved relevant documents contributing 0; 0 when ``R == 0`` (trec_eval ``map``).
    * ``ndcg_at_k = DCG@k / IDCG@k`` (trec_eval ``ndcg_cut_k``) with
      ``DCG@k = sum_{i <= min(k, N)} gain(ranking[i]) / log2(i + 1)`` and ``IDCG@k`` the same sum over the
      judged gains sorted in decreasing order; 0 when ``IDCG@k == 0``.
    * ``ndcg = DCG@N / IDCG@all`` (trec_eval ``ndcg``): the whole ranking against the ideal ranking of every
      judged document with a positive grade, retrieved or not.
    * ``precision = hits@N / N``, ``recall = hits@N / R`` and ``f1`` their harmonic mean, over the whole
      returned list with no cut-off (trec_eval ``set_P``, ``set_recall``, ``set_F``); each 0 when its
      denominator is 0. These measure a retriever (or a reranker with a score threshold) that returns a
      variable number of documents: ``precision_at_k`` counts missing ranks as misses, ``precision`` does not.
    * ``num_retrieved = N``, ``num_relevant = R``, ``num_relevant_retrieved = hits@N`` (trec_eval
      ``num_ret``, ``num_rel``, ``num_rel_ret``).

    Conventions (trec_eval's, except where said):

    * Gains are the raw grades: ``gain(d) = grade(d)`` when positive, else 0 (Järvelin and Kekäläinen's
      linear gain, trec_eval's default). nDCG ignores ``relevance_threshold``, as trec_eval's ``ndcg`` and
      ``ndcg_cut`` ignore ``-l``: with a threshold of 2, a grade-1 document is not relevant for precision
      but still earns gain 1.
    * Grades below 0 mean "judged but unusable" in trec_eval (in the pool, unjudged): never relevant, not
      counted in ``R``, gain 0. Grade 0 means judged non-relevant.
    * ``relevant`` given as a list means grade 1 for each id (repeats collapse).
    * Repeated ids in ``retrieved``: trec_eval refuses the run; here the first occurrence is kept and later
      ones are dropped, so the ranks close up and a document is credited once.
    * An empty ``retrieved`` scores 0 on every measure (trec_eval's ``-c`` treatment of a query with
      judgments but no retrieved documents; without ``-c`` trec_eval leaves the query out).
    * A query without relevant documents (``num_relevant == 0``; e.g. an empty ``relevant``) scores 0 on
      every binary measure, as trec_eval scores a query that is in the qrels but has no relevant document,
      and such a query *counts* in trec_eval's averages. ``ndcg`` can still be positive when the
      threshold is above some positive grade. To leave these rows out of an average, filter on
      ``num_relevant == 0`` or pass ``skip_without_relevant=True`` to :func:`aggregate_queries`.

    Args:
        retrieved: Ranked document ids, best first (``str`` or ``int``). To rank ``{doc_id: score}`` as
            trec_eval does, use :func:`rank_run`.
        relevant: Gold ids (grade 1 each) or a mapping id -> numeric grade.
        ks: Rank cutoffs for the ``_at_k`` measures.
        relevance_threshold: Minimum grade for a document to count as relevant in the binary measures
            (precision, recall, F1, hit rate, MRR, MAP), like trec_eval's ``-l``. Must be ``>= 0``.
        validate: Check the inputs with :func:`validate_retrieval_row` first (the cost is one pass over the
            ids). Turn off only for inputs already validated.

    Returns:
        The measures keyed as listed by :func:`metric_names`, each a float (the three counts are ints).

    Raises:
        ValueError: On bad ids, grades, cutoffs or threshold (see :func:`validate_retrieval_row`).
    """
    cutoffs = validate_ks(ks)
    threshold = _validate_threshold(relevance_threshold)
    if validate:
        validate_retrieval_row(retrieved, relevant)
    grades = _as_grades(relevant)
    num_retrieved, hits = _locate(_as_list(retrieved), grades)
    return _score_one(num_retrieved, hits, grades, cutoffs, threshold)


def _score_one(
    num_retrieved: int,
    hits: list[tuple[int, Any]],
    grades: dict[Any, float],
    cutoffs: tuple[int, ...],
    threshold: float,
) -> dict[str, float]:
    relevant_ranks = [rank for rank, grade in hits if grade >= threshold]
    num_relevant = sum(1 for grade in grades.values() if grade >= threshold)
    ideal = sorted((grade for grade in grades.values() if grade > 0), reverse=True)
    log2 = _log2_table(max(num_retrieved, len(ideal)))

    # Average precision: sum of precision at each relevant retrieved rank, over R (m_map.c).
    ap_sum = 0.0
    for found, rank in enumerate(relevant_ranks, 1):
        ap_sum += found / (rank + 1)

    # DCG@k and IDCG@k for increasing k, summed in rank order as trec_eval does (m_ndcg_cut.c).
    dcg_terms = [(rank, grade / log2[rank]) for rank, grade in hits if grade > 0]
    result: dict[str, float] = {}
    dcg = 0.0
    idcg = 0.0
    next_term = 0
    next_ideal = 0
    for k in cutoffs:
        while next_term < len(dcg_terms) and dcg_terms[next_term][0] < k:
            dcg += dcg_terms[next_term][1]
            next_term += 1
        while next_ideal < len(ideal) and next_ideal < k:
            idcg += ideal[next_ideal] / log2[next_ideal]
            next_ideal += 1
        found = bisect.bisect_left(relevant_ranks, k)
        precision = found / k
        recall = found / num_relevant if num_relevant else 0.0
        result[f"precision_at_{k}"] = precision
        result[f"recall_at_{k}"] = recall
        result[f"f1_at_{k}"] = 2 * precision * recall / (precision + recall) if found else 0.0
        result[f"hit_rate_at_{k}"] = 1.0 if found else 0.0
        result[f"ndcg_at_{k}"] = dcg / idcg if idcg > 0 else 0.0
    for _, term in dcg_terms[next_term:]:
        dcg += term
    for i in range(next_ideal, len(ideal)):
        idcg += ideal[i] / log2[i]

    result["mrr"] = 1.0 / (relevant_ranks[0] + 1) if relevant_ranks else 0.0
    result["map"] = ap_sum / num_relevant if num_relevant else 0.0
    result["ndcg"] = dcg / idcg if idcg > 0 else 0.0
    found_all = len(relevant_ranks)
    set_p = found_all / num_retrieved if num_retrieved else 0.0
    set_r = found_all / num_relevant if num_relevant else 0.0
    result["precision"] = set_p
    result["recall"] = set_r
    result["f1"] = 2 * set_p * set_r / (set_p + set_r) if found_all else 0.0
    result["num_retrieved"] = num_retrieved
    result["num_relevant"] = num_relevant
    result["num_relevant_retrieved"] = len(relevant_ranks)
    return result


# --------------------------------------------------------------------------------------------------------
# Scoring many queries at once (vectorised)
# --------------------------------------------------------------------------------------------------------


def score_queries(
    retrieved: Iterable[RankedIds],
    relevant: Iterable[Relevant],
    *,
    ks: int | Iterable[int] = DEFAULT_KS,
    relevance_threshold: float = 1,
    validate: bool = True,
    chunk_size: int = 8192,
) -> dict[str, np.ndarray]:
    """Score many queries at once; the same numbers as :func:`score_query`, bit for bit, but faster.

    The per-query Python work is reduced to locating the judged documents in each ranking (C-speed set
    and list operations); the measures are then computed with numpy on a dense ``queries x ranks``
    matrix, a chunk of queries at a time. Every sum runs in rank order over the same terms as
    :func:`score_query` (numpy's ``cumsum`` is sequential, and the added zeros do not change a float
    sum), and the DCG discounts come from the same ``math.log2`` table, so the results are identical,
    not merely close.

    Args:
        retrieved: One ranked id list per query.
        relevant: One gold entry per query (ids, or a mapping id -> grade), in the same order.
        ks: Rank cutoffs.
        relevance_threshold: See :func:`score_query`.
        validate: Check every row with :func:`validate_retrieval_row` first (rows numbered from 0).
        chunk_size: Queries per numpy block; bounds memory to about ``chunk_size x max ranking length``
            floats per matrix.

    Returns:
        Metric name (as :func:`metric_names`) -> array with one value per query, in input order
        (``float64``; the counts are ``int64``). Use ``pandas.DataFrame(result)`` for a table and
        :func:`aggregate_queries` for the means.

    Raises:
        ValueError: On bad rows (naming the row), cutoffs, threshold, or columns of different lengths.
    """
    import numpy as np

    cutoffs = validate_ks(ks)
    threshold = _validate_threshold(relevance_threshold)
    retrieved_rows = retrieved if isinstance(retrieved, list) else list(retrieved)
    relevant_rows = relevant if isinstance(relevant, list) else list(relevant)
    if validate:
        validate_retrieval_columns(retrieved_rows, relevant_rows)
    elif len(retrieved_rows) != len(relevant_rows):
        raise ValueError(
            f"'{RETRIEVED_COLUMN}' has {len(retrieved_rows)} rows but '{RELEVANT_COLUMN}' has "
            f"{len(relevant_rows)}; give one gold entry per query"
        )
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer; got {chunk_size}")

    names = metric_names(cutoffs)
    n = len(retrieved_rows)
    out = {name: np.zeros(n, dtype=np.int64 if name in COUNT_KEYS else np.float64) for name in names}
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        _score_chunk(
            retrieved_rows[start:stop], relevant_rows[start:stop], cutoffs, threshold, out, start, np
        )
    return out


def _score_chunk(
    retrieved_rows: list[Any],
    relevant_rows: list[Any],
    cutoffs: tuple[int, ...],
    threshold: float,
    out: dict[str, np.ndarray],
    offset: int,
    np: Any,
) -> None:
    n = len(retrieved_rows)
    # Sparse facts per query, gathered in Python (the only per-query Python work).
    hit_rows: list[int] = []
    hit_ranks: list[int] = []
    hit_grades: list[Any] = []
    judged_rows: list[int] = []
    judged_grades: list[Any] = []
    num_retrieved = np.zeros(n, dtype=np.int64)
    for q, (retrieved, relevant) in enumerate(zip(retrieved_rows, relevant_rows, strict=True)):
        grades = _as_grades(relevant)
        num_retrieved[q], hits = _locate(_as_list(retrieved), grades)
        if hits:
            hit_rows += [q] * len(hits)
            hit_ranks += [rank for rank, _ in hits]
            hit_grades += [grade for _, grade in hits]
        if grades:
            judged_rows += [q] * len(grades)
            judged_grades += grades.values()

    rows = np.asarray(hit_rows, dtype=np.int64)
    ranks = np.asarray(hit_ranks, dtype=np.int64)
    grades_arr = np.asarray(hit_grades, dtype=np.float64)
    judged_rows_arr = np.asarray(judged_rows, dtype=np.int64)
    judged_arr = np.asarray(judged_grades, dtype=np.float64)
    num_relevant = np.bincount(judged_rows_arr[judged_arr >= threshold], minlength=n).astype(np.int64)

    # The ideal ranking of each query: its positive grades, largest first (lexsort: by row, then grade).
    positive_judged = judged_arr > 0
    ideal_rows = judged_rows_arr[positive_judged]
    ideal_grades = judged_arr[positive_judged]
    order = np.lexsort((-ideal_grades, ideal_rows))
    ideal_rows = ideal_rows[order]
    ideal_grades = ideal_grades[order]
    ideal_cols = np.arange(ideal_rows.size) - np.searchsorted(ideal_rows, ideal_rows, side="left")

    width = int(ranks.max()) + 1 if ranks.size else 1
    ideal_width = int(ideal_cols.max()) + 1 if ideal_cols.size else 1
    log2 = np.asarray(_log2_table(max(width, ideal_width))[: max(width, ideal_width)], dtype=np.float64)

    # Binary relevance, cumulative hits and the average-precision terms found/rank at relevant ranks.
    is_rel = grades_arr >= threshold
    relevant_matrix = np.zeros((n, width), dtype=np.int64)
    relevant_matrix[rows[is_rel], ranks[is_rel]] = 1
    cum_hits = np.cumsum(relevant_matrix, axis=1)
    rank_numbers = np.arange(1, width + 1, dtype=np.int64)
    ap_terms = np.where(relevant_matrix == 1, cum_hits / rank_numbers, 0.0)
    ap_sum = np.cumsum(ap_terms, axis=1)[:, -1]

    # Gains over discounts, in rank order; ideal gains likewise.
    positive = grades_arr > 0
    dcg_terms = np.zeros((n, width), dtype=np.float64)
    dcg_terms[rows[positive], ranks[positive]] = grades_arr[positive] / log2[ranks[positive]]
    dcg_cum = np.cumsum(dcg_terms, axis=1)
    ideal_terms = np.zeros((n, ideal_width), dtype=np.float64)
    ideal_terms[ideal_rows, ideal_cols] = ideal_grades / log2[ideal_cols]
    idcg_cum = np.cumsum(ideal_terms, axis=1)

    has_relevant = num_relevant > 0
    safe_relevant = np.where(has_relevant, num_relevant, 1)
    block = slice(offset, offset + n)
    for k in cutoffs:
        found = cum_hits[:, min(k, width) - 1]
        precision = found / k
        recall = np.where(has_relevant, found / safe_relevant, 0.0)
        denominator = precision + recall
        f1 = np.where(found > 0, 2 * precision * recall / np.where(found > 0, denominator, 1.0), 0.0)
        dcg_k = dcg_cum[:, min(k, width) - 1]
        idcg_k = idcg_cum[:, min(k, ideal_width) - 1]
        out[f"precision_at_{k}"][block] = precision
        out[f"recall_at_{k}"][block] = recall
        out[f"f1_at_{k}"][block] = f1
        out[f"hit_rate_at_{k}"][block] = (found > 0).astype(np.float64)
        out[f"ndcg_at_{k}"][block] = np.where(idcg_k > 0, dcg_k / np.where(idcg_k > 0, idcg_k, 1.0), 0.0)

    any_relevant = cum_hits[:, -1] > 0
    first_rank = np.argmax(relevant_matrix, axis=1) + 1
    out["mrr"][block] = np.where(any_relevant, 1.0 / first_rank, 0.0)
    out["map"][block] = np.where(has_relevant, ap_sum / safe_relevant, 0.0)
    dcg_all = dcg_cum[:, -1]
    idcg_all = idcg_cum[:, -1]
    out["ndcg"][block] = np.where(idcg_all > 0, dcg_all / np.where(idcg_all > 0, idcg_all, 1.0), 0.0)
    found_all = cum_hits[:, -1]
    has_retrieved = num_retrieved > 0
    set_p = np.where(has_retrieved, found_all / np.where(has_retrieved, num_retrieved, 1), 0.0)
    set_r = np.where(has_relevant, found_all / safe_relevant, 0.0)
    out["precision"][block] = set_p
    out["recall"][block] = set_r
    out["f1"][block] = np.where(found_all > 0, 2 * set_p * set_r / np.where(found_all > 0, set_p + set_r, 1.0), 0.0)
    out["num_retrieved"][block] = num_retrieved
    out["num_relevant"][block] = num_relevant
    out["num_relevant_retrieved"][block] = found_all


# --------------------------------------------------------------------------------------------------------
# Aggregating
# --------------------------------------------------------------------------------------------------------


def aggregate_queries(
    per_query: Sequence[Mapping[str, float]] | Mapping[str, Collection[float]],
    *,
    skip_without_relevant: bool = False,
) -> dict[str, float]:
    """Average per-query measures over queries (the arithmetic mean, as trec_eval's summary line).

    trec_eval divides every measure by the number of evaluated queries, and a query that is in the qrels
    but has no relevant document is evaluated (it scores 0). Averaging every row given here is therefore
    trec_eval's behaviour for queries that appear in the qrels, with ``-c`` for queries whose ranking is
    empty. trec_eval *sums* ``num_ret``, ``num_rel`` and ``num_rel_ret`` in its summary line; here they are
    averaged like everything else (multiply by ``num_queries`` for trec_eval's totals).

    Args:
        per_query: The results of :func:`score_query` for each query (a list of dicts), or the column
            mapping returned by :func:`score_queries`.
        skip_without_relevant: Leave out queries with ``num_relevant == 0`` (no gold document at the
            threshold), which otherwise pull every mean toward 0. Not trec_eval's default.

    Returns:
        Metric name -> mean over the queries kept, plus ``num_queries`` (how many were kept). With no query
        kept, only ``{"num_queries": 0.0}``: there is no mean of nothing, and no NaN is invented.

    Raises:
        ValueError: If the queries do not all have the same metrics.
    """
    columns = _columns(per_query)
    if skip_without_relevant:
        if "num_relevant" not in columns:
            raise ValueError("skip_without_relevant needs the 'num_relevant' count of every query")
        keep = [count > 0 for count in columns["num_relevant"]]
        columns = {
            name: [v for v, k in zip(values, keep, strict=True) if k] for name, values in columns.items()
        }
    num_queries = len(next(iter(columns.values()))) if columns else 0
    if num_queries == 0:
        return {"num_queries": 0.0}
    result = {name: math.fsum(values) / num_queries for name, values in columns.items()}
    result["num_queries"] = float(num_queries)
    return result


def _columns(
    per_query: Sequence[Mapping[str, float]] | Mapping[str, Collection[float]],
) -> dict[str, list[float]]:
    if isinstance(per_query, Mapping):
        columns = {name: [float(v) for v in values] for name, values in per_query.items()}
        lengths = {len(values) for values in columns.values()}
        if len(lengths) > 1:
            raise ValueError(
                f"every metric needs one value per query; got columns of lengths {sorted(lengths)}"
            )
        return columns
    rows = list(per_query)
    if not rows:
        return {}
    names = list(rows[0])
    for index, row in enumerate(rows):
        if set(row) != set(names):
            raise ValueError(
                f"query {index} has metrics {sorted(row)} but query 0 has {sorted(names)}; score every query "
                f"with the same ks"
            )
    return {name: [float(row[name]) for row in rows] for name in names}


# --------------------------------------------------------------------------------------------------------
# trec_eval file formats
# --------------------------------------------------------------------------------------------------------


def _content_lines(path: str | Path) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(line number, fields)`` of non-blank, non-comment lines (``#`` starts a comment line)."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            fields = line.split()
            if fields and not fields[0].startswith("#"):
                yield number, fields


def read_qrels(path: str | Path) -> dict[str, dict[str, int | float]]:
    """Read a trec_eval qrels file: ``query_id iteration doc_id grade`` per line.

    The iteration field is ignored, as by trec_eval. Grades are integers (trec_eval's ``atol``); a
    non-integer grade is kept as a float. Blank lines and lines starting with ``#`` are skipped
    (trec_eval 10.0). Every query in the file is returned, including one whose grades are all 0: trec_eval
    evaluates such a query (it scores 0) and counts it in its averages.

    Args:
        path: The qrels file.

    Returns:
        Query id -> (document id -> grade), in file order.

    Raises:
        ValueError: On a line without 4 fields, a grade that is not a number, or a document judged twice for
            one query (trec_eval: "duplicate docs").
    """
    qrels: dict[str, dict[str, int | float]] = {}
    for number, fields in _content_lines(path):
        if len(fields) != 4:
            raise ValueError(
                f"{path}, line {number}: a qrels line has 4 fields 'query_id iteration doc_id grade'; "
                f"got {len(fields)}"
            )
        query_id, _, doc_id, grade_text = fields
        judged = qrels.setdefault(query_id, {})
        if doc_id in judged:
            raise ValueError(
                f"{path}, line {number}: document {doc_id!r} is judged twice for query {query_id!r}"
            )
        judged[doc_id] = _parse_grade(grade_text, path, number)
    return qrels


def _parse_grade(text: str, path: str | Path, number: int) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{path}, line {number}: the grade {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{path}, line {number}: the grade {text!r} is not a finite number")
    return value


def read_run(path: str | Path) -> dict[str, dict[str, float]]:
    """Read a trec_eval run: ``query_id Q0 doc_id rank score run_id`` per line.

    As in trec_eval, the rank column is ignored (order comes from the score; see :func:`rank_run`), fields
    after ``run_id`` are ignored, and blank and ``#`` lines are skipped.

    Args:
        path: The run file.

    Returns:
        Query id -> (document id -> score), in file order. Rank a query with ``rank_run(run[qid])``.

    Raises:
        ValueError: On a line with fewer than 6 fields, a score that is not a number, or a document
            retrieved twice for one query (trec_eval refuses such a run: "duplicate docs").
    """
    run: dict[str, dict[str, float]] = {}
    for number, fields in _content_lines(path):
        if len(fields) < 6:
            raise ValueError(
                f"{path}, line {number}: a run line has 6 fields 'query_id Q0 doc_id rank score run_id'; "
                f"got {len(fields)}"
            )
        query_id, _, doc_id, _, score_text = fields[:5]
        try:
            score = float(score_text)
        except ValueError:
            raise ValueError(f"{path}, line {number}: the score {score_text!r} is not a number") from None
        scored = run.setdefault(query_id, {})
        if doc_id in scored:
            raise ValueError(
                f"{path}, line {number}: document {doc_id!r} is retrieved twice for query {query_id!r} "
                f"(trec_eval rejects duplicate documents in a run)"
            )
        scored[doc_id] = score
    return run


# --------------------------------------------------------------------------- the metric


class _RetrievalState:
    def __init__(self, ks: tuple[int, ...], have_ids: bool, have_chunks: bool, have_gold: bool) -> None:
        self.ks = ks
        self.have_ids = have_ids
        self.have_chunks = have_chunks
        keys = score_query(["d"], ["d"], ks=ks, validate=False) if have_gold else {}
        self.keys = [k for k in keys if not k.startswith("num_")]


def _setup(ctx: Any) -> _RetrievalState:
    rows = ctx.rows
    have_ids = any(r.retrieved_doc_ids is not None or r.relevant_doc_ids is not None for r in rows)
    have_chunks = any(r.contexts is not None for r in rows) and any(r.reference for r in rows)
    have_gold = any(r.relevant_doc_ids for r in rows)
    return _RetrievalState(validate_ks(ctx.cfg.k), have_ids, have_chunks, have_gold)


def _validate(rows: Sequence[Any], cfg: Any) -> None:
    validate_ks(cfg.k)
    for r in rows:
        if r.relevant_doc_ids:
            validate_retrieval_row(r.retrieved_doc_ids or [], r.relevant_doc_ids, r.index)


def _score(state: _RetrievalState, r: Any, ctx: Any) -> dict[str, Any]:
    out: dict[str, JudgeResult] = {}
    if state.have_ids:
        # A row without gold ids is skipped and counted (not averaged in as 0): a RAG dataset row with no
        # labelled documents is unlabelled, not a query that trec_eval's qrels say has no relevant document.
        if r.relevant_doc_ids:
            scores = score_query(r.retrieved_doc_ids or [], r.relevant_doc_ids, ks=state.ks,
                                 relevance_threshold=ctx.cfg.relevance_threshold, validate=False)
            out.update({k: JudgeResult.scored(scores[k]) for k in state.keys})
        else:
            out.update({k: JudgeResult.abstained("no_gold_ids") for k in state.keys})
    if state.have_chunks:
        names = ("context_rougeL_recall", "context_rougeL_precision", "context_rougeL_f1")
        if r.contexts is None or not r.reference:
            out.update({n: JudgeResult.abstained("no_contexts_or_reference") for n in names})
        else:
            # several acceptable answers: the one the contexts cover best (ROUGE-L recall) counts
            s = max((lexical.context_rouge_l(r.contexts, a) for a in r.acceptable_answers),
                    key=lambda x: -1.0 if x["recall"] is None else x["recall"])
            for n, key in zip(names, ("recall", "precision", "f1")):
                v = s[key]
                out[n] = JudgeResult.scored(v) if v is not None else JudgeResult.abstained("empty_reference")
    return out


def _finish(state: _RetrievalState, rows: Sequence[Any], results: Any, ctx: Any) -> Any:
    fin = Finish()
    if state.have_ids:
        scored = sum(1 for r in rows if r.relevant_doc_ids)
        fin.metrics["retrieval/rows_scored"] = float(scored)
        fin.metrics["retrieval/rows_without_gold_ids"] = float(len(rows) - scored)
        if scored < len(rows):
            fin.skipped["retrieval_rows_without_gold_ids"] = f"{len(rows) - scored} row(s) have no relevant_doc_ids"
    return fin


def _check_ks(k: Any) -> None:
    validate_ks(k)


#: retrieval's own setting
OPTIONS = (Option("k", [1, 3, 5, 10], check=_check_ks, public=lambda k: k),)


def _spec() -> Any:
    return MetricSpec(
        "retrieval",
        options=OPTIONS,
        requires=(("retrieved_doc_ids", "relevant_doc_ids"), ("contexts", "reference")),
        outputs=("precision_at_", "recall_at_", "f1_at_", "hit_rate_at_", "ndcg_at_", "ndcg", "mrr", "map",
                 *SET_KEYS, "context_rougeL_"),
        required_text=(),
        setup=_setup,
        validate=_validate,
        score=_score,
        finish=_finish,
        params=lambda state, ctx: {"ragjudge.k": json.dumps(ctx.cfg.k)},
        description="retrieval: trec_eval-exact P/R/F1/hit rate/nDCG@k, MRR, MAP; chunk-level ROUGE-L coverage",
    )


METRICS = (_spec(),)
