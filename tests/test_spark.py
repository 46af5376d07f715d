"""Evaluations on Spark (``mlflow_ragjudge.spark.evaluate_spark``) on a real local Spark session (``local[2]``,
the executors' Python is this venv's): the same aggregates as ``evaluate_frame`` on the same rows, the judge's
requests counted at the fake server, bad input refused before any call, one MLflow run logged from the driver.

Skipped when pyspark (the ``spark`` extra) or Java is not installed."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java (17 or newer)", allow_module_level=True)

import mlflow  # noqa: E402
from compliant_model import CompliantModel  # noqa: E402
from fakellm import Reply  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import mlflow_ragjudge as rj  # noqa: E402
from mlflow_ragjudge.adapters import spark as spark_adapter  # noqa: E402
from mlflow_ragjudge.adapters.run_log import log_output  # noqa: E402
from mlflow_ragjudge.adapters.spark import PYSPARK_PANDAS_WARNING  # noqa: E402
from mlflow_ragjudge.adapters.traces import pick_rows  # noqa: E402
from mlflow_ragjudge.core.errors import InputError, SparkPandasWarning  # noqa: E402
from mlflow_ragjudge.spark import evaluate_spark  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from throughput import make_rows  # noqa: E402

pytestmark = pytest.mark.timeout(900)

#: whether PySpark warns about this pandas (PySpark 4.x with pandas >= 3)
PYSPARK_WARNS = spark_adapter._pandas_note() is not None

KEY = "sk-spark-executors-0001"
JUDGED = ["correctness", "faithfulness", "context_precision", "context_recall"]


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # local[2, 2]: two cores, and a failed task is tried once more (as a cluster retries it)
    session = (SparkSession.builder.master("local[2,2]").appName("ragjudge-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.executorEnv.OPENAI_API_KEY", KEY)  # credentials reach the executors this way
               .config("spark.executorEnv.MLFLOW_DISABLE_TELEMETRY", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _rows(n: int, repeat: bool = True) -> pd.DataFrame:
    df = make_rows(n)
    rng = random.Random(7)
    df["group"] = [rng.choice(["sql", "ml", None]) for _ in range(n)]
    if repeat:  # a repeated question: its row ids are numbered in the order of the whole data
        df.loc[5, ["question", "reference"]] = df.loc[3, ["question", "reference"]].tolist()
    return df


def _close(a: dict[str, float], b: dict[str, float], tol: float = 1e-9) -> list[str]:
    assert set(a) == set(b), f"names differ: {sorted(set(a) ^ set(b))[:10]}"
    return [k for k in a if abs(a[k] - b[k]) > tol]


def test_offline_metrics_on_four_partitions_equal_evaluate_frame(spark):
    df = _rows(2000)
    cfg = {"judge": "offline:/lexical", "bertscore": False, "cache": False}
    ref = rj.evaluate_frame(df, cfg)
    sdf = spark.createDataFrame(df).repartition(4)
    assert sdf.rdd.getNumPartitions() == 4
    res = evaluate_spark(sdf, cfg, log=False)
    assert not _close(ref.metrics, res.metrics)
    assert res.metrics["correctness/count"] == 2000 and "correctness/mean/sql" in res.metrics
    assert res.metrics["retrieval/rows_scored"] == ref.metrics["retrieval/rows_scored"]
    # per row too: every result column, keyed by the row ids, which number the repeated question as one process does
    got = res.rows.toPandas().set_index("row_id")
    want = ref.table.set_index("row_id")
    assert set(got.index) == set(want.index) and want.index.is_unique
    assert want.loc[want.index.str.endswith("-2")].shape[0] == 1
    for col in [c for c in want.columns if c.endswith("/score")]:
        pd.testing.assert_series_equal(got.loc[want.index, col].astype(float), want[col].astype(float),
                                       check_names=False, rtol=0, atol=1e-12)
    statuses = [c for c in want.columns if c.endswith("/status")]
    assert statuses and all((got.loc[want.index, c] == want[c]).all() for c in statuses)
    # the input columns pass through untouched
    assert {"question", "answer", "contexts", "retrieved_doc_ids", "group"} <= set(got.columns)
    res.unpersist()


@pytest.fixture
def judged(fake_llm):
    fake_llm.set_handler(CompliantModel("json_schema"))
    return f"openai:/judge-model?base_url={fake_llm.openai_base_url}"


def test_judged_metrics_equal_evaluate_frame_and_a_rerun_sends_nothing(spark, fake_llm, judged, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    df = _rows(40, repeat=False)
    ref = rj.evaluate_frame(df, {"judge": judged, "metrics": JUDGED, "cache": False})
    pandas_requests = fake_llm.request_count
    fake_llm.reset()
    cfg = {"judge": judged, "metrics": JUDGED, "cache": str(tmp_path / "calls.sqlite")}
    res = evaluate_spark(spark.createDataFrame(df).repartition(4), cfg, log=False)
    scores = {k: v for k, v in ref.metrics.items() if not k.startswith("judge/")}
    assert not _close(scores, {k: v for k, v in res.metrics.items() if not k.startswith("judge/")})
    # at most the pandas run's requests plus each Python worker's own negotiation of the output format
    negotiation = res.config["usage"]["format_refusals"]
    sent = fake_llm.request_count
    assert 0 < sent <= pandas_requests + negotiation
    assert res.metrics["judge/calls"] == ref.metrics["judge/calls"]
    assert res.metrics["correctness/n_failed"] == 0
    # the identical re-run: every reply from the shared cache, nothing sent
    res.unpersist()  # else Spark would answer the identical plan from the persisted scoring
    fake_llm.reset()
    again = evaluate_spark(spark.createDataFrame(df).repartition(4), cfg, log=False)
    assert fake_llm.request_count == 0
    usage = again.config["usage"]
    # each reply comes from the cache file, or from the Python worker's memory of its last run (Spark reuses workers)
    assert usage["cache_hits"] + usage["merged"] == usage["calls"] == ref.metrics["judge/calls"], usage
    with sqlite3.connect(tmp_path / "calls.sqlite") as db:  # every paid reply is in the shared cache
        assert db.execute("SELECT COUNT(*) FROM calls").fetchone()[0] == sent - negotiation
    assert not _close(scores, {k: v for k, v in again.metrics.items() if not k.startswith("judge/")})


def test_a_failing_judge_fails_rows_with_their_reason_and_the_run_completes(spark, fake_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_llm.set_handler(lambda req: (_ for _ in ()).throw(RuntimeError("judge down")))  # every reply a 500
    judge = f"openai:/judge-model?base_url={fake_llm.openai_base_url}"
    res = evaluate_spark(spark.createDataFrame(_rows(8)).repartition(4),
                         {"judge": judge, "metrics": ["correctness"], "cache": False, "max_attempts": 2},
                         log=False)
    rows = res.rows.toPandas()
    assert len(rows) == 8
    assert rows["correctness/status"].str.startswith("failed:").all()
    assert res.metrics["correctness/n_failed"] == 8 and res.failures and res.failures[0]["metric"] == "correctness"


def _first_error(fn):
    with pytest.raises(InputError) as e:
        fn()
    return str(e.value)


def test_bad_input_gets_the_pandas_paths_error_before_any_call(spark, fake_llm, judged, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cfg = {"judge": judged, "metrics": JUDGED, "cache": False}
    df = _rows(30)
    # a missing column
    no_ref = df.drop(columns=["reference"])
    assert (_first_error(lambda: evaluate_spark(spark.createDataFrame(no_ref), cfg, log=False))
            == _first_error(lambda: rj.evaluate_frame(no_ref, cfg)))
    # cells that are not lists (contexts as JSON text is fine), the first in the data's second partition: the pandas
    # path's message, with the row numbered as in the whole data
    bad = df.copy()
    bad["contexts"] = [json.dumps(list(c)) for c in bad["contexts"]]
    bad.loc[[23, 27], "contexts"] = "a passage, not a list"
    sdf = spark.createDataFrame(bad)
    assert sdf.rdd.getNumPartitions() == 2
    spark_err = _first_error(lambda: evaluate_spark(sdf, cfg, log=False))
    assert "Column 'contexts' row 23 holds a string" in spark_err
    assert spark_err == _first_error(lambda: rj.evaluate_frame(bad, cfg))
    bad.loc[8, "contexts"] = "a passage, not a list"  # bad cells in both partitions: the first in the data's order
    assert "Column 'contexts' row 8 holds a string" in _first_error(
        lambda: evaluate_spark(spark.createDataFrame(bad), cfg, log=False))
    # a column of the wrong Spark type
    typed = spark.createDataFrame(df.assign(answer=range(len(df))))
    assert "Column 'answer' is a Spark bigint column; it must be string" in _first_error(
        lambda: evaluate_spark(typed, cfg, log=False))
    ids = spark.createDataFrame(df.assign(retrieved_doc_ids=range(len(df))))
    assert "Column 'retrieved_doc_ids' is a Spark bigint column; it must be array<string>" in _first_error(
        lambda: evaluate_spark(ids, cfg, log=False))
    # what a split run cannot do, said before it starts
    assert "human_labels" in _first_error(lambda: evaluate_spark(
        spark.createDataFrame(df.assign(h=1.0)), {**cfg, "human_labels": {"correctness": "h"}}, log=False))
    assert fake_llm.request_count == 0


def test_missing_credentials_on_the_executors_are_said_before_any_call(spark, fake_llm, judged, monkeypatch):
    # a second session would share the JVM; use the driver-side check through a config whose key cannot be found
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    # no base_url and no key: the OpenAI backend refuses to start on the executors (their env has a key here, so
    # the refusal is provoked through an Anthropic judge, whose key no executor has)
    spark = SparkSession.builder.getOrCreate()
    with pytest.raises(InputError) as e:
        evaluate_spark(spark.createDataFrame(_rows(6)), {"judge": "anthropic:/claude-x", "metrics": ["correctness"],
                                                        "cache": False}, log=False)
    assert "On the Spark executors" in str(e.value) and "spark.executorEnv" in str(e.value)
    assert fake_llm.request_count == 0


def test_one_run_is_logged_from_the_driver(spark, tmp_tracking):
    df = _rows(120)
    cfg = {"judge": "offline:/lexical", "bertscore": False, "cache": False, "metrics": ["correctness", "lexical"]}
    res = evaluate_spark(spark.createDataFrame(df).repartition(4), cfg, experiment="spark-runs", run_name="bm25",
                         table_rows=50)
    run = mlflow.get_run(res.run_id)
    assert run.info.run_name == "bm25"
    assert mlflow.get_experiment(run.info.experiment_id).name == "spark-runs"
    assert run.data.metrics["correctness/mean"] == pytest.approx(res.metrics["correctness/mean"], abs=1e-12)
    assert run.data.params["ragjudge.spark.partitions"] == "4"
    table = rj.load_output(res.run_id).table
    assert len(table) == 50 and table["row_id"].is_unique and "correctness/score" in table.columns
    assert list(table.columns[:2]) == ["question", "correctness/score"]
    cfg_record = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=res.run_id, artifact_path="ragjudge/config.json")).read_text())
    assert cfg_record["rows"] == 120 and cfg_record["spark"]["partitions"] == 4
    assert "a seeded sample of 50 rows" in cfg_record["spark"]["table"]
    # the scored rows evaluated again (their results among the input columns): replaced, the same numbers
    again = evaluate_spark(res.rows, cfg, log=False)
    assert not _close(res.metrics, again.metrics)
    assert again.rows.columns.count("correctness/score") == 1


def _trace_views(run_id: str) -> dict[int, dict]:
    """A run's traces by row index (``ragjudge.row``), as MLflow gives them back: the row id, the request and
    response, every Feedback (value, rationale, status, error, source), the Expectation and the RETRIEVER span's
    documents."""
    client = MlflowClient()
    eid = client.get_run(run_id).info.experiment_id
    views = {}
    for t in mlflow.search_traces(run_id=run_id, locations=[eid], return_type="list", max_results=10_000):
        feedback = {a.name: (a.value, a.rationale, a.metadata.get("ragjudge.status"), a.metadata.get("ragjudge.reason"),
                             a.error.error_code if a.error else None, a.source.source_type, a.source.source_id)
                    for a in t.info.assessments if a.feedback is not None}
        row = int(t.info.trace_metadata["ragjudge.row"])
        assert row not in views, f"two traces for row {row}"
        views[row] = {
            "row_id": t.info.trace_metadata.get("ragjudge.row_id"), "client_request_id": t.info.client_request_id,
            "state": t.info.state, "request": t.info.request_preview, "response": t.info.response_preview,
            "feedback": feedback,
            "expectations": {a.name: a.value for a in t.info.assessments if a.expectation is not None},
            "documents": [(d["page_content"], d["metadata"]) for s in t.data.spans if s.span_type == "RETRIEVER"
                          for d in s.outputs],
        }
    return views


def _pandas_run(df: pd.DataFrame, cfg: dict) -> str:
    """The pandas path on the same rows: evaluate_frame, logged into a run of its own (traces included)."""
    out = rj.evaluate_frame(df, cfg)
    with mlflow.start_run() as run:
        log_output(out, run.info.run_id)
    return run.info.run_id


def test_the_spark_run_logs_the_seeded_sample_of_traces_the_pandas_run_logs(spark, tmp_tracking, monkeypatch):
    df = _rows(60)  # row 5 repeats row 3's question: its row id ends in -2
    cfg = {"judge": "offline:/lexical", "bertscore": False, "cache": False, "traces": 25, "seed": 1,
           "metrics": ["correctness", "faithfulness", "context_precision", "retrieval"]}
    picked = pick_rows(60, 25, 1)
    assert picked != list(range(25)) and 5 in picked  # a real sample, holding the renumbered repeat
    # the rows in their order (a row's index is its place in the DataFrame, as sdf.toPandas() lists it), in two parts
    sdf = spark.createDataFrame(df)
    assert sdf.rdd.getNumPartitions() == 2
    collected: list[int] = []  # rows each toPandas() brought to the driver
    to_pandas = type(sdf).toPandas

    def counted(self):
        frame = to_pandas(self)
        collected.append(len(frame))
        return frame

    monkeypatch.setattr(type(sdf), "toPandas", counted)
    res = evaluate_spark(sdf, cfg, experiment="spark-traces", table_rows=10)
    monkeypatch.undo()
    res.unpersist()
    got = _trace_views(res.run_id)
    want = _trace_views(_pandas_run(df, cfg))
    assert sorted(got) == sorted(want) == picked
    assert got[5]["row_id"].endswith("-2") and got[5]["client_request_id"] == got[5]["row_id"]
    for i in picked:
        assert got[i] == want[i], i
    # real content: a RETRIEVER span with the contexts, the reference as an Expectation, every metric's Feedback
    first = got[picked[0]]
    assert [text for text, _ in first["documents"]] == list(df.loc[picked[0], "contexts"])
    assert first["expectations"] == {"expected_response": df.loc[picked[0], "reference"]}
    assert {"correctness", "faithfulness", "context_precision", "map"} <= set(first["feedback"])
    # the run says what it logged, in the pandas run's words
    tag = mlflow.get_run(res.run_id).data.tags["ragjudge.traces"]
    assert tag.startswith("25 of 60 rows as traces (a seeded uniform sample")
    # only the sampled rows left the executors: the table's 10 and the traces' 25
    assert sorted(collected) == [10, 25]


def test_a_failed_row_is_the_same_trace_on_spark_as_in_pandas(spark, fake_llm, monkeypatch, tmp_tracking):
    """Judged rows, some failing at the provider: every row traced (12 < ``traces``), the failure as the
    Feedback's error with its reason, the judge model as the source, as the pandas run logs them."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    model = CompliantModel("json_schema")

    def handle(request):
        if "zzfail" in json.dumps(request.body):
            return Reply.error(400, "This request cannot be processed.")
        return model(request)

    fake_llm.set_handler(handle)
    df = _rows(12, repeat=False)
    df.loc[[2, 9], "answer"] = df.loc[[2, 9], "answer"] + " zzfail"
    cfg = {"judge": f"openai:/judge-model?base_url={fake_llm.openai_base_url}", "metrics": ["correctness"],
           "cache": False, "max_error_rate": 1.0}
    res = evaluate_spark(spark.createDataFrame(df), cfg)  # two partitions, the rows in their order
    res.unpersist()
    got = _trace_views(res.run_id)
    want = _trace_views(_pandas_run(df, cfg))
    assert sorted(got) == sorted(want) == list(range(12))
    assert got == want
    failed = {i for i, t in got.items() if t["feedback"]["correctness"][4] is not None}
    assert failed == {2, 9}
    value, _, status, reason, code, source, judge = got[2]["feedback"]["correctness"]
    assert (value, status, code, source) == (None, "failed", reason.upper(), "LLM_JUDGE") and "judge-model" in judge
    # the others are judged: a value when scored, none when the judge was not sure (level 0: abstained)
    judged = [got[i]["feedback"]["correctness"] for i in sorted(set(got) - {2, 9})]
    assert {f[2] for f in judged} <= {"scored", "abstained"} and any(f[2] == "scored" for f in judged)
    assert all((f[0] is not None) == (f[2] == "scored") for f in judged)
    assert mlflow.get_run(res.run_id).data.tags["ragjudge.traces"] == "12 of 12 rows as traces"


