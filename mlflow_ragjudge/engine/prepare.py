"""Step 2 of an evaluation: before any judge call, each metric's ``prepare`` hook (the judge contexts, E3 retrieval
included), the judge client, the run's embeddings and each metric's state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.errors import EmbeddingsUnavailable, InputError, MetricUnavailable
from ..llm.client import JudgeClient
from ..llm.embeddings import embeddings_fix, resolve_embedder
from ..metrics.spec import MetricSpec, RunContext
from .config import RagJudgeConfig

__all__ = ["build_client", "setup_metrics", "run_embeddings"]


def build_client(cfg: RagJudgeConfig) -> JudgeClient:
    return JudgeClient(
        cfg.judge,  # type: ignore[arg-type]  # checked by select_metrics: judged metrics need a judge
        cache=cfg.cache,
        max_concurrency=cfg.max_concurrency,
        requests_per_minute=cfg.requests_per_minute,
        timeout=cfg.timeout,
        max_attempts=cfg.max_attempts,
        check_ready=not cfg.dry_run,  # an estimate sends nothing, so it needs no API key
        dedupe=True,  # metrics that need the same reply share it
        batch=cfg.batch if cfg.batch and not cfg.dry_run else None,
    )

def setup_metrics(specs: list[MetricSpec], ctx: RunContext, skipped: dict[str, str], asked: bool) -> dict[str, Any]:
    """Each metric's state, built before any call; a metric that cannot run here is an input error when asked
    for by name, else skipped with the reason."""
    states: dict[str, Any] = {}
    for spec in list(specs):
        try:
            states[spec.name] = spec.setup(ctx) if spec.setup is not None else None
        except MetricUnavailable as e:
            if asked:
                raise InputError(f"Metric '{spec.name}' cannot run: {e}") from e
            skipped[spec.name] = str(e)
            specs.remove(spec)
    return states

def run_embeddings(specs: list[MetricSpec], cfg: RagJudgeConfig, client: JudgeClient | None,
                skipped: dict[str, str]) -> Callable[[list[str]], list[list[float]]] | None:
    """The run's embeddings, when a metric needs them; a metric asked for by name without them is an input
    error, a defaulted one is skipped with the reason."""
    wanting = [s for s in specs if s.needs.embeddings]
    if not wanting:
        return None
    try:
        return resolve_embedder(cfg.embeddings, client=client, check_ready=not cfg.dry_run)
    except EmbeddingsUnavailable as e:
        fix = embeddings_fix(cfg.judge)
        if cfg.metrics is not None:
            raise InputError(f"Metric '{wanting[0].name}' needs embeddings ({e.reason}); {fix}.") from e
        for s in wanting:
            specs.remove(s)
            skipped[s.name] = f"needs embeddings ({e.reason}); {fix}"
        return None
