"""The process-wide gate of each provider connection: how many calls may be in flight (adaptive, AIMD on 429s,
unless set), request pacing, and the cool-down after a 429 -- shared by every client in the process that talks to the
same provider connection (provider + base URL), and thread-safe, because MLflow calls scorers from thread pools."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable

from .backends import Backend, resolve_backend

__all__ = ["ProviderGate", "gate_for", "configure_provider", "ENV_MAX_CONCURRENCY"]

ENV_MAX_CONCURRENCY = "RAGJUDGE_MAX_CONCURRENCY"

class ProviderGate:
    """Concurrency limit and request pacing for one provider connection, shared by every client in the process.

    ``limit`` calls may be in flight at once. Unless a limit is set explicitly (:func:`configure_provider`, or
    ``RAGJUDGE_MAX_CONCURRENCY``), the limit is found by additive increase / multiplicative decrease, as TCP
    finds a link's capacity: it starts at ``ADAPTIVE_START``, doubles after each ``limit`` successful requests
    until the first 429 (slow start), then grows by one per ``limit`` successes, up to ``ADAPTIVE_MAX``. A 429
    that does not say when to come back halves it, at most once per round trip (the median latency of recent
    replies; 1 s before any), so one burst of 429s counts once. A 429 with ``retry-after`` is a rate window
    (requests or tokens per minute), handled by the cool-down below instead. So default settings use what a
    server allows without a hand-set limit, and back off when it says no.

    With ``requests_per_minute`` set, call starts are spaced ``60 / rpm`` seconds apart. After a 429 every
    caller waits until the cool-down the server asked for has passed, and is then let out one at a time,
    ``spacing`` seconds apart: the pace at which the server accepted requests over the last minute (at most
    1 s, and no more than the ``retry-after``), shrinking by 30 % with each success. So the end of a cool-down
    is neither a burst of 429s nor a trickle that leaves a reopened window unused.
    """

    MAX_SPACING = 1.0
    SPACING_DECAY = 0.7  # per success after a cool-down (0.9 left a reopened 600/min window 15% unused)
    ADAPTIVE_START = 16
    ADAPTIVE_MAX = 64
    #: tail latency: after this many successful requests on the connection, the first attempt of a request is
    #: given ``TAIL_FACTOR`` x the 95th-percentile latency seen (at least ``MIN_ADAPTIVE_TIMEOUT`` seconds)
    MIN_OBSERVATIONS = 20
    TAIL_FACTOR = 8.0
    MIN_ADAPTIVE_TIMEOUT = 10.0

    def __init__(self, limit: int | None = None, requests_per_minute: float | None = None) -> None:
        self._cond = threading.Condition()
        #: an explicit limit is kept as it is; otherwise the limit adapts (see the class docstring)
        self.fixed = limit is not None
        self.limit = limit if limit is not None else self.ADAPTIVE_START
        self.ceiling = limit if limit is not None else self.ADAPTIVE_MAX
        self.requests_per_minute = requests_per_minute
        self.decreases = 0
        self._slow_start = True
        self._ok = 0
        self._last_decrease = -1e9
        self.active = 0
        self.peak = 0
        self._next_start = 0.0
        self._cooldown_until = 0.0
        self._spacing = 0.0
        self._next_spaced = 0.0
        self._latencies: deque[float] = deque(maxlen=200)
        self._accepted: deque[float] = deque(maxlen=20_000)  # start times of requests that went through

    def configure(self, limit: int | None = None, requests_per_minute: float | None = None) -> None:
        """Change the limits. ``None`` leaves a setting as it is; ``requests_per_minute=0`` turns pacing off."""
        with self._cond:
            if limit is not None:
                if limit < 1:
                    raise ValueError(f"max_concurrency must be >= 1, got {limit}")
                self.limit = self.ceiling = limit
                self.fixed = True
            if requests_per_minute is not None:
                if requests_per_minute < 0:
                    raise ValueError(f"requests_per_minute must be >= 0 (0 = no pacing), got {requests_per_minute}")
                self.requests_per_minute = requests_per_minute or None
            self._cond.notify_all()

    def acquire(self, sleep: Callable[[float], None] = time.sleep) -> float:
        """Take a slot; returns the seconds spent waiting for pacing/cool-down."""
        with self._cond:
            while self.active >= self.limit:
                self._cond.wait()
            self.active += 1
            self.peak = max(self.peak, self.active)
            now = time.monotonic()
            start = max(now, self._cooldown_until)
            if self._spacing > 0:
                start = max(start, self._next_spaced)
                self._next_spaced = start + self._spacing
            if self.requests_per_minute:
                start = max(start, self._next_start)
                self._next_start = start + 60.0 / self.requests_per_minute
        wait = start - now
        if wait > 0:
            sleep(wait)
        return max(0.0, wait)

    def release(self) -> None:
        with self._cond:
            self.active -= 1
            self._cond.notify()

    def cool_down(self, seconds: float) -> None:
        """A 429 asked for ``seconds`` of quiet: everyone waits, then goes one at a time, spaced at the rate
        the server accepted requests over the last minute (what its window or bucket lets through), at
        most ``MAX_SPACING`` apart."""
        with self._cond:
            now = time.monotonic()
            self._cooldown_until = max(self._cooldown_until, now + seconds)
            while self._accepted and self._accepted[0] < now - 60.0:
                self._accepted.popleft()
            pace = self.MAX_SPACING
            if self._accepted:
                span = max(1.0, now - self._accepted[0])
                pace = span / len(self._accepted)
            self._spacing = max(self._spacing, min(self.MAX_SPACING, pace, seconds if seconds > 0 else 0.05))

    def observe(self, seconds: float) -> None:
        """Record a successful request's latency (the last 200 are kept) and when it went through."""
        with self._cond:
            self._latencies.append(seconds)
            self._accepted.append(time.monotonic() - seconds)

    def adaptive_timeout(self, timeout: float) -> float:
        """The timeout for a request's first attempt: ``timeout`` until enough requests were seen, then
        ``max(MIN_ADAPTIVE_TIMEOUT, TAIL_FACTOR x p95 latency)``, never above ``timeout``."""
        with self._cond:
            seen = sorted(self._latencies)
        if len(seen) < self.MIN_OBSERVATIONS:
            return timeout
        p95 = seen[min(len(seen) - 1, int(0.95 * len(seen)))]
        return min(timeout, max(self.MIN_ADAPTIVE_TIMEOUT, self.TAIL_FACTOR * p95))

    def succeeded(self) -> None:
        """A request went through: relax the post-429 spacing; an adaptive limit grows (see the class docstring)."""
        with self._cond:
            if self._spacing:
                self._spacing = 0.0 if self._spacing < 0.01 else self._spacing * self.SPACING_DECAY
            if self.fixed or self.limit >= self.ceiling:
                return
            self._ok += 1
            if self._ok >= self.limit:
                self.limit = min(self.ceiling, self.limit * 2 if self._slow_start else self.limit + 1)
                self._ok = 0
                self._cond.notify_all()

    def throttled(self) -> None:
        """The server said no (429): an adaptive limit halves, at most once per round trip."""
        with self._cond:
            self._slow_start = False
            now = time.monotonic()
            recent = sorted(self._latencies)[-50:] if self._latencies else []
            round_trip = min(5.0, max(0.05, recent[len(recent) // 2])) if recent else 1.0
            if self.fixed or now - self._last_decrease < round_trip:
                return
            self.limit = max(1, self.limit // 2)
            self._ok = 0
            self._last_decrease = now
            self.decreases += 1

_GATES: dict[str, ProviderGate] = {}

_GATES_LOCK = threading.Lock()

def gate_for(key: str) -> ProviderGate:
    """The process-wide gate for a provider connection key."""
    with _GATES_LOCK:
        gate = _GATES.get(key)
        if gate is None:
            env = os.environ.get(ENV_MAX_CONCURRENCY)
            gate = _GATES[key] = ProviderGate(int(env) if env else None)
        return gate

def configure_provider(judge: str | Backend, *, max_concurrency: int | None = None,
                       requests_per_minute: float | None = None) -> ProviderGate:
    """Set a provider connection's process-wide limits explicitly: ``max_concurrency`` requests in flight
    (instead of the adaptive limit) and ``requests_per_minute`` pacing (0 turns it off). Every client of the
    connection in this process is bound by them."""
    gate = gate_for(resolve_backend(judge).connection_key())
    gate.configure(max_concurrency, requests_per_minute)
    return gate
