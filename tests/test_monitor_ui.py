"""What a user sees of ``ragjudge monitor`` in the MLflow UI (issue 37), on a real `mlflow server` in headless
Chromium: the Traces tab of the app's own experiment lists the app's traces with the monitor's Feedback as columns
(next to the users' thumbs), each value the one attached to that trace; an opened trace shows the judge's Feedback
with its source and rationale. The judge is the independent schema-following model behind a local fake server."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import mlflow
import pytest
from compliant_model import CompliantModel
from fakellm import FakeLLMServer
from mlflow.entities import AssessmentSource, AssessmentSourceType, Document, SpanType
from mlflow_ui import (
    CLOSE_ASSISTANT,
    DISMISS_DETECT_ISSUES,
    EXPAND_ASSESSMENT,
    SHOW_ASSESSMENTS,
    browse,
    chromium_path,
)

from mlflow_ragjudge.cli import main
from mlflow_ragjudge.engine.identity import JUDGE_ID_KEY

pytestmark = pytest.mark.slow

METRICS = ("faithfulness", "context_relevance")
JUDGE_MODEL = "judge-m"
DOCS = {"returns": "Items can be returned within 30 days of delivery if they are unused and in their original box.",
        "shipping": "Standard shipping takes 3 to 5 business days; express shipping takes 1 business day."}
APP = {  # question -> (documents retrieved, the app's answer): supported answers and made-up ones
    "How many days do I have to return an item?": (["returns"], "Within 30 days of delivery, unused and boxed."),
    "Can an opened item be returned?": (["returns"], "Yes, opened items can be returned within 90 days."),
    "How long does standard shipping take?": (["shipping"], "Standard shipping takes 3 to 5 business days."),
    "Do you ship to Canada?": (["shipping"], "We ship to Canada for free."),
}
#: a trace's row in the Traces tab: its id (from the row's checkbox) and its cells' texts
ROWS = r"""Array.from(document.querySelectorAll('[role=row]')).map(row => {
  const box = row.querySelector('input[aria-label^="Select trace "]');
  return box ? {id: box.getAttribute('aria-label').replace('Select trace ', ''),
                cells: Array.from(row.querySelectorAll('[role=cell]')).map(c => c.innerText.trim())} : null;
}).filter(r => r)"""
HEADERS = "Array.from(document.querySelectorAll('[role=columnheader]')).map(h => h.innerText.trim())"


@pytest.fixture(scope="module")
def monitored(mlflow_server, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The app's traces on a real server, a user's thumbs on two of them, one ``ragjudge monitor`` pass."""
    if chromium_path() is None:
        pytest.skip("chromium is not installed (apt-get install chromium): this test reads the MLflow UI")
    mp = pytest.MonkeyPatch()
    judge = FakeLLMServer().start()
    judge.set_handler(CompliantModel("json_schema"))
    try:
        mp.setenv("MLFLOW_TRACKING_URI", mlflow_server)
        mp.setenv("OPENAI_API_KEY", "sk-judge")
        mp.setenv("RAGJUDGE_CACHE_DIR", str(tmp_path_factory.mktemp("monitor-ui-cache")))
        mlflow.set_tracking_uri(mlflow_server)
        name = f"support-bot-{uuid.uuid4().hex[:6]}"
        exp_id = mlflow.set_experiment(name).experiment_id

        @mlflow.trace(span_type=SpanType.RETRIEVER)
        def retrieve(query: str) -> list[Document]:
            return [Document(page_content=DOCS[d], metadata={"doc_uri": f"kb://{d}"}) for d in APP[query][0]]

        @mlflow.trace
        def support_bot(question: str) -> str:
            retrieve(question)
            return APP[question][1]

        ids = {}
        for question in APP:
            support_bot(question)
            ids[question] = mlflow.get_last_active_trace_id()
        mlflow.flush_trace_async_logging()
        user = AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="user-7")
        thumbs = {ids["How many days do I have to return an item?"]: True,
                  ids["Can an opened item be returned?"]: False}
        for trace_id, up in thumbs.items():
            mlflow.log_feedback(trace_id=trace_id, name="user_thumbs_up", value=up, source=user)

        assert main(["monitor", "--experiment", name, "--judge",
                     f"openai:/{JUDGE_MODEL}?base_url={judge.openai_base_url}", "--metrics", ",".join(METRICS),
                     "--settle", "0"]) == 0
        traces = mlflow.search_traces(locations=[exp_id], return_type="list", include_spans=False)
        feedback = {t.info.trace_id: {a.name: a for a in t.info.assessments
                                      if (a.metadata or {}).get(JUDGE_ID_KEY) and a.feedback is not None}
                    for t in traces}
        assert set(feedback) == set(ids.values())  # the app's own traces, no new one
        assert all(set(f) == set(METRICS) for f in feedback.values()), feedback
        yield {"url": mlflow_server, "experiment": exp_id, "ids": ids, "feedback": feedback, "thumbs": thumbs}
    finally:
        judge.stop()
        mp.undo()
        mlflow.tracking.fluent._active_experiment_id = None


