"""Monitor a small traced app on a real local `mlflow server` and screenshot what the MLflow UI shows of it (docs/img).

Usage (needs Debian's chromium: `apt-get install chromium`):

    .venv/bin/python scripts/screenshot_monitor.py [--out-dir docs/img]

A small RAG app (an ``@mlflow.trace`` function with a RETRIEVER span; some answers say what the documents say, some
do not) logs traces to the experiment ``support-bot``; people leave HUMAN Feedback on a few of them (a thumbs-up /
down ``user_thumbs_up``, and a reviewer's ``faithfulness`` label); ``ragjudge monitor --experiment support-bot``
(the offline judge, ``offline:/lexical``, so no LLM server; ``--settle 0``) runs a pass after each of three batches of
traces (6, 3 and 3), each pass judging only the new ones. Writes (the MLflow UI routes in brackets):

* ``monitor-traces-tab.png`` (``#/experiments/<id>/traces``): the experiment's Traces tab, the app's 12 traces with
  the monitor's ``context_relevance`` and ``faithfulness`` columns next to the users' ``user_thumbs_up``;
* ``monitor-trace-feedback.png`` (``#/experiments/<id>/traces?traceId=<trace>``, "Assess" opened, each Feedback
  expanded): the trace the reviewer labelled, the judge's Feedback (source ``offline:/lexical``, a code icon, with its
  rationale) next to the reviewer's and the user's;
* ``monitor-trend.png`` (``#/experiments/<id>/runs/<monitor run>/model-metrics``): the monitor's run,
  ``context_relevance/mean`` and ``faithfulness/mean`` over the passes (step = pass).

Everything runs on 127.0.0.1; the server and its store live in a temp dir and are removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from mlflow_ui import (  # noqa: E402
    CLOSE_ASSISTANT,
    DISMISS_DETECT_ISSUES,
    EXPAND_ASSESSMENT,
    SHOW_ASSESSMENTS,
    TOGGLE_SIDEBAR,
    browse,
    start_server,
)

EXPERIMENT = "support-bot"
METRICS = "faithfulness,context_relevance"
#: the app's knowledge base: doc id -> text
DOCS = {
    "refunds": "Refunds are issued to the original payment method within 14 days of the return being received.",
    "shipping": "Standard shipping takes 3 to 5 business days; express shipping takes 1 business day.",
    "warranty": "Every laptop comes with a two-year warranty covering manufacturing defects, not accidental damage.",
    "returns": "Items can be returned within 30 days of delivery if they are unused and in their original box.",
    "support": "Phone support is open Monday to Friday from 9 am to 6 pm Central European Time.",
}
#: what the app retrieves and answers for each question, in the order users ask, one batch per monitor pass: some
#: answers say what the documents say, some do not
BATCHES = [
    {
        "How long do refunds take to be issued?": (["refunds", "returns"], "Refunds are issued to the original "
                                                   "payment method within 14 days of the return being received."),
        "How long does standard shipping take?": (["shipping"], "Standard shipping takes 3 to 5 business days."),
        "Does the laptop warranty cover accidental damage?": (["warranty"], "No: the two-year warranty covers "
                                                              "manufacturing defects, not accidental damage."),
        "Can an opened item be returned?": (["returns"], "Yes, opened items can be returned within 90 days for "
                                            "store credit."),
        "When is phone support open?": (["support"], "Phone support is open Monday to Friday from 9 am to 6 pm CET."),
        "Do you offer express shipping?": (["shipping"], "Yes: express shipping takes 1 business day."),
    },
    {
        "Do you ship to Canada?": (["shipping"], "We ship to Canada for free, with a tracking number on every "
                                   "parcel."),
        "How long is the laptop warranty?": (["warranty", "refunds"], "Every laptop comes with a two-year warranty "
                                             "covering manufacturing defects."),
        "Can I get my refund in cash?": (["refunds"], "Yes, refunds are paid in cash at any of our stores the same "
                                         "day."),
    },
    {
        "How many days do I have to return an item?": (["returns"], "Items can be returned within 30 days of "
                                                       "delivery if unused and in their original box."),
        "Is phone support open on weekends?": (["support"], "Phone support is open around the clock, weekends "
                                               "included."),
        "What does the laptop warranty cover?": (["warranty"], "The two-year warranty covers manufacturing "
                                                 "defects, not accidental damage."),
    },
]
ANSWERS = {q: a for batch in BATCHES for q, a in batch.items()}


def log_app_traces(questions: list[str]) -> list[str]:
    """Users ask the app: one trace per question, a RETRIEVER span in it; returns the trace ids in order."""
    import mlflow
    from mlflow.entities import Document, SpanType

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(query: str) -> list[Document]:
        return [Document(page_content=DOCS[i], metadata={"doc_uri": f"kb://{i}"}) for i in ANSWERS[query][0]]

    @mlflow.trace
    def support_bot(question: str) -> str:
        retrieve(question)
        return ANSWERS[question][1]

    trace_ids = []
    for question in questions:
        support_bot(question)
        trace_id = mlflow.get_last_active_trace_id()
        assert trace_id is not None
        trace_ids.append(trace_id)
    mlflow.flush_trace_async_logging()
    return trace_ids


def human_feedback(trace_ids: list[str]) -> str:
    """People's Feedback on a few traces of the first batch: users' thumbs up / down, and a reviewer's faithfulness
    label; returns the trace the reviewer labelled."""
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    def person(who: str) -> AssessmentSource:
        return AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=who)

    mlflow.log_feedback(trace_id=trace_ids[0], name="user_thumbs_up", value=True, source=person("user-1042"))
    mlflow.log_feedback(trace_id=trace_ids[2], name="user_thumbs_up", value=True, source=person("user-0318"))
    mlflow.log_feedback(trace_id=trace_ids[3], name="user_thumbs_up", value=False, source=person("user-2211"),
                        rationale="The store told me opened items can't be returned.")
    mlflow.log_feedback(trace_id=trace_ids[3], name="faithfulness", value=0, source=person("reviewer-17"),
                        rationale="The documents say 30 days, unused, in the original box; the answer says 90 days, "
                                  "opened.")
    return trace_ids[3]


def monitor(url: str) -> None:
    """One pass of ``ragjudge monitor``, run as a user runs it."""
    subprocess.run([sys.executable, "-m", "mlflow_ragjudge", "monitor", "--experiment", EXPERIMENT,
                    "--judge", "offline:/lexical", "--metrics", METRICS, "--settle", "0", "--tracking-uri", url],
                   check=True, env=dict(os.environ, MLFLOW_TRACKING_URI=url))


def setup(url: str) -> dict[str, str]:
    """The app's traces, people's Feedback, and a monitor pass after each batch of traces; returns the experiment,
    the trace the reviewer labelled and the monitor's run."""
    import mlflow

    mlflow.set_tracking_uri(url)
    exp_id = mlflow.set_experiment(EXPERIMENT).experiment_id
    labelled = ""
    for i, batch in enumerate(BATCHES):
        trace_ids = log_app_traces(list(batch))
        if i == 0:
            labelled = human_feedback(trace_ids)
        monitor(url)
    runs = mlflow.search_runs([exp_id], filter_string="tags.`ragjudge.kind` = 'monitor_pass'", output_format="list")
    assert len(runs) == len(BATCHES), [r.info.run_name for r in runs]
    return {"experiment": exp_id, "trace": labelled, "monitor_run": runs[0].data.tags["ragjudge.monitor.parent"]}


