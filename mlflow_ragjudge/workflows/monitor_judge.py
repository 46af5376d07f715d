"""How ``ragjudge monitor`` turns an app's traces into judged rows and the rows' results into Feedback: the judge's
identity (what a Feedback of the same judgment carries), each trace read as a row (the question, answer and
retrieved documents of whatever shape the app logged, a reference answer from an Expectation), what each trace still
needs (a metric judged before under the same identity is not judged again; a metric whose inputs the trace lacks
gets a failed Feedback saying what is missing), and the rows judged by the engine -- in this process, or in Spark's
executors -- with each result as a Feedback stamped with the identity and the pass."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..adapters.monitor_store import MonitorStore
from ..adapters.scorer_inputs import missing_fields, read_scorer_args
from ..adapters.spark import evaluate_spark
from ..adapters.traces import call_ids, feedback_for, metric_owners, row_feedback, spec_for, user_name
from ..core.errors import InputError
from ..core.stop import stop_requested
from ..core.types import JudgeResult, Row
from ..engine.config import RagJudgeConfig
from ..engine.evaluate import EvalOutput, evaluate_frame
from ..engine.identity import JUDGE_ID_KEY, JUDGE_KEY, PROMPTS_KEY, judge_id, score_options
from ..metrics.spec import get_metric

__all__ = ["MAX_TRIES", "OWNERS", "TRANSIENT", "Identity", "Judged", "Work", "has_identities", "identify", "judge_rows",
           "judged", "plan_work", "settles"]

#: the Row fields a trace's row carries into the engine
_FIELDS = ("question", "answer", "reference", "contexts", "retrieved_doc_ids", "relevant_doc_ids",
           "reference_contexts", "evidence_contexts", "gold_documents", "citations", "answerable", "raw_output")


#: result name -> the metric spec that produces it
OWNERS = metric_owners()


@dataclass(frozen=True)
class Identity:
    """The monitor's judge: per metric, the identity of its first output (:func:`~.identity.judge_id`), the
    judge URI and the prompt versions; ``monitor_id`` names the whole set (its tag on traces, its state)."""

    metrics: tuple[str, ...]
    judge: str
    ids: dict[str, str]
    prompts: dict[str, dict[str, str]]
    options: dict[str, Any]
    skipped: dict[str, str]

    @property
    def monitor_id(self) -> str:
        text = json.dumps(sorted(self.ids.items()), separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]

    def output_id(self, output: str) -> str:
        """The identity of one output (a metric with several outputs gives each its own)."""
        spec = spec_for(output, OWNERS)
        metric = spec.name if spec is not None else output
        judged = spec is None or spec.judged
        return judge_id(output, self.judge if judged else None, self.prompts.get(metric, {}),
                        self.options if judged else {})


def _synthetic_row() -> pd.DataFrame:
    """A row with every column a monitored metric may read: the dry run that names the prompts needs one."""
    return pd.DataFrame({"question": ["q?"], "answer": ["a."], "contexts": [["c."]], "reference": ["a."],
                         "retrieved_doc_ids": [["d"]], "relevant_doc_ids": [["d"]]})


def identify(cfg: dict[str, Any]) -> Identity:
    """The judge's identity for ``cfg`` (the metrics it runs, their prompt versions), found by a dry run: nothing is
    sent. A metric the judge cannot run (answer relevancy on the offline judge) is left out, with the reason."""
    out = evaluate_frame(_synthetic_row(), {**cfg, "dry_run": True, "traces": 0})
    metrics = tuple(out.config.get("metrics_run") or ())
    if not metrics:
        why = "; ".join(f"{k}: {v}" for k, v in out.skipped.items()) or "none was asked"
        raise InputError(f"No metric can run for this monitor ({why}).")
    panel = RagJudgeConfig.from_dict({k: v for k, v in cfg.items() if k != "dry_run"}).panel or []
    judge = ",".join(sorted(str(j) for j in panel)) if panel else out.params.get("ragjudge.judge", "")
    prompts = {k: dict(v) for k, v in (out.config.get("prompt_versions_by_metric") or {}).items()}
    options = score_options(RagJudgeConfig.from_dict(cfg).as_dict())
    ids = {m: judge_id(get_metric(m).output_names[0], judge if get_metric(m).judged else None, prompts.get(m, {}),
                       options if get_metric(m).judged else {}) for m in metrics}
    return Identity(metrics, judge, ids, prompts, options, dict(out.skipped))



#: failures on the provider's side: the metric is judged again by a later pass, up to :data:`MAX_TRIES` passes in all
TRANSIENT = frozenset({"timeout", "rate_limited", "connection_error", "provider_error"})
MAX_TRIES = 3
#: Feedback metadata: which pass's try this judgment was (1 = the first)
TRY_KEY = "ragjudge.monitor.try"


def _error_code(a: Any) -> str | None:
    fb = getattr(a, "feedback", None)
    err = getattr(fb, "error", None) if fb is not None else None
    err = err or getattr(a, "error", None)
    return None if err is None else str(getattr(err, "error_code", "") or "failed").lower()


def _tries(a: Any) -> int:
    try:
        return int((getattr(a, "metadata", None) or {}).get(TRY_KEY, 1))
    except (TypeError, ValueError):
        return 1


def settles(a: Any) -> bool:
    """Whether a Feedback is a judgment that stands: a value, an abstention, or a failure that another try would not
    change (a reply that could not be read, an input the metric cannot judge) or that was tried :data:`MAX_TRIES`
    times; a provider-side failure (a timeout, the server down) before that does not."""
    code = _error_code(a)
    return code is None or code not in TRANSIENT or _tries(a) >= MAX_TRIES


@dataclass
class Judged:
    """What a trace carries of some identities: ``settled`` (judged for good), and, for each one whose last try
    failed on the provider's side, ``(tries so far, the ids of those failed Feedback)``."""

    settled: set[str] = field(default_factory=set)
    retry: dict[str, tuple[int, list[str]]] = field(default_factory=dict)


