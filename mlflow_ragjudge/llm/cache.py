"""Persistent cache of judge calls (SQLite, safe across threads and processes).

The key covers exactly what changes a reply: provider, model, base URL, the
rendered messages, the sampling parameters (temperature, max tokens, seed, stop,
JSON schema) and the prompt version -- nothing else (not the API key, not the
time, not the run). A re-run, or a sweep that changes one variant, pays only for
the calls that changed.

Only successful, parseable replies are stored; failures, refusals and replies the
judge could not read are never cached (the client decides that).

Location: ``$RAGJUDGE_CACHE_DIR/calls.sqlite``, default
``~/.cache/mlflow-ragjudge/calls.sqlite``.

**The cache never costs a result** (:meth:`CallCache.open`, docs/failure-modes.md): a damaged cache is moved
aside (``calls.sqlite.corrupt-<time>``) with a warning and a fresh cache is used; a cache that cannot be written
(read-only file or directory) is used read-only with a warning; one that cannot be created at all is left out with
a warning and the run goes on without it. While the run goes on, a lookup that fails is a miss, and a write that
cannot get the database lock within ``lock_timeout`` seconds (another process is writing) is skipped -- the row
keeps the reply it paid for; the run records how many writes were skipped.

**Nor any file of the user's.** Only a file recognisably ours is used or moved aside: a SQLite file holding our
``calls`` table, a SQLite file with no tables yet, an empty file (what a cache another process is creating looks
like for an instant), or -- at the package's own place, ``$RAGJUDGE_CACHE_DIR/calls.sqlite`` or
``~/.cache/mlflow-ragjudge/calls.sqlite`` -- anything (only this package writes there). Any other existing file
(a CSV, a JSON, a SQLite database with other tables) is refused with :class:`~..core.errors.NotACacheError`, before
any judge call, and left byte for byte as it was.

**Opening waits out a lock.** Two processes (or Spark workers) creating the same new file at once meet each
other's locks, some of which SQLite reports at once instead of waiting; opening retries them for up to
``open_timeout`` seconds (:data:`OPEN_TIMEOUT`, 30 s) before it gives up and the run goes on without a cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..core.errors import CacheWarning, NotACacheError

ENV_CACHE_DIR = "RAGJUDGE_CACHE_DIR"
#: seconds opening a cache waits for a lock held by another process (one creating or converting the same file)
OPEN_TIMEOUT = 30.0
_SCHEMA_VERSION = "1"
_CREATE = "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL)"
#: what marks a SQLite file as a cache of ours: the text of our table's schema, which SQLite keeps on page 1
_FINGERPRINT = _CREATE.replace("IF NOT EXISTS ", "").encode("ascii")
_SQLITE_HEADER = b"SQLite format 3\x00"
_OUR_TABLES = frozenset({"calls", "batches", "batch_lines", "batch_lines_key"})
# Provider batches submitted from this cache's runs, and the calls (cache keys) each carries: a killed process's
# re-run re-attaches to its batches instead of paying for the same lines again (docs/batch.md).
_CREATE_BATCHES = (
    "CREATE TABLE IF NOT EXISTS batches (batch_id TEXT PRIMARY KEY, connection TEXT NOT NULL, state TEXT NOT NULL, "
    "created REAL, updated REAL, info TEXT)",
    "CREATE TABLE IF NOT EXISTS batch_lines (key TEXT NOT NULL, batch_id TEXT NOT NULL, mode TEXT, "
    "PRIMARY KEY (key, batch_id))",
    "CREATE INDEX IF NOT EXISTS batch_lines_key ON batch_lines (key)",
)
# files already checked for damage in this process (the check reads the whole file once)
_CHECKED: set[str] = set()
_CHECKED_LOCK = threading.Lock()
_T = TypeVar("_T")


def default_cache_dir() -> Path:
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "mlflow-ragjudge"


def cache_key(kind: str, identity: dict[str, Any], payload: dict[str, Any], prompt_version: str = "") -> str:
    """SHA-256 over a canonical JSON of what changes the output."""
    blob = json.dumps(
        {"v": _SCHEMA_VERSION, "kind": kind, "backend": identity, "payload": payload, "prompt": prompt_version},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def _resolve(path: str | Path | None) -> Path:
    p = Path(path).expanduser() if path is not None else default_cache_dir() / "calls.sqlite"
    if p.suffix == "" or p.is_dir():
        p = p / "calls.sqlite"
    return p


def _file_kind(p: Path) -> str:
    """What the file at ``p`` is, read from its bytes without opening it as a database: ``new`` (no file, or an
    empty one), ``ours`` (our table's schema is on its first page), ``blank`` (a SQLite file whose first page lists
    no table: being created, or its tables are still in its write-ahead log), ``foreign`` (not a SQLite file, or
    one with tables of its own) or ``unreadable``."""
    try:
        with open(p, "rb") as fh:
            head = fh.read(100)
            if not head:
                return "new"
            if len(head) < 100 or not head.startswith(_SQLITE_HEADER):
                return "foreign"
            size = int.from_bytes(head[16:18], "big")
            page = head + fh.read((65536 if size == 1 else size) - 100)
    except FileNotFoundError:
        return "new"
    except OSError:
        return "unreadable"
    if _FINGERPRINT in page:
        return "ours"
    if len(page) >= 105 and page[100] == 0x0D and page[103:105] == b"\x00\x00":  # a leaf with no cells
        return "blank"
    return "foreign"


def _at_home(p: Path) -> bool:
    """Whether ``p`` is the package's own cache file (only this package writes there)."""
    try:
        return p.resolve() == (default_cache_dir() / "calls.sqlite").resolve()
    except OSError:
        return False