def screenshots(url: str, ids: dict[str, str], out: Path) -> list[Path]:
    exp = ids["experiment"]
    shots = [out / "monitor-traces-tab.png", out / "monitor-trace-feedback.png", out / "monitor-trend.png"]
    # (a) the app's traces with the monitor's Feedback as columns, next to the users' thumbs
    browse(f"{url}/#/experiments/{exp}/traces", clicks=(CLOSE_ASSISTANT, DISMISS_DETECT_ISSUES, TOGGLE_SIDEBAR),
           until=("context_relevance", "faithfulness", "user_thumbs_up", "12 of 12"), screenshot=shots[0],
           width=2000, height=820)
    # (b) the trace a reviewer labelled, opened: the judge's Feedback (rationale, source) next to the person's
    browse(f"{url}/#/experiments/{exp}/traces?traceId={ids['trace']}",
           clicks=(CLOSE_ASSISTANT, DISMISS_DETECT_ISSUES, SHOW_ASSESSMENTS),
           click_every=(EXPAND_ASSESSMENT,), until=("Rationale", "offline:/lexical", "reviewer-17"),
           screenshot=shots[1], width=1800, height=1420)
    # (c) the monitor's run: each pass's means as a series (step = pass)
    browse(f"{url}/#/experiments/{exp}/runs/{ids['monitor_run']}/model-metrics",
           clicks=(CLOSE_ASSISTANT, TOGGLE_SIDEBAR), until=("faithfulness/mean", "context_relevance/mean"),
           screenshot=shots[2], width=1100, height=1250)
    return shots


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default="docs/img")
    args = ap.parse_args()
    out = Path(args.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RAGJUDGE_CACHE_DIR"] = str(Path(tmp) / "cache")
        proc, url = start_server(Path(tmp))
        try:
            shots = screenshots(url, setup(url), out)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print("wrote " + ", ".join(str(p) for p in shots))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
