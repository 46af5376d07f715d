"""Readers for the public human-labelled data the offline judge is calibrated and measured on.

The files are not part of the package (nor of a clone of the project); point the readers at a folder laid
out as ``../shared/data`` is (see its README):

* ``openqa_eval/`` -- OpenQA-eval (ehsk/OpenQA-eval, MIT): 1,490 answers to 301 Natural Questions, each judged
  acceptable or not by humans (``NQ301_human.tsv``), with the recorded verdicts of GPT-4 and BEM on the same
  rows; the gold answers (several acceptable answers per question) are in ``NQ301_BEM.tsv``.
* ``mtrag/reference_subset_with_human_evaluations.json`` -- MTRAG (IBM/mt-rag-benchmark, Apache-2.0): 159
  multi-turn RAG tasks x 3 responders, each response rated 1..4 by 2-3 people on faithfulness, completeness,
  appropriateness and naturalness, with the reference answer, the passages and recorded automatic scores.

:func:`half_split` is the fixed rule that cuts a data set into the half the offline judge is fitted on and the
half it is reported on.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import string
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["load_nq301", "load_mtrag", "half_split", "repair_mojibake", "lexical_match", "normalise_answer", "NQ_DIR",
           "MTRAG_FILE"]

NQ_DIR = "openqa_eval"
MTRAG_FILE = "mtrag/reference_subset_with_human_evaluations.json"


def repair_mojibake(text: str) -> str:
    """Undo UTF-8 text that was read as Windows-1252/Latin-1 (``DÃ¡in`` -> ``Dáin``); other text unchanged.
    ``NQ301_BEM.tsv`` stores some gold answers that way."""
    if not any(ch in text for ch in "ÃÂâ"):
        return text
    for codec in ("cp1252", "latin-1"):
        try:
            return text.encode(codec).decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            continue
    return text


def _verdict(text: str) -> bool | None:
    head = text.strip().lower()
    return True if head.startswith("yes") else False if head.startswith("no") else None


def _tsv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def load_nq301(data_dir: str | Path) -> pd.DataFrame:
    """OpenQA-eval NQ301 as one row per judged answer.

    Columns: ``question_id``, ``question``, ``answer``, ``references`` (the acceptable gold answers, mojibake
    repaired), ``human`` (the majority said acceptable), ``gpt4`` (GPT-4's recorded verdict; None when its
    reply starts with neither Yes nor No), ``bem`` (BEM's recorded verdict).

    Raises:
        FileNotFoundError: the folder lacks the files.
    """
    folder = Path(data_dir) / NQ_DIR
    human, bem, gpt4 = (_tsv(folder / f"NQ301_{n}.tsv") for n in ("human", "BEM", "gpt-4"))
    if not len(human) == len(bem) == len(gpt4):
        raise ValueError(f"{folder}: the human, BEM and GPT-4 files have different lengths")
    rows = []
    for h, b, g in zip(human, bem, gpt4):
        if h["Question"] != b["Question"] or h["Question"] != g["Question"]:
            raise ValueError(f"{folder}: the files are not in the same order ({h['Question']!r})")
        golds = [repair_mojibake(x).replace("\xa0", " ").strip() for x in b["Gold answers"].split(" | ")]
        rows.append({"question_id": h["id"], "question": h["Question"], "answer": h["Model answer"],
                     "references": [x for x in golds if x], "human": h["Acceptable?"] == "Yes",
                     "gpt4": _verdict(g["gpt-4"]), "bem": b["Acceptable?"] == "Yes"})
    return pd.DataFrame(rows)


def load_mtrag(data_dir: str | Path, *, include_reference_responder: bool = False) -> pd.DataFrame:
    """MTRAG's human-evaluation subset as one row per rated response.

    Columns: ``task_id``, ``model``, ``question`` (the last user turn), ``history`` (earlier turns),
    ``response``, ``reference`` (the reference answer), ``passages`` (the task's passages, in full),
    ``answerability``, the mean human rating per dimension (``faithfulness``, ``completeness``,
    ``appropriateness``, ``naturalness``; 1 = No .. 4 = Yes) and the recorded automatic scores (``rl_f`` =
    RAGAS faithfulness, ``rb_llm``, ``RougeL``, ``Bert-Rec``, ``Bert-KPrec``).

    Args:
        include_reference_responder: keep the benchmark's own reference answers as responses (159 rows, all
            rated faithful); by default only the two models' 318 responses, as the recorded baselines use.
    """
    data = json.loads((Path(data_dir) / MTRAG_FILE).read_text(encoding="utf-8"))
    docs = {d["document_id"]: d["text"] for d in data["documents"]}
    tasks = {t["task_id"]: t for t in data["tasks"]}
    rows: list[dict[str, Any]] = []
    for ev in data["evaluations"]:
        if ev["model_id"] == "reference" and not include_reference_responder:
            continue
        task = tasks[ev["task_id"]]
        turns = task["input"]
        ann = ev["annotations"]
        row: dict[str, Any] = {
            "task_id": ev["task_id"], "model": ev["model_id"], "response": ev["model_response"],
            "question": next(t["text"] for t in reversed(turns) if t["speaker"] == "user"),
            "history": turns[:-1], "reference": task["targets"][0]["text"],
            "passages": [docs[c["document_id"]] for c in task["contexts"]],
            "answerability": (task.get("Answerability") or [None])[0],
        }
        for dim in ("faithfulness", "completeness", "appropriateness", "naturalness"):
            ratings = [float(a["value"]) for a in ann[dim].values()]
            row[dim] = sum(ratings) / len(ratings)
        for name in ("rl_f", "rb_llm", "RougeL", "Bert-Rec", "Bert-KPrec"):
            (only,) = ann[name].values()
            row[name] = float(only["value"])
        rows.append(row)
    return pd.DataFrame(rows)


def half_split(keys: Iterable[str], salt: str) -> set[str]:
    """The fit half of ``keys``: those whose SHA-256 of ``salt + key`` is even. A fixed rule, chosen before any
    result was seen, so the reported half is never picked for its numbers; split by question (NQ301) or task
    (MTRAG), so a question's answers are never on both sides."""
    return {k for k in set(keys) if hashlib.sha256((salt + k).encode("utf-8")).digest()[-1] % 2 == 0}


def normalise_answer(text: str) -> str:
    """An answer as OpenQA evaluation compares it: accents dropped, lowercase, no punctuation, no articles, single
    spaces."""
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).lower()
    text = "".join(" " if c in string.punctuation else c for c in text)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def lexical_match(answer: str, references: Iterable[str]) -> bool:
    """Lexical matching as OpenQA evaluation does it: some acceptable answer, normalised
    (:func:`normalise_answer`), occurs in the normalised answer."""
    a = f" {normalise_answer(answer)} "
    return any((n := normalise_answer(r)) and f" {n} " in a for r in references)
