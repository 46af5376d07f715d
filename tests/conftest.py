"""Test-wide settings: everything offline, every store under a temp dir, no backoff."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

import pytest

_TMP = Path(tempfile.mkdtemp(prefix="ragjudge-tests-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)  # one per test process (pytest-xdist: one per worker)
os.environ.update(
    {
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "MLFLOW_MODEL_CATALOG_URI": "",
        "MLFLOW_TRACKING_URI": f"sqlite:///{_TMP / 'mlflow.db'}",
        "RAGJUDGE_CACHE_DIR": str(_TMP / "cache"),
        "RAGJUDGE_BACKOFF_SCALE": "0",
        # a first attempt is abandoned and sent again only after 30 s (the product's floor is 2 s): on a loaded
        # CI machine a reply can take seconds, and tests that count requests must not see a resend for it (the
        # tail-latency tests set their own floor)
        "RAGJUDGE_TAIL_TIMEOUT_FLOOR": "30",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
)
for _var in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "RAGJUDGE_MAX_CONCURRENCY"):
    os.environ.pop(_var, None)
_WORKDIR = _TMP / "cwd"
_WORKDIR.mkdir()

from compliant_model import CompliantModel  # noqa: E402
from fakellm import fake_llm as _fake_llm  # noqa: E402,F401  (registers the fake_llm fixture)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """A test that starts Spark or a real ``mlflow server`` (the ``spark`` and ``mlflow_server`` fixtures, or a
    ``store`` parametrized to ``"server"``) is slow: ``scripts/test.sh`` leaves it out of a developer's quick run
    (``-m "not slow"``), CI runs it. The other slow tests are marked where they are written (``@pytest.mark.slow``:
    the subprocess CLIs, the browser, the long runs and fits -- each 5 s or more in a one-worker run of the suite on
    the shared 2-core machine, about 1 s or more on an idle one); each module keeps tests in the quick run."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if {"spark", "mlflow_server"} & set(item.fixturenames) or params.get("store") == "server":
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _run_in_a_temp_dir() -> None:
    # A SQLite tracking store puts artifacts under ./mlruns of the working directory: run the tests from a
    # temp directory so nothing lands in the checkout. (Not at import: pytest resolves ``testpaths`` against
    # the working directory after loading this file, and pytest-xdist starts its workers in it.)
    os.chdir(_WORKDIR)


@pytest.fixture(autouse=True)
def _fresh_connection_state():
    """Each test starts with no memory of earlier tests' servers: a fake server may get a port an earlier
    one had, and the process-wide negotiation and limit state is keyed on the URL."""
    from mlflow_ragjudge.llm import gate as gate_module
    from mlflow_ragjudge.llm.backends.openai import forget_negotiations

    forget_negotiations()
    with gate_module._GATES_LOCK:
        gate_module._GATES.clear()
    store = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    # A CLI call in-process (``main([... "--tracking-uri", URI])``) makes URI MLflow's process-wide tracking URI,
    # as it should for a command, and mlflow.set_tracking_uri writes it to MLFLOW_TRACKING_URI too (for
    # subprocesses); the next test must inherit neither.
    import sys

    if store is not None:
        os.environ["MLFLOW_TRACKING_URI"] = store
    if "mlflow" in sys.modules:
        sys.modules["mlflow"].set_tracking_uri(store)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"reference data not found at {SHARED_DATA} (it lives beside the project, not in it)")
    return SHARED_DATA


# ----------------------------------------------------------------------------- MLflow tracking stores

# MLflow runs all its alembic migrations on every new SQLite tracking database (1-3 s each). Each test process
# builds one initialised database, once, and every test that needs a fresh store gets a copy of it (a file
# copy is milliseconds): the same empty, fully migrated store, under a path (and so a URI) of its own.
_STORE_TEMPLATE = _TMP / "mlflow-template.db"
_STORE_TEMPLATE_LOCK = threading.Lock()


def _store_template() -> Path:
    with _STORE_TEMPLATE_LOCK:
        if not _STORE_TEMPLATE.is_file():
            from mlflow.tracking import MlflowClient

            building = _TMP / "mlflow-template-building.db"
            # From the tests' working directory, like a store made by a test, so experiment 0 (created with the
            # tables) has the artifact location a store made in a test would give it.
            MlflowClient(f"sqlite:///{building}").search_experiments()
            building.replace(_STORE_TEMPLATE)
        return _STORE_TEMPLATE