def _refuse(p: Path, what: str) -> NotACacheError:
    return NotACacheError(
        f"the judge-call cache {p} is an existing file that is not a judge-call cache ({what}); it was left as it "
        f"is. Give the cache a path of its own (cache=<a new file or a directory>, or {ENV_CACHE_DIR} for the "
        "default place), move that file away, or run without a cache (cache=False, --no-cache).")


def check_cache_path(setting: bool | str | os.PathLike[str] | None) -> None:
    """The check :class:`CallCache` makes before it opens a file, made on its own and changing nothing: raise
    :class:`NotACacheError` when the cache ``setting`` (True for the default place, False / None for none, or a
    path) names an existing file that is not a judge-call cache. For a driver that opens no cache itself (Spark's:
    its executors do), so the refusal comes before any job and any judge call."""
    if setting is None or setting is False:
        return
    p = _resolve(None if setting is True else Path(setting))
    if _file_kind(p) == "foreign" and not _at_home(p):
        raise _refuse(p, "not a SQLite file, or a SQLite database of other tables")


def _locked(e: BaseException) -> bool:
    msg = str(e).lower()
    return isinstance(e, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


def _table_names(conn: sqlite3.Connection) -> list[str]:
    """The tables and indexes a database holds (SQLite's own left out)."""
    return [str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")]


def _waiting(conn: sqlite3.Connection, deadline: float, step: Callable[[], _T]) -> _T:
    """Run ``step`` on ``conn``, waiting out another process's lock until ``deadline`` (``time.monotonic``): the
    busy handler waits for most locks, and the ones SQLite reports at once (two connections that both want to
    change the file, each holding a shared lock) are retried. Re-raises when the deadline has passed."""
    pause = 0.005
    while True:
        left = deadline - time.monotonic()
        conn.execute(f"PRAGMA busy_timeout = {max(0, int(left * 1000))}")
        try:
            return step()
        except sqlite3.OperationalError as e:
            left = deadline - time.monotonic()
            if not _locked(e) or left <= 0:
                raise
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.1)


#: file systems on which SQLite's WAL mode does not work (it needs memory shared between the processes, which a
#: network or FUSE file system does not give) and whose locking is only as good as the server's
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre", "gpfs",
                       "beegfs", "fuse")


def filesystem_of(path: Path) -> str:
    """The type of the file system ``path`` is on (``/proc/mounts``: the longest mount point that contains it), or
    ``""`` where that cannot be told (not Linux)."""
    try:
        mounts = Path("/proc/mounts").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    target = str(path.resolve())
    best, kind = "", ""
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, parts[2]
    return kind


def on_network_filesystem(kind: str) -> bool:
    return kind.split(".")[0] in NETWORK_FILESYSTEMS


def _readonly_error(e: BaseException) -> bool:
    msg = str(e).lower()
    return "readonly" in msg or "read-only" in msg or "unable to open" in msg or "disk i/o" in msg


