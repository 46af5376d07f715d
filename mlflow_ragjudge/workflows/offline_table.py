"""The offline judge against the lexical baselines on every public human-labelled set the package reads: the
table of docs/offline-judge.md ("Against the lexical baselines").

::

    ragjudge offline-judge report --data ../shared/data --splits 20

For each set -- OpenQA-eval NQ301 (short gold answers; the human majority's acceptable / not), with its
extractive (at most :data:`SHORT_RESPONSE` words) and generated responses also apart, and MTRAG (a passage as
the reference; "acceptable" = mean human completeness >= 3, mostly yes or better) -- on the rows of the half a
calibration was not fitted on:

* **offline judge**: level >= 4, calibrated on the other halves (the shipped calibration for the fixed split);
* **offline judge, other set only**: the same fit on the other data set alone, none of this set's rows (how the
  calibration transfers across sets; one model, as there is one length of answer per set);
* **exact match**: the response equals some acceptable answer after normalisation (lowercase, no punctuation,
  no articles, single spaces);
* **token recall**: the share of the best acceptable answer's words found in the response, at or above a
  threshold fitted on the fit half of the same set (the one that maximises Cohen's kappa there);
* **containment**: some acceptable answer, normalised, occurs in the normalised response (lexical matching as
  OpenQA evaluation does it).

NQ301 is also measured **across response styles**: fitted on the fit half's extractive responses only and measured
on the held-out generated ones, and the reverse (:func:`_across_styles`): one public set holds both, and a
judge fitted on one style that holds on the other generalises past the answers it saw.

Each is scored against the humans by agreement and Cohen's kappa on the same rows; the margin is the judge's
kappa minus the best baseline's. With ``splits``, the halves are also drawn at random that many times (the
calibration and the token-recall threshold refitted on each), and the judge's kappa and margin summarised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..engine.meta import agreement
from ..metrics.lexical import word_recall
from ..metrics.offline import Calibration, OfflineJudge
from .public_data import half_split, lexical_match, normalise_answer

__all__ = ["agreement_table", "format_table", "BASELINES", "SHORT_RESPONSE"]

#: a response of at most this many words is an extractive reader's (NQ301's DPR, FiD ...); longer: generated
SHORT_RESPONSE = 5
BASELINES = ("exact match", "token recall", "containment")
RECALL_GRID = tuple(round(0.05 * i, 2) for i in range(1, 21))


@dataclass
class _Set:
    """One labelled set as the table reads it: a row's question, response, acceptable answers, passages and the
    human verdict, and the key its halves are split by."""

    name: str
    key: str  # "nq301" or "mtrag": which data set (and which argument of fit_calibration) the rows come from
    frame: pd.DataFrame
    split_key: pd.Series
    question: list[str]
    response: list[str]
    references: list[list[str]]
    passages: list[Sequence[str]]
    truth: np.ndarray


def _sets(nq: pd.DataFrame, m: pd.DataFrame) -> list[_Set]:
    out = [_Set("NQ301", "nq301", nq, nq["question_id"], nq["question"].tolist(), nq["answer"].tolist(),
                [list(r) for r in nq["references"]], [()] * len(nq), nq["human"].to_numpy(dtype=bool)),
           _Set("MTRAG", "mtrag", m, m["task_id"], m["question"].tolist(), m["response"].tolist(),
                [[r] for r in m["reference"]], list(m["passages"]), (m["completeness"] >= 3.0).to_numpy())]
    return out


def exact_match(response: str, references: Sequence[str]) -> bool:
    """The normalised response equals some normalised acceptable answer (:func:`normalise_answer`)."""
    said = normalise_answer(response)
    return bool(said) and any(said == normalise_answer(r) for r in references)


def token_recall(response: str, references: Sequence[str]) -> float:
    """The best acceptable answer's share of words found in the response (:func:`word_recall`)."""
    return max((word_recall(response, r) or 0.0 for r in references), default=0.0)


def _kappa(pred: Sequence[bool], truth: Sequence[bool]) -> dict[str, float]:
    out = agreement(["Yes" if p else "No" for p in pred], ["Yes" if t else "No" for t in truth])
    # a verdict that never changes agrees exactly as often as chance: kappa 0 (agreement() leaves it None only
    # when the humans never change either)
    return {"n": out["n"], "agreement": out["agreement"], "kappa": out["cohen_kappa"] or 0.0}


def _recall_threshold(recall: np.ndarray, truth: np.ndarray) -> float:
    return max(RECALL_GRID, key=lambda t: (_kappa(list(recall >= t), list(truth))["kappa"], -t))


