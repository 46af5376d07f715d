"""The gate's policies, one small object each (docs/architecture.md, "Tour 3: the client's pacing").

Each object owns its own state and answers one question about the next request; none of them locks or waits:
:class:`~mlflow_ragjudge.llm.gate.ProviderGate` holds the one lock, asks them in order, and does the waiting.

==================  ==================================================  ===========================================
policy              reacts to                                           set by
==================  ==================================================  ===========================================
Concurrency         successes (slow start, then +1), a 429 without      ``max_concurrency`` / configure_provider /
  + Rounds          ``retry-after`` (halves, once per round trip)       ``RAGJUDGE_MAX_CONCURRENCY`` (else adaptive)
AnnouncedBudget     a reply's ``x-ratelimit-*`` / ``anthropic-          the server (headers on every reply)
                    ratelimit-*`` request headers
AnnouncedTokens     the same replies' token headers, against each       the server (headers on every reply)
                    request's estimated prompt tokens
CoolDown            a 429 with ``retry-after``                          the server
LearnedPace         what the server accepted before a 429 with          the server (only when it announces no
                    ``retry-after``: a window to mirror or a pace       budget)
RequestsPerMinute   nothing: a fixed spacing of starts (across          ``requests_per_minute``, ``shared_pace``
                    processes with a pace file)
Latency             every successful reply                              ``RAGJUDGE_TAIL_TIMEOUT_FLOOR``
==================  ==================================================  ===========================================
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field

from .shared_pace import SharedPace

__all__ = ["Rounds", "Concurrency", "AnnouncedBudget", "AnnouncedTokens", "CoolDown", "LearnedPace",
           "RequestsPerMinute", "Latency", "ENV_TAIL_TIMEOUT_FLOOR"]

#: the least a first attempt is given before it is abandoned and sent again (seconds; default
#: ``Latency.MIN_ADAPTIVE_TIMEOUT``); a shared, overloaded machine may want more
ENV_TAIL_TIMEOUT_FLOOR = "RAGJUDGE_TAIL_TIMEOUT_FLOOR"


@dataclass
class Rounds:
    """Slow start's bookkeeping: a round is ``limit`` successes. While ``slow_start``, each round doubles the limit,
    until ``FLAT_ROUNDS`` full rounds in a row (rounds that reached the limit; one with fewer callers waiting proves
    nothing) delivered less than ``GROWTH`` x the replies per second of the best round: then the limit goes back to
    that round's and is held (``plateau``) -- more in flight only queues, at the server or for this process's CPU."""

    GROWTH = 1.25
    FLAT_ROUNDS = 2

    best_limit: int
    slow_start: bool = True
    ok: int = 0  # successes in this round
    started: float = field(default_factory=time.monotonic)
    full: bool = False  # the round reached the limit
    best_rate: float = 0.0
    flat: int = 0  # full rounds in a row without GROWTH
    plateau: bool = False
    plateaus: int = 0

    def next_limit(self, limit: int, ceiling: int) -> int | None:
        """A round of ``limit`` successes ended: the new limit (None while the round runs or the limit is held)."""
        if self.plateau:
            return None
        self.ok += 1
        if self.ok < limit:
            return None
        now = time.monotonic()
        if self.slow_start and self.full:  # did the last doubling buy replies per second?
            rate = self.ok / max(1e-6, now - self.started)
            if rate >= self.GROWTH * self.best_rate:
                self.best_rate, self.best_limit, self.flat = rate, limit, 0
            else:
                self.flat += 1
        self.ok, self.started, self.full = 0, now, False
        if self.flat >= self.FLAT_ROUNDS:
            self.slow_start, self.plateau = False, True
            self.plateaus += 1
            return self.best_limit
        if limit < ceiling:
            return min(ceiling, limit * 2 if self.slow_start else limit + 1)
        return limit


@dataclass
class Concurrency:
    """How many calls may be in flight: ``limit``, fixed when set (``fixed``), else adaptive (AIMD): slow start and
    +1 per round (:class:`Rounds`) up to ``ceiling``; halved by a 429 that does not say when to come back, at most
    once per round trip, so one burst of 429s counts once. (A 429 with ``retry-after`` is a rate window, left to
    the pacing policies: halving the concurrency too would leave the window unused once it reopens.)"""

    ADAPTIVE_START = 16
    ADAPTIVE_MAX = 128

    limit: int
    ceiling: int
    fixed: bool
    rounds: Rounds
    active: int = 0
    peak: int = 0
    decreases: int = 0
    last_decrease: float = -1e9

    @classmethod
    def of(cls, limit: int | None) -> Concurrency:
        start = limit if limit is not None else cls.ADAPTIVE_START
        return cls(start, limit if limit is not None else cls.ADAPTIVE_MAX, limit is not None, Rounds(start))

    def enter(self) -> None:
        self.active += 1
        self.peak = max(self.peak, self.active)
        if self.active >= self.limit:
            self.rounds.full = True

    def succeeded(self) -> bool:
        """A request went through; True when a round ended (the limit may have changed)."""
        if self.fixed:
            return False
        new = self.rounds.next_limit(self.limit, self.ceiling)
        if new is None:
            return False
        self.limit = new
        return True

    def throttled(self, round_trip: float) -> None:
        self.rounds.slow_start = False
        now = time.monotonic()
        if self.fixed or now - self.last_decrease < round_trip:
            return
        self.last_decrease = now
        self.limit = max(1, self.limit // 2)
        self.rounds.ok = 0
        self.rounds.plateau = False  # from here additive growth finds the server's level again
        self.decreases += 1


@dataclass
class AnnouncedBudget:
    """The request budget a server announces in its replies' rate-limit headers (OpenAI ``x-ratelimit-*-requests``,
    Anthropic ``anthropic-ratelimit-requests-*``): the latest reply's ``remaining``, less the other requests in
    flight (the server may not have counted them yet), less each request started since. At zero nobody starts
    until a reply brings a fresher count or the announced reset passes; then one request (the ``probe``) goes
    first, to learn the new budget, and the others wait for its reply (at most a few round trips)."""

    announced: bool = False  # then no pace is guessed from 429s
    left: int | None = None
    reset_at: float = 0.0
    waits: int = 0  # starts that waited for the budget
    probe: int | None = None  # the start number of the request sent to learn the budget, until it returns
    probe_until: float = 0.0

    def exhausted(self) -> bool:
        return self.left is not None and self.left <= 0

    def hold_until(self, now: float) -> float:
        """Until when no request may start for lack of budget (0: it may)."""
        if not self.exhausted():
            return 0.0
        if self.probe is not None and now < self.probe_until:
            return self.probe_until  # the probe's reply will say how much is left
        return self.reset_at

    def spend(self) -> None:
        """A request started: one less left."""
        if self.left is not None:
            self.left -= 1

    def send_probe(self, seq: int, until: float) -> None:
        """The request that started ``seq``-th learns the new budget; the others wait for it until ``until``."""
        self.left, self.probe, self.probe_until = 0, seq, until

    def announce(self, remaining: int, reset: float | None, now: float, seq: int | None, uncounted: int) -> None:
        """A reply (of the request that started ``seq``-th) said ``remaining`` requests are left, for ``reset``
        seconds; ``uncounted`` requests in flight it may not have counted yet."""
        self.announced = True
        self.left = remaining - uncounted
        self.reset_at = now + (reset if reset is not None else 1.0)
        if seq is not None and seq == self.probe:
            self.probe = None


@dataclass
class AnnouncedTokens:
    """The token budget a server announces in its replies' headers (OpenAI ``x-ratelimit-*-tokens``, Anthropic
    ``anthropic-ratelimit-(input-)tokens-*``), kept as :class:`AnnouncedBudget` keeps the request budget: the latest
    reply's ``remaining``, less the estimated prompt tokens of the requests started after that reply's request (the
    server may not have counted them yet), less each start's since. A request starts when its own estimate is left
    (or the whole limit, for one larger than the limit). Between replies the budget is taken to refill at the pace
    the announcement implies (what was used, ``limit - remaining``, back by the ``reset``): a request short of tokens
    waits until that refill covers it, at the latest until the reset, when the budget is whole again."""

    left: int | None = None
    limit: int | None = None
    reset_at: float = 0.0
    announced_at: float = 0.0
    refill: float = 0.0  # tokens per second coming back, as the latest announcement implies
    waits: int = 0  # starts that waited for tokens
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=4096))  # (start number, tokens)
    #: the server's count of a prompt per token of our (deliberately high) estimate, learned from replies' usage
    scale: float = 1.0

    def cost(self, estimate: int) -> int:
        """A request's tokens as the server will count them: our estimate, scaled by what it counted before."""
        return max(1, round(estimate * self.scale)) if estimate > 0 else 0

    def counted(self, estimate: int, server: int) -> None:
        """A reply's usage said the server counted ``server`` prompt tokens where we estimated ``estimate``: the
        scale moves a tenth of the way to that ratio (kept in [0.2, 1.5]: a broken usage field cannot stall or
        flood the budget)."""
        if estimate > 0 and server > 0:
            self.scale += 0.1 * (min(1.5, max(0.2, server / estimate)) - self.scale)

    def hold_until(self, now: float, tokens: int) -> float:
        """Until when a request of ``tokens`` may not start for lack of tokens (0: it may)."""
        if self.left is None or tokens <= 0:
            return 0.0
        if now >= self.reset_at:  # the window the count was for is over: whole again
            self.left, self.announced_at = self.limit, now
            return 0.0
        need = min(tokens, self.limit) if self.limit else tokens
        have = self.left + self.refill * (now - self.announced_at)
        if have >= need:
            return 0.0
        if self.refill <= 0:
            return self.reset_at
        return min(self.reset_at, self.announced_at + (need - self.left) / self.refill)

    def spend(self, seq: int, tokens: int) -> None:
        """Request ``seq`` started with an estimated ``tokens``."""
        if tokens > 0:
            self.recent.append((seq, tokens))
            if self.left is not None:
                self.left -= tokens

    def announce(self, remaining: int, limit: int | None, reset: float | None, now: float, seq: int | None,
                 in_flight: int = 0) -> None:
        """A reply (of the request that started ``seq``-th) said ``remaining`` tokens are left until ``reset``; the
        ``in_flight`` other requests may not be counted yet either (a busy client puts a started request on the wire
        late), as many as started after it at least."""
        after = [t for s, t in self.recent if seq is None or s > seq]
        typical = sum(t for _, t in list(self.recent)[-50:]) / min(50, len(self.recent)) if self.recent else 0.0
        uncounted = max(sum(after), round(in_flight * typical))
        self.left = remaining - uncounted
        self.limit = limit if limit is not None else self.limit
        reset = reset if reset is not None else 1.0
        self.reset_at, self.announced_at = now + reset, now
        self.refill = (self.limit - remaining) / reset if self.limit is not None and reset > 0 else 0.0


