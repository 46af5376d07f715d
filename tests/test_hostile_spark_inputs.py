"""Issue 40, cases 7, 12, 13 and the Ctrl-C item of 16: hostile input on the Python path (a lone surrogate in an
identifier column), a plugin metric that is not judged but fails on every row, and ``--spark`` under hostile
conditions (an output path that cannot be written, Ctrl-C, ``--traces N``, skip reasons over partitions,
``max_concurrency: 1``).

Real SDKs against the fake server (requests counted there), a real SQLite MLflow store, a real local Spark session
(``local[2]``, one per module) and real signals sent to a real ``ragjudge`` process."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from compliant_model import CompliantModel
from mlflow import MlflowClient

import mlflow_ragjudge as rj
from mlflow_ragjudge.adapters.run_log import log_output
from mlflow_ragjudge.core.errors import InputError, InvalidTextWarning, JudgeFailureWarning
from mlflow_ragjudge.metrics.spec import unregister_metric

KEY = "sk-hostile-spark-0001"
ROOT = Path(__file__).resolve().parents[1]


def _judge(fake_llm) -> str:
    fake_llm.set_handler(CompliantModel("json_schema"))
    return f"openai:/m?base_url={fake_llm.openai_base_url}"


# ----------------------------------------------------------------------------------------- case 7: identifier cells

def _surrogate_rows() -> pd.DataFrame:
    # (object columns: pandas 3's Arrow-backed text dtype cannot hold a lone surrogate; a frame built on pandas 2, or
    # with dtype=object, can)
    return pd.DataFrame({
        "question": ["Where is the saw?", "Who made the saw?"],
        "answer": ["In the shed.", "A family firm."],
        "reference": ["In the shed.", "A family firm."],
        "row_id": ["r1\ud800", "r2"],
        "retrieved_doc_ids": [["d1\ud800", "d2"], ["d3\udc00"]],
        "relevant_doc_ids": [["d1\ud800"], {"d3\udc00": 2}],
        "citations": [["d1\ud800"], ["d3"]],
    }, dtype=object)


def test_case_07_surrogates_in_identifier_columns_are_repaired_and_logged(fake_llm, tmp_tracking, monkeypatch):
    """A lone surrogate in ``row_id`` / ``retrieved_doc_ids`` / ``relevant_doc_ids`` / ``citations`` is repaired
    as text cells are (U+FFFD, announced), the same way in every column, so an id matches its copy elsewhere; the
    run logs (it stopped with LoggingFailed after paying), and a re-run does the same. The Python path:
    ``evaluate_frame`` and the logging ``mlflow.models.evaluate``'s evaluator does."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cfg = {"judge": _judge(fake_llm), "metrics": ["correctness", "retrieval"], "cache": False}
    for attempt in range(2):  # a re-run is no different
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = rj.evaluate_frame(_surrogate_rows(), cfg)
            with mlflow.start_run() as run:  # as the evaluator logs it (mlflow.models.evaluate itself cannot take
                log_output(out, run.info.run_id)  # such a frame under pandas 3: its dataset digest fails first)
        said = " ".join(str(w.message) for w in seen if issubclass(w.category, InvalidTextWarning))
        for column in ("row_id", "retrieved_doc_ids", "relevant_doc_ids"):
            assert f"row 0 '{column}'" in said or f"'{column}'" in said, said
        out = rj.load_output(run.info.run_id)
        assert out.table["row_id"].tolist() == ["r1\ufffd", "r2"]
        logged = MlflowClient().get_run(run.info.run_id).data.metrics
        # the repaired ids still match each other: both rows find their relevant document at rank 1
        direct = rj.evaluate_frame(_surrogate_rows(), {**cfg, "metrics": ["retrieval"]})
        assert direct.table["mrr/score"].tolist() == [1.0, 1.0]
        assert logged["mrr/mean"] == 1.0, (attempt, logged)
        assert logged["correctness/count"] == 2 and logged["correctness/n_failed"] == 0, (attempt, logged)