def _judged(judge: OfflineJudge, s: _Set, rows: np.ndarray) -> np.ndarray:
    out = []
    for i in np.flatnonzero(rows):
        res = judge.correctness(s.question[i], s.response[i], s.references[i], s.passages[i] or None)
        out.append(bool(res.is_scored and res.value is not None and res.value >= 4))
    return np.array(out, dtype=bool)


def _subsets(s: _Set) -> list[tuple[str, np.ndarray]]:
    """The set and, for NQ301, its extractive and generated responses apart."""
    if s.key != "nq301":
        return [(s.name, np.ones(len(s.truth), bool))]
    short = np.array([len(r.split()) <= SHORT_RESPONSE for r in s.response])
    return [(s.name, np.ones(len(s.truth), bool)),
            (f"{s.name}, extractive responses (<= {SHORT_RESPONSE} words)", short),
            (f"{s.name}, generated responses (> {SHORT_RESPONSE} words)", ~short)]


def _one_split(sets: list[_Set], fit: dict[str, set[str]], fitter: Callable[..., Calibration],
               calibration: Calibration | None, transfer: bool, features: dict[str, dict[str, Any]]
               ) -> dict[str, dict[str, Any]]:
    """Every judge and baseline on the held-out rows of each set, for the fit halves ``fit`` (by set key)."""
    cal = calibration or fitter(nq_fit=fit["nq301"], m_fit=fit["mtrag"])
    judge = OfflineJudge(cal)
    out: dict[str, dict[str, Any]] = {}
    for s in sets:
        fit_rows = s.split_key.isin(fit[s.key]).to_numpy()
        held = ~fit_rows
        recall = features[s.key]["recall"]
        threshold = _recall_threshold(recall[fit_rows], s.truth[fit_rows])
        verdicts: dict[str, np.ndarray] = {"offline judge": _judged(judge, s, held)}
        if transfer:  # fitted on every row of the other set, none of this one's
            other = {x.key: set() if x.key == s.key else set(x.split_key) for x in sets}
            alone = OfflineJudge(fitter(nq_fit=other["nq301"], m_fit=other["mtrag"], regimes=False))
            verdicts["offline judge, other set only"] = _judged(alone, s, held)
        verdicts["exact match"] = features[s.key]["exact"][held]
        verdicts["token recall"] = recall[held] >= threshold
        verdicts["containment"] = features[s.key]["contained"][held]
        for name, rows in _subsets(s):
            sub = rows[held]
            truth = s.truth[held][sub]
            scores = {k: _kappa(list(v[sub]), list(truth)) for k, v in verdicts.items()}
            best = max(BASELINES, key=lambda b: scores[b]["kappa"])
            out[name] = {"rows": int(sub.sum()), "accepted": float(truth.mean()) if len(truth) else 0.0,
                         "scores": scores, "token_recall_threshold": threshold, "best_baseline": best,
                         "margin": scores["offline judge"]["kappa"] - scores[best]["kappa"]}
    return out


