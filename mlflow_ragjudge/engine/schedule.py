"""Step 3 of an evaluation: every (row, metric) task in one pool, the judge client's provider gate bounding the calls
in flight -- no barrier between metrics, so a slow or hung call delays only its own row -- and one row scored the
way the ``mlflow.genai`` scorers score it too (:func:`score_row`). A metric's exception fails its row
(``internal_error``), never the run."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import repeat
from typing import Any

from ..core.matching import cut_by_sentence
from ..core.stop import await_until_stopped, stop_reason, stop_requested
from ..core.types import FailureReason, JudgeResult, Row
from ..metrics.spec import MetricSpec, Prepared, RunContext

__all__ = ["schedule", "score_row", "prepare_metrics", "by_output", "ERROR_KEY"]


def _progress_bar(total: int, desc: str, setting: bool | str) -> Any:
    """A tqdm bar on stderr (``progress='auto'``: only on a terminal), or None (also when stderr is closed)."""
    stream = sys.stderr
    if setting is False or stream is None or (setting == "auto" and not _isatty(stream)):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
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

def _workers(ctx: RunContext, tasks: int) -> int:
    """Threads for the pool: enough to keep the provider gate full while some tasks wait on earlier calls of
    their row (a task makes one to three calls in a row); the gate, not the pool, bounds what is in flight."""
    if ctx.client is None:
        return 1
    limit = ctx.client.max_concurrency or ctx.client.gate.ceiling
    return max(1, min(tasks, 256, max(8, 2 * limit)))

def schedule(specs: Sequence[MetricSpec], states: dict[str, Any], rows: Sequence[Row],
              ctx: RunContext) -> dict[str, list[dict[str, JudgeResult]]]:
    """Score every (row, metric) in one pool; returns metric -> per-row results. Never raises for a metric's
    exception: it fails that row (``internal_error``) and the run goes on."""
    out: dict[str, list[dict[str, JudgeResult]]] = {s.name: [{} for _ in rows] for s in specs}
    per_row = [s for s in specs if s.score is not None]
    batched = [s for s in specs if s.score_batch is not None]
    total = len(rows) * len(per_row) + len(batched)
    names = ", ".join(s.name for s in specs)
    bar = _progress_bar(total, f"ragjudge ({names})" if len(names) <= 60 else "ragjudge", ctx.cfg.progress)

    runner = ctx.client.batch if ctx.client is not None else None

    def one(spec: MetricSpec, i: int) -> None:
        try:
            if runner is None:  # no batch runner to enter: the task as it is (most tasks of an offline run)
                out[spec.name][i] = score_row(spec, states[spec.name], rows[i], ctx)
            else:
                with _task(runner, spec):
                    out[spec.name][i] = score_row(spec, states[spec.name], rows[i], ctx)
        finally:
            _bar_step(bar)

    def batch(spec: MetricSpec) -> None:
        try:
            assert spec.score_batch is not None
            with _task(runner, spec):
                got = spec.score_batch(states[spec.name], rows, ctx)
            if len(got) != len(rows):
                raise ValueError(f"metric {spec.name!r} returned {len(got)} results for {len(rows)} rows")
            out[spec.name] = [_as_results(spec, g) for g in got]
        except Exception as e:
            out[spec.name] = [_crash(e) for _ in rows]
        finally:
            _bar_step(bar)

    jobs: list[tuple[Callable[[], None], str, int | None]] = [
        (lambda s=s: batch(s), s.name, None) for s in batched]  # type: ignore[misc]
    # row-major: a row's metrics start together, so work they share (one statement extraction, one combined
    # call) is asked for once and its row finishes early
    jobs += [(lambda s=s, i=i: one(s, i), s.name, i)  # type: ignore[misc]
             for i in range(len(rows)) for s in per_row]
    unfinished: list[tuple[str, int | None]] = []
    try:
        workers = _workers(ctx, len(jobs))
        if runner is not None:  # every running task may add a line to the next batch: run them all at once
            workers = max(1, min(len(jobs), runner.options.threads))
        if workers <= 1:
            texts = tuple(dict.fromkeys(f for s in per_row for f in s.needs.sentences))
            row_at: int | None = None
            with _results_kept_frozen() as keep:
                for n, (job, _, at) in enumerate(jobs):
                    if stop_requested():
                        unfinished = [(name, i) for _, name, i in jobs[n:]]
                        break
                    if texts and at is not None and at != row_at:  # a row's first task: its texts cut once for all
                        row_at = at
                        _cut_by_sentence(rows[at], texts)
                    job()
                    if n % _FREEZE_EVERY == 0:
                        keep()
        else:
            unfinished = _run_pool(jobs, workers)
    finally:
        _bar_step(bar, close=True)
        if runner is not None:
            runner.close()
    if unfinished:  # stopped: what was not judged says so; a task still running past the grace writes elsewhere
        out = {name: list(res) for name, res in out.items()}
        for name, i in unfinished:
            for j in (range(len(rows)) if i is None else (i,)):
                out[name][j] = _interrupted()
    return out

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


#: tasks scored between two freezes of what is alive (:func:`_results_kept_frozen`)
_FREEZE_EVERY = 500


@contextlib.contextmanager
def _results_kept_frozen() -> Iterator[Callable[[], None]]:
    """While rows are scored on one thread, what is alive is frozen now and then (``gc.freeze``), and unfrozen at
    the end: the cyclic garbage collector then walks only what was made since the last freeze, not again and again
    the results kept so far and the process's own objects (its imports, the input frame). A run scores a few
    results per row that live to its end; the collector's full passes over everything alive cost about a fifth
    of the offline metrics' time per row before. Nothing is lost: what is frozen goes back to the collector's
    oldest generation at the end. Left alone when the collector is off or the process froze objects itself.

    Between two freezes the collector's middle generation is not collected either (its threshold raised for the
    run, set back after): what survives a young collection there is a task's results, kept to the run's end, and
    walking them once more before they are frozen cost 0.04 ms of the offline metrics' 1 ms per row (measured
    with ``gc.callbacks``). Young collections go on as before, so a cycle a task leaves behind is still freed."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield lambda: None
        return
    before = gc.get_threshold()
    during = (before[0], max(before[1], _FREEZE_EVERY), *before[2:])
    gc.set_threshold(*during)
    try:
        yield gc.freeze
    finally:
        gc.unfreeze()
        if gc.get_threshold() == during:  # (unless someone set other thresholds meanwhile: theirs stay)
            gc.set_threshold(*before)