def test_the_apps_traces_tab_shows_the_monitors_feedback_per_trace(monitored):
    url, exp = monitored["url"], monitored["experiment"]
    n = len(monitored["ids"])
    page = f"{url}/#/experiments/{exp}/traces"
    until = (*METRICS, "user_thumbs_up", f"{n} of {n}")
    shown = json.loads(browse(page, clicks=(CLOSE_ASSISTANT, DISMISS_DETECT_ISSUES), until=until,
                              script=f"{{headers: {HEADERS}, rows: {ROWS}}}", width=2200))
    headers, rows = shown["headers"], shown["rows"]
    # one column per metric of the monitor, next to the users' Feedback
    assert {*METRICS, "user_thumbs_up", "Input", "Output"} <= set(headers), headers
    assert {r["id"] for r in rows} == set(monitored["ids"].values())  # every trace of the app, and only those
    col = {name: headers.index(name) for name in (*METRICS, "user_thumbs_up", "Input")}
    for row in rows:
        cells = row["cells"]
        assert len(cells) == len(headers), (headers, cells)
        question = next(q for q, i in monitored["ids"].items() if i == row["id"])
        assert question in cells[col["Input"]]
        for metric in METRICS:  # the value the monitor attached to this trace (the UI shows at most 2 decimals)
            value = monitored["feedback"][row["id"]][metric].value
            assert float(cells[col[metric]]) == pytest.approx(float(value), abs=0.005), (metric, row, value)
        thumb = monitored["thumbs"].get(row["id"])
        assert cells[col["user_thumbs_up"]] == ("" if thumb is None else str(thumb))


def test_an_opened_trace_shows_the_judges_feedback_with_its_source_and_rationale(monitored):
    url, exp = monitored["url"], monitored["experiment"]
    trace_id = monitored["ids"]["Can an opened item be returned?"]
    fb = monitored["feedback"][trace_id]
    dom = browse(f"{url}/#/experiments/{exp}/traces?traceId={trace_id}",
                 clicks=(CLOSE_ASSISTANT, DISMISS_DETECT_ISSUES, SHOW_ASSESSMENTS), click_every=(EXPAND_ASSESSMENT,),
                 until=("Rationale", "user-7"),
                 script="document.querySelector('[role=dialog]').innerText")
    text = re.sub(r"\s+", " ", json.loads(dom))
    pane = text[text.index("Assessments"):]
    assert f"Feedback ({len(METRICS) + 1})" in pane  # the two judgments and the user's thumb
    for metric in METRICS:
        a = fb[metric]
        assert metric in pane
        assert a.source.source_type == "LLM_JUDGE" and a.source.source_id in pane  # the judge, named
        assert a.rationale and re.sub(r"\s+", " ", a.rationale)[:60] in pane  # its reasoning, as attached
    assert "user_thumbs_up" in pane and "user-7" in pane
