"""The tests' own tracking stores: ``tmp_tracking`` is a copy of one initialised store, and still one per test."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient


@pytest.mark.parametrize("name", ["first", "second", "third"])
def test_each_test_starts_from_an_empty_store_of_its_own(tmp_tracking, tmp_path, name):
    # whichever of these runs first (or on whichever worker), it sees none of the others' experiments or runs
    assert tmp_tracking == f"sqlite:///{tmp_path / 'mlflow.db'}" == mlflow.get_tracking_uri()
    client = MlflowClient()
    assert [e.name for e in client.search_experiments()] == ["Default"]
    assert client.search_runs(["0"]) == []
    exp = mlflow.create_experiment(f"exp-{name}")
    assert exp == "1"  # ids start afresh in every store
    with mlflow.start_run(experiment_id=exp):
        mlflow.log_metric("m", 1.0)
    assert len(client.search_runs([exp])) == 1


def test_a_fresh_store_is_usable_and_never_overwrites(fresh_tracking_uri, tmp_path):
    db = tmp_path / "a" / "mlflow.db"
    client = MlflowClient(fresh_tracking_uri(db))
    run = client.create_run("0")
    client.log_metric(run.info.run_id, "m", 2.0)
    assert client.get_run(run.info.run_id).data.metrics == {"m": 2.0}
    with pytest.raises(FileExistsError):
        fresh_tracking_uri(db)
    assert client.get_run(run.info.run_id).data.metrics == {"m": 2.0}
