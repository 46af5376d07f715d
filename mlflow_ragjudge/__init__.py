"""mlflow-ragjudge: research-faithful RAG evaluation judges for MLflow.

Plain Python::

    import mlflow_ragjudge as rj
    out = rj.evaluate_frame(df, judge="openai:/gpt-4o-mini")
    out.metrics["correctness/mean"]

Variants of your RAG system, each an MLflow run, compared (docs/sweeps.md)::

    result = rj.sweep(pipeline, {"top_k": [3, 5]}, questions_df, evaluator_config={"judge": "offline:/lexical"})
    result.comparison

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
from .sweep import PromptTemplate, SweepResult, sweep
from .types import Aggregate, FailureReason, JudgeResult, Status, aggregate


def compare_runs(run_ids: Any, baseline: int | str = 0, **kwargs: Any) -> Any:
    """The paired comparison of existing ragjudge runs (see :func:`mlflow_ragjudge.compare.compare_runs`)."""
    from .compare import compare_runs as _compare

    return _compare(run_ids, baseline, **kwargs)


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
    "aggregate",
    "compare_runs",
    "evaluate_frame",
    "load_output",
    "resolve_backend",
    "sweep",
]
