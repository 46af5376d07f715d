"""Batch API vs synchronous judge calls, side by side, at a given synchronous rate limit.

The same 200 rows, correctness + faithfulness + answer relevancy + context precision + context recall, judged by
the fake server's independent schema-following model through the real ``openai`` SDK:

* synchronously, behind a rate limit of ``--rpm`` requests per minute (the client paced at that rate, as a user
  who knows the tier sets ``requests_per_minute``);
* through the Batch API (Files + Batches on the fake server), each batch taking ``--turnaround`` seconds from
  creation to completion (a real provider's turnaround is minutes to 24 h; the fake's is a setting).

Both runs get the same replies; the script checks the per-row scores are equal and reports wall time, chat
requests sent synchronously, batches and rounds, and the cost at gpt-4o-mini's list price (batch: half).

    .venv/bin/python benchmarks/batch_vs_sync.py --rows 200 --rpm 600 --turnaround 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from compliant_model import CompliantModel  # noqa: E402
from fakellm import FakeLLMServer, embed_text  # noqa: E402

from mlflow_ragjudge import evaluate_frame  # noqa: E402

METRICS = ["correctness", "faithfulness", "answer_relevancy", "context_precision", "context_recall"]


def rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({
        "question": [f"What does unit {i} do, and how often does it report?" for i in range(n)],
        "answer": [f"Unit {i} stores the sensor data of hall {i % 9} and sends a report every {i % 7 + 1} days."
                   for i in range(n)],
        "reference": [f"Unit {i} stores sensor data and reports every {i % 7 + 1} days." for i in range(n)],
        "contexts": [[f"Unit {i} is the storage node of hall {i % 9}; it keeps all sensor data.",
                      f"Reports from unit {i} go out every {i % 7 + 1} days to the operations team.",
                      "Maintenance windows are announced a week ahead."] for i in range(n)],
    })


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--rpm", type=int, default=600, help="the synchronous rate limit, requests per minute")
    ap.add_argument("--turnaround", type=float, default=20.0, help="seconds a fake batch takes to complete")
    ap.add_argument("--out", help="write the figures as JSON")
    args = ap.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-0000")
    server = FakeLLMServer().start()
    server.set_handler(CompliantModel("json_schema"))
    judge = f"openai:/gpt-4o-mini?base_url={server.openai_base_url}"
    df = rows(args.rows)
    base = {"judge": judge, "metrics": METRICS, "context_mode": "generation", "progress": False,
            "embeddings": lambda texts: [embed_text(t) for t in texts]}
    server.rate_limit_per_minute = args.rpm
    t0 = time.perf_counter()
    sync = evaluate_frame(df, {**base, "cache": False, "requests_per_minute": args.rpm})
    sync_s = time.perf_counter() - t0
    sync_chat = len(server.requests_for("openai_chat"))
    sync_429 = server.rate_limited_count
    server.reset()
    server.batches.delay = args.turnaround
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        batch = evaluate_frame(df, {**base, "cache": cache,
                                    "batch": {"poll_interval": 1.0, "max_poll_interval": 5.0, "progress": False}})
    batch_s = time.perf_counter() - t0
    cols = [c for c in sync.table.columns if c.endswith("/score") or c.endswith("/status")]
    same = sync.table[cols].astype(str).equals(batch.table[cols].astype(str))
    rounds = len(server.batches.created)
    out = {
        "rows": args.rows, "rpm": args.rpm, "turnaround_s": args.turnaround, "same_scores": same,
        "sync": {"seconds": round(sync_s, 1), "chat_requests": sync_chat, "cost_usd": sync.metrics["judge/cost_usd"],
                 "rate_limited_429": sync_429},
        "batch": {"seconds": round(batch_s, 1), "chat_requests": len(server.requests_for("openai_chat")),
                  "batches": rounds, "lines": len(server.batches.submitted),
                  "cost_usd": batch.metrics["judge/cost_usd"],
                  "fake_processing_s": round(server.batches.processing_s, 1),
                  "overhead_s": round(batch_s - rounds * args.turnaround - server.batches.processing_s, 1)},
    }
    server.stop()
    print(f"{args.rows} rows, {', '.join(METRICS)}; synchronous limit {args.rpm}/min; batch turnaround "
          f"{args.turnaround:g} s; same per-row scores: {same}")
    print(f"{'':<12}{'wall s':>8}{'chat requests':>15}{'batches':>9}{'lines':>7}{'cost $':>10}")
    s, b = out["sync"], out["batch"]
    print(f"{'synchronous':<12}{s['seconds']:>8}{s['chat_requests']:>15}{'-':>9}{'-':>7}{s['cost_usd']:>10.4f}")
    print(f"{'batch':<12}{b['seconds']:>8}{b['chat_requests']:>15}{b['batches']:>9}{b['lines']:>7}{b['cost_usd']:>10.4f}")
    print(f"synchronous: {s['rate_limited_429']} of its requests were answered 429 and sent again")
    print(f"batch wall time = {rounds} rounds x {args.turnaround:g} s turnaround + {b['fake_processing_s']} s the fake "
          f"server spent answering the lines + {b['overhead_s']} s ours (submitting, waiting for the next poll, "
          "parsing, scoring)")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
