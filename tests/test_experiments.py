"""The bundled example RAG system (mlflow_ragjudge.workflows.example_rag) and the examples in experiments/, which
use only the public API: a retrieval sweep, and seed 004's prompt iterations against a scripted generator."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from scripted_generator import ScriptedGenerator

from mlflow_ragjudge.workflows import example_rag
from mlflow_ragjudge.workflows.example_rag import BM25Index, Chunk, chunk_documents

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"

# --------------------------------------------------------------------------- the example RAG system


def test_bm25_score_matches_the_formula():
    index = BM25Index([Chunk("a#0", "a", "apple apple pear"), Chunk("b#0", "b", "pear plum")], k1=1.2, b=0.75)
    n, avgdl = 2, 2.5
    idf = math.log(1 + (n - 1 + 0.5) / (1 + 0.5))
    expected = idf * 2 * 2.2 / (2 + 1.2 * (1 - 0.75 + 0.75 * 3 / avgdl))
    ((chunk, score),) = index.search("apple", 5)
    assert chunk.doc_id == "a" and score == pytest.approx(expected)


def test_chunking_sizes_and_overlap():
    doc = {"d": "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10"}
    assert [c.text for c in chunk_documents(doc, 4, 1)] == ["w1 w2 w3 w4", "w4 w5 w6 w7", "w7 w8 w9 w10"]
    assert [c.chunk_id for c in chunk_documents(doc, 4, 1)] == ["d#0", "d#1", "d#2"]
    assert [c.text for c in chunk_documents(doc, 4, 0)] == ["w1 w2 w3 w4", "w5 w6 w7 w8", "w9 w10"]
    assert [c.text for c in chunk_documents({"j": "電池は約14か月"}, 3, 0)] == ["電池は", "約14か", "月"]
    for size, overlap in [(0, 0), (4, 4), (4, -1)]:
        with pytest.raises(ValueError, match="chunk_size|overlap"):
            chunk_documents(doc, size, overlap)


def test_the_example_system_returns_what_a_sweep_reads():
    out = example_rag.answer("How do I restore a database from a backup?")
    assert set(out) == {"answer", "contexts", "retrieved_doc_ids", "citations"}
    assert out["retrieved_doc_ids"][0] == "d10" and out["citations"] == ["d10"]
    assert out["answer"].startswith("BACKUP DATABASE creates a backup image")
    assert example_rag.answer("How do I bake sourdough bread?")["answer"] == example_rag.NOT_FOUND
    assert example_rag.retrieve("What does EXCEPT return?", top_k=1, generator="ignored") == [
        example_rag.sample_corpus()["d3"]]
    with pytest.raises(ValueError, match="reranker"):
        example_rag.answer("q", reranker="magic")
    with pytest.raises(ValueError, match="top_k"):
        example_rag.answer("q", top_k=0)


def test_the_reranker_prefers_chunks_that_cover_the_question(tmp_path):
    corpus = tmp_path / "c.json"
    corpus.write_text(json.dumps({"a": "backup backup backup backup", "b": "restore the database from a backup"}))
    q = "restore database backup"
    assert example_rag.retrieve(q, top_k=2, corpus=str(corpus), reranker="coverage")[0].startswith("restore")


def test_an_llm_generator_goes_through_the_judge_client(fake_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    fake_llm.set_handler(lambda req: "RUNSTATS updates table statistics [d5], not [d99].")
    out = example_rag.answer("What does RUNSTATS do?", generator=f"openai:/gen?base_url={fake_llm.openai_base_url}",
                             top_k=2)
    assert out["answer"].startswith("RUNSTATS updates") and out["citations"] == ["d5"]  # only retrieved ids
    sent = fake_llm.last_request.last_user_text
    assert "[d5]" in sent and "What does RUNSTATS do?" in sent and example_rag.NOT_FOUND in sent


# --------------------------------------------------------------------------- the examples


@pytest.mark.parametrize("name", ["retrieval_sweep.py", "prompt_iterations.py"])
def test_examples_use_only_the_public_api(name):
    tree = ast.parse((EXPERIMENTS / name).read_text(encoding="utf-8"))
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert not any(m and m.startswith("experiments") for m in imported)
    public = ("mlflow_ragjudge.workflows", "mlflow_ragjudge.workflows.example_rag", "mlflow_ragjudge.llm.backends")
    assert not any(m and m.startswith("mlflow_ragjudge.") and m not in public for m in imported)
    assert "sys.path" not in (EXPERIMENTS / name).read_text(encoding="utf-8")


@pytest.mark.slow
def test_retrieval_sweep_example(tmp_path, capsys):
    from experiments.retrieval_sweep import main

    uri = f"sqlite:///{tmp_path / 'e.db'}"
    assert main(["--quick", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "comparison against 'cs=64,top_k=3'" in out and "extractive" in out
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name("ragjudge-retrieval-sweep")
    assert len(MlflowClient().search_runs([exp.experiment_id])) == 4


def test_aurora_questions_find_the_needle_in_the_long_log():
    from experiments.retrieval_sweep import aurora

    corpus, questions = aurora()
    assert len(questions) == 7 and set(questions["group"]) >= {"present", "multi_doc", "long_context"}
    q = "Which part replaced the anemometer bearing?"
    out = example_rag.answer(q, corpus=corpus, chunk_size=64, overlap=16, top_k=3)
    assert out["retrieved_doc_ids"][0] == "AUR-09"
    assert out["answer"] == "Log entry 58: the anemometer bearing was replaced with part AB-7731 after it squealed."


@pytest.mark.slow
def test_prompt_iterations_against_a_scripted_generator(fake_llm, tmp_path, monkeypatch, capsys):
    from experiments.prompt_iterations import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    script = ScriptedGenerator()
    fake_llm.set_handler(script)
    uri = f"sqlite:///{tmp_path / 'p.db'}"
    assert main(["--generator", f"openai:/scripted?base_url={fake_llm.openai_base_url}", "--tracking-uri", uri]) == 0
    assert script.calls == {"zero_shot": 12, "few_shot": 12, "cot": 12}
    out = capsys.readouterr().out
    assert "zero_shot = prompt=@v1" in out and "cot = prompt=@v3" in out
    assert "generator=" not in out.split("iterations (prompt versions):")[1].splitlines()[0]
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    exp = mlflow.get_experiment_by_name("ragjudge-prompt-iterations")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    zero, cot = runs["prompt=@v1"].data.metrics, runs["prompt=@v3"].data.metrics
    assert runs["prompt=@v1"].data.params["variant.generator"].startswith("openai:/scripted")
    # what the script does, as the checks measure it: zero-shot breaks the format once and answers 2 of the 4
    # unanswerable questions (its English refusal of the Japanese one is still a refusal phrase); chain-of-thought
    # keeps the format, refuses every unanswerable question, and refuses one answerable one
    assert zero["output_contract/mean"] == pytest.approx(11 / 12) and cot["output_contract/mean"] == 1.0
    assert zero["refusal_correct/mean"] == pytest.approx(2 / 4) and cot["refusal_correct/mean"] == 1.0
    assert cot["false_refusal/mean"] == pytest.approx(1 / 8) and zero["false_refusal/mean"] == 0.0
    assert "broken_format" in out and "refusal_failure" in out and "false_refusal" in out
    assert mlflow.genai.load_prompt("prompts:/aurora-rag-answer/3").template.startswith("Answer the QUERY using only")


def test_the_input_contract_names_the_field():
    from experiments.prompt_iterations import check_input

    with pytest.raises(ValueError, match="query: 300 characters"):
        check_input("x" * 300, [], "en")
    with pytest.raises(ValueError, match="contexts: 6 documents"):
        check_input("q", [("d", "t")] * 6, "en")
    with pytest.raises(ValueError, match="language: 'fr'"):
        check_input("q", [], "fr")
