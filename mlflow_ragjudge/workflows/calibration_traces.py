"""Human labels on the ``mlflow.genai`` path, where every row is a trace: :func:`calibrate_traces` reads human
feedback on the traces of a run (assessments named after the metric whose source type is HUMAN, the latest per
trace) and gives the calibrated estimates :mod:`mlflow_ragjudge.workflows.calibration` gives for a label file;
:func:`queue_for_review` puts a random sample of a run's traces into an MLflow review queue, with one label schema
per metric, so that people label them in the MLflow UI."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..adapters import tracking
from ..core.errors import InputError, TooFewLabels
from ..engine.identity import JUDGE_ID_KEY
from ..engine.inputs import off_scale
from ..engine.ppi import CalibratedEstimate, ppi_mean
from ..metrics.spec import all_specs
from .calibration import CALIBRATION_FILE, SAMPLE_FILE, scale_of

__all__ = ["ReviewSample", "calibrate_traces", "human_labels_on_traces", "queue_for_review"]


def _millis(stamp: Any) -> float:
    """An assessment's time in ms, whether MLflow gives milliseconds, a datetime or an ISO string."""
    if stamp is None:
        return 0.0
    if isinstance(stamp, (int, float)):
        return float(stamp)
    try:
        return float(pd.Timestamp(stamp).timestamp() * 1000)
    except (TypeError, ValueError):
        return 0.0

def human_labels_on_traces(traces: pd.DataFrame, metric: str, *, judge_id: str | None = None
                           ) -> tuple[pd.Series, pd.Series]:
    """Per trace id: the judge's latest score named ``metric`` (not HUMAN; with ``judge_id``, only a Feedback whose
    metadata carries that judge identity, :mod:`~mlflow_ragjudge.engine.identity`) and the latest valid HUMAN
    one."""
    judge: dict[str, float] = {}
    human: dict[str, float] = {}
    for _, t in traces.iterrows():
        tid = t["trace_id"]
        latest: dict[bool, tuple[float, float]] = {}
        for a in (t.get("assessments") or []):
            get = a.get if isinstance(a, dict) else (lambda k, a=a: getattr(a, k, None))
            if get("assessment_name") != metric and get("name") != metric:
                continue
            source = get("source")
            stype = (source.get("source_type") if isinstance(source, dict) else getattr(source, "source_type", None))
            fb = get("feedback")
            value = fb.get("value") if isinstance(fb, dict) else getattr(fb, "value", None) if fb is not None else None
            err = fb.get("error") if isinstance(fb, dict) else getattr(fb, "error", None) if fb is not None else None
            meta = get("metadata") or {}
            if get("valid") is False or err or (not str(stype).upper().endswith("HUMAN")
                                                 and meta.get("status") in ("abstained", "failed")):
                continue  # an invalid label, an error, or a judge that gave no score (correctness 0: not sure)
            try:
                v = float(value)  # type: ignore[arg-type]  # None raises TypeError, caught
            except (TypeError, ValueError):
                continue
            if v != v:
                continue
            when = _millis(get("last_update_time_ms") or get("last_update_time") or get("create_time_ms")
                           or get("create_time"))
            is_human = str(stype).upper().endswith("HUMAN")
            if not is_human and judge_id is not None and meta.get(JUDGE_ID_KEY) != judge_id:
                continue  # another judge's score of the same name
            if is_human not in latest or when >= latest[is_human][0]:
                latest[is_human] = (when, v)
        if False in latest:
            judge[tid] = latest[False][1]
        if True in latest:
            human[tid] = latest[True][1]
    ids = list(traces["trace_id"])
    return (pd.Series([judge.get(i, np.nan) for i in ids], index=ids, dtype=float),
            pd.Series([human.get(i, np.nan) for i in ids], index=ids, dtype=float))

def _traces(run_id: str) -> pd.DataFrame:
    """The run's traces, wherever its experiment is; an unknown run is an input error."""
    try:
        return tracking.run_traces(run_id)
    except Exception as e:
        if "RESOURCE_DOES_NOT_EXIST" in str(e) or "not found" in str(e).lower():
            raise InputError(f"No MLflow run {run_id!r} in the tracking store ({str(e)[:200]}); check the run id and "
                             "the tracking URI.") from None
        raise

def calibrate_traces(run_id: str, metrics: Sequence[str], *, alpha: float = 0.05, lam: float | None = None,
                     log: bool = True) -> dict[str, CalibratedEstimate]:
    """Calibrated estimates for an ``mlflow.genai.evaluate`` run from human feedback on its traces.

    For each metric, the judge's score per trace is its latest assessment named after the metric that is not from
    a human, and the label the latest valid assessment of that name whose source type is HUMAN (as the MLflow UI and
    ``mlflow.log_feedback(source=AssessmentSource(source_type="HUMAN", ...))`` record it). Logs
    ``<metric>/ppi_mean`` ... into the run.

    Raises:
        InputError: a run with no traces, a metric with no judge scores, or fewer than 30 human labels.
    """
    traces = _traces(run_id)
    if traces is None or len(traces) == 0:
        raise InputError(f"Run {run_id} has no traces; calibrate_traces is for mlflow.genai.evaluate runs.")
    out: dict[str, CalibratedEstimate] = {}
    values: dict[str, float] = {}
    for m in metrics:
        judge, human = human_labels_on_traces(traces, m)
        if judge.notna().sum() == 0:
            raise InputError(f"No trace of run {run_id} has a judge assessment named {m!r}; name the scorer's metric.")
        scale = scale_of(m)
        if scale is not None:
            lo, hi = scale
            off = human[off_scale(human, scale)]
            if len(off):
                raise InputError(f"Human feedback {off.iloc[0]:g} on trace {off.index[0]} for {m!r} is off the "
                                 f"metric's scale {lo:g}..{hi:g}.")
            if scale == (1.0, 5.0):
                human = human.where(human != 0)
        try:
            est = ppi_mean(judge.to_numpy(), human.to_numpy(), alpha=alpha, lam=lam, scale=scale)
        except TooFewLabels as e:
            raise InputError(f"Run {run_id}, metric {m!r}: {e}") from None
        out[m] = est
        values.update(est.as_metrics(m))
    if log:
        tracking.log_metrics(run_id, values)
        tracking.log_dict(run_id, {m: e.as_dict() for m, e in out.items()}, CALIBRATION_FILE)
    return out

