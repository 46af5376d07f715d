"""Where runs live: reading a run's tables and traces wherever its experiment is, checking that a tracking store
answers before anything is paid for, and telling the user where to look at a run.

Every function here takes a run id and finds the run's experiment itself. MLflow's own readers do not:
``mlflow.load_table(..., run_ids=[id])`` searches the *active* experiment only (experiment 0 in a new process), and
``mlflow.search_traces(run_id=id)`` refuses a run outside the active experiment -- so a run logged with
``--experiment`` could be written but not read back.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import re
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pandas as pd

from ..core.errors import InputError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock (MLflow's own behaviour)
    fcntl = None  # type: ignore[assignment]

#: seconds the reachability check of an HTTP tracking server waits for an answer (MLflow's own client retries a
#: refused connection for about four minutes before it gives up)
TRACKING_CHECK_TIMEOUT_S = 5.0


#: MLflow's HTTP retries for a command's requests to a tracking server, unless the user set them: 4 retries (urllib3's
#: backoff: 0, 4, 8, 16 s, plus MLflow's jitter of up to 1 s each) and 30 s a try, so a server that refuses
#: connections fails a request in about 30 s, one that never answers in about 3 min (MLflow's own 7 retries of 120 s:
#: about 4 min, and up to 18)
STORE_HTTP_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
_bounded = False
_unanswered: dict[str, str] = {}  # tracking URI -> why it stopped answering (this process)
_unanswered_lock = threading.Lock()


def bounded_store_retries() -> None:
    """Set :data:`STORE_HTTP_RETRIES` in this process's environment where the user has not (every ``ragjudge``
    command that talks to a server; not a Python caller's process), and from then on, once a store has not answered
    (:func:`note_unanswered`), give each further request to it one try: the command ends within a bound instead of
    paying MLflow's retries again for every call."""
    global _bounded
    for key, value in STORE_HTTP_RETRIES.items():
        os.environ.setdefault(key, value)
    _bounded = True


@contextlib.contextmanager
def bounded_store_requests() -> Iterator[None]:
    """:func:`bounded_store_retries` for the time of one command: the environment and this module's memory of
    stores that did not answer are as they were afterwards (a command run in-process, e.g. by a test)."""
    global _bounded
    keys = (*STORE_HTTP_RETRIES, "MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    before = {k: os.environ.get(k) for k in keys}
    was = _bounded
    bounded_store_retries()
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _bounded = was
        forget_unanswered()


def store_unanswered(e: BaseException) -> bool:
    """Whether an exception says the tracking store did not answer (refused connection, timeout, retries exhausted)
    rather than refused one request: the next request would most likely fail the same way, after as long."""
    import requests

    seen: set[int] = set()
    err: BaseException | None = e
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                            requests.exceptions.RetryError, ConnectionError, TimeoutError)):
            return True
        text = str(err)
        if text.startswith("API request to") and any(s in text for s in (
                "Max retries exceeded", "Connection refused", "timed out", "Connection aborted",
                "RemoteDisconnected", "NewConnectionError", "timeout")):
            return True
        err = err.__cause__ or err.__context__
    return False


def note_unanswered(uri: str | None, reason: str) -> None:
    """Record that the store at ``uri`` stopped answering; in a command (:func:`bounded_store_retries`), every later
    MLflow request of this process gets one try."""
    with _unanswered_lock:
        _unanswered.setdefault(str(uri), reason)
    if _bounded:
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"


def unanswered(uri: str | None = None) -> str | None:
    """Why the store at ``uri`` (default: the active one) stopped answering in this process, or None."""
    if uri is None:
        import mlflow

        uri = mlflow.get_tracking_uri()
    with _unanswered_lock:
        return _unanswered.get(str(uri))


def forget_unanswered() -> None:
    with _unanswered_lock:
        _unanswered.clear()


def _client() -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def run_experiment_id(run_id: str, client: Any = None) -> str:
    """The experiment a run belongs to."""
    return str((client or _client()).get_run(run_id).info.experiment_id)


