"""The offline judge's faithfulness against human labels of claims (issue 39), next to two lexical baselines on the
same rows: the claim's **word recall** (the share of its content words found anywhere in the evidence: what the
judge computed before) and its **best single-sentence recall** (the share found in the one evidence sentence that
holds most of them). Spearman and AUC of each score against the labels, on every set readable here:

* **MTRAG** (``../shared/data/mtrag``): the model responses of the held-out half, scored against their passages;
  label: the mean human faithfulness rating (1-4); AUC: rated 3 or more ("mostly yes") against the rest. A response
  of several sentences gets the mean over its claim sentences, baselines too. The judge's support threshold is fitted
  on the other half.
* **WiCE** (Kamoi et al. 2023, ``github.com/ryokamoi/wice``, ``data/entailment_retrieval/claim/{dev,test}.jsonl``;
  not shipped: pass its folder): sentences of Wikipedia and the article each cites, labelled supported, partially
  supported or not supported by annotators; Spearman against the three labels in that order, AUC: supported
  against the rest. The judge's window, key-word penalty and contradiction rule were chosen on the dev split; the
  table is the test split.
* **QAGS** (Wang et al. 2020, ``github.com/W4ngatang/qags``, ``data/mturk_{cnndm,xsum}.jsonl``; not shipped: pass
  its folder): the sentences of model summaries of CNN/DailyMail (QAGS-C) and XSum (QAGS-X) articles, each judged by
  three crowd workers: does the article support it? Label: the share of workers who said yes; AUC: a majority said
  yes. Evidence: the article. The articles are numbered in file order from 0; the phrase share and its weight were
  chosen with the odd-numbered articles beside MTRAG's fit half and WiCE dev; the table's held-out rows are the
  even-numbered ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mlflow_ragjudge.core.matching import content_union, text_cut
from mlflow_ragjudge.core.text import nonblank_passages
from mlflow_ragjudge.metrics.faithfulness import offline_claims
from mlflow_ragjudge.metrics.offline import OfflineJudge
from mlflow_ragjudge.metrics.offline_reading import number_forms

WICE_LABELS = {"not_supported": 0, "partially_supported": 1, "supported": 2}


def load_wice(folder: str | Path) -> dict[str, list[dict[str, Any]]]:
    """WiCE's claim-level splits from ``folder`` (its ``dev.jsonl`` and ``test.jsonl``): each row's ``claim``,
    ``evidence`` (the cited article's sentences) and ``label``.

    Raises:
        FileNotFoundError: the folder holds neither split.
    """
    out = {}
    for split in ("dev", "test"):
        path = Path(folder) / f"{split}.jsonl"
        if path.is_file():
            out[split] = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not out:
        raise FileNotFoundError(f"{folder}: no dev.jsonl or test.jsonl (WiCE's data/entailment_retrieval/claim)")
    return out


QAGS_FILES = {"QAGS-C": "mturk_cnndm.jsonl", "QAGS-X": "mturk_xsum.jsonl"}


def load_qags(folder: str | Path) -> dict[str, list[dict[str, Any]]]:
    """QAGS's summary sentences from ``folder`` (its ``mturk_cnndm.jsonl``, ``mturk_xsum.jsonl``), by set name
    (``QAGS-C``, ``QAGS-X``): each row's ``claim`` (the sentence), ``article``, ``article_number`` (in file order, from
    0), ``yes`` (the share of workers who judged it supported).

    Raises:
        FileNotFoundError: the folder holds neither file.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for name, file in QAGS_FILES.items():
        path = Path(folder) / file
        if not path.is_file():
            continue
        rows = []
        for number, line in enumerate(x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()):
            doc = json.loads(line)
            for sentence in doc["summary_sentences"]:
                votes = [r["response"] == "yes" for r in sentence["responses"]]
                rows.append({"claim": sentence["sentence"], "article": doc["article"], "article_number": number,
                             "yes": sum(votes) / len(votes)})
        out[name] = rows
    if not out:
        raise FileNotFoundError(f"{folder}: no {' or '.join(QAGS_FILES.values())} (QAGS's data/ folder)")
    return out


def baselines(response: str, evidence: list[str]) -> tuple[float, float] | None:
    """(word recall, best single-sentence recall) of ``response``'s claim sentences against ``evidence`` (means over
    the sentences), or None when it has no claim or there is no evidence."""
    passages = [number_forms(p) for p in nonblank_passages(evidence)]
    claims = [part for _, part in offline_claims(response)]  # the sentences the judge checks
    if not passages or not claims:
        return None
    backed = content_union(passages)
    sentences = [s.content_set for p in passages for s in text_cut(p).parts]
    word, best = [], []
    for part in claims:
        tokens = part.content
        word.append(sum(t in backed for t in tokens) / len(tokens))
        best.append(max((sum(t in s for t in tokens) / len(tokens) for s in sentences), default=0.0))
    return float(np.mean(word)), float(np.mean(best))


