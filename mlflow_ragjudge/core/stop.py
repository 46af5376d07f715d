"""Stopping an evaluation on request (Ctrl-C, SIGTERM) without losing what was paid for.

One process-wide flag, and a count of the stops requested so far. The first SIGINT or SIGTERM sets it: the judge
client sends no new request (a call that would start fails ``interrupted``), the replies already in flight are
awaited for a grace period (:func:`grace_seconds`, ``RAGJUDGE_STOP_GRACE``, default 10 s) and cached as they arrive,
and the evaluation ends with what is done -- logged, its run marked KILLED, with a line on how to resume. A second
SIGINT exits at once.

The flag is cleared when the stopped evaluation returns, so that later work starts afresh; what belonged to the
stopped one -- a worker thread, a judge call waiting for a cool-down -- knows it by the count (:func:`stop_epoch`,
:func:`stopped_since`): it sends nothing after the evaluation has returned, whenever its wait ends.

Standard library only: the floor of the package (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future

ENV_STOP_GRACE = "RAGJUDGE_STOP_GRACE"
#: the exit status of a process stopped by a signal, by the shell's convention (128 + the signal's number)
EXIT_SIGNAL = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM}

_EVENT = threading.Event()
_LOCK = threading.Lock()
_reason: str | None = None
_at: float | None = None
_depth = 0  # nested stop_on_signals (a sweep's variants): only the outermost installs the handlers
_stops = 0  # stops requested in this process so far
_SCOPE = threading.local()  # the epoch of the run a thread works for (stop_scope)
#: the longest a wait that must notice a stop already cleared (stopped_since) sleeps before it looks again
POLL = 0.25
_installed = False  # the outermost installed them (it runs in the main thread)


def request_stop(reason: str = "stop requested") -> None:
    """Ask every running evaluation of this process to stop sending and finish with what it has."""
    global _reason, _at, _stops
    with _LOCK:
        if not _EVENT.is_set():
            _reason, _at = reason, time.monotonic()
            _stops += 1
            _EVENT.set()


def stop_requested() -> bool:
    return _EVENT.is_set()


def stop_epoch() -> int:
    """What :func:`stopped_since` compares with: the epoch of the run this thread works for (:func:`stop_scope`),
    else the number of stops requested so far."""
    bound = getattr(_SCOPE, "epoch", None)
    return _stops if bound is None else bound


def stopped_since(epoch: int) -> bool:
    """Whether a stop was requested since ``epoch`` (a :func:`stop_epoch`) -- still true once the stopped evaluation
    has returned and cleared the flag -- or is requested now."""
    return _EVENT.is_set() or _stops != epoch


@contextlib.contextmanager
def stop_scope(epoch: int) -> Iterator[None]:
    """Work on this thread inside the block belongs to a run that started at ``epoch`` (:func:`stop_epoch` gives it):
    a stop of that run stops it even after the run has returned and the flag was cleared."""
    before = getattr(_SCOPE, "epoch", None)
    _SCOPE.epoch = epoch
    try:
        yield
    finally:
        _SCOPE.epoch = before


def stop_reason() -> str | None:
    """The signal's name (``SIGINT``, ``SIGTERM``) or the reason given to :func:`request_stop`; None if none."""
    return _reason if _EVENT.is_set() else None


def clear_stop() -> None:
    global _reason, _at
    with _LOCK:
        _EVENT.clear()
        _reason = _at = None


def grace_seconds() -> float:
    """How long replies already in flight are awaited after a stop (``RAGJUDGE_STOP_GRACE``, default 10 s)."""
    raw = os.environ.get(ENV_STOP_GRACE, "10")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_STOP_GRACE}={raw!r} is not a number of seconds; set it like 10 or 2.5.") from None
    return max(0.0, value)


def grace_left() -> float:
    """Seconds of the grace period left since the stop (the full period if no stop was requested)."""
    with _LOCK:
        at = _at
    if at is None:
        return grace_seconds()
    return max(0.0, grace_seconds() - (time.monotonic() - at))