def test_case_07_ids_made_equal_by_the_repair_are_refused_before_any_call(fake_llm):
    """Two row ids that differ only in their invalid characters are the same id once repaired: refused before any
    judge call, naming the column and the fix."""
    rows = _surrogate_rows()
    rows["row_id"] = pd.Series(["r\ud800", "r\udc00"], dtype=object)
    with pytest.raises(InputError, match=r"Column 'row_id'.*encoding") as e:
        rj.evaluate_frame(rows, {"judge": _judge(fake_llm), "metrics": ["correctness"], "cache": False})
    assert "U+FFFD" in str(e.value)
    assert fake_llm.request_count == 0


def test_case_07_a_scorer_repairs_document_ids_the_same_way():
    """The ``mlflow.genai`` scorers read ids from ``outputs`` / ``expectations``: the same repair, so the ids match."""
    from mlflow_ragjudge.adapters.scorers import RetrievalMetrics

    fbs = RetrievalMetrics()(outputs={"retrieved_doc_ids": ["x", "d\ud800"]},
                             expectations={"relevant_doc_ids": {"d\udc00": 1}})
    got = {f.name: f.value for f in fbs}
    assert got["mrr"] == 0.5 and got["hit_rate_at_1"] == 0.0
    for f in fbs:  # what MLflow logs of it is valid text
        json.dumps(f.to_dictionary(), ensure_ascii=False).encode("utf-8")


# ----------------------------------------------------------------------------------------- case 12: plain plugins

PLUGIN = '''
from mlflow_ragjudge.metrics.spec import MetricSpec, register_metric


def score(state, row, ctx):
    {body}


register_metric(MetricSpec("hostile_plain", requires=(("answer",),), score=score, judged=False,
                           description="a plugin metric that fails on every row"), replace=True)
'''


@pytest.fixture
def unregister():
    yield
    unregister_metric("hostile_plain")


@pytest.mark.parametrize("body,says", [("raise RuntimeError('the plugin broke')", "RuntimeError: the plugin broke"),
                                       ("return 0.5", "returned float")])
def test_case_12_a_plain_plugin_failing_every_row_is_loud_and_exits_3(tmp_path, tmp_tracking, capsys, unregister,
                                                                      body, says):
    from mlflow_ragjudge.cli import main

    plugin = tmp_path / "hostile_plain.py"
    plugin.write_text(PLUGIN.format(body=body))
    data = tmp_path / "rows.jsonl"
    _rag_rows(2).to_json(data, orient="records", lines=True)
    code = main(["evaluate", str(data), "--plugin", str(plugin), "--metrics", "hostile_plain,correctness",
                 "--experiment", "hostile-plain"])
    printed = capsys.readouterr()
    assert code == 3, printed
    assert "hostile_plain" in printed.err and "internal_error" in printed.err and says in printed.err
    run = mlflow.search_runs(experiment_names=["hostile-plain"]).iloc[0]
    assert run["metrics.hostile_plain/error_rate"] == 1.0 and run["metrics.hostile_plain/n_failed"] == 2
    table = rj.load_output(run["run_id"]).table
    assert all(s.startswith("failed:internal_error") for s in table["hostile_plain/status"])

    with warnings.catch_warnings(record=True) as seen:  # the Python path: the same rule, a loud warning
        warnings.simplefilter("always")
        out = rj.evaluate_frame(pd.read_json(data, lines=True), {"metrics": ["hostile_plain"]})
    assert [f["metric"] for f in out.failures] == ["hostile_plain"]
    assert any(issubclass(w.category, JudgeFailureWarning) and "hostile_plain" in str(w.message) for w in seen)


