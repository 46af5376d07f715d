"""The ``ragjudge`` evaluator for ``mlflow.evaluate`` / ``mlflow.models.evaluate``.

Registered through the ``mlflow.model_evaluator`` entry point. It claims only
``model_type="rag"``, so it never runs inside other people's evaluations::

    mlflow.models.evaluate(
        data=df, predictions="answer", targets="reference", model_type="rag",
        evaluators="ragjudge", evaluator_config={"judge": "openai:/gpt-4o-mini"},
    )

MLflow does not log what a third-party evaluator returns, so this one logs its own metrics, per-row table,
transcripts, params and configuration into the run, as every other entry point does
(:func:`~mlflow_ragjudge.adapters.run_log.log_output`); its caller reads the full output back with
:func:`~mlflow_ragjudge.adapters.run_load.load_output`. This module is only the plugin: the model's answers put
beside the data, the evaluation, the logging and the result MLflow expects.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from mlflow.models.evaluation import EvaluationResult, ModelEvaluator
from mlflow.models.evaluation.artifacts import JsonEvaluationArtifact

from ..core.errors import InputError
from ..engine.evaluate import evaluate_frame
from .run_log import log_output

__all__ = ["RagJudgeEvaluator", "MODEL_TYPE"]

MODEL_TYPE = "rag"


def _model_outputs(model: Any, features: pd.DataFrame) -> tuple[list[Any], list[Any] | None]:
    """Call a pyfunc model (or wrapped callable) on the features.

    The model may return a list/Series of answers, a DataFrame with ``answer`` (and
    optionally ``contexts``), or a list of dicts with those keys.
    """
    out = model.predict(features)
    if out is None or isinstance(out, (str, bytes, int, float, bool)):
        raise InputError(
            f"The model returned {type(out).__name__} for {len(features)} rows; it must return one answer per row: "
            "a list of str, a pandas Series, a DataFrame with an 'answer' column (and optionally 'contexts'), or a "
            "list of dicts with 'answer'."
        )
    contexts: list[Any] | None = None
    if isinstance(out, pd.DataFrame):
        if "answer" in out.columns:
            answers = out["answer"].tolist()
            contexts = out["contexts"].tolist() if "contexts" in out.columns else None
        elif out.shape[1] == 1:
            answers = out.iloc[:, 0].tolist()
        else:
            raise InputError(
                f"The model returned a DataFrame with columns {list(out.columns)}; return an 'answer' column "
                "(and optionally 'contexts'), or a list of answers."
            )
    elif isinstance(out, pd.Series):
        answers = out.tolist()
    else:
        answers = list(out)
        if answers and isinstance(answers[0], dict):
            contexts = [a.get("contexts") for a in answers] if "contexts" in answers[0] else None
            answers = [a.get("answer") for a in answers]
    if len(answers) != len(features):
        raise InputError(f"The model returned {len(answers)} outputs for {len(features)} rows.")
    return answers, contexts


def _frame_from_dataset(dataset: Any, model: Any, config: dict[str, Any]) -> pd.DataFrame:
    features = dataset.features_data
    if not isinstance(features, pd.DataFrame):
        raise InputError("ragjudge needs tabular data (a pandas DataFrame) with one row per question.")
    df = features.copy()
    mapping = config.get("col_mapping") or {}
    answer_col = mapping.get("answer", "answer")
    ref_col = mapping.get("reference", "reference")
    if dataset.labels_data is not None:
        df[ref_col] = list(dataset.labels_data)
    if model is not None:
        answers, contexts = _model_outputs(model, features)
        df[answer_col] = answers
        if contexts is not None:
            df[mapping.get("contexts", "contexts")] = contexts
    elif dataset.predictions_data is not None:
        df[answer_col] = list(dataset.predictions_data)
    return df


class RagJudgeEvaluator(ModelEvaluator):
    """MLflow evaluator for RAG outputs (``model_type="rag"``)."""

    @classmethod
    def can_evaluate(cls, *, model_type: str, evaluator_config: dict[str, Any] | None, **kwargs: Any) -> bool:
        return model_type == MODEL_TYPE

    def evaluate(
        self,
        *,
        model_type: str,
        dataset: Any,
        run_id: str,
        evaluator_config: dict[str, Any] | None,
        model: Any = None,
        extra_metrics: Any = None,
        custom_artifacts: Any = None,
        predictions: Any = None,
        **kwargs: Any,
    ) -> EvaluationResult:
        config = dict(evaluator_config or {})
        if extra_metrics:
            raise ValueError("ragjudge does not take extra_metrics; choose metrics with evaluator_config['metrics'].")
        df = _frame_from_dataset(dataset, model, config)
        out = evaluate_frame(df, config)
        uris = log_output(out, run_id)
        artifacts = {
            "eval_results_table": JsonEvaluationArtifact(
                uri=uris["eval_results_table"], content=out.table.to_dict(orient="split")
            ),
            "ragjudge_config": JsonEvaluationArtifact(uri=uris["config"], content=out.config),
        }
        # MLflow returns its own result object to the caller, so the full output is read back from the run
        # with mlflow_ragjudge.load_output(result.run_id) (docs/mlflow.md).
        return EvaluationResult(metrics=dict(out.metrics), artifacts=artifacts, run_id=run_id)