def wait_for_stop(seconds: float, since: int | None = None) -> bool:
    """Sleep up to ``seconds``, waking early on a stop; True when a stop was requested (with ``since``, a
    :func:`stop_epoch`: any stop since then, even one already cleared). Any length is safe (a timer's upper limit is
    never met)."""
    end = time.monotonic() + min(max(0.0, seconds), 1e9)
    while True:
        if since is not None and stopped_since(since):
            return True
        left = end - time.monotonic()
        if left <= 0:
            return _EVENT.is_set()
        if _EVENT.wait(min(left, POLL if since is not None else 3600.0)):
            return True


def await_until_stopped(futures: Iterable[Future]) -> set[Future]:  # type: ignore[type-arg]
    """Wait for every future, re-raising what a finished one raised; returns the ones that did not finish: none
    unless a stop was requested -- then those not started are cancelled and the running ones awaited for the
    grace period, no longer (a pool holding them must be shut down with ``wait=False``)."""
    futures = list(futures)
    # Each future hands itself over as it finishes (cancelled ones too): one queue read per future. Waiting with
    # concurrent.futures.wait(FIRST_COMPLETED) instead installs and removes a waiter on every pending future at each
    # completion -- quadratic, and a tenth of a large judged run's CPU.
    finished: queue.SimpleQueue[Future] = queue.SimpleQueue()  # type: ignore[type-arg]
    for f in futures:
        f.add_done_callback(finished.put)
    left = len(futures)
    cancelled = False
    while left:
        try:
            f = finished.get(timeout=0.25)
        except queue.Empty:
            pass
        else:
            left -= 1
            if not f.cancelled():
                f.result()
        if stop_requested():
            if not cancelled:
                for g in futures:
                    g.cancel()  # not started: never will be (a running or finished one stays as it is)
                cancelled = True
            if grace_left() <= 0:
                break
    return {f for f in futures if f.cancelled() or not f.done()}


def _say(text: str) -> None:
    """A line on stderr; a closed or broken stderr never stops the stop."""
    with contextlib.suppress(Exception):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _handler(signum: int, frame: object) -> None:  # noqa: ARG001
    name = signal.Signals(signum).name
    if _EVENT.is_set():
        if signum == signal.SIGINT:
            _say(f"ragjudge: second {name}: exiting now (replies not yet received are lost; the cache keeps "
                 "every reply that arrived).")
            os._exit(EXIT_SIGNAL["SIGINT"])
        return  # a repeated SIGTERM: the stop is under way
    request_stop(name)
    _say(f"ragjudge: {name} received: no new judge requests; waiting up to {grace_seconds():g} s for the replies "
         "in flight, then saving and logging what is done. Press Ctrl-C again to exit at once.")


def reclaim_signals() -> None:
    """Inside :func:`stop_on_signals` (in the main thread): put its handlers back where a library replaced them since
    -- PySpark's SparkContext installs its own SIGINT handler when it starts (it cancels every job and raises
    KeyboardInterrupt). The handlers in place before the outermost scope are still the ones given back at its end."""
    with _LOCK:
        installed = _installed
    if not installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(sig) is not _handler:
                signal.signal(sig, _handler)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside: SIGINT and SIGTERM request a stop instead of killing the process (in the main thread only;
    elsewhere, or nested, it does nothing). The outermost one clears the flag on entry and on exit: what was
    stopped says so in its result (an evaluation's ``config["interrupted"]``), and later work starts afresh."""
    global _depth, _installed
    main = threading.current_thread() is threading.main_thread()
    with _LOCK:
        outer = _depth == 0
        _depth += 1
    previous: dict[int, object] = {}
    try:
        if outer:
            clear_stop()
            if main:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    with contextlib.suppress(ValueError, OSError):
                        previous[sig] = signal.signal(sig, _handler)
                _installed = bool(previous)
        yield
    finally:
        if outer and main:
            _installed = False
        for signum, old in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, old)  # type: ignore[arg-type]
        with _LOCK:
            _depth -= 1
            last = _depth == 0
        if outer and last:
            clear_stop()
