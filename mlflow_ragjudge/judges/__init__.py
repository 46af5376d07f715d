"""LLM judges. Each takes a :class:`~mlflow_ragjudge.client.JudgeClient` and returns
:class:`~mlflow_ragjudge.types.JudgeResult` values; none imports mlflow."""

from .correctness import CorrectnessJudge, format_contexts

__all__ = ["CorrectnessJudge", "format_contexts"]
