"""Anthropic's Messages API through the official ``anthropic`` SDK.

URI: ``anthropic:/claude-3-5-haiku-latest``; key from ``ANTHROPIC_API_KEY``;
``?base_url=`` or ``ANTHROPIC_BASE_URL`` for a proxy. Structured output uses a
forced tool call whose ``input_schema`` is the judge's JSON schema.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

from ...core.json_text import MAX_JSON_DEPTH, value_depth
from ._sdk import classify, http_client, missing_sdk, parse_rate_headers, post, token_count
from .base import (
    Backend,
    BackendError,
    BatchState,
    ChatRequest,
    ChatResponse,
    ErrorKind,
    query_secrets,
    split_base_url,
    unreadable_result,
    url_credentials,
)


class AnthropicBackend(Backend):
    """Claude models as judges.

    Args:
        model: e.g. ``claude-3-5-haiku-latest``.
        base_url: default ``ANTHROPIC_BASE_URL`` or Anthropic's API.
        api_key: default ``ANTHROPIC_API_KEY``.
    """

    provider = "anthropic"
    supports_json_schema = True

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None) -> None:
        self.model = model
        # the base URL's query (a gateway's ?token=...) is sent with every request, after the path
        self._base_url, self._query = split_base_url(base_url or os.environ.get("ANTHROPIC_BASE_URL"))
        self._api_key = api_key or os.environ.get("ANTHROPIC_API_KEY") or ""
        self._client: Any = None
        self._client_lock = threading.Lock()

    @property
    def base_url(self) -> str | None:
        return self._base_url

    def base_query(self) -> dict[str, str]:
        return dict(self._query)

    @property
    def structured_mode(self) -> str:
        return "tool_use"

    def secrets(self) -> list[str]:
        return (([self._api_key] if self._api_key else []) + url_credentials(self._base_url)
                + query_secrets(self._query))

    def check_ready(self) -> None:
        if not self._api_key:
            raise ValueError(
                "No Anthropic API key: set the ANTHROPIC_API_KEY environment variable or pass api_key=."
            )

    def _sdk(self) -> Any:
        try:
            import anthropic
        except ImportError as e:  # pragma: no cover - anthropic is a dependency
            raise missing_sdk("anthropic") from e
        return anthropic

    def warm_up(self) -> None:
        self._get_client()

    def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        self.check_ready()
        with self._client_lock:  # one SDK client (and connection pool) however many threads start at once
            if self._client is None:
                anthropic = self._sdk()
                self._client = anthropic.Anthropic(api_key=self._api_key, base_url=self._base_url,
                                                   default_query=self._query or None, max_retries=0,
                                                   http_client=http_client(anthropic))
        return self._client

    def _params(self, request: ChatRequest) -> dict[str, Any]:
        """The Messages API body for a request: what :meth:`chat` sends and what a batch line carries."""
        system = "\n\n".join(m["content"] for m in request.messages if m["role"] == "system")
        messages = [{"role": m["role"], "content": m["content"]} for m in request.messages if m["role"] != "system"]
        params: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        }
        if system:
            params["system"] = system
        if request.stop:
            params["stop_sequences"] = list(request.stop)
        schema = request.json_schema
        if schema is not None:
            params["tools"] = [
                {"name": schema.name, "description": "Record the verdict.", "input_schema": schema.schema}
            ]
            params["tool_choice"] = {"type": "tool", "name": schema.name}
        return params

    def chat(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        anthropic = self._sdk()
        try:
            # through the SDK's request layer, not messages.create: never traced by autologging (_sdk.post)
            raw = post(self._get_client(), anthropic, "/v1/messages", self._params(request), timeout=timeout)
            text = raw.text
        except Exception as exc:
            raise classify(exc, anthropic) from exc
        try:
            msg = json.loads(text)
        except RecursionError:  # a tool input nested too deep for Python's decoder: served, so kept
            return self._unreadable(text, request)
        except ValueError as exc:
            raise BackendError(ErrorKind.TRANSIENT, f"unreadable response body: {exc}") from exc
        if not isinstance(msg, dict):
            raise BackendError(ErrorKind.TRANSIENT, "unreadable response body: not a JSON object")
        response = self._response(msg, request)
        response.rate = parse_rate_headers(raw.headers)
        return response

    def _unreadable(self, body: str, request: ChatRequest) -> ChatResponse:
        """A served reply the SDK could not decode (JSON nested deeper than Python's recursion limit): the raw
        body as the reply's text, so the parser records it as unreadable with its tokens (read from the body's
        last usage block) instead of the call failing as an internal error that loses both."""
        tokens = {k: int(m[-1]) if (m := re.findall(rf'"{k}"\s*+:\s*+(\d{{1,12}})', body)) else 0
                  for k in ("input_tokens", "output_tokens")}
        return ChatResponse(text=body, input_tokens=tokens["input_tokens"], output_tokens=tokens["output_tokens"],
                            model=self.model, structured_mode="tool_use" if request.json_schema is not None else "text")

    def _response(self, msg: dict[str, Any], request: ChatRequest) -> ChatResponse:
        """A message's JSON (a reply, or a batch result line's message) as a :class:`ChatResponse`."""
        schema = request.json_schema
        texts: list[str] = []
        data: dict[str, Any] | None = None
        content = msg.get("content")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif btype == "tool_use" and schema is not None and block.get("name") == schema.name:
                inp = block.get("input")
                data = dict(inp) if isinstance(inp, dict) else None
        if data is not None and value_depth(data) > MAX_JSON_DEPTH:
            # decoded, but too deep for every recursive walk after it (redaction, the transcript, the cache): its
            # text, cut at the limit, goes to the parser, which reports it as unreadable
            text, data = _deep_text(data), None
        else:
            text = json.dumps(data, ensure_ascii=False) if data is not None else "".join(texts)
        stop_reason = msg.get("stop_reason")
        if stop_reason == "refusal":
            raise BackendError(ErrorKind.REFUSED, text or "the model refused to answer")
        usage = msg.get("usage")
        if not isinstance(usage, dict):
            raise BackendError(ErrorKind.TRANSIENT, "reply has no usage block")
        return ChatResponse(
            text=text,
            data=data,
            input_tokens=token_count(usage.get("input_tokens")),
            output_tokens=token_count(usage.get("output_tokens")),
            model=str(msg.get("model") or "") or self.model,
            finish_reason=stop_reason,
            structured_mode="tool_use" if schema is not None else "text",
        )

    # ------------------------------------------------------------------ Message Batches (docs/batch.md)

    #: Anthropic's documented limits per message batch: 100,000 requests or 256 MB
    batch_max_requests = 100_000
    batch_max_bytes = 256 * 1024 * 1024
    supports_batch = True

    def batch_line(self, request: ChatRequest) -> tuple[dict[str, Any], str]:
        return self._params(request), "tool_use" if request.json_schema is not None else "text"

    def batch_submit(self, lines: list[tuple[str, dict[str, Any]]], *, timeout: float,
                     metadata: dict[str, str] | None = None) -> str:
        anthropic = self._sdk()
        try:
            batch = self._get_client().messages.batches.create(
                requests=[{"custom_id": cid, "params": params} for cid, params in lines], timeout=timeout)
        except Exception as exc:
            raise classify(exc, anthropic) from exc
        return str(batch.id)

    def batch_poll(self, batch_id: str, *, timeout: float) -> BatchState:
        anthropic = self._sdk()
        try:
            b = self._get_client().messages.batches.retrieve(batch_id, timeout=timeout)
        except Exception as exc:
            raise classify(exc, anthropic) from exc
        rc = getattr(b, "request_counts", None)
        counts = {k: int(getattr(rc, k, 0) or 0) for k in ("processing", "succeeded", "errored", "canceled", "expired")}
        return BatchState(batch_id, str(b.processing_status), b.processing_status == "ended", counts,
                          expires_at=getattr(b, "expires_at", None))

    def batch_results(self, state: BatchState, *, timeout: float) -> Iterator[tuple[str | None, dict[str, Any]]]:
        """``(custom_id, outcome)`` per line of an ended batch's results stream, read line by line (the SDK's
        decoder stops at the first line that is not JSON): a line that cannot be read is an error outcome for its
        call alone (:func:`unreadable_result`)."""
        anthropic = self._sdk()
        try:
            response = self._get_client().messages.batches.results(state.batch_id, timeout=timeout).http_response
            try:
                for line in response.iter_lines():
                    if line.strip():
                        yield _batch_result_line(line)
            finally:
                response.close()
        except BackendError:
            raise
        except Exception as exc:
            raise classify(exc, anthropic) from exc

    def batch_response(self, request: ChatRequest, mode: str, body: dict[str, Any]) -> ChatResponse:
        return self._response(body, request)

    def batch_error(self, outcome: dict[str, Any], mode: str) -> BackendError:
        status, code = outcome.get("status"), str(outcome.get("code") or "")
        message = str(outcome.get("error") or code)
        if code.startswith("batch_") or status is None or status >= 500:
            return BackendError(ErrorKind.TRANSIENT, message, status)
        return BackendError(ErrorKind.RATE_LIMITED if status == 429 else ErrorKind.PERMANENT, message, status)

    def batch_cancel(self, batch_id: str, *, timeout: float) -> None:
        anthropic = self._sdk()
        try:
            self._get_client().messages.batches.cancel(batch_id, timeout=timeout)
        except Exception as exc:
            raise classify(exc, anthropic) from exc


#: HTTP status of an errored batch line's error type (Anthropic's error types)
_ANTHROPIC_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                     "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
                     "overloaded_error": 529}


def _batch_result_line(line: str) -> tuple[str | None, dict[str, Any]]:
    """One line of a message batch's results as ``(custom_id, outcome)``; never raises."""
    try:
        rec = json.loads(line)
    except ValueError as e:
        return unreadable_result(line, f"not JSON: {e}")
    if not isinstance(rec, dict) or rec.get("custom_id") is None or not isinstance(rec.get("result"), dict):
        return unreadable_result(line, "not a result record")
    cid, result = str(rec["custom_id"]), rec["result"]
    rtype = result.get("type")
    if rtype == "succeeded" and isinstance(result.get("message"), dict):
        return cid, {"body": result["message"]}
    if rtype == "errored":
        outer: dict[str, Any] = result["error"] if isinstance(result.get("error"), dict) else {}
        err: dict[str, Any] = outer["error"] if isinstance(outer.get("error"), dict) else outer
        etype = str(err.get("type") or "")
        return cid, {"error": str(err.get("message") or etype or "errored"), "code": etype,
                     "status": _ANTHROPIC_STATUS.get(etype)}
    if rtype in ("canceled", "expired"):
        return cid, {"error": f"the batch line was {rtype}", "code": f"batch_{rtype}", "status": None}
    return unreadable_result(line, f"result type {rtype!r}")


def _deep_text(value: Any) -> str:
    """JSON text of a decoded value nested deeper than :data:`MAX_JSON_DEPTH`, written without recursion;
    containers below the limit's next level are shown as ``[...]`` / ``{...}``."""
    out: list[str] = []
    todo: list[tuple[Any, int] | str] = [(value, 1)]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        v, depth = item
        if isinstance(v, dict):
            if depth > MAX_JSON_DEPTH + 1:
                out.append("{...}")
                continue
            todo.append("}")
            for i, (k, x) in reversed(list(enumerate(v.items()))):
                todo.append((x, depth + 1))
                todo.append(("" if i == 0 else ", ") + json.dumps(str(k), ensure_ascii=False) + ": ")
            todo.append("{")
        elif isinstance(v, list):
            if depth > MAX_JSON_DEPTH + 1:
                out.append("[...]")
                continue
            todo.append("]")
            for i, x in reversed(list(enumerate(v))):
                todo.append((x, depth + 1))
                if i:
                    todo.append(", ")
            todo.append("[")
        else:
            out.append(json.dumps(v, ensure_ascii=False))
    return "".join(out)
