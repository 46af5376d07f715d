"""Sending one request: the connection's gate, then the backend call with a timeout, then classified retries with
backoff -- the middle of the client's pipeline (cache -> de-duplication -> **gate -> retries -> backend**), and what
the batch runner sends its submit and poll calls through. Also the thread-safe usage counters both of them add to.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..core.stop import POLL, stop_epoch, stop_reason, stopped_since, wait_for_stop
from .backends import BackendError, ErrorKind
from .backends.base import clamp_seconds, watching_wire
from .gate import ProviderGate, Ticket

__all__ = ["Sender", "Usage", "ENV_BACKOFF_SCALE", "MAX_RATE_LIMITED_ATTEMPTS"]

ENV_BACKOFF_SCALE = "RAGJUDGE_BACKOFF_SCALE"  # tests set 0 to zero the backoff
MAX_RATE_LIMITED_ATTEMPTS = 100  # hard cap on 429-with-retry-after attempts per call


@dataclass
class Usage:
    """Totals over a client's calls. Thread-safe: counters change only through :meth:`add` and :meth:`add_cost`."""

    calls: int = 0  # logical calls (one per cache lookup)
    requests: int = 0  # HTTP requests actually sent (attempts, re-asks)
    cache_hits: int = 0
    failures: int = 0
    retries: int = 0
    rate_limited: int = 0
    format_refusals: int = 0  # requests the server refused for their output format (negotiation)
    merged: int = 0  # calls answered by an identical call of this client (in flight or recent): nothing sent
    embedding_requests: int = 0
    batches: int = 0  # provider batches submitted (batch mode)
    batch_lines: int = 0  # calls sent as batch lines (not counted in ``requests``)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add to counters, e.g. ``usage.add(requests=1, input_tokens=120)``."""
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def add_cost(self, cost: float | None) -> None:
        """Add a call's cost; an unknown price (None) makes the total unknown."""
        with self._lock:
            if cost is None:
                self.cost_usd = None
            elif self.cost_usd is not None:
                self.cost_usd += cost

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}



@dataclass
class _Call:
    """One call's attempts so far."""

    started: float
    epoch: int = 0  # core.stop's count of stops when the call began
    attempt: int = 0
    counted: int = 0  # attempts that count against max_attempts
    format_refusals: int = 0  # the server refused the output format; the backend moved to a weaker mode
    timeouts: int = 0  # attempts in a row that timed out: each next one gets twice the time (up to ``timeout``)
    waited: float = 0.0