def judged(trace: Any, wanted: set[str]) -> Judged:
    """The judgments of ``wanted`` identities a trace carries (a valid Feedback with that judge id)."""
    out = Judged()
    for a in getattr(trace.info, "assessments", None) or []:
        jid = (getattr(a, "metadata", None) or {}).get(JUDGE_ID_KEY)
        if jid not in wanted or getattr(a, "valid", True) is False or getattr(a, "feedback", None) is None:
            continue
        if settles(a):
            out.settled.add(jid)
        else:
            tries, ids = out.retry.get(jid, (0, []))
            out.retry[jid] = (max(tries, _tries(a)), [*ids, str(getattr(a, "assessment_id", ""))])
    for jid in out.settled:
        out.retry.pop(jid, None)
    return out


def has_identities(trace: Any, wanted: set[str]) -> set[str]:
    """The identities among ``wanted`` a trace is judged for, for good (:func:`judged`)."""
    return judged(trace, wanted).settled


def _expectations(trace: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in getattr(trace.info, "assessments", None) or []:
        exp = getattr(a, "expectation", None)
        if exp is not None and getattr(a, "valid", True) is not False:
            out[a.name] = exp.value
    return out


def _record(row: Row, trace_id: str) -> dict[str, Any]:
    rec: dict[str, Any] = {"row_id": trace_id}
    for f in _FIELDS:
        value = getattr(row, f, None)
        if f == "reference" and row.references and len(row.references) > 1:
            value = list(row.references)
        if value is not None:
            rec[f] = value
    return rec


def _lacks(metric: str, row: Row, cfg: RagJudgeConfig, looked: dict[str, str]) -> list[str]:
    """Nothing when the row has what ``metric`` reads, else what it lacks and where it was looked for (the failed
    Feedback says it)."""
    alternatives = get_metric(metric).requirements(cfg)
    if any(all(getattr(row, c, None) is not None for c in alt) for alt in alternatives):
        return []
    return missing_fields(row, alternatives[0], looked)


@dataclass
class Work:
    """The traces of a pass and what each needs."""

    traces: dict[str, Any]
    rows: dict[str, Row] = field(default_factory=dict)
    #: trace -> metric -> Feedback to attach without judging (the trace cannot be read for it)
    direct: dict[str, list[Any]] = field(default_factory=dict)
    #: trace -> the metrics to judge
    needs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: (trace, metric) -> which try this is, when an earlier pass's failed on the provider's side
    tries: dict[tuple[str, str], int] = field(default_factory=dict)
    #: trace -> the earlier failed Feedback that this pass's judgments replace
    replace: dict[str, list[str]] = field(default_factory=dict)


def plan_work(store: MonitorStore, picked: Sequence[Any], ident: Identity, cfg: RagJudgeConfig, run_id: str,
               retriever_spans: str | Sequence[str], meta: dict[str, str]) -> Work:
    work = Work(store.fetch([t.info.trace_id for t in picked]))
    for t in picked:
        tid = t.info.trace_id
        trace = work.traces.get(tid)
        if trace is None:
            continue
        have = judged(trace, set(ident.ids.values()))
        todo = [m for m in ident.metrics if ident.ids[m] not in have.settled]
        if not todo:
            continue
        for m in todo:
            if ident.ids[m] in have.retry:
                tries, ids = have.retry[ident.ids[m]]
                work.tries[(tid, m)] = tries + 1
                work.replace.setdefault(tid, []).extend(ids)
        try:
            found = read_scorer_args(None, None, _expectations(trace), trace,
                                     relevance_threshold=cfg.relevance_threshold, retriever_spans=retriever_spans)
            row, looked = found.row, found.looked
        except (InputError, ValueError) as e:
            row, looked, error = None, {}, str(e)
        judge_now: list[str] = []
        for m in todo:
            lacks = [error] if row is None else _lacks(m, row, cfg, looked)
            if lacks:
                res = JudgeResult.failed("invalid_input", f"the trace has no {'; no '.join(lacks)}")
                fb = feedback_for(get_metric(m).output_names[0], None, res, get_metric(m), ident.judge, run_id, [])
                work.direct.setdefault(tid, []).append(_stamp(fb, ident, meta, work.tries.get((tid, m), 1)))
            else:
                judge_now.append(m)
        if judge_now and row is not None:
            work.rows[tid] = row
            work.needs[tid] = tuple(judge_now)
    return work


def _stamp(fb: Any, ident: Identity, meta: dict[str, str], tries: int = 1) -> Any:
    """A Feedback with the monitor's metadata: the judge's identity, the pass, and which try it was."""
    extra = {JUDGE_ID_KEY: ident.output_id(fb.name.partition("@")[0]), JUDGE_KEY: ident.judge, **meta,
             TRY_KEY: str(tries)}
    spec = spec_for(fb.name.partition("@")[0], OWNERS)
    if spec is not None and ident.prompts.get(spec.name):
        extra[PROMPTS_KEY] = json.dumps(ident.prompts[spec.name], sort_keys=True)
    fb.metadata = {**(fb.metadata or {}), **extra}
    return fb


def _metric_of(name: str) -> str:
    spec = spec_for(name.partition("@")[0], OWNERS)
    return spec.name if spec is not None else name


def judge_rows(work: Work, cfg: dict[str, Any], ident: Identity, run_id: str, meta: dict[str, str],
           spark: Any = None) -> tuple[dict[str, list[Any]], dict[str, list[tuple[str, JudgeResult]]],
                                       list[EvalOutput]]:
    """Judge the rows, one engine run per set of metrics the rows need (usually one), in this process or on Spark;
    Feedback per trace, and per output the ``(trace id, result)`` pairs."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for tid, metrics in work.needs.items():
        groups.setdefault(metrics, []).append(tid)
    feedback: dict[str, list[Any]] = {tid: list(fbs) for tid, fbs in work.direct.items()}
    results: dict[str, list[tuple[str, JudgeResult]]] = {}
    for tid, fbs in work.direct.items():
        for fb in fbs:
            results.setdefault(fb.name, []).append((tid, JudgeResult.failed("invalid_input", fb.error.error_message)))
    outs: list[EvalOutput] = []
    for metrics, tids in groups.items():
        if stop_requested():
            break
        frame = pd.DataFrame([_record(work.rows[t], t) for t in tids])
        run_cfg = {**cfg, "metrics": list(metrics), "traces": 0, "fail_under": {}}
        out = _on_spark(spark, frame, run_cfg) if spark is not None else evaluate_frame(frame, run_cfg)
        if out is None:
            continue
        outs.append(out)
        calls = call_ids(out.transcripts)
        judge = out.config.get("judge") if isinstance(out.config.get("judge"), str) else None
        ids = [str(t) for t in out.table["row_id"]] if "row_id" in out.table.columns else tids
        for i, tid in enumerate(ids):
            if any(r[i] is not None and r[i].reason == "interrupted" for r in out.results.values() if i < len(r)):
                continue  # stopped before this row was judged: the next pass judges it (its calls are cached)
            fbs = row_feedback(i, out.table, out, OWNERS, judge or ident.judge, run_id, calls, user_name())
            feedback.setdefault(tid, []).extend(_stamp(fb, ident, meta, work.tries.get((tid, _metric_of(fb.name)), 1))
                                                for fb in fbs)
            for name, res in out.results.items():
                if i < len(res) and res[i] is not None:
                    results.setdefault(name, []).append((tid, res[i]))
    return feedback, results, outs


def _on_spark(spark: Any, frame: pd.DataFrame, cfg: dict[str, Any]) -> EvalOutput | None:
    """One group's rows judged in Spark's executors (:func:`~mlflow_ragjudge.adapters.spark.evaluate_spark`, nothing
    logged from there), every row's results brought back to attach them. List cells travel as JSON text."""
    cells = frame.copy()
    types = []
    for col in cells.columns:
        if col == "answerable":
            types.append(f"`{col}` boolean")
            continue
        cells[col] = [None if v is None or (isinstance(v, float) and v != v) else
                      json.dumps(v, ensure_ascii=False, default=str) if isinstance(v, (list, tuple, dict)) else str(v)
                      for v in cells[col]]
        types.append(f"`{col}` string")
    sdf = spark.createDataFrame(cells.astype(object).where(cells.notna(), None), schema=", ".join(types))
    evaluation = evaluate_spark(sdf, cfg, log=False, collect=True, table_rows=0)
    evaluation.unpersist()
    return evaluation.output
