"""Seeded random rows for the offline metrics, and a snapshot of what the seven offline metrics say about them.

``tests/data/offline_golden.json`` holds the snapshot as the code at commit 63e0970 gave it (before the offline
metrics were made fast, issue 26; rewritten once with floats at 12 significant digits, by code that matched the
exact-repr golden, so that it holds on any CPU; written again for calibration 2 of the offline judge, issue 27:
its long-answer model, the new_recall feature, the character-pair recall of answers written without spaces,
numbers in CJK numerals, and the hard rules on question words, dates, units and names, with nothing else
changed; for gates on intervals, issue 36: each mean's ``ci_low``/``ci_high`` added to the aggregates, every
other number kept as it was; and for calibration 3, issue 39: numbers read in one form (scale words, grouped
thousands, spelled-out numbers and years, digits mixed with CJK numerals), amounts in another currency or scale,
short answers named but not asserted (denied, among alternatives, inside a question), and a claim's support read
from one passage's window, its missing names and numbers, and what contradicts it).
``tests/test_offline_speed.py`` checks that the code of today gives the very same per-row results, tables and
aggregates. The rows are built to reach the corners of the text code the speed work touched: English, Japanese,
Chinese and Korean text, accents and full-width characters, numbers with thousands separators, number words and
ordinals, abbreviations, line breaks, declines and courtesy, empty texts, several acceptable answers, contexts
missing or empty.

Regenerate (only when the offline metrics' results are meant to change, and say why in the commit)::

    PYTHONPATH=. .venv/bin/python tests/offline_rows.py --write
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

GOLDEN = Path(__file__).resolve().parent / "data" / "offline_golden.json"
SEED = 26
ROWS = 300
METRICS = ["correctness", "faithfulness", "context_precision", "context_recall", "context_relevance", "lexical",
           "retrieval"]

_ENGLISH = ("bridge library station tower harbour museum river engineer council granite steel oak designed "
            "restored funded damaged flood fire storm visitors summer winter festival railway merchants built "
            "completed opened closed extended university students professor government company owner public "
            "private city town village north south east west old new tall long wide famous original").split()
_STOP = ("the a an of to in on and or is was were it its this that with by at from which who what when where how "
         "not no do did has have had will would can also than then so").split()
_NUMBERS = ("1969 1970 2,579 12,000,000 3.5 eight eleven twenty 14th first third 42 007 1,000 H2O CO2 v1.2 No. 5 "
            "1900s 10km").split()
_ACCENTED = "café Dáin naïve Straße résumé São Paulo Zürich Ａｌｐｈａ ＡＩ１２ ﬁnance Ελλάδα Москва".split()
_CJK_WORDS = ("東京 日本 首都 富士山 大阪 橋 図書館 駅 建設 年 人口 北京 中国 "
              "上海 長江 서울 한국 ソウル カタカナ ひらがな １１．５ 人々 ｶﾀｶﾅ").split()
_CJK_PARTICLES = list("はがのにをでとへも")
_ABBREVIATIONS = ["Dr. Smith", "e.g. the", "U.S. Navy", "J. R. Tolkien", "vs. them", "Fig. 3", "approx. five"]
_DECLINES = ["I don't know.", "The context does not say.", "I'm not sure.", "There is no information about that.",
             "わかりません。", "I cannot find the answer"]
_COURTESY = ["Thanks!", "Hope this helps.", "Sorry,", "Feel free to ask more."]


def _english_sentence(rng: random.Random, words: list[str]) -> str:
    n = rng.randint(3, 14)
    out: list[str] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.55:
            out.append(rng.choice(words))
        elif r < 0.8:
            out.append(rng.choice(_STOP))
        elif r < 0.9:
            out.append(rng.choice(_NUMBERS))
        elif r < 0.95:
            out.append(rng.choice(_ACCENTED))
        else:
            out.append(rng.choice(_ABBREVIATIONS))
    if rng.random() < 0.3:
        out[0] = out[0].capitalize()
    if rng.random() < 0.15:
        out.insert(rng.randrange(len(out)), rng.choice((",", "(", ")", "-", "&", "_", "'s")))
    return " ".join(out) + rng.choice((".", ".", ".", "!", "?", "", ".\n", "…"))


def _cjk_sentence(rng: random.Random, words: list[str]) -> str:
    out: list[str] = []
    for _ in range(rng.randint(2, 8)):
        out.append(rng.choice(words))
        if rng.random() < 0.5:
            out.append(rng.choice(_CJK_PARTICLES))
        if rng.random() < 0.1:
            out.append(rng.choice(_NUMBERS[:6]))
    return "".join(out) + rng.choice(("。", "。", "！", "？", "", "」と言った。", "\n"))


def _sentence(rng: random.Random, lang: str, words: list[str], cjk: list[str]) -> str:
    if lang == "en" or (lang == "mixed" and rng.random() < 0.5):
        return _english_sentence(rng, words)
    return _cjk_sentence(rng, cjk)


def _text(rng: random.Random, facts: list[str], noise: list[str], n: int, p_fact: float) -> str:
    parts = [rng.choice(facts) if rng.random() < p_fact else rng.choice(noise) for _ in range(n)]
    sep = rng.choice((" ", " ", "", "\n"))
    return sep.join(parts)


def make_rows(n: int = ROWS, seed: int = SEED) -> pd.DataFrame:
    """``n`` random rows (deterministic for a seed): every column the seven offline metrics read."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        lang = rng.choice(("en", "en", "cjk", "mixed"))
        words = rng.sample(_ENGLISH, 12)
        cjk = rng.sample(_CJK_WORDS, 8)
        facts = [_sentence(rng, lang, words, cjk) for _ in range(rng.randint(2, 6))]
        noise = [_sentence(rng, lang, rng.sample(_ENGLISH, 12), rng.sample(_CJK_WORDS, 8)) for _ in range(6)]
        reference = _text(rng, facts, noise, rng.randint(1, 3), 1.0)
        answer = _text(rng, facts, noise, rng.randint(1, 4), rng.choice((0.2, 0.6, 0.9)))
        r = rng.random()
        if r < 0.08:
            answer = rng.choice(_DECLINES)
        elif r < 0.15:
            answer = f"{rng.choice(_COURTESY)} {answer} {rng.choice(_DECLINES)}"
        elif r < 0.18:
            answer = ""
        elif r < 0.22:
            answer = rng.choice(reference.split() or ["x"])  # a one-word answer
        question = _sentence(rng, lang, words, cjk).rstrip(".!…\n") + "?"
        contexts: list[str] | None = [_text(rng, facts, noise, rng.randint(1, 6), rng.choice((0.1, 0.4, 0.8)))
                                      for _ in range(rng.randint(0, 6))]
        if rng.random() < 0.05:
            contexts = None
        elif contexts and rng.random() < 0.1:
            contexts[rng.randrange(len(contexts))] = rng.choice(("", "   ", "..."))
        references = None
        if rng.random() < 0.2:
            references = [reference, *(_text(rng, facts, noise, 1, 0.7) for _ in range(rng.randint(1, 2)))]
        if rng.random() < 0.03:
            reference = rng.choice(("...", "the"))
            references = None
        ids = [f"d{rng.randint(0, 30)}" for _ in range(rng.randint(0, 8))]
        relevant = sorted({f"d{rng.randint(0, 30)}" for _ in range(rng.randint(0, 3))})
        rows.append({"question": question, "answer": answer, "reference": reference, "references": references,
                     "contexts": contexts, "retrieved_doc_ids": list(dict.fromkeys(ids)), "relevant_doc_ids": relevant,
                     "id": f"r{i}"})
    return pd.DataFrame(rows)


