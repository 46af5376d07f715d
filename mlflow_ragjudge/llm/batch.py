"""Judge calls through the provider's batch API (OpenAI Batch API, Anthropic Message Batches), round by round.

Metrics are written as plain code that calls the judge and waits for the reply. With ``batch`` on, the judge
client does not send a call: it hands the request to a :class:`BatchRunner` and the calling task waits. When every
running task is waiting for a reply (the run is *quiescent*), the runner sends all the waiting requests as one
batch (split at the provider's limits), polls it with backoff, and wakes each task with its reply. The tasks go
on, and the calls that needed those replies (claims, then verdicts; statements, then attribution; a re-ask) wait
for the next batch: **rounds** come from the metrics' own order, with no metric written for batches.

* The request body of a line is the one the synchronous path would send (:meth:`Backend.batch_line`), and its
  reply is parsed by the same code, then cached, accounted and transcribed by the one client path.
* Cache hits never reach the runner; identical calls in flight are one line.
* A line that errors with a retryable reason (5xx, 429, expired, cancelled, missing from the results, a result line
  that cannot be read) goes into the next round, at most ``max_rounds`` times; a permanent error (a bad request)
  fails its call at once, with the provider's message: the row is recorded as failed and the run goes on.
* Results are read line by line: one unreadable line costs its own call, never the batch's other replies. A reply
  and an error for the same ``custom_id`` keep the reply.
* Every submitted batch is recorded with the cache keys of its lines in the cache database
  (:meth:`CallCache.record_batch`) before anything waits on it. A call whose key is in a pending batch
  re-attaches to that batch instead of being submitted again: a killed run's re-run pays for nothing twice. A
  re-attached batch the provider no longer has (404) is marked ``gone`` and its calls are submitted again, without
  using up a round.
* Progress lines never stop work (a write that fails is dropped), and the coordinator thread never dies silently:
  whatever stops it fails every call still waiting, with the reason, and the next call starts a new coordinator.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.stop import stop_epoch, stop_reason, stopped_since
from .backends import Backend, BackendError, ChatRequest, ChatResponse, ErrorKind
from .cache import CallCache
from .sender import Sender, Usage

__all__ = ["BatchRunner", "BatchOptions", "BATCH_OPTION_KEYS"]

#: what the ``batch`` setting may hold besides True / False
BATCH_OPTION_KEYS = ("poll_interval", "max_poll_interval", "max_rounds", "max_wait", "max_requests", "max_bytes",
                     "threads", "progress")


@dataclass
class BatchOptions:
    """Settings of a batch run (``evaluator_config["batch"] = {...}``).

    Attributes:
        poll_interval: seconds before the first poll of a batch; later polls back off by 1.5x.
        max_poll_interval: the longest wait between two polls.
        max_rounds: how many times one call may be put in a batch (a line that expired, was cancelled or failed
            with a retryable error goes into the next round); then its row fails with the reason.
        max_wait: seconds to wait for one batch before cancelling it and failing (or retrying) its lines; default
            just over the providers' 24-hour completion window.
        max_requests, max_bytes: split batches below these (default: the provider's documented limits).
        threads: tasks run at once in a batch run (every running task can add a line to the next batch).
        progress: print each batch's state and counts while polling (default True).
    """

    poll_interval: float = 10.0
    max_poll_interval: float = 120.0
    max_rounds: int = 3
    max_wait: float = 25 * 3600.0
    max_requests: int | None = None
    max_bytes: int | None = None
    threads: int = 2048
    progress: bool = True

    @classmethod
    def of(cls, setting: Any) -> BatchOptions:
        if isinstance(setting, BatchOptions):
            return setting
        if setting is True:
            return cls()
        if isinstance(setting, dict):
            unknown = sorted(set(setting) - set(BATCH_OPTION_KEYS))
            if unknown:
                raise ValueError(f"batch has unknown option(s) {unknown}; valid: {', '.join(BATCH_OPTION_KEYS)}")
            return cls(**setting)
        raise ValueError(f"batch={setting!r} must be True, False or a dict of options ({', '.join(BATCH_OPTION_KEYS)})")


@dataclass
class _Line:
    key: str
    request: ChatRequest
    body: dict[str, Any] | None
    mode: str | None
    batch_id: str | None = None
    response: ChatResponse | None = None
    error: BackendError | None = None
    done: bool = False
    gone: bool = False  # re-attached to a batch the provider no longer has: submit it again, in the same round
    followers: list[_Line] = field(default_factory=list)


@dataclass
class _Batch:
    batch_id: str
    lines: dict[str, list[_Line]]  # custom id (cache key) -> the lines waiting on it
    submitted: float
    next_poll: float
    interval: float
    attached: bool = False
    last_status: str = ""
    read_failures: int = 0  # polls whose results could not be downloaded


class BatchRunner:
    """Collects a client's calls into provider batches (see the module docstring).

    Tasks that may call the judge run inside :meth:`task`; the client's synchronous send is replaced by
    :meth:`chat`. :meth:`close` stops the coordinator once nothing is waiting.

    Args:
        backend: the provider (it must support batches).
        sender: how the runner's own requests (submit, poll, read results) go out: the client's gate and retries.
        cache: where submitted batches are recorded for re-attachment (None: no cache, no re-attachment).
        usage: the client's counters (``batches``, ``batch_lines``).
        options: the batch settings.
        progress: where progress lines go (default: stderr when ``options.progress``).
    """

    def __init__(self, backend: Backend, sender: Sender, cache: CallCache | None, usage: Usage,
                 options: BatchOptions | None = None, progress: Callable[[str], None] | None = None) -> None:
        self.sender = sender
        self.cache = cache
        self.usage = usage
        self.backend = backend
        self.options = options or BatchOptions()
        if not self.backend.supports_batch:
            raise ValueError(f"batch: the {self.backend.provider} backend has no batch API; batch works with OpenAI "
                             "(openai:/...) and Anthropic (anthropic:/...) judges")
        self.connection = self.backend.connection_key()
        self._progress = progress if progress is not None else (_stderr if self.options.progress else None)
        self._cond = threading.Condition()
        self._active = 0  # tasks running inside task()
        self._waiting = 0  # tasks waiting for a line
        self._pending: dict[str, _Line] = {}  # key -> line not submitted yet
        self._attach: dict[str, list[_Line]] = {}  # batch id -> lines re-attached to a recorded batch
        self._inflight: dict[str, _Batch] = {}
        self._open: dict[int, _Line] = {}  # id -> every line (not a follower) not delivered yet
        self._closed = False
        self._quiet_since: float | None = None
        self._thread: threading.Thread | None = None
        self._epoch = 0  # core.stop's count when the coordinator was started (_start)
        self._local = threading.local()
        #: counters (also in the client's usage): batches submitted, lines sent, lines re-attached, rounds, polls
        self.stats = {"batches": 0, "lines": 0, "reattached_lines": 0, "reattached_batches": 0, "retried_lines": 0,
                      "rounds": 0, "polls": 0, "failed_lines": 0, "unreadable_lines": 0, "gone_batches": 0,
                      "progress_write_errors": 0, "coordinator_errors": 0}
        self.log: list[dict[str, Any]] = []  # one record per batch: id, lines, states seen, seconds

    # ------------------------------------------------------------------ tasks

    @contextlib.contextmanager
    def task(self) -> Iterator[None]:
        """Run one task (a row's metric) whose judge calls may go into batches."""
        with self._cond:
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        """The calling task waits for another task's call (an identical call in flight): it counts as waiting."""
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._waiting -= 1

    @contextlib.contextmanager
    def synchronous(self) -> Iterator[None]:
        """Calls made inside go out synchronously (multi-turn: each turn needs the last)."""
        self._local.sync = True
        try:
            yield
        finally:
            self._local.sync = False

    def wants(self) -> bool:
        """Whether a call made now from this thread goes into a batch."""
        return not getattr(self._local, "sync", False)

    # ------------------------------------------------------------------ calls

    def chat(self, request: ChatRequest, key: str) -> tuple[ChatResponse | None, int, BackendError | None, str | None]:
        """The reply to one call through batches: ``(response, rounds, error, batch id)``, like the synchronous
        path's ``(response, attempts, error, waited)``."""
        epoch = stop_epoch()  # a stop of this call's run, even once the run has returned (core.stop)
        rounds = 0
        format_changes = 0
        last: BackendError | None = None
        batch_id: str | None = None
        reattach = True
        while rounds < self.options.max_rounds:
            rounds += 1
            line = self._enqueue(key, request, reattach)
            reattach = False
            with self._cond:
                self._waiting += 1
                self._cond.notify_all()
                try:
                    while not line.done and not stopped_since(epoch):
                        self._cond.wait(timeout=1.0)
                        if not line.done:
                            self._start()  # a coordinator that stopped after this line was queued: start another
                finally:
                    self._waiting -= 1
                if not line.done:  # Ctrl-C / SIGTERM: this call stops waiting (core.stop)
                    if self._pending.get(key) is line:
                        del self._pending[key]  # never submitted: nothing was bought
                    return None, rounds, _stopped(line.batch_id), line.batch_id
            batch_id = line.batch_id
            if line.response is not None:
                return line.response, rounds, None, batch_id
            if line.gone:  # its batch no longer exists: this run never paid for it; submit it, same round
                rounds -= 1
                continue
            last = line.error or BackendError(ErrorKind.TRANSIENT, "the batch returned no result for this line")
            if last.kind is ErrorKind.FORMAT_REJECTED and format_changes < 4:
                format_changes += 1  # the backend moved to a weaker output mode: the same call, new body
                rounds -= 1
                continue
            if not last.retryable:
                break
            with self._cond:
                self.stats["retried_lines"] += 1
        with self._cond:
            self.stats["failed_lines"] += 1
        return None, rounds, last, batch_id

    def _enqueue(self, key: str, request: ChatRequest, reattach: bool) -> _Line:
        with self._cond:
            self._start()
            pending = self._pending.get(key)
            if pending is not None:  # the same call already waiting for the next batch: one line
                follower = _Line(key, request, None, pending.mode)
                pending.followers.append(follower)
                return follower
            found = self._recorded(key) if reattach else None
            if found is not None:
                batch_id, mode = found
                line = _Line(key, request, None, mode, batch_id=batch_id)
                self._attach.setdefault(batch_id, []).append(line)
                self.stats["reattached_lines"] += 1
                self._open[id(line)] = line
                return line
            body, mode = self.backend.batch_line(request)
            line = _Line(key, request, body, mode)
            self._pending[key] = line
            self._open[id(line)] = line
            return line

    def _recorded(self, key: str) -> tuple[str, str | None] | None:
        cache = self.cache
        if cache is None:
            return None
        inflight = next((b for b in self._inflight.values() if key in b.lines), None)
        if inflight is not None:
            return inflight.batch_id, inflight.lines[key][0].mode
        return cache.batch_for(key, self.connection)

    # ------------------------------------------------------------------ coordinator

    def _start(self) -> None:
        """Start the coordinator unless it runs (called with the condition held)."""
        if self._thread is None or not self._thread.is_alive():
            self._epoch = stop_epoch()  # the run of the call that starts it: a stop of that run ends it
            self._thread = threading.Thread(target=self._run, name="ragjudge-batches", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the coordinator (after every waiting call has its reply)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._cond:
            self._thread = None
        with self._cond:
            self._closed = False  # the client may be used again: a later call starts a new coordinator

    def _quiescent(self) -> bool:
        """Every running task waits for a reply: nothing more will join the next batch until one arrives."""
        return self._waiting >= self._active

    def _run(self) -> None:
        try:
            self._coordinate()
        except BaseException as e:  # whatever stops the coordinator reaches every waiting call
            self._abandon(e)

    def _abandon(self, exc: BaseException) -> None:
        """The coordinator stopped on ``exc`` (a bug of ours or of a library): fail every call still waiting with the
        reason instead of leaving its task waiting forever. Submitted batches stay recorded in the cache: a re-run
        re-attaches to them."""
        err = BackendError(ErrorKind.INTERNAL, f"the batch coordinator stopped ({type(exc).__name__}: {exc}); "
                                               "batches already submitted are kept: a re-run re-attaches to them")
        with self._cond:
            self.stats["coordinator_errors"] += 1
            lines = list(self._open.values())
            self._pending.clear()
            self._attach = {}
            self._inflight.clear()
            self.log.append({"coordinator_error": str(err)})
        for line in lines:
            self._deliver(line, error=err)

    def _coordinate(self) -> None:
        # a task that just got its reply needs a moment to reach its next call: wait that long with everyone waiting
        # before sending, so a round is one batch and not several
        settle = min(1.0, max(0.25, self.options.poll_interval / 10))
        while True:
            if stopped_since(self._epoch):
                # Ctrl-C / SIGTERM: no new batch is submitted and none is awaited; a batch already submitted goes on
                # at the provider, recorded in the cache, and a re-run re-attaches to it (nothing bought twice)
                return
            with self._cond:
                now = time.monotonic()
                ready = bool(self._pending or self._attach) and self._quiescent()
                if ready:
                    self._quiet_since = self._quiet_since or now
                else:
                    self._quiet_since = None
                if self._closed and not self._pending and not self._attach and not self._inflight:
                    return
                go = ready and self._quiet_since is not None and now - self._quiet_since >= settle
                due = [b for b in self._inflight.values() if b.next_poll <= now]
                if not go and not due:
                    waits = [b.next_poll - now for b in self._inflight.values()]
                    self._cond.wait(timeout=max(0.01, min([settle, *waits])) if ready else
                                    max(0.01, min(waits, default=1.0)))
                    continue
                if go:
                    lines = list(self._pending.values())
                    self._pending.clear()
                    attach = self._attach
                    self._attach = {}
                    self._quiet_since = None
                else:
                    lines, attach = [], {}
            if go:
                self._round(lines, attach)
            for b in due:
                self._poll(b)

    def _round(self, lines: list[_Line], attach: dict[str, list[_Line]]) -> None:
        with self._cond:
            self.stats["rounds"] += 1
        now = time.monotonic()
        for batch_id, waiting in attach.items():
            with self._cond:
                batch = self._inflight.get(batch_id)
                if batch is None:
                    batch = self._inflight[batch_id] = _Batch(batch_id, {}, now, now, self.options.poll_interval,
                                                              attached=True)
                    self.stats["reattached_batches"] += 1
                for line in waiting:
                    batch.lines.setdefault(line.key, []).append(line)
            self._say(f"batch {batch_id}: re-attached ({len(waiting)} call(s) of this run were submitted in it by an "
                      "earlier run)")
        for chunk in self._chunks(lines):
            self._submit(chunk)

    def _chunks(self, lines: list[_Line]) -> Iterator[list[_Line]]:
        max_n = self.options.max_requests or self.backend.batch_max_requests or 50_000
        max_b = self.options.max_bytes or self.backend.batch_max_bytes or 100 * 1024 * 1024
        chunk: list[_Line] = []
        size = 0
        for line in lines:
            n = len(json.dumps(line.body, ensure_ascii=False).encode("utf-8")) + len(line.key) + 100
            if chunk and (len(chunk) >= max_n or size + n > max_b * 0.95):
                yield chunk
                chunk, size = [], 0
            chunk.append(line)
            size += n
        if chunk:
            yield chunk

    def _submit(self, chunk: list[_Line]) -> None:
        payload = [(line.key, line.body or {}) for line in chunk]
        value, _, err, _ = self.sender.send(
            lambda t: self.backend.batch_submit(payload, timeout=t, metadata={"source": "mlflow-ragjudge"}))
        if value is None:
            assert err is not None
            self._say(f"a batch of {len(chunk)} call(s) could not be submitted: {err}")
            self._deliver_error(chunk, err)
            return
        batch_id = str(value)
        now = time.monotonic()
        if self.cache is not None:
            self.cache.record_batch(batch_id, self.connection, [(line.key, line.mode or "") for line in chunk],
                                           {"lines": len(chunk), "model": self.backend.model})
        with self._cond:
            for line in chunk:
                line.batch_id = batch_id
            self._inflight[batch_id] = _Batch(batch_id, {line.key: [line] for line in chunk}, now,
                                              now + self.options.poll_interval, self.options.poll_interval)
            self.stats["batches"] += 1
            self.stats["lines"] += len(chunk)
        self.usage.add(batches=1, batch_lines=len(chunk))
        self.log.append({"batch_id": batch_id, "lines": len(chunk), "submitted": time.time(), "states": []})
        self._say(f"batch {batch_id}: submitted {len(chunk)} call(s); results are expected within the provider's "
                  f"24-hour window, usually within minutes; polling from {self.options.poll_interval:g} s, backing off "
                  f"to {self.options.max_poll_interval:g} s")

    def _poll(self, batch: _Batch) -> None:
        state, _, err, _ = self.sender.send(lambda t: self.backend.batch_poll(batch.batch_id, timeout=t))
        with self._cond:
            self.stats["polls"] += 1
        now = time.monotonic()
        if state is None:
            assert err is not None
            if err.retryable:
                self._reschedule(batch, now)
            elif err.status == 404:
                self._gone(batch, err)
            else:
                self._finish(batch, error=err)  # the provider refuses to show it (another account, a revoked key)
            return
        counts = ", ".join(f"{k} {v}" for k, v in state.counts.items())
        if state.status != batch.last_status or state.ended:
            self._say(f"batch {batch.batch_id}: {state.status} ({counts})")
            batch.last_status = state.status
        for rec in self.log:
            if rec["batch_id"] == batch.batch_id:
                rec["states"].append(state.status)
        if not state.ended:
            if now - batch.submitted > self.options.max_wait:
                self._say(f"batch {batch.batch_id}: waited {self.options.max_wait:g} s; cancelling it")
                with contextlib.suppress(BackendError):
                    self.backend.batch_cancel(batch.batch_id, timeout=self.sender.timeout)
                self._finish(batch, error=BackendError(ErrorKind.TIMEOUT, f"batch {batch.batch_id} did not end in "
                                                                          f"{self.options.max_wait:g} s"))
                return
            self._reschedule(batch, now)
            return
        results, _, err, _ = self.sender.send(
            lambda t: list(self.backend.batch_results(state, timeout=t)))
        if results is None:
            assert err is not None
            if err.retryable and batch.read_failures < _READ_RETRIES:  # paid for and kept by the provider: read later
                batch.read_failures += 1
                self._say(f"batch {batch.batch_id}: its results could not be read ({err}); trying again")
                self._reschedule(batch, now)
                return
            self._finish(batch, error=BackendError(ErrorKind.TRANSIENT, f"the results of batch {batch.batch_id} "
                                                                         f"could not be read: {err}"),
                         state="ended" if err.retryable else "failed")
            return
        outcomes, unreadable = _merge_results(results)
        if unreadable:
            with self._cond:
                self.stats["unreadable_lines"] += unreadable
            self._say(f"batch {batch.batch_id}: {unreadable} result line(s) could not be read; only their call(s) "
                      "go into the next round")
        message = "; ".join(m for m in (state.message, f"{unreadable} result line(s) could not be read"
                                        if unreadable else None) if m) or None
        self._finish(batch, outcomes=outcomes, message=message)

    def _gone(self, batch: _Batch, err: BackendError) -> None:
        """The provider no longer has ``batch`` (404: deleted, past its retention, another project): its calls are
        submitted again -- for a batch an earlier run submitted, without using up one of this run's rounds."""
        with self._cond:
            self._inflight.pop(batch.batch_id, None)
            lines = [line for waiting in batch.lines.values() for line in waiting]
            self.stats["gone_batches"] += 1
        if self.cache is not None:
            self.cache.set_batch_state(batch.batch_id, "gone")
        self._say(f"batch {batch.batch_id}: the provider no longer has it ({err}); its {len(lines)} call(s) are "
                  "submitted again")
        gone = BackendError(ErrorKind.TRANSIENT, f"batch {batch.batch_id} is no longer with the provider: {err}",
                            err.status)
        for line in lines:
            self._deliver(line, error=gone, gone=batch.attached)

    def _reschedule(self, batch: _Batch, now: float) -> None:
        with self._cond:
            batch.interval = min(self.options.max_poll_interval, batch.interval * 1.5)
            batch.next_poll = now + batch.interval

    def _finish(self, batch: _Batch, *, outcomes: dict[str, dict[str, Any]] | None = None,
                error: BackendError | None = None, message: str | None = None, state: str | None = None) -> None:
        with self._cond:
            self._inflight.pop(batch.batch_id, None)
            waiting = {k: list(v) for k, v in batch.lines.items()}
        cache = self.cache
        if cache is not None:
            cache.set_batch_state(batch.batch_id, state or ("failed" if error is not None else "read"))
        for key, lines in waiting.items():
            outcome = (outcomes or {}).get(key)
            for line in lines:
                if error is not None:
                    self._deliver(line, error=error)
                elif outcome is None:
                    self._deliver(line, error=BackendError(
                        ErrorKind.TRANSIENT, f"batch {batch.batch_id} ended without a result for this call"
                        + (f" ({message})" if message else "")))
                elif "body" in outcome:
                    try:
                        response = self.backend.batch_response(line.request, line.mode or "text", outcome["body"])
                    except BackendError as e:
                        self._deliver(line, error=e)
                    except Exception as e:  # a body the SDK cannot read: that line fails, not the run
                        self._deliver(line, error=BackendError(ErrorKind.TRANSIENT, f"unreadable batch result: {e}"))
                    else:
                        self._deliver(line, response=response)
                else:
                    self._deliver(line, error=self.backend.batch_error(outcome, line.mode or "text"))

    def _deliver(self, line: _Line, *, response: ChatResponse | None = None, error: BackendError | None = None,
                 gone: bool = False) -> None:
        with self._cond:
            if line.done:
                return  # delivered already (the coordinator stopped while delivering)
            self._open.pop(id(line), None)
            for target in (line, *line.followers):
                target.response, target.error, target.batch_id, target.gone = response, error, line.batch_id, gone
                target.done = True
            self._cond.notify_all()

    def _deliver_error(self, lines: list[_Line], err: BackendError) -> None:
        for line in lines:
            self._deliver(line, error=err)

    def _say(self, message: str) -> None:
        """A progress line. Its write failing (stderr closed, a pipe whose reader left: ``... 2>&1 | head``) never
        stops work: the line is dropped and counted."""
        if self._progress is None:
            return
        try:
            self._progress(f"ragjudge: {message}")
        except Exception:  # progress is never worth a run
            with self._cond:
                self.stats["progress_write_errors"] += 1


#: polls that may fail to download an ended batch's results (each after the sender's own retries) before its calls
#: go into the next round: the results are paid for and kept by the provider, reading them again costs nothing
_READ_RETRIES = 3


def _merge_results(results: list[tuple[str | None, dict[str, Any]]]) -> tuple[dict[str, dict[str, Any]], int]:
    """Outcomes by custom id, and how many lines could not be read (with or without a custom id found in them). A
    reply wins over an error for the same id (a provider that lists a line in both its output and its error file
    served it)."""
    outcomes: dict[str, dict[str, Any]] = {}
    unreadable = 0
    for cid, outcome in results:
        if cid is None or outcome.get("code") == "batch_unreadable_line":
            unreadable += 1
        if cid is None:
            continue
        have = outcomes.get(cid)
        if have is None or ("body" in outcome and "body" not in have):
            outcomes[cid] = outcome
    return outcomes, unreadable


def _stderr(message: str) -> None:
    stream = sys.stderr
    if stream is not None:  # None: the process started with stderr closed
        print(message, file=stream, flush=True)


def _stopped(batch_id: str | None) -> BackendError:
    where = (f"; batch {batch_id} goes on at the provider and a re-run with the cache on re-attaches to it"
             if batch_id else "; it was not submitted")
    return BackendError(ErrorKind.INTERRUPTED, f"not awaited: the evaluation was stopped ({stop_reason() or 'stop'})"
                        + where)
