"""Judge calls through the providers' batch APIs, end to end through the real ``openai`` and ``anthropic`` SDKs
against the fake server's Files + Batches and Message Batches endpoints (tests/fakebatch.py), answered by the
independent schema-following model."""

from __future__ import annotations

import concurrent.futures.thread
import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from compliant_model import CompliantModel
from fakellm import Reply, embed_text

from mlflow_ragjudge import FakeBackend, InputError, evaluate_frame
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.llm.batch import BatchOptions
from mlflow_ragjudge.llm.cache import CallCache

METRICS = ["correctness", "faithfulness", "answer_relevancy", "context_precision", "context_recall"]
FAST = {"poll_interval": 0.05, "max_poll_interval": 0.2, "progress": False}
TESTS = Path(__file__).resolve().parent


def _rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({
        "question": [f"What does unit {i} do?" for i in range(n)],
        "answer": [f"Unit {i} stores data and sends a report every {i % 7 + 1} days." for i in range(n)],
        "reference": [f"Unit {i} stores data." for i in range(n)],
        "contexts": [[f"Unit {i} stores data for the team.", f"A report is sent by unit {i}."] for i in range(n)],
    })


def _config(server, provider: str = "openai", **extra):
    if provider == "openai":
        judge = f"openai:/gpt-4o-mini?base_url={server.openai_base_url}"
    else:
        judge = f"anthropic:/claude-3-5-haiku-latest?base_url={server.anthropic_base_url}"
    return {"judge": judge, "metrics": METRICS if provider == "openai" else ["correctness", "faithfulness"],
            "embeddings": lambda texts: [embed_text(t) for t in texts],  # no HTTP: the rate limit is for chat
            "context_mode": "generation", **extra}


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-batch-0001")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-batch-0001")


@pytest.fixture
def model(fake_llm):
    fake_llm.set_handler(CompliantModel("json_schema"))
    return fake_llm


def _scores(out) -> pd.DataFrame:
    cols = [c for c in out.table.columns if c.endswith("/score") or c.endswith("/status")]
    return out.table[cols].astype(object).where(out.table[cols].notna(), None)


@pytest.mark.slow
def test_two_hundred_rows_go_through_the_batch_api_with_the_same_scores_at_half_the_price(model, tmp_path):
    df = _rows(200)
    sync = evaluate_frame(df, _config(model, cache=False))
    sync_chat = len(model.requests_for("openai_chat"))
    model.reset()
    model.rate_limit_per_minute = 10  # the synchronous endpoint would take two hours for these calls
    out = evaluate_frame(df, _config(model, cache=str(tmp_path / "cache"), batch=FAST))
    assert model.requests_for("openai_chat") == []  # no synchronous chat request at all
    assert model.rate_limited_count == 0
    lines = model.batches.submitted
    assert len(lines) == sync_chat and len(set(lines)) == len(lines)  # the same calls, each once
    assert 2 <= len(model.batches.created) <= 4  # rounds: claims / statements first, then what needs them
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))
    assert out.metrics["judge/batch_lines"] == sync_chat
    assert out.metrics["judge/cost_usd"] == pytest.approx(sync.metrics["judge/cost_usd"] / 2)
    assert out.metrics["judge/input_tokens"] == sync.metrics["judge/input_tokens"]
    records = [t for t in out.transcripts if not t.get("cache_hit") and not t.get("shared")]
    assert records and all(t["via"] == "batch" and t["batch_id"] in model.batches.created for t in records)
    # an identical re-run is answered by the cache: nothing is submitted
    before = len(model.batches.created)
    again = evaluate_frame(df, _config(model, cache=str(tmp_path / "cache"), batch=FAST))
    assert len(model.batches.created) == before
    pd.testing.assert_frame_equal(_scores(again), _scores(out))


