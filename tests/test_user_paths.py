"""Every documented path works the first time (issue 22): each case runs the user's own command -- the CLI, or the
Python API where that is what the docs show -- with its runs in a **named** experiment, on a SQLite store and on a
real ``mlflow server``, and ends in the documented result.

A command that reads runs back (``label-sample``, ``calibrate``, ``load_output``, ``compare_runs``) runs as in a new
process: no active experiment and no ``MLFLOW_EXPERIMENT_*`` variable, and the tests' default tracking store (from
``MLFLOW_TRACKING_URI``) is another one than the store under test, so only what the command is given counts.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import uuid
from pathlib import Path

import mlflow
import mlflow.tracking.fluent
import numpy as np
import pandas as pd
import pytest
from compliant_model import CompliantModel
from fakellm import Reply
from mlflow.entities import AssessmentSource
from mlflow.tracking import MlflowClient
from mlflow_ui import free_port

import mlflow_ragjudge as rj
from mlflow_ragjudge.adapters.tracking import load_run_table
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.workflows import example_rag
from mlflow_ragjudge.workflows.calibration import CALIBRATED_COLUMNS
from mlflow_ragjudge.workflows.compare import COMPARISON_FILE

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "server"])
def store(request, tmp_path, fresh_tracking_uri, monkeypatch):
    """The tracking URI under test: a new SQLite store, or a real `mlflow server` over HTTP."""
    monkeypatch.setenv("RAGJUDGE_CACHE_DIR", str(tmp_path / "cache"))  # each test pays for its own judge calls
    monkeypatch.setenv("RAGJUDGE_OUTPUT_DIR", str(tmp_path / "outputs"))
    uri = (fresh_tracking_uri(tmp_path / "store" / "mlflow.db") if request.param == "sqlite"
           else request.getfixturevalue("mlflow_server"))
    yield uri
    _new_process(monkeypatch)


def _new_process(monkeypatch) -> None:
    """What a new process sees: no active experiment, no experiment variable, the default tracking store."""
    import os

    mlflow.tracking.fluent._active_experiment_id = None
    for var in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(var, raising=False)
    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])


def _experiment(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _human(answer: str, reference: str) -> float:
    """A person's correctness label: 5 when the answer carries most of the reference's content words, 1 when it
    declines or carries none of them, 3 in between (independent of the judge's rules)."""
    words = {w for w in re.findall(r"[a-z0-9]+", reference.lower()) if len(w) > 3}
    if not isinstance(answer, str) or answer == example_rag.NOT_FOUND or not words:
        return 1.0
    share = len(words & set(re.findall(r"[a-z0-9]+", answer.lower()))) / len(words)
    return 5.0 if share >= 0.5 else 3.0 if share > 0.15 else 1.0


def _fill(path: Path, metric: str = "correctness", fn=None) -> pd.DataFrame:
    frame = pd.read_csv(path, dtype={"row_id": str, "run_id": str, "item_id": str})
    fn = fn or (lambda r: _human(r["answer"], r["reference"]))
    frame[metric] = [fn(r) for _, r in frame.iterrows()]
    frame.to_csv(path, index=False)
    return frame


# ----------------------------------------------------------------------------- 1. runs outside experiment 0


def test_the_quickstart_then_label_sample_and_calibrate_in_its_named_experiment(store, tmp_path, monkeypatch, capsys):
    """docs/calibration.md's loop after the main job: quickstart -> label-sample -> fill -> calibrate."""
    exp = _experiment("quickstart")
    assert main(["quickstart", "--tracking-uri", store, "--experiment", exp]) == 0
    out = capsys.readouterr().out
    parent = re.search(r"parent run ([0-9a-f]{32})", out).group(1)
    nxt = re.search(r"next, calibrate .*?: (\S+) (label-sample .*)$", out, re.M)
    assert nxt is not None, out  # the quickstart prints the next command, with this store
    args = nxt.group(2).split()
    assert args[args.index("--tracking-uri") + 1].endswith(store.rsplit("/", 1)[-1])
    _new_process(monkeypatch)
    labels = tmp_path / "labels.csv"
    args[args.index("--out") + 1] = str(labels)
    assert main(args) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "120 rows to label" in said and f"calibrate {parent} --labels {labels}" in said
    _fill(labels)
    _new_process(monkeypatch)
    assert main(["calibrate", parent, "--labels", str(labels), "--tracking-uri", store]) == 0, capsys.readouterr().err
    summary = capsys.readouterr().out
    assert "calibrated difference" in summary and "from 40 labels" in summary

    client = MlflowClient(store)
    children = client.search_runs([client.get_run(parent).info.experiment_id],
                                  filter_string=f"tags.`ragjudge.sweep.parent` = '{parent}'")
    assert len(children) == 3
    for child in children:
        m = child.data.metrics
        assert m["correctness/n_labelled"] == m["correctness/n_scored"]  # every row labelled: the scored ones count
        assert m["correctness/ppi_ci_low"] <= m["correctness/ppi_mean"] <= m["correctness/ppi_ci_high"]
    mlflow.set_tracking_uri(store)
    table = load_run_table(parent, COMPARISON_FILE)
    assert set(CALIBRATED_COLUMNS) <= set(table.columns) and table["ppi_diff"].notna().any()


def test_reading_runs_back_from_a_named_experiment_in_python(store, monkeypatch):
    exp = _experiment("python-read")
    questions = example_rag.sample_questions().head(12)
    result = rj.sweep(example_rag.answer, [{"chunk_size": 64, "top_k": 3}, {"chunk_size": 8, "top_k": 1}],
                      questions, evaluator_config={"judge": "offline:/lexical", "metrics": ["correctness"]},
                      experiment=exp, tracking_uri=store)
    _new_process(monkeypatch)
    mlflow.set_tracking_uri(store)  # the store, as a user's script sets it; no experiment
    outs = {name: rj.load_output(rid) for name, rid in result.run_ids.items()}
    assert all(len(o.table) == 12 and "correctness/score" in o.table for o in outs.values())
    table = rj.compare_runs(result.run_ids, baseline=result.baseline, metrics=["correctness"])
    expected = result.comparison[result.comparison["metric"] == "correctness"]
    assert table["mean_diff"].tolist() == pytest.approx(expected["mean_diff"].tolist())


def test_review_queue_and_trace_feedback_of_a_genai_run_in_a_named_experiment(store, monkeypatch, capsys):
    mlflow.set_tracking_uri(store)
    mlflow.set_experiment(_experiment("genai"))
    rng = np.random.default_rng(1)
    truth = rng.integers(1, 6, size=40).astype(float)
    with mlflow.start_run() as run:
        for i in range(40):
            with mlflow.start_span(name="rag") as span:
                span.set_inputs({"question": f"q{i}"})
                span.set_outputs({"answer": f"a{i}"})
    traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list", flush=True)
    judge_src = AssessmentSource(source_type="LLM_JUDGE", source_id="openai:/gpt-4o-mini")
    for i, t in enumerate(sorted(traces, key=lambda t: json.loads(t.data.response)["answer"])):
        mlflow.log_feedback(trace_id=t.info.trace_id, name="correctness", value=min(5.0, truth[i] + (i % 2)),
                            source=judge_src)
        mlflow.log_feedback(trace_id=t.info.trace_id, name="correctness", value=truth[i],
                            source=AssessmentSource(source_type="HUMAN", source_id="ann"))
    rid = run.info.run_id
    _new_process(monkeypatch)
    assert main(["label-sample", rid, "--review-queue", "--metrics", "correctness", "--n", "5",
                 "--tracking-uri", store]) == 0, capsys.readouterr().err
    assert "review queue" in capsys.readouterr().out
    _new_process(monkeypatch)
    assert main(["calibrate", rid, "--metrics", "correctness", "--tracking-uri", store]) == 0, capsys.readouterr().err
    assert "from 40 human labels" in capsys.readouterr().out
    assert "correctness/ppi_mean" in MlflowClient(store).get_run(rid).data.metrics


# ----------------------------------------------------------------------------- 2. embeddings for a local server


@pytest.fixture
def local_judge(fake_llm, monkeypatch) -> str:
    """An OpenAI-compatible server of the user's own, and the base install: no local embedding model."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-server")
    monkeypatch.setenv("MLFLOW_RAGJUDGE_LOCAL_MODEL", str(Path("/nonexistent/model")))
    fake_llm.set_handler(CompliantModel("json_schema"))
    return f"openai:/m?base_url={fake_llm.openai_base_url}"


def _data(tmp_path: Path, n: int = 3) -> Path:
    path = tmp_path / "data.jsonl"
    rows = [json.loads(line) for line in (Path(rj.__file__).parent / "data" / "sample_rag.jsonl")
            .read_text().splitlines()][:n]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    return path


def test_answer_relevancy_against_a_local_server_from_the_cli(store, local_judge, fake_llm, tmp_path, capsys):
    data, exp = _data(tmp_path), _experiment("local-server")
    base = ["evaluate", str(data), "--judge", local_judge, "--experiment", exp, "--tracking-uri", store]
    # by default: skipped, and the summary says so, with the CLI form of the fix pointing at the user's server
    assert main(base) == 0
    out = capsys.readouterr().out
    skipped = out[out.index("skipped (not in this run):"):]
    assert "answer_relevancy: needs embeddings" in skipped and "--embeddings URI" in skipped
    assert f"base_url={fake_llm.openai_base_url}" in skipped and "embeddings='" not in out
    # asked for by name without embeddings: exit 2 before any call, with the CLI form
    sent = fake_llm.request_count
    assert main([*base, "--metrics", "correctness,answer_relevancy"]) == 2
    err = capsys.readouterr().err
    assert "--embeddings URI" in err and "embeddings='" not in err and fake_llm.request_count == sent
    # with --embeddings: scored, through the server's embeddings API
    assert main([*base, "--metrics", "answer_relevancy", "--embeddings",
                 f"openai:/embedder?base_url={fake_llm.openai_base_url}"]) == 0
    assert any(r.api == "openai_embeddings" for r in fake_llm.requests)
    runs = MlflowClient(store).search_runs([MlflowClient(store).get_experiment_by_name(exp).experiment_id],
                                           order_by=["attributes.start_time DESC"])
    assert runs[0].data.metrics["answer_relevancy/n_scored"] == 3


# ----------------------------------------------------------------------------- 3 + 9. pipeline files, data names


def test_a_pipeline_file_that_imports_its_neighbour_and_the_data_files_name(store, tmp_path, monkeypatch, capsys):
    code = tmp_path / "my_rag"
    code.mkdir()
    (code / "retrieval_helpers.py").write_text("def shout(q):\n    return q.upper()\n", encoding="utf-8")
    (code / "pipe.py").write_text("from retrieval_helpers import shout\n\n\ndef answer(question, *, style):\n"
                                  "    return shout(question) if style == 'loud' else question\n", encoding="utf-8")
    data = tmp_path / "capital_questions.jsonl"
    data.write_text("\n".join(json.dumps({"question": q, "reference": q}) for q in ("Where is Rome?", "Why?")),
                    encoding="utf-8")
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"style": ["loud", "quiet"]}), encoding="utf-8")
    monkeypatch.chdir(tmp_path / "my_rag" / "..")  # not the pipeline's folder: its directory goes on the path itself
    exp = _experiment("pipeline-file")
    assert main(["sweep", str(data), "--pipeline", f"{code / 'pipe.py'}:answer", "--grid", str(grid),
                 "--metrics", "lexical", "--experiment", exp, "--tracking-uri", store]) == 0, capsys.readouterr().err
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name(exp).experiment_id])
    parent = next(r for r in runs if r.data.tags.get("ragjudge.sweep") == "parent")
    assert parent.info.run_name.startswith("sweep-capital_questions-")
    assert parent.inputs.dataset_inputs[0].dataset.name == "capital_questions"
    capsys.readouterr()
    # a pipeline that cannot be imported: exit 2, the file and the error named, nothing logged
    (code / "broken.py").write_text("import not_installed_anywhere\n\ndef answer(q):\n    return q\n", encoding="utf-8")
    (code / "typo.py").write_text("def answer(q)\n    return q\n", encoding="utf-8")
    for name, expected in (("broken.py", "No module named 'not_installed_anywhere'"), ("typo.py", "SyntaxError")):
        exp2 = _experiment("broken-pipeline")
        assert main(["sweep", str(data), "--pipeline", f"{code / name}:answer", "--grid", str(grid),
                     "--experiment", exp2, "--tracking-uri", store]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and name in err and expected in err
        made = client.get_experiment_by_name(exp2)
        assert made is None or not client.search_runs([made.experiment_id])


def test_a_dataframe_keeps_its_name_in_a_sweep(store):
    questions = pd.DataFrame({"question": ["Where is Rome?"], "reference": ["Italy"]})
    questions.attrs["name"] = "capitals-v2"
    result = rj.sweep(lambda q, **p: "Italy", [{"v": 1}, {"v": 2}], questions,
                      evaluator_config={"metrics": ["lexical"]}, experiment=_experiment("df-name"),
                      tracking_uri=store)
    run = MlflowClient(store).get_run(result.parent_run_id)
    assert run.inputs.dataset_inputs[0].dataset.name == "capitals-v2" and "capitals-v2" in run.info.run_name


# ----------------------------------------------------------------------------- 4. a tracking store that is down


class _Silent:
    """A TCP server that accepts connections and never answers: a hung tracking server. Counts connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.held: list[socket.socket] = []
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.mark.parametrize("kind", ["refused", "hung", "sqlite_unusable"])
def test_a_store_that_is_down_fails_at_once_before_any_judge_call(kind, local_judge, fake_llm, tmp_path, monkeypatch,
                                                                  capsys):
    from mlflow_ragjudge.adapters import tracking

    monkeypatch.setattr(tracking, "TRACKING_CHECK_TIMEOUT_S", 1.0)
    silent = None
    if kind == "refused":
        uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    elif kind == "hung":
        silent = _Silent()
        uri = f"http://127.0.0.1:{silent.port}"
    else:
        (tmp_path / "a-file").write_text("x")
        uri = f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}"
    try:
        code = main(["evaluate", str(_data(tmp_path)), "--judge", local_judge, "--metrics", "correctness",
                     "--experiment", "x", "--tracking-uri", uri])
        err = capsys.readouterr().err
        assert code == 2 and fake_llm.request_count == 0, err
        assert "Nothing was sent to the judge." in err and "Traceback" not in err
        if kind != "sqlite_unusable":
            # one request with a short timeout, said in seconds -- not MLflow's minutes of retries
            assert re.search(r"did not answer \(.*checked once, \d+\.\d s, timeout 1 s\)", err), err
        if silent is not None:
            assert silent.accepted == 1  # MLflow's client never got to retry
        code = main(["label-sample", "0123456789abcdef0123456789abcdef", "--out", str(tmp_path / "l.csv"),
                     "--tracking-uri", uri])
        assert code == 2 and "Traceback" not in capsys.readouterr().err
    finally:
        if silent is not None:
            silent.close()


