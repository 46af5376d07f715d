"""OpenAI and OpenAI-compatible servers (vLLM, Ollama, llama.cpp, TGI, LM Studio).

URI forms (see :func:`mlflow_ragjudge.backends.resolve_backend`)::

    openai:/gpt-4o-mini
    openai:/prometheus-eval/prometheus-8x7b-v2.0?base_url=http://localhost:8000/v1
    OPENAI_BASE_URL=http://localhost:11434/v1 -> openai:/llama3.1:70b

The key comes from ``OPENAI_API_KEY``; a local server that needs none gets a
placeholder key when a base URL is set.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from ._sdk import classify, missing_sdk
from .base import Backend, BackendError, ChatRequest, ChatResponse, EmbedResponse, ErrorKind

_PLACEHOLDER_KEY = "not-needed"


class OpenAIBackend(Backend):
    """Chat completions (and embeddings) through the official ``openai`` SDK.

    Args:
        model: model name as the server knows it.
        base_url: an OpenAI-compatible server; default ``OPENAI_BASE_URL`` or OpenAI.
        api_key: default ``OPENAI_API_KEY``.
        structured: ``"json_schema"`` (constrained decoding; OpenAI, vLLM, Ollama),
            ``"json_object"`` (JSON mode only), or ``"none"`` (plain text; the judge's
            prompt then carries the format, e.g. Prometheus ``[RESULT] n``).
            Default: ``json_schema`` for OpenAI itself, ``none`` for other servers.
    """

    provider = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        structured: str | None = None,
        organization: str | None = None,
    ) -> None:
        self.model = model
        self._base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or "").rstrip("/") or None
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            if self._base_url is None:
                raise ValueError(
                    "No OpenAI API key: set the OPENAI_API_KEY environment variable, or pass api_key=, "
                    "or point the judge at an OpenAI-compatible server with "
                    "'openai:/<model>?base_url=http://host:port/v1' (local servers need no key)."
                )
            key = _PLACEHOLDER_KEY
        self._api_key = key
        self._organization = organization
        if structured is None:
            structured = "json_schema" if self._base_url is None else "none"
        if structured not in ("json_schema", "json_object", "none"):
            raise ValueError(f"structured must be 'json_schema', 'json_object' or 'none', not {structured!r}")
        self.structured = structured
        self.supports_json_schema = structured == "json_schema"
        self._client: Any = None
        self._client_lock = threading.Lock()

    @property
    def base_url(self) -> str | None:
        return self._base_url

    def secrets(self) -> list[str]:
        return [self._api_key] if self._api_key != _PLACEHOLDER_KEY else []

    def _sdk(self) -> Any:
        try:
            import openai
        except ImportError as e:  # pragma: no cover - openai is a dependency
            raise missing_sdk("openai") from e
        return openai

    def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        with self._client_lock:  # one SDK client (and connection pool) however many threads start at once
            if self._client is None:
                openai = self._sdk()
                # The client is the only retry layer: the SDK's own retries are off.
                self._client = openai.OpenAI(
                    api_key=self._api_key,
                    base_url=self._base_url,
                    organization=self._organization,
                    max_retries=0,
                )
        return self._client

    def chat(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        openai = self._sdk()
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in request.messages],
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
            "timeout": timeout,
        }
        if request.seed is not None:
            kwargs["seed"] = request.seed
        if request.stop:
            kwargs["stop"] = list(request.stop)
        if request.json_schema is not None:
            if self.structured == "json_schema":
                kwargs["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {
                        "name": request.json_schema.name,
                        "schema": request.json_schema.schema,
                        "strict": True,
                    },
                }
            elif self.structured == "json_object":
                kwargs["response_format"] = {"type": "json_object"}
        try:
            completion = self._get_client().chat.completions.create(**kwargs)
        except Exception as exc:
            raise classify(exc, openai) from exc
        if not getattr(completion, "choices", None):
            raise BackendError(ErrorKind.TRANSIENT, "reply has no choices")
        choice = completion.choices[0]
        message = choice.message
        refusal = getattr(message, "refusal", None)
        text = message.content or ""
        usage = getattr(completion, "usage", None)
        data = None
        if request.json_schema is not None and self.structured != "none" and text:
            try:
                parsed = json.loads(text)
                data = parsed if isinstance(parsed, dict) else None
            except ValueError:
                data = None  # the parser downstream reports it with the raw text
        return ChatResponse(
            text=text,
            data=data,
            input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            model=getattr(completion, "model", "") or self.model,
            finish_reason=getattr(choice, "finish_reason", None),
            refusal=refusal,
        )

    def embed(self, texts: list[str], *, timeout: float) -> EmbedResponse:
        openai = self._sdk()
        try:
            resp = self._get_client().embeddings.create(model=self.model, input=list(texts), timeout=timeout)
        except Exception as exc:
            raise classify(exc, openai) from exc
        items = sorted(resp.data, key=lambda d: d.index)
        if len(items) != len(texts):
            raise BackendError(ErrorKind.TRANSIENT, f"asked for {len(texts)} embeddings, got {len(items)}")
        usage = getattr(resp, "usage", None)
        return EmbedResponse(
            vectors=[list(map(float, d.embedding)) for d in items],
            input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            model=getattr(resp, "model", "") or self.model,
        )