def _run_pool(jobs: list[tuple[Callable[[], None], str, int | None]], workers: int) -> list[tuple[str, int | None]]:
    """Every job in a thread pool; returns the jobs that did not finish (none unless a stop was requested: then the
    ones not started are cancelled, and the running ones are awaited for the stop's grace period, no longer)."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ragjudge")
    futures: dict[Future[None], tuple[str, int | None]] = {pool.submit(job): (name, i) for job, name, i in jobs}
    try:
        return [futures[f] for f in await_until_stopped(futures)]
    finally:
        # after a stop, a call still in flight past the grace is not waited for (its reply, if it comes while the
        # process lives, still goes to the cache)
        pool.shutdown(wait=not stop_requested(), cancel_futures=True)

def _task(runner: Any, spec: MetricSpec) -> Any:
    """The context a task runs in: inside the batch runner for a batchable metric, synchronous otherwise."""
    if runner is None:
        return contextlib.nullcontext()
    return runner.synchronous() if spec.needs.synchronous else runner.task()

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


def prepare_metrics(specs: Sequence[MetricSpec], ctx: RunContext) -> Prepared:
    """Each metric's ``prepare`` hook, in order, before any judge call; what they found, merged. Metrics that share
    a hook share its work (it runs once per run)."""
    found = Prepared()
    for spec in specs:
        if spec.prepare is not None:
            got = spec.prepare(ctx)
            if got is not None:
                found.record.update(got.record)
                found.params.update(got.params)
    return found


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
