"""trec_eval's file formats: qrels (``query 0 doc grade``) and runs (``query Q0 doc rank score tag``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

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