def test_case_12_a_plain_metric_that_fails_some_rows_counts_them(tmp_path, unregister):
    """Below max_error_rate: no failure, but the rows that failed are counted (error_rate) and say why."""
    plugin = tmp_path / "hostile_plain.py"
    plugin.write_text(PLUGIN.format(body="if row.index == 0:\n        raise ValueError('row zero')\n"
                                    "    from mlflow_ragjudge.core.types import JudgeResult\n"
                                    "    return JudgeResult.scored(1.0, 'fine')"))
    from mlflow_ragjudge.cli.reading import load_plugins

    load_plugins([str(plugin)])
    rows = pd.DataFrame({"answer": [f"answer {i}" for i in range(4)]})
    out = rj.evaluate_frame(rows, {"metrics": ["hostile_plain"], "max_error_rate": 0.5})
    assert out.failures == []
    assert out.metrics["hostile_plain/error_rate"] == 0.25 and out.metrics["hostile_plain/mean"] == 1.0
    assert out.table["hostile_plain/status"].tolist()[0] == "failed:internal_error"


def test_case_13_an_unwritable_spark_output_is_refused_before_spark_starts(fake_llm, tmp_path, capsys,
                                                                           monkeypatch):
    from mlflow_ragjudge.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    (tmp_path / "afile").write_text("the user's own file\n")
    _rag_rows(3).to_parquet(tmp_path / "rows.parquet")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("the user's notes\n")
    for target in (tmp_path / "afile" / "out", tmp_path / "afile", tmp_path / "theirs", Path("/proc/ragjudge-out")):
        code = main(["evaluate", str(tmp_path / "rows.parquet"), "--spark", "--judge", _judge(fake_llm),
                     "--metrics", "correctness", "--spark-output", str(target)])
        err = capsys.readouterr().err
        assert code == 2 and f"--spark-output {target}" in err, err
    assert fake_llm.request_count == 0
    assert (tmp_path / "afile").read_text() == "the user's own file\n"  # left alone
    assert (tmp_path / "theirs" / "notes.txt").read_text() == "the user's notes\n"


# ----------------------------------------------------------------------------------------- case 13: Spark

