"""A judge's identity: what makes two judgments of one trace the same judgment, so that a monitor (``ragjudge
monitor``) and a scorer run by MLflow's online scoring never judge a trace twice for the same thing.

One metric output judged by one judge (or panel), with the prompts at their versions and the options that change
a score, is one identity; anything else (the cache, concurrency, the package version while the prompts stay
unchanged) is not part of it. The id is short and stable: the first 16 hex digits of a SHA-256 of the canonical
JSON of those parts. It travels in each Feedback's metadata (:data:`JUDGE_ID_KEY`) with the parts it was made of
(:data:`JUDGE_KEY`, :data:`PROMPTS_KEY`), so a person reading a Feedback can see what judged it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["JUDGE_ID_KEY", "JUDGE_KEY", "PROMPTS_KEY", "SCORE_OPTIONS", "judge_id", "score_options"]

#: Feedback metadata keys
JUDGE_ID_KEY = "ragjudge.judge_id"
JUDGE_KEY = "ragjudge.judge"
PROMPTS_KEY = "ragjudge.prompt_versions"

#: the settings that change what a judged metric gives for the same row (the rest do not: cache, concurrency,
#: rate limits, timeouts, traces ...); a setting at its default is left out, so adding a new option later does not
#: change the identity of judgments made before it existed
SCORE_OPTIONS: dict[str, Any] = {
    "language": "en", "context_mode": "auto", "repeats": 1, "repeat_temperature": None, "panel_rule": "auto",
    "escalate_to": None, "judge_output": "auto", "relevance_threshold": 1, "answer_relevancy_n": 3,
    "faithfulness_evidence": "contexts", "max_context_chars": 12000,
}


def score_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The score-changing settings of a configuration (a :class:`~.config.RagJudgeConfig`'s dict or a scorer's
    keyword arguments) that differ from their defaults."""
    return {k: config[k] for k, default in SCORE_OPTIONS.items() if k in config and config[k] != default}


def judge_id(output: str, judge: str | Sequence[str] | None, prompt_versions: Mapping[str, str] | None = None,
             options: Mapping[str, Any] | None = None) -> str:
    """The identity of ``output`` (a metric's result name, e.g. ``faithfulness``) judged by ``judge`` (a URI, a
    panel's URIs -- their order does not matter -- or None for a metric that calls no judge) with the prompts at
    ``prompt_versions`` and the score-changing ``options`` (:func:`score_options`)."""
    judges = sorted(judge) if isinstance(judge, (list, tuple)) else judge
    parts = {"output": output, "judge": judges, "prompts": dict(sorted((prompt_versions or {}).items())),
             "options": dict(sorted((options or {}).items()))}
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
