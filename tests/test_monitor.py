"""``ragjudge monitor``: a traced app's own traces judged where they are. The app is traced by MLflow's autologging
of the real ``openai`` SDK (against a local fake server) or by ``@mlflow.trace``; the judge is the independent
schema-following model (it knows none of our prompts). On a SQLite store and on a real ``mlflow server``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pytest
from compliant_model import CompliantModel
from fakellm import FakeLLMServer
from mlflow.entities import AssessmentSource, Document, SpanType

from mlflow_ragjudge.cli import main
from mlflow_ragjudge.engine.identity import JUDGE_ID_KEY
from mlflow_ragjudge.engine.intervals import difference_interval
from mlflow_ragjudge.engine.ppi import ppi_mean
from mlflow_ragjudge.workflows.monitor import identify, monitor_pass, parse_every, parse_since

DOCS = [("d1", "Paris is the capital and the largest city of France."),
        ("d2", "The Seine flows through Paris before it reaches the sea.")]
APP_ANSWER = "Paris is the capital of France. It lies on the Seine."
JUDGE_MODEL = "judge-m"
METRICS = ("faithfulness", "context_relevance")

#: the process-level tests (signals, a killed process) do not depend on MLflow's version: the main suite runs them,
#: the MLflow-versions step (scripts/test_mlflow_versions.sh sets RAGJUDGE_EXPECT_MLFLOW) leaves them out
once_per_ci = pytest.mark.skipif(bool(os.environ.get("RAGJUDGE_EXPECT_MLFLOW")),
                                 reason="process-level: run once, in the main suite (not MLflow-version-specific)")


@pytest.fixture
def app_llm() -> Iterator[FakeLLMServer]:
    server = FakeLLMServer().start()
    server.set_handler(lambda request: APP_ANSWER)
    yield server
    server.stop()


@pytest.fixture
def judge_mode() -> str:
    return "json_schema"


@pytest.fixture
def judge_llm(monkeypatch, judge_mode, tmp_path) -> Iterator[FakeLLMServer]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-judge")
    monkeypatch.setenv("RAGJUDGE_CACHE_DIR", str(tmp_path / "cache"))  # this test's own cache: requests are counted
    server = FakeLLMServer().start()
    server.set_handler(CompliantModel(judge_mode))
    yield server
    server.stop()


@pytest.fixture
def sqlite_store(tmp_path, fresh_tracking_uri, monkeypatch) -> Iterator[str]:
    uri = fresh_tracking_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.tracking.fluent._active_experiment_id = None


@pytest.fixture
def openai_autolog() -> Iterator[None]:
    mlflow.openai.autolog()
    yield
    mlflow.openai.autolog(disable=True)


@mlflow.trace(span_type=SpanType.RETRIEVER)
def retrieve(query: str) -> list[Document]:
    return [Document(page_content=text, metadata={"doc_uri": doc_id}) for doc_id, text in DOCS]


def _chat_app(base_url: str) -> Any:
    """A RAG app as teams write it: a retriever, then the OpenAI chat API (autologged), in one traced call."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="sk-app")

    @mlflow.trace
    def chat_app(messages: list[dict[str, Any]]) -> Any:
        docs = retrieve(messages[-1]["content"])
        system = "Answer from these passages:\n" + "\n".join(d.page_content for d in docs)
        return client.chat.completions.create(model="app-model",
                                              messages=[{"role": "system", "content": system}, *messages])

    return chat_app


def _ask(app: Any, questions: list[str]) -> None:
    for q in questions:
        app([{"role": "user", "content": q}])
    mlflow.flush_trace_async_logging()


def _traces(exp_id: str) -> list[Any]:
    return mlflow.search_traces(locations=[exp_id], return_type="list", include_spans=False, max_results=1000)


def _ours(trace: Any) -> list[Any]:
    """The monitor's Feedback on a trace."""
    return [a for a in trace.info.assessments if (a.metadata or {}).get(JUDGE_ID_KEY)
            and getattr(a, "feedback", None) is not None]


def _process_env(tracking_uri: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a ``python -m mlflow_ragjudge`` child: this store, its own cache, this checkout first on
    the path and an MLflow laid over (the version step's PYTHONPATH) kept."""
    return {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "RAGJUDGE_CACHE_DIR": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]),
                                                      os.environ.get("PYTHONPATH")) if p)}


def _judge_uri(server: FakeLLMServer) -> str:
    return f"openai:/{JUDGE_MODEL}?base_url={server.openai_base_url}"


def _monitor(experiment: str, judge: str, *extra: str) -> int:
    return main(["monitor", "--experiment", experiment, "--judge", judge, "--metrics", ",".join(METRICS),
                 "--settle", "0", *extra])


