"""Logging an evaluation into an MLflow run: a local copy first (:func:`save_local`), then the metrics, params, tags,
per-row table, transcripts and config (:func:`log_output`), then the rows as traces (:func:`log_traces`).

Every entry point that logs a run uses this module: the ``ragjudge`` evaluator of ``mlflow.models.evaluate``, the
CLI (``ragjudge evaluate``, ``ragjudge log-saved``), sweeps (one child run per variant) and ``evaluate_spark`` (one
run from the driver). :mod:`~mlflow_ragjudge.adapters.run_load` reads back what is written here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from ..core.errors import LoggingFailed
from ..engine.evaluate import EvalOutput
from ..engine.intervals import gate_status
from ..engine.record import local_output_root
from .traces import DEFAULT_MAX_TRACES, TraceLog, log_row_traces, remove_row_traces
from .tracking import note_unanswered, replace_table, store_unanswered

__all__ = ["log_output", "log_traces", "save_local", "logged", "Logged", "ROW_CONTEXTS_FILE", "LoggingFailed",
           "TABLE_FILE", "TRANSCRIPTS_FILE", "CONFIG_FILE",
           "META_FILE"]

#: where a run holds what :func:`log_output` logged (artifact paths)
TABLE_FILE = "ragjudge/eval_results_table.json"
TRANSCRIPTS_FILE = "ragjudge/judge_transcripts.jsonl"
CONFIG_FILE = "ragjudge/config.json"
META_FILE = "ragjudge/meta_evaluation.json"
#: in a local save: each row's contexts and retrieved document ids (the traces' retriever spans), not an artifact
ROW_CONTEXTS_FILE = "row_contexts.json"


@dataclass
class Logged:
    """What the last :func:`log_output` of a run in this process did: its traces, the local copy it kept (when the
    traces could not all be written: ``ragjudge log-saved FOLDER --run-id RUN`` writes them later), and why the
    store stopped answering, if it did (the run's end and tags could then not be recorded)."""

    run_id: str
    traces: TraceLog | None = None
    kept: Path | None = None
    unanswered: str | None = None


_LOGGED: dict[str, Logged] = {}


def logged(run_id: str) -> Logged | None:
    """What :func:`log_output` did for ``run_id`` in this process (None if it did not log it)."""
    return _LOGGED.get(run_id)


def _write_json(path: Path, value: Any) -> None:
    with open(path, "w", encoding="utf-8", errors="backslashreplace") as fh:
        json.dump(value, fh, ensure_ascii=False, indent=1, default=str)


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8", errors="backslashreplace") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")


