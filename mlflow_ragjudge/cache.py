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
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["CallCache", "cache_key", "default_cache_dir"]

ENV_CACHE_DIR = "RAGJUDGE_CACHE_DIR"
_SCHEMA_VERSION = "1"


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
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class CallCache:
    """A key-value store of JSON replies in one SQLite file.

    One connection per thread (SQLite connections are not shared across threads);
    WAL mode lets several processes read while one writes.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        p = Path(path) if path is not None else default_cache_dir() / "calls.sqlite"
        if p.suffix == "" or p.is_dir():
            p = p / "calls.sqlite"
        p.parent.mkdir(parents=True, exist_ok=True)
        self.path = p
        self._local = threading.local()
        with self._conn() as c:
            c.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL)")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def get(self, key: str) -> dict[str, Any] | None:
        row = self._conn().execute("SELECT value FROM calls WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            value = json.loads(row[0])
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._conn().execute(
            "INSERT OR REPLACE INTO calls (key, value, created) VALUES (?, ?, ?)",
            (key, json.dumps(value, ensure_ascii=False), time.time()),
        )

    def __len__(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM calls").fetchone()[0])

    def clear(self) -> None:
        self._conn().execute("DELETE FROM calls")

    def __repr__(self) -> str:
        return f"CallCache({str(self.path)!r})"
