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
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from .backends import Backend, BackendError, FakeBackend, resolve_backend
from .cache import CallCache
from .client import JudgeClient
from .config import RagJudgeConfig
from .evaluation import EvalOutput, InputError, evaluate_frame
from .judges import CorrectnessJudge
from .offline import DEFAULT_OFFLINE_JUDGE, OfflineJudge
from .ppi import CalibratedEstimate, TooFewLabels, labels_needed, ppi_mean, ppi_paired_diff
from .sweep import PromptTemplate, SweepResult, sweep
from .types import Aggregate, FailureReason, JudgeResult, Status, aggregate


def compare_runs(run_ids: Any, baseline: int | str = 0, **kwargs: Any) -> Any:
    """The paired comparison of existing ragjudge runs (see :func:`mlflow_ragjudge.compare.compare_runs`)."""
    from .compare import compare_runs as _compare

    return _compare(run_ids, baseline, **kwargs)


def label_sample(run_id: str, n: int = 100, **kwargs: Any) -> Any:
    """A seeded random sample of a run's (or a sweep's) rows to label blind (see
    :func:`mlflow_ragjudge.calibration.label_sample`)."""
    from .calibration import label_sample as _sample

    return _sample(run_id, n, **kwargs)


def calibrate(run_id: str, labels: Any, **kwargs: Any) -> Any:
    """Calibrated estimates for a run or sweep from human labels (see :func:`mlflow_ragjudge.calibration.calibrate`)."""
    from .calibration import calibrate as _calibrate

    return _calibrate(run_id, labels, **kwargs)


def load_output(run_id: str) -> EvalOutput:
    """The full output of a ``ragjudge`` run (metrics, per-row table and results, transcripts, config),
    read back from the MLflow run. See :func:`mlflow_ragjudge.evaluator.load_output`."""
    from .evaluator import load_output as _load

    return _load(run_id)


__all__ = [
    "__version__",
    "Aggregate",
    "Backend",
    "BackendError",
    "CalibratedEstimate",
    "CallCache",
    "CorrectnessJudge",
    "DEFAULT_OFFLINE_JUDGE",
    "EvalOutput",
    "FailureReason",
    "FakeBackend",
    "InputError",
    "JudgeClient",
    "JudgeResult",
    "OfflineJudge",
    "PromptTemplate",
    "RagJudgeConfig",
    "Status",
    "SweepResult",
    "TooFewLabels",
    "aggregate",
    "calibrate",
    "compare_runs",
    "evaluate_frame",
    "label_sample",
    "labels_needed",
    "load_output",
    "ppi_mean",
    "ppi_paired_diff",
    "resolve_backend",
    "sweep",
]
