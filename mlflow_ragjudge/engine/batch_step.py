"""Step 3 with ``batch=True``: the scheduler's tasks run inside the judge client's
:class:`~mlflow_ragjudge.llm.batch.BatchRunner`, which collects their judge calls into provider batches. What the
scheduler needs of it is here: how many tasks run at once (every running task may add a line to the next batch, so
all of them, up to the batch's ``threads``), the context each task runs in, and closing the runner at the end."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from ..llm.batch import BatchRunner
from ..llm.client import JudgeClient
from ..metrics.spec import MetricSpec

__all__ = ["BatchStep"]


class BatchStep:
    """The batch runner of one run's step 3 (:meth:`of` gives None when the run sends no batch)."""

    def __init__(self, runner: BatchRunner) -> None:
        self.runner = runner

    @classmethod
    def of(cls, client: JudgeClient | None) -> BatchStep | None:
        runner = client.batch if client is not None else None
        return cls(runner) if runner is not None else None

    def workers(self, tasks: int) -> int:
        """Threads for the tasks: every running task may add a line to the next batch, so run them all at once."""
        return max(1, min(tasks, self.runner.options.threads))

    def context(self, spec: MetricSpec) -> AbstractContextManager[None]:
        """Where a task of ``spec`` runs: inside the runner for a batchable metric, synchronous otherwise (multi-turn:
        each turn needs the last)."""
        return self.runner.task() if not spec.needs.synchronous else self.runner.synchronous()

    def around(self, spec: MetricSpec, job: Callable[[], None]) -> Callable[[], None]:
        """``job`` run in :meth:`context`."""
        def in_batch() -> None:
            with self.context(spec):
                job()
        return in_batch

    def close(self) -> None:
        """Stop the runner's coordinator once nothing waits on it."""
        self.runner.close()
