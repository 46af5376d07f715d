"""The input layer: one place that turns data into :class:`~mlflow_ragjudge.types.Row` objects and
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
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from ..core.constants import LOGICAL_COLUMNS
from ..core.errors import InputError, InvalidTextWarning
from ..core.text import clean_text
from ..core.types import Row
from .config import RagJudgeConfig

__all__ = [
    "passages",
    "set_references",
    "Repairs",
    "InputError",
    "InvalidTextWarning",
    "Repairs",
    "read_rows",
    "resolve_context_mode",
    "resolve_judge_contexts",
    "resolve_context_modes",
    "resolve_row_contexts",
    "primary_mode",
    "passages_from_retriever",
    "e3_query",
    "as_references",
    "set_references",
    "TEXT_COLUMNS",
    "LIST_COLUMNS",
]

TEXT_COLUMNS = ("question", "answer", "reference")
LIST_COLUMNS = ("contexts", "reference_contexts", "evidence_contexts", "gold_documents")


class Repairs:
    """Text repairs made while reading the data: recorded in the run's config and announced once."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def text(self, value: Any, column: str, row: int) -> Any:
        if isinstance(value, str):
            value, n = clean_text(value)
            if n:
                self.items.append({"row": row, "column": column, "replaced": n})
        return value

    def announce(self) -> None:
        if self.items:
            total = sum(i["replaced"] for i in self.items)
            where = ", ".join(f"row {i['row']} '{i['column']}'" for i in self.items[:5])
            more = f" and {len(self.items) - 5} more" if len(self.items) > 5 else ""
            warnings.warn(
                f"{total} invalid character(s) (lone surrogates, which UTF-8 cannot encode) were replaced with "
                f"U+FFFD in {where}{more}; fix the data's encoding to keep the original text.",
                InvalidTextWarning, stacklevel=3,
            )


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
        )
    return value


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
            "or a list of acceptable answers (list of str).")
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
            ids.append(str(value).strip())
        dup = [i for i, c in Counter(ids).items() if c > 1]
        if dup:
            raise InputError(f"Column '{col}' (row ids) repeats {dup[:3]}; row ids must be unique (they key human "
                             "labels).")
        return ids
    out: list[str] = []
    seen: Counter[str] = Counter()
    for r in rows:
        if r.question is None:
            out.append(f"row-{r.index}")
            continue
        key = json.dumps([r.question, r.acceptable_answers or []], ensure_ascii=False)
        base = hashlib.sha1(key.encode("utf-8", "backslashreplace")).hexdigest()[:12]
        seen[base] += 1
        out.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return out


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
              repairs: Repairs | None = None) -> list[Row]:
    """Every row of ``df`` as a :class:`Row`, checked cell by cell (``required_text``: the text columns
    that must be non-empty in every row, because a metric of the run needs them)."""
    repairs = repairs if repairs is not None else Repairs()
    required = set(required_text)
    present = {logical for logical in LOGICAL_COLUMNS if cfg.column(logical) in df.columns}
    group_col = cfg.group_column or ("group" if "group" in present else None)
    if group_col and group_col != "group" and group_col not in df.columns:
        raise InputError(f"group_column={group_col!r} is not a column of the data ({list(df.columns)}).")
    _check_human_columns(df, cfg)
    rows: list[Row] = []
    for pos, (_, rec) in enumerate(df.iterrows()):
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
                setattr(r, logical, as_list(rec[col], col, pos, mapping_ok=logical == "relevant_doc_ids"))
        if group_col:
            g = rec[group_col] if group_col in df.columns else rec[cfg.column("group")]
            r.group = None if _missing(g) else repairs.text(str(g), group_col, pos)
        rows.append(r)
    return rows


def set_references(row: Row, answers: list[str] | None, column: str, repairs: Repairs) -> None:
    """Fill ``row.reference`` (the first answer) and, for several, ``row.references``."""
    if answers is None:
        return
    answers = [repairs.text(a, column, row.index) for a in answers]
    row.reference = answers[0]
    row.references = answers if len(answers) > 1 else None


# --------------------------------------------------------------------------- judge contexts


def e3_query(question: str, reference: str | Sequence[str]) -> str:
    """The E3 retrieval query: question and reference answer concatenated (seed 000, section 2); with several
    acceptable answers, each on its own line after the question."""
    answers = [reference] if isinstance(reference, str) else list(reference)
    return "\n".join([question, *answers])


