"""Judge the traces where they are: a traced RAG app in production, watched by the same judges that picked its
variant (``ragjudge monitor``, docs/monitoring.md).

One **pass** (:func:`monitor_pass`):

1. lists the app experiment's traces not yet handled by this monitor, newest first, from its watermark on (an
   experiment tag, so a restarted monitor resumes where the last one stopped); by default every such trace up to
   ``max_traces`` per pass (the rest wait for the next pass), or a seeded sample (``sample``: a rate in (0, 1) keeps
   each trace with that probability, decided by a hash of its id, or a count N draws N of the new traces);
2. reads each trace as a row (the question, answer and retrieved documents of whatever shape the app logged:
   :mod:`~mlflow_ragjudge.adapters.trace_fields`; a reference answer from an Expectation), and judges the rows with
   the whole engine (:func:`~mlflow_ragjudge.engine.evaluate.evaluate_frame`: the cache, rate limits, repeats and
   panels, the batch API when asked);
3. attaches each result as a Feedback to **the app's own trace** (the judge as its source, the rationale, a failure
   as its error, and in its metadata the judge's identity -- :mod:`~mlflow_ragjudge.engine.identity` -- and the
   pass's run), then marks the trace with the tag ``ragjudge.monitor.<monitor id>``; a trace that already carries a
   Feedback of the same identity (an earlier pass killed half-way, or MLflow's online scoring of our scorers) is not
   judged again for it;
4. logs one run for the pass in the app's experiment -- a child of the monitor's run, which carries every pass's
   metrics as a series (step = pass, timestamp = the window's end), so MLflow's charts show the trend -- with the
   metrics over the traces it judged, their time window, counts and cost, and links those traces to it;
5. calibrates: human Feedback on monitored traces (named after a metric, source HUMAN: the MLflow UI, or
   ``mlflow.log_feedback``) gives each pass's run the prediction-powered mean (``<metric>/ppi_mean`` ...) once 30
   labels exist; earlier passes whose traces got labels since are brought up to date;
6. gates: ``fail_under`` on each mean's interval, and ``max_drop`` against a baseline pass (paired on the
   questions that recur, unpaired otherwise).

:func:`monitor` runs passes every ``every`` seconds until stopped (Ctrl-C / SIGTERM end it cleanly between or within
passes, as elsewhere).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..adapters import tracking
from ..adapters.monitor_store import MonitorStore, monitor_tag, store_failure
from ..adapters.traces import spec_for
from ..core.constants import DEFAULT_OFFLINE_JUDGE, VERSION, is_offline_judge
from ..core.errors import InputError
from ..core.stop import stop_reason, stop_requested, wait_for_stop
from ..core.types import JudgeResult, Status, aggregate
from ..engine.aggregate import aggregate_metric
from ..engine.config import RagJudgeConfig
from ..engine.evaluate import EvalOutput
from ..engine.identity import JUDGE_ID_KEY
from ..engine.intervals import LEVEL, decide_gate, difference_interval, gate_status, mean_interval
from ..engine.ppi import TooFewLabels, ppi_mean
from ..metrics.spec import get_metric
from .calibration import scale_of
from .calibration_traces import human_labels_on_traces
from .monitor_judge import (
    MAX_TRIES,
    OWNERS,
    Identity,
    Work,
    has_identities,
    identify,
    judge_rows,
    plan_work,
    settles,
)

__all__ = ["MONITOR_METRICS", "MonitorPass", "monitor", "monitor_pass", "parse_every", "parse_since"]

#: what a monitor judges by default: the metrics that need no reference answer (production traces have none)
MONITOR_METRICS = ("faithfulness", "answer_relevancy", "context_relevance")
#: traces judged per pass by default (newest first; the rest wait for the next pass)
DEFAULT_MAX_TRACES = 200
#: traces listed per pass at most (infos only): the new ones and those the watermark could not pass yet
DEFAULT_MAX_SCAN = 20_000
#: a trace is written when its request ends, with its start time: a pass looks this far behind its watermark
DEFAULT_SETTLE_S = 300.0
#: earlier passes whose calibration a pass brings up to date
RECALIBRATE_PASSES = 20
#: the pass's per-row table and its record, where an evaluation run keeps them (``load_output`` reads both)
TABLE_FILE = "ragjudge/eval_results_table.json"
CONFIG_FILE = "ragjudge/config.json"
TRANSCRIPTS_FILE = "ragjudge/judge_transcripts.jsonl"
#: the run tag that names a pass's monitor run (its parent)
PARENT_TAG = "ragjudge.monitor.parent"
#: the trace metadata / Feedback metadata key naming the pass
PASS_KEY = "ragjudge.monitor.pass"
# ------------------------------------------------------------------------------------------------- the judge


# ------------------------------------------------------------------------------------------------- one pass


@dataclass
class MonitorPass:
    """What one pass did. ``judged``: the traces it judged (ids); ``attached``: Feedback written; ``seen``: traces
    listed since the watermark; ``already``: of them, handled before (by this monitor or with the same judge);
    ``sampled_out``: left out by the sample; ``backlog``: left for the next pass (``max_traces``); ``unreadable``:
    traces with no question or answer to judge (each got a failed Feedback saying what is missing)."""

    monitor_id: str
    experiment_id: str
    run_id: str | None = None
    parent_run_id: str | None = None
    pass_number: int = 0
    judged: list[str] = field(default_factory=list)
    attached: int = 0
    seen: int = 0
    already: int = 0
    sampled_out: int = 0
    backlog: int = 0
    unreadable: int = 0
    window: tuple[int, int] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    gate: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the pass could not finish: the tracking store failed (with ``monitor(every=...)``, the next pass tries again)
    failed: str | None = None
    #: judged metrics that failed on more than ``max_error_rate`` of this pass's rows (as ``EvalOutput.failures``)
    failures: list[dict[str, Any]] = field(default_factory=list)
    #: traces whose judge failed on the provider's side, to be tried again by the next pass; the oldest one's time
    retrying: int = 0
    oldest_retry_ms: int | None = None
    interrupted: str | None = None
    calibrated: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return int(self.usage.get("requests") or 0)

    @property
    def outcome(self) -> str | None:
        """``failed`` / ``undecided`` / ``passed`` over the gates, None without gates."""
        return gate_status(self.gate)

    def summary(self) -> str:
        if self.failed:
            return "\n".join([f"monitor pass on experiment {self.experiment_id} failed: the tracking store: "
                              f"{self.failed}", *(f"  note: {n}" for n in self.notes)])
        lines = [f"monitor {self.monitor_id} pass {self.pass_number} on experiment {self.experiment_id}: "
                 f"{len(self.judged)} traces judged, {self.attached} Feedback attached"
                 + (f" (run {self.run_id})" if self.run_id else " (nothing new: no run logged)")]
        lines.append(f"  seen {self.seen} since the watermark; {self.already} judged before, {self.sampled_out} "
                     f"left out by the sample, {self.backlog} left for the next pass, {self.unreadable} unreadable")
        if self.window is not None:
            lo, hi = (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t / 1000)) for t in self.window)
            lines.append(f"  window {lo} .. {hi} UTC; judge requests {self.requests}, tokens "
                         f"{int(self.usage.get('input_tokens') or 0)} in / {int(self.usage.get('output_tokens') or 0)}"
                         " out" + (f", cost ${self.usage['cost_usd']:.4f}" if self.usage.get("cost_usd") else ""))
        for name in sorted(k[: -len("/mean")] for k in self.metrics if k.endswith("/mean") and k.count("/") == 1):
            m = self.metrics
            ci = (f" [{m[name + '/ci_low']:.3f}, {m[name + '/ci_high']:.3f}]" if f"{name}/ci_low" in m else "")
            lines.append(f"  {name}: {m[name + '/mean']:.3f}{ci} over {int(m.get(name + '/n_scored', 0))} traces")
        for run_id, cal in self.calibrated.items():
            for key, value in sorted(cal.items()):
                if key.endswith("/ppi_mean"):
                    name = key[: -len("/ppi_mean")]
                    low, high = cal[name + "/ppi_ci_low"], cal[name + "/ppi_ci_high"]
                    lines.append(f"  calibrated {name} (run {run_id[:8]}): {value:.3f} [{low:.3f}, {high:.3f}] "
                                 f"from {int(cal[name + '/n_labelled'])} labels")
        lines.extend(f"  gate: {g['message']}" for g in self.gate)
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.extend(f"  warning: {e}" for e in self.errors[:5])
        if self.interrupted:
            lines.append(f"  stopped by {self.interrupted}: the traces not attached are judged by the next pass "
                         "(their judge calls are cached)")
        return "\n".join(lines)


def _sample_key(trace_id: str, seed: int) -> float:
    """A trace's place in the seeded sample: uniform in [0, 1), the same for the same trace and seed on any
    machine."""
    digest = hashlib.sha256(f"{seed}:{trace_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _pass_metrics(results: Mapping[str, list[tuple[str, JudgeResult]]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, pairs in results.items():
        spec = spec_for(name, OWNERS)
        out.update(aggregate_metric(name, [r for _, r in pairs], [], spec is None or spec.judged))
    return out


def _usage(outs: Sequence[EvalOutput]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for out in outs:
        for k, v in (out.config.get("usage") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("peak_in_flight",
                                                                                     "connection_limit"):
                total[k] = total.get(k, 0) + v
    return total


def _table(work: Work, results: Mapping[str, list[tuple[str, JudgeResult]]]) -> pd.DataFrame:
    """The pass's per-row table, laid out as an evaluation's (``load_output`` and ``ragjudge judge-report`` read it):
    the question, each output's score, status and justification, the answer; ``row_id`` is the trace id, and the
    trace's time beside it."""
    cells: dict[str, dict[str, Any]] = {}
    for name, pairs in results.items():
        for tid, r in pairs:
            cell = cells.setdefault(tid, {})
            cell[f"{name}/score"] = r.value if r.status is Status.SCORED else None
            cell[f"{name}/status"] = r.status.value + (f":{r.reason}" if r.reason else "")
            cell[f"{name}/justification"] = r.rationale or None
    rows = []
    for tid, row_cells in cells.items():
        trace = work.traces.get(tid)
        row = work.rows.get(tid)
        rows.append({"question": row.question if row is not None else None, **row_cells,
                     "answer": row.answer if row is not None else None, "row_id": tid, "trace_id": tid,
                     "timestamp_ms": getattr(trace.info, "timestamp_ms", None) if trace is not None else None})
    return pd.DataFrame(rows)


