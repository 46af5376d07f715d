"""What a user sees of a sweep's judgments in MLflow 3's UI (issue 28), on a real `mlflow server` in headless
Chromium: a variant's Traces tab lists its rows with one column per metric, and the Evaluation runs page, asked to
compare a variant to the baseline run, lines the two variants' rows up with both values of each metric."""

from __future__ import annotations

import re

import mlflow
import pytest
from mlflow_ui import CLOSE_ASSISTANT, browse, chromium_path, start_server

from mlflow_ragjudge import sweep
from mlflow_ragjudge.workflows import example_rag

pytestmark = pytest.mark.slow

METRICS = ["correctness", "faithfulness", "context_recall"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory, fresh_tracking_uri):
    if chromium_path() is None:
        pytest.skip("chromium is not installed (apt-get install chromium): this test reads the MLflow UI")
    workdir = tmp_path_factory.mktemp("traces-ui")
    fresh_tracking_uri(workdir / "mlflow.db")
    proc, url = start_server(workdir)
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", url)
    mp.setenv("RAGJUDGE_CACHE_DIR", str(workdir / "cache"))
    try:
        result = sweep(example_rag.answer, [{"chunk_size": 64, "top_k": 3}, {"chunk_size": 8, "top_k": 1}],
                       example_rag.sample_questions().head(10), retriever=example_rag.retrieve,
                       experiment="ui-traces", tracking_uri=url, run_name="ui-traces-sweep",
                       evaluator_config={"judge": "offline:/lexical", "progress": False, "metrics": METRICS})
        eid = mlflow.get_experiment_by_name("ui-traces").experiment_id
        yield url, eid, result
    finally:
        mp.undo()
        proc.terminate()
        proc.wait(timeout=30)


def _text(dom: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


def test_a_variants_traces_tab_shows_every_row_with_its_assessments(swept):
    url, eid, result = swept
    name = [n for n in result.run_ids if n != result.baseline][0]
    dom = browse(f"{url}/#/experiments/{eid}/runs/{result.run_ids[name]}/traces", clicks=(CLOSE_ASSISTANT,),
                 until=("context_recall", "faithfulness", "10 of 10"))
    text = _text(dom)
    assert "10 of 10" in text  # every row a trace
    assert "Assessments (3/3)" in text and "Expected output" in text
    for metric in ("context_recall", "faithfulness", "Correctness"):  # MLflow capitalises its built-in names
        assert metric in text
    question = example_rag.sample_questions()["question"].iloc[0]
    assert question[:30] in text  # the request column shows the question


def test_compare_to_baseline_lines_up_both_variants_values(swept):
    url, eid, result = swept
    base = result.run_ids[result.baseline]
    other_name = [n for n in result.run_ids if n != result.baseline][0]
    other = result.run_ids[other_name]
    dom = browse(f"{url}/#/experiments/{eid}/evaluation-runs?selectedRunUuid={other}&compareToRunUuid={base}",
                 clicks=(CLOSE_ASSISTANT,), until=("Comparing", "context_recall"))
    text = _text(dom)
    assert "Comparing" in text and other_name in text and result.baseline in text
    assert "context_recall" in text and "faithfulness" in text
    # each row shows the variant's value over the baseline's: context recall moves between the two variants here
    out_b, out_o = result.outputs[result.baseline], result.outputs[other_name]
    assert out_b is not None and out_o is not None
    mean_b = out_b.metrics["context_recall/mean"]
    mean_o = out_o.metrics["context_recall/mean"]
    assert mean_b != mean_o
    # the summary cell shows the selected run's mean and its difference to the baseline
    shown = f"{mean_o:.2g}".rstrip("0").rstrip(".")
    assert shown in text, (shown, text[:3000])
