"""Every judged row of a ``ragjudge`` run as an MLflow trace, so that the run's Traces tab and MLflow's
evaluation UI show each row with its judgments.

One trace per row: a root span (the question in, the answer out), a RETRIEVER span with the row's contexts
as documents, and, in a sweep, a span for the call to the user's pipeline. Each metric's per-row result is a
``Feedback`` assessment named after the metric (its value, the judge's rationale, the judge as its source:
``LLM_JUDGE`` with the model, ``CODE`` for deterministic metrics and the offline judge; a failure as the
assessment's error; the transcript's call ids in its metadata); the reference answer is an ``Expectation``
named ``expected_response``. The human labels of a review queue land on the same traces.

Written after the scores, never in the judge's path, and in bulk: each trace is created with its assessments
in one request (``start_trace``), and the spans of many traces go in one ``log_spans`` call. A run logs at
most ``max_traces`` traces (the ``traces`` setting, default :data:`DEFAULT_MAX_TRACES`, 0 = none); beyond it,
a seeded uniform sample of the rows, and the run's ``ragjudge.traces`` tag says so.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import json
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from mlflow.entities import (
    AssessmentError,
    AssessmentSource,
    AssessmentSourceType,
    Expectation,
    Feedback,
    Span,
    TraceInfo,
    TraceLocation,
    TraceState,
)
from mlflow.tracing.client import TracingClient
from mlflow.tracking import MlflowClient

from ..core.stop import await_until_stopped, grace_seconds, stop_reason, stop_requested
from ..core.types import JudgeResult, Row, Status
from ..metrics.spec import all_specs
from .tracking import is_remote_uri, note_unanswered, store_unanswered

#: traces a run logs by default; beyond it, a seeded uniform sample of the rows
DEFAULT_MAX_TRACES = 2000
#: the trace tag MLflow's evaluation gives each row (``TraceTagKey.EVAL_REQUEST_ID``); ours holds the row id
EVAL_REQUEST_ID = "mlflow.eval.requestId"
#: the Expectation that carries the reference answer (MLflow's own name for it)
EXPECTATION_NAME = "expected_response"
TRACE_NAME = "ragjudge_row"
#: spans per ``log_spans`` request
SPAN_BATCH = 500
#: text kept in a span's inputs / outputs and in an assessment's rationale
MAX_TEXT = 20_000


@dataclass
class TraceLog:
    """What :func:`log_row_traces` wrote: ``logged`` traces of ``rows`` rows (``sampled`` when fewer), their ids by
    row index, the seconds it took, and ``errors`` for traces the store refused (the run is logged anyway). Only
    readable traces -- created with their spans -- are counted; ``unwritten`` holds the rows whose trace was meant
    to be written and is not (refused, or not attempted once the store stopped answering or the run was stopped)."""

    rows: int
    logged: int = 0
    sampled: bool = False
    seconds: float = 0.0
    trace_ids: dict[int, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: what stopped the writing (Ctrl-C / SIGTERM), when the run was stopped
    stopped: str | None = None
    #: why the store stopped answering while the traces were written (the rest were not attempted)
    unanswered: str | None = None
    #: the rows (run indices) picked for a trace that has none
    unwritten: list[int] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every picked row has a readable trace."""
        return not self.unwritten and not self.errors and not self.stopped and not self.unanswered

    def describe(self) -> str:
        if self.logged == 0 and self.complete:
            return "no traces (traces=0)" if self.rows else "no rows"
        text = f"{self.logged} of {self.rows} rows as traces"
        if self.sampled:
            text += " (a seeded uniform sample; raise the 'traces' setting for more)"
        if self.unanswered:
            text += f"; the tracking store stopped answering, the rest were not attempted: {self.unanswered[:300]}"
        elif self.errors:
            text += f"; {len(self.errors)} refused by the store: {self.errors[0][:300]}"
        if self.stopped:
            text += f"; the rest not written: the run was stopped by {self.stopped}"
        if self.unwritten and (self.errors or self.unanswered):
            shown = ", ".join(str(i) for i in self.unwritten[:10]) + (" ..." if len(self.unwritten) > 10 else "")
            text += f"; rows without a trace: {shown}"
        return text