def _gates(metrics: Mapping[str, float], results: Mapping[str, list[tuple[str, JudgeResult]]],
           fail_under: Mapping[str, float], rule: str) -> list[dict[str, Any]]:
    gates = []
    for name, threshold in fail_under.items():
        pairs = results.get(name)
        iv = mean_interval(aggregate([r for _, r in pairs])) if pairs else None
        gates.append(decide_gate(name, float(threshold), metrics.get(f"{name}/mean"), iv, rule=rule,
                                 no_interval="fewer than two scored traces"))
    return gates


def _drop_gates(table: pd.DataFrame, baseline: pd.DataFrame, max_drop: Mapping[str, float], baseline_run: str
                ) -> list[dict[str, Any]]:
    """The drop test of each metric against the baseline pass: the interval of (this pass - baseline) -- paired on
    the questions both passes judged when at least 10 recur, unpaired (Welch) otherwise -- fails when all of it lies
    below ``-max_drop``, passes when all of it lies above, else is undecided."""
    gates = []
    for name, drop in max_drop.items():
        col = f"{name}/score"
        now = table[["question", col]].dropna() if col in table.columns else pd.DataFrame(columns=["question", col])
        base = (baseline[["question", col]].dropna() if col in baseline.columns
                else pd.DataFrame(columns=["question", col]))
        iv = difference_interval(now.groupby("question")[col].mean().to_dict() if len(now) else {},
                                 base.groupby("question")[col].mean().to_dict() if len(base) else {},
                                 list(now[col]), list(base[col]))
        entry: dict[str, Any] = {"metric": f"{name}/drop_vs_baseline", "threshold": -float(drop),
                                 "baseline_run": baseline_run, "rule": "interval"}
        if iv is None:
            gates.append({**entry, "outcome": "undecided", "passed": False, "value": None,
                          "message": f"{name}: too few scored traces in this pass or the baseline run "
                                     f"{baseline_run} to test a drop: undecided"})
            continue
        shown = (f"{name} changed by {iv['diff']:+.4f} against run {baseline_run[:8]} ({iv['kind']}, {iv['n']} "
                 f"{'questions' if iv['kind'] == 'paired' else 'traces'}), {LEVEL:.0%} interval "
                 f"[{iv['low']:+.4f}, {iv['high']:+.4f}]")
        entry.update(value=iv["diff"], ci_low=iv["low"], ci_high=iv["high"], n=iv["n"], kind=iv["kind"])
        if iv["high"] < -drop:
            gates.append({**entry, "outcome": "fail", "passed": False,
                          "message": f"{shown}, all of it below -{drop:g}: dropped, failed"})
        elif iv["low"] >= -drop:
            gates.append({**entry, "outcome": "pass", "passed": True,
                          "message": f"{shown}, all of it at or above -{drop:g}: passed"})
        else:
            gates.append({**entry, "outcome": "undecided", "passed": False,
                          "message": f"{shown} straddles -{drop:g}: undecided"})
    return gates


