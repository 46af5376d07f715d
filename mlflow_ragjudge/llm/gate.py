"""The process-wide gate of each provider connection: how many calls may be in flight (adaptive, AIMD on 429s,
unless set), request pacing, and the cool-down after a 429 -- shared by every client in the process that talks to the
same provider connection (provider + base URL), and thread-safe, because MLflow calls scorers from thread pools."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .backends import Backend, resolve_backend
from .backends._sdk import parse_retry_after
from .backends.base import BackendError, ErrorKind, RateInfo

__all__ = ["ProviderGate", "gate_for", "configure_provider", "ENV_MAX_CONCURRENCY", "ENV_TAIL_TIMEOUT_FLOOR"]

ENV_MAX_CONCURRENCY = "RAGJUDGE_MAX_CONCURRENCY"
#: the least a first attempt is given before it is abandoned and sent again (seconds; default
#: ``ProviderGate.MIN_ADAPTIVE_TIMEOUT``); a shared, overloaded machine may want more
ENV_TAIL_TIMEOUT_FLOOR = "RAGJUDGE_TAIL_TIMEOUT_FLOOR"

class ProviderGate:
    """Concurrency limit and request pacing for one provider connection, shared by every client in the process.

    **Concurrency.** ``limit`` calls may be in flight at once. Unless a limit is set explicitly
    (:func:`configure_provider`, or ``RAGJUDGE_MAX_CONCURRENCY``), it starts at ``ADAPTIVE_START`` and doubles
    after each ``limit`` successful requests (slow start: 16, 32, 64, 128 within the first four round trips, so an
    unlimited server is latency-bound from the first second) until the first 429, then grows by one per
    ``limit`` successes, up to ``ADAPTIVE_MAX``. Slow start also ends where more in flight stops buying replies:
    when ``FLAT_ROUNDS`` rounds in a row that reached the limit delivered less than ``GROWTH`` x the replies per
    second of the best round, the limit goes back to that round's and is held (a server or a CPU that is already
    saturated only queues the extra requests; the queue costs threads, and against a rate limit it is the burst
    that meets the wall before the first 429 comes back). A round with fewer calls waiting than the limit proves
    nothing and is not counted. It comes down only on the server's word: a 429 that does not
    say when to come back halves it, at most once per round trip (the median latency of recent replies; 1 s
    before any), so one burst of 429s counts once. A 429 with ``retry-after`` is a rate window (requests or
    tokens per minute), handled by the pace below instead: halving the concurrency too would leave the window
    unused once it reopens.

    **The request budget a server announces.** Where replies carry rate-limit headers (OpenAI
    ``x-ratelimit-*-requests``, Anthropic ``anthropic-ratelimit-requests-*``), the gate keeps the budget they
    announce: the latest reply's ``remaining``, less the other requests in flight (the server may not have
    counted them yet: those started after that reply's request, and those a busy client started but has not put
    on the wire yet), less each request started since. At zero no request starts until a
    reply brings a fresher count or the announced reset passes; then one request goes first, to learn the new
    budget. So a server that says how much it accepts gets (almost) no 429, and its whole budget is used.

    **A pace learned from 429s.** A server that sends no such headers teaches its limit by refusing: after a
    429 with ``retry-after`` every caller waits out the cool-down it asked for, and from then on request starts
    are spaced at ``RATE_MARGIN`` of the rate the server accepted before it said no: what it accepted over the
    last minute, over the span from the first of those requests to the end of the cool-down (for a window that
    was empty when the run began, its length). The pace is kept (it does not decay into a burst that meets the
    same wall again); a further 429 re-measures it, and ``PROBE_EVERY`` seconds without one raise it by
    ``PROBE_STEP``, so a limit that grows is found again.

    **A window learned from 429s.** When the server kept the client out at least as long as the client took to
    fill it (the 429's ``retry-after`` no shorter than the time from the first request it accepted to the 429),
    the limiter is a window -- sliding or fixed -- of ``W`` = that span (at most a minute) holding the ``L``
    requests it accepted, not a bucket that refills by the second. Then, instead of an even pace, the window
    itself is mirrored: no ``W + WINDOW_LAG`` seconds hold more than ``RATE_MARGIN x L`` of this connection's
    starts, the accepted ones before the 429 included. Capacity is reused as the server frees it -- a burst that
    filled the window is followed, ``W`` later, by one as large -- where an even pace at the window's average
    would leave the first window's burst unrepaid. A sliding window's rule is a fixed window's too (every ``W``
    seconds hold at most ``L``); ``WINDOW_LAG`` covers the time a request takes from its start here to its
    arrival there. A further 429 re-measures ``L`` and ``W``; two windows (at least ``PROBE_EVERY`` seconds)
    without one raise ``L`` by ``PROBE_STEP``. The latest 429 decides the kind: one that comes back sooner than
    the window took to fill turns the mirror into the even pace (a full window frees request by request).

    With ``requests_per_minute`` set, call starts are also spaced ``60 / (RPM_MARGIN x rpm)`` seconds apart: 1 %
    under the limit, so a start that is late by a few milliseconds never puts one request too many in a window.
    """

    ADAPTIVE_START = 16
    ADAPTIVE_MAX = 128
    #: slow start ends when FLAT_ROUNDS rounds in a row, each at the limit, did not deliver GROWTH x the best
    #: round's replies per second
    GROWTH = 1.25
    FLAT_ROUNDS = 2
    #: the learned pace: this share of the accepted rate the 429 revealed; raised by PROBE_STEP after PROBE_EVERY
    #: seconds without a 429
    RATE_MARGIN = 0.995
    #: the learned window's extra length: a request's start here to its arrival at the server, at most
    WINDOW_LAG = 0.25
    RPM_MARGIN = 0.99
    PROBE_EVERY = 60.0
    PROBE_STEP = 1.02
    #: tail latency: after this many successful requests on the connection, the first attempt of a request is
    #: given ``TAIL_FACTOR`` x the 95th-percentile latency seen (at least ``MIN_ADAPTIVE_TIMEOUT`` seconds)
    MIN_OBSERVATIONS = 10
    TAIL_FACTOR = 4.0
    MIN_ADAPTIVE_TIMEOUT = 2.0

    def __init__(self, limit: int | None = None, requests_per_minute: float | None = None) -> None:
        self._lock = threading.Lock()
        self._slot = threading.Condition(self._lock)  # waiting for a free slot
        self._budget_cond = threading.Condition(self._lock)  # waiting for the announced budget
        #: an explicit limit is kept as it is; otherwise the limit adapts (see the class docstring)
        self.fixed = limit is not None
        self.limit = limit if limit is not None else self.ADAPTIVE_START
        self.ceiling = limit if limit is not None else self.ADAPTIVE_MAX
        self.requests_per_minute = requests_per_minute
        self.decreases = 0
        self._slow_start = True
        self._ok = 0
        #: slow start's rounds (``limit`` successes each): replies per second of the best round and its limit,
        #: rounds since without GROWTH, whether this round reached the limit (a round with fewer calls waiting than
        #: the limit allows says nothing about the server), and whether the limit is held at a plateau
        self._round_start = time.monotonic()
        self._round_full = False
        self._best_rate = 0.0
        self._best_limit = self.limit
        self._flat_rounds = 0
        self._plateau = False
        self.plateaus = 0
        self._last_decrease = -1e9
        self.active = 0
        self.peak = 0
        #: requests started on this connection (a request's sequence number is this count when it starts)
        self.starts = 0
        self._next_start = 0.0
        self._cooldown_until = 0.0
        #: the pace learned from 429s (requests per second), when it is set the next start it allows
        self.learned_rate: float | None = None
        #: the window learned from 429s: its length (seconds), the starts it allows, and the starts in it
        self.learned_window: float | None = None
        self.window_cap = 0.0
        self._window_starts: deque[float] = deque()
        self._next_learned = 0.0
        self._last_429 = 0.0
        self._learn_pending: tuple[float, float] | None = None
        self._last_learn = -1e9
        #: the server announces its budget in rate-limit headers (then no pace is guessed from 429s)
        self.announced = False
        self._probed = 0.0
        #: the announced budget (rate-limit headers): requests left, and when it grows again
        self.budget: int | None = None
        self._budget_reset_at = 0.0
        self.budget_waits = 0  # starts that waited for the announced budget
        self._probe: int | None = None  # the start number of the request sent to learn the budget, until it returns
        self._probe_until = 0.0
        self._mine = threading.local()
        self._latencies: deque[float] = deque(maxlen=200)
        self._accepted: deque[float] = deque(maxlen=20_000)  # start times of requests that went through

    def configure(self, limit: int | None = None, requests_per_minute: float | None = None) -> None:
        """Change the limits. ``None`` leaves a setting as it is; ``requests_per_minute=0`` turns pacing off."""
        with self._lock:
            if limit is not None:
                if limit < 1:
                    raise ValueError(f"max_concurrency must be >= 1, got {limit}")
                self.limit = self.ceiling = limit
                self.fixed = True
            if requests_per_minute is not None:
                if requests_per_minute < 0:
                    raise ValueError(f"requests_per_minute must be >= 0 (0 = no pacing), got {requests_per_minute}")
                self.requests_per_minute = requests_per_minute or None
            self._slot.notify_all()

    def acquire(self, sleep: Callable[[float], None] = time.sleep) -> float:
        """Take a slot; returns the seconds spent waiting for the announced budget, the pace or a cool-down."""
        budget_wait = 0.0
        with self._lock:
            probe = False
            while True:
                if self.active >= self.limit:
                    self._slot.wait()
                    continue
                # a cool-down is waited out here, before the request counts as started (the budget, the pace)
                now = time.monotonic()
                until = self._cooldown_until
                if self.budget is not None:
                    if self.budget <= 0:
                        if self._probe is not None and now < self._probe_until:
                            until = max(until, self._probe_until)  # the probe's reply will say how much is left
                        else:
                            until = max(until, self._budget_reset_at)
                if now < until:
                    if not budget_wait and self.budget is not None and self.budget <= 0:
                        self.budget_waits += 1
                    self._budget_cond.wait(timeout=until - now)
                    budget_wait += time.monotonic() - now
                    continue
                # past the announced reset: this request learns the new budget
                probe = self.budget is not None and self.budget <= 0
                break
            self.active += 1
            self.peak = max(self.peak, self.active)
            if self.active >= self.limit:
                self._round_full = True
            self.starts += 1
            self._mine.seq = self.starts  # this request's place in the connection's starts (see observe)
            now = time.monotonic()
            if probe:
                # the others wait for the probe's reply (or, if it never brings one, a few round trips)
                self.budget = 0
                self._probe = self.starts
                self._probe_until = now + max(1.0, 4.0 * self._median_latency())
            elif self.budget is not None:
                self.budget -= 1
            start = max(now, self._cooldown_until)
            if self._learn_pending is not None and now >= self._cooldown_until:
                self._learn(*self._learn_pending)
                self._learn_pending = None
            if self.learned_window:
                # no 429 for two windows (the first mirrors the one that was refused): try a little more
                quiet = max(self.PROBE_EVERY, 2.0 * self.learned_window)
                if now - self._last_429 > quiet and now - self._probed > quiet:
                    self.window_cap *= self.PROBE_STEP
                    self._probed = now
                start = self._window_start(start)
            elif self.learned_rate:
                if now - self._last_429 > self.PROBE_EVERY and now - self._probed > self.PROBE_EVERY:
                    self.learned_rate *= self.PROBE_STEP  # no 429 for a while: try a little faster
                    self._probed = now
                start = max(start, self._next_learned)
                self._next_learned = start + 1.0 / self.learned_rate
            if self.requests_per_minute:
                start = max(start, self._next_start)
                self._next_start = start + 60.0 / (self.RPM_MARGIN * self.requests_per_minute)
        wait = start - now
        if wait > 0:
            sleep(wait)
        return max(0.0, wait) + budget_wait

    def started(self) -> int:
        """The start count of this thread's last :meth:`acquire` (its request's place among the connection's)."""
        return int(getattr(self._mine, "seq", self.starts))

    def release(self) -> None:
        with self._lock:
            self.active -= 1
            self._slot.notify()

    def _median_latency(self) -> float:
        recent = sorted(list(self._latencies)[-50:])
        return recent[len(recent) // 2] if recent else 1.0

    def cool_down(self, seconds: float) -> None:
        """A 429 asked for ``seconds`` of quiet: everyone waits, then requests start at the learned pace."""
        with self._lock:
            now = time.monotonic()
            self._cooldown_until = max(self._cooldown_until, now + seconds)
            self._last_429 = now
            self._probe = None  # a refused probe: the cool-down says when to try again
            if not self.announced:  # a server that announces its budget is followed by that, not a guess
                # measured when the cool-down ends: by then the requests in flight at this 429 have come back
                # and show what the server accepted before it
                if self._learn_pending is None:
                    self._learn_pending = (now, seconds)
                self._next_learned = max(self._next_learned, self._cooldown_until)

    def cooling_down(self) -> float:
        """Seconds left of the quiet a 429 asked for (0 when none)."""
        return max(0.0, self._cooldown_until - time.monotonic())

    def before_wire(self) -> None:
        """A started request is about to leave (:class:`~.backends.base.WireWatch`): held back when a 429 asked for
        quiet since it started. Under many threads a request can wait long for the CPU between its start and the
        wire; without this, every request started before the first 429 came back would meet the same wall."""
        wait = self.cooling_down()
        if wait > 0:
            raise BackendError(ErrorKind.HELD, "held back before sending: the server asked for quiet", retry_after=wait)

    def on_reply(self, status: int, headers: Any) -> None:
        """A reply's status and headers as they arrive: a 429 that says when to come back starts the cool-down at
        once, before the SDK has read its body and the retry layer has seen its exception."""
        if status == 429:
            seconds = parse_retry_after(headers)
            if seconds is not None:
                self.cool_down(seconds)

    def _window_start(self, earliest: float) -> float:
        """The first start at or after ``earliest`` that keeps every ``learned_window + WINDOW_LAG`` seconds at
        ``window_cap`` starts or fewer (starts are handed out in order); the start is counted."""
        span = (self.learned_window or 0.0) + self.WINDOW_LAG
        starts = self._window_starts
        while starts and starts[0] <= earliest - span:
            starts.popleft()  # out of every window a start from now on can be in
        cap = max(1, int(self.window_cap))
        start = max(earliest, starts[-1]) if starts else earliest
        if len(starts) >= cap:
            start = max(start, starts[-cap] + span)
        starts.append(start)
        return start

    def _learn(self, at: float, retry_after: float) -> None:
        """Set the window or the pace from what the server accepted before the 429 at ``at`` (see the class
        docstring)."""
        accepted = [t for t in self._accepted if at - (self.learned_window or 60.0) <= t <= at]
        if not accepted:
            return  # nothing went through before it: nothing to measure
        # a fresh window runs from the first request it accepted to when it takes requests again
        filled = at - accepted[0]
        span = filled + retry_after
        if retry_after >= filled:  # kept out as long as it took to fill: a window, not a bucket
            cap = self.RATE_MARGIN * len(accepted)
            if self.learned_window is None or cap < self.window_cap:
                self.window_cap = max(1.0, cap)
            elif at - self._last_learn >= 1.0:  # refused again at the learned cap: a little less (once a second)
                self.window_cap = max(1.0, 0.95 * self.window_cap)
            if self.learned_window is None:  # from now on every start is counted; before, the accepted ones
                self._window_starts = deque(sorted(accepted))
            self.learned_window = min(60.0, max(1.0, span))
            self.learned_rate = None  # the latest 429 says what kind of limit this is
            self._last_learn = at
            return
        # a window's later 429s look like a bucket's (it is full and frees request by request): from then on an
        # even pace at what it accepted, which is what mirroring a window full of evenly spaced starts gives
        self.learned_window = None
        self._window_starts.clear()
        rate = self.RATE_MARGIN * len(accepted) / min(60.0, max(1.0, span))
        if self.learned_rate is None or rate < self.learned_rate:
            self.learned_rate = max(rate, 1.0 / 60.0)
        elif at - self._last_learn >= 1.0:  # refused again at the learned pace: a little slower (once a second)
            self.learned_rate *= 0.9
        self._last_learn = at
        self._next_learned = max(self._next_learned, time.monotonic())

    def observe(self, seconds: float, rate: RateInfo | None = None, started_after: int | None = None) -> None:
        """Record a successful request's latency (the last 200 are kept) and when it went through; ``rate`` is
        what its reply's headers announced, ``started_after`` the connection's start count when it started."""
        with self._lock:
            now = time.monotonic()
            self._latencies.append(seconds)
            self._accepted.append(now - seconds)
            if rate is not None and rate.remaining is not None:
                self.announced = True
                # every other request in flight may not be counted yet: those started after this one, and those
                # started before it that a busy client has not put on the wire yet
                since = self.starts - started_after if started_after is not None else 0
                self.budget = rate.remaining - max(since, self.active - 1)
                self._budget_reset_at = now + (rate.reset if rate.reset is not None else 1.0)
                if started_after is not None and started_after == self._probe:
                    self._probe = None
                self._budget_cond.notify_all()

    def adaptive_timeout(self, timeout: float) -> float:
        """The timeout for a request's first attempt: ``timeout`` until enough requests were seen, then
        ``max(MIN_ADAPTIVE_TIMEOUT, TAIL_FACTOR x p95 latency)``, never above ``timeout``."""
        with self._lock:
            seen = sorted(self._latencies)
        if len(seen) < self.MIN_OBSERVATIONS:
            return timeout
        p95 = seen[min(len(seen) - 1, int(0.95 * len(seen)))]
        floor = float(os.environ.get(ENV_TAIL_TIMEOUT_FLOOR) or self.MIN_ADAPTIVE_TIMEOUT)
        return min(timeout, max(floor, self.TAIL_FACTOR * p95))

    def calibrated(self) -> bool:
        """Whether enough replies were seen for :meth:`adaptive_timeout` to know this server's usual latency."""
        with self._lock:
            return len(self._latencies) >= self.MIN_OBSERVATIONS

    def succeeded(self) -> None:
        """A request went through: an adaptive limit grows (see the class docstring)."""
        with self._lock:
            if self.fixed or self._plateau:
                return
            self._ok += 1
            if self._ok < self.limit:
                return
            now = time.monotonic()
            if self._slow_start and self._round_full:
                # a round in which the limit was reached: did the last doubling buy replies per second?
                rate = self._ok / max(1e-6, now - self._round_start)
                if rate >= self.GROWTH * self._best_rate:
                    self._best_rate, self._best_limit, self._flat_rounds = rate, self.limit, 0
                else:
                    self._flat_rounds += 1
            self._ok, self._round_start, self._round_full = 0, now, False
            if self._flat_rounds >= self.FLAT_ROUNDS:
                # more in flight only queues (at the server or for this process's CPU): back to the limit that
                # gave the best rate, and held there (a 429 still halves it, and growth resumes after one)
                self.limit, self._slow_start, self._plateau = self._best_limit, False, True
                self.plateaus += 1
            elif self.limit < self.ceiling:
                self.limit = min(self.ceiling, self.limit * 2 if self._slow_start else self.limit + 1)
            self._slot.notify_all()

    def throttled(self) -> None:
        """The server said no (429) without saying when to come back: an adaptive limit halves, at most once per
        round trip."""
        with self._lock:
            self._slow_start = False
            now = time.monotonic()
            round_trip = min(5.0, max(0.05, self._median_latency()))
            if self.fixed or now - self._last_decrease < round_trip:
                return
            self._last_decrease = now
            self.limit = max(1, self.limit // 2)
            self._ok = 0
            self._plateau = False  # from here additive growth (AIMD) finds the server's level again
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
