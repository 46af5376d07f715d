"""One pace for several processes: the tasks of a Spark job, or two jobs that use one API key.

A provider's limit belongs to the key, not to a process. Each process paces its own starts
(:class:`~mlflow_ragjudge.llm.pacing.RequestsPerMinute`); processes that open the same **pace file** pace
together instead: every start is claimed from the file, so the starts of all of them are spaced
``60 / (0.99 x rpm)`` s apart, as one process's are, and together they never exceed the limit.

A budget the server announces in its replies' headers is the key's, so each process that sends on the file's
connection takes its part of it: the announced ``remaining`` divided by the processes that sent in the last few
seconds (:meth:`SharedPace.users`), or at the window's turn every process would spend the same requests.

The file also carries what one process learns from a 429 with ``retry-after``: the quiet it asked for, which every
process that opens the file waits out and learns from as from its own 429 (:meth:`SharedPace.share_quiet`,
:meth:`SharedPace.quiet_until`), so the others do not run into the same wall one by one.

The file is a small SQLite database with one row per provider connection (its key's digest: no URL, no secret): the
next start anyone may take, and the end of the latest quiet. A claim is one short write transaction (``BEGIN
IMMEDIATE``, read, write, commit: about a millisecond on a local disk), in the rollback-journal mode, which needs
only the file locks that local and network file systems give (not WAL, which needs shared memory on one machine).
Clocks: starts are wall-clock times (``time.time()``); processes on one machine share the clock, machines of a
cluster agree within their NTP skew (milliseconds), which the 1 % margin covers.

Why a file: it is the one mechanism every place a job runs already has -- one machine (``local[N]``), or a
cluster's shared file system where the judge-call cache lives -- with no service to run and no port to open
between executors and the driver. A file that cannot be opened or locked is said once
(:class:`SharedPaceWarning`) and the process paces alone, as without one; no row fails for it.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import warnings
from collections.abc import Callable
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
    #: a process reads the shared quiet at most this often (seconds): a read is a file lock and a query
    QUIET_READ_EVERY = 0.01
    #: a process counts the file's other users at most this often, as those that sent in the last USER_SPAN s
    USERS_EVERY = 0.5
    USER_SPAN = 5.0

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self.failed: str | None = None  # why the file is not used (then this process paces alone)
        self._quiet_read: dict[str, tuple[float, float | None]] = {}  # key -> (read at, until)
        self._users_read: dict[str, tuple[float, int]] = {}  # key -> (read at, processes)
        self.pid = os.getpid()  # this process's row among the users

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(self.path), timeout=self.LOCK_TIMEOUT, isolation_level=None,
                               check_same_thread=False)
        conn.execute("CREATE TABLE IF NOT EXISTS pace (key TEXT PRIMARY KEY, next_start REAL NOT NULL)")
        conn.execute("CREATE TABLE IF NOT EXISTS quiet (key TEXT PRIMARY KEY, until REAL NOT NULL)")
        conn.execute("CREATE TABLE IF NOT EXISTS users (key TEXT NOT NULL, pid INTEGER NOT NULL, seen REAL NOT NULL, "
                     "PRIMARY KEY (key, pid))")
        return conn

    def users(self, connection: str, now: float) -> int:
        """How many processes sent on ``connection`` in the last ``USER_SPAN`` s, this one counted now (read and
        written at most every ``USERS_EVERY`` s; 1 when the file cannot be used)."""
        key = _key(connection)
        with self._lock:
            read_at, n = self._users_read.get(key, (-1e18, 1))
        if now - read_at < self.USERS_EVERY:
            return n
        got: list[int] = []

        def count(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO users (key, pid, seen) VALUES (?, ?, ?) ON CONFLICT (key, pid) DO UPDATE SET "
                         "seen = excluded.seen", (key, self.pid, now))
            got.extend(r[0] for r in conn.execute("SELECT count(*) FROM users WHERE key = ? AND seen > ?",
                                                  (key, now - self.USER_SPAN)))

        n = max(1, got[0]) if self._transaction(count) and got else 1
        with self._lock:
            self._users_read[key] = (now, n)
        return n

    def share_quiet(self, connection: str, until: float) -> None:
        """A 429 on ``connection`` asked for quiet until ``until`` (wall-clock seconds): every process is told."""
        key = _key(connection)

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO quiet (key, until) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET until = "
                         "max(until, excluded.until)", (key, until))

        self._transaction(write)
        with self._lock:
            self._quiet_read[key] = (0.0, None)  # read again next time

    def quiet_until(self, connection: str, now: float) -> float | None:
        """The end of the latest quiet any process was asked for on ``connection`` (wall-clock seconds; read at most
        every ``QUIET_READ_EVERY`` s), or None."""
        key = _key(connection)
        with self._lock:
            read_at, until = self._quiet_read.get(key, (0.0, None))
        if now - read_at < self.QUIET_READ_EVERY:
            return until
        rows: list[float] = []

        def read(conn: sqlite3.Connection) -> None:
            rows.extend(r[0] for r in conn.execute("SELECT until FROM quiet WHERE key = ?", (key,)))

        self._transaction(read, immediate=False)
        until = rows[0] if rows else None
        with self._lock:
            self._quiet_read[key] = (now, until)
        return until

    def claim(self, connection: str, interval: float, earliest: float) -> float | None:
        """Take the first start at or after ``earliest`` (wall-clock seconds) that is ``interval`` seconds after the
        last start any process claimed on ``connection`` (a connection key), and return it; None when the file
        cannot be used (the caller paces alone)."""
        key = _key(connection)
        got: list[float] = []

        def take(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT next_start FROM pace WHERE key = ?", (key,)).fetchone()
            start = max(earliest, float(row[0])) if row else earliest
            conn.execute("INSERT INTO pace (key, next_start) VALUES (?, ?) ON CONFLICT (key) "
                         "DO UPDATE SET next_start = excluded.next_start", (key, start + interval))
            got.append(start)

        return got[0] if self._transaction(take) and got else None

    def _transaction(self, body: Callable[[sqlite3.Connection], None], immediate: bool = True) -> bool:
        """Run ``body`` in one transaction on the file; False when the file cannot be used (said once)."""
        with self._lock:
            if self.failed is not None:
                return False
            try:
                if self._conn is None:
                    self._conn = self._connect()
                conn = self._conn
                conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
                try:
                    body(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return True
            except (sqlite3.Error, OSError) as e:
                self.failed = f"{type(e).__name__}: {e}"
                warnings.warn(SharedPaceWarning(
                    f"the pace file {str(self.path)!r} cannot be used ({self.failed}); this process paces its "
                    "requests_per_minute alone. Fix: a shared_pace path on a file system every process can write "
                    "and lock."), stacklevel=3)
                return False

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _key(connection: str) -> str:
    """A connection's row in the file: its key's digest (no URL, no secret)."""
    return hashlib.sha256(connection.encode("utf-8", "surrogatepass")).hexdigest()[:32]


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
