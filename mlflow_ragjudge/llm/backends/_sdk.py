"""Error classification shared by the SDK-based backends.

Both official SDKs expose the same exception family (``APIStatusError`` with a
``status_code`` and the HTTP response, ``APITimeoutError`` below
``APIConnectionError``), so one classifier serves both.
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import importlib
import json
import re
import time
from typing import Any

from . import deadline
from .base import BackendError, ErrorKind, RateInfo, clamp_count, clamp_seconds, wire_watch

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)(ms|h|m|s)")


def header_number(value: Any) -> float | None:
    """A header's value as a number, or None when it is absent or not a number (``nan`` included; ``inf`` and
    ``1e308`` are numbers, left to the clamps of :func:`~.base.clamp_seconds` and :func:`~.base.clamp_count`). The
    one reader of every numeric header."""
    if value is None:
        return None
    try:
        number = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return None if number != number else number


def _seconds(value: Any) -> float | None:
    """A header's plain number of seconds, clamped; None when unreadable or negative (a malformed value, not
    "now")."""
    number = header_number(value)
    return clamp_seconds(number) if number is not None and number >= 0 else None


def parse_retry_after(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date), clamped to
    ``[0, MAX_HEADER_SECONDS]``; None when neither is there or readable."""
    if headers is None:
        return None
    ms = header_number(headers.get("retry-after-ms"))
    if ms is not None and ms >= 0:
        return clamp_seconds(ms / 1000.0)
    value = headers.get("retry-after")
    if value is None:
        return None
    if header_number(value) is not None or str(value).strip().lower() in ("nan", "+nan", "-nan"):
        return _seconds(value)
    try:  # an HTTP date
        parsed = email.utils.parsedate_tz(str(value))
        return None if parsed is None else clamp_seconds(email.utils.mktime_tz(parsed) - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def _duration(value: str) -> float | None:
    """``"6m0s"``, ``"1.5s"``, ``"20ms"``, ``"2"`` -> seconds (OpenAI's reset headers), clamped; None when
    unreadable."""
    value = value.strip()
    if header_number(value) is not None or value.lower() in ("nan", "+nan", "-nan"):
        return _seconds(value)
    parts = _DURATION_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value.replace(" ", ""):
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return clamp_seconds(sum(float(n) * scale[u] for n, u in parts))


def _count(value: Any) -> int | None:
    """A header's request count, clamped to ``[0, MAX_HEADER_COUNT]``; None when unreadable or negative."""
    number = header_number(value)
    return clamp_count(number) if number is not None and number >= 0 else None


def _reset_time(value: Any) -> float | None:
    """Seconds until an RFC 3339 time (Anthropic's resets), clamped; None when unreadable."""
    try:
        when = _dt.datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        return clamp_seconds(when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def parse_rate_headers(headers: Any) -> RateInfo | None:
    """The budgets a reply's headers announce, or None when they announce none. Requests: OpenAI's
    ``x-ratelimit-{remaining,limit,reset}-requests`` (reset as ``"1.5s"`` / ``"6m0s"``) or Anthropic's
    ``anthropic-ratelimit-requests-{remaining,limit,reset}`` (reset as an RFC 3339 time). Tokens: OpenAI's
    ``x-ratelimit-{remaining,limit,reset}-tokens``, or Anthropic's ``anthropic-ratelimit-tokens-*`` and
    ``anthropic-ratelimit-input-tokens-*`` (the tighter of the two: what a prompt spends). Every value is clamped
    (:func:`~.base.clamp_seconds`, :func:`~.base.clamp_count`): an absurd one is read as the longest wait or the
    largest count, an unreadable one as unknown."""
    if headers is None:
        return None
    requests: tuple[int | None, int | None, float | None] = (None, None, None)
    tokens: tuple[int | None, int | None, float | None] = (None, None, None)
    remaining = headers.get("x-ratelimit-remaining-requests")
    if remaining is not None:
        reset = headers.get("x-ratelimit-reset-requests")
        requests = (_count(remaining), _count(headers.get("x-ratelimit-limit-requests")),
                    _duration(str(reset)) if reset else None)
    elif headers.get("anthropic-ratelimit-requests-remaining") is not None:
        reset_at = headers.get("anthropic-ratelimit-requests-reset")
        requests = (_count(headers.get("anthropic-ratelimit-requests-remaining")),
                    _count(headers.get("anthropic-ratelimit-requests-limit")),
                    _reset_time(reset_at) if reset_at else None)
    left = headers.get("x-ratelimit-remaining-tokens")
    if left is not None:
        reset = headers.get("x-ratelimit-reset-tokens")
        tokens = (_count(left), _count(headers.get("x-ratelimit-limit-tokens")),
                  _duration(str(reset)) if reset else None)
    else:
        found = []
        for kind in ("tokens", "input-tokens"):
            left = headers.get(f"anthropic-ratelimit-{kind}-remaining")
            if left is not None and _count(left) is not None:
                reset_at = headers.get(f"anthropic-ratelimit-{kind}-reset")
                found.append((_count(left), _count(headers.get(f"anthropic-ratelimit-{kind}-limit")),
                              _reset_time(reset_at) if reset_at else None))
        if found:
            tokens = min(found, key=lambda t: t[0] if t[0] is not None else float("inf"))
    if not any(headers.get(k) is not None for k in _BUDGET_HEADERS):
        return None  # (one that is there but unreadable still says the server announces a budget)
    return RateInfo(*requests, *tokens)


_BUDGET_HEADERS = ("x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining",
                   "x-ratelimit-remaining-tokens", "anthropic-ratelimit-tokens-remaining",
                   "anthropic-ratelimit-input-tokens-remaining")


def classify(exc: BaseException, sdk: Any) -> BackendError:
    """Map an SDK exception to a :class:`BackendError`.

    Retry only what is worth retrying: 429 (after ``retry-after``), 408/409/5xx,
    timeouts, connection errors and unreadable bodies; every other 4xx fails at once.
    """
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc.__cause__, BackendError):  # raised by our wire hooks; an SDK may wrap it as a connection error
        return exc.__cause__
    if isinstance(exc, sdk.APITimeoutError):
        return BackendError(ErrorKind.TIMEOUT, "request timed out")
    if isinstance(exc, sdk.APIConnectionError):
        return BackendError(ErrorKind.CONNECTION, f"connection error: {exc}")
    if isinstance(exc, sdk.APIStatusError):
        status = int(exc.status_code)
        msg = _message(exc)
        headers = getattr(getattr(exc, "response", None), "headers", None)
        if status == 429:
            return BackendError(ErrorKind.RATE_LIMITED, msg, status, parse_retry_after(headers))
        if status in (408, 409) or status >= 500:
            return BackendError(ErrorKind.TRANSIENT, msg, status, parse_retry_after(headers))
        return BackendError(ErrorKind.PERMANENT, msg, status, extra=_error_fields(exc))
    if isinstance(exc, (sdk.APIResponseValidationError, json.JSONDecodeError, UnicodeDecodeError)):
        # A body that is not the API's JSON (a proxy's HTML page, a cut-off reply): worth another try.
        return BackendError(ErrorKind.TRANSIENT, f"unreadable response body: {type(exc).__name__}: {exc}")
    # Anything else (a TypeError, a plain ValueError ...) is a bug, ours or the SDK's: not retried.
    return BackendError(ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}")


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(exc, "message", exc))


