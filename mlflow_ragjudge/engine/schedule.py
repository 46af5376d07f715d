"""Step 3 of an evaluation: every (row, metric) task run on a set of threads, the judge client's provider gate bounding
the calls in flight -- no barrier between metrics, so a slow or hung call delays only its own row -- and one row scored
the way the ``mlflow.genai`` scorers score it too (:func:`score_row`). A metric's exception fails its row
(``internal_error``), never the run. One path for one thread (an offline run) and many (a judged run); with
``batch=True`` the tasks run inside the batch runner (:mod:`.batch_step`)."""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
from collections.abc import Callable, Sequence
from functools import partial
from itertools import repeat
from typing import Any

from ..core.matching import cut_by_sentence
from ..core.stop import grace_left, stop_epoch, stop_reason, stop_requested, stop_scope, stopped_since
from ..core.types import FailureReason, JudgeResult, Row
from ..metrics.spec import MetricSpec, RunContext
from .batch_step import BatchStep
from .collector import FREEZE_EVERY, results_kept_frozen

__all__ = ["schedule", "score_row", "by_output", "ERROR_KEY"]


def _progress_bar(total: int, desc: str, setting: bool | str) -> Any:
    """A tqdm bar on stderr (``progress='auto'``: only on a terminal), or None (also when stderr is closed)."""
    stream = sys.stderr
    if setting is False or stream is None or (setting == "auto" and not _isatty(stream)):
        return None
    from tqdm.auto import tqdm  # (here, not at the top: a run without a bar does not pay for importing it)

    try:
        return tqdm(total=total, desc=desc, unit="task", file=stream)
    except Exception:  # its first write failed: no bar, the run goes on
        return None


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (OSError, ValueError, AttributeError):  # closed, or an object without isatty
        return False


def _bar_step(bar: Any, close: bool = False) -> None:
    """Move (or close) the progress bar. Its write failing (stderr closed, a pipe whose reader left) never stops
    work: the bar is only progress."""
    if bar is None:
        return
    try:
        bar.close() if close else bar.update(1)
    except Exception:  # progress is never worth a row
        pass

ERROR_KEY = "__error__"

def _as_results(spec: MetricSpec, value: Any) -> dict[str, JudgeResult]:
    if isinstance(value, JudgeResult):
        return {spec.name: value}
    if not isinstance(value, dict) or not all(map(isinstance, value.values(), repeat(JudgeResult))):
        raise TypeError(f"metric {spec.name!r} returned {type(value).__name__}; it must return a JudgeResult "
                        "or a dict of output name -> JudgeResult")
    return value

def _crash(e: BaseException) -> dict[str, JudgeResult]:
    return {ERROR_KEY: JudgeResult.failed("internal_error", f"{type(e).__name__}: {e}")}

def _interrupted() -> dict[str, JudgeResult]:
    return {ERROR_KEY: JudgeResult.failed(
        FailureReason.INTERRUPTED, f"not judged: the evaluation was stopped ({stop_reason() or 'stop'}) first")}

#: one task of step 3: what it runs, its metric's name, its row (None: every row, a ``score_batch`` metric)
Job = tuple[Callable[[], None], str, "int | None"]


def _workers(ctx: RunContext, tasks: int) -> int:
    """Threads for the tasks: enough to keep the provider gate full while some tasks wait on earlier calls of
    their row (a task makes one to three calls in a row); the gate, not the threads, bounds what is in flight. One
    without a judge client: the offline scorers are pure Python, which threads would only slow down."""
    if ctx.client is None:
        return 1
    limit = ctx.client.max_concurrency or ctx.client.gate.ceiling
    return max(1, min(tasks, 256, max(8, 2 * limit)))


