"""The offline judge against the public human labels in ../shared/data (skipped where absent): the shipped
calibration is what the documented fit produces, and its held-out agreement is what docs/offline-judge.md and
the calibration file say, at or above the goals.

See the figures with ``.venv/bin/python -m tools.offline_judge report --data ../shared/data --splits 20``; the judge
against the lexical baselines on every set is the first table it prints.
"""

from __future__ import annotations

from functools import cache

import pytest

from mlflow_ragjudge.metrics.offline import Calibration, OfflineJudge
from tools.offline_judge.fit import baseline_table, fit_calibration, held_out_report
from tools.offline_judge.public_data import half_split, load_mtrag, load_nq301


@cache
def _report(data_dir: str) -> dict:
    return held_out_report(data_dir)


def test_loaders(shared_data):
    nq = load_nq301(shared_data)
    assert len(nq) == 1490 and nq["question_id"].nunique() == 301
    assert nq["human"].mean() == pytest.approx(816 / 1490)  # the majority accepts 54.8 %
    assert any("Dáin" in r for refs in nq["references"] for r in refs)  # mojibake repaired
    assert nq["references"].map(len).max() > 5  # several acceptable answers per question
    m = load_mtrag(shared_data)
    assert len(m) == 318 and m["task_id"].nunique() == 159 and set(m["model"]) == {"gpt-4o",
                                                                                  "llama-3.1-405b-instruct"}
    fit = half_split(nq["question_id"], "s")
    assert 0.4 < len(fit) / 301 < 0.6 and fit == half_split(reversed(list(nq["question_id"])), "s")


@pytest.mark.slow
def test_the_shipped_calibration_is_what_the_documented_fit_produces(shared_data):
    shipped = Calibration.shipped()
    fitted = fit_calibration(load_nq301(shared_data), load_mtrag(shared_data))
    assert fitted.features == shipped.features
    assert fitted.weights == pytest.approx(shipped.weights, abs=1e-6)
    assert fitted.bias == pytest.approx(shipped.bias, abs=1e-6)
    assert fitted.cuts == pytest.approx(shipped.cuts, abs=1e-6)
    assert fitted.recall_cuts == shipped.recall_cuts and fitted.support_threshold == shipped.support_threshold
    assert fitted.claim_threshold == shipped.claim_threshold is not None
    assert fitted.long is not None and shipped.long is not None
    assert fitted.long.features == shipped.long.features
    assert fitted.long.weights == pytest.approx(shipped.long.weights, abs=1e-6)
    assert fitted.long.bias == pytest.approx(shipped.long.bias, abs=1e-6)
    assert fitted.long.cuts == pytest.approx(shipped.long.cuts, abs=1e-6)


@cache
def _table(data_dir: str) -> dict:
    return baseline_table(data_dir, splits=20)


@pytest.mark.slow
def test_the_judge_is_above_every_lexical_baseline_on_every_set(shared_data):
    """Issue 27: on each set the package reads, the offline judge's kappa with the humans is at least the best
    lexical baseline's (exact match, token recall with its threshold fitted on the fit half, containment) + 0.02
    on the same held-out rows -- for the shipped calibration on the fixed split, and on average over 20 random
    halves, refitted each time; the figures the calibration file carries are these."""
    t = _table(str(shared_data))
    held = Calibration.shipped().fit["held_out"]["kappa_and_margin_over_the_best_lexical_baseline"]
    for name, r in t["fixed"].items():
        print(f"\n{name}: judge kappa {r['scores']['offline judge']['kappa']:.3f}, margin {r['margin']:+.3f} over "
              f"{r['best_baseline']}; random halves: margin mean {t['random']['sets'][name]['margin']['mean']:+.3f}")
        assert held[name]["kappa"] == pytest.approx(r["scores"]["offline judge"]["kappa"], abs=1e-12)
        assert held[name]["margin"] == pytest.approx(r["margin"], abs=1e-12)
        assert r["margin"] >= 0.02, name
        assert t["random"]["sets"][name]["margin"]["mean"] >= 0.02, name
    # fitted on one style of response, it holds on the other (NQ301's extractive and generated responses)
    for name, r in t["styles"].items():
        assert r["margin"] >= 0.02, (name, r)
    # one model for both lengths of answer does not carry from one set to the other: fitted on NQ301 alone, MTRAG's
    # agreement is no better than chance's neighbourhood, which is why long answers have their own model
    mtrag = t["fixed"]["MTRAG"]["scores"]
    assert mtrag["offline judge, other set only"]["kappa"] < mtrag["offline judge"]["kappa"] - 0.1


