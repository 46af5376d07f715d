"""Fit the offline judge's calibration on public human labels, and measure it on the half it was not fitted on.

::

    python -m tools.offline_judge report --data ../shared/data   # the held-out agreement (docs/offline-judge.md)
    python -m tools.offline_judge fit --data ../shared/data --out mlflow_ragjudge/data/offline_judge.json

(from the project's root). The data (see :mod:`tools.offline_judge.public_data`) is cut in two by a fixed rule
(:func:`half_split`, by question for NQ301 and by task for MTRAG). On the **fit half**:

1. the correctness models: logistic regressions (L2, weight 1, intercept not penalised) of "a human accepts the
   response", over NQ301 (the majority's acceptable / not) and MTRAG's model responses (mean completeness >= 3,
   "mostly yes" or better) -- one on the pairs of a response and a **short** acceptable answer (:data:`USED`),
   one on the pairs with a **long** one (more than ``SHORT_ANSWER`` distinct content words, :data:`LONG_USED`;
   :attr:`~mlflow_ragjudge.metrics.offline.Calibration.long`), or one for both when either has under
   :data:`MIN_LONG_ROWS` rows. A row's features are those of its best acceptable answer under the model, so each
   fit alternates between choosing each row's best answer and refitting (three rounds, starting from the answer
   with the highest word recall);
2. cut-point 4 of each model (levels 4-5 = acceptable): the probability that maximises Cohen's kappa with the
   human verdicts on the fit rows whose best answer that model judges;
3. cut-point 5 of each model on the probability, and the shared recall cut-points 3 and 2 below cut-point 4 (how
   much of the best answer's content the response contains: some -> 2, more -> 3, none -> 1): the ones that
   minimise the mean squared difference between the level and a target level -- MTRAG's mean completeness put on
   the six-level scale (1 -> 1, 2 -> 2.33, 3 -> 3.67, 4 -> 5); for NQ301, 5 for an accepted answer and 1 for a
   rejected one -- each data set weighing the same;
4. the support threshold (faithfulness, context recall and precision): the share of a sentence's content words
   that must occur in the passages for it to count as supported, chosen to maximise the Spearman correlation
   of the supported share with MTRAG's mean human faithfulness.

The report measures the shipped calibration on the **held-out half**, against the lexical baselines on every set
(:mod:`~tools.offline_judge.table`) and beside the recorded judges on the same rows, and shows how much the
figures move when the halves are drawn at random (refitted each time).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mlflow_ragjudge.engine.meta import agreement
from mlflow_ragjudge.metrics.lexical import word_recall
from mlflow_ragjudge.metrics.offline import FEATURES, Calibration, OfflineJudge, answer_features
from mlflow_ragjudge.metrics.offline_evidence import SHORT_ANSWER, AnswerModel, is_long_answer

from .claims import claims_table, format_claims_table, load_qags, load_wice
from .public_data import half_split, lexical_match, load_mtrag, load_nq301
from .table import agreement_table, format_table

__all__ = ["fit_calibration", "held_out_report", "baseline_table", "format_report", "main", "SPLIT_SALT"]

#: the salt of the fixed half split (fit half: SHA-256(salt + key) even)
SPLIT_SALT = "mlflow-ragjudge offline judge v1"
CALIBRATION_VERSION = "4"
L2 = 1.0
ROUNDS = 3
SUPPORT_GRID = tuple(round(0.4 + 0.05 * i, 2) for i in range(12))  # 0.40 .. 0.95
#: recorded figures the report prints beside ours (all 318 MTRAG model responses; the whole NQ301)
RECORDED = {"mtrag_faithfulness_spearman": {"RAGAS faithfulness (rl_f)": 0.635, "BERT-KPrec": 0.654,
                                             "ROUGE-L": 0.505},
            "nq301_agreement": {"GPT-4": 0.848, "BEM": 0.806, "lexical match": 0.75}}


# --------------------------------------------------------------------------- features


def _nq_rows(nq: pd.DataFrame) -> list[list[dict[str, float] | None]]:
    return [[answer_features(r.question, r.answer, ref) for ref in r.references] for r in nq.itertuples()]


def _mtrag_rows(m: pd.DataFrame) -> list[list[dict[str, float] | None]]:
    return [[answer_features(r.question, r.response, r.reference, r.passages)] for r in m.itertuples()]


#: the features the calibration's main model uses (a subset of offline.FEATURES)
USED = ("recall", "phrase", "char_recall", "number_missing", "number_conflict", "support", "response_length",
        "new_recall")
#: the features of the long-answer model (all of them: chosen over USED by the mean held-out kappa on MTRAG over 20
#: random halves when chosen, 0.421 against 0.409; docs/offline-judge.md)
LONG_USED = FEATURES


def _matrix(feats: Sequence[dict[str, float]], used: Sequence[str] = USED) -> np.ndarray:
    return np.array([[f[k] for k in used] for f in feats], dtype=float)


# --------------------------------------------------------------------------- the logistic model


def _logistic(X: np.ndarray, y: np.ndarray, weight: np.ndarray, l2: float = L2) -> tuple[np.ndarray, float]:
    """Weights and intercept minimising the (row-weighted) log loss + l2/2 * |w|^2 (intercept not penalised)."""
    from scipy.optimize import minimize

    Xb = np.hstack([X, np.ones((len(X), 1))])

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = Xb @ theta
        # log(1 + e^z) - y z, computed stably
        value = np.sum(weight * (np.logaddexp(0.0, z) - y * z)) + 0.5 * l2 * float(theta[:-1] @ theta[:-1])
        p = 1.0 / (1.0 + np.exp(-z))
        grad = Xb.T @ (weight * (p - y))
        grad[:-1] += l2 * theta[:-1]
        return float(value), grad

    res = minimize(loss, np.zeros(Xb.shape[1]), jac=True, method="L-BFGS-B")
    return res.x[:-1], float(res.x[-1])


def _best(rows: list[list[dict[str, float] | None]], w: np.ndarray | None, b: float,
          used: Sequence[str]) -> list[int]:
    out = []
    for feats in rows:
        scores = [(-math.inf if f is None else (f["recall"] if w is None else float(_matrix([f], used)[0] @ w + b)))
                  for f in feats]
        out.append(int(np.argmax(scores)) if scores else 0)
    return out


def _fit_model(rows: list[list[dict[str, float] | None]], y: np.ndarray, weight: np.ndarray,
               used: Sequence[str]) -> tuple[np.ndarray, float]:
    w: np.ndarray | None = None
    b = 0.0
    for _ in range(ROUNDS):
        pick = _best(rows, w, b, used)
        keep = [i for i, feats in enumerate(rows) if feats and feats[pick[i]] is not None]
        X = _matrix([rows[i][pick[i]] for i in keep], used)  # type: ignore[misc]
        w, b = _logistic(X, y[keep], weight[keep])
    assert w is not None
    return w, b


# --------------------------------------------------------------------------- cut-points


RECALL_GRID = tuple(round(0.05 * i, 2) for i in range(1, 21))  # 0.05 .. 1.00


def _completeness_levels(completeness: np.ndarray) -> np.ndarray:
    """MTRAG's mean rating 1..4 on the six-level scale 1..5."""
    return 1.0 + (completeness - 1.0) * 4.0 / 3.0


