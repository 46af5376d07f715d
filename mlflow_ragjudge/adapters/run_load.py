"""Reading a logged evaluation back as an :class:`~mlflow_ragjudge.engine.evaluate.EvalOutput`: from an MLflow run
(:func:`load_output`; ``mlflow.models.evaluate`` returns its own result object, so this is how its caller gets the
full output) or from the local folder :func:`~mlflow_ragjudge.adapters.run_log.save_local` wrote (:func:`load_local`,
for ``ragjudge log-saved``). The inverse of :mod:`~mlflow_ragjudge.adapters.run_log`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.tracking import MlflowClient

from ..core.errors import InputError
from ..core.types import JudgeResult, Row, Status
from ..engine.evaluate import EvalOutput
from ..llm.backends import safe_judge_uri
from ..llm.backends.base import safe_url
from ..metrics.spec import all_specs
from .run_log import META_FILE, ROW_CONTEXTS_FILE, TABLE_FILE
from .tracking import load_run_table

__all__ = ["load_output", "load_local", "scrub_saved"]


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
    log-saved FOLDER``). Every file is checked for the shape the package writes; the params and config pass through
    the same scrubbing as a live run's (:func:`scrub_saved`): a folder edited by hand cannot put a secret into a run.

    Raises:
        InputError: the folder is missing, is not such a save, or a file of it is damaged (the error names the file
            and what is wrong with it).
    """
    path = Path(folder).expanduser()
    needed = ("eval_results_table.json", "metrics.json", "params.json", "config.json")
    missing = [n for n in needed if not (path / n).is_file()]
    if not path.is_dir() or missing:
        raise InputError(f"{str(path)!r} is not a saved ragjudge evaluation (missing {missing or 'the folder'}); give "
                         "the folder the failed run named (under RAGJUDGE_OUTPUT_DIR).")
    try:
        return _load_checked(path)
    except _Damaged as e:
        raise InputError(f"{str(path / e.name)!r} is damaged: {e.what}. It is not as ragjudge saved it; restore it "
                         "from a copy, or re-run the evaluation (cached judge replies are not bought again). "
                         "Nothing was logged.") from None


class _Damaged(Exception):
    def __init__(self, name: str, what: str) -> None:
        super().__init__(f"{name}: {what}")
        self.name, self.what = name, what


