"""CPU per judge request: the package at a git revision against the working tree, side by side, and the raw SDK's
floor -- what our own share of each request costs (client, engine, metric code, thread switches).

Run from the repository root::

    .venv/bin/python benchmarks/bench_request_cpu.py --rev HEAD~1            # ~1 min: 3 rounds of each
    .venv/bin/python benchmarks/bench_request_cpu.py --rev 63e0970 --rounds 5 --rows 300

Each round runs, in alternation and each in a fresh child process (so both pay the same imports and warm-ups):
``evaluate_frame`` of correctness, faithfulness, context precision and context recall (5 chat requests per row) on
``--rows`` synthetic rows (``benchmarks/throughput.py``'s rows) against the fake OpenAI server of
``benchmarks/throughput.py`` in its own process (``CompliantModel("json_schema")``, latency 0), with 2 calls in
flight; the package is the one exported from ``--rev`` (``git archive``) or the working tree. Reported: process
CPU seconds of the call over the requests the server received (the median of the rounds), and the raw ``openai``
SDK's CPU per request for requests of the same size on one thread (``throughput.py``'s ``sdk-floor``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time, warnings
sys.path.insert(0, sys.argv[1])          # the package under test, ahead of the editable install
import mlflow_ragjudge, mlflow_ragjudge.engine.evaluate
sys.path.insert(1, sys.argv[2])          # benchmarks/ (throughput.py's rows and server)
import throughput as T
from mlflow_ragjudge import evaluate_frame
rows = int(sys.argv[3])
os.environ.setdefault("OPENAI_API_KEY", "sk-bench-000000000000")
df = T.make_rows(rows)
with T.ServerProcess(0.0, 0) as server:
    cfg = {"judge": f"openai:/m?base_url={server.url}", "metrics": list(T.JUDGED), "cache": False,
           "progress": False, "max_concurrency": 2}
    T.configure_provider(cfg["judge"], max_concurrency=2)
    warnings.simplefilter("ignore")
    evaluate_frame(df.head(5), cfg)      # imports, connections, the structured-output negotiation
    before = server.stats()
    cpu0 = time.process_time()
    evaluate_frame(df, cfg)
    cpu = time.process_time() - cpu0
    sent = server.stats()["http_requests"] - before["http_requests"]
    floor = T.run_sdk_floor(df, 300) if sys.argv[4] == "1" else None
print(json.dumps({"package": mlflow_ragjudge.__file__, "requests": sent, "cpu_ms_per_request": 1000 * cpu / sent,
                  "sdk_floor_ms": floor and floor.get("cpu_ms_per_request")}))
"""


def _export(rev: str, into: Path) -> Path:
    data = subprocess.run(["git", "archive", rev, "mlflow_ragjudge"], cwd=ROOT, capture_output=True,
                          check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def _run(package: Path, rows: int, floor: bool) -> dict:
    env = {**os.environ, "MLFLOW_TRACKING_URI": os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///:memory:")}
    out = subprocess.run([sys.executable, "-c", CHILD, str(package), str(ROOT / "benchmarks"), str(rows),
                          "1" if floor else "0"], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True, help="the git revision to compare the working tree with")
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = _export(args.rev, Path(tmp))
        runs: dict[str, list[float]] = {args.rev: [], "working tree": []}
        floors: list[float] = []
        for r in range(args.rounds):
            for name, pkg in ((args.rev, old), ("working tree", ROOT)):
                res = _run(pkg, args.rows, floor=name == "working tree")
                runs[name].append(res["cpu_ms_per_request"])
                if res["sdk_floor_ms"]:
                    floors.append(res["sdk_floor_ms"])
                print(f"round {r + 1} {name:>14}: {res['cpu_ms_per_request']:.2f} CPU ms/request "
                      f"({res['requests']} requests; {res['package']})", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    floor = statistics.median(floors) if floors else float("nan")
    print(f"\n| package | CPU ms/request (median of {args.rounds}) | above the SDK floor |")
    print("|---|---:|---:|")
    for name, v in med.items():
        print(f"| {name} | {v:.2f} | {v - floor:.2f} |")
    print(f"| raw openai SDK, one thread (floor) | {floor:.2f} | |")
    print(f"\nworking tree / {args.rev}: {med['working tree'] / med[args.rev]:.2f}x the CPU per request; "
          f"our own share {med['working tree'] - floor:.2f} ms against {med[args.rev] - floor:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