class Sender:
    """Runs ``fn(timeout)`` -- one backend request -- under a provider gate, with retries.

    Args:
        gate: the connection's process-wide gate.
        usage: where requests, retries, 429s and format refusals are counted.
        timeout: seconds per request.
        max_attempts: attempts per request, the first included (a 429 with ``retry-after`` does not use one up).
        max_retry_time: stop retrying when the next wait would pass this many seconds since the call started.
        backoff_base, backoff_max: exponential backoff ``base * 2**(n-1)`` capped at ``max``, jitter in [50%, 100%],
            scaled by ``RAGJUDGE_BACKOFF_SCALE``.
        max_concurrency: a cap on this sender's own requests in flight (the gate bounds every client's).
        sleep: the sleep function (tests may inject one).
    """

    def __init__(self, gate: ProviderGate, usage: Usage, *, timeout: float = 60.0, max_attempts: int = 6,
                 max_retry_time: float = 300.0, backoff_base: float = 0.5, backoff_max: float = 60.0,
                 max_concurrency: int | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.gate = gate
        self.usage = usage
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.max_retry_time = max_retry_time
        scale = float(os.environ.get(ENV_BACKOFF_SCALE, "1"))
        self.backoff_base = backoff_base * scale
        self.backoff_max = backoff_max * scale
        self._cap = threading.BoundedSemaphore(max_concurrency) if max_concurrency else None
        # a wait (backoff, pacing, cool-down) ends early when the evaluation is stopped (core.stop): the default sleep
        # is made per call (it knows when the call began); an injected one is the tests'
        self._sleep = None if sleep is time.sleep else sleep
        self._lock = threading.Lock()
        self._in_flight = 0
        self.peak_in_flight = 0

    def send(self, fn: Callable[[float], Any], gate: ProviderGate | None = None, *, tokens: int = 0
             ) -> tuple[Any, int, BackendError | None, float]:
        """Run ``fn(timeout)`` under the gate (default: this client's) with retries; ``tokens``: the request's
        estimated prompt tokens, which each attempt's start needs from a token budget the server announces.

        Tail latency: an attempt's timeout is the connection's adaptive one
        (:meth:`ProviderGate.adaptive_timeout`, never above ``timeout``; watched, before the connection knows its
        latency): a call that hangs far past what this server usually takes is abandoned and sent again at once,
        instead of holding its row for the full ``timeout``. Each attempt after a timeout gets twice the time of
        the one before (up to ``timeout``), so a call that is merely slow still finishes, and a hang on a retry
        costs seconds, not the full ``timeout``; one after another fault (a 5xx, a reset connection) is watched
        like a first.

        Returns (value or None, attempts, last error, seconds spent waiting).
        """
        gate = gate or self.gate
        call = _Call(time.monotonic(), stop_epoch())
        stopped = partial(stopped_since, call.epoch)  # a stop since the call began, even one already cleared
        sleep: Callable[[float], Any] = self._sleep or partial(wait_for_stop, since=call.epoch)
        while True:
            if stopped():  # Ctrl-C / SIGTERM: nothing new is sent (what is in flight is awaited)
                return None, call.attempt, _not_sent(), call.waited
            call.attempt += 1
            call.counted += 1
            try:
                ticket = self._start(gate, call, sleep, stopped, tokens)
            except BackendError as e:  # stopped, or the server's word outlasts the retry budget: nothing was sent
                if e.kind is ErrorKind.INTERRUPTED:
                    e = _not_sent()
                else:
                    e.message += f" (max_retry_time {self.max_retry_time:g} s)"
                return None, call.attempt - 1, e, call.waited
            with self._lock:
                self._in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
            try:
                self.usage.add(requests=1)
                limit = self._attempt_timeout(gate, call.timeouts)
                value = self._attempt(fn, gate, ticket, limit, watched=not call.timeouts and not gate.calibrated(),
                                      tokens=tokens)
                return value, call.attempt, None, call.waited
            except BackendError as e:
                err = e
            except Exception as e:  # a bug (ours or the SDK's), not a provider error: never retried
                err = BackendError(ErrorKind.INTERNAL, f"{type(e).__name__}: {e}")
            finally:
                gate.release()
                with self._lock:
                    self._in_flight -= 1
                if self._cap is not None:
                    self._cap.release()
            then = self._after_error(err, call, gate, limit)
            if isinstance(then, BackendError):
                return None, call.attempt, then, call.waited
            if then > 0:
                sleep(then)
                call.waited += then

    def _start(self, gate: ProviderGate, call: _Call, sleep: Callable[[float], Any],
               stopped: Callable[[], bool], tokens: int = 0) -> Ticket:
        """This sender's own cap, then the gate (:meth:`ProviderGate.acquire`): the call's retry budget bounds the
        waits for the server's word, and every wait ends at a stop. Raises :class:`BackendError` with nothing held."""
        if self._cap is not None:
            while not self._cap.acquire(timeout=POLL):
                if stopped():
                    raise BackendError(ErrorKind.INTERRUPTED, "stopped")
        try:
            ticket = gate.acquire(sleep, deadline=call.started + self.max_retry_time, stopped=stopped, tokens=tokens)
        except BaseException:
            if self._cap is not None:
                self._cap.release()
            raise
        call.waited += ticket.waited
        if stopped():  # stopped while waiting for a slot or the pace
            gate.release()
            if self._cap is not None:
                self._cap.release()
            raise BackendError(ErrorKind.INTERRUPTED, "stopped")
        return ticket

    def _after_error(self, err: BackendError, call: _Call, gate: ProviderGate, limit: float) -> float | BackendError:
        """What an attempt's error means: the seconds to wait before the next attempt (0: at once), or the error the
        call ends with. Tells the gate what the server said (a 429) and counts it."""
        if err.kind is ErrorKind.HELD:  # never left: not a request, not an attempt; started again after the quiet
            self.usage.add(requests=-1)
            call.attempt -= 1
            call.counted -= 1
            return 0.0
        cut_short = err.kind is ErrorKind.TIMEOUT and (limit < self.timeout or "far past" in err.message)
        call.timeouts = call.timeouts + 1 if err.kind is ErrorKind.TIMEOUT else 0
        retry_after = clamp_seconds(err.retry_after)  # (whatever a backend reports: finite, at most a day)
        told_when = err.kind is ErrorKind.RATE_LIMITED and retry_after is not None
        if err.kind is ErrorKind.RATE_LIMITED:
            if not told_when:
                # "slow down", with no word on when: fewer in flight. A 429 that says when to come back is a rate
                # window (requests or tokens per minute): the cool-down below waits exactly that, and halving the
                # concurrency too would leave the window unused once it reopens.
                gate.throttled()
            self.usage.add(rate_limited=1)
        if err.kind is ErrorKind.FORMAT_REJECTED:
            # not a fault of this request's content: resend at once in the weaker mode; bounded by the number of
            # modes (a backend that keeps refusing ends as a provider error)
            call.format_refusals += 1
            call.counted -= 1
            if call.format_refusals <= 4:
                self.usage.add(format_refusals=1)
                return 0.0
            err = BackendError(ErrorKind.PERMANENT, err.message, err.status)
        if told_when and call.attempt < MAX_RATE_LIMITED_ATTEMPTS:
            # The server said when to come back: that wait is bounded by max_retry_time, not by max_attempts, so a
            # long evaluation behind a busy quota does not lose rows.
            call.counted -= 1
        if not err.retryable or call.counted >= self.max_attempts:
            return err
        if told_when:
            delay = retry_after or 0.0
            gate.cool_down(delay)  # everyone on this connection waits
        elif cut_short:
            delay = 0.0  # an attempt left far past the usual latency (tail): sent again at once
        else:
            exp = min(self.backoff_max, self.backoff_base * 2.0 ** min(call.attempt - 1, 64))
            delay = exp * (0.5 + random.random() / 2)
            if retry_after is not None:
                delay = max(delay, retry_after)
        if time.monotonic() - call.started + delay > self.max_retry_time:
            err.message += f" (gave up after {call.attempt} attempts: retry budget of {self.max_retry_time:g}s)"
            return err
        self.usage.add(retries=1)
        return delay

    def _attempt_timeout(self, gate: ProviderGate, timeouts: int) -> float:
        """An attempt's timeout: the connection's adaptive one, doubled for each timeout in a row before it (up to
        ``timeout``); the full ``timeout`` for a first attempt before the connection knows its latency."""
        if timeouts:
            return min(self.timeout, gate.adaptive_timeout(self.timeout) * 2 ** timeouts)
        if gate.calibrated():
            return gate.adaptive_timeout(self.timeout)
        return self.timeout

    @staticmethod
    def _attempt(fn: Callable[[float], Any], gate: ProviderGate, ticket: Ticket, limit: float, *,
                 watched: bool, tokens: int = 0) -> Any:
        """One request under ``limit`` seconds; a success teaches the gate its latency and the announced budget."""
        t_start = time.monotonic()

        def on_the_wire(seconds: float) -> Any:  # the gate watches the request on the thread that sends it
            with watching_wire(gate):
                return fn(seconds)

        value = _EARLY.run(on_the_wire, gate, limit) if watched else on_the_wire(limit)
        latency = time.monotonic() - t_start - float(getattr(value, "queued", 0.0) or 0.0)
        gate.observe(latency, getattr(value, "rate", None), ticket.seq,
                     (tokens, int(getattr(value, "input_tokens", 0) or 0)) if tokens else None)
        gate.succeeded()
        return value


class _EarlyAttempts:
    """First attempts sent before the connection knows its server's usual latency run here, on a few reused daemon
    threads, and are watched: once the first replies have taught the latency (:meth:`ProviderGate.adaptive_timeout`),
    one that hangs far past it is left, as a later first attempt would be, instead of holding its row for the full
    ``timeout``. The worker finishes the left request on its own (its reply, if any, is dropped). Daemon threads,
    because a hung request must not hold the interpreter's exit (a thread pool's workers would)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def run(self, fn: Callable[[float], Any], gate: ProviderGate, timeout: float) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()

        def job() -> None:
            try:
                box["value"] = fn(timeout)
            except BaseException as e:  # handed to the caller below
                box["error"] = e
            finally:
                done.set()

        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                threading.Thread(target=self._work, name="ragjudge-first-attempt", daemon=True).start()
        self._jobs.put(job)
        started = time.monotonic()
        while not done.wait(0.1):
            limit = gate.adaptive_timeout(timeout)
            if time.monotonic() - started > limit:
                raise BackendError(ErrorKind.TIMEOUT, f"no reply after {limit:.1f} s, far past this server's usual "
                                                      "latency: sent again")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _work(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1


_EARLY = _EarlyAttempts()


def _not_sent() -> BackendError:
    return BackendError(ErrorKind.INTERRUPTED, f"not sent: the evaluation was stopped ({stop_reason() or 'stop'})")