def _read_json(path: Path, name: str) -> Any:
    try:
        text = (path / name).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise _Damaged(name, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise _Damaged(name, f"cannot be read ({e.strerror or e})") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise _Damaged(name, f"not valid JSON ({e})") from None


def _read_jsonl(path: Path, name: str) -> list[dict[str, Any]]:
    try:
        lines = (path / name).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise _Damaged(name, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise _Damaged(name, f"cannot be read ({e.strerror or e})") from None
    records = []
    for k, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise _Damaged(name, f"line {k} is not valid JSON ({e})") from None
        if not isinstance(rec, dict):
            raise _Damaged(name, f"line {k} is a JSON {type(rec).__name__}, not an object")
        if "row" in rec and not _whole(rec["row"]):
            raise _Damaged(name, f"line {k}: 'row' is {rec['row']!r}, not a row number")
        records.append(rec)
    return records


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _table(path: Path, name: str) -> pd.DataFrame:
    split = _read_json(path, name)
    if not isinstance(split, dict):
        raise _Damaged(name, f"a JSON {type(split).__name__}, not a table ({{\"columns\": [...], \"data\": [...]}})")
    for key in ("columns", "data"):
        if not isinstance(split.get(key), list):
            raise _Damaged(name, f"no '{key}' list" if key not in split else f"'{key}' is not a list")
    columns = split["columns"]
    if not all(isinstance(c, str) for c in columns):
        raise _Damaged(name, "a column name that is not text")
    if len(set(columns)) != len(columns):
        raise _Damaged(name, "a column name twice")
    for k, row in enumerate(split["data"]):
        if not isinstance(row, list) or len(row) != len(columns):
            what = f"a {type(row).__name__}" if not isinstance(row, list) else f"{len(row)} cells"
            raise _Damaged(name, f"row {k} is {what}, not a list of {len(columns)} cells (one per column)")
    table = pd.DataFrame(split["data"], columns=columns)
    for col in columns:
        if col.endswith("/score") or "/score@" in col:
            bad = [v for v in table[col] if v is not None and not (isinstance(v, (int, float)) and not
                                                                    isinstance(v, bool))]
            if bad:
                raise _Damaged(name, f"column {col!r} holds {bad[0]!r}, not a score (a number or null)")
    return table


def _config(config: Any, rows: int) -> dict[str, Any]:
    name = "config.json"
    if not isinstance(config, dict):
        raise _Damaged(name, f"a JSON {type(config).__name__}, not an object")
    if not _whole(config.get("rows")) or config["rows"] < 0:
        raise _Damaged(name, "no 'rows' count" if "rows" not in config else f"'rows' is {config['rows']!r}")
    if config["rows"] != rows:
        raise _Damaged(name, f"'rows' is {config['rows']}, but the per-row table has {rows} rows")
    run = config.get("metrics_run")
    if not isinstance(run, list) or not all(isinstance(m, str) for m in run):
        raise _Damaged(name, "no 'metrics_run' list of metric names")
    shapes: dict[str, tuple[type, ...]] = {"config": (dict,), "skipped": (dict,), "failures": (list,),
                                           "gate": (list,), "usage": (dict,), "cache": (dict,),
                                           "interrupted": (dict,), "calibration": (dict,), "draws": (dict,)}
    for key, kinds in shapes.items():
        if config.get(key) is not None and not isinstance(config[key], kinds):
            raise _Damaged(name, f"'{key}' is a {type(config[key]).__name__}, not a {kinds[0].__name__}")
    settings = config.get("config") or {}
    for key in ("traces", "seed"):
        if settings.get(key) is not None and not _whole(settings[key]):
            raise _Damaged(name, f"'config.{key}' is {settings[key]!r}, not a whole number")
    for f in config.get("failures") or []:
        if not isinstance(f, dict) or not isinstance(f.get("metric"), str) or not isinstance(f.get("message"), str):
            raise _Damaged(name, "a 'failures' entry without its 'metric' and 'message'")
    for g in config.get("gate") or []:
        if not isinstance(g, dict) or not isinstance(g.get("metric"), str) or not (
                g.get("outcome") in ("pass", "fail", "undecided") or isinstance(g.get("passed"), bool)):
            raise _Damaged(name, "a 'gate' entry without its 'metric' and outcome")
    stop = config.get("interrupted")
    if stop is not None and not (isinstance(stop.get("by"), str) and _whole(stop.get("results"))
                                 and _whole(stop.get("results_not_judged"))):
        raise _Damaged(name, "'interrupted' without 'by', 'results' and 'results_not_judged'")
    return config


def _rows(path: Path, table: pd.DataFrame) -> list[Row]:
    """The rows' contexts (the traces' retriever spans), when the save has them."""
    name = ROW_CONTEXTS_FILE
    if not (path / name).is_file():
        return []
    saved = _read_json(path, name)
    if not isinstance(saved, list) or len(saved) != len(table):
        raise _Damaged(name, f"not a list of {len(table)} entries (one per row of the table)")
    rows = []
    for i, rec in enumerate(saved):
        contexts = rec.get("contexts") if isinstance(rec, dict) else None
        ids = rec.get("retrieved_doc_ids") if isinstance(rec, dict) else None
        if not isinstance(rec, dict) or not isinstance(contexts, (list, type(None))) or not isinstance(
                ids, (list, type(None))):
            raise _Damaged(name, f"entry {i} is not {{\"contexts\": [...], \"retrieved_doc_ids\": [...]}}")
        question = table["question"].iloc[i] if "question" in table.columns else None
        rows.append(Row(index=i, question=question if isinstance(question, str) else None,
                        contexts=[str(c) for c in contexts] if contexts else None, retrieved_doc_ids=ids))
    return rows


def _load_checked(path: Path) -> EvalOutput:
    table = _table(path, "eval_results_table.json")
    metrics = _read_json(path, "metrics.json")
    if not isinstance(metrics, dict):
        raise _Damaged("metrics.json", f"a JSON {type(metrics).__name__}, not an object")
    for k, v in metrics.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise _Damaged("metrics.json", f"{k!r} is {v!r}, not a number")
    params = _read_json(path, "params.json")
    if not isinstance(params, dict):
        raise _Damaged("params.json", f"a JSON {type(params).__name__}, not an object")
    if not all(isinstance(v, (str, int, float, bool)) or v is None for v in params.values()):
        raise _Damaged("params.json", "a value that is not text or a number")
    config = _config(_read_json(path, "config.json"), len(table))
    meta = _table(path, "meta_evaluation.json") if (path / "meta_evaluation.json").is_file() else None
    transcripts = (_read_jsonl(path, "judge_transcripts.jsonl") if (path / "judge_transcripts.jsonl").is_file()
                   else [])
    artifacts = {f.name: _read_jsonl(path, f.name) for f in sorted(path.glob("*.jsonl"))
                 if f.name != "judge_transcripts.jsonl"}
    out = _output({k: float(v) for k, v in metrics.items()}, scrub_saved({str(k): str(v) for k, v in params.items()}),
                  scrub_saved(config), table, transcripts, meta, artifacts)
    out.rows = _rows(path, table)
    return out


#: dict keys whose values are secrets wherever they are
_SECRET_KEYS = re.compile(r"(api[_-]?key|token|secret|password|passwd|authorization|access[_-]?key|credential)",
                          re.IGNORECASE)
#: provider keys by their look (OpenAI / Anthropic ``sk-``, GitHub, Slack, AWS access key ids)
_KEY_LOOK = re.compile(r"\b(sk-[A-Za-z0-9_-]{8,}|gh[pousr]_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}"
                       r"|AKIA[A-Z0-9]{16})")
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]+")


def scrub_saved(value: Any) -> Any:
    """Params or config read from disk, as a live run would log them: judge URIs as :func:`safe_judge_uri` writes
    them, no ``user:password@`` or query value in any URL, no value of a secret-named key, no secret this process
    holds (``*_API_KEY``, ``*_TOKEN`` ... variables, as the judge client scrubs its records), nothing that looks
    like a provider's key."""
    if isinstance(value, dict):
        return {k: "***" if isinstance(k, str) and _SECRET_KEYS.search(k) and v not in (None, "", False)
                else scrub_saved(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_saved(v) for v in value]
    if not isinstance(value, str):
        return value
    text = value
    if re.match(r"^[a-z][a-z0-9]*:/", text) and "://" not in text.split("?", 1)[0]:
        text = str(safe_judge_uri(text))  # a judge URI: provider:/model?base_url=...
    text = _URL.sub(lambda m: str(safe_url(m.group(0))) if "@" in m.group(0) or "?" in m.group(0) else m.group(0),
                    text)
    for secret in _process_secrets():
        text = text.replace(secret, "***")
    return _KEY_LOOK.sub("***", text)


def _process_secrets() -> list[str]:
    return [v for k, v in os.environ.items() if k.endswith(("_API_KEY", "_TOKEN", "_SECRET", "_PASSWORD"))
            and v and len(v) >= 6]
