"""The backend interface: a thin translation layer to one provider's API.

A backend turns a :class:`ChatRequest` into a provider call and the reply into a
:class:`ChatResponse`, and classifies every error into a :class:`BackendError`
with an :class:`ErrorKind`. It holds no policy: caching, concurrency limits,
retries and accounting live in :class:`mlflow_ragjudge.llm.client.JudgeClient` alone
(DESIGN point 5).
"""

from __future__ import annotations

import enum
import json
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from .urls import path_secrets, query_secrets, safe_url, split_base_url, url_credentials, url_digest, url_identity

__all__ = [
    "ChatRequest",
    "ChatResponse",
    "EmbedResponse",
    "RateInfo",
    "ErrorKind",
    "BackendError",
    "WireWatch",
    "watching_wire",
    "wire_watch",
    "Backend",
    "BatchState",
    "unreadable_result",
    "JsonSchema",
    "SCHEMA_NOTE_VERSION",
    "CARRY_MODES",
    "carry_schema",
    "safe_url",
    "url_credentials",
    "split_base_url",
    "query_secrets",
    "MAX_HEADER_SECONDS",
    "MAX_HEADER_COUNT",
    "clamp_seconds",
    "clamp_count",
    "url_identity",
]

#: the longest wait a server's header is taken to ask for (a day: no provider's window is longer); a longer, an
#: infinite or an overflowing value (``retry-after: 1e308``, a reset in the year 9999) is read as this, and the
#: retry budget (``max_retry_time``) then decides whether it is waited out
MAX_HEADER_SECONDS = 86_400.0
#: the largest request count a header is taken to announce
MAX_HEADER_COUNT = 10**9


def clamp_seconds(value: object) -> float | None:
    """A number of seconds a server asked for, as a finite float in ``[0, MAX_HEADER_SECONDS]``; None when it is not
    a number or not a real one (``nan``). The one clamp every wait read from a server goes through (the header
    readers, and again the gate for what a backend reports), so no absurd value can overflow a timer."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        return MAX_HEADER_SECONDS if value > 0 else 0.0
    if seconds != seconds:
        return None
    return min(MAX_HEADER_SECONDS, max(0.0, seconds))


def clamp_count(value: object) -> int | None:
    """A request count a server announced, as an int in ``[0, MAX_HEADER_COUNT]``; None when it is not a real
    number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return int(min(MAX_HEADER_COUNT, max(0, value)))


@dataclass(frozen=True)
class RateInfo:
    """What a reply's rate-limit headers said about the connection's budgets: requests (OpenAI
    ``x-ratelimit-*-requests``, Anthropic ``anthropic-ratelimit-requests-*``) and tokens (OpenAI
    ``x-ratelimit-*-tokens``, Anthropic ``anthropic-ratelimit-tokens-*`` / ``-input-tokens-*``, the tighter). Any
    field may be unknown."""

    remaining: int | None = None  # requests the server will still accept in its current window
    limit: int | None = None  # requests it accepts per window
    reset: float | None = None  # seconds until the budget grows again
    tokens_remaining: int | None = None  # tokens it will still accept
    tokens_limit: int | None = None  # tokens it accepts per window
    tokens_reset: float | None = None  # seconds until the token budget is whole again


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
    #: how the reply's format was obtained (``json_schema``, ``json_object``, ``text``, ``tool_use``);
    #: set by the backend, recorded in transcripts, not part of the cached reply
    structured_mode: str | None = None
    #: the reply's rate-limit headers, for the connection's gate (never cached)
    rate: RateInfo | None = None
    #: seconds the request waited in the backend before it was sent (the structured-mode negotiation): not the
    #: server's latency
    queued: float = 0.0

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
    rate: RateInfo | None = None


class ErrorKind(str, enum.Enum):
    """How the client's retry policy treats an error."""

    RATE_LIMITED = "rate_limited"  # 429: wait retry-after (or back off), then retry
    TRANSIENT = "transient"  # 5xx, overloaded: back off, retry
    TIMEOUT = "timeout"  # request timed out: back off, retry
    CONNECTION = "connection"  # could not connect: back off, retry
    PERMANENT = "permanent"  # 4xx other than 429, auth, bad request: fail at once
    REFUSED = "refused"  # the model refused (content policy): fail at once, never cached
    # The server rejected the requested output format (response_format); the backend has already
    # switched its connection to a weaker mode, so the client resends at once, without backoff and
    # without using up an attempt (bounded by the number of modes).
    FORMAT_REJECTED = "format_rejected"
    # An exception from our own code or an unknown one from an SDK: a bug, never retried, the row fails
    # ``internal_error`` with the message.
    INTERNAL = "internal"
    # The evaluation was asked to stop (Ctrl-C, SIGTERM; core.stop): the request is not sent. Never retried.
    INTERRUPTED = "interrupted"
    # Held back on its way out: between the request's start and the moment it would have left, a 429 on the same
    # connection asked for quiet (see WireWatch). It never reached the server: not a request, not an attempt; it
    # is started again once the cool-down is over.
    HELD = "held"


