"""The offline metrics made fast (issue 26) say exactly what they said before.

* ROUGE-L (the lexical baseline and retrieval's chunk-level coverage) equals ``rouge_score``'s -- its Python LCS
  table and its arithmetic, with our tokenizer -- on random English, CJK and mixed text;
* the seven offline metrics give the per-row results, per-row table and aggregates recorded in
  ``tests/data/offline_golden.json`` by the code at commit 63e0970 (before the speed work; written again for
  calibrations 2 and 3, see ``offline_rows.py``) on seeded random rows,
  the package's sample data and, where ``../shared/data`` is present, the public data the calibration was fitted on;
* the shipped calibration is the file it was (calibration 3 since issue 39, when the golden was written again).

No timings here: speed is measured by ``benchmarks/throughput.py`` and ``benchmarks/bench_lcs.py``.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
from offline_rows import GOLDEN, make_rows, public_rows, public_snapshot, sample_rows, snapshot

from mlflow_ragjudge.core.text import tokenize
from mlflow_ragjudge.metrics.lexical import context_rouge_l, rouge_l

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CALIBRATION = Path(__file__).resolve().parents[1] / "mlflow_ragjudge" / "data" / "offline_judge.json"

rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")


class _OurTokens:
    def tokenize(self, text: str) -> list[str]:
        return tokenize(text)


REFERENCE = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_OurTokens())

_WORDS = "the a of union all keeps removes duplicates rows fast café naïve Straße 3.5 1,200 x y z".split()
_CJK = list("東京は日本の首都です北京中国上海ソウル서울한국ひらがなカタカナ")


def _english(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n)) + rng.choice((".", "!", "", "\n"))


def _cjk(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_CJK) for _ in range(n)) + rng.choice(("。", "", "！"))


def _mixed(rng: random.Random, n: int) -> str:
    return " ".join(_english(rng, 3) if rng.random() < 0.5 else _cjk(rng, 4) for _ in range(max(1, n // 3)))


def _pairs(kind: str, count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(f"{kind}:{seed}")
    make = {"english": _english, "cjk": _cjk, "mixed": _mixed}[kind]
    out = []
    for _ in range(count):
        out.append((make(rng, rng.choice((0, 1, 2, 5, 20, 80, 300))), make(rng, rng.choice((0, 1, 3, 10, 45)))))
    return out


def _same(ours: dict[str, float | None], theirs: object) -> None:
    assert ours["precision"] == pytest.approx(theirs.precision, abs=1e-12)  # type: ignore[attr-defined]
    assert ours["recall"] == pytest.approx(theirs.recall, abs=1e-12)  # type: ignore[attr-defined]
    assert ours["f1"] == pytest.approx(theirs.fmeasure, abs=1e-12)  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["english", "cjk", "mixed"])
def test_rouge_l_equals_rouge_score_on_random_pairs(kind: str) -> None:
    pairs = _pairs(kind, 300, seed=1)
    assert sum(1 for c, r in pairs if tokenize(c) and tokenize(r)) > 200  # most pairs have tokens on both sides
    for candidate, reference in pairs:
        ours = rouge_l(candidate, reference)
        if not tokenize(reference):
            assert ours == {"precision": None, "recall": None, "f1": None}
            continue
        _same(ours, REFERENCE.score(reference, candidate)["rougeL"])


@pytest.mark.parametrize("kind", ["english", "cjk", "mixed"])
def test_context_rouge_l_equals_rouge_score_on_the_joined_contexts(kind: str) -> None:
    rng = random.Random(f"contexts:{kind}")
    make = {"english": _english, "cjk": _cjk, "mixed": _mixed}[kind]
    for _ in range(150):
        contexts = [make(rng, rng.choice((0, 1, 10, 60, 120))) for _ in range(rng.randint(0, 6))]
        if contexts and rng.random() < 0.2:
            contexts[0] = "\u0301" + contexts[0]  # a combining mark right after the joining line break
        reference = make(rng, rng.choice((1, 5, 45)))
        ours = context_rouge_l(contexts, reference)
        if not tokenize(reference):
            assert ours["recall"] is None
            continue
        _same(ours, REFERENCE.score(reference, "\n".join(c for c in contexts if c))["rougeL"])


def test_rouge_l_zero_cases_as_rouge_score() -> None:
    # no candidate tokens: 0 (rouge_score's Score(0, 0, 0)); no common token: 0 with precision + recall = 0
    assert rouge_l("", "a b") == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert rouge_l("c d e", "a b") == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert rouge_l("a", "a") == {"precision": 1.0, "recall": 1.0, "f1": 1.0}


# --------------------------------------------------------------------------- the offline metrics, row by row


def _golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def _compare(got: dict, want: dict) -> None:
    assert sorted(got["results"]) == sorted(want["results"])
    for name, rows in want["results"].items():
        diff = [i for i, (a, b) in enumerate(zip(got["results"][name], rows)) if a != b]
        assert not diff, (f"{name}: {len(diff)} row(s) differ from the golden, first row {diff[0]}: "
                          f"{got['results'][name][diff[0]]} != {rows[diff[0]]}")
    assert got["table_columns"] == want["table_columns"]
    diff = [i for i, (a, b) in enumerate(zip(got["table_rows"], want["table_rows"])) if a != b]
    assert not diff and len(got["table_rows"]) == len(want["table_rows"]), f"table rows differ: {diff[:10]}"
    assert got["metrics"] == want["metrics"]


def test_offline_metrics_on_random_rows_are_as_before() -> None:
    golden = _golden()
    df = make_rows(golden["rows"], golden["seed"])
    _compare(snapshot(df), golden["random"])


def test_offline_metrics_on_the_sample_data_are_as_before() -> None:
    _compare(snapshot(sample_rows()), _golden()["sample"])


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"public data not found at {SHARED_DATA}")
def test_offline_metrics_on_the_public_data_are_as_before() -> None:
    want = _golden()["public"]
    for name, df in public_rows(SHARED_DATA).items():
        got = public_snapshot(df)
        assert sorted(got) == sorted(want[name])
        for output, w in want[name].items():
            diff = [i for i, (a, b) in enumerate(zip(got[output]["values"], w["values"])) if a != b]
            assert not diff, f"{name} {output}: rows {diff[:10]} differ"
            assert got[output]["digest"] == w["digest"], f"{name} {output}: rationale or details differ"


def test_the_golden_sees_every_kind_of_result() -> None:
    # a golden of abstentions only would prove nothing: the random rows reach scores, levels and abstentions
    results = _golden()["random"]["results"]
    assert {r[1] for r in results["correctness"]} >= {"1", "2", "3", "4", "5", None}
    for name in ("faithfulness", "context_precision", "context_recall", "context_relevance", "rougeL",
                 "context_rougeL_recall", "word_recall"):
        statuses = {r[0] for r in results[name]}
        assert "scored" in statuses and "abstained" in statuses, name
        assert len({r[1] for r in results[name]}) > 5, name


def test_the_shipped_calibration_is_unchanged() -> None:
    digest = hashlib.sha256(CALIBRATION.read_bytes()).hexdigest()
    assert digest == "50d260603a4e409eff3ee1b5efbf95f1a93fbedce7a560557770fa9516175b68"


# --------------------------------------------------------------------------- the pieces rewritten for speed


def test_the_faster_regexes_match_as_the_old_ones() -> None:
    import re

    from mlflow_ragjudge.core import matching, text

    old_boundary = re.compile(f"(?:[.!?…]+|[。！？．｡]+)[{re.escape(text._CLOSERS)}]*")
    old_thousands = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
    rng = random.Random(7)
    marks = list("ab .!?…。！？．｡\"')」』）\n1") + [","]
    digits = list("12,3a ,,4567890٣")
    for _ in range(20_000):
        s = "".join(rng.choice(marks) for _ in range(rng.randint(0, 40)))
        assert ([(m.span(), m.group(0)) for m in text._BOUNDARY_RE.finditer(s)]
                == [(m.span(), m.group(0)) for m in old_boundary.finditer(s)]), s
        d = "".join(rng.choice(digits) for _ in range(rng.randint(0, 30)))
        assert matching._THOUSANDS.sub("", d) == old_thousands.sub("", d), d


def test_the_ascii_shortcut_tokenises_as_the_rule() -> None:
    from mlflow_ragjudge.core.text import _token_re, normalize

    rng = random.Random(8)
    for _ in range(5_000):
        s = "".join(chr(rng.randrange(128)) for _ in range(rng.randint(0, 60)))
        assert tokenize(s) == _token_re().findall(normalize(s)), s


def test_char_trigrams_counted_as_a_counter_would() -> None:
    from collections import Counter

    from mlflow_ragjudge.metrics.offline_evidence import _shared_trigrams, _trigrams

    def old(a: str, b: str) -> int:
        def grams(s: str) -> Counter[str]:
            return Counter(s[i: i + 3] for i in range(len(s) - 2))
        return sum((grams(a) & grams(b)).values())

    rng = random.Random(9)
    alphabet = list("ab c") + ["東", "\ud800", "\U00020000", "é"]
    for _ in range(3_000):
        a = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        b = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert _shared_trigrams(_trigrams(a), _trigrams(b)) == old(a, b), (a, b)
        assert int(_trigrams(a)[1].sum()) == max(0, len(a) - 2)
