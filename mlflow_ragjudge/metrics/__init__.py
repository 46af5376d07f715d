"""LLM judges. Each takes a :class:`~mlflow_ragjudge.client.JudgeClient` and returns
:class:`~mlflow_ragjudge.types.JudgeResult` values; none imports mlflow."""

from .answer_relevancy import AnswerRelevancyJudge
from .context import ContextPrecisionJudge, ContextRecallJudge, ContextRelevanceJudge
from .correctness import CorrectnessJudge, format_contexts
from .faithfulness import FaithfulnessJudge
from .statements import StatementExtractor

__all__ = [
    "AnswerRelevancyJudge",
    "ContextPrecisionJudge",
    "ContextRecallJudge",
    "ContextRelevanceJudge",
    "CorrectnessJudge",
    "FaithfulnessJudge",
    "StatementExtractor",
    "format_contexts",
]