# ----------------------------------------------------------------------------- 5. honest counters


def _failing_rows_handler(model):
    """The compliant model, except that any request about a row whose answer carries the marker 'zzfail' gets an
    HTTP 400 -- a permanent judge failure on those rows, whatever the prompt's wording."""
    def handle(request):
        if "zzfail" in json.dumps(request.body):
            return Reply.error(400, "This request cannot be processed.")
        return model(request)
    return handle


def test_counters_say_what_they_count(store, fake_llm, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-counters")
    fake_llm.set_handler(_failing_rows_handler(CompliantModel("json_schema")))
    judge = f"openai:/m?base_url={fake_llm.openai_base_url}"
    rows = [{"question": f"What does archive {i} hold?", "answer": f"Archive {i} holds maps." if i == 0
             else f"zzfail archive {i}", "reference": f"Archive {i} holds maps.",
             "contexts": [f"Archive {i} holds maps and charts."]} for i in range(10)]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    exp = _experiment("counters")
    args = ["evaluate", str(path), "--judge", judge, "--metrics", "faithfulness,context_precision,context_recall",
            "--max-error-rate", "1", "--experiment", exp, "--tracking-uri", store]
    assert main(args) == 0
    first = capsys.readouterr().out
    line = next(x for x in first.splitlines() if x.split()[:1] == ["faithfulness"])
    assert line.split()[2:6] == ["1", "0", "9", "(10)"]  # scored, abstained, failed (of rows)
    client = MlflowClient(store)
    eid = client.get_experiment_by_name(exp).experiment_id
    m = client.search_runs([eid], order_by=["attributes.start_time DESC"])[0].data.metrics
    assert (m["faithfulness/count"], m["faithfulness/n_scored"], m["faithfulness/n_failed"]) == (10, 1, 9)
    # the summary prints the run's totals as logged: nothing was in the cache yet; identical calls were sent once
    # (context precision and recall share one verdict call per row, and the reference's statements)
    assert m["judge/cache_hits"] == 0 == sum(v for k, v in m.items() if re.fullmatch(r"judge/[a-z_]+/cache_hits", k))
    assert m["judge/shared"] >= sum(v for k, v in m.items() if re.fullmatch(r"judge/[a-z_]+/shared", k)) >= 9
    assert f"{int(m['judge/shared'])} shared by identical calls of this run" in first
    requests = sum(v for k, v in m.items() if re.fullmatch(r"judge/[a-z_]+/requests", k))
    assert f"{int(requests)} requests sent, 0 answered from the cache" in first
    # an identical re-run: what was answered comes from the cache (the failed rows are asked again: a failure is
    # never cached), and the summary says as many cache hits as the metrics logged
    assert main(args) == 0
    second = capsys.readouterr().out
    m2 = client.search_runs([eid], order_by=["attributes.start_time DESC"])[0].data.metrics
    hits = sum(v for k, v in m2.items() if re.fullmatch(r"judge/[a-z_]+/cache_hits", k))
    assert hits > 0 and m2["judge/cache_hits"] == hits
    assert m2["judge/faithfulness/requests"] == 9 and m2["judge/context_precision/requests"] == 0
    assert f"9 requests sent, {int(hits)} answered from the cache" in second


# ----------------------------------------------------------------------------- 6. the calibration dead end


def _abstaining_rows(n: int = 40, unsure: int = 11) -> pd.DataFrame:
    rows = []
    for i in range(n):
        answer = "I don't know." if i < unsure else (f"Archive {i} is in Town{i}." if i % 3 else "It is up north.")
        rows.append({"question": f"Which town keeps archive {i}?", "answer": answer, "reference": f"Town{i}",
                     "human": 1.0 if i < unsure or i % 3 == 0 else 5.0})
    return pd.DataFrame(rows)


def test_every_row_labelled_but_the_judge_abstained_says_what_to_do(store, tmp_path, monkeypatch, capsys):
    path = tmp_path / "rows.csv"
    _abstaining_rows().to_csv(path, index=False)
    exp = _experiment("dead-end")
    # in the run: no calibrated estimate, the reason, and what the labels alone say -- the run completes
    assert main(["evaluate", str(path), "--metrics", "correctness", "--human-labels", "correctness=human",
                 "--experiment", exp, "--tracking-uri", store]) == 0
    out = capsys.readouterr().out
    assert "29 labelled row(s) have a judge score, fewer than the 30" in out
    assert "(40 labelled, 11 of them not scored by the judge)" in out and "from 40 labels" in out
    client = MlflowClient(store)
    run = client.search_runs([client.get_experiment_by_name(exp).experiment_id])[0]
    assert run.data.metrics["correctness/labels_only_n"] == 40 and "correctness/ppi_mean" not in run.data.metrics
    # after the run: label every row, calibrate -> exit 2 saying what happened and the ways out
    _new_process(monkeypatch)
    labels = tmp_path / "labels.csv"
    assert main(["label-sample", run.info.run_id, "--n", "40", "--out", str(labels), "--tracking-uri", store]) == 0
    truth = dict(zip(_abstaining_rows()["question"], _abstaining_rows()["human"]))
    _fill(labels, fn=lambda r: truth[r["question"]])
    capsys.readouterr()
    assert main(["calibrate", run.info.run_id, "--labels", str(labels), "--tracking-uri", store]) == 2
    err = capsys.readouterr().err
    assert "40 row(s) are labelled; the judge abstained on 11 and failed on 0 of them" in err
    assert "evaluate more questions" in err and "calibrate another metric" in err
    assert f"--labels {labels} --labels-only" in err
    assert main(["calibrate", run.info.run_id, "--labels", str(labels), "--labels-only", "--tracking-uri", store]) == 0
    assert "labels alone" in capsys.readouterr().out
    m = client.get_run(run.info.run_id).data.metrics
    human = _abstaining_rows()["human"]
    assert m["correctness/labels_only_mean"] == pytest.approx(human.mean())
    half = 1.959963984540054 * human.std(ddof=0) / np.sqrt(40)
    assert m["correctness/labels_only_ci_high"] == pytest.approx(human.mean() + half)


# ----------------------------------------------------------------------------- 8. BERTScore only when asked for


def test_bertscore_runs_only_when_asked_for(store, tmp_path, capsys):
    from mlflow_ragjudge.core.errors import LocalModelUnavailable
    from mlflow_ragjudge.metrics.lexical import BertScorer

    exp, data = _experiment("bertscore"), _data(tmp_path)
    base = ["evaluate", str(data), "--metrics", "lexical", "--experiment", exp, "--tracking-uri", store]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "bertscore_f1" not in out  # not computed, and not a "skipped" line either: nobody asked for it
    try:
        BertScorer.load()
    except LocalModelUnavailable:  # the light install: asking for it is a clear input error, before any work
        assert main([*base, "--bertscore"]) == 2
        assert "bertscore=True but BERTScore is unavailable" in capsys.readouterr().err
        return
    assert main([*base, "--bertscore"]) == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name(exp).experiment_id],
                              order_by=["attributes.start_time ASC"])
    assert "bertscore_f1/mean" not in runs[0].data.metrics and 0 < runs[1].data.metrics["bertscore_f1/mean"] <= 1


