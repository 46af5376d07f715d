"""One ``requests_per_minute`` for several processes: the tasks of a Spark job, or two jobs that use one API key.

A provider's limit belongs to the key, not to a process. Each process paces its own starts
(:class:`~mlflow_ragjudge.llm.pacing.RequestsPerMinute`); processes that open the same **pace file** pace
together instead: every start is claimed from the file, so the starts of all of them are spaced
``60 / (0.99 x rpm)`` s apart, as one process's are, and together they never exceed the limit.

The file is a small SQLite database with one row per provider connection (its key's digest: no URL, no
secret): the next start anyone may take. A claim is one short write transaction (``BEGIN IMMEDIATE``, read,
write, commit: about a millisecond on a local disk), in the rollback-journal mode, which needs only the file
locks that local and network file systems give (not WAL, which needs shared memory on one machine). Clocks:
starts are wall-clock times (``time.time()``); processes on one machine share the clock, machines of a cluster
agree within their NTP skew (milliseconds), which the 1 % margin covers.

Why a file: it is the one mechanism every place a job runs already has -- one machine (``local[N]``), or a
cluster's shared file system where the judge-call cache lives -- with no service to run and no port to open
between executors and the driver. A file that cannot be opened or locked is said once
(:class:`SharedPaceWarning`) and the process paces alone, as without one; no row fails for it.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import warnings
from pathlib import Path

__all__ = ["SharedPace", "SharedPaceWarning", "shared_pace", "ENV_SHARED_PACE"]

#: a pace file for every judge client of the process that sets no ``shared_pace`` of its own
ENV_SHARED_PACE = "RAGJUDGE_SHARED_PACE"


class SharedPaceWarning(UserWarning):
    """The pace file could not be used: this process paces alone."""


class SharedPace:
    """The pace file at ``path`` (module docstring); thread-safe, one connection per process."""

    #: seconds a claim waits for another process's transaction before the file counts as unusable
    LOCK_TIMEOUT = 30.0

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self.failed: str | None = None  # why the file is not used (then this process paces alone)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(self.path), timeout=self.LOCK_TIMEOUT, isolation_level=None,
                               check_same_thread=False)
        conn.execute("CREATE TABLE IF NOT EXISTS pace (key TEXT PRIMARY KEY, next_start REAL NOT NULL)")
        return conn

    def claim(self, connection: str, interval: float, earliest: float) -> float | None:
        """Take the first start at or after ``earliest`` (wall-clock seconds) that is ``interval`` seconds after the
        last start any process claimed on ``connection`` (a connection key), and return it; None when the file
        cannot be used (the caller paces alone)."""
        key = hashlib.sha256(connection.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        with self._lock:
            if self.failed is not None:
                return None
            try:
                if self._conn is None:
                    self._conn = self._connect()
                conn = self._conn
                conn.execute("BEGIN IMMEDIATE")
                try:
                    row = conn.execute("SELECT next_start FROM pace WHERE key = ?", (key,)).fetchone()
                    start = max(earliest, float(row[0])) if row else earliest
                    conn.execute("INSERT INTO pace (key, next_start) VALUES (?, ?) ON CONFLICT (key) "
                                 "DO UPDATE SET next_start = excluded.next_start", (key, start + interval))
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return start
            except (sqlite3.Error, OSError) as e:
                self.failed = f"{type(e).__name__}: {e}"
                warnings.warn(SharedPaceWarning(
                    f"the pace file {str(self.path)!r} cannot be used ({self.failed}); this process paces its "
                    "requests_per_minute alone. Fix: a shared_pace path on a file system every process can write "
                    "and lock."), stacklevel=2)
                return None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


_OPEN: dict[str, SharedPace] = {}
_OPEN_LOCK = threading.Lock()


def shared_pace(path: str | Path) -> SharedPace:
    """The process's one :class:`SharedPace` for ``path`` (every client and gate that names it shares it)."""
    key = str(Path(path).expanduser().resolve())
    with _OPEN_LOCK:
        pace = _OPEN.get(key)
        if pace is None:
            pace = _OPEN[key] = SharedPace(key)
        return pace
