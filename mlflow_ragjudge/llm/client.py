"""The one client through which every judge call flows, as a pipeline:

    cache -> de-duplication -> gate -> retries -> backend        (then: parse, re-ask, store, account, transcribe)

* **cache** (:mod:`~mlflow_ragjudge.llm.cache`): a reply an earlier run paid for is read back;
* **de-duplication**: a call identical to one in flight waits for its reply, one identical to a recent one reuses it;
* **gate -> retries -> backend** (:class:`~mlflow_ragjudge.llm.sender.Sender`): the connection's process-wide gate
  (:mod:`~mlflow_ragjudge.llm.gate`), the backend call with a timeout, classified retries with backoff -- or, with
  ``batch``, a line of the next provider batch (:class:`~mlflow_ragjudge.llm.batch.BatchRunner`, which is given the
  sender, the cache and the usage counters explicitly);
* the reply is parsed (re-asked within the attempts budget), stored, counted and recorded in a transcript with
  secrets redacted.

Backends stay thin (DESIGN point 5): they translate requests and classify errors; the policy is here.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import os
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ParseError
from ..core.types import FailureReason
from .backends import Backend, ChatRequest, ChatResponse, ErrorKind, resolve_backend
from .backends.base import CARRY_MODES, SCHEMA_NOTE_VERSION, carry_schema, safe_url
from .batch import BatchOptions, BatchRunner
from .cache import CallCache, cache_key
from .gate import ProviderGate, configure_provider, gate_for
from .pricing import cost_usd, messages_tokens
from .sender import Sender, Usage
from .shared_pace import ENV_SHARED_PACE

__all__ = [
    "FAILURE_FOR_KIND", "JudgeClient", "CallResult", "ParseError", "Usage", "ProviderGate", "gate_for",
    "configure_provider",
]

MEMO_SIZE = 4096  # replies kept in memory per client, so identical requests in one run are sent once
RECENT_RECORDS = 1000  # transcript records a client keeps for inspection (results carry their own)

REASK_TEMPLATE = (
    "Your previous reply could not be read: {error}. Reply again with the complete answer, "
    "in exactly the format the instructions ask for, with one final verdict and nothing else."
)
#: failures of a reply that arrived but could not be used: re-asked (within the attempts budget), never cached
PARSE_FAILURES = frozenset({FailureReason.PARSE_ERROR, FailureReason.INCONSISTENT, FailureReason.AMBIGUOUS})


# --------------------------------------------------------------------------- gate


# --------------------------------------------------------------------------- accounting


@dataclass
class CallResult:
    """What one logical call produced.

    ``ok`` is True when a reply arrived and parsed; otherwise ``failure`` holds the
    reason code and ``error`` the message, and ``raw`` the last raw reply if any.
    ``records`` are the transcript records (one per model request, re-asks included).
    """

    ok: bool
    parsed: Any = None
    response: ChatResponse | None = None
    failure: FailureReason | None = None
    error: str = ""
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def raw(self) -> str | None:
        return self.response.text if self.response is not None else None


def _iso_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


FAILURE_FOR_KIND: dict[ErrorKind, FailureReason] = {
    ErrorKind.RATE_LIMITED: FailureReason.RATE_LIMITED,
    ErrorKind.TRANSIENT: FailureReason.PROVIDER_ERROR,
    ErrorKind.TIMEOUT: FailureReason.TIMEOUT,
    ErrorKind.CONNECTION: FailureReason.CONNECTION_ERROR,
    ErrorKind.PERMANENT: FailureReason.PROVIDER_ERROR,
    ErrorKind.REFUSED: FailureReason.REFUSED,
    ErrorKind.FORMAT_REJECTED: FailureReason.PROVIDER_ERROR,
    ErrorKind.INTERNAL: FailureReason.INTERNAL_ERROR,
    ErrorKind.INTERRUPTED: FailureReason.INTERRUPTED,
    ErrorKind.HELD: FailureReason.RATE_LIMITED,
}

_SECRET_ENV_SUFFIXES = ("_API_KEY", "_TOKEN", "_SECRET", "_PASSWORD")


def _check_settings(**settings: Any) -> None:
    """Type and range of the client's settings: a clear ``ValueError`` naming the setting, never a TypeError later."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v not in (float("inf"),)

    rules: dict[str, tuple[Any, str]] = {
        "cache": (lambda v: v is None or isinstance(v, (bool, str, os.PathLike, CallCache)),
                  "True, False, a cache directory / file path, or a CallCache"),
        "max_concurrency": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
                            "None or a whole number >= 1"),
        "requests_per_minute": (lambda v: v is None or (number(v) and v >= 0), "None or a number >= 0"),
        "timeout": (lambda v: number(v) and v > 0, "a number of seconds > 0"),
        "max_attempts": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a whole number >= 1"),
        "max_retry_time": (lambda v: number(v) and v >= 0, "a number of seconds >= 0"),
        "shared_pace": (lambda v: v is None or (isinstance(v, (str, os.PathLike)) and bool(str(v))),
                        "None or the path of a pace file"),
    }
    for key, value in settings.items():
        ok, what = rules[key]
        if not ok(value):
            raise ValueError(f"{key}={value!r} is not valid: it must be {what}.")


