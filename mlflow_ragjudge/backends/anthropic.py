"""Anthropic's Messages API through the official ``anthropic`` SDK.

URI: ``anthropic:/claude-3-5-haiku-latest``; key from ``ANTHROPIC_API_KEY``;
``?base_url=`` or ``ANTHROPIC_BASE_URL`` for a proxy. Structured output uses a
forced tool call whose ``input_schema`` is the judge's JSON schema.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from ._sdk import classify, missing_sdk
from .base import Backend, BackendError, ChatRequest, ChatResponse, ErrorKind, url_credentials


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
        self._base_url = (base_url or os.environ.get("ANTHROPIC_BASE_URL") or "").rstrip("/") or None
        self._api_key = api_key or os.environ.get("ANTHROPIC_API_KEY") or ""
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._takes_temperature: bool | None = None

    @property
    def base_url(self) -> str | None:
        return self._base_url

    @property
    def structured_mode(self) -> str:
        return "tool_use"

    def secrets(self) -> list[str]:
        return ([self._api_key] if self._api_key else []) + url_credentials(self._base_url)

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

    def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        self.check_ready()
        with self._client_lock:  # one SDK client (and connection pool) however many threads start at once
            if self._client is None:
                anthropic = self._sdk()
                self._client = anthropic.Anthropic(api_key=self._api_key, base_url=self._base_url, max_retries=0)
        return self._client

    def _sdk_takes_temperature(self) -> bool:
        if self._takes_temperature is None:
            import inspect

            params = inspect.signature(self._get_client().messages.create).parameters
            self._takes_temperature = "temperature" in params
        return self._takes_temperature

    def chat(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        anthropic = self._sdk()
        system = "\n\n".join(m["content"] for m in request.messages if m["role"] == "system")
        messages = [{"role": m["role"], "content": m["content"]} for m in request.messages if m["role"] != "system"]
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": request.max_tokens,
            "timeout": timeout,
        }
        # Newer SDKs dropped `temperature` from the signature; the API still reads it from the body.
        if self._sdk_takes_temperature():
            kwargs["temperature"] = request.temperature
        else:
            kwargs["extra_body"] = {"temperature": request.temperature}
        if system:
            kwargs["system"] = system
        if request.stop:
            kwargs["stop_sequences"] = list(request.stop)
        schema = request.json_schema
        if schema is not None:
            kwargs["tools"] = [
                {"name": schema.name, "description": "Record the verdict.", "input_schema": schema.schema}
            ]
            kwargs["tool_choice"] = {"type": "tool", "name": schema.name}
        try:
            msg = self._get_client().messages.create(**kwargs)
        except Exception as exc:
            raise classify(exc, anthropic) from exc
        texts: list[str] = []
        data: dict[str, Any] | None = None
        for block in getattr(msg, "content", None) or []:
            btype = getattr(block, "type", None)
            if btype == "text":
                texts.append(block.text)
            elif btype == "tool_use" and schema is not None and getattr(block, "name", None) == schema.name:
                inp = getattr(block, "input", None)
                data = dict(inp) if isinstance(inp, dict) else None
        text = json.dumps(data, ensure_ascii=False) if data is not None else "".join(texts)
        stop_reason = getattr(msg, "stop_reason", None)
        if stop_reason == "refusal":
            raise BackendError(ErrorKind.REFUSED, text or "the model refused to answer")
        usage = getattr(msg, "usage", None)
        if usage is None:
            raise BackendError(ErrorKind.TRANSIENT, "reply has no usage block")
        return ChatResponse(
            text=text,
            data=data,
            input_tokens=int(getattr(usage, "input_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
            model=getattr(msg, "model", "") or self.model,
            finish_reason=stop_reason,
            structured_mode="tool_use" if schema is not None else "text",
        )
