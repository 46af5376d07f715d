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

**The cache never costs a result** (:meth:`CallCache.open`, docs/failure-modes.md): a file that is
not a database or is damaged is moved aside (``calls.sqlite.corrupt-<time>``) with a warning and a
fresh cache is used; a cache that cannot be written (read-only file or directory) is used read-only
with a warning; one that cannot be created at all is left out with a warning and the run goes on
without it. While the run goes on, a lookup that fails is a miss, and a write that cannot get the
database lock within ``lock_timeout`` seconds (another process is writing) is skipped -- the row
keeps the reply it paid for; the run records how many writes were skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from ..core.errors import CacheWarning

ENV_CACHE_DIR = "RAGJUDGE_CACHE_DIR"
_SCHEMA_VERSION = "1"
_CREATE = "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL)"
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

    Raises:
        OSError: the directory cannot be created; ``sqlite3.Error``: the file cannot be opened or is
        damaged. :meth:`open` turns each of these into a warning and a way forward.
    """

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False, lock_timeout: float = 2.0) -> None:
        p = _resolve(path)
        if not read_only:
            p.parent.mkdir(parents=True, exist_ok=True)
        self.path = p
        self.filesystem = filesystem_of(p.parent if p.parent.exists() else Path.cwd())
        self.journal = "delete" if on_network_filesystem(self.filesystem) else "wal"
        self.read_only = read_only
        self.lock_timeout = lock_timeout
        self.skipped_writes = 0
        self.failed_reads = 0
        self.events: list[str] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        conn = self._conn()
        if not read_only:
            conn.execute(_CREATE)
            for statement in _CREATE_BATCHES:
                conn.execute(statement)
        key = str(p.resolve())
        with _CHECKED_LOCK:
            checked = key in _CHECKED
        if not checked:
            row = conn.execute("PRAGMA quick_check(1)").fetchone()
            if row is None or str(row[0]).lower() != "ok":
                raise sqlite3.DatabaseError(f"the cache file is damaged (quick_check: {row[0] if row else 'none'})")
            conn.execute("SELECT COUNT(*) FROM calls").fetchone()  # the table is there and readable
            with _CHECKED_LOCK:
                _CHECKED.add(key)

    @classmethod
    def open(cls, path: str | Path | None = None) -> CallCache | None:
        """Open the cache so that it never costs a result (see the module docstring).

        Returns a read-write cache, a read-only one, or ``None`` (run without a cache); every
        fallback is announced with a :class:`CacheWarning` that names the file and the fix.
        """
        p = _resolve(path)
        try:
            return cls(p)
        except OSError as e:
            if not p.exists():
                _warn(f"the judge-call cache {p} cannot be created ({e}); running without a cache "
                      f"(set {ENV_CACHE_DIR} or cache=<writable path> to keep replies across runs).")
                return None
            return cls._read_only(p, e)
        except sqlite3.OperationalError as e:
            if _readonly_error(e):
                return cls._read_only(p, e)
            if "locked" in str(e).lower() or "busy" in str(e).lower():
                _warn(f"the judge-call cache {p} is locked by another process ({e}); running without a cache.")
                return None
            return cls._replace_damaged(p, e)
        except sqlite3.DatabaseError as e:  # not a database, malformed, failed check
            return cls._replace_damaged(p, e)

    @classmethod
    def _read_only(cls, p: Path, error: BaseException) -> CallCache | None:
        try:
            cache = cls(p, read_only=True)
        except (OSError, sqlite3.Error) as e:
            _warn(f"the judge-call cache {p} cannot be written ({error}) nor read ({e}); running without a cache "
                  f"(set {ENV_CACHE_DIR} or cache=<writable path>).")
            return None
        cache.events.append(f"read-only: {error}")
        _warn(f"the judge-call cache {p} cannot be written ({error}); using it read-only: cached replies are "
              f"reused, new ones are not stored (set {ENV_CACHE_DIR} or cache=<writable path> to store them).")
        return cache

    @classmethod
    def _replace_damaged(cls, p: Path, error: BaseException) -> CallCache | None:
        aside = p.with_name(f"{p.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            p.rename(aside)
            for suffix in ("-wal", "-shm"):
                side = p.with_name(p.name + suffix)
                if side.exists():
                    side.rename(aside.with_name(aside.name + suffix))
            cache = cls(p)
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
                conn.execute(f"PRAGMA journal_mode={self.journal.upper()}")
                conn.execute("PRAGMA synchronous=NORMAL" if self.journal == "wal" else "PRAGMA synchronous=FULL")
            self._local.conn = conn
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
