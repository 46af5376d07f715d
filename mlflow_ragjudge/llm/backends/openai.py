"""OpenAI and OpenAI-compatible servers (vLLM, Ollama, llama.cpp, TGI, LM Studio).

URI forms (see :func:`mlflow_ragjudge.llm.backends.resolve_backend`)::

    openai:/gpt-4o-mini
    openai:/prometheus-eval/prometheus-8x7b-v2.0?base_url=http://localhost:8000/v1
    OPENAI_BASE_URL=http://localhost:11434/v1 -> openai:/llama3.1:70b

The key comes from ``OPENAI_API_KEY``; a local server that needs none gets a
placeholder key when a base URL is set.

**Structured output is negotiated, not assumed** (docs/judge-client.md). A request that
carries a JSON schema is sent in the strongest mode the connection is known to accept:

1. ``json_schema`` -- ``response_format={"type": "json_schema", ...}``: the server enforces the
   schema (OpenAI, vLLM, Ollama, llama.cpp, LM Studio);
2. ``json_schema_basic`` -- the same, with the count / range / length keywords left out of the
   schema sent (for servers whose grammar engine rejects them); the full schema rides in the prompt;
3. ``json_object`` -- JSON mode; the full schema rides in the prompt;
4. ``text`` -- no ``response_format`` at all; the full schema rides in the prompt.

A server that refuses a mode (HTTP 400/415/422/501 whose message names ``response_format``,
a schema or JSON mode) moves its connection one step down the list, for the whole process,
and the client resends the same request at once (:attr:`ErrorKind.FORMAT_REJECTED`). A
``structured=`` pinned in the URI is never changed: a refusal is then an error naming the fix.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

from ...core.json_text import loads
from ._sdk import classify, http_client, missing_sdk, parse_rate_headers, post, token_count
from .base import (
    CARRY_MODES,
    Backend,
    BackendError,
    BatchState,
    ChatRequest,
    ChatResponse,
    EmbedResponse,
    ErrorKind,
    carry_schema,
    query_secrets,
    split_base_url,
    unreadable_result,
    url_credentials,
)

__all__ = [
    "OpenAIBackend", "STRUCTURED_MODES", "negotiated_modes", "forget_negotiations", "openai_strict_schema",
    "basic_schema",
]

_PLACEHOLDER_KEY = "not-needed"

#: the modes, strongest first; a refused mode moves the connection to the next one
STRUCTURED_MODES = ("json_schema", "json_schema_basic", "json_object", "text")
_ALIASES = {"none": "text", "auto": None}

# The negotiated mode of each connection (provider + base URL), for the whole process.
_NEGOTIATED: dict[str, str] = {}
_NEGOTIATED_LOCK = threading.Lock()
_PROSE: dict[str, int] = {}  # prose replies to json_schema requests, per connection
_FOLLOWED: dict[str, int] = {}  # replies that held the JSON asked for, per connection
# Connections whose mode a structured reply has confirmed. Until then structured requests on the
# connection go one at a time, so a refusing server sees one refused request per mode, not one per
# thread of a concurrent run.
_CONFIRMED: set[str] = set()
_PROBE_LOCKS: dict[str, threading.Lock] = {}
#: seconds the other structured requests wait for the first one of a connection (the negotiation) to come back
NEGOTIATION_WAIT = 3.0

# A refusal of the output format: the status says "bad request", the message names the feature.
_FORMAT_STATUSES = frozenset({400, 415, 422, 501})
_FORMAT_WORDS = re.compile(
    r"response_format|json_schema|json_object|json mode|structured output|guided|grammar|schema", re.IGNORECASE
)

# Keywords OpenAI's strict structured outputs accept (its "supported schemas" list); anything else
# is left out of what is sent to OpenAI itself. The client still checks the full schema.
_OPENAI_STRICT_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "$defs",
    "$ref", "description", "title", "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "pattern", "format",
})
# What json_schema_basic leaves out: the constraints grammar engines most often reject.
_BASIC_DROPPED = frozenset({
    "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "uniqueItems", "pattern", "format",
})


def _prune(schema: Any, keep: Any) -> Any:
    """A copy of a JSON schema keeping only keywords for which ``keep(keyword)`` is true
    (property names under ``properties`` / ``$defs`` are names, not keywords, and are kept)."""
    if isinstance(schema, list):
        return [_prune(s, keep) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if not keep(k):
            continue
        if k in ("properties", "$defs") and isinstance(v, dict):
            out[k] = {name: _prune(sub, keep) for name, sub in v.items()}
        elif k in ("items", "anyOf", "additionalProperties") and isinstance(v, (dict, list)):
            out[k] = _prune(v, keep)
        else:
            out[k] = v
    return out


def openai_strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as OpenAI's strict mode accepts it (unsupported keywords left out)."""
    return _prune(schema, lambda k: k in _OPENAI_STRICT_KEYWORDS)


