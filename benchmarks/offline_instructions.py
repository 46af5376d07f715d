"""CPU instructions per row of the offline metrics, counted by valgrind: a measure that another process on the same
cores does not change (``benchmarks/throughput.py``'s CPU time per row moves by ±20 % with the host's load).

Run from the repository root (valgrind must be installed; about two minutes for the default 1,000 rows)::

    .venv/bin/python benchmarks/offline_instructions.py
    .venv/bin/python benchmarks/offline_instructions.py --rows 600 --metrics correctness,context_relevance

The rows are ``throughput.py``'s synthetic rows. Each count runs the offline metrics (``judge="offline:/lexical"``,
``bertscore=False``, ``cache=False``) under ``valgrind --tool=cachegrind --cache-sim=no`` in a child process, once on
``--rows`` rows and once on none (imports, the same rows' construction and a warm-up on their first 20 are in both),
with ``PYTHONHASHSEED=0``; the difference divided by the rows is the figure. Repeated counts agree to about 1 %.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALL = "correctness,faithfulness,context_precision,context_recall,context_relevance,lexical,retrieval"


def _child(scored: int, rows: int, metrics: str) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import throughput  # (the child alone needs the benchmark's rows, and pandas)

    cfg = {"judge": "offline:/lexical", "metrics": metrics.split(","), "bertscore": False, "cache": False,
           "progress": False}
    df = throughput.make_rows(max(rows, 20))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        throughput.evaluate_frame(df.head(20), cfg)
        if scored:
            throughput.evaluate_frame(df.head(scored), cfg)


def _instructions(scored: int, rows: int, metrics: str) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", sys.executable,
           __file__, "--child", str(scored), "--rows", str(rows), "--metrics", metrics]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stderr
    found = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--metrics", default=ALL)
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        _child(a.child, a.rows, a.metrics)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    per_row = (_instructions(a.rows, a.rows, a.metrics) - _instructions(0, a.rows, a.metrics)) / a.rows
    print(f"{a.metrics}: {per_row / 1e6:.2f} M instructions per row ({a.rows} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