def test_the_traces_setting_bounds_a_spark_run_and_0_logs_none(spark, tmp_tracking):
    sdf = spark.createDataFrame(_rows(12))
    tags = {}
    for traces in (4, 0):
        cfg = {"judge": "offline:/lexical", "metrics": ["correctness"], "cache": False, "traces": traces}
        res = evaluate_spark(sdf, cfg)
        res.unpersist()
        assert sorted(_trace_views(res.run_id)) == pick_rows(12, traces, 0)
        tags[traces] = mlflow.get_run(res.run_id).data.tags["ragjudge.traces"]
    assert tags[4].startswith("4 of 12 rows as traces (a seeded uniform sample")
    assert tags[0] == "no traces (traces=0)"


def test_a_request_limit_holds_for_the_whole_job(spark, fake_llm, judged, monkeypatch):
    """``requests_per_minute`` is the job's: every task claims its starts from one pace file (on ``local[N]`` in the
    driver's temporary folder: :mod:`mlflow_ragjudge.adapters.spark_pace`), so the server's limit (600/min, on a
    6-second window to keep the test short) refuses next to nothing and no row is lost; the file is gone after the
    job. (The fake server in this process and the test's CPU bunch some arrivals, which a 6-second window notices:
    benchmarks/bench_spark.py measures the same on a 60-second window.)"""
    import tempfile

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_llm.rate_limit_per_minute, fake_llm.rate_limit_window = 60, 6.0  # 60 per 6 s = 600/min
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def spy(*args, **kwargs):  # the folders the job makes (other tests running beside this one make their own)
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    res = evaluate_spark(spark.createDataFrame(_rows(120, repeat=False)).repartition(4),
                         {"judge": judged, "metrics": ["correctness"], "cache": False, "requests_per_minute": 540},
                         log=False)
    assert res.config["spark"]["concurrent_tasks"] == 2
    assert res.config["spark"]["pace_file"] == "driver" and res.config["spark"]["requests_per_minute_per_task"] is None
    paces = [Path(d) for d in made if Path(d).name.startswith("ragjudge-pace-")]
    assert len(paces) == 1 and not paces[0].exists()  # the job's pace folder, removed with the job
    # two tasks at the whole limit each, without the one pace, would see about half their requests refused
    assert fake_llm.rate_limited_count <= 0.02 * (fake_llm.request_count - fake_llm.rate_limited_count)
    arrivals = sorted(r.received_at for r in fake_llm.requests)
    # one pace for the job: 540/min at 99 % is 0.112 s between starts, whichever task took them
    assert arrivals[-1] - arrivals[0] >= (len(arrivals) - 1) * 60 / (0.99 * 540) - 1.0
    assert res.metrics["correctness/count"] == 120 and res.metrics["correctness/n_failed"] == 0