def load_run_table(run_id: str, artifact_file: str, client: Any = None) -> pd.DataFrame:
    """A table artifact (``mlflow.log_table``'s JSON layout) of one run, wherever the run's experiment is, with
    the JSON's own types: a text cell stays text (``pd.read_json``, which ``mlflow.load_table`` uses, would turn a
    row id ``"007"`` into 7 and an answer ``"42"`` into 42.0), as :func:`~mlflow_ragjudge.adapters.run_load.load_local`
    reads the same layout from disk.

    Raises:
        FileNotFoundError: the run has no such table artifact.
    """
    import tempfile

    client = client or _client()
    folder = os.path.dirname(artifact_file) or None
    if not any(f.path == artifact_file for f in client.list_artifacts(run_id, folder)):
        raise FileNotFoundError(f"run {run_id} has no table artifact {artifact_file!r}")
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, artifact_file, tmp)
        with open(path, encoding="utf-8") as fh:
            split = json.load(fh)
    return pd.DataFrame(split["data"], columns=split["columns"])


def run_traces(run_id: str, client: Any = None) -> pd.DataFrame:
    """The traces of one run (``mlflow.search_traces`` as a DataFrame, without spans), wherever its experiment is."""
    import mlflow

    experiment = run_experiment_id(run_id, client)
    return mlflow.search_traces(run_id=run_id, locations=[experiment], return_type="pandas", include_spans=False,
                                flush=True)


def _health_url(uri: str) -> str | None:
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return f"{uri.rstrip('/')}/health"


def _check_timeout() -> float:
    raw = os.environ.get("RAGJUDGE_TRACKING_CHECK_TIMEOUT")
    try:
        return float(raw) if raw else TRACKING_CHECK_TIMEOUT_S
    except ValueError:
        return TRACKING_CHECK_TIMEOUT_S


def check_reachable(uri: str, *, timeout: float | None = None) -> None:
    """One request to an HTTP(S) tracking server with a short timeout (default :data:`TRACKING_CHECK_TIMEOUT_S`, or
    ``RAGJUDGE_TRACKING_CHECK_TIMEOUT`` seconds); nothing for other stores.

    A server that answers at all -- even with 404 (no ``/health`` behind a proxy) or 401 -- is reachable: MLflow's
    own calls then say what is wrong. A refused connection, an unknown host or no answer within ``timeout`` seconds
    is an :class:`InputError` at once, instead of MLflow's minutes of retries.
    """
    url = _health_url(uri)
    if url is None:
        return
    timeout = _check_timeout() if timeout is None else timeout
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout):  # noqa: S310
            return
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
        reason = getattr(e, "reason", e)
        took = time.monotonic() - t0
        raise InputError(
            f"The MLflow tracking server at {safe_tracking_uri(uri)} did not answer ({reason}; checked once, "
            f"{took:.1f} s, timeout {timeout:g} s). Start it (mlflow server --host 127.0.0.1 --port PORT) or fix the "
            "tracking URI (--tracking-uri, tracking_uri= or MLFLOW_TRACKING_URI).") from None


def safe_tracking_uri(uri: str) -> str:
    """A URI without user:password, and, for a server (not a local ``sqlite:``/``file:`` store, whose query holds
    settings), with every query value masked (``?token=***``)."""
    parts = urlsplit(uri)
    masked = bool(parts.query) and parts.scheme not in ("sqlite", "file", "")
    if masked:
        keys = [pair.partition("=")[0] for pair in parts.query.split("&") if pair]
        parts = parts._replace(query="&".join(f"{k}=***" for k in keys))
    if parts.password is None and parts.username is None:
        return parts.geturl() if masked else uri
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return parts._replace(netloc=netloc).geturl()


