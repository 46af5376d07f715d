"""What ``ragjudge monitor`` reads from and writes to the tracking store: an app's traces (listed without their
spans, then fetched whole), the Feedback attached to them, the trace tag that marks a trace as handled by one
monitor, and the monitor's own state -- its watermark and its lease -- as tags of the app's experiment, so that a
monitor restarted on another machine resumes where the last one stopped.

Each function is one kind of request; :mod:`mlflow_ragjudge.workflows.monitor` decides what to ask.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pandas as pd
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracing.client import TracingClient
from mlflow.tracking import MlflowClient

from ..core.errors import InputError
from .traces import EVAL_REQUEST_ID, TRACE_NAME
from .tracking import bounded_store_retries, is_remote_uri, replace_table

__all__ = ["MonitorStore", "Lease", "PAGE", "monitor_tag", "store_failure", "bounded_store_retries"]

#: traces per search page
PAGE = 500
#: traces per ``batch_get_traces`` request
FETCH_BATCH = 100
#: traces per ``link_traces_to_run`` request
LINK_BATCH = 100
T = TypeVar("T")


def store_failure(e: BaseException) -> bool:
    """Whether an exception is the tracking store failing (MLflow's errors, the HTTP client's, the database's, the
    network's), not a bug of ours: a monitor on a clock then tries again at its next pass."""
    seen: set[int] = set()
    err: BaseException | None = e
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        module = type(err).__module__.split(".")[0]
        if module in ("mlflow", "requests", "urllib3", "sqlalchemy", "sqlite3", "http") or isinstance(err, OSError):
            return True
        err = err.__cause__ or err.__context__
    return False


def monitor_tag(monitor_id: str) -> str:
    """The trace tag that marks a trace as handled by monitor ``monitor_id`` (its value: the pass's run id)."""
    return f"ragjudge.monitor.{monitor_id}"


@dataclass
class Lease:
    """Who runs a monitor now: ``holder`` (host:pid) until ``until`` (epoch seconds)."""

    holder: str
    until: float

    @staticmethod
    def parse(text: str | None) -> Lease | None:
        if not text or "@" not in text:
            return None
        holder, _, until = text.rpartition("@")
        try:
            return Lease(holder, float(until))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.holder}@{self.until:.0f}"

    def alive(self) -> bool:
        """Held: not expired, and, when held on this machine, by a process that still runs."""
        if self.until < time.time():
            return False
        host, _, pid = self.holder.rpartition(":")
        if host == socket.gethostname() and pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return False
            except PermissionError:  # another user's process: it runs
                return True
        return True


