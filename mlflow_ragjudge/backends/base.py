"""The backend interface: a thin translation layer to one provider's API.

A backend turns a :class:`ChatRequest` into a provider call and the reply into a
:class:`ChatResponse`, and classifies every error into a :class:`BackendError`
with an :class:`ErrorKind`. It holds no policy: caching, concurrency limits,
retries and accounting live in :class:`mlflow_ragjudge.client.JudgeClient` alone
(DESIGN point 5).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ChatRequest",
    "ChatResponse",
    "EmbedResponse",
    "ErrorKind",
    "BackendError",
    "Backend",
    "JsonSchema",
]


@dataclass(frozen=True)
class JsonSchema:
    """A named JSON schema for structured output.

    Backends that support constrained decoding use it (OpenAI ``response_format``
    ``json_schema``, Anthropic forced tool use); the others get the schema as a
    format instruction in the prompt and the reply is parsed as JSON text.
    """

    name: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class ChatRequest:
    """One chat-completion request, provider-neutral.

    ``messages`` are ``{"role": "system" | "user" | "assistant", "content": str}``.
    Everything here changes the output and so enters the cache key.
    """

    messages: tuple[dict[str, str], ...]
    temperature: float = 0.0
    max_tokens: int = 1024
    json_schema: JsonSchema | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @staticmethod
    def of(messages: list[dict[str, str]], **kw: Any) -> ChatRequest:
        return ChatRequest(messages=tuple(dict(m) for m in messages), **kw)

    def params(self) -> dict[str, Any]:
        """Sampling parameters as recorded in transcripts and the cache key."""
        out: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.seed is not None:
            out["seed"] = self.seed
        if self.stop:
            out["stop"] = list(self.stop)
        if self.json_schema is not None:
            out["json_schema"] = {"name": self.json_schema.name, "schema": self.json_schema.schema}
        return out


@dataclass
class ChatResponse:
    """A provider's reply.

    ``text`` is the message text (for structured output, the JSON text);
    ``data`` the parsed structured output when the provider returned one
    (Anthropic tool input, or OpenAI ``json_schema`` content).
    """

    text: str
    data: dict[str, Any] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    finish_reason: str | None = None
    refusal: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "data": self.data,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "model": self.model,
            "finish_reason": self.finish_reason,
            "refusal": self.refusal,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ChatResponse:
        return cls(
            text=str(d.get("text") or ""),
            data=d.get("data"),
            input_tokens=int(d.get("input_tokens") or 0),
            output_tokens=int(d.get("output_tokens") or 0),
            model=str(d.get("model") or ""),
            finish_reason=d.get("finish_reason"),
            refusal=d.get("refusal"),
        )


@dataclass
class EmbedResponse:
    vectors: list[list[float]]
    input_tokens: int = 0
    model: str = ""


class ErrorKind(str, enum.Enum):
    """How the client's retry policy treats an error."""

    RATE_LIMITED = "rate_limited"  # 429: wait retry-after (or back off), then retry
    TRANSIENT = "transient"  # 5xx, overloaded: back off, retry
    TIMEOUT = "timeout"  # request timed out: back off, retry
    CONNECTION = "connection"  # could not connect: back off, retry
    PERMANENT = "permanent"  # 4xx other than 429, auth, bad request: fail at once
    REFUSED = "refused"  # the model refused (content policy): fail at once, never cached


RETRYABLE = frozenset({ErrorKind.RATE_LIMITED, ErrorKind.TRANSIENT, ErrorKind.TIMEOUT, ErrorKind.CONNECTION})


@dataclass
class BackendError(Exception):
    """A classified provider error."""

    kind: ErrorKind
    message: str
    status: int | None = None
    retry_after: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        code = f" (HTTP {self.status})" if self.status else ""
        return f"{self.kind.value}{code}: {self.message}"

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE


class Backend(ABC):
    """A judge-model provider.

    Subclasses set ``provider`` and ``model`` and implement :meth:`chat` (and
    :meth:`embed` where the provider has embeddings).
    """

    provider: str = "abstract"
    model: str = ""
    #: whether the backend can constrain output to a JSON schema
    supports_json_schema: bool = False

    @property
    def base_url(self) -> str | None:
        return None

    def connection_key(self) -> str:
        """Key under which concurrency and rate limits are shared process-wide."""
        return f"{self.provider}|{self.base_url or ''}"

    def identity(self) -> dict[str, Any]:
        """What identifies this backend in the cache key and the run params."""
        return {"provider": self.provider, "model": self.model, "base_url": self.base_url}

    @property
    def uri(self) -> str:
        return f"{self.provider}:/{self.model}"

    @abstractmethod
    def chat(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        """Send one request; raise :class:`BackendError` on any failure."""

    def embed(self, texts: list[str], *, timeout: float) -> EmbedResponse:
        raise BackendError(ErrorKind.PERMANENT, f"{self.provider} backend has no embeddings API")

    def secrets(self) -> list[str]:
        """Secret strings this backend holds, so the client can scrub them from records."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"