# --------------------------------------------------------------------------- faithfulness


def _supported_share(judge: OfflineJudge, response: str, passages: Sequence[str], tau: float) -> float | None:
    res = judge.faithfulness(response, passages)
    if not res.is_scored:
        return None
    claims = res.details["claims"]
    return sum(c["support"] >= tau for c in claims) / len(claims)


def _spearman(a: Sequence[float | None], b: Sequence[float]) -> tuple[float, float, int]:
    from scipy import stats

    pairs = [(x, y) for x, y in zip(a, b) if x is not None]
    if len(pairs) < 3:
        return math.nan, math.nan, len(pairs)
    xs, ys = zip(*pairs)
    return (float(stats.spearmanr(xs, ys).statistic), float(stats.kendalltau(xs, ys).statistic), len(pairs))


# --------------------------------------------------------------------------- fit


def _masks(nq: pd.DataFrame, m: pd.DataFrame, nq_fit: set[str], m_fit: set[str]) -> tuple[np.ndarray, np.ndarray]:
    return nq["question_id"].isin(nq_fit).to_numpy(), m["task_id"].isin(m_fit).to_numpy()


def _regime(rows: list[list[dict[str, float] | None]], long: bool) -> list[list[dict[str, float] | None]]:
    """``rows`` with the acceptable answers of the other length left out (None), so that indices still align."""
    return [[f if f is not None and is_long_answer(f) == long else None for f in feats] for feats in rows]