def check_tracking_store(tracking_uri: str | None, experiment: str | None, *, nothing: str,
                         into_run: bool = False) -> None:
    """Make ``tracking_uri`` / ``experiment`` the active ones and check the store answers, before anything is paid
    for; an :class:`InputError` naming the store, the fix and ``nothing`` (what was not done) otherwise. An HTTP
    server is first checked with one short request (:func:`check_reachable`). ``into_run``: what follows writes into
    an existing run (``log-saved --run-id``), so the active experiment (``MLFLOW_EXPERIMENT_ID``) need not exist."""
    import mlflow

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    uri = mlflow.get_tracking_uri()
    try:
        check_reachable(uri)
    except InputError as e:
        raise InputError(f"{e} {nothing}") from None
    try:
        with store_creation_lock(uri):  # the first use creates (migrates) a new SQLite store: one process at a time
            if experiment:
                mlflow.set_experiment(experiment)
            elif os.environ.get("MLFLOW_EXPERIMENT_ID") and not into_run:  # where a new run would go must exist
                _client().get_experiment(os.environ["MLFLOW_EXPERIMENT_ID"])
            else:
                _client().search_experiments(max_results=1)
    except Exception as e:
        newer = _newer_schema_message(uri)
        if newer:  # MLflow's own text would advise `mlflow db upgrade`, which fails on such a store
            raise InputError(f"The MLflow tracking store at {safe_tracking_uri(uri)} cannot be used: {newer} "
                             f"{nothing}") from None
        raise InputError(
            f"The MLflow tracking store at {safe_tracking_uri(uri)} cannot be used ({type(e).__name__}: "
            f"{str(e)[:300]}); {_half_migrated_hint(uri, e)}fix the tracking URI (--tracking-uri, tracking_uri= or "
            f"MLFLOW_TRACKING_URI). {nothing}") from None


def sqlite_store_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for other stores and ``:memory:``)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


#: seconds a process waits for another one creating the same SQLite store (MLflow's migrations take a few seconds)
STORE_LOCK_TIMEOUT_S = 120.0