def pick_rows(n: int, max_traces: int, seed: int = 0) -> list[int]:
    """The row indices that get a trace: all of them up to ``max_traces``, else a seeded uniform sample, in order."""
    if max_traces <= 0 or n <= 0:
        return []
    if n <= max_traces:
        return list(range(n))
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(n, size=max_traces, replace=False))


# --------------------------------------------------------------------------- what a row's trace holds


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + f"... [{len(value) - MAX_TEXT} more characters]"
    return value


def _plain(value: Any) -> Any:
    """A table cell as a JSON value (numpy scalars and NaN made plain)."""
    if value is None:
        return None
    if isinstance(value, (np.generic,)):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    return value


def metric_owners() -> dict[str, Any]:
    """Result name -> the metric spec that produces it."""
    owners: dict[str, Any] = {}
    for spec in all_specs():
        for name in spec.output_names:
            owners[name] = spec
    return owners


def spec_for(name: str, owners: dict[str, Any]) -> Any:
    if name in owners:
        return owners[name]
    base = name.split("_")[0]  # correctness_<mode> (several context modes in one run)
    return owners.get(base)


def _source(name: str, res: JudgeResult, spec: Any, judge: str | None) -> Any:
    if spec is None or not spec.judged:
        return AssessmentSource(source_type=AssessmentSourceType.CODE, source_id=f"mlflow_ragjudge.{name}")
    used = res.details.get("judge") if isinstance(res.details, dict) else None
    used = used or (res.calls[0].get("model") if res.calls else None) or judge or "unknown"
    kind = AssessmentSourceType.CODE if str(used).startswith("offline:") else AssessmentSourceType.LLM_JUDGE
    return AssessmentSource(source_type=kind, source_id=str(used)[:250])


def feedback_for(name: str, value: Any, res: JudgeResult | None, spec: Any, judge: str | None,
                 run_id: str, calls: Sequence[str], level: Any = None) -> Any:
    """The ``Feedback`` of one metric on one row: the per-row table's value, the rationale, the judge as source; a
    failed row carries its reason as the assessment's error; an abstention has no value and says why (the six-level
    judge's "not sure" keeps the paper's level 0 in the metadata, ``ragjudge.level``, as a scored row keeps its)."""
    res = res or (JudgeResult.scored(value) if value is not None else JudgeResult.abstained("no_score"))
    if res.status is not Status.SCORED:
        value = None  # an abstention or a failure is never a number, whatever the table's cell holds
    meta = {"mlflow.assessment.sourceRunId": run_id, "ragjudge.status": res.status.value}
    if res.reason:
        meta["ragjudge.reason"] = str(res.reason)
    if level is not None:
        meta["ragjudge.level"] = str(int(level))
    if calls:
        meta["ragjudge.call_ids"] = ",".join(calls)[:1000]
    error = None
    if res.status is Status.FAILED:
        error = AssessmentError(error_code=str(res.reason or "failed").upper(),
                                error_message=_clip(res.rationale or f"the judge failed: {res.reason}"))
    rationale = _clip(res.rationale) if res.rationale else None
    if value is None and error is None:  # abstained: no score, and the reason is the rationale
        rationale = rationale or f"no score: {res.reason or res.status.value}"
    return Feedback(name=name, value=value, rationale=rationale, source=_source(name, res, spec, judge),
                    error=error, metadata=meta)


def call_ids(transcripts: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[str]]:
    """(metric, row) -> the ids of its judge calls in the transcripts (a Feedback's ``ragjudge.call_ids``)."""
    calls: dict[tuple[str, int], list[str]] = {}
    for rec in transcripts:
        if rec.get("call_id"):
            calls.setdefault((rec.get("metric", ""), int(rec.get("row", -1))), []).append(str(rec["call_id"]))
    return calls


def row_feedback(i: int, table: pd.DataFrame, out: Any, owners: dict[str, Any], judge: str | None, run_id: str,
                 calls: dict[tuple[str, int], list[str]], user: str) -> list[Any]:
    """:func:`row_assessments` without the reference's Expectation: the judgments alone (a monitor attaches them to a
    trace that has its own expectations, if any)."""
    return [a for a in row_assessments(i, table, out, owners, judge, run_id, calls, user) if isinstance(a, Feedback)]