def _fresh_tracking_uri(db: Path) -> str:
    """Put a new, initialised, empty MLflow SQLite store at ``db`` (which must not exist); returns its URI."""
    if db.exists():
        raise FileExistsError(f"{db} exists: a fresh store needs a new path")
    db.parent.mkdir(parents=True, exist_ok=True)
    # sqlite's backup API: a consistent copy even while a connection to the template is open
    with contextlib.closing(sqlite3.connect(_store_template())) as src, contextlib.closing(sqlite3.connect(db)) as dst:
        src.backup(dst)
    return f"sqlite:///{db}"


@pytest.fixture(scope="session")
def fresh_tracking_uri():
    """``fresh_tracking_uri(path)``: a new, empty MLflow SQLite store at ``path``; returns its URI (not made active)."""
    return _fresh_tracking_uri


@pytest.fixture(params=["sqlite", "server"])
def store(request, tmp_path, fresh_tracking_uri, monkeypatch):
    """The tracking store under test, made the active one: a new SQLite store, or a real ``mlflow server`` (one per
    module: ``mlflow_server``); each test with its own judge-call cache and local output folder (it pays for its own
    judge calls, and counts them)."""
    import mlflow

    monkeypatch.setenv("RAGJUDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RAGJUDGE_OUTPUT_DIR", str(tmp_path / "outputs"))
    uri = (_fresh_tracking_uri(tmp_path / "store" / "mlflow.db") if request.param == "sqlite"
           else request.getfixturevalue("mlflow_server"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.tracking.fluent._active_experiment_id = None


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` on 127.0.0.1 for every test of a session (of an xdist worker) that asks for one, its
    SQLite store initialised beforehand (the server need not migrate a new one) in a temp dir; yields its URL. One
    per session, not per module: starting one costs seconds of CPU, and the tests keep to experiments of their own
    (unique names), so they do not see each other's runs."""
    from mlflow_ui import start_server

    workdir = tmp_path_factory.mktemp("mlflow-server")
    _fresh_tracking_uri(workdir / "mlflow.db")
    proc, url = start_server(workdir)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def tmp_tracking(tmp_path, monkeypatch):
    """A fresh SQLite MLflow tracking store for one test (``tmp_path / "mlflow.db"``), made the active one."""
    import mlflow

    uri = _fresh_tracking_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id="0")  # forget an experiment made active by an earlier test
    yield uri
    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI"))


# ----------------------------------------------------------------------------- judges on the fake server


@pytest.fixture
def judge_api_key() -> str:
    """The OpenAI API key ``judge_uri`` sets (a module overrides this fixture to choose its own)."""
    return "sk-test-judge-0001"


@pytest.fixture
def judge_handler():
    """The fake server's handler that ``judge_uri`` installs; None keeps the server's (a module overrides this)."""
    return None


@pytest.fixture
def judge_uri(fake_llm, monkeypatch, judge_api_key, judge_handler) -> str:
    """An OpenAI judge URI on the fake server, with ``OPENAI_API_KEY`` set to ``judge_api_key``."""
    monkeypatch.setenv("OPENAI_API_KEY", judge_api_key)
    if judge_handler is not None:
        fake_llm.set_handler(judge_handler)
    return f"openai:/judge-model?base_url={fake_llm.openai_base_url}"


@pytest.fixture
def judge(request):
    """A judge URI on the fake server, answered by the independent, schema-compliant model.

    In a test marked ``inprocess_judge``: the same model answering in-process (a ``Backend`` object, see
    ``compliant_judge``), for a test that checks what the package does with the replies, not the wire."""
    if request.node.get_closest_marker("inprocess_judge") is not None:
        return request.getfixturevalue("compliant_judge")
    fake_llm = request.getfixturevalue("fake_llm")
    fake_llm.set_handler(CompliantModel("json_schema"))
    return f"openai:/m?base_url={fake_llm.openai_base_url}"


@pytest.fixture
def compliant_judge():
    """A judge answered in-process by the same independent model as ``judge`` (tests/inprocess.py): a ``Backend``
    object, no server, no SDK. For tests of what the package does with a judge's replies; ``judge`` for the wire."""
    from inprocess import CompliantBackend

    return CompliantBackend()
