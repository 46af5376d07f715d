"""Every judged row of a ``ragjudge`` run is an MLflow trace in that run (issue 28): after ``ragjudge evaluate``,
``mlflow.models.evaluate(..., evaluators="ragjudge")`` and a sweep, on a SQLite store and on a real ``mlflow
server``, ``mlflow.search_traces(run_id=...)`` gives one trace per row whose assessments equal the per-row table's
values, failed rows carrying their reason; the reference is an Expectation; the contexts are a RETRIEVER span; a
sweep's rows show the call to the user's pipeline. Bounded (a seeded sample beyond ``traces``, 0 = none), replaced
rather than doubled when a run is logged again, and the human labels of a review land on the same traces."""

from __future__ import annotations

import json
import math
import uuid
import warnings

import mlflow
import pandas as pd
import pytest
from compliant_model import CompliantModel
from fakellm import Reply
from mlflow.entities import AssessmentSource, AssessmentSourceType
from mlflow.tracking import MlflowClient

from mlflow_ragjudge import load_output
from mlflow_ragjudge.adapters.run_log import TABLE_FILE, log_output
from mlflow_ragjudge.adapters.traces import EXPECTATION_NAME, pick_rows
from mlflow_ragjudge.adapters.tracking import load_run_table
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.engine.evaluate import evaluate_frame
from mlflow_ragjudge.workflows import example_rag
from mlflow_ragjudge.workflows.calibration_traces import calibrate_traces

pytestmark = pytest.mark.slow


