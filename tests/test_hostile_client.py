"""The judge client under hostile servers (issue 40, cases 2, 3, 4 and 11): every wait for the server's word is
bounded by ``max_retry_time`` (one rule: a wait that would pass the call's retry budget fails the call now,
``rate_limited``), ``timeout`` bounds a whole request (a body that trickles in included), no request leaves after a
stop in Python, and no header value, however absurd, breaks a row. Real openai and anthropic SDKs against the fake
server (and, for the trickle, a raw socket server); bounds are derived from the configured values."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import mlflow
import pandas as pd
import pytest
from compliant_model import CompliantModel
from fakellm import Reply

from mlflow_ragjudge import evaluate_frame
from mlflow_ragjudge.llm.backends import ChatRequest
from mlflow_ragjudge.llm.backends._sdk import parse_rate_headers, parse_retry_after
from mlflow_ragjudge.llm.backends.anthropic import AnthropicBackend
from mlflow_ragjudge.llm.backends.openai import OpenAIBackend
from mlflow_ragjudge.llm.client import JudgeClient, ProviderGate

KEY_OPENAI = "sk-test-hostile-0123456789"
KEY_ANTHROPIC = "sk-ant-hostile-0123456789"


def _backend(api: str, openai_url: str, anthropic_url: str):
    if api == "openai":
        return OpenAIBackend("m", base_url=openai_url, api_key=KEY_OPENAI, structured="none")
    return AnthropicBackend("claude-test", base_url=anthropic_url, api_key=KEY_ANTHROPIC)


def _client(fake_llm, api: str = "openai", **kw) -> JudgeClient:
    """A client of the fake server with no cache and a gate of its own."""
    client = JudgeClient(_backend(api, fake_llm.openai_base_url, fake_llm.anthropic_base_url), cache=False, **kw)
    client.gate = ProviderGate()
    return client


def _req(i: int) -> ChatRequest:
    return ChatRequest.of([{"role": "user", "content": f"question {i}"}])


def _calls_within(client: JudgeClient, n: int, bound: float) -> list:
    """``n`` calls at once, one per thread; fails when they have not all ended within ``bound`` seconds (a wait past
    the retry budget), or when one raised (in a run, the row's ``internal_error``). Daemon threads: a hang fails the
    test instead of holding the process."""
    results: list = []
    lock = threading.Lock()

    def work(i: int) -> None:
        try:
            res = client.call(_req(i))
        except Exception as e:  # noqa: BLE001 - a run's engine makes this the row's internal_error
            res = e
        with lock:
            results.append(res)

    pool = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    t0 = time.monotonic()
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=max(0.0, bound - (time.monotonic() - t0)))
    stuck = sum(t.is_alive() for t in pool)
    assert not stuck, f"{stuck} of {n} calls still waiting after {bound:g} s (calls ended: {len(results)})"
    raised = [f"internal_error: {type(r).__name__}: {r}" for r in results if isinstance(r, Exception)]
    assert not raised, raised
    return results


# --------------------------------------------------------------------------- case 2: every wait bounded


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_case_02_a_long_retry_after_fails_the_waiting_rows_now(fake_llm, api):
    """A 429 asking for an hour of quiet, with a retry budget of 3 s: the refused call fails ``rate_limited`` at once,
    and every call behind it (8 at once) -- which would wait for the same hour -- fails now too, without sending
    anything."""
    budget = 3.0
    fake_llm.script(Reply.error(429, "come back in an hour", retry_after=3600))
    client = _client(fake_llm, api, max_retry_time=budget)
    first = client.call(_req(-1))
    assert first.failure is not None and first.failure.value == "rate_limited" and "retry budget" in first.error
    results = _calls_within(client, 8, bound=budget)
    assert [r.failure.value for r in results if r.failure] == ["rate_limited"] * 8
    assert all("max_retry_time" in r.error for r in results), results[0].error
    assert fake_llm.request_count == 1  # the hour is the server's word: nothing else was sent


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_case_02_an_announced_budget_of_zero_with_a_distant_reset_fails_now(fake_llm, api):
    """A reply announcing 0 requests left until a reset an hour away: nothing in flight can bring a fresher count,
    so the calls behind it fail ``rate_limited`` now instead of waiting for the hour."""
    budget = 3.0
    if api == "openai":
        headers = {"x-ratelimit-limit-requests": "100", "x-ratelimit-remaining-requests": "0",
                   "x-ratelimit-reset-requests": "1h0m0s"}
    else:
        reset = (datetime.now(UTC) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
        headers = {"anthropic-ratelimit-requests-limit": "100", "anthropic-ratelimit-requests-remaining": "0",
                   "anthropic-ratelimit-requests-reset": reset}
    fake_llm.script(Reply(text="the last one", headers=headers))
    client = _client(fake_llm, api, max_retry_time=budget)
    assert client.call(_req(-1)).ok
    results = _calls_within(client, 6, bound=budget)
    assert [r.failure.value for r in results if r.failure] == ["rate_limited"] * 6
    assert "budget" in results[0].error and "max_retry_time" in results[0].error
    assert fake_llm.request_count == 1


def test_case_02_a_short_cool_down_within_the_budget_is_still_waited_out(fake_llm):
    """The rule only cuts waits past the budget: a 429 asking for a second, with a budget of 30 s, is waited out and
    every call succeeds."""
    fake_llm.script(Reply.error(429, "a moment", retry_after=1))
    client = _client(fake_llm, max_retry_time=30.0)
    results = _calls_within(client, 6, bound=30.0)
    assert all(r.ok for r in results) and len(results) == 6


# --------------------------------------------------------------------------- case 3: a trickled reply


def _openai_body() -> bytes:
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    return json.dumps(body).encode()


def _anthropic_body() -> bytes:
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}
    return json.dumps(body).encode()


class TrickleServer:
    """A raw HTTP server that answers every request with its status line and headers at once, then its body one
    byte every ``every`` seconds (a slow proxy, a stalled stream): no single read waits long, the whole reply takes
    ``len(body) * every`` seconds."""

    def __init__(self, body: bytes, every: float) -> None:
        self.body, self.every = body, every
        self.requests = 0
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
                while len(rest) < length:
                    rest += conn.recv(65536)
                self.requests += 1
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             + f"content-length: {len(self.body)}\r\n\r\n".encode())
                for i in range(len(self.body)):
                    if self._stop.wait(self.every):
                        return
                    conn.sendall(self.body[i:i + 1])
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_case_03_a_reply_that_trickles_in_is_bounded_by_the_timeout(api):
    """Headers at once, then one byte every 0.3 s (each read well within the timeout; the whole body would take
    about a minute): with ``timeout=1`` each attempt ends at its timeout, as ``timeout``, and is retried per the
    policy; the call ends within ``max_attempts x timeout`` (no backoff in the tests) and some slack for the reads
    under way."""
    timeout, attempts, every = 1.0, 2, 0.3
    body = _openai_body() if api == "openai" else _anthropic_body()
    server = TrickleServer(body + b" " * 40, every)
    try:
        client = JudgeClient(_backend(api, server.url + "/v1", server.url), cache=False, timeout=timeout,
                             max_attempts=attempts)
        client.gate = ProviderGate()
        t0 = time.monotonic()
        res = client.call(_req(0))
        took = time.monotonic() - t0
    finally:
        server.close()
    assert res.failure is not None and res.failure.value == "timeout", res.error
    assert res.records[0]["attempts"] == attempts and server.requests == attempts
    bound = attempts * (timeout + every) + 2.0  # each attempt ends at its deadline (one trickled byte late at most)
    assert took < bound, (took, bound)


# --------------------------------------------------------------------------- case 4: nothing sent after a stop

ROWS = pd.DataFrame({
    "question": [f"Question number {i}?" for i in range(12)],
    "answer": [f"Answer {i} is short. It has a second claim {i}." for i in range(12)],
    "reference": [f"Reference {i}." for i in range(12)],
    "contexts": [[f"Context {i}."] for i in range(12)],
})


def _as_reply(value) -> Reply:
    if isinstance(value, Reply):
        return value
    if isinstance(value, dict):
        return Reply(json=value)
    return Reply(text=value)


@pytest.mark.filterwarnings("ignore::mlflow_ragjudge.core.errors.JudgeFailureWarning")
@pytest.mark.parametrize("wait,how", [("cool_down", "evaluate_frame"), ("budget", "evaluate_frame"),
                                      pytest.param("cool_down", "mlflow.models.evaluate", marks=pytest.mark.slow)])
def test_case_04_after_a_stop_in_python_no_request_reaches_the_server(fake_llm, monkeypatch, request, wait, how):
    """The 6th request is answered with a 429 asking for 3 s of quiet (or with an announced budget of 0 for 3 s):
    the other workers wait in the gate; SIGINT comes while they wait. ``evaluate_frame`` (``mlflow.models.evaluate``)
    returns; the cool-down (the budget's reset) then passes, and still no request reaches the server -- and the
    run's worker threads end at the stop, not when the wait would have ended (the process can exit)."""
    cool = 3.0
    model = CompliantModel("json_schema")
    served = threading.Event()
    served_at: list[float] = []
    count = {"n": 0}
    lock = threading.Lock()

    def handler(req):
        with lock:
            count["n"] += 1
            n = count["n"]
        if n == 6:
            served_at.append(time.monotonic())
            served.set()
            if wait == "cool_down":
                return Reply.error(429, "slow down", retry_after=cool)
            reply = _as_reply(model(req))
            reply.headers = {"x-ratelimit-limit-requests": "100", "x-ratelimit-remaining-requests": "0",
                             "x-ratelimit-reset-requests": f"{cool:g}s"}
            return reply
        return model(req)

    fake_llm.set_handler(handler)
    monkeypatch.setenv("RAGJUDGE_STOP_GRACE", "1")

    def stop_while_waiting() -> None:
        served.wait(60)
        time.sleep(0.5)  # the others are in the gate, waiting for the cool-down (the reset)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=stop_while_waiting, daemon=True).start()
    cfg = {"judge": f"openai:/m?base_url={fake_llm.openai_base_url}", "metrics": ["correctness", "faithfulness"],
           "max_concurrency": 4, "cache": False}
    if how == "evaluate_frame":
        out = evaluate_frame(ROWS, cfg)
        assert out.config["interrupted"]["by"] == "SIGINT"
    else:
        request.getfixturevalue("tmp_tracking")
        with mlflow.start_run():
            mlflow.models.evaluate(data=ROWS, predictions="answer", targets="reference", model_type="rag",
                                   evaluators="ragjudge", evaluator_config=cfg)
    returned = fake_llm.request_count
    (t0,) = served_at
    # the run's workers end at the stop (each wait wakes), before the cool-down (the reset) would have ended
    while any(re.fullmatch(r"ragjudge_\d+", t.name) for t in threading.enumerate()) and time.monotonic() < t0 + 30:
        time.sleep(0.05)
    workers_done = time.monotonic()
    time.sleep(max(0.0, t0 + cool + 1.0 - time.monotonic()))  # past the end of the cool-down (the reset)
    assert fake_llm.request_count == returned, "requests reached the server after the stop"
    assert workers_done < t0 + cool, "the run's workers waited for the cool-down after the stop"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::mlflow_ragjudge.core.errors.JudgeFailureWarning")
def test_case_04_a_batch_run_stopped_in_python_sends_nothing_after_it_returned(fake_llm, monkeypatch):
    """The same through the batch API, with no grace: SIGINT once the batch is at the provider (which takes an
    hour). ``evaluate_frame`` returns at once and clears the stop; its calls waiting for the batch and the batch
    coordinator still know their run was stopped: no poll, no new batch reaches the server afterwards (a few poll
    intervals later)."""
    fake_llm.set_handler(CompliantModel("json_schema"))
    fake_llm.batches.delay = 3600.0
    monkeypatch.setenv("RAGJUDGE_STOP_GRACE", "0")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-hostile-batch-01")

    def stop_once_submitted() -> None:
        deadline = time.monotonic() + 60
        while not fake_llm.batches.created and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=stop_once_submitted, daemon=True).start()
    out = evaluate_frame(ROWS.head(4), {"judge": f"openai:/m?base_url={fake_llm.openai_base_url}", "cache": False,
                                        "metrics": ["correctness"], "batch": {"poll_interval": 0.05,
                                                                              "max_poll_interval": 0.1,
                                                                              "progress": False}})
    returned = fake_llm.request_count
    assert out.config["interrupted"]["by"] == "SIGINT" and len(fake_llm.batches.created) == 1
    time.sleep(2.0)  # 20 poll intervals, and a waiting call's look at the stop (every second)
    assert fake_llm.request_count == returned and len(fake_llm.batches.created) == 1


# --------------------------------------------------------------------------- case 11: absurd header values

RETRY_AFTER = [
    {"retry-after": "inf"}, {"retry-after": "1e308"}, {"retry-after": "99999999999"}, {"retry-after": "nan"},
    {"retry-after": "-5"}, {"retry-after": "-inf"}, {"retry-after-ms": "inf"}, {"retry-after-ms": "1e308"},
    {"retry-after-ms": "nan"}, {"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"},
]
BUDGETS = [
    {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "99999999999h"},
    {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "inf"},
    {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1e308s"},
    {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "99999999999"},
    {"x-ratelimit-remaining-requests": "inf", "x-ratelimit-limit-requests": "1e308"},
    {"x-ratelimit-remaining-requests": "nan", "x-ratelimit-reset-requests": "nan"},
    {"x-ratelimit-remaining-requests": "-1e308", "x-ratelimit-reset-requests": "-5s"},
    {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z"},
    {"anthropic-ratelimit-requests-remaining": "1e400", "anthropic-ratelimit-requests-limit": "inf"},
]


@pytest.mark.parametrize("headers", RETRY_AFTER + BUDGETS, ids=lambda h: ";".join(f"{k}={v}" for k, v in h.items()))
def test_case_11_absurd_header_values_are_clamped(fake_llm, headers):
    """Each absurd value on the first reply (a 429 for ``retry-after``, a success for the budget headers), then 6
    calls at once: no row fails ``internal_error``; each ends scored, or ``rate_limited`` by the rule of case 2 (a
    wait past the 2 s retry budget), within that budget."""
    budget = 2.0
    retry = any(k.startswith("retry-after") for k in headers)
    api = "anthropic" if any(k.startswith("anthropic") for k in headers) else "openai"
    fake_llm.script(Reply.error(429, "absurd", headers=headers) if retry else Reply(text="first", headers=headers))
    client = _client(fake_llm, api, max_retry_time=budget)
    first = client.call(_req(-1))
    results = [first, *_calls_within(client, 6, bound=budget + 2.0)]
    outcomes = {"scored" if r.ok else r.failure.value for r in results}
    assert outcomes <= {"scored", "rate_limited"}, [r.error for r in results if not r.ok]
    assert not any("OverflowError" in (r.error or "") for r in results)


@pytest.mark.parametrize("value", ["inf", "1e308", "99999999999", "Fri, 31 Dec 9999 23:59:59 GMT", "1e400"])
def test_case_11_every_header_reader_gives_a_finite_bounded_value(value):
    """One clamp for every header: a wait read from any header is finite and at most ``MAX_HEADER_SECONDS``; a
    count is a plain int; unreadable values (``nan``, negative numbers) are treated as absent."""
    from mlflow_ragjudge.llm.backends.base import MAX_HEADER_SECONDS

    wait = parse_retry_after({"retry-after": value})
    assert wait is not None and 0 <= wait <= MAX_HEADER_SECONDS
    for reset in (value, f"{value}s" if value[0].isdigit() else value):
        info = parse_rate_headers({"x-ratelimit-remaining-requests": value, "x-ratelimit-limit-requests": value,
                                   "x-ratelimit-reset-requests": reset})
        assert info is not None and (info.reset is None or 0 <= info.reset <= MAX_HEADER_SECONDS)
        assert info.remaining is None or isinstance(info.remaining, int)
    info = parse_rate_headers({"anthropic-ratelimit-requests-remaining": "0",
                               "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z"})
    assert info is not None and info.reset == MAX_HEADER_SECONDS
    assert parse_retry_after({"retry-after": "nan"}) is None and parse_retry_after({"retry-after": "-5"}) is None
    assert parse_retry_after({"retry-after-ms": "nan", "retry-after": "2"}) == 2.0