def test_passes_attach_to_the_apps_own_traces_once_then_only_new_ones(store, app_llm, judge_llm, openai_autolog,
                                                                      capsys):
    name = f"prod-app-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    app = _chat_app(app_llm.openai_base_url)
    _ask(app, [f"What is the capital of France? (user {i})" for i in range(6)])
    app_ids = {t.info.trace_id for t in _traces(exp_id)}
    assert len(app_ids) == 6

    assert _monitor(name, _judge_uri(judge_llm)) == 0
    first = judge_llm.request_count
    assert first > 0
    after = _traces(exp_id)
    assert {t.info.trace_id for t in after} == app_ids  # the app's traces: no new trace, none copied
    for t in after:
        fbs = _ours(t)
        assert Counter(a.name for a in fbs) == Counter(METRICS), (t.info.trace_id, [a.name for a in fbs])
        assert all(a.source.source_type == "LLM_JUDGE" and JUDGE_MODEL in a.source.source_id for a in fbs)
        assert all(a.error is None and a.value is not None for a in fbs), [a.error for a in fbs]
    # one run for the pass, a child of the monitor's run, its metrics over the 6 traces, the traces linked to it
    runs = mlflow.search_runs([exp_id], filter_string="tags.`ragjudge.kind` = 'monitor_pass'", output_format="list")
    assert len(runs) == 1
    pass_run = runs[0]
    assert pass_run.data.metrics["monitor/traces_judged"] == 6
    assert pass_run.data.metrics["faithfulness/n_scored"] == 6
    assert pass_run.data.metrics["judge/requests"] == first
    linked = mlflow.search_traces(run_id=pass_run.info.run_id, locations=[exp_id], return_type="list")
    assert {t.info.trace_id for t in linked} == app_ids
    parent = mlflow.get_run(pass_run.data.tags["ragjudge.monitor.parent"])
    assert parent.data.metrics["faithfulness/mean"] == pass_run.data.metrics["faithfulness/mean"]
    # the judge's own requests were never traced into the app's experiment
    spans = [s for t in mlflow.search_traces(locations=[exp_id], return_type="list") for s in t.data.spans]
    assert not [s for s in spans if JUDGE_MODEL in json.dumps(s.inputs, default=str)]

    assert _monitor(name, _judge_uri(judge_llm)) == 0  # nothing new: no request, nothing attached, no run
    assert judge_llm.request_count == first
    assert sum(len(_ours(t)) for t in _traces(exp_id)) == 6 * len(METRICS)
    assert len(mlflow.search_runs([exp_id], filter_string="tags.`ragjudge.kind` = 'monitor_pass'")) == 1

    _ask(app, [f"Which river flows through Paris? (user {i})" for i in range(3)])
    new_ids = {t.info.trace_id for t in _traces(exp_id)} - app_ids
    assert _monitor(name, _judge_uri(judge_llm)) == 0
    assert judge_llm.request_count > first
    for t in _traces(exp_id):
        assert Counter(a.name for a in _ours(t)) == Counter(METRICS)  # the old ones untouched, the new ones judged
    runs = mlflow.search_runs([exp_id], filter_string="tags.`ragjudge.kind` = 'monitor_pass'", output_format="list",
                              order_by=["start_time DESC"])
    assert len(runs) == 2 and runs[0].data.metrics["monitor/traces_judged"] == 3
    linked = mlflow.search_traces(run_id=runs[0].info.run_id, locations=[exp_id], return_type="list")
    assert {t.info.trace_id for t in linked} == new_ids
    out = capsys.readouterr().out
    assert "6 traces judged" in out and "0 traces judged" in out and "3 traces judged" in out


@pytest.mark.parametrize("judge_mode", ["text"])
def test_a_plain_text_judge_server(sqlite_store, judge_llm):
    """A server with no structured output: every trace still gets its Feedback, none failed."""
    name = f"plain-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id

    @mlflow.trace
    def app(question: str) -> str:
        retrieve(question)
        return APP_ANSWER

    for i in range(4):
        app(f"What is the capital of France? ({i})")
    mlflow.flush_trace_async_logging()
    result = monitor_pass(name, _judge_uri(judge_llm), list(METRICS), settle=0)
    assert len(result.judged) == 4 and result.attached == 8
    fbs = [a for t in _traces(exp_id) for a in _ours(t)]
    assert len(fbs) == 8 and all(a.error is None for a in fbs), [a.error for a in fbs if a.error]


def _simple_app(n: int, start: int = 0, supported: Any = None) -> None:
    @mlflow.trace
    def app(question: str) -> str:
        retrieve(question)
        ok = supported(question) if supported is not None else True
        return APP_ANSWER if ok else "Lyon is the capital of France and it lies on the Rhone."

    for i in range(start, start + n):
        app(f"Question {i}: where is the capital of France?")
    mlflow.flush_trace_async_logging()


