"""Nothing paid for is lost (issue 10): a damaged, read-only, missing or busy cache; a tracking store that refuses
or cannot be reached; a failure after the judge calls; a process killed mid-run and resumed."""

from __future__ import annotations

import gc
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from compliant_model import CompliantModel

from mlflow_ragjudge import evaluate_frame
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.core.errors import CacheWarning, LoggingFailed
from mlflow_ragjudge.llm.cache import CallCache

ROWS = pd.DataFrame({
    "question": [f"What is item {i}?" for i in range(4)],
    "answer": [f"Item {i} is a blue box. It weighs {i} kg." for i in range(4)],
    "reference": [f"Item {i} is a blue box weighing {i} kg." for i in range(4)],
    "contexts": [[f"Item {i} is a box.", f"It is blue and weighs {i} kg."] for i in range(4)],
})


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("RAGJUDGE_CACHE_DIR", str(d))
    return d


def _run(judge):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = evaluate_frame(ROWS, judge=judge, metrics=["correctness", "faithfulness"], progress=False)
    return out, [w for w in caught if issubclass(w.category, CacheWarning)]


def _all_scored(out):
    for name in ("correctness", "faithfulness"):
        assert out.metrics[f"{name}/error_rate"] == 0 and out.metrics[f"{name}/count"] == 4


# ----------------------------------------------------------------------------- the cache


def test_a_cache_file_that_is_not_a_database_is_moved_aside(judge, cache_dir, fake_llm):
    cache_dir.mkdir()
    (cache_dir / "calls.sqlite").write_bytes(b"this is not a sqlite file " * 50)
    out, caught = _run(judge)
    _all_scored(out)
    assert caught and "moved to" in str(caught[0].message)
    aside = [p for p in cache_dir.iterdir() if ".corrupt-" in p.name]
    assert aside and aside[0].read_bytes().startswith(b"this is not")
    assert out.config["cache"]["mode"] == "read_write" and "moved to" in out.config["cache"]["events"][0]
    n = fake_llm.request_count
    again, _ = _run(judge)  # the fresh cache works: nothing is asked twice
    assert fake_llm.request_count == n and again.metrics["correctness/mean"] == out.metrics["correctness/mean"]


def _checkpointed(cache_dir: Path) -> Path:
    """The cache file with everything in it (the WAL folded back), so the file alone holds the replies."""
    db = cache_dir / "calls.sqlite"
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return db


