"""A local fake LLM server speaking the OpenAI and Anthropic HTTP APIs.

The official ``openai`` and ``anthropic`` SDKs work against it unmodified::

    server = FakeLLMServer().start()
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])  # -> "ok"
    server.stop()

Endpoints (the ``/v1`` prefix is optional, and so is a gateway's own path before the endpoint):

* ``POST /v1/chat/completions``      -> ``api="openai_chat"``
* ``POST /v1/responses``             -> ``api="openai_responses"`` (the Responses API, which the recorded traces'
  example apps call: tests/data/traces/record.py)
* ``POST /v1/embeddings``            -> ``api="openai_embeddings"`` (float or base64 encoding)
* ``POST /v1/messages``              -> ``api="anthropic_messages"``
* ``/v1/files``, ``/v1/batches``             -> ``api="openai_batch"`` (OpenAI's Files and Batch APIs)
* ``/v1/messages/batches``                 -> ``api="anthropic_batch"`` (Message Batches; see tests/fakebatch.py)

What the package, its benchmarks' peers and the trace recorder send, and no more: a request with
``stream=true`` gets a 400 naming ``stream``, and Anthropic's token counting (``/v1/messages/count_tokens``) a
404 -- nothing here streams or counts tokens that way (the backends read ``usage`` from each reply).

Every reply is decided by, in order: the rate limiter (``rate_limit_per_minute``), the queue filled by
:meth:`FakeLLMServer.script`, then the handler set with :meth:`FakeLLMServer.set_handler` (default:
text ``"ok"``, and a hashed bag-of-words vector for embeddings). A handler or scripted item may be a
:class:`Reply`, a ``str`` (text), a ``dict`` (structured output, see :attr:`Reply.json`), a
``list[float]`` (an embedding), ``None`` (default reply) or, in the script queue, a callable taking
the :class:`Request` and returning one of those.

Standard library only (``pytest`` is imported lazily for the ``fake_llm`` fixture, the SDKs lazily
for the ``openai_client``/``anthropic_client`` conveniences).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import json as jsonlib
import math
import re
import secrets
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Union
from urllib.parse import parse_qs, urlsplit

from fakebatch import BatchAPI

__all__ = [
    "DEFAULT_EMBEDDING_DIM",
    "FakeLLMServer",
    "Handler",
    "Reply",
    "ReplyLike",
    "Request",
    "embed_text",
    "fake_llm",
]

DEFAULT_EMBEDDING_DIM = 32

OPENAI_CHAT = "openai_chat"
OPENAI_RESPONSES = "openai_responses"
OPENAI_EMBEDDINGS = "openai_embeddings"
ANTHROPIC_MESSAGES = "anthropic_messages"

_CONNECTION_ERRORS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout)

# OpenAI finish_reason <-> Anthropic stop_reason, used when a Reply only sets one of them.
_FINISH_TO_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                   "content_filter": "refusal", "function_call": "tool_use"}
_STOP_TO_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                   "model_context_window_exceeded": "length", "tool_use": "tool_calls",
                   "refusal": "content_filter", "pause_turn": "stop"}

_OPENAI_ERROR_TYPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    409: ("invalid_request_error", None),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}
_ANTHROPIC_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_DEFAULT_ERROR_MESSAGES: dict[int, str] = {
    400: "Invalid request.",
    401: "Incorrect API key provided.",
    403: "Permission denied.",
    404: "The model does not exist or you do not have access to it.",
    408: "Request timed out.",
    409: "Conflict.",
    429: "Rate limit reached for requests.",
    500: "The server had an error while processing your request.",
    502: "Bad gateway.",
    503: "The engine is currently overloaded, please try again later.",
    504: "Gateway timeout.",
    529: "Overloaded",
}
_REASON_PHRASES: dict[int, str] = {529: "Site is overloaded"}


# --------------------------------------------------------------------------------------------------
# Request / Reply
# --------------------------------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    """Flatten an OpenAI or Anthropic message ``content`` (string or list of parts/blocks) to text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return str(content)
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            parts.append(str(part.get("text", "")))
        elif kind == "refusal":
            parts.append(str(part.get("refusal", "")))
        elif kind == "tool_use":
            parts.append(jsonlib.dumps(part.get("input", {}), sort_keys=True))
        elif kind == "tool_result":
            parts.append(_text_of(part.get("content")))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        elif kind in ("image", "image_url", "input_image"):
            parts.append("[image]")
        elif kind in ("document", "file", "input_file"):
            parts.append("[document]")
        elif kind == "input_audio":
            parts.append("[audio]")
        elif "text" in part:
            parts.append(str(part["text"]))
    return "\n".join(p for p in parts if p)


