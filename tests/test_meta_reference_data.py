"""Meta-evaluation against public human-labelled data in ../shared/data (skipped where absent).

(a) MTRAG (IBM/mt-rag-benchmark, human evaluation subset): reproduce the README's
    baseline -- RAGAS faithfulness (``rl_f``) vs the mean human faithfulness rating,
    Spearman ~ 0.635 on the 318 model responses -- and check our ROUGE-L against the
    recorded ``RougeL`` scores.
(b) OpenQA-eval NQ301 (ehsk/OpenQA-eval): agreement and Cohen's kappa of the recorded
    GPT-4 judgments with the human majority label, checked against counts taken by a
    second route (pandas crosstab + scikit-learn).

Run with ``-s`` to see the measured numbers (they are quoted in docs/meta-evaluation.md):
``PYTHONPATH=. python -m pytest tests/test_meta_reference_data.py -q -s``
"""

from __future__ import annotations

import csv
import json
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from mlflow_ragjudge.core.errors import BertScoreUnavailable
from mlflow_ragjudge.engine.meta import agreement, correlations, meta_evaluate
from mlflow_ragjudge.metrics.lexical import BertScorer, rouge_l, word_recall

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
MTRAG_FILE = SHARED_DATA / "mtrag" / "reference_subset_with_human_evaluations.json"
OPENQA_DIR = SHARED_DATA / "openqa_eval"

needs_mtrag = pytest.mark.skipif(
    not MTRAG_FILE.is_file(), reason=f"MTRAG reference data not found at {MTRAG_FILE} (not part of a clone)"
)
needs_openqa = pytest.mark.skipif(
    not (OPENQA_DIR / "NQ301_human.tsv").is_file(),
    reason=f"OpenQA-eval reference data not found at {OPENQA_DIR} (not part of a clone)",
)

HUMAN_DIMENSIONS = ("faithfulness", "completeness", "appropriateness", "naturalness")
RECORDED_METRICS = ("rl_f", "rb_llm", "rb_agg", "RougeL", "Bert-Rec", "Bert-KPrec")


# ---------------------------------------------------------------------------------------------
# (a) MTRAG
# ---------------------------------------------------------------------------------------------


@cache
def _mtrag() -> pd.DataFrame:
    """One row per evaluated response: recorded metrics, mean human ratings, texts."""
    data = json.loads(MTRAG_FILE.read_text(encoding="utf-8"))
    tasks = {t["task_id"]: t for t in data["tasks"]}
    rows = []
    for ev in data["evaluations"]:
        ann = ev["annotations"]
        row: dict = {"task_id": ev["task_id"], "model_id": ev["model_id"], "response": ev["model_response"]}
        for name in RECORDED_METRICS:
            (only,) = ann[name].values()  # {"system": {...}} or {"composite": {...}}
            row[name] = float(only["value"])
        for dim in HUMAN_DIMENSIONS:
            # per-annotator ratings "1".."4" (No, Mostly No, Mostly Yes, Yes) -> their mean
            ratings = [float(a["value"]) for a in ann[dim].values()]
            row[dim] = float(np.mean(ratings))
            row[f"{dim}_raters"] = len(ratings)
        row["reference"] = tasks[ev["task_id"]]["targets"][0]["text"]
        rows.append(row)
    return pd.DataFrame(rows)


@needs_mtrag
def test_mtrag_structure() -> None:
    df = _mtrag()
    assert len(df) == 477
    assert df["task_id"].nunique() == 159
    assert df["model_id"].value_counts().to_dict() == {
        "reference": 159, "llama-3.1-405b-instruct": 159, "gpt-4o": 159,
    }  # fmt: skip
    # the "reference" responder is the benchmark's own reference answer, not a model
    ref_rows = df[df["model_id"] == "reference"]
    assert (ref_rows["response"] == ref_rows["reference"]).all()
    assert set(df["faithfulness_raters"]) <= {2, 3}