@contextlib.contextmanager
def store_creation_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive lock beside a SQLite store's file (``<db>.ragjudge-lock``) around its first use in this
    process. MLflow creates and migrates a new SQLite store on first use, and two processes doing that at once
    leave it half-migrated ("table ... already exists", "duplicate column name"); with the lock the second one waits
    and finds a finished store. Nothing for other stores, on systems without ``fcntl``, or where the lock file
    cannot be made (the store's own error then says why)."""
    path = sqlite_store_path(uri)
    if path is None or fcntl is None or not path.parent.is_dir():
        yield
        return
    try:
        fd = os.open(str(path) + ".ragjudge-lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + STORE_LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break  # a stuck holder: go on unprotected rather than hang
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _half_migrated_hint(uri: str, error: BaseException) -> str:
    """What to do with a SQLite store that two processes created at once before this lock existed."""
    text = str(error)
    if sqlite_store_path(uri) is None or not any(s in text for s in (
            "already exists", "duplicate column", "out-of-date database schema", "alembic", "no such table",
            "no such column")):
        return ""
    return ("the store looks half-created (several processes created it at once, or a migration was interrupted): "
            "run `mlflow db upgrade " + safe_tracking_uri(uri) + "` once, or move the file aside and start "
            "with a new one; ")


#: schema revisions of MLflow releases newer than those this package supports, each with the first release whose
#: migrations (``mlflow/store/db_migrations/versions``) hold it: the revisions of MLflow 3.18.0's wheel that 3.17.2's
#: lacks. A revision neither here nor the installed MLflow's is named as "a newer MLflow than the installed X.Y.Z".
NEWER_SCHEMA_REVISIONS = {"e7d1f4b2a9c6": "3.18.0", "8b6ad64cb8f5": "3.18.0", "f4a9b2c7d1e6": "3.18.0"}


def _sqlite_schema_revision(path: Path) -> str | None:
    """The schema revision a SQLite tracking store records (its ``alembic_version`` table), read without writing;
    None when the file has no such table or cannot be read."""
    if not path.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as con:
            row = con.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    return str(row[0]) if row and row[0] else None


def _installed_schema_revisions() -> set[str] | None:
    """Every schema revision the installed MLflow's migrations know (None when they cannot be read)."""
    try:
        import mlflow
        from alembic.script import ScriptDirectory

        scripts = ScriptDirectory(str(Path(mlflow.__file__).parent / "store" / "db_migrations"))
        return {script.revision for script in scripts.walk_revisions()}
    except Exception:  # only for a better message: never fail the check over it
        return None


def _mlflow_requirement() -> str | None:
    """This package's requirement on MLflow (``mlflow<4,>=3.14``), when its metadata is installed."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("mlflow-ragjudge") or []
    except PackageNotFoundError:
        return None
    return next((r.strip() for r in reqs if re.fullmatch(r"mlflow\s*([<>=!~][^;]*)?", r.strip())), None)


def _newer_schema_message(uri: str) -> str | None:
    """What to do with a SQLite store whose schema a newer MLflow migrated (MLflow migrates a store forward on first
    use, and the older MLflow then refuses it; ``mlflow db upgrade`` of the older one cannot migrate it back), or
    None when the store is not such a one."""
    path = sqlite_store_path(uri)
    revision = _sqlite_schema_revision(path) if path is not None else None
    known = _installed_schema_revisions() if revision else None
    if not revision or known is None or revision in known:
        return None
    import mlflow

    installed = mlflow.__version__
    first = NEWER_SCHEMA_REVISIONS.get(revision)
    which = f" (MLflow {first}'s migrations have it)" if first else ""
    needed = f"MLflow {first} or later" if first else "the newer MLflow that migrated it"
    requirement = _mlflow_requirement()
    pinned = f" (this mlflow-ragjudge requires {requirement})" if requirement else ""
    return (f"a newer MLflow than the installed {installed} migrated it: its schema revision {revision}{which} is "
            f"unknown to MLflow {installed}, and MLflow has no command that migrates a store back. Use another store "
            "(--tracking-uri, tracking_uri= or MLFLOW_TRACKING_URI: a new file, or a copy saved before the newer "
            f"MLflow opened this one), or open this one with {needed}{pinned}.")


def env_command(name: str) -> str:
    """A console command of the running environment (``mlflow``, ``ragjudge``): the venv's own, as a path relative
    to the working directory where it is inside it (``.venv/bin/mlflow``), else absolute; the bare name when the
    environment has none."""
    exe = Path(sys.executable).parent / (f"{name}.exe" if os.name == "nt" else name)
    if not exe.is_file():
        return name
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def absolute_store_uri(uri: str) -> str:
    """A ``sqlite:///relative.db`` URI made absolute, so the printed command works from any directory."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = uri[len("sqlite:///"):]
        if path and path != ":memory:":
            return f"sqlite:///{Path(path).resolve()}"
    return uri


def ui_hint(run_id: str | None = None, *, experiment_id: str | None = None) -> str:
    """How to look at a run in the MLflow UI: the page's address on an HTTP tracking server, else the ``mlflow ui``
    command (the running environment's) for the local store and the page to open in it."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    if experiment_id is None and run_id is not None:
        try:
            experiment_id = run_experiment_id(run_id)
        except Exception:  # only a hint: never fail a finished run over it
            experiment_id = None
    page = ""
    if experiment_id is not None:
        page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    if _health_url(uri) is not None:
        return f"open it at {safe_tracking_uri(uri).rstrip('/')}/{page}"
    return (f"view it with: {env_command('mlflow')} ui --backend-store-uri {absolute_store_uri(uri)}   "
            f"(then http://127.0.0.1:5000/{page})")


# --------------------------------------------------------------------------- runs, for the workflows
# The workflows (sweeps, comparison, calibration) reach MLflow only through these, so that they stay free of it.


def get_run(run_id: str) -> Any:
    """The run (``mlflow.entities.Run``)."""
    return _client().get_run(run_id)


def mark_killed(run_id: str) -> None:
    """End a run as KILLED (it was stopped by Ctrl-C / SIGTERM; what it logged is what was done)."""
    _client().set_terminated(run_id, status="KILLED")


def run_name(run_id: str) -> str:
    return str(_client().get_run(run_id).info.run_name or run_id)


def child_runs(parent_run_id: str, tag: str, max_results: int = 1000) -> list[Any]:
    """The runs of the parent's experiment whose ``tag`` names the parent, oldest first."""
    client = _client()
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id], filter_string=f"tags.`{tag}` = '{parent_run_id}'",
                              max_results=max_results)
    return sorted(runs, key=lambda r: r.info.start_time or 0)


def log_metrics(run_id: str, metrics: dict[str, float]) -> None:
    """Log metrics into a run in batches (MLflow takes at most 1,000 per call); NaN values are left out."""
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    items = [Metric(k, float(v), ts, 0) for k, v in metrics.items() if v == v]
    client = _client()
    for start in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[start: start + 1000])


def log_dict(run_id: str, value: Any, artifact_file: str) -> None:
    _client().log_dict(run_id, value, artifact_file)


