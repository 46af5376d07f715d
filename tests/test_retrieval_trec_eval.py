"""Conformance of mlflow_ragjudge.metrics.retrieval with trec_eval's own expected outputs.

The data are trec_eval's test files (github.com/usnistgov/trec_eval, ``test/``), kept in
``shared/data/trec_eval`` beside the repository. trec_eval's Makefile (target ``quicktest``) says which
command printed each expected output:

============================  ===================================================================
file                          command
============================  ===================================================================
``out.test``                  ``trec_eval qrels.test results.test`` (default measures, summary only)
``out.test.a``                ``trec_eval -m all_trec qrels.test results.test``
``out.test.aq``               ``trec_eval -m all_trec -q qrels.test results.test``
``out.test.aqc``              ``trec_eval -m all_trec -q -c qrels.test results.trunc``
``out.test.aql``              ``trec_eval -m all_trec -mrelstring.20 -q -l2 qrels.rel_level results.test``
``out.test.meas_params``      ``trec_eval -q ... -m P.5,7,3 -m recall.20,2000 -mndcg_cut.10,20,23.4
                              -msuccess.2,5,20 ... qrels.test results.test``
``out.test.qrels_jg``         ``trec_eval -m qrels_jg -q -R qrels_jg qrels.123 results.test``
============================  ===================================================================

What each one exercises:

* ``qrels.test``: binary grades (0/1), 3 queries, 500 retrieved each in ``results.test``.
* ``results.trunc`` has no ranking at all for query 302 and 84 documents for 303; with ``-c`` trec_eval
  scores 302 as an empty ranking and averages over all 3 qrels queries, which is what averaging every row
  does here.
* ``qrels.rel_level`` has grades -1 (in the pool, unjudged), 0, 1, 2, 3, 4; with ``-l2`` only grades >= 2
  are relevant for P / recall / map / recip_rank / success, while ndcg and ndcg_cut use the raw grades.
* ``results.test`` carries scores, not just ranks; the ranking comes from :func:`rank_run` (score
  descending, ties by document id descending).

``out.test.qrels_jg`` (multiple judgment groups per query) and the ``prefs`` outputs measure things this
package does not implement, and ``ndcg_1=3,2=9,4=4.5`` in ``out.test.meas_params`` uses custom gains; they
are not checked. trec_eval prints 4 decimals; a value agrees when it prints the same after rounding to 4
decimals (hence differs by at most 5e-5). The counts ``num_ret``, ``num_rel`` and ``num_rel_ret`` are
compared exactly; on the summary line trec_eval prints their sums.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mlflow_ragjudge.metrics.retrieval import (
    aggregate_queries,
    rank_run,
    read_qrels,
    read_run,
    score_queries,
    score_query,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "trec_eval"

pytestmark = pytest.mark.skipif(
    not (DATA / "out.test.aq").is_file(),
    reason=f"trec_eval's test data not found at {DATA} (shared/data/trec_eval beside the repository)",
)

DEFAULT_CUTOFFS = (5, 10, 15, 20, 30, 100, 200, 500, 1000)  # trec_eval's P, recall and ndcg_cut defaults
SUCCESS_CUTOFFS = (1, 5, 10)  # trec_eval's success defaults


def trec_eval_names(ks: tuple[int, ...]) -> dict[str, str]:
    """Map our metric names to trec_eval's for the cutoffs of one trec_eval invocation."""
    names = {
        "mrr": "recip_rank",
        "map": "map",
        "ndcg": "ndcg",
        "num_retrieved": "num_ret",
        "num_relevant": "num_rel",
        "num_relevant_retrieved": "num_rel_ret",
    }
    for k in ks:
        names[f"precision_at_{k}"] = f"P_{k}"
        names[f"recall_at_{k}"] = f"recall_{k}"
        names[f"ndcg_at_{k}"] = f"ndcg_cut_{k}"
        names[f"hit_rate_at_{k}"] = f"success_{k}"
    return names


def read_trec_eval_output(path: Path) -> dict[tuple[str, str], str]:
    """Read ``measure query value`` lines into {(measure, query): printed value}."""
    printed: dict[tuple[str, str], str] = {}
    for line in path.read_text().splitlines():
        measure, query, value = line.split()
        printed[(measure, query)] = value
    return printed


