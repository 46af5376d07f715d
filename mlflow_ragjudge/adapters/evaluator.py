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
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.models.evaluation import EvaluationResult, ModelEvaluator
from mlflow.models.evaluation.artifacts import JsonEvaluationArtifact
from mlflow.tracking import MlflowClient

from ..core.errors import InputError, LoggingFailed
from ..core.types import JudgeResult, Status
from ..engine.evaluate import EvalOutput, evaluate_frame
from ..engine.record import local_output_root
from ..metrics.spec import all_specs
from .traces import DEFAULT_MAX_TRACES, TraceLog, log_row_traces, remove_row_traces
from .tracking import load_run_table, replace_table

__all__ = ["RagJudgeEvaluator", "LoggingFailed", "log_output", "load_output", "load_local", "save_local", "MODEL_TYPE",
           "TABLE_FILE", "TRANSCRIPTS_FILE", "CONFIG_FILE"]

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


def _write_json(path: Path, value: Any) -> None:
    with open(path, "w", encoding="utf-8", errors="backslashreplace") as fh:
        json.dump(value, fh, ensure_ascii=False, indent=1, default=str)


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8", errors="backslashreplace") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")


def save_local(out: EvalOutput, label: str = "") -> Path | None:
    """Write an evaluation's results to a local folder before anything is sent to MLflow, so that a
    tracking store that refuses or fails cannot lose what the judge calls paid for.

    The folder (under :func:`local_output_root`) holds ``eval_results_table.json`` (pandas ``split``
    layout), ``judge_transcripts.jsonl``, ``config.json``, ``metrics.json``, ``params.json``, the
    meta-evaluation table and the extra JSONL artifacts. Returns the folder, or None (with a warning)
    when nothing could be written.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidates = [local_output_root(), Path(tempfile.gettempdir()) / "ragjudge-outputs"]
    for root in candidates:
        folder = root / f"{stamp}-{os.getpid()}-{label or 'run'}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _write_json(folder / "eval_results_table.json", out.table.to_dict(orient="split"))
            _write_jsonl(folder / "judge_transcripts.jsonl", out.transcripts)
            _write_json(folder / "config.json", out.config)
            _write_json(folder / "metrics.json", out.metrics)
            _write_json(folder / "params.json", out.params)
            if out.meta is not None:
                _write_json(folder / "meta_evaluation.json", out.meta.to_dict(orient="split"))
            for name, records in out.artifacts.items():
                _write_jsonl(folder / name, records)
            return folder
        except OSError:
            continue
    warnings.warn("the evaluation's results could not be saved locally before logging (no writable folder in "
                  f"{[str(c) for c in candidates]}); set RAGJUDGE_OUTPUT_DIR", RuntimeWarning, stacklevel=2)
    return None


def log_output(out: EvalOutput, run_id: str, *, saved: Path | None = None, keep_local: bool = False,
               pipeline: Sequence[dict[str, Any] | None] | None = None, traces: bool = True) -> dict[str, Any]:
    """Log an evaluation's metrics, params, tags, table, transcripts and config into a run, and then its rows as
    traces (:func:`~mlflow_ragjudge.adapters.traces.log_row_traces`, at most the config's ``traces``; ``pipeline``:
    per row, the call to the user's pipeline, shown as a span). Into a run that holds a logged evaluation already,
    the tables, files and traces replace the earlier ones (each row once), and a metric is logged only where its
    value differs from the run's. ``traces=False``: no traces here (a Spark run's table is a sample of its rows, so
    the caller logs the traces from the rows it collected, with :func:`log_traces`).

    The results are first saved locally (:func:`save_local`, unless ``saved`` says where they already
    are). Every logging step is attempted even when an earlier one fails; if any failed, the run gets
    the tag ``ragjudge.logging_error`` (when the store takes it) and :class:`LoggingFailed` is raised,
    naming the local folder. On success the local copy is removed unless ``keep_local``.

    Returns the artifact URIs by name.
    """
    from mlflow.entities import Metric, Param, RunTag

    if saved is None:
        saved = save_local(out, run_id[:8])
    client = MlflowClient()
    errors: list[str] = []

    def attempt(step: str, fn: Any) -> None:
        try:
            fn()
        except Exception as e:  # the store refused or failed: keep going, report all at the end
            errors.append(f"{step}: {type(e).__name__}: {str(e)[:300]}")

    metrics = {k: float(v) for k, v in out.metrics.items()}
    ts = int(time.time() * 1000)
    params = {k: str(v)[:6000] for k, v in out.params.items()}
    existing: dict[str, str] = {}
    logged: dict[str, float] = {}

    def read_run() -> None:
        data = client.get_run(run_id).data
        existing.update(data.params)
        logged.update(data.metrics)

    attempt("read the run", read_run)
    params = {k: v for k, v in params.items() if existing.get(k) in (None, v)}
    # a run logged again keeps one point per metric: a value the run holds already is not logged a second time
    metric_list = [Metric(k, v, ts, 0) for k, v in sorted(metrics.items()) if not _same_value(logged.get(k), v)]
    for start in range(0, len(metric_list), 1000):  # MLflow takes at most 1,000 metrics per batch
        chunk = metric_list[start: start + 1000]
        attempt("metrics", lambda chunk=chunk: client.log_batch(run_id, metrics=chunk))
    attempt("params and tags", lambda: client.log_batch(
        run_id, params=[Param(k, v) for k, v in params.items() if k not in existing],
        tags=[RunTag(k, v) for k, v in _tags(out).items()]))
    # replaced, not appended: a run logged again (ragjudge log-saved --run-id) holds each row once
    attempt("table", lambda: replace_table(run_id, out.table, TABLE_FILE))
    if out.meta is not None:
        meta = out.meta
        attempt("meta-evaluation table", lambda: replace_table(run_id, meta, META_FILE))
    with tempfile.TemporaryDirectory() as tmp:
        files: dict[str, Any] = {"judge_transcripts.jsonl": lambda p: _write_jsonl(p, out.transcripts),
                                 "config.json": lambda p: _write_json(p, out.config)}
        for name, records in out.artifacts.items():
            files[name] = lambda p, r=records: _write_jsonl(p, r)
        for name, write in files.items():
            path = Path(tmp) / name

            def log(path: Path = path, write: Any = write) -> None:
                write(path)
                client.log_artifact(run_id, str(path), "ragjudge")

            attempt(name, log)
    if not errors and traces:  # the traces are a second view of the table: written once the table is safe
        log_traces(out, run_id, pipeline)
    if errors:
        where = f"they are saved at {saved}" if saved is not None else "they could not be saved locally either"
        message = f"Logging to MLflow run {run_id} failed ({'; '.join(errors)}); the results are not lost: {where}."
        try:
            client.set_tag(run_id, "ragjudge.logging_error", message[:5000])
        except Exception:  # the store is unreachable: the exception below still says where the results are
            pass
        raise LoggingFailed(message, saved)
    if saved is not None and not keep_local:
        shutil.rmtree(saved, ignore_errors=True)
    base = client.get_run(run_id).info.artifact_uri.rstrip("/")
    return {
        "eval_results_table": f"{base}/{TABLE_FILE}",
        "judge_transcripts": f"{base}/{TRANSCRIPTS_FILE}",
        "config": f"{base}/{CONFIG_FILE}",
    }


def _same_value(logged: float | None, value: float) -> bool:
    return logged is not None and (logged == value or (math.isnan(logged) and math.isnan(value)))


def log_traces(out: EvalOutput, run_id: str, pipeline: Sequence[dict[str, Any] | None] | None = None, *,
               positions: Sequence[int] | None = None, total: int | None = None) -> TraceLog:
    """Write the run's rows as traces (replacing those an earlier logging of the same run wrote) and say how many in
    the run's ``ragjudge.traces`` tag. A store that refuses traces is warned about, not raised: the metrics and the
    per-row table are logged already. ``positions`` / ``total``: ``out`` holds only the rows of a larger run that
    the trace sample picks (:func:`~mlflow_ragjudge.adapters.traces.log_row_traces`)."""
    settings = out.config.get("config") or {}
    limit = DEFAULT_MAX_TRACES if settings.get("traces") is None else int(settings["traces"])
    client = MlflowClient()
    try:
        if client.get_run(run_id).data.tags.get("ragjudge.traces"):
            remove_row_traces(run_id)
        log = log_row_traces(out, run_id, max_traces=limit, seed=int(settings.get("seed") or 0), pipeline=pipeline,
                             positions=positions, total=total)
    except Exception as e:  # the store has no trace support, or failed
        log = TraceLog(rows=len(out.table) if total is None else total,
                       errors=[f"{type(e).__name__}: {str(e)[:300]}"])
    try:
        client.set_tag(run_id, "ragjudge.traces", log.describe()[:5000])
    except Exception:  # the store is unreachable now: the warning below still says it
        pass
    if log.errors:
        warnings.warn(f"run {run_id}: {log.describe()}", RuntimeWarning, stacklevel=3)
    return log


def _tags(out: EvalOutput) -> dict[str, str]:
    """Run tags that make a failed or gated run visible in the MLflow UI's run list."""
    tags = {"ragjudge.status": "judge_failures" if out.failures else "ok"}
    stopped = out.config.get("interrupted")
    if stopped:  # Ctrl-C / SIGTERM: what is logged is what was done (core.stop)
        tags["ragjudge.status"] = "interrupted"
        tags["ragjudge.interrupted"] = (f"stopped by {stopped['by']}: {stopped['results_not_judged']} of "
                                        f"{stopped['results']} results not judged; re-run to finish (cached replies "
                                        "are not bought again)")
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
    # read from the run itself: mlflow.load_table searches the active experiment only
    table = load_run_table(run_id, TABLE_FILE, client)
    meta = None
    if any(a.path == META_FILE for a in client.list_artifacts(run_id, "ragjudge")):
        meta = load_run_table(run_id, META_FILE, client)
    params = {k: v for k, v in run.data.params.items() if k.startswith("ragjudge.")}
    return _output(dict(run.data.metrics), params, config, table, transcripts, meta, artifacts)


