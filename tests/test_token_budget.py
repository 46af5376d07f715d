"""A tokens-per-minute limit the server announces is paced as the request budget is (issue 38).

The servers that send ``x-ratelimit-*-tokens`` (OpenAI) or ``anthropic-ratelimit-(input-)tokens-*`` (Anthropic) are
followed: a request starts when the tokens its prompt will cost are left. The fake server here counts each chat
request's prompt tokens (its ``usage.prompt_tokens``) in a sliding window and refuses what would pass its limit; the
real SDKs carry its headers to the client. The tokens a prompt costs are our (deliberately high) estimate, scaled by
what the server's usage said it counted for the requests before.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mlflow_ragjudge.llm.backends import ChatRequest
from mlflow_ragjudge.llm.backends._sdk import parse_rate_headers
from mlflow_ragjudge.llm.client import JudgeClient
from mlflow_ragjudge.llm.pacing import AnnouncedTokens

WORDS = " ".join(f"word{i}" for i in range(60))  # 60 words: the fake server counts 60-odd prompt tokens


def test_token_headers_are_read_for_both_providers():
    info = parse_rate_headers({"x-ratelimit-remaining-tokens": "1500", "x-ratelimit-limit-tokens": "2000",
                               "x-ratelimit-reset-tokens": "6m0s"})
    assert (info.tokens_remaining, info.tokens_limit, info.tokens_reset) == (1500, 2000, 360.0)
    assert info.remaining is None  # no request budget announced: none assumed
    both = parse_rate_headers({"x-ratelimit-remaining-requests": "9", "x-ratelimit-remaining-tokens": "70"})
    assert (both.remaining, both.tokens_remaining) == (9, 70)
    # Anthropic: the tighter of the total and the input budget
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 30))
    anth = parse_rate_headers({"anthropic-ratelimit-tokens-remaining": "5000",
                               "anthropic-ratelimit-input-tokens-remaining": "800",
                               "anthropic-ratelimit-input-tokens-limit": "1000",
                               "anthropic-ratelimit-input-tokens-reset": at})
    assert (anth.tokens_remaining, anth.tokens_limit) == (800, 1000) and 25 < anth.tokens_reset <= 31
    # absurd values are clamped, unreadable ones unknown
    assert parse_rate_headers({"x-ratelimit-remaining-tokens": "inf"}).tokens_remaining is not None
    assert parse_rate_headers({"x-ratelimit-remaining-tokens": "many"}).tokens_remaining is None


def test_a_request_waits_for_its_tokens_and_the_refill_between_replies():
    budget = AnnouncedTokens()
    assert budget.hold_until(0.0, 500) == 0.0  # nothing announced: nothing held
    # 100 left of 1,000, the used 900 back within 9 s: 100 tokens a second come back
    budget.announce(100, 1000, 9.0, now=0.0, seq=1)
    assert budget.hold_until(0.0, 100) == 0.0
    budget.spend(2, 100)
    assert budget.hold_until(0.0, 300) == pytest.approx(3.0)  # 300 more tokens: 3 s of refill
    assert budget.hold_until(5.0, 300) == 0.0
    # a request larger than the whole limit is not held forever: it needs the whole limit
    assert budget.hold_until(1.0, 5000) == pytest.approx(9.0)
    # a reply counted before a later start does not know of it: that start's tokens stay spent
    budget.spend(3, 200)
    budget.announce(600, 1000, 4.0, now=1.0, seq=2)
    assert budget.left == 400
    # past the reset the budget is whole again
    assert budget.hold_until(6.0, 900) == 0.0 and budget.left == 1000


def test_the_estimate_learns_what_the_server_counts():
    budget = AnnouncedTokens()
    for _ in range(40):
        budget.counted(estimate=200, server=100)
    assert budget.cost(200) == pytest.approx(100, abs=3)
    budget.counted(estimate=100, server=10**9)  # a broken usage field moves it a little, within its bounds
    assert budget.scale <= 1.5


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_token_limit_is_kept_through_the_real_sdks(fake_llm, monkeypatch, provider):
    # 2,000 prompt tokens per sliding 3 s and no request limit: 90 requests of about 65 tokens each are 3 windows'
    # worth; sent from 16 threads they would pass it many times over without the headers
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-tokens")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-tokens")
    monkeypatch.setenv("RAGJUDGE_BACKOFF_SCALE", "0")
    fake_llm.token_limit_per_minute, fake_llm.rate_limit_window = 2000, 3.0
    base = fake_llm.openai_base_url if provider == "openai" else fake_llm.anthropic_base_url
    client = JudgeClient(f"{provider}:/judge-model?base_url={base}", cache=False)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(
            lambda i: client.call(ChatRequest.of([{"role": "user", "content": f"{i} {WORDS}"}], max_tokens=50)),
            range(90)))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    # the headers followed: next to no refusal (measured: 1 of 90 with either SDK; the client before the token
    # budget, pacing only on what its 429s taught it, met 7 to 12 here)
    assert fake_llm.token_limited_count <= 3, fake_llm.token_limited_count
    assert client.gate.tokens.waits > 0  # starts waited for tokens
    assert 0.2 < client.gate.tokens.scale < 1.0  # our estimate is high; the server's count taught the scale