def score_with_score_query(
    rankings: list[list[str]], qrels: list[dict[str, Any]], ks: tuple[int, ...], threshold: int
) -> list[dict[str, float]]:
    return [
        score_query(ranking, judged, ks=ks, relevance_threshold=threshold)
        for ranking, judged in zip(rankings, qrels, strict=True)
    ]


def score_with_score_queries(
    rankings: list[list[str]], qrels: list[dict[str, Any]], ks: tuple[int, ...], threshold: int
) -> list[dict[str, float]]:
    columns = score_queries(rankings, qrels, ks=ks, relevance_threshold=threshold, chunk_size=2)
    return [{name: values[i].item() for name, values in columns.items()} for i in range(len(rankings))]


SCORERS = [
    pytest.param(score_with_score_query, id="score_query"),
    pytest.param(score_with_score_queries, id="score_queries"),
]

# (expected output, qrels, run, -l threshold, -c, cutoffs that trec_eval printed, per-query lines printed)
RUNS = [
    pytest.param("out.test", "qrels.test", "results.test", 1, False, DEFAULT_CUTOFFS, False, id="default"),
    pytest.param(
        "out.test",
        "qrels.test.with-comments",
        "results.test",
        1,
        False,
        DEFAULT_CUTOFFS,
        False,
        id="default-qrels-with-comments",
    ),
    pytest.param(
        "out.test.a", "qrels.test", "results.test", 1, False, DEFAULT_CUTOFFS + SUCCESS_CUTOFFS, False, id="a"
    ),
    pytest.param(
        "out.test.aq",
        "qrels.test",
        "results.test",
        1,
        False,
        DEFAULT_CUTOFFS + SUCCESS_CUTOFFS,
        True,
        id="aq",
    ),
    pytest.param(
        "out.test.aqc",
        "qrels.test",
        "results.trunc",
        1,
        True,
        DEFAULT_CUTOFFS + SUCCESS_CUTOFFS,
        True,
        id="aqc-empty-run-for-302",
    ),
    pytest.param(
        "out.test.aql",
        "qrels.rel_level",
        "results.test",
        2,
        False,
        DEFAULT_CUTOFFS + SUCCESS_CUTOFFS,
        True,
        id="aql-graded-threshold-2",
    ),
    pytest.param(
        "out.test.meas_params",
        "qrels.test",
        "results.test",
        1,
        False,
        (2, 3, 5, 7, 10, 20, 23, 2000),  # P.5,7,3  recall.20,2000  ndcg_cut.10,20,23.4  success.2,5,20
        True,
        id="meas-params-cutoffs",
    ),
]


def _load(qrels_file: str, run_file: str, complete: bool) -> tuple[list[str], list[list[str]], list[Any]]:
    qrels = read_qrels(DATA / qrels_file)
    run = read_run(DATA / run_file)
    # trec_eval evaluates the qrels queries that have a ranking; with -c also those without one.
    queries = [query for query in qrels if complete or query in run]
    rankings = [rank_run(run.get(query, {})) for query in queries]
    return queries, rankings, [qrels[query] for query in queries]


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize(
    ("out_file", "qrels_file", "run_file", "threshold", "complete", "ks", "per_query_printed"), RUNS
)
def test_agrees_with_trec_eval(
    scorer: Callable[..., list[dict[str, float]]],
    out_file: str,
    qrels_file: str,
    run_file: str,
    threshold: int,
    complete: bool,
    ks: tuple[int, ...],
    per_query_printed: bool,
) -> None:
    printed = read_trec_eval_output(DATA / out_file)
    queries, rankings, judged = _load(qrels_file, run_file, complete)
    per_query = scorer(rankings, judged, tuple(sorted(set(ks))), threshold)
    means = aggregate_queries(per_query)

    checked: list[tuple[str, str]] = []
    mismatches: list[str] = []
    for ours, theirs in trec_eval_names(ks).items():
        rows = [(query, scores[ours]) for query, scores in zip(queries, per_query, strict=True)]
        summary = means[ours] * means["num_queries"] if ours.startswith("num_") else means[ours]
        for query, value in [*rows, ("all", summary)]:
            expected = printed.get((theirs, query))
            if expected is None:
                continue
            checked.append((theirs, query))
            agrees = round(value) == int(expected) if ours.startswith("num_") else f"{value:.4f}" == expected
            if not agrees:
                mismatches.append(f"{theirs} query {query}: ours {value!r}, trec_eval {expected}")

    assert not mismatches, "\n".join(mismatches)
    # Guard against checking nothing: every measure we map must have been found for every query.
    expected_lines = {
        (theirs, query) for (theirs, query) in printed if theirs in trec_eval_names(ks).values()
    }
    assert set(checked) == expected_lines
    queries_printed = {query for (_, query) in printed if query != "all"}
    assert (queries_printed == set(queries)) if per_query_printed else (queries_printed == set())
    if ("num_q", "all") in printed:
        assert int(printed[("num_q", "all")]) == means["num_queries"]