HAS_SPARK = importlib.util.find_spec("pyspark") is not None and (
    shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME")))
needs_java = pytest.mark.skipif(not HAS_SPARK, reason="Spark needs the spark extra and Java (17 or newer)")


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("ragjudge-hostile")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.executorEnv.OPENAI_API_KEY", KEY)
               .config("spark.executorEnv.MLFLOW_DISABLE_TELEMETRY", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _rag_rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({
        "question": [f"Question number {i}?" for i in range(n)],
        "answer": [f"Answer {i} is short." for i in range(n)],
        "reference": [f"Answer {i} is short." for i in range(n)],
        "retrieved_doc_ids": [[f"d{i}", f"e{i}"] for i in range(n)],
        "relevant_doc_ids": [[f"d{i}"] if i % 3 else None for i in range(n)],
    })


_SCHEMA = ("question string, answer string, reference string, retrieved_doc_ids array<string>, "
           "relevant_doc_ids array<string>")


@needs_java
def test_case_13_skip_reasons_add_up_over_partitions(spark):
    from mlflow_ragjudge.spark import evaluate_spark

    rows = _rag_rows(12)
    cfg = {"judge": "offline:/lexical", "metrics": ["retrieval"], "cache": False}
    res = evaluate_spark(spark.createDataFrame(rows, _SCHEMA).repartition(3), cfg, log=False)
    res.unpersist()
    whole = rj.evaluate_frame(rows, cfg)
    lacking = sum(r is None for r in rows.relevant_doc_ids)
    assert whole.skipped["retrieval_rows_without_gold_ids"].startswith(f"{lacking} row(s)")
    assert res.skipped == whole.skipped


@needs_java
def test_case_13_max_concurrency_one_is_one_request_in_flight_job_wide(spark, fake_llm):
    from mlflow_ragjudge.spark import evaluate_spark

    fake_llm.latency = 0.2
    cfg = {"judge": _judge(fake_llm), "metrics": ["correctness"], "cache": False, "max_concurrency": 1}
    res = evaluate_spark(spark.createDataFrame(_rag_rows(6), _SCHEMA).repartition(2), cfg, log=False)
    res.unpersist()
    assert res.metrics["correctness/count"] == 6 and res.metrics["correctness/n_failed"] == 0
    assert fake_llm.request_count >= 6 and fake_llm.peak_in_flight == 1
    assert res.config["spark"]["partitions"] == 1 and res.config["spark"]["concurrent_tasks"] == 1  # coalesced


@needs_java
def test_case_13_traces_n_is_honoured_on_spark(spark, tmp_path, tmp_tracking, capsys):
    from mlflow_ragjudge.cli import main

    data = tmp_path / "rows.parquet"
    _rag_rows(10).to_parquet(data)
    code = main(["evaluate", str(data), "--spark", "--metrics", "correctness", "--no-cache", "--traces", "3",
                 "--experiment", "spark-traces"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "traces: 3 of 10 rows" in printed
    run = mlflow.search_runs(experiment_names=["spark-traces"]).iloc[0]
    traces = mlflow.search_traces(locations=[run["experiment_id"]], run_id=run["run_id"], return_type="list")
    assert len(traces) == 3


@needs_java
def test_case_13_a_spark_output_that_fails_late_still_prints_the_summary(spark, tmp_path, tmp_tracking, capsys):
    """A URI the check before the run cannot judge (no S3 file system in this Spark): the write fails after the run
    is logged; the summary is printed and the error says where the results are."""
    from mlflow_ragjudge.cli import main

    data = tmp_path / "rows.parquet"
    _rag_rows(5).to_parquet(data)
    code = main(["evaluate", str(data), "--spark", "--metrics", "correctness", "--no-cache",
                 "--experiment", "spark-late", "--spark-output", "s3a://no-such-bucket/out"])
    printed = capsys.readouterr()
    run = mlflow.search_runs(experiment_names=["spark-late"]).iloc[0]
    assert code == 5, printed
    assert "rows: 5" in printed.out and run["run_id"] in printed.out  # the summary
    assert "s3a://no-such-bucket/out" in printed.err and "per-row table" in printed.err and run["run_id"] in printed.err
    assert len(rj.load_output(run["run_id"]).table) == 5


@pytest.mark.slow
@needs_java
def test_case_16_ctrl_c_during_spark_stops_cleanly_with_130(fake_llm, tmp_path):
    """Case 13's and 16's Ctrl-C: PySpark replaces the SIGINT handler when its context starts; ours is put back for
    the job, so a SIGINT cancels the Spark job, says what was done and how to finish, and exits 130 -- no
    KeyboardInterrupt traceback, no run left behind. The signal goes to the command's process group, as a terminal's
    Ctrl-C does (it reaches the driver only: the JVM ignores SIGINT, the Python workers have a group of their own). The
    workers go on until Spark ends them, seconds later (docs/failure-modes.md): the run still stops well short of its
    end."""
    fake_llm.latency = 0.3
    judge = _judge(fake_llm)
    data = tmp_path / "rows.parquet"
    rows = 80
    _rag_rows(rows).to_parquet(data)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_EXPERIMENT", "MLFLOW_RUN_ID"))}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", PYSPARK_PYTHON=sys.executable,
               OPENAI_API_KEY=KEY, RAGJUDGE_CACHE_DIR=str(tmp_path / "cache"), RAGJUDGE_STOP_GRACE="2",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "mlflow_ragjudge", "evaluate", str(data), "--spark",
                             "--spark-master", "local[1]", "--judge", judge, "--metrics", "correctness",
                             "--max-concurrency", "2", "--experiment", "spark-stop"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True)  # its own process group, as a shell gives a command
    try:
        assert fake_llm.wait_for_requests(2, timeout=300), proc.poll()
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert "SIGINT" in stderr and "run the same command again" in stderr, stderr[-3000:]
    assert fake_llm.request_count < rows  # it stopped: a whole run sends at least one request a row
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("spark-stop")
    assert experiment is None or not client.search_runs([experiment.experiment_id])  # nothing half-logged