def row_assessments(i: int, table: pd.DataFrame, out: Any, owners: dict[str, Any], judge: str | None,
                     run_id: str, calls: dict[tuple[str, int], list[str]], user: str) -> list[Any]:
    found = []
    for col in table.columns:
        if "/score@" in col:  # a panel's judge (or a cascade's): one Feedback of its own, the judge as its source
            name, _, label = col.partition("/score@")
            value = _plain(table[col].iloc[i])
            if value is None:  # this judge gave no score here (or was not asked: a cascade): the row's own says why
                continue
            found.append(feedback_for(f"{name}@{label}", value, None, spec_for(name, owners), label, run_id, []))
            continue
        if not col.endswith("/score"):
            continue
        name = col[: -len("/score")]
        spec = spec_for(name, owners)
        res_list = out.results.get(name)
        res = res_list[i] if res_list is not None and i < len(res_list) else None
        value = _plain(table[col].iloc[i])
        if res is None and value is None:  # no result here (a Spark part that did not produce this output)
            continue
        owner = spec.name if spec is not None else name
        level = _plain(table[f"{name}/level"].iloc[i]) if f"{name}/level" in table.columns else None
        found.append(feedback_for(name, value, res, spec, judge, run_id, calls.get((owner, i), []), level))
    if "reference" in table.columns:
        ref = _plain(table["reference"].iloc[i])
        if ref is not None:
            found.append(Expectation(name=EXPECTATION_NAME, value=_clip(ref),
                                     source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=user),
                                     metadata={"mlflow.assessment.sourceRunId": run_id}))
    return found


def _documents(row: Row | None) -> list[dict[str, Any]]:
    if row is None or not row.contexts:
        return []
    ids = list(row.retrieved_doc_ids or [])
    docs = []
    for k, text in enumerate(row.contexts):
        meta: dict[str, Any] = {"rank": k + 1}
        if k < len(ids) and ids[k] is not None:
            meta["doc_uri"] = str(ids[k])
        docs.append({"page_content": _clip(str(text)), "metadata": meta})
    return docs


# --------------------------------------------------------------------------- spans


def _span(trace_id: str, otel_trace: int, span_id: int, parent: int | None, name: str, kind: str,
          start_ns: int, end_ns: int, inputs: Any, outputs: Any, error: str | None = None) -> Any:
    def b64(value: int, size: int) -> str:
        return base64.b64encode(value.to_bytes(size, "big")).decode()

    attrs = {"mlflow.traceRequestId": json.dumps(trace_id), "mlflow.spanType": json.dumps(kind),
             "mlflow.spanInputs": json.dumps(inputs, ensure_ascii=False, default=str),
             "mlflow.spanOutputs": json.dumps(outputs, ensure_ascii=False, default=str)}
    return Span.from_dict({
        "trace_id": b64(otel_trace, 16), "span_id": b64(span_id, 8),
        "parent_span_id": b64(parent, 8) if parent is not None else None, "name": name,
        "start_time_unix_nano": start_ns, "end_time_unix_nano": end_ns, "events": [],
        "status": {"code": "STATUS_CODE_ERROR" if error else "STATUS_CODE_OK", "message": error or ""},
        "attributes": attrs, "links": [],
    })


@dataclass
class _RowTrace:
    index: int
    info: Any
    spans: list[Any]


