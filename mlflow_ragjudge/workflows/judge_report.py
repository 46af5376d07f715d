"""The judge report: how well a run's judge agrees with people on the same rows (docs/judge-report.md).

:func:`judge_report` reads a ``ragjudge`` run's per-row table (:func:`~mlflow_ragjudge.adapters.run_load.load_output`),
joins human labels to it by row id -- from a label file (CSV, TSV, JSONL, XLSX) or a DataFrame, or from human
feedback on the run's traces -- and reports, for one judged metric:

* ``n`` (rows with both a judge value and a human label), the raw agreement and Cohen's kappa: quadratic-weighted on
  the six-level scale (levels 1..5, so that a judge one level off counts less than four off), unweighted for a
  binary (pass/fail) metric; both kappas are given, ``kappa`` is the one named in ``kappa_weights``;
* the confusion matrix (rows: people, columns: the judge) and each label's precision and recall (people as truth);
* every row where judge and people disagree, with its row id (and trace id where the run logged traces), so that
  it can be opened in the MLflow UI;
* the labelled rows left out: the judge abstained (six-level 0 "not sure" included) or failed -- counted by
  reason, never compared -- and the human "not sure" labels (six-level 0);
* with repeats (the ``<metric>/draws`` column): the judge's self-consistency over all rows of the run -- the share
  of rows whose draws all agree, the flip rate (rows whose verdict changes across draws), the chance that two draws
  of a row differ, and Fleiss' kappa across draws;
* with a panel (``<metric>/score@<judge>`` columns): each judge's kappa and agreement with people, and the
  inter-judge Fleiss' kappa and Krippendorff's alpha (ordinal on levels, nominal for pass/fail).

A metric whose scores lie in [0, 1] is read as pass/fail: a row passes when its score is at or above
``threshold`` (default 0.5; with repeats the score is the mean of the draws, so 0.5 is the majority). The report is
logged into the run (or ``log_to``) as ``ragjudge/judge_report.json`` (one entry per metric) and the metrics
``judge_report/<metric>/kappa``, ``/agreement``, ``/n``. The statistics are :mod:`mlflow_ragjudge.engine.agreement`'s.
"""

from __future__ import annotations

import json
import math
import numbers
from collections import Counter
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..adapters import tracking
from ..adapters.run_load import load_output
from ..core.errors import InputError
from ..core.types import metric_name_part
from ..engine.agreement import (
    Level,
    Weights,
    cohen_kappa,
    confusion,
    fleiss_kappa,
    krippendorff_alpha,
    per_label_precision_recall,
)
from ..engine.draws import read_draws
from .calibration import scale_of
from .calibration_traces import _traces, human_labels_on_traces

__all__ = ["judge_report", "JudgeReport", "REPORT_FILE", "PASS", "FAIL"]

REPORT_FILE = "ragjudge/judge_report.json"
PASS, FAIL = "pass", "fail"
LEVELS = (1, 2, 3, 4, 5)
_YES = {"yes", "y", "pass", "passed", "true", "t", "1", "1.0"}
_NO = {"no", "n", "fail", "failed", "false", "f", "0", "0.0"}
_SHOWN = 20  # disagreements printed by summary()


# --------------------------------------------------------------------------- the scale


