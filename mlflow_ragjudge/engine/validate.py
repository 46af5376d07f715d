"""Step 1 of an evaluation: every check that can refuse the input, before anything runs -- the data, the metrics
(:mod:`.select`), the quality gate's names, every row (:mod:`.inputs`) and each metric's own row checks (its
``validate`` hook). Bad input stops here with an :class:`~mlflow_ragjudge.core.errors.InputError` naming the column and
the fix; nothing has been paid for and no user code (a retriever) has run yet."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..core.constants import is_offline_judge
from ..core.errors import InputError
from ..core.text import Repairs
from ..core.types import Row
from ..metrics.spec import MetricSpec
from .config import RagJudgeConfig
from .inputs import check_human_labels, read_rows, row_ids
from .ppi import MIN_LABELS
from .select import check_gate_names, check_metric_name_parts, labelled_outputs, select_metrics

__all__ = ["Checked", "validate"]


@dataclass(frozen=True)
class Checked:
    """What step 1 hands to step 2: the checked input.

    Attributes:
        cfg: the run's configuration.
        data: the input frame, as given (the per-row table starts from it).
        specs: the metrics selected for the run, in their order.
        skipped: metric -> why it does not run (defaulted metrics whose columns or judge it lacks).
        rows: every data row as a checked :class:`Row`.
        repairs: text repairs made while reading the rows (announced once step 2 has added its own).
        renamed: values renamed to be valid metric-name parts (groups, human columns).
    """

    cfg: RagJudgeConfig
    data: pd.DataFrame
    specs: tuple[MetricSpec, ...]
    skipped: dict[str, str]
    rows: list[Row]
    repairs: Repairs
    renamed: dict[str, str]


def validate(data: Any, cfg: RagJudgeConfig, first_row: int = 0) -> Checked:
    """Step 1: check the data against the configuration and the metrics it selects (``first_row``: where ``data``
    starts in the whole data, when it is one part of it, so that errors name rows as in the whole).

    Raises:
        InputError: the data cannot be evaluated as configured (the message names the column and the fix).
    """
    if not isinstance(data, pd.DataFrame):
        raise InputError(f"data must be a pandas DataFrame, got {type(data).__name__}.")
    if len(data) == 0:
        raise InputError("The data has no rows: pass at least one row with question/answer/reference columns.")
    specs, skipped = select_metrics(data, cfg)
    check_gate_names(cfg.fail_under, specs)
    if cfg.batch and (cfg.judge is None or is_offline_judge(cfg.judge)):
        raise InputError("batch=True sends judge calls through a provider's batch API, but this run has no LLM judge "
                         f"({'the offline judge sends nothing' if cfg.judge else 'judge is not set'}); drop batch, or "
                         "set judge='openai:/...' or 'anthropic:/...'.")
    if cfg.human_labels:
        check_human_labels(data, cfg, labelled_outputs(specs), min_labelled=MIN_LABELS)
    repairs = Repairs()
    rows = read_rows(data, cfg, required_text={c for s in specs for c in s.text_columns(cfg)}, repairs=repairs,
                     first_row=first_row)
    if cfg.column("row_id") in data.columns:
        row_ids(data, cfg, rows)  # empty or repeated ids (also once repaired): refused before any call, not after
    renamed = check_metric_name_parts(rows, cfg)
    for spec in specs:
        if spec.validate is not None:
            spec.validate(rows, cfg)
    return Checked(cfg, data, tuple(specs), skipped, rows, repairs, renamed)
