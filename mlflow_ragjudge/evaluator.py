"""The ``ragjudge`` evaluator for ``mlflow.evaluate`` / ``mlflow.models.evaluate``.

Registered through the ``mlflow.model_evaluator`` entry point. It claims only
``model_type="rag"``, so it never runs inside other people's evaluations::

    mlflow.models.evaluate(
        data=df, predictions="answer", targets="reference", model_type="rag",
        evaluators="ragjudge", evaluator_config={"judge": "openai:/gpt-4o-mini"},
    )

MLflow does not log what a third-party evaluator returns, so this one logs its
own metrics, per-row table, transcripts, params and configuration into the run.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pandas as pd
from mlflow.models.evaluation import EvaluationResult, ModelEvaluator
from mlflow.models.evaluation.artifacts import JsonEvaluationArtifact
from mlflow.tracking import MlflowClient

from .evaluation import EvalOutput, InputError, evaluate_frame
from .types import JudgeResult, Status

__all__ = ["RagJudgeEvaluator", "log_output", "load_output", "MODEL_TYPE", "TABLE_FILE", "TRANSCRIPTS_FILE",
           "CONFIG_FILE"]

MODEL_TYPE = "rag"
TABLE_FILE = "ragjudge/eval_results_table.json"
TRANSCRIPTS_FILE = "ragjudge/judge_transcripts.jsonl"
CONFIG_FILE = "ragjudge/config.json"
META_FILE = "ragjudge/meta_evaluation.json"


def _model_outputs(model: Any, features: pd.DataFrame) -> tuple[list[Any], list[Any] | None]:
    """Call a pyfunc model (or wrapped callable) on the features.

    The model may return a list/Series of answers, a DataFrame with ``answer`` (and
    optionally ``contexts``), or a list of dicts with those keys.
    """
    out = model.predict(features)
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


def log_output(out: EvalOutput, run_id: str) -> dict[str, Any]:
    """Log an evaluation's metrics, params, table, transcripts and config into a run.

    Returns the artifact URIs by name.
    """
    import mlflow

    client = MlflowClient()
    metrics = {k: float(v) for k, v in out.metrics.items()}
    # one batch for the metrics and params (the store handles hundreds at once)
    import time as _time

    from mlflow.entities import Metric, Param, RunTag

    ts = int(_time.time() * 1000)
    params = {k: str(v)[:6000] for k, v in out.params.items()}
    existing = client.get_run(run_id).data.params
    params = {k: v for k, v in params.items() if existing.get(k) in (None, v)}
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, ts, 0) for k, v in sorted(metrics.items())],
        params=[Param(k, v) for k, v in params.items() if k not in existing],
        tags=[RunTag(k, v) for k, v in _tags(out).items()],
    )
    mlflow.log_table(data=out.table, artifact_file=TABLE_FILE, run_id=run_id)
    if out.meta is not None:
        mlflow.log_table(data=out.meta, artifact_file=META_FILE, run_id=run_id)
    with tempfile.TemporaryDirectory() as tmp:
        tpath = os.path.join(tmp, "judge_transcripts.jsonl")
        with open(tpath, "w", encoding="utf-8") as fh:
            for rec in out.transcripts:
                fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
        cpath = os.path.join(tmp, "config.json")
        with open(cpath, "w", encoding="utf-8") as fh:
            json.dump(out.config, fh, ensure_ascii=False, indent=2, default=str)
        client.log_artifact(run_id, tpath, "ragjudge")
        client.log_artifact(run_id, cpath, "ragjudge")
        for name, records in out.artifacts.items():
            apath = os.path.join(tmp, name)
            with open(apath, "w", encoding="utf-8") as fh:
                for rec in records:
                    fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            client.log_artifact(run_id, apath, "ragjudge")
    base = client.get_run(run_id).info.artifact_uri.rstrip("/")
    return {
        "eval_results_table": f"{base}/{TABLE_FILE}",
        "judge_transcripts": f"{base}/{TRANSCRIPTS_FILE}",
        "config": f"{base}/{CONFIG_FILE}",
    }


def _tags(out: EvalOutput) -> dict[str, str]:
    """Run tags that make a failed or gated run visible in the MLflow UI's run list."""
    tags = {"ragjudge.status": "judge_failures" if out.failures else "ok"}
    for f in out.failures:
        tags[f"ragjudge.failure.{f['metric']}"[:250]] = f["message"][:5000]
    if out.gate:
        tags["ragjudge.gate"] = "passed" if out.gate_passed else "failed"
        tags["ragjudge.gate.detail"] = json.dumps(out.gate)[:5000]
    return tags


