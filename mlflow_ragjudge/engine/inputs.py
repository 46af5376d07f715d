"""The input layer: one place that turns data into :class:`~mlflow_ragjudge.core.types.Row` objects and
resolves what the six-level judge sees, for the evaluator, the CLI and the ``mlflow.genai`` scorers alike.

* :func:`read_rows` reads a DataFrame (columns per SPEC 3.1, renamed with ``col_mapping``), checking every
  cell before any judge call: the error names the column, the row and the fix.
* :func:`row_from_mlflow` maps a scorer's ``inputs`` / ``outputs`` / ``expectations`` / ``trace`` to the same
  ``Row``, with the same checks.
* :func:`resolve_context_mode` and :func:`resolve_judge_contexts` decide a row's judge contexts (E3 through
  the retriever or ``reference_contexts``, E2, gold, none) and validate retriever output. A retriever that
  raises or returns something that is not a list of passages is an :class:`InputError` everywhere: the
  evaluator refuses the run before any call; a scorer, which sees one row, fails that row with the same message.

No mlflow import at module level (the scorers' trace helper imports it when a trace is given).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..core.constants import LOGICAL_COLUMNS
from ..core.errors import InputError, InvalidTextWarning
from ..core.text import Repairs, clean_text
from ..core.types import Row
from .config import RagJudgeConfig

__all__ = [
    "passages",
    "set_references",
    "InputError",
    "InvalidTextWarning",
    "Repairs",
    "read_rows",
    "as_references",
    "set_references",
    "TEXT_COLUMNS",
    "LIST_COLUMNS",
    "repaired_ids",
]

TEXT_COLUMNS = ("question", "answer", "reference")
LIST_COLUMNS = ("contexts", "reference_contexts", "evidence_contexts", "gold_documents")


# --------------------------------------------------------------------------- cells


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def as_list(value: Any, column: str, row: int, *, mapping_ok: bool = False) -> Any:
    """Coerce a cell to a list (or dict) of items, or raise naming the fix."""
    if _missing(value):
        return None
    if mapping_ok and isinstance(value, dict):
        return value
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("[") or (mapping_ok and s.startswith("{")):
            try:  # JSON text, as lists arrive from CSV files
                return as_list(json.loads(s), column, row, mapping_ok=mapping_ok)
            except ValueError:
                pass
        raise InputError(
            f"Column '{column}' row {row} holds a string ({value[:60]!r}); it must be a list, e.g. "
            f"['first passage', 'second passage']. Wrap single passages in a list."
        )
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = value.tolist()  # numpy arrays from parquet
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise InputError(
            f"Column '{column}' row {row} holds a {type(value).__name__}; it must be a list"
            + (" or a dict of id -> grade." if mapping_ok else ".")
        )
    return value


_TRUE = {"true", "yes", "1", "y", "t"}
_FALSE = {"false", "no", "0", "n", "f"}


def as_flag(value: Any, column: str, row: int) -> bool | None:
    """A yes/no cell: a bool, 0/1, or the text true/false/yes/no (any case); empty is unknown (None)."""
    if _missing(value):
        return None
    if isinstance(value, bool) or (hasattr(value, "dtype") and str(getattr(value, "dtype", "")) == "bool"):
        return bool(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise InputError(f"Column '{column}' row {row} holds {value!r}; it must be true or false (a bool, 0/1, or the "
                     "text true/false), or empty where unknown.")


def as_text(value: Any, column: str, row: int, *, required: bool) -> str | None:
    if _missing(value):
        if required:
            raise InputError(
                f"Column '{column}' row {row} is empty; every row needs {LOGICAL_COLUMNS.get(column, 'a value')}."
            )
        return None
    if not isinstance(value, str):
        raise InputError(
            f"Column '{column}' row {row} holds a {type(value).__name__} ({str(value)[:40]!r}); it must be text (str)."
            + _AS_TEXT_FIX.format(column=column)
        )
    return value


#: how to fix a number (or another non-text value) in a text column: the frame's column as text; ragjudge's own file
#: readers (the CLI) already read text columns as the text in the file
_AS_TEXT_FIX = (" Convert the column to text as it was written (e.g. read the file with dtype={{'{column}': str}}, "
                "or df['{column}'] = df['{column}'].astype(str)); `ragjudge evaluate FILE` reads text columns as text.")


def as_references(value: Any, column: str, row: int, *, required: bool) -> list[str] | None:
    """A reference cell as its acceptable answers: a str is one answer; a list of str (or JSON text of one, as
    lists arrive from CSV files; or a numpy array from parquet) is several, any of which is correct."""
    if isinstance(value, str):
        s = value.strip()
        if s.startswith('["'):
            try:
                parsed = json.loads(s)
            except ValueError:
                parsed = None
            if isinstance(parsed, list) and parsed and all(isinstance(x, str) for x in parsed):
                value = parsed
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple, str)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        answers = list(value)
        for j, a in enumerate(answers):
            if not isinstance(a, str):
                raise InputError(
                    f"Column '{column}' row {row} item {j} is a {type(a).__name__} ({str(a)[:40]!r}); a list of "
                    "acceptable answers must hold text, e.g. ['Paris', 'the city of Paris'].")
            if not a.strip():
                raise InputError(
                    f"Column '{column}' row {row} item {j} is empty; every acceptable answer in the list needs "
                    "text (drop the empty item).")
        if not answers:
            if required:
                raise InputError(f"Column '{column}' row {row} is an empty list; every row needs "
                                 f"{LOGICAL_COLUMNS.get('reference')} -- one answer, or a list of acceptable ones.")
            return None
        return answers
    if _missing(value):
        if required:
            raise InputError(
                f"Column '{column}' row {row} is empty; every row needs {LOGICAL_COLUMNS.get('reference')}.")
        return None
    if not isinstance(value, str):
        raise InputError(
            f"Column '{column}' row {row} holds a {type(value).__name__} ({str(value)[:40]!r}); it must be text (str), "
            "or a list of acceptable answers (list of str)." + _AS_TEXT_FIX.format(column=column))
    return [value]


def passages(value: Any, column: str, row: int, repairs: Repairs) -> list[str] | None:
    items = as_list(value, column, row)
    if items is None:
        return None
    for j, it in enumerate(items):
        if not isinstance(it, str):
            raise InputError(
                f"Column '{column}' row {row} item {j} is a {type(it).__name__}; passages must be strings.")
    return [repairs.text(it, column, row) for it in items]


def _check_human_columns(df: pd.DataFrame, cfg: RagJudgeConfig) -> None:
    for col in cfg.human_columns:
        if col not in df.columns:
            raise InputError(f"human_columns names {col!r}, which is not a column of the data ({list(df.columns)}).")
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = df[col][vals.isna() & df[col].notna()]
        if len(bad):
            raise InputError(
                f"Human-score column {col!r} row {df.index.get_loc(bad.index[0])} holds {bad.iloc[0]!r}; it must be "
                "a number (leave the cell empty where a row has no human score)."
            )
        inf = vals[vals.isin([float("inf"), float("-inf")])]
        if len(inf):
            raise InputError(
                f"Human-score column {col!r} row {df.index.get_loc(inf.index[0])} holds {inf.iloc[0]}; human scores "
                "must be finite numbers (leave the cell empty where a row has no human score)."
            )


def row_ids(df: pd.DataFrame, cfg: RagJudgeConfig, rows: Sequence[Row]) -> list[str]:
    """A stable id per row, carried by the per-row table and used to key human labels: the ``row_id`` column when
    the data has one (unique, non-empty), else a hash of the question and the acceptable answers -- the same
    question has the same id in every variant of a sweep -- with ``-2``, ``-3`` ... for repeats, in order; a row
    with no question is ``row-<position>``."""
    col = cfg.column("row_id")
    if col in df.columns:
        ids: list[str] = []
        for pos, value in enumerate(df[col].tolist()):
            if value is None or (isinstance(value, float) and value != value) or not str(value).strip():
                raise InputError(f"Column '{col}' (row ids) row {pos} is empty; give every row an id, or drop the "
                                 "column to have ids derived from the question and reference.")
            ids.append(clean_text(str(value).strip())[0])  # as read_rows repaired (and announced) it
        dup = [i for i, c in Counter(ids).items() if c > 1]
        if dup:
            repaired = any("\ufffd" in i for i in dup)
            raise InputError(f"Column '{col}' (row ids) repeats {dup[:3]}; row ids must be unique (they key human "
                             "labels)." + (" Some are the same only once their invalid characters (lone surrogates, "
                                          "which UTF-8 cannot encode) were replaced with U+FFFD: fix the data's "
                                          "encoding so that every id is valid text." if repaired else ""))
        return ids
    out: list[str] = []
    seen: Counter[str] = Counter()
    for r in rows:
        base = row_key(r)
        if r.question is None:
            out.append(base)
            continue
        seen[base] += 1
        out.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return out


def row_key(r: Row) -> str:
    """A row's id before repeats are numbered: a hash of the question and the acceptable answers, or
    ``row-<position>`` for a row with no question (:func:`row_ids` numbers the repeats of a hash ``-2``, ``-3``...
    in order)."""
    if r.question is None:
        return f"row-{r.index}"
    key = json.dumps([r.question, r.acceptable_answers or []], ensure_ascii=False)
    return hashlib.sha1(key.encode("utf-8", "backslashreplace")).hexdigest()[:12]


def off_scale(values: pd.Series, scale: tuple[float, float]) -> pd.Series:
    """Which labels lie outside a metric's ``(low, high)`` scale; on the six-level scale (1..5) a 0 ("not sure") is
    on it."""
    lo, hi = scale
    return values.notna() & ((values < lo) | (values > hi)) & ~((scale == (1.0, 5.0)) & (values == 0))


def check_human_labels(df: pd.DataFrame, cfg: RagJudgeConfig, outputs: Mapping[str, tuple[float, float] | None],
                       *, min_labelled: int) -> None:
    """``human_labels`` (metric -> column), checked before any call: every metric is one the run produces
    (``outputs``: output name -> its scale), every column exists and holds finite numbers on the metric's scale
    (0 also allowed on the six-level scale: "not sure"), and at least ``min_labelled`` rows are labelled."""
    for metric, col in cfg.human_labels.items():
        if metric not in outputs:
            raise InputError(
                f"human_labels names metric {metric!r}, which this run does not produce (it produces "
                f"{', '.join(sorted(outputs)) or 'nothing judged'}); name one of those, or add the metric to "
                "metrics=[...].")
        if col not in df.columns:
            raise InputError(f"human_labels maps {metric!r} to column {col!r}, which is not a column of the data "
                             f"({list(df.columns)}).")
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = df[col][vals.isna() & df[col].notna() & (df[col].astype(str).str.strip() != "")]
        if len(bad):
            raise InputError(f"Human-label column {col!r} row {df.index.get_loc(bad.index[0])} holds "
                             f"{bad.iloc[0]!r}; labels must be numbers on the {metric} scale (leave the cell empty "
                             "where a row is unlabelled).")
        scale = outputs[metric]
        if scale is not None:
            lo, hi = scale
            six_level = scale == (1.0, 5.0)
            off = vals[off_scale(vals, scale)]
            if len(off):
                raise InputError(
                    f"Human-label column {col!r} row {df.index.get_loc(off.index[0])} holds {off.iloc[0]:g}, off the "
                    f"{metric} scale {lo:g}..{hi:g}{' (0 = not sure)' if six_level else ''}: label on the metric's "
                    "own scale (rescale yours), or leave the cell empty.")
        n = int(vals.notna().sum())
        if n < min_labelled:
            raise InputError(
                f"Human-label column {col!r} labels {n} row(s) of {len(df)}; a calibrated interval needs at least "
                f"{min_labelled} randomly chosen labelled rows (fewer and the normal interval is not trustworthy). "
                "Label more (ragjudge label-sample draws a random sample), or use human_columns for meta-evaluation "
                "only.")


def read_rows(df: pd.DataFrame, cfg: RagJudgeConfig, *, required_text: Iterable[str] = (),
              repairs: Repairs | None = None, first_row: int = 0) -> list[Row]:
    """Every row of ``df`` as a :class:`Row`, checked cell by cell (``required_text``: the text columns
    that must be non-empty in every row, because a metric of the run needs them). ``first_row``: the position of
    ``df``'s first row in the whole data when ``df`` is a part of it (a Spark partition), so that rows are numbered
    and named in errors as in the whole."""
    repairs = repairs if repairs is not None else Repairs()
    required = set(required_text)
    present = {logical for logical in LOGICAL_COLUMNS if cfg.column(logical) in df.columns}
    group_col = cfg.group_column or ("group" if "group" in present else None)
    if group_col and group_col != "group" and group_col not in df.columns:
        raise InputError(f"group_column={group_col!r} is not a column of the data ({list(df.columns)}).")
    _check_human_columns(df, cfg)
    rows: list[Row] = []
    for pos, rec in enumerate(_records(df), start=first_row):
        r = Row(index=pos, relevance_threshold=cfg.relevance_threshold)
        for logical in TEXT_COLUMNS:
            if logical in present:
                col = cfg.column(logical)
                if logical == "reference":
                    set_references(r, as_references(rec[col], col, pos, required=logical in required), col, repairs)
                    continue
                setattr(r, logical, repairs.text(as_text(rec[col], col, pos, required=logical in required), col, pos))
        for logical in LIST_COLUMNS:
            if logical in present:
                setattr(r, logical, passages(rec[cfg.column(logical)], cfg.column(logical), pos, repairs))
        if "raw_output" in present:
            col = cfg.column("raw_output")
            r.raw_output = repairs.text(as_text(rec[col], col, pos, required=False), col, pos)
        if "answerable" in present:
            r.answerable = as_flag(rec[cfg.column("answerable")], cfg.column("answerable"), pos)
        for logical in ("retrieved_doc_ids", "relevant_doc_ids", "citations"):
            if logical in present:
                col = cfg.column(logical)
                ids = as_list(rec[col], col, pos, mapping_ok=logical == "relevant_doc_ids")
                setattr(r, logical, repaired_ids(ids, col, pos, repairs))
        if "row_id" in present:  # repaired as text is (row_ids gives the repaired id): announced here
            repairs.text(rec[cfg.column("row_id")], cfg.column("row_id"), pos)
        if group_col:
            g = rec[group_col] if group_col in df.columns else rec[cfg.column("group")]
            r.group = None if _missing(g) else repairs.text(str(g), group_col, pos)
        rows.append(r)
    return rows


def repaired_ids(ids: Any, column: str, row: int, repairs: Repairs) -> Any:
    """Document ids (a list, or a dict of id -> grade) with the lone surrogates of their text replaced as text cells'
    are, so that an id and its copy in another column are still the same id (and the table can be logged)."""
    if isinstance(ids, dict):
        return {repairs.text(k, column, row): v for k, v in ids.items()}
    if isinstance(ids, list):
        return [repairs.text(i, column, row) for i in ids]
    return ids


class _Cells:
    """One row's cells by column name (see :func:`_records`)."""

    __slots__ = ("_values", "_where")

    def __init__(self, values: Any, where: dict[Any, int]) -> None:
        self._values = values
        self._where = where

    def __getitem__(self, col: Any) -> Any:
        return self._values[self._where[col]]


