"""Logging an evaluation again into a run that holds one (``ragjudge log-saved FOLDER --run-id RUN``, or
``log_output`` twice) replaces what the run holds instead of adding to it: ``mlflow.log_table`` appends to a table
artifact of the same name, so the per-row table of a 6-row evaluation logged twice had 12 rows (on MLflow 3.17.2
and 3.18.0), and so did the meta-evaluation table (docs/failure-modes.md, "Results are safe before they are
logged")."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from mlflow_ragjudge import load_output
from mlflow_ragjudge.adapters.run_log import META_FILE, TABLE_FILE, log_output, save_local
from mlflow_ragjudge.adapters.tracking import load_run_table
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.engine.evaluate import evaluate_frame
from mlflow_ragjudge.workflows import example_rag
from mlflow_ragjudge.workflows.compare import COMPARISON_FILE, compare_runs

N_ROWS = 6


def _offline_evaluation() -> object:
    """A 6-row evaluation by the offline judge, with a human column so that it has a meta-evaluation table too."""
    frame = example_rag.sample_questions().head(N_ROWS).reset_index(drop=True)
    outs = [example_rag.answer(q) for q in frame["question"]]
    frame["answer"] = [o["answer"] for o in outs]
    frame["contexts"] = [o["contexts"] for o in outs]
    frame["expert"] = [1, 5, 2, 4, 3, 5]
    return evaluate_frame(frame, {"judge": "offline:/lexical", "progress": False, "human_columns": ["expert"],
                                  "metrics": ["correctness", "faithfulness", "lexical"], "n_boot": 0})


def _logged_tables(run_id: str) -> list[str]:
    tag = MlflowClient().get_run(run_id).data.tags.get("mlflow.loggedArtifacts", "[]")
    return [a["path"] for a in json.loads(tag) if a.get("type") == "table"]


def _snapshot(run_id: str) -> dict[str, object]:
    out = load_output(run_id)
    return {"table": load_run_table(run_id, TABLE_FILE), "meta": load_run_table(run_id, META_FILE),
            "transcripts": out.transcripts, "output_table": out.table, "tables": _logged_tables(run_id)}


def test_log_saved_into_the_same_run_twice_leaves_one_copy_of_every_table(tmp_tracking, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAGJUDGE_OUTPUT_DIR", str(tmp_path / "outputs"))
    out = _offline_evaluation()
    assert out.meta is not None and len(out.table) == N_ROWS
    folder = save_local(out, "relog")
    run_id = MlflowClient().create_run("0").info.run_id
    args = ["log-saved", str(folder), "--run-id", run_id, "--tracking-uri", tmp_tracking]

    assert main(args) == 0, capsys.readouterr().err
    first = _snapshot(run_id)
    assert len(first["table"]) == N_ROWS and len(first["output_table"]) == N_ROWS
    assert sorted(first["tables"]) == sorted([TABLE_FILE, META_FILE])

    assert main(args) == 0, capsys.readouterr().err  # the same folder into the same run again
    again = _snapshot(run_id)
    assert len(again["table"]) == N_ROWS, f"the per-row table has {len(again['table'])} rows after logging twice"
    pd.testing.assert_frame_equal(again["table"], first["table"])
    pd.testing.assert_frame_equal(again["output_table"], first["output_table"])
    pd.testing.assert_frame_equal(again["meta"], first["meta"])
    assert again["transcripts"] == first["transcripts"]
    assert again["tables"] == first["tables"], "mlflow.loggedArtifacts lists each table once"
    # MLflow's own reader -- what its evaluation view reads through the tag -- finds the table, once
    eid = MlflowClient().get_run(run_id).info.experiment_id
    assert len(MlflowClient().load_table(eid, TABLE_FILE, run_ids=[run_id])) == N_ROWS
    # and the local save's table is what the run holds
    saved = json.loads((folder / "eval_results_table.json").read_text(encoding="utf-8"))
    assert again["table"]["question"].tolist() == [row[0] for row in saved["data"]]


def test_metrics_logged_again_with_the_same_values_stay_one_point(tmp_tracking, tmp_path, monkeypatch, capsys):
    """A metric logged again at the same step gets a second point in its history (MLflow keeps both); re-logging
    the same evaluation adds none, a changed value still gets its point."""
    monkeypatch.setenv("RAGJUDGE_OUTPUT_DIR", str(tmp_path / "outputs"))
    out = _offline_evaluation()
    folder = save_local(out, "relog")
    run_id = MlflowClient().create_run("0").info.run_id
    for _ in range(2):
        assert main(["log-saved", str(folder), "--run-id", run_id, "--tracking-uri", tmp_tracking]) == 0
    client = MlflowClient()
    assert client.get_run(run_id).data.metrics == pytest.approx(out.metrics)
    histories = {k: len(client.get_metric_history(run_id, k)) for k in out.metrics}
    assert set(histories.values()) == {1}, {k: n for k, n in histories.items() if n != 1}
    out.metrics["correctness/mean"] += 1
    log_output(out, run_id)
    assert [m.value for m in client.get_metric_history(run_id, "correctness/mean")] == pytest.approx(
        [out.metrics["correctness/mean"] - 1, out.metrics["correctness/mean"]])


@pytest.mark.inprocess_judge
def test_a_run_logged_again_with_another_evaluation_holds_that_evaluation_only(tmp_tracking, judge):
    """The second evaluation (4 rows, an LLM judge on the fake server, so with transcripts) replaces the first
    (6 rows, the offline judge) in the run: table, meta-evaluation table and transcripts are the second's."""
    out = _offline_evaluation()
    frame = out.table[["question", "answer", "reference"]].head(4).assign(
        contexts=[example_rag.answer(q)["contexts"] for q in out.table["question"].head(4)], expert=[1, 5, 2, 4])
    second = evaluate_frame(frame, {"judge": judge, "progress": False, "metrics": ["correctness"],
                                    "human_columns": ["expert"], "n_boot": 0})
    assert second.meta is not None and second.transcripts
    with mlflow.start_run() as run:
        log_output(out, run.info.run_id)
    log_output(second, run.info.run_id)
    logged = load_output(run.info.run_id)
    assert logged.table["question"].tolist() == second.table["question"].tolist()
    assert len(logged.meta) == len(second.meta)
    assert [t["row"] for t in logged.transcripts] == [t["row"] for t in second.transcripts]


