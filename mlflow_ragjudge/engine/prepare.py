"""Step 2 of an evaluation: everything before the first judge call -- each metric's ``prepare`` hook (the judge
contexts, E3 retrieval included), the judge client, the run's embeddings and each metric's state. A metric that cannot
run here is an input error when it was asked for by name, else skipped with the reason. Each function returns what it
built; none changes the list of metrics it is given."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.constants import is_offline_judge
from ..core.errors import EmbeddingsUnavailable, InputError, MetricUnavailable
from ..core.types import metric_name_part
from ..llm.backends import Backend
from ..llm.client import JudgeClient
from ..llm.embeddings import embeddings_fix, resolve_embedder
from ..metrics.spec import MetricSpec, Prepared, RunContext
from .config import RagJudgeConfig
from .validate import Checked

__all__ = ["Plan", "prepare", "run_prepare_hooks", "prepare_metrics", "build_client", "setup_metrics", "run_embeddings",
           "judge_clients", "judge_label"]

Embed = Callable[[list[str]], list[list[float]]]


@dataclass(frozen=True)
class Plan:
    """What step 2 hands to step 3 (and to the dry run): the metrics that run, ready.

    Attributes:
        specs: the metrics that run (those that could not are in ``skipped``).
        states: metric name -> the state its ``setup`` hook built (None without one).
        ctx: what the metrics share: the judge client (None offline), the embeddings, the rows.
        found: what the ``prepare`` hooks found (record entries and params: the context mode ...).
        skipped: metric -> why it does not run, from steps 1 and 2.
        judges: every judge of the run as ``(label, client)``: the first is ``ctx.client``; more for a panel
            (``judge=[...]``); the cascade's second judge (``escalate_to``) last. Empty offline.
        prepared: what the ``prepare`` hooks built on ``ctx`` (``ctx.shared`` objects made before any client): every
            judge of a panel and every draw of a repeat reads the same (one retrieval, not one per judge).
    """

    specs: tuple[MetricSpec, ...]
    states: dict[str, Any]
    ctx: RunContext
    found: Prepared
    skipped: dict[str, str]
    judges: tuple[tuple[str, JudgeClient], ...] = ()
    prepared: dict[str, object] = field(default_factory=dict)


def prepare(checked: Checked, client: JudgeClient | None = None) -> Plan:
    """Step 2: the ``prepare`` hooks, then the client (``client``, else one built from the config when a judged
    metric has an LLM judge), the embeddings and each metric's state.

    Raises:
        InputError: a ``prepare`` hook refused the rows (a retriever's output), or a metric asked for by name
            cannot run (no embeddings, its ``setup`` found it unavailable).
    """
    cfg, specs = checked.cfg, checked.specs
    ctx, found = run_prepare_hooks(checked)
    prepared = ctx.shared_now()
    if client is None and cfg.judge is not None and not is_offline_judge(cfg.judge) and any(s.judged for s in specs):
        client = build_client(cfg)
    ctx.client = client
    judges = judge_clients(cfg, client) if client is not None else ()
    ctx.embed, specs, without_embeddings = run_embeddings(specs, cfg, client)
    states, specs, unavailable = setup_metrics(specs, ctx, asked=cfg.metrics is not None)
    ctx.metrics = tuple(s.name for s in specs)
    return Plan(specs, states, ctx, found, {**checked.skipped, **without_embeddings, **unavailable}, judges, prepared)


def run_prepare_hooks(checked: Checked) -> tuple[RunContext, Prepared]:
    """The run's context (no client yet) and what the metrics' ``prepare`` hooks found on it; then the text repairs
    of the input, reading the rows' and the hooks' (a retriever's passages), announced once."""
    ctx = RunContext(None, checked.cfg, metrics=tuple(s.name for s in checked.specs), rows=checked.rows,
                     columns=frozenset(map(str, checked.data.columns)), repairs=checked.repairs)
    found = prepare_metrics(checked.specs, ctx)
    checked.repairs.announce()
    return ctx, found


def prepare_metrics(specs: Sequence[MetricSpec], ctx: RunContext) -> Prepared:
    """Each metric's ``prepare`` hook, in order, before any judge call; what they found, merged. Metrics that share
    a hook share its work (it runs once per run)."""
    found = Prepared()
    for spec in specs:
        if spec.prepare is not None:
            got = spec.prepare(ctx)
            if got is not None:
                found.record.update(got.record)
                found.params.update(got.params)
    return found


def judge_clients(cfg: RagJudgeConfig, first: JudgeClient) -> tuple[tuple[str, JudgeClient], ...]:
    """Every judge of the run, labelled (:func:`judge_label`): ``first`` (the run's client), the rest of a panel,
    and the cascade's second judge, each a client of its own (its own connection's limits) sharing the run's
    settings."""
    others = [*cfg.panel[1:], *([cfg.escalate_to] if cfg.escalate_to is not None else [])]
    clients = [first, *(build_client(cfg, judge) for judge in others)]
    labels: list[str] = []
    for c in clients:
        label = judge_label(c)
        labels.append(label if label not in labels else f"{label}_{len(labels) + 1}")
    return tuple(zip(labels, clients))


def judge_label(client: JudgeClient) -> str:
    """A judge's short name in metric names and columns: its model, in the characters MLflow takes."""
    return metric_name_part(client.model or client.backend.provider) or "judge"


def build_client(cfg: RagJudgeConfig, judge: str | Backend | None = None) -> JudgeClient:
    return JudgeClient(
        judge if judge is not None else cfg.judge,  # type: ignore[arg-type]  # judged metrics need a judge
        cache=cfg.cache,
        max_concurrency=cfg.max_concurrency,
        requests_per_minute=cfg.requests_per_minute,
        shared_pace=cfg.shared_pace,
        timeout=cfg.timeout,
        max_attempts=cfg.max_attempts,
        check_ready=not cfg.dry_run,  # an estimate sends nothing, so it needs no API key
        dedupe=True,  # metrics that need the same reply share it
        batch=cfg.batch if cfg.batch and not cfg.dry_run else None,
    )


def setup_metrics(specs: Sequence[MetricSpec], ctx: RunContext, asked: bool
                  ) -> tuple[dict[str, Any], tuple[MetricSpec, ...], dict[str, str]]:
    """Each metric's state, built before any call: ``(states, the metrics that run, metric -> why it was skipped)``.
    A metric that cannot run here is an input error when asked for by name, else skipped with the reason."""
    states: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for spec in specs:
        try:
            states[spec.name] = spec.setup(ctx) if spec.setup is not None else None
        except MetricUnavailable as e:
            if asked:
                raise InputError(f"Metric '{spec.name}' cannot run: {e}") from e
            skipped[spec.name] = str(e)
    return states, tuple(s for s in specs if s.name not in skipped), skipped


def run_embeddings(specs: Sequence[MetricSpec], cfg: RagJudgeConfig, client: JudgeClient | None
                   ) -> tuple[Embed | None, tuple[MetricSpec, ...], dict[str, str]]:
    """The run's embeddings, when a metric needs them: ``(embed or None, the metrics that run, metric -> why it was
    skipped)``. A metric asked for by name without them is an input error, a defaulted one is skipped with the
    reason."""
    wanting = [s for s in specs if s.needs.embeddings]
    if not wanting:
        return None, tuple(specs), {}
    try:
        return resolve_embedder(cfg.embeddings, client=client, check_ready=not cfg.dry_run), tuple(specs), {}
    except EmbeddingsUnavailable as e:
        fix = embeddings_fix(cfg.judge)
        if cfg.metrics is not None:
            raise InputError(f"Metric '{wanting[0].name}' needs embeddings ({e.reason}); {fix}.") from e
        return (None, tuple(s for s in specs if not s.needs.embeddings),
                {s.name: f"needs embeddings ({e.reason}); {fix}" for s in wanting})