def _calibrate(store: MonitorStore, run_id: str, ident: Identity, logged: Mapping[str, float]
               ) -> dict[str, float]:
    """The prediction-powered means of a pass from the human Feedback on its traces; only what changed is
    returned (nothing when fewer than 30 labels exist)."""
    traces = store.run_traces(run_id)
    if not traces:
        return {}
    frame = pd.DataFrame({"trace_id": [t.info.trace_id for t in traces],
                          "assessments": [list(t.info.assessments or []) for t in traces]})
    out: dict[str, float] = {}
    for metric in ident.metrics:
        name = get_metric(metric).output_names[0]
        judge, human = human_labels_on_traces(frame, name, judge_id=ident.output_id(name))
        if human.notna().sum() == 0:
            continue
        scale = scale_of(name)
        if scale == (1.0, 5.0):
            human = human.where(human != 0)
        try:
            est = ppi_mean(judge.to_numpy(), human.to_numpy(), scale=scale)
        except TooFewLabels:
            continue
        values = est.as_metrics(name)
        if logged.get(f"{name}/n_labelled") != values[f"{name}/n_labelled"] or f"{name}/ppi_mean" not in logged:
            out.update(values)
    return out


def _key(ident: Identity, what: str) -> str:
    return f"ragjudge.monitor.{ident.monitor_id}.{what}"