def _experiment(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _traces(uri: str, run_id: str) -> list:
    mlflow.set_tracking_uri(uri)
    eid = MlflowClient(uri).get_run(run_id).info.experiment_id
    return mlflow.search_traces(run_id=run_id, locations=[eid], return_type="list", max_results=10_000)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _assert_traces_equal_table(uri: str, run_id: str) -> tuple[pd.DataFrame, dict[int, object]]:
    """One trace per row; each row's assessments are the table's score (value), justification (rationale) and
    status (a failure as the error with its reason); the reference is the Expectation; the contexts the RETRIEVER
    span's documents."""
    client = MlflowClient(uri)
    table = load_run_table(run_id, TABLE_FILE, client)
    traces = _traces(uri, run_id)
    by_row = {int(t.info.trace_metadata["ragjudge.row"]): t for t in traces}
    assert sorted(by_row) == list(range(len(table))), "one trace per row"
    scores = [c[: -len("/score")] for c in table.columns if c.endswith("/score")]
    assert scores
    for i, trace in by_row.items():
        feedback = {a.name: a for a in trace.info.assessments if a.feedback is not None}
        assert set(feedback) == set(scores), (i, set(feedback) ^ set(scores))
        for name in scores:
            a, cell = feedback[name], table[f"{name}/score"].iloc[i]
            assert a.trace_id == trace.info.trace_id
            if _missing(cell):
                assert a.value is None, (i, name, a.value)
            else:
                # the logged table and the assessment both keep the full value (MLflow's log_table wrote 10 decimals)
                assert a.value == pytest.approx(float(cell), rel=1e-9, abs=1e-10), (i, name, a.value, cell)
            if f"{name}/status" in table.columns:
                status = table[f"{name}/status"].iloc[i]
                assert a.metadata["ragjudge.status"] == status.split(":")[0]
                if status.startswith("failed"):
                    reason = status.split(":", 1)[1]
                    assert a.error is not None and a.error.error_code == reason.upper(), (i, name, a.error)
                    assert a.value is None
                else:
                    assert a.error is None
                justification = table[f"{name}/justification"].iloc[i]
                if isinstance(justification, str) and justification:
                    assert a.rationale == justification
            else:
                assert a.source.source_type == AssessmentSourceType.CODE
        if "reference" in table.columns and isinstance(table["reference"].iloc[i], str):
            exp = [a for a in trace.info.assessments if a.name == EXPECTATION_NAME]
            assert len(exp) == 1 and exp[0].value == table["reference"].iloc[i]
        assert trace.info.request_preview and table["question"].iloc[i] in json.loads(trace.info.request_preview)[
            "question"]
    return table, by_row


def _contexts(trace) -> list[str]:
    spans = [s for s in trace.data.spans if s.span_type == "RETRIEVER"]
    return [d["page_content"] for d in spans[0].outputs] if spans else []


def _failing_rows_handler(model):
    """The compliant model, except that any request about a row whose answer carries 'zzfail' gets an HTTP 400."""
    def handle(request):
        if "zzfail" in json.dumps(request.body):
            return Reply.error(400, "This request cannot be processed.")
        return model(request)
    return handle


# ----------------------------------------------------------------------------- the three ways runs are made


def test_ragjudge_evaluate_logs_every_row_as_a_trace_with_its_judgments(store, fake_llm, monkeypatch, tmp_path,
                                                                          capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-traces")
    fake_llm.set_handler(_failing_rows_handler(CompliantModel("json_schema")))
    rows = [{"question": f"What does archive {i} hold?",
             "answer": f"Archive {i} holds maps." if i % 3 else f"zzfail archive {i}",
             "reference": f"Archive {i} holds maps.", "contexts": [f"Archive {i} holds maps and charts.", "Other."]}
            for i in range(9)]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    exp = _experiment("traces-cli")
    assert main(["evaluate", str(path), "--judge", f"openai:/judge-model?base_url={fake_llm.openai_base_url}",
                 "--metrics", "correctness,faithfulness,lexical", "--max-error-rate", "1", "--experiment", exp,
                 "--tracking-uri", store]) == 0
    assert "9 of 9 rows as traces" in capsys.readouterr().out
    client = MlflowClient(store)
    run = client.search_runs([client.get_experiment_by_name(exp).experiment_id])[0]
    table, by_row = _assert_traces_equal_table(store, run.info.run_id)
    assert run.data.tags["ragjudge.traces"] == "9 of 9 rows as traces"
    failed = [i for i in range(9) if str(table["faithfulness/status"].iloc[i]).startswith("failed")]
    assert failed == [0, 3, 6]  # the rows the server refused: each trace says why
    for i in failed:
        a = next(a for a in by_row[i].info.assessments if a.name == "faithfulness")
        assert a.error.error_code == "PROVIDER_ERROR" and "400" in a.error.error_message
    ok = next(a for a in by_row[1].info.assessments if a.name == "correctness")
    assert ok.source.source_type == AssessmentSourceType.LLM_JUDGE and ok.source.source_id == "judge-model"
    # each judged assessment names the judge calls behind it, as the transcripts record them
    out = load_output(run.info.run_id)
    calls = {r["call_id"] for r in out.transcripts if r["metric"] == "correctness" and r["row"] == 1}
    assert calls and set(ok.metadata["ragjudge.call_ids"].split(",")) == calls
    assert _contexts(by_row[4]) == rows[4]["contexts"]
    lexical = next(a for a in by_row[1].info.assessments if a.name == "rougeL")
    assert lexical.source.source_type == AssessmentSourceType.CODE


def test_mlflow_models_evaluate_with_ragjudge_logs_traces(store):
    frame = example_rag.sample_questions().head(12).copy()
    outs = [example_rag.answer(q) for q in frame["question"]]
    frame["answer"] = [o["answer"] for o in outs]
    frame["contexts"] = [o["contexts"] for o in outs]
    mlflow.set_experiment(_experiment("traces-evaluate"))
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=frame, predictions="answer", targets="reference", model_type="rag",
                               evaluators="ragjudge", evaluator_config={"judge": "offline:/lexical",
                                                                        "progress": False})
    table, by_row = _assert_traces_equal_table(store, run.info.run_id)
    assert len(table) == 12
    judged = next(a for a in by_row[0].info.assessments if a.name == "correctness")
    # the offline judge is code, named as such
    assert judged.source.source_type == AssessmentSourceType.CODE and judged.source.source_id == "offline:/lexical"
    assert _contexts(by_row[5]) == list(frame["contexts"].iloc[5])


def test_each_sweep_variant_logs_its_rows_as_traces_with_the_pipeline_call(store):
    from mlflow_ragjudge import sweep

    questions = example_rag.sample_questions().head(8)
    result = sweep(example_rag.answer, [{"chunk_size": 64, "top_k": 3}, {"chunk_size": 8, "top_k": 1}],
                   questions, experiment=_experiment("traces-sweep"), tracking_uri=store,
                   evaluator_config={"judge": "offline:/lexical", "progress": False})
    assert len(result.run_ids) == 2
    for name, run_id in result.run_ids.items():
        table, by_row = _assert_traces_equal_table(store, run_id)
        params = result.variants[name]
        for i, trace in by_row.items():
            call = [s for s in trace.data.spans if s.name.startswith("pipeline: ")]
            assert len(call) == 1, [s.name for s in trace.data.spans]
            assert call[0].inputs["question"] == table["question"].iloc[i]
            assert {k: call[0].inputs[k] for k in params} == {k: str(v) for k, v in params.items()}
            assert call[0].outputs["answer"] == table["answer"].iloc[i]
            assert call[0].parent_id == trace.data.spans[0].span_id  # under the row's root span
    # the parent run holds the comparison, not rows
    assert _traces(store, result.parent_run_id) == []


def test_ragjudge_sweep_cli_logs_traces_in_each_child_and_none_beyond_traces_n(store, tmp_path, capsys):
    code = tmp_path / "pipe.py"
    code.write_text("def answer(question, *, style):\n"
                    "    return {'answer': question.upper() if style == 'loud' else question,\n"
                    "            'contexts': ['The archive holds maps.', question]}\n", encoding="utf-8")
    data = tmp_path / "questions.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"What does archive {i} hold?", "reference": "Maps."})
                              for i in range(6)), encoding="utf-8")
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"style": ["loud", "quiet"]}), encoding="utf-8")
    exp = _experiment("traces-sweep-cli")
    assert main(["sweep", str(data), "--pipeline", f"{code}:answer", "--grid", str(grid), "--metrics",
                 "lexical,faithfulness", "--traces", "4", "--experiment", exp, "--tracking-uri", store]) == 0, \
        capsys.readouterr().err
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name(exp).experiment_id])
    children = [r for r in runs if r.data.tags.get("ragjudge.sweep") == "variant"]
    assert len(children) == 2
    for child in children:
        traces = _traces(store, child.info.run_id)
        assert len(traces) == 4  # --traces 4 of the 6 rows: a seeded sample, the same rows in every variant
        assert child.data.tags["ragjudge.traces"].startswith("4 of 6 rows as traces (a seeded uniform sample")
        table = load_run_table(child.info.run_id, TABLE_FILE, client)
        for t in traces:
            i = int(t.info.trace_metadata["ragjudge.row"])
            got = {a.name: a.value for a in t.info.assessments if a.feedback is not None}
            assert got["faithfulness"] == pytest.approx(table["faithfulness/score"].iloc[i], rel=1e-9)
            assert got["rougeL"] == pytest.approx(table["rougeL/score"].iloc[i], rel=1e-9)
            call = next(s for s in t.data.spans if s.name == "pipeline: answer")
            assert call.inputs["style"] == child.data.params["variant.style"]
    rows = [sorted(int(t.info.trace_metadata["ragjudge.row"]) for t in _traces(store, c.info.run_id))
            for c in children]
    assert rows[0] == rows[1] == pick_rows(6, 4, seed=0)


