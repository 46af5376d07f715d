"""The metrics: one module per metric, each with its spec (:class:`~mlflow_ragjudge.metrics.spec.MetricSpec`), its
options, its prompts' use, its LLM judge and its offline scorer side by side; none imports mlflow. What several of
them share is in modules of its own: the judge contexts (:mod:`.contexts`), statement extraction and numbered
verdicts (:mod:`.statements`), context precision's and recall's joint call (:mod:`.context_verdicts`), the offline
judge's evidence (:mod:`.offline_evidence`).

The built-in metrics are registered here, in the order they run and appear in the per-row table: adding one is its
module plus one line in :data:`BUILTIN`. A metric of your own: ``register_metric(spec)`` (docs/extending.md).
"""

from . import (
    answer_relevancy,
    citations,
    context_precision,
    context_recall,
    context_relevance,
    correctness,
    faithfulness,
    lexical,
    multiturn,
    output_contract,
    refusal,
    retrieval,
)
from .answer_relevancy import AnswerRelevancyJudge
from .context_precision import ContextPrecisionJudge
from .context_recall import ContextRecallJudge
from .context_relevance import ContextRelevanceJudge
from .correctness import CorrectnessJudge, format_contexts
from .faithfulness import FaithfulnessJudge
from .spec import register_metric
from .statements import StatementExtractor

#: the built-in metric modules, in run order (each has a ``METRICS`` tuple of specs)
BUILTIN = (
    correctness,
    lexical,
    retrieval,
    faithfulness,
    answer_relevancy,
    context_precision,
    context_recall,
    context_relevance,
    output_contract,
    refusal,
    citations,
    multiturn,
)
for _module in BUILTIN:
    for _spec in _module.METRICS:
        register_metric(_spec, replace=True)

__all__ = [
    "BUILTIN",
    "AnswerRelevancyJudge",
    "ContextPrecisionJudge",
    "ContextRecallJudge",
    "ContextRelevanceJudge",
    "CorrectnessJudge",
    "FaithfulnessJudge",
    "StatementExtractor",
    "format_contexts",
]
