"""Human labels after the run: draw a random sample to label, then turn the labels into calibrated estimates.

The way teams work (docs/calibration.md):

1. :func:`label_sample` draws a seeded uniform random sample of the rows of a ``ragjudge`` run -- for a sweep's
   parent run, the same questions in every variant, so that differences pair up -- and writes a file to label
   blind: the question, the answer and the reference, never the judge's verdict, rows of all variants shuffled
   together, one empty column per metric. The sample is recorded in the run (``ragjudge/label_sample.json``).
2. People fill the metric columns on the metric's own scale (correctness 1..5, 0 = not sure; faithfulness 0..1 ...).
3. :func:`calibrate` reads the filled file, checks it (known runs and row ids, numbers on the scale, at least 30
   labels per metric and run), keeps the labels in the run (``ragjudge/human_labels.json``), and logs into each
   run ``<metric>/ppi_mean``, ``<metric>/ppi_ci_low``, ``<metric>/ppi_ci_high`` and ``<metric>/n_labelled`` beside
   the judge-only ``<metric>/mean``, with the agreement of judge and humans on the labelled rows (``meta/...``).
   For a sweep it adds to the parent's comparison, for every variant against the baseline, the calibrated
   difference ``ppi_diff`` with ``ppi_ci_low`` / ``ppi_ci_high`` and ``n_labelled`` (PPI on the per-row
   differences), says where the judge-only and the calibrated conclusions disagree, and plots both intervals.

On the ``mlflow.genai`` path every row is a trace: :func:`calibrate_traces` reads human feedback on the traces of a
run (assessments named after the metric whose source type is HUMAN, the latest per trace), and
:func:`queue_for_review` puts a random sample of a run's traces into an MLflow review queue, with one label schema
per metric, so people label in the MLflow UI.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..adapters import tracking
from ..adapters.run_load import load_output
from ..core.errors import CalibrationWarning, InputError, TooFewLabels
from ..engine import meta
from ..engine.inputs import off_scale
from ..engine.ppi import (
    MIN_LABELS,
    LabelsOnlyEstimate,
    labels_needed,
    labels_only_mean,
    ppi_mean,
    ppi_paired_diff,
)
from ..metrics.spec import all_specs
from .compare import COMPARISON_FILE, LOWER_IS_BETTER, _safe_file, _short

__all__ = ["label_sample", "calibrate", "CalibrationResult", "scale_of",
           "SAMPLE_FILE", "LABELS_FILE", "CALIBRATION_FILE", "CALIBRATED_COLUMNS"]

SAMPLE_FILE = "ragjudge/label_sample.json"
LABELS_FILE = "ragjudge/human_labels.json"
CALIBRATION_FILE = "ragjudge/calibration.json"
#: columns a label file may carry besides the metric columns
INFO_COLUMNS = ("item_id", "run_id", "row_id", "question", "answer", "reference", "contexts", "notes", "labeller")
#: what :func:`calibrate` adds to a sweep's comparison table
CALIBRATED_COLUMNS = ["ppi_diff", "ppi_ci_low", "ppi_ci_high", "n_labelled", "labels_only_diff",
                      "labels_only_ci_low", "labels_only_ci_high", "judge_conclusion", "calibrated_conclusion",
                      "conclusions_agree"]


# --------------------------------------------------------------------------- runs


@dataclass
class _Runs:
    runs: dict[str, str]  # name -> run id
    parent: str | None  # the sweep's parent run, or None for one run
    baseline: str | None


def _runs_of(run_id: str) -> _Runs:
    """The runs behind ``run_id``: the run itself, or a sweep parent's variant runs (with the baseline)."""
    try:
        run = tracking.get_run(run_id)
    except Exception as e:
        raise InputError(f"No MLflow run {run_id!r} in the tracking store ({type(e).__name__}: {str(e)[:200]}); "
                         "check the run id and MLFLOW_TRACKING_URI.") from None
    if run.data.tags.get("ragjudge.sweep") != "parent":
        return _Runs({run.info.run_name or run_id: run_id}, None, None)
    runs: dict[str, str] = {}
    baseline = None
    for c in tracking.child_runs(run_id, "ragjudge.sweep.parent"):
        if c.data.tags.get("ragjudge.status") in ("evaluation_error", "no_answers"):
            continue
        name = c.info.run_name or c.info.run_id
        runs[name] = c.info.run_id
        if c.data.tags.get("ragjudge.sweep.baseline") == "true":
            baseline = name
    if not runs:
        raise InputError(f"Sweep run {run_id} has no evaluated variant runs to label.")
    return _Runs(runs, run_id, baseline)


