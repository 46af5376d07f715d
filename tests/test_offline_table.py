"""The table of the offline judge against the lexical baselines (``tools/offline_judge/table.py``), on small rows
written here: the baselines say what their definitions say, the halves are the split's, the threshold of token
recall comes from the fit half only, and the margin is the judge's kappa over the best baseline's. (On the public
data, with the figures of docs/offline-judge.md: tests/test_offline_judge_reference_data.py.)"""

from __future__ import annotations

import pandas as pd
import pytest

from mlflow_ragjudge.metrics.offline import Calibration
from tools.offline_judge.public_data import half_split, lexical_match
from tools.offline_judge.table import (
    _kappa,
    _recall_threshold,
    agreement_table,
    exact_match,
    format_table,
    token_recall,
)


def test_the_baselines():
    assert exact_match("The Eiffel Tower!", ["eiffel tower"]) and not exact_match("the Eiffel Tower in Paris",
                                                                                  ["eiffel tower"])
    assert not exact_match("", [""])
    assert lexical_match("It is the Eiffel Tower, in Paris.", ["Eiffel Tower"])
    assert token_recall("It is the Eiffel Tower.", ["Eiffel Tower in Paris", "La Tour Eiffel"]) == pytest.approx(0.5)
    assert token_recall("anything", []) == 0.0
    # a verdict that never changes agrees as often as chance
    assert _kappa([True] * 4, [True, False, True, False])["kappa"] == 0.0
    assert _kappa([True, False], [True, False])["kappa"] == 1.0
    import numpy as np

    assert _recall_threshold(np.array([0.1, 0.2, 0.6, 0.9]), np.array([False, False, True, True])) == 0.25


def _rows() -> tuple[pd.DataFrame, pd.DataFrame]:
    nq, m = [], []
    for i in range(40):
        gold = [f"answer{i}", f"alias{i}"]
        for text, ok in [(f"answer{i}", True), (f"It was answer{i} in the end.", True), (f"wrong{i}", False),
                         (f"Maybe alias{i} or wrong{i}.", i % 3 == 0)]:
            nq.append({"question_id": str(i), "question": f"what is thing {i}?", "answer": text, "references": gold,
                       "human": ok})
    for i in range(30):
        ref = f"The harbour museum {i} opened in spring after the council funded the restored granite station."
        for text, comp in [(ref, 4.0), (f"The museum {i} opened.", 2.0 + (i % 2)), ("I do not know.", 1.0)]:
            m.append({"task_id": f"t{i}", "question": f"when did museum {i} open?", "response": text,
                      "reference": ref, "passages": [ref], "completeness": comp})
    return pd.DataFrame(nq), pd.DataFrame(m)


def _recording_fitter(calls: list[dict]):
    """A fitter that records what it was asked to fit on and gives the shipped calibration."""

    def fitter(**kw):
        calls.append(kw)
        return Calibration.shipped()

    return fitter


def test_the_table_reads_each_half_as_the_split_says():
    nq, m = _rows()
    calls: list[dict] = []
    fitter = _recording_fitter(calls)
    t = agreement_table(nq, m, fitter, "salt", calibration=Calibration.shipped())
    fixed = t["fixed"]
    assert set(fixed) == {"NQ301", "NQ301, extractive responses (<= 5 words)", "NQ301, generated responses (> 5 words)",
                          "MTRAG"}
    held_q = set(nq["question_id"]) - half_split(nq["question_id"], "salt")
    assert fixed["NQ301"]["rows"] == int(nq["question_id"].isin(held_q).sum())
    assert (fixed["NQ301, extractive responses (<= 5 words)"]["rows"]
            + fixed["NQ301, generated responses (> 5 words)"]["rows"] == fixed["NQ301"]["rows"])
    held = nq[nq["question_id"].isin(held_q)]
    contained = [lexical_match(a, r) for a, r in zip(held["answer"], held["references"])]
    assert fixed["NQ301"]["scores"]["containment"] == _kappa(contained, held["human"].tolist())
    for r in fixed.values():
        best = max(r["scores"][b]["kappa"] for b in ("exact match", "token recall", "containment"))
        assert r["margin"] == pytest.approx(r["scores"]["offline judge"]["kappa"] - best)
    # the "other set only" judge is fitted on every row of the other set and none of this one's
    assert {"nq_fit": set(), "m_fit": set(m["task_id"]), "regimes": False} in calls
    assert {"nq_fit": set(nq["question_id"]), "m_fit": set(), "regimes": False} in calls
    # across response styles: fitted on one style's fit-half rows, measured on the other style's held-out rows
    keeps = [c["nq_keep"] for c in calls if "nq_keep" in c]
    assert len(keeps) == 2 and (keeps[0] == ~keeps[1]).all()
    short = nq["answer"].str.split().str.len() <= 5
    styles = t["styles"]
    assert styles["extractive -> generated"]["rows"] == int((~short & nq["question_id"].isin(held_q)).sum())
    assert styles["generated -> extractive"]["rows"] == int((short & nq["question_id"].isin(held_q)).sum())
    text = format_table(t)
    assert "| MTRAG | " in text and "margin" in text and "| extractive -> generated |" in text


def test_random_halves_refit_each_time():
    nq, m = _rows()
    calls: list[dict] = []
    fitter = _recording_fitter(calls)
    t = agreement_table(nq, m, fitter, "salt", calibration=Calibration.shipped(), splits=3, seed=1)
    refits = [c for c in calls if "regimes" not in c and "nq_keep" not in c]
    assert len(refits) == 3 and len({frozenset(c["nq_fit"]) for c in refits}) == 3
    assert all(len(c["nq_fit"]) == 20 and len(c["m_fit"]) == 15 for c in refits)
    assert t["random"]["splits"] == 3 and "| NQ301 | " in format_table(t).split("random halves")[1]
