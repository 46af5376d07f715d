"""Run a benchmark script again on the package as committed at a git revision (``--rev``), not the working tree."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: set in the child: it measures the exported package, and runs no child of its own
CHILD = "RAGJUDGE_BENCH_AT_REV"


def in_child() -> bool:
    return os.environ.get(CHILD) == "1"


def rerun_at(rev: str, script: str, argv: list[str] | None) -> int:
    """``git archive`` the package at ``rev`` into a temporary folder and run ``script`` again with it first on
    ``PYTHONPATH`` (ahead of the editable install); returns the child's exit status."""
    src = Path(tempfile.mkdtemp(prefix="bench-at-rev-"))
    archive = subprocess.run(["git", "archive", rev, "mlflow_ragjudge"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    env = {**os.environ, "PYTHONPATH": str(src), CHILD: "1"}
    return subprocess.run([sys.executable, script, *(argv if argv is not None else sys.argv[1:])],
                          env=env).returncode