def save_local(out: EvalOutput, label: str = "") -> Path | None:
    """Write an evaluation's results to a local folder before anything is sent to MLflow, so that a
    tracking store that refuses or fails cannot lose what the judge calls paid for.

    The folder (under :func:`local_output_root`) holds ``eval_results_table.json`` (pandas ``split``
    layout), ``judge_transcripts.jsonl``, ``config.json``, ``metrics.json``, ``params.json``, the
    meta-evaluation table and the extra JSONL artifacts. Returns the folder, or None (with a warning)
    when nothing could be written.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidates = [local_output_root(), Path(tempfile.gettempdir()) / "ragjudge-outputs"]
    for root in candidates:
        folder = root / f"{stamp}-{os.getpid()}-{label or 'run'}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _write_json(folder / "eval_results_table.json", out.table.to_dict(orient="split"))
            _write_jsonl(folder / "judge_transcripts.jsonl", out.transcripts)
            _write_json(folder / "config.json", out.config)
            _write_json(folder / "metrics.json", out.metrics)
            _write_json(folder / "params.json", out.params)
            if out.meta is not None:
                _write_json(folder / "meta_evaluation.json", out.meta.to_dict(orient="split"))
            if any(r.contexts for r in out.rows):  # the traces' retriever spans, for ragjudge log-saved
                _write_json(folder / ROW_CONTEXTS_FILE, [
                    {"contexts": r.contexts, "retrieved_doc_ids": r.retrieved_doc_ids} for r in out.rows])
            for name, records in out.artifacts.items():
                _write_jsonl(folder / name, records)
            return folder
        except OSError:
            continue
    warnings.warn("the evaluation's results could not be saved locally before logging (no writable folder in "
                  f"{[str(c) for c in candidates]}); set RAGJUDGE_OUTPUT_DIR", RuntimeWarning, stacklevel=2)
    return None


def log_output(out: EvalOutput, run_id: str, *, saved: Path | None = None, keep_local: bool = False,
               pipeline: Sequence[dict[str, Any] | None] | None = None, traces: bool = True) -> dict[str, Any]:
    """Log an evaluation's metrics, params, tags, table, transcripts and config into a run, and then its rows as
    traces (:func:`~mlflow_ragjudge.adapters.traces.log_row_traces`, at most the config's ``traces``; ``pipeline``:
    per row, the call to the user's pipeline, shown as a span). Into a run that holds a logged evaluation already,
    the tables, files and traces replace the earlier ones (each row once), and a metric is logged only where its
    value differs from the run's. ``traces=False``: no traces here (a Spark run's table is a sample of its rows, so
    the caller logs the traces from the rows it collected, with :func:`log_traces`).

    The results are first saved locally (:func:`save_local`, unless ``saved`` says where they already
    are). Every logging step is attempted even when an earlier one fails; if any failed, the run gets
    the tag ``ragjudge.logging_error`` (when the store takes it) and :class:`LoggingFailed` is raised,
    naming the local folder. On success the local copy is removed unless ``keep_local``.

    Returns the artifact URIs by name.
    """
    from mlflow.entities import Metric, Param, RunTag

    if saved is None:
        saved = save_local(out, run_id[:8])
    client = MlflowClient()
    errors: list[str] = []

    def attempt(step: str, fn: Any) -> None:
        try:
            fn()
        except Exception as e:  # the store refused or failed: keep going, report all at the end
            errors.append(f"{step}: {type(e).__name__}: {str(e)[:300]}")
            if store_unanswered(e):  # in a command, the steps left get one try each
                note_unanswered(client.tracking_uri, errors[-1])

    metrics = {k: float(v) for k, v in out.metrics.items()}
    ts = int(time.time() * 1000)
    params = {k: str(v)[:6000] for k, v in out.params.items()}
    existing: dict[str, str] = {}
    logged: dict[str, float] = {}
    artifact_uri: list[str] = []

    def read_run() -> None:
        run = client.get_run(run_id)
        existing.update(run.data.params)
        logged.update(run.data.metrics)
        artifact_uri.append(run.info.artifact_uri.rstrip("/"))

    attempt("read the run", read_run)
    params = {k: v for k, v in params.items() if existing.get(k) in (None, v)}
    # a run logged again keeps one point per metric: a value the run holds already is not logged a second time
    metric_list = [Metric(k, v, ts, 0) for k, v in sorted(metrics.items()) if not _same_value(logged.get(k), v)]
    for start in range(0, len(metric_list), 1000):  # MLflow takes at most 1,000 metrics per batch
        chunk = metric_list[start: start + 1000]
        attempt("metrics", lambda chunk=chunk: client.log_batch(run_id, metrics=chunk))
    attempt("params and tags", lambda: client.log_batch(
        run_id, params=[Param(k, v) for k, v in params.items() if k not in existing],
        tags=[RunTag(k, v) for k, v in _tags(out).items()]))
    # replaced, not appended: a run logged again (ragjudge log-saved --run-id) holds each row once
    attempt("table", lambda: replace_table(run_id, out.table, TABLE_FILE))
    if out.meta is not None:
        meta = out.meta
        attempt("meta-evaluation table", lambda: replace_table(run_id, meta, META_FILE))
    with tempfile.TemporaryDirectory() as tmp:
        files: dict[str, Any] = {"judge_transcripts.jsonl": lambda p: _write_jsonl(p, out.transcripts),
                                 "config.json": lambda p: _write_json(p, out.config)}
        for name, records in out.artifacts.items():
            files[name] = lambda p, r=records: _write_jsonl(p, r)
        for name, write in files.items():
            path = Path(tmp) / name

            def log(path: Path = path, write: Any = write) -> None:
                write(path)
                client.log_artifact(run_id, str(path), "ragjudge")

            attempt(name, log)
    report = _LOGGED[run_id] = Logged(run_id)
    if not errors and traces:  # the traces are a second view of the table: written once the table is safe
        report.traces = log_traces(out, run_id, pipeline)
        report.unanswered = report.traces.unanswered
    if errors:
        where = f"they are saved at {saved}" if saved is not None else "they could not be saved locally either"
        message = f"Logging to MLflow run {run_id} failed ({'; '.join(errors)}); the results are not lost: {where}."
        try:
            client.set_tag(run_id, "ragjudge.logging_error", message[:5000])
        except Exception:  # the store is unreachable: the exception below still says where the results are
            pass
        raise LoggingFailed(message, saved)
    if report.unanswered:
        report.kept = saved  # the traces the store did not take: ragjudge log-saved SAVED --run-id RUN writes them
    elif saved is not None and not keep_local:
        shutil.rmtree(saved, ignore_errors=True)
    base = artifact_uri[0] if artifact_uri else client.get_run(run_id).info.artifact_uri.rstrip("/")
    return {
        "eval_results_table": f"{base}/{TABLE_FILE}",
        "judge_transcripts": f"{base}/{TRANSCRIPTS_FILE}",
        "config": f"{base}/{CONFIG_FILE}",
    }


def _same_value(logged: float | None, value: float) -> bool:
    return logged is not None and (logged == value or (math.isnan(logged) and math.isnan(value)))


def log_traces(out: EvalOutput, run_id: str, pipeline: Sequence[dict[str, Any] | None] | None = None, *,
               positions: Sequence[int] | None = None, total: int | None = None) -> TraceLog:
    """Write the run's rows as traces (replacing those an earlier logging of the same run wrote) and say how many in
    the run's ``ragjudge.traces`` tag. A store that refuses traces is warned about, not raised: the metrics and the
    per-row table are logged already. ``positions`` / ``total``: ``out`` holds only the rows of a larger run that
    the trace sample picks (:func:`~mlflow_ragjudge.adapters.traces.log_row_traces`)."""
    settings = out.config.get("config") or {}
    limit = DEFAULT_MAX_TRACES if settings.get("traces") is None else int(settings["traces"])
    try:
        # whatever an earlier logging of this run wrote, tagged or not (a run killed while writing its traces); a
        # sweep variant's failed calls, written just before, only when the run was logged before
        tagged = bool(MlflowClient().get_run(run_id).data.tags.get("ragjudge.traces"))
        remove_row_traces(run_id, failed_calls=tagged)
        log = log_row_traces(out, run_id, max_traces=limit, seed=int(settings.get("seed") or 0), pipeline=pipeline,
                             positions=positions, total=total)
    except Exception as e:  # the store has no trace support, or failed
        log = TraceLog(rows=len(out.table) if total is None else total,
                       errors=[f"{type(e).__name__}: {str(e)[:300]}"])
        if store_unanswered(e):
            log.unanswered = log.errors[0]
    if not log.unanswered:  # a store that stopped answering is not asked again
        try:
            MlflowClient().set_tag(run_id, "ragjudge.traces", log.describe()[:5000])
        except Exception:  # the store is unreachable now: the warning below still says it
            pass
    if log.errors or log.unanswered:
        warnings.warn(f"run {run_id}: {log.describe()}", RuntimeWarning, stacklevel=3)
    return log


def _tags(out: EvalOutput) -> dict[str, str]:
    """Run tags that make a failed or gated run visible in the MLflow UI's run list."""
    tags = {"ragjudge.status": "judge_failures" if out.failures else "ok"}
    stopped = out.config.get("interrupted")
    if stopped:  # Ctrl-C / SIGTERM: what is logged is what was done (core.stop)
        tags["ragjudge.status"] = "interrupted"
        tags["ragjudge.interrupted"] = (f"stopped by {stopped['by']}: {stopped['results_not_judged']} of "
                                        f"{stopped['results']} results not judged; re-run to finish (cached replies "
                                        "are not bought again)")
    for f in out.failures:
        tags[f"ragjudge.failure.{f['metric']}"[:250]] = f["message"][:5000]
    if out.gate:
        tags["ragjudge.gate"] = str(gate_status(out.gate))  # passed, failed or undecided
        tags["ragjudge.gate.detail"] = json.dumps(out.gate)[:5000]
    return tags
