"""Where runs live: reading a run's tables and traces wherever its experiment is, checking that a tracking store
answers before anything is paid for, and telling the user where to look at a run.

Every function here takes a run id and finds the run's experiment itself. MLflow's own readers do not:
``mlflow.load_table(..., run_ids=[id])`` searches the *active* experiment only (experiment 0 in a new process), and
``mlflow.search_traces(run_id=id)`` refuses a run outside the active experiment -- so a run logged with
``--experiment`` could be written but not read back.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pandas as pd

from ..core.errors import InputError

__all__ = ["load_run_table", "run_traces", "run_experiment_id", "check_reachable", "check_tracking_store",
           "safe_tracking_uri", "ui_hint", "env_command", "absolute_store_uri", "TRACKING_CHECK_TIMEOUT_S"]

#: seconds the reachability check of an HTTP tracking server waits for an answer (MLflow's own client retries a
#: refused connection for about four minutes before it gives up)
TRACKING_CHECK_TIMEOUT_S = 5.0


def _client() -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def run_experiment_id(run_id: str, client: Any = None) -> str:
    """The experiment a run belongs to."""
    return str((client or _client()).get_run(run_id).info.experiment_id)


def load_run_table(run_id: str, artifact_file: str, client: Any = None) -> pd.DataFrame:
    """A table artifact (``mlflow.log_table``'s JSON layout) of one run, read the way ``mlflow.load_table`` reads
    it, wherever the run's experiment is.

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
        return pd.read_json(path, orient="split")


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
    """A URI without user:password."""
    parts = urlsplit(uri)
    if parts.password is None and parts.username is None:
        return uri
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return parts._replace(netloc=netloc).geturl()


def check_tracking_store(tracking_uri: str | None, experiment: str | None, *, nothing: str) -> None:
    """Make ``tracking_uri`` / ``experiment`` the active ones and check the store answers, before anything is paid
    for; an :class:`InputError` naming the store, the fix and ``nothing`` (what was not done) otherwise. An HTTP
    server is first checked with one short request (:func:`check_reachable`)."""
    import mlflow

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    uri = mlflow.get_tracking_uri()
    try:
        check_reachable(uri)
    except InputError as e:
        raise InputError(f"{e} {nothing}") from None
    try:
        if experiment:
            mlflow.set_experiment(experiment)
        elif os.environ.get("MLFLOW_EXPERIMENT_ID"):  # the experiment the run would go to must exist
            _client().get_experiment(os.environ["MLFLOW_EXPERIMENT_ID"])
        else:
            _client().search_experiments(max_results=1)
    except Exception as e:
        raise InputError(
            f"The MLflow tracking store at {safe_tracking_uri(uri)} cannot be used ({type(e).__name__}: "
            f"{str(e)[:300]}); fix the tracking URI (--tracking-uri, tracking_uri= or MLFLOW_TRACKING_URI). "
            f"{nothing}") from None


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