def _error_fields(exc: Any) -> dict[str, Any]:
    """The error body's ``param`` / ``code`` / ``type`` (OpenAI names the offending parameter there)."""
    body = getattr(exc, "body", None)
    err = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return {}
    return {k: err[k] for k in ("param", "code", "type") if err.get(k) is not None}


def _before_wire(request: Any) -> None:
    watch = wire_watch()
    if watch is not None:
        watch.before_wire()
    limit = deadline.current()
    if limit is not None:  # the connection opened for it is watched from the start (deadline.py)
        request.extensions["trace"] = deadline.traced(limit, request.extensions.get("trace"))


def _on_reply(response: Any) -> None:
    watch = wire_watch()
    if watch is not None:
        watch.on_reply(response.status_code, response.headers)
    limit = deadline.current()
    if limit is not None:
        deadline.attach(limit, response.extensions.get("network_stream"))
        if limit.fired:
            raise _timed_out(limit)


def _timed_out(limit: deadline.Deadline) -> BackendError:
    return BackendError(ErrorKind.TIMEOUT, f"no complete reply within the timeout of {limit.timeout:g} s (a deadline "
                                           "for the whole request, its body included)")


def http_client(sdk: Any) -> Any:
    """The SDK's own HTTP client (its defaults: timeouts, connection limits, redirects, proxies from the
    environment) with the wire watch's hooks (:class:`~.base.WireWatch`): run on the sending thread just before a
    request leaves, and as soon as a reply's status and headers arrive."""
    return sdk.DefaultHttpxClient(event_hooks={"request": [_before_wire], "response": [_on_reply]})


def _response_class(sdk: Any) -> Any:
    """The ``Response`` class of the HTTP library the SDK is built on (``httpx``; ``httpx2`` in the newest SDKs)."""
    for base in sdk.DefaultHttpxClient.__mro__[1:]:
        if base.__name__ == "Client":
            return importlib.import_module(base.__module__.split(".")[0]).Response
    raise TypeError(f"{sdk.__name__}.DefaultHttpxClient is not an HTTP client class")  # pragma: no cover


def post(client: Any, sdk: Any, path: str, body: dict[str, Any], *, timeout: float) -> Any:
    """POST a JSON ``body`` to ``path`` through the SDK client's own request layer -- its base URL, auth, headers,
    timeout, connection pool and error types -- and return the HTTP response (``.json()``, ``.text``, ``.headers``).

    Not through the resource methods (``client.chat.completions.create``, ``client.messages.create``): those are what
    tracing integrations patch -- MLflow's ``openai`` and ``anthropic`` autologging, which ``mlflow.genai.evaluate``
    also switches on for the length of an evaluation -- and a judge's own request must never become a trace or a
    span in the user's experiment. ``client.post`` is the SDKs' documented way to call an endpoint directly; with
    the HTTP library's ``Response`` as ``cast_to`` it hands back the response itself, so that the reply is read here
    as plain JSON, the same way for a synchronous reply and a batch result line.

    ``timeout`` bounds the whole request, the reply's body included (:mod:`.deadline`), not only each read."""
    with deadline.watch(timeout) as limit:
        try:
            return client.post(path, cast_to=_response_class(sdk), body=body, options={"timeout": timeout})
        except Exception as exc:
            if limit.fired:  # the deadline ended it, however the SDK words the broken read
                raise _timed_out(limit) from exc
            raise


def token_count(value: Any) -> int:
    """A usage block's token count as an int (0 when a server leaves it out or writes something else)."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def missing_sdk(package: str) -> ImportError:
    return ImportError(
        f"The '{package}' package is needed for this judge backend but is not installed. "
        f"Install it with: pip install '{package}'"
    )