def read_json_artifact(run_id: str, artifact_file: str) -> Any:
    """A JSON artifact of a run, or None when the run has none by that name."""
    import json
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = _client().download_artifacts(run_id, artifact_file, tmp)
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
    except Exception:
        return None


def log_figures(run_id: str, figures: dict[str, Any]) -> None:
    """Log matplotlib figures as PNG artifacts and close them."""
    import matplotlib.pyplot as plt

    client = _client()
    for name, fig in figures.items():
        client.log_figure(run_id, fig, name)
        plt.close(fig)


def _json_cell(value: Any) -> Any:
    """A table cell as JSON: every digit of a number kept (``mlflow.log_table`` writes 10 decimal places, so a p-value
    of 1.25e-12 became 0.0), a missing or non-finite number as null (``Infinity`` is not JSON a browser reads),
    dates in ISO form, numpy values as their Python ones."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, dict):
        return {str(k): _json_cell(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_cell(v) for v in value]
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _json_cell(value.tolist())
    return str(value)


def replace_table(run_id: str, table: pd.DataFrame, artifact_file: str) -> None:
    """Log a table artifact in ``mlflow.log_table``'s layout (``{"columns": [...], "data": [[...], ...]}``), replacing
    one the run already holds under that name, and list it once in the run's ``mlflow.loggedArtifacts`` tag, as
    ``mlflow.log_table`` does, so the UI's evaluation view shows it.

    Not ``mlflow.log_table`` itself: it appends to an existing table of the same name (a run logged again, e.g. by
    ``ragjudge log-saved --run-id``, had its 6 rows twice) and rounds numbers to 10 decimal places.
    """
    import tempfile

    client = _client()
    folder, _, fname = artifact_file.rpartition("/")
    split = table.astype(object).to_dict(orient="split")
    content = {"columns": [str(c) for c in split["columns"]],
               "data": [[_json_cell(v) for v in row] for row in split["data"]]}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / fname
        with open(path, "w", encoding="utf-8") as fh:
            # ASCII escapes, as MLflow writes its tables: any Python text, even a lone surrogate, is valid JSON
            json.dump(content, fh, ensure_ascii=True, allow_nan=False)
        client.log_artifact(run_id, str(path), folder or None)
    tags = client.get_run(run_id).data.tags
    logged = json.loads(tags.get("mlflow.loggedArtifacts", "[]") or "[]")
    if not any(a.get("path") == artifact_file for a in logged):
        logged.append({"path": artifact_file, "type": "table"})
        client.set_tag(run_id, "mlflow.loggedArtifacts", json.dumps(logged))


# --------------------------------------------------------------------------- the run a sweep is building


class RunLog:
    """One run being written by a workflow, opened with :func:`open_run` (the active MLflow run inside it)."""

    def __init__(self, run: Any) -> None:
        self.run_id = str(run.info.run_id)
        self.experiment_id = str(run.info.experiment_id)

    def params(self, params: dict[str, str]) -> None:
        import mlflow

        mlflow.log_params(params)

    def tags(self, tags: dict[str, str]) -> None:
        import mlflow

        mlflow.set_tags(tags)

    def metrics(self, metrics: dict[str, float]) -> None:
        import mlflow

        mlflow.log_metrics(metrics)

    def dataset(self, data: pd.DataFrame, name: str) -> None:
        """The data as the run's evaluation dataset (list cells as JSON text, which MLflow's schema wants)."""
        import json

        import mlflow
        from mlflow.data.pandas_dataset import from_pandas

        logged = data.copy()
        for col in logged.columns:
            if logged[col].map(lambda v: isinstance(v, (list, dict, tuple))).any():
                logged[col] = logged[col].map(lambda v: json.dumps(v, ensure_ascii=False, default=str)
                                              if isinstance(v, (list, dict, tuple)) else v)
        mlflow.log_input(from_pandas(logged, name=name), context="evaluation")

    def link_prompt(self, version: Any) -> None:
        _client().link_prompt_version_to_run(self.run_id, version)


@contextlib.contextmanager
def open_run(name: str, *, nested: bool = False) -> Iterator[RunLog]:
    """A run in the active experiment (a child of the active run with ``nested``), ended when the block ends."""
    import mlflow

    with mlflow.start_run(run_name=name, nested=nested) as run:
        yield RunLog(run)


# --------------------------------------------------------------------------- the prompt registry


def load_prompt(uri: str) -> Any:
    """A prompt version of MLflow's prompt registry (``prompts:/name/version`` or ``prompts:/name@alias``)."""
    import mlflow

    return mlflow.genai.load_prompt(uri, link_to_model=False)