def test_anthropic_message_batches_through_the_real_sdk(model, tmp_path):
    df = _rows(12)
    sync = evaluate_frame(df, _config(model, "anthropic", cache=False))
    sync_calls = len(model.requests_for("anthropic_messages"))
    model.reset()
    out = evaluate_frame(df, _config(model, "anthropic", cache=str(tmp_path / "c"), batch=FAST))
    assert model.requests_for("anthropic_messages") == []
    assert len(model.batches.submitted) == sync_calls
    assert all(b.startswith("msgbatch_") for b in model.batches.created)
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))
    assert out.metrics["judge/cost_usd"] == pytest.approx(sync.metrics["judge/cost_usd"] / 2)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_failed_and_expired_lines_go_into_the_next_round_and_no_row_is_lost(model, tmp_path, provider):
    df = _rows(10)
    sync = evaluate_frame(df, _config(model, provider, cache=False, metrics=["correctness"]))
    model.reset()
    model.batches.expire_batches = 1  # the first batch expires with half its lines answered
    out = evaluate_frame(df, _config(model, provider, cache=str(tmp_path / "c"), metrics=["correctness"],
                                     batch=FAST))
    submitted = model.batches.submitted
    assert len(submitted) == 15 and len(set(submitted)) == 10  # the five expired lines were sent again, once
    assert len(model.batches.created) == 2
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))
    # a line error the server calls transient (500) is retried the same way
    model.reset()
    first = {json.loads(json.dumps(k)) for k in submitted[:3]}
    model.batches.fail_lines = first
    out = evaluate_frame(df, _config(model, provider, cache=False, metrics=["correctness"], batch=FAST))
    assert len(model.batches.submitted) == 13
    assert (out.table["correctness/status"] == sync.table["correctness/status"]).all()


def test_a_line_that_keeps_failing_fails_its_row_with_the_reason(model):
    df = _rows(6)
    compliant = CompliantModel("json_schema")

    def handler(request):
        text = json.dumps(request.body)
        if "unit 3 " in text.lower() or "Unit 3 " in text:
            return Reply.error(400, "This request violates the usage policy of this fake server.")
        return compliant(request)

    sync = evaluate_frame(df, _config(model, cache=False, metrics=["correctness"]))
    model.set_handler(handler)
    model.reset()
    out = evaluate_frame(df, _config(model, cache=False, metrics=["correctness"], batch=FAST))
    status = out.table["correctness/status"]
    assert status[3] == "failed:provider_error" and "usage policy" in out.table["correctness/justification"][3]
    assert status.drop(3).tolist() == sync.table["correctness/status"].drop(3).tolist()  # the other rows as ever
    assert len(model.batches.submitted) == 6  # a permanent error is not retried
    # always expiring: bounded by max_rounds, then the rows fail as timeouts, and the run completes
    model.set_handler(compliant)
    model.reset()
    model.batches.expire_batches = 100
    model.batches.expire_fraction = 0.0
    out = evaluate_frame(df, _config(model, cache=False, metrics=["correctness"],
                                     batch={**FAST, "max_rounds": 2}))
    assert len(model.batches.created) == 2 and len(model.batches.submitted) == 12
    assert set(out.table["correctness/status"]) == {"failed:provider_error"}
    assert "batch_expired" in out.table["correctness/justification"][0]
    assert out.failures and out.failures[0]["metric"] == "correctness"  # reported loudly, not a silent NaN


def test_a_batch_that_does_not_end_in_time_is_cancelled(model):
    model.batches.delay = 30.0
    out = evaluate_frame(_rows(3), _config(model, cache=False, metrics=["correctness"],
                                           batch={**FAST, "max_wait": 0.5, "max_rounds": 1}))
    cancels = [r for r in model.requests_for("openai_batch") if r.path.endswith("/cancel")]
    # each batch cancelled once (on a loaded machine the three calls may reach the provider in two batches)
    assert len(cancels) == len(model.batches.created) >= 1
    assert len({r.path for r in cancels}) == len(cancels)
    assert all(s == "failed:timeout" for s in out.table["correctness/status"])


KILLED_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import pandas as pd
    from test_batch import _rows
    from mlflow_ragjudge import evaluate_frame
    evaluate_frame(_rows(20), {config!r})