@needs_mtrag
def test_mtrag_ragas_faithfulness_baseline() -> None:
    """README baseline: RAGAS faithfulness vs mean human faithfulness, Spearman ~ 0.635, n = 318."""
    models = _mtrag()[lambda d: d["model_id"] != "reference"]
    out = correlations(models["rl_f"], models["faithfulness"], n_boot=1000, seed=0)
    print(
        f"\nMTRAG rl_f vs human faithfulness (n={out['n']}): spearman={out['spearman']:.4f} "
        f"[{out['spearman_ci_low']:.4f}, {out['spearman_ci_high']:.4f}] pearson={out['pearson']:.4f} "
        f"kendall={out['kendall']:.4f}"
    )
    assert out["n"] == 318 and out["n_dropped"] == 0
    assert out["spearman"] == pytest.approx(0.635, abs=0.01)
    assert out["spearman"] == pytest.approx(stats.spearmanr(models["rl_f"], models["faithfulness"]).statistic)
    assert out["spearman_ci_low"] < 0.635 < out["spearman_ci_high"]
    # with the reference answers included the correlation is lower (0.58): they are all rated faithful
    everyone = correlations(_mtrag()["rl_f"], _mtrag()["faithfulness"], n_boot=0)
    assert everyone["n"] == 477 and everyone["spearman"] < out["spearman"] - 0.03


@pytest.mark.slow
@needs_mtrag
def test_mtrag_figure2_table() -> None:
    models = _mtrag()[lambda d: d["model_id"] != "reference"].reset_index(drop=True)
    table = meta_evaluate(models, list(RECORDED_METRICS), list(HUMAN_DIMENSIONS), n_boot=200, seed=0)
    assert len(table) == len(RECORDED_METRICS) * len(HUMAN_DIMENSIONS) * 2
    faith = table[(table["human"] == "faithfulness") & (table["subset"] == "all")].set_index("metric")
    print("\nMTRAG, 318 model responses, Spearman with mean human faithfulness:")
    for metric, row in faith.iterrows():
        print(
            f"  {metric:<11} mean={row['mean']:.3f} spearman={row['spearman']:.3f} "
            f"pearson={row['pearson']:.3f}"
        )
    assert faith.loc["rl_f", "spearman"] == pytest.approx(0.635, abs=0.01)
    # no abstentions were declared, so both subsets agree
    assert (
        table[table["subset"] == "all"]["spearman"].tolist()
        == table[table["subset"] == "no_abstentions"]["spearman"].tolist()
    )


@needs_mtrag
def test_mtrag_recorded_rougel_equals_ours_on_ascii_text() -> None:
    """The recorded ``RougeL`` is rouge_score's ROUGE-L F1 of response vs reference answer.

    On ASCII-only pairs our tokens are rouge_score's, so the numbers must be equal;
    pairs with letters such as "é" differ because rouge_score deletes those letters.
    """
    models = _mtrag()[lambda d: d["model_id"] != "reference"]
    ascii_rows = models[models["response"].map(str.isascii) & models["reference"].map(str.isascii)]
    assert len(ascii_rows) == 280
    ours = np.array(
        [rouge_l(r, g)["f1"] for r, g in zip(ascii_rows["response"], ascii_rows["reference"], strict=True)]
    )
    np.testing.assert_allclose(ours, ascii_rows["RougeL"].to_numpy(), rtol=0, atol=1e-9)


@pytest.mark.slow
@needs_mtrag
def test_mtrag_our_lexical_baselines() -> None:
    """Our word recall and ROUGE-L (response vs reference answer) against the humans."""
    models = _mtrag()[lambda d: d["model_id"] != "reference"].reset_index(drop=True)
    pairs = list(zip(models["response"], models["reference"], strict=True))
    rouge = [rouge_l(r, g) for r, g in pairs]
    df = pd.DataFrame(
        {
            "word_recall": [word_recall(r, g) for r, g in pairs],
            "rougeL_f1": [s["f1"] for s in rouge],
            "rougeL_recall": [s["recall"] for s in rouge],
            "completeness": models["completeness"],
            "faithfulness": models["faithfulness"],
        }
    )
    table = _print_baselines(df)
    assert (table["n"] == 318).all()
    # ROUGE-L F1 differs from the recorded RougeL on 4 non-ASCII rows only: same correlation to 2 decimals
    recorded = stats.spearmanr(models["RougeL"], models["faithfulness"]).statistic
    ours = table[(table["metric"] == "rougeL_f1") & (table["human"] == "faithfulness")]["spearman"].item()
    assert ours == pytest.approx(recorded, abs=0.005)
    # every lexical baseline agrees with the humans positively but clearly below RAGAS faithfulness
    assert all(0.1 < v < 0.6 for v in table["spearman"])


