"""Document-level retrieval measures that agree with trec_eval: the formula kernels of the ground floor, as
rouge_score and ranx keep theirs (the ``retrieval`` metric, :mod:`mlflow_ragjudge.metrics.retrieval`, runs them on a
run's rows).

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
import math
import numbers
import threading
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .ir_checks import (
    DEFAULT_KS,
    RELEVANT_COLUMN,
    RETRIEVED_COLUMN,
    RankedIds,
    Relevant,
    short_repr,
    validate_ks,
    validate_retrieval_columns,
    validate_retrieval_row,
    validate_threshold,
)

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

_Id = TypeVar("_Id", bound=Hashable)

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
# The formulas: one kernel per measure, shared by the per-query and the batch path
# --------------------------------------------------------------------------------------------------------
# Each takes the per-query counts as numbers (score_query) or as numpy arrays, one value per query
# (score_queries), and gives the measure the same way: the same operations on the same values, so the two
# paths agree bit for bit. A zero denominator gives 0 (trec_eval's convention), never NaN.


def _is_array(x: Any) -> bool:
    return getattr(x, "ndim", 0) > 0


def ratio(num: Any, den: Any) -> Any:
    """``num / den``, 0 where ``den`` is 0."""
    if _is_array(den):
        import numpy as np

        return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
    return num / den if den else 0.0


def harmonic_mean(p: Any, r: Any, found: Any) -> Any:
    """``2pr / (p + r)``, 0 where nothing relevant was found (both are 0)."""
    if _is_array(found):
        import numpy as np

        return np.where(found > 0, 2 * p * r / np.where(found > 0, p + r, 1.0), 0.0)
    return 2 * p * r / (p + r) if found else 0.0


def precision_at_k(found: Any, k: int) -> Any:
    """``hits@k / k`` (trec_eval ``P_k``): missing ranks count as misses."""
    return found / k


def recall_at_k(found: Any, num_relevant: Any) -> Any:
    """``hits@k / R`` (trec_eval ``recall_k``); 0 when ``R == 0``."""
    return ratio(found, num_relevant)


def hit_rate_at_k(found: Any) -> Any:
    """1 when a relevant document is in the first k (trec_eval ``success_k``)."""
    if _is_array(found):
        return (found > 0).astype(float)
    return 1.0 if found else 0.0


def ndcg_value(dcg: Any, idcg: Any) -> Any:
    """``DCG / IDCG``, 0 when ``IDCG == 0`` (trec_eval ``ndcg``, ``ndcg_cut_k``)."""
    return ratio(dcg, idcg)


def reciprocal_rank(first_rank: Any) -> Any:
    """``1 / rank`` of the first relevant document (1-based); 0 when none was retrieved (``first_rank`` 0)."""
    return ratio(1.0, first_rank)


def average_precision(ap_sum: Any, num_relevant: Any) -> Any:
    """The sum of precision at each relevant retrieved rank, over ``R`` (trec_eval ``map``); 0 when ``R == 0``."""
    return ratio(ap_sum, num_relevant)

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
                f"score of {doc_id!r} is {short_repr(score)}; rank_run needs a number (not NaN) for every id"
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
    threshold = validate_threshold(relevance_threshold)
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
        precision = precision_at_k(found, k)
        recall = recall_at_k(found, num_relevant)
        result[f"precision_at_{k}"] = precision
        result[f"recall_at_{k}"] = recall
        result[f"f1_at_{k}"] = harmonic_mean(precision, recall, found)
        result[f"hit_rate_at_{k}"] = hit_rate_at_k(found)
        result[f"ndcg_at_{k}"] = ndcg_value(dcg, idcg)
    for _, term in dcg_terms[next_term:]:
        dcg += term
    for i in range(next_ideal, len(ideal)):
        idcg += ideal[i] / log2[i]

    result["mrr"] = reciprocal_rank(relevant_ranks[0] + 1 if relevant_ranks else 0)
    result["map"] = average_precision(ap_sum, num_relevant)
    result["ndcg"] = ndcg_value(dcg, idcg)
    found_all = len(relevant_ranks)
    set_p = ratio(found_all, num_retrieved)
    set_r = ratio(found_all, num_relevant)
    result["precision"] = set_p
    result["recall"] = set_r
    result["f1"] = harmonic_mean(set_p, set_r, found_all)
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
    threshold = validate_threshold(relevance_threshold)
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

    block = slice(offset, offset + n)
    for k in cutoffs:
        found = cum_hits[:, min(k, width) - 1]
        precision = precision_at_k(found, k)
        recall = recall_at_k(found, num_relevant)
        out[f"precision_at_{k}"][block] = precision
        out[f"recall_at_{k}"][block] = recall
        out[f"f1_at_{k}"][block] = harmonic_mean(precision, recall, found)
        out[f"hit_rate_at_{k}"][block] = hit_rate_at_k(found)
        out[f"ndcg_at_{k}"][block] = ndcg_value(dcg_cum[:, min(k, width) - 1], idcg_cum[:, min(k, ideal_width) - 1])

    any_relevant = cum_hits[:, -1] > 0
    out["mrr"][block] = reciprocal_rank(np.where(any_relevant, np.argmax(relevant_matrix, axis=1) + 1, 0))
    out["map"][block] = average_precision(ap_sum, num_relevant)
    out["ndcg"][block] = ndcg_value(dcg_cum[:, -1], idcg_cum[:, -1])
    found_all = cum_hits[:, -1]
    set_p = ratio(found_all, num_retrieved)
    set_r = ratio(found_all, num_relevant)
    out["precision"][block] = set_p
    out["recall"][block] = set_r
    out["f1"][block] = harmonic_mean(set_p, set_r, found_all)
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