def _outputs(runs: _Runs) -> dict[str, Any]:
    outs = {}
    for name, rid in runs.runs.items():
        try:
            out = load_output(rid)
        except FileNotFoundError:
            raise InputError(f"Run {rid} ({name}) has no ragjudge per-row table, so there are no rows to label: it was "
                             "not logged by ragjudge evaluate / mlflow.models.evaluate(evaluators='ragjudge'). For an "
                             "mlflow.genai.evaluate run, label its traces: label-sample --review-queue, then calibrate "
                             "--metrics.") from None
        if "row_id" not in out.table.columns:
            raise InputError(f"Run {rid} ({name}) has no row_id column in its per-row table: it was evaluated by an "
                             "older mlflow-ragjudge. Evaluate it again to label it.")
        outs[name] = out
    return outs


def _judged_metrics(out: Any) -> list[str]:
    t = out.table
    return [c[: -len("/score")] for c in t.columns if c.endswith("/score") and f"{c[:-len('/score')]}/status" in t]


def _item_id(run_id: str, row_id: str) -> str:
    return hashlib.sha1(f"{run_id}\x1f{row_id}".encode()).hexdigest()[:10]


# --------------------------------------------------------------------------- label-sample


def label_sample(run_id: str, n: int = 100, *, seed: int = 0, metrics: Sequence[str] | None = None,
                 path: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """Draw ``n`` rows (uniformly at random, seeded) of a ``ragjudge`` run or sweep to label, blind.

    For a sweep's parent run the same row ids are drawn in every variant (a row every variant answered), so that
    differences pair up. The file (``path``: ``.csv``, ``.jsonl`` or ``.xlsx``) has ``item_id, run_id, row_id,
    question, answer, reference`` and one empty column per metric (default: the run's judged metrics), rows of all
    variants shuffled together and no judge verdict. The draw is recorded in the (parent) run as
    ``ragjudge/label_sample.json``. Returns the frame written.

    Raises:
        InputError: an unknown run, a run without ``row_id``, ``n`` < 1, or metrics the run did not judge.
    """

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"n={n!r} must be a whole number >= 1 (rows to label; at least {MIN_LABELS} for an interval)")
    out_path = _writable(Path(path)) if path is not None else None
    runs = _runs_of(run_id)
    outs = _outputs(runs)
    judged = sorted(set.intersection(*(set(_judged_metrics(o)) for o in outs.values())))
    chosen = list(metrics) if metrics else judged
    unknown = [m for m in chosen if m not in judged]
    if unknown or not chosen:
        raise InputError(f"Metric(s) {unknown or chosen} are not judged in every run of {run_id}; the judged metrics "
                         f"are {judged or 'none'} (labels are for judged metrics).")
    common: set[str] | None = None
    for out in outs.values():
        answered = {str(r) for r, a in zip(out.table["row_id"], out.table.get("answer", out.table["row_id"]))
                    if isinstance(a, str) and a}
        common = answered if common is None else common & answered
    pool = sorted(common or [])
    if not pool:
        raise InputError(f"No row of {run_id} was answered in every run; nothing to label.")
    rng = np.random.default_rng(seed)
    picked = [pool[i] for i in sorted(rng.choice(len(pool), size=min(n, len(pool)), replace=False))]
    if n > len(pool):
        warnings.warn(f"Asked for {n} rows; the run has {len(pool)} (all are in the sample).", CalibrationWarning,
                      stacklevel=2)
    records = []
    for name, out in outs.items():
        rid = runs.runs[name]
        t = out.table.assign(row_id=out.table["row_id"].astype(str)).set_index("row_id")
        for row_id in picked:
            rec = t.loc[row_id]
            records.append({"item_id": _item_id(rid, row_id), "run_id": rid, "row_id": row_id,
                            "question": rec.get("question"), "answer": rec.get("answer"),
                            "reference": rec.get("reference"), **{m: None for m in chosen}})
    frame = pd.DataFrame(records)
    frame = frame.iloc[rng.permutation(len(frame))].reset_index(drop=True)  # variants interleaved: label blind
    record = {"seed": seed, "n": len(picked), "asked": n, "population": len(pool), "row_ids": picked,
              "metrics": chosen, "runs": runs.runs, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "method": "uniform random sample without replacement (numpy default_rng(seed).choice)"}
    if out_path is not None:
        _write(frame, out_path)  # before the record: a draw is recorded only once its file exists
    tracking.log_dict(runs.parent or next(iter(runs.runs.values())), record, SAMPLE_FILE)
    return frame


