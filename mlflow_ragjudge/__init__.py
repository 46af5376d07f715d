"""mlflow-ragjudge: research-faithful RAG evaluation judges for MLflow.

Plain Python::

    import mlflow_ragjudge as rj
    out = rj.evaluate_frame(df, judge="openai:/gpt-4o-mini")
    out.metrics["correctness/mean"]

Variants of your RAG system, each an MLflow run, compared (docs/sweeps.md)::

    result = rj.sweep(pipeline, {"top_k": [3, 5]}, questions_df, evaluator_config={"judge": "offline:/lexical"})
    result.comparison

Numbers a team can defend: a random sample of human labels turns judge scores into valid intervals
(docs/calibration.md)::

    rj.label_sample(result.parent_run_id, 100, path="labels.csv")     # people fill the metric columns
    rj.calibrate(result.parent_run_id, "labels.csv").summary()          # ppi_mean / ppi_diff with intervals

MLflow: ``mlflow.models.evaluate(data=df, predictions="answer", targets="reference",
model_type="rag", evaluators="ragjudge", evaluator_config={"judge": ...})``.

The package is layered (docs/architecture.md): ``core`` < ``llm`` < ``metrics`` < ``engine`` < ``adapters`` <
``workflows`` < ``cli``. Each public name below is imported from the module that defines it, which is also its one
other import path (``mlflow_ragjudge.engine.evaluate.evaluate_frame``). The names whose modules import mlflow
(``sweep``, ``compare_runs``, ``label_sample``, ``calibrate``, ``judge_report``, ``plan``, ``monitor``, ``load_output``,
``SweepResult``, ``PromptTemplate``) are imported on first use, for start-up time: ``import mlflow_ragjudge`` does
not load mlflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.constants import DEFAULT_OFFLINE_JUDGE
from .core.constants import VERSION as __version__
from .core.errors import InputError, Interrupted, RagJudgeError
from .core.types import Aggregate, FailureReason, JudgeResult, Status, aggregate
from .engine.config import RagJudgeConfig
from .engine.evaluate import EvalOutput, evaluate_frame
from .engine.ppi import (
    CalibratedEstimate,
    LabelsOnlyEstimate,
    TooFewLabels,
    labels_needed,
    labels_only_mean,
    ppi_mean,
    ppi_paired_diff,
)
from .llm.backends import Backend, BackendError, FakeBackend, resolve_backend
from .llm.cache import CallCache
from .llm.client import JudgeClient
from .metrics.correctness import CorrectnessJudge
from .metrics.offline import OfflineJudge
from .metrics.spec import MetricSpec, register_metric

if TYPE_CHECKING:  # imported on first use by __getattr__ below; here for mypy and editors
    from .adapters.run_load import load_output
    from .workflows.calibration import calibrate, label_sample
    from .workflows.compare import compare_runs
    from .workflows.judge_report import judge_report
    from .workflows.monitor import MonitorPass, monitor, monitor_pass
    from .workflows.planning import plan
    from .workflows.sweep import PromptTemplate, SweepResult, sweep


def __getattr__(name: str) -> object:
    """The public names whose modules import mlflow (seconds of start-up), imported when first used."""
    if name == "load_output":
        from .adapters import run_load
        value = getattr(run_load, name)
    elif name in ("calibrate", "label_sample"):
        from .workflows import calibration
        value = getattr(calibration, name)
    elif name == "compare_runs":
        from .workflows import compare
        value = getattr(compare, name)
    elif name == "judge_report":
        from .workflows import judge_report as report
        value = getattr(report, name)
    elif name == "plan":
        from .workflows import planning
        value = getattr(planning, name)
    elif name in ("monitor", "monitor_pass", "MonitorPass"):
        from .workflows import monitor as monitoring
        value = getattr(monitoring, name)
    elif name in ("PromptTemplate", "SweepResult", "sweep"):
        from .workflows import sweep as sweeps
        value = getattr(sweeps, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once imported, a plain attribute
    return value


__all__ = [
    "__version__",
    # core: the result type and the errors
    "Aggregate", "FailureReason", "JudgeResult", "Status", "aggregate",
    "InputError", "Interrupted", "RagJudgeError", "DEFAULT_OFFLINE_JUDGE",
    # llm: the judge model
    "Backend", "BackendError", "FakeBackend", "resolve_backend", "CallCache", "JudgeClient",
    # metrics
    "CorrectnessJudge", "MetricSpec", "OfflineJudge", "register_metric",
    # engine: one evaluation, and prediction-powered inference
    "EvalOutput", "RagJudgeConfig", "evaluate_frame",
    "CalibratedEstimate", "LabelsOnlyEstimate", "TooFewLabels", "labels_needed", "labels_only_mean", "ppi_mean",
    "ppi_paired_diff",
    # adapters and workflows (imported on first use: they load mlflow)
    "load_output", "PromptTemplate", "SweepResult", "sweep", "compare_runs", "calibrate", "label_sample",
    "judge_report", "plan", "monitor", "monitor_pass", "MonitorPass",
]