def _row_trace(i: int, table: pd.DataFrame, row: Row | None, experiment_id: str, run_id: str,
               assessments: list[Any], now_ms: int, pipeline: dict[str, Any] | None,
               meta_extra: dict[str, str] | None = None, position: int | None = None) -> _RowTrace:
    """Row ``i`` of ``table`` as a trace; ``position``: its index in the run, when ``table`` holds only some rows."""
    index = i if position is None else position
    otel = uuid.uuid4().int
    trace_id = f"tr-{otel:032x}"
    question = _plain(table["question"].iloc[i]) if "question" in table.columns else None
    answer = _plain(table["answer"].iloc[i]) if "answer" in table.columns else None
    seconds = float(pipeline.get("seconds") or 0.0) if pipeline else 0.0
    start_ns = now_ms * 1_000_000
    end_ns = start_ns + max(int(seconds * 1e9), 1_000)
    ids = iter(range(1, 1 << 20))
    root = next(ids)
    inputs = {"question": _clip(question)}
    outputs = _clip(answer)  # the answer's text, as MLflow's evaluation UI shows a response
    error = pipeline.get("error") if pipeline else None
    spans = [_span(trace_id, otel, root, None, TRACE_NAME, "CHAIN", start_ns, end_ns, inputs, outputs, error)]
    if pipeline is not None:
        done = {"answer": outputs, "from_cache": pipeline.get("from_cache")}
        spans.append(_span(trace_id, otel, next(ids), root, str(pipeline.get("name") or "pipeline"), "CHAIN",
                           start_ns, end_ns, pipeline.get("inputs"), done, error))
    docs = _documents(row)
    if docs:
        spans.append(_span(trace_id, otel, next(ids), root, "retrieved_contexts", "RETRIEVER", start_ns,
                           start_ns + 1_000, {"query": _clip(question)}, docs))
    row_id = _plain(table["row_id"].iloc[i]) if "row_id" in table.columns else None
    meta = {"mlflow.sourceRun": run_id, "mlflow.trace_schema.version": "3",
            **(meta_extra if meta_extra is not None else {"ragjudge.row": str(index)})}
    if row_id is not None:
        meta["ragjudge.row_id"] = str(row_id)
    info = TraceInfo(
        trace_id=trace_id, trace_location=TraceLocation.from_experiment_id(experiment_id), request_time=now_ms,
        state=TraceState.ERROR if error else TraceState.OK, execution_duration=max(1, int(seconds * 1000)),
        request_preview=json.dumps(inputs, ensure_ascii=False)[:1000],
        response_preview=(outputs or "")[:1000] if isinstance(outputs, str) else json.dumps(outputs)[:1000],
        client_request_id=str(row_id) if row_id is not None else None,
        trace_metadata=meta, tags={"mlflow.traceName": TRACE_NAME, "ragjudge.run_id": run_id,
                                   # the row's identity across runs, as mlflow.genai.evaluate tags its rows: MLflow's
                                   # compare_evaluations pairs two runs' rows on it (on the question alone, a repeated
                                   # question would be ambiguous)
                                   EVAL_REQUEST_ID: str(row_id) if row_id is not None else f"row-{i}"},
        assessments=assessments,
    )
    for a in assessments:
        a.trace_id = trace_id
        a.span_id = f"{root:016x}"
    return _RowTrace(index, info, spans)


# --------------------------------------------------------------------------- writing


def user_name() -> str:
    try:
        return getpass.getuser() or "unknown"
    except Exception:  # no user name in a container
        return "unknown"


