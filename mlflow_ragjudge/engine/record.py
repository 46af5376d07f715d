"""What a run records about itself besides its numbers: the run record and params that a dry run and a run share
(:func:`run_record`), the judge's identity and params (an LLM client or the offline judge), and where results are
saved on disk before MLflow sees them."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.constants import VERSION, is_offline_judge
from ..core.types import JudgeResult
from ..llm.backends import safe_url
from ..llm.cache import default_cache_dir
from ..llm.client import JudgeClient
from ..metrics.offline import resolve_offline
from .config import RagJudgeConfig
from .prepare import Plan

__all__ = ["run_record", "local_output_root", "save_partial", "judge_uri", "offline_identity", "offline_params",
           "judge_params"]


def run_record(cfg: RagJudgeConfig, plan: Plan, rows: int, skipped: dict[str, str], *, dry_run: bool = False
               ) -> tuple[dict[str, Any], dict[str, str]]:
    """The run record (``ragjudge/config.json``) and the MLflow params as far as a dry run and a run share them:
    the package version, the config, the metrics run, what their ``prepare`` hooks found, the judge, what was
    skipped, the number of rows and the prompt versions (all, and per metric: a judge's identity,
    :mod:`.identity`). A run adds its usage, failures ...; a dry run its estimate."""
    client = plan.ctx.client
    names = [s.name for s in plan.specs]
    judge = client.identity() if client is not None else None if dry_run else offline_identity(cfg)
    by_metric = {spec.name: dict(spec.prompt_versions(plan.states[spec.name])) for spec in plan.specs
                 if spec.prompt_versions is not None and spec.name in plan.states}
    record: dict[str, Any] = {
        "package_version": VERSION, "config": cfg.public_params(), "metrics_run": names,
        **({"dry_run": True} if dry_run else {}), **plan.found.record,
        "judge": judge, "skipped": skipped, "rows": rows,
        "prompt_versions": {k: v for versions in by_metric.values() for k, v in versions.items()},
        "prompt_versions_by_metric": by_metric,
    }
    params = {"ragjudge.version": VERSION, "ragjudge.metrics": ",".join(names),
              **({"ragjudge.dry_run": "true"} if dry_run else {}), "ragjudge.judge": judge_uri(client, cfg)}
    return record, params


def local_output_root() -> Path:
    """Where results are saved before they are logged: ``$RAGJUDGE_OUTPUT_DIR``, else ``outputs/`` beside the
    judge-call cache."""
    env = os.environ.get("RAGJUDGE_OUTPUT_DIR")
    if env:
        return Path(env).expanduser()

    return default_cache_dir() / "outputs"

def save_partial(per_row: dict[str, list[dict[str, JudgeResult]]], client: JudgeClient | None) -> Path | None:
    """Write what the metrics produced so far (per-row results with their judge calls) to a local folder."""
    import tempfile

    stamp = time.strftime("%Y%m%d-%H%M%S")
    for root in (local_output_root(), Path(tempfile.gettempdir()) / "ragjudge-outputs"):
        folder = root / f"{stamp}-{os.getpid()}-partial"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / "results.jsonl", "w", encoding="utf-8", errors="backslashreplace") as fh:
                for metric, rows in per_row.items():
                    for i, res in enumerate(rows):
                        for name, r in res.items():
                            rec = {"metric": metric, "output": name, "row": i, **r.to_dict(), "calls": r.calls}
                            fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            if client is not None:
                with open(folder / "usage.json", "w", encoding="utf-8") as fh:
                    json.dump(client.summary(), fh, default=str)
            return folder
        except OSError:
            continue
    return None

def judge_uri(client: JudgeClient | None, cfg: RagJudgeConfig) -> str:
    if client is not None:
        return client.backend.uri
    if is_offline_judge(cfg.judge):
        return resolve_offline(str(cfg.judge)).uri
    return "none"

def offline_identity(cfg: RagJudgeConfig) -> dict[str, Any] | None:
    """The offline judge's identity in the run record: what it is, its calibration and its measured agreement."""
    if not is_offline_judge(cfg.judge):
        return None
    judge = resolve_offline(str(cfg.judge))
    return {"uri": judge.uri, "kind": "offline judge: calibrated lexical evidence, not an LLM",
            "calibration": judge.calibration.version, "held_out": judge.calibration.fit.get("held_out"),
            "languages": "calibrated and measured on English (NQ301, MTRAG); other languages run with the same "
                         "rules (Chinese and Japanese by character pairs), uncalibrated, with no agreement figure",
            "docs": "docs/offline-judge.md"}

def offline_params(cfg: RagJudgeConfig) -> dict[str, str]:
    judge = resolve_offline(str(cfg.judge))
    return {"ragjudge.judge.provider": "offline", "ragjudge.judge.model": judge.uri.partition(":/")[2],
            "ragjudge.judge.kind": "offline (not an LLM)", "ragjudge.offline.calibration": judge.calibration.version}

def judge_params(client: JudgeClient, transcripts: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Params that tell runs apart by judge: provider, model, server host (no credentials) and the
    structured-output mode the run's structured requests ended up using (``none`` if it sent none)."""
    url = safe_url(client.backend.base_url)
    structured = any(t.get("structured_mode") for t in transcripts)
    return {
        "ragjudge.judge.provider": client.backend.provider,
        "ragjudge.judge.model": client.backend.model,
        "ragjudge.judge.base_url_host": url.split("://", 1)[-1].split("/", 1)[0] if url else "default",
        "ragjudge.judge.structured": client.structured_mode if structured else "none",
    }