def _writable(path: Path) -> Path:
    """``path`` checked before anything is drawn or logged: a new file (an existing one may hold a person's labels:
    it is never overwritten) of a type label-sample writes, in a folder that exists (made when missing)."""
    if path.is_dir():
        raise InputError(f"--out {str(path)!r} is a folder; name a file in it, e.g. {str(path / 'labels.csv')!r}.")
    if path.exists():
        raise InputError(f"--out {str(path)!r} exists; it may hold labels already filled in, and is left as it is. "
                         "Name a new file, or delete that one first.")
    if path.suffix.lower() not in (".csv", ".jsonl", ".xlsx"):
        raise InputError(f"--out {str(path)!r}: label-sample writes .csv, .jsonl or .xlsx; name the file with one of "
                         "those endings.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--out {str(path)!r}: its folder cannot be made ({e.strerror or e}); choose a folder you can "
                         "write to.") from None
    if not os.access(path.parent, os.W_OK):
        raise InputError(f"--out {str(path)!r}: the folder {str(path.parent)!r} is not writable; choose a folder you "
                         "can write to.")
    return path


def _write(frame: pd.DataFrame, path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True, force_ascii=False)
    elif suffix == ".xlsx":
        frame.to_excel(path, index=False)
    else:
        frame.to_csv(path, index=False)


#: byte-order marks and the encodings they announce (a spreadsheet's "Unicode text" export is UTF-16)
_BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
         (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))
#: what to do with a label file that cannot be read, said in every such error
_LABEL_FIX = ("label the file `ragjudge label-sample` wrote, and save it as .csv (UTF-8, comma-separated), .jsonl (one "
              "JSON object per line) or .xlsx")


def _label_text(path: Path) -> str:
    """A text label file decoded by its byte-order mark (UTF-8 without one)."""
    raw = path.read_bytes()
    encoding = next((enc for bom, enc in _BOMS if raw.startswith(bom)), "utf-8")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        raise InputError(f"Label file {str(path)!r} is not {encoding.upper()} text (byte {e.start}: {e.reason}); "
                         f"{_LABEL_FIX}.") from None


def _read(labels: Any) -> pd.DataFrame:
    """A label file (``.csv``, ``.jsonl``, ``.xlsx``) as a frame; text in UTF-8, or in the encoding its byte-order
    mark names (UTF-16 from a spreadsheet). Every way it cannot be read is an input error naming the file, the line
    where there is one, and the fix."""
    if isinstance(labels, pd.DataFrame):
        return labels.copy()
    path = Path(labels)
    if not path.is_file():
        raise InputError(f"Label file {str(path)!r} does not exist (or is not a file); {_LABEL_FIX}.")
    suffix = path.suffix.lower()
    try:
        if suffix == ".xlsx":
            return pd.read_excel(path)
        text = _label_text(path)
        if suffix == ".jsonl":
            rows = []
            for n, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise InputError(f"Label file {str(path)!r} line {n} is not a JSON object ({e}): the file is torn "
                                     f"or was edited by hand; {_LABEL_FIX}.") from None
                if not isinstance(row, dict):
                    raise InputError(f"Label file {str(path)!r} line {n} is a JSON {type(row).__name__}, not an "
                                     f"object; {_LABEL_FIX}.")
                rows.append(row)
            return pd.DataFrame(rows)
        header = text.split("\n", 1)[0]
        sep = "\t" if "\t" in header and "," not in header else ","  # a spreadsheet's "Unicode text" is tab-separated
        return pd.read_csv(io.StringIO(text), sep=sep, dtype={"row_id": str, "run_id": str, "item_id": str})
    except InputError:
        raise
    except (ValueError, OSError, ImportError) as e:
        raise InputError(f"Label file {str(path)!r} could not be read as {suffix or 'CSV'} ({type(e).__name__}: "
                         f"{str(e)[:200]}); {_LABEL_FIX}.") from None


# --------------------------------------------------------------------------- calibrate