class JudgeClient:
    """Calls a judge model with caching, limits, retries, accounting and transcripts.

    Args:
        judge: a judge URI (``openai:/gpt-4o-mini``) or a :class:`Backend`.
        cache: True for the default on-disk cache, False/None for none, a path,
            or a :class:`CallCache`.
        max_concurrency: a cap on this client's own calls in flight (default: none). Every client of a
            provider connection is also bound by the connection's process-wide limit: adaptive (AIMD on
            429s, 16 to 64) unless set with :func:`configure_provider` or ``RAGJUDGE_MAX_CONCURRENCY``.
            Building a client never changes another client's limit.
        requests_per_minute: pace request starts to this rate (a provider's limit, so a setting of the
            provider connection, as with :func:`configure_provider`); 0 turns pacing off; ``None`` leaves
            it as it is.
        shared_pace: a pace file (default ``$RAGJUDGE_SHARED_PACE``): every process that names the same file
            paces ``requests_per_minute`` together, so together they stay under the limit
            (:mod:`~mlflow_ragjudge.llm.shared_pace`; the tasks of a Spark job get one).
        timeout: seconds per request.
        max_attempts: attempts per request, the first included. A 429 that carries
            ``retry-after`` does not use one up (waits are bounded by ``max_retry_time``).
        max_retry_time: stop retrying when the next wait would pass this many
            seconds since the call started.
        backoff_base, backoff_max: exponential backoff ``base * 2**(n-1)`` capped at
            ``max``, with jitter in [50%, 100%]; scaled by ``RAGJUDGE_BACKOFF_SCALE``.
        prices: extra ``model -> ($/Mtok in, $/Mtok out)`` entries.
        sleep: the sleep function (tests may inject one).
        check_ready: check now that the backend can send (an API key is set ...), so a
            missing key is an error before any work; ``False`` for estimates, which send nothing.
        max_reasks: how many times an unreadable reply is asked again. Default: within the attempts budget of
            any transient error (``max_attempts - 1``): a reply cut off by a proxy or prose after a 5xx is a
            transient fault, not the model's answer; the asking stops early when the model gives the same
            unusable answer (ambiguous, inconsistent) twice. A model that slips into prose on 5% of replies
            then loses about one call in 60 million.
        batch: True or :class:`~mlflow_ragjudge.llm.batch.BatchOptions` (or their dict): send calls through the
            provider's batch API, round by round, at the batch price (:mod:`mlflow_ragjudge.llm.batch`).
        dedupe: send identical requests once for this client's life: a request identical to one in flight
            waits for its reply, and one identical to a recent successful one (the last 4,096) reuses it, with
            no tokens counted (the transcript record says ``shared``). The evaluator and the scorers turn it
            on, so metrics that need the same reply (one statement extraction, one combined verdict call)
            share it without knowing about each other, with or without the persistent cache.
    """

    def __init__(
        self,
        judge: str | Backend,
        *,
        cache: bool | str | Path | CallCache | None = True,
        max_concurrency: int | None = None,
        requests_per_minute: float | None = None,
        timeout: float = 60.0,
        max_attempts: int = 6,
        max_retry_time: float = 300.0,
        backoff_base: float = 0.5,
        backoff_max: float = 60.0,
        prices: dict[str, tuple[float, float]] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        check_ready: bool = True,
        dedupe: bool = False,
        max_reasks: int | None = None,
        batch: Any = None,
        shared_pace: str | Path | None = None,
    ) -> None:
        _check_settings(cache=cache, max_concurrency=max_concurrency, requests_per_minute=requests_per_minute,
                        timeout=timeout, max_attempts=max_attempts, max_retry_time=max_retry_time,
                        shared_pace=shared_pace)
        self.backend = resolve_backend(judge)
        if check_ready:
            self.backend.check_ready()
            self.backend.warm_up()
        if cache is True:
            self.cache: CallCache | None = CallCache.open()
        elif cache is False or cache is None:
            self.cache = None
        elif isinstance(cache, CallCache):
            self.cache = cache
        else:
            self.cache = CallCache.open(cache)
        self.usage = Usage()
        # max_concurrency caps this client's own calls in flight (the connection's gate bounds all clients);
        # requests_per_minute is the provider's pacing, a setting of the connection
        self.max_concurrency = max_concurrency
        self.sender = Sender(gate_for(self.backend.connection_key()), self.usage, timeout=timeout,
                             max_attempts=max_attempts, max_retry_time=max_retry_time, backoff_base=backoff_base,
                             backoff_max=backoff_max, max_concurrency=max_concurrency, sleep=sleep)
        pace_file = shared_pace if shared_pace is not None else (os.environ.get(ENV_SHARED_PACE) or None)
        self.gate.configure(None, requests_per_minute, shared_pace=pace_file,
                            connection=self.backend.connection_key())
        self.timeout = timeout
        self.prices = prices
        self._lock = threading.Lock()  # the memo, the in-flight table and the recent records
        #: the most recent transcript records (bounded; every result carries its own records)
        self.records: deque[dict[str, Any]] = deque(maxlen=RECENT_RECORDS)
        self._memo: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._inflight: dict[str, Future[dict[str, Any] | None]] = {}
        self._embed_backends: dict[str, Backend] = {}
        self.dedupe = dedupe
        self.max_reasks = max_reasks
        self._secrets = [s for s in self.backend.secrets() if s and len(s) >= 6]
        self._secrets += [
            v for k, v in os.environ.items() if k.endswith(_SECRET_ENV_SUFFIXES) and v and len(v) >= 6
        ]
        #: with ``batch`` (True or options, docs/batch.md): calls go through the provider's batch API
        self.batch: BatchRunner | None = None
        if batch:
            self.batch = BatchRunner(self.backend, self.sender, self.cache, self.usage, BatchOptions.of(batch))

    #: the draw this view of the client sends (:meth:`for_draw`); None for the client itself
    draw: int | None = None
    #: the temperature of a draw (None: each request's own)
    draw_temperature: float | None = None

    # ------------------------------------------------------------------ public

    def for_draw(self, draw: int, temperature: float | None = None) -> JudgeClient:
        """A view of this client for draw ``draw`` (0, 1, ...) of a repeated judgement: the same connection,
        cache, memory of identical calls and usage, with every request sent as that draw -- ``seed=draw`` from draw
        1 on (draw 0 keeps each request's own seed, so it is the plain request) and ``temperature`` when given.
        Each draw's requests are thus distinct calls with their own cache entries (a re-run of a repeated
        evaluation is free), and the metrics of one draw still share their identical calls."""
        if not (isinstance(draw, int) and draw >= 0):
            raise ValueError(f"draw={draw!r} must be a whole number >= 0")
        view = copy.copy(self)
        view.draw, view.draw_temperature = draw, temperature
        return view

    def _drawn(self, request: ChatRequest) -> ChatRequest:
        """The request as this view's draw sends it (itself for the client itself)."""
        if self.draw is None:
            return request
        return dataclasses.replace(
            request, seed=request.seed if self.draw == 0 else self.draw,
            temperature=request.temperature if self.draw_temperature is None else self.draw_temperature)

    @property
    def gate(self) -> ProviderGate:
        """The provider connection's process-wide gate."""
        return self.sender.gate

    @gate.setter
    def gate(self, gate: ProviderGate) -> None:
        self.sender.gate = gate

    @property
    def peak_in_flight(self) -> int:
        """The most calls of this client in flight at once."""
        return self.sender.peak_in_flight

    @property
    def model(self) -> str:
        return self.backend.model

    def identity(self) -> dict[str, Any]:
        ident = dict(self.backend.identity())
        ident["base_url"] = safe_url(ident.get("base_url"))
        return ident

    @property
    def structured_mode(self) -> str:
        """How structured replies are obtained on this connection now (negotiated; see docs/judge-client.md)."""
        return self.backend.structured_mode

    def call(
        self,
        request: ChatRequest,
        *,
        parse: Callable[[ChatResponse], Any] | None = None,
        prompt_version: str = "",
        purpose: str = "",
        reask: bool = True,
    ) -> CallResult:
        """One logical judge call. Never raises for provider or parse failures.

        Args:
            request: the messages and sampling parameters.
            parse: turns a reply into the judge's verdict; raises :class:`ParseError`
                when the reply is unreadable, inconsistent or ambiguous. Such a reply is
                re-asked (``max_reasks``; when ``reask``; each re-ask shows the
                original request, the last reply and what was wrong with it, and repeats the JSON
                schema, if any), then the call fails with the parse error's reason and the raw
                text kept.
            prompt_version: the prompt's version, part of the cache key.
            purpose: a label for the transcript (``correctness``, ``claims`` ...).
        """
        request = self._drawn(request)
        # A cached reply that does not parse is re-asked about, like a fresh one. It is sent again instead when no
        # re-ask follows, or when this call already saw it (an identical re-ask: a second draw, not the same reply).
        reasks = self.sender.max_attempts - 1 if self.max_reasks is None else self.max_reasks
        unreadable: set[str] = set() if reask and reasks > 0 else {"*"}
        result = self._call_once(request, parse, prompt_version, purpose, unreadable)
        records = list(result.records)
        # An unreadable reply is a transient fault until the model shows otherwise (a reply cut off by a proxy,
        # prose after a 5xx): asked again within the attempts budget of any transient error, not taken as the
        # model's answer -- unless the model gave the same kind of unusable answer (ambiguous, inconsistent) twice.
        seen: dict[FailureReason, int] = {}
        for _ in range(reasks if reask else 0):
            if result.ok or result.failure not in PARSE_FAILURES or result.response is None:
                break
            assert result.failure is not None
            if not any(r.get("cache_hit") for r in result.records):  # what the model says now, not a stored reply
                seen[result.failure] = seen.get(result.failure, 0) + 1
            if result.failure is not FailureReason.PARSE_ERROR and seen.get(result.failure, 0) >= 2:
                break
            ask: tuple[dict[str, str], ...] = (
                {"role": "user", "content": REASK_TEMPLATE.format(error=result.error)},
            )
            if request.json_schema is not None:
                # whatever the server's mode, the re-ask says exactly what the reply must hold
                ask = carry_schema(ask, request.json_schema)
            followup = ChatRequest(
                messages=(  # the original request, the last unreadable reply and what was wrong with it
                    *request.messages,
                    {"role": "assistant", "content": result.response.text},
                    *ask,
                ),
                temperature=request.temperature,
                max_tokens=request.max_tokens,
                json_schema=request.json_schema,
                seed=request.seed,
                stop=request.stop,
            )
            result = self._call_once(followup, parse, prompt_version, f"{purpose}:reask" if purpose else "reask",
                                     unreadable)
            records += result.records
        result.records = records
        self._count_failure(result)
        return result

    def embedder(self, uri: str | Backend, *, check_ready: bool = True) -> Callable[[list[str]], list[list[float]]]:
        """``embed(texts) -> vectors`` through another model (an embeddings URI such as
        ``openai:/text-embedding-3-small``), with this client's cache, timeout, retries and accounting, under
        that model's provider gate."""
        backend = resolve_backend(uri)
        if check_ready:
            backend.check_ready()
            backend.warm_up()
        for s in backend.secrets():
            if s and len(s) >= 6 and s not in self._secrets:
                self._secrets.append(s)
        self._embed_backends[backend.uri] = backend
        return lambda texts: self.embed(list(texts), backend=backend)

    def embed(self, texts: list[str], *, purpose: str = "embedding",
              backend: Backend | None = None) -> list[list[float]]:
        """Embed texts (through ``backend``, default this client's own), cached per text. Raises
        :class:`BackendError` on failure."""
        backend = backend or self.backend
        gate = self.gate if backend is self.backend else gate_for(backend.connection_key())
        ident = backend.cache_identity()  # the base URL's model-selecting query counts, no secret does
        out: list[list[float] | None] = [None] * len(texts)
        keys = [cache_key("embed", ident, {"text": t}) for t in texts]
        missing: list[int] = []
        for i, k in enumerate(keys):
            hit = self._memo_get(k) if self.dedupe else None
            if hit is None and self.cache is not None:
                hit = self.cache.get(k)
            if hit is not None and isinstance(hit.get("vector"), list):
                out[i] = hit["vector"]
            else:
                missing.append(i)
        self.usage.add(calls=1, cache_hits=len(texts) - len(missing))
        if missing:
            batch = [texts[i] for i in missing]
            resp, _, error, _ = self.sender.send(lambda t: backend.embed(batch, timeout=t), gate=gate)
            if resp is None:
                assert error is not None
                raise error
            self.usage.add(input_tokens=resp.input_tokens, embedding_requests=1)
            self._add_cost(resp.model or backend.model, resp.input_tokens, 0)
            for i, vec in zip(missing, resp.vectors):
                out[i] = vec
                if self.dedupe:
                    self._memo_put(keys[i], {"vector": vec})
                if self.cache is not None:
                    self.cache.put(keys[i], {"vector": vec})
        return [v for v in out if v is not None]

    def summary(self) -> dict[str, Any]:
        d = self.usage.as_dict()
        d["peak_in_flight"] = self.peak_in_flight  # this client's own
        d["connection_limit"] = self.gate.limit  # the connection's concurrency limit now (adaptive unless set)
        d["structured_mode"] = self.structured_mode
        return d

    def redact(self, value: Any) -> Any:
        """Replace any secret this process holds by ``***`` in a (nested) value."""
        if not self._secrets:
            return value
        if isinstance(value, str):
            for s in self._secrets:
                if s in value:
                    value = value.replace(s, "***")
            return value
        if isinstance(value, dict):
            return {k: self.redact(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.redact(v) for v in value]
        return value

    # ------------------------------------------------------------------ internals

    def _count_failure(self, result: CallResult) -> None:
        if not result.ok:
            self.usage.add(failures=1)

    def _add_cost(self, model: str, inp: int, outp: int, batch: bool = False) -> float | None:
        c = cost_usd(model, inp, outp, self.prices, batch_provider=self.backend.provider if batch else None)
        self.usage.add_cost(c)
        return c

    def _call_once(
        self,
        request: ChatRequest,
        parse: Callable[[ChatResponse], Any] | None,
        prompt_version: str,
        purpose: str,
        unreadable: set[str] | None = None,
    ) -> CallResult:
        ident = self.identity()
        key = cache_key("chat", self.backend.cache_identity(),
                        {"messages": list(request.messages), "params": request.params()}, prompt_version)
        record: dict[str, Any] = {
            "call_id": uuid.uuid4().hex[:12],
            "time": _iso_now(),
            "purpose": purpose,
            "prompt_version": prompt_version,
            "provider": ident["provider"],
            "model": ident["model"],
            "base_url": ident["base_url"],
            "messages": [dict(m) for m in request.messages],
            "params": request.params(),
            "structured_mode": self.backend.structured_mode if request.json_schema is not None else None,
        }
        if self.draw is not None:
            record["draw"] = self.draw
        self.usage.add(calls=1)
        t0 = time.perf_counter()
        # 0. an identical call of this client, finished recently (memo) or in flight (wait for it): nothing is
        #    sent twice, so metrics that need the same reply (one statement extraction, one combined verdict
        #    call) share it without knowing about each other
        shared: str | None = None
        hit = self._memo_get(key) if self.dedupe else None
        if hit is not None:
            shared = "memo"
        owner: Future[dict[str, Any] | None] | None = None
        if hit is None and self.dedupe:
            with self._lock:
                pending = self._inflight.get(key)
                if pending is None:
                    owner = self._inflight[key] = Future()
            if pending is not None:
                if self.batch is not None and self.batch.wants():
                    with self.batch.idle():  # waiting on another task's batch line: this task is quiescent too
                        hit = pending.result()
                else:
                    hit = pending.result()  # None when that call failed: then this one asks for itself
                shared = "in_flight" if hit is not None else None
        stored: dict[str, Any] | None = None
        try:
            # 1. cache
            if hit is None and self.cache is not None:
                hit = self.cache.get(key)
            if (hit is not None and unreadable is not None and ("*" in unreadable or key in unreadable)
                    and parse is not None and not _parses(parse, hit)):
                hit = None  # no re-ask will follow, or this call saw this reply already: a fresh one is needed
            if hit is not None:
                response = ChatResponse.from_json(hit)
                self.usage.add(**{"merged" if shared else "cache_hits": 1})
                record.update(
                    raw_reply=response.text, structured=response.data, input_tokens=0, output_tokens=0,
                    cost_usd=0.0, cache_hit=True, attempts=0, latency_s=round(time.perf_counter() - t0, 6),
                    reply_model=response.model,
                )
                if shared:
                    record["shared"] = shared
                    record["shared_from"] = hit.get("_call_id")
                try:
                    parsed = parse(response) if parse else response.text
                except ParseError as e:
                    # a paid reply that did not parse (the cache keeps every reply as it arrives) or a stale one the
                    # current parser rejects: not bought again -- the caller re-asks with it, as on first arrival
                    record.update(outcome=e.reason.value, error=str(e))
                    if unreadable is not None:
                        unreadable.add(key)
                    return self._finish(CallResult(False, response=response, failure=e.reason, error=str(e)),
                                        record)
                record.update(parsed=_jsonable(parsed), outcome="ok", error=None)
                stored = hit
                return self._finish(CallResult(True, parsed, response), record)
            result = self._send(request, parse, record, t0, key)
            if not result.ok and result.response is not None and unreadable is not None:
                unreadable.add(key)  # stored as it arrived; an identical re-ask in this call gets a new draw
            if result.ok and result.response is not None:
                # (in the cache already: _send stores every reply as it arrives, before parsing it)
                stored = result.response.to_json()
                stored = {**stored, "_call_id": result.records[-1].get("call_id") if result.records else None}
                if self.dedupe:
                    self._memo_put(key, stored)
            return result
        finally:
            if owner is not None:
                with self._lock:
                    self._inflight.pop(key, None)
                owner.set_result(stored)

    def _send(self, request: ChatRequest, parse: Callable[[ChatResponse], Any] | None, record: dict[str, Any],
              t0: float, key: str = "") -> CallResult:
        """The model call under the gate, with retries (or as a batch line), then the parse."""
        batched = self.batch is not None and self.batch.wants()
        if batched:
            assert self.batch is not None
            response, attempts, err, batch_id = self.batch.chat(request, key)
            record.update(cache_hit=False, attempts=0, batch_rounds=attempts, batch_id=batch_id, via="batch")
        else:
            response, attempts, err, waited = self.sender.send(lambda t: self.backend.chat(request, timeout=t),
                                                               tokens=messages_tokens(request.messages))
            record.update(cache_hit=False, attempts=attempts, waited_s=round(waited, 3))
        if response is not None and request.json_schema is not None and response.structured_mode:
            record["structured_mode"] = response.structured_mode
            if response.structured_mode in CARRY_MODES:  # the prompt as sent carried the schema
                record["messages"] = [dict(m) for m in carry_schema(request.messages, request.json_schema)]
                record["schema_note_version"] = SCHEMA_NOTE_VERSION
        if response is None:
            assert err is not None
            failure = FAILURE_FOR_KIND[err.kind]
            record.update(raw_reply=None, input_tokens=0, output_tokens=0, cost_usd=0.0,
                          latency_s=round(time.perf_counter() - t0, 6), outcome=failure.value,
                          error=str(err), http_status=err.status)
            return self._finish(CallResult(False, failure=failure, error=str(err)), record)
        if self.cache is not None and key and not response.refusal:
            # stored before anything can go wrong with it (a parse that fails, hangs or is killed): a reply paid for
            # is never bought again; a re-run re-asks about it if it does not parse
            self.cache.put(key, response.to_json())
        self.usage.add(input_tokens=response.input_tokens, output_tokens=response.output_tokens)
        cost = self._add_cost(response.model or self.model, response.input_tokens, response.output_tokens,
                              batch=batched)
        record.update(
            raw_reply=response.text, structured=response.data, input_tokens=response.input_tokens,
            output_tokens=response.output_tokens, cost_usd=cost, finish_reason=response.finish_reason,
            reply_model=response.model, latency_s=round(time.perf_counter() - t0, 6),
        )
        # refusals and unreadable replies fail the call and are never cached
        if response.refusal:
            record.update(outcome=FailureReason.REFUSED.value, error=response.refusal)
            return self._finish(
                CallResult(False, response=response, failure=FailureReason.REFUSED, error=response.refusal),
                record)
        try:
            parsed = parse(response) if parse else response.text
        except ParseError as e:
            if response.structured_mode in ("json_schema", "json_object") and "{" not in response.text:
                self.backend.format_ignored(response.structured_mode)  # prose despite a JSON request
            if response.finish_reason in ("length", "max_tokens"):
                e = ParseError(f"{e} (the reply was cut off at max_tokens={request.max_tokens})", e.reason)
            record.update(outcome=e.reason.value, error=str(e))
            return self._finish(CallResult(False, response=response, failure=e.reason, error=str(e)), record)
        except RecursionError:  # a structure too deep for a parser's recursion: unreadable, like any other
            error = "the reply is nested too deeply to be read; give one flat JSON object"
            record.update(outcome=FailureReason.PARSE_ERROR.value, error=error)
            return self._finish(CallResult(False, response=response, failure=FailureReason.PARSE_ERROR, error=error),
                                record)
        except Exception as e:  # a bug of ours reading it: the call fails, but the reply and its tokens are kept
            error = f"reading the reply failed: {type(e).__name__}: {e}"
            record.update(outcome=FailureReason.INTERNAL_ERROR.value, error=error)
            return self._finish(CallResult(False, response=response, failure=FailureReason.INTERNAL_ERROR,
                                           error=error), record)
        if response.structured_mode == "json_schema":
            self.backend.format_followed(response.structured_mode)
        record.update(parsed=_jsonable(parsed), outcome="ok", error=None)
        return self._finish(CallResult(True, parsed, response), record)

    def is_memoised(self, request: ChatRequest, prompt_version: str = "") -> bool:
        """Whether an identical request's reply is in this client's memory (``dedupe``): it would cost nothing."""
        if not self.dedupe:
            return False
        request = self._drawn(request)
        key = cache_key("chat", self.backend.cache_identity(),
                        {"messages": list(request.messages), "params": request.params()}, prompt_version)
        with self._lock:
            return key in self._memo

    def _memo_get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
            return hit

    def _memo_put(self, key: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._memo[key] = value
            while len(self._memo) > MEMO_SIZE:
                self._memo.popitem(last=False)

    def _finish(self, result: CallResult, record: dict[str, Any]) -> CallResult:
        record = self.redact(record)
        result.records.append(record)
        if result.error:
            result.error = self.redact(result.error)
        with self._lock:
            self.records.append(record)
        return result


def _parses(parse: Callable[[ChatResponse], Any], stored: dict[str, Any]) -> bool:
    try:
        parse(ChatResponse.from_json(stored))
    except ParseError:
        return False
    return True


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _jsonable(to_dict())
    return repr(value)