def test_a_comparison_logged_twice_into_a_run_is_replaced(tmp_tracking):
    runs = {}
    for name in ("a", "b"):
        with mlflow.start_run(run_name=name) as run:
            log_output(_offline_evaluation(), run.info.run_id)
        runs[name] = run.info.run_id
    with mlflow.start_run(run_name="comparison") as target:
        pass
    kwargs = {"metrics": ["correctness"], "n_boot": 200, "log_to": target.info.run_id, "plots": False}
    once = compare_runs(runs, **kwargs)
    compare_runs(runs, **kwargs)
    logged = load_run_table(target.info.run_id, COMPARISON_FILE)
    assert len(logged) == len(once) > 0
    assert _logged_tables(target.info.run_id) == [COMPARISON_FILE]


def test_a_logged_table_keeps_every_digit_of_its_numbers(tmp_tracking):
    """MLflow's log_table, which wrote the per-row table before, writes 10 decimal places: a p-value of 1.25e-12
    became 0.0. The table's writer keeps every digit, and writes infinity as null (``Infinity`` is not JSON)."""
    out = _offline_evaluation()
    values = [1.25e-12, 0.123456789012345, float("inf"), float("nan"), 1.0, -2.5]
    out.table["p"] = values
    out.table["text"] = ["日本語", "x", None, "a", "b", "c"]
    with mlflow.start_run() as run:
        log_output(out, run.info.run_id)
    table = load_run_table(run.info.run_id, TABLE_FILE)
    assert table["p"].iloc[:2].tolist() == values[:2] and table["p"].iloc[4:].tolist() == values[4:]
    assert table["p"].iloc[2:4].isna().all()
    assert table["text"].iloc[:2].tolist() == ["日本語", "x"] and table["text"].isna().iloc[2]
