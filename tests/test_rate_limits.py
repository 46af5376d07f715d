"""Rate limits at defaults (nothing configured): the budget a server announces in its reply headers is followed,
and a server that only says ``retry-after`` on a 429 teaches a pace that is then kept -- through the real openai
and anthropic SDKs against the fake server's sliding window. Counts only: no clock is asserted."""

from __future__ import annotations

import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mlflow_ragjudge.llm.backends import ChatRequest
from mlflow_ragjudge.llm.backends._sdk import parse_rate_headers
from mlflow_ragjudge.llm.backends.anthropic import AnthropicBackend
from mlflow_ragjudge.llm.backends.base import RateInfo
from mlflow_ragjudge.llm.backends.openai import OpenAIBackend
from mlflow_ragjudge.llm.client import JudgeClient, ProviderGate
from mlflow_ragjudge.llm.pacing import LearnedPace


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
    # the window it proved: filled by us, then kept shut at least as long (its length and what it held)
    assert gate.learned_window is not None and 1.4 <= gate.learned_window <= 2.0, gate.learned_window
    assert 15 <= gate.window_cap <= 24, gate.window_cap
    accepted = fake_llm.request_count - fake_llm.rate_limited_count
    assert accepted == 90
    assert fake_llm.rate_limited_count <= 20, fake_llm.rate_limited_count


def test_what_the_first_429_says_decides_the_window_and_the_growth():
    """The pace's reading of a first 429, on recorded start times (its clock is passed in): kept out at least as
    long as it took us to fill, a window of that span holding what it accepted, mirrored, and nothing growing;
    kept out for less, the default (per-minute) window, and a growth from what the ``retry-after`` says."""
    window = LearnedPace()
    window.accepted.extend(100.0 + 0.005 * i for i in range(20))  # 20 accepted in 0.1 s
    window.refused(100.1, retry_after=1.4, quiet_until=101.5, learn=True)  # refused right after, told 1.4 s
    window.schedule(101.5, 101.5, 101.5)  # (learned once the quiet is over; this start is the mirror's first)
    assert window.window_learned and abs(window.window - 1.5) < 1e-9
    assert abs(window.cap - 0.995 * 20) < 1e-9 and window.growth == LearnedPace.MIN_GROWTH
    # the next starts reuse the window's capacity as it frees: the second of the 20 leaves 1.5 s (+ the lag) after
    # it started, the next one 5 ms later ...; 19 of 20 (99.5 %, rounded down) at a time
    starts = [window.schedule(101.5, 101.5, 101.5) for _ in range(3)]
    assert starts == pytest.approx([100.0 + 0.005 * i + 1.5 + LearnedPace.WINDOW_LAG for i in (2, 3, 4)], abs=1e-9)

    others = LearnedPace()  # one of ours went through, then a window of someone else's said: the next frees soon
    others.accepted.append(100.0)
    others.refused(100.05, retry_after=0.25, quiet_until=100.3, learn=True)
    others.schedule(100.3, 100.3, 100.3)
    assert not others.window_learned and others.window == LearnedPace.DEFAULT_WINDOW
    assert others.growth == pytest.approx(1 / 0.25) and others.slow_start


def test_a_learned_window_is_reset_by_a_neighbours_refusals():
    """The policy on a virtual clock (benchmarks/pace_sim.py): a fresh 600-per-minute window, filled by us, teaches
    the window and a cap of what it held; then a neighbour starts sending 4 a second (70-200 s): the starts we
    mirror meet its requests, and the refusals bring the learned cap down to what we still get, with few 429s (no
    storm); once its requests have left the window, probing brings the cap back up."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from pace_sim import simulate

    states: list[tuple[float, float | None, float]] = []

    def watch(t, pace, server):
        if not states or t - states[-1][0] >= 1.0:
            states.append((t, pace.cap, pace.window))

    res = simulate("neighbour", windows=6, neighbour=0.4, after=watch, neighbour_span=(70.0, 200.0))
    alone = [cap for t, cap, _ in states if 61 < t < 70]
    assert alone and min(alone) >= 0.99 * 600 and all(w == 60.0 for t, _, w in states if t > 61)
    beside = [cap for t, cap, _ in states if 135 < t < 200]
    assert beside and max(beside) <= 0.95 * min(alone), (alone[:3], beside[:3])  # reset by the refusals
    assert res["ours_refused"] <= 0.01 * res["ours_accepted"], res["ours_refused"]
    assert res["share_of_max"] >= 0.95, res
    later = [cap for t, cap, _ in states if t > 320]
    assert later and max(later) > max(beside), (beside[-3:], later[-3:])  # probed back up


def test_the_pace_reaches_a_shared_limit_with_few_refusals():
    """The four scenarios of benchmarks/bench_shared_quota.py, on the policy's virtual clock (600 per sliding
    minute, 16 callers, 200 ms): a fresh window, another client's 600 spread over the minute before, or sent at once
    half a minute before, and a neighbour at 40 % beside us -- at least 95 % of the most a client could have had
    over the first two windows, and 2 % refusals at most."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from pace_sim import SCENARIOS, simulate

    for scenario in SCENARIOS:
        res = simulate(scenario)
        assert res["share_of_max"] >= 0.95, res
        assert res["refused_per_accepted"] <= 0.02, res


def test_the_tasks_of_a_job_share_a_limit_through_the_quiet_they_tell_each_other():
    """A Spark job's tasks on the policy's virtual clock (benchmarks/pace_sim.py: each task its own gate, 1,000
    requests between them, 600 per sliding minute, 300 ms): told of each other's 429s through the job's pace file,
    the job takes at most 1.2 x the sliding window's minimum with at most 2 % refusals, whatever the number of
    tasks; without it, the refusals grow with the tasks (each meets the wall on its own)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from pace_sim import simulate_job

    for tasks in (1, 2, 4, 8, 16):
        job = simulate_job(tasks, 1000, share_quiet=True)
        assert job["accepted"] == 1000 and job["ratio"] <= 1.2, job
        assert job["refused_per_accepted"] <= 0.02, job
    alone = simulate_job(16, 1000, share_quiet=False)
    assert alone["refused_per_accepted"] > simulate_job(16, 1000, share_quiet=True)["refused_per_accepted"]


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
    assert client.gate.learned_growth >= 5 and client.gate.learned_window is None
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