# ----------------------------------------------------------------------------- 7. hints that work


def test_the_printed_way_to_the_ui_works_for_the_store(store, tmp_path, capsys):
    exp = _experiment("hints")
    assert main(["evaluate", str(_data(tmp_path)), "--metrics", "correctness", "--experiment", exp,
                 "--tracking-uri", store]) == 0
    out = capsys.readouterr().out
    run_id = re.search(r"MLflow run ([0-9a-f]{32})", out).group(1)
    eid = MlflowClient(store).get_run(run_id).info.experiment_id
    if store.startswith("http"):
        assert f"open it at {store}/#/experiments/{eid}/runs/{run_id}" in out
        assert "--backend-store-uri http" not in out
        import urllib.request

        with urllib.request.urlopen(f"{store}/", timeout=30) as page:  # the address serves the UI
            assert page.status == 200 and b"<html" in page.read().lower()
    else:
        mlflow_cmd = str(Path(sys.executable).parent / "mlflow")
        hint = re.search(r"view it with: (\S+) ui --backend-store-uri (sqlite:///\S+)", out)
        assert hint is not None and Path(hint.group(1)).resolve() == Path(mlflow_cmd).resolve()
        assert Path(hint.group(2)[len("sqlite:///"):]).is_absolute()


def test_the_quickstart_script_says_what_it_does():
    header = [line for line in (Path(__file__).parents[1] / "scripts" / "quickstart.sh").read_text().splitlines()
              if line.startswith("#")]
    text = " ".join(header)
    assert "sweep" in text and "three variants" in text and "label-sample" in text


