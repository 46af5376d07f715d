"""Rate limits at defaults (nothing configured): the budget a server announces in its reply headers is followed,
and a server that only says ``retry-after`` on a 429 teaches a pace that is then kept -- through the real openai
and anthropic SDKs against the fake server's sliding window. Counts only: no clock is asserted."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from mlflow_ragjudge.llm.backends import ChatRequest
from mlflow_ragjudge.llm.backends._sdk import parse_rate_headers
from mlflow_ragjudge.llm.backends.anthropic import AnthropicBackend
from mlflow_ragjudge.llm.backends.base import RateInfo
from mlflow_ragjudge.llm.backends.openai import OpenAIBackend
from mlflow_ragjudge.llm.client import JudgeClient, ProviderGate


def _gated_openai_client(fake_llm) -> JudgeClient:
    """A client of the fake server through the OpenAI SDK, no cache, with a gate of its own (none shared)."""
    client = JudgeClient(OpenAIBackend("m", base_url=fake_llm.openai_base_url, api_key="sk-test-0123456789"),
                         cache=False)
    client.gate = ProviderGate()
    return client


def _calls(client: JudgeClient, n: int, threads: int = 24) -> list:
    results: list = []
    lock = threading.Lock()
    todo = iter(range(n))

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            res = client.call(ChatRequest.of([{"role": "user", "content": f"question {i}"}]))
            with lock:
                results.append(res)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results


@pytest.mark.parametrize("value,seconds", [("1s", 1.0), ("1.5s", 1.5), ("20ms", 0.02), ("6m0s", 360.0),
                                           ("1h2m3.5s", 3723.5), ("2", 2.0), ("soon", None)])
def test_openai_reset_durations_are_read(value, seconds):
    info = parse_rate_headers({"x-ratelimit-remaining-requests": "7", "x-ratelimit-limit-requests": "500",
                               "x-ratelimit-reset-requests": value})
    assert info == RateInfo(7, 500, seconds)


def test_anthropic_reset_time_is_read_and_no_headers_is_none():
    at = (datetime.now(UTC) + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
    info = parse_rate_headers({"anthropic-ratelimit-requests-remaining": "3",
                               "anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-reset": at})
    assert info is not None and (info.remaining, info.limit) == (3, 50)
    assert info.reset is not None and 25 < info.reset <= 30
    assert parse_rate_headers({"content-type": "application/json"}) is None
    assert parse_rate_headers(None) is None


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_the_budget_a_server_announces_is_followed_without_429s(fake_llm, api):
    """20 requests per 1.5 s sliding window, announced on every reply; 70 calls from 24 threads at defaults:
    every call succeeds, the gate waited for the budget instead of running into the wall, and (almost) no
    request was refused."""
    fake_llm.rate_limit_per_minute, fake_llm.rate_limit_window = 20, 1.5
    fake_llm.latency = 0.02
    if api == "openai":
        backend = OpenAIBackend("m", base_url=fake_llm.openai_base_url, api_key="sk-test-0123456789")
    else:
        backend = AnthropicBackend("claude-test", base_url=fake_llm.anthropic_base_url, api_key="sk-ant-0123456789")
    client = JudgeClient(backend, cache=False)
    client.gate = ProviderGate()
    results = _calls(client, 70)
    assert len(results) == 70 and all(r.ok for r in results)
    assert client.gate.budget_waits > 0
    # before the first reply nothing is known: the first 24 starts meet a limit of 20 (4 refused); after that a
    # request a busy client started before a fresher count came back may still race it, never a storm
    assert fake_llm.rate_limited_count <= 24 - 20 + 8, fake_llm.rate_limited_count
    assert fake_llm.request_count - fake_llm.rate_limited_count == 70


@pytest.mark.slow
def test_without_headers_the_window_learned_from_the_first_429_is_kept(fake_llm):
    """The same window, but the server says only ``retry-after`` on a 429: it kept the client out longer than the
    client took to fill it, so the gate learns a window (its length and what it holds) and from then on starts
    no more than that in any such span -- 90 calls cost a handful of 429s, not one per call beyond the limit, as a
    client that goes back to full speed after each cool-down gets."""
    fake_llm.rate_limit_per_minute, fake_llm.rate_limit_window = 20, 1.5
    fake_llm.rate_limit_headers = False
    fake_llm.latency = 0.02
    client = _gated_openai_client(fake_llm)
    results = _calls(client, 90)
    assert len(results) == 90 and all(r.ok for r in results)
    gate = client.gate
    # one kind of limit learned, the latest 429's: the window (or, once it is full of evenly spaced starts, or on a
    # machine so loaded that filling it took longer than it then kept the client out, an even pace)
    assert (gate.learned_window is None) != (gate.learned_rate is None)
    if gate.learned_window is not None:
        assert 1.4 <= gate.learned_window <= 2.0 and 15 <= gate.window_cap <= 20, (gate.learned_window,
                                                                                    gate.window_cap)
    accepted = fake_llm.request_count - fake_llm.rate_limited_count
    assert accepted == 90
    assert fake_llm.rate_limited_count <= 20, fake_llm.rate_limited_count


def test_what_the_first_429_says_decides_between_a_window_and_a_pace():
    """The gate's reading of a 429, on recorded start times (no clock involved): kept out at least as long as it
    took to fill, a window of that span holding what it accepted, mirrored; kept out for less, an even pace."""
    import time

    now = time.monotonic()
    window = ProviderGate()
    window._accepted.extend(now - 1.0 + 0.005 * i for i in range(20))  # 20 accepted in 0.1 s, a second ago
    window._learn(now - 0.9, retry_after=1.4)  # refused right after, and told to come back 1.4 s later
    assert window.learned_rate is None and window.learned_window is not None
    assert abs(window.learned_window - 1.5) < 1e-9 and abs(window.window_cap - 0.995 * 20) < 1e-9
    # the next starts reuse the window's capacity as it frees: the first of the 20 accepted leaves 1.5 s (+ the lag)
    # after it started, the next one 5 ms later ...; 19 of 20 (99.5 %, rounded down) at a time
    starts = [window._window_start(now) for _ in range(4)]
    assert starts == pytest.approx([now - 1.0 + 0.005 * i + 1.5 + ProviderGate.WINDOW_LAG for i in (1, 2, 3, 4)],
                                   abs=1e-9)

    bucket = ProviderGate()
    bucket._accepted.extend(now - 1.0 + 0.005 * i for i in range(20))
    bucket._learn(now - 0.9, retry_after=0.025)  # a token's refill time: a bucket
    assert bucket.learned_window is None and bucket.learned_rate is not None
    assert abs(bucket.learned_rate - 0.995 * 20 / 1.0) < 1e-9  # 20 over the span, at least a second


@pytest.mark.slow
def test_a_bucket_that_refills_by_the_moment_teaches_a_pace(fake_llm):
    """A token bucket (10 requests at once, 40 more a second) refuses with a ``retry-after`` of one token's refill
    time: shorter than the client took to empty it, so the gate learns an even pace, not a window -- every call
    succeeds, and the refusals stay a small share."""
    lock = threading.Lock()
    bucket = {"tokens": 10.0, "at": None}

    def handler(_request):
        import time

        from fakellm import Reply

        with lock:
            now = time.monotonic()
            if bucket["at"] is not None:
                bucket["tokens"] = min(10.0, bucket["tokens"] + 40.0 * (now - bucket["at"]))
            bucket["at"] = now
            if bucket["tokens"] < 1.0:
                return Reply.error(429, "slow down", retry_after=(1.0 - bucket["tokens"]) / 40.0)
            bucket["tokens"] -= 1.0
        return "ok"

    fake_llm.set_handler(handler)
    fake_llm.latency = 0.01
    client = _gated_openai_client(fake_llm)
    results = _calls(client, 150)
    assert len(results) == 150 and all(r.ok for r in results)
    assert client.gate.learned_rate is not None and client.gate.learned_window is None
    refused = fake_llm.request_count - 150
    assert refused <= 40, refused


def test_requests_per_minute_set_paces_below_the_limit(fake_llm):
    """With a rate set (720/min against a limit of 20 per 1.5 s = 800/min), the starts are paced and the server
    refuses nothing."""
    fake_llm.rate_limit_per_minute, fake_llm.rate_limit_window = 20, 1.5
    fake_llm.rate_limit_headers = False
    backend = OpenAIBackend("m", base_url=fake_llm.openai_base_url, api_key="sk-test-0123456789")
    client = JudgeClient(backend, cache=False, requests_per_minute=720)
    client.gate = ProviderGate(requests_per_minute=720)
    results = _calls(client, 40)
    assert all(r.ok for r in results) and fake_llm.rate_limited_count == 0


# --------------------------------------------------------------------------- the wire watch


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_request_started_before_a_429_came_back_is_held_not_sent(fake_llm, api):
    """A request that has its slot when another request's 429 arrives is stopped on its way out (the SDK's own
    HTTP client asks the gate just before sending): the server never sees it, it is not counted as a request or an
    attempt, and it goes out once the cool-down is over."""
    fake_llm.latency = 0.0
    backend = (OpenAIBackend("m", base_url=fake_llm.openai_base_url, api_key="sk-test-0123456789")
               if api == "openai" else
               AnthropicBackend("claude-test", base_url=fake_llm.anthropic_base_url, api_key="sk-ant-0123456789"))
    client = JudgeClient(backend, cache=False)
    client.gate = gate = ProviderGate()
    request = ChatRequest.of([{"role": "user", "content": "hello"}])
    held: list[float] = []

    def send(timeout: float):
        if not held:  # the first time: a 429 elsewhere asks for quiet after this request took its slot
            gate.cool_down(0.3)
            held.append(gate._cooldown_until)
        return backend.chat(request, timeout=timeout)

    value, attempts, error, _ = client.sender.send(send)
    assert error is None and value.text == "ok"
    assert attempts == 1 and client.usage.requests == 1 and client.usage.rate_limited == 0
    assert fake_llm.request_count == 1  # the held request never reached the server
    assert fake_llm.requests[0].received_at >= held[0] - 0.01  # sent only after the quiet


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_429_starts_the_cool_down_as_soon_as_its_headers_arrive(fake_llm, api):
    """The gate learns of a 429 from the reply's status line and headers (the SDK's response hook), before the SDK
    has turned it into an exception and the retry layer has seen it."""
    from mlflow_ragjudge.llm.backends import BackendError
    from mlflow_ragjudge.llm.backends.base import ErrorKind, watching_wire

    fake_llm.rate_limit_per_minute, fake_llm.rate_limit_window = 1, 30.0
    backend = (OpenAIBackend("m", base_url=fake_llm.openai_base_url, api_key="sk-test-0123456789")
               if api == "openai" else
               AnthropicBackend("claude-test", base_url=fake_llm.anthropic_base_url, api_key="sk-ant-0123456789"))
    gate = ProviderGate()
    request = ChatRequest.of([{"role": "user", "content": "hello"}])
    with watching_wire(gate):
        backend.chat(request, timeout=5)
        with pytest.raises(BackendError) as refused:
            backend.chat(request, timeout=5)
        assert refused.value.kind is ErrorKind.RATE_LIMITED
        assert gate.cooling_down() > 20  # nobody called cool_down: the reply's headers did
        with pytest.raises(BackendError) as held:  # and the next request does not leave
            backend.chat(request, timeout=5)
    assert held.value.kind is ErrorKind.HELD
    assert fake_llm.request_count == 2


def test_slow_start_stops_where_more_in_flight_buys_nothing(fake_llm):
    """A server that works on 4 requests at a time (the rest wait in its queue; about 130 replies a second, well
    under what the client can send even on a loaded machine): doubling the calls in flight past that delivers no
    more replies per second, so slow start ends there instead of at ADAPTIVE_MAX -- every call still succeeds.
    Counts and states only: no clock is asserted."""
    working = threading.BoundedSemaphore(4)

    def busy(_request):
        with working:
            threading.Event().wait(0.03)
        return "ok"

    fake_llm.set_handler(busy)
    client = _gated_openai_client(fake_llm)
    results = _calls(client, 600, threads=128)
    assert len(results) == 600 and all(r.ok for r in results)
    assert client.gate.plateaus == 1
    assert client.gate.limit < ProviderGate.ADAPTIVE_MAX