class WireWatch(Protocol):
    """What the policy layer watches on the wire, through the SDKs' HTTP clients (their event hooks): the moment a
    request is about to leave, and the status and headers of a reply as soon as they arrive, before the SDK reads
    the body. Under many threads a started request may wait long for its turn on the CPU before the SDK puts it on
    the wire, and a 429 may wait as long before its exception reaches the retry layer; the watch sees both at once.
    """

    def before_wire(self) -> None:
        """Raise :class:`BackendError` (``ErrorKind.HELD``) to keep the request from leaving."""

    def on_reply(self, status: int, headers: Any) -> None:
        """A reply's status and headers, as soon as they arrive."""


_WIRE = threading.local()


def wire_watch() -> WireWatch | None:
    """The watch of the request this thread is sending (None outside :func:`watching_wire`)."""
    return getattr(_WIRE, "watch", None)


@contextmanager
def watching_wire(watch: WireWatch | None) -> Iterator[None]:
    """Requests this thread sends inside the block are watched by ``watch`` (the backends' SDK hooks ask
    :func:`wire_watch`): per thread, because one backend may serve several gates, and a call runs on one thread."""
    before = getattr(_WIRE, "watch", None)
    _WIRE.watch = watch
    try:
        yield
    finally:
        _WIRE.watch = before


RETRYABLE = frozenset({
    ErrorKind.RATE_LIMITED, ErrorKind.TRANSIENT, ErrorKind.TIMEOUT, ErrorKind.CONNECTION, ErrorKind.FORMAT_REJECTED,
})

#: version of the schema note below; recorded in transcripts with the mode that used it
SCHEMA_NOTE_VERSION = "1"
#: structured-output modes in which the server does not enforce the full schema, so the prompt carries it
CARRY_MODES = frozenset({"json_schema_basic", "json_object", "text"})


def carry_schema(messages: tuple[dict[str, str], ...], schema: JsonSchema) -> tuple[dict[str, str], ...]:
    """The messages with the reply's JSON schema appended to the last user message.

    Used whenever the server cannot enforce the schema itself (JSON mode, plain text): the
    schema says exactly which fields, how many items and which values the reply may hold, so a
    model that follows it produces what the validator accepts.
    """
    note = (
        "\n\nThe reply must be one JSON object that is valid against this JSON Schema. The schema fixes the "
        "fields, the number of items in each list and the values allowed:\n```json\n"
        + json.dumps(schema.schema, ensure_ascii=False)
        + "\n```\nReply with that JSON object and nothing else."
    )
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            if not m["content"].endswith(note):  # a re-ask may carry it already: never twice
                m["content"] = m["content"] + note
            break
    else:
        out.append({"role": "user", "content": note.strip()})
    return tuple(out)


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


@dataclass
class BatchState:
    """A provider batch as last polled: ``status`` in the provider's words, ``ended`` once no line will change,
    ``counts`` (e.g. ``completed`` / ``failed`` / ``total``, or ``succeeded`` / ``errored`` / ``processing``),
    ``files`` where the provider keeps the results (OpenAI's output and error files)."""

    batch_id: str
    status: str
    ended: bool
    counts: dict[str, int] = field(default_factory=dict)
    expires_at: Any = None
    message: str | None = None
    files: tuple[str | None, ...] = ()


_CUSTOM_ID = re.compile(r'"custom_id"\s*:\s*"((?:[^"\\]|\\.)*)"')


def unreadable_result(text: str, why: str) -> tuple[str | None, dict[str, Any]]:
    """One line of a batch's results that cannot be read (not JSON, torn, not a result record): its ``custom_id``
    when it can still be found in the text (None otherwise) and an error outcome for that call alone, retryable
    (the reply was lost on the way, not refused), so the batch's other lines are read as usual."""
    match = _CUSTOM_ID.search(text)
    cid: str | None = None
    if match is not None:
        try:
            cid = str(json.loads(f'"{match.group(1)}"'))
        except ValueError:
            cid = None
    snippet = text[:80] + ("..." if len(text) > 80 else "")
    return cid, {"error": f"its result line could not be read ({why}): {snippet!r}", "code": "batch_unreadable_line",
                 "status": None}