def agreement_table(nq: pd.DataFrame, m: pd.DataFrame, fitter: Callable[..., Calibration], split_salt: str, *,
                    calibration: Calibration | None = None, splits: int = 0, seed: int = 0) -> dict[str, Any]:
    """The table's figures: the fixed split (``split_salt``; the judge is ``calibration``, default the one
    ``fitter`` gives on the fixed fit halves) and, with ``splits``, that many random halves, refitted.

    Args:
        nq, m: :func:`~mlflow_ragjudge.workflows.public_data.load_nq301` and
            :func:`~mlflow_ragjudge.workflows.public_data.load_mtrag`.
        fitter: fits a calibration: ``fitter(nq_fit=..., m_fit=..., regimes=...)`` (the fit of
            :mod:`~mlflow_ragjudge.workflows.offline_fit`, bound to the data).
    """
    sets = _sets(nq, m)
    features = {s.key: {"recall": np.array([token_recall(r, refs) for r, refs in zip(s.response, s.references)]),
                        "exact": np.array([exact_match(r, refs) for r, refs in zip(s.response, s.references)]),
                        "contained": np.array([lexical_match(r, refs) for r, refs in zip(s.response, s.references)])}
                for s in sets}
    fixed = {s.key: half_split(s.split_key, split_salt) for s in sets}
    out: dict[str, Any] = {"fixed": _one_split(sets, fixed, fitter, calibration, True, features),
                           "styles": _across_styles(sets[0], fixed, fitter, features["nq301"]),
                           "split_salt": split_salt}
    if splits:
        rng = np.random.default_rng(seed)
        runs = []
        for _ in range(splits):
            fit = {}
            for s in sets:
                keys = sorted(set(s.split_key))
                fit[s.key] = set(rng.choice(keys, len(keys) // 2, replace=False))
            runs.append(_one_split(sets, fit, fitter, None, False, features))
        out["random"] = {"splits": splits, "seed": seed, "sets": {
            name: {"kappa": _summary([r[name]["scores"]["offline judge"]["kappa"] for r in runs]),
                   "best_baseline_kappa": _summary([r[name]["scores"][r[name]["best_baseline"]]["kappa"]
                                                    for r in runs]),
                   "margin": _summary([r[name]["margin"] for r in runs])} for name in runs[0]}}
    return out


def _across_styles(s: _Set, fit: dict[str, set[str]], fitter: Callable[..., Calibration],
                   features: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """NQ301 fitted on one style of response and measured on the other: the calibration fitted on the fit half's
    extractive (or generated) responses only, with MTRAG's fit half as usual, and token recall's threshold fitted
    on those same rows; measured on the held-out half's responses of the other style."""
    short = np.array([len(r.split()) <= SHORT_RESPONSE for r in s.response])
    fit_rows = s.split_key.isin(fit[s.key]).to_numpy()
    out = {}
    for name, train in (("extractive -> generated", short), ("generated -> extractive", ~short)):
        judge = OfflineJudge(fitter(nq_fit=fit["nq301"], m_fit=fit["mtrag"], nq_keep=train))
        threshold = _recall_threshold(features["recall"][fit_rows & train], s.truth[fit_rows & train])
        held = ~fit_rows & ~train
        truth = list(s.truth[held])
        scores = {"offline judge": _kappa(list(_judged(judge, s, held)), truth),
                  "exact match": _kappa(list(features["exact"][held]), truth),
                  "token recall": _kappa(list(features["recall"][held] >= threshold), truth),
                  "containment": _kappa(list(features["contained"][held]), truth)}
        best = max(BASELINES, key=lambda b: scores[b]["kappa"])
        out[name] = {"rows": int(held.sum()), "scores": scores, "token_recall_threshold": threshold,
                     "best_baseline": best, "margin": scores["offline judge"]["kappa"] - scores[best]["kappa"]}
    return out


def _summary(xs: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(xs)), "min": float(np.min(xs)), "max": float(np.max(xs))}


def format_table(t: dict[str, Any]) -> str:
    """The figures as the Markdown of docs/offline-judge.md."""
    names = ("offline judge", "offline judge, other set only", *BASELINES)
    lines = [f"Against the lexical baselines, held-out halves (split salt {t['split_salt']!r}): agreement / Cohen's "
             "kappa with the humans on the same rows", "",
             "| set | rows | accepted | " + " | ".join(names) + " | margin |",
             "|---|---|---|" + "---|" * len(names) + "---|"]
    for name, r in t["fixed"].items():
        cells = [f"{r['scores'][k]['agreement']:.3f} / {r['scores'][k]['kappa']:.3f}" for k in names]
        lines.append(f"| {name} | {r['rows']} | {r['accepted']:.0%} | " + " | ".join(cells)
                     + f" | {r['margin']:+.3f} (vs {r['best_baseline']}) |")
    first = next(iter(t["fixed"].values()))
    lines += ["", "margin: the offline judge's kappa minus the best baseline's. Token recall's threshold is fitted on "
              f"the fit half of the same set (NQ301: {first['token_recall_threshold']:.2f}; MTRAG: "
              f"{t['fixed']['MTRAG']['token_recall_threshold']:.2f})."]
    if "styles" in t:
        lines += ["", "NQ301 across response styles (fixed halves): fitted on the fit half's responses of one style "
                  "only (token recall's threshold too), measured on the held-out responses of the other; kappa", "",
                  "| fitted on -> measured on | rows | offline judge | " + " | ".join(BASELINES) + " | margin |",
                  "|---|---|---|" + "---|" * len(BASELINES) + "---|"]
        for name, r in t["styles"].items():
            lines.append(f"| {name} | {r['rows']} | " + " | ".join(
                f"{r['scores'][k]['kappa']:.3f}" for k in ("offline judge", *BASELINES))
                + f" | {r['margin']:+.3f} (vs {r['best_baseline']}) |")
    if "random" in t:
        r = t["random"]
        lines += ["", f"Refitted on {r['splits']} random halves (seed {r['seed']}): the judge's kappa and its margin "
                  "over the best baseline of each split, mean [min, max]", "",
                  "| set | judge kappa | best baseline kappa | margin |", "|---|---|---|---|"]
        for name, v in r["sets"].items():
            lines.append(f"| {name} | " + " | ".join(
                f"{v[k]['mean']:+.3f} [{v[k]['min']:+.3f}, {v[k]['max']:+.3f}]"
                for k in ("kappa", "best_baseline_kappa", "margin")) + " |")
    return "\n".join(lines)