def _spearman(x: list[float], y: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y)[0])


def _auc(x: list[float], positive: list[bool]) -> float:
    """The probability that a positive row scores above a negative one (ties count half)."""
    xs, ps = np.asarray(x, float), np.asarray(positive, bool)
    pos, neg = xs[ps], xs[~ps]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def _scored(name: str, rows: list[tuple[str, list[str], float, bool]], judge: OfflineJudge) -> dict[str, Any]:
    """The three scores on the rows where the judge scores (the same rows for all three)."""
    kept: list[tuple[float, float, float, float, bool]] = []
    for response, evidence, label, positive in rows:
        res = judge.faithfulness(response, evidence)
        base = baselines(response, evidence)
        if res.value is None or base is None:
            continue
        kept.append((float(res.value), base[0], base[1], label, positive))
    labels = [k[3] for k in kept]
    positives = [k[4] for k in kept]
    scores = {}
    for i, score in enumerate(("offline judge", "word recall", "best sentence recall")):
        xs = [k[i] for k in kept]
        scores[score] = {"spearman": _spearman(xs, labels), "auc": _auc(xs, positives)}
    best = max(scores["word recall"]["spearman"], scores["best sentence recall"]["spearman"])
    best_auc = max(scores["word recall"]["auc"], scores["best sentence recall"]["auc"])
    return {"set": name, "rows": len(kept), "positive": float(np.mean(positives)) if kept else float("nan"),
            "scores": scores, "margin_spearman": scores["offline judge"]["spearman"] - best,
            "margin_auc": scores["offline judge"]["auc"] - best_auc}


def claims_table(mtrag_held_out: pd.DataFrame | None, wice: dict[str, list[dict[str, Any]]] | None,
                 judge: OfflineJudge | None = None,
                 qags: dict[str, list[dict[str, Any]]] | None = None,
                 mtrag_fit: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """One row per set: the judge's and the baselines' Spearman and AUC on the same rows."""
    judge = judge or OfflineJudge()
    out = []
    for frame, note in ((mtrag_held_out, "held-out half"), (mtrag_fit, "fit half: the support threshold's")):
        if frame is not None:
            rows = [(r.response, list(r.passages), float(r.faithfulness), float(r.faithfulness) >= 3.0)
                    for r in frame.itertuples()]
            out.append(_scored(f"MTRAG, {note} (response-level faithfulness 1-4)", rows, judge))
    for split in ("test", "dev"):
        if wice and split in wice:
            rows = [(r["claim"], ["\n".join(r["evidence"])], float(WICE_LABELS[r["label"]]), r["label"] == "supported")
                    for r in wice[split]]
            note = "held out" if split == "test" else "the split the judge's rules were chosen on"
            out.append(_scored(f"WiCE {split} ({note}; supported / partially / not)", rows, judge))
    for name, sentences in (qags or {}).items():
        for parity, note in ((0, "held-out half: even-numbered articles"),
                             (1, "the half the phrase share was chosen on: odd-numbered articles")):
            rows = [(r["claim"], [r["article"]], r["yes"], r["yes"] > 0.5) for r in sentences
                    if r["article_number"] % 2 == parity]
            out.append(_scored(f"{name} ({note}; share of 3 workers saying supported)", rows, judge))
    return out


def format_claims_table(table: list[dict[str, Any]]) -> str:
    lines = ["Faithfulness against human labels of claims: Spearman / AUC of each score on the same rows",
             "", "| set | rows | positive | offline judge | word recall | best sentence recall | margin |",
             "|---|---|---|---|---|---|---|"]
    for t in table:
        s = t["scores"]
        cell = {k: f"{v['spearman']:.3f} / {v['auc']:.3f}" for k, v in s.items()}
        lines.append(f"| {t['set']} | {t['rows']} | {t['positive']:.0%} | {cell['offline judge']} | "
                     f"{cell['word recall']} | {cell['best sentence recall']} | "
                     f"{t['margin_spearman']:+.3f} / {t['margin_auc']:+.3f} |")
    lines += ["", "margin: the judge's Spearman / AUC minus the better baseline's. AUC: MTRAG rated >= 3 (mostly "
              "faithful) against the rest; WiCE supported against partially or not supported; QAGS a majority of the "
              "workers said supported against the rest."]
    return "\n".join(lines)