class Backend(ABC):
    """A judge-model provider.

    Subclasses set ``provider`` and ``model`` and implement :meth:`chat` (and
    :meth:`embed` where the provider has embeddings).
    """

    provider: str = "abstract"
    model: str = ""
    #: whether the backend can return a reply that follows a JSON schema (enforced by the server,
    #: or carried in the prompt when the server cannot enforce it)
    supports_json_schema: bool = False

    @property
    def structured_mode(self) -> str:
        """How structured replies are obtained on this connection right now (recorded on the run)."""
        return "json_schema" if self.supports_json_schema else "text"

    def format_followed(self, mode: str) -> None:
        """A reply sent in ``mode`` held the JSON asked for (negotiating backends count it)."""
        return None

    def format_ignored(self, mode: str) -> None:
        """A reply sent in ``mode`` held no JSON at all: the server accepted the structured-output
        request but did not enforce it. Backends that negotiate move to a mode that carries the
        schema in the prompt; others do nothing."""
        return None

    def check_ready(self) -> None:
        """Raise ``ValueError`` (naming the fix) when this backend cannot send requests, e.g. a
        missing API key. Called before a run's first request; a dry run skips it."""
        return None

    def warm_up(self) -> None:
        """Load the SDK and build its client now, before the first request is paced: an SDK imported by the
        first request delays the paced starts behind it until they leave together. Backends without one do
        nothing."""
        return None

    @property
    def base_url(self) -> str | None:
        return None

    def base_query(self) -> dict[str, str]:
        """The base URL's query, sent with every request (``?deployment=...``, a gateway's ``?token=...``)."""
        return {}

    def connection_key(self) -> str:
        """Key under which concurrency and rate limits are shared process-wide (and pending batches are found in
        the cache): the provider and :func:`~.urls.url_identity` of the base URL -- no secret in it, and a query
        that selects the model makes a connection of its own."""
        return f"{self.provider}|{url_identity(self.base_url, self.base_query()) or ''}"

    def identity(self) -> dict[str, Any]:
        """What identifies this backend in the run params and transcripts: the base URL as
        :func:`~.urls.safe_url` shows it (its query's names, every value and key-like path segment ``***``)."""
        query = "&".join(f"{k}=" for k in self.base_query())
        shown = safe_url(f"{self.base_url}?{query}" if self.base_url and query else self.base_url)
        return {"provider": self.provider, "model": self.model, "base_url": shown}

    def cache_identity(self) -> dict[str, Any]:
        """What identifies this backend in the cache key: the identity, with the base URL as
        :func:`~.urls.url_identity` gives it (a query that selects the model counts, a key in the query does not)
        and, when the path holds something key-like, a digest of it (never shown nor stored: it lives only inside
        the cache key's own hash)."""
        ident = dict(self.identity())
        ident["base_url"] = url_identity(self.base_url, self.base_query())
        hidden = path_secrets(self.base_url)
        if hidden:
            ident["url_secrets"] = url_digest("\n".join(sorted(hidden)))
        return ident

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

    # ------------------------------------------------------------------ batch API (optional)

    #: whether the provider has a batch API this backend speaks (OpenAI's Batch API, Anthropic's Message Batches)
    supports_batch: bool = False
    #: the provider's documented limits per batch (requests, bytes of request bodies)
    batch_max_requests: int = 0
    batch_max_bytes: int = 0

    def batch_line(self, request: ChatRequest) -> tuple[dict[str, Any], str]:
        """The request as one batch line's body (exactly what :meth:`chat` would send) and its structured mode."""
        raise BackendError(ErrorKind.PERMANENT, f"{self.provider} backend has no batch API")

    def batch_submit(self, lines: list[tuple[str, dict[str, Any]]], *, timeout: float,
                     metadata: dict[str, str] | None = None) -> str:
        raise BackendError(ErrorKind.PERMANENT, f"{self.provider} backend has no batch API")

    def batch_poll(self, batch_id: str, *, timeout: float) -> BatchState:
        raise BackendError(ErrorKind.PERMANENT, f"{self.provider} backend has no batch API")

    def batch_results(self, state: BatchState, *, timeout: float) -> Any:
        raise BackendError(ErrorKind.PERMANENT, f"{self.provider} backend has no batch API")

    def batch_response(self, request: ChatRequest, mode: str, body: dict[str, Any]) -> ChatResponse:
        raise BackendError(ErrorKind.PERMANENT, f"{self.provider} backend has no batch API")

    def batch_error(self, outcome: dict[str, Any], mode: str) -> BackendError:
        return BackendError(ErrorKind.PERMANENT, str(outcome.get("error")))

    def batch_cancel(self, batch_id: str, *, timeout: float) -> None:
        raise BackendError(ErrorKind.PERMANENT, f"{self.provider} backend has no batch API")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"