@dataclass
class CalibrationResult:
    """What :func:`calibrate` found and logged.

    Attributes:
        estimates: run name -> metric -> :class:`~mlflow_ragjudge.engine.ppi.CalibratedEstimate` (with ``labels_only``:
            :class:`~mlflow_ragjudge.engine.ppi.LabelsOnlyEstimate`).
        method: ``"ppi++"``, ``"ppi"`` (``lam=1``), ``"fixed lambda"`` or ``"labels_only"``.
        comparison: for a sweep, the parent's comparison with :data:`CALIBRATED_COLUMNS` added; else None.
        plans: with ``target_width``: run name -> metric -> :func:`~mlflow_ragjudge.engine.ppi.labels_needed`'s answer.
        warnings: what the user should know (labels not from the recorded sample, not random-looking ...).
    """

    estimates: dict[str, dict[str, Any]] = field(default_factory=dict)
    comparison: pd.DataFrame | None = None
    plans: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    run_ids: dict[str, str] = field(default_factory=dict)
    method: str = "ppi++"

    def summary(self) -> str:
        lines = []
        for name, per in self.estimates.items():
            for metric, e in per.items():
                if isinstance(e, LabelsOnlyEstimate):
                    lines.append(f"{name} {metric}: labels alone {e.mean:.3f} [{e.ci_low:.3f}, {e.ci_high:.3f}] from "
                                 f"{e.n_labelled} labels (no judge score used)")
                    continue
                lines.append(f"{name} {metric}: calibrated {e.mean:.3f} [{e.ci_low:.3f}, {e.ci_high:.3f}] from "
                             f"{e.n_labelled} labels (judge alone {e.judge_mean:.3f}; labels alone "
                             f"[{e.classical_ci_low:.3f}, {e.classical_ci_high:.3f}], worth "
                             f"{e.effective_labels or 0:.0f} labels with the judge)")
        if self.comparison is not None and len(self.comparison):
            for _, r in self.comparison.iterrows():
                if r["ppi_diff"] is not None:
                    what, d, lo, hi = "calibrated difference", r["ppi_diff"], r["ppi_ci_low"], r["ppi_ci_high"]
                elif self.method == "labels_only" and r["labels_only_diff"] is not None:
                    what, d, lo, hi = ("labels-only difference", r["labels_only_diff"], r["labels_only_ci_low"],
                                       r["labels_only_ci_high"])
                else:
                    continue
                lines.append(f"{r['variant']} vs {r['baseline']} {r['metric']}: {what} {d:+.3f} [{lo:+.3f}, {hi:+.3f}] "
                             f"(n_labelled {int(r['n_labelled'])}); judge alone {r['judge_conclusion']}, with labels "
                             f"{r['calibrated_conclusion']}" + ("" if r["conclusions_agree"] else "  <- DISAGREE"))
        for name, plans in self.plans.items():
            for metric, p in plans.items():
                lines.append(f"{name} {metric}: for an interval {p['target_width']:g} wide, about "
                             f"{p['ppi'] if p['ppi'] is not None else 'more than ' + str(p['rows'])} labels with the "
                             f"judge, {p['classical']} with labels alone")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def scale_of(metric: str) -> tuple[float, float] | None:
    for spec in all_specs():
        if spec.produces(metric):
            return spec.scale_of(metric)
    return None


def _judge_scores(out: Any, metric: str) -> pd.Series:
    """The judge's score per row id: NaN where it gave none (failed, abstained, correctness 0)."""
    t = out.table
    status = t[f"{metric}/status"].astype(str)
    score = pd.to_numeric(t[f"{metric}/score"], errors="coerce").where(status == "scored")
    return pd.Series(score.to_numpy(dtype=float), index=t["row_id"].astype(str))