def test_a_truncated_cache_is_moved_aside(judge, cache_dir, fake_llm):
    _run(judge)
    db = _checkpointed(cache_dir)
    data = db.read_bytes()
    for side in cache_dir.glob("calls.sqlite-*"):
        side.unlink()
    db.write_bytes(data[: len(data) // 2])
    from mlflow_ragjudge.llm import cache as cache_module

    cache_module._CHECKED.clear()  # a new process would check the file again
    fake_llm.reset()
    fake_llm.set_handler(CompliantModel("json_schema"))
    again, caught = _run(judge)
    _all_scored(again)
    assert caught and "damaged" in str(caught[0].message)
    assert any(".corrupt-" in p.name for p in cache_dir.iterdir())


def _make_read_only(path: Path) -> None:
    if os.geteuid() != 0:
        path.chmod(0o444 if path.is_file() else 0o555)
        return
    proc = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot make {path} read-only as root here (chattr: {proc.stderr.strip()})")


def _make_writable(path: Path) -> None:
    if os.geteuid() != 0:
        path.chmod(0o644 if path.is_file() else 0o755)
    else:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def test_a_read_only_cache_is_used_read_only(judge, cache_dir, fake_llm):
    _run(judge)
    # the first run's connections closed before the file is made read-only: SQLite keeps the descriptor of a
    # connection closed while another one to the same file is open, and hands it (writable) to the next connection
    gc.collect()
    db = _checkpointed(cache_dir)
    n_first = fake_llm.request_count
    _make_read_only(db)
    try:
        rows = pd.concat([ROWS, ROWS.assign(question=ROWS["question"] + " (new)")], ignore_index=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = evaluate_frame(rows, judge=judge, metrics=["correctness"], progress=False)
        assert out.metrics["correctness/error_rate"] == 0 and out.metrics["correctness/count"] == 8
        # the 4 known rows came from the cache; the 4 new ones were asked and kept, but not stored
        assert fake_llm.request_count - n_first == 4
        assert out.metrics["judge/cache_hits"] == 4
        assert any("read-only" in str(w.message) for w in caught if issubclass(w.category, CacheWarning))
        assert out.config["cache"]["mode"] == "read_only" and out.config["cache"]["skipped_writes"] >= 1
    finally:
        _make_writable(db)


def test_a_cache_in_a_read_only_directory_is_used_read_only(judge, cache_dir, tmp_path, monkeypatch, fake_llm):
    _run(judge)
    # a copy of the filled cache, alone in its directory with no -wal / -shm files: opening it in WAL mode would
    # have to create them
    ro_dir = tmp_path / "ro-cache"
    ro_dir.mkdir()
    src, dst = sqlite3.connect(cache_dir / "calls.sqlite"), sqlite3.connect(ro_dir / "calls.sqlite")
    src.backup(dst)
    dst.execute("PRAGMA journal_mode=DELETE")
    src.close()
    dst.close()
    assert sorted(p.name for p in ro_dir.iterdir()) == ["calls.sqlite"]
    monkeypatch.setenv("RAGJUDGE_CACHE_DIR", str(ro_dir))
    n_first = fake_llm.request_count
    _make_read_only(ro_dir)
    try:
        out, caught = _run(judge)
        _all_scored(out)
        assert fake_llm.request_count == n_first  # every reply came from the read-only cache
        assert any("read-only" in str(w.message) for w in caught)
        assert out.config["cache"]["mode"] == "read_only"
    finally:
        _make_writable(ro_dir)


@pytest.mark.inprocess_judge
def test_a_cache_that_cannot_be_created_is_left_out(judge, tmp_path, monkeypatch, fake_llm):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("RAGJUDGE_CACHE_DIR", str(blocker / "cache"))
    out, caught = _run(judge)
    _all_scored(out)
    assert caught and "cannot be created" in str(caught[0].message)
    assert out.config["cache"] == {"mode": "off"}


def test_a_write_that_cannot_get_the_lock_is_skipped_and_the_row_keeps_its_result(judge, cache_dir, fake_llm):
    CallCache(cache_dir)  # create it
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sqlite3, sys, time\n"
            f"c = sqlite3.connect({str(cache_dir / 'calls.sqlite')!r}, isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "c.execute(\"INSERT OR REPLACE INTO calls VALUES ('held', '{}', 0)\")\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = evaluate_frame(ROWS.iloc[:2], judge=judge, metrics=["correctness"], progress=False)
        assert out.metrics["correctness/error_rate"] == 0 and out.metrics["correctness/count"] == 2
        assert out.config["cache"]["skipped_writes"] == 2
        assert any("was skipped" in str(w.message) for w in caught if issubclass(w.category, CacheWarning))
    finally:
        holder.kill()
        holder.wait()


# ----------------------------------------------------------------------------- logging


def test_a_store_that_refuses_the_artifacts_leaves_the_results_on_disk(judge, tmp_path, tmp_tracking, monkeypatch,
                                                                      capsys):
    monkeypatch.setenv("RAGJUDGE_OUTPUT_DIR", str(tmp_path / "outputs"))
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    exp = mlflow.create_experiment("broken-artifacts", artifact_location=(blocker / "artifacts").as_uri())
    path = tmp_path / "rows.jsonl"
    ROWS.to_json(path, orient="records", lines=True)
    rc = main(["evaluate", str(path), "--judge", judge, "--metrics", "correctness", "--experiment",
               "broken-artifacts"])
    err = capsys.readouterr().err
    assert rc == 5 and "the results are not lost: they are saved at" in err
    saved = Path(err.split("saved at ")[1].split(".\n")[0].rstrip("."))
    assert saved.is_dir() and saved.parent == tmp_path / "outputs"
    table = json.loads((saved / "eval_results_table.json").read_text())
    assert len(table["data"]) == 4 and "correctness/score" in table["columns"]
    assert len((saved / "judge_transcripts.jsonl").read_text().splitlines()) == 4
    assert json.loads((saved / "metrics.json").read_text())["correctness/count"] == 4
    run = mlflow.search_runs([exp]).iloc[0]
    assert run["status"] == "FAILED" and "table" in run["tags.ragjudge.logging_error"]
    assert run["metrics.correctness/count"] == 4  # what the store took is there


def test_a_missing_experiment_in_the_environment_is_refused_before_any_call(judge, tmp_path, tmp_tracking,
                                                                            monkeypatch, capsys, fake_llm):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "987654")
    path = tmp_path / "rows.jsonl"
    ROWS.to_json(path, orient="records", lines=True)
    assert main(["evaluate", str(path), "--judge", judge, "--metrics", "correctness"]) == 2
    assert "987654" in capsys.readouterr().err and fake_llm.request_count == 0


def test_an_unreachable_tracking_store_is_refused_before_any_call(judge, tmp_path, monkeypatch, capsys, fake_llm):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    path = tmp_path / "rows.jsonl"
    ROWS.to_json(path, orient="records", lines=True)
    rc = main(["evaluate", str(path), "--judge", judge, "--metrics", "correctness", "--experiment", "x",
               "--tracking-uri", "http://127.0.0.1:9"])
    assert rc == 2 and "tracking" in capsys.readouterr().err.lower()
    assert fake_llm.request_count == 0


def test_a_failure_after_the_judge_calls_saves_the_results_so_far(judge, tmp_path, monkeypatch, fake_llm):
    monkeypatch.setenv("RAGJUDGE_OUTPUT_DIR", str(tmp_path / "outputs"))
    from mlflow_ragjudge.engine import aggregate as evaluation

    def broken_table(*args, **kwargs):  # stands for a bug in a step after the judge calls
        raise RuntimeError("table builder broke")

    monkeypatch.setattr(evaluation, "build_table", broken_table)
    with pytest.raises(LoggingFailed, match="table builder broke") as e:
        evaluate_frame(ROWS, judge=judge, metrics=["correctness"], cache=False)
    saved = e.value.saved_to
    lines = [json.loads(x) for x in (saved / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(r["metric"] == "correctness" and r["calls"] for r in lines)
    assert fake_llm.request_count == 4


# ----------------------------------------------------------------------------- kill -9 and resume


@pytest.mark.slow
def test_killed_mid_run_and_resumed_only_unfinished_calls_are_sent(fake_llm, tmp_path, fresh_tracking_uri):
    fake_llm.set_handler(CompliantModel("json_schema"))
    fake_llm.latency = 0.15
    rows = pd.DataFrame({
        "question": [f"Question number {i}?" for i in range(12)],
        "answer": [f"Answer {i} is short. It has a second claim {i}." for i in range(12)],
        "reference": [f"Reference {i}." for i in range(12)],
        "contexts": [[f"Context {i}."] for i in range(12)],
    })
    data = tmp_path / "rows.jsonl"
    rows.to_json(data, orient="records", lines=True)
    base_env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")}
    env = dict(base_env, RAGJUDGE_CACHE_DIR=str(tmp_path / "cache"), RAGJUDGE_OUTPUT_DIR=str(tmp_path / "out"),
               MLFLOW_TRACKING_URI=fresh_tracking_uri(tmp_path / "mlflow.db"))
    cmd = [sys.executable, "-m", "mlflow_ragjudge", "evaluate", str(data), "--judge",
           f"openai:/m?base_url={fake_llm.openai_base_url}", "--metrics", "correctness,faithfulness",
           "--max-concurrency", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while fake_llm.request_count < 14 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    cached = len(CallCache(tmp_path / "cache"))
    assert cached >= 10

    fake_llm.reset()
    fake_llm.set_handler(CompliantModel("json_schema"))
    fake_llm.latency = 0.0
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = fake_llm.request_count

    fake_llm.reset()
    fake_llm.set_handler(CompliantModel("json_schema"))
    third = subprocess.run([*cmd, "--no-cache"], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    total = fake_llm.request_count  # what the whole run costs from nothing
    # the resumed run sent exactly what the killed one had not finished: nothing twice, nothing lost
    assert resumed == total - cached and resumed < total

    fake_llm.reset()
    fake_llm.set_handler(CompliantModel("json_schema"))
    fourth = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert fake_llm.request_count == 0  # an identical re-run sends nothing