class CallCache:
    """A key-value store of JSON replies in one SQLite file.

    One connection per thread (SQLite connections are not shared across threads);
    WAL mode lets several processes read while one writes. On a network or FUSE file system (a cache shared by the
    executors of a cluster) the file uses SQLite's rollback journal instead, since WAL needs memory shared between
    the processes; there, writers from several machines rely on the file system's locks (docs/scaling.md).

    Args:
        path: the cache file, or a directory for ``calls.sqlite``; default under
            :func:`default_cache_dir`.
        read_only: look replies up, never store them.
        lock_timeout: seconds a write waits for another process's lock before it is skipped.
        open_timeout: seconds opening the file waits for another process's lock (:data:`OPEN_TIMEOUT`).

    Raises:
        NotACacheError: the file exists and is not a judge-call cache (the user's own data; left as it is).
        OSError: the directory cannot be created; ``sqlite3.Error``: the file cannot be opened, is locked past
        ``open_timeout`` or is damaged. :meth:`open` turns each of these into a warning and a way forward.
    """

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False, lock_timeout: float = 2.0,
                 open_timeout: float = OPEN_TIMEOUT) -> None:
        p = _resolve(path)
        kind = _file_kind(p)
        if kind == "foreign":
            if not _at_home(p):
                raise _refuse(p, "not a SQLite file, or a SQLite database of other tables")
            raise sqlite3.DatabaseError("not a judge-call cache")  # at our own place: a damaged cache of ours
        if not read_only:
            p.parent.mkdir(parents=True, exist_ok=True)
        self.path = p
        self.filesystem = filesystem_of(p.parent if p.parent.exists() else Path.cwd())
        self.journal = "delete" if on_network_filesystem(self.filesystem) else "wal"
        self.read_only = read_only
        self.lock_timeout = lock_timeout
        self.open_timeout = open_timeout
        self.skipped_writes = 0
        self.failed_reads = 0
        self.events: list[str] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        deadline = time.monotonic() + open_timeout
        conn = self._connect(deadline, check_tables=kind == "blank")
        self._local.conn = conn
        if not read_only:
            tables = set(_waiting(conn, deadline, lambda: _table_names(conn)))
            if not {"calls", "batches", "batch_lines"} <= tables:
                for statement in (_CREATE, *_CREATE_BATCHES):
                    _waiting(conn, deadline, functools.partial(conn.execute, statement))
        key = str(p.resolve())
        with _CHECKED_LOCK:
            checked = key in _CHECKED
        if not checked:
            row = _waiting(conn, deadline, lambda: conn.execute("PRAGMA quick_check(1)").fetchone())
            if row is None or str(row[0]).lower() != "ok":
                raise sqlite3.DatabaseError(f"the cache file is damaged (quick_check: {row[0] if row else 'none'})")
            # the table is there and readable
            _waiting(conn, deadline, lambda: conn.execute("SELECT COUNT(*) FROM calls").fetchone())
            with _CHECKED_LOCK:
                _CHECKED.add(key)
        conn.execute(f"PRAGMA busy_timeout = {int(lock_timeout * 1000)}")

    @classmethod
    def open(cls, path: str | Path | None = None, *, lock_timeout: float = 2.0,
             open_timeout: float = OPEN_TIMEOUT) -> CallCache | None:
        """Open the cache so that it never costs a result (see the module docstring).

        Returns a read-write cache, a read-only one, or ``None`` (run without a cache); every
        fallback is announced with a :class:`CacheWarning` that names the file and the fix.

        Raises:
            NotACacheError: ``path`` is an existing file that is not a judge-call cache; it is left as it is.
        """
        p = _resolve(path)
        timeouts = (lock_timeout, open_timeout)
        try:
            return cls(p, lock_timeout=lock_timeout, open_timeout=open_timeout)
        except OSError as e:
            if not p.exists():
                _warn(f"the judge-call cache {p} cannot be created ({e}); running without a cache "
                      f"(set {ENV_CACHE_DIR} or cache=<writable path> to keep replies across runs).")
                return None
            return cls._read_only(p, e, timeouts)
        except sqlite3.OperationalError as e:
            if _readonly_error(e):
                return cls._read_only(p, e, timeouts)
            if _locked(e):
                _warn(f"the judge-call cache {p} is locked by another process ({e}); waited {open_timeout:g} s for "
                      "it, then went on without a cache: replies of this run are not stored.")
                return None
            return cls._replace_damaged(p, e, timeouts)
        except sqlite3.DatabaseError as e:  # not a database, malformed, failed check
            return cls._replace_damaged(p, e, timeouts)

    @classmethod
    def _read_only(cls, p: Path, error: BaseException, timeouts: tuple[float, float]) -> CallCache | None:
        try:
            cache = cls(p, read_only=True, lock_timeout=timeouts[0], open_timeout=timeouts[1])
        except (OSError, sqlite3.Error) as e:
            _warn(f"the judge-call cache {p} cannot be written ({error}) nor read ({e}); running without a cache "
                  f"(set {ENV_CACHE_DIR} or cache=<writable path>).")
            return None
        cache.events.append(f"read-only: {error}")
        _warn(f"the judge-call cache {p} cannot be written ({error}); using it read-only: cached replies are "
              f"reused, new ones are not stored (set {ENV_CACHE_DIR} or cache=<writable path> to store them).")
        return cache

    @classmethod
    def _replace_damaged(cls, p: Path, error: BaseException, timeouts: tuple[float, float]) -> CallCache | None:
        # only a cache of ours is moved aside: a file we cannot recognise as one may be the user's own
        if _file_kind(p) not in ("ours", "blank", "new") and not _at_home(p):
            raise _refuse(p, f"not recognisable as one: {error}") from error
        aside = p.with_name(f"{p.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            p.rename(aside)
            for suffix in ("-wal", "-shm"):
                side = p.with_name(p.name + suffix)
                if side.exists():
                    side.rename(aside.with_name(aside.name + suffix))
            cache = cls(p, lock_timeout=timeouts[0], open_timeout=timeouts[1])
        except (OSError, sqlite3.Error) as e:
            _warn(f"the judge-call cache {p} is damaged ({error}) and could not be replaced ({e}); running "
                  "without a cache.")
            return None
        cache.events.append(f"damaged file moved to {aside}: {error}")
        _warn(f"the judge-call cache {p} was damaged ({error}); it was moved to {aside} and a fresh cache is used.")
        return cache

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # the file is set up by now: a thread's own connection waits for a lock as long as a write would
            conn = self._connect(time.monotonic() + self.lock_timeout)
            conn.execute(f"PRAGMA busy_timeout = {int(self.lock_timeout * 1000)}")
            self._local.conn = conn
        return conn

    def _connect(self, deadline: float, check_tables: bool = False) -> sqlite3.Connection:
        """A new connection, its journal mode set (waiting out another process's lock until ``deadline``). With
        ``check_tables`` (a SQLite file whose first page lists no table), the tables it holds in its write-ahead
        log are looked at first: a database of other tables is refused before anything is changed."""
        if self.read_only:
            try:
                conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=self.lock_timeout,
                                       isolation_level=None)
                conn.execute("SELECT 1 FROM calls LIMIT 1").fetchall()
            except sqlite3.Error:
                # a WAL-mode file in a directory we cannot write: read it as an immutable snapshot
                conn = sqlite3.connect(f"file:{self.path}?immutable=1", uri=True, isolation_level=None)
        else:
            conn = sqlite3.connect(self.path, timeout=self.lock_timeout, isolation_level=None)
        try:
            if check_tables:
                other = set(_waiting(conn, deadline, lambda: _table_names(conn))) - _OUR_TABLES
                if other:
                    if not _at_home(self.path):
                        raise _refuse(self.path, f"a SQLite database of other tables: {', '.join(sorted(other))}")
                    raise sqlite3.DatabaseError("not a judge-call cache")
            if self.read_only:
                return conn
            mode = self.journal
            current = _waiting(conn, deadline, lambda: conn.execute("PRAGMA journal_mode").fetchone())
            if current is None or str(current[0]).lower() != mode:
                _waiting(conn, deadline, lambda: conn.execute(f"PRAGMA journal_mode={mode.upper()}").fetchone())
            conn.execute("PRAGMA synchronous=NORMAL" if mode == "wal" else "PRAGMA synchronous=FULL")
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def mode(self) -> str:
        return "read_only" if self.read_only else "read_write"

    def status(self) -> dict[str, Any]:
        """What happened to the cache in this process: mode, skipped writes, failed reads, events."""
        return {"path": str(self.path), "mode": self.mode, "skipped_writes": self.skipped_writes,
                "failed_reads": self.failed_reads, "events": list(self.events), "filesystem": self.filesystem,
                "journal": self.journal}

    def _note(self, counter: str, message: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)
            first = message not in self.events
            if first:
                self.events.append(message)
        if first:
            _warn(message)

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored reply, or None (a miss; a lookup that fails is a miss too, with a warning)."""
        try:
            row = self._conn().execute("SELECT value FROM calls WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as e:
            self._note("failed_reads", f"a lookup in the judge-call cache {self.path} failed ({e}); treated as a miss")
            return None
        if row is None:
            return None
        try:
            value = json.loads(row[0])
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> bool:
        """Store a reply. Returns False when it was not stored (read-only, or the lock was not free in
        ``lock_timeout`` seconds, or the write failed): the caller keeps its result either way."""
        if self.read_only:
            with self._lock:
                self.skipped_writes += 1
            return False
        try:
            self._conn().execute(
                "INSERT OR REPLACE INTO calls (key, value, created) VALUES (?, ?, ?)",
                (key, json.dumps(value, ensure_ascii=False), time.time()),
            )
        except sqlite3.Error as e:
            if isinstance(e, sqlite3.OperationalError) and _readonly_error(e):
                # found out only now (a file the filesystem will not let us change): read-only from here on
                with self._lock:
                    self.read_only = True
                self._note("skipped_writes", f"the judge-call cache {self.path} cannot be written ({e}); using it "
                                             f"read-only: cached replies are reused, new ones are not stored (set "
                                             f"{ENV_CACHE_DIR} or cache=<writable path> to store them)")
                return False
            self._note("skipped_writes", f"a write to the judge-call cache {self.path} was skipped ({e}); the row "
                                         "keeps its result, a re-run asks for it again")
            return False
        return True

    # ------------------------------------------------------------------ provider batches

    def record_batch(self, batch_id: str, connection: str, lines: list[tuple[str, str]], info: dict[str, Any]) -> bool:
        """Remember a submitted batch and the ``(cache key, structured mode)`` of each line, in one transaction.
        False when it could not be stored (read-only ...): the batch then cannot be re-attached after a crash."""
        if self.read_only:
            return False
        try:
            conn = self._conn()
            now = time.time()
            with _transaction(conn):
                conn.execute("INSERT OR REPLACE INTO batches VALUES (?, ?, 'submitted', ?, ?, ?)",
                             (batch_id, connection, now, now, json.dumps(info, default=str)))
                conn.executemany("INSERT OR REPLACE INTO batch_lines VALUES (?, ?, ?)",
                                 [(key, batch_id, mode) for key, mode in lines])
        except sqlite3.Error as e:
            self._note("skipped_writes", f"batch {batch_id} could not be recorded in {self.path} ({e}); a killed run "
                                         "cannot re-attach to it")
            return False
        return True

    def batch_for(self, key: str, connection: str) -> tuple[str, str | None] | None:
        """The newest batch still pending (not ended, or ended and not yet read) that carries ``key`` on this
        connection, with the line's structured mode; None when there is none."""
        try:
            row = self._conn().execute(
                "SELECT b.batch_id, l.mode FROM batch_lines l JOIN batches b ON b.batch_id = l.batch_id "
                "WHERE l.key = ? AND b.connection = ? AND b.state IN ('submitted', 'ended') "
                "ORDER BY b.created DESC LIMIT 1", (key, connection)).fetchone()
        except sqlite3.Error:
            return None
        return (str(row[0]), row[1]) if row else None

    def set_batch_state(self, batch_id: str, state: str) -> None:
        """``submitted`` -> ``ended`` (results available) -> ``read`` (every line delivered), or ``failed``, or
        ``gone`` (the provider no longer has it: a 404)."""
        if self.read_only:
            return
        try:
            self._conn().execute("UPDATE batches SET state = ?, updated = ? WHERE batch_id = ?",
                                 (state, time.time(), batch_id))
        except sqlite3.Error as e:
            self._note("skipped_writes", f"the state of batch {batch_id} could not be stored in {self.path} ({e})")

    def batches(self, state: str | None = None) -> list[dict[str, Any]]:
        """The recorded batches (newest first), with their line counts."""
        try:
            rows = self._conn().execute(
                "SELECT b.batch_id, b.connection, b.state, b.created, b.updated, b.info, COUNT(l.key) FROM batches b "
                "LEFT JOIN batch_lines l ON l.batch_id = b.batch_id "
                + ("WHERE b.state = ? " if state else "") + "GROUP BY b.batch_id ORDER BY b.created DESC",
                (state,) if state else ()).fetchall()
        except sqlite3.Error:
            return []
        return [{"batch_id": r[0], "connection": r[1], "state": r[2], "created": r[3], "updated": r[4],
                 "info": json.loads(r[5] or "{}"), "lines": r[6]} for r in rows]

    def __len__(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM calls").fetchone()[0])

    def clear(self) -> None:
        self._conn().execute("DELETE FROM calls")

    def __repr__(self) -> str:
        return f"CallCache({str(self.path)!r}{', read_only=True' if self.read_only else ''})"


class _transaction:
    """``BEGIN`` ... ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def _warn(message: str) -> None:
    warnings.warn(message, CacheWarning, stacklevel=3)
