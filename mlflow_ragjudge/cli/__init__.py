"""Command line: ``ragjudge evaluate <file> --judge <URI> ...`` and ``ragjudge quickstart``.

``evaluate`` reads JSONL, CSV or Parquet (list columns in CSV as JSON text),
creates an MLflow run with metrics, the per-row table, transcripts and config,
and prints a short summary and the run's location.

Exit codes (docs/failure-modes.md):

* 0 -- the run completed and every gate passed;
* 2 -- bad input or configuration, found before any judge call (nothing was sent);
* 3 -- the run completed and was logged, but a judged metric failed on more than
  ``--max-error-rate`` of its rows (the judge is not working: see the warning); for ``sweep``, also a variant
  whose pipeline failed on more than ``max_error_rate`` of its questions;
* 4 -- the run completed and was logged, but a ``--fail-under METRIC=VALUE`` gate failed: the 95 % interval of
  the metric's mean lies below VALUE (with ``--gate-rule point``: the mean does);
* 5 -- the evaluation completed but could not be logged to MLflow; the message names the local folder
  where its results (table, transcripts, config, metrics) were saved first; also when the tracking store stopped
  answering while the run's traces were written (the summary says how to write them: ``ragjudge log-saved``);
* 6 -- the run completed and was logged, no gate failed, but a gate is undecided: the interval straddles VALUE;
  the message names about how many more rows (or, with repeats, how many repeats) would decide it;
* 130 / 143 -- stopped by Ctrl-C (SIGINT) / SIGTERM: what was done is logged (run status KILLED) and the message
  says how to finish; a second Ctrl-C exits at once.

When both 3 and 4 (or 6) apply the exit code is 3: a gate measured by a failing judge means nothing; when a gate
failed and another is undecided, 4.
"""

from __future__ import annotations

import os
import sys

from ..adapters.tracking import bounded_store_requests
from ..core.errors import InputError, Interrupted, LoggingFailed
from ..core.stop import EXIT_SIGNAL, stop_on_signals, stop_reason, stop_requested
from .common import exit_code, store_stopped, summary
from .evaluate import (
    config_from_args,
    estimate_command,
    metrics_table,
    run_evaluation,
    run_spark_evaluation,
    stopped_message,
    testset_command,
)
from .exits import (
    EXIT_BAD_INPUT,
    EXIT_GATE_FAILED,
    EXIT_GATE_UNDECIDED,
    EXIT_JUDGE_FAILURES,
    EXIT_NOT_LOGGED,
    EXIT_OK,
)
from .judge_report import judge_report_command
from .labels import labels_command, log_saved_command
from .monitor import monitor_command
from .parser import build_parser
from .planning import plan_command
from .reading import load_plugins, read_grid, read_table
from .streams import guarded_streams
from .sweep import QUICKSTART_VARIANTS, quickstart_command, sweep_command

__all__ = ["main", "read_table", "read_grid", "metrics_table", "QUICKSTART_VARIANTS", "EXIT_OK", "EXIT_BAD_INPUT",
           "EXIT_JUDGE_FAILURES", "EXIT_GATE_FAILED", "EXIT_NOT_LOGGED", "EXIT_GATE_UNDECIDED"]


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. Output nobody reads any more (``| head``, ``2>&-``) never stops it
    (:mod:`.streams`)."""
    with guarded_streams():
        return _command(argv)


def _command(argv: list[str] | None) -> int:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no progress bars between our lines
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    # Ctrl-C / SIGTERM: stop sending, keep what arrives, log what is done (core.stop); a tracking server that stops
    # answering fails a request in about 30 s, not 4 min, and once it has, each further request gets one try
    with stop_on_signals(), bounded_store_requests():
        code = _main(argv)
    if code in EXIT_SIGNAL.values() and as_program:
        _exit_without_waiting(code)
    return code


def _exit_without_waiting(code: int) -> None:
    """After a stop: a judge request still in flight past the grace period must not hold the process until its
    timeout (Python waits for worker threads at exit). Everything is logged and flushed by now."""
    import threading

    if any(t.name.startswith("ragjudge") and t.is_alive() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing more to say
                pass
        os._exit(code)


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    try:
        load_plugins(getattr(args, "plugin", None))
        if args.command == "metrics":
            print(metrics_table())
            return 0
        if args.command == "evaluate" and args.spark:
            run_id, out = run_spark_evaluation(args, config_from_args(args))
        elif args.command == "evaluate":
            cfg = config_from_args(args)
            df = read_table(args.data, cfg.get("col_mapping"))
            run_id, out = run_evaluation(
                df, cfg, experiment=args.experiment, run_name=args.run_name, tracking_uri=args.tracking_uri
            )
        elif args.command == "sweep":
            return sweep_command(args)
        elif args.command in ("label-sample", "calibrate"):
            return labels_command(args)
        elif args.command == "log-saved":
            return log_saved_command(args)
        elif args.command == "judge-report":
            return judge_report_command(args)
        elif args.command == "testset":
            return testset_command(args)
        elif args.command == "estimate":
            return estimate_command(args)
        elif args.command == "plan":
            return plan_command(args)
        elif args.command == "monitor":
            return monitor_command(args)
        else:
            return quickstart_command(args)
    except Interrupted as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_SIGNAL.get(e.signal, EXIT_SIGNAL["SIGINT"])
    except (InputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LoggingFailed as e:
        print(f"error: {e}", file=sys.stderr)
        if e.saved_to is not None:
            from ..adapters.tracking import env_command

            where = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in (
                ("experiment", getattr(args, "experiment", None)), ("run_name", getattr(args, "run_name", None)),
                ("tracking_uri", getattr(args, "tracking_uri", None))) if v)
            print(f"when the tracking store answers again, log them with: {env_command('ragjudge')} log-saved "
                  f"{e.saved_to}{' ' + where if where else ''}", file=sys.stderr)
        return EXIT_NOT_LOGGED
    print(summary(run_id, out))
    if getattr(out, "unwritten", None):  # --spark --spark-output: logged, but the rows are not where asked
        print(f"error: {out.unwritten}", file=sys.stderr)
        return EXIT_NOT_LOGGED
    if out.config.get("interrupted"):
        print(stopped_message(run_id, out, argv), file=sys.stderr)
        return EXIT_SIGNAL.get(out.config["interrupted"]["by"], EXIT_SIGNAL["SIGINT"])
    if stop_requested():  # stopped while the finished evaluation was logged (its traces): said in the summary
        reason = stop_reason() or "SIGINT"
        print(f"stopped by {reason} while run {run_id} was logged: its results are logged, its traces as the "
              "summary says", file=sys.stderr)
        return EXIT_SIGNAL.get(reason, EXIT_SIGNAL["SIGINT"])
    code = exit_code(out)
    if store_stopped(run_id):  # logged but for its traces and its end: as exit 5, the summary says how to finish
        print(f"error: the tracking store stopped answering while run {run_id}'s traces were written (exit "
              f"{EXIT_NOT_LOGGED} unless a judge or gate failure says more)", file=sys.stderr)
        return EXIT_NOT_LOGGED if code == EXIT_OK else code
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