def sample_rows() -> pd.DataFrame:
    """The package's own sample data (``mlflow_ragjudge/data/sample_rag.jsonl``)."""
    path = Path(__file__).resolve().parents[1] / "mlflow_ragjudge" / "data" / "sample_rag.jsonl"
    return pd.read_json(path, lines=True)


def _canonical(value: Any) -> Any:
    """``value`` with every float at 12 significant digits: the same on every machine. (numpy picks its summation
    kernels by the CPU's vector instructions, so a mean may differ in its last bit from one machine to another;
    the golden is about what the metrics say, not about the last bit of a sum.)"""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.12g}"
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if hasattr(value, "item") and hasattr(value, "dtype"):  # a numpy scalar
        return _canonical(value.item())
    return value


def _digest(value: Any) -> str:
    text = json.dumps(_canonical(value), sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _number(v: Any) -> Any:
    """A value as JSON keeps it (floats at 12 significant digits, see :func:`_canonical`; NaN as a string)."""
    return _canonical(v) if isinstance(v, float) else v


#: retrieval's document-id measures read no text (the table's digests still cover them)
_ID_MEASURE = re.compile(r"(precision|recall|f1|hit_rate|ndcg|map|mrr)(_at_\d+)?$")


def _evaluate(df: pd.DataFrame, metrics: list[str]) -> Any:
    from mlflow_ragjudge import evaluate_frame

    cfg = {"judge": "offline:/lexical", "metrics": metrics, "bertscore": False, "cache": False, "progress": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return evaluate_frame(df, cfg)


def snapshot(df: pd.DataFrame) -> dict[str, Any]:
    """What the seven offline metrics say about ``df``: each output's per-row status, value and a digest of its
    reason, rationale and details; a digest of each row of the per-row table; every aggregate."""
    out = _evaluate(df, METRICS)
    results = {name: [[r.status.value, _number(r.value), _digest([r.reason, r.rationale, r.details])]
                      for r in res] for name, res in sorted(out.results.items()) if not _ID_MEASURE.match(name)}
    table = out.table
    rows = [_digest([[c, _number(v) if not isinstance(v, list | dict) else v] for c, v in zip(table.columns, row)])
            for row in table.itertuples(index=False)]
    return {"results": results, "table_columns": list(table.columns), "table_rows": rows,
            "metrics": {k: _number(v) for k, v in sorted(out.metrics.items())}}


def public_rows(data_dir: Path) -> dict[str, pd.DataFrame]:
    """The public human-labelled data the calibration was fitted on (``../shared/data``, beside the checkout), as
    rows the offline metrics read: NQ301's answers with their acceptable answers; MTRAG's responses with the
    reference and the passages."""
    from tools.offline_judge.public_data import load_mtrag, load_nq301

    nq = load_nq301(data_dir)
    m = load_mtrag(data_dir)
    return {"nq301": pd.DataFrame({"question": nq["question"], "answer": nq["answer"],
                                   "reference": [r[0] for r in nq["references"]], "references": nq["references"]}),
            "mtrag": pd.DataFrame({"question": m["question"], "answer": m["response"], "reference": m["reference"],
                                   "contexts": m["passages"]})}


def public_snapshot(df: pd.DataFrame) -> dict[str, Any]:
    """Per output: the per-row values, and one digest of every row's status, value, reason, rationale, details."""
    out = _evaluate(df, METRICS if "contexts" in df.columns else ["correctness", "lexical"])
    return {name: {"values": [_number(r.value) for r in res],
                   "digest": _digest([[r.status.value, _number(r.value), r.reason, r.rationale, r.details]
                                      for r in res])}
            for name, res in sorted(out.results.items())}


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(__doc__)
        return 2
    golden = {"made_by": "tests/offline_rows.py --write", "seed": SEED, "rows": ROWS,
              "random": snapshot(make_rows()), "sample": snapshot(sample_rows())}
    shared = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    if shared.is_dir():  # the public data sits beside the project's own checkout
        golden["public"] = {name: public_snapshot(df) for name, df in public_rows(shared).items()}
    GOLDEN.write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size / 1024:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
