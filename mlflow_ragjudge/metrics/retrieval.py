"""The ``retrieval`` metric: trec_eval-exact document-level measures (:mod:`mlflow_ragjudge.core.ir`) on each row's
``retrieved_doc_ids`` against its ``relevant_doc_ids``, and chunk-level ROUGE-L coverage of the reference by the
``contexts`` (SPEC 2.5). The measures' functions stay importable from here
(``from mlflow_ragjudge.metrics.retrieval import score_query``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..core.ir import (
    COUNT_KEYS,
    SET_KEYS,
    TREC_EVAL_MEASURES,
    aggregate_queries,
    metric_names,
    rank_run,
    score_queries,
    score_query,
)
from ..core.ir_checks import (
    DEFAULT_KS,
    DocId,
    RankedIds,
    Relevant,
    validate_ks,
    validate_retrieval_columns,
    validate_retrieval_row,
)
from ..core.trec_files import read_qrels, read_run
from ..core.types import JudgeResult, Row
from . import lexical
from .spec import Finish, MetricSpec, Needs, Option, Outputs, RunContext, RunSettings

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
        #: the id measures of the run's labelled rows, worked out together (:meth:`score_rows`): id(row) -> (row,
        #: its values in the order of ``keys``); each taken out when its row is scored
        self.scored: dict[int, tuple[Any, tuple[float, ...]]] = {}

    def score_rows(self, rows: Sequence[Row], threshold: float) -> None:
        """The id measures of every labelled row at once (:func:`score_queries`: the same floats as
        :func:`score_query`, bit for bit, at a fifth of the cost per row). Rows this cannot score (bad ids, which
        the run's checks refuse before this, but a lone scorer row has not been checked) are left to be scored one
        by one, as before, with whatever error that gives them."""
        labelled = [r for r in rows if r.relevant_doc_ids]
        if len(labelled) < _SCORED_TOGETHER:
            return
        try:
            got = score_queries([r.retrieved_doc_ids or [] for r in labelled], [r.relevant_doc_ids for r in labelled],
                                ks=self.ks, relevance_threshold=threshold, validate=False)
        except Exception:  # the one-row path says what is wrong with its row
            return
        for r, values in zip(labelled, zip(*(got[k].tolist() for k in self.keys))):
            self.scored[id(r)] = (r, values)


#: fewer labelled rows than this are scored one by one (numpy's start-up cost per call is a few dozen rows' work)
_SCORED_TOGETHER = 32


def _setup(ctx: RunContext) -> _RetrievalState:
    rows = ctx.rows
    have_ids = any(r.retrieved_doc_ids is not None or r.relevant_doc_ids is not None for r in rows)
    have_chunks = any(r.contexts is not None for r in rows) and any(r.reference for r in rows)
    have_gold = any(r.relevant_doc_ids for r in rows)
    state = _RetrievalState(validate_ks(KS.read(ctx.cfg)), have_ids, have_chunks, have_gold)
    if have_ids and have_gold:
        state.score_rows(rows, ctx.cfg.relevance_threshold)
    return state


def _validate(rows: Sequence[Row], cfg: RunSettings) -> None:
    validate_ks(KS.read(cfg))
    for r in rows:
        if r.relevant_doc_ids:
            validate_retrieval_row(r.retrieved_doc_ids or [], r.relevant_doc_ids, r.index)


def _score(state: _RetrievalState, r: Row, ctx: RunContext) -> dict[str, JudgeResult]:
    out: dict[str, JudgeResult] = {}
    if state.have_ids:
        # A row without gold ids is skipped and counted (not averaged in as 0): a RAG dataset row with no
        # labelled documents is unlabelled, not a query that trec_eval's qrels say has no relevant document.
        if r.relevant_doc_ids:
            done = state.scored.pop(id(r), None)
            if done is not None and done[0] is r:
                values: Sequence[float] = done[1]
            else:
                scores = score_query(r.retrieved_doc_ids or [], r.relevant_doc_ids, ks=state.ks,
                                     relevance_threshold=ctx.cfg.relevance_threshold, validate=False)
                values = [scores[k] for k in state.keys]
            out.update(zip(state.keys, JudgeResult.scored_each(values)))
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


def _finish(state: _RetrievalState, rows: Sequence[Row], results: list[dict[str, JudgeResult]],
            ctx: RunContext) -> Finish:
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
#: the cut-offs of the @k metrics
KS: Option[list[int]] = Option("k", [1, 3, 5, 10], check=_check_ks, public=lambda k: k)


def _spec() -> MetricSpec[_RetrievalState]:
    return MetricSpec(
        "retrieval",
        options=(KS,),
        requires=(("retrieved_doc_ids", "relevant_doc_ids"), ("contexts", "reference")),
        outputs=Outputs(("precision_at_", "recall_at_", "f1_at_", "hit_rate_at_", "ndcg_at_", "ndcg", "mrr", "map",
                         *SET_KEYS, "context_rougeL_")),
        needs=Needs(text=()),
        setup=_setup,
        validate=_validate,
        score=_score,
        finish=_finish,
        params=lambda state, ctx: {"ragjudge.k": json.dumps(KS.read(ctx.cfg))},
        description="retrieval: trec_eval-exact P/R/F1/hit rate/nDCG@k, MRR, MAP; chunk-level ROUGE-L coverage",
    )


METRICS = (_spec(),)
