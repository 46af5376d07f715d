"""Evaluations on local Spark: the offline metrics at scale, and judged rows behind a request limit.

Run from the repository root with the project's venv and the ``spark`` extra (Java 17 on the machine)::

    .venv/bin/python benchmarks/bench_spark.py --part offline --rows 1000000      # all seven offline metrics
    .venv/bin/python benchmarks/bench_spark.py --part offline --rows 2000 --compare # + evaluate_frame, same rows
    .venv/bin/python benchmarks/bench_spark.py --part rate --rows 200              # 600/min server, ~2 min
    .venv/bin/python benchmarks/bench_spark.py --part rate --rows 200 --rpm 0      # nothing set: limits learned

* ``offline``: ``--rows`` rows of ``throughput.make_rows`` (realistic sizes; a seed per 20,000-row Parquet file, so
  every row is distinct), read back (one partition per file, or ``--partitions``) and scored with
  ``evaluate_spark(sdf, {"judge": "offline:/lexical", "bertscore": False, "cache": False}, log=False)`` on
  ``local[N]`` (``--cores``, default 2); the wall time of the call (validation, scoring, aggregation) and the rows/s.
  ``--compare`` also runs ``evaluate_frame`` on the same rows in this process and reports the largest difference
  between the two runs' metrics.
* ``rate``: the fake OpenAI server (``tests/fakellm.py``, in a child process) with ``CompliantModel("json_schema")``,
  a latency of 300 ms and a limit of 600 requests per sliding 60 s; ``--rows`` rows with correctness, faithfulness,
  context precision and recall (5 requests per row), ``requests_per_minute=600`` in the config, 4 partitions
  (``--partitions``: 3 leaves the last task alone, which without the job's pace file runs at its share) on
  ``local[2]``; ``--rpm 0`` sets no limit: the tasks follow the server's rate-limit headers, or with
  ``--no-headers`` (the server announces no budget, only ``retry-after``) learn the limit from 429s, told of each
  other's through the job's pace file. Two minimum times: the accepted requests at the limit's even rate (10 per
  second), and the sliding window's (600 at once, the next 600 a window later, ...); reported: wall / each, the
  requests' own span (first accepted to last reply), the time before the first request and after the last reply
  (Spark's own share of the wall), 429s and when they came, rows lost.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests")]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
for k, v in {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "MLFLOW_MODEL_CATALOG_URI": ""}.items():
    os.environ.setdefault(k, v)

KEY = "sk-bench-spark-0001"


def session(cores: int):
    from pyspark.sql import SparkSession

    s = (SparkSession.builder.master(f"local[{cores}]").appName("ragjudge-bench")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.memory", "6g").config("spark.sql.shuffle.partitions", str(2 * cores))
         .config("spark.executorEnv.OPENAI_API_KEY", KEY).getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    return s


def offline(args) -> dict:
    import pandas as pd
    from throughput import make_rows

    from mlflow_ragjudge.spark import evaluate_spark

    cfg = {"judge": "offline:/lexical", "bertscore": False, "cache": False}
    tmp = Path(tempfile.mkdtemp(prefix="rj-spark-"))
    chunk = 20_000
    written = 0
    t = time.perf_counter()
    for i in range(0, args.rows, chunk):  # distinct rows (a seed per file), written without the driver holding all
        n = min(chunk, args.rows - i)
        make_rows(n, seed=11 + i).to_parquet(tmp / f"part-{i // chunk:05d}.parquet")
        written += n
    generated = time.perf_counter() - t
    spark = session(args.cores)
    sdf = spark.read.parquet(str(tmp))
    if args.partitions:
        sdf = sdf.repartition(args.partitions)
    t = time.perf_counter()
    res = evaluate_spark(sdf, cfg, log=False)
    wall = time.perf_counter() - t
    out = {"rows": written, "partitions": sdf.rdd.getNumPartitions(), "cores": args.cores,
           "seconds": round(wall, 1), "rows_per_s": round(written / wall, 1),
           "seconds_in_parts": round(res.config["spark"]["seconds_in_parts"], 1),
           "rows_per_s_per_core_in_parts": round(written / max(1e-9, res.config["spark"]["seconds_in_parts"]), 1),
           "data_generation_seconds": round(generated, 1), "correctness_mean": res.metrics.get("correctness/mean"),
           "rows_failed": int(max(v for k, v in res.metrics.items() if k.endswith("/n_failed")))}
    res.unpersist()
    if args.compare:
        import mlflow_ragjudge as rj

        df = pd.concat([pd.read_parquet(f) for f in sorted(tmp.glob("*.parquet"))], ignore_index=True)
        t = time.perf_counter()
        ref = rj.evaluate_frame(df, cfg)
        out["evaluate_frame_seconds"] = round(time.perf_counter() - t, 1)
        out["max_metric_difference"] = max(abs(ref.metrics[k] - res.metrics[k]) for k in ref.metrics)
        out["same_metric_names"] = set(ref.metrics) == set(res.metrics)
    return out


def rate(args) -> dict:
    from throughput import ServerProcess, make_rows  # the fake server in a child process

    from mlflow_ragjudge.spark import evaluate_spark

    with ServerProcess(0.3, 600, headers=not args.no_headers) as server:
        spark = session(2)
        sdf = spark.createDataFrame(make_rows(args.rows)).repartition(args.partitions or 4)
        cfg = {"judge": f"openai:/judge-model?base_url={server.url}", "cache": False,
               "metrics": ["correctness", "faithfulness", "context_precision", "context_recall"]}
        if args.rpm:
            cfg["requests_per_minute"] = args.rpm
        t, started = time.perf_counter(), time.time()
        res = evaluate_spark(sdf, cfg, log=False)
        wall, ended = time.perf_counter() - t, time.time()
        stats = server.stats()
    accepted = stats["http_requests"] - stats["http_429"]
    minimum = accepted / 10.0  # the limit's even rate: 600 per minute
    # the sliding window's minimum: 600 at once, the next 600 a window later, ... (+ one reply's latency)
    full, rest = divmod(accepted, 600)
    sliding = (full - 1 if rest == 0 else full) * 60.0 + 0.3
    span = float(stats.get("last_chat_at", 0.0)) - float(stats.get("first_chat_at", 0.0)) + 0.3
    failed = int(max(res.metrics.get(f"{m}/n_failed", 0) for m in cfg["metrics"]))
    return {"rows": args.rows, "partitions": args.partitions or 4, "requests_per_minute": args.rpm or None,
            "rate_limit_headers": not args.no_headers, "accepted": accepted,
            "rate_limited": stats["http_429"], "refused_per_accepted": round(stats["http_429"] / max(1, accepted), 4),
            "seconds": round(wall, 1), "limit_minimum_seconds": round(minimum, 1),
            "ratio": round(wall / minimum, 3) if minimum else None,
            "sliding_minimum_seconds": round(sliding, 1), "ratio_to_sliding": round(wall / sliding, 3),
            # the requests alone: from the first accepted request to the last reply (Spark's start-up left out)
            "requests_seconds": round(span, 1), "requests_ratio_to_sliding": round(span / sliding, 3),
            # the rest of the wall: from the call to the first request (validation, Spark's Python workers), and from
            # the last reply to the call's return (the results' merge, the per-row table)
            "before_first_request_s": round(float(stats.get("first_chat_at", started)) - started, 1),
            "after_last_reply_s": round(ended - float(stats.get("last_chat_at", ended)) - 0.3, 1),
            "rows_failed": failed,
            # when the 429s came, in seconds from the first accepted request
            "refused_after_s": [round(t - float(stats.get("first_chat_at", 0.0)), 2) for t in stats["refused_at"]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["offline", "rate"], required=True)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--partitions", type=int, default=0, help="repartition to this many (default: one per file)")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--compare", action="store_true")
    p.add_argument("--no-headers", action="store_true", help="the server sends no x-ratelimit-* headers, only "
                   "retry-after on a 429 (the tasks learn the limit)")
    p.add_argument("--rpm", type=float, default=600, help="the config's requests_per_minute (0: nothing set, the "
                   "tasks learn the limit from 429s and share each 429's quiet through the job's pace file)")
    args = p.parse_args()
    os.environ["OPENAI_API_KEY"] = KEY
    print(json.dumps(offline(args) if args.part == "offline" else rate(args), indent=1))


if __name__ == "__main__":
    main()