def register_prompt(name: str, template: str, commit_message: str) -> Any:
    """The registry's version of this prompt: an existing version with the same text, else a new one."""
    import mlflow

    try:
        latest = load_prompt(f"prompts:/{name}@latest")
    except Exception:
        latest = None
    if latest is not None:
        for v in range(int(latest.version), 0, -1):
            try:
                pv = load_prompt(f"prompts:/{name}/{v}")
            except Exception:
                continue
            if pv.template == template:
                return pv
    return mlflow.genai.register_prompt(name, template, commit_message=commit_message)


# --------------------------------------------------------------------------- review queues (mlflow.genai)


def create_review_queue(run_id: str, trace_ids: list[str], schemas: dict[str, tuple[float, float, str]],
                        queue_name: str) -> tuple[Any, str]:
    """An MLflow review queue (``mlflow.genai.review_queues``, experimental, open-source MLflow >= 3.14) holding
    ``trace_ids``, with one numeric label schema per name (``name -> (min, max, instruction)``; an existing schema of
    that name in the run's experiment is reused). Returns the queue and what happened: ``"created"``; ``"reused"``
    (a queue of that name already holds exactly these traces and schemas: the same draw asked for again);
    ``"filled"`` (a queue of that name was left empty by an earlier failure: the traces are added to it). A queue
    that is not created whole is deleted again, so a failure leaves no empty queue behind.

    Raises:
        InputError: a queue of that name holds other traces or other label schemas (people may be labelling it;
            it is never changed).
    """
    from mlflow.exceptions import MlflowException
    from mlflow.genai import label_schemas, review_queues

    exp = run_experiment_id(run_id)
    try:
        existing = review_queues.get_review_queue(name=queue_name, experiment_id=exp)
    except MlflowException as e:
        if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST" and "not found" not in str(e).lower():
            raise
        existing = None
    known = {s.name: s for s in label_schemas.list_label_schemas(experiment_id=exp, max_results=1000)}
    if existing is not None:
        held = {i.item_id for i in review_queues.list_review_queue_items(existing.queue_id, max_results=1000)}
        wanted = {known[n].schema_id for n in schemas if n in known}
        if held and (held != set(trace_ids) or len(wanted) < len(schemas) or not wanted <= set(existing.schema_ids)):
            raise InputError(
                f"Review queue {queue_name!r} ({existing.queue_id}) already exists in experiment {exp} with "
                f"{len(held)} other trace(s) or other metrics than this draw ({len(trace_ids)} trace(s) for "
                f"{', '.join(schemas)}); it is left as it is (people may be labelling it). Draw with another --seed, "
                "or delete that queue in the MLflow UI first.")
        if held:
            return existing, "reused"
        review_queues.add_items_to_review_queue(existing.queue_id, item_ids=trace_ids)
        return existing, "filled"
    schema_ids = []
    for name, (lo, hi, instruction) in schemas.items():
        if name in known:
            schema_ids.append(known[name].schema_id)
            continue
        widget = label_schemas.InputNumeric(min_value=lo, max_value=hi)
        schema = label_schemas.create_label_schema(name, type="feedback", input=widget, instruction=instruction,
                                                   experiment_id=exp)
        schema_ids.append(schema.schema_id)
    queue = review_queues.create_review_queue(queue_name, queue_type="custom", schema_ids=schema_ids,
                                              experiment_id=exp)
    try:
        review_queues.add_items_to_review_queue(queue.queue_id, item_ids=trace_ids)
    except BaseException:
        review_queues.delete_review_queue(queue.queue_id)  # no empty queue left to block the next draw
        raise
    return queue, "created"


def is_remote_uri(uri: str | None) -> bool:
    """Whether a tracking URI is a server (HTTP, Databricks) rather than a local store."""
    return str(uri or "").lower().startswith(("http://", "https://", "databricks"))
