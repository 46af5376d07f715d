"""The command line, in process and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from mlflow_ragjudge.cli import main


@pytest.fixture
def jsonl(tmp_path):
    rows = [
        {"question": "What is X?", "answer": "X is a letter.", "reference": "X is a letter of the alphabet.",
         "contexts": ["X is the 24th letter."], "retrieved_doc_ids": ["d1", "d2"], "relevant_doc_ids": ["d1"],
         "team": "a"},
        {"question": "What is Y?", "answer": "I am not sure.", "reference": "Y is a letter.",
         "contexts": ["Y follows X."], "retrieved_doc_ids": ["d3"], "relevant_doc_ids": ["d4"], "team": "b"},
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    return path


def test_cli_evaluate_creates_a_run(fake_llm, monkeypatch, jsonl, tmp_tracking, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-cli-test")
    fake_llm.set_handler(lambda r: "Feedback: fine [RESULT] 4")
    rc = main(["evaluate", str(jsonl), "--judge", f"openai:/j?base_url={fake_llm.openai_base_url}",
               "--metrics", "correctness,retrieval", "--group-column", "team", "--experiment", "cli-exp",
               "--run-name", "variant-a", "--k", "1,2", "--no-cache"])
    out = capsys.readouterr().out
    assert rc == 0
    # the summary leads with each judged metric: its mean, then how many rows were scored, abstained, failed (of all)
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["metric", "mean"])
    assert lines[header].split()[2:5] == ["scored", "abstained", "failed"]
    assert lines[header + 1].split() == ["correctness", "4.0000", "2", "0", "0", "(2)"]
    assert "MLflow run" in out and out.index("correctness") < out.index("precision_at_")
    exp = mlflow.get_experiment_by_name("cli-exp")
    runs = MlflowClient().search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "variant-a"
    m = runs[0].data.metrics
    assert m["correctness/mean"] == 4 and m["correctness/mean/a"] == 4
    assert m["precision_at_1/mean"] == 0.5 and m["recall_at_2/mean"] == 0.5
    assert runs[0].info.run_id in out


def test_cli_csv_with_json_list_columns(tmp_path, tmp_tracking, capsys):
    df = pd.DataFrame({"question": ["q"], "answer": ["alpha beta"], "reference": ["alpha gamma"],
                       "contexts": [json.dumps(["alpha gamma delta"])]})
    path = tmp_path / "d.csv"
    df.to_csv(path, index=False)
    assert main(["evaluate", str(path), "--metrics", "lexical,retrieval", "--config", '{"bertscore": false}']) == 0
    out = capsys.readouterr().out
    assert "word_recall/mean" in out and "context_rougeL_recall/mean" in out


@pytest.mark.slow
def test_cli_bad_input_exits_2_with_the_fix(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "a"}), encoding="utf-8")
    assert main(["evaluate", str(path), "--metrics", "lexical"]) == 2
    err = capsys.readouterr().err
    assert "needs column(s) ['reference']" in err


def test_cli_unknown_provider(tmp_path, capsys, jsonl):
    assert main(["evaluate", str(jsonl), "--judge", "nosuch:/m", "--metrics", "correctness"]) == 2
    assert "unknown provider 'nosuch'" in capsys.readouterr().err


def _missing(tmp_path):
    return tmp_path / "missing.parquet"


def _jsonl_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "a", "reference": "r"}) + "\n", encoding="utf-8")
    return path


def _text_folder(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "_SUCCESS").write_text("")  # hidden from Spark, as are empty files: not the problem
    (folder / "a.txt").write_text("some notes\n" * 5, encoding="utf-8")
    return folder


def _empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


@pytest.mark.parametrize("make, says", [
    pytest.param(_missing, "No such file or directory: {path} (with --spark, DATA is a Parquet file", id="missing"),
    pytest.param(_jsonl_file, "{path} is not a Parquet file (a .jsonl file)", id="jsonl"),
    pytest.param(_text_folder, "{path} holds a file that is not Parquet: a.txt", id="folder-of-text"),
    pytest.param(_empty_folder, "{path} is a folder with no Parquet files in it", id="empty-folder"),
    pytest.param(lambda t: f"file://{_missing(t)}", "No such file or directory: {path}", id="file-uri"),
])
def test_a_bad_spark_path_exits_2_naming_it_before_spark_starts(tmp_path, capfd, monkeypatch, make, says):
    try:
        from pyspark.sql import SparkSession
    except ImportError:  # without the spark extra the path is still checked first
        pass
    else:
        def no_session(self):
            raise AssertionError("a Spark session was started for a path that cannot be read")

        monkeypatch.setattr(SparkSession.Builder, "getOrCreate", no_session)
    path = str(make(tmp_path))
    code = main(["evaluate", path, "--spark", "--metrics", "correctness", "--no-cache"])
    err = capfd.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert says.format(path=path) in err
    assert "Traceback" not in err and "org.apache" not in err


@pytest.mark.slow
def test_quickstart_subprocess(tmp_path):
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'qs.db'}")
    proc = subprocess.run([sys.executable, "-m", "mlflow_ragjudge", "quickstart"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "correctness=" in proc.stdout and "map=" in proc.stdout and "comparison against" in proc.stdout
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    exp = mlflow.get_experiment_by_name("ragjudge-quickstart")
    runs = MlflowClient().search_runs([exp.experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 3 and all(r.data.params["ragjudge.judge"] == "offline:/lexical" for r in children)