def _check_labels(frame: pd.DataFrame, runs: _Runs, outs: Mapping[str, Any]) -> tuple[pd.DataFrame, list[str]]:
    """The label file checked against the runs: returns it with a ``run`` (name) column, and its metric columns."""
    if "row_id" not in frame.columns:
        raise InputError(f"The label file has no 'row_id' column (columns: {list(frame.columns)}); label the file "
                         "`ragjudge label-sample` wrote, which keys every row by row_id.")
    frame = frame.assign(row_id=frame["row_id"].astype(str).str.strip())
    ids = {rid: name for name, rid in runs.runs.items()}
    if "run_id" not in frame.columns:
        if len(runs.runs) > 1:
            raise InputError("The label file has no 'run_id' column, but the sweep has several runs: keep the run_id "
                             "column label-sample wrote.")
        frame = frame.assign(run_id=next(iter(ids)))
    frame = frame.assign(run_id=frame["run_id"].astype(str).str.strip())
    unknown_runs = sorted(set(frame["run_id"]) - set(ids))
    if unknown_runs:
        raise InputError(f"The label file names run(s) {unknown_runs[:3]} that are not "
                         f"{'variants of sweep ' + str(runs.parent) if runs.parent else 'the run'}: label the file "
                         "label-sample wrote for this run.")
    frame["run"] = frame["run_id"].map(ids)
    metrics = [c for c in frame.columns if c not in (*INFO_COLUMNS, "run", "variant")]
    if not metrics:
        raise InputError("The label file has no metric column to read labels from (e.g. 'correctness').")
    for name, out in outs.items():
        judged = set(_judged_metrics(out))
        known = set(out.table["row_id"].astype(str))
        sub = frame[frame["run"] == name]
        bad = sorted(set(sub["row_id"]) - known)
        if bad:
            raise InputError(f"The label file has row id(s) {bad[:3]} that run {runs.runs[name]} ({name}) does not "
                             f"have ({len(bad)} in all); labels must be for rows of the run.")
        dup = sub["row_id"][sub["row_id"].duplicated()]
        if len(dup):
            raise InputError(f"Row id {dup.iloc[0]!r} of run {runs.runs[name]} is labelled twice in the file; keep one "
                             "line per row and run.")
        for m in metrics:
            if m not in judged:
                raise InputError(f"The label file has a column {m!r}, which is not a judged metric of run "
                                 f"{runs.runs[name]} ({sorted(judged)}); rename or drop it.")
    for m in metrics:
        raw = frame[m]
        vals = pd.to_numeric(raw, errors="coerce")
        blank = raw.isna() | (raw.astype(str).str.strip() == "")
        bad_rows = frame[vals.isna() & ~blank]
        if len(bad_rows):
            raise InputError(f"Label {raw[bad_rows.index[0]]!r} for {m!r} (row_id {bad_rows['row_id'].iloc[0]}) is "
                             "not a number; leave the cell empty where the row is not labelled.")
        scale = scale_of(m)
        if scale is not None:
            lo, hi = scale
            six = scale == (1.0, 5.0)
            off = frame[off_scale(vals, scale)]
            if len(off):
                raise InputError(f"Label {vals[off.index[0]]:g} for {m!r} (row_id {off['row_id'].iloc[0]}) is off the "
                                 f"metric's scale {lo:g}..{hi:g}{' (0 = not sure)' if six else ''}.")
        frame[m] = vals.where(vals != 0) if scale == (1.0, 5.0) else vals  # six-level 0 = not sure: no label
    return frame, metrics


def _too_few(e: TooFewLabels, *, run_id: str, name: str, rid: str, metric: str, out: Any, aligned: pd.Series,
             labels: Any, labels_only: bool) -> str:
    """What happened when an interval cannot be given, and what the user can do about it."""
    status = out.table.assign(row_id=out.table["row_id"].astype(str)).set_index("row_id")[f"{metric}/status"]
    labelled = aligned.dropna().index
    states = status.reindex(labelled).astype(str).str.partition(":")[0]
    abstained, failed = int((states == "abstained").sum()), int((states == "failed").sum())
    n_rows = len(out.table)
    file = str(labels) if isinstance(labels, (str, os.PathLike)) else "FILE"
    head = f"Run {rid} ({name}), metric {metric!r}: "
    if labels_only:
        return head + (f"{len(labelled)} label(s), fewer than the {e.min_labelled} the labels' own interval needs. "
                       + (f"Label more of the run's {n_rows - len(labelled)} unlabelled rows, drawn at random."
                          if len(labelled) < n_rows else
                          f"All {n_rows} rows of the run are labelled: a larger evaluation is needed."))
    lines = [head + f"{e.n_usable} labelled row(s) have a judge score, fewer than the {e.min_labelled} a calibrated "
             f"interval needs. {len(labelled)} row(s) are labelled; the judge abstained on {abstained} and failed on "
             f"{failed} of them, and a calibrated estimate leaves such rows out (it estimates the mean over the rows "
             "the judge scored). What you can do:"]
    if e.n_unlabelled > 0:
        lines.append(f"  - label more rows drawn at random: {e.n_unlabelled} row(s) the judge scored have no "
                     "label yet;")
    else:
        lines.append(f"  - evaluate more questions: every one of the run's {n_rows} rows that the judge scored is "
                     "labelled already;")
    lines.append("  - calibrate another metric, one the judge scores on more of these rows;")
    if len(labelled) >= e.min_labelled:
        lines.append(f"  - use the labels alone, which need no judge score ({len(labelled)} labels): ragjudge "
                     f"calibrate {run_id} --labels {file} --labels-only (Python: calibrate(..., labels_only=True)).")
    else:
        lines.append(f"  - the labels alone need {e.min_labelled} labels too ({len(labelled)} now).")
    return "\n".join(lines)


