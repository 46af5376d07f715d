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


def test_without_headers_the_pace_learned_from_the_first_429_is_kept(fake_llm):
    """The same window, but the server says only ``retry-after`` on a 429: after the first refusals the client
    paces at what the server accepted, so 90 calls cost a handful of 429s -- not one per call beyond the
    limit, as a client that goes back to full speed after each cool-down gets."""
    fake_llm.rate_limit_per_minute, fake_llm.rate_limit_window = 20, 1.5
    fake_llm.rate_limit_headers = False
    fake_llm.latency = 0.02
    backend = OpenAIBackend("m", base_url=fake_llm.openai_base_url, api_key="sk-test-0123456789")
    client = JudgeClient(backend, cache=False)
    client.gate = ProviderGate()
    results = _calls(client, 90)
    assert len(results) == 90 and all(r.ok for r in results)
    assert client.gate.learned_rate is not None
    accepted = fake_llm.request_count - fake_llm.rate_limited_count
    assert accepted == 90
    assert fake_llm.rate_limited_count <= 20, fake_llm.rate_limited_count


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
