"""Reading a logged evaluation back as an :class:`~mlflow_ragjudge.engine.evaluate.EvalOutput`: from an MLflow run
(:func:`load_output`; ``mlflow.models.evaluate`` returns its own result object, so this is how its caller gets the
full output) or from the local folder :func:`~mlflow_ragjudge.adapters.run_log.save_local` wrote (:func:`load_local`,
for ``ragjudge log-saved``). The inverse of :mod:`~mlflow_ragjudge.adapters.run_log`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.tracking import MlflowClient

from ..core.errors import InputError
from ..core.types import JudgeResult, Status
from ..engine.evaluate import EvalOutput
from ..metrics.spec import all_specs
from .run_log import META_FILE, TABLE_FILE
from .tracking import load_run_table

__all__ = ["load_output", "load_local"]


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
    """An evaluation saved by :func:`~mlflow_ragjudge.adapters.run_log.save_local` (the folder a failed logging named,
    exit 5), read back to log it later with :func:`~mlflow_ragjudge.adapters.run_log.log_output` (``ragjudge
    log-saved FOLDER``).

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