def test_human_feedback_on_random_monitored_traces_calibrates_the_pass(sqlite_store):
    """40 random traces of 60 labelled by people in the UI's way (HUMAN Feedback named after the metric): the next
    pass brings the first pass's run a calibrated mean equal to ppi_mean on the same values."""
    name = f"labelled-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    _simple_app(60, supported=lambda q: int(q.split()[1].rstrip(":")) % 3 != 0)
    first = monitor_pass(name, "offline:/lexical", ["faithfulness"], settle=0)
    assert len(first.judged) == 60
    traces = {t.info.trace_id: t for t in _traces(exp_id)}
    rng = np.random.default_rng(7)
    labelled = sorted(rng.choice(sorted(traces), size=40, replace=False))
    human = {}
    for k, tid in enumerate(labelled):
        value = float(rng.random() < 0.7)
        human[tid] = value
        mlflow.log_feedback(trace_id=tid, name="faithfulness", value=value,
                            source=AssessmentSource(source_type="HUMAN", source_id=f"reviewer-{k % 3}"))
    second = monitor_pass(name, "offline:/lexical", ["faithfulness"], settle=0)
    assert second.judged == [] and first.run_id in second.calibrated
    ids = sorted(traces)
    judge = [next(a.value for a in _ours(traces[t]) if a.name == "faithfulness") for t in ids]
    expected = ppi_mean(np.array(judge, dtype=float), np.array([human.get(t, np.nan) for t in ids]))
    logged = mlflow.get_run(first.run_id).data.metrics
    assert logged["faithfulness/ppi_mean"] == pytest.approx(expected.mean)
    assert logged["faithfulness/ppi_ci_low"] == pytest.approx(expected.ci_low)
    assert logged["faithfulness/n_labelled"] == 40
    # the pass's traces are a run's traces: the review queue and `ragjudge calibrate` read them as they are
    from mlflow_ragjudge.workflows.calibration_traces import calibrate_traces

    again = calibrate_traces(first.run_id, ["faithfulness"], log=False)
    assert again["faithfulness"].mean == pytest.approx(expected.mean)
    # the judge against the people on production traces: judge-report reads the pass's table and the labels
    from mlflow_ragjudge.workflows.judge_report import judge_report

    report = judge_report(first.run_id, metric="faithfulness", log=False)
    by_id = dict(zip(ids, judge, strict=True))
    agree = sum((by_id[t] >= 0.5) == (h == 1.0) for t, h in human.items())
    assert (report.rows, report.labelled, report.n, report.n_agree) == (60, 40, 40, agree)
    assert all(d["trace_id"] == d["row_id"] and d["row_id"] in traces for d in report.disagreements)
    from mlflow.genai import review_queues

    assert main(["label-sample", first.run_id, "--review-queue", "--n", "10", "--metrics", "faithfulness"]) == 0
    sample = mlflow.artifacts.load_dict(f"runs:/{first.run_id}/ragjudge/label_sample.json")
    assert len(sample["trace_ids"]) == 10 and set(sample["trace_ids"]) <= set(traces)  # the app's own traces
    assert len(review_queues.list_review_queue_items(sample["queue"])) == 10


def test_a_pass_killed_while_attaching_then_restarted_judges_nothing_twice(sqlite_store, judge_llm, monkeypatch):
    from mlflow_ragjudge.adapters.monitor_store import MonitorStore

    name = f"killed-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    _simple_app(8)
    real = MonitorStore.attach
    calls = {"n": 0}

    def dies_after_three(self, trace_id, assessments, mark, replace=()):
        calls["n"] += 1
        if calls["n"] == 4:  # the fourth trace: one Feedback written, then the process "dies"
            self.tracing.log_assessment(trace_id, assessments[0])
            raise SystemExit("killed")
        return real(self, trace_id, assessments, mark, replace)

    monkeypatch.setattr(MonitorStore, "attach", dies_after_three)
    with pytest.raises(SystemExit):
        monitor_pass(name, _judge_uri(judge_llm), list(METRICS), settle=0)
    monkeypatch.setattr(MonitorStore, "attach", real)
    sent = [r.prompt_text for r in judge_llm.requests]
    assert 0 < sum(len(_ours(t)) for t in _traces(exp_id)) < 8 * len(METRICS)
    again = monitor_pass(name, _judge_uri(judge_llm), list(METRICS), settle=0)
    assert len(again.judged) == 5  # the three complete traces were not looked at again
    for t in _traces(exp_id):
        assert Counter(a.name for a in _ours(t)) == Counter(METRICS), t.info.trace_id  # none twice, none lost
    resent = [r.prompt_text for r in judge_llm.requests[len(sent):]]
    assert resent == []  # everything the killed pass judged came from the cache
    killed = mlflow.search_runs([exp_id], filter_string="tags.`ragjudge.kind` = 'monitor_pass'", output_format="list",
                                order_by=["start_time ASC"])
    assert [r.info.status for r in killed] == ["KILLED", "FINISHED"]