def _parent_run(store: MonitorStore, ident: Identity) -> str:
    """The monitor's own run (created on its first pass): its params name the judge; its metrics are the trend."""
    key = _key(ident, "run")
    run_id = store.state(key)
    if run_id:
        try:
            if store.client.get_run(run_id).info.lifecycle_stage == "active":
                return run_id
        except Exception:  # deleted: a new one
            pass
    params = {"ragjudge.monitor.judge": ident.judge, "ragjudge.monitor.metrics": ",".join(ident.metrics),
              "ragjudge.prompt_versions": json.dumps(ident.prompts, sort_keys=True),
              **{f"ragjudge.judge_id.{m}": i for m, i in ident.ids.items()},
              **{f"ragjudge.option.{k}": str(v)[:500] for k, v in ident.options.items()}}
    run_id = store.create_run(f"ragjudge-monitor-{ident.monitor_id}", {"ragjudge.monitor": ident.monitor_id,
                                                                      "ragjudge.kind": "monitor"}, params)
    store.end_run(run_id)  # its metrics grow with every pass; it never runs itself
    store.set_state(key, run_id)
    return run_id


def _baseline_table(store: MonitorStore, baseline: str, parent: str, current: str | None) -> tuple[str, pd.DataFrame]:
    """The per-row table of the baseline: ``first`` (the monitor's first pass), ``previous``, or a run id -- a pass's,
    or any ragjudge evaluation's (the variant's offline evaluation: production against it, paired on the questions
    both have)."""
    run_id = baseline
    if baseline in ("first", "previous"):
        passes = [r.info.run_id for r in tracking.child_runs(parent, PARENT_TAG) if r.info.run_id != current]
        if not passes:
            raise InputError(f"--baseline {baseline}: the monitor has no earlier pass to compare with yet")
        run_id = passes[0] if baseline == "first" else passes[-1]
    try:
        return run_id, tracking.load_run_table(run_id, TABLE_FILE)
    except Exception as e:
        raise InputError(f"--baseline {baseline}: run {run_id} has no ragjudge per-row table ({type(e).__name__}: "
                         f"{str(e)[:200]}); give a monitor pass's or a ragjudge evaluation's run id, 'first' or "
                         "'previous'") from None


