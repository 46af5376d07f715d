"""Checking retrieval inputs before anything is scored: rank cutoffs, the relevance threshold, and each row's
retrieved ids and gold documents (ids or id -> grade), with errors that name the row, the column and the fix."""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Iterable, Mapping
from typing import Any, TypeAlias

DocId: TypeAlias = str | int
"""A document id. trec_eval treats ids as text; here ``7`` and ``"7"`` are different ids."""

RankedIds: TypeAlias = Collection[DocId]
"""Retrieved ids, best first: a list, tuple or 1-D numpy array (a set or dict is rejected: no order)."""

Relevant: TypeAlias = Collection[DocId] | Mapping[str, float] | Mapping[int, float]
"""Gold documents: ids (all grade 1; a list, tuple, set or numpy array) or a mapping id -> numeric grade."""

DEFAULT_KS: tuple[int, ...] = (1, 3, 5, 10)
"""Cutoffs used when none are given."""

RETRIEVED_COLUMN = "retrieved_doc_ids"
RELEVANT_COLUMN = "relevant_doc_ids"


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


def validate_threshold(relevance_threshold: float) -> float:
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


def short_repr(value: Any, limit: int = 60) -> str:
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
            f"{where}: {what} {position} is {short_repr(item)} ({type(item).__name__}); document ids must be "
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
            f"{where}: got a string {short_repr(value)} where a list of document ids is expected, "
            f"e.g. {example}. "
            f"If the column was read from CSV or JSON text, parse it first, e.g. "
            f"df['{column}'] = df['{column}'].map(json.loads)"
        )
    if not hasattr(value, "__iter__") or not hasattr(value, "__len__"):
        raise ValueError(
            f"{where}: expected a list of document ids, e.g. {example}; got {short_repr(value)} "
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
                f"{where}: the grade of {doc_id!r} is {short_repr(grade)} ({type(grade).__name__}); grades "
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


