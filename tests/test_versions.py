"""The MLflow versions the package admits: its requirement takes the newest release (3.18) and the oldest it is
tested on (3.14), so installing it beside them keeps them; and the tests run on the MLflow they were started for
(scripts/test_mlflow_versions.sh lays 3.18.0 over, or builds a 3.14.0 venv, and says which in
RAGJUDGE_EXPECT_MLFLOW)."""

from __future__ import annotations

import os
from importlib.metadata import requires

import mlflow
import pytest
from packaging.requirements import Requirement


def _mlflow_requirement() -> Requirement:
    reqs = [Requirement(r) for r in requires("mlflow-ragjudge") or []]
    return next(r for r in reqs if r.name == "mlflow" and r.marker is None)


@pytest.mark.parametrize("version", ["3.14.0", "3.17.2", "3.18.0"])
def test_the_requirement_admits_the_tested_versions(version):
    assert _mlflow_requirement().specifier.contains(version)


def test_the_requirement_stops_below_the_next_major_and_the_untested_past():
    spec = _mlflow_requirement().specifier
    assert not spec.contains("4.0.0") and not spec.contains("3.13.0")


def test_the_installed_mlflow_is_admitted_and_the_one_the_run_expects():
    assert _mlflow_requirement().specifier.contains(mlflow.__version__)
    expected = os.environ.get("RAGJUDGE_EXPECT_MLFLOW")
    if expected:  # a run of scripts/test_mlflow_versions.sh: the overlay or the venv really is that MLflow
        assert mlflow.__version__ == expected
