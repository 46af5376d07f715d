"""The evaluator against a real `mlflow server` over HTTP, and its runs in the real UI (headless Chromium)."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from mlflow_ui import chromium, chromium_path, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory, fresh_tracking_uri):
    workdir = tmp_path_factory.mktemp("mlflow-server")
    fresh_tracking_uri(workdir / "mlflow.db")  # an initialised store: the server need not migrate a new one
    proc, url = start_server(workdir)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def _data(answers):
    return pd.DataFrame({
        "question": ["What does UNION do?", "What does UNION ALL do?", "What does EXCEPT do?"],
        "answer": answers,
        "reference": ["UNION removes duplicate rows.", "UNION ALL keeps duplicate rows.",
                      "EXCEPT returns rows of the first query missing from the second."],
    })


def test_runs_logged_over_http_and_compared_in_the_ui(server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    mlflow.set_tracking_uri(server)
    exp = mlflow.set_experiment("ui-compare")
    variants = {
        "variant-weak": ["UNION keeps duplicates.", "I am not sure.", "It joins tables."],
        "variant-strong": ["UNION removes duplicate rows.", "UNION ALL keeps duplicate rows.",
                           "EXCEPT returns rows of the first query missing from the second."],
    }
    run_ids = {}
    for name, answers in variants.items():
        with mlflow.start_run(run_name=name) as run:
            mlflow.models.evaluate(data=_data(answers), predictions="answer", targets="reference", model_type="rag",
                                   evaluators="ragjudge",
                                   evaluator_config={"judge": "offline:/lexical", "cache": False, "bertscore": False,
                                                     "metrics": ["correctness", "lexical"]})
        run_ids[name] = run.info.run_id
    client = MlflowClient(server)
    weak, strong = (client.get_run(run_ids[n]).data.metrics for n in ("variant-weak", "variant-strong"))
    assert strong["correctness/mean"] == 5 and weak["correctness/mean"] < strong["correctness/mean"]
    assert weak["correctness/abstain_rate"] == pytest.approx(1 / 3)
    # the artifacts went through the server's artifact proxy
    files = {f.path for f in client.list_artifacts(run_ids["variant-weak"], "ragjudge")}
    assert {"ragjudge/eval_results_table.json", "ragjudge/judge_transcripts.jsonl", "ragjudge/config.json"} <= files

    if chromium_path() is None:
        pytest.skip("chromium is not installed (apt-get install chromium): the UI half of this test needs it")
    ids = json.dumps(list(run_ids.values())).replace(" ", "")
    dom = chromium(f"{server}/#/compare-runs?runs={ids}&experiments={json.dumps([exp.experiment_id])}")
    # the React UI rendered both runs and our metrics into the page
    assert "variant-weak" in dom and "variant-strong" in dom
    assert "correctness/mean" in dom and "ragjudge.context_mode" in dom


def test_a_sweep_over_http_and_its_parent_and_children_in_the_ui(server, monkeypatch, tmp_path):
    from mlflow_ui import CLOSE_ASSISTANT, EXPAND_PARENT_RUN, browse

    from mlflow_ragjudge import example_rag, sweep

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    monkeypatch.setenv("RAGJUDGE_CACHE_DIR", str(tmp_path / "cache"))
    result = sweep(example_rag.answer, [{"chunk_size": 64, "top_k": 3}, {"chunk_size": 8, "top_k": 1}],
                   example_rag.sample_questions(), retriever=example_rag.retrieve, experiment="ui-sweep",
                   evaluator_config={"judge": "offline:/lexical", "bertscore": False, "progress": False},
                   tracking_uri=server, run_name="ui-sweep-parent")
    client = MlflowClient(server)
    files = {f.path for f in client.list_artifacts(result.parent_run_id, "ragjudge")}
    assert "ragjudge/comparison.json" in files and "ragjudge/plots" in files
    if chromium_path() is None:
        pytest.skip("chromium is not installed (apt-get install chromium): the UI half of this test needs it")
    exp = mlflow.get_experiment_by_name("ui-sweep").experiment_id
    runs = browse(f"{server}/#/experiments/{exp}/runs", clicks=(CLOSE_ASSISTANT, EXPAND_PARENT_RUN),
                  ready=("ui-sweep-parent",), until=("chunk_size=64, top_k=3", "chunk_size=8, top_k=1"))
    # the parent run, expanded, lists both children by name
    assert "ui-sweep-parent" in runs and "chunk_size=64, top_k=3" in runs and "chunk_size=8, top_k=1" in runs
    page = browse(f"{server}/#/experiments/{exp}/runs/{result.parent_run_id}/artifacts/ragjudge/comparison.json",
                  until=("mean_diff",))
    assert "mean_diff" in page and "p_holm" in page and "correctness" in page
