"""``ragjudge label-sample``, ``calibrate`` and ``log-saved``."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from ..core.errors import InputError
from .common import exit_code, summary
from .exits import EXIT_NOT_LOGGED


def labels_command(args: argparse.Namespace) -> int:
    """``ragjudge label-sample`` and ``ragjudge calibrate``."""
    from ..adapters.tracking import check_tracking_store, env_command
    from ..workflows import calibration, calibration_traces

    check_tracking_store(args.tracking_uri, None, nothing="Nothing was read or logged.")
    store = f" --tracking-uri {args.tracking_uri}" if args.tracking_uri else ""
    ragjudge = env_command("ragjudge")
    metrics = [m.strip() for m in (args.metrics or "").split(",") if m.strip()] or None
    if args.command == "label-sample":
        if args.review_queue:
            if not metrics:
                raise InputError("--review-queue needs --metrics (the metrics people label, e.g. correctness)")
            queue = calibration_traces.queue_for_review(args.run_id, metrics, args.n, seed=args.seed)
            what = {"created": "", "reused": " (it already held this draw: the same seed draws the same traces)",
                    "filled": " (an empty queue of that name, left by an earlier failure, now holds the draw)"}
            print(f"review queue {queue.name} ({queue.queue_id}){what[queue.outcome]}: {len(queue.trace_ids)} "
                  f"sampled traces of run {args.run_id} to label for {', '.join(metrics)} in the MLflow UI; then: "
                  f"{ragjudge} calibrate {args.run_id} --metrics {','.join(metrics)}{store}")
            return 0
        if not args.out:
            raise InputError("label-sample needs --out FILE (.csv, .jsonl or .xlsx), or --review-queue")
        frame = calibration.label_sample(args.run_id, args.n, seed=args.seed, metrics=metrics, path=args.out)
        label_cols = [c for c in frame.columns if c not in calibration.INFO_COLUMNS]
        print(f"{len(frame)} rows to label -> {args.out} ({frame['row_id'].nunique()} questions x "
              f"{frame['run_id'].nunique()} run(s), shuffled, no judge verdicts). Fill {', '.join(label_cols)} on each "
              f"metric's scale (leave blank what you skip), then: {ragjudge} calibrate {args.run_id} --labels "
              f"{args.out}{store}")
        return 0
    lam = 1.0 if args.ppi else None
    if args.labels:
        result = calibration.calibrate(args.run_id, args.labels, alpha=args.alpha, lam=lam,
                                       target_width=args.target_width, labels_only=args.labels_only)
        print(result.summary())
        return 0
    if not metrics:
        raise InputError("calibrate needs --labels FILE, or --metrics to read human feedback on the run's traces")
    estimates = calibration_traces.calibrate_traces(args.run_id, metrics, alpha=args.alpha, lam=lam)
    for m, e in estimates.items():
        print(f"{m}: calibrated {e.mean:.3f} [{e.ci_low:.3f}, {e.ci_high:.3f}] from {e.n_labelled} human labels "
              f"(judge alone {e.judge_mean:.3f})")
        if e.warning:
            print(f"warning: {m}: {e.warning}")
    return 0

def log_saved_command(args: argparse.Namespace) -> int:
    """``ragjudge log-saved FOLDER``: an evaluation saved locally when MLflow could not take it (exit 5), logged now
    into a new run (or ``--run-id``), with the same summary and exit code as ``ragjudge evaluate``. Into an existing
    run: refused when the run holds another judge's evaluation (nothing is written); the run ends FINISHED (KILLED
    for a stopped evaluation) once logged, whatever status the failed logging left."""
    import mlflow

    from ..adapters.run_load import load_local
    from ..adapters.run_log import log_output
    from ..adapters.tracking import check_tracking_store

    out = load_local(args.folder)
    check_tracking_store(args.tracking_uri, args.experiment, nothing="Nothing was logged; the saved folder is kept.",
                         into_run=bool(args.run_id))
    if args.run_id:
        client = mlflow.tracking.MlflowClient()
        run = client.get_run(args.run_id)  # an unknown run fails here, before anything is logged
        _refuse_another_evaluation(args.run_id, run.data.params, out.params)
        log_output(out, args.run_id, saved=Path(args.folder), keep_local=True)
        run_id = args.run_id
        if run.info.status in ("FAILED", "RUNNING") and not _unanswered(run_id):
            client.set_terminated(run_id, status="KILLED" if out.config.get("interrupted") else "FINISHED")
    else:
        run = mlflow.start_run(run_name=args.run_name)
        run_id = run.info.run_id
        status = "FAILED"
        try:
            log_output(out, run_id, saved=Path(args.folder), keep_local=True)
            if not _unanswered(run_id):
                mlflow.set_tag("ragjudge.logged_from", str(Path(args.folder).resolve()))
            status = "KILLED" if out.config.get("interrupted") else "FINISHED"
        finally:
            with contextlib.suppress(Exception):  # a store that stopped answering: the summary says so
                mlflow.end_run(status)
    print(summary(run_id, out))
    if _unanswered(run_id):
        print(f"error: the tracking store stopped answering while run {run_id} was logged; the folder "
              f"{args.folder} is kept", file=sys.stderr)
        return EXIT_NOT_LOGGED
    print(f"(logged from {args.folder}; that folder is kept and can be deleted now)")
    return exit_code(out)


def _unanswered(run_id: str) -> bool:
    from ..adapters.run_log import logged

    report = logged(run_id)
    return bool(report and report.unanswered)


def _refuse_another_evaluation(run_id: str, run_params: dict[str, str], saved: dict[str, str]) -> None:
    """An existing run whose ``ragjudge.*`` params differ from the saved evaluation's holds another evaluation:
    logging into it would replace its metrics and table while its params (which MLflow never changes) keep
    describing the other one."""
    differ = sorted(k for k, v in saved.items() if k.startswith("ragjudge.") and k in run_params
                    and run_params[k] != str(v)[:6000])
    if not differ:
        return
    first = "ragjudge.judge" if "ragjudge.judge" in differ else differ[0]
    raise InputError(
        f"run {run_id} holds another evaluation: its {first} is {run_params[first]!r}, the saved one's is "
        f"{saved[first]!r}" + (f" (and {len(differ) - 1} other param(s) differ: {', '.join(differ[1:][:8])})"
                               if len(differ) > 1 else "")
        + ". Logging it there would replace that run's metrics while its params (which MLflow does not change) "
        "kept describing the other. Log it into a new run: the same command without --run-id. Nothing was logged.")
