"""Evaluate a Spark DataFrame where its rows are: ``mlflow_ragjudge.spark.evaluate_spark``.

The rows are scored in the executors (``mapInPandas`` over the partitions; each Python worker builds one judge client
from the run's config and keeps it across its tasks) and never collected to the driver. Each part hands back the
sums and counts behind the run's numbers (:mod:`mlflow_ragjudge.engine.parts`), and the driver adds them up into the
metrics :func:`~mlflow_ragjudge.evaluate_frame` gives on the same rows, and logs one MLflow run. Four passes over the
data, only the third of which can call a judge:

1. the rows per partition (a count in the JVM), so that every row has its position in the whole data;
2. every check ``evaluate_frame`` makes before any judge call, on every partition; the first error (in the order of
   the data) is raised on the driver, with the row numbered as in the whole data, and nothing is sent;
3. the scoring, persisted, so that nothing is scored twice;
4. the per-row ids (a repeated question gets ``-2``, ``-3`` ... in the order of the whole data, as in one process).

The run's per-row table (a seeded sample of ``table_rows`` rows) and its traces (the rows the pandas path's seeded
sample of ``traces`` picks, drawn over the whole data with the same seed) are the only rows collected to the driver.

Needs the ``spark`` extra (``pip install 'mlflow-ragjudge[spark]'``: pyspark and pyarrow).
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..core.constants import VERSION, is_offline_judge
from ..core.errors import InputError, SparkPandasWarning
from ..core.types import JudgeResult, Row, Status
from ..engine.aggregate import gate_outcome
from ..engine.config import RagJudgeConfig
from ..engine.evaluate import EvalOutput
from ..engine.inputs import LIST_COLUMNS, TEXT_COLUMNS, row_ids, row_key
from ..engine.parts import USAGE_KEYS, check_splittable, evaluate_part, merge_parts, part_summary, validate_part
from ..engine.prepare import build_client
from ..engine.select import select_metrics
from ..llm.cache import check_cache_path
from ..llm.client import JudgeClient
from .spark_pace import job_pace
from .spark_stop import stoppable

#: rows of the per-row table logged with the run (a seeded sample; ``table_rows="all"`` logs every row)
DEFAULT_TABLE_ROWS = 1000
#: columns the scoring pass adds and the result drops
_ROW, _KEY, _CELLS, _PART = "_ragjudge_row", "_ragjudge_key", "_ragjudge_cells", "_ragjudge_part"
#: the scoring pass's column with what a sampled row's trace shows (null on the other rows)
_TRACE = "_ragjudge_trace"
#: per-row table columns that repeat an input column
_FROM_INPUT = ("question", "answer", "reference", "group", "row_id")


@dataclass
class SparkEvaluation:
    """What :func:`evaluate_spark` gives.

    Attributes:
        rows: a Spark DataFrame: the input columns and every per-row result, named as in the per-row table
            (``correctness/score``, ``correctness/status`` ..., ``row_id``), ready to write to Parquet or Delta.
            It is read from the scoring pass, which stays persisted (cached by Spark) so that nothing is scored
            twice: call :meth:`unpersist` once the rows are written. (While it is persisted, Spark answers an
            identical evaluation of the same data from it.)
        metrics: the run's aggregates, with the names and values ``evaluate_frame`` gives on the same rows.
        run_id: the MLflow run they were logged to (None with ``log=False``).
        config: the run's record (``ragjudge/config.json``).
        failures: judged metrics that failed on more than ``max_error_rate`` of their rows.
        skipped: metric -> why it did not run.
    """

    rows: Any
    metrics: dict[str, float]
    run_id: str | None
    config: dict[str, Any]
    params: dict[str, str]
    failures: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    #: the ``fail_under`` quality gate, as ``EvalOutput.gate`` (on the intervals of the merged sums)
    gate: list[dict[str, Any]] = field(default_factory=list)

    scored: Any = field(default=None, repr=False)
    #: every output's name (``correctness``, ``precision_at_5`` ...)
    outputs: list[str] = field(default_factory=list)
    #: with ``collect=True``: every row's results on the driver, as an :class:`EvalOutput` (its per-row table's
    #: question / answer / reference / ``<output>/score`` cells and ``row_id``, the results, the rows' contexts)
    output: EvalOutput | None = field(default=None, repr=False)
    #: ``ragjudge evaluate --spark-output``: why the rows could not be written there, and where the results are
    unwritten: str | None = None

    @property
    def results(self) -> dict[str, list[Any]]:
        """Output name -> [] (the per-row results are in :attr:`rows`; the CLI's summary reads the names)."""
        return {name: [] for name in self.outputs}

    @property
    def gate_passed(self) -> bool:
        return all(g["passed"] for g in self.gate)

    def unpersist(self) -> None:
        """Free the persisted scoring pass (``rows`` is computed again, judge calls included, if read after)."""
        if self.scored is not None:
            self.scored.unpersist()


def _pyspark() -> Any:
    try:
        import pyspark.sql.functions as F  # noqa: N812  (Spark's own convention)
    except ImportError as e:  # the extra is not installed
        raise ImportError("mlflow_ragjudge.spark needs pyspark and pyarrow: pip install 'mlflow-ragjudge[spark]'"
                          ) from e
    return F


# ----------------------------------------------------------------------------------------------- pandas 3 and PySpark

#: the start of PySpark's warning about the installed pandas (``pyspark/sql/pandas/utils.py``; PySpark 4.x gives it
#: for pandas >= 3 at session start and at every pandas conversion: three times in one ``ragjudge evaluate --spark``)
PYSPARK_PANDAS_WARNING = "PySpark does not yet fully support pandas"
_NOTE = {"given": False}
_NOTE_LOCK = threading.Lock()


@contextmanager
def pandas_support_note() -> Iterator[None]:
    """Within: PySpark's warning that it does not fully support the installed pandas is held back, and said once per
    process in our words (:class:`~mlflow_ragjudge.core.errors.SparkPandasWarning`): what it means for this
    package and what to do. Nothing is said when PySpark has nothing to warn about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PYSPARK_PANDAS_WARNING, category=FutureWarning)
        with _NOTE_LOCK:
            first, _NOTE["given"] = not _NOTE["given"], True
        note = _pandas_note() if first else None
        if note is not None:
            warnings.warn(note, SparkPandasWarning, stacklevel=4)  # at the caller of evaluate_spark
        yield


def _pandas_note() -> str | None:
    """What to say about PySpark's warning for the installed pandas, if PySpark gives one (asked the way PySpark
    asks itself before a conversion)."""
    try:
        import pyspark
        from pyspark.sql.pandas.utils import require_minimum_pandas_version
    except ImportError:
        return None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            require_minimum_pandas_version()
        except Exception:  # a pandas too old for PySpark: PySpark's own error comes at the first conversion
            return None
    theirs = next((str(w.message) for w in seen if PYSPARK_PANDAS_WARNING in str(w.message)), None)
    if theirs is None:
        return None
    return (f"pyspark {pyspark.__version__} with pandas {pd.__version__}: PySpark warns \"{theirs}\" (said once here, "
            "not at every conversion). mlflow-ragjudge's Spark tests pass on pyspark 4.3 with pandas 3.1, every "
            "per-row result and metric equal to evaluate_frame's. For the pandas PySpark supports: pip install "
            "'pandas>=2.2,<3' (mlflow-ragjudge gives the same results with pandas 2.3). See docs/scaling.md, "
            "'pandas 3 and PySpark'.")


# ----------------------------------------------------------------------------------------------- the driver's checks

def _check_schema(schema: Any, cfg: RagJudgeConfig) -> None:
    """Spark types that cannot hold what a column needs, refused before any row is read (the cells are checked
    row by row in pass 2, with the pandas path's messages)."""
    from pyspark.sql.types import ArrayType, MapType, StringType

    fields = {f.name: f.dataType for f in schema.fields}
    for logical in TEXT_COLUMNS:
        col = cfg.column(logical)
        if col in fields and not isinstance(fields[col], StringType) and not (
                logical == "reference" and isinstance(fields[col], ArrayType)):
            several = ", or array<string> for several acceptable answers" if logical == "reference" else ""
            raise InputError(f"Column '{col}' is a Spark {fields[col].simpleString()} column; it must be string "
                             f"(text){several}. Cast it, e.g. F.col('{col}').cast('string').")
    for logical in (*LIST_COLUMNS, "retrieved_doc_ids", "relevant_doc_ids", "citations"):
        col = cfg.column(logical)
        if col not in fields:
            continue
        t = fields[col]
        ok = isinstance(t, (ArrayType, StringType)) or (logical == "relevant_doc_ids" and isinstance(t, MapType))
        if not ok:
            raise InputError(f"Column '{col}' is a Spark {t.simpleString()} column; it must be array<string> (a list, "
                             "one item per passage or id) or a string holding a JSON list. Build it with "
                             f"F.array(...) or F.from_json('{col}', 'array<string>').")
        if isinstance(t, ArrayType) and logical in LIST_COLUMNS and not isinstance(t.elementType, StringType):
            raise InputError(f"Column '{col}' is a Spark {t.simpleString()} column; passages must be strings: "
                             "array<string>.")


def _check_rows(sdf: Any, run_cfg: dict[str, Any]) -> tuple[dict[int, int], int]:
    """Pass 1, the checks before any judge call: every cell (the pandas path's checks), the judge's credentials on the
    executors, and each partition's rows. Returns the position of each partition's first row in the whole data
    (counted the way the scoring pass sees the partitions: in Python, by task; every partition has one, empty or
    not) and the number of rows.

    One pass: the partitions validate their rows numbered from their own start. Only when one fails is the data read
    again, numbered in the whole data, to name the first bad cell in the order of the data as the pandas path does."""
    schema = "part long, first_row long, n long, error string"
    found = sdf.mapInPandas(_Validate(run_cfg), schema).collect()
    counts: dict[int, int] = {}
    for row in found:
        counts[int(row["part"])] = counts.get(int(row["part"]), 0) + int(row["n"])
    offsets, at = {}, 0
    for p in sorted(counts):
        offsets[p] = at
        at += counts[p]
    if at and any(row["error"] is not None for row in found):
        first = (sdf.mapInPandas(_Validate(run_cfg, offsets), schema).where("error IS NOT NULL")
                 .orderBy("first_row").limit(1).collect())
        raise InputError(first[0]["error"])
    return offsets, at


def _partition_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return int(ctx.partitionId()) if ctx is not None else 0


# ----------------------------------------------------------------------------------------------- in the executors

_CLIENTS: dict[str, JudgeClient] = {}
_CLIENTS_LOCK = threading.Lock()


def _client(cfg: RagJudgeConfig) -> JudgeClient | None:
    """This Python worker's judge client for the run's config, built once and kept across its tasks (its provider
    gate, its connections and the structured-output mode it negotiated carry over)."""
    if cfg.judge is None or is_offline_judge(cfg.judge):
        return None
    key = json.dumps(cfg.as_dict(), sort_keys=True, default=str)
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            _CLIENTS[key] = build_client(cfg)
        return _CLIENTS[key]


def _usage(client: JudgeClient | None) -> dict[str, Any]:
    if client is None:
        return {}
    s = client.summary()
    return {k: s.get(k, 0) for k in USAGE_KEYS} | {"cost_usd": s.get("cost_usd")}


def _minus(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    out = {k: after[k] - before.get(k, 0) for k in USAGE_KEYS if k in after}
    a, b = after.get("cost_usd"), before.get("cost_usd")
    out["cost_usd"] = None if a is None or b is None else a - b
    return out


def _jsonable(value: Any) -> Any:
    """A table cell as JSON: numbers and text as they are, anything else as its JSON text (a string column)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if hasattr(value, "item") and not hasattr(value, "__len__"):
        return _jsonable(value.item())  # numpy scalars
    return json.dumps(value, ensure_ascii=False, default=str)


def _spark_type(values: list[Any]) -> str:
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return "null"
    if kinds <= {float, int}:
        return "double"
    if kinds == {bool}:
        return "boolean"
    return "string"


class _Validate:
    """The checks of pass 1 (picklable for the executors): each batch's partition, first row, rows and first error,
    or none. Rows are numbered from each partition's start, or in the whole data with ``offsets``."""

    def __init__(self, cfg: dict[str, Any], offsets: dict[int, int] | None = None) -> None:
        self.cfg, self.offsets = cfg, offsets

    def __call__(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        cfg = RagJudgeConfig.from_dict(self.cfg)
        part = _partition_id()
        at = (self.offsets or {}).get(part, 0)
        ready = None
        try:
            _client(cfg)  # the judge's credentials must reach the executors
        except (InputError, ValueError) as e:
            ready = (f"On the Spark executors: {e} (an executor's environment comes from the cluster: "
                     "spark.executorEnv.<NAME> or the cluster's secrets, set before the session starts).")
        rows = 0
        for batch in batches:
            error = ready
            try:
                if error is None:
                    validate_part(batch, cfg, at)
                if cfg.column("row_id") in batch.columns:
                    row_ids(batch, cfg, [])  # empty or repeated ids within the batch
            except (InputError, ValueError) as e:
                error = str(e)
            yield pd.DataFrame({"part": [part], "first_row": [at], "n": [len(batch)], "error": [error]})
            at += len(batch)
            rows += len(batch)
        if not rows:  # an empty partition still counts, with no rows
            yield pd.DataFrame({"part": [part], "first_row": [at], "n": [0], "error": [None]})


def _trace_material(out: EvalOutput, k: int) -> dict[str, Any]:
    """What row ``k``'s trace shows (JSON-able): its cells of the per-row table that the trace reads (the question,
    the answer, the reference, each ``<output>/score``), each result's status, reason, rationale and judge, and the
    row's contexts with their ids (the RETRIEVER span)."""
    cells = {c: _jsonable(out.table[c].iloc[k]) for c in out.table.columns
             if c in ("question", "answer", "reference") or c.endswith("/score")}
    results = {}
    for name, res in out.results.items():
        if k < len(res):
            r = res[k]
            judge = r.details.get("judge") if isinstance(r.details, dict) else None
            model = r.calls[0].get("model") if r.calls else None
            results[name] = {"status": r.status.value, "value": r.value, "rationale": r.rationale,
                             "reason": r.reason, "judge": None if judge is None else str(judge),
                             "model": None if model is None else str(model)}
    row = out.rows[k] if k < len(out.rows) else None
    return {"cells": cells, "results": results,
            "contexts": row.contexts if row is not None else None,
            "retrieved_doc_ids": row.retrieved_doc_ids if row is not None else None}


class _Score:
    """Pass 2 (picklable for the executors): each batch evaluated as ``evaluate_frame`` would, its input columns
    passed through with the row's position, id key and result cells; the batch's summary rides on its first row, and
    the rows at the positions in ``traced`` carry what their trace shows."""

    def __init__(self, cfg: dict[str, Any], offsets: dict[int, int], drop: tuple[str, ...],
                 traced: frozenset[int] = frozenset()) -> None:
        self.cfg, self.offsets, self.drop, self.traced = cfg, offsets, drop, traced

    def __call__(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        cfg = RagJudgeConfig.from_dict(self.cfg)
        client = _client(cfg)
        at = self.offsets.get(_partition_id(), 0)
        for batch in batches:
            before = _usage(client)
            out = evaluate_part(batch, cfg, first_row=at, client=client)
            summary = part_summary(out, at, _minus(_usage(client), before) if client is not None else None)
            yield self._rows(batch, out, summary, at)
            at += len(batch)

    def _rows(self, batch: pd.DataFrame, out: EvalOutput, summary: dict[str, Any], at: int) -> pd.DataFrame:
        table = out.table.drop(columns=[c for c in (*_FROM_INPUT, *self.drop) if c in out.table.columns])
        cells = {c: [_jsonable(v) for v in table[c].tolist()] for c in table.columns}
        summary["columns"] = {c: _spark_type(v) for c, v in cells.items()}
        res = batch.copy()
        res[_ROW] = range(at, at + len(batch))
        res[_KEY] = [row_key(r) for r in out.rows]
        res[_CELLS] = [json.dumps({c: cells[c][i] for c in cells}, ensure_ascii=False) for i in range(len(batch))]
        res[_PART] = [json.dumps(summary, default=str)] + [None] * (len(batch) - 1)
        res[_TRACE] = [json.dumps(_trace_material(out, k), ensure_ascii=False, default=str)
                       if at + k in self.traced else None for k in range(len(batch))]
        return res


# ----------------------------------------------------------------------------------------------- the entry point

#: without a pace file (:mod:`.spark_pace`), each task paces at this share of its part of the job's request limit.
#: Tasks in different processes then cannot see each other's request starts, and their arrival jitter at the provider
#: adds a request or two to a full window, which a provider counting a sliding window refuses (measured at 100 %:
#: 2.2 % of the requests refused with 429, each refusal holding its task back for the window's ``retry-after``)
TASK_PACE_SHARE = 0.97


def _executor_config(cfg: RagJudgeConfig, concurrent_tasks: int, pace: str | None = None) -> dict[str, Any]:
    """The config each task runs with: the whole job's request limit (and concurrency, when set: at most
    ``max_concurrency`` in flight over the job, :func:`_within_concurrency`) shared between the tasks that run at
    once -- through the job's pace file ``pace`` when there is one, else as a share per task; no progress bar (the
    driver logs the run and its traces)."""
    d = cfg.as_dict()
    if pace is not None:
        # every task claims its starts from the one pace (the job runs at the whole limit) and is told of every
        # other task's 429 (all wait it out and learn from it)
        d["shared_pace"] = pace
    elif cfg.requests_per_minute:
        d["requests_per_minute"] = cfg.requests_per_minute / concurrent_tasks * TASK_PACE_SHARE
    if cfg.max_concurrency:
        d["max_concurrency"] = max(1, cfg.max_concurrency // concurrent_tasks)
    d["progress"] = False
    return d


def evaluate_spark(sdf: Any, evaluator_config: dict[str, Any] | RagJudgeConfig | None = None, *,
                   experiment: str | None = None, run_name: str | None = None, log: bool = True,
                   table_rows: int | str = DEFAULT_TABLE_ROWS, collect: bool = False) -> SparkEvaluation:
    """Evaluate the rows of a Spark DataFrame in the executors and log one MLflow run from the driver.

    The run holds what ``evaluate_frame`` + logging hold on the same rows: the metrics, a per-row table (here a seeded
    sample of ``table_rows`` rows), and one trace per row for the rows the config's ``traces`` and ``seed`` pick
    (all rows up to ``traces``, default 2000, else the pandas path's seeded sample: the same rows, the same traces).

    Args:
        sdf: one row per question, with the columns ``evaluate_frame`` reads (``col_mapping`` renames them):
            text columns as string, ``contexts`` / ids as array<string> (or JSON text).
        evaluator_config: the run's config, as for ``mlflow.evaluate(..., evaluator_config=...)``. ``cache`` (a
            path every executor reaches) and ``requests_per_minute`` (for the whole job: shared between the tasks
            that run at once) matter most on a cluster; see docs/scaling.md.
        experiment: the MLflow experiment's name (created if needed); default: the active one.
        run_name: the run's name.
        log: False: compute, log nothing (``run_id`` is None).
        table_rows: rows of the per-row table logged with the run (a seeded sample), or ``"all"``.
        collect: bring every row's results to the driver (``SparkEvaluation.output``), for a caller that acts on
            each one (``ragjudge monitor`` attaches them to traces); with ``log=False`` only. The data must fit on
            the driver (its results do: a few hundred bytes per row).

    Raises:
        InputError: a missing column, a column of the wrong Spark type, or a bad cell (the first in the order of
            the data, named as the pandas path names it): before any judge call.
        Interrupted: Ctrl-C or SIGTERM (in the main thread) came before the run was logged: its Spark jobs were
            cancelled, nothing was logged (:mod:`.spark_stop`).
    """
    cfg = evaluator_config if isinstance(evaluator_config, RagJudgeConfig) else \
        RagJudgeConfig.from_dict(evaluator_config or {})
    check_splittable(cfg)
    check_cache_path(cfg.cache)  # the user's own file named as the cache: refused here, not in every task
    with pandas_support_note(), stoppable(sdf.sparkSession, cfg), \
            job_pace(cfg, sdf.sparkSession.sparkContext) as pace:  # Ctrl-C: our stop, not PySpark's (spark_stop)
        return _evaluate_spark(sdf, cfg, experiment, run_name, log, table_rows, collect, pace)


def _evaluate_spark(sdf: Any, cfg: RagJudgeConfig, experiment: str | None, run_name: str | None, log: bool,
                    table_rows: int | str, collect: bool = False,
                    pace: tuple[str | None, str] = (None, "none")) -> SparkEvaluation:
    F = _pyspark()  # noqa: N806
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    if collect and log:
        raise ValueError("collect=True brings every row's results to the driver for the caller to log: use it with "
                         "log=False")
    if not (table_rows == "all" or (isinstance(table_rows, int) and table_rows >= 0)):
        raise ValueError(f"table_rows={table_rows!r}: give a number of rows >= 0, or 'all'.")
    _check_schema(sdf.schema, cfg)
    select_metrics(pd.DataFrame(columns=sdf.columns), cfg)  # missing columns: the pandas path's error, at once
    t0 = time.perf_counter()
    sdf, slots = _within_concurrency(sdf, cfg)
    id_col = cfg.column("row_id")
    if id_col in sdf.columns:
        dup = [r[0] for r in sdf.groupBy(id_col).count().where("count > 1").limit(3).collect()]
        if dup:
            raise InputError(f"Column '{id_col}' (row ids) repeats {dup}; row ids must be unique (they key human "
                             "labels).")
    # 1. every check before any judge call, and where each partition's rows start
    offsets, n_rows = _check_rows(sdf, _executor_config(cfg, slots, pace[0]))
    if not n_rows:
        raise InputError("The data has no rows: pass at least one row with question/answer/reference columns.")
    partitions = len(offsets)
    concurrent = min(partitions, slots)
    run_cfg = _executor_config(cfg, concurrent, pace[0])
    # 2. the scoring, once; the rows the traces' sample picks (as the pandas path picks them) carry their trace
    human = tuple(dict.fromkeys([*cfg.human_columns, *cfg.human_labels.values()]))
    traced: list[int] = []
    if log:
        from .traces import pick_rows  # (imports mlflow: on the driver, not in every executor's Python worker)

        traced = pick_rows(n_rows, cfg.traces, cfg.seed)
    elif collect:
        traced = list(range(n_rows))
    schema = StructType([*sdf.schema.fields, StructField(_ROW, LongType()), StructField(_KEY, StringType()),
                         StructField(_CELLS, StringType()), StructField(_PART, StringType()),
                         StructField(_TRACE, StringType())])
    scored = sdf.mapInPandas(_Score(run_cfg, offsets, human, frozenset(traced)), schema)
    scored = scored.persist()
    try:
        parts = [json.loads(r[0]) for r in scored.where(F.col(_PART).isNotNull()).select(_PART).collect()]
    except Exception as e:  # a task failed as often as Spark allows (a bug, or an executor that kept dying)
        scored.unpersist()
        raise RuntimeError(_task_failure(e, cfg)) from e
    merged = merge_parts(parts, cfg)
    gate = gate_outcome(cfg.fail_under, merged.metrics, merged.summaries, cfg.gate_rule)
    # 3. the per-row result columns, typed, and the row ids as one process numbers them
    types: dict[str, str] = {}
    for p in sorted(parts, key=lambda p: p["first_row"]):
        for c, t in p["columns"].items():
            if t == "null":  # no value in this part says nothing about the column's type
                types.setdefault(c, "null")
            else:
                types[c] = t if types.get(c) in (None, "null", t) else "string"
    ddl = {"double": "double", "boolean": "boolean", "string": "string", "null": "string"}
    cell_schema = StructType.fromDDL(", ".join(f"`{c}` {ddl[t]}" for c, t in types.items())) if types else None
    # results of an earlier evaluation among the input columns are replaced by this one's
    rows = scored.drop(*[c for c in types if c in sdf.columns])
    if cell_schema is not None:
        parsed = F.from_json(F.col(_CELLS), cell_schema)
        rows = rows.select("*", *[parsed.getField(c).alias(c) for c in types])
    if id_col not in sdf.columns:
        rows = _with_row_ids(rows)
    sample = _table_sample(rows, cfg, table_rows, merged.rows) if log else pd.DataFrame()  # (log=False: no table)
    picked = _traced_rows(rows, cfg, traced)
    rows = rows.drop(_KEY, _CELLS, _PART, _ROW, _TRACE)
    wall = round(time.perf_counter() - t0, 3)
    record = _record(cfg, merged, partitions, concurrent, wall, table_rows, len(sample), pace, log)
    record["gate"] = gate
    params = {"ragjudge.version": VERSION, **merged.params, "ragjudge.spark.partitions": str(partitions)}
    run_id = _log(merged, params, record, sample, gate, experiment, run_name, picked) if log else None
    outputs = list(dict.fromkeys(o for p in parts for outs in p["summaries"].values() for o in outs))
    output = _traced_output(picked, record) if collect and len(picked) else None
    return SparkEvaluation(rows, merged.metrics, run_id, record, params, merged.failures, merged.skipped, gate,
                           scored, outputs, output)


def _within_concurrency(sdf: Any, cfg: RagJudgeConfig) -> tuple[Any, int]:
    """The data as the scoring pass reads it, and at most how many of its tasks run at once (the tasks at once are
    the fewer of this and the partitions, counted by the checks' pass). Each task sends at most
    ``max_concurrency // tasks at once`` requests (:func:`_executor_config`), so the job never has more than
    ``max_concurrency`` in flight; with fewer allowed in flight than tasks could run at once, the partitions are
    coalesced (in their order, no shuffle) into ``max_concurrency`` -- one request per task, that many tasks (a data
    with no more partitions than that keeps them). The partitions are not counted here: asking Spark for them costs
    the first query's warm-up, about a second, which the checks' pass pays anyway."""
    slots = max(1, int(sdf.sparkSession.sparkContext.defaultParallelism))
    judged = cfg.judge is not None and not is_offline_judge(cfg.judge)
    if judged and cfg.max_concurrency and cfg.max_concurrency < slots:
        sdf = sdf.coalesce(cfg.max_concurrency)
        slots = cfg.max_concurrency
    return sdf, slots


def _task_failure(e: BaseException, cfg: RagJudgeConfig) -> str:
    """What to say when the scoring job failed: the Python error behind it, and what the cache kept."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    python = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b", ln)]
    cause = (python[-1] if python else lines[0] if lines else type(e).__name__)[:500]
    kept = (f"the judge replies paid for so far are in the cache at {cfg.cache}, so a re-run sends only the rest"
            if isinstance(cfg.cache, str) else "with cache=<a path every executor reaches>, a re-run would send "
            "only what was not paid for")
    return (f"The scoring failed in a Spark task, after Spark's retries ({cause}); nothing was logged. A judge or "
            f"parse failure never does this (it fails only its row): see the executor's log for the traceback; "
            f"{kept}.")


def _with_row_ids(rows: Any) -> Any:
    """The ``row_id`` column as one process numbers it: the row's key, with ``-2``, ``-3`` ... for the repeats of a
    key in the order of the data. Only the repeated keys are numbered (a small join, broadcast), so the rows keep
    their partitions and their order."""
    F = _pyspark()  # noqa: N806
    from pyspark.sql import Window

    repeated = rows.groupBy(_KEY).count().where(F.col("count") > 1).select(_KEY)
    n = F.row_number().over(Window.partitionBy(_KEY).orderBy(_ROW))
    numbered = (rows.select(_KEY, _ROW).join(repeated, _KEY)
                .select(_ROW, F.when(n == 1, F.col(_KEY)).otherwise(
                    F.concat(F.col(_KEY), F.lit("-"), n.cast("string"))).alias("_ragjudge_id")))
    return (rows.join(F.broadcast(numbered), _ROW, "left")
            .withColumn("row_id", F.coalesce(F.col("_ragjudge_id"), F.col(_KEY))).drop("_ragjudge_id"))


def _table_sample(rows: Any, cfg: RagJudgeConfig, table_rows: int | str, n_rows: int) -> pd.DataFrame:
    """The per-row table logged with the run: a seeded sample of positions (or every row), laid out as
    ``evaluate_frame``'s. Only the sampled rows leave the executors."""
    F = _pyspark()  # noqa: N806
    if table_rows == "all" or int(table_rows) >= n_rows:
        pick = rows
    else:
        positions = sorted(random.Random(cfg.seed).sample(range(n_rows), int(table_rows)))
        pick = rows.where(F.col(_ROW).isin(positions))
    frame = pick.toPandas().sort_values(_ROW, kind="stable").reset_index(drop=True)
    cells = [c for c in frame.columns if "/" in c]
    out = pd.DataFrame()
    q = cfg.column("question")
    out["question"] = frame[q] if q in frame.columns else [f"row {i}" for i in frame[_ROW]]
    for c in cells:
        out[c] = frame[c]
    for logical in ("answer", "reference", "group"):
        if cfg.column(logical) in frame.columns:
            out[logical] = frame[cfg.column(logical)].map(_plain)
    out["row_id"] = frame[cfg.column("row_id") if cfg.column("row_id") in frame.columns else "row_id"].astype(str)
    return out


def _traced_rows(rows: Any, cfg: RagJudgeConfig, positions: list[int]) -> pd.DataFrame:
    """The rows the traces' sample picked, collected from the scoring pass: their position, row id and what their
    trace shows (only these rows leave the executors)."""
    F = _pyspark()  # noqa: N806
    if not positions:
        return pd.DataFrame({_ROW: [], "row_id": [], _TRACE: []})
    ids = cfg.column("row_id") if cfg.column("row_id") in rows.columns else "row_id"
    frame = rows.where(F.col(_ROW).isin(positions)).select(_ROW, F.col(ids).alias("row_id"), _TRACE).toPandas()
    frame = frame.sort_values(_ROW, kind="stable").reset_index(drop=True)
    frame["row_id"] = frame["row_id"].astype(str)  # as the per-row table shows it (_table_sample)
    return frame


def _traced_output(picked: pd.DataFrame, record: dict[str, Any]) -> EvalOutput:
    """The traced rows as the output :func:`~mlflow_ragjudge.adapters.traces.log_row_traces` reads: their cells of
    the per-row table, their results and their input rows, row k being row ``picked[_ROW][k]`` of the run."""
    material = [json.loads(m) for m in picked[_TRACE]]
    table = pd.DataFrame([m["cells"] for m in material])
    table["row_id"] = picked["row_id"].tolist()
    names = list(dict.fromkeys(name for m in material for name in m["results"]))
    results = {name: [_result(m["results"].get(name)) for m in material] for name in names}
    rows = [Row(index=int(p), contexts=m["contexts"], retrieved_doc_ids=m["retrieved_doc_ids"])
            for p, m in zip(picked[_ROW], material)]
    return EvalOutput({}, table, results, [], {}, record, rows=rows)  # type: ignore[arg-type]


def _result(d: dict[str, Any] | None) -> JudgeResult | None:
    """A result as :func:`_trace_material` kept it: what the trace's Feedback shows (status, value, reason,
    rationale, the judge as its source)."""
    if d is None:
        return None
    return JudgeResult(Status(d["status"]), d["value"], d["rationale"] or "", d["reason"],
                       details={"judge": d["judge"]} if d["judge"] is not None else {},
                       calls=[{"model": d["model"]}] if d["model"] is not None else [])


def _plain(value: Any) -> Any:
    """A cell as the per-row table shows it (several acceptable answers as a JSON list)."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value), ensure_ascii=False)
    return value


def _record(cfg: RagJudgeConfig, merged: Any, partitions: int, concurrent: int, wall: float,
            table_rows: int | str, logged: int, pace: tuple[str | None, str] = (None, "none"),
            log: bool = True) -> dict[str, Any]:
    shared = bool(cfg.requests_per_minute) and pace[0] is not None
    return {
        "package_version": VERSION, "config": cfg.public_params(), "rows": merged.rows,
        "metrics_run": [m for m in merged.params.get("ragjudge.metrics", "").split(",") if m],
        "prompt_versions": merged.prompt_versions, "usage": merged.usage, "usage_by_metric": merged.usage_by_metric,
        "skipped": merged.skipped, "failures": merged.failures, "seconds": wall,
        "spark": {"partitions": partitions, "concurrent_tasks": concurrent, "seconds_in_parts": merged.seconds,
                  "requests_per_minute_per_task": (cfg.requests_per_minute / concurrent * TASK_PACE_SHARE
                                                   if cfg.requests_per_minute and not shared else None),
                  # the job's pace: one file for every task ("driver", "cache" or "config"), or "none" (a share each)
                  "pace_file": pace[1] if shared else "none",
                  "table": "none (log=False)" if not log else "every row" if table_rows == "all"
                  else f"a seeded sample of {logged} rows"},
    }


def _log(merged: Any, params: dict[str, str], record: dict[str, Any], sample: pd.DataFrame,
         gate: list[dict[str, Any]], experiment: str | None, run_name: str | None, picked: pd.DataFrame) -> str:
    """One MLflow run from the driver: the metrics, params, the config record and the per-row table (sample), then
    the traces of the rows the pandas path's sample picks (``picked``, collected from the executors)."""
    import mlflow

    from .run_log import log_output, log_traces

    if experiment is not None:
        mlflow.set_experiment(experiment)
    out = EvalOutput(merged.metrics, sample, {}, [], params, record, None, merged.skipped, {}, merged.failures,
                     gate, [])
    with mlflow.start_run(run_name=run_name) as run:
        mlflow.set_tag("ragjudge.spark", f"{merged.rows} rows in {record['spark']['partitions']} partitions")
        # the table is its own sample (table_rows): the traces come from the rows collected for them
        log_output(out, run.info.run_id, traces=False)
        log_traces(_traced_output(picked, record), run.info.run_id, positions=[int(p) for p in picked[_ROW]],
                   total=merged.rows)
        return str(run.info.run_id)