def _result_from_cells(score: Any, status: Any, justification: Any, judged: bool) -> JudgeResult:
    if isinstance(score, float) and score != score:
        score = None
    if not judged or not isinstance(status, str):
        return JudgeResult.scored(score) if score is not None else JudgeResult.abstained("not_scored")
    state, _, reason = status.partition(":")
    text = justification if isinstance(justification, str) else ""
    if state == Status.FAILED.value:
        return JudgeResult.failed(reason or "unknown", text)
    if state == Status.ABSTAINED.value:
        return JudgeResult.abstained(reason or "abstained", text)
    return JudgeResult.scored(score, text) if score is not None else JudgeResult.abstained("not_scored", text)


def load_output(run_id: str) -> EvalOutput:
    """The full output of a ``ragjudge`` run, read back from what the run logged.

    ``mlflow.models.evaluate`` returns its own result object, so the ``EvalOutput`` the evaluator
    built does not reach the caller; this rebuilds it from the run: ``metrics`` and ``params``
    (the ``ragjudge.*`` ones), the per-row ``table``, ``transcripts``, ``config``, the meta-evaluation
    table, the extra artifacts (multi-turn conversations), the recorded judge ``failures`` and the
    ``gate``. ``results`` holds one :class:`JudgeResult` per row and metric, rebuilt from the table's
    score / status / justification columns, with each row's judge calls attached from the transcripts
    (metric-specific ``details`` stay in the table's extra columns).

    Example:
        >>> result = mlflow.models.evaluate(..., evaluators="ragjudge", ...)    # doctest: +SKIP
        >>> out = mlflow_ragjudge.load_output(result.run_id)                     # doctest: +SKIP
        >>> out.table[["question", "correctness/score"]]                         # doctest: +SKIP
    """
    import mlflow

    client = MlflowClient()
    run = client.get_run(run_id)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            folder = client.download_artifacts(run_id, "ragjudge", tmp)
        except Exception as e:
            raise ValueError(f"Run {run_id} has no ragjudge artifacts ({e}); was it evaluated by ragjudge?") from e
        files = set(os.listdir(folder))

        def read_jsonl(name: str) -> list[dict[str, Any]]:
            if name not in files:
                return []
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                return [json.loads(line) for line in fh if line.strip()]

        config: dict[str, Any] = {}
        if "config.json" in files:
            with open(os.path.join(folder, "config.json"), encoding="utf-8") as fh:
                config = json.load(fh)
        transcripts = read_jsonl("judge_transcripts.jsonl")
        artifacts = {name: read_jsonl(name) for name in files
                     if name.endswith(".jsonl") and name != "judge_transcripts.jsonl"}
    table = mlflow.load_table(TABLE_FILE, run_ids=[run_id])
    meta = None
    if any(a.path == META_FILE for a in client.list_artifacts(run_id, "ragjudge")):
        meta = mlflow.load_table(META_FILE, run_ids=[run_id])
    calls: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rec in transcripts:
        calls.setdefault((rec.get("metric", ""), int(rec.get("row", -1))), []).append(rec)
    results: dict[str, list[JudgeResult]] = {}
    for col in table.columns:
        if not col.endswith("/score"):
            continue
        name = col[: -len("/score")]
        judged = f"{name}/status" in table.columns
        results[name] = []
        for i in range(len(table)):
            res = _result_from_cells(table[col].iloc[i], table[f"{name}/status"].iloc[i] if judged else None,
                                     table[f"{name}/justification"].iloc[i] if judged else None, judged)
            res.calls = calls.get(("multiturn" if name == "wscore" else name, i), [])
            results[name].append(res)
    params = {k: v for k, v in run.data.params.items() if k.startswith("ragjudge.")}
    return EvalOutput(
        metrics=dict(run.data.metrics), table=table, results=results, transcripts=transcripts, params=params,
        config=config, meta=meta, skipped=dict(config.get("skipped") or {}), artifacts=artifacts,
        failures=list(config.get("failures") or []), gate=list(config.get("gate") or []),
    )


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