def this_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class MonitorStore:
    """The tracking store as a monitor uses it, for experiment ``experiment`` (a name or an id)."""

    def __init__(self, experiment: str, *, workers: int | None = None) -> None:
        self.client = MlflowClient()
        self.tracing = TracingClient(self.client.tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None and experiment.isdigit():
            try:
                exp = self.client.get_experiment(experiment)
            except Exception:  # no experiment of that id either
                exp = None
        if exp is None:
            raise InputError(f"No MLflow experiment {experiment!r} in the tracking store {self.client.tracking_uri}; "
                             "give the name (or id) of the experiment your app logs its traces to "
                             "(mlflow.set_experiment in the app).")
        self.experiment_id: str = exp.experiment_id
        self.experiment_name: str = exp.name
        # a remote server takes several requests at once; a local database serialises writes anyway
        self.workers = workers or (8 if is_remote_uri(self.client.tracking_uri) else 1)

    # -- the app's traces ---------------------------------------------------------------------------------------
    def list_traces(self, filter_string: str | None, after_ms: int | None, limit: int,
                    skip: Callable[[Any], bool] = lambda t: False) -> tuple[list[Any], int, int | None, bool]:
        """The experiment's traces (infos with their assessments and tags, no spans), newest first, started at or
        after ``after_ms``, matching the user's ``filter_string``, but those ``skip`` says (handled already); at
        most ``limit`` of them. Traces of evaluations (a ``ragjudge`` run's rows, ``mlflow.genai.evaluate``'s
        copies) are left out: they are not the app's. Returns ``(traces, how many were skipped, the newest listed
        trace's time, more)``, ``more`` when the limit cut the list."""
        parts = [f"({filter_string})"] if filter_string else []
        if after_ms is not None:
            parts.append(f"timestamp_ms >= {int(after_ms)}")
        query = " AND ".join(parts) or None
        found: list[Any] = []
        skipped = 0
        newest: int | None = None
        token = None
        while True:
            page = self.tracing.search_traces(locations=[self.experiment_id], filter_string=query,
                                              order_by=["timestamp_ms DESC"], max_results=PAGE, page_token=token,
                                              include_spans=False)
            for t in page:
                tags = t.info.tags or {}
                if EVAL_REQUEST_ID in tags or "ragjudge.run_id" in tags or tags.get("mlflow.traceName") == TRACE_NAME:
                    continue
                newest = t.info.timestamp_ms if newest is None else max(newest, t.info.timestamp_ms)
                if skip(t):
                    skipped += 1
                    continue
                found.append(t)
                if len(found) > limit:
                    return found[:limit], skipped, newest, True
            token = page.token
            if not token:
                return found, skipped, newest, False

    def fetch(self, trace_ids: Sequence[str]) -> dict[str, Any]:
        """Each trace whole (its spans: the retrievers' documents), by id, :data:`FETCH_BATCH` per request
        (``batch_get_traces``: 3-4x faster than one request per trace, benchmarks/monitor_attach.py); a trace the
        store cannot give is left out (deleted since it was listed). A store without the batch call is asked one
        trace at a time."""
        ids = list(trace_ids)
        out: dict[str, Any] = {}
        try:
            for k in range(0, len(ids), FETCH_BATCH):
                out.update((t.info.trace_id, t) for t in self.tracing.batch_get_traces(ids[k: k + FETCH_BATCH]))
            return out
        except Exception:  # noqa: BLE001 - an older store or server: one at a time below
            pass

        def get(tid: str) -> tuple[str, Any]:
            try:
                return tid, self.tracing.get_trace(tid)
            except Exception:  # deleted meanwhile, or unreadable: the caller counts it
                return tid, None

        return {tid: t for tid, t in self._each(get, ids) if t is not None}

    def attach(self, trace_id: str, assessments: Sequence[Any], mark: tuple[str, str] | None,
               replace: Sequence[str] = ()) -> None:
        """Log ``assessments`` on the trace, delete the earlier assessments they replace (by id: a try that failed
        on the provider's side), then (all of that done) set the tag ``mark`` = ``(key, value)``: a trace carries
        the mark only once everything is on it."""
        for a in assessments:
            self.tracing.log_assessment(trace_id, a)
        for assessment_id in replace:
            self.tracing.delete_assessment(trace_id, assessment_id)
        if mark is not None:
            self.client.set_trace_tag(trace_id, *mark)

    def attach_all(self, items: Sequence[tuple[str, Sequence[Any], tuple[str, str] | None, Sequence[str]]],
                   should_stop: Callable[[], bool]) -> tuple[list[str], list[str]]:
        """:meth:`attach` for many traces, each ``(trace id, assessments, mark, replaced ids)`` (in parallel on a
        server); ``(attached trace ids, errors)``. Stops starting new ones once ``should_stop()``."""
        def one(item: tuple[str, Sequence[Any], tuple[str, str] | None, Sequence[str]]) -> tuple[str, str | None]:
            tid, assessments, mark, replace = item
            if should_stop():
                return tid, "stopped"
            try:
                self.attach(tid, assessments, mark, replace)
                return tid, None
            except Exception as e:  # the store refused this one: count it, keep the others
                return tid, f"{tid}: {type(e).__name__}: {str(e)[:300]}"

        done: list[str] = []
        errors: list[str] = []
        for tid, err in self._each(one, items):
            if err is None:
                done.append(tid)
            elif err != "stopped":
                errors.append(err)
        return done, errors

    def link(self, trace_ids: Sequence[str], run_id: str) -> None:
        """Link traces to a run (``mlflow.search_traces(run_id=...)`` then finds them: ``ragjudge calibrate``,
        ``label-sample --review-queue`` and judge-report read a pass's traces this way)."""
        ids = list(trace_ids)
        for k in range(0, len(ids), LINK_BATCH):
            self.client.link_traces_to_run(ids[k: k + LINK_BATCH], run_id)

    def run_traces(self, run_id: str) -> list[Any]:
        """The traces linked to a run (infos with assessments)."""
        out: list[Any] = []
        token = None
        while True:
            page = self.tracing.search_traces(locations=[self.experiment_id], run_id=run_id, max_results=PAGE,
                                              page_token=token, include_spans=False)
            out.extend(page)
            token = page.token
            if not token:
                return out

    # -- the monitor's runs ----------------------------------------------------------------------------------------
    def create_run(self, name: str, tags: dict[str, str], params: dict[str, str] | None = None) -> str:
        """A run in the app's experiment (a monitor's, or a pass's: ``mlflow.parentRunId`` in ``tags``)."""
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        if params:
            self.client.log_batch(run.info.run_id, params=[Param(k, v[:6000]) for k, v in params.items()])
        return str(run.info.run_id)

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status)

    def log_run(self, run_id: str, *, metrics: dict[str, float], params: dict[str, str], tags: dict[str, str],
                table: tuple[pd.DataFrame, str] | None = None, texts: dict[str, str] | None = None) -> None:
        """Metrics (finite ones, at step 0), params and tags, a per-row table (``(table, artifact path)``) and text
        artifacts (artifact path -> content) into a run."""
        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, 0) for k, v in sorted(metrics.items()) if math.isfinite(float(v))]
        for k in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[k: k + 1000])
        self.client.log_batch(run_id, params=[Param(k, v[:6000]) for k, v in params.items()],
                              tags=[RunTag(k, v[:5000]) for k, v in tags.items()])
        if table is not None and len(table[0]):
            replace_table(run_id, table[0], table[1])
        for path, content in (texts or {}).items():
            if content:
                self.client.log_text(run_id, content, path)

    def log_series(self, run_id: str, metrics: dict[str, float], step: int, when_ms: int) -> None:
        """One point of each metric's series (``step``, at ``when_ms``): MLflow's charts draw the trend."""
        items = [Metric(k, float(v), int(when_ms), step) for k, v in sorted(metrics.items()) if math.isfinite(v)]
        if items:
            self.client.log_batch(run_id, metrics=items)

    # -- the monitor's own state: experiment tags ------------------------------------------------------------------
    def state(self, key: str) -> str | None:
        return self.client.get_experiment(self.experiment_id).tags.get(key)

    def set_state(self, key: str, value: str) -> None:
        self.client.set_experiment_tag(self.experiment_id, key, value)

    def take_lease(self, key: str, seconds: float) -> Lease:
        """Hold the monitor's lease for ``seconds`` (a monitor that runs on, renews it each pass). Another live
        holder is refused with its name: two monitors of one judge at once would judge the same traces twice."""
        held = Lease.parse(self.state(key))
        me = this_holder()
        if held is not None and held.holder != me and held.alive():
            until = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(held.until))
            raise InputError(f"Another monitor with this judge runs on experiment {self.experiment_name!r}: "
                             f"{held.holder} holds it until {until} UTC. Stop it first, or wait for its lease to "
                             "end (a killed monitor's lease ends when its process is gone, on its own machine, or "
                             "when it expires).")
        lease = Lease(me, time.time() + seconds)
        self.set_state(key, str(lease))
        return lease

    def release_lease(self, key: str) -> None:
        held = Lease.parse(self.state(key))
        if held is not None and held.holder == this_holder():
            self.set_state(key, f"{held.holder}@0")

    def _each(self, fn: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
        items = list(items)
        if self.workers > 1 and len(items) > 1:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="ragjudge-monitor") as pool:
                return list(pool.map(fn, items))
        return [fn(i) for i in items]