def log_row_traces(out: Any, run_id: str, *, max_traces: int = DEFAULT_MAX_TRACES, seed: int = 0,
                   pipeline: Sequence[dict[str, Any] | None] | None = None, workers: int | None = None,
                   positions: Sequence[int] | None = None, total: int | None = None) -> TraceLog:
    """Write one trace per row of ``out`` (an :class:`~mlflow_ragjudge.engine.evaluate.EvalOutput`) into run
    ``run_id``; at most ``max_traces`` (a seeded uniform sample beyond it, none for 0). ``pipeline``: per row, the
    call to the user's pipeline (``{"name", "inputs", "seconds", "error"}``) as a span. A trace the store refuses is
    counted in ``errors``, never raised: the run's metrics and table are logged already.

    ``positions`` and ``total``: ``out`` holds only some rows of a run of ``total`` rows (a Spark run: the rows the
    sample picks, collected from the executors), row k of ``out`` being row ``positions[k]`` of the run. The sample
    is drawn over ``total`` exactly as for a run held whole (:func:`pick_rows`), so the same rows get a trace, with
    the same ``ragjudge.row``; each picked row must be among ``positions``."""
    table = out.table
    n = len(table) if total is None else total
    log = TraceLog(rows=n)
    picked = pick_rows(n, max_traces, seed)
    local = {int(p): k for k, p in enumerate(positions)} if positions is not None else {i: i for i in picked}
    missing = [i for i in picked if i not in local]
    if missing:
        raise ValueError(f"rows {missing[:5]} of the sample are not among the rows given ({len(local)})")
    if not picked:
        return log
    t0 = time.perf_counter()
    mclient = MlflowClient()
    experiment_id = mclient.get_run(run_id).info.experiment_id
    client = TracingClient(mclient.tracking_uri)
    owners = metric_owners()
    judge = out.config.get("judge") if isinstance(out.config.get("judge"), str) else None
    calls = call_ids(out.transcripts)
    rows = list(getattr(out, "rows", None) or [])
    user = user_name()
    now_ms = int(time.time() * 1000)
    traces = []
    for i in picked:
        k = local[i]  # the row's place in ``out``; ``i`` its index in the run
        assessments = row_assessments(k, table, out, owners, judge, run_id, calls, user)
        step = pipeline[k] if pipeline is not None and k < len(pipeline) else None
        # a millisecond apart, so that MLflow's trace list (newest first, or oldest) keeps the rows' order
        traces.append(_row_trace(k, table, rows[k] if k < len(rows) else None, experiment_id, run_id, assessments,
                                 now_ms + i, step, position=i))

    uri = mclient.tracking_uri
    abandoned = _start_traces(client, traces, log, uri, workers or (8 if is_remote_uri(uri) else 1))
    if stop_requested() and len(log.trace_ids) < len(traces):
        # Ctrl-C / SIGTERM (before or while the traces are written): the run's results are logged already
        log.stopped = str(stop_reason() or "a signal")
    if abandoned and not log.unanswered:  # requests still unanswered after the stop's grace period
        log.unanswered = f"{abandoned} trace request(s) unanswered {grace_seconds():g} s after the stop"
        note_unanswered(uri, log.unanswered)
    started = dict(log.trace_ids)
    if not log.unanswered:
        _log_spans(client, experiment_id, [t for t in traces if t.index in started], log, uri)
    # a trace without its spans is not readable: not counted, and removed while the store answers
    lost = [t.info.trace_id for t in traces if t.index in started and t.index not in log.trace_ids]
    if log.unanswered:
        log.trace_ids.clear()
    elif lost:
        with contextlib.suppress(Exception):
            for k in range(0, len(lost), 100):
                client.delete_traces(experiment_id, trace_ids=lost[k: k + 100])
    log.unwritten = sorted(t.index for t in traces if t.index not in log.trace_ids)
    log.logged = len(log.trace_ids)
    log.sampled = len(picked) < n
    log.seconds = time.perf_counter() - t0
    return log


def _start_traces(client: Any, traces: list[_RowTrace], log: TraceLog, uri: str, n_workers: int) -> int:
    """Create each trace with its assessments (``start_trace``); ``n_workers`` at a time. Once one request finds
    the store not answering, no more are sent; after a stop, none either, and the requests in flight are awaited
    for the stop's grace period, no longer. Returns how many were still in flight then (abandoned)."""
    lock = threading.Lock()
    closed: list[bool] = []  # set once the writing goes on without the requests still in flight

    def start(t: _RowTrace) -> None:
        if stop_requested() or log.unanswered:  # a stopped run is logged quickly; a dead store is not asked again
            return
        try:
            client.start_trace(t.info)
        except Exception as e:  # the store refused this one: count it, keep the others
            with lock:
                if closed:
                    return
                log.errors.append(f"row {t.index}: {type(e).__name__}: {str(e)[:300]}")
                if store_unanswered(e) and not log.unanswered:
                    log.unanswered = f"{type(e).__name__}: {str(e)[:300]}"
                    note_unanswered(uri, log.unanswered)
            return
        with lock:
            if not closed:  # an abandoned request that ends later: its trace is not counted (not readable)
                log.trace_ids[t.index] = t.info.trace_id

    if n_workers <= 1:
        for t in traces:
            start(t)
        return 0
    # a remote server takes several requests at once; a local database serialises writes anyway
    pool = ThreadPoolExecutor(n_workers, thread_name_prefix="ragjudge-traces")
    try:
        left = await_until_stopped([pool.submit(start, t) for t in traces])
    finally:
        with lock:
            closed.append(True)
        pool.shutdown(wait=False, cancel_futures=True)
    return sum(1 for f in left if not f.cancelled())