def monitor_pass(experiment: str, judge: Any = None, metrics: Sequence[str] | None = None, *,
                 filter_string: str | None = None, since: Any = None, sample: float | None = None,
                 max_traces: int = DEFAULT_MAX_TRACES, seed: int = 0, settle: float = DEFAULT_SETTLE_S,
                 fail_under: Mapping[str, float] | None = None, max_drop: Mapping[str, float] | None = None,
                 baseline: str | None = None, retriever_spans: str | Sequence[str] = "all",
                 config: Mapping[str, Any] | None = None, lease_seconds: float = 3600.0,
                 max_scan: int = DEFAULT_MAX_SCAN, spark: Any = None) -> MonitorPass:
    """One monitoring pass over experiment ``experiment``'s traces (module docstring).

    Args:
        experiment: the app's experiment, by name (or id).
        judge, metrics: the judge URI (or a list: a panel; default the offline judge) and the metrics (default
            :data:`MONITOR_METRICS`, those the judge can run); ``config``: any other evaluator setting (``repeats``,
            ``batch``, ``language`` ...).
        filter_string: an MLflow trace filter the traces must match too (``tags.env = 'prod'``).
        since: traces started before it are not looked at (the first pass's start; later passes start at the
            watermark): epoch seconds, a datetime, an ISO time or a duration back from now (``"2h"``, ``"7d"``).
        sample: None (every new trace, newest first, ``max_traces`` per pass), a rate in (0, 1) (each trace kept with
            that probability, by a seeded hash of its id: the same traces whoever runs it), or a count >= 1 (that many
            of the new traces per pass, drawn by the same hash).
        settle: seconds behind the newest trace a pass looks again next time (traces are written when their request
            ends, with its start time).
        fail_under: metric -> threshold: a gate on each mean's interval (exit 4 fail, 6 undecided in the CLI).
        max_drop, baseline: metric -> the largest drop tolerated against the ``baseline`` pass (a run id,
            ``first`` or ``previous``).
        lease_seconds: how long this pass holds the monitor's lease (renewed by every pass).
        spark: a SparkSession: the rows are judged in its executors (large backlogs; the judge-call cache at a path
            every executor reaches, ``requests_per_minute`` shared by the tasks: docs/scaling.md); the traces are
            still read and the Feedback attached from here.
        max_scan: traces not judged yet listed per pass at most (their infos, without spans); beyond it the older
            ones wait until these are done.

    Raises:
        InputError: an unknown experiment, a bad sample or filter, no metric that can run, another live monitor.
    """
    if isinstance(since, str):
        since = parse_since(since)
    elif since is not None and hasattr(since, "timestamp"):  # a datetime (naive: UTC) or a pandas Timestamp
        stamp = pd.Timestamp(since)
        since = float((stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp).timestamp())
    cfg_dict: dict[str, Any] = dict(config or {})
    if judge is not None:
        cfg_dict["judge"] = judge
    cfg_dict.setdefault("judge", DEFAULT_OFFLINE_JUDGE)  # no model named: the offline judge, as the CLI
    cfg_dict["metrics"] = list(metrics) if metrics else [m for m in MONITOR_METRICS]
    if sample is not None and not (0 < sample < 1 or (sample >= 1 and float(sample).is_integer())):
        raise InputError(f"sample={sample!r}: give a rate in (0, 1) or a whole number of traces >= 1")
    if max_traces < 1:
        raise InputError(f"max_traces={max_traces}: at least 1 trace per pass")
    store = MonitorStore(experiment)
    left_out: dict[str, str] = {}
    if not metrics:  # the defaults the judge cannot run (answer relevancy offline) are left out, not refused
        offline = isinstance(cfg_dict["judge"], str) and is_offline_judge(cfg_dict["judge"])
        cfg_dict["metrics"] = [m for m in MONITOR_METRICS if not (offline and get_metric(m).offline_reason())]
        left_out = {m: str(get_metric(m).offline_reason()) for m in MONITOR_METRICS if m not in cfg_dict["metrics"]}
    ident = identify(cfg_dict)
    cfg = RagJudgeConfig.from_dict({**cfg_dict, "dry_run": False})
    for name in list(fail_under or {}) + list(max_drop or {}):
        if not any(get_metric(m).produces(name) for m in ident.metrics):
            raise InputError(f"The gate on {name!r} names no metric this monitor judges ({', '.join(ident.metrics)}).")
    result = MonitorPass(ident.monitor_id, store.experiment_id)
    result.notes.extend(f"{m} left out: {why}" for m, why in (left_out if not metrics else {}).items())
    lease_key = _key(ident, "lease")
    store.take_lease(lease_key, lease_seconds)
    try:
        _run_pass(store, ident, cfg_dict, cfg, result, filter_string=filter_string, since=since, sample=sample,
                  max_traces=max_traces, seed=seed, settle=settle, fail_under=dict(fail_under or {}),
                  max_drop=dict(max_drop or {}), baseline=baseline, retriever_spans=retriever_spans,
                  max_scan=max_scan, spark=spark)
    finally:
        try:
            store.release_lease(lease_key)
        except Exception as e:  # noqa: BLE001 - the store is down: the lease expires, or its dead process frees it
            if not store_failure(e):
                raise
    return result


