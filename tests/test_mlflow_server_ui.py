"""The evaluator against a real `mlflow server` over HTTP, and its runs in the real UI (headless Chromium)."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from mlflow_ui import chromium, chromium_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(mlflow_server):
    return mlflow_server


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


#: per run-name cell of the runs table: its text and whether the cell cuts it (text wider than the room it has)
RUN_NAME_CELLS = r"""Array.from(document.querySelectorAll('[col-id="attributes.`Run Name`"].ag-cell')).map(cell => {
  const a = cell.querySelector('a'); if (!a) return null;
  let cut = false;
  for (let e = a.querySelector('span') || a; e && e !== cell.parentElement; e = e.parentElement)
    if (e.scrollWidth > e.clientWidth + 1) cut = true;
  return {name: a.textContent, cut}; }).filter(x => x)"""
#: the parallel-coordinates plot's selected parameters and metrics on the compare-runs page
PARALLEL_SELECTION = r"""Object.fromEntries(['Parameters:', 'Metrics:'].map(label => {
  const head = Array.from(document.querySelectorAll('div')).find(d => d.textContent === label);
  const box = head ? head.nextElementSibling : null;
  return [label, box ? Array.from(box.querySelectorAll('[class$="select-selection-item-content"]'))
                        .map(e => e.textContent) : null]; }))"""
#: the section headers of the experiment's chart view, in order
CHART_SECTIONS = r"""Array.from(document.querySelectorAll(
  '[data-testid="experiment-view-compare-runs-section-header"]')).map(h => h.textContent)"""


def test_a_sweep_over_http_and_its_parent_and_children_in_the_ui(server, monkeypatch, tmp_path):
    """What a user sees of a sweep in the MLflow 3.17 UI: each variant's name whole in the runs table, the
    compare-runs page's parallel coordinates opened on the headline metric (not on a constant bookkeeping metric),
    the chart view's first section the headline metrics, the comparison table with the variant first."""
    from mlflow_ui import CLOSE_ASSISTANT, EXPAND_PARENT_RUN, browse

    from mlflow_ragjudge import sweep
    from mlflow_ragjudge.workflows import example_rag

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    monkeypatch.setenv("RAGJUDGE_CACHE_DIR", str(tmp_path / "cache"))
    result = sweep(example_rag.answer, [{"chunk_size": 64, "top_k": 3}, {"chunk_size": 8, "top_k": 1}],
                   example_rag.sample_questions(), retriever=example_rag.retrieve, experiment="ui-sweep",
                   evaluator_config={"judge": "offline:/lexical", "bertscore": False, "progress": False},
                   tracking_uri=server, run_name="ui-sweep-parent")
    names = list(result.run_ids)
    assert names == ["cs=64,top_k=3", "cs=8,top_k=1"]
    client = MlflowClient(server)
    files = {f.path for f in client.list_artifacts(result.parent_run_id, "ragjudge")}
    assert "ragjudge/comparison.json" in files and "ragjudge/plots" in files
    # over HTTP too, the store lists the headline means first (what the UI's parallel coordinates open on)
    assert list(client.get_run(result.run_ids[names[0]]).data.metrics)[:2] == [
        "_headline/correctness", "_headline/faithfulness"]
    if chromium_path() is None:
        pytest.skip("chromium is not installed (apt-get install chromium): the UI half of this test needs it")
    exp = mlflow.get_experiment_by_name("ui-sweep").experiment_id
    cells = json.loads(browse(f"{server}/#/experiments/{exp}/runs", clicks=(CLOSE_ASSISTANT, EXPAND_PARENT_RUN),
                              ready=("ui-sweep-parent",), until=tuple(names), script=RUN_NAME_CELLS))
    shown = {c["name"]: c["cut"] for c in cells}
    # the parent run, expanded, lists both children, each name whole (the names of before were cut: "chunk_size=8, t…")
    assert "ui-sweep-parent" in shown and all(n in shown and shown[n] is False for n in names), cells
    ids = json.dumps(list(result.run_ids.values())).replace(" ", "")
    chosen = json.loads(browse(f"{server}/#/compare-runs?runs={ids}&experiments={json.dumps([exp])}",
                               until=("_headline/correctness",), script=PARALLEL_SELECTION))
    # the parallel coordinates open on the headline metric (before: generation/failed_rate, 0 for every variant)
    assert chosen["Metrics:"] == ["_headline/correctness"]
    assert chosen["Parameters:"] == ["variant.chunk_size", "variant.top_k"]  # the parameters, no name axis
    sections = json.loads(browse(f"{server}/#/experiments/{exp}/runs?compareRunsMode=CHART",
                                 clicks=(CLOSE_ASSISTANT, EXPAND_PARENT_RUN), until=("_headline/correctness",),
                                 script=CHART_SECTIONS))
    # the chart view opens on the headline means (before: citation_validity, correctness 23rd of 91 sections)
    assert sections and sections[0].startswith("_headline(2)"), sections[:3]
    page = browse(f"{server}/#/experiments/{exp}/runs/{result.parent_run_id}/artifacts/ragjudge/comparison.json",
                  until=("mean_diff",))
    assert "mean_diff" in page and "p_holm" in page and "correctness" in page
    assert page.index(">variant<") < page.index(">metric<") < page.index(">baseline<")  # the variant column first