""")


@pytest.mark.slow
def test_a_killed_run_re_attaches_to_its_batches_instead_of_submitting_again(model, tmp_path):
    df = _rows(20)
    sync = evaluate_frame(df, _config(model, cache=False, metrics=["correctness", "faithfulness"]))
    model.reset()
    cache = str(tmp_path / "cache")
    config = _config(model, cache=cache, metrics=["correctness", "faithfulness"], batch=FAST)
    del config["embeddings"]  # (a function does not cross to the other process; these metrics need none)
    first_round = _kill_after_first_batch(model, config, tmp_path)  # the first round does not end while it lives
    recorded = CallCache(cache).batches()
    assert recorded and recorded[0]["batch_id"] == model.batches.created[0] and recorded[0]["lines"] == len(first_round)
    # the re-run: the batch has ended meanwhile; its lines are read from it, not submitted again
    model.batches.delay = 0.0
    out = evaluate_frame(df, config)
    assert len(model.batches.submitted) == len(set(model.batches.submitted))  # no line submitted twice
    assert not set(first_round) & set(model.batches.submitted[len(first_round):])
    assert model.requests_for("openai_chat") == []
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))
    reattached = [t for t in out.transcripts if t.get("batch_id") == model.batches.created[0]]
    assert len(reattached) == len(first_round)
    assert CallCache(cache).batches(state="read")


def test_batch_settings_are_checked_before_any_call(model):
    with pytest.raises(InputError, match="offline judge sends nothing"):
        evaluate_frame(_rows(2), judge="offline:/lexical", metrics=["correctness"], batch=True)
    with pytest.raises(ValueError, match="batch has unknown option"):
        evaluate_frame(_rows(2), _config(model, batch={"pol_interval": 1}))
    with pytest.raises(ValueError, match="has no batch API"):
        evaluate_frame(_rows(2), judge=FakeBackend(), metrics=["correctness"], context_mode="none", batch=True)
    assert model.requests == []
    assert BatchOptions.of(True).max_rounds == 3


def test_estimate_shows_synchronous_and_batch_cost_side_by_side(model, tmp_path, capsys):
    path = tmp_path / "data.jsonl"
    _rows(5).to_json(path, orient="records", lines=True)
    code = main(["estimate", str(path), "--judge", f"openai:/gpt-4o-mini?base_url={model.openai_base_url}",
                 "--metrics", "correctness,faithfulness"])
    text = capsys.readouterr().out
    assert code == 0
    sync = float(text.split("~$")[1].split()[0])
    batch = float(text.split("~$")[2].split()[0])
    assert "synchronous" in text and "through the batch API" in text
    # both printed to 4 decimals: each off by at most 0.00005 from its true value, and batch is exactly half
    assert abs(batch - sync / 2) <= 0.00005 + 0.00005 / 2 + 1e-12
    assert model.requests == []


def test_cli_evaluate_with_batch(model, tmp_path, tmp_tracking, capsys, monkeypatch):
    path = tmp_path / "data.jsonl"
    _rows(4).to_json(path, orient="records", lines=True)
    monkeypatch.setenv("RAGJUDGE_CACHE_DIR", str(tmp_path / "cache"))
    code = main(["evaluate", str(path), "--judge", f"openai:/gpt-4o-mini?base_url={model.openai_base_url}",
                 "--metrics", "correctness", "--batch", "--config", json.dumps({"batch": FAST})])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert model.requests_for("openai_chat") == [] and len(model.batches.created) == 1


@pytest.mark.slow
def test_a_sweep_judges_every_variant_through_batches(model, tmp_path, tmp_tracking):
    import mlflow_ragjudge as rj

    questions = _rows(6)[["question", "reference"]]

    def pipeline(question: str, *, style: str) -> dict:
        unit = question.split()[3]
        return {"answer": f"Unit {unit} stores data." if style == "short" else f"Unit {unit} stores data daily.",
                "contexts": [f"Unit {unit} stores data for the team."]}

    result = rj.sweep(pipeline, {"style": ["short", "long"]}, questions, verbose=False,
                      evaluator_config={**_config(model, cache=str(tmp_path / "c"), metrics=["correctness"]),
                                        "batch": FAST})
    assert model.requests_for("openai_chat") == []
    assert len(model.batches.created) == 2 and len(model.batches.submitted) == 12  # one round per variant
    assert set(result.run_ids) == {"style=short", "style=long"}
    for out in result.outputs.values():
        assert out.metrics["judge/batch_lines"] == 6


@pytest.mark.parametrize("mode", ["json_object", "text"])
def test_servers_that_refuse_json_schema_are_negotiated_down_inside_batches(fake_llm, tmp_path, mode):
    """A provider-compatible server whose batch lines refuse ``response_format`` json_schema (or any format): the
    refusals move the connection to a weaker mode, as on the synchronous path, and the calls are sent again in it."""
    from mlflow_ragjudge.llm.backends.openai import forget_negotiations

    fake_llm.set_handler(CompliantModel(mode))
    df = _rows(8)
    metrics = ["correctness", "faithfulness", "context_precision"]
    forget_negotiations()
    sync = evaluate_frame(df, _config(fake_llm, cache=False, metrics=metrics))
    fake_llm.reset()
    forget_negotiations()  # the batch run negotiates from scratch
    out = evaluate_frame(df, _config(fake_llm, cache=str(tmp_path / "c"), metrics=metrics, batch=FAST))
    assert fake_llm.requests_for("openai_chat") == []
    assert out.params["ragjudge.judge.structured"] == mode
    assert not any(s.startswith("failed") for c in out.table.columns if c.endswith("/status") for s in out.table[c])
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))
    refused = len(fake_llm.batches.submitted) - len(set(fake_llm.batches.submitted))
    assert refused > 0  # the first lines were refused and sent again in the weaker mode


# ------------------------------------------------------------ results read line by line (docs/failure-modes.md)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_one_unreadable_result_line_costs_nothing_else(model, tmp_path, provider):
    """A garbage line among a batch's results (OpenAI's output file, Anthropic's results stream) is that line's
    problem only: every other reply is read, and a re-run buys nothing again."""
    df = _rows(8)
    sync = evaluate_frame(df, _config(model, provider, cache=False, metrics=["correctness"]))
    model.reset()
    model.batches.garbage_batches = 100  # every batch's results carry one unreadable line besides the real ones
    cache = str(tmp_path / "c")
    out = evaluate_frame(df, _config(model, provider, cache=cache, metrics=["correctness"], batch=FAST))
    submitted = model.batches.submitted
    assert len(submitted) == 8 and len(set(submitted)) == 8  # each call bought once
    assert len(model.batches.created) == 1
    assert sorted(model.batches.served) == sorted(submitted)  # ... and served once
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))  # nothing served was lost
    # a re-run: every reply is in the cache, nothing is bought again
    again = evaluate_frame(df, _config(model, provider, cache=cache, metrics=["correctness"], batch=FAST))
    assert len(model.batches.submitted) == 8 and len(model.batches.created) == 1
    pd.testing.assert_frame_equal(_scores(again), _scores(sync))


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_torn_result_line_is_the_only_call_asked_again(model, provider):
    """A result line cut in half loses that one reply: that call alone goes into the next round."""
    df = _rows(8)
    sync = evaluate_frame(df, _config(model, provider, cache=False, metrics=["correctness"]))
    model.reset()
    model.batches.garbage_batches = 1
    model.batches.garbage_mode = "truncate"
    out = evaluate_frame(df, _config(model, provider, cache=False, metrics=["correctness"], batch=FAST))
    submitted = model.batches.submitted
    assert len(submitted) == 9 and len(set(submitted)) == 8  # the torn line's call, once more
    assert len(model.batches.created) == 2
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))
    torn = [t for t in out.transcripts if t.get("batch_rounds") == 2]
    assert len(torn) == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_reply_and_an_error_for_the_same_custom_id_keep_the_reply(model, provider):
    df = _rows(8)
    sync = evaluate_frame(df, _config(model, provider, cache=False, metrics=["correctness"]))
    model.reset()
    model.batches.duplicate_errors = 100  # every batch reports its first answered line twice: reply, then a 500
    out = evaluate_frame(df, _config(model, provider, cache=False, metrics=["correctness"], batch=FAST))
    assert len(model.batches.submitted) == 8 and len(model.batches.created) == 1  # nothing bought twice
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))


@pytest.mark.slow
def test_re_attaching_to_a_batch_the_provider_no_longer_has_submits_its_calls_again(model, tmp_path):
    df = _rows(20)
    metrics = ["correctness", "faithfulness"]
    sync = evaluate_frame(df, _config(model, cache=False, metrics=metrics))
    model.reset()
    cache = str(tmp_path / "cache")
    config = _config(model, cache=cache, metrics=metrics, batch=FAST)
    del config["embeddings"]
    first_round = _kill_after_first_batch(model, config, tmp_path)
    gone = model.batches.created[0]
    model.batches.forget(gone)  # deleted, or past the provider's retention: every request about it is a 404
    model.batches.delay = 0.0
    out = evaluate_frame(df, config)
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))  # no row fails for it
    rerun = model.batches.submitted[len(first_round):]
    assert set(first_round) <= set(rerun)  # the lost batch's calls were submitted again ...
    assert len(rerun) == len(set(rerun))  # ... once each
    assert [b["state"] for b in CallCache(cache).batches() if b["batch_id"] == gone] == ["gone"]
    assert all(t.get("batch_rounds") == 1 for t in out.transcripts if t.get("via") == "batch")


def _kill_after_first_batch(model, config, tmp_path) -> list[str]:
    """Run ``_rows(20)`` with ``config`` in another process, kill it once its first batch is submitted and recorded
    (the server is told to take an hour over it); the custom ids that batch carried."""
    model.batches.delay = 3600.0
    env = {**os.environ, "RAGJUDGE_CACHE_DIR": str(tmp_path / "unused")}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN.format(tests=str(TESTS), config=config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not model.batches.created and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # let it record the batch and start polling
    proc.kill()
    proc.wait()
    assert len(model.batches.created) == 1, proc.stderr.read().decode()[-2000:]
    return list(model.batches.submitted)


# ------------------------------------------------------------ no thread dies silently (docs/failure-modes.md)


class _BrokenPipe(io.TextIOBase):
    """stderr whose reader has gone: every write raises, as ``... 2>&1 | head -2`` does once head has exited."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")

    def isatty(self):
        return False


