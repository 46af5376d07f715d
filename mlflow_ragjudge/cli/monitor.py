"""``ragjudge monitor --experiment NAME``: judge a traced app's new traces where they are (docs/monitoring.md)."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from ..core.constants import DEFAULT_OFFLINE_JUDGE
from ..core.errors import JudgeFailureWarning
from ..core.stop import EXIT_SIGNAL, stop_reason, stop_requested
from .common import config_json, exit_code, judge_config, numbers
from .evaluate import spark_session
from .exits import EXIT_NOT_LOGGED


def _sample(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--sample {text!r}: give a rate in (0, 1) such as 0.1, or a whole number of traces such "
                         "as 50") from None


def monitor_config(args: argparse.Namespace) -> dict[str, Any]:
    cfg = config_json(args.config)
    if args.judge:
        judge_config(args, cfg)
    cfg.setdefault("judge", DEFAULT_OFFLINE_JUDGE)
    for flag in ("language", "context_mode", "embeddings", "max_concurrency", "gate_rule"):
        if getattr(args, flag, None) is not None:
            cfg[flag] = getattr(args, flag)
    if args.no_cache:
        cfg["cache"] = False
    if args.batch:
        cfg["batch"] = True
    return cfg


def monitor_command(args: argparse.Namespace) -> int:
    """Run one pass, or passes ``--every`` DURATION; print each pass. Exit 3 when the judge failed on too many traces,
    4 / 6 on the last pass's gates, 5 when the tracking store failed during a single pass (with ``--every`` the next
    pass tries again), 130 / 143 when stopped."""
    from ..adapters.monitor_store import store_failure
    from ..adapters.tracking import bounded_store_retries, check_tracking_store
    from ..workflows.monitor import monitor, parse_every, parse_since

    cfg = monitor_config(args)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    max_drop = numbers(args.max_drop, "--max-drop")
    if max_drop and not args.baseline:
        raise ValueError("--max-drop needs --baseline RUN|first|previous: the pass to compare with")
    every = parse_every(args.every) if args.every else None
    if args.passes is not None and args.passes < 1:
        raise ValueError(f"--passes {args.passes}: at least 1")
    spans = args.retriever_spans
    retriever_spans = spans if spans in ("all", "first", "last") else [s.strip() for s in spans.split(",")]
    bounded_store_retries()  # a store that goes down fails a request in about a minute; the next pass goes on
    check_tracking_store(args.tracking_uri, None, nothing="Nothing was sent to the judge.")
    spark = None
    if args.spark:
        try:
            import pyspark  # noqa: F401
        except ImportError:
            raise ValueError("--spark needs pyspark and pyarrow: pip install 'mlflow-ragjudge[spark]'") from None
        from ..adapters.spark import pandas_support_note

        with pandas_support_note():
            spark = spark_session("ragjudge monitor", args.spark_master)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JudgeFailureWarning)  # said after the summary, with the exit code
        try:
            passes = monitor(args.experiment, cfg.pop("judge"), metrics, every=every, passes=args.passes,
                             on_pass=lambda r: print(r.summary(), flush=True), filter_string=args.filter_string,
                             since=parse_since(args.since) if args.since else None, sample=_sample(args.sample),
                             max_traces=args.max_traces, seed=args.seed, settle=args.settle,
                             fail_under=numbers(args.fail_under, "--fail-under"), max_drop=max_drop,
                             baseline=args.baseline, retriever_spans=retriever_spans, config=cfg, spark=spark)
        except Exception as e:
            if not store_failure(e):
                raise
            print(f"error: the tracking store failed during the pass ({type(e).__name__}: {str(e)[:300]}); what was "
                  "attached stays on the traces, and the next `ragjudge monitor` goes on from the watermark",
                  file=sys.stderr)
            return EXIT_NOT_LOGGED
    last = passes[-1]
    if stop_requested():  # within a pass (what was attached stays) or between passes
        reason = stop_reason() or "SIGINT"
        print(f"stopped by {reason}: {len(passes)} pass(es) done; the next `ragjudge monitor` goes on from the "
              "watermark and judges nothing twice", file=sys.stderr)
        return EXIT_SIGNAL.get(reason, EXIT_SIGNAL["SIGINT"])
    return exit_code(last)  # 3: the judge failed on too many traces; 4 / 6: a gate failed / is undecided
