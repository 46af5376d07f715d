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
LearnedPace         what the server held of ours at each 429 with       the server (only when it announces no
                    ``retry-after`` (a share to mirror and grow)        budget)
RequestsPerMinute   nothing: a fixed spacing of starts (across          ``requests_per_minute``, ``shared_pace``
                    processes with a pace file)
Latency             every successful reply                              ``RAGJUDGE_TAIL_TIMEOUT_FLOOR``
==================  ==================================================  ===========================================
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter, deque
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
    #: the first request goes alone (an adaptive limit), until its attempt ends or FIRST_ALONE s pass: a window
    #: someone else filled costs one 429, not a burst of them
    opened: bool = False
    first_at: float | None = None
    FIRST_ALONE = 2.0

    def allows(self, now: float) -> int:
        """How many may be in flight now."""
        if self.opened or self.fixed:
            return self.limit
        if self.first_at is not None and now - self.first_at >= self.FIRST_ALONE:
            self.opened = True
            return self.limit
        return 1

    @classmethod
    def of(cls, limit: int | None) -> Concurrency:
        start = limit if limit is not None else cls.ADAPTIVE_START
        return cls(start, limit if limit is not None else cls.ADAPTIVE_MAX, limit is not None, Rounds(start))

    def enter(self) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
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
    """Our share of a limit, learned from 429s when the server announces no budget. The limit may be shared:
    someone else's requests in the server's window leave us less at first and more as they age out; a neighbour
    keeps part of it all along. So the policy holds what the server accepted of ours (a cap, mirrored), grows it
    as fast as the server lets it grow, and probes upward when refusals stop.

    * **The window** is ``DEFAULT_WINDOW`` (the providers' limits are per minute) unless a 429 proves one shorter
      than half of it: a fresh window filled by at least ``MIN_EVIDENCE`` of ours and then kept shut at least
      (``SHUT_FACTOR`` x) as long as filling it took (``retry-after`` against the span from the first request it
      accepted to the 429). A later 429 with less than half as much of ours in that window resets it to the
      default (a neighbour filled it too).
    * **The cap**: ``RATE_MARGIN`` x what the server accepted of ours in the window before the latest 429. No
      :meth:`span` (the window and ``WINDOW_LAG`` s) holds more of our starts than the cap, so our own capacity is
      reused as the server frees it (the window mirrored).
    * **The growth** (starts per second): a start beyond the cap takes a token, and tokens come at the growth rate
      (at most ``BURST`` seconds' worth kept: an allowance not used does not pile up into a burst); each start
      beyond the cap raises it by one. At the first 429 the growth is one per ``retry-after`` (the server said when
      its next request frees; at most ``FIRST_GROWTH``), doubling every ``doubling`` s (two round trips: slow start)
      until the next 429. At a later one: ``RATE_MARGIN`` x how fast what the server held of ours grew from the 429
      before (at both it held all it had room for) -- about the rate others' requests age out of a window they
      filled, and nothing (``MIN_GROWTH``) beside a neighbour who takes all that frees, after a window filled by us
      alone, or once the window is all ours. A 429 less than ``MIN_SPAN`` s after the one before halves it.
    * **Probing up**: every ``quiet`` seconds without a 429 the growth (if tokens were taken) is raised, the k-th
      raise in a row by ``PROBE_STEP ** k``; a 429 soon after a raise doubles ``quiet`` (up to ``QUIET_MAX``): a
      limit that stays where it is costs about a 429 a minute, and one that frees is found again (from the minimum
      growth that takes minutes: benchmarks/pace_sim.py).

    A start handed out before the pace changed (``version``) is asked for again by its caller (:meth:`stale`).
    Every time is passed in: the policy has no clock of its own (benchmarks/pace_sim.py runs it on a virtual one).
    """

    RATE_MARGIN = 0.995
    WINDOW_LAG = 0.25  # a request's start here to its arrival in the server's count, at most
    DEFAULT_WINDOW = 60.0
    MIN_EVIDENCE = 10
    SHUT_FACTOR = 1.0
    FIRST_GROWTH = 10.0
    MIN_GROWTH = 1.0 / 60.0
    MIN_SPAN = 1.0
    BURST = 0.5
    QUIET = 5.0
    QUIET_MAX = 60.0
    PROBE_STEP = 1.25

    window: float = DEFAULT_WINDOW
    window_learned: bool = False  # proved by a fresh window, not the default
    cap: float | None = None  # None: nothing learned, no pacing
    growth: float = 0.0  # tokens per second (in slow start, at ``ramp_at``)
    slow_start: bool = True
    doubling: float = 0.5
    ramp_at: float = 0.0
    tokens: float = 0.0
    tokens_at: float = 0.0
    starts: deque[float] = field(default_factory=deque)  # our starts counted against the cap, in order
    dropped: Counter[float] = field(default_factory=Counter)  # starts handed out, dropped by a learning, not re-asked
    accepted: deque[float] = field(default_factory=lambda: deque(maxlen=20_000))  # starts that went through
    pending: tuple[float, float, float] | None = None  # a 429 to learn from: when, retry-after, learned from when
    last_429: float = -1e9
    last_full: tuple[float, int] | None = None  # the latest 429 learned from: when, and how many of ours were held
    paced_since: float = 0.0  # the first learning: what went before it was not paced
    learned_at: float = -1e9
    quiet: float = QUIET
    raised_at: float = -1e9
    version: int = 0  # the pace's changes (learned, raised)
    raises: int = 0  # raises since the latest 429 learned from
    taken: int = 0  # tokens taken since the latest raise

    def refused(self, now: float, retry_after: float, quiet_until: float, learn: bool, settle: float = 0.0) -> None:
        """A 429 at ``now`` asked for ``retry_after`` s of quiet (until ``quiet_until``, for everyone); it is learned
        from once that is over and the requests in flight have come back (``settle`` s, about two round trips)."""
        self.last_429 = now
        if not learn or self.pending is not None or now < self.learned_at + settle:
            return  # (a request started at the pace before the latest learning: nothing new to learn)
        self.pending = (now, retry_after, max(quiet_until, now + settle))
        self.doubling = max(0.2, settle)

    def schedule(self, start: float, now: float, quiet_until: float) -> float:
        """The start it allows for a request that may start at ``start`` (counted as started)."""
        self._tick(now)
        if self.pending is not None:
            # after a 429, nobody starts before what it says is learned (the requests in flight back): at the pace
            # it refused, more would meet the same wall
            start = max(start, self.pending[2])
        if self.cap is None:
            return start
        return self._window_start(start)

    def stale(self, start: float, version: int, now: float) -> bool:
        """Whether a start handed out at the pace's ``version`` was handed out at a pace that changed since, or is
        due before a 429 is learned from (then it no longer counts, and its caller asks :meth:`schedule` again);
        asked by a caller waiting for it."""
        self._tick(now)
        if version == self.version and (self.pending is None or start >= self.pending[2]):
            return False  # (a start due before a 429 is learned from would meet its wall: asked again, and held)
        if self.dropped[start] > 0:  # dropped by a learning (another start may hold the same time: not that one)
            self.dropped[start] -= 1
        else:
            try:
                self.starts.remove(start)
            except ValueError:
                pass
        return True

    def span(self) -> float:
        """The window our starts are counted over: the server's, and the lag of a start's arrival in its count."""
        return self.window + self.WINDOW_LAG

    # -- the growth's tokens

    def _rate(self, t: float) -> float:
        if not self.slow_start:
            return self.growth
        return self.growth * 2.0 ** min(60.0, max(0.0, t - self.ramp_at) / self.doubling)

    def _accrued(self, t0: float, t1: float) -> float:
        if t1 <= t0:
            return 0.0
        if not self.slow_start:
            return self.growth * (t1 - t0)
        return (self._rate(t1) - self._rate(t0)) * self.doubling / math.log(2)

    def _tokens(self, t: float) -> float:
        return min(max(1.0, self.BURST * self._rate(t)), self.tokens + self._accrued(self.tokens_at, t))

    def _token_at(self, t: float) -> float:
        """When, from ``t`` on, a whole token is there."""
        need = 1.0 - self._tokens(t)
        if need <= 0:
            return t
        if self.growth <= 0:
            return math.inf
        if not self.slow_start:
            return t + need / self.growth
        # the rate doubles every ``doubling`` s: solve the accrual for ``need``
        r0 = self._rate(t)
        return t + self.doubling * math.log2(1.0 + need * math.log(2) / (r0 * self.doubling))

    def _window_start(self, earliest: float) -> float:
        """The first start at or after ``earliest`` that keeps every :meth:`span` seconds within the cap,
        or else takes a token (starts are handed out in order)."""
        span = self.span()
        starts = self.starts
        while starts and starts[0] <= earliest - span:
            starts.popleft()  # out of every window a start from now on can be in
        t = max(earliest, starts[-1]) if starts else earliest
        first = 0  # the oldest start still in the window that ends at t
        cap = self.cap or 0.0
        while True:
            while first < len(starts) and starts[first] <= t - span:
                first += 1
            if len(starts) - first + 1 <= cap + 1e-9:
                break  # room in the cap (ours ageing out of the server's window)
            if self._tokens(t) >= 1.0 - 1e-9:  # beyond it: a token, and the cap is one more
                self.tokens, self.tokens_at = self._tokens(t) - 1.0, t
                self.cap = cap = cap + 1.0
                self.taken += 1
                break
            ages = starts[first] + span if first < len(starts) else math.inf
            t = max(t + 1e-9, min(ages, self._token_at(t)))  # (never standing still, whatever the rounding)
        starts.append(t)
        return t

    # -- learning from a 429

    def _tick(self, now: float) -> None:
        """A 429 whose time has come is learned from; a quiet spell raises the growth."""
        if self.pending is not None and now >= self.pending[2]:
            at, retry_after, _ = self.pending
            self.pending = None
            self._learn(at, retry_after, now)
        if (self.cap is not None and not self.slow_start and self.pending is None and self.taken
                and now - self.last_429 >= self.quiet and now - self.raised_at >= self.quiet):
            self.taken = 0  # (only a growth put to the test is raised: one nobody asked for proves nothing)
            self.tokens, self.tokens_at = self._tokens(now), now
            self.raises += 1  # the k-th raise in a row without a 429 multiplies by PROBE_STEP ** k
            self.growth *= self.PROBE_STEP ** self.raises
            self.raised_at = now
            self.version += 1

    def _learn(self, at: float, retry_after: float, now: float) -> None:
        window = self.window
        held = sorted(t for t in self.accepted if at - window < t <= at)
        first = self.cap is None
        if self.window_learned and self.cap is not None and len(held) < 0.5 * self.cap:
            # refused with much less of ours in the window than it held before: it was not ours alone (a neighbour
            # filled it too), or it is longer -- back to the default
            self.window = window = self.DEFAULT_WINDOW
            self.window_learned = False
            held = sorted(t for t in self.accepted if at - window < t <= at)
        episode = held if first else [t for t in held if t >= self.paced_since]
        filled = at - episode[0] if episode else 0.0
        filled_by_us = (retry_after >= self.SHUT_FACTOR * filled and len(episode) >= self.MIN_EVIDENCE
                        and filled + retry_after >= 1.0)  # a fresh window filled by us, then kept shut
        if filled_by_us and filled + retry_after < 0.5 * self.DEFAULT_WINDOW:
            # (a span near the default's is the default's, part of it filled before our first request: by another
            # process of the job, or someone else on the key)
            self.window = window = filled + retry_after
            self.window_learned = True
            held = [t for t in held if at - window < t]
        if first:
            self.paced_since = at
        if filled_by_us:  # nothing frees before ours age out
            self.growth, self.slow_start = self.MIN_GROWTH, False
        elif first and len(held) < self.MIN_EVIDENCE:  # a window of others': its next request frees in
            # ``retry_after`` s, so from one per that, doubling
            self.growth = min(self.FIRST_GROWTH, max(self.MIN_GROWTH, 1.0 / max(retry_after, 1e-3)))
        elif first:  # much of ours in it: what frees next may be someone else's again, or a bucket's; from little
            self.growth = self.MIN_GROWTH
        else:
            # at each 429 the server held all of ours it had room for: how much that grew from one 429 to the next
            # is how fast its room for us grows
            since, before = self.last_full or (self.paced_since, len(held))
            if at - since >= self.MIN_SPAN:
                self.growth = max(self.MIN_GROWTH, self.RATE_MARGIN * max(0, len(held) - before) / (at - since))
            else:  # refused again right after: too fast, whatever was measured
                self.growth = max(self.MIN_GROWTH, self._rate(at) / 2.0)
            if not self.slow_start and self.raised_at > since and at - self.raised_at < self.quiet:
                self.quiet = min(self.QUIET_MAX, 2.0 * self.quiet)  # the last raise was refused: probe less often
            self.slow_start = False
        self.last_full, self.raises = (at, len(held)), 0
        self.cap = max(1.0, self.RATE_MARGIN * len(held))
        self.ramp_at = self.tokens_at = now
        self.tokens = 0.0
        # from here every start counts: the accepted ones in the window, and those started after the 429 (a start
        # still to come was handed out at the pace before: its caller asks again)
        span = self.span()
        self.dropped = Counter({t: n for t, n in self.dropped.items() if n > 0 and t > now - span})
        self.dropped.update(t for t in self.starts if t > now)
        self.starts = deque(sorted([t for t in held if t > now - span] + [t for t in self.starts if at < t <= now]))
        self.learned_at = now
        self.version += 1


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