def calibrate(run_id: str, labels: Any, *, alpha: float = 0.05, lam: float | None = None,
              target_width: float | None = None, labels_only: bool = False, log: bool = True) -> CalibrationResult:
    """Human-calibrated estimates for a ``ragjudge`` run or sweep from a filled label file (or DataFrame).

    Every (run, metric) with labels needs at least 30 labelled rows that the judge scored
    (:class:`~mlflow_ragjudge.engine.ppi.TooFewLabels`, as an input error that says how many rows were labelled, how
    many of them the judge gave no score, and what to do). See the module docstring for what is logged. ``target_width``
    also plans how many labels an interval that wide would take (:func:`~mlflow_ragjudge.engine.ppi.labels_needed`).

    ``labels_only=True`` gives the classical interval of the labels alone instead
    (:func:`~mlflow_ragjudge.engine.ppi.labels_only_mean`: every labelled row counts, whatever the judge said; logged as
    ``<metric>/labels_only_mean``, ``_ci_low``, ``_ci_high``, ``labels_only_n``; for a sweep, the paired
    difference of the labels in the comparison's ``labels_only_*`` columns). It needs no judge score, and is wider.

    Raises:
        InputError: an unknown run or row id, a label off the metric's scale, too few labels; nothing is logged.
    """
    runs = _runs_of(run_id)
    outs = _outputs(runs)
    where = "" if isinstance(labels, pd.DataFrame) else f"Label file {str(labels)!r}: "
    try:
        frame, metrics = _check_labels(_read(labels), runs, outs)
    except InputError as e:
        raise InputError(f"{where}{e}" if where and not str(e).startswith("Label file") else str(e)) from None
    if not frame[metrics].notna().any().any():
        raise InputError(f"{where[:-2] if where else 'The label frame'} holds no label: every cell of "
                         f"{', '.join(metrics)} is empty in {len(frame)} row(s). Fill in your own judgement for "
                         "the rows you label (the metric's scale, blank where you skip), save, and run calibrate "
                         "again.")
    method = "labels_only" if labels_only else ("ppi++" if lam is None else "ppi" if lam == 1 else "fixed lambda")
    result = CalibrationResult(run_ids=dict(runs.runs), method=method)
    human: dict[str, dict[str, pd.Series]] = {}
    for name, out in outs.items():
        sub = frame[frame["run"] == name].set_index("row_id")
        human[name] = {}
        for m in metrics:
            series = sub[m].dropna() if m in sub else pd.Series(dtype=float)
            if series.empty:
                continue
            judge = _judge_scores(out, m)
            aligned = series.reindex(judge.index)
            est: Any
            try:
                if labels_only:
                    est = labels_only_mean(aligned.to_numpy(dtype=float), alpha=alpha, scale=scale_of(m))
                else:
                    est = ppi_mean(judge.to_numpy(), aligned.to_numpy(dtype=float), alpha=alpha, lam=lam,
                                   scale=scale_of(m))
            except TooFewLabels as e:
                raise InputError(_too_few(e, run_id=run_id, name=name, rid=runs.runs[name], metric=m, out=out,
                                          aligned=aligned, labels=labels, labels_only=labels_only)) from None
            human[name][m] = aligned
            result.estimates.setdefault(name, {})[m] = est
            if est.warning:
                result.warnings.append(f"{name} {m}: {est.warning}")
            if labels_only:
                continue
            if target_width is not None:
                result.plans.setdefault(name, {})[m] = labels_needed(est, target_width)
            if est.selection_p is not None and est.selection_p < 0.01:
                result.warnings.append(
                    f"{name} {m}: the labelled rows' judge mean ({est.judge_mean_labelled:.3f}) differs from the "
                    f"other rows' (p = {est.selection_p:.2g}); were they drawn at random?")
    result.warnings += _sample_warnings(runs, frame, metrics)
    if runs.parent is not None and runs.baseline is not None:
        result.comparison = _calibrated_comparison(runs, outs, human, alpha, lam, labels_only=labels_only,
                                                   warnings_out=result.warnings)
    for w in result.warnings:
        warnings.warn(w, CalibrationWarning, stacklevel=2)
    if log:
        _log(runs, outs, frame, metrics, result, human)
    return result


