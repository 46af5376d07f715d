"""Ctrl-C and SIGTERM (issue 24.2): the first stops sending new requests, keeps what arrives for a grace period, logs
what is done with the run marked KILLED and says how to resume; a second Ctrl-C exits at once; a re-run sends only
what was not finished. Real signals, real SDKs against the fake server, requests counted there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import mlflow
import pandas as pd
import pytest
from compliant_model import CompliantModel

from mlflow_ragjudge import Interrupted, evaluate_frame
from mlflow_ragjudge.core.stop import request_stop, stop_on_signals, stop_requested

ROWS = pd.DataFrame({
    "question": [f"Question number {i}?" for i in range(16)],
    "answer": [f"Answer {i} is short. It has a second claim {i}." for i in range(16)],
    "reference": [f"Reference {i}." for i in range(16)],
    "contexts": [[f"Context {i}."] for i in range(16)],
})


def _signal_after(server, requests: int, sig: int = signal.SIGINT, pid: int | None = None) -> dict[str, int]:
    """Send ``sig`` once the server has seen ``requests`` requests; returns what it had seen then."""
    seen: dict[str, int] = {}

    def go() -> None:
        server.wait_for_requests(requests, timeout=60)
        seen["at_signal"] = server.request_count
        seen["in_flight"] = server.in_flight
        os.kill(pid or os.getpid(), sig)

    threading.Thread(target=go, daemon=True).start()
    return seen


def test_ctrl_c_in_process_stops_sending_and_a_rerun_sends_only_the_rest(fake_llm, tmp_path, monkeypatch):
    fake_llm.set_handler(CompliantModel("json_schema"))
    fake_llm.latency = 0.15
    monkeypatch.setenv("RAGJUDGE_STOP_GRACE", "30")  # long enough for every reply in flight to arrive
    cfg = {"judge": f"openai:/m?base_url={fake_llm.openai_base_url}", "metrics": ["correctness", "faithfulness"],
           "max_concurrency": 2, "cache": str(tmp_path / "cache")}
    # what SIGINT did before: Python's KeyboardInterrupt handler, or SIG_IGN in a process a non-interactive shell
    # started in the background (`pytest ... &`)
    before = signal.getsignal(signal.SIGINT)
    seen = _signal_after(fake_llm, 6)
    out = evaluate_frame(ROWS, cfg)
    first = fake_llm.request_count
    assert out.config["interrupted"]["by"] == "SIGINT" and not stop_requested()  # cleared once returned
    # nothing new was sent after the signal: only what was in flight then (at most 2) came in
    assert first <= seen["at_signal"] + 2
    statuses = [r.status.value for res in out.results.values() for r in res]
    reasons = {r.reason for res in out.results.values() for r in res if r.status.value == "failed"}
    assert "scored" in statuses and reasons == {"interrupted"}
    assert out.config["interrupted"]["results_not_judged"] == statuses.count("failed")
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back

    fake_llm.reset()
    fake_llm.set_handler(CompliantModel("json_schema"))
    fake_llm.latency = 0.0
    again = evaluate_frame(ROWS, cfg)
    resumed = fake_llm.request_count
    assert "interrupted" not in again.config
    assert not any(r.reason == "interrupted" for res in again.results.values() for r in res)
    fake_llm.reset()
    fake_llm.set_handler(CompliantModel("json_schema"))
    fresh = evaluate_frame(ROWS, {**cfg, "cache": False})
    total = fake_llm.request_count
    # every reply that arrived (before or after the signal) was kept: the two runs bought the whole run once
    assert first + resumed == total
    columns = [c for c in fresh.table.columns if c.endswith(("/score", "/status"))]
    pd.testing.assert_frame_equal(again.table[columns], fresh.table[columns])  # the same results as an unbroken run


def test_a_stop_before_any_judge_call_sends_and_logs_nothing(fake_llm):
    fake_llm.set_handler(CompliantModel("json_schema"))
    with stop_on_signals():  # as the CLI and a sweep hold it: the stop came while the input was being checked
        request_stop("SIGTERM")
        with pytest.raises(Interrupted, match="before any judge call") as e:
            evaluate_frame(ROWS, {"judge": f"openai:/m?base_url={fake_llm.openai_base_url}", "cache": False,
                                  "metrics": ["correctness"]})
    assert e.value.signal == "SIGTERM" and fake_llm.request_count == 0
    assert not stop_requested()  # the outermost scope clears it on the way out


def _cli(fake_llm, tmp_path, *extra: str, batch: bool = False) -> tuple[list[str], dict[str, str]]:
    data = tmp_path / "rows.jsonl"
    ROWS.to_json(data, orient="records", lines=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")}
    env.update(RAGJUDGE_CACHE_DIR=str(tmp_path / "cache"), RAGJUDGE_OUTPUT_DIR=str(tmp_path / "out"),
               OPENAI_API_KEY="sk-test-stop-0001", RAGJUDGE_STOP_GRACE="5")
    cmd = [sys.executable, "-m", "mlflow_ragjudge", "evaluate", str(data), "--judge",
           f"openai:/m?base_url={fake_llm.openai_base_url}", "--metrics", "correctness,faithfulness",
           "--experiment", "stops", *extra]
    return cmd, env


def _runs(uri: str) -> list:
    client = mlflow.MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name("stops").experiment_id])


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_cli_logs_what_is_done_marks_the_run_killed_and_says_how_to_resume(fake_llm, tmp_path,
                                                                               fresh_tracking_uri, sig, code):
    fake_llm.set_handler(CompliantModel("json_schema"))
    fake_llm.latency = 0.2
    uri = fresh_tracking_uri(tmp_path / "mlflow.db")
    cmd, env = _cli(fake_llm, tmp_path, "--max-concurrency", "4", "--tracking-uri", uri)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    fake_llm.wait_for_requests(8, timeout=120)
    at_signal = fake_llm.request_count
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)  # a hang fails here, not in CI's timeout
    assert proc.returncode == code, stderr[-3000:]
    assert fake_llm.request_count <= at_signal + 4  # only what was in flight (--max-concurrency 4)
    assert "stopped by" in stderr and "run the same command again" in stderr
    (run,) = _runs(uri)
    assert run.info.status == "KILLED" and run.data.tags["ragjudge.status"] == "interrupted"
    assert run.data.metrics["correctness/n_scored"] >= 1  # what was done is logged

    fake_llm.reset()
    fake_llm.set_handler(CompliantModel("json_schema"))
    fake_llm.latency = 0.0
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert fake_llm.request_count < 2 * len(ROWS) + 2 * len(ROWS)  # not the whole run again
    finished = [r for r in _runs(uri) if r.info.status == "FINISHED"]
    assert len(finished) == 1 and finished[0].data.metrics["correctness/n_failed"] == 0


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once_even_with_a_hung_request(fake_llm, tmp_path, fresh_tracking_uri):
    fake_llm.set_handler(CompliantModel("json_schema"))
    fake_llm.latency = 600  # every request hangs
    uri = fresh_tracking_uri(tmp_path / "mlflow.db")
    cmd, env = _cli(fake_llm, tmp_path, "--tracking-uri", uri)
    env["RAGJUDGE_STOP_GRACE"] = "600"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    fake_llm.wait_for_requests(1, timeout=120)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.5)  # the first one is being handled
    assert proc.poll() is None  # still waiting for the hung replies (grace 600 s)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "exiting now" in stderr


@pytest.mark.slow
def test_a_batch_run_stops_waiting_and_a_rerun_reattaches_without_buying_again(fake_llm, tmp_path,
                                                                               fresh_tracking_uri):
    fake_llm.set_handler(CompliantModel("json_schema"))
    fake_llm.batches.delay = 3600.0  # the provider takes its time
    uri = fresh_tracking_uri(tmp_path / "mlflow.db")
    cmd, env = _cli(fake_llm, tmp_path, "--tracking-uri", uri, "--batch",
                    "--config", '{"batch": {"poll_interval": 0.05, "max_poll_interval": 0.2, "progress": false}}')
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not fake_llm.batches.created and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake_llm.batches.created
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    bought = list(fake_llm.batches.submitted)
    assert bought and len(fake_llm.batches.created) == 1  # no second batch after the signal
    (run,) = _runs(uri)
    assert run.info.status == "KILLED"

    fake_llm.batches.delay = 0.05
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    lines = fake_llm.batches.submitted
    assert len(lines) == len(set(lines))  # the first batch's lines were re-attached to, not bought again
    assert lines[:len(bought)] == bought


HUNG_PIPELINE = '''
import os, pathlib, time

CALLS = pathlib.Path(os.environ["CALLS_DIR"])


def answer(question, delay=0):
    (CALLS / f"{os.getpid()}-{time.monotonic_ns()}").write_text(question)
    if question.endswith("3?"):
        time.sleep(600)  # a pipeline call that hangs
    return f"{question} The answer is {delay}."
'''


@pytest.mark.slow
def test_a_sweep_stops_without_waiting_for_a_hung_pipeline_and_ends_its_runs_killed(tmp_path, fresh_tracking_uri):
    (tmp_path / "hung_rag.py").write_text(HUNG_PIPELINE)
    (tmp_path / "grid.json").write_text('{"delay": [0, 1, 2]}')
    pd.DataFrame({"question": [f"Question {i}?" for i in range(8)],
                  "reference": [f"Answer {i}." for i in range(8)]}).to_json(tmp_path / "q.jsonl", orient="records",
                                                                             lines=True)
    calls = tmp_path / "calls"
    calls.mkdir()
    uri = fresh_tracking_uri(tmp_path / "mlflow.db")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")}
    env.update(CALLS_DIR=str(calls), RAGJUDGE_STOP_GRACE="2", RAGJUDGE_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "mlflow_ragjudge", "sweep", "q.jsonl", "--pipeline", "hung_rag.py:answer",
           "--grid", "grid.json", "--workers", "2", "--experiment", "stops", "--tracking-uri", uri,
           "--config", '{"bertscore": false}']
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while len(list(calls.iterdir())) < 5 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)  # the probe's question, then the first variant's: question 3 hangs
    made = len(list(calls.iterdir()))
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)  # without the stop it would wait 600 s for the hung call
    assert proc.returncode == 130, stderr[-3000:]
    assert "stopped by SIGINT after 1 of 3 variants" in stderr
    assert len(list(calls.iterdir())) <= made + 2  # no new pipeline call after the signal (2 workers in flight)
    runs = _runs(uri)
    parent = [r for r in runs if r.data.tags.get("ragjudge.sweep") == "parent"]
    children = [r for r in runs if r.data.tags.get("ragjudge.sweep") == "variant"]
    assert len(parent) == 1 and parent[0].info.status == "KILLED"
    assert parent[0].data.tags["ragjudge.status"] == "interrupted"
    assert len(children) == 1 and children[0].info.status == "KILLED"  # the variant under way; none after it