@dataclass(frozen=True)
class _Scale:
    """How a metric's values become categories: six levels, or pass/fail at a threshold."""

    kind: str  # "levels" | "binary"
    threshold: float | None = None
    #: the range numeric human labels must lie in (a pass/fail metric scored in [0, 1]: (0, 1)); None = any number
    bounds: tuple[float, float] | None = None

    @property
    def labels(self) -> list[Hashable]:
        return list(LEVELS) if self.kind == "levels" else [FAIL, PASS]

    @property
    def weights(self) -> Weights:
        return "quadratic" if self.kind == "levels" else None

    def judge(self, value: Any) -> Hashable | None:
        """A judge value (a score, a level, one draw) as a category; None for no value (0 = not sure included)."""
        if value is None or isinstance(value, bool) and self.kind == "levels":
            return None
        if not isinstance(value, numbers.Real) or math.isnan(float(value)):
            return None
        v = float(value)
        if self.kind == "levels":
            level = math.floor(v + 0.5)  # a mean over draws (3.67) is read as its nearest level (4)
            return level if 1 <= level <= 5 else None
        return PASS if v >= float(self.threshold) else FAIL  # type: ignore[arg-type]

    def human(self, raw: Any, row_id: str, column: str) -> Hashable | None:
        """A human label as a category; None when blank; ``"not sure"`` for the six-level 0.

        Raises:
            InputError: a label that is not on the scale, naming the row and the accepted values.
        """
        if raw is None or (isinstance(raw, float) and math.isnan(raw)) or str(raw).strip() == "":
            return None
        if self.kind == "binary":
            if isinstance(raw, bool):
                return PASS if raw else FAIL
            text = str(raw).strip().lower()
            if text in _YES or text in _NO:
                return PASS if text in _YES else FAIL
        number = _number(raw)
        if self.kind == "binary" and number is not None and (
                self.bounds is None or self.bounds[0] <= number <= self.bounds[1]):
            return PASS if number >= float(self.threshold) else FAIL  # type: ignore[arg-type]
        if self.kind == "levels" and number is not None and number == int(number) and 0 <= number <= 5:
            return "not sure" if number == 0 else int(number)
        within = "" if self.bounds is None else f" in {self.bounds[0]:g}..{self.bounds[1]:g}"
        accepted = ("a whole number 1..5 (0 = not sure)" if self.kind == "levels" else
                    f"yes/no, pass/fail, true/false, 1/0 or a number{within} (pass at >= {self.threshold:g})")
        raise InputError(f"Label {raw!r} in column {column!r} (row id {row_id}) is not on the metric's scale: give "
                         f"{accepted}, or leave the cell empty where the row is not labelled.")

    def describe(self) -> str:
        if self.kind == "levels":
            return "six-level 1..5 (0 = not sure, left out); kappa quadratic-weighted"
        return f"pass/fail (the judge's score passes at >= {self.threshold:g}); kappa unweighted"