# ----------------------------------------------------------------------------- 10. saved results, logged later


def test_results_saved_after_exit_5_are_logged_later_with_the_printed_command(store, local_judge, fake_llm, tmp_path,
                                                                              monkeypatch, capsys):
    mlflow.set_tracking_uri(store)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    broken = _experiment("broken-artifacts")
    MlflowClient(store).create_experiment(broken, artifact_location=(blocker / "artifacts").as_uri())
    code = main(["evaluate", str(_data(tmp_path)), "--judge", local_judge, "--metrics", "correctness",
                 "--experiment", broken, "--tracking-uri", store])
    err = capsys.readouterr().err
    assert code == 5
    command = re.search(r"log them with: (\S+) (log-saved .*)$", err, re.M)
    assert command is not None, err
    args = command.group(2).split()
    folder = Path(args[1])
    saved_metrics = json.loads((folder / "metrics.json").read_text())
    sent = fake_llm.request_count
    good = _experiment("recovered")
    args[args.index("--experiment") + 1] = good  # the broken experiment cannot take artifacts: log elsewhere
    _new_process(monkeypatch)
    assert main(args) == 0, capsys.readouterr().err
    assert "logged from" in capsys.readouterr().out and fake_llm.request_count == sent  # nothing judged again
    client = MlflowClient(store)
    run = client.search_runs([client.get_experiment_by_name(good).experiment_id])[0]
    assert run.data.metrics == pytest.approx(saved_metrics)
    mlflow.set_tracking_uri(store)
    assert len(rj.load_output(run.info.run_id).table) == 3