def _output(metrics: dict[str, float], params: dict[str, str], config: dict[str, Any], table: pd.DataFrame,
            transcripts: list[dict[str, Any]], meta: pd.DataFrame | None,
            artifacts: dict[str, list[dict[str, Any]]]) -> EvalOutput:
    """An :class:`EvalOutput` rebuilt from what a run (or a local save) holds: one :class:`JudgeResult` per row and
    metric from the table's score / status / justification columns, each with its judge calls attached."""
    calls: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rec in transcripts:
        calls.setdefault((rec.get("metric", ""), int(rec.get("row", -1))), []).append(rec)
    # a metric's transcripts go with its first output (multiturn's with wscore)
    owners = {spec.output_names[0]: spec.name for spec in all_specs()}
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
            res.calls = calls.get((owners.get(name, name), i), [])
            results[name].append(res)
    return EvalOutput(
        metrics=metrics, table=table, results=results, transcripts=transcripts, params=params,
        config=config, meta=meta, skipped=dict(config.get("skipped") or {}), artifacts=artifacts,
        failures=list(config.get("failures") or []), gate=list(config.get("gate") or []),
    )


def load_local(folder: str | os.PathLike[str]) -> EvalOutput:
    """An evaluation saved by :func:`save_local` (the folder a failed logging named, exit 5), read back to log it
    later with :func:`log_output` (``ragjudge log-saved FOLDER``).

    Raises:
        InputError: the folder is missing or is not such a save.
    """
    path = Path(folder).expanduser()
    needed = ("eval_results_table.json", "metrics.json", "params.json", "config.json")
    missing = [n for n in needed if not (path / n).is_file()]
    if not path.is_dir() or missing:
        raise InputError(f"{str(path)!r} is not a saved ragjudge evaluation (missing {missing or 'the folder'}); give "
                         "the folder the failed run named (under RAGJUDGE_OUTPUT_DIR).")

    def read(name: str) -> Any:
        with open(path / name, encoding="utf-8") as fh:
            return json.load(fh)

    def read_jsonl(name: str) -> list[dict[str, Any]]:
        with open(path / name, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

    split = read("eval_results_table.json")
    table = pd.DataFrame(split["data"], columns=split["columns"])
    meta = None
    if (path / "meta_evaluation.json").is_file():
        m = read("meta_evaluation.json")
        meta = pd.DataFrame(m["data"], columns=m["columns"])
    transcripts = read_jsonl("judge_transcripts.jsonl") if (path / "judge_transcripts.jsonl").is_file() else []
    artifacts = {f.name: read_jsonl(f.name) for f in sorted(path.glob("*.jsonl"))
                 if f.name != "judge_transcripts.jsonl"}
    return _output({k: float(v) for k, v in read("metrics.json").items()}, dict(read("params.json")),
                   read("config.json"), table, transcripts, meta, artifacts)


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