def _number(raw: Any) -> float | None:
    """A label as a finite number, or None (text, NaN, infinity)."""
    try:
        value = float(raw) if isinstance(raw, numbers.Real) else float(str(raw).strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _scale_of_metric(table: pd.DataFrame, metric: str, threshold: float | None) -> _Scale:
    scores = pd.to_numeric(table[f"{metric}/score"], errors="coerce").dropna()
    if f"{metric}/level" in table.columns or scale_of(metric) == (1.0, 5.0):
        if threshold is not None:
            raise InputError(f"--threshold is for pass/fail metrics; {metric!r} is on the six-level scale, whose "
                             "levels are compared as they are. Drop --threshold.")
        return _Scale("levels")
    if threshold is not None:
        if not math.isfinite(threshold):
            raise InputError(f"threshold={threshold!r} must be a finite number (e.g. 0.5)")
        return _Scale("binary", float(threshold), scale_of(metric))
    if len(scores) and (scores.min() < 0 or scores.max() > 1):
        raise InputError(f"Metric {metric!r} has scores from {scores.min():g} to {scores.max():g}, not in [0, 1] and "
                         "not on the six-level scale: give --threshold T (Python: threshold=T) to read a score >= T "
                         "as pass.")
    return _Scale("binary", 0.5, (0.0, 1.0))


# --------------------------------------------------------------------------- the report


@dataclass
class JudgeReport:
    """What :func:`judge_report` found (``as_dict()`` is the logged JSON; ``summary()`` the CLI's text).

    Attributes:
        run_id, metric: the run and the judged metric.
        scale: how values were read (six-level, or pass/fail at ``threshold``); ``kappa_weights`` the kappa's.
        n: rows compared (both a judge value and a human label); ``n_agree`` of them equal.
        agreement: ``n_agree / n``; ``kappa``: Cohen's kappa with ``kappa_weights``; ``kappa_unweighted``.
        confusion: ``{"labels", "matrix"}``, ``matrix[i][j]`` = rows people labelled ``labels[i]`` and the judge
            ``labels[j]``.
        per_label: one dict per label: precision, recall, support (people), predicted (judge).
        disagreements: ``{"row_id", "judge", "human", "score"}`` (+ ``trace_id``) per row where they differ.
        left_out: labelled rows not compared: ``human_not_sure``, ``judge_abstained``, ``judge_failed`` (+ the
            failure reasons), ``judge_no_value``; ``rows``/``labelled``: rows of the run / rows with a label.
        self_consistency: with repeats, else None; ``panel``: with a panel, else None.
        None is an undefined statistic, never NaN.
    """

    run_id: str
    metric: str
    scale: str
    threshold: float | None
    kappa_weights: str | None
    labels_from: str
    rows: int
    labelled: int
    n: int
    n_agree: int
    agreement: float | None
    kappa: float | None
    kappa_unweighted: float | None
    confusion: dict[str, Any]
    per_label: list[dict[str, Any]]
    disagreements: list[dict[str, Any]]
    left_out: dict[str, Any]
    self_consistency: dict[str, Any] | None = None
    panel: dict[str, Any] | None = None
    logged_to: str | None = None
    ui: str | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """The run metrics ``judge_report/<metric>/<stat>`` (undefined values left out)."""
        base = f"judge_report/{metric_name_part(self.metric)}"
        values: dict[str, Any] = {"kappa": self.kappa, "agreement": self.agreement, "n": self.n,
                                  "n_disagree": len(self.disagreements)}
        if self.self_consistency:
            for k in ("all_agree", "flip_rate", "fleiss_kappa"):
                values[f"draws_{k}"] = self.self_consistency.get(k)
        if self.panel:
            values["panel_fleiss_kappa"] = self.panel.get("fleiss_kappa")
            values["panel_krippendorff_alpha"] = self.panel.get("krippendorff_alpha")
        return {f"{base}/{k}": float(v) for k, v in values.items() if v is not None}

    def summary(self, shown: int = _SHOWN) -> str:
        f = _fmt
        lines = [f"judge report: run {self.run_id}, metric {self.metric} ({self.scale})",
                 f"  labels from {self.labels_from}",
                 f"  compared rows n = {self.n} of {self.labelled} labelled ({self.rows} in the run); agreement "
                 f"{f(self.agreement)} ({self.n_agree}/{self.n}); Cohen's kappa "
                 f"({self.kappa_weights or 'unweighted'}) {f(self.kappa)}"
                 + (f", unweighted {f(self.kappa_unweighted)}" if self.kappa_weights else "")]
        lo = self.left_out
        failed = ", ".join(f"{r} {c}" for r, c in lo["judge_failed_reasons"].items())
        lines.append(f"  left out: judge abstained {lo['judge_abstained']}, judge failed {lo['judge_failed']}"
                     + (f" ({failed})" if failed else "") + f", no judge value {lo['judge_no_value']}, people "
                     f"not sure {lo['human_not_sure']}")
        labels = self.confusion["labels"]
        lines.append("  confusion (rows: people, columns: judge):")
        lines.append("    " + " " * 10 + "".join(f"{str(x):>8}" for x in labels))
        for lab, row in zip(labels, self.confusion["matrix"], strict=True):
            lines.append(f"    {str(lab):<10}" + "".join(f"{c:>8}" for c in row))
        lines.append("  per label: " + "; ".join(f"{p['label']}: precision {f(p['precision'])} recall "
                                                   f"{f(p['recall'])} (n {p['support']})" for p in self.per_label))
        if self.self_consistency:
            s = self.self_consistency
            lines.append(f"  self-consistency over {s['rows']} rows x up to {s['draws']} draws: all draws agree on "
                         f"{f(s['all_agree'])}, flip rate {f(s['flip_rate'])}, two draws differ "
                         f"{f(s['pair_disagreement'])}, Fleiss' kappa {f(s['fleiss_kappa'])}")
        if self.panel:
            p = self.panel
            for judge, st in p["judges"].items():
                lines.append(f"  panel judge {judge}: kappa with people {f(st['kappa'])}, agreement "
                             f"{f(st['agreement'])} (n {st['n']})")
            lines.append(f"  panel agreement across {len(p['judges'])} judges: Fleiss' kappa {f(p['fleiss_kappa'])}, "
                         f"Krippendorff's alpha ({p['alpha_level']}) {f(p['krippendorff_alpha'])}")
        lines.append(f"  disagreements: {len(self.disagreements)} rows" + (" (row id: judge vs people)" if
                                                                         self.disagreements else ""))
        for d in self.disagreements[:shown]:
            lines.append(f"    {d['row_id']}: judge {d['judge']} vs people {d['human']}"
                         + (f"  trace {d['trace_id']}" if d.get("trace_id") else ""))
        if len(self.disagreements) > shown:
            lines.append(f"    ... {len(self.disagreements) - shown} more in {REPORT_FILE}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.logged_to:
            lines.append(f"logged to run {self.logged_to}: {REPORT_FILE}, judge_report/{self.metric}/kappa, "
                         "/agreement, /n")
        if self.ui:
            lines.append(f"  {self.ui}")
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "undefined" if v is None else f"{v:.4f}"


# --------------------------------------------------------------------------- reading


def _read_labels(labels: Any) -> tuple[pd.DataFrame, str]:
    """The label table and where it came from; every cell as the file gives it (ids stay text)."""
    if isinstance(labels, pd.DataFrame):
        return labels.copy(), "a DataFrame"
    path = Path(labels).expanduser()
    if not path.is_file():
        raise InputError(f"Label file {str(path)!r} does not exist; give a CSV, TSV, JSONL or XLSX file with a row id "
                         "column and a label column.")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        frame = pd.read_json(path, lines=True, dtype=False)
    elif suffix == ".xlsx":
        frame = pd.read_excel(path, dtype=object)
    elif suffix in (".tsv", ".tab"):
        frame = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    else:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    return frame, str(path)


def _judged(table: pd.DataFrame) -> list[str]:
    return [c[: -len("/score")] for c in table.columns if c.endswith("/score") and "@" not in c
            and f"{c[: -len('/score')]}/status" in table.columns]


def _pick_metric(table: pd.DataFrame, metric: str | None, frame: pd.DataFrame | None, run_id: str) -> str:
    judged = _judged(table)
    if metric is not None:
        if f"{metric}/score" not in table.columns:
            raise InputError(f"Run {run_id} has no metric {metric!r} in its per-row table (no column "
                             f"'{metric}/score'); its judged metrics are {judged or 'none'}: name one with --metric.")
        return metric
    in_file = [m for m in judged if frame is not None and m in frame.columns]
    for candidates in (in_file, judged):
        if len(candidates) == 1:
            return candidates[0]
    raise InputError(f"Run {run_id} has {len(judged)} judged metrics ({judged}); name the one the labels are for "
                     "with --metric (Python: metric=...).")


def _label_column(frame: pd.DataFrame, metric: str, label_column: str | None) -> str:
    if label_column is not None:
        if label_column not in frame.columns:
            raise InputError(f"The labels have no column {label_column!r} (columns: {list(frame.columns)}); name the "
                             "column holding the human labels with --label-column.")
        return label_column
    for name in (metric, "label", "human", "human_label"):
        if name in frame.columns:
            return name
    raise InputError(f"The labels have no column {metric!r} (nor 'label' or 'human'); columns: "
                     f"{list(frame.columns)}. Name the column holding the human labels with --label-column.")


def _human_from_file(frame: pd.DataFrame, run_id: str, known: set[str], row_id_column: str,
                     column: str) -> dict[str, Any]:
    """row id -> the raw label, checked: the row id column exists, every id is a row of the run, none twice."""
    if row_id_column not in frame.columns:
        raise InputError(f"The labels have no row id column {row_id_column!r} (columns: {list(frame.columns)}); "
                         "give each label the row_id of the run's per-row table (ragjudge label-sample writes it), "
                         "or name your id column with --row-id-column.")
    if "run_id" in frame.columns and row_id_column != "run_id":
        ids = frame["run_id"].astype(str).str.strip()
        named = sorted({i for i in ids if i and i.lower() not in ("nan", "none")})
        if named and run_id not in named:
            raise InputError(f"The labels are for run(s) {named[:3]} (their run_id column), not {run_id}: report on "
                             "the run they were drawn from, or drop the run_id column if the rows are this run's.")
        if named:
            frame = frame[ids == run_id]  # a label-sample file of a sweep: this run's rows
    row_ids = frame[row_id_column].astype(str).str.strip()
    unknown = sorted(set(row_ids) - known)
    if unknown:
        raise InputError(f"The labels have row id(s) {unknown[:3]} that run {run_id} does not have ({len(unknown)} "
                         f"in all); labels must be for rows of the run (its per-row table's row_id column).")
    dup = row_ids[row_ids.duplicated()]
    if len(dup):
        raise InputError(f"Row id {dup.iloc[0]!r} is labelled twice in the labels; keep one line per row.")
    return dict(zip(row_ids, frame[column].tolist(), strict=True))


def _human_from_traces(run_id: str, metric: str) -> tuple[dict[str, Any], dict[str, str]]:
    """row id -> the latest HUMAN feedback named ``metric`` on the run's traces, and row id -> trace id."""
    traces = _traces(run_id)
    if traces is None or len(traces) == 0:
        raise InputError(f"Run {run_id} has no traces to read human feedback from; give --labels FILE.")
    _, human = human_labels_on_traces(traces, metric)
    trace_ids = _trace_ids(traces)
    by_trace = {tid: rid for rid, tid in trace_ids.items()}
    # a monitor's pass: its rows are the app's own traces, each row's id its trace id
    by_trace.update({t: t for t in traces["trace_id"] if t not in by_trace})
    trace_ids.update({t: t for t in traces["trace_id"] if t not in trace_ids.values()})
    values = {by_trace[t]: v for t, v in human.items() if t in by_trace and v == v}
    if not values:
        raise InputError(f"No trace of run {run_id} has human feedback named {metric!r}; label the traces in the "
                         "MLflow UI (ragjudge label-sample --review-queue) or give --labels FILE.")
    return values, trace_ids


def _trace_ids(traces: pd.DataFrame) -> dict[str, str]:
    """row id -> trace id, from the traces' client request id (ragjudge's row traces carry the row id there)."""
    if traces is None or "client_request_id" not in traces.columns:
        return {}
    return {str(r): str(t) for r, t in zip(traces["client_request_id"], traces["trace_id"], strict=True)
            if r is not None and r == r}


def _row_trace_ids(run_id: str) -> dict[str, str]:
    """The run's row traces by row id, when it logged any (only a convenience: never fails the report)."""
    try:
        if not tracking.get_run(run_id).data.tags.get("ragjudge.traces"):
            return {}
        return _trace_ids(_traces(run_id))
    except Exception:  # noqa: BLE001 - trace ids are a convenience for opening rows in the UI
        return {}


# --------------------------------------------------------------------------- statistics


def _judge_outcomes(table: pd.DataFrame, metric: str, scale: _Scale) -> tuple[list[Any], list[str]]:
    """Per row: the judge's category (None when it gave none) and its state (scored / abstained / failed:reason)."""
    values = table[f"{metric}/level"] if f"{metric}/level" in table.columns else table[f"{metric}/score"]
    status = (table[f"{metric}/status"].astype(str).tolist() if f"{metric}/status" in table.columns
              else ["scored"] * len(table))
    cats = [scale.judge(v) for v in pd.to_numeric(values, errors="coerce").tolist()]
    return cats, status


def _draws(cell: Any) -> list[Any]:
    return read_draws(cell) or []


def _first_judges_draws(table: pd.DataFrame, drawn: dict[str, Any]) -> pd.DataFrame:
    """A panel's (or cascade's) table with each ``<metric>/draws`` cell cut to the first judge's draws: its
    self-consistency is over one judge's repeats (the judges' agreement is the panel's, reported apart)."""
    if len(drawn.get("judges") or ()) < 2:
        return table
    table = table.copy()
    for column in [c for c in table.columns if c.endswith("/draws")]:
        table[column] = [json.dumps(read_draws(cell, drawn) or []) for cell in table[column]]
    return table


def _self_consistency(table: pd.DataFrame, metric: str, scale: _Scale) -> dict[str, Any] | None:
    """Agreement of the judge with itself across repeated draws, over every row with 2 or more scored draws."""
    column = f"{metric}/draws"
    if column not in table.columns:
        return None
    units = [[scale.judge(v) for v in _draws(c)] for c in table[column].tolist()]
    units = [[v for v in u if v is not None] for u in units]
    kept = [u for u in units if len(u) >= 2]
    if not kept:
        return {"rows": 0, "draws": max((len(_draws(c)) for c in table[column]), default=0), "all_agree": None,
                "flip_rate": None, "pair_disagreement": None, "fleiss_kappa": None}
    same = sum(len(set(u)) == 1 for u in kept)
    pairs = [sum(c * (c - 1) for c in Counter(u).values()) / (len(u) * (len(u) - 1)) for u in kept]
    return {"rows": len(kept), "draws": max(len(u) for u in kept), "all_agree": same / len(kept),
            "flip_rate": 1 - same / len(kept), "pair_disagreement": 1 - sum(pairs) / len(pairs),
            "fleiss_kappa": fleiss_kappa(kept)}


def _panel(table: pd.DataFrame, metric: str, scale: _Scale, pairs_at: list[int], human: list[Any]
           ) -> dict[str, Any] | None:
    """Each panel judge against people (on the compared rows' labels) and the judges against each other."""
    prefix = f"{metric}/score@"
    columns = [c for c in table.columns if c.startswith(prefix)]
    if not columns:
        return None
    per_judge: dict[str, list[Any]] = {c[len(prefix):]: [scale.judge(v) for v in
                                                         pd.to_numeric(table[c], errors="coerce").tolist()]
                                       for c in columns}
    judges: dict[str, dict[str, Any]] = {}
    for name, cats in per_judge.items():
        pairs = [(cats[i], human[i]) for i in pairs_at if cats[i] is not None]
        judges[name] = {"n": len(pairs),
                        "agreement": sum(a == b for a, b in pairs) / len(pairs) if pairs else None,
                        "kappa": cohen_kappa([a for a, _ in pairs], [b for _, b in pairs], weights=scale.weights,
                                             labels=scale.labels)}
    rows = [list(vals) for vals in zip(*per_judge.values(), strict=True)]
    level: Level = "ordinal" if scale.kind == "levels" else "nominal"
    return {"judges": judges, "fleiss_kappa": fleiss_kappa(rows),
            "krippendorff_alpha": krippendorff_alpha(rows, level=level), "alpha_level": level,
            "rows": sum(sum(v is not None for v in r) >= 2 for r in rows)}


# --------------------------------------------------------------------------- the workflow


def _check_run(run_id: str) -> None:
    try:
        tracking.get_run(run_id)
    except Exception as e:  # noqa: BLE001 - the store's own error is quoted
        raise InputError(f"No MLflow run {run_id!r} in the tracking store ({type(e).__name__}: {str(e)[:200]}); "
                         "check the run id and MLFLOW_TRACKING_URI.") from None


def _load_run(run_id: str) -> Any:
    _check_run(run_id)
    if tracking.get_run(run_id).data.tags.get("ragjudge.sweep") == "parent":
        children = [c.info.run_id for c in tracking.child_runs(run_id, "ragjudge.sweep.parent")]
        raise InputError(f"Run {run_id} is a sweep's parent run; report each variant run on its own: {children}.")
    try:
        out = load_output(run_id)
    except Exception as e:  # noqa: BLE001 - not a ragjudge evaluation: the store's own words are quoted
        raise InputError(f"Run {run_id} holds no ragjudge evaluation to report on ({type(e).__name__}: "
                         f"{str(e)[:200]}); give the run ragjudge evaluate or mlflow.models.evaluate logged.") from None
    if "row_id" not in out.table.columns:
        raise InputError(f"Run {run_id} has no row_id column in its per-row table: it was evaluated by an older "
                         "mlflow-ragjudge. Evaluate it again to compare it with labels.")
    return out


def _compare(table: pd.DataFrame, metric: str, scale: _Scale, raw: dict[str, Any], column: str
             ) -> tuple[list[int], list[Any], list[Any], dict[str, Any], int]:
    """The rows compared, the judge's and people's categories per row, what was left out, and the rows labelled."""
    row_ids = table["row_id"].astype(str).tolist()
    judge, status = _judge_outcomes(table, metric, scale)
    human: list[Any] = [scale.human(raw[r], r, column) if r in raw else None for r in row_ids]
    left: dict[str, Any] = {"human_not_sure": 0, "judge_abstained": 0, "judge_failed": 0, "judge_failed_reasons": {},
                            "judge_no_value": 0}
    reasons: Counter[str] = Counter()
    compared: list[int] = []
    labelled = 0
    for i, h in enumerate(human):
        if h is None:
            continue
        labelled += 1
        if h == "not sure":
            left["human_not_sure"] += 1
        elif judge[i] is not None:
            compared.append(i)
        elif status[i].startswith("failed"):
            left["judge_failed"] += 1
            reasons[status[i].partition(":")[2] or "unknown"] += 1
        elif status[i].startswith("abstained"):
            left["judge_abstained"] += 1
        else:
            left["judge_no_value"] += 1
    left["judge_failed_reasons"] = dict(reasons.most_common())
    return compared, judge, human, left, labelled


def judge_report(run_id: str, labels: Any = None, *, metric: str | None = None, label_column: str | None = None,
                 row_id_column: str = "row_id", threshold: float | None = None, log: bool = True,
                 log_to: str | None = None) -> JudgeReport:
    """How well a run's judge agrees with human labels on the same rows; logged into the run.

    Args:
        run_id: a ``ragjudge`` run (its per-row table has ``row_id`` and ``<metric>/score``, ``/status``).
        labels: a label file (``.csv``, ``.tsv``, ``.jsonl``, ``.xlsx``) or a DataFrame with a row id column and a
            label column; None reads human feedback on the run's traces (assessments named after the metric whose
            source is HUMAN, the latest per trace; numeric values only).
        metric: the judged metric (default: the run's only judged metric, or the one the label file names).
        label_column: the labels' column (default: the metric's name, else ``label`` or ``human``). On the
            six-level scale whole numbers 1..5 (0 = not sure); for pass/fail yes/no, pass/fail, true/false, 1/0 or
            numbers (pass at ``>= threshold``). Blank = not labelled.
        row_id_column: the labels' row id column (default ``row_id``, as ``ragjudge label-sample`` writes it).
        threshold: for a metric scored in [0, 1] (or any non-six-level metric): a score at or above it passes
            (default 0.5 for [0, 1] scores).
        log: log the report into the run (``ragjudge/judge_report.json`` and ``judge_report/<metric>/...``).
        log_to: log into this run instead (e.g. a run holding the review).

    Raises:
        InputError: an unknown run, metric, row id column or row id, a label off the scale; nothing is logged.
    """
    out = _load_run(run_id)
    table = _first_judges_draws(out.table, out.config.get("draws") or {})
    frame, source = _read_labels(labels) if labels is not None else (None, "human feedback on the run's traces")
    metric = _pick_metric(table, metric, frame, run_id)
    scale = _scale_of_metric(table, metric, threshold)
    known = set(table["row_id"].astype(str))
    trace_ids: dict[str, str] = {}
    if frame is not None:
        column = _label_column(frame, metric, label_column)
        raw = _human_from_file(frame, run_id, known, row_id_column, column)
    else:
        column = f"human feedback {metric!r}"
        raw, trace_ids = _human_from_traces(run_id, metric)
    compared, judge, human, left, labelled = _compare(table, metric, scale, raw, column)
    if labelled == 0:
        raise InputError(f"No row of run {run_id} has a label in {column!r}: fill it on the metric's scale (blank = "
                         "not labelled), or name the column holding the labels with --label-column.")
    if log_to is not None and log_to != run_id:
        _check_run(log_to)  # an unknown run to log into fails here, before anything is logged
    if not trace_ids:
        trace_ids = _row_trace_ids(run_id)
    report = _build(run_id, metric, scale, source, table, compared, judge, human, left, labelled, trace_ids)
    if log:
        target = log_to or run_id
        existing = tracking.read_json_artifact(target, REPORT_FILE)
        entries = existing if isinstance(existing, dict) and "metric" not in existing else {}
        report.logged_to = target
        entries[metric] = report.as_dict()
        tracking.log_dict(target, entries, REPORT_FILE)
        tracking.log_metrics(target, report.metrics())
    report.ui = _ui(run_id, bool(trace_ids))
    return report


def _build(run_id: str, metric: str, scale: _Scale, source: str, table: pd.DataFrame, compared: list[int],
           judge: list[Any], human: list[Any], left: dict[str, Any], labelled: int,
           trace_ids: dict[str, str]) -> JudgeReport:
    j = [judge[i] for i in compared]
    h = [human[i] for i in compared]
    labels, matrix = confusion(h, j, scale.labels)
    prec = per_label_precision_recall(j, h, scale.labels)
    row_ids = table["row_id"].astype(str).tolist()
    scores = table[f"{metric}/score"].tolist()
    disagreements = []
    for i in compared:
        if judge[i] != human[i]:
            score = scores[i]
            d = {"row_id": row_ids[i], "judge": judge[i], "human": human[i],
                 "score": None if score is None or score != score else float(score)}
            if row_ids[i] in trace_ids:
                d["trace_id"] = trace_ids[row_ids[i]]
            disagreements.append(d)
    n_agree = sum(a == b for a, b in zip(j, h, strict=True))
    notes = []
    if scale.kind == "levels" and any(isinstance(judge[i], int) and scores[i] is not None and scores[i] == scores[i]
                                      and float(scores[i]) != judge[i] for i in compared):
        notes.append("some judge scores are means over draws or judges; each was read as its nearest level")
    return JudgeReport(
        run_id=run_id, metric=metric, scale=scale.describe(), threshold=scale.threshold,
        kappa_weights=scale.weights, labels_from=source, rows=len(table), labelled=labelled, n=len(compared),
        n_agree=n_agree, agreement=n_agree / len(compared) if compared else None,
        kappa=cohen_kappa(j, h, weights=scale.weights, labels=scale.labels),
        kappa_unweighted=cohen_kappa(j, h, labels=scale.labels),
        confusion={"labels": labels, "rows": "people", "columns": "judge", "matrix": matrix},
        per_label=[{"label": lab, **stats} for lab, stats in prec.items()],
        disagreements=disagreements, left_out=left,
        self_consistency=_self_consistency(table, metric, scale),
        panel=_panel(table, metric, scale, compared, human),
        notes=notes,
    )


def _ui(run_id: str, traces: bool) -> str | None:
    """Where to open the disagreeing rows: the run's page; its Traces tab finds a row by its id."""
    try:
        hint = tracking.ui_hint(run_id)
    except Exception:  # noqa: BLE001 - only a hint
        return None
    if traces:
        return hint + "; each row is a trace in the run's Traces tab (request id = the row id)"
    return hint + "; a row: the per-row table ragjudge/eval_results_table.json (Artifacts tab), by its row_id"