@pytest.mark.slow
@once_per_ci
def test_a_monitor_process_killed_mid_pass_resumes_and_loses_nothing(tmp_path, fresh_tracking_uri, judge_llm):
    uri = fresh_tracking_uri(tmp_path / "mlflow.db")
    env = _process_env(uri, tmp_path)
    mlflow.set_tracking_uri(uri)
    name = f"sigkill-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    _simple_app(12)
    judge_llm.latency = 0.2
    cmd = [sys.executable, "-m", "mlflow_ragjudge", "monitor", "--experiment", name, "--judge",
           _judge_uri(judge_llm), "--metrics", ",".join(METRICS), "--settle", "0", "--max-concurrency", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while judge_llm.request_count < 8 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]  # killed mid-pass, not finished or failed
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    before = len(judge_llm.requests)
    assert before >= 8
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for t in _traces(exp_id):
        assert Counter(a.name for a in _ours(t)) == Counter(METRICS), t.info.trace_id
    prompts = [r.prompt_text for r in judge_llm.requests]
    again = [p for p, n in Counter(prompts).items() if n > 1]
    # only a request in flight when the process died (its reply never reached the cache) is sent again: at most
    # --max-concurrency of them, each once more; everything judged before the kill came from the cache
    assert len(prompts) - len(set(prompts)) <= 2 and all(Counter(prompts)[p] == 2 for p in again)
    assert len(prompts) > before


def test_sample_rate_is_a_seeded_hash_and_count_samples_and_backlog(sqlite_store):
    name = f"sample-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    _simple_app(40)
    half = monitor_pass(name, "offline:/lexical", ["faithfulness"], sample=0.5, seed=3, settle=0)
    assert 8 <= len(half.judged) <= 32 and half.sampled_out == 40 - len(half.judged)
    # the same seed picks the same traces on a second store: the choice is the trace id's hash, not a run's state
    from mlflow_ragjudge.workflows.monitor import _sample_key

    assert set(half.judged) == {t.info.trace_id for t in _traces(exp_id) if _sample_key(t.info.trace_id, 3) < 0.5}
    again = monitor_pass(name, "offline:/lexical", ["faithfulness"], sample=0.5, seed=3, settle=0)
    assert again.judged == []  # the left-out traces stay left out

    name2 = f"backlog-{uuid.uuid4().hex[:8]}"
    exp2 = mlflow.set_experiment(name2).experiment_id
    _simple_app(25)
    newest = [t.info.trace_id for t in sorted(_traces(exp2), key=lambda t: -t.info.timestamp_ms)]
    p1 = monitor_pass(name2, "offline:/lexical", ["faithfulness"], max_traces=10, settle=0)
    assert set(p1.judged) == set(newest[:10]) and p1.backlog == 15
    p2 = monitor_pass(name2, "offline:/lexical", ["faithfulness"], max_traces=10, settle=0)
    p3 = monitor_pass(name2, "offline:/lexical", ["faithfulness"], max_traces=10, settle=0)
    assert set(p2.judged) == set(newest[10:20]) and set(p3.judged) == set(newest[20:])
    assert sorted(p1.judged + p2.judged + p3.judged) == sorted(newest)

    # a listing capped below the backlog still reaches every trace: the handled ones do not count against it
    name4 = f"capped-{uuid.uuid4().hex[:8]}"
    exp4 = mlflow.set_experiment(name4).experiment_id
    _simple_app(25)
    passes = [monitor_pass(name4, "offline:/lexical", ["faithfulness"], max_traces=5, max_scan=7, settle=0)
              for _ in range(6)]
    assert [len(p.judged) for p in passes] == [5, 5, 5, 5, 5, 0]
    assert {t.info.trace_id for t in _traces(exp4) if _ours(t)} == {t.info.trace_id for t in _traces(exp4)}

    name3 = f"count-{uuid.uuid4().hex[:8]}"
    mlflow.set_experiment(name3)
    _simple_app(20)
    five = monitor_pass(name3, "offline:/lexical", ["faithfulness"], sample=5, settle=0)
    assert len(five.judged) == 5 and five.sampled_out == 15


