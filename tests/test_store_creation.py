"""Several processes that start at once on a new SQLite tracking store: MLflow creates and migrates the store on
first use, and two doing it together left it half-migrated ("table registered_models already exists", "duplicate
column name: step"); the lock beside the database file (adapters/tracking.py:store_creation_lock) serialises the
first use (docs/failure-modes.md, "The tracking store")."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from mlflow_ragjudge.adapters.tracking import check_tracking_store

ROOT = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import mlflow
    from mlflow_ragjudge.adapters import tracking
    uri, folder, me = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    (folder / f"ready-{me}").write_text("")
    while not (folder / "go").exists():   # every process starts its first use of the store at once
        time.sleep(0.002)
    tracking.check_tracking_store(uri, "together", nothing="Nothing was done.")
    with mlflow.start_run(run_name=f"worker-{me}"):
        mlflow.log_param("worker", me)
    print("logged", me)
""")


def test_processes_starting_at_once_on_a_new_sqlite_store_all_succeed_and_the_store_works(tmp_path):
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MLFLOW_TRACKING_URI": uri}
    env.pop("MLFLOW_EXPERIMENT_ID", None)
    n = 3
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, uri, str(tmp_path), str(i)], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < n and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    (tmp_path / "go").write_text("")
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    for i, (rc, out, err) in enumerate(results):
        assert rc == 0 and f"logged {i}" in out, f"worker {i} exit {rc}:\n{err[-2000:]}"
    # the store works afterwards: every run is there, and a new process-level use logs another
    check_tracking_store(uri, "together", nothing="")
    exp = mlflow.get_experiment_by_name("together")
    runs = MlflowClient().search_runs([exp.experiment_id])
    assert sorted(r.data.params["worker"] for r in runs) == [str(i) for i in range(n)]
    with mlflow.start_run(run_name="after"):
        mlflow.log_param("worker", "after")
    assert len(MlflowClient().search_runs([exp.experiment_id])) == n + 1


def test_a_store_left_half_created_is_explained(tmp_path):
    """A store half-created before the lock existed (here: a table of MLflow's schema made by hand, so MLflow's
    creation meets it) is refused with what to do, not only SQLite's words."""
    import sqlite3

    import pytest

    from mlflow_ragjudge import InputError

    db = tmp_path / "half.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY)")  # a creation cut short
    with pytest.raises(InputError) as info:
        check_tracking_store(f"sqlite:///{db}", "half", nothing="Nothing was done.")
    message = str(info.value)
    assert "half-created" in message and "move the file aside" in message and "Nothing was done." in message
