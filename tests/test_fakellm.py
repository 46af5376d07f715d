"""The fake LLM server, exercised through the real ``openai`` and ``anthropic`` SDKs."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, cast

import anthropic
import fakellm  # tests/ is on sys.path under pytest (rootdir-relative import), as in tests/conftest.py
import openai
import pytest
from fakellm import fake_llm  # noqa: F401 - the shipped fixture, used by test_fixture_fake_llm
from pydantic import BaseModel

FakeLLMServer = fakellm.FakeLLMServer
Reply = fakellm.Reply
Request = fakellm.Request

USER: Any = [{"role": "user", "content": "What is the capital of France?"}]


class Verdict(BaseModel):
    score: int
    reason: str


VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"score": {"type": "integer"}, "reason": {"type": "string"}},
    "required": ["score", "reason"],
    "additionalProperties": False,
}


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


@pytest.fixture
def oai(server: FakeLLMServer) -> Iterator[openai.OpenAI]:
    # strict validation: a response missing a required field fails the test
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0,
                           _strict_response_validation=True)
    yield client
    client.close()


@pytest.fixture
def ant(server: FakeLLMServer) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="test", max_retries=0,
                                 _strict_response_validation=True)
    yield client
    client.close()


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("model", "gpt-test")
    kwargs.setdefault("messages", USER)
    return client.chat.completions.create(**kwargs)


def _msg(client: anthropic.Anthropic, **kwargs: Any) -> Any:
    kwargs.setdefault("model", "claude-test")
    kwargs.setdefault("max_tokens", 64)
    kwargs.setdefault("messages", USER)
    return client.messages.create(**kwargs)


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------------ plain text


def test_openai_plain_text_and_usage(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    resp = _chat(oai, temperature=0.0)
    assert resp.object == "chat.completion"
    assert resp.model == "gpt-test"
    choice = resp.choices[0]
    assert choice.message.content == "ok"
    assert choice.message.role == "assistant"
    assert choice.message.refusal is None
    assert choice.finish_reason == "stop"
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == 6  # rough word count of the prompt
    assert resp.usage.completion_tokens == 1
    assert resp.usage.total_tokens == 7
    assert resp._request_id == server.last_request.id  # x-request-id header


def test_anthropic_plain_text_and_usage(server: FakeLLMServer, ant: anthropic.Anthropic) -> None:
    server.set_handler(lambda req: f"echo: {req.last_user_text}")
    msg = _msg(ant, system="You are a judge.")
    assert msg.type == "message"
    assert msg.role == "assistant"
    assert msg.model == "claude-test"
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "echo: What is the capital of France?"
    assert msg.stop_reason == "end_turn"
    assert msg.stop_sequence is None
    assert msg.usage.input_tokens == 10  # system (4 words) + user (6)
    assert msg.usage.output_tokens == 7
    assert msg._request_id == server.last_request.id  # request-id header


def test_token_overrides_and_finish_reason(server: FakeLLMServer, oai: openai.OpenAI,
                                           ant: anthropic.Anthropic) -> None:
    server.script(Reply(text="cut", prompt_tokens=100, completion_tokens=7, finish_reason="length"),
                  Reply(text="cut", prompt_tokens=100, completion_tokens=7, finish_reason="length"))
    resp = _chat(oai)
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (100, 7, 107)
    assert resp.choices[0].finish_reason == "length"
    msg = _msg(ant)
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (100, 7)
    assert msg.stop_reason == "max_tokens"  # mapped from finish_reason


def test_refusal_and_empty(server: FakeLLMServer, oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    server.script(Reply(refusal="I can't help with that."), Reply(empty=True), Reply(empty=True))
    message = _chat(oai).choices[0].message
    assert message.refusal == "I can't help with that."
    assert message.content is None
    assert _chat(oai).choices[0].message.content == ""
    assert _msg(ant).content == []


def test_requests_are_recorded(server: FakeLLMServer, oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    _chat(oai, model="gpt-judge", temperature=0.3, max_tokens=50,
          messages=[{"role": "system", "content": "Be strict."},
                    {"role": "user", "content": [{"type": "text", "text": "part one"},
                                                 {"type": "text", "text": "part two"}]}])
    # anthropic 2.x's messages.create() has no `temperature` parameter: it only travels via extra_body
    _msg(ant, model="claude-judge", extra_body={"temperature": 0.0},
         system=[{"type": "text", "text": "Sys."}],
         messages=[{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                   {"role": "user", "content": [{"type": "text", "text": "q2"}]}])
    assert server.request_count == 2
    first, second = server.requests
    assert first.api == "openai_chat" and first.path == "/v1/chat/completions"
    assert first.model == "gpt-judge"
    assert first.temperature == 0.3
    assert first.max_tokens == 50
    assert first.body["temperature"] == 0.3
    assert first.messages == [{"role": "system", "content": "Be strict."},
                              {"role": "user", "content": "part one\npart two"}]
    assert first.system == "Be strict."
    assert first.last_user_text == "part one\npart two"
    assert first.headers["authorization"] == "Bearer sk-test"
    assert second.api == "anthropic_messages" and second.path == "/v1/messages"
    assert second.model == "claude-judge"
    assert second.temperature == 0.0
    # anthropic 2.x sends the key as a bearer token (1.x used x-api-key)
    assert second.headers.get("x-api-key", second.headers.get("authorization", "").removeprefix("Bearer ")) \
        == "test"
    assert "anthropic-version" in second.headers
    assert second.messages == [{"role": "system", "content": "Sys."}, {"role": "user", "content": "q1"},
                               {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert second.last_user_text == "q2"
    assert server.requests_for("anthropic_messages") == [second]


# ------------------------------------------------------------------------------------ structured output


def test_openai_json_schema(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    seen: list[Request] = []

    def handler(req: Request) -> dict[str, Any]:
        seen.append(req)
        return {"score": 4, "reason": "mostly right"}

    server.set_handler(handler)
    fmt = {"type": "json_schema",
           "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA, "strict": True}}
    resp = _chat(oai, response_format=fmt)
    assert json.loads(resp.choices[0].message.content) == {"score": 4, "reason": "mostly right"}
    assert resp.choices[0].message.tool_calls is None
    assert seen[0].response_format == fmt
    assert seen[0].json_schema == VERDICT_SCHEMA
    assert seen[0].wants_json
    # the SDK's own structured-output helper parses it too
    parsed = oai.chat.completions.parse(model="gpt-test", messages=USER, response_format=Verdict)
    assert parsed.choices[0].message.parsed == Verdict(score=4, reason="mostly right")


def test_openai_json_object_and_tool_call(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.script({"score": 1, "reason": "x"}, {"score": 2, "reason": "y"})
    resp = _chat(oai, response_format={"type": "json_object"})
    assert json.loads(resp.choices[0].message.content) == {"score": 1, "reason": "x"}
    tool = {"type": "function", "function": {"name": "submit", "parameters": VERDICT_SCHEMA}}
    resp = _chat(oai, tools=[tool], tool_choice={"type": "function", "function": {"name": "submit"}})
    call = resp.choices[0].message.tool_calls[0]
    assert call.function.name == "submit"
    assert json.loads(call.function.arguments) == {"score": 2, "reason": "y"}
    assert server.last_request.json_schema == VERDICT_SCHEMA


def test_anthropic_tool_use(server: FakeLLMServer, ant: anthropic.Anthropic) -> None:
    server.script({"score": 5, "reason": "exact"})
    tools = [{"name": "other", "input_schema": {"type": "object"}},
             {"name": "record_verdict", "description": "d", "input_schema": VERDICT_SCHEMA}]
    msg = _msg(ant, tools=tools, tool_choice={"type": "tool", "name": "record_verdict"})
    assert msg.stop_reason == "tool_use"
    [block] = msg.content
    assert block.type == "tool_use"
    assert block.name == "record_verdict"
    assert block.input == {"score": 5, "reason": "exact"}
    assert block.id.startswith("toolu_")
    req = server.last_request
    assert req.tools == tools
    assert req.json_schema == VERDICT_SCHEMA


def test_anthropic_json_without_tools_is_text(server: FakeLLMServer, ant: anthropic.Anthropic) -> None:
    server.set_handler(lambda req: {"score": 3, "reason": "ok"})
    msg = _msg(ant)
    assert json.loads(msg.content[0].text) == {"score": 3, "reason": "ok"}
    # structured outputs (output_config.format) through the SDK's parse helper
    parsed = ant.messages.parse(model="claude-test", max_tokens=64, messages=USER, output_format=Verdict)
    assert parsed.parsed_output == Verdict(score=3, reason="ok")
    assert server.last_request.json_schema is not None


# ---------------------------------------------------------------------------------------- responses API


def _respond(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("model", "gpt-test")
    kwargs.setdefault("input", "What is the capital of France?")
    return client.responses.create(**kwargs)


def test_openai_responses_text_and_usage(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.set_handler(lambda req: f"echo: {req.last_user_text}")
    resp = _respond(oai, instructions="You are a judge.", max_output_tokens=50, temperature=0.2)
    assert resp.object == "response"
    assert resp.id.startswith("resp_")
    assert resp.status == "completed"
    assert resp.model == "gpt-test"
    assert resp.instructions == "You are a judge."
    assert resp.output_text == "echo: What is the capital of France?"
    [item] = resp.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert [(part.type, part.annotations) for part in item.content] == [("output_text", [])]
    assert resp.usage is not None
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.total_tokens) == (10, 7, 17)
    assert resp._request_id == server.last_request.id
    req = server.last_request
    assert req.api == "openai_responses" and req.path == "/v1/responses"
    assert req.messages == [{"role": "system", "content": "You are a judge."},
                            {"role": "user", "content": "What is the capital of France?"}]
    assert req.system == "You are a judge."
    assert req.prompt_text == "You are a judge.\nWhat is the capital of France?"
    assert (req.max_tokens, req.temperature) == (50, 0.2)
    assert server.requests_for("openai_responses") == [req]


def test_openai_responses_input_items(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    resp = _respond(oai, input=[
        {"role": "developer", "content": "Be strict."},
        {"role": "user", "content": "q1"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a1"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "part one"},
                                     {"type": "input_text", "text": "part two"}]},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q": "x"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "found"},
    ])
    assert resp.output_text == "ok"
    req = server.last_request
    assert req.messages == [{"role": "developer", "content": "Be strict."}, {"role": "user", "content": "q1"},
                            {"role": "assistant", "content": "a1"},
                            {"role": "user", "content": "part one\npart two"},
                            {"role": "assistant", "content": 'lookup({"q": "x"})'},
                            {"role": "tool", "content": "found"}]
    assert req.system == "Be strict."
    assert req.last_user_text == "part one\npart two"


def test_openai_responses_structured_output(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.set_handler(lambda req: {"score": 4, "reason": "mostly right"})
    fmt = {"type": "json_schema", "name": "verdict", "schema": VERDICT_SCHEMA, "strict": True}
    resp = _respond(oai, text={"format": fmt})
    assert json.loads(resp.output_text) == {"score": 4, "reason": "mostly right"}
    assert server.last_request.response_format == fmt
    assert server.last_request.json_schema == VERDICT_SCHEMA
    assert server.last_request.wants_json
    parsed = oai.responses.parse(model="gpt-test", input="Grade it.", text_format=Verdict)
    assert parsed.output_parsed == Verdict(score=4, reason="mostly right")
    tool = {"type": "function", "name": "submit", "parameters": VERDICT_SCHEMA, "strict": True}
    resp = _respond(oai, tools=[tool], tool_choice={"type": "function", "name": "submit"})
    [call] = resp.output
    assert call.type == "function_call" and call.name == "submit"
    assert json.loads(call.arguments) == {"score": 4, "reason": "mostly right"}
    assert server.last_request.json_schema == VERDICT_SCHEMA


def test_openai_responses_refusal_incomplete_and_errors(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.script(Reply(refusal="I can't help with that."), Reply(text="cut", finish_reason="length"),
                  Reply.error(429, "slow down", retry_after=7))
    resp = _respond(oai)
    assert [part.type for part in resp.output[0].content] == ["refusal"]
    assert resp.output_text == ""
    resp = _respond(oai)
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output_text == "cut"
    with pytest.raises(openai.RateLimitError) as info:
        _respond(oai)
    assert info.value.body == {"message": "slow down", "type": "requests", "param": None,
                               "code": "rate_limit_exceeded"}
    assert info.value.response.headers["retry-after"] == "7"
    with pytest.raises(openai.BadRequestError, match="without streaming") as bad:
        _respond(oai, stream=True)
    assert cast(dict[str, Any], bad.value.body)["param"] == "stream"


# ------------------------------------------------------------------------------------------ embeddings


def test_embeddings_deterministic_and_similar(server: FakeLLMServer) -> None:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0)
    texts = ["Paris is the capital of France", "the capital of France is Paris", "bananas are yellow fruit"]
    resp = client.embeddings.create(model="text-embedding-test", input=texts)  # SDK asks for base64
    assert server.last_request.api == "openai_embeddings"
    assert server.last_request.body["encoding_format"] == "base64"
    assert server.last_request.input == texts
    vecs = [d.embedding for d in resp.data]
    assert [d.index for d in resp.data] == [0, 1, 2]
    assert all(len(v) == fakellm.DEFAULT_EMBEDDING_DIM for v in vecs)
    assert all(math.isclose(_cos(v, v), 1.0, rel_tol=1e-5) for v in vecs)
    assert _cos(vecs[0], vecs[1]) > 0.99  # same bag of words
    assert _cos(vecs[0], vecs[1]) > _cos(vecs[0], vecs[2])
    assert resp.usage.prompt_tokens == 16 and resp.usage.total_tokens == 16
    # float encoding, single string input, requested dimensions; identical to the base64 path
    strict = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0,
                           _strict_response_validation=True)
    one = strict.embeddings.create(model="e", input=texts[0], encoding_format="float")
    assert len(one.data) == 1
    assert one.data[0].embedding == pytest.approx(vecs[0], abs=1e-6)
    assert one.data[0].embedding == pytest.approx(fakellm.embed_text(texts[0]))
    small = strict.embeddings.create(model="e", input=["a b"], encoding_format="float", dimensions=8)
    assert len(small.data[0].embedding) == 8


def test_embedding_override(server: FakeLLMServer) -> None:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0)
    server.script(Reply(embedding=[1.0, 0.0, 0.0]), [0.0, 1.0])
    assert client.embeddings.create(model="e", input=["x", "y"]).data[1].embedding == [1.0, 0.0, 0.0]
    assert client.embeddings.create(model="e", input="x", encoding_format="float").data[0].embedding == [0, 1]


# -------------------------------------------------------------------------------------- faults: status


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_rate_limit_error_with_retry_after(server: FakeLLMServer, oai: openai.OpenAI,
                                           ant: anthropic.Anthropic, sdk: str) -> None:
    server.script(Reply.error(429, "slow down", retry_after=7))
    exc: Any
    if sdk == "openai":
        with pytest.raises(openai.RateLimitError) as oinfo:
            _chat(oai)
        exc = oinfo.value
        assert exc.body == {"message": "slow down", "type": "requests", "param": None,
                            "code": "rate_limit_exceeded"}
    else:
        with pytest.raises(anthropic.RateLimitError) as ainfo:
            _msg(ant)
        exc = ainfo.value
        assert exc.type == "rate_limit_error"
        assert exc.api_message == "slow down"
        assert exc.body["type"] == "error"
    assert exc.status_code == 429
    assert exc.response.headers["retry-after"] == "7"
    assert exc.response.headers["retry-after-ms"] == "7000"


@pytest.mark.parametrize("status", [500, 503])
def test_server_errors(server: FakeLLMServer, oai: openai.OpenAI, ant: anthropic.Anthropic,
                       status: int) -> None:
    server.script(Reply.error(status), Reply.error(status))
    with pytest.raises(openai.InternalServerError) as oinfo:
        _chat(oai)
    assert oinfo.value.status_code == status
    assert cast(dict[str, Any], oinfo.value.body)["type"] == "server_error"
    with pytest.raises(anthropic.InternalServerError) as ainfo:
        _msg(ant)
    assert ainfo.value.status_code == status
    if status == 503:
        assert isinstance(ainfo.value, anthropic.ServiceUnavailableError)
        assert ainfo.value.type == "overloaded_error"
    else:
        assert ainfo.value.type == "api_error"


def test_other_errors(server: FakeLLMServer, oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    server.script(Reply.error(529), Reply.error(400, "bad prompt"), Reply.error(400, "bad prompt"),
                  Reply.error(401))
    with pytest.raises(anthropic.OverloadedError):
        _msg(ant)
    with pytest.raises(openai.BadRequestError, match="bad prompt"):
        _chat(oai)
    with pytest.raises(anthropic.BadRequestError) as info:
        _msg(ant)
    assert info.value.type == "invalid_request_error"
    assert info.value.request_id == cast(dict[str, Any], info.value.body)["request_id"]
    with pytest.raises(openai.AuthenticationError):
        _chat(oai)


def test_unknown_path_and_bad_request_json(server: FakeLLMServer) -> None:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="Unknown request URL"):
        client.models.list()
    bad = urllib.request.Request(server.openai_base_url + "/chat/completions", data=b"{nope", method="POST",
                                 headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bad, timeout=5)
    assert info.value.code == 400
    assert json.loads(info.value.read())["error"]["type"] == "invalid_request_error"
    assert server.requests[-1].body is None and server.requests[-1].raw_body == b"{nope"


# ------------------------------------------------------------------------------------- faults: bodies


def test_malformed_json_body(server: FakeLLMServer, oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    # A 200 whose JSON is cut off: both SDKs let json.JSONDecodeError (a ValueError) escape.
    server.script(Reply(raw_body=b'{"id": "chatcmpl-1", "choices": ['), Reply(raw_body=b'{"type": "mess'))
    with pytest.raises(json.JSONDecodeError):
        _chat(oai)
    with pytest.raises(json.JSONDecodeError):
        _msg(ant)


def test_non_json_content_type(server: FakeLLMServer, oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    page = Reply(raw_body=b"<html>502 Bad Gateway</html>", headers={"content-type": "text/html"})
    server.script(page, page, page)
    # strict clients: APIResponseValidationError
    with pytest.raises(openai.APIResponseValidationError):
        _chat(oai)
    with pytest.raises(anthropic.APIResponseValidationError):
        _msg(ant)
    # default (non-strict) clients hand back the raw text instead of a ChatCompletion
    lax = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0)
    assert _chat(lax) == "<html>502 Bad Gateway</html>"


def test_wrong_shape_fails_strict_validation(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.script(Reply(raw_body=b'{"unexpected": true}'))
    with pytest.raises(openai.APIResponseValidationError):
        _chat(oai)


# ----------------------------------------------------------------------------------- faults: network


def test_timeout(server: FakeLLMServer) -> None:
    oai = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0, timeout=0.2)
    ant = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="test", max_retries=0, timeout=0.2)
    server.script(Reply(delay=1.5), Reply(delay=1.5))
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        _chat(oai)
    with pytest.raises(anthropic.APITimeoutError):
        _msg(ant)
    assert time.monotonic() - started < 1.2
    # the same clients (connection pools) work again afterwards
    assert _chat(oai).choices[0].message.content == "ok"
    assert _msg(ant).content[0].text == "ok"


def test_latency_beyond_timeout(server: FakeLLMServer) -> None:
    server.latency = 0.5
    oai = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0, timeout=0.1)
    with pytest.raises(openai.APITimeoutError):
        _chat(oai)


def test_dropped_connection(server: FakeLLMServer, oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    server.script(Reply(drop=True), Reply(drop=True))
    with pytest.raises(openai.APIConnectionError) as oinfo:
        _chat(oai)
    assert not isinstance(oinfo.value, openai.APITimeoutError)
    with pytest.raises(anthropic.APIConnectionError):
        _msg(ant)
    assert _chat(oai).choices[0].message.content == "ok"


def test_stop_does_not_wait_for_hanging_requests() -> None:
    srv = FakeLLMServer().start()
    srv.script(Reply(delay=30))
    client = openai.OpenAI(base_url=srv.openai_base_url, api_key="sk-test", max_retries=0, timeout=5)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            _chat(client)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    assert srv.wait_for_requests(1)
    started = time.monotonic()
    srv.stop()
    thread.join(5)
    assert time.monotonic() - started < 2
    assert errors and isinstance(errors[0], openai.APIConnectionError)


# ------------------------------------------------------------------------------- concurrency, limits


def test_peak_in_flight(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.latency = 0.3
    barrier = threading.Barrier(8)
    results: list[str] = []

    def call() -> None:
        barrier.wait()
        results.append(_chat(oai).choices[0].message.content)

    threads = [threading.Thread(target=call) for _ in range(8)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    elapsed = time.monotonic() - started
    assert results == ["ok"] * 8
    assert server.peak_in_flight == 8
    assert server.in_flight == 0
    assert server.request_count == 8
    assert elapsed < 1.5  # served concurrently, not 8 x 0.3 s


def test_keep_alive_reuses_connection(server: FakeLLMServer, oai: openai.OpenAI,
                                      ant: anthropic.Anthropic) -> None:
    server.script(Reply.error(500))  # error replies keep the connection alive too
    with pytest.raises(openai.InternalServerError):
        _chat(oai)
    for _ in range(4):
        _chat(oai)
        _msg(ant)
    assert server.connection_count == 2  # one per client


def test_rate_limit_per_minute(server: FakeLLMServer, oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    server.rate_limit_per_minute = 3
    server.script("a", "b", "c", "d")
    assert [_chat(oai).choices[0].message.content for _ in range(3)] == ["a", "b", "c"]
    with pytest.raises(openai.RateLimitError) as oinfo:
        _chat(oai)
    with pytest.raises(anthropic.RateLimitError) as ainfo:
        _msg(ant)
    for exc in (oinfo.value, ainfo.value):
        wait = float(exc.response.headers["retry-after"])
        assert 1 <= wait <= 60
        assert exc.response.headers["x-ratelimit-limit-requests" if exc is oinfo.value
                                    else "anthropic-ratelimit-requests-limit"] == "3"
    assert server.rate_limited_count == 2
    assert server.request_count == 5
    assert server.pending == 1  # limited requests do not consume scripted replies


def test_rate_limit_retry_after_lets_client_succeed(server: FakeLLMServer) -> None:
    server.rate_limit_per_minute = 2
    server.rate_limit_window = 0.4  # a short window keeps the test fast
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=1)
    started = time.monotonic()
    for _ in range(3):  # the third is limited once, waits retry-after-ms, then succeeds
        assert _chat(client).choices[0].message.content == "ok"
    assert server.rate_limited_count == 1
    assert server.request_count == 4
    assert 0.3 < time.monotonic() - started < 2.0


# ------------------------------------------------------------------------------------------- scripting


def test_script_then_handler_and_reset(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.set_handler(lambda req: f"handler saw {req.model}")
    server.script("first", lambda req: Reply(text=req.last_user_text.upper()), None)
    assert server.pending == 3
    got = [_chat(oai).choices[0].message.content for _ in range(4)]
    assert got == ["first", "WHAT IS THE CAPITAL OF FRANCE?", "ok", "handler saw gpt-test"]
    server.script("queued")
    server.reset()
    assert (server.pending, server.request_count, server.requests, server.peak_in_flight) == (0, 0, [], 0)
    assert _chat(oai).choices[0].message.content == "handler saw gpt-test"  # handler kept
    server.set_handler(None)
    assert _chat(oai).choices[0].message.content == "ok"


def test_handler_exception_becomes_500(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    def boom(req: Request) -> str:
        raise RuntimeError("handler bug")

    server.set_handler(boom)
    with pytest.raises(openai.InternalServerError, match="handler bug"):
        _chat(oai)
    assert len(server.errors) == 1 and isinstance(server.errors[0], RuntimeError)


def test_unserialisable_reply_becomes_500(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.script(Reply(json={"when": object()}))
    with pytest.raises(openai.InternalServerError, match="could not build the reply"):
        _chat(oai)
    assert isinstance(server.errors[0], TypeError)
    assert _chat(oai).choices[0].message.content == "ok"  # the server keeps serving


def test_fractional_retry_after(server: FakeLLMServer, ant: anthropic.Anthropic) -> None:
    server.script(Reply.error(429, retry_after=0.25))
    with pytest.raises(anthropic.RateLimitError) as info:
        _msg(ant)
    headers = info.value.response.headers
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("0.25", "250")


def test_custom_headers_and_status(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.script(Reply(text="hi", headers={"X-Custom": "1"}))
    raw = oai.chat.completions.with_raw_response.create(model="m", messages=USER)
    assert raw.headers["x-custom"] == "1"
    assert raw.headers["content-length"] == str(len(raw.http_response.content))
    assert raw.headers["x-request-id"].startswith("req_")
    assert raw.parse().choices[0].message.content == "hi"


# ------------------------------------------------------------------------------------ what is not served, async


def test_streaming_and_token_counting_are_refused(server: FakeLLMServer, oai: openai.OpenAI,
                                                  ant: anthropic.Anthropic) -> None:
    # nothing the fake serves streams or counts tokens apart (the backends read usage from each reply): a request
    # for either is refused, and a scripted reply waits for the next request
    server.script("the scripted reply")
    with pytest.raises(openai.BadRequestError, match="without streaming") as bad:
        _chat(oai, stream=True)
    assert cast(dict[str, Any], bad.value.body)["param"] == "stream"
    with pytest.raises(anthropic.BadRequestError, match="without streaming"):
        with ant.messages.stream(model="claude-test", max_tokens=64, messages=USER) as stream:
            stream.get_final_message()
    with pytest.raises(anthropic.NotFoundError):
        ant.messages.count_tokens(model="claude-test", messages=USER, system="Be brief.")
    assert _chat(oai).choices[0].message.content == "the scripted reply"


def test_async_clients(server: FakeLLMServer) -> None:
    server.latency = 0.25

    async def main() -> list[str]:
        oai = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0)
        ant = anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="test", max_retries=0)
        calls: list[Any] = [oai.chat.completions.create(model="m", messages=USER) for _ in range(3)]
        calls += [ant.messages.create(model="m", max_tokens=8, messages=USER) for _ in range(3)]
        results: list[Any] = await asyncio.gather(*calls)
        await oai.close()
        await ant.close()
        return [r.choices[0].message.content if hasattr(r, "choices") else r.content[0].text for r in results]

    assert asyncio.run(main()) == ["ok"] * 6
    assert server.peak_in_flight == 6


# ------------------------------------------------------------------------------------ fixture, env


def test_fixture_fake_llm(fake_llm: FakeLLMServer) -> None:  # noqa: F811
    assert fake_llm.url.startswith("http://127.0.0.1:")
    assert fake_llm.openai_base_url == fake_llm.url + "/v1"
    assert fake_llm.anthropic_base_url == fake_llm.url
    reply = fake_llm.openai_client().chat.completions.create(model="m", messages=USER)
    assert reply.choices[0].message.content == "ok"
    message: Any = fake_llm.anthropic_client().messages.create(model="m", max_tokens=8, messages=USER)
    assert message.content[0].text == "ok"


def test_env_points_default_clients_here(server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    assert _chat(openai.OpenAI(max_retries=0)).choices[0].message.content == "ok"
    assert _msg(anthropic.Anthropic(max_retries=0)).content[0].text == "ok"
    assert server.request_count == 2
