"""A real local `mlflow server` and headless Chromium, for UI tests and the docs screenshot."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(workdir: Path, timeout: float = 120, *, jobs: bool = False) -> tuple[subprocess.Popen, str]:
    """Start `mlflow server` on 127.0.0.1 with a SQLite store in ``workdir``; returns (process, url).

    ``workdir / "mlflow.db"`` is created (and migrated) by the server unless it is there already. ``jobs``: MLflow's
    job execution, off by default: it starts several consumer processes (each importing mlflow) that neither
    logging runs nor the UI pages need.
    """
    port = free_port()
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="true" if jobs else "false")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
         "--default-artifact-root", str(workdir / "artifacts"), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=workdir,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"mlflow server did not answer within {timeout:g} s")


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(url: str, *, screenshot: Path | None = None, width: int = 1500, height: int = 1100,
             budget_ms: int = 25000) -> str:
    """Render ``url`` headless; returns the DOM after ``budget_ms`` of virtual time (or writes a PNG)."""
    browser = chromium_path()
    if browser is None:
        raise FileNotFoundError("chromium not found: apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile:
        args = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                f"--virtual-time-budget={budget_ms}"]
        args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
        proc = subprocess.run([*args, url], check=True, capture_output=True, text=True, timeout=240)
    return proc.stdout