def _run_pass(store: MonitorStore, ident: Identity, cfg_dict: dict[str, Any], cfg: RagJudgeConfig,
              result: MonitorPass, *, filter_string: str | None, since: float | None, sample: float | None,
              max_traces: int, seed: int, settle: float, fail_under: dict[str, float], max_drop: dict[str, float],
              baseline: str | None, retriever_spans: str | Sequence[str], max_scan: int, spark: Any) -> None:
    started = time.time()
    watermark_key = _key(ident, "watermark")
    stored = store.state(watermark_key)
    watermark = int(float(stored)) if stored else None
    after = max(x for x in (watermark, int(since * 1000) if since is not None else None, 0) if x is not None)
    tag = monitor_tag(ident.monitor_id)
    try:
        fresh, result.already, newest, more = store.list_traces(
            filter_string, after, max_scan, skip=lambda t: tag in (t.info.tags or {}))
    except Exception as e:
        if "filter" in str(e).lower() or "INVALID_PARAMETER" in str(e):
            raise InputError(f"The trace filter {filter_string!r} was refused: {str(e)[:300]}") from None
        raise
    result.seen = len(fresh) + result.already
    if sample is not None and sample < 1:
        picked = [t for t in fresh if _sample_key(t.info.trace_id, seed) < sample]
    elif sample is not None:
        picked = sorted(fresh, key=lambda t: _sample_key(t.info.trace_id, seed))[: int(sample)]
    else:
        picked = fresh  # newest first
    result.sampled_out = len(fresh) - len(picked)
    if len(picked) > max_traces:  # newest first; the rest wait for the next pass
        result.backlog = len(picked) - max_traces
        picked = picked[:max_traces]
        result.notes.append(f"{result.backlog} traces wait for the next pass: more arrived than --max-traces "
                            f"{max_traces} judges in one pass; if this lasts, raise --max-traces, run passes more "
                            "often, or sample (--sample)")
    if more:
        result.notes.append(f"the listing stopped at {max_scan} traces not judged yet since the watermark: the older "
                            "ones are looked at once these are done (a first pass over a large experiment: --since)")
    # the watermark moves past what this pass dealt with, less the settle time; a backlog keeps it where it is
    new_watermark = None
    if newest is not None and result.backlog == 0 and not more:
        new_watermark = max(watermark or 0, min(newest, int((started - settle) * 1000)))
    parent = _parent_run(store, ident)
    result.parent_run_id = parent
    if picked:
        _judge_and_log(store, ident, cfg_dict, cfg, result, picked, parent, retriever_spans, tag, fail_under,
                       max_drop, baseline, spark)
    if new_watermark is not None and result.oldest_retry_ms is not None:
        new_watermark = min(new_watermark, result.oldest_retry_ms)  # the traces to try again stay in view
    if new_watermark is not None and not result.interrupted and not result.errors:
        store.set_state(watermark_key, str(new_watermark))
    # earlier passes whose traces got human labels since: their calibrated means brought up to date
    for run in tracking.child_runs(parent, PARENT_TAG)[-RECALIBRATE_PASSES:]:
        if run.info.run_id == result.run_id or stop_requested():
            continue
        values = _calibrate(store, run.info.run_id, ident, run.data.metrics)
        if values:
            tracking.log_metrics(run.info.run_id, values)
            result.calibrated[run.info.run_id] = values