def passages_from_retriever(out: Any, row: int) -> list[str]:
    """The passages of a retriever's output (str, dicts with ``text`` / ``page_content``, ``(id, text)`` pairs,
    LangChain / MLflow documents), or an :class:`InputError` saying what it returned and what it must return."""
    if out is None:
        return []
    if isinstance(out, (str, bytes)):
        raise InputError(f"The retriever returned a string for row {row}; it must return a list of passages.")
    if isinstance(out, dict):
        raise InputError(
            f"The retriever returned a dict for row {row} (keys {list(out)[:3]}); it must return a list of passages "
            "(str, dicts with 'text', or (id, text) pairs), e.g. [{'id': 'd1', 'text': '...'}] -- its keys would "
            "otherwise be judged as passages."
        )
    if not isinstance(out, Iterable) or hasattr(out, "page_content"):
        raise InputError(
            f"The retriever returned a {type(out).__name__} for row {row}; it must return a list of passages "
            "(str, dicts with 'text', or (id, text) pairs)."
        )
    passages = []
    for item in out:
        if isinstance(item, str):
            passages.append(item)
        elif isinstance(item, dict) and isinstance(text := item.get("text", item.get("page_content")), str):
            passages.append(text)
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], str):
            passages.append(item[1])
        elif hasattr(item, "page_content"):  # LangChain / MLflow Document
            passages.append(str(item.page_content))
        else:
            raise InputError(
                f"The retriever returned {type(item).__name__} items for row {row}; return str passages, "
                "dicts with 'text', or (id, text) pairs."
            )
    return passages


def resolve_context_mode(mode: str, *, retriever: Any, has: Callable[[str], bool]) -> str:
    """The context mode a run (or a scorer's row) uses; ``has(logical)`` says whether a column is there.

    ``auto``: ``reference`` (E3) when a retriever or reference contexts are given, else ``generation`` (E2)
    when there are contexts, else ``evidence`` when a test set's evidence is there, else ``none``. ``auto``
    never calls anything E3 that was not retrieved with question + reference. An explicit mode whose input is
    missing is an :class:`InputError`.
    """
    if mode == "auto":
        if retriever is not None or has("reference_contexts"):
            return "reference"
        if has("contexts"):
            return "generation"
        if has("evidence_contexts"):
            return "evidence"
        return "none"
    if mode == "reference" and retriever is None and not has("reference_contexts"):
        raise InputError(
            "context_mode='reference' (E3) needs contexts retrieved with question + reference answer: pass "
            "retriever=<callable query -> passages> or add a 'reference_contexts' column."
        )
    if mode == "generation" and not has("contexts"):
        raise InputError("context_mode='generation' (E2) needs a 'contexts' column (the passages the RAG used).")
    if mode == "evidence" and not has("evidence_contexts"):
        raise InputError("context_mode='evidence' needs an 'evidence_contexts' column (as `ragjudge testset` writes).")
    if mode == "gold" and not has("gold_documents"):
        raise InputError("context_mode='gold' needs a 'gold_documents' column (list of gold document texts).")
    return mode


def resolve_context_modes(setting: str | list[str], *, retriever: Any, has: Callable[[str], bool]) -> list[str]:
    """:func:`resolve_context_mode` for each mode of a setting that may be a list; the primary mode (E3 when it
    is among them, else the first) is :func:`primary_mode`."""
    wanted = setting if isinstance(setting, list) else [setting]
    return [resolve_context_mode(m, retriever=retriever, has=has) for m in wanted]


def primary_mode(modes: Sequence[str]) -> str:
    """The mode that multi-turn and single-mode readers use: E3 when it is among ``modes``, else the first."""
    return "reference" if "reference" in modes else modes[0]


def resolve_row_contexts(row: Row, modes: Sequence[str], retriever: Callable[[str], Any] | None,
                         repairs: Repairs | None = None) -> None:
    """A row's judge contexts for every mode (``row.judge_contexts_by_mode`` when there are several), with
    ``judge_contexts`` / ``context_mode`` set to the primary mode's; the retriever is called once per row."""
    primary = primary_mode(modes)
    if len(modes) == 1:
        resolve_judge_contexts(row, primary, retriever, repairs)
        return
    for m in modes:
        resolve_judge_contexts(row, m, retriever, repairs)
        row.judge_contexts_by_mode[m] = list(row.judge_contexts or [])
    row.judge_contexts, row.context_mode = list(row.judge_contexts_by_mode[primary]), primary


def resolve_judge_contexts(row: Row, mode: str, retriever: Callable[[str], Any] | None,
                           repairs: Repairs | None = None) -> None:
    """Set ``row.judge_contexts`` and ``row.context_mode``; calls the retriever for E3 when one is given."""
    repairs = repairs if repairs is not None else Repairs()
    row.context_mode = mode
    if mode == "reference":
        if retriever is not None:
            try:
                out = retriever(e3_query(row.question or "", row.acceptable_answers or [""]))
            except Exception as e:
                raise InputError(
                    f"The retriever raised on row {row.index} ({type(e).__name__}: {e}); fix the retriever or "
                    "precompute a 'reference_contexts' column."
                ) from e
            row.judge_contexts = [repairs.text(p, "retriever output", row.index)
                                  for p in passages_from_retriever(out, row.index)]
        else:
            row.judge_contexts = row.reference_contexts or []
    elif mode == "generation":
        row.judge_contexts = row.contexts or []
    elif mode == "evidence":
        row.judge_contexts = row.evidence_contexts or []
    elif mode == "gold":
        row.judge_contexts = row.gold_documents or []
    else:
        row.judge_contexts = []