def test_without_a_pace_file_each_task_paces_its_share(judged, tmp_path):
    """A cluster whose executors share no folder with the driver and no cache path: each task paces its share of the
    limit, as before the pace file; a given ``shared_pace`` is used as it is."""
    from mlflow_ragjudge.adapters.spark import _executor_config
    from mlflow_ragjudge.adapters.spark_pace import job_pace
    from mlflow_ragjudge.engine.config import RagJudgeConfig

    cfg = RagJudgeConfig.from_dict({"judge": judged, "cache": False, "requests_per_minute": 540})

    class Cluster:
        master = "spark://somewhere:7077"

    with job_pace(cfg, Cluster()) as pace:
        assert pace == (None, "none")
        assert _executor_config(cfg, 2, pace[0])["requests_per_minute"] == pytest.approx(270 * 0.97)
    on_cache = RagJudgeConfig.from_dict({"judge": judged, "cache": str(tmp_path / "cache"),
                                         "requests_per_minute": 540})
    with job_pace(on_cache, Cluster()) as (path, where):
        assert where == "cache" and Path(path).parent == tmp_path / "cache"
        run = _executor_config(on_cache, 2, path)
        assert run["requests_per_minute"] == 540 and run["shared_pace"] == path
        Path(path).parent.mkdir(parents=True)
        Path(path).write_text("")  # as the tasks' first claim makes it
    assert not Path(path).exists()  # the job's file is removed after it
    given = RagJudgeConfig.from_dict({"judge": judged, "cache": False, "requests_per_minute": 540,
                                      "shared_pace": str(tmp_path / "mine.pace")})
    with job_pace(given, Cluster()) as pace:
        assert pace == (str(tmp_path / "mine.pace"), "config")


