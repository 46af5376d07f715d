"""Ctrl-C and SIGTERM during a Spark evaluation (:func:`~mlflow_ragjudge.adapters.spark.evaluate_spark`): the same
stop as without Spark, for what a Spark job can do.

PySpark's SparkContext puts its own SIGINT handler in place when it starts (it cancels every job of the context and
raises KeyboardInterrupt, whose traceback is all the user sees). While an evaluation runs, ours is put back
(:func:`~mlflow_ragjudge.core.stop.reclaim_signals`): the first signal requests the stop, and a watcher cancels the
evaluation's own jobs (those with its job tag, not the session's other jobs). The rows are judged in the executors,
which a flag on the driver does not reach: a cancelled task's Python worker is ended by Spark (after
``spark.python.task.killTimeout``, 2 s by default), and what its judge replies had brought is in the judge-call cache.
A Spark run is logged once every partition is scored, so a stopped one logs nothing; :class:`Interrupted` says so, and
how to finish (the same command again: the cache answers what was paid for).

A Ctrl-C at a terminal reaches the driver only: PySpark starts the JVM with SIGINT ignored, and the Python workers
run in a process group of their own (measured with pyspark 4.3, ``local[n]``), so a terminal's Ctrl-C and a
``kill -INT`` of the driver are the same stop.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from ..core.errors import Interrupted
from ..core.stop import reclaim_signals, stop_on_signals, stop_reason, stop_requested, wait_for_stop
from ..engine.config import RagJudgeConfig

__all__ = ["stoppable"]


@contextlib.contextmanager
def stoppable(spark: Any, cfg: RagJudgeConfig) -> Iterator[None]:
    """Within: a SIGINT or SIGTERM (or :func:`~mlflow_ragjudge.core.stop.request_stop`) cancels the Spark jobs started
    here, and what they raise becomes :class:`Interrupted` with what was done and how to finish."""
    with stop_on_signals():
        reclaim_signals()  # PySpark's handler, if its context started since the outermost scope began
        sc = spark.sparkContext
        tag = f"ragjudge-{uuid.uuid4().hex[:12]}"
        sc.addJobTag(tag)
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                if wait_for_stop(0.2):
                    with contextlib.suppress(Exception):  # a context already stopped has nothing to cancel
                        sc.cancelJobsWithTag(tag)
                    return

        watcher = threading.Thread(target=watch, name="ragjudge-spark-stop", daemon=True)
        watcher.start()
        try:
            yield
        except Exception as e:
            if stop_requested():
                raise Interrupted(_stopped(cfg), stop_reason() or "SIGINT") from e
            raise
        finally:
            done.set()
            watcher.join()
            with contextlib.suppress(Exception):
                sc.removeJobTag(tag)


def _stopped(cfg: RagJudgeConfig) -> str:
    if cfg.cache is False:
        kept = "the judge-call cache was off, so running it again pays for every call again"
    else:
        where = f" at {cfg.cache}" if isinstance(cfg.cache, str) else ""
        kept = (f"the judge replies that arrived are in the judge-call cache{where}, so running the same command "
                "again sends only the rest")
    return (f"stopped by {stop_reason() or 'a stop request'}: the Spark job was cancelled and nothing was logged (a "
            f"Spark run is logged once every partition is scored); {kept}. To finish, run the same command again (in "
            "Python: the same call).")
