"""The judge-call cache on the file system it finds: WAL on a local disk; SQLite's rollback journal on a network or
FUSE file system (a cache shared by a cluster's executors), where WAL's shared memory does not exist."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mlflow_ragjudge.llm import cache as cache_mod
from mlflow_ragjudge.llm.cache import CallCache, filesystem_of, on_network_filesystem


def _journal(path: Path) -> str:
    with sqlite3.connect(path) as db:
        return str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()


def test_the_file_system_is_read_from_the_mount_table(tmp_path):
    kind = filesystem_of(tmp_path)
    assert kind and kind != "proc"  # the tmp dir is on some real file system
    assert filesystem_of(Path("/proc/self")) == "proc"
    assert on_network_filesystem("nfs4") and on_network_filesystem("fuse.s3fs") and on_network_filesystem("cifs")
    assert not on_network_filesystem("ext4") and not on_network_filesystem("tmpfs") and not on_network_filesystem("")


def test_a_local_cache_uses_wal(tmp_path):
    c = CallCache(tmp_path / "calls.sqlite")
    c.put("k", {"v": 1})
    assert c.status()["journal"] == "wal" and _journal(tmp_path / "calls.sqlite") == "wal"


def test_a_cache_on_a_network_file_system_uses_the_rollback_journal(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod, "filesystem_of", lambda p: "nfs4")
    c = CallCache(tmp_path / "shared.sqlite")
    c.put("k", {"v": 1})
    assert c.get("k") == {"v": 1}
    status = c.status()
    assert status["filesystem"] == "nfs4" and status["journal"] == "delete"
    assert _journal(tmp_path / "shared.sqlite") == "delete"
    assert not (tmp_path / "shared.sqlite-wal").exists()
    # a second process's view (another connection) reads what the first stored
    assert CallCache(tmp_path / "shared.sqlite").get("k") == {"v": 1}