def test_the_cli_evaluates_a_parquet_file_on_spark(spark, tmp_path, tmp_tracking, capsys):
    from mlflow_ragjudge.cli import main

    data = tmp_path / "rows.parquet"
    _rows(60).to_parquet(data)
    out = tmp_path / "scored"
    code = main(["evaluate", str(data), "--spark", "--metrics", "correctness,retrieval", "--no-cache",
                 "--experiment", "cli-spark", "--spark-output", str(out), "--table-rows", "all"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "rows: 60" in printed and "OFFLINE judge" in printed
    assert "traces: 60 of 60 rows as traces" in printed  # every row, as the pandas path logs them (traces=2000)
    scored = pd.read_parquet(out)
    assert len(scored) == 60 and {"correctness/score", "map/score", "row_id", "question"} <= set(scored.columns)
    run = mlflow.search_runs(experiment_names=["cli-spark"]).iloc[0]
    assert run["metrics.correctness/count"] == 60
    assert len(rj.load_output(run["run_id"]).table) == 60
    assert sorted(_trace_views(run["run_id"])) == list(range(60))


@pytest.mark.slow
def test_a_bad_spark_source_exits_2_in_one_line_without_a_java_traceback(tmp_path):
    """As a user runs it (a process of its own, its JVM's output read too): a missing Parquet path is refused before
    Spark starts; a table the session's catalog lacks gets Spark's AnalysisException, said in the same one line; a URI
    Spark cannot read (no S3 file system here), Spark's Java error, in that line too (Spark's own log still shows its
    stack trace, as a WARN line of the JVM: not ours to silence)."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items()  # not the experiment an earlier test in this process made active
           if not k.startswith(("MLFLOW_EXPERIMENT", "MLFLOW_RUN_ID"))}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p))
    for data, says in [(str(tmp_path / "missing.parquet"), "No such file or directory: "),
                       ("no_such_table", "--spark could not read no_such_table: [TABLE_OR_VIEW_NOT_FOUND]"),
                       ("s3a://no-such-bucket/rows", "--spark could not read s3a://no-such-bucket/rows: java.lang.")]:
        proc = subprocess.run([sys.executable, "-m", "mlflow_ragjudge", "evaluate", data, "--spark",
                               "--spark-master", "local[1]", "--metrics", "correctness", "--no-cache"],
                              env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr[-3000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and data in errors[0] and says in errors[0], proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr  # no Python traceback
        if not data.startswith("s3a:"):  # and no Java one
            assert "org.apache" not in proc.stderr and "py4j" not in proc.stderr
        assert proc.stdout == ""
        # PySpark's warning about pandas 3 comes at session start: only inside ours, said once (no session: none)
        ours = proc.stderr.count("SparkPandasWarning")
        assert ours == (1 if data != str(tmp_path / "missing.parquet") and PYSPARK_WARNS else 0), proc.stderr[-3000:]
        assert proc.stderr.count(PYSPARK_PANDAS_WARNING) == ours


def test_pysparks_warning_about_pandas_3_is_said_once_in_our_words(spark, monkeypatch):
    """PySpark 4.3 warns at every pandas conversion that it does not fully support pandas 3 (a ``FutureWarning`` from
    ``mapInPandas`` and ``toPandas``); evaluate_spark holds it back and says once per process what it means here."""
    monkeypatch.setitem(spark_adapter._NOTE, "given", False)  # as in a fresh process
    sdf = spark.createDataFrame(_rows(6))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            evaluate_spark(sdf, {"judge": "offline:/lexical", "metrics": ["correctness"], "cache": False},
                           log=False, table_rows=2).unpersist()
    ours = [w for w in seen if issubclass(w.category, SparkPandasWarning)]
    theirs = [w for w in seen if PYSPARK_PANDAS_WARNING in str(w.message) and w not in ours]
    assert theirs == []
    assert len(ours) == (1 if PYSPARK_WARNS else 0)
    if ours:
        message = str(ours[0].message)
        assert f"pandas {pd.__version__}" in message and "pip install 'pandas>=2.2,<3'" in message
        assert ours[0].filename == __file__  # it points at the caller's line




def test_batch_mode_goes_through_each_task_and_gives_the_same_scores(spark, fake_llm, monkeypatch):
    """``batch=True`` on Spark: each task submits its own provider batch (the fake server's Files + Batches API,
    through the real openai SDK) and scores its rows from it; the aggregates are the pandas batch run's."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_llm.set_handler(CompliantModel("json_schema"))
    judge = f"openai:/gpt-4o-mini?base_url={fake_llm.openai_base_url}"
    cfg = {"judge": judge, "metrics": ["correctness", "faithfulness"], "cache": False,
           "batch": {"poll_interval": 0.05, "max_poll_interval": 0.2, "progress": False}}
    df = _rows(12, repeat=False)
    ref = rj.evaluate_frame(df, cfg)
    before = len(fake_llm.batches.created)
    res = evaluate_spark(spark.createDataFrame(df).repartition(2), cfg, log=False)
    scores = {k: v for k, v in ref.metrics.items() if not k.startswith("judge/")}
    assert not _close(scores, {k: v for k, v in res.metrics.items() if not k.startswith("judge/")})
    # two tasks, each with its own rounds (statements, then verdicts): at least two batches each
    assert len(fake_llm.batches.created) - before == res.metrics["judge/batches"] >= 4
    assert res.metrics["judge/batch_lines"] == ref.metrics["judge/batch_lines"]
    assert res.metrics["faithfulness/n_failed"] == 0 and res.metrics["correctness/n_failed"] == 0


def _python_workers(spark) -> list[int]:
    """The Python workers this session's Spark daemon forked (the processes that run its tasks; not another
    session's, such as another pytest worker's)."""
    jvm = spark.sparkContext._gateway.proc.pid
    procs = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                args = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
            procs[int(d.name)] = (ppid, args)
    daemons = {pid for pid, (ppid, args) in procs.items() if "pyspark.daemon" in args and ppid == jvm}
    return [pid for pid, (ppid, _) in procs.items() if ppid in daemons]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the Python workers through /proc (Linux)")
def test_a_killed_task_is_retried_without_paying_twice_and_no_row_is_lost(spark, fake_llm, judged, tmp_path,
                                                                         monkeypatch):
    """The Python workers are killed (SIGKILL) while their tasks are half way through their judge calls; Spark runs
    the tasks again, and the replies the killed attempts paid for come from the shared cache."""
    import signal
    import threading
    import time

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    df = _rows(40, repeat=False)
    ref = rj.evaluate_frame(df, {"judge": judged, "metrics": JUDGED, "cache": False})
    pandas_requests = fake_llm.request_count
    fake_llm.reset()
    fake_llm.latency = 0.02
    killed: list[int] = []

    def kill_half_way() -> None:
        deadline = time.monotonic() + 120
        while fake_llm.request_count < pandas_requests // 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        for pid in _python_workers(spark):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass

    killer = threading.Thread(target=kill_half_way, daemon=True)
    killer.start()
    # at most 4 calls in flight in the job (2 per task): what a kill can lose before it is stored
    cfg = {"judge": judged, "metrics": JUDGED, "cache": str(tmp_path / "calls.sqlite"), "max_concurrency": 4}
    res = evaluate_spark(spark.createDataFrame(df).repartition(2), cfg, log=False)
    killer.join(5)
    assert killed, "no Python worker was running when a third of the calls were sent"
    # no row lost: every row scored, the same aggregates as one process
    assert res.metrics["correctness/count"] == 40 and all(res.metrics[f"{m}/n_failed"] == 0 for m in
                                                          ("correctness", "faithfulness"))
    scores = {k: v for k, v in ref.metrics.items() if not k.startswith("judge/")}
    assert not _close(scores, {k: v for k, v in res.metrics.items() if not k.startswith("judge/")})
    # not paying twice: every paid reply is stored once; the retried tasks read what the killed ones stored, and
    # only what the kill caught between sending and storing is sent again: the calls in flight (at most 4, the gate's
    # slots) and the replies just received, whose slot is free again while they wait for the cache's write lock (the
    # two executors share the file): at most one more per slot unless the lock is held for long (a CI run saw 5; the
    # first version of this test allowed 4)
    with sqlite3.connect(tmp_path / "calls.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM calls").fetchone()[0] == pandas_requests
    usage = res.config["usage"]  # the attempts that finished
    killed_sent = fake_llm.request_count - usage["requests"]
    caught = 2 * 4
    assert killed_sent > 0 and usage["cache_hits"] >= killed_sent - caught
    assert fake_llm.request_count - pandas_requests <= caught, (fake_llm.request_count, pandas_requests, usage)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the Python workers through /proc (Linux)")
def test_a_task_that_keeps_dying_fails_the_job_with_a_clear_error(spark, fake_llm, judged, tmp_path, monkeypatch):
    """Workers killed again and again (more often than ``spark.task.maxFailures`` allows): the job fails with what
    happened and where the paid replies are, nothing is logged, and the persisted scoring is released."""
    import signal
    import threading
    import time

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_llm.latency = 0.05
    stop = threading.Event()

    def keep_killing() -> None:
        while not stop.is_set():
            if fake_llm.request_count:
                for pid in _python_workers(spark):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)

    killer = threading.Thread(target=keep_killing, daemon=True)
    killer.start()
    cache = str(tmp_path / "calls.sqlite")
    persisted = spark.sparkContext._jsc.getPersistentRDDs().size()
    try:
        with pytest.raises(RuntimeError) as e:
            evaluate_spark(spark.createDataFrame(_rows(40, repeat=False)).repartition(2),
                           {"judge": judged, "metrics": JUDGED, "cache": cache}, log=False)
    finally:
        stop.set()
        killer.join(5)
    message = str(e.value)
    assert message.startswith("The scoring failed in a Spark task, after Spark's retries")
    assert f"in the cache at {cache}" in message and "a re-run sends only the rest" in message
    assert spark.sparkContext._jsc.getPersistentRDDs().size() == persisted  # the failed scoring is not kept


def test_a_plain_text_server_scores_every_row_on_spark(spark, fake_llm, monkeypatch):
    """A server that answers in plain text only (no JSON modes): each worker negotiates the format on its own, and
    every row is scored with the pandas run's aggregates."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_llm.set_handler(CompliantModel("text"))
    judge = f"openai:/judge-model?base_url={fake_llm.openai_base_url}"
    cfg = {"judge": judge, "metrics": ["correctness", "faithfulness"], "cache": False}
    df = _rows(12, repeat=False)
    ref = rj.evaluate_frame(df, cfg)
    res = evaluate_spark(spark.createDataFrame(df).repartition(2), cfg, log=False)
    scores = {k: v for k, v in ref.metrics.items() if not k.startswith("judge/")}
    assert not _close(scores, {k: v for k, v in res.metrics.items() if not k.startswith("judge/")})
    assert res.metrics["correctness/n_failed"] == 0 and res.metrics["faithfulness/n_failed"] == 0
    res.unpersist()


def test_the_run_is_logged_to_a_real_mlflow_server_in_a_named_experiment(spark, mlflow_server):
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_server)
    try:
        res = evaluate_spark(spark.createDataFrame(_rows(40)).repartition(2),
                             {"judge": "offline:/lexical", "metrics": ["correctness"], "cache": False},
                             experiment="spark-on-a-server", run_name="variant-a", table_rows=10)
        run = mlflow.get_run(res.run_id)
        assert mlflow.get_experiment(run.info.experiment_id).name == "spark-on-a-server"
        assert run.data.metrics["correctness/mean"] == pytest.approx(res.metrics["correctness/mean"], abs=1e-12)
        assert len(rj.load_output(res.run_id).table) == 10
        res.unpersist()
    finally:
        mlflow.set_tracking_uri(before)


def test_repeats_and_a_panel_on_spark_give_the_pandas_runs_scores_noise_and_agreement(spark, fake_llm, monkeypatch):
    """``repeats`` and a panel compose with Spark: each task judges its rows' draws with each judge, and the parts'
    judge-noise and agreement sums add up to the flip rates, variances, kappas and alpha one process logs."""
    from noisy_model import NoisyModel

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_llm.set_handler(NoisyModel(0.3, values=[1, 2, 3, 4, 5]))
    judges = [f"openai:/judge-{x}?base_url={fake_llm.openai_base_url}" for x in "ab"]
    cfg = {"judge": judges, "metrics": ["correctness"], "cache": False, "repeats": 3, "context_mode": "generation"}
    df = _rows(40, repeat=False)
    ref = rj.evaluate_frame(df, cfg)
    pandas_requests = fake_llm.request_count
    assert pandas_requests == 2 * 3 * 40
    assert {"correctness/panel/alpha", "correctness/panel/fleiss_kappa",
            "correctness/by_judge/judge-b/flip_rate"} <= set(ref.metrics)
    fake_llm.reset()
    res = evaluate_spark(spark.createDataFrame(df).repartition(3), cfg, log=False)
    assert fake_llm.request_count == pandas_requests
    scores = {k: v for k, v in ref.metrics.items() if not k.startswith("judge/")}
    assert "correctness/flip_rate" in scores and "correctness/judge_share" in scores
    assert not _close(scores, {k: v for k, v in res.metrics.items() if not k.startswith("judge/")})
    res.unpersist()


def test_a_monitor_backlog_judged_on_spark_attaches_what_one_process_attaches(spark, fake_llm, judged, tmp_tracking,
                                                                             tmp_path):
    """``ragjudge monitor --spark``: a pass's rows judged in the executors, the Feedback attached from the driver to
    the app's own traces -- the same values, statuses and identities as the in-process pass on the same app."""
    import uuid

    from mlflow.entities import Document, SpanType

    from mlflow_ragjudge.engine.identity import JUDGE_ID_KEY
    from mlflow_ragjudge.workflows.monitor import monitor_pass

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(query: str) -> list[Document]:
        return [Document(page_content="Paris is the capital and the largest city of France.",
                         metadata={"doc_uri": "d1"})]

    @mlflow.trace
    def app(question: str) -> str:
        retrieve(question)
        return "Paris is the capital of France." if int(question.split()[1]) % 2 else "Lyon is the capital."

    values: dict[str, list[tuple[str, float | None, str, str]]] = {}
    for where in ("spark", "process"):
        exp_id = mlflow.set_experiment(f"monitor-{where}-{uuid.uuid4().hex[:8]}").experiment_id
        for i in range(10):
            app(f"Question {i} about France?")
        mlflow.flush_trace_async_logging()
        result = monitor_pass(exp_id, judged, ["faithfulness", "context_relevance"], settle=0,
                              config={"cache": str(tmp_path / f"{where}.db")},
                              spark=spark if where == "spark" else None)
        assert len(result.judged) == 10 and result.attached == 20, result.summary()
        assert result.metrics["faithfulness/n_scored"] == 10
        traces = mlflow.search_traces(locations=[exp_id], return_type="list", include_spans=False)
        values[where] = sorted((a.name, a.value, a.metadata[JUDGE_ID_KEY], a.metadata["ragjudge.status"])
                               for t in traces for a in t.info.assessments if (a.metadata or {}).get(JUDGE_ID_KEY))
    assert len(values["spark"]) == 20 and values["spark"] == values["process"]