def schedule(specs: Sequence[MetricSpec], states: dict[str, Any], rows: Sequence[Row],
             ctx: RunContext) -> dict[str, list[dict[str, JudgeResult]]]:
    """Score every (row, metric); returns metric -> per-row results. Never raises for a metric's exception: it
    fails that row (``internal_error``) and the run goes on. On a stop, what was not judged fails ``interrupted``."""
    out: dict[str, list[dict[str, JudgeResult]]] = {s.name: [{} for _ in rows] for s in specs}
    per_row = [s for s in specs if s.score is not None]
    batched = [s for s in specs if s.score_batch is not None]
    names = ", ".join(s.name for s in specs)
    bar = _progress_bar(len(rows) * len(per_row) + len(batched),
                        f"ragjudge ({names})" if len(names) <= 60 else "ragjudge", ctx.cfg.progress)

    def one(spec: MetricSpec, i: int) -> None:
        try:
            out[spec.name][i] = score_row(spec, states[spec.name], rows[i], ctx)
        finally:
            _bar_step(bar)

    def whole(spec: MetricSpec) -> None:
        try:
            assert spec.score_batch is not None
            got = spec.score_batch(states[spec.name], rows, ctx)
            if len(got) != len(rows):
                raise ValueError(f"metric {spec.name!r} returned {len(got)} results for {len(rows)} rows")
            out[spec.name] = [_as_results(spec, g) for g in got]
        except Exception as e:
            out[spec.name] = [_crash(e) for _ in rows]
        finally:
            _bar_step(bar)

    jobs: list[Job] = [(partial(whole, s), s.name, None) for s in batched]
    # row-major: a row's metrics start together, so work they share (one statement extraction, one combined
    # call) is asked for once and its row finishes early
    jobs += [(partial(one, s, i), s.name, i) for i in range(len(rows)) for s in per_row]
    batching = BatchStep.of(ctx.client)
    if batching is not None:
        jobs = [(batching.around(s, job), name, i) for (job, name, i), s in zip(jobs, [*batched, *per_row * len(rows)])]
    workers = batching.workers(len(jobs)) if batching is not None else _workers(ctx, len(jobs))
    try:
        with results_kept_frozen() if workers == 1 else contextlib.nullcontext(_nothing) as keep:
            if workers == 1:
                jobs = _on_one_thread(jobs, rows, per_row, keep)
            unfinished = _run(jobs, workers)
    finally:
        _bar_step(bar, close=True)
        if batching is not None:
            batching.close()
    if unfinished:  # stopped: what was not judged says so; a task still running past the grace writes elsewhere
        out = {name: list(res) for name, res in out.items()}
        for name, i in unfinished:
            for j in (range(len(rows)) if i is None else (i,)):
                out[name][j] = _interrupted()
    return out


def _nothing() -> None:
    return None


def _on_one_thread(jobs: list[Job], rows: Sequence[Row], per_row: Sequence[MetricSpec],
                   keep: Callable[[], None]) -> list[Job]:
    """What a run scored on one thread does besides its tasks (docs/scaling.md, with what each gains): a row's texts
    that its metrics read sentence by sentence cut at its first task, once for all of them
    (:func:`_cut_by_sentence`), and what is alive frozen for the garbage collector every
    :data:`~.collector.FREEZE_EVERY` tasks (``keep``, :func:`~.collector.results_kept_frozen`)."""
    texts = tuple(dict.fromkeys(f for s in per_row for f in s.needs.sentences))
    first = len(jobs) - len(rows) * len(per_row)  # the first row's first task (after the score_batch metrics')
    out: list[Job] = []
    for n, (job, name, i) in enumerate(jobs):
        cut = texts and i is not None and (n - first) % len(per_row) == 0
        if cut or n % FREEZE_EVERY == 0:
            job = partial(_tuned, job, rows[i] if cut and i is not None else None, texts, n % FREEZE_EVERY == 0, keep)
        out.append((job, name, i))
    return out


def _tuned(job: Callable[[], None], row: Row | None, texts: Sequence[str], freeze: bool,
           keep: Callable[[], None]) -> None:
    if row is not None:
        _cut_by_sentence(row, texts)
    job()
    if freeze:
        keep()


