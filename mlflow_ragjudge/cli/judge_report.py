"""``ragjudge judge-report RUN --labels FILE``: the judge against people (docs/judge-report.md)."""

from __future__ import annotations

import argparse


def judge_report_command(args: argparse.Namespace) -> int:
    """Print the report and log it into the run (or ``--log-to``); exit 0, or 2 for bad input (nothing logged)."""
    from ..adapters.tracking import check_tracking_store
    from ..workflows.judge_report import judge_report

    check_tracking_store(args.tracking_uri, None, nothing="Nothing was read or logged.")
    if args.show < 0:
        raise ValueError(f"--show {args.show} must be 0 or more (disagreeing rows to print)")
    report = judge_report(args.run_id, args.labels, metric=args.metric, label_column=args.label_column,
                          row_id_column=args.row_id_column, threshold=args.threshold, log=not args.no_log,
                          log_to=args.log_to)
    print(report.summary(shown=args.show))
    return 0
