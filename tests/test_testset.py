"""Test-set generation against the fake server."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from fakellm import Reply

from mlflow_ragjudge import JudgeClient, evaluate_frame
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.workflows.testset import generate_testset

CORPUS = {
    "d1": "UNION ALL keeps duplicate rows. It is faster than UNION.",
    "d2": "Table of contents: 1. Intro 2. Setup",
    "d3": "RUNSTATS updates table statistics for the optimizer.",
    "d4": "",
}


def handler(req):
    text = req.last_user_text
    if 'name="doc_id">\nd1\n' in text:
        return {"has_question": True, "question": "Which keeps duplicates, UNION or UNION ALL?",
                "answer": "UNION ALL.", "evidence": "UNION ALL keeps duplicate rows."}
    if 'name="doc_id">\nd2\n' in text:
        return {"has_question": False, "question": "", "answer": "", "evidence": ""}
    if 'name="doc_id">\nd3\n' in text:
        return Reply.error(400, "content policy")
    return Reply.error(500, "unexpected")


@pytest.fixture
def client(fake_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-testset")
    fake_llm.set_handler(handler)
    return JudgeClient(f"openai:/writer?base_url={fake_llm.openai_base_url}", cache=False)


def test_generate_one_question_per_document_or_none(fake_llm, client):
    df, report = generate_testset(CORPUS, client)
    assert report.generated == ["d1"] and sorted(report.declined) == ["d2", "d4"]
    assert list(report.failed) == ["d3"] and "provider_error" in report.failed["d3"]
    assert fake_llm.request_count == 3  # the empty document is not sent
    row = df.iloc[0]
    assert row["question"].startswith("Which keeps") and row["reference"] == "UNION ALL."
    assert row["relevant_doc_ids"] == ["d1"] and row["gold_documents"] == [CORPUS["d1"]]
    assert row["evidence_contexts"] == ["UNION ALL keeps duplicate rows."] and "reference_contexts" not in row


def test_has_question_without_a_question_counts_as_declined_not_made_up(fake_llm, client):
    # a schema-valid reply that says "a question can be made" but writes none: nothing usable, no item invented
    fake_llm.set_handler(lambda r: {"has_question": True, "question": "", "answer": "", "evidence": ""})
    df, report = generate_testset({"d1": "text"}, client)
    assert report.declined == ["d1"] and len(df) == 0 and fake_llm.request_count == 1


def test_unreadable_reply_is_reasked_then_failed(fake_llm, client):
    fake_llm.set_handler(lambda r: "I would ask about the text.")
    _, report = generate_testset({"d1": "text"}, client)
    assert "parse_error" in report.failed["d1"] and fake_llm.request_count == 6  # the first try, five re-asks


def test_sample_is_seeded_and_validated(fake_llm, client):
    a, _ = generate_testset(CORPUS, client, sample=2, seed=3)
    n = fake_llm.request_count
    b, _ = generate_testset(CORPUS, client, sample=2, seed=3)
    assert fake_llm.request_count - n == n  # the same documents asked again
    with pytest.raises(ValueError, match="sample=9"):
        generate_testset(CORPUS, client, sample=9)
    with pytest.raises(ValueError, match="must be text"):
        generate_testset({"d1": 3}, client)  # type: ignore[dict-item]


def test_generated_set_feeds_the_evaluator(fake_llm, client):
    df, _ = generate_testset(CORPUS, client)
    df = df.assign(retrieved_doc_ids=[["d2", "d1"]])
    out = evaluate_frame(df, metrics=["retrieval"], k=[1, 2])
    assert out.metrics["recall_at_2/mean"] == 1 and out.metrics["mrr/mean"] == 0.5


def test_cli_testset(fake_llm, client, tmp_path, capsys):
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps(CORPUS), encoding="utf-8")
    out = tmp_path / "ts.jsonl"
    uri = f"openai:/writer?base_url={fake_llm.openai_base_url}"
    assert main(["testset", str(corpus), "--judge", uri, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "1 questions from 4 documents (2 declined, 1 failed)" in printed
    rows = pd.read_json(out, lines=True)
    assert rows["source_doc_id"].tolist() == ["d1"]


def test_corpus_recipe_minimum_size_and_distractors(fake_llm, judge, tmp_path):
    """Seed 001's recipe: short documents are never asked; the corpus to index mixes the positives with
    n distractors each, drawn with the seed; the gold ids are the rows' relevant_doc_ids."""
    docs = {f"long{i}": f"Document {i} explains topic {i} in detail. " * 8 for i in range(6)}
    docs.update({f"short{i}": f"Stub {i}." for i in range(8)})
    writer = JudgeClient(judge, cache=False)
    df, report = generate_testset(docs, writer, min_positive_chars=100, distractors_per_positive=2, seed=1)
    asked = json.dumps([r.messages for r in fake_llm.requests])
    assert not any(f"Stub {i}." in asked for i in range(8))  # never asked
    assert sorted(report.too_short) == sorted(f"short{i}" for i in range(8))
    positives = set(report.generated)
    assert positives and positives == {ids[0] for ids in df["relevant_doc_ids"]}
    assert not positives & set(report.distractor_ids)
    assert len(report.distractor_ids) == min(2 * len(positives), len(docs) - len(positives))
    assert set(report.corpus_ids) == positives | set(report.distractor_ids)
    _, again = generate_testset(docs, writer, min_positive_chars=100, distractors_per_positive=2, seed=1)
    assert again.corpus_ids == report.corpus_ids  # seeded
    with pytest.raises(ValueError, match="min_positive_chars"):
        generate_testset(docs, writer, min_positive_chars=10_000)
    corpus_file = tmp_path / "corpus.json"
    corpus_file.write_text(json.dumps(docs))
    out, corpus_out = tmp_path / "set.jsonl", tmp_path / "index.jsonl"
    assert main(["testset", str(corpus_file), "--judge", judge, "--out", str(out), "--min-positive-chars", "100",
                 "--distractors-per-positive", "1", "--corpus-out", str(corpus_out)]) == 0
    index = [json.loads(line) for line in corpus_out.read_text().splitlines()]
    gold = {json.loads(line)["relevant_doc_ids"][0] for line in out.read_text().splitlines()}
    assert gold <= {d["id"] for d in index} and all(d["text"] == docs[d["id"]] for d in index)