def test_held_out_agreement_as_shipped_and_at_the_goals(shared_data):
    r = _report(str(shared_data))
    held = Calibration.shipped().fit["held_out"]
    nq, m = r["nq301_heldout"], r["mtrag_heldout"]
    print(f"\nNQ301 held-out ({nq['rows']} answers): offline {nq['offline']['agreement']:.4f} "
          f"kappa {nq['offline']['kappa']:.4f}; BEM {nq['bem_recorded']['agreement']:.4f}, GPT-4 "
          f"{nq['gpt4_recorded']['agreement']:.4f}, lexical match {nq['lexical_match']['agreement']:.4f}\n"
          f"MTRAG held-out faithfulness Spearman {m['offline_faithfulness~faithfulness']['spearman']:.4f}")
    # what the calibration file (and the docs) claim is what this data gives
    assert nq["rows"] == held["nq301"]["rows"]
    assert nq["offline"]["agreement"] == pytest.approx(held["nq301"]["agreement"], abs=1e-12)
    assert nq["offline"]["kappa"] == pytest.approx(held["nq301"]["kappa"], abs=1e-12)
    assert m["offline_faithfulness~faithfulness"]["spearman"] == pytest.approx(held["mtrag_faithfulness_spearman"],
                                                                              abs=1e-12)
    # the goals (issue 11): >= 80 % agreement with kappa >= 0.60 on NQ301, Spearman >= 0.65 on MTRAG
    assert nq["offline"]["agreement"] >= 0.80 and nq["offline"]["kappa"] >= 0.60
    assert m["offline_faithfulness~faithfulness"]["spearman"] >= 0.65
    # above the lexical baselines and the stand-in it replaces, on the same rows
    assert nq["offline"]["agreement"] > nq["lexical_match"]["agreement"] > nq["replaced_demo_overlap"]["agreement"]
    same_rows = m["rl_f~faithfulness"]["spearman_same_rows_as_offline"]
    assert m["offline_faithfulness~faithfulness"]["spearman"] > same_rows  # RAGAS faithfulness, recorded


def test_aliases_count_on_nq(shared_data):
    """Every acceptable answer is scored and the best kept: reading only the first answer agrees less."""
    from mlflow_ragjudge.engine.meta import agreement

    nq = load_nq301(shared_data)
    nq = nq[nq["references"].map(len) > 1]
    judge = OfflineJudge()

    def accepted(refs):
        return ["Yes" if (res := judge.correctness(q, a, list(rs))).is_scored and res.value >= 4 else "No"
                for q, a, rs in zip(nq["question"], nq["answer"], refs)]

    truth = ["Yes" if h else "No" for h in nq["human"]]
    best = agreement(accepted(nq["references"]), truth)["agreement"]
    first = agreement(accepted(nq["references"].map(lambda rs: rs[:1])), truth)["agreement"]
    print(f"\nNQ301 rows with several gold answers (n={len(nq)}): all answers {best:.3f}, first only {first:.3f}")
    assert best > first + 0.02


@pytest.mark.slow
def test_no_passing_level_without_the_answer_on_the_public_rows(shared_data):
    """On every NQ301 and MTRAG row: a response that contains none of any acceptable answer (answer_found false
    for each) is never level 4 or 5, whatever the models' probability."""
    from mlflow_ragjudge.metrics.offline_evidence import answer_features, answer_found

    judge = OfflineJudge()
    nq, m = load_nq301(shared_data), load_mtrag(shared_data)
    rows = [(r.question, r.answer, list(r.references), None) for r in nq.itertuples()]
    rows += [(r.question, r.response, [r.reference], r.passages) for r in m.itertuples()]
    checked = 0
    for question, response, references, passages in rows:
        features = [answer_features(question, response, ref) for ref in references]
        if any(f is not None and answer_found(f, response, ref) for f, ref in zip(features, references)):
            continue
        res = judge.correctness(question, response, references, passages)
        checked += 1
        assert res.value is None or res.value <= 3, (question, response, references, res.rationale)
    assert checked > 100  # the rule is exercised, not vacuous
