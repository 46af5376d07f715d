"""The offline judge, ``offline:/lexical``, as one object: calibrated lexical evidence, **not a language model**
(docs/offline-judge.md). Each metric's offline rule lives beside its LLM judge, in the metric's own module
(:func:`~mlflow_ragjudge.metrics.correctness.offline_correctness` ...); :class:`OfflineJudge` gathers them for
callers who want the offline judge's verdicts directly, and :func:`resolve_offline` names it from its URI. The
evidence they share (tokens, features, the calibration) is :mod:`~mlflow_ragjudge.metrics.offline_evidence`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.constants import DEFAULT_OFFLINE_JUDGE, OFFLINE_MODELS, OFFLINE_PROVIDER, is_offline_judge
from ..core.matching import STOPWORDS, content_tokens, declines_to_answer, match_tokens
from ..core.types import JudgeResult
from .context_precision import offline_context_precision
from .context_recall import offline_context_recall
from .context_relevance import offline_context_relevance
from .correctness import offline_correctness
from .faithfulness import offline_faithfulness
from .offline_evidence import FEATURES, Calibration, OfflineEvidence, answer_features

__all__ = ["OfflineJudge", "resolve_offline", "OfflineEvidence", "Calibration", "answer_features", "FEATURES",
           "DEFAULT_OFFLINE_JUDGE", "OFFLINE_PROVIDER", "is_offline_judge", "match_tokens", "content_tokens",
           "declines_to_answer", "STOPWORDS"]


class OfflineJudge(OfflineEvidence):
    """The offline judge's scorers, one per metric it can answer; every result is labelled with its method
    (``details["judge"] = "offline:/lexical"``) and the calibration version.

    Args:
        calibration: the fitted numbers (default: the shipped ones).
    """

    def correctness(self, question: str, response: str, references: Sequence[str],
                    contexts: Sequence[str] | None = None) -> JudgeResult:
        """Six-level correctness (:func:`~mlflow_ragjudge.metrics.correctness.offline_correctness`)."""
        return offline_correctness(self, question, response, references, contexts)

    def faithfulness(self, response: str, evidence: Sequence[str] | None) -> JudgeResult:
        """Support of the response's sentences (:func:`~mlflow_ragjudge.metrics.faithfulness.offline_faithfulness`)."""
        return offline_faithfulness(self, response, evidence)

    def context_precision(self, question: str, references: Sequence[str],
                          contexts: Sequence[str] | None) -> JudgeResult:
        return offline_context_precision(self, question, references, contexts)

    def context_recall(self, references: Sequence[str], contexts: Sequence[str] | None) -> JudgeResult:
        return offline_context_recall(self, references, contexts)

    def context_relevance(self, question: str, references: Sequence[str],
                          contexts: Sequence[str] | None) -> JudgeResult:
        return offline_context_relevance(self, question, references, contexts)


def resolve_offline(judge: str) -> OfflineJudge:
    """The offline judge a URI names.

    Raises:
        ValueError: an unknown offline model.
    """
    text = judge.strip().lower()
    model = "lexical" if text == OFFLINE_PROVIDER else text.partition(":/")[2].strip("/")
    if model not in OFFLINE_MODELS:
        raise ValueError(f"Unknown offline judge {judge!r}: the offline judge is {DEFAULT_OFFLINE_JUDGE!r} "
                         "(calibrated lexical evidence, no LLM).")
    return OfflineJudge()