def _run(jobs: Sequence[Job], workers: int) -> list[tuple[str, int | None]]:
    """Every job, in order, on ``workers`` threads that each take the next job not yet taken; returns the jobs that
    did not finish: none unless a stop was requested -- then no job is taken any more, and the running ones are
    awaited for the stop's grace period, no longer (a call still in flight past the grace is not waited for; its
    reply, if it comes while the process lives, still goes to the cache). What a job raises is raised here."""
    done = [False] * len(jobs)
    taken = itertools.count()  # (next() on a count is atomic: no job is taken twice)
    raised: list[BaseException] = []
    running = [workers]
    lock = threading.Lock()
    finished = threading.Event()
    epoch = stop_epoch()  # a stop of this run ends its workers even once the run has returned (core.stop)

    def work() -> None:
        try:
            with stop_scope(epoch):
                while not stopped_since(epoch) and not raised:
                    n = next(taken)
                    if n >= len(jobs):
                        break
                    jobs[n][0]()
                    done[n] = True
        except BaseException as e:  # (a metric's exception is its row's already: this is a bug, raised below)
            raised.append(e)
        finally:
            with lock:
                running[0] -= 1
                if running[0] == 0:
                    finished.set()

    for k in range(workers):
        threading.Thread(target=work, name=f"ragjudge_{k}").start()
    while not finished.wait(0.25):
        if stop_requested() and grace_left() <= 0:
            break
    if raised:
        raise raised[0]
    return [(name, i) for (_, name, i), ok in zip(jobs, done) if not ok]

def _cut_by_sentence(row: Row, fields: Sequence[str]) -> None:
    """The row's texts that metrics of the run read sentence by sentence (``MetricSpec.needs.sentences``), cut into
    sentences before the row's metrics run, so that they all read one cut of each text. Changes no result; if it
    fails, the metrics meet the same text themselves (and a failure there is their row's)."""
    try:
        for field in fields:
            value = getattr(row, field, None)
            cut_by_sentence(value if isinstance(value, list) else (value,))
    except Exception:  # (only the sharing is lost)
        pass


def by_output(spec: MetricSpec, per_row: list[dict[str, JudgeResult]]) -> dict[str, list[JudgeResult]]:
    """Per-row results of one metric, as output name -> list over rows; a row whose scoring crashed fails each
    output with the error."""
    seen: dict[str, Any] = {}
    for res in per_row:  # the outputs in the order they first occur (a dict keeps its first insertion's place)
        seen.update(res)
    names = [name for name in seen if name != ERROR_KEY]
    if not names and ERROR_KEY in seen:
        names = [o for o in spec.output_names if not o.endswith("_")] or [spec.name]
    if ERROR_KEY not in seen and all(len(res) == len(names) for res in per_row):
        # every row has every output (and no error): each output's column read straight off the rows
        return {n: [res[n] for res in per_row] for n in names}
    out: dict[str, list[JudgeResult]] = {n: [] for n in names}
    for res in per_row:
        for n in names:
            if n in res:
                out[n].append(res[n])
            elif ERROR_KEY in res:
                err = res[ERROR_KEY]
                out[n].append(JudgeResult.failed(err.reason or "internal_error", err.rationale))
            else:
                out[n].append(JudgeResult.abstained("not_applicable", f"{spec.name} gave no {n} for this row"))
    return out


def score_row(spec: MetricSpec, state: Any, row: Row, ctx: RunContext) -> dict[str, JudgeResult]:
    """One row of one metric, as the evaluator scores it and the ``mlflow.genai`` scorers score it: the spec's
    ``score`` (or ``score_batch`` on the one row), its results by output name; an exception is the row's
    ``internal_error`` (under :data:`ERROR_KEY`, which :func:`by_output` spreads over the outputs)."""
    try:
        if spec.score is not None:
            return _as_results(spec, spec.score(state, row, ctx))
        assert spec.score_batch is not None
        got = spec.score_batch(state, [row], ctx)
        if len(got) != 1:
            raise ValueError(f"metric {spec.name!r} returned {len(got)} results for 1 row")
        return _as_results(spec, got[0])
    except Exception as e:  # a bug must not lose the row or the run
        return _crash(e)