def _row_best(rows: list[list[dict[str, float] | None]],
              models: dict[bool, tuple[np.ndarray, float, Sequence[str]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's acceptance probability (its best acceptable answer's, each answer under the model of its length),
    that answer's recall, and whether it is a long answer."""
    ps, rs, longs = [], [], []
    for feats in rows:
        best = (-math.inf, 0.0, False)
        for f in feats:
            if f is None:
                continue
            long = is_long_answer(f) and True in models
            w, b, used = models[long]
            z = float(_matrix([f], used)[0] @ w + b)
            if z > best[0]:
                best = (z, f["recall"], long)
        ps.append(0.0 if best[0] == -math.inf else 1.0 / (1.0 + math.exp(-best[0])))
        rs.append(best[1])
        longs.append(best[2])
    return np.array(ps), np.array(rs), np.array(longs, dtype=bool)


def _kappa_cut(p: np.ndarray, y: np.ndarray) -> float:
    """The probability cut-point (level 4 and above = accepted) that maximises Cohen's kappa with the human
    verdicts ``y`` (ties: the cut nearer 0.5)."""
    candidates = np.unique(np.round(p, 4))

    def kappa(c: float) -> float:
        pred = p >= c
        po = float(np.mean(pred == y))
        pe = float(np.mean(pred) * np.mean(y) + np.mean(~pred) * np.mean(~y))
        return (po - pe) / (1 - pe) if pe < 1 else 0.0

    return float(max(candidates, key=lambda c: (round(kappa(c), 12), -abs(c - 0.5))))


def _c5(p: np.ndarray, target: np.ndarray, weight: np.ndarray, c4: float) -> float:
    """Cut-point 5 (>= c4) minimising the weighted squared difference between level (5 or 4) and target over the
    rows at or above c4; candidates: the 1 %-quantiles of ``p``."""
    above = p >= c4

    def cost5(c: float) -> float:
        return float(np.sum(weight[above] * (np.where(p[above] >= c, 5, 4) - target[above]) ** 2))

    grid = np.unique(np.concatenate([np.quantile(p, np.linspace(0, 1, 101)), [c4]])) if len(p) else np.array([c4])
    return min([float(g) for g in grid if g >= c4] + [1.0 + 1e-9], key=cost5)


def _recall_cuts(recall: np.ndarray, target: np.ndarray, weight: np.ndarray) -> tuple[float, float]:
    """(r2, r3), r2 <= r3, on the recall of the rows below cut-point 4 (level 3 from r3, 2 from r2, else 1; r2 > 0,
    so a response with none of the answer's words is level 1), minimising the weighted squared difference between
    level and target; steps of 0.05."""

    def cost23(rr: tuple[float, float]) -> float:
        lv = np.where(recall >= rr[1], 3, np.where(recall >= rr[0], 2, 1))
        return float(np.sum(weight * (lv - target) ** 2))

    return min(((r2, r3) for r3 in RECALL_GRID for r2 in RECALL_GRID if r2 <= r3), key=cost23)


#: fewer fit rows than this with a long acceptable answer, or with a short one: no long-answer model (one model
#: judges every answer)
MIN_LONG_ROWS = 40


def fit_calibration(nq: pd.DataFrame, mtrag: pd.DataFrame, *, nq_fit: set[str] | None = None,
                    m_fit: set[str] | None = None, features: Sequence[str] = USED,
                    long_features: Sequence[str] = LONG_USED, regimes: bool = True, mtrag_weight: float = 1.0,
                    nq_keep: np.ndarray | None = None, _cache: dict[str, Any] | None = None) -> Calibration:
    """Fit a calibration on the fit halves (default: the fixed :func:`half_split` with :data:`SPLIT_SALT`; an
    empty set leaves that data set out; ``nq_keep``, a boolean mask over ``nq``'s rows, keeps only those of the fit
    half). With ``regimes``, short and long acceptable answers get a model each (:attr:`Calibration.long`);
    without, one model for both (calibration 1's way)."""
    nq_fit = nq_fit if nq_fit is not None else half_split(nq["question_id"], SPLIT_SALT)
    m_fit = m_fit if m_fit is not None else half_split(mtrag["task_id"], SPLIT_SALT)
    cache = _cache if _cache is not None else {}
    if "nq_rows" not in cache:
        cache["nq_rows"] = _nq_rows(nq)
    if "m_rows" not in cache:
        cache["m_rows"] = _mtrag_rows(mtrag)
    nq_rows, m_rows = cache["nq_rows"], cache["m_rows"]
    nmask, mmask = _masks(nq, mtrag, nq_fit, m_fit)
    if nq_keep is not None:
        nmask = nmask & nq_keep
    y_nq = nq["human"].to_numpy(dtype=float)
    y_m = (mtrag["completeness"].to_numpy() >= 3.0).astype(float)
    rows = [r for r, keep in zip(nq_rows, nmask) if keep] + [r for r, keep in zip(m_rows, mmask) if keep]
    y = np.concatenate([y_nq[nmask], y_m[mmask]])
    rw = np.concatenate([np.ones(int(nmask.sum())), np.full(int(mmask.sum()), mtrag_weight)])
    # the level targets: MTRAG's completeness on the six-level scale; an NQ answer is 5 when the humans accept
    # it and 1 when they do not (a wrong short answer is wrong outright); each data set weighs the same
    t_nq = np.where(y_nq[nmask] > 0, 5.0, 1.0)
    t_m = _completeness_levels(mtrag["completeness"].to_numpy()[mmask])
    target = np.concatenate([t_nq, t_m])
    weight = np.concatenate([np.full(len(t_nq), 0.5 / max(1, len(t_nq))),
                             np.full(len(t_m), 0.5 / max(1, len(t_m)))])
    models: dict[bool, tuple[np.ndarray, float, Sequence[str]]] = {}
    long_rows, short_rows = _regime(rows, True), _regime(rows, False)
    if regimes and min(sum(any(f is not None for f in r) for r in part)
                       for part in (long_rows, short_rows)) >= MIN_LONG_ROWS:
        models[True] = (*_fit_model(long_rows, y, rw, tuple(long_features)), tuple(long_features))
        main_rows = short_rows
    else:
        main_rows = rows
    models[False] = (*_fit_model(main_rows, y, rw, tuple(features)), tuple(features))
    p, recall, long = _row_best(rows, models)
    truth = y.astype(bool)
    c4 = {k: _kappa_cut(p[long == k], truth[long == k]) for k in models}
    c5 = {k: _c5(p[long == k], target[long == k], weight[long == k], c4[k]) for k in models}
    below = p < np.array([c4[bool(k)] for k in long]) if len(p) else np.zeros(0, bool)
    r2, r3 = _recall_cuts(recall[below], target[below], weight[below])
    w, b, used = models[False]
    long_model = None
    if True in models:
        lw, lb, lused = models[True]
        long_model = AnswerModel(tuple(lused), tuple(round(float(x), 6) for x in lw), round(lb, 6),
                                 {"4": round(c4[True], 6), "5": round(c5[True], 6)})
    # the two thresholds: the Spearman of the supported share of a response's claims with human faithfulness on the
    # fit half, a claim supported when the share of its words found (support_threshold: what context recall and
    # context precision read) or its support (claim_threshold: faithfulness's) reaches the threshold
    judge = OfflineJudge(Calibration(CALIBRATION_VERSION, tuple(used), tuple(w), b, {"4": c4[False], "5": c5[False]},
                                     {"2": r2, "3": r3}, 0.5))
    fit_m = mtrag[mmask]
    if "support" not in cache:
        cache["support"] = [judge.faithfulness(r.response, r.passages) for r in mtrag.itertuples()]

    def threshold(key: str) -> float:
        return max(SUPPORT_GRID, key=lambda t: _spearman(
            [None if not res.is_scored else sum(c[key] >= t for c in res.details["claims"]) / len(
                res.details["claims"]) for res, keep in zip(cache["support"], mmask) if keep],
            fit_m["faithfulness"].tolist())[0]) if mmask.any() else 0.5

    tau, claim_tau = threshold("words_found"), threshold("support")
    return Calibration(
        CALIBRATION_VERSION, tuple(used), tuple(round(float(x), 6) for x in w), round(b, 6),
        {"4": round(c4[False], 6), "5": round(c5[False], 6)}, {"2": r2, "3": r3}, float(tau),
        {"data": {"nq301": "ehsk/OpenQA-eval @ 8b9317d0 (NQ301_human.tsv, NQ301_BEM.tsv gold answers)",
                  "mtrag": "IBM/mt-rag-benchmark @ cc5b1d48 (human evaluation subset, model responses)"},
         "split": f"half_split(key, salt={SPLIT_SALT!r}): fit half = SHA-256(salt + key) even; "
                  "key = question id (NQ301), task id (MTRAG)",
         "fit_rows": {"nq301": int(nmask.sum()), "mtrag": int(mmask.sum())},
         "l2": L2, "rounds": ROUNDS, "cut_4": "the probability that maximises Cohen's kappa on the fit rows",
         "long_answer": f"more than {SHORT_ANSWER} distinct content words"},
        long_model, float(claim_tau),
    )


# --------------------------------------------------------------------------- report


def _agreement(pred: Sequence[bool], truth: Sequence[bool]) -> dict[str, float]:
    out = agreement(["Yes" if p else "No" for p in pred], ["Yes" if t else "No" for t in truth])
    return {"n": out["n"], "agreement": out["agreement"], "kappa": out["cohen_kappa"]}


def _nq_judgements(judge: OfflineJudge, nq: pd.DataFrame) -> list[bool]:
    out = []
    for r in nq.itertuples():
        res = judge.correctness(r.question, r.answer, list(r.references))
        out.append(res.is_scored and res.value is not None and res.value >= 4)
    return out


def _old_demo_rule(nq: pd.DataFrame) -> list[bool]:
    """The replaced ``demo:/overlap`` stand-in on NQ: share of the (one-string) reference's words in the answer
    >= 0.6 (its level 4), the aliases read as one string."""
    return [(word_recall(r.answer, " | ".join(r.references)) or 0.0) >= 0.6 for r in nq.itertuples()]


def held_out_report(data_dir: str | Path, calibration: Calibration | None = None, *, splits: int = 0,
                    seed: int = 0) -> dict[str, Any]:
    """Measure ``calibration`` (default: the shipped one) on the held-out halves of the data in ``data_dir``,
    beside the recorded judges on the same rows; with ``splits`` > 0, also refit on that many random halves and
    summarise the held-out figures."""
    nq, m = load_nq301(data_dir), load_mtrag(data_dir)
    cal = calibration or Calibration.shipped()
    judge = OfflineJudge(cal)
    nq_fit, m_fit = half_split(nq["question_id"], SPLIT_SALT), half_split(m["task_id"], SPLIT_SALT)
    nmask, mmask = _masks(nq, m, nq_fit, m_fit)
    out: dict[str, Any] = {"calibration": cal.version, "split": SPLIT_SALT}
    ho = nq[~nmask]
    truth = ho["human"].tolist()
    nq_out: dict[str, Any] = {"rows": len(ho), "questions": int(ho["question_id"].nunique()),
                              "offline": _agreement(_nq_judgements(judge, ho), truth)}
    nq_out["gpt4_recorded"] = _agreement([bool(v) for v in ho["gpt4"]], truth)  # unparsed = No, as OpenQA-eval
    nq_out["bem_recorded"] = _agreement(ho["bem"].tolist(), truth)
    nq_out["lexical_match"] = _agreement([lexical_match(r.answer, r.references) for r in ho.itertuples()], truth)
    nq_out["replaced_demo_overlap"] = _agreement(_old_demo_rule(ho), truth)
    out["nq301_heldout"] = nq_out
    mh = m[~mmask].reset_index(drop=True)
    faith = [judge.faithfulness(r.response, r.passages) for r in mh.itertuples()]
    corr = [judge.correctness(r.question, r.response, [r.reference], r.passages) for r in mh.itertuples()]
    fvals = [res.value if res.is_scored else None for res in faith]
    cvals = [res.value if res.is_scored else None for res in corr]
    m_out: dict[str, Any] = {"rows": len(mh), "tasks": int(mh["task_id"].nunique())}
    for name, vals in (("offline_faithfulness", fvals), ("offline_correctness", cvals)):
        for human in ("faithfulness", "completeness"):
            s, k, n = _spearman(vals, mh[human].tolist())
            m_out[f"{name}~{human}"] = {"spearman": s, "kendall": k, "n": n}
    scored = [v is not None for v in fvals]
    for rec in ("rl_f", "Bert-KPrec", "RougeL", "rb_llm"):
        for human in ("faithfulness", "completeness"):
            s, k, n = _spearman(mh[rec].tolist(), mh[human].tolist())
            s2, _, n2 = _spearman([v if ok else None for v, ok in zip(mh[rec], scored)], mh[human].tolist())
            m_out[f"{rec}~{human}"] = {"spearman": s, "kendall": k, "n": n, "spearman_same_rows_as_offline": s2}
    m_out["offline_faithfulness_abstained"] = sum(v is None for v in fvals)
    m_out["offline_correctness_abstained"] = sum(v is None for v in cvals)
    m_out["offline_correctness_mean_level"] = float(np.mean([v for v in cvals if v is not None]))
    m_out["human_completeness_mean_on_six_levels"] = float(np.mean(_completeness_levels(mh["completeness"])))
    out["mtrag_heldout"] = m_out
    if splits:
        out["random_splits"] = _random_splits(nq, m, splits, seed)
    return out


def _random_splits(nq: pd.DataFrame, m: pd.DataFrame, splits: int, seed: int, **fit_options: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    cache: dict[str, Any] = {}
    qids, tids = sorted(nq["question_id"].unique()), sorted(m["task_id"].unique())
    agree, kappa, spear, bem, gpt4 = [], [], [], [], []
    for _ in range(splits):
        nq_fit = set(rng.choice(qids, len(qids) // 2, replace=False))
        m_fit = set(rng.choice(tids, len(tids) // 2, replace=False))
        cal = fit_calibration(nq, m, nq_fit=nq_fit, m_fit=m_fit, _cache=cache, **fit_options)
        judge = OfflineJudge(cal)
        nmask, mmask = _masks(nq, m, nq_fit, m_fit)
        a = _agreement(_nq_judgements(judge, nq[~nmask]), nq[~nmask]["human"].tolist())
        agree.append(a["agreement"])
        truth = nq[~nmask]["human"].tolist()
        bem.append(_agreement(nq[~nmask]["bem"].tolist(), truth)["agreement"])
        gpt4.append(_agreement([bool(v) for v in nq[~nmask]["gpt4"]], truth)["agreement"])
        kappa.append(a["kappa"])
        mh = m[~mmask]
        vals = [res.value if res.is_scored else None
                for res in (judge.faithfulness(r.response, r.passages) for r in mh.itertuples())]
        spear.append(_spearman(vals, mh["faithfulness"].tolist())[0])

    def summary(xs: list[float]) -> dict[str, float]:
        return {"mean": float(np.mean(xs)), "min": float(np.min(xs)), "max": float(np.max(xs))}

    return {"splits": splits, "seed": seed, "nq301_agreement": summary(agree), "nq301_kappa": summary(kappa),
            "nq301_bem_agreement": summary(bem), "nq301_gpt4_agreement": summary(gpt4),
            "mtrag_faithfulness_spearman": summary(spear)}


def format_report(r: dict[str, Any]) -> str:
    """The report as Markdown tables (the form docs/offline-judge.md quotes)."""
    nq, m = r["nq301_heldout"], r["mtrag_heldout"]
    lines = [f"Offline judge calibration {r['calibration']}, held-out halves (split salt {r['split']!r})", "",
             f"OpenQA-eval NQ301, held-out half: {nq['rows']} answers to {nq['questions']} questions, against the "
             "human majority", "", "| judge | agreement | Cohen's kappa |", "|---|---|---|"]
    for key, label in (("offline", "offline:/lexical (level >= 4 = acceptable)"),
                       ("gpt4_recorded", "GPT-4 (recorded verdicts)"), ("bem_recorded", "BEM (recorded verdicts)"),
                       ("lexical_match", "lexical match (any gold answer contained)"),
                       ("replaced_demo_overlap", "demo:/overlap, the stand-in it replaces")):
        lines.append(f"| {label} | {nq[key]['agreement']:.3f} | {nq[key]['kappa']:.3f} |")
    lines += ["", f"MTRAG, held-out half: {m['rows']} model responses to {m['tasks']} tasks, against the mean "
              "human rating", "", "| score | vs human | Spearman | Kendall | n |", "|---|---|---|---|---|"]
    for key in ("offline_faithfulness~faithfulness", "offline_faithfulness~completeness",
                "offline_correctness~completeness", "offline_correctness~faithfulness",
                "rl_f~faithfulness", "Bert-KPrec~faithfulness", "RougeL~faithfulness", "rb_llm~faithfulness",
                "rl_f~completeness", "RougeL~completeness", "rb_llm~completeness"):
        v = m[key]
        name, human = key.split("~")
        extra = (f" (on the offline judge's {m['offline_faithfulness~faithfulness']['n']} rows: "
                 f"{v['spearman_same_rows_as_offline']:.3f})" if "spearman_same_rows_as_offline" in v
                 and human == "faithfulness" else "")
        lines.append(f"| {name} | {human} | {v['spearman']:.3f}{extra} | {v['kendall']:.3f} | {v['n']} |")
    lines += ["", f"Offline abstentions on MTRAG's held-out half: faithfulness {m['offline_faithfulness_abstained']} "
              f"(responses that decline: no claims), correctness {m['offline_correctness_abstained']} (level 0). "
              f"Mean correctness level {m['offline_correctness_mean_level']:.2f} vs the humans' completeness on the "
              f"six-level scale {m['human_completeness_mean_on_six_levels']:.2f}."]
    if "random_splits" in r:
        s = r["random_splits"]
        lines += ["", f"Refitted on {s['splits']} random halves (seed {s['seed']}), held-out figures: "
                  f"NQ301 agreement mean {s['nq301_agreement']['mean']:.3f} "
                  f"[{s['nq301_agreement']['min']:.3f}, {s['nq301_agreement']['max']:.3f}], "
                  f"kappa mean {s['nq301_kappa']['mean']:.3f} [{s['nq301_kappa']['min']:.3f}, "
                  f"{s['nq301_kappa']['max']:.3f}] (on the same halves: BEM's recorded verdicts "
                  f"{s['nq301_bem_agreement']['mean']:.3f}, GPT-4's {s['nq301_gpt4_agreement']['mean']:.3f}); "
                  "MTRAG faithfulness Spearman mean "
                  f"{s['mtrag_faithfulness_spearman']['mean']:.3f} [{s['mtrag_faithfulness_spearman']['min']:.3f}, "
                  f"{s['mtrag_faithfulness_spearman']['max']:.3f}]."]
    lines += ["", "Recorded baselines on all rows (from the sources): MTRAG Spearman with human faithfulness "
              + ", ".join(f"{k} {v}" for k, v in RECORDED["mtrag_faithfulness_spearman"].items())
              + "; NQ301 agreement " + ", ".join(f"{k} {v:.1%}" for k, v in RECORDED["nq301_agreement"].items())
              + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.offline_judge fit|report --data DIR``."""
    ap = argparse.ArgumentParser(prog="python -m tools.offline_judge", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit the calibration on the fit halves and write it as JSON")
    fit.add_argument("--data", required=True, help="the folder holding openqa_eval/ and mtrag/ (../shared/data)")
    fit.add_argument("--out", default="-", help="where to write the calibration JSON (default: stdout)")
    rep = sub.add_parser("report", help="measure the calibration on the held-out halves")
    rep.add_argument("--data", required=True, help="the folder holding openqa_eval/ and mtrag/ (../shared/data)")
    rep.add_argument("--calibration", help="a calibration JSON (default: the one shipped with the package)")
    rep.add_argument("--splits", type=int, default=0, help="also refit on this many random halves (e.g. 20)")
    rep.add_argument("--json", help="also write the figures as JSON to this file")
    rep.add_argument("--claims", help="also measure faithfulness on WiCE: the folder holding its dev.jsonl and "
                     "test.jsonl (github.com/ryokamoi/wice, data/entailment_retrieval/claim)")
    rep.add_argument("--qags", help="also measure faithfulness on QAGS: the folder holding its mturk_cnndm.jsonl and "
                     "mturk_xsum.jsonl (github.com/W4ngatang/qags, data/)")
    args = ap.parse_args(argv)
    try:
        if args.command == "fit":
            cal = fit_calibration(load_nq301(args.data), load_mtrag(args.data))
            report = held_out_report(args.data, cal)
            table = baseline_table(args.data, cal)
            text = json.dumps({**cal.to_dict(), "fit": {**cal.fit, "held_out": _headline(report, table)}}, indent=1,
                              ensure_ascii=False) + "\n"
            if args.out == "-":
                sys.stdout.write(text)
            else:
                Path(args.out).write_text(text, encoding="utf-8")
                print(f"calibration {cal.version} written to {args.out}", file=sys.stderr)
            return 0
        given = (Calibration.from_dict(json.loads(Path(args.calibration).read_text(encoding="utf-8")))
                 if args.calibration else None)
        report = held_out_report(args.data, given, splits=args.splits)
        table = baseline_table(args.data, given, splits=args.splits)
        m = load_mtrag(args.data)
        fit_half = m["task_id"].isin(half_split(m["task_id"], SPLIT_SALT))
        held, fitted = m[~fit_half].reset_index(drop=True), m[fit_half].reset_index(drop=True)
        judge = OfflineJudge(given) if given is not None else OfflineJudge()
        claims = claims_table(held, load_wice(args.claims) if args.claims else None, judge,
                              load_qags(args.qags) if args.qags else None, fitted)
        print(format_table(table) + "\n\n" + format_report(report) + "\n\n" + format_claims_table(claims))
        if args.json:
            Path(args.json).write_text(json.dumps({**report, "baselines": table, "claims": claims}, indent=1,
                                                  default=float), encoding="utf-8")
        return 0
    except FileNotFoundError as e:
        print(f"error: {e}. Point --data at a folder laid out like ../shared/data (openqa_eval/, mtrag/).",
              file=sys.stderr)
        return 2


def baseline_table(data_dir: str | Path, calibration: Calibration | None = None, *, splits: int = 0,
                   seed: int = 0) -> dict[str, Any]:
    """The offline judge against the lexical baselines on every set (:func:`~tools.offline_judge.table.
    agreement_table`), the judge being ``calibration`` (default: the shipped one) on the fixed split."""
    nq, m = load_nq301(data_dir), load_mtrag(data_dir)
    cache: dict[str, Any] = {}

    def fitter(**kw: Any) -> Calibration:
        return fit_calibration(nq, m, _cache=cache, **kw)

    return agreement_table(nq, m, fitter, SPLIT_SALT, calibration=calibration or Calibration.shipped(),
                           splits=splits, seed=seed)


def _headline(report: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    nq, m = report["nq301_heldout"], report["mtrag_heldout"]
    return {"kappa_and_margin_over_the_best_lexical_baseline": {
                name: {"kappa": r["scores"]["offline judge"]["kappa"], "margin": r["margin"]}
                for name, r in table["fixed"].items()},
            "nq301": {"rows": nq["rows"], **{k: nq["offline"][k] for k in ("agreement", "kappa")}},
            "mtrag_faithfulness_spearman": m["offline_faithfulness~faithfulness"]["spearman"],
            "mtrag_faithfulness_kendall": m["offline_faithfulness~faithfulness"]["kendall"],
            "mtrag_correctness_completeness_spearman": m["offline_correctness~completeness"]["spearman"],
            "mtrag_rows": m["rows"]}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
