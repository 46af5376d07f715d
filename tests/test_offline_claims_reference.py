"""The offline judge's faithfulness against human labels of claims (issue 39), as docs/offline-judge.md reports it
("What a sentence asserts"): MTRAG from ../shared/data, WiCE from the folder ``RAGJUDGE_WICE_DIR`` names (its
``data/entailment_retrieval/claim``), QAGS from the folder ``RAGJUDGE_QAGS_DIR`` names (its ``data/``); neither is
shipped. Each part is skipped where its data is absent.

The figures: ``.venv/bin/python -m tools.offline_judge report --data ../shared/data --claims <WiCE folder>
--qags <QAGS folder>``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.offline_judge.claims import baselines, claims_table, load_qags, load_wice
from tools.offline_judge.fit import SPLIT_SALT
from tools.offline_judge.public_data import half_split, load_mtrag


def test_baselines_are_the_claims_word_recall_and_best_sentence_recall():
    word, best = baselines("The bridge opened in 1931 in Sydney.",
                           ["The bridge opened in 1931.\nIt stands in Sydney harbour."])
    # content words: bridge, open(ed), 1931, sydney -- all found somewhere; at most three in one sentence
    assert word == 1.0 and best == 0.75
    assert baselines("Thanks!", ["anything"]) == (0.0, 0.0)  # a one-word response is one claim, as the judge reads it
    assert baselines("The bridge opened.", []) is None  # no evidence: nothing to compare, as the judge abstains


def test_on_mtrag_the_judge_orders_responses_above_both_recall_baselines(shared_data):
    m = load_mtrag(shared_data)
    held = m[~m["task_id"].isin(half_split(m["task_id"], SPLIT_SALT))].reset_index(drop=True)
    (row,) = claims_table(held, None)
    s = row["scores"]
    assert row["rows"] == 139
    assert s["offline judge"]["spearman"] == pytest.approx(0.767, abs=5e-4)  # docs/offline-judge.md
    # above both baselines on the held-out half by the 0.02 (+0.038 Spearman, +0.026 AUC)
    assert row["margin_spearman"] >= 0.02 and row["margin_auc"] >= 0.02


def test_on_wice_test_the_judge_is_above_both_recall_baselines():
    folder = os.environ.get("RAGJUDGE_WICE_DIR")
    if not folder or not Path(folder).is_dir():
        pytest.skip("WiCE not found: set RAGJUDGE_WICE_DIR to its data/entailment_retrieval/claim folder")
    table = {t["set"].split(" (")[0]: t for t in claims_table(None, load_wice(folder))}
    test = table["WiCE test"]
    assert test["rows"] == 358
    assert test["margin_spearman"] >= 0.02 and test["margin_auc"] >= 0.02


def test_on_qags_held_out_halves_the_judge_is_above_both_recall_baselines():
    """News summaries (CNN/DailyMail, XSum) judged sentence by sentence: the even-numbered articles, which no choice
    was made on."""
    folder = os.environ.get("RAGJUDGE_QAGS_DIR")
    if not folder or not Path(folder).is_dir():
        pytest.skip("QAGS not found: set RAGJUDGE_QAGS_DIR to its data/ folder (github.com/W4ngatang/qags)")
    table = {t["set"].split(" (")[0] + (" held" if "held-out" in t["set"] else " fit"): t
             for t in claims_table(None, None, qags=load_qags(folder))}
    assert table["QAGS-C held"]["rows"] == 359 and table["QAGS-X held"]["rows"] == 120
    for name in ("QAGS-C held", "QAGS-X held"):
        assert table[name]["margin_spearman"] >= 0.02 and table[name]["margin_auc"] >= 0.02, table[name]