def test_traces_the_metrics_cannot_read_get_a_failed_feedback_once(sqlite_store):
    """A trace with no retriever: faithfulness and context relevance say what is missing, as an error on the trace
    (never a silent gap), and it is not looked at again."""
    name = f"noretriever-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id

    @mlflow.trace
    def bare(question: str) -> str:
        return "Paris."

    bare("What is the capital of France?")
    _simple_app(2)
    first = monitor_pass(name, "offline:/lexical", list(METRICS), settle=0)
    assert len(first.judged) == 3 and first.unreadable == 1
    bare_trace = next(t for t in _traces(exp_id) if t.info.tags.get("mlflow.traceName") == "bare")
    fbs = _ours(bare_trace)
    assert sorted(a.name for a in fbs) == sorted(METRICS)
    assert all(a.error is not None and "contexts" in a.error.error_message for a in fbs)
    assert first.metrics["faithfulness/n_failed"] == 1 and first.metrics["faithfulness/n_scored"] == 2
    assert monitor_pass(name, "offline:/lexical", list(METRICS), settle=0).judged == []


def test_evaluation_traces_and_other_judges_are_left_alone(sqlite_store):
    """Traces of evaluation runs are not the app's; a Feedback of the same name by another judge does not count as
    this judge's."""
    name = f"mixed-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    _simple_app(3)
    import pandas as pd

    from mlflow_ragjudge.adapters.run_log import log_output
    from mlflow_ragjudge.engine.evaluate import evaluate_frame

    out = evaluate_frame(pd.DataFrame({"question": ["q?"], "answer": ["a"], "contexts": [["a"]]}),
                         judge="offline:/lexical", metrics=["faithfulness"])
    with mlflow.start_run() as run:
        log_output(out, run.info.run_id)
    t0 = next(iter(_traces(exp_id)))
    mlflow.log_feedback(trace_id=t0.info.trace_id, name="faithfulness", value=0.0,
                        source=AssessmentSource(source_type="LLM_JUDGE", source_id="openai:/someone-else"))
    result = monitor_pass(name, "offline:/lexical", ["faithfulness"], settle=0)
    assert len(result.judged) == 3  # the app's three, not the evaluation's row trace


def test_gates_exit_codes_and_the_drop_test(sqlite_store, capsys):
    name = f"gates-{uuid.uuid4().hex[:8]}"
    mlflow.set_experiment(name)
    _simple_app(30)
    base = ["monitor", "--experiment", name, "--metrics", "faithfulness", "--settle", "0"]
    assert main(base + ["--fail-under", "faithfulness=0.5"]) == 0  # supported answers: well above 0.5
    _simple_app(30, start=100, supported=lambda q: False)  # the app regresses: unsupported answers
    code = main(base + ["--max-drop", "faithfulness=0.1", "--baseline", "previous"])
    assert code == 4
    err = capsys.readouterr().out
    assert "dropped, failed" in err and "unpaired" in err
    # the same 30 questions asked again, answered well again: paired on the questions, no drop
    _simple_app(30, start=100)
    assert main(base + ["--max-drop", "faithfulness=0.1", "--baseline", "previous"]) == 0
    out = capsys.readouterr().out
    assert "(paired, 30 questions)" in out and "passed" in out
    assert main(base + ["--fail-under", "faithfulness=2"]) == 0  # nothing new to judge: no gate to fail
    assert main(["monitor", "--experiment", "no-such-experiment"]) == 2
    # no judge, no metrics: the offline judge on the defaults it can score (answer relevancy left out, not refused)
    _simple_app(2, start=300)
    assert main(["monitor", "--experiment", name, "--settle", "0"]) == 0
    out = capsys.readouterr().out
    assert "2 traces judged" in out and "faithfulness" in out and "context_relevance" in out
    assert "answer_relevancy left out: the offline judge" in out
    assert main(base + ["--sample", "1.5"]) == 2
    assert main(base + ["--max-drop", "faithfulness=0.1"]) == 2  # no baseline named


def test_production_against_the_variants_offline_evaluation(sqlite_store, capsys):
    """``--baseline RUN`` may be the evaluation run that picked the variant: production's traces are paired with its
    rows on the questions both have."""
    import pandas as pd

    from mlflow_ragjudge.adapters.run_log import log_output
    from mlflow_ragjudge.engine.evaluate import evaluate_frame

    name = f"vs-eval-{uuid.uuid4().hex[:8]}"
    mlflow.set_experiment(name)
    questions = [f"Question {i}: where is the capital of France?" for i in range(400, 420)]
    offline = pd.DataFrame({"question": questions, "answer": [APP_ANSWER] * 20,
                            "contexts": [[text for _, text in DOCS]] * 20})
    out = evaluate_frame(offline, judge="offline:/lexical", metrics=["faithfulness"])
    with mlflow.start_run(run_name="variant-b") as run:
        log_output(out, run.info.run_id)
    _simple_app(20, start=400, supported=lambda q: int(q.split()[1].rstrip(":")) % 2 == 0)  # half made up
    code = main(["monitor", "--experiment", name, "--metrics", "faithfulness", "--settle", "0",
                 "--max-drop", "faithfulness=0.05", "--baseline", run.info.run_id])
    printed = capsys.readouterr().out
    assert code == 4, printed
    assert "(paired, 20 questions)" in printed and "dropped, failed" in printed


