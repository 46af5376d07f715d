"""Step 1 of an evaluation: which metrics run -- every registered one whose columns the data has, or the ones asked
for by name, each checked against the config and the judge -- and the names the run will log (gates, groups and
human columns as metric-name segments), all before any judge call."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ..core.constants import LOGICAL_COLUMNS, is_offline_judge
from ..core.errors import InputError
from ..core.types import Row, metric_name_parts
from ..metrics.spec import MetricSpec, all_specs, get_metric
from .config import RagJudgeConfig

__all__ = ["select_metrics", "gate_metric_name", "check_gate_names", "check_metric_name_parts", "labelled_outputs"]


def _present(df: pd.DataFrame, cfg: RagJudgeConfig, logical: str) -> bool:
    return cfg.column(logical) in df.columns

def _has_columns(spec: MetricSpec, df: pd.DataFrame, cfg: RagJudgeConfig) -> bool:
    return any(all(_present(df, cfg, c) for c in alt) for alt in spec.requirements(cfg))

def select_metrics(df: pd.DataFrame, cfg: RagJudgeConfig) -> tuple[list[MetricSpec], dict[str, str]]:
    """The metrics of the run and, for defaulted ones that cannot run, why. Under the offline judge, a judged
    metric is run by its offline scorer (:meth:`MetricSpec.for_offline_judge`), and one the offline judge cannot
    score is skipped with the reason (asked for by name: an input error)."""
    skipped: dict[str, str] = {}
    offline = is_offline_judge(cfg.judge)
    if cfg.metrics is None:
        chosen = []
        for spec in all_specs():
            if not _has_columns(spec, df, cfg) or not spec.runs_by_default(cfg):
                continue
            if spec.judged and cfg.judge is None:
                skipped[spec.name] = ("no judge configured (set judge='openai:/gpt-4o-mini' or similar, or "
                                      "judge='offline:/lexical' for the offline judge, no LLM)")
                continue
            if offline and spec.offline_reason():
                skipped[spec.name] = str(spec.offline_reason())
                continue
            reason = spec.check(cfg) if spec.check is not None else None
            if reason:
                skipped[spec.name] = reason
                continue
            chosen.append(spec)
        if not chosen:
            raise InputError(
                f"No metric can run on columns {list(df.columns)}: add question/answer/reference (correctness, "
                "lexical), retrieved_doc_ids/relevant_doc_ids (retrieval), or map yours with col_mapping."
            )
        return [s.for_offline_judge() for s in chosen] if offline else chosen, skipped
    chosen = [get_metric(m) for m in dict.fromkeys(cfg.metrics)]
    for spec in chosen:
        if _has_columns(spec, df, cfg):
            continue
        alternatives = spec.requirements(cfg)
        alt = alternatives[0]
        missing = [cfg.column(c) for c in alt if not _present(df, cfg, c)]
        what = [LOGICAL_COLUMNS[c] for c in alt if not _present(df, cfg, c)]
        raise InputError(
            f"Metric '{spec.name}' needs column(s) {missing} ({'; '.join(what)})"
            f", but the data has {list(df.columns)}. Add the column, or map yours with "
            f"col_mapping={{'{alt[0]}': '<your column>'}}."
            + (" Alternatively: " + " or ".join(str(list(a)) for a in alternatives[1:]) if len(alternatives) > 1
               else "")
        )
    for spec in chosen:
        reason = spec.check(cfg) if spec.check is not None else None
        if reason:
            raise InputError(reason)
    needs_judge = [s.name for s in chosen if s.judged]
    if needs_judge and cfg.judge is None:
        raise InputError(
            f"Metric(s) {needs_judge} need a judge model: set judge='openai:/gpt-4o-mini' (or any judge URI), or "
            "judge='offline:/lexical' for the offline judge (no LLM)."
        )
    if offline:
        for spec in chosen:
            reason = spec.offline_reason()
            if reason:
                raise InputError(reason[0].upper() + reason[1:] + ".")
        chosen = [s.for_offline_judge() for s in chosen]
    return chosen, skipped

def gate_metric_name(name: str) -> str:
    """``correctness`` -> ``correctness/mean``; a full metric name is kept."""
    name = name.strip()
    return name if "/" in name else f"{name}/mean"

def check_gate_names(fail_under: dict[str, float], specs: Sequence[MetricSpec]) -> None:
    for raw in fail_under:
        base = gate_metric_name(raw).split("/", 1)[0]
        if not any(s.produces(base) for s in specs):
            raise InputError(
                f"fail_under names {raw!r}, which this run does not produce (metrics: "
                f"{', '.join(s.name for s in specs)}). Use a metric's name (e.g. 'correctness', 'faithfulness', "
                "'wscore') or a logged metric name such as 'correctness/mean'."
            )

def check_metric_name_parts(rows: Sequence[Row], cfg: RagJudgeConfig) -> dict[str, str]:
    """Groups and human-score columns become metric name segments: refuse two that would share one, before
    any call, and return the ones logged under a changed name (recorded in the run's config)."""
    renamed: dict[str, str] = {}
    for texts, what in (({r.group for r in rows if r.group is not None}, "group"),
                        (set(cfg.human_columns) | set(cfg.human_labels.values()), "human-score column")):
        try:
            names = metric_name_parts(sorted(texts), what)
        except ValueError as e:
            raise InputError(str(e)) from e
        renamed.update({k: v for k, v in names.items() if k != v})
    return renamed

def labelled_outputs(specs: Sequence[MetricSpec]) -> dict[str, tuple[float, float] | None]:
    """Output name -> its scale, for the outputs of ``specs`` that human labels can be given for."""
    return {o: s.scale_of(o) for s in specs for o in s.output_names if not o.endswith("_")}