def _judge_names(traces: pd.DataFrame) -> list[str]:
    """The names of the assessments on ``traces`` that are not a person's (what a judge or code scored)."""
    names: set[str] = set()
    for assessments in traces.get("assessments", pd.Series(dtype=object)):
        for a in assessments or []:
            get = a.get if isinstance(a, dict) else (lambda k, a=a: getattr(a, k, None))
            source = get("source")
            stype = source.get("source_type") if isinstance(source, dict) else getattr(source, "source_type", None)
            if not str(stype).upper().endswith("HUMAN"):
                names.add(str(get("assessment_name") or get("name")))
    return sorted(names)


def _check_calibratable(run_id: str, traces: pd.DataFrame, metrics: Sequence[str]) -> None:
    """Refuse, before a queue is made, a metric that :func:`calibrate_traces` could not calibrate: one computed
    exactly (retrieval, lexical: no judge to correct) or one no trace of the run carries a judge's score for."""
    exact = {s.name for s in all_specs() if not s.judged}
    for m in metrics:
        spec = next((s for s in all_specs() if s.produces(m)), None)
        if spec is not None and spec.name in exact:
            raise InputError(f"{m!r} is computed exactly, not judged: there is no judge error for human labels to "
                             "correct, so it cannot be calibrated. Label a judged metric (e.g. correctness, "
                             "faithfulness).")
        judge, _ = human_labels_on_traces(traces, m)
        if judge.notna().sum() == 0:
            found = _judge_names(traces)
            raise InputError(f"No trace of run {run_id} has a judge's score named {m!r}, so labels for it could not "
                             f"be calibrated; the traces carry {', '.join(found) if found else 'no judge scores'}. "
                             "Name one of those with --metrics.")


@dataclass(frozen=True)
class ReviewSample:
    """What :func:`queue_for_review` did: the MLflow review queue, the traces drawn into it, and ``outcome``:
    ``"created"``, ``"reused"`` (the same draw asked for again: the queue already held it) or ``"filled"`` (an empty
    queue of that name, left by an earlier failure, now holds the draw)."""

    queue: Any
    trace_ids: list[str]
    outcome: str

    @property
    def queue_id(self) -> str:
        return str(self.queue.queue_id)

    @property
    def name(self) -> str:
        return str(self.queue.name)

    @property
    def schema_ids(self) -> list[str]:
        return list(self.queue.schema_ids)


def queue_for_review(run_id: str, metrics: Sequence[str], n: int = 100, *, seed: int = 0,
                     queue_name: str | None = None) -> ReviewSample:
    """Put a seeded uniform random sample of an ``mlflow.genai.evaluate`` run's traces into an MLflow review queue
    (``mlflow.genai.review_queues``, experimental, open-source MLflow >= 3.14), with one numeric label schema per
    metric on its scale, so that people label them in the MLflow UI; :func:`calibrate_traces` reads the labels back.
    Returns a :class:`ReviewSample` (the queue, its traces, and whether it was created or the same draw reused).

    Raises:
        InputError: ``n`` < 1, no metric, a run without traces, a metric that cannot be calibrated (computed exactly,
            or no judge score of that name on the traces), or a queue of that name holding another draw; nothing is
            created then.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"n={n!r} must be a whole number >= 1 (traces to label; at least 30 for an interval).")
    if not metrics:
        raise InputError("A review queue needs at least one metric to label (e.g. correctness).")
    traces = _traces(run_id)
    if traces is None or len(traces) == 0:
        raise InputError(f"Run {run_id} has no traces to queue for review.")
    _check_calibratable(run_id, traces, metrics)
    ids = sorted(traces["trace_id"])
    rng = np.random.default_rng(seed)
    picked = [ids[i] for i in sorted(rng.choice(len(ids), size=min(n, len(ids)), replace=False))]
    schemas: dict[str, tuple[float, float, str]] = {}
    for m in metrics:
        lo, hi = scale_of(m) or (0.0, 1.0)
        six = (lo, hi) == (1.0, 5.0)
        schemas[m] = (0.0 if six else lo, hi, f"Your own judgement of {m} for this answer, {lo:g}..{hi:g}"
                      + (" (0 = not sure)" if six else "") + ". Do not look at the judge's score.")
    queue, outcome = tracking.create_review_queue(run_id, picked, schemas,
                                                  queue_name or f"ragjudge-{run_id[:8]}-seed{seed}")
    tracking.log_dict(run_id, {"seed": seed, "n": len(picked), "trace_ids": picked, "metrics": list(metrics),
                               "queue": queue.queue_id}, SAMPLE_FILE)
    return ReviewSample(queue, picked, outcome)