def _log_spans(client: Any, experiment_id: str, traces: list[_RowTrace], log: TraceLog, uri: str) -> None:
    """The spans of the created traces, :data:`SPAN_BATCH` at a time. A batch the store refuses is sent again trace
    by trace, so that only the trace it cannot take loses its spans (and is dropped from ``log.trace_ids``); a store
    that does not answer ends the writing."""
    batch: list[_RowTrace] = []
    batches: list[list[_RowTrace]] = []
    size = 0
    for t in traces:
        if batch and size + len(t.spans) > SPAN_BATCH:
            batches.append(batch)
            batch, size = [], 0
        batch.append(t)
        size += len(t.spans)
    if batch:
        batches.append(batch)
    for group in batches:
        try:
            client.log_spans(experiment_id, [s for t in group for s in t.spans])
            continue
        except Exception as e:
            if store_unanswered(e):
                log.unanswered = f"{type(e).__name__}: {str(e)[:300]}"
                note_unanswered(uri, log.unanswered)
                return
            if len(group) == 1:
                log.errors.append(f"row {group[0].index}: spans: {type(e).__name__}: {str(e)[:300]}")
                log.trace_ids.pop(group[0].index, None)
                continue
        for t in group:  # one by one: which trace did the store refuse?
            try:
                client.log_spans(experiment_id, t.spans)
            except Exception as e:
                log.errors.append(f"row {t.index}: spans: {type(e).__name__}: {str(e)[:300]}")
                log.trace_ids.pop(t.index, None)
                if store_unanswered(e):
                    log.unanswered = f"{type(e).__name__}: {str(e)[:300]}"
                    note_unanswered(uri, log.unanswered)
                    return


def log_failed_calls(run_id: str, failed: Sequence[tuple[int, str, dict[str, Any]]], *,
                     max_traces: int = DEFAULT_MAX_TRACES) -> int:
    """The questions a sweep's pipeline failed on, as traces in the variant's run: state ERROR, the question in, the
    call's span with the error, no assessments (nothing was judged); ``failed`` holds ``(question index, question,
    call)`` with the call as :func:`log_row_traces` takes it plus its ``error``. Metadata ``ragjudge.question`` (the
    question's index in the data) and ``ragjudge.generation_error``; no ``ragjudge.row`` (the row is not in the
    per-row table). At most ``max_traces``; a store that refuses them is not an error (returns how many were
    written)."""
    if max_traces <= 0 or not failed or stop_requested():  # a stopped sweep logs quickly
        return 0
    mclient = MlflowClient()
    experiment_id = mclient.get_run(run_id).info.experiment_id
    client = TracingClient(mclient.tracking_uri)
    picked = list(failed)[:max_traces]
    table = pd.DataFrame({"question": [q for _, q, _ in picked]})
    now_ms = int(time.time() * 1000)
    written = 0
    for k, (j, _, call) in enumerate(picked):
        error = str(call.get("error") or "the pipeline failed")
        extra = {"ragjudge.question": str(j), "ragjudge.generation_error": error[:5000]}
        t = _row_trace(k, table, None, experiment_id, run_id, [], now_ms + k, {**call, "error": error}, extra)
        try:
            client.start_trace(t.info)
            client.log_spans(experiment_id, t.spans)
            written += 1
        except Exception:  # the run and its generations table say the same; the trace is a view
            continue
    return written


def remove_row_traces(run_id: str, *, failed_calls: bool = True) -> int:
    """Delete the row traces an earlier logging of the same run wrote (a run logged again, a sweep's variant
    finished later, a run killed while it wrote them), found by the run they name, whatever the run's tags say;
    returns how many. ``failed_calls=False`` keeps the traces of a sweep's failed pipeline calls
    (:func:`log_failed_calls`, written before the run's rows)."""
    mclient = MlflowClient()
    experiment_id = mclient.get_run(run_id).info.experiment_id
    client = TracingClient(mclient.tracking_uri)
    ids: list[str] = []
    token = None
    while True:
        page = client.search_traces(locations=[experiment_id], run_id=run_id, max_results=500, page_token=token,
                                    filter_string=f"tag.`ragjudge.run_id` = '{run_id}'", include_spans=False)
        ids.extend(t.info.trace_id for t in page
                   if failed_calls or "ragjudge.question" not in (t.info.trace_metadata or {}))
        token = page.token
        if not token:
            break
    for k in range(0, len(ids), 100):
        client.delete_traces(experiment_id, trace_ids=ids[k: k + 100])
    return len(ids)