@dataclass
class CoolDown:
    """The quiet a 429 with ``retry-after`` asked for: every caller waits it out before its request starts, and a
    request started before it began is held back on its way out (:meth:`ProviderGate.before_wire`)."""

    until: float = 0.0

    def left(self) -> float:
        return max(0.0, self.until - time.monotonic())


@dataclass
class LearnedPace:
    """A limit learned from 429s when the server announces none: from what it accepted before a 429 with
    ``retry-after`` (measured when the cool-down ends, once the requests in flight have come back).

    * **A window** when the server kept the client out at least as long as it took to fill (``retry-after`` no
      shorter than the span from the first request it accepted to the 429): no ``window + WINDOW_LAG`` seconds
      hold more than ``window_cap`` (``RATE_MARGIN`` x the ``L`` accepted) starts, so capacity is reused as the
      server frees it. Two quiet windows (at least ``PROBE_EVERY`` s) raise the cap by ``PROBE_STEP``.
    * **An even pace** otherwise (a bucket, or a full window freeing request by request): starts spaced at
      ``RATE_MARGIN`` of the accepted rate; ``PROBE_EVERY`` s without a 429 raise it by ``PROBE_STEP``.

    The latest 429 decides the kind; a further 429 re-measures (a little less, at most once a second)."""

    RATE_MARGIN = 0.995
    WINDOW_LAG = 0.25  # a request's start here to its arrival at the server, at most
    PROBE_EVERY = 60.0
    PROBE_STEP = 1.02

    rate: float | None = None  # requests per second
    window: float | None = None  # seconds
    window_cap: float = 0.0
    window_starts: deque[float] = field(default_factory=deque)
    next_start: float = 0.0  # the next start the pace allows
    pending: tuple[float, float] | None = None  # a 429 (when, retry-after) to learn from once its cool-down ends
    last_429: float = 0.0
    last_learn: float = -1e9
    probed: float = 0.0
    accepted: deque[float] = field(default_factory=lambda: deque(maxlen=20_000))  # starts that went through

    def refused(self, now: float, retry_after: float, quiet_until: float, learn: bool) -> None:
        self.last_429 = now
        if learn:
            if self.pending is None:
                self.pending = (now, retry_after)
            self.next_start = max(self.next_start, quiet_until)

    def schedule(self, start: float, now: float, quiet_until: float) -> float:
        """The start it allows for a request that may start at ``start`` (counted as started)."""
        if self.pending is not None and now >= quiet_until:
            self._learn(*self.pending)
            self.pending = None
        if self.window:
            quiet = max(self.PROBE_EVERY, 2.0 * self.window)  # the first window mirrors the refused one
            if now - self.last_429 > quiet and now - self.probed > quiet:
                self.window_cap *= self.PROBE_STEP
                self.probed = now
            return self._window_start(start)
        if self.rate:
            if now - self.last_429 > self.PROBE_EVERY and now - self.probed > self.PROBE_EVERY:
                self.rate *= self.PROBE_STEP
                self.probed = now
            start = max(start, self.next_start)
            self.next_start = start + 1.0 / self.rate
        return start

    def _window_start(self, earliest: float) -> float:
        """The first start at or after ``earliest`` that keeps every ``window + WINDOW_LAG`` seconds at
        ``window_cap`` starts or fewer (starts are handed out in order)."""
        span = (self.window or 0.0) + self.WINDOW_LAG
        starts = self.window_starts
        while starts and starts[0] <= earliest - span:
            starts.popleft()  # out of every window a start from now on can be in
        cap = max(1, int(self.window_cap))
        start = max(earliest, starts[-1]) if starts else earliest
        if len(starts) >= cap:
            start = max(start, starts[-cap] + span)
        starts.append(start)
        return start

    def _learn(self, at: float, retry_after: float) -> None:
        accepted = [t for t in self.accepted if at - (self.window or 60.0) <= t <= at]
        if not accepted:
            return  # nothing went through before it: nothing to measure
        filled = at - accepted[0]  # a fresh window runs from the first request it accepted
        span = filled + retry_after  # ... to when it takes requests again
        if retry_after >= filled:  # kept out as long as it took to fill: a window, not a bucket
            cap = self.RATE_MARGIN * len(accepted)
            if self.window is None or cap < self.window_cap:
                self.window_cap = max(1.0, cap)
            elif at - self.last_learn >= 1.0:  # refused again at the learned cap: a little less
                self.window_cap = max(1.0, 0.95 * self.window_cap)
            if self.window is None:  # from now on every start is counted; before, the accepted ones
                self.window_starts = deque(sorted(accepted))
            self.window = min(60.0, max(1.0, span))
            self.rate = None
            self.last_learn = at
            return
        # a window's later 429s look like a bucket's (it is full and frees request by request): an even pace at
        # what it accepted, which is what mirroring a window full of evenly spaced starts gives
        self.window = None
        self.window_starts.clear()
        rate = self.RATE_MARGIN * len(accepted) / min(60.0, max(1.0, span))
        if self.rate is None or rate < self.rate:
            self.rate = max(rate, 1.0 / 60.0)
        elif at - self.last_learn >= 1.0:  # refused again at the learned pace: a little slower
            self.rate *= 0.9
        self.last_learn = at
        self.next_start = max(self.next_start, time.monotonic())