# ----------------------------------------------------------------------------- Ctrl-C (issue 24)


def test_ctrl_c_logs_what_is_done_as_a_killed_run_in_its_named_experiment(store, local_judge, fake_llm, tmp_path,
                                                                          monkeypatch, capsys):
    import os
    import signal
    import threading

    monkeypatch.setenv("RAGJUDGE_STOP_GRACE", "30")
    fake_llm.latency = 0.2
    path = _data(tmp_path, n=12)
    exp = _experiment("stopped")
    args = ["evaluate", str(path), "--judge", local_judge, "--metrics", "correctness", "--max-concurrency", "2",
            "--experiment", exp, "--tracking-uri", store]

    def interrupt() -> None:
        fake_llm.wait_for_requests(4, timeout=60)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "stopped by SIGINT" in err and "run the same command again" in err
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name(exp).experiment_id])
    assert run.info.status == "KILLED" and run.data.tags["ragjudge.status"] == "interrupted"
    assert 1 <= run.data.metrics["correctness/n_scored"] < 12
    fake_llm.latency = 0.0
    assert main(args) == 0  # finished by the same command, in the same experiment
    finished = [r for r in client.search_runs([client.get_experiment_by_name(exp).experiment_id])
                if r.info.status == "FINISHED"]
    assert len(finished) == 1 and finished[0].data.metrics["correctness/n_failed"] == 0