def _judge_and_log(store: MonitorStore, ident: Identity, cfg_dict: dict[str, Any], cfg: RagJudgeConfig,
                   result: MonitorPass, picked: Sequence[Any], parent: str, retriever_spans: str | Sequence[str],
                   tag: str, fail_under: dict[str, float], max_drop: dict[str, float], baseline: str | None,
                   spark: Any = None) -> None:
    previous = tracking.child_runs(parent, PARENT_TAG)
    for run in previous:  # this monitor holds the lease: a pass still RUNNING was killed (its process is gone)
        if run.info.status == "RUNNING":
            store.end_run(run.info.run_id, "KILLED")
    result.pass_number = len(previous) + 1
    run_id = result.run_id = store.create_run(
        f"monitor-{ident.monitor_id}-pass-{result.pass_number}",
        {"mlflow.parentRunId": parent, PARENT_TAG: parent, "ragjudge.kind": "monitor_pass",
         "ragjudge.monitor": ident.monitor_id})
    meta = {PASS_KEY: run_id, "ragjudge.monitor": ident.monitor_id}
    work = plan_work(store, picked, ident, cfg, run_id, retriever_spans, meta)
    feedback, results, outs = judge_rows(work, cfg_dict, ident, run_id, meta, spark)
    result.unreadable = sum(1 for tid in work.direct if tid not in work.needs)
    result.usage = _usage(outs)
    result.failures = [f for out in outs for f in out.failures]
    # every metric of the identity must be on a trace before it carries the monitor's tag
    wanted = set(ident.ids.values())
    complete = {tid for tid in feedback if wanted <= has_identities(work.traces[tid], wanted)
                | {fb.metadata.get(JUDGE_ID_KEY) for fb in feedback[tid] if settles(fb)}}
    items = [(tid, feedback[tid], (tag, run_id) if tid in complete else None, work.replace.get(tid, []))
             for tid in feedback]
    done, errors = store.attach_all(items, stop_requested)
    # a metric that failed on the provider's side is tried again by the next pass (MAX_TRIES in all): the trace
    # stays unmarked and the watermark waits for it
    waiting = [work.traces[t].info.timestamp_ms for t in done if t not in complete]
    result.retrying = len(waiting)
    result.oldest_retry_ms = min(waiting, default=None)
    if waiting:
        result.notes.append(f"{len(waiting)} traces failed on the judge's side (timeouts, errors of the server): "
                            f"the next pass tries them again ({MAX_TRIES} tries in all)")
    # traces already judged for every metric by someone with the same identity: marked, nothing to attach
    for t in picked:
        tid = t.info.trace_id
        if tid in work.traces and tid not in feedback and tid not in work.needs and not stop_requested():
            try:
                store.client.set_trace_tag(tid, tag, run_id)
            except Exception as e:  # noqa: BLE001 - counted; the trace is looked at again next pass
                errors.append(f"{tid}: {type(e).__name__}: {str(e)[:200]}")
    result.errors.extend(errors)
    result.judged = done
    result.attached = sum(len(feedback[t]) for t in done)
    if stop_requested():
        result.interrupted = str(stop_reason() or "a signal")
    kept = {t for t in done}
    results = {name: [(t, r) for t, r in pairs if t in kept] for name, pairs in results.items()}
    results = {k: v for k, v in results.items() if v}
    try:
        store.link(done, run_id)
    except Exception as e:  # noqa: BLE001 - the Feedback is on the traces; only the run's view of them is missing
        result.errors.append(f"linking the traces to run {run_id}: {type(e).__name__}: {str(e)[:200]}")
    stamps = [work.traces[t].info.timestamp_ms for t in done if t in work.traces]
    result.window = (min(stamps), max(stamps)) if stamps else None
    metrics = _pass_metrics(results)
    metrics.update({"monitor/traces_judged": float(len(done)), "monitor/traces_seen": float(result.seen),
                    "monitor/backlog": float(result.backlog), "monitor/unreadable": float(result.unreadable),
                    "monitor/feedback_attached": float(result.attached),
                    "monitor/retrying": float(result.retrying),
                    "monitor/attach_errors": float(len(errors))})
    for k in ("requests", "input_tokens", "output_tokens", "cache_hits", "cost_usd"):
        if result.usage.get(k) is not None:
            metrics[f"judge/{k}"] = float(result.usage[k])
    if result.window is not None:
        metrics["monitor/window_start_ms"], metrics["monitor/window_end_ms"] = map(float, result.window)
    result.metrics = metrics
    table = _table(work, results)
    result.gate = _gates(metrics, results, fail_under, cfg.gate_rule)
    if max_drop and baseline:
        base_id, base_table = _baseline_table(store, baseline, parent, run_id)
        result.gate.extend(_drop_gates(table, base_table, max_drop, base_id))
    calibrated = _calibrate(store, run_id, ident, {})
    if calibrated:
        metrics.update(calibrated)
        result.calibrated[run_id] = calibrated
    _log_pass(store, result, ident, table, outs, parent)


def _transcripts(outs: Sequence[EvalOutput], table: pd.DataFrame) -> str:
    """The engine runs' judge calls as JSON lines, each one's ``row`` renumbered to its trace's row of the pass's
    table (as ``load_output`` pairs calls with rows), with its ``trace_id``."""
    position = {tid: k for k, tid in enumerate(table["row_id"])} if len(table) else {}
    lines = []
    for out in outs:
        ids = list(out.table["row_id"]) if "row_id" in out.table.columns else []
        for rec in out.transcripts:
            row = rec.get("row")
            tid = ids[row] if isinstance(row, int) and 0 <= row < len(ids) else None
            lines.append(json.dumps({**rec, "row": position.get(tid, -1), "trace_id": tid}, default=str))
    return "".join(line + "\n" for line in lines)