@dataclass
class RequestsPerMinute:
    """``requests_per_minute`` set: starts spaced ``60 / (MARGIN x rpm)`` s apart, 1 % under the limit, so a start
    late by a few milliseconds never puts one request too many in a window. None: no spacing. With a pace file
    (``shared``, :mod:`~mlflow_ragjudge.llm.shared_pace`) the spacing holds between the starts of every process
    that opens it, claimed under the connection's key (``connection``)."""

    MARGIN = 0.99

    rpm: float | None = None
    next_start: float = 0.0
    shared: SharedPace | None = None
    connection: str = ""

    def schedule(self, start: float) -> float:
        if not self.rpm:
            return start
        interval = 60.0 / (self.MARGIN * self.rpm)
        if self.shared is not None:
            offset = time.time() - time.monotonic()  # the file holds wall-clock times, the gate monotonic ones
            claimed = self.shared.claim(self.connection, interval, start + offset)
            if claimed is not None:
                return claimed - offset
        start = max(start, self.next_start)
        self.next_start = start + interval
        return start


@dataclass
class Latency:
    """The latencies of the last 200 successful replies: the round trip (their median, 1 s before any) and the
    tail timeout of a first attempt (``TAIL_FACTOR`` x the 95th percentile, at least ``MIN_ADAPTIVE_TIMEOUT`` s
    or ``RAGJUDGE_TAIL_TIMEOUT_FLOOR``), once ``MIN_OBSERVATIONS`` replies were seen."""

    MIN_OBSERVATIONS = 10
    TAIL_FACTOR = 4.0
    MIN_ADAPTIVE_TIMEOUT = 2.0

    seen: deque[float] = field(default_factory=lambda: deque(maxlen=200))

    def median(self) -> float:
        recent = sorted(list(self.seen)[-50:])
        return recent[len(recent) // 2] if recent else 1.0

    def calibrated(self) -> bool:
        return len(self.seen) >= self.MIN_OBSERVATIONS

    def tail_timeout(self, timeout: float) -> float:
        return self.tail_of(sorted(self.seen), timeout)

    @classmethod
    def tail_of(cls, seen: list[float], timeout: float) -> float:
        """:meth:`tail_timeout` of the latencies ``seen``, sorted."""
        if len(seen) < cls.MIN_OBSERVATIONS:
            return timeout
        p95 = seen[min(len(seen) - 1, int(0.95 * len(seen)))]
        floor = float(os.environ.get(ENV_TAIL_TIMEOUT_FLOOR) or cls.MIN_ADAPTIVE_TIMEOUT)
        return min(timeout, max(floor, cls.TAIL_FACTOR * p95))