# ----------------------------------------------------------------------------- bounded, replaced, labelled


def _offline_run(n: int, config: dict | None = None) -> tuple[str, object]:
    base = example_rag.sample_questions()
    frame = pd.concat([base] * (n // len(base) + 1)).head(n).reset_index(drop=True)
    frame["question"] = [f"{q} (#{i})" for i, q in enumerate(frame["question"])]
    outs = [example_rag.answer(q) for q in frame["question"]]
    frame["answer"] = [o["answer"] for o in outs]
    frame["contexts"] = [o["contexts"] for o in outs]
    out = evaluate_frame(frame, {"judge": "offline:/lexical", "progress": False, "metrics": ["correctness"],
                                 **(config or {})})
    with mlflow.start_run() as run:
        log_output(out, run.info.run_id)
    return run.info.run_id, out


def test_traces_beyond_the_limit_are_a_seeded_uniform_sample_and_zero_turns_them_off(tmp_tracking):
    run_id, _ = _offline_run(30, {"traces": 7, "seed": 3})
    traces = _traces(tmp_tracking, run_id)
    rows = sorted(int(t.info.trace_metadata["ragjudge.row"]) for t in traces)
    assert rows == pick_rows(30, 7, seed=3) and len(set(rows)) == 7
    assert rows != pick_rows(30, 7, seed=4)  # the seed decides the sample
    tag = MlflowClient().get_run(run_id).data.tags["ragjudge.traces"]
    assert tag.startswith("7 of 30 rows as traces (a seeded uniform sample")
    off, _ = _offline_run(10, {"traces": 0})
    assert _traces(tmp_tracking, off) == []
    assert MlflowClient().get_run(off).data.tags["ragjudge.traces"] == "no traces (traces=0)"
    with pytest.raises(ValueError, match="traces=-1 is not valid"):
        evaluate_frame(pd.DataFrame({"question": ["q"], "answer": ["a"]}), {"traces": -1})


def test_logging_a_run_again_replaces_its_traces(tmp_tracking):
    run_id, out = _offline_run(6)
    first = {t.info.trace_id for t in _traces(tmp_tracking, run_id)}
    log_output(out, run_id)  # e.g. ragjudge log-saved into the same run
    again = _traces(tmp_tracking, run_id)
    assert len(again) == 6 and not first & {t.info.trace_id for t in again}


def test_a_store_that_refuses_traces_does_not_lose_the_run(tmp_tracking, monkeypatch):
    from mlflow.tracing.client import TracingClient

    calls = {"n": 0}
    real = TracingClient.start_trace

    def flaky(self, trace_info):
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            raise RuntimeError("trace table is read-only")
        return real(self, trace_info)

    monkeypatch.setattr(TracingClient, "start_trace", flaky)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_id, out = _offline_run(6)
    assert any("refused by the store" in str(w.message) for w in caught)
    assert len(_traces(tmp_tracking, run_id)) == 3
    tag = MlflowClient().get_run(run_id).data.tags["ragjudge.traces"]
    assert tag.startswith("3 of 6 rows as traces; 3 refused by the store") and "read-only" in tag
    assert len(load_run_table(run_id, TABLE_FILE)) == 6  # the table, the metrics: all there
    assert MlflowClient().get_run(run_id).data.metrics["correctness/count"] == 6


def test_human_feedback_on_a_ragjudge_runs_traces_calibrates_it(tmp_tracking):
    """The labelling flow meets the judgments: people label the run's traces (as the MLflow UI or a review queue
    records it), and calibrate_traces turns those labels and the judge's assessments into an interval."""
    from mlflow.genai import review_queues

    from mlflow_ragjudge.workflows.calibration_traces import queue_for_review

    run_id, out = _offline_run(40)
    traces = _traces(tmp_tracking, run_id)
    queue = queue_for_review(run_id, ["correctness"], n=10, seed=1)  # the run's own traces, sampled for review
    queued = {i.item_id for i in review_queues.list_review_queue_items(queue.queue_id)}
    assert len(queued) == 10 and queued <= {t.info.trace_id for t in traces}
    abstained = 0
    for t in traces[:34]:
        i = int(t.info.trace_metadata["ragjudge.row"])
        judge = out.table["correctness/score"].iloc[i]
        abstained += int(out.table["correctness/status"].iloc[i].startswith("abstained"))
        label = 5.0 if judge >= 4 and i % 4 else 2.0  # a person who disagrees with the judge now and then
        mlflow.log_feedback(trace_id=t.info.trace_id, name="correctness", value=label,
                            source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="reviewer"))
    est = calibrate_traces(run_id, ["correctness"])["correctness"]
    # a row the judge abstained on has no judge score: left out and counted, as in the per-row table's calibration
    assert abstained > 0 and est.n_labelled == 34 - abstained and est.n_excluded_labelled == abstained
    assert est.ci_low <= est.mean <= est.ci_high
    assert MlflowClient().get_run(run_id).data.metrics["correctness/ppi_mean"] == pytest.approx(est.mean)


def test_cli_review_queue_and_calibrate_on_a_ragjudge_evaluate_runs_traces(store, tmp_path, capsys):
    """The documented labelling flow on the traces of a ``ragjudge evaluate`` run: ``label-sample --review-queue``
    queues a sample of its traces, people label them (HUMAN feedback), ``calibrate --metrics`` reads them back."""
    from mlflow.genai import review_queues

    path = tmp_path / "rows.jsonl"
    frame = example_rag.sample_questions()
    outs = [example_rag.answer(q) for q in frame["question"]]
    rows = [{"question": q, "answer": o["answer"], "contexts": o["contexts"], "reference": r}
            for q, o, r in zip(frame["question"], outs, frame["reference"])]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    exp = _experiment("traces-labels")
    assert main(["evaluate", str(path), "--metrics", "correctness", "--experiment", exp, "--tracking-uri", store]) == 0
    client = MlflowClient(store)
    run_id = client.search_runs([client.get_experiment_by_name(exp).experiment_id])[0].info.run_id
    capsys.readouterr()
    assert main(["label-sample", run_id, "--review-queue", "--metrics", "correctness", "--n", "35",
                 "--tracking-uri", store]) == 0
    assert "review queue" in capsys.readouterr().out
    queue = review_queues.list_review_queues(experiment_id=client.get_run(run_id).info.experiment_id)[0]
    items = [i.item_id for i in review_queues.list_review_queue_items(queue.queue_id)]
    assert len(items) == 35
    for k, trace_id in enumerate(items):  # a reviewer's labels, one per queued trace
        mlflow.log_feedback(trace_id=trace_id, name="correctness", value=5.0 if k % 3 else 2.0,
                            source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="reviewer"))
    assert main(["calibrate", run_id, "--metrics", "correctness", "--tracking-uri", store]) == 0
    text = capsys.readouterr().out
    assert "correctness: calibrated" in text and "from 35 human labels" in text
    assert "correctness/ppi_mean" in client.get_run(run_id).data.metrics