@needs_mtrag
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:BERTScore.*truncated")  # one response exceeds 512 word pieces
def test_mtrag_our_bertscore_baseline() -> None:
    """BERTScore (local MiniLM, layer 6) of response vs reference answer against the humans (~10 s on CPU)."""
    try:
        scorer = BertScorer.load()
    except BertScoreUnavailable as exc:
        pytest.skip(f"BERTScore unavailable: {exc.reason} ({exc.install})")
    models = _mtrag()[lambda d: d["model_id"] != "reference"].reset_index(drop=True)
    scores = scorer.score(models["response"].tolist(), models["reference"].tolist())
    df = pd.DataFrame(
        {
            "bertscore_f1": [s["f1"] for s in scores],
            "completeness": models["completeness"],
            "faithfulness": models["faithfulness"],
        }
    )
    table = _print_baselines(df)
    assert (table["n"] == 318).all()
    assert all(0.1 < v < 0.6 for v in table["spearman"])


def _print_baselines(df: pd.DataFrame) -> pd.DataFrame:
    metrics = [c for c in df.columns if c not in ("completeness", "faithfulness")]
    table = meta_evaluate(df, metrics, ["completeness", "faithfulness"], n_boot=200, seed=0)
    table = table[table["subset"] == "all"]
    print("\nMTRAG, our baselines vs mean human ratings (n=318):")
    for _, row in table.iterrows():
        print(
            f"  {row['metric']:<13} {row['human']:<13} mean={row['mean']:.3f} spearman={row['spearman']:.3f} "
            f"[{row['spearman_ci_low']:.3f}, {row['spearman_ci_high']:.3f}]"
        )
    return table


# ---------------------------------------------------------------------------------------------
# (b) OpenQA-eval NQ301
# ---------------------------------------------------------------------------------------------


def _verdict(text: str) -> str | None:
    """The judge's verdict: the reply starts with Yes or No; anything else is unparsed."""
    head = text.strip().lower()
    if head.startswith("yes"):
        return "Yes"
    if head.startswith("no"):
        return "No"
    return None


def _read_tsv(name: str) -> list[dict[str, str]]:
    with (OPENQA_DIR / name).open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


@needs_openqa
def test_openqa_gpt4_agreement_and_kappa() -> None:
    human = _read_tsv("NQ301_human.tsv")
    gpt4 = _read_tsv("NQ301_gpt-4.tsv")
    assert len(human) == len(gpt4) == 1490
    # the two files list the same answers in the same order
    assert all(
        h["id"] == g["id"] and h["Question"] == g["Question"] for h, g in zip(human, gpt4, strict=True)
    )
    human_labels = [h["Acceptable?"] for h in human]
    judge = [_verdict(g["gpt-4"]) for g in gpt4]
    assert set(human_labels) == {"Yes", "No"} and sum(v is None for v in judge) == 10

    strict = agreement(judge, human_labels)  # unparsed replies dropped
    lenient = agreement([v or "No" for v in judge], human_labels)  # unparsed = "No", as oqaeval scores them
    print(
        f"\nOpenQA NQ301 GPT-4 vs human: strict n={strict['n']} agreement={strict['agreement']:.4f} "
        f"kappa={strict['cohen_kappa']:.4f}; unparsed-as-No n={lenient['n']} "
        f"agreement={lenient['agreement']:.4f} kappa={lenient['cohen_kappa']:.4f}"
    )
    assert strict["n"] == 1480 and strict["n_dropped"] == 10
    assert strict["agreement"] == pytest.approx(1256 / 1480)
    assert lenient["n"] == 1490 and lenient["agreement"] == pytest.approx(1264 / 1490)

    # Second route: pandas' own TSV parser, a crosstab, and scikit-learn's kappa.
    sk = pytest.importorskip("sklearn.metrics")
    h = pd.read_csv(OPENQA_DIR / "NQ301_human.tsv", sep="\t", dtype=str, keep_default_na=False)
    g = pd.read_csv(OPENQA_DIR / "NQ301_gpt-4.tsv", sep="\t", dtype=str, keep_default_na=False)
    verdict = g["gpt-4"].str.strip().str.extract(r"^(?i:(yes|no))", expand=False).str.capitalize()
    table = pd.crosstab(verdict.fillna("unparsed"), h["Acceptable?"])
    assert table.to_dict() == {
        "No": {"No": 580, "Yes": 86, "unparsed": 8},
        "Yes": {"No": 138, "Yes": 676, "unparsed": 2},
    }
    parsed = verdict.notna()
    assert strict["cohen_kappa"] == pytest.approx(
        sk.cohen_kappa_score(verdict[parsed], h["Acceptable?"][parsed])
    )
    assert lenient["cohen_kappa"] == pytest.approx(
        sk.cohen_kappa_score(verdict.fillna("No"), h["Acceptable?"])
    )
    assert strict["cohen_kappa"] == pytest.approx(0.69639, abs=1e-5)
    assert lenient["cohen_kappa"] == pytest.approx(0.69598, abs=1e-5)