def _within(seconds: float, fn):
    """``fn()`` in a thread; the test fails (instead of hanging) when it has not returned after ``seconds``."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the test below
            box["error"] = e

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        # a hung run: its pool's threads would also hold the interpreter's exit (concurrent.futures joins them then)
        concurrent.futures.thread._threads_queues.clear()
        pytest.fail(f"the evaluation was still running after {seconds:g} s: it hangs")
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.mark.parametrize("bar", [False, True], ids=["batch-progress", "batch-progress+bar"])
def test_a_batch_run_whose_stderr_is_a_broken_pipe_scores_every_row(model, monkeypatch, bar):
    """Progress lines (the batch runner's, written from its coordinator thread, and the tqdm bar) to a stderr whose
    reader has gone are dropped; the run scores every row."""
    df = _rows(6)
    metrics = ["correctness", "faithfulness"]  # two rounds: progress is written while tasks wait
    sync = evaluate_frame(df, _config(model, cache=False, metrics=metrics))
    model.reset()
    monkeypatch.setattr(sys, "stderr", _BrokenPipe())
    out = _within(120, lambda: evaluate_frame(df, _config(model, cache=False, metrics=metrics, progress=bar,
                                                          batch={**FAST, "progress": True})))
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))
    assert len(model.batches.created) == 2 and len(model.batches.submitted) == len(set(model.batches.submitted))


def test_a_coordinator_that_stops_fails_its_calls_with_the_reason_instead_of_hanging(model, monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the coordinator")

    monkeypatch.setattr(CallCache, "record_batch", broken)  # runs on the coordinator thread after each submit
    out = _within(120, lambda: evaluate_frame(_rows(4), _config(model, cache=str(tmp_path / "c"),
                                                                 metrics=["correctness"], batch=FAST)))
    assert set(out.table["correctness/status"]) == {"failed:internal_error"}
    assert all("batch coordinator stopped (RuntimeError: a bug in the coordinator)" in j
               for j in out.table["correctness/justification"])
    assert out.failures and out.failures[0]["metric"] == "correctness"  # reported loudly, the run completed


def _cli_command(model, data: Path) -> list[str]:
    config = {"batch": {**FAST, "progress": True}, "progress": True}
    return [sys.executable, "-m", "mlflow_ragjudge", "evaluate", str(data), "--judge",
            f"openai:/gpt-4o-mini?base_url={model.openai_base_url}", "--metrics", "correctness", "--batch",
            "--config", json.dumps(config)]


def _logged_run(uri: str) -> dict[str, float]:
    from mlflow import MlflowClient

    runs = MlflowClient(uri).search_runs(["0"])
    assert len(runs) == 1
    return runs[0].data.metrics


@pytest.mark.slow
@pytest.mark.parametrize("how", ["2>&1 | head -2", "2>&-"])
def test_cli_batch_run_with_stderr_gone_completes(model, tmp_path, fresh_tracking_uri, how):
    """``ragjudge evaluate ... --batch 2>&1 | head -2`` (both streams become a pipe nobody reads after two lines)
    and ``2>&-`` (no stderr at all): the command ends, exit 0, every row scored and logged. A timeout fails the test
    instead of a hang."""
    data = tmp_path / "data.jsonl"
    _rows(4).to_json(data, orient="records", lines=True)
    uri = fresh_tracking_uri(tmp_path / "mlflow.db")
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "RAGJUDGE_CACHE_DIR": str(tmp_path / "cache")}
    script = f'set -o pipefail; "$@" {how}'
    try:
        done = subprocess.run(["bash", "-c", script, "ragjudge", *_cli_command(model, data)], env=env,
                              capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"`ragjudge evaluate --batch {how}` hung: {e}")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    if how.startswith("2>&1"):
        assert "ragjudge" in done.stdout and "MLflow run" not in done.stdout  # what head let through
    else:
        assert "MLflow run" in done.stdout  # the summary, on stdout
    metrics = _logged_run(uri)  # every row judged: scored, or abstained as the judge said "not sure"; none failed
    assert metrics["correctness/count"] == 4 and metrics["correctness/n_failed"] == 0
    assert metrics["correctness/n_scored"] + metrics["correctness/n_abstained"] == 4
    assert len(model.batches.submitted) == 4 and model.requests_for("openai_chat") == []


def test_repeats_go_through_the_batch_api_each_draw_its_own_line(model, tmp_path):
    """``repeats`` composes with batch mode: every draw of every call is a batch line of its own (its seed differs),
    the same calls the synchronous repeated run sends, and an identical re-run submits nothing."""
    df = _rows(8)
    cfg = _config(model, metrics=["correctness", "faithfulness"], repeats=2, cache=False)
    sync = evaluate_frame(df, cfg)
    sync_chat = len(model.requests_for("openai_chat"))
    model.reset()
    out = evaluate_frame(df, {**cfg, "cache": str(tmp_path / "cache"), "batch": FAST})
    lines = model.batches.submitted
    assert model.requests_for("openai_chat") == []
    assert len(lines) == sync_chat and len(set(lines)) == len(lines)
    assert out.metrics["correctness/repeats"] == 2 and "faithfulness/flip_rate" in out.metrics
    pd.testing.assert_frame_equal(_scores(out), _scores(sync))
    before = len(model.batches.created)
    evaluate_frame(df, {**cfg, "cache": str(tmp_path / "cache"), "batch": FAST})
    assert len(model.batches.created) == before