def test_difference_interval_against_scipy():
    from scipy import stats

    rng = np.random.default_rng(0)
    a, b = list(rng.normal(0.6, 0.2, 40)), list(rng.normal(0.5, 0.3, 25))
    iv = difference_interval({}, {}, a, b)
    res = stats.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(0.95)
    assert iv["kind"] == "unpaired" and iv["low"] == pytest.approx(ci.low, abs=0.01)
    keys = [f"q{i}" for i in range(20)]
    now = dict(zip(keys, rng.normal(0.6, 0.2, 20), strict=True))
    before = {k: v - 0.05 + rng.normal(0, 0.02) for k, v in now.items()}
    iv = difference_interval(now, before, list(now.values()), list(before.values()))
    ci = stats.ttest_rel(list(now.values()), list(before.values())).confidence_interval(0.95)
    assert iv["kind"] == "paired" and iv["low"] == pytest.approx(ci.low) and iv["high"] == pytest.approx(ci.high)


def test_identity_changes_with_what_changes_a_score():
    base = identify({"judge": "openai:/m", "metrics": ["faithfulness"]})
    assert base == identify({"judge": "openai:/m", "metrics": ["faithfulness"], "max_concurrency": 3, "cache": False})
    assert base.ids != identify({"judge": "openai:/other", "metrics": ["faithfulness"]}).ids
    assert base.ids != identify({"judge": "openai:/m", "metrics": ["faithfulness"], "language": "ja"}).ids
    assert base.ids != identify({"judge": "openai:/m", "metrics": ["faithfulness"], "repeats": 3}).ids
    panel = identify({"judge": ["openai:/a", "openai:/b"], "metrics": ["faithfulness"]})
    assert panel.ids == identify({"judge": ["openai:/b", "openai:/a"], "metrics": ["faithfulness"]}).ids


def test_durations_and_times():
    assert parse_every("10m") == 600 and parse_every("30s") == 30 and parse_every("1h") == 3600
    assert abs(parse_since("2h") - (time.time() - 7200)) < 5
    assert parse_since("2026-11-27T09:00") == pytest.approx(1795770000.0)
    for bad in ("soon", "-5m", "0"):
        with pytest.raises(ValueError):
            parse_every(bad)


def test_another_live_monitor_of_the_same_judge_is_refused(sqlite_store):
    from mlflow_ragjudge.adapters.monitor_store import MonitorStore
    from mlflow_ragjudge.core.errors import InputError

    name = f"lease-{uuid.uuid4().hex[:8]}"
    mlflow.set_experiment(name)
    _simple_app(2)
    ident = identify({"judge": "offline:/lexical", "metrics": ["faithfulness"]})
    store = MonitorStore(name)
    store.set_state(f"ragjudge.monitor.{ident.monitor_id}.lease", f"other-host:1@{time.time() + 600:.0f}")
    with pytest.raises(InputError, match="other-host:1 holds it"):
        monitor_pass(name, "offline:/lexical", ["faithfulness"], settle=0)
    store.set_state(f"ragjudge.monitor.{ident.monitor_id}.lease", f"other-host:1@{time.time() - 1:.0f}")  # expired
    assert len(monitor_pass(name, "offline:/lexical", ["faithfulness"], settle=0).judged) == 2


