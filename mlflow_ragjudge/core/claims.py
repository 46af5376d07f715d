"""Claim arithmetic: the scores that follow from recorded verdicts, with no LLM.

The claim-based judges (``metrics/faithfulness.py``, ``metrics/context_recall.py``) ask a model for
verdicts and then call these functions, so the arithmetic can be tested on its own -- against
our own vectors and against RAGChecker's recorded example outputs
(``tests/test_claims_reference_data.py``). Formulas and sources are in ``docs/faithfulness.md``
and ``docs/ragas-family.md``.

Two families:

* **RAGAS** (Es et al. 2023, "RAGAS: Automated Evaluation of Retrieval Augmented Generation"):
  :func:`faithfulness`, :func:`average_precision` (context precision), :func:`context_recall`,
  :func:`context_relevance`, :func:`mean_cosine` (answer relevancy).
* **RAGChecker** (Ru et al. 2024, amazon-science/RAGChecker ``ragchecker/computation.py``):
  claim-level precision/recall/F1 of the response against the reference answer, claim recall and
  context precision of the retriever, and the generator's context utilisation, noise
  sensitivity, hallucination, self-knowledge and faithfulness, from entailment matrices
  (:func:`ragchecker_metrics`, :func:`ragchecker_report`).

Undefined values are ``None``, never NaN: a faithfulness with no claims is undefined (an
abstention, SPEC 2.3), not 0 and not 1. Where RAGChecker itself reports 0 for an undefined case
(no claims, no recalled claims) the RAGChecker functions here return ``None`` and say so; the
reference outputs have no such case, so the recorded numbers are reproduced exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "ENTAILMENT",
    "faithfulness",
    "fraction",
    "precision_at_k",
    "average_precision",
    "context_recall",
    "context_relevance",
    "cosine",
    "mean_cosine",
    "entailed",
    "ragchecker_metrics",
    "ragchecker_report",
    "RAGCHECKER_GROUPS",
]

#: RAGChecker's verdict label that counts as "supported"; ``Neutral`` and ``Contradiction`` do not.
ENTAILMENT = "Entailment"


def _flags(values: Iterable[Any], what: str) -> list[bool]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool):
            out.append(v)
        elif isinstance(v, int) and v in (0, 1):
            out.append(bool(v))
        else:
            raise ValueError(f"{what}[{i}] must be a bool (or 0/1), got {v!r}")
    return out


def fraction(flags: Sequence[bool | int]) -> float | None:
    """Share of true flags: ``sum(flags) / len(flags)``; ``None`` for an empty sequence.

    Args:
        flags: one bool (or 0/1) per item.

    Returns:
        The share in [0, 1], or ``None`` when there is nothing to count.
    """
    values = _flags(flags, "flags")
    return sum(values) / len(values) if values else None


def faithfulness(supported: Sequence[bool | int]) -> float | None:
    """RAGAS faithfulness ``F = |V| / |S|``: supported claims over all claims of the response.

    Args:
        supported: one verdict per claim (True: the evidence supports it).

    Returns:
        The share of supported claims; ``None`` when the response has no claims (the judge
        reports that as an abstention, never as NaN, 0 or 1).

    Example:
        >>> faithfulness([True, True, False, True, False])
        0.6
    """
    return fraction(supported)


def precision_at_k(relevant: Sequence[bool | int], k: int) -> float:
    """Precision at rank ``k``: relevant chunks among the first ``k`` over ``k``.

    Args:
        relevant: relevance of each ranked chunk, rank 1 first.
        k: the cut-off, ``1 <= k <= len(relevant)``.
    """
    rels = _flags(relevant, "relevant")
    if not 1 <= k <= len(rels):
        raise ValueError(f"k must be between 1 and {len(rels)}, got {k}")
    return sum(rels[:k]) / k


def average_precision(relevant: Sequence[bool | int]) -> float | None:
    """RAGAS context precision: ``Σ_k (precision@k · rel_k) / (number of relevant chunks)``.

    Average precision over the ranked chunks the retriever returned: relevant chunks ranked
    early score higher. The denominator counts the relevant chunks *among those retrieved*
    (RAGAS's definition), not all relevant chunks in the corpus as trec_eval's MAP does.

    Args:
        relevant: one verdict per retrieved chunk, in rank order.

    Returns:
        The average precision in [0, 1]; 0.0 when no chunk is relevant (RAGAS divides by
        ``count + 1e-10`` and so returns 0 as well; here the case is explicit); ``None`` when
        there are no chunks at all.

    Example:
        >>> average_precision([True, False, True])  # (1/1 + 2/3) / 2
        0.8333333333333333
    """
    rels = _flags(relevant, "relevant")
    if not rels:
        return None
    n_relevant = sum(rels)
    if n_relevant == 0:
        return 0.0
    total = 0.0
    hits = 0
    for k, rel in enumerate(rels, 1):
        if rel:
            hits += 1
            total += hits / k
    return total / n_relevant


def context_recall(attributed: Sequence[bool | int]) -> float | None:
    """RAGAS context recall: reference statements attributable to the contexts over all statements.

    Returns ``None`` when the reference has no statements.
    """
    return fraction(attributed)


def context_relevance(selected: Iterable[int], total: int) -> float | None:
    """Original RAGAS context relevance: ``|S_ext| / total sentences``.

    Args:
        selected: 1-based numbers of the context sentences needed to answer the question
            (repeats count once).
        total: number of sentences in the contexts.

    Returns:
        The share in [0, 1]; ``None`` when the contexts have no sentences.

    Raises:
        ValueError: a selected number outside ``1..total``.
    """
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    chosen = set()
    for s in selected:
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= total:
            raise ValueError(f"sentence number {s!r} is not between 1 and {total}")
        chosen.add(s)
    if total == 0:
        return None
    return len(chosen) / total


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors; 0.0 when either is all zeros.

    Raises:
        ValueError: vectors of different lengths or with non-finite values.
    """
    if len(a) != len(b):
        raise ValueError(f"vectors have different lengths ({len(a)} and {len(b)})")
    dot = na = nb = 0.0
    for x, y in zip(a, b):
        x, y = float(x), float(y)
        dot += x * y
        na += x * x
        nb += y * y
    if not all(math.isfinite(v) for v in (dot, na, nb)):
        raise ValueError("vectors contain non-finite values")
    if na == 0.0 or nb == 0.0:
        return 0.0
    return dot / math.sqrt(na * nb)


def mean_cosine(query: Sequence[float], others: Sequence[Sequence[float]]) -> float | None:
    """RAGAS answer relevancy: mean cosine similarity between the question and each generated question.

    Returns ``None`` when ``others`` is empty.
    """
    if not others:
        return None
    return sum(cosine(query, v) for v in others) / len(others)


# --------------------------------------------------------------------------- RAGChecker


def entailed(verdict: Any) -> bool:
    """Whether a RAGChecker verdict label counts as supported (only ``Entailment`` does)."""
    if isinstance(verdict, bool):
        return verdict
    if not isinstance(verdict, str):
        raise ValueError(f"a verdict must be a label such as 'Entailment', got {verdict!r}")
    return verdict == ENTAILMENT


def _vector(values: Any, name: str) -> list[bool]:
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{name} must be a list of verdicts, got {type(values).__name__}")
    return [entailed(v) for v in values]


def _matrix(values: Any, name: str, n_passages: int | None = None) -> list[list[bool]]:
    """A claims x passages verdict matrix; ragged rows are an error."""
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{name} must be a list (one row per claim), got {type(values).__name__}")
    rows = [_vector(r, f"{name}[{i}]") for i, r in enumerate(values)]
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise ValueError(f"{name} is ragged: rows have {sorted(widths)} passages")
    if rows and n_passages is not None and len(rows[0]) != n_passages:
        raise ValueError(f"{name} has {len(rows[0])} columns but there are {n_passages} passages")
    return rows


def _mean(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def ragchecker_metrics(record: Mapping[str, Any]) -> dict[str, float | None]:
    """RAGChecker's per-row metrics from its four recorded entailment checks.

    ``record`` holds (the keys of RAGChecker's ``checking_outputs.json``):

    * ``answer2response``: one verdict per *response* claim, checked against the reference answer;
    * ``response2answer``: one verdict per *reference* claim, checked against the response;
    * ``retrieved2response``: response claims x passages;
    * ``retrieved2answer``: reference claims x passages.

    Definitions (rows are claims, columns passages; "entailed" = verdict ``Entailment``):

    * precision = mean(answer2response); recall = mean(response2answer); f1 = their harmonic mean
      (0 when either is 0);
    * claim_recall = share of reference claims entailed by at least one passage;
    * context_precision = share of passages that entail at least one reference claim;
    * context_utilization = reference claims both entailed by some passage and present in the
      response, over reference claims entailed by some passage;
    * faithfulness = share of response claims entailed by at least one passage;
    * hallucination = share of response claims entailed by no passage and wrong (not entailed by
      the reference); self_knowledge = entailed by no passage but correct;
    * noise_sensitivity_in_relevant = share of response claims that are wrong and entailed by a
      relevant passage (one entailing some reference claim); ..._in_irrelevant = wrong and
      entailed only by irrelevant passages.

    Returns:
        metric name -> value in [0, 1], or ``None`` where the denominator is empty (RAGChecker
        reports 0 there).

    Raises:
        ValueError: a missing key, a non-label verdict, a ragged matrix, or matrices whose
            passage counts disagree.
    """
    for key in ("answer2response", "response2answer", "retrieved2response", "retrieved2answer"):
        if key not in record:
            raise ValueError(f"record has no {key!r} (RAGChecker checking output)")
    a2r = _vector(record["answer2response"], "answer2response")
    r2a = _vector(record["response2answer"], "response2answer")
    ret2resp = _matrix(record["retrieved2response"], "retrieved2response")
    n_passages = len(ret2resp[0]) if ret2resp else None
    ret2ans = _matrix(record["retrieved2answer"], "retrieved2answer", n_passages)
    if n_passages is None and ret2ans:
        n_passages = len(ret2ans[0])
    if len(ret2resp) != len(a2r):
        raise ValueError(f"retrieved2response has {len(ret2resp)} rows but answer2response {len(a2r)} claims")
    if len(ret2ans) != len(r2a):
        raise ValueError(f"retrieved2answer has {len(ret2ans)} rows but response2answer {len(r2a)} claims")

    out: dict[str, float | None] = {}
    precision = _mean(a2r)
    recall = _mean(r2a)
    out["precision"] = precision
    out["recall"] = recall
    if precision is None or recall is None:
        out["f1"] = None
    elif precision > 0 and recall > 0:
        out["f1"] = 2 * precision * recall / (precision + recall)
    else:
        out["f1"] = 0.0

    # retriever
    ans_claim_recalled = [any(row) for row in ret2ans]
    out["claim_recall"] = _mean(ans_claim_recalled)
    passage_useful = [any(row[j] for row in ret2ans) for j in range(n_passages or 0)] if ret2ans else []
    out["context_precision"] = _mean(passage_useful)

    # generator
    recalled = sum(ans_claim_recalled)
    used = sum(1 for rec, inresp in zip(ans_claim_recalled, r2a) if rec and inresp)
    out["context_utilization"] = used / recalled if recalled else None

    resp_faithful = [any(row) for row in ret2resp]
    out["faithfulness"] = _mean(resp_faithful)
    unfaithful = [not f for f in resp_faithful]
    out["hallucination"] = _mean([u and not c for u, c in zip(unfaithful, a2r)])
    out["self_knowledge"] = _mean([u and c for u, c in zip(unfaithful, a2r)])

    if ret2resp and ret2ans:
        relevant = [any(row[j] for row in ret2ans) for j in range(n_passages or 0)]
        in_relevant = [any(row[j] and relevant[j] for j in range(len(row))) for row in ret2resp]
        in_irrelevant = [
            any(row[j] and not relevant[j] for j in range(len(row))) and not rel_hit
            for row, rel_hit in zip(ret2resp, in_relevant)
        ]
        wrong = [not c for c in a2r]
        out["noise_sensitivity_in_relevant"] = _mean([r and w for r, w in zip(in_relevant, wrong)])
        out["noise_sensitivity_in_irrelevant"] = _mean([r and w for r, w in zip(in_irrelevant, wrong)])
    else:
        out["noise_sensitivity_in_relevant"] = None
        out["noise_sensitivity_in_irrelevant"] = None
    return out


#: RAGChecker's report layout: group -> metric names.
RAGCHECKER_GROUPS: dict[str, tuple[str, ...]] = {
    "overall": ("precision", "recall", "f1"),
    "retriever": ("claim_recall", "context_precision"),
    "generator": (
        "context_utilization",
        "noise_sensitivity_in_relevant",
        "noise_sensitivity_in_irrelevant",
        "hallucination",
        "self_knowledge",
        "faithfulness",
    ),
}


def ragchecker_report(rows: Sequence[Mapping[str, float | None]]) -> dict[str, dict[str, float | None]]:
    """Aggregate per-row RAGChecker metrics the way RAGChecker reports them.

    Each metric is the mean over rows, in percent, rounded to one decimal
    (``round(mean * 100, 1)``). Rows where a metric is ``None`` (undefined) are left out of
    that metric's mean; a metric undefined on every row is ``None``. (RAGChecker counts such rows
    as 0.)

    Args:
        rows: the output of :func:`ragchecker_metrics` for each row.

    Returns:
        ``{"overall": {...}, "retriever": {...}, "generator": {...}}``.
    """
    report: dict[str, dict[str, float | None]] = {}
    for group, names in RAGCHECKER_GROUPS.items():
        report[group] = {}
        for name in names:
            values = [r[name] for r in rows if r.get(name) is not None]
            report[group][name] = round(sum(values) / len(values) * 100, 1) if values else None  # type: ignore[arg-type]
    return report
