"""Several processes that start at once on a new SQLite tracking store: MLflow creates and migrates the store on
first use, and two doing it together left it half-migrated ("table registered_models already exists", "duplicate
column name: step"); the lock beside the database file (adapters/tracking.py:store_creation_lock) serialises the
first use (docs/failure-modes.md, "The tracking store")."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlflow
import pytest
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


@pytest.mark.slow
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
    from mlflow_ragjudge import InputError

    db = tmp_path / "half.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY)")  # a creation cut short
    with pytest.raises(InputError) as info:
        check_tracking_store(f"sqlite:///{db}", "half", nothing="Nothing was done.")
    message = str(info.value)
    assert "half-created" in message and "move the file aside" in message and "Nothing was done." in message


# MLflow 3.18.0 migrates a store made by 3.17.2 on first open, one way: its alembic_version goes from 3.17.2's head
# dc11669786a5 through e7d1f4b2a9c6 and 8b6ad64cb8f5 to f4a9b2c7d1e6, 3.18.0's head (checked by hand: a store made
# with MlflowClient("sqlite:///s.db").search_experiments() under 3.17.2, opened the same way under 3.18.0, read
# `SELECT version_num FROM alembic_version`). MLflow 3.17.2 then refuses it ("out-of-date database schema"), and
# `mlflow db upgrade` under 3.17.2 fails ("Can't locate revision identified by 'f4a9b2c7d1e6'"). 3.17.2 checks only
# the revision (every table it needs is there), so a fresh store with that revision written in is such a store.
NEWER_REVISIONS = [
    pytest.param("f4a9b2c7d1e6", "3.18.0", id="mlflow-3.18.0-head"),
    pytest.param("0123456789ab", None, id="a-revision-no-release-names"),
]


@pytest.mark.parametrize(("revision", "release"), NEWER_REVISIONS)
def test_a_store_a_newer_mlflow_migrated_is_refused_with_what_to_do(tmp_path, fresh_tracking_uri, capsys, revision,
                                                                    release):
    from alembic.script import ScriptDirectory

    from mlflow_ragjudge.cli import main

    known = {s.revision for s in ScriptDirectory(str(Path(mlflow.__file__).parent / "store" / "db_migrations"))
             .walk_revisions()}  # the installed MLflow's migrations
    if revision in known:
        pytest.skip(f"the installed MLflow {mlflow.__version__} knows revision {revision}: its store is not newer")
    db = tmp_path / "newer.db"
    uri = fresh_tracking_uri(db)
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        (own,) = con.execute("SELECT version_num FROM alembic_version").fetchone()
        assert own in known  # a store the installed MLflow made is at a revision it knows (3.17.2: dc11669786a5)
        con.execute("UPDATE alembic_version SET version_num = ?", (revision,))
    before = db.read_bytes()
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "q?", "answer": "a", "reference": "a"}) + "\n", encoding="utf-8")

    code = main(["evaluate", str(data), "--judge", "offline:/lexical", "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert code == 2, err
    message = next(line for line in err.splitlines() if line.startswith("error: "))  # MLflow logs to stderr too
    assert message.startswith(f"error: The MLflow tracking store at {uri} cannot be used: a newer MLflow than the "
                              f"installed {mlflow.__version__} migrated it")
    err = message
    assert revision in err and "Use another store" in err and "Nothing was sent to the judge." in err
    assert ("MLflow 3.18.0 or later" in err) if release else ("the newer MLflow that migrated it" in err)
    assert "db upgrade" not in err and "half-created" not in err  # the advice that fails on such a store
    assert db.read_bytes() == before  # the store is left as it was
    # the fix it names works: another store
    other = fresh_tracking_uri(tmp_path / "other.db")
    assert main(["evaluate", str(data), "--judge", "offline:/lexical", "--tracking-uri", other, "--experiment",
                 "another-store"]) == 0, capsys.readouterr().err
