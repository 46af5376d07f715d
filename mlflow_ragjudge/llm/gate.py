"""The process-wide gate of each provider connection (provider + base URL): shared by every client in the process
that talks to it, and thread-safe, because MLflow calls scorers from thread pools. It composes the pacing policies
of :mod:`~mlflow_ragjudge.llm.pacing` under one lock; the design note and the table of the policies are in
docs/architecture.md, "Tour 3: the client's pacing"."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .backends import Backend, resolve_backend
from .backends._sdk import parse_retry_after
from .backends.base import BackendError, ErrorKind, RateInfo, clamp_count, clamp_seconds
from .pacing import (
    ENV_TAIL_TIMEOUT_FLOOR,
    AnnouncedBudget,
    AnnouncedTokens,
    Concurrency,
    CoolDown,
    Latency,
    LearnedPace,
    RequestsPerMinute,
    Rounds,
)
from .shared_pace import shared_pace as open_shared_pace

__all__ = ["ProviderGate", "Ticket", "gate_for", "configure_provider", "ENV_MAX_CONCURRENCY",
           "ENV_TAIL_TIMEOUT_FLOOR"]

ENV_MAX_CONCURRENCY = "RAGJUDGE_MAX_CONCURRENCY"


@dataclass(frozen=True)
class Ticket:
    """A request's start: its place among the connection's starts, and the seconds it waited for them."""

    seq: int
    waited: float


class _Via:
    """A policy's field read (and written) as the gate's own: ``gate.limit`` is ``gate.concurrency.limit``."""

    def __init__(self, policy: str, name: str) -> None:
        self.policy, self.name = policy, name

    def __get__(self, gate: Any, owner: Any = None) -> Any:
        return self if gate is None else getattr(getattr(gate, self.policy), self.name)

    def __set__(self, gate: Any, value: Any) -> None:
        setattr(getattr(gate, self.policy), self.name, value)


class ProviderGate:
    """Concurrency limit and request pacing for one provider connection, shared by every client in the process.

    A request's start (:meth:`acquire`) asks, in order: a free slot (:class:`~.pacing.Concurrency`); the end of a
    cool-down (:class:`~.pacing.CoolDown`) and a request left in the announced budget
    (:class:`~.pacing.AnnouncedBudget`), waited for on the lock's conditions; then the start time the learned pace
    (:class:`~.pacing.LearnedPace`) and ``requests_per_minute`` (:class:`~.pacing.RequestsPerMinute`) allow, slept
    after the lock is released. A reply (:meth:`observe`, :meth:`succeeded`, :meth:`throttled`, :meth:`cool_down`)
    is handed to the policy that reacts to it. :class:`~.pacing.Latency` gives the round trip and the tail timeout.
    """

    ADAPTIVE_START = Concurrency.ADAPTIVE_START
    ADAPTIVE_MAX = Concurrency.ADAPTIVE_MAX
    WINDOW_LAG = LearnedPace.WINDOW_LAG
    MIN_OBSERVATIONS = Latency.MIN_OBSERVATIONS
    MIN_ADAPTIVE_TIMEOUT = Latency.MIN_ADAPTIVE_TIMEOUT

    def __init__(self, limit: int | None = None, requests_per_minute: float | None = None) -> None:
        self._lock = threading.Lock()
        self._slot = threading.Condition(self._lock)  # waiting for a free slot
        self._quiet = threading.Condition(self._lock)  # waiting for the budget or the end of a cool-down
        self.starts = 0  # requests started on this connection (a request's ``Ticket.seq``)
        self.concurrency = Concurrency.of(limit)
        self.budget = AnnouncedBudget()
        self.tokens = AnnouncedTokens()
        self.cooldown = CoolDown()
        self.learned = LearnedPace()
        self.rpm = RequestsPerMinute(requests_per_minute)
        self.latency = Latency()

    # the policies' fields the rest of the package (and its tests) read as the gate's
    limit, ceiling, fixed = _Via("concurrency", "limit"), _Via("concurrency", "ceiling"), _Via("concurrency", "fixed")
    active, peak = _Via("concurrency", "active"), _Via("concurrency", "peak")
    decreases = _Via("concurrency", "decreases")
    plateaus = _Via("rounds", "plateaus")
    budget_waits, announced = _Via("budget", "waits"), _Via("budget", "announced")
    learned_growth, window_cap = _Via("learned", "growth"), _Via("learned", "cap")
    requests_per_minute = _Via("rpm", "rpm")
    # ... and the tests' handles on the policies' insides
    _cooldown_until, _latencies = _Via("cooldown", "until"), _Via("latency", "seen")
    _accepted = _Via("learned", "accepted")

    @property
    def learned_window(self) -> float | None:
        """The window a 429 proved (None: the default's, :attr:`~.pacing.LearnedPace.DEFAULT_WINDOW`, or none yet)."""
        return self.learned.window if self.learned.window_learned else None

    @property
    def rounds(self) -> Rounds:
        """Slow start's rounds (part of :class:`~.pacing.Concurrency`)."""
        return self.concurrency.rounds

    def configure(self, limit: int | None = None, requests_per_minute: float | None = None, *,
                  shared_pace: str | Path | None = None, connection: str = "") -> None:
        """Change the limits. ``None`` leaves a setting as it is; ``requests_per_minute=0`` turns pacing off;
        ``shared_pace``: a pace file whose other users (processes) share the ``requests_per_minute`` pace of
        ``connection`` (:mod:`~mlflow_ragjudge.llm.shared_pace`)."""
        with self._lock:
            if shared_pace is not None:
                self.rpm.shared, self.rpm.connection = open_shared_pace(shared_pace), connection
            if limit is not None:
                if limit < 1:
                    raise ValueError(f"max_concurrency must be >= 1, got {limit}")
                self.limit = self.ceiling = limit
                self.fixed = True
            if requests_per_minute is not None:
                if requests_per_minute < 0:
                    raise ValueError(f"requests_per_minute must be >= 0 (0 = no pacing), got {requests_per_minute}")
                self.rpm.rpm = requests_per_minute or None
            self._slot.notify_all()

    #: how often a wait in the gate looks for a stop (``stopped``)
    POLL = 0.25
    #: how long a request waiting for its start sleeps before it asks whether the learned pace changed
    RECHECK = 1.0

    def acquire(self, sleep: Callable[[float], None] = time.sleep, *, deadline: float | None = None,
                stopped: Callable[[], bool] | None = None, tokens: int = 0) -> Ticket:
        """Take a slot and start a request (of an estimated ``tokens`` prompt tokens, for an announced token budget);
        its ticket holds the seconds spent waiting for the announced budgets, a cool-down or the pace.

        The waits for the server's word follow one rule (docs/failure-modes.md): one that would end past
        ``deadline`` (the call's retry budget, a ``time.monotonic()`` time) raises :class:`BackendError`
        (``RATE_LIMITED``, saying why) now, with nothing started -- a cool-down at once; an announced budget of 0 at
        once when no request in flight can bring a fresher count, else at the deadline. ``stopped`` is asked while
        waiting (every ``POLL`` s): True raises ``INTERRUPTED``."""
        quiet_wait = 0.0
        with self._lock:
            while True:
                if stopped is not None and stopped():
                    raise BackendError(ErrorKind.INTERRUPTED, "not sent: the evaluation was stopped")
                if self.concurrency.active >= self.concurrency.allows(time.monotonic()):
                    opening = not self.concurrency.opened
                    self._slot.wait(self.POLL if stopped is not None or opening else None)
                    continue
                now = time.monotonic()  # a cool-down is waited out before the request counts as started
                self._adopt_shared_quiet(now)
                cost = self.tokens.cost(tokens)
                cool = self.cooldown.until
                hold = max(self.budget.hold_until(now), self.tokens.hold_until(now, cost))
                until = max(cool, hold)
                if now >= until:
                    break
                if deadline is not None and until > deadline and (
                        cool > deadline or self.concurrency.active == 0 or now >= deadline):
                    raise BackendError(ErrorKind.RATE_LIMITED, _past_budget(cool, hold, now), retry_after=until - now)
                if not quiet_wait and self.budget.exhausted():
                    self.budget.waits += 1
                elif not quiet_wait and hold > cool:
                    self.tokens.waits += 1
                end = until if deadline is None else min(until, max(deadline, now))
                self._quiet.wait(timeout=min(end - now, self.POLL))
                quiet_wait += time.monotonic() - now
            probe = self.budget.exhausted()  # past the announced reset: this request learns the new budget
            self.concurrency.enter()
            self.starts += 1
            now = time.monotonic()
            if probe:  # the others wait for its reply (or, if it never brings one, a few round trips)
                self.budget.send_probe(self.starts, now + max(1.0, 4.0 * self.latency.median()))
            else:
                self.budget.spend()
            self.tokens.spend(self.starts, self.tokens.cost(tokens))
            learned = self.learned.schedule(max(now, self.cooldown.until), now, self.cooldown.until)
            version = self.learned.version
            start, seq = self.rpm.schedule(learned), self.starts
            spaced = start if start > learned else 0.0  # the requests_per_minute slot, when it is the later
        waited = 0.0
        while True:  # asleep a RECHECK at most: a start handed out at a pace learned anew since is asked again
            wait = start - time.monotonic()
            if wait > 0:
                sleep(min(wait, self.RECHECK))
                waited += min(wait, self.RECHECK)
            with self._lock:
                now = time.monotonic()
                if self.learned.stale(learned, version, now):
                    learned = self.learned.schedule(max(now, self.cooldown.until), now, self.cooldown.until)
                    version, start = self.learned.version, max(learned, spaced)
                    continue
            if wait <= self.RECHECK:
                break
        return Ticket(seq, waited + quiet_wait)

    def release(self) -> None:
        with self._lock:
            self.concurrency.active -= 1
            if not self.concurrency.opened:  # the first request came back: the others may go
                self.concurrency.opened = True
                self._slot.notify_all()
            else:
                self._slot.notify()

    def cool_down(self, seconds: float) -> None:
        """A 429 asked for ``seconds`` of quiet: everyone waits, then requests start at the learned pace; with a pace
        file, every other process that opens it is told (:meth:`~.shared_pace.SharedPace.share_quiet`)."""
        seconds = clamp_seconds(seconds) or 0.0  # (whatever a backend reports: never past MAX_HEADER_SECONDS)
        with self._lock:
            now = time.monotonic()
            self._quiet_for(now, now + seconds)
            until = self.cooldown.until
        shared = self.rpm.shared
        if shared is not None and seconds > 0:
            shared.share_quiet(self.rpm.connection, until + (time.time() - time.monotonic()))

    def _quiet_for(self, now: float, until: float) -> None:
        """Quiet until ``until`` (a 429's, or another process's read from the pace file), learned from."""
        self.cooldown.until = max(self.cooldown.until, until)
        self.budget.probe = None  # a refused probe: the cool-down says when to try again
        # a server that announces its budget is followed by that, not a guess
        settle = 2.0 * self.latency.median() if self.latency.seen else 0.5  # the requests in flight back
        self.learned.refused(now, until - now, self.cooldown.until, learn=not self.budget.announced,
                             settle=min(5.0, settle))

    def _adopt_shared_quiet(self, now: float) -> None:
        """Another process's 429, read from the pace file: waited out here too, and learned from as our own."""
        shared = self.rpm.shared
        if shared is None:
            return
        offset = time.time() - now
        until = shared.quiet_until(self.rpm.connection, now + offset)
        if until is not None and until - offset > max(now, self.cooldown.until) + 1e-3:
            self._quiet_for(now, until - offset)

    def cooling_down(self) -> float:
        """Seconds left of the quiet a 429 asked for (0 when none)."""
        return self.cooldown.left()

    def before_wire(self) -> None:
        """A started request is about to leave (:class:`~.backends.base.WireWatch`): held back when a 429 asked for
        quiet since it started. Under many threads a request can wait long for the CPU between its start and the
        wire; without this, every request started before the first 429 came back would meet the same wall (with a
        pace file: another process's 429 too)."""
        if self.rpm.shared is not None:
            with self._lock:
                self._adopt_shared_quiet(time.monotonic())
        wait = self.cooldown.left()
        if wait > 0:
            raise BackendError(ErrorKind.HELD, "held back before sending: the server asked for quiet", retry_after=wait)

    def on_reply(self, status: int, headers: Any) -> None:
        """A reply's status and headers as they arrive: a 429 that says when to come back starts the cool-down at
        once, before the SDK has read its body and the retry layer has seen its exception."""
        if status == 429:
            seconds = parse_retry_after(headers)
            if seconds is not None:
                self.cool_down(seconds)

    def observe(self, seconds: float, rate: RateInfo | None = None, started_after: int | None = None,
                tokens: tuple[int, int] | None = None) -> None:
        """Record a successful request's latency and when it went through; ``rate`` is what its reply's headers
        announced, ``started_after`` the connection's start count when it started (its ``Ticket.seq``), ``tokens``
        its prompt's (estimated, counted by the server) tokens."""
        with self._lock:
            now = time.monotonic()
            if tokens is not None:
                self.tokens.counted(*tokens)
            self.latency.seen.append(seconds)
            self.learned.accepted.append(now - seconds)
            # (clamped again: whatever a backend reports, no count or reset can overflow the waits)
            remaining = clamp_count(rate.remaining) if rate is not None else None
            if rate is not None and remaining is not None:
                # every other request in flight may not be counted yet: those started after this one, and those
                # started before it that a busy client has not put on the wire yet
                since = self.starts - started_after if started_after is not None else 0
                uncounted = max(since, self.concurrency.active - 1)
                shared = self.rpm.shared  # (a key's budget, spent by every process of the pace file: our part)
                users = shared.users(self.rpm.connection, time.time()) if shared is not None else 1
                self.budget.announce(remaining // users, clamp_seconds(rate.reset), now, started_after, uncounted)
                self._quiet.notify_all()
            tokens_left = clamp_count(rate.tokens_remaining) if rate is not None else None
            if rate is not None and tokens_left is not None:
                self.tokens.announce(tokens_left, clamp_count(rate.tokens_limit), clamp_seconds(rate.tokens_reset),
                                     now, started_after, self.concurrency.active - 1)
                self._quiet.notify_all()
            if remaining is None and started_after is not None and started_after == self.budget.probe:
                # the request sent to learn the new budget came back without one: the server announces none any
                # more (or none that can be read); nobody waits for a count that will not come
                self.budget.left = self.budget.probe = None
                self._quiet.notify_all()

    def adaptive_timeout(self, timeout: float) -> float:
        """The timeout for a request's first attempt (:meth:`~.pacing.Latency.tail_timeout`)."""
        with self._lock:
            seen = sorted(self.latency.seen)
        return Latency.tail_of(seen, timeout)

    def calibrated(self) -> bool:
        """Whether enough replies were seen for :meth:`adaptive_timeout` to know this server's usual latency."""
        with self._lock:
            return self.latency.calibrated()

    def succeeded(self) -> None:
        """A request went through: an adaptive limit grows (:class:`~.pacing.Concurrency`)."""
        with self._lock:
            if self.concurrency.succeeded():
                self._slot.notify_all()

    def throttled(self) -> None:
        """The server said no (429) without saying when to come back: an adaptive limit halves, at most once per
        round trip."""
        with self._lock:
            self.concurrency.throttled(min(5.0, max(0.05, self.latency.median())))



def _past_budget(cool: float, hold: float, now: float) -> str:
    """Why a call is not sent: the server's word outlasts its retry budget."""
    if cool >= hold:
        what = f"the server asked for quiet (retry-after) for {cool - now:.0f} s more"
    else:
        what = (f"the server announced no request (or too few tokens) left in its budget until its reset in "
                f"{hold - now:.0f} s")
    return f"{what}, past this call's retry budget: not sent"


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
                       requests_per_minute: float | None = None,
                       shared_pace: str | Path | None = None) -> ProviderGate:
    """Set a provider connection's process-wide limits explicitly: ``max_concurrency`` requests in flight
    (instead of the adaptive limit) and ``requests_per_minute`` pacing (0 turns it off). Every client of the
    connection in this process is bound by them; with ``shared_pace`` (a pace file), every process that names the
    same file shares the pace (:mod:`~mlflow_ragjudge.llm.shared_pace`)."""
    key = resolve_backend(judge).connection_key()
    gate = gate_for(key)
    gate.configure(max_concurrency, requests_per_minute, shared_pace=shared_pace, connection=key)
    return gate