def _record(result: MonitorPass, ident: Identity, table: pd.DataFrame) -> dict[str, Any]:
    """The pass's run record (``ragjudge/config.json``), as an evaluation's: what judged, on which traces, what it
    cost, what failed and the gates."""
    return {"package_version": VERSION, "monitor": ident.monitor_id, "judge": ident.judge,
            "metrics_run": list(ident.metrics), "judge_ids": ident.ids, "options": ident.options,
            "prompt_versions": {k: v for versions in ident.prompts.values() for k, v in versions.items()},
            "prompt_versions_by_metric": ident.prompts, "rows": len(table), "window_ms": result.window,
            "usage": result.usage, "failures": result.failures, "gate": result.gate, "skipped": ident.skipped,
            "retrying": result.retrying}


def _log_pass(store: MonitorStore, result: MonitorPass, ident: Identity, table: pd.DataFrame,
              outs: Sequence[EvalOutput], parent: str) -> None:
    run_id = str(result.run_id)
    params = {"ragjudge.monitor": ident.monitor_id, "ragjudge.monitor.judge": ident.judge,
              "ragjudge.monitor.metrics": ",".join(ident.metrics),
              "ragjudge.monitor.experiment": store.experiment_name}
    tags = {"ragjudge.monitor.window": json.dumps(result.window) if result.window else "",
            "ragjudge.status": "interrupted" if result.interrupted else "ok"}
    if result.gate:
        tags["ragjudge.gate"] = str(gate_status(result.gate))
        tags["ragjudge.gate.detail"] = json.dumps(result.gate, default=str)
    store.log_run(run_id, metrics=result.metrics, params=params, tags=tags, table=(table, TABLE_FILE),
                  texts={TRANSCRIPTS_FILE: _transcripts(outs, table),
                         CONFIG_FILE: json.dumps(_record(result, ident, table), default=str, indent=1)})
    store.end_run(run_id, "KILLED" if result.interrupted else "FINISHED")
    # the trend: each pass's means on the monitor's run, at the window's end
    trend = {k: v for k, v in result.metrics.items() if k.endswith("/mean") or k.startswith("monitor/traces")
             or k.endswith("/ppi_mean") or k == "judge/cost_usd"}
    store.log_series(parent, trend, result.pass_number, result.window[1] if result.window else int(time.time() * 1000))


# ------------------------------------------------------------------------------------------------- passes on a clock


def parse_every(text: str) -> float:
    """``10m``, ``30s``, ``1h``, ``90`` (seconds) -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise InputError(f"--every {text!r}: give a duration such as 30s, 10m, 1h") from None
    if not value > 0 or not math.isfinite(value):
        raise InputError(f"--every {text!r}: the duration must be positive")
    return value


def parse_since(text: str) -> float:
    """``--since``: an ISO date or time (UTC unless it says), or a duration back from now (``2h``, ``7d``) -> epoch
    seconds."""
    t = text.strip()
    if t and t[-1].lower() in "smhd" and t[:-1].replace(".", "", 1).isdigit():
        return time.time() - parse_every(t)
    try:
        stamp = pd.Timestamp(t)
    except (ValueError, TypeError):
        raise InputError(f"--since {text!r}: give an ISO date or time (2026-11-27T09:00) or a duration back "
                         "from now (2h, 7d)") from None
    if stamp.tzinfo is None:
        stamp = stamp.tz_localize("UTC")
    return float(stamp.timestamp())


def monitor(experiment: str, judge: Any = None, metrics: Sequence[str] | None = None, *, every: float | None = None,
            passes: int | None = None, on_pass: Any = None, **kwargs: Any) -> list[MonitorPass]:
    """Monitor passes (:func:`monitor_pass`, same arguments): one, or one every ``every`` seconds until stopped
    (Ctrl-C / SIGTERM) or ``passes`` passes ran. ``on_pass(result)`` is called after each (the CLI prints it).
    Returns the passes."""
    done: list[MonitorPass] = []
    while True:
        t0 = time.time()
        kwargs.setdefault("lease_seconds", max(3600.0, 3 * (every or 0)))
        try:
            result = monitor_pass(experiment, judge, metrics, **kwargs)
        except InputError:
            raise
        except Exception as e:
            if every is None or not store_failure(e):
                raise
            # the tracking store failed (down, restarting, unreachable): what was attached stays, the watermark did
            # not move, so the next pass takes up where this one stopped
            result = MonitorPass("", experiment, failed=f"{type(e).__name__}: {str(e)[:300]}")
            result.notes.append(f"the next pass in {every:g} s goes on from the watermark")
        done.append(result)
        if on_pass is not None:
            on_pass(result)
        if every is None or result.interrupted or (passes is not None and len(done) >= passes):
            return done
        if wait_for_stop(max(0.0, every - (time.time() - t0))):
            return done
