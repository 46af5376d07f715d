"""The job-wide pace of a Spark evaluation: one pace file for the job's tasks (its ``requests_per_minute``, and the
quiet any task's 429 asks for).

Tasks run in executor processes that cannot see each other's starts, so without help each one paces a share of the
limit (``requests_per_minute / tasks at once``, a little under): a task that finishes early leaves its share unused,
and the others' jitter adds up at the provider. With a pace file (:mod:`mlflow_ragjudge.llm.shared_pace`) every task
claims its starts from the one pace, so the job as a whole runs at the limit, whatever the number of tasks.

Without a limit set, each task learns the server's limit from its 429s
(:class:`~mlflow_ragjudge.llm.pacing.LearnedPace`, every other task a neighbour); through the file each task is
told of every other task's 429, waits its quiet out and learns from it as from its own, so the job meets the wall
once, not once per task.

Which file (:func:`job_pace`): the config's ``shared_pace`` when given (the user's choice, e.g. one file for several
jobs on one key); else a new file for this job where every executor reaches it --
the driver's temporary folder when the executors run on the driver's machine (``local[N]``), a file beside the
judge-call cache when the cache is a path (the place the user already gave as reachable from every executor); else
none, and each task paces its share as before (docs/scaling.md says how to give one). A file the job made is
removed when the job ends.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..engine.config import RagJudgeConfig

__all__ = ["job_pace"]


@contextmanager
def job_pace(cfg: RagJudgeConfig, spark_context: Any) -> Iterator[tuple[str | None, str]]:
    """The job's pace file (None: each task paces its share) and where it came from, for the run's record:
    ``"config"``, ``"driver"`` (a temporary folder on the driver's machine), ``"cache"`` (beside the judge-call
    cache) or ``"none"``."""
    if cfg.shared_pace is not None:
        yield str(cfg.shared_pace), "config"
        return
    master = str(getattr(spark_context, "master", "") or "")
    made: Path | None = None
    if master.startswith("local"):
        made = Path(tempfile.mkdtemp(prefix="ragjudge-pace-"))
        where, path = "driver", made / "job.pace"
    elif isinstance(cfg.cache, str) and cfg.cache:
        cache = Path(cfg.cache).expanduser()
        folder = cache if cache.suffix == "" or cache.is_dir() else cache.parent
        where, path = "cache", folder / f".ragjudge-pace-{uuid.uuid4().hex[:12]}.sqlite"
    else:
        yield None, "none"
        return
    try:
        yield str(path), where
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        else:
            for leftover in (path, path.with_name(path.name + "-journal")):
                leftover.unlink(missing_ok=True)
