"""Issue 40, case 15: review queues and label files under hostile use. Each test is named after its case; each failed
on the main branch before the fix (a traceback, an empty queue left behind, an uncalibratable metric accepted, an
empty line and exit 0, an error naming neither the file nor the fix)."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest
from mlflow.genai import review_queues
from test_traces import _offline_run

from mlflow_ragjudge.cli import main


@pytest.fixture
def run_id(tmp_tracking):
    """A run of the offline judge's correctness on 40 rows, logged with its traces (one judge Feedback each)."""
    return _offline_run(40)[0]


def _queues(run_id: str) -> list:
    exp = mlflow.get_run(run_id).info.experiment_id
    return list(review_queues.list_review_queues(experiment_id=exp))


def _queue(args: list[str], capsys) -> tuple[int, str]:
    code = main(["label-sample", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_case_15_second_review_queue_with_the_same_seed_reuses_the_draw(run_id, capsys):
    code, first = _queue([run_id, "--review-queue", "--metrics", "correctness", "--n", "6", "--seed", "1"], capsys)
    assert code == 0 and "review queue" in first
    code, again = _queue([run_id, "--review-queue", "--metrics", "correctness", "--n", "6", "--seed", "1"], capsys)
    assert code == 0 and "already held this draw" in again
    queues = _queues(run_id)
    assert len(queues) == 1 and len(review_queues.list_review_queue_items(queues[0].queue_id)) == 6
    # the same queue name asked to hold another draw (more traces) is refused, and left as it is
    code, other = _queue([run_id, "--review-queue", "--metrics", "correctness", "--n", "9", "--seed", "1"], capsys)
    assert code == 2 and "already exists" in other and "another --seed" in other and "Traceback" not in other
    assert len(review_queues.list_review_queue_items(queues[0].queue_id)) == 6


def test_case_15_review_queue_of_zero_traces_is_refused_and_leaves_no_empty_queue(run_id, capsys):
    code, text = _queue([run_id, "--review-queue", "--metrics", "correctness", "--n", "0"], capsys)
    assert code == 2 and "n=0" in text and ">= 1" in text
    assert _queues(run_id) == []
    code, _ = _queue([run_id, "--review-queue", "--metrics", "correctness", "--n", "5"], capsys)
    assert code == 0 and len(_queues(run_id)) == 1  # the next draw works


def test_case_15_an_empty_queue_left_by_an_old_failure_is_filled_not_a_dead_end(run_id, capsys):
    from mlflow.genai import label_schemas

    exp = mlflow.get_run(run_id).info.experiment_id
    schema = label_schemas.create_label_schema("correctness", type="feedback",
                                               input=label_schemas.InputNumeric(min_value=0, max_value=5),
                                               instruction="yours", experiment_id=exp)
    review_queues.create_review_queue(f"ragjudge-{run_id[:8]}-seed0", queue_type="custom",
                                      schema_ids=[schema.schema_id], experiment_id=exp)  # as n=0 left it before
    code, text = _queue([run_id, "--review-queue", "--metrics", "correctness", "--n", "5"], capsys)
    assert code == 0 and "now holds the draw" in text
    assert len(review_queues.list_review_queue_items(_queues(run_id)[0].queue_id)) == 5


@pytest.mark.parametrize("metric, message", [
    ("precision_at_5", "computed exactly, not judged"),
    ("bogus_metric", "has a judge's score named 'bogus_metric'"),
])
def test_case_15_metrics_that_cannot_be_calibrated_are_refused_before_a_queue(run_id, capsys, metric, message):
    code, text = _queue([run_id, "--review-queue", "--metrics", metric], capsys)
    assert code == 2 and message in text
    if metric == "bogus_metric":
        assert "the traces carry correctness" in text  # what can be labelled instead
    assert _queues(run_id) == []


def test_case_15_label_sample_out_into_a_missing_folder_makes_it(run_id, tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "labels.csv"
    code, text = _queue([run_id, "--out", str(out), "--n", "5"], capsys)
    assert code == 0 and out.is_file() and len(pd.read_csv(out)) == 5


@pytest.mark.parametrize("name, fix", [("labels.txt", ".csv, .jsonl or .xlsx"), ("", "is a folder")])
def test_case_15_label_sample_out_that_cannot_be_written_is_refused_before_the_draw(run_id, tmp_path, capsys, name,
                                                                                     fix):
    out = tmp_path / name if name else tmp_path
    code, text = _queue([run_id, "--out", str(out), "--n", "5"], capsys)
    assert code == 2 and fix in text and "Traceback" not in text
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(run_id, "ragjudge")}
    assert "ragjudge/label_sample.json" not in logged  # nothing recorded in the run: the draw never happened


def test_case_15_label_sample_never_overwrites_a_file_that_may_hold_labels(run_id, tmp_path, capsys):
    path = tmp_path / "labels.csv"
    assert main(["label-sample", run_id, "--out", str(path), "--n", "5"]) == 0
    path.write_text(path.read_text(encoding="utf-8") + "# a person's work\n", encoding="utf-8")
    before = path.read_bytes()
    code, text = _queue([run_id, "--out", str(path), "--n", "5", "--seed", "9"], capsys)
    assert code == 2 and "exists" in text and path.read_bytes() == before


def test_case_15_calibrate_with_a_file_holding_no_labels_is_an_error_naming_it(run_id, tmp_path, capsys):
    path = tmp_path / "labels.csv"
    assert main(["label-sample", run_id, "--out", str(path), "--n", "35"]) == 0  # written, never filled in
    capsys.readouterr()
    assert main(["calibrate", run_id, "--labels", str(path)]) == 2
    text = capsys.readouterr().err
    assert str(path) in text and "holds no label" in text and "Fill in" in text
    assert "correctness/ppi_mean" not in mlflow.get_run(run_id).data.metrics


def _filled(run_id: str, tmp_path) -> pd.DataFrame:
    path = tmp_path / "drawn.csv"
    assert main(["label-sample", run_id, "--out", str(path), "--n", "35"]) == 0
    frame = pd.read_csv(path, dtype=str)
    frame["correctness"] = ["5" if i % 3 else "2" for i in range(len(frame))]
    return frame


def test_case_15_torn_jsonl_labels_name_the_file_the_line_and_the_fix(run_id, tmp_path, capsys):
    frame = _filled(run_id, tmp_path)
    lines = [json.dumps(r) for r in frame.to_dict(orient="records")]
    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(lines[:10]) + "\n" + lines[10][: len(lines[10]) // 2], encoding="utf-8")  # torn
    capsys.readouterr()
    assert main(["calibrate", run_id, "--labels", str(path)]) == 2
    text = capsys.readouterr().err
    assert str(path) in text and "line 11" in text and "one JSON object per line" in text


def test_case_15_utf16_csv_labels_from_a_spreadsheet_are_read(run_id, tmp_path, capsys):
    """A spreadsheet's "Unicode text" export: UTF-16 with a byte-order mark, tab-separated. It is read as the labels
    it holds (before, an error naming neither the file nor the fix)."""
    frame = _filled(run_id, tmp_path)
    path = tmp_path / "labels.csv"
    path.write_text(frame.to_csv(index=False, sep="\t"), encoding="utf-16")
    capsys.readouterr()
    assert main(["calibrate", run_id, "--labels", str(path)]) == 0
    assert "calibrated" in capsys.readouterr().out
    assert "correctness/ppi_mean" in mlflow.get_run(run_id).data.metrics


def test_case_15_undecodable_labels_name_the_file_and_the_fix(run_id, tmp_path, capsys):
    path = tmp_path / "labels.csv"
    path.write_bytes(b"row_id,correctness\n\xff\xfa\xfb,5\n")  # neither UTF-8 nor announced by a byte-order mark
    assert main(["calibrate", run_id, "--labels", str(path)]) == 2
    text = capsys.readouterr().err
    assert str(path) in text and "not UTF-8" in text and "save it as .csv (UTF-8" in text


def test_case_15_label_sample_of_a_run_without_a_ragjudge_table_is_an_error_not_a_traceback(tmp_tracking, tmp_path,
                                                                                             capsys):
    """An mlflow.genai.evaluate run that a review queue was drawn from: a ragjudge/ folder, no per-row table (before,
    FileNotFoundError's traceback)."""
    with mlflow.start_run() as run:
        mlflow.log_dict({"seed": 0, "trace_ids": []}, "ragjudge/label_sample.json")
    code, text = _queue([run.info.run_id, "--out", str(tmp_path / "l.csv")], capsys)
    assert code == 2 and "no ragjudge per-row table" in text and "--review-queue" in text