def _sample_warnings(runs: _Runs, frame: pd.DataFrame, metrics: list[str]) -> list[str]:
    """Labels outside the sample label-sample recorded (or no recorded sample) mean the rows may not be random."""
    where = runs.parent or next(iter(runs.runs.values()))
    sample = tracking.read_json_artifact(where, SAMPLE_FILE)
    if not isinstance(sample, dict):
        return [f"run {where} has no label sample drawn by `ragjudge label-sample`: the calibrated intervals assume "
                "the labelled rows are a uniform random sample; make sure they are."]
    drawn = set(sample.get("row_ids") or [])
    labelled = frame[frame[metrics].notna().any(axis=1)]
    outside = sorted(set(labelled["row_id"]) - drawn)
    if outside:
        return [f"{len(outside)} labelled row(s) (e.g. {outside[0]}) are not in the random sample label-sample drew "
                "(seed {}); rows picked by hand can bias the estimate.".format(sample.get("seed"))]
    return []


def _conclusion(low: Any, high: Any, diff: Any, significant: Any = None) -> str:
    if low is None or diff is None:
        return "n/a"
    if significant is not None:  # the judge-only test
        if not significant:
            return "no significant difference"
        return "better" if diff > 0 else "worse"
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "no significant difference"


def _calibrated_comparison(runs: _Runs, outs: Mapping[str, Any], human: Mapping[str, Mapping[str, pd.Series]],
                           alpha: float, lam: float | None, *, labels_only: bool = False,
                           warnings_out: list[str] | None = None) -> pd.DataFrame:
    """The parent's comparison with the calibrated columns; what the user must know about an interval (labels
    that carry no variance) goes to ``warnings_out``."""
    parent = runs.parent
    assert parent is not None and runs.baseline is not None
    raw = tracking.read_json_artifact(parent, COMPARISON_FILE)
    table = (pd.DataFrame(raw["data"], columns=raw["columns"]) if isinstance(raw, dict) and "data" in raw
             else pd.DataFrame(columns=["metric", "variant", "baseline"]))
    table = table.drop(columns=[c for c in CALIBRATED_COLUMNS if c in table.columns])
    base = runs.baseline
    added: list[dict[str, Any]] = []
    for _, row in table.iterrows():
        metric, variant = row["metric"], row["variant"]
        entry: dict[str, Any] = {c: None for c in CALIBRATED_COLUMNS}
        ha, hb = human.get(variant, {}).get(metric), human.get(base, {}).get(metric)
        if ha is not None and hb is not None:
            ja, jb = _judge_scores(outs[variant], metric), _judge_scores(outs[base], metric)
            ids = [i for i in ja.index if i in set(jb.index)]
            sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
            mean = low = high = None
            try:
                if labels_only:
                    diff = ha.reindex(ids).to_numpy(dtype=float) - hb.reindex(ids).to_numpy(dtype=float)
                    only = labels_only_mean(diff, alpha=alpha, scale=scale_of(metric), paired=True)
                    warning = only.warning
                    entry.update(labels_only_diff=only.mean, labels_only_ci_low=only.ci_low,
                                 labels_only_ci_high=only.ci_high, n_labelled=only.n_labelled)
                    mean, low, high = only.mean, only.ci_low, only.ci_high
                else:
                    est = ppi_paired_diff(ja.reindex(ids).to_numpy(), jb.reindex(ids).to_numpy(),
                                          ha.reindex(ids).to_numpy(dtype=float),
                                          hb.reindex(ids).to_numpy(dtype=float), alpha=alpha, lam=lam,
                                          scale=scale_of(metric))
                    warning = est.warning
                    entry.update(ppi_diff=est.mean, ppi_ci_low=est.ci_low, ppi_ci_high=est.ci_high,
                                 n_labelled=est.n_labelled, labels_only_diff=est.classical_mean,
                                 labels_only_ci_low=est.classical_ci_low, labels_only_ci_high=est.classical_ci_high)
                    mean, low, high = est.mean, est.ci_low, est.ci_high
            except TooFewLabels as e:
                entry["calibrated_conclusion"] = f"n/a: {e}"
            else:
                if warning and warnings_out is not None:
                    warnings_out.append(f"{variant} vs {base} {metric}: {warning}")
            if mean is not None and low is not None and high is not None:
                entry["calibrated_conclusion"] = _conclusion(sign * low if sign > 0 else -high,
                                                             sign * high if sign > 0 else -low, sign * mean)
                judge_diff = row.get("mean_diff")
                entry["judge_conclusion"] = _conclusion(row.get("ci_low"), row.get("ci_high"),
                                                        None if judge_diff is None else sign * judge_diff,
                                                        bool(row.get("significant")))
                entry["conclusions_agree"] = entry["judge_conclusion"] == entry["calibrated_conclusion"]
        added.append(entry)
    extra = pd.DataFrame(added, columns=CALIBRATED_COLUMNS, index=table.index)
    return pd.concat([table, extra], axis=1).astype(object).where(lambda f: f.notna(), None)


