"""Evaluate a DataFrame of RAG outputs: the engine behind the MLflow evaluator, the CLI and plain Python. No mlflow
here, and no metric names: every metric is a :class:`~mlflow_ragjudge.metrics.spec.MetricSpec` from the registry,
and what is particular to a metric (its judge contexts, its level shares, its settings) it does in its own hooks.

Four steps, each in the module named after it, called in order by :func:`evaluate_frame`:

1. :func:`.validate.validate` -- the data, the metrics (by default every registered one whose columns are there),
   every row and each metric's own row checks; bad input stops here, before anything runs;
2. :func:`.prepare.prepare` -- each metric's ``prepare`` hook (the judge contexts, E3 retrieval), the judge client,
   the embeddings and each metric's state; the dry run branches off here (:func:`_dry_run`: an estimate, nothing
   sent);
3. :func:`.schedule.schedule` -- every (row, metric) task, the provider gate bounding the calls in flight; no barrier
   between metrics, so a slow or hung call delays only its own row;
4. :func:`.aggregate.aggregate_run` -- overall and per-group metrics, the per-row table, meta-evaluation and
   calibrated estimates, usage, the run record (:mod:`.record`, which the dry run shares).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

import pandas as pd

from ..core.errors import Interrupted, LoggingFailed
from ..core.stop import stop_on_signals, stop_reason, stop_requested
from ..core.types import JudgeResult
from ..llm.client import JudgeClient
from ..llm.pricing import cost_usd
from ..metrics.spec import metric_names
from .aggregate import EvalOutput, aggregate_run
from .config import RagJudgeConfig
from .draws import has_draws, schedule_draws
from .prepare import Plan, prepare
from .record import run_record, save_partial
from .schedule import schedule
from .validate import Checked, validate

__all__ = ["evaluate_frame", "EvalOutput", "available_metrics"]


def _config(config: RagJudgeConfig | dict[str, Any] | None, overrides: dict[str, Any]) -> RagJudgeConfig:
    if isinstance(config, RagJudgeConfig):
        if not overrides:
            return config
        return RagJudgeConfig.from_dict({**config.as_dict(), **overrides})
    return RagJudgeConfig.from_dict({**(config or {}), **overrides})


def evaluate_frame(
    data: pd.DataFrame,
    config: RagJudgeConfig | dict[str, Any] | None = None,
    *,
    client: JudgeClient | None = None,
    **overrides: Any,
) -> EvalOutput:
    """Evaluate a DataFrame of RAG outputs with the configured metrics.

    Args:
        data: one row per question; columns per SPEC 3.1 (rename with ``col_mapping``).
        config: a :class:`RagJudgeConfig` or its dict form; keyword overrides win.
        client: an existing judge client (default: one built from ``config.judge``).

    Ctrl-C or SIGTERM while it runs (in the main thread) stops it without losing what was paid for: no new judge
    request is sent, the replies in flight are awaited for ``RAGJUDGE_STOP_GRACE`` seconds (default 10) and cached,
    and the output holds what was done, the rest failed ``interrupted`` and ``config["interrupted"]`` set. A second
    Ctrl-C exits the process at once. (docs/failure-modes.md, "Stopping a run")

    Raises:
        InputError: bad data, found before any judge call.
        ValueError: bad configuration.
    """
    with stop_on_signals():
        return _evaluate(data, config, client, overrides)


def _evaluate(data: Any, config: RagJudgeConfig | dict[str, Any] | None, client: JudgeClient | None,
              overrides: dict[str, Any], first_row: int = 0) -> EvalOutput:
    cfg = _config(config, overrides)
    checked = validate(data, cfg, first_row)  # 1
    plan = prepare(checked, client)  # 2
    if cfg.dry_run:
        return _dry_run(checked, plan)
    if stop_requested():  # Ctrl-C / SIGTERM while the input was checked: nothing paid for, nothing to log
        raise Interrupted(f"Stopped by {stop_reason()} before any judge call: nothing was sent or logged.",
                          stop_reason() or "SIGINT")
    client = plan.ctx.client
    t0 = time.perf_counter()
    per_row: dict[str, list[dict[str, JudgeResult]]] = {}
    try:
        draws = None
        if has_draws(checked):  # repeats, a panel or a cascade: several draws per row, combined
            per_row, draws = schedule_draws(checked, plan)  # 3
            # the judged metrics' finish, record and params hooks read the states of the first judge's first draw
            plan = dataclasses.replace(plan, states={**plan.states, **draws.states})
        else:
            per_row = schedule(plan.specs, plan.states, checked.rows, plan.ctx)  # 3
        return aggregate_run(checked, plan, per_row, time.perf_counter() - t0, draws)  # 4
    except Exception as e:
        if client is None or client.summary()["requests"] == 0:
            raise  # nothing was paid for: the error as it is
        # A failure after judge calls were paid for (a bug, or a metric that could not finish): the per-row
        # results and transcripts so far are written to disk before the error goes up, and the client's cache
        # keeps every reply, so a re-run pays only for what was not finished.
        saved = save_partial(per_row, client)
        raise LoggingFailed(
            f"The evaluation stopped after its judge calls ({type(e).__name__}: {e}); the results so far are not "
            + (f"lost: they are saved at {saved}" if saved else "saved locally (no writable folder)")
            + ("; a re-run takes the paid replies from the judge-call cache." if client.cache is not None else "."),
            saved,
        ) from e


_ESTIMATED: tuple[Literal["calls", "input_tokens", "output_tokens"], ...] = ("calls", "input_tokens", "output_tokens")


def _dry_run(checked: Checked, plan: Plan) -> EvalOutput:
    """Estimate judge calls and tokens per metric (each metric's ``estimate`` hook); nothing is sent."""
    rows, client, ctx = checked.rows, plan.ctx.client, plan.ctx
    lines: list[dict[str, Any]] = []
    # a judged metric is scored once per draw of every judge of a panel (a cascade's second judge: only on the rows
    # its first is unsure about, unknown before they are judged -- not counted)
    draws = checked.cfg.repeats * max(1, len(checked.cfg.panel))
    for spec in plan.specs:
        est = [spec.estimate(plan.states[spec.name], r, ctx) for r in rows] if spec.estimate is not None else []
        sums: dict[str, int] = {k: sum(e[k] for e in est) * (draws if spec.judged else 1) for k in _ESTIMATED}
        lines.append({"metric": spec.name, "rows": len(rows), **sums})
    table = pd.DataFrame(lines, columns=["metric", "rows", *_ESTIMATED])
    table["calls_per_row"] = table["calls"] / max(1, len(rows))
    out: dict[str, float] = {}
    for line in lines:
        for k in _ESTIMATED:
            out[f"estimate/{line['metric']}/{k}"] = float(line[k])  # type: ignore[arg-type]
    for k in _ESTIMATED:
        out[f"estimate/total/{k}"] = float(table[k].sum())
    model = client.model if client is not None else ""
    cost = cost_usd(model, int(out["estimate/total/input_tokens"]), int(out["estimate/total/output_tokens"]))
    if cost is not None and client is not None:
        out["estimate/total/cost_usd"] = cost
        if client.backend.supports_batch:  # the same calls through the provider's batch API
            out["estimate/total/batch_cost_usd"] = cost_usd(
                model, int(out["estimate/total/input_tokens"]), int(out["estimate/total/output_tokens"]),
                batch_provider=client.backend.provider) or 0.0
    record, params = run_record(checked.cfg, plan, len(rows), plan.skipped, dry_run=True)
    record["estimate"] = lines
    return EvalOutput(out, table, {}, [], params, record, None, plan.skipped)


def available_metrics() -> tuple[str, ...]:
    """Every registered metric name."""
    return metric_names()