def test_a_stop_while_traces_are_written_leaves_the_run_logged_and_says_so(tmp_tracking, monkeypatch):
    """Ctrl-C / SIGTERM after the scores: the table and metrics are logged, no more traces are written, and the
    run's tag says what was written and why the rest was not."""
    from mlflow.tracing.client import TracingClient

    from mlflow_ragjudge.core.stop import clear_stop, request_stop

    real = TracingClient.start_trace
    written = {"n": 0}

    def then_stop(self, trace_info):
        written["n"] += 1
        if written["n"] == 3:
            request_stop("SIGINT")  # the signal arrives while the third trace is being written
        return real(self, trace_info)

    monkeypatch.setattr(TracingClient, "start_trace", then_stop)
    try:
        run_id, _ = _offline_run(8)
    finally:
        clear_stop()
    assert len(_traces(tmp_tracking, run_id)) == 3
    tag = MlflowClient().get_run(run_id).data.tags["ragjudge.traces"]
    assert tag == "3 of 8 rows as traces; the rest not written: the run was stopped by SIGINT"
    assert len(load_run_table(run_id, TABLE_FILE)) == 8


def test_a_question_the_pipeline_failed_on_is_an_error_trace_with_the_error(tmp_tracking):
    from mlflow_ragjudge import sweep

    def pipeline(question, *, top_k):
        if "RUNSTATS" in question:
            raise TimeoutError("the index did not answer in 30 s")
        return example_rag.answer(question, top_k=top_k)

    questions = example_rag.sample_questions().head(10)
    broken = [i for i, q in enumerate(questions["question"]) if "RUNSTATS" in q]
    assert broken  # the sample has such a question
    result = sweep(pipeline, [{"top_k": 3}, {"top_k": 1}], questions, experiment=_experiment("traces-failed"),
                   evaluator_config={"judge": "offline:/lexical", "progress": False, "max_error_rate": 0.5})
    for run_id in result.run_ids.values():
        traces = _traces(tmp_tracking, run_id)
        errors = [t for t in traces if "ragjudge.generation_error" in t.info.trace_metadata]
        judged = [t for t in traces if "ragjudge.row" in t.info.trace_metadata]
        assert len(judged) == 10 - len(broken) and len(errors) == len(broken)
        for t in errors:
            assert t.info.state.value == "ERROR" and not t.info.assessments  # nothing was judged
            assert int(t.info.trace_metadata["ragjudge.question"]) in broken
            why = t.info.trace_metadata["ragjudge.generation_error"]
            assert "TimeoutError: the index did not answer in 30 s" in why
            call = next(s for s in t.data.spans if s.name == "pipeline: pipeline")
            assert call.status.status_code.value == "ERROR" and "30 s" in call.status.description