def _log(runs: _Runs, outs: Mapping[str, Any], frame: pd.DataFrame, metrics: list[str], result: CalibrationResult,
         human: Mapping[str, Mapping[str, pd.Series]]) -> None:
    for name, per in result.estimates.items():
        rid = runs.runs[name]
        values: dict[str, float] = {}
        record: dict[str, Any] = {}
        for m, e in per.items():
            values.update(e.as_metrics(m))
            record[m] = e.as_dict()
            judge = _judge_scores(outs[name], m)
            pair = pd.DataFrame({m: judge.to_numpy(), "human": human[name][m].reindex(judge.index).to_numpy()})
            pair = pair.dropna()
            if len(pair) >= 3:
                table = meta.meta_evaluate(pair, [m], ["human"], n_boot=0)
                values.update({k.replace("/human/", "/human_labels/"): v for k, v in meta.meta_metrics(table).items()})
        tracking.log_metrics(rid, values)
        mine = frame[frame["run"] == name][["row_id", *metrics]].dropna(how="all", subset=metrics)
        tracking.replace_table(rid, mine.reset_index(drop=True), LABELS_FILE)
        tracking.log_dict(rid, record, CALIBRATION_FILE)
    if result.comparison is not None and runs.parent is not None:
        tracking.replace_table(runs.parent, result.comparison, COMPARISON_FILE)
        disagree = result.comparison["conclusions_agree"].map(lambda v: v is False).sum()
        tracking.log_metrics(runs.parent, {"sweep/calibrated_disagreements": float(disagree)})
        tracking.log_figures(runs.parent, calibrated_figures(result.comparison))


def calibrated_figures(comparison: pd.DataFrame) -> dict[str, Any]:
    """One figure per metric with labels: each variant's difference from the baseline, the judge-only interval and
    the calibrated one side by side (``ragjudge/plots/calibrated_<metric>.png``)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    figures: dict[str, Any] = {}
    rows = comparison[comparison["ppi_diff"].map(lambda v: v is not None)]
    for metric in dict.fromkeys(rows["metric"]):
        sub = rows[rows["metric"] == metric]
        fig, ax = plt.subplots(figsize=(9, 0.7 * len(sub) + 1.8))
        for i, (_, r) in enumerate(sub.iterrows()):
            if r["ci_low"] is not None:
                ax.errorbar([r["mean_diff"]], [i - 0.15], xerr=[[r["mean_diff"] - r["ci_low"]],
                                                                   [r["ci_high"] - r["mean_diff"]]],
                            fmt="o", capsize=4, color="#7f7f7f", label="judge only" if i == 0 else None)
            ax.errorbar([r["ppi_diff"]], [i + 0.15], xerr=[[r["ppi_diff"] - r["ppi_ci_low"]],
                                                            [r["ppi_ci_high"] - r["ppi_diff"]]],
                        fmt="D", capsize=4, color="#1f77b4" if r["conclusions_agree"] else "#d62728",
                        label=f"calibrated ({r['n_labelled']} labels)" if i == 0 else None)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(np.arange(len(sub)), [_short(str(v)) for v in sub["variant"]], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{metric}: difference from {sub['baseline'].iloc[0]} (red: the two conclusions disagree)",
                     fontsize=9)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        figures[f"ragjudge/plots/calibrated_{_safe_file(metric)}.png"] = fig
    return figures






# the trace path lives in calibration_traces; its names stay reachable from here, where the docs show them
