"""Test-wide settings: everything offline, every store under a temp dir, no backoff."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_TMP = Path(tempfile.mkdtemp(prefix="ragjudge-tests-"))
os.environ.update(
    {
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "MLFLOW_MODEL_CATALOG_URI": "",
        "MLFLOW_TRACKING_URI": f"sqlite:///{_TMP / 'mlflow.db'}",
        "RAGJUDGE_CACHE_DIR": str(_TMP / "cache"),
        "RAGJUDGE_BACKOFF_SCALE": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
)
for _var in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "RAGJUDGE_MAX_CONCURRENCY"):
    os.environ.pop(_var, None)
# A SQLite tracking store puts artifacts under ./mlruns of the working directory: run the tests from a
# temp directory so nothing lands in the checkout.
_WORKDIR = _TMP / "cwd"
_WORKDIR.mkdir()
os.chdir(_WORKDIR)

from fakellm import fake_llm  # noqa: E402,F401  (the fixture)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"reference data not found at {SHARED_DATA} (it lives beside the project, not in it)")
    return SHARED_DATA


@pytest.fixture
def tmp_tracking(tmp_path, monkeypatch):
    """A fresh SQLite MLflow tracking store for one test."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id="0")  # forget an experiment made active by an earlier test
    yield uri
    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI"))