#: cells no dtype is inferred over: a row holding one keeps the object dtype in ``iterrows``' Series
_OPAQUE = (list, tuple, dict, np.ndarray)


def _records(df: pd.DataFrame) -> Iterator[Any]:
    """The rows of ``df`` as ``iterrows`` gives them (``rec[col]``: the cell), without building a Series per row
    where that changes nothing -- a Series per row cost more than everything else :func:`read_rows` does.

    ``iterrows`` cuts each row from ``df.values`` and makes it a Series, which may infer a dtype over the row's
    cells (all strings or missing: a string dtype, ``None`` read as NaN; all dates: datetime64). A row with a list
    (or tuple, dict, array) cell, or of strings only, is left as it is by that inference, so its cells are read
    from ``df.values`` directly; any other row gets the very Series ``iterrows`` makes. Frames with repeated
    column names (where ``rec[col]`` is itself a Series) keep ``iterrows``."""
    if not df.columns.is_unique:
        for _, rec in df.iterrows():
            yield rec
        return
    where = {col: i for i, col in enumerate(df.columns)}
    klass = df._constructor_sliced
    for name, values in zip(df.index, df.values, strict=True):
        types = set(map(type, values))
        if types == {str} or any(issubclass(t, _OPAQUE) for t in types):
            yield _Cells(values, where)
        else:
            yield klass(values, index=df.columns, name=name)


def set_references(row: Row, answers: list[str] | None, column: str, repairs: Repairs) -> None:
    """Fill ``row.reference`` (the first answer) and, for several, ``row.references``."""
    if answers is None:
        return
    answers = [repairs.text(a, column, row.index) for a in answers]
    row.reference = answers[0]
    row.references = answers if len(answers) > 1 else None