def _responses_messages(instructions: Any, items: Any) -> list[dict[str, str]]:
    """A Responses API request's ``instructions`` + ``input`` as ``[{"role", "content"}]`` messages.

    ``input`` is a string (one user turn) or a list of items: messages (``{"role", "content"}``, with or
    without ``"type": "message"``; content a string or ``input_text``/``output_text`` parts), function
    calls (rendered as ``name(arguments)`` by the assistant) and their outputs (a ``"tool"`` message).
    """
    out: list[dict[str, str]] = []
    if instructions is not None:
        out.append({"role": "system", "content": _text_of(instructions)})
    if items is None:
        return out
    if not isinstance(items, list):
        items = [items]
    for item in items:
        if isinstance(item, str):
            out.append({"role": "user", "content": item})
            continue
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message" or "role" in item:
            out.append({"role": str(item.get("role", "user")), "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            out.append({"role": "assistant", "content": f"{item.get('name', '')}({item.get('arguments', '')})"})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "content": output if isinstance(output, str) else _text_of(output)})
    return out


def _count_words(text: str) -> int:
    return len(text.split())


@dataclass
class Request:
    """One HTTP request received by the fake server."""

    api: str
    """``"openai_chat"``, ``"openai_responses"``, ``"openai_embeddings"``, ``"anthropic_messages"`` or
    ``"unknown"``."""
    path: str
    """URL path without the query string, e.g. ``/v1/chat/completions``."""
    headers: dict[str, str]
    """Request headers, lower-cased keys."""
    body: Any
    """Parsed JSON body (``None`` if absent or not JSON; see :attr:`raw_body`)."""
    method: str = "POST"
    query: dict[str, list[str]] = field(default_factory=dict)
    raw_body: bytes = b""
    id: str = ""
    """The request id sent back in the ``request-id`` / ``x-request-id`` response headers."""
    received_at: float = 0.0
    """``time.monotonic()`` when the request was received."""

    def _get(self, key: str, default: Any = None) -> Any:
        return self.body.get(key, default) if isinstance(self.body, dict) else default

    @property
    def model(self) -> str | None:
        return self._get("model")

    @property
    def system(self) -> str | None:
        """System prompt text: Anthropic ``system``, or the OpenAI system/developer messages joined (for
        the Responses API, ``instructions`` first)."""
        if self.api.startswith("anthropic"):
            system = self._get("system")
            return None if system is None else _text_of(system)
        texts = [m["content"] for m in self.messages if m["role"] in ("system", "developer")]
        return "\n".join(texts) if texts else None

    @property
    def messages(self) -> list[dict[str, str]]:
        """``[{"role", "content"}]`` with string contents, for all three APIs.

        Anthropic's ``system`` comes first as a ``"system"`` message, and so do the Responses API's
        ``instructions``; a Responses ``input`` string is one ``"user"`` message. Tool calls/uses are
        rendered as their JSON arguments, images as ``[image]``.
        """
        if self.api == OPENAI_RESPONSES:
            return _responses_messages(self._get("instructions"), self._get("input"))
        out: list[dict[str, str]] = []
        if self.api.startswith("anthropic"):
            system = self._get("system")
            if system is not None:
                out.append({"role": "system", "content": _text_of(system)})
        for message in self._get("messages") or []:
            if not isinstance(message, dict):
                continue
            text = _text_of(message.get("content"))
            if not text and message.get("tool_calls"):
                calls = [c.get("function") or {} for c in message["tool_calls"] if isinstance(c, dict)]
                text = "\n".join(f"{fn.get('name', '')}({fn.get('arguments', '')})" for fn in calls)
            out.append({"role": str(message.get("role", "")), "content": text})
        return out

    @property
    def last_user_text(self) -> str:
        """Content of the last ``user`` message ("" if none)."""
        for message in reversed(self.messages):
            if message["role"] == "user":
                return message["content"]
        return ""

    @property
    def prompt_text(self) -> str:
        """All message contents (system included) joined by newlines."""
        return "\n".join(m["content"] for m in self.messages)

    @property
    def response_format(self) -> dict[str, Any] | None:
        """OpenAI ``response_format`` (e.g. ``{"type": "json_schema", "json_schema": {...}}``); for the
        Responses API its ``text.format`` (e.g. ``{"type": "json_schema", "name": ..., "schema": {...}}``)."""
        if self.api == OPENAI_RESPONSES:
            text = self._get("text")
            return text.get("format") if isinstance(text, dict) else None
        return self._get("response_format")

    @property
    def output_config(self) -> dict[str, Any] | None:
        """Anthropic ``output_config`` (structured outputs: ``{"format": {"type": "json_schema", ...}}``)."""
        return self._get("output_config")

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return self._get("tools")

    @property
    def tool_choice(self) -> Any:
        return self._get("tool_choice")

    @property
    def json_schema(self) -> dict[str, Any] | None:
        """The JSON schema the client asked the reply to follow, whichever mechanism it used.

        OpenAI ``response_format.json_schema.schema``, Anthropic ``output_config.format.schema``, or
        the ``parameters``/``input_schema`` of the tool a structured reply would be sent to.
        """
        fmt = self.response_format
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            if self.api == OPENAI_RESPONSES:
                return fmt.get("schema")
            return (fmt.get("json_schema") or {}).get("schema")
        cfg = self.output_config
        if isinstance(cfg, dict) and isinstance(cfg.get("format"), dict):
            return cfg["format"].get("schema")
        tool = _chosen_tool(self)
        if tool is not None:
            if "function" in tool:
                return tool["function"].get("parameters")
            return tool.get("input_schema", tool.get("parameters"))  # Anthropic; Responses API
        return None

    @property
    def wants_json(self) -> bool:
        """True if the client asked for JSON output (response_format, output_config or tools)."""
        fmt = self.response_format
        if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
            return True
        return self.json_schema is not None

    @property
    def input(self) -> Any:
        """Embeddings ``input`` (str, list of str, or token lists); the Responses API's ``input`` too."""
        return self._get("input")

    @property
    def inputs(self) -> list[str]:
        """Embeddings ``input`` normalised to a list of strings."""
        return _embedding_inputs(self.input)

    @property
    def temperature(self) -> float | None:
        return self._get("temperature")

    @property
    def max_tokens(self) -> int | None:
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            value = self._get(key)
            if value is not None:
                return value
        return None

    @property
    def stream(self) -> bool:
        return bool(self._get("stream", False))


@dataclass
class Reply:
    """What the fake server answers to one request. All fields optional."""

    text: str | None = None
    """Assistant text. Default ``"ok"`` (unless ``json``, ``refusal`` or ``empty`` is set)."""
    json: dict[str, Any] | None = None
    """Structured output. OpenAI: serialized as ``message.content`` (or as a function tool call when the
    request has ``tools`` and no JSON ``response_format``). Anthropic: a ``tool_use`` block (stop_reason
    ``"tool_use"``) when the request has ``tools``, else serialized as text."""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: bytes | None = None
    """Sent verbatim instead of a JSON body (e.g. malformed JSON). ``content-type`` stays
    ``application/json`` unless overridden in ``headers``."""
    delay: float = 0.0
    """Seconds to hang before answering (on top of the server's ``latency``)."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    embedding: list[float] | None = None
    """Vector returned for every input of an embeddings request (default: hashed bag of words)."""
    finish_reason: str | None = None
    stop_reason: str | None = None
    refusal: str | None = None
    """OpenAI ``message.refusal`` (content null); Anthropic: text with stop_reason ``"refusal"``."""
    empty: bool = False
    """Empty content (OpenAI ``""``, Anthropic ``[]``)."""
    tool_name: str | None = None
    """Name of the tool a structured (``json``) reply is sent to (default: the forced/first tool)."""
    drop: bool = False
    """Close the connection without answering (the SDKs raise ``APIConnectionError``)."""
    error_message: str | None = None
    error_type: str | None = None
    error_code: str | None = None
    error_param: str | None = None
    """OpenAI error body ``param``: the request parameter the error is about (e.g. ``response_format``)."""

    @classmethod
    def error(
        cls,
        status: int,
        message: str | None = None,
        retry_after: float | None = None,
        *,
        type: str | None = None,  # noqa: A002 - mirrors the APIs' field name
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """An error reply shaped like each API's real error body.

        OpenAI: ``{"error": {"message", "type", "param", "code"}}``; Anthropic:
        ``{"type": "error", "error": {"type", "message"}, "request_id"}``. ``retry_after`` (seconds)
        sets the ``retry-after`` header (and ``retry-after-ms``).
        """
        hdrs = dict(headers or {})
        if retry_after is not None:
            hdrs.update(_retry_after_headers(retry_after, ceil=False))
        return cls(
            status=status,
            headers=hdrs,
            error_message=message if message is not None else _DEFAULT_ERROR_MESSAGES.get(status, "Error."),
            error_type=type,
            error_code=code,
            error_param=param,
        )

    @property
    def is_error(self) -> bool:
        return self.status >= 400 or self.error_message is not None


ReplyLike = Union[Reply, str, dict[str, Any], list[float], None]
Handler = Callable[[Request], ReplyLike]


def _retry_after_headers(seconds: float, *, ceil: bool) -> dict[str, str]:
    """``retry-after`` (seconds) and ``retry-after-ms``; ``ceil`` rounds both up (never below 1)."""
    seconds = max(0.0, float(seconds))
    if ceil:
        return {"retry-after": str(max(1, math.ceil(seconds))),
                "retry-after-ms": str(max(1, math.ceil(seconds * 1000)))}
    whole = str(int(seconds)) if seconds == int(seconds) else f"{seconds:g}"
    return {"retry-after": whole, "retry-after-ms": str(round(seconds * 1000))}


def _coerce_reply(value: ReplyLike) -> Reply:
    if value is None:
        return Reply()
    if isinstance(value, Reply):
        return value
    if isinstance(value, str):
        return Reply(text=value)
    if isinstance(value, dict):
        return Reply(json=value)
    if isinstance(value, list) and all(isinstance(x, (int, float)) for x in value):
        return Reply(embedding=[float(x) for x in value])
    raise TypeError(f"fakellm: a handler returned {type(value).__name__}; expected Reply, str, dict, "
                    "list[float] or None")


def _chosen_tool(request: Request) -> dict[str, Any] | None:
    """The tool a structured reply goes to, or None when the reply should be plain content."""
    tools = request.tools
    if not tools or not isinstance(tools, list):
        return None
    choice = request.tool_choice
    if choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none"):
        return None
    wanted: str | None = None
    if isinstance(choice, dict):
        wanted = choice.get("name") or (choice.get("function") or {}).get("name")
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        name = tool.get("name") or (tool.get("function") or {}).get("name")
        if wanted is None or name == wanted:
            return tool
    return tools[0] if isinstance(tools[0], dict) else None


def _tool_name(tool: dict[str, Any] | None) -> str:
    if tool is None:
        return "respond"
    return str(tool.get("name") or (tool.get("function") or {}).get("name") or "respond")


# --------------------------------------------------------------------------------------------------
# Embeddings
# --------------------------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


def embed_text(text: str, dim: int = DEFAULT_EMBEDDING_DIM) -> list[float]:
    """Deterministic, L2-normalised hashed bag-of-words vector: texts sharing words are more similar."""
    vec = [0.0] * dim
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dim
        vec[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vec))
    if norm == 0.0:
        vec[0] = 1.0
        return vec
    return [x / norm for x in vec]


def _embedding_inputs(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if value and all(isinstance(x, int) for x in value):  # one token list
            return [" ".join(f"t{x}" for x in value)]
        return [x if isinstance(x, str) else " ".join(f"t{t}" for t in x) if isinstance(x, list) else str(x)
                for x in value]
    return [str(value)]


# --------------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------------


def _new_id(prefix: str, nbytes: int = 12) -> str:
    return prefix + secrets.token_hex(nbytes)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a burst of concurrent connects overflows it and the
    # kernel drops SYNs, which the client only retries ~1 s later.
    request_queue_size = 1024
    fake: FakeLLMServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Client disconnects (timeouts, dropped replies) are expected; stay quiet about those.
        if isinstance(sys.exc_info()[1], (*_CONNECTION_ERRORS, OSError)):
            return
        super().handle_error(request, client_address)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes otherwise; with Nagle on, a keep-alive client's delayed
    # ACK stalls every reply by ~40 ms.
    disable_nagle_algorithm = True
    server: _HTTPServer
    server_version = "fakellm/1.0"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, add=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.fake._track(self.connection, add=False)

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        self.server.fake._serve(self)

    do_GET = do_POST  # noqa: N815
    do_PUT = do_POST  # noqa: N815
    do_DELETE = do_POST  # noqa: N815
    do_PATCH = do_POST  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def read_body(self) -> bytes:
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length > 0 else b""


class FakeLLMServer:
    """Fake OpenAI + Anthropic HTTP server on ``127.0.0.1`` (random port), for tests.

    Thread-safe; usable as a context manager (``with FakeLLMServer() as server: ...``).
    """

    def __init__(self) -> None:
        self.latency: float = 0.0
        """Seconds slept before answering each request (not applied to rate-limiter 429s)."""
        self.rate_limit_per_minute: int | None = None
        """Requests accepted per sliding window; above it the reply is 429 with ``retry-after``."""
        self.rate_limit_window: float = 60.0
        self.token_limit_per_minute: int | None = None
        """Prompt tokens (as ``usage.prompt_tokens`` counts them) accepted per sliding window (``rate_limit_window``)
        on chat requests; a request that would pass it gets a 429 with ``retry-after``. With ``rate_limit_headers``,
        every reply announces the token budget (``x-ratelimit-*-tokens``, ``anthropic-ratelimit-input-tokens-*``)."""
        self.token_limited_count: int = 0
        self.rate_limit_headers: bool = True
        """With a rate limit: announce the budget on every reply (OpenAI ``x-ratelimit-*-requests``, Anthropic
        ``anthropic-ratelimit-requests-*``), as the big providers do; False: only ``retry-after`` on a 429."""
        """Length in seconds of the rate limiter's sliding window (lower it to test retries fast)."""
        self.embedding_dim: int = DEFAULT_EMBEDDING_DIM
        """Default embedding size (the request's ``dimensions`` wins)."""
        self.requests: list[Request] = []
        self.batches = BatchAPI(self)
        """The batch endpoints (OpenAI Files + Batches, Anthropic Message Batches) and their settings."""
        self.errors: list[BaseException] = []
        """Exceptions raised by handlers or while building a reply (each was answered with a 500)."""
        self.request_count: int = 0
        self.in_flight: int = 0
        self.peak_in_flight: int = 0
        self.rate_limited_count: int = 0
        self.connection_count: int = 0
        """TCP connections accepted (keep-alive reuse keeps it low)."""
        self._handler: Handler = self.default_handler
        self._queue: collections.deque[Any] = collections.deque()
        self._window: collections.deque[float] = collections.deque()
        self._token_window: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url: str = ""
        self.openai_base_url: str = ""
        self.anthropic_base_url: str = ""

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> FakeLLMServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HTTPServer(("127.0.0.1", 0), _RequestHandler)
        httpd.fake = self
        self._httpd = httpd
        port = httpd.server_address[1]
        self.url = f"http://127.0.0.1:{port}"
        self.openai_base_url = self.url + "/v1"
        self.anthropic_base_url = self.url
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, name=f"fakellm-{port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()  # wakes requests sleeping on latency/delay
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections = list(self._connections)
            self._connections.clear()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1]) if self.url else 0

    def env(self, openai_key: str = "sk-test", anthropic_key: str = "test") -> dict[str, str]:
        """Environment variables pointing both SDKs here (for ``monkeypatch.setenv``)."""
        return {
            "OPENAI_BASE_URL": self.openai_base_url,
            "OPENAI_API_KEY": openai_key,
            "ANTHROPIC_BASE_URL": self.anthropic_base_url,
            "ANTHROPIC_API_KEY": anthropic_key,
        }

    def openai_client(self, **kwargs: Any) -> Any:
        """``openai.OpenAI`` pointed here (``api_key="sk-test"``, ``max_retries=0`` unless given)."""
        import openai

        kwargs.setdefault("api_key", "sk-test")
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.openai_base_url, **kwargs)

    def anthropic_client(self, **kwargs: Any) -> Any:
        """``anthropic.Anthropic`` pointed here (``api_key="test"``, ``max_retries=0`` unless given)."""
        import anthropic

        kwargs.setdefault("api_key", "test")
        kwargs.setdefault("max_retries", 0)
        return anthropic.Anthropic(base_url=self.anthropic_base_url, **kwargs)

    # ---------------------------------------------------------------- scripting

    def set_handler(self, fn: Handler | None) -> None:
        """Set the function deciding replies (``None`` restores :meth:`default_handler`)."""
        self._handler = fn if fn is not None else self.default_handler

    def script(self, *replies: ReplyLike | Handler) -> None:
        """Append replies to a FIFO consumed one per request (any API) before the handler is asked.

        Items: :class:`Reply`, ``str``, ``dict``, ``list[float]``, ``None`` or a callable ``Request -> ...``.
        """
        with self._lock:
            self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted replies not yet consumed."""
        with self._lock:
            return len(self._queue)

    def reset(self) -> None:
        """Clear the script queue, recorded requests/errors, counters and the rate-limit window.

        The handler, ``latency`` and ``rate_limit_per_minute`` settings are kept.
        """
        with self._lock:
            self._queue.clear()
            self._window.clear()
            self._token_window.clear()
            self.token_limited_count = 0
            self.requests.clear()
            self.errors.clear()
            self.request_count = 0
            self.peak_in_flight = self.in_flight
            self.rate_limited_count = 0
            self.connection_count = 0
            self.batches = BatchAPI(self)

    @staticmethod
    def default_handler(request: Request) -> ReplyLike:  # noqa: ARG004
        """Text ``"ok"``; embeddings get the hashed bag-of-words vectors."""
        return None

    # ---------------------------------------------------------------- inspection

    @property
    def last_request(self) -> Request:
        """The most recent request (``LookupError`` if none arrived yet)."""
        with self._lock:
            if not self.requests:
                raise LookupError("fakellm: no request received yet")
            return self.requests[-1]

    def requests_for(self, api: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.api == api]

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        """Block until at least ``count`` requests were received; False on timeout."""
        with self._arrived:
            return self._arrived.wait_for(lambda: self.request_count >= count, timeout=timeout)

    # ---------------------------------------------------------------- internals

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
                self.connection_count += 1
            else:
                self._connections.discard(conn)

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)

    def _serve(self, http: _RequestHandler) -> None:
        split = urlsplit(http.path)
        try:
            raw = http.read_body()
        except (OSError, ValueError):
            http.close_connection = True
            return
        headers = {k.lower(): v for k, v in http.headers.items()}
        body: Any = None
        body_ok = True
        if raw:
            try:
                body = jsonlib.loads(raw)
            except ValueError:
                body_ok = False
        request = Request(
            api=_route(split.path),
            path=split.path,
            headers=headers,
            body=body,
            method=http.command,
            query=parse_qs(split.query),
            raw_body=raw,
            id="req_" + secrets.token_hex(12),
            received_at=time.monotonic(),
        )
        batch_api = BatchAPI.api_of(split.path)
        if batch_api is not None:
            request.api = batch_api
        with self._lock:
            self.requests.append(request)
            self.request_count += 1
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            self._arrived.notify_all()
        try:
            if batch_api is not None:  # files, batches, message batches (tests/fakebatch.py)
                self._sleep(self.latency)
                status, out_headers, payload = self.batches.handle(request)
                drop = False
            else:
                status, out_headers, payload, drop = self._respond(request, body_ok)
        except Exception as exc:  # noqa: BLE001 - a bad Reply (e.g. not JSON-serialisable): answer 500
            with self._lock:
                self.errors.append(exc)
            reply = Reply.error(500, f"fakellm could not build the reply: {type(exc).__name__}: {exc}")
            status, out_headers, payload, drop = 500, {}, _error_body(request.api, request, reply), False
        finally:
            # Leave in_flight before the client can see the reply, so a test asserting on the counters
            # right after its call returns never races this thread.
            with self._lock:
                self.in_flight -= 1
        if drop or self._stopping.is_set():
            http.close_connection = True
            with contextlib.suppress(OSError):
                http.connection.shutdown(socket.SHUT_RDWR)
            return
        out_headers.setdefault("content-type", "application/json")
        out_headers["content-length"] = str(len(payload))
        out_headers.setdefault("request-id", request.id)
        out_headers.setdefault("x-request-id", request.id)
        try:
            # one write for status line, headers and body (see disable_nagle_algorithm)
            body = payload if http.command != "HEAD" else b""
            http.wfile.write(_head(http, status, out_headers) + body)
            if out_headers.get("connection", "").lower() == "close":
                http.close_connection = True
        except _CONNECTION_ERRORS:
            http.close_connection = True

    def _rate_limit(self, request: Request) -> dict[str, str] | None:
        """Returns the 429 headers when the request is over the limit, else None (and counts it)."""
        limit = self.rate_limit_per_minute
        if limit is None or request.api == "unknown":
            return None
        now = time.monotonic()
        window = self.rate_limit_window
        with self._lock:
            while self._window and self._window[0] <= now - window:
                self._window.popleft()
            if len(self._window) < limit:
                self._window.append(now)
                return None
            self.rate_limited_count += 1
            wait = self._window[0] + window - now  # in (0, window]; headers round it up
        return _retry_after_headers(wait, ceil=True)

    def _token_limit(self, request: Request) -> dict[str, str] | None:
        """The 429 headers when the request's prompt tokens would pass the token limit, else None (and counts them)."""
        limit = self.token_limit_per_minute
        if limit is None or request.api not in (OPENAI_CHAT, ANTHROPIC_MESSAGES):
            return None
        tokens = _prompt_tokens(request)
        now = time.monotonic()
        window = self.rate_limit_window
        with self._lock:
            while self._token_window and self._token_window[0][0] <= now - window:
                self._token_window.popleft()
            used = sum(n for _, n in self._token_window)
            if used + tokens <= limit or not self._token_window:
                self._token_window.append((now, tokens))
                return None
            self.token_limited_count += 1
            freed, wait = used, window
            for t, n in self._token_window:  # until enough of the oldest have left the window
                freed -= n
                if freed + tokens <= limit:
                    wait = t + window - now
                    break
        return _retry_after_headers(max(0.001, wait), ceil=True)

    def _token_info_headers(self, api: str) -> dict[str, str]:
        limit = self.token_limit_per_minute
        if limit is None or not self.rate_limit_headers:
            return {}
        now = time.monotonic()
        with self._lock:
            live = [(t, n) for t, n in self._token_window if t > now - self.rate_limit_window]
        remaining = max(0, limit - sum(n for _, n in live))
        reset = (live[-1][0] + self.rate_limit_window - now) if live else 0.0  # when the window is empty again
        if api.startswith("anthropic"):
            at = datetime.now(UTC).timestamp() + max(0.0, reset)
            return {"anthropic-ratelimit-input-tokens-limit": str(limit),
                    "anthropic-ratelimit-input-tokens-remaining": str(remaining),
                    "anthropic-ratelimit-input-tokens-reset": datetime.fromtimestamp(at, UTC)
                    .isoformat().replace("+00:00", "Z")}
        return {"x-ratelimit-limit-tokens": str(limit), "x-ratelimit-remaining-tokens": str(remaining),
                "x-ratelimit-reset-tokens": f"{max(0.0, reset):.3f}s"}

    def _ratelimit_info_headers(self, api: str) -> dict[str, str]:
        tokens = self._token_info_headers(api)
        limit = self.rate_limit_per_minute
        if limit is None or not self.rate_limit_headers:
            return tokens
        now = time.monotonic()
        with self._lock:
            used = sum(1 for t in self._window if t > now - self.rate_limit_window)
            reset = (self._window[0] + self.rate_limit_window - now) if self._window else 0.0
        remaining = max(0, limit - used)
        if api.startswith("anthropic"):
            at = datetime.now(UTC).timestamp() + max(0.0, reset)
            return {
                "anthropic-ratelimit-requests-limit": str(limit),
                "anthropic-ratelimit-requests-remaining": str(remaining),
                "anthropic-ratelimit-requests-reset": datetime.fromtimestamp(at, UTC)
                .isoformat().replace("+00:00", "Z"),
                **tokens,
            }
        return {
            "x-ratelimit-limit-requests": str(limit),
            "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": f"{max(0.0, reset):.3f}s",
            **tokens,
        }

    def _next_reply(self, request: Request) -> Reply:
        with self._lock:
            item = self._queue.popleft() if self._queue else self._handler
            scripted = item is not self._handler
        if scripted and not callable(item):
            return _coerce_reply(item)
        try:
            return _coerce_reply(item(request))
        except Exception as exc:  # noqa: BLE001 - reported as a 500 and kept in .errors
            with self._lock:
                self.errors.append(exc)
            return Reply.error(500, f"fakellm handler raised {type(exc).__name__}: {exc}")

    def _respond(self, request: Request, body_ok: bool) -> tuple[int, dict[str, str], bytes, bool]:
        api = request.api
        if api == "unknown":
            msg = f"Unknown request URL: {request.method} {request.path}."
            return 404, {}, _error_body(api, request, Reply.error(404, msg, code="unknown_url")), False
        if request.method != "POST":
            msg = f"Method {request.method} not allowed for {request.path}."
            return 405, {}, _error_body(api, request, Reply.error(405, msg)), False
        limited = self._rate_limit(request) or self._token_limit(request)
        if limited is not None:
            reply = Reply.error(429, "Rate limit reached for requests (fakellm rate_limit_per_minute="
                                f"{self.rate_limit_per_minute}).")
            headers = {**self._ratelimit_info_headers(api), **limited}
            return 429, headers, _error_body(api, request, reply), False
        if not body_ok or not isinstance(request.body, dict):
            msg = "We could not parse the JSON body of your request."
            return 400, {}, _error_body(api, request, Reply.error(400, msg)), False
        if request.stream:  # (before a scripted reply is taken: it stays for the next request)
            msg = "fakellm answers without streaming: send stream=false."
            return 400, {}, _error_body(api, request, Reply.error(400, msg, param="stream")), False

        reply = self._next_reply(request)
        self._sleep(self.latency + reply.delay)
        headers = {**self._ratelimit_info_headers(api), **{k.lower(): v for k, v in reply.headers.items()}}
        if api.startswith("openai"):
            headers.setdefault("openai-processing-ms", str(int((self.latency + reply.delay) * 1000)))
        if reply.drop:
            return 0, headers, b"", True
        if reply.raw_body is not None:
            return reply.status, headers, reply.raw_body, False
        if reply.is_error:
            status = reply.status if reply.status >= 400 else 500
            return status, headers, _error_body(api, request, reply), False
        payload: Any
        if api == OPENAI_RESPONSES:
            payload = _openai_response(request, reply)
        elif api == OPENAI_CHAT:
            payload = _openai_chat(request, reply)
        elif api == OPENAI_EMBEDDINGS:
            payload = _openai_embeddings(request, reply, self.embedding_dim)
        else:  # ANTHROPIC_MESSAGES
            payload = _anthropic_message(request, reply)
        return reply.status, headers, _dumps(payload), False