@pytest.mark.slow
@once_per_ci
def test_every_runs_passes_until_sigterm_then_stops_cleanly(tmp_path, fresh_tracking_uri):
    """``--every``: a pass, a wait, the next pass judges what arrived meanwhile; SIGTERM during the wait ends the
    process at once with 143, saying where the next monitor goes on."""
    uri = fresh_tracking_uri(tmp_path / "mlflow.db")
    env = _process_env(uri, tmp_path)
    mlflow.set_tracking_uri(uri)
    name = f"every-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    _simple_app(3)
    proc = subprocess.Popen([sys.executable, "-m", "mlflow_ragjudge", "monitor", "--experiment", name,
                             "--metrics", "faithfulness", "--settle", "0", "--every", "2s"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def judged() -> int:
            return sum(1 for t in _traces(exp_id) if _ours(t))

        deadline = time.time() + 120
        while judged() < 3 and time.time() < deadline:
            time.sleep(0.2)
        _simple_app(2, start=50)
        while judged() < 5 and time.time() < deadline:
            time.sleep(0.2)
        assert judged() == 5
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM" in err and "3 traces judged" in out and "2 traces judged" in out
    runs = mlflow.search_runs([exp_id], filter_string="tags.`ragjudge.kind` = 'monitor_pass'", output_format="list")
    assert sorted(r.data.metrics["monitor/traces_judged"] for r in runs) == [2, 3]
    assert all(r.info.status == "FINISHED" for r in runs)


def test_a_judge_server_that_is_down_is_tried_again_by_the_next_passes_then_settled(sqlite_store, judge_llm):
    """A provider-side failure is not a judgment: the failed Feedback says why on the trace, the next pass tries
    again and, once the server answers, replaces it (one Feedback per metric in the end); a server down for good is
    tried MAX_TRIES passes, then its failure stands and nothing more is sent."""
    from fakellm import Reply

    from mlflow_ragjudge.workflows.monitor_judge import MAX_TRIES, TRY_KEY

    name = f"down-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    _simple_app(3)
    healthy = CompliantModel("json_schema")
    judge_llm.set_handler(lambda request: Reply.error(503, "overloaded"))
    first = monitor_pass(name, _judge_uri(judge_llm), ["faithfulness"], settle=0)
    assert len(first.judged) == 3 and first.retrying == 3
    fbs = [a for t in _traces(exp_id) for a in _ours(t)]
    assert len(fbs) == 3 and all(a.error is not None and a.metadata[TRY_KEY] == "1" for a in fbs)
    assert all("ragjudge.monitor." + first.monitor_id not in t.info.tags for t in _traces(exp_id))

    # the CLI says it loudly: exit 3, the judge failed on more than max_error_rate of the traces
    _simple_app(1, start=900)
    assert main(["monitor", "--experiment", name, "--judge", _judge_uri(judge_llm), "--metrics", "faithfulness",
                 "--settle", "0"]) == 3
    judge_llm.set_handler(healthy)
    second = monitor_pass(name, _judge_uri(judge_llm), ["faithfulness"], settle=0)
    assert len(second.judged) == 4 and second.retrying == 0
    tries = []
    for t in _traces(exp_id):
        (fb,) = _ours(t)  # the failed tries replaced, not kept beside
        assert fb.error is None and fb.value is not None
        tries.append(fb.metadata[TRY_KEY])
    assert sorted(tries) == ["2", "3", "3", "3"]  # the CLI's pass was the first three's second try
    assert monitor_pass(name, _judge_uri(judge_llm), ["faithfulness"], settle=0).judged == []

    name2 = f"down-for-good-{uuid.uuid4().hex[:8]}"
    exp2 = mlflow.set_experiment(name2).experiment_id
    _simple_app(2, start=500, supported=lambda q: False)  # not what the cache holds from the first app
    judge_llm.set_handler(lambda request: Reply.error(503, "overloaded"))
    tries = [monitor_pass(name2, _judge_uri(judge_llm), ["faithfulness"], settle=0) for _ in range(MAX_TRIES)]
    assert [p.retrying for p in tries] == [2] * (MAX_TRIES - 1) + [0]
    sent = judge_llm.request_count
    assert monitor_pass(name2, _judge_uri(judge_llm), ["faithfulness"], settle=0).judged == []
    assert judge_llm.request_count == sent
    for t in _traces(exp2):
        (fb,) = _ours(t)
        assert fb.error is not None and fb.metadata[TRY_KEY] == str(MAX_TRIES)


def test_a_panel_with_repeats_attaches_the_verdict_and_each_judges_feedback(sqlite_store, judge_llm):
    """A panel of two judges with two draws each: the combined Feedback per metric and one per judge
    (``faithfulness@<judge>``), all with the panel's identity; a second pass sends nothing."""
    name = f"panel-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    _simple_app(3, start=700)
    judges = [f"openai:/judge-{k}?base_url={judge_llm.openai_base_url}" for k in ("a", "b")]
    first = monitor_pass(name, judges, ["faithfulness"], settle=0, config={"repeats": 2})
    assert len(first.judged) == 3 and first.retrying == 0, first.summary()
    for t in _traces(exp_id):
        names = sorted(a.name for a in _ours(t))
        assert names[0] == "faithfulness" and len(names) == 3 and all(n.startswith("faithfulness@") for n in names[1:])
        assert len({a.metadata[JUDGE_ID_KEY] for a in _ours(t)}) == 1
    sent = judge_llm.request_count
    assert monitor_pass(name, judges, ["faithfulness"], settle=0, config={"repeats": 2}).judged == []
    assert judge_llm.request_count == sent


def test_batch_a_pass_sends_its_judge_calls_through_the_batch_api(sqlite_store, judge_llm):
    """``--batch``: the pass's calls go through the provider's batch API (no synchronous chat request), and the
    Feedback on the traces is what the synchronous pass attaches on the same app."""
    values = {}
    for mode in ("sync", "batch"):
        name = f"{mode}-{uuid.uuid4().hex[:8]}"
        exp_id = mlflow.set_experiment(name).experiment_id
        _simple_app(4, start=800, supported=lambda q: int(q.split()[1].rstrip(":")) % 2 == 0)
        judge_llm.reset()
        config = {"cache": False, **({"batch": {"poll_interval": 0.05, "max_poll_interval": 0.2, "progress": False}}
                                     if mode == "batch" else {})}
        result = monitor_pass(name, _judge_uri(judge_llm), list(METRICS), settle=0, config=config)
        assert len(result.judged) == 4 and result.attached == 8
        if mode == "batch":
            assert judge_llm.requests_for("openai_chat") == [] and judge_llm.batches.created
        values[mode] = sorted((a.name, a.value) for t in _traces(exp_id) for a in _ours(t))
    assert values["batch"] == values["sync"]


def test_an_anthropic_autologged_app_and_a_langchain_shaped_one(sqlite_store, app_llm, judge_llm):
    """Other shapes apps log: the Anthropic SDK autologged (the question is the last user turn's text block, the
    answer the message's text blocks) and a chain's ``{"input": ...}`` -> ``{"output": ...}``; each trace judged
    with its retriever's documents, nothing failed."""
    import anthropic

    name = f"shapes-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    client = anthropic.Anthropic(base_url=app_llm.anthropic_base_url, api_key="sk-ant-app")

    @mlflow.trace
    def messages_app(messages: list[dict[str, Any]]) -> Any:
        docs = retrieve(messages[-1]["content"][0]["text"])
        return client.messages.create(model="app-claude", max_tokens=200, messages=messages,
                                      system="Answer from: " + " ".join(d.page_content for d in docs))

    @mlflow.trace(name="RetrievalQA")
    def chain(inputs: dict[str, Any]) -> dict[str, Any]:
        retrieve(inputs["input"])
        return {"output": APP_ANSWER}

    mlflow.anthropic.autolog()
    try:
        messages_app([{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}])
    finally:
        mlflow.anthropic.autolog(disable=True)
    chain({"input": "Which river flows through Paris?"})
    mlflow.flush_trace_async_logging()
    result = monitor_pass(name, _judge_uri(judge_llm), list(METRICS), settle=0)
    assert len(result.judged) == 2 and result.unreadable == 0, result.summary()
    for t in _traces(exp_id):
        fbs = _ours(t)
        assert sorted(a.name for a in fbs) == sorted(METRICS)
        assert all(a.error is None for a in fbs), [a.error for a in fbs]
    questions = {r.prompt_text for r in judge_llm.requests}
    assert any("What is the capital of France?" in p for p in questions)
    assert any("Which river flows through Paris?" in p for p in questions)


@pytest.mark.slow
@once_per_ci  # a server process killed and started again: what the monitor does then is ours, not MLflow's
def test_a_tracking_server_that_goes_down_and_comes_back(tmp_path, fresh_tracking_uri):
    """A monitor on a clock outlives its tracking server's restart: the passes while it is down fail (said, bounded
    by the HTTP retries), the monitor goes on, and once the server is back the traces logged meanwhile are judged,
    nothing twice. A single pass against a server that is gone exits 5 within its retries."""
    import threading

    from mlflow_ui import free_port, start_server

    fresh_tracking_uri(tmp_path / "mlflow.db")  # the server's store, made and migrated beforehand
    port = free_port()
    server, url = start_server(tmp_path, port=port)
    env = {**_process_env(url, tmp_path), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
           "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
    mlflow.set_tracking_uri(url)
    name = f"outage-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.set_experiment(name).experiment_id
    _simple_app(2)
    cmd = [sys.executable, "-m", "mlflow_ragjudge", "monitor", "--experiment", name, "--metrics", "faithfulness",
           "--settle", "0"]
    proc = subprocess.Popen(cmd + ["--every", "1s"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()

    def wait_for(what: Any, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while not what() and time.time() < deadline:
            time.sleep(0.2)
        assert what(), "".join(lines)[-3000:]

    try:
        wait_for(lambda: any("2 traces judged" in ln for ln in lines))
        server.terminate()
        server.wait(timeout=30)
        wait_for(lambda: any("failed: the tracking store" in ln for ln in lines))
        assert proc.poll() is None  # the monitor goes on
        server, _ = start_server(tmp_path, port=port)  # back, same store
        _simple_app(2, start=50)
        wait_for(lambda: sum(1 for t in _traces(exp_id) if _ours(t)) == 4)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM
        for t in _traces(exp_id):
            assert [a.name for a in _ours(t)] == ["faithfulness"]
        server.terminate()
        server.wait(timeout=30)
        t0 = time.time()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode in (2, 5), done.stderr[-2000:]  # refused up front (2) or failed within the pass (5)
        assert time.time() - t0 < 120
    finally:
        proc.kill()
        server.kill()