@pytest.mark.parametrize(
    ("out_file", "qrels_file", "run_file", "threshold", "complete"),
    [
        pytest.param("out.test.aq", "qrels.test", "results.test", 1, False, id="aq"),
        pytest.param("out.test.aqc", "qrels.test", "results.trunc", 1, True, id="aqc"),
        pytest.param("out.test.aql", "qrels.rel_level", "results.test", 2, False, id="aql"),
    ],
)
def test_set_measures_are_the_cutoff_at_num_retrieved(
    out_file: str, qrels_file: str, run_file: str, threshold: int, complete: bool
) -> None:
    """trec_eval's set_P, set_recall and set_F are P@k, recall@k and our F1@k at k = num_ret."""
    printed = read_trec_eval_output(DATA / out_file)
    queries, rankings, judged = _load(qrels_file, run_file, complete)
    checked = 0
    for query, ranking, judgments in zip(queries, rankings, judged, strict=True):
        k = len(ranking)
        if k == 0:  # trec_eval prints 0 for an empty ranking; there is no cutoff 0
            assert printed[("set_F", query)] == "0.0000"
            empty = score_query([], judgments, ks=1, relevance_threshold=threshold)
            assert empty["precision"] == empty["recall"] == empty["f1"] == 0.0
            continue
        scores = score_query(ranking, judgments, ks=k, relevance_threshold=threshold)
        # precision / recall / f1 are over the returned list with no cut-off: exactly trec_eval's set measures
        assert f"{scores['precision']:.4f}" == printed[("set_P", query)]
        assert f"{scores['recall']:.4f}" == printed[("set_recall", query)]
        assert f"{scores['f1']:.4f}" == printed[("set_F", query)]
        assert f"{scores[f'precision_at_{k}']:.4f}" == printed[("set_P", query)]
        assert f"{scores[f'recall_at_{k}']:.4f}" == printed[("set_recall", query)]
        assert f"{scores[f'f1_at_{k}']:.4f}" == printed[("set_F", query)]
        checked += 1
    assert checked >= 2


def test_qrels_comment_lines_are_skipped_but_hash_inside_an_id_is_kept() -> None:
    """trec_eval 10.0 skips lines starting with '#'; the file also has a document id 'CR#93E-1860'."""
    with_comments = read_qrels(DATA / "qrels.test.with-comments")
    plain = read_qrels(DATA / "qrels.test")
    assert with_comments["301"].pop("CR#93E-1860") == plain["301"].pop("CR93E-1860") == 0
    assert with_comments == plain


def test_rank_run_reproduces_the_rank_column_including_ties() -> None:
    """results.test's rank column is trec_eval's order; it has tied scores, broken by doc id descending."""
    rank_column: dict[tuple[str, str], int] = {}
    for line in (DATA / "results.test").read_text().splitlines():
        query, _, doc, rank, *_ = line.split()
        rank_column[(query, doc)] = int(rank)
    run = read_run(DATA / "results.test")
    tied_pairs = 0
    for query, scored in run.items():
        ranking = rank_run(scored)
        assert [rank_column[(query, doc)] for doc in ranking] == list(range(1, len(ranking) + 1))
        tied_pairs += sum(scored[a] == scored[b] for a, b in zip(ranking, ranking[1:], strict=False))
    assert tied_pairs > 0  # the file really exercises the tie-break
