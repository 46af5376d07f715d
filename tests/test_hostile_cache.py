"""The judge-call cache and the base URL under hostile conditions (issue 40, cases 5, 6 and the first two of 16).

* 5: two processes opening a new cache file at the same moment both keep the cache (a lock met while the file is
  created is waited out, for a bounded, documented time) and an identical re-run pays for nothing.
* 6: ``cache=`` naming a file that was never a cache (the user's CSV, JSON, binary, an unrelated SQLite database)
  is refused before any judge call and left byte-identical; a damaged cache of ours is still moved aside.
* 16: base URLs that differ only in a query that selects the model keep their own cache entries; a key in a base
  URL's path is warned about once and reaches no record, param, log or cache.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest

from mlflow_ragjudge import evaluate_frame
from mlflow_ragjudge.core.errors import CacheWarning, InputError, RagJudgeWarning
from mlflow_ragjudge.llm.backends import ChatRequest, resolve_backend, safe_judge_uri, safe_url
from mlflow_ragjudge.llm.cache import CallCache
from mlflow_ragjudge.llm.client import JudgeClient

ROWS = pd.DataFrame({
    "question": [f"What is item {i}?" for i in range(3)],
    "answer": [f"Item {i} is a blue box. It weighs {i} kg." for i in range(3)],
    "reference": [f"Item {i} is a blue box weighing {i} kg." for i in range(3)],
    "contexts": [[f"Item {i} is a box.", f"It is blue and weighs {i} kg."] for i in range(3)],
})


def _quiet_run(judge, **kw):
    """evaluate_frame, with the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = evaluate_frame(ROWS, judge=judge, metrics=["correctness"], progress=False, **kw)
    return out, caught


# ----------------------------------------------------------------------------- 5: two processes, one new file


def _open_and_judge(judge: str, paths: list[str], judged: int, barrier, results) -> None:
    """A child process: for each new cache file, wait for the other process, open the cache through the client at
    the same moment and say what the cache was; on the first ``judged`` files, judge the rows with it too."""
    backend = resolve_backend(judge)
    JudgeClient(backend, cache=False)  # the SDK imported, its client built: only the open is left to race
    for i, path in enumerate(paths):
        barrier.wait(timeout=60)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                client = JudgeClient(backend, cache=path)
                mode = client.cache.mode if client.cache is not None else "off"
                scored = None
                if i < judged:
                    out = evaluate_frame(ROWS, judge=judge, client=client, metrics=["correctness"], progress=False)
                    mode, scored = out.config["cache"]["mode"], out.metrics["correctness/count"]
        except Exception as e:  # noqa: BLE001 - the parent reports it
            results.put({"path": path, "error": f"{type(e).__name__}: {e}"})
            continue
        results.put({"path": path, "mode": mode, "scored": scored,
                     "warnings": [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]})


@pytest.mark.slow
def test_case_05_two_processes_opening_a_new_cache_both_keep_it(judge, fake_llm, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-case-05")
    # the two meet on a new file only when their opens overlap within microseconds: many files, each opened by both
    # at once (a barrier), and a few of them used for a whole run
    rounds, judged = 40, 3
    paths = [str(tmp_path / f"round{i}" / "calls.sqlite") for i in range(rounds)]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_open_and_judge, args=(judge, paths, judged, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=240) for _ in range(2 * rounds)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for r in got:
        assert "error" not in r, r
        # neither process ran without the cache, nor used it read-only, nor was told anything about a lock
        assert r["mode"] == "read_write", r
        assert r["warnings"] == [], r
    assert sorted(r["scored"] for r in got if r["scored"] is not None) == [len(ROWS)] * (2 * judged)
    # an identical re-run on each judged file pays for nothing: every reply is in the cache
    before = fake_llm.request_count
    for path in paths[:judged]:
        again, caught = _quiet_run(judge, cache=path)
        assert again.metrics["correctness/count"] == len(ROWS)
        assert again.metrics["judge/cache_hits"] >= len(ROWS)
        assert not [w for w in caught if issubclass(w.category, CacheWarning)]
    assert fake_llm.request_count == before


def test_case_05_a_lock_met_at_open_is_waited_out(tmp_path):
    # another connection is creating the same new cache file and holds its lock for a while: longer than a write
    # waits for a lock (lock_timeout), which is where opening used to give up and run the whole job without a cache
    path = tmp_path / "calls.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    lock_timeout = 0.2
    opened = threading.Event()
    box: dict = {}

    def opener() -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            box["cache"] = CallCache.open(path, lock_timeout=lock_timeout)
        box["warnings"] = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
        opened.set()

    thread = threading.Thread(target=opener)
    thread.start()
    gave_up = opened.wait(4 * lock_timeout)  # the lock is held four times as long as a write would wait
    holder.execute("ROLLBACK")
    holder.close()
    thread.join()
    assert not gave_up, box
    assert box["cache"] is not None and box["cache"].mode == "read_write" and box["warnings"] == []
    box["cache"].put("k", {"v": 1})
    assert CallCache(path).get("k") == {"v": 1}


_HOLD = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_case_05_a_lock_never_released_is_waited_out_for_the_open_timeout_only(tmp_path):
    # another process holds the lock on a cache file it is creating, and never lets go
    path = tmp_path / "calls.sqlite"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        open_timeout = 0.5
        t0 = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cache = CallCache.open(path, open_timeout=open_timeout)
        waited = time.monotonic() - t0
    finally:
        holder.communicate("", timeout=30)
    # waited out first, then the run goes on without the cache, saying why and for how long it waited
    assert waited >= open_timeout
    assert cache is None
    message = " ".join(str(w.message) for w in caught if issubclass(w.category, CacheWarning))
    assert "locked" in message and str(path) in message and f"{open_timeout:g} s" in message
    # once the lock is gone the same file opens as a cache
    assert CallCache.open(path) is not None


# ----------------------------------------------------------------------------- 6: files that were never a cache


def _foreign_sqlite(path: Path, *, wal: bool = False, calls_table: bool = False) -> None:
    con = sqlite3.connect(path)
    if wal:
        con.execute("PRAGMA journal_mode=WAL")
    if calls_table:  # the user's own table named like ours: their phone calls
        con.execute("CREATE TABLE calls (id INTEGER PRIMARY KEY, caller TEXT, minutes REAL)")
        con.executemany("INSERT INTO calls (caller, minutes) VALUES (?, ?)", [("ann", 3.5), ("bob", 12.0)])
    else:
        con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT, qty INTEGER)")
        con.executemany("INSERT INTO orders (item, qty) VALUES (?, ?)", [("box", 2), ("lamp", 1)])
    con.commit()
    if wal:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()