def basic_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema without count, range and length constraints (mode ``json_schema_basic``)."""
    return _prune(schema, lambda k: k not in _BASIC_DROPPED)


def negotiated_modes() -> dict[str, str]:
    """Connection key -> the structured mode negotiated so far in this process."""
    with _NEGOTIATED_LOCK:
        return dict(_NEGOTIATED)


def forget_negotiations(key: str | None = None) -> None:
    """Forget what this process learned about a connection's structured-output support (every connection's
    when ``key`` is None): for a long-lived process whose server at the same URL was replaced by another."""
    with _NEGOTIATED_LOCK:
        for memory in (_NEGOTIATED, _PROSE, _FOLLOWED):
            if key is None:
                memory.clear()
            else:
                memory.pop(key, None)
        if key is None:
            _CONFIRMED.clear()
        else:
            _CONFIRMED.discard(key)


class OpenAIBackend(Backend):
    """Chat completions (and embeddings) through the official ``openai`` SDK.

    Args:
        model: model name as the server knows it.
        base_url: an OpenAI-compatible server; default ``OPENAI_BASE_URL`` or OpenAI.
        api_key: default ``OPENAI_API_KEY``.
        structured: ``None`` / ``"auto"`` (default): negotiated per connection, starting at
            ``json_schema`` (see the module docstring); or pinned to one of ``json_schema``,
            ``json_schema_basic``, ``json_object``, ``text`` (``none`` is an alias of ``text``).
        organization: OpenAI organization id.
        headers: extra HTTP headers for every request (e.g. a gateway's auth header); their
            values are treated as secrets and scrubbed from every record.
    """

    provider = "openai"
    supports_json_schema = True  # enforced by the server, or carried in the prompt

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        structured: str | None = None,
        organization: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.model = model
        # the base URL's query (a gateway's ?token=...) is sent with every request, after the path
        self._base_url, self._query = split_base_url(base_url or os.environ.get("OPENAI_BASE_URL"))
        self._api_key = api_key or os.environ.get("OPENAI_API_KEY") or None
        self._organization = organization
        self._headers = dict(headers or {})
        structured = _ALIASES.get(structured, structured) if structured is not None else None
        if structured is not None and structured not in STRUCTURED_MODES:
            raise ValueError(
                f"structured must be one of {', '.join(STRUCTURED_MODES)} (or 'auto' to negotiate), "
                f"not {structured!r}"
            )
        #: the mode pinned by the user, or None when negotiated
        self.pinned_mode = structured
        self._client: Any = None
        self._client_lock = threading.Lock()

    # ------------------------------------------------------------------ identity and secrets

    @property
    def base_url(self) -> str | None:
        return self._base_url

    def base_query(self) -> dict[str, str]:
        return dict(self._query)

    def secrets(self) -> list[str]:
        out = [self._api_key] if self._api_key and self._api_key != _PLACEHOLDER_KEY else []
        out += url_credentials(self._base_url) + query_secrets(self._query)
        out += [v for v in self._headers.values() if v]
        return out

    def check_ready(self) -> None:
        if not self._api_key and self._base_url is None:
            raise ValueError(
                "No OpenAI API key: set the OPENAI_API_KEY environment variable, or pass api_key=, "
                "or point the judge at an OpenAI-compatible server with "
                "'openai:/<model>?base_url=http://host:port/v1' (local servers need no key)."
            )

    @property
    def structured_mode(self) -> str:
        if self.pinned_mode is not None:
            return self.pinned_mode
        with _NEGOTIATED_LOCK:
            return _NEGOTIATED.get(self.connection_key(), STRUCTURED_MODES[0])

    def _downgrade(self, used: str) -> str | None:
        """Move the connection one mode down from ``used`` (compare-and-set: concurrent refusals of
        the same mode move it once). Returns the new mode, or None when there is nothing weaker."""
        key = self.connection_key()
        with _NEGOTIATED_LOCK:
            current = _NEGOTIATED.get(key, STRUCTURED_MODES[0])
            if current != used:
                return current  # another thread already moved it
            i = STRUCTURED_MODES.index(used)
            if i + 1 >= len(STRUCTURED_MODES):
                return None
            _NEGOTIATED[key] = STRUCTURED_MODES[i + 1]
            return _NEGOTIATED[key]

    # ------------------------------------------------------------------ SDK

    def _sdk(self) -> Any:
        try:
            import openai
        except ImportError as e:  # pragma: no cover - openai is a dependency
            raise missing_sdk("openai") from e
        return openai

    def warm_up(self) -> None:
        self._get_client()

    def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        self.check_ready()
        with self._client_lock:  # one SDK client (and connection pool) however many threads start at once
            if self._client is None:
                openai = self._sdk()
                # The client is the only retry layer: the SDK's own retries are off.
                self._client = openai.OpenAI(
                    api_key=self._api_key or _PLACEHOLDER_KEY,
                    base_url=self._base_url,
                    organization=self._organization,
                    default_headers=self._headers or None,
                    default_query=self._query or None,
                    max_retries=0,
                    http_client=http_client(openai),
                )
        return self._client

    def _response_format(self, request: ChatRequest, mode: str) -> dict[str, Any] | None:
        schema = request.json_schema
        if schema is None or mode == "text":
            return None
        if mode == "json_object":
            return {"type": "json_object"}
        sent = schema.schema if mode == "json_schema" else basic_schema(schema.schema)
        if self._base_url is None:  # OpenAI itself: only the keywords its strict mode supports
            sent = openai_strict_schema(sent)
        return {"type": "json_schema", "json_schema": {"name": schema.name, "schema": sent, "strict": True}}

    def chat(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        if request.json_schema is None or self.pinned_mode is not None:
            return self._chat(request, timeout=timeout)
        key = self.connection_key()
        with _NEGOTIATED_LOCK:
            confirmed = key in _CONFIRMED
            probe = _PROBE_LOCKS.setdefault(key, threading.Lock())
        if not confirmed:
            # negotiating: one structured request at a time on this connection -- but a first request that hangs
            # does not hold the others for long: after NEGOTIATION_WAIT they go in the mode as it stands (a server
            # that refuses it answers each with a quick 400, and the mode steps down as for the first)
            t0 = time.monotonic()
            if probe.acquire(timeout=NEGOTIATION_WAIT):
                try:
                    with _NEGOTIATED_LOCK:
                        confirmed = key in _CONFIRMED  # settled while this thread waited
                    if not confirmed:
                        response = self._chat(request, timeout=timeout)
                        with _NEGOTIATED_LOCK:
                            _CONFIRMED.add(key)
                        return response
                finally:
                    probe.release()
            queued = time.monotonic() - t0
            response = self._chat(request, timeout=timeout)
            response.queued = queued
            with _NEGOTIATED_LOCK:
                _CONFIRMED.add(key)  # the mode was not refused: the negotiation is over, the first request or not
            return response
        return self._chat(request, timeout=timeout)

    def _body(self, request: ChatRequest) -> tuple[dict[str, Any], str, dict[str, Any] | None]:
        """The request body as sent (without the SDK's ``timeout``), the structured mode it uses and its
        ``response_format``: the same for a synchronous request and a batch line."""
        mode = self.structured_mode if request.json_schema is not None else "text"
        messages = request.messages
        if request.json_schema is not None and mode in CARRY_MODES:
            messages = carry_schema(messages, request.json_schema)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if request.stop:
            body["stop"] = list(request.stop)
        response_format = self._response_format(request, mode)
        if response_format is not None:
            body["response_format"] = response_format
        return body, mode, response_format

    def _chat(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        openai = self._sdk()
        body, mode, response_format = self._body(request)
        try:
            # through the SDK's request layer, not chat.completions.create: never traced by autologging (_sdk.post)
            raw = post(self._get_client(), openai, "/chat/completions", body, timeout=timeout)
            completion = _json_body(raw.text)
        except Exception as exc:
            err = classify(exc, openai)
            if response_format is not None and _refuses_format(err):
                raise self._format_refused(err, mode) from exc
            raise err from exc
        response = self._response(completion, mode, response_format is not None)
        response.rate = parse_rate_headers(raw.headers)
        return response

    def _response(self, completion: dict[str, Any], mode: str, structured: bool) -> ChatResponse:
        """A chat completion's JSON (a reply, or a batch result line's body) as a :class:`ChatResponse`."""
        choices = completion.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise BackendError(ErrorKind.TRANSIENT, "reply has no choices")
        choice = choices[0]
        message: dict[str, Any] = choice["message"] if isinstance(choice.get("message"), dict) else {}
        refusal = message.get("refusal")
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        usage: dict[str, Any] = completion["usage"] if isinstance(completion.get("usage"), dict) else {}
        data = None
        if structured and text:
            try:
                parsed = loads(text)  # nested deeper than MAX_JSON_DEPTH: a ParseError, never a RecursionError
                data = parsed if isinstance(parsed, dict) else None
            except ValueError:
                data = None  # the parser downstream reports it with the raw text
        return ChatResponse(
            text=text,
            data=data,
            input_tokens=token_count(usage.get("prompt_tokens")),
            output_tokens=token_count(usage.get("completion_tokens")),
            model=str(completion.get("model") or "") or self.model,
            finish_reason=choice.get("finish_reason"),
            refusal=refusal if isinstance(refusal, str) else None,
            structured_mode=mode,
        )

    # ------------------------------------------------------------------ Batch API (docs/batch.md)

    #: OpenAI's documented limits per batch: 50,000 requests and a 200 MB input file
    batch_max_requests = 50_000
    batch_max_bytes = 200 * 1024 * 1024
    supports_batch = True

    def batch_line(self, request: ChatRequest) -> tuple[dict[str, Any], str]:
        body, mode, _ = self._body(request)
        return body, mode

    def batch_submit(self, lines: list[tuple[str, dict[str, Any]]], *, timeout: float,
                     metadata: dict[str, str] | None = None) -> str:
        """Upload the lines as a JSONL file and create a batch for ``/v1/chat/completions``; the batch id."""
        openai = self._sdk()
        jsonl = "".join(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                                    "body": body}, ensure_ascii=False) + "\n" for cid, body in lines)
        client = self._get_client()
        try:
            uploaded = client.files.create(file=("ragjudge-batch.jsonl", jsonl.encode("utf-8")), purpose="batch",
                                           timeout=timeout)
            batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                          completion_window="24h", metadata=metadata or None, timeout=timeout)
        except Exception as exc:
            raise classify(exc, openai) from exc
        return str(batch.id)

    def batch_poll(self, batch_id: str, *, timeout: float) -> BatchState:
        openai = self._sdk()
        try:
            b = self._get_client().batches.retrieve(batch_id, timeout=timeout)
        except Exception as exc:
            raise classify(exc, openai) from exc
        counts = getattr(b, "request_counts", None)
        done = {k: int(getattr(counts, k, 0) or 0) for k in ("completed", "failed", "total")}
        errors = getattr(b, "errors", None)
        message = None
        if errors is not None and getattr(errors, "data", None):
            message = "; ".join(str(getattr(e, "message", e)) for e in errors.data)[:500]
        return BatchState(batch_id, str(b.status), b.status in ("completed", "failed", "expired", "cancelled"),
                          done, expires_at=getattr(b, "expires_at", None), message=message,
                          files=(getattr(b, "output_file_id", None), getattr(b, "error_file_id", None)))

    def batch_results(self, state: BatchState, *, timeout: float) -> Iterator[tuple[str | None, dict[str, Any]]]:
        """``(custom_id, outcome)`` per line of an ended batch: ``{"body": ...}`` for a reply, ``{"error": ...}``
        (with ``status``, ``kind``) for a line that failed, expired or was cancelled. Read line by line: a line
        that cannot be read is an error outcome for its call alone (:func:`unreadable_result`)."""
        openai = self._sdk()
        client = self._get_client()
        for file_id in state.files:
            if not file_id:
                continue
            try:
                text = client.files.content(file_id, timeout=timeout).text
            except Exception as exc:
                raise classify(exc, openai) from exc
            for line in text.splitlines():
                if line.strip():
                    yield _batch_result_line(line)

    def batch_response(self, request: ChatRequest, mode: str, body: dict[str, Any]) -> ChatResponse:
        return self._response(body, mode, request.json_schema is not None and mode != "text")

    def batch_error(self, outcome: dict[str, Any], mode: str) -> BackendError:
        status, code, message = outcome.get("status"), outcome.get("code") or "", outcome.get("error") or ""
        if code in ("batch_expired", "batch_cancelled"):
            return BackendError(ErrorKind.TRANSIENT, f"{code}: {message}", status)
        kind = (ErrorKind.RATE_LIMITED if status == 429 else ErrorKind.TRANSIENT if status is None or status >= 500
                else ErrorKind.PERMANENT)
        err = BackendError(kind, message, status)
        if mode != "text" and _refuses_format(err):
            return self._format_refused(err, mode)
        return err

    def batch_cancel(self, batch_id: str, *, timeout: float) -> None:
        openai = self._sdk()
        try:
            self._get_client().batches.cancel(batch_id, timeout=timeout)
        except Exception as exc:
            raise classify(exc, openai) from exc

    #: prose replies to json_schema requests on a connection before it moves to json_schema_basic, and only
    #: while they are at least as many as the replies that followed the schema: a server that ignores
    #: response_format answers in prose nearly always; a model that slips now and then stays on json_schema
    PROSE_TO_DOWNGRADE = 3

    def format_followed(self, mode: str) -> None:
        if self.pinned_mode is None and mode == "json_schema":
            with _NEGOTIATED_LOCK:
                _FOLLOWED[self.connection_key()] = _FOLLOWED.get(self.connection_key(), 0) + 1

    def format_ignored(self, mode: str) -> None:
        # A server that accepts response_format but answers in prose does not enforce the schema: the schema
        # then rides in the prompt (json_schema_basic), where a model can read it.
        if self.pinned_mode is None and mode == "json_schema":
            key = self.connection_key()
            with _NEGOTIATED_LOCK:
                _PROSE[key] = _PROSE.get(key, 0) + 1
                move = _PROSE[key] >= self.PROSE_TO_DOWNGRADE and _PROSE[key] >= _FOLLOWED.get(key, 0)
            if move:
                self._downgrade(mode)

    def _format_refused(self, err: BackendError, mode: str) -> BackendError:
        if self.pinned_mode is not None:
            return BackendError(
                ErrorKind.PERMANENT,
                f"the server refused structured={mode} ({err.message}); remove 'structured=' from the judge URI "
                "to let the client negotiate a mode the server accepts",
                err.status,
            )
        new = self._downgrade(mode)
        if new is None:
            return err
        return BackendError(
            ErrorKind.FORMAT_REJECTED, f"the server refused {mode} ({err.message}); now using {new}", err.status,
            extra={"from": mode, "to": new},
        )

    def embed(self, texts: list[str], *, timeout: float) -> EmbedResponse:
        openai = self._sdk()
        try:
            # as for chat: through the SDK's request layer, never traced by autologging
            raw = post(self._get_client(), openai, "/embeddings", {"model": self.model, "input": list(texts)},
                       timeout=timeout)
            resp = _json_body(raw.text)
        except Exception as exc:
            raise classify(exc, openai) from exc
        data = resp.get("data")
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise BackendError(ErrorKind.TRANSIENT, "reply has no embeddings list")
        items = sorted(data, key=lambda d: int(d.get("index") or 0))
        if len(items) != len(texts):
            raise BackendError(ErrorKind.TRANSIENT, f"asked for {len(texts)} embeddings, got {len(items)}")
        try:
            vectors = [[float(x) for x in d["embedding"]] for d in items]
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendError(ErrorKind.TRANSIENT, f"unreadable embedding in the reply: {exc}") from exc
        usage: dict[str, Any] = resp["usage"] if isinstance(resp.get("usage"), dict) else {}
        return EmbedResponse(
            vectors=vectors,
            input_tokens=token_count(usage.get("prompt_tokens")),
            model=str(resp.get("model") or "") or self.model,
            rate=parse_rate_headers(raw.headers),
        )


def _json_body(text: str) -> dict[str, Any]:
    """A reply's body as a JSON object; anything else is an unreadable reply, worth another try."""
    try:
        body = loads(text)
    except ValueError as exc:
        raise BackendError(ErrorKind.TRANSIENT, f"unreadable response body: {exc}") from exc
    if not isinstance(body, dict):
        raise BackendError(ErrorKind.TRANSIENT, "unreadable response body: not a JSON object")
    return body



def _refuses_format(err: BackendError) -> bool:
    """A client error that names the output format: the server does not support the mode we sent."""
    if err.kind is not ErrorKind.PERMANENT or err.status not in _FORMAT_STATUSES:
        return False
    text = err.message + " " + json.dumps(err.extra, default=str)
    return bool(_FORMAT_WORDS.search(text))


def _batch_result_line(line: str) -> tuple[str | None, dict[str, Any]]:
    """One line of a batch's output or error file as ``(custom_id, outcome)``; never raises."""
    try:
        rec = json.loads(line)
    except ValueError as e:
        return unreadable_result(line, f"not JSON: {e}")
    if not isinstance(rec, dict) or rec.get("custom_id") is None:
        return unreadable_result(line, "not a result record")
    cid = str(rec["custom_id"])
    response: dict[str, Any] = rec["response"] if isinstance(rec.get("response"), dict) else {}
    body = response.get("body")
    try:
        status = int(response.get("status_code") or 0)
    except (TypeError, ValueError):
        status = 0
    if rec.get("error") is None and status == 200 and isinstance(body, dict):
        return cid, {"body": body}
    err = rec.get("error") or (body.get("error") if isinstance(body, dict) else None) or {}
    if not isinstance(err, dict):
        err = {"message": str(err)}
    code = str(err.get("code") or err.get("type") or "")
    return cid, {"error": str(err.get("message") or code or f"HTTP {status}"), "status": status or None, "code": code}