def _head(http: _RequestHandler, status: int, headers: dict[str, str]) -> bytes:
    try:
        reason = _REASON_PHRASES.get(status) or HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {status} {reason}", f"Server: {http.version_string()}",
             f"Date: {http.date_time_string()}"]
    lines += [f"{key}: {value}" for key, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _route(path: str) -> str:
    path = path.rstrip("/")
    if path.startswith("/v1/"):
        path = path[3:]
    apis = {
        "/chat/completions": OPENAI_CHAT,
        "/responses": OPENAI_RESPONSES,
        "/embeddings": OPENAI_EMBEDDINGS,
        "/messages": ANTHROPIC_MESSAGES,
    }
    # a gateway's own path before the API's (``/key/<key>/v1/chat/completions``, ``/v1/<key>/chat/completions``)
    return apis.get(path) or next((api for end, api in apis.items() if path.endswith(end)), "unknown")


def _dumps(payload: Any) -> bytes:
    return jsonlib.dumps(payload, separators=(",", ":")).encode()


def _error_body(api: str, request: Request, reply: Reply) -> bytes:
    status = reply.status
    message = reply.error_message or _DEFAULT_ERROR_MESSAGES.get(status, "Error.")
    is_anthropic = api.startswith("anthropic") or (api == "unknown" and request.path.rstrip("/").endswith(
        "/messages"))
    if is_anthropic:
        kind = reply.error_type or _ANTHROPIC_ERROR_TYPES.get(status) or (
            "api_error" if status >= 500 else "invalid_request_error")
        error: dict[str, Any] = {"type": kind, "message": message}
        if reply.error_code:
            error["details"] = {"error_code": reply.error_code}
        return _dumps({"type": "error", "error": error, "request_id": request.id})
    default_type, default_code = _OPENAI_ERROR_TYPES.get(status, ("server_error" if status >= 500 else
                                                                  "invalid_request_error", None))
    return _dumps({"error": {
        "message": message,
        "type": reply.error_type or default_type,
        "param": reply.error_param,
        "code": reply.error_code if reply.error_code is not None else default_code,
    }})


def _prompt_tokens(request: Request) -> int:
    return max(1, _count_words(request.prompt_text))


def _output(request: Request, reply: Reply) -> tuple[str, dict[str, Any] | None]:
    """(text, tool) — tool is the tool dict when the structured reply goes to a tool call."""
    if reply.json is not None:
        fmt = request.response_format
        json_format = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
        tool = None if json_format else _chosen_tool(request)
        return jsonlib.dumps(reply.json), tool
    if reply.empty:
        return "", None
    if reply.refusal is not None and reply.text is None:
        return "", None
    return (reply.text if reply.text is not None else "ok"), None


def _usage_counts(request: Request, reply: Reply, text: str) -> tuple[int, int]:
    prompt = reply.prompt_tokens if reply.prompt_tokens is not None else _prompt_tokens(request)
    completion_text = text or (reply.refusal or "")
    completion = reply.completion_tokens if reply.completion_tokens is not None else max(
        1 if completion_text else 0, _count_words(completion_text))
    return prompt, completion


def _openai_chat(request: Request, reply: Reply) -> dict[str, Any]:
    text, tool = _output(request, reply)
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
    finish = "stop"
    if tool is not None:
        message["content"] = None
        message["tool_calls"] = [{
            "id": _new_id("call_"),
            "type": "function",
            "function": {"name": reply.tool_name or _tool_name(tool), "arguments": text},
        }]
        forced = isinstance(request.tool_choice, dict)
        finish = "stop" if forced else "tool_calls"
    if reply.refusal is not None:
        message["refusal"] = reply.refusal
        if reply.text is None and reply.json is None:
            message["content"] = None
    if reply.finish_reason is not None:
        finish = reply.finish_reason
    elif reply.stop_reason is not None:
        finish = _STOP_TO_FINISH.get(reply.stop_reason, reply.stop_reason)
    prompt, completion = _usage_counts(request, reply, text)
    n = request._get("n") or 1
    return {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model or "fake-model",
        "choices": [
            {"index": i, "message": message, "finish_reason": finish, "logprobs": None} for i in range(int(n))
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
        },
        "service_tier": "default",
        "system_fingerprint": "fp_fakellm",
    }


def _openai_response(request: Request, reply: Reply) -> dict[str, Any]:
    """A ``Response`` object of the Responses API: one output item, a message (or a function call)."""
    text, tool = _output(request, reply)
    item: dict[str, Any]
    if tool is not None:
        name = reply.tool_name or _tool_name(tool)
        item = {"id": _new_id("fc_"), "type": "function_call", "status": "completed",
                "call_id": _new_id("call_"), "name": name, "arguments": text}
    else:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        if reply.refusal is not None and reply.text is None and reply.json is None:
            part = {"type": "refusal", "refusal": reply.refusal}
        item = {"id": _new_id("msg_"), "type": "message", "status": "completed", "role": "assistant",
                "content": [part]}
    finish = reply.finish_reason or _STOP_TO_FINISH.get(reply.stop_reason or "", reply.stop_reason)
    incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(finish or "")
    if incomplete is not None:
        item["status"] = "incomplete"
    prompt, completion = _usage_counts(request, reply, text)
    body = request.body
    now = int(time.time())
    fmt = request.response_format
    return {
        "id": _new_id("resp_"),
        "object": "response",
        "created_at": now,
        "status": "incomplete" if incomplete is not None else "completed",
        "completed_at": None if incomplete is not None else now,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete is not None else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": request.model or "fake-model",
        "output": [item],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": fmt if isinstance(fmt, dict) else {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def _openai_embeddings(request: Request, reply: Reply, default_dim: int) -> dict[str, Any]:
    dims = request._get("dimensions")
    dim = int(dims) if isinstance(dims, int) and dims > 0 else default_dim
    as_base64 = request._get("encoding_format") == "base64"
    texts = request.inputs
    data = []
    for i, text in enumerate(texts):
        vec = list(reply.embedding) if reply.embedding is not None else embed_text(text, dim)
        value: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if as_base64 else vec
        data.append({"object": "embedding", "index": i, "embedding": value})
    tokens = reply.prompt_tokens if reply.prompt_tokens is not None else sum(
        max(1, _count_words(t)) for t in texts)
    return {
        "object": "list",
        "data": data,
        "model": request.model or "fake-embedding-model",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _anthropic_message(request: Request, reply: Reply) -> dict[str, Any]:
    text, tool = _output(request, reply)
    content: list[dict[str, Any]] = []
    stop = "end_turn"
    if tool is not None and reply.json is not None:
        name = reply.tool_name or _tool_name(tool)
        content.append({"type": "tool_use", "id": _new_id("toolu_"), "name": name, "input": reply.json})
        stop = "tool_use"
    elif reply.refusal is not None:
        content.append({"type": "text", "text": reply.text if reply.text is not None else reply.refusal})
        stop = "refusal"
    elif text or not reply.empty:
        content.append({"type": "text", "text": text})
    if reply.stop_reason is not None:
        stop = reply.stop_reason
    elif reply.finish_reason is not None:
        stop = _FINISH_TO_STOP.get(reply.finish_reason, reply.finish_reason)
    prompt, completion = _usage_counts(request, reply, text)
    return {
        "id": _new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": request.model or "fake-model",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt,
            "output_tokens": completion,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "service_tier": "standard",
        },
    }


# --------------------------------------------------------------------------------------------------
# pytest fixture
# --------------------------------------------------------------------------------------------------


def _fake_llm_fixture() -> Iterator[FakeLLMServer]:
    """A started :class:`FakeLLMServer`, stopped after the test."""
    server = FakeLLMServer().start()
    try:
        yield server
    finally:
        server.stop()


try:
    import pytest as _pytest
except ImportError:  # pragma: no cover - the module stays usable outside pytest
    fake_llm = _fake_llm_fixture
else:
    fake_llm = _pytest.fixture(name="fake_llm")(_fake_llm_fixture)
