"""The ``retrieval`` metric: trec_eval-exact document-level measures (:mod:`mlflow_ragjudge.core.ir`) on each row's
``retrieved_doc_ids`` against its ``relevant_doc_ids``, and chunk-level ROUGE-L coverage of the reference by the
``contexts`` (SPEC 2.5). The measures' functions stay importable from here (``from mlflow_ragjudge.retrieval import
score_query``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..core.ir import (
    COUNT_KEYS,
    DEFAULT_KS,
    SET_KEYS,
    TREC_EVAL_MEASURES,
    DocId,
    RankedIds,
    Relevant,
    aggregate_queries,
    metric_names,
    rank_run,
    score_queries,
    score_query,
    validate_ks,
    validate_retrieval_columns,
    validate_retrieval_row,
)
from ..core.trec_files import read_qrels, read_run
from ..core.types import JudgeResult
from . import lexical
from .spec import Finish, MetricSpec, Option

__all__ = ["DEFAULT_KS", "DocId", "RankedIds", "Relevant", "TREC_EVAL_MEASURES", "COUNT_KEYS", "aggregate_queries",
           "metric_names", "rank_run", "read_qrels", "read_run", "score_queries", "score_query", "validate_ks",
           "validate_retrieval_columns", "validate_retrieval_row", "METRICS"]


# --------------------------------------------------------------------------- the metric


class _RetrievalState:
    def __init__(self, ks: tuple[int, ...], have_ids: bool, have_chunks: bool, have_gold: bool) -> None:
        self.ks = ks
        self.have_ids = have_ids
        self.have_chunks = have_chunks
        keys = score_query(["d"], ["d"], ks=ks, validate=False) if have_gold else {}
        self.keys = [k for k in keys if not k.startswith("num_")]


def _setup(ctx: Any) -> _RetrievalState:
    rows = ctx.rows
    have_ids = any(r.retrieved_doc_ids is not None or r.relevant_doc_ids is not None for r in rows)
    have_chunks = any(r.contexts is not None for r in rows) and any(r.reference for r in rows)
    have_gold = any(r.relevant_doc_ids for r in rows)
    return _RetrievalState(validate_ks(ctx.cfg.k), have_ids, have_chunks, have_gold)


def _validate(rows: Sequence[Any], cfg: Any) -> None:
    validate_ks(cfg.k)
    for r in rows:
        if r.relevant_doc_ids:
            validate_retrieval_row(r.retrieved_doc_ids or [], r.relevant_doc_ids, r.index)


def _score(state: _RetrievalState, r: Any, ctx: Any) -> dict[str, Any]:
    out: dict[str, JudgeResult] = {}
    if state.have_ids:
        # A row without gold ids is skipped and counted (not averaged in as 0): a RAG dataset row with no
        # labelled documents is unlabelled, not a query that trec_eval's qrels say has no relevant document.
        if r.relevant_doc_ids:
            scores = score_query(r.retrieved_doc_ids or [], r.relevant_doc_ids, ks=state.ks,
                                 relevance_threshold=ctx.cfg.relevance_threshold, validate=False)
            out.update({k: JudgeResult.scored(scores[k]) for k in state.keys})
        else:
            out.update({k: JudgeResult.abstained("no_gold_ids") for k in state.keys})
    if state.have_chunks:
        names = ("context_rougeL_recall", "context_rougeL_precision", "context_rougeL_f1")
        if r.contexts is None or not r.reference:
            out.update({n: JudgeResult.abstained("no_contexts_or_reference") for n in names})
        else:
            # several acceptable answers: the one the contexts cover best (ROUGE-L recall) counts
            s = max((lexical.context_rouge_l(r.contexts, a) for a in r.acceptable_answers),
                    key=lambda x: -1.0 if x["recall"] is None else x["recall"])
            for n, key in zip(names, ("recall", "precision", "f1")):
                v = s[key]
                out[n] = JudgeResult.scored(v) if v is not None else JudgeResult.abstained("empty_reference")
    return out


def _finish(state: _RetrievalState, rows: Sequence[Any], results: Any, ctx: Any) -> Any:
    fin = Finish()
    if state.have_ids:
        scored = sum(1 for r in rows if r.relevant_doc_ids)
        fin.counts["retrieval/rows_scored"] = float(scored)
        fin.counts["retrieval/rows_without_gold_ids"] = float(len(rows) - scored)
        if scored < len(rows):
            fin.skipped["retrieval_rows_without_gold_ids"] = f"{len(rows) - scored} row(s) have no relevant_doc_ids"
    return fin


def _check_ks(k: Any) -> None:
    validate_ks(k)


#: retrieval's own setting
OPTIONS = (Option("k", [1, 3, 5, 10], check=_check_ks, public=lambda k: k),)


def _spec() -> Any:
    return MetricSpec(
        "retrieval",
        options=OPTIONS,
        requires=(("retrieved_doc_ids", "relevant_doc_ids"), ("contexts", "reference")),
        outputs=("precision_at_", "recall_at_", "f1_at_", "hit_rate_at_", "ndcg_at_", "ndcg", "mrr", "map",
                 *SET_KEYS, "context_rougeL_"),
        required_text=(),
        setup=_setup,
        validate=_validate,
        score=_score,
        finish=_finish,
        params=lambda state, ctx: {"ragjudge.k": json.dumps(ctx.cfg.k)},
        description="retrieval: trec_eval-exact P/R/F1/hit rate/nDCG@k, MRR, MAP; chunk-level ROUGE-L coverage",
    )


METRICS = (_spec(),)