def _user_file(kind: str, path: Path) -> None:
    if kind == "csv":
        path.write_text("question,answer\nWhat is item 1?,A blue box.\n", encoding="utf-8")
    elif kind == "json":
        path.write_text(json.dumps({"rows": [{"question": "q", "answer": "a"}]}), encoding="utf-8")
    elif kind == "binary":
        path.write_bytes(random.Random(6).randbytes(5000))
    elif kind == "sqlite":
        _foreign_sqlite(path)
    elif kind == "sqlite_wal":
        _foreign_sqlite(path, wal=True)
    elif kind == "sqlite_calls":
        _foreign_sqlite(path, calls_table=True)
    else:  # pragma: no cover
        raise AssertionError(kind)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.endswith("-shm")}


@pytest.mark.parametrize("kind", ["csv", "json", "binary", "sqlite", "sqlite_wal", "sqlite_calls", "sqlite_in_use"])
def test_case_06_a_file_that_was_never_a_cache_is_refused_and_left_alone(kind, judge, fake_llm, tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    path = folder / ("data.csv" if kind == "csv" else "data.json" if kind == "json" else "data.db")
    user = None
    if kind == "sqlite_in_use":
        # the user's application has its database open in WAL mode: its tables are still only in the -wal file
        user = sqlite3.connect(path, isolation_level=None)
        user.execute("PRAGMA journal_mode=WAL")
        user.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
        user.execute("INSERT INTO orders (item) VALUES ('box')")
    else:
        _user_file(kind, path)
    before = _files(folder)  # (the -shm index is SQLite's shared memory, rewritten by any reader)
    try:
        with pytest.raises(InputError) as info:
            evaluate_frame(ROWS, judge=judge, metrics=["correctness"], progress=False, cache=str(path))
        message = str(info.value)
        # the error names the file and the fix
        assert str(path) in message and "not a judge-call cache" in message and "cache=" in message
        # before any judge call, and the file is as it was: same bytes, nothing moved, nothing beside it
        assert fake_llm.request_count == 0
        assert _files(folder) == before
        # the client refuses it the same way (the Python API, a Spark worker, a scorer all build one)
        with pytest.raises(InputError):
            JudgeClient(judge, cache=path)
        assert _files(folder) == before
        if user is not None:
            assert user.execute("SELECT name FROM sqlite_master").fetchall() == [("orders",)]
    finally:
        if user is not None:
            user.close()


def test_case_06_an_empty_file_is_taken_as_a_new_cache(judge, fake_llm, tmp_path):
    # an empty file holds nothing to lose, and it is what a cache another process is creating looks like for an
    # instant (case 5): it becomes the cache, without a word
    path = tmp_path / "calls.sqlite"
    path.write_bytes(b"")
    out, caught = _quiet_run(judge, cache=str(path))
    assert out.config["cache"]["mode"] == "read_write" and not out.config["cache"]["events"]
    assert not [w for w in caught if issubclass(w.category, CacheWarning)]
    n = fake_llm.request_count
    _quiet_run(judge, cache=str(path))
    assert fake_llm.request_count == n


def test_case_06_a_damaged_cache_of_ours_at_a_named_path_is_still_moved_aside(judge, fake_llm, tmp_path):
    path = tmp_path / "mine.sqlite"
    _quiet_run(judge, cache=str(path))
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = path.read_bytes()
    for side in tmp_path.glob("mine.sqlite-*"):
        side.unlink()
    path.write_bytes(data[: len(data) // 2])  # cut in half: our schema is still there, the rest is gone
    from mlflow_ragjudge.llm import cache as cache_module

    cache_module._CHECKED.clear()  # a new process would check the file again
    out, caught = _quiet_run(judge, cache=str(path))
    assert out.metrics["correctness/count"] == len(ROWS)
    assert any("damaged" in str(w.message) for w in caught if issubclass(w.category, CacheWarning))
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name]


# ----------------------------------------------------------------------------- 16: the base URL


def _which_model(request):
    """A gateway that serves the model its query names (Azure style ``?deployment=``), one answer per model."""
    return f"answer of {request.query.get('deployment', ['?'])[0]} at {request.query.get('api-version', ['-'])[0]}"


def _ask(uri: str, cache: Path) -> str:
    result = JudgeClient(uri, cache=CallCache(cache)).call(ChatRequest.of([{"role": "user", "content": "hi"}]))
    assert result.ok, result.error
    return result.response.text


def test_case_16_a_query_that_selects_the_model_has_its_own_cache_entries(fake_llm, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-case-16")
    fake_llm.set_handler(_which_model)
    cache = tmp_path / "calls.sqlite"
    base = fake_llm.openai_base_url
    assert _ask(f"openai:/m?base_url={base}?deployment=modelA", cache) == "answer of modelA at -"
    assert _ask(f"openai:/m?base_url={base}?deployment=modelB", cache) == "answer of modelB at -"
    assert _ask(f"openai:/m?base_url={base}?deployment=modelA&api-version=2024-10-21",
                cache) == "answer of modelA at 2024-10-21"
    assert fake_llm.request_count == 3
    # each asked again: every answer from the cache, each still its own model's
    assert _ask(f"openai:/m?base_url={base}?deployment=modelB", cache) == "answer of modelB at -"
    assert _ask(f"openai:/m?base_url={base}?deployment=modelA", cache) == "answer of modelA at -"
    assert fake_llm.request_count == 3


def test_case_16_a_query_key_is_not_in_the_cache_and_a_new_key_keeps_the_entries(fake_llm, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-case-16")
    fake_llm.set_handler(_which_model)
    cache = tmp_path / "calls.sqlite"
    base = fake_llm.openai_base_url
    first, second = "Qk3yOne-7d1f0a9c2b", "Qk3yTwo-5e8b7c6d4a"
    assert _ask(f"openai:/m?base_url={base}?deployment=modelA&api-key={first}", cache) == "answer of modelA at -"
    # the key rotated: same model, the reply is the one already paid for (the key is not part of the identity)
    assert _ask(f"openai:/m?base_url={base}?deployment=modelA&api-key={second}", cache) == "answer of modelA at -"
    assert fake_llm.request_count == 1
    # but a key never merges two models
    assert _ask(f"openai:/m?base_url={base}?deployment=modelB&api-key={first}", cache) == "answer of modelB at -"
    assert fake_llm.request_count == 2
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("calls.sqlite*"))
    assert first.encode() not in stored and second.encode() not in stored


def test_case_16_runs_against_two_deployments_do_not_share_scores(judge, fake_llm, tmp_path):
    cache = str(tmp_path / "calls.sqlite")
    base = judge.partition("?base_url=")[2]
    first, _ = _quiet_run(f"openai:/m?base_url={base}?deployment=modelA", cache=cache)
    paid = fake_llm.request_count
    assert paid > 0 and first.metrics["correctness/count"] == len(ROWS)
    second, _ = _quiet_run(f"openai:/m?base_url={base}?deployment=modelB", cache=cache)
    # the other deployment was asked for every call: none of modelA's replies stood in for modelB's
    assert fake_llm.request_count == 2 * paid
    assert second.metrics["judge/cache_hits"] == 0


PATH_KEY = "sk-proj-Zq8c3VwT9xLm4Rb7Kd2Hs6Nf"


@pytest.mark.parametrize("shape", ["/key/{key}/v1", "/v1/{key}"])
def test_case_16_a_key_in_a_base_url_path_warns_once_and_is_recorded_nowhere(shape, judge, fake_llm, tmp_path,
                                                                             capsys):
    base = judge.partition("?base_url=")[2].removesuffix("/v1") + shape.format(key=PATH_KEY)
    uri = f"openai:/m?base_url={base}"
    cache = tmp_path / "calls.sqlite"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = evaluate_frame(ROWS, judge=uri, metrics=["correctness"], progress=False, cache=str(cache))
        again = evaluate_frame(ROWS, judge=uri, metrics=["correctness"], progress=False, cache=str(cache))
    assert out.metrics["correctness/count"] == len(ROWS) and again.metrics["judge/cache_hits"] >= len(ROWS)
    # the requests went where the user said, key and all
    assert fake_llm.requests and all(PATH_KEY in r.path for r in fake_llm.requests)
    # one warning for the process, naming the fix, without the key
    said = [str(w.message) for w in caught if issubclass(w.category, RagJudgeWarning)
            and "base URL" in str(w.message) and "key" in str(w.message)]
    assert len(said) == 1, said
    assert "api_key" in said[0] and "OPENAI_API_KEY" in said[0] and PATH_KEY not in said[0]
    # nowhere: results, transcripts, params, config, the table, the cache file, the console
    for result in (out, again):
        blob = json.dumps([result.metrics, result.params, result.config, result.transcripts,
                           result.table.to_dict(orient="records")], default=str)
        assert PATH_KEY not in blob
    assert all(t["base_url"] and "***" in t["base_url"] for t in out.transcripts)
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("calls.sqlite*"))
    assert stored and PATH_KEY.encode() not in stored
    printed = capsys.readouterr()
    assert PATH_KEY not in printed.out + printed.err


@pytest.mark.parametrize(("url", "secret"), [
    (f"https://gw.example/v1/{PATH_KEY}/", PATH_KEY),
    (f"https://gw.example/key/{PATH_KEY}/v1", PATH_KEY),
    ("https://gw.example/api-key/hunter2hunter2/v1", "hunter2hunter2"),
    ("https://gw.example/token/c2VjcmV0LXRva2Vu/openai", "c2VjcmV0LXRva2Vu"),
    ("https://gw.example/openai/0f3c9a7e5b2d4c8e9a1b3c5d7e9f1a2b/v1", "0f3c9a7e5b2d4c8e9a1b3c5d7e9f1a2b"),
])
def test_case_16_secret_looking_path_segments_are_masked_everywhere_they_are_shown(url, secret):
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        backend = resolve_backend(f"openai:/m?base_url={url}")
    assert backend.base_url and secret in backend.base_url  # the requests still go there
    assert secret in backend.secrets()  # so every record is scrubbed of it
    for shown in (safe_url(url), safe_judge_uri(f"openai:/m?base_url={url}"), json.dumps(backend.identity()),
                  backend.connection_key()):
        assert shown and secret not in shown and "gw.example" in shown


@pytest.mark.parametrize("url", [
    "https://my-resource.openai.azure.com/openai/deployments/gpt-4o-mini-2024-07-18",
    "http://localhost:8000/v1",
    "https://api.example.com/v1/projects/retrieval-eval/models",
    "https://gw.example/v1/123e4567-e89b-12d3-a456-426614174000/openai",
])
def test_case_16_ordinary_paths_are_shown_as_they_are_without_a_warning(url):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = resolve_backend(f"openai:/m?base_url={url}")
    assert not [w for w in caught if issubclass(w.category, RagJudgeWarning)]
    assert safe_url(url) == url
    assert not any(part and part in backend.secrets() for part in url.split("/")[3:])


def test_case_16_two_path_keys_do_not_share_entries_and_neither_is_in_the_key(tmp_path):
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        one = resolve_backend(f"openai:/m?base_url=https://gw.example/key/{PATH_KEY}/v1")
        two = resolve_backend("openai:/m?base_url=https://gw.example/key/sk-proj-OtherKey1234567890abcd/v1")
    assert one.cache_identity() != two.cache_identity()
    assert PATH_KEY not in json.dumps(one.cache_identity())


def test_case_06_spark_refuses_the_file_on_the_driver_before_any_job(judge, fake_llm, tmp_path):
    pytest.importorskip("pyspark")
    from mlflow_ragjudge.adapters.spark import evaluate_spark

    path = tmp_path / "data.csv"
    _user_file("csv", path)
    before = path.read_bytes()

    class NoFrame:  # anything Spark would be asked for fails the test: the refusal comes first
        def __getattr__(self, name):
            raise AssertionError(f"the data frame was used ({name}) before the cache was checked")

    with pytest.raises(InputError, match="not a judge-call cache"):
        evaluate_spark(NoFrame(), {"judge": judge, "metrics": ["correctness"], "cache": str(path)}, log=False)
    assert fake_llm.request_count == 0 and path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
