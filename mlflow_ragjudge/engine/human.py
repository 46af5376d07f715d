"""Human labels in a run: the agreement of every metric with the ``human_columns`` (meta-evaluation) and the
human-calibrated estimate of each metric of ``human_labels`` (PPI++)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..core.errors import CalibrationWarning, TooFewLabels
from ..core.types import JudgeResult
from ..metrics.spec import MetricSpec
from . import meta
from .config import RagJudgeConfig
from .ppi import labels_only_mean, ppi_mean
from .select import labelled_outputs

__all__ = ["meta_evaluation", "calibrated_estimates", "human_not_sure_values", "CALIBRATION_ALPHA", "SELECTION_P"]


def meta_evaluation(table: pd.DataFrame, cfg: RagJudgeConfig) -> tuple[pd.DataFrame | None, dict[str, float]]:
    """Agreement with humans: every metric against every ``human_columns`` column, and each metric of
    ``human_labels`` against its own label column."""
    if not cfg.human_columns and not cfg.human_labels:
        return None, {}

    names = [c[: -len("/score")] for c in table.columns if c.endswith("/score")]
    # a six-level output by its level: the judge's "not sure" (0) is a value of the "all" subset, as in the paper
    frame = pd.DataFrame({name: table[f"{name}/level" if f"{name}/level" in table.columns else f"{name}/score"]
                          for name in names})
    humans = list(dict.fromkeys([*cfg.human_columns, *cfg.human_labels.values()]))
    for hc in humans:
        frame[hc] = table[hc]
    # each metric's own abstentions (e.g. correctness level 0), for the "no_abstentions" subset
    masks = {
        name: table[f"{name}/status"].str.startswith("abstained").tolist()
        for name in names
        if f"{name}/status" in table.columns
    }
    pairs = [(names, list(cfg.human_columns))] if cfg.human_columns else []
    pairs += [([m], [c]) for m, c in cfg.human_labels.items() if m in names and c not in cfg.human_columns]
    parts = [
        meta.meta_evaluate(
            frame, ms, hs, abstain_mask=masks or None, n_boot=cfg.n_boot, seed=cfg.seed,
            human_not_sure={hc: human_not_sure_values(cfg.human_not_sure, frame[hc]) for hc in hs},
        )
        for ms, hs in pairs
    ]
    if not parts:
        return None, {}
    result = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return result, meta.meta_metrics(result)

def calibrated_estimates(table: pd.DataFrame, specs: Sequence[MetricSpec], results: dict[str, list[JudgeResult]],
               cfg: RagJudgeConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """The human-calibrated estimate of each metric of ``human_labels`` (PPI++, :func:`mlflow_ragjudge.ppi_mean`):
    logged metrics and the run record's ``calibration`` entry. A metric whose labelled rows the judge did not score
    enough of gets no estimate, with the reason recorded and warned about, never a NaN."""
    out: dict[str, float] = {}
    record: dict[str, Any] = {}
    scales = labelled_outputs(specs)
    for metric, col in cfg.human_labels.items():
        if metric not in results:
            continue
        judge = [float(r.value) if r.is_scored and r.value is not None else float("nan") for r in results[metric]]
        human = pd.to_numeric(table[col], errors="coerce").astype(float)
        unsure = 0
        if scales.get(metric) == (1.0, 5.0):  # a human "not sure" (0) on the six-level scale is no label
            unsure = int((human == 0).sum())
            human = human.where(human != 0)
        try:
            est = ppi_mean(judge, human.to_numpy(), alpha=CALIBRATION_ALPHA, scale=scales.get(metric))
        except TooFewLabels as e:
            # say what happened -- the judge gave no score on labelled rows -- and give what the labels alone say
            why = (f"{e.n_usable} labelled row(s) have a judge score, fewer than the {e.min_labelled} a calibrated "
                   f"interval needs ({e.n_labels} labelled, {e.n_excluded_labelled} of them not scored by the judge)")
            entry: dict[str, Any] = {"labels": col, "error": why, "n_human_not_sure": unsure}
            try:
                only = labels_only_mean(human.to_numpy(), alpha=CALIBRATION_ALPHA, scale=scales.get(metric))
            except TooFewLabels:
                why += "; the labels alone are too few for an interval too"
            else:
                out.update(only.as_metrics(metric))
                entry["labels_only"] = only.as_dict()
                why += (f"; the labels alone (every labelled row, judge or not): {only.mean:.3f} "
                        f"[{only.ci_low:.3f}, {only.ci_high:.3f}] from {only.n_labelled} labels")
                if only.warning:
                    why += f". {only.warning}"
            entry["error"] = why
            record[metric] = entry
            warnings.warn(f"No calibrated estimate for {metric!r}: {why}", CalibrationWarning, stacklevel=4)
            continue
        out.update(est.as_metrics(metric))
        record[metric] = {"labels": col, **est.as_dict(), "n_human_not_sure": unsure,
                          "method": "PPI++ (mlflow_ragjudge.engine.ppi.ppi_mean)"}
        messages = [est.warning] if est.warning else []
        if est.selection_p is not None and est.selection_p < SELECTION_P:
            messages.append(f"The labelled rows of {metric!r} do not look like a random sample: the judge's mean on "
                            f"them ({est.judge_mean_labelled:.3f}) differs from the rest's "
                            f"(p = {est.selection_p:.2g}). The calibrated interval is valid only for randomly chosen "
                            "rows; draw them with `ragjudge label-sample`.")
        if messages:
            record[metric]["warning"] = " ".join(messages)
            warnings.warn(record[metric]["warning"], CalibrationWarning, stacklevel=4)
    return out, record

#: the level of the calibrated intervals logged by a run
CALIBRATION_ALPHA = 0.05

#: below this p-value of the judge's scores on labelled vs unlabelled rows, the labels are said not to look random
SELECTION_P = 0.01

def human_not_sure_values(setting: Any, column: pd.Series) -> list[float]:
    """The human scores that mean "not sure" in one column: ``"auto"`` is ``[0]`` for a column on the six-level
    scale (whole numbers 0..5 that reach 2 or more) and nothing otherwise (a 0/1 or a continuous column, where
    0 is a judgement); a list is taken as it is; None keeps every score."""
    if setting is None:
        return []
    if setting != "auto":
        return [float(x) for x in setting]
    values = pd.to_numeric(column, errors="coerce").dropna()
    six_level = len(values) > 0 and bool(values.isin([0, 1, 2, 3, 4, 5]).all()) and values.max() >= 2
    return [0.0] if six_level else []
