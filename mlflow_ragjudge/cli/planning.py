"""``ragjudge plan RUN [RUN_B] --metric NAME (--width W | --detect D)``: rows, repeats and labels, planned from a run
(docs/planning.md)."""

from __future__ import annotations

import argparse


def plan_command(args: argparse.Namespace) -> int:
    """Print the plan's table; nothing is logged or sent."""
    from ..adapters.tracking import check_tracking_store
    from ..workflows.planning import plan

    check_tracking_store(args.tracking_uri, None, nothing="Nothing was read.")
    result = plan(args.run_id, args.run_b, metric=args.metric, width=args.width, detect=args.detect,
                  power=args.power, alpha=args.alpha)
    print(result.text())
    return 0
