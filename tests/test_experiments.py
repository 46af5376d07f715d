"""experiments/: the toy RAG, the variant sweep and the prompt-optimisation loop, offline."""

from __future__ import annotations

import json
import math
import re

import pytest

from experiments.contract import (
    NOT_FOUND,
    ContextDoc,
    ContractError,
    check_output,
    is_refusal,
    lenient_answer,
    validate_input,
)
from experiments.prompt_optimisation import assess, optimisation_loop
from experiments.rag_prompts import STYLES, prompt_version, render
from experiments.scenarios import SCENARIOS
from experiments.sweep_variants import QUICK_GRID, Variant, build_grid, sweep
from experiments.sweep_variants import main as sweep_main
from experiments.text_utils import approx_tokens, content_terms
from experiments.toy_rag import (
    BM25Index,
    Chunk,
    CoverageReranker,
    Document,
    ExtractiveGenerator,
    LLMGenerator,
    ToyRAG,
    chunk_documents,
    load_sample_corpus,
    load_sample_questions,
)
from mlflow_ragjudge.backends import ChatRequest, FakeBackend

# --------------------------------------------------------------------------- toy RAG


def test_bm25_ranks_the_obviously_relevant_document_first():
    docs = [
        Document("bread", "Bake the loaf at 230 degrees for twenty minutes."),
        Document("backup", "RESTORE DATABASE rebuilds a database from a backup image."),
        Document("library", "The library opens at nine and closes on Sundays."),
    ]
    index = BM25Index(chunk_documents(docs, chunk_size=50))
    hits = index.search("How do I restore a database from a backup?", k=3)
    assert hits[0][0].doc_id == "backup"
    assert all(c.doc_id != "bread" for c, _ in hits)  # no shared term: score 0, not returned
    rag = ToyRAG(load_sample_corpus(), chunk_size=64, top_k=3)
    assert rag.retrieve("How do I restore a database from a backup?").doc_ids[0] == "d10"
    assert rag.retrieve("What is the default isolation level?").doc_ids[0] == "d8"


def test_bm25_score_matches_the_formula():
    chunks = [Chunk("a#0", "a", "apple apple pear", 0, 3), Chunk("b#0", "b", "pear plum", 0, 2)]
    index = BM25Index(chunks, k1=1.2, b=0.75)
    n, avgdl = 2, 2.5
    idf_apple = math.log(1 + (n - 1 + 0.5) / (1 + 0.5))
    expected = idf_apple * 2 * 2.2 / (2 + 1.2 * (1 - 0.75 + 0.75 * 3 / avgdl))
    assert index.scores("apple") == pytest.approx([expected, 0.0])


def test_chunking_sizes_and_overlap():
    doc = Document("d", "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10")
    chunks = chunk_documents([doc], chunk_size=4, overlap=1)
    assert [c.text for c in chunks] == ["w1 w2 w3 w4", "w4 w5 w6 w7", "w7 w8 w9 w10"]
    assert [c.chunk_id for c in chunks] == ["d#0", "d#1", "d#2"]
    assert [c.text for c in chunk_documents([doc], chunk_size=4)] == ["w1 w2 w3 w4", "w5 w6 w7 w8", "w9 w10"]
    assert [c.text for c in chunk_documents([doc], chunk_size=50, overlap=10)] == [doc.text]
    # punctuation and spacing are kept; each CJK character is one token
    assert chunk_documents([Document("x", "Hello,  world. Again!")], 2)[0].text == "Hello,  world."
    assert [c.text for c in chunk_documents([Document("j", "電池は約14か月")], 3)] == ["電池は", "約14か", "月"]
    for size, overlap in [(0, 0), (4, 4), (4, -1)]:
        with pytest.raises(ValueError, match="chunk_size|overlap"):
            chunk_documents([doc], size, overlap)


def test_token_and_term_rules():
    assert approx_tokens("two words") == 2
    assert approx_tokens("電池は約14か月") == 7  # 6 CJK characters + "14"
    assert content_terms("The indexes of queries") == ["index", "query"]
    assert "電池" in content_terms("電池は約14か月") and "は約" in content_terms("電池は約14か月")


def test_reranker_prefers_the_chunk_that_covers_the_whole_question():
    hits = [
        (Chunk("a#0", "a", "backup backup backup backup", 0, 4), 3.0),
        (Chunk("b#0", "b", "restore the database from a backup", 0, 6), 2.0),
    ]
    reranked = CoverageReranker().rerank("restore database backup", hits)
    assert [c.doc_id for c, _ in reranked] == ["b", "a"]


def test_extractive_generator_answers_from_context_or_says_not_found():
    gen = ExtractiveGenerator()
    ctx = [ContextDoc("d1", "Tablespaces hold tables. The default isolation level is cursor stability.")]
    assert gen.generate("What is the default isolation level?", ctx).answer == (
        "The default isolation level is cursor stability."
    )
    assert gen.generate("How do I bake bread?", ctx).answer == NOT_FOUND["en"]
    assert gen.generate("パンの焼き方は?", [], "ja").answer == NOT_FOUND["ja"]
    # two fragments of overlapping chunks are stitched, not repeated
    frags = [ContextDoc("a#0", "To create an index, use CREATE INDEX name"),
             ContextDoc("a#1", "INDEX name ON table (column).")]
    assert gen.generate("How do I create an index on a column?", frags).answer == (
        "To create an index, use CREATE INDEX name ON table (column)."
    )


def test_toy_rag_returns_the_columns_the_evaluator_reads():
    rag = ToyRAG(load_sample_corpus(), chunk_size=8, overlap=2, top_k=3, reranker=CoverageReranker())
    out = rag.answer("What does EXCEPT return?")
    assert out.retrieved_doc_ids[0] == "d3"
    assert len(out.contexts) == len(out.chunk_ids) <= 3
    assert len(out.retrieved_doc_ids) == len(set(out.retrieved_doc_ids))  # a document is listed once
    assert "EXCEPT" in out.answer
    assert rag.retrieve_texts("What does EXCEPT return?") == out.contexts


def _contract_reply(request: ChatRequest) -> dict:
    """A fake LLM that answers with the first context document (not a few-shot example's), in the contract."""
    prompt = request.messages[-1]["content"]
    doc_id, text = next(d for d in re.findall(r"\[doc_id: ([^\]]+)\]\n(.*)", prompt) if not d[0].startswith("ex-"))
    return {"answer": text, "confidence_score": 0.7, "sources": [{"doc_id": doc_id, "snippet": text[:30]}],
            "status": "success"}


def test_llm_generator_goes_through_the_judge_client_and_the_contract():
    backend = FakeBackend(handler=_contract_reply)
    rag = ToyRAG(load_sample_corpus(), chunk_size=64, top_k=2, generator=LLMGenerator(backend, "few_shot",
                                                                                     cache=False))
    out = rag.answer("What does RUNSTATS do?")
    assert out.format_ok is True and out.violations == []
    assert out.answer.startswith("The RUNSTATS command")
    sent = backend.requests[0].messages[-1]["content"]
    assert "[doc_id: d5#0]" in sent and "# Example 2" in sent and NOT_FOUND["en"] in sent
    broken = ToyRAG(load_sample_corpus(), top_k=1,
                    generator=LLMGenerator(FakeBackend(["Sure! RUNSTATS updates statistics."]), cache=False))
    out = broken.answer("What does RUNSTATS do?")
    assert out.format_ok is False and "not valid JSON" in out.violations[0]
    assert out.answer == "Sure! RUNSTATS updates statistics."


# --------------------------------------------------------------------------- the sweep


def test_quick_sweep_logs_one_run_per_variant(tmp_tracking, capsys):
    from mlflow.tracking import MlflowClient

    assert sweep_main(["--quick", "--experiment", "sweep-test", "--tracking-uri", tmp_tracking]) == 0
    printed = capsys.readouterr().out
    assert "offline stand-ins" in printed and "correctness" in printed
    client = MlflowClient(tmp_tracking)
    exp = client.get_experiment_by_name("sweep-test")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == len(QUICK_GRID) == 2
    seen = set()
    for run in runs:
        p, m = run.data.params, run.data.metrics
        seen.add((int(p["variant.chunk_size"]), int(p["variant.chunk_overlap"]), int(p["variant.top_k"]),
                  p["variant.reranker"] == "coverage"))
        assert p["variant.retriever"] == "bm25" and p["variant.generator"] == "extractive"
        assert p["ragjudge.judge"] == "offline:/lexical" and p["ragjudge.context_mode"] == "reference"
        for name in ("correctness/mean", "map/mean", "mrr/mean", "rougeL/mean", "rag/not_found_rate"):
            assert name in m, name
        assert 1 <= m["correctness/mean"] <= 5 and 0 <= m["map/mean"] <= 1
        assert run.data.tags["offline_stand_ins"] == "true"
    assert seen == {(v.chunk_size, v.overlap, v.top_k, v.reranker) for v in QUICK_GRID}
    # the table is sorted by the headline metric, best first
    scores = [float(line.split()[4]) for line in printed.splitlines()[-2:]]
    assert scores == sorted(scores, reverse=True)


def test_sweep_with_an_llm_generator_sweeps_prompt_styles(tmp_tracking):
    variants = [Variant(64, 16, 1, False, style) for style in ("zero_shot", "cot")]
    table = sweep(variants, judge=None, generator=FakeBackend(handler=_contract_reply), experiment="llm-sweep",
                  cache=False)
    assert sorted(table["style"]) == ["cot", "zero_shot"]
    # the fake replies without the FINAL JSON: line the cot contract requires; the answer is still read
    assert dict(zip(table["style"], table["rag/format_adherence_rate"])) == {"cot": 0.0, "zero_shot": 1.0}
    assert (table["rag/not_found_rate"] == 0).all()
    assert "correctness/mean" in table.columns and table["correctness/mean"].isna().all()  # no judge
    assert (table["map/mean"] > 0).all()


def test_grid():
    grid = build_grid((8, 64), (1, 3), (False, True))
    assert len(grid) == 8 and grid[0] == Variant(8, 2, 1, False)
    assert Variant(8, 2, 1, True, "cot").params()["variant.prompt_version"] == prompt_version("cot")


# --------------------------------------------------------------------------- contracts


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"query": "x" * 257}, "query", "at most 256 characters"),
        ({"query": "  "}, "query", "non-empty"),
        ({"contexts": [{"doc_id": f"d{i}", "text": "t"} for i in range(6)]}, "contexts", "5 most relevant"),
        ({"language": "fr"}, "language", "'ja' or 'en'"),
        ({"contexts": [{"doc_id": "d0", "text": "word " * 2049}]}, "contexts[0].text", "at most 2048 tokens"),
        ({"contexts": [{"doc_id": "d0", "text": "電" * 2049}]}, "contexts[0].text", "at most 2048 tokens"),
        ({"contexts": [{"doc_id": "d0"}]}, "contexts[0]", "'doc_id': str, 'text': str"),
        ({"contexts": [{"doc_id": "a", "text": "t", "score": 1.0}, {"doc_id": "b", "text": "u", "score": 2.0}]},
         "contexts[1].score", "sort the contexts by descending relevance"),
        ({"contexts": [{"doc_id": "a", "text": "t"}, {"doc_id": "a", "text": "u"}]}, "contexts[1].doc_id", "unique"),
    ],
)
def test_input_contract_errors_name_the_field_and_the_fix(kwargs, field, fix):
    args = {"query": "How long do the batteries last?", "contexts": [{"doc_id": "d1", "text": "t"}],
            "language": "en", **kwargs}
    with pytest.raises(ContractError) as err:
        validate_input(args["query"], args["contexts"], args["language"])
    assert err.value.field == field
    assert fix in err.value.fix
    assert str(err.value).startswith(f"{field}: ") and "Fix: " in str(err.value)


def test_input_contract_accepts_a_valid_input():
    inp = validate_input("電池はどのくらい持ちますか?", [ContextDoc("j1", "電" * 2048, 0.9)], "ja")
    assert inp.language == "ja" and inp.contexts[0].doc_id == "j1"
    assert validate_input("q", [], "en").contexts == ()


GOOD = {"answer": "About 14 months.", "confidence_score": 0.9,
        "sources": [{"doc_id": "d1", "snippet": "last about 14 months"}], "status": "success"}


@pytest.mark.parametrize(
    ("reply", "field", "fix"),
    [
        ('{"answer": "x", "confidence_score": 0.5,', "reply", "JSON object only"),
        ("Here you go: " + json.dumps(GOOD), "reply", "no prose before or after"),
        (json.dumps({**GOOD, "confidence_score": 1.5}), "confidence_score", "from 0.0 to 1.0"),
        (json.dumps({**GOOD, "confidence_score": "high"}), "confidence_score", "from 0.0 to 1.0"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "status"}), "status", "add 'status'"),
        (json.dumps({**GOOD, "status": "ok"}), "status", "'success' or 'failure'"),
        (json.dumps({**GOOD, "answer": "", "status": "failure"}), "error_message", "say why"),
        (json.dumps({**GOOD, "sources": [{"doc_id": "d9", "snippet": "s"}]}), "sources[0].doc_id", "cite only"),
        (json.dumps({**GOOD, "sources": [{"document_id": "d1", "snippet": "s"}]}), "sources[0].document_id",
         "'doc_id'"),
        (json.dumps({**GOOD, "notes": "x"}), "reply", "use only"),
        ("[1, 2]", "reply", "one JSON object"),
    ],
)
def test_output_contract_errors_name_the_field_and_the_fix(reply, field, fix):
    check = check_output(reply, ["d1", "d2"])
    assert not check.ok
    hit = [v for v in check.violations if v.field == field]
    assert hit, check.messages()
    assert fix in hit[0].fix


def test_output_contract_accepts_valid_replies_and_reads_broken_ones_leniently():
    assert check_output(json.dumps(GOOD), ["d1"]).ok
    assert check_output("```json\n" + json.dumps(GOOD) + "\n```", ["d1"]).ok
    refusal = {"answer": NOT_FOUND["ja"], "confidence_score": 0.0, "sources": [], "status": "success"}
    assert check_output(json.dumps(refusal, ensure_ascii=False), []).ok
    cot = "1. Relevant passages: [d1] ...\n4. Final answer: About 14 months.\nFINAL JSON:\n" + json.dumps(GOOD)
    assert check_output(cot, ["d1"], cot=True).ok
    no_marker = check_output(json.dumps(GOOD), ["d1"], cot=True)
    assert no_marker.violations[0].field == "reply" and "FINAL JSON:" in no_marker.violations[0].fix
    assert lenient_answer(check_output("Sure: " + json.dumps(GOOD) + " Bye.", ["d1"])) == "About 14 months."
    assert is_refusal(" " + NOT_FOUND["en"]) and not is_refusal(NOT_FOUND["en"], "ja")


# --------------------------------------------------------------------------- prompt optimisation


def test_prompt_styles_render_the_input_and_the_fixed_phrase():
    s = next(s for s in SCENARIOS if s.language == "ja")
    inp = validate_input(s.query, s.contexts, s.language)
    versions = set()
    for style in STYLES:
        msgs = render(style, inp)
        text = msgs[-1]["content"]
        assert s.query in text and NOT_FOUND["ja"] in text and "Japanese" in text
        assert all(f"[doc_id: {c.doc_id}]" in text for c in s.contexts)
        versions.add(prompt_version(style))
    assert len(versions) == 3
    assert "FINAL JSON:" in render("cot", inp)[-1]["content"]


def test_scenarios_satisfy_the_input_contract_and_cover_every_kind():
    for s in SCENARIOS:
        validate_input(s.query, s.contexts, s.language)
    kinds = {s.kind for s in SCENARIOS}
    assert kinds == {"present", "multi_doc", "ambiguous", "long_context", "no_answer", "conflicting", "irrelevant"}
    assert {s.language for s in SCENARIOS} == {"en", "ja"}
    assert any(s.kind == "long_context" and approx_tokens(s.contexts[0].text) > 1000 for s in SCENARIOS)


def test_checks_on_one_reply():
    s = next(s for s in SCENARIOS if s.scenario_id == "s07-no-answer")
    made_up = {"answer": "It costs 249 euros.", "confidence_score": 0.8, "sources": [], "status": "success"}
    r = assess(s, json.dumps(made_up), cot=False)
    assert r.format_ok and not r.refused
    assert set(r.failure_modes) == {"refusal_failure", "hallucination"}
    assert set(r.unsupported_terms) == {"cost", "249", "euro"}
    ja = next(s for s in SCENARIOS if s.scenario_id == "s12-no-answer-ja")
    english = {"answer": NOT_FOUND["en"], "confidence_score": 0.1, "sources": [], "status": "success"}
    r = assess(ja, json.dumps(english), cot=False)
    assert r.refused and not r.refused_correctly and "wrong_language" in r.failure_modes
    good = next(s for s in SCENARIOS if s.scenario_id == "s03-multi-doc")
    reply = {"answer": good.reference, "confidence_score": 0.9, "status": "success",
             "sources": [{"doc_id": d, "snippet": p} for d, p in good.evidence]}
    r = assess(good, json.dumps(reply), cot=False)
    assert r.failure_modes == [] and r.utilisation == 1.0 and r.snippets_grounded == r.snippets_cited == 2


def test_prompt_optimisation_loop_logs_one_run_per_style(tmp_tracking):
    from mlflow.tracking import MlflowClient

    table = optimisation_loop(experiment="po-test")
    assert list(table["style"]) == list(STYLES)
    client = MlflowClient(tmp_tracking)
    runs = client.search_runs([client.get_experiment_by_name("po-test").experiment_id])
    assert len(runs) == 3
    by_style = {r.data.params["prompt.style"]: r for r in runs}
    assert set(by_style) == set(STYLES)
    for style, run in by_style.items():
        m, p = run.data.metrics, run.data.params
        assert p["simulation"] == "true" and p["generator"] == f"simulated:{style}"
        assert p["prompt.version"] == prompt_version(style)
        for name in ("format/adherence_rate", "refusal/correct_rate", "refusal/false_refusal_rate",
                     "context_utilisation/mean", "hallucination/flag_rate", "word_recall/mean", "correctness/mean"):
            assert name in m, (style, name)
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "prompt_eval")}
        assert {"prompt_eval/scenarios.json", "prompt_eval/error_analysis.md"} <= artifacts
    # the scripted simulation: zero-shot breaks the format once and fails refusals; CoT refuses correctly
    zs, cot = by_style["zero_shot"].data.metrics, by_style["cot"].data.metrics
    assert zs["format/adherence_rate"] == pytest.approx(11 / 12)
    assert zs["refusal/correct_rate"] == pytest.approx(1 / 4)
    assert cot["format/adherence_rate"] == 1.0 and cot["refusal/correct_rate"] == 1.0
    assert cot["refusal/false_refusal_rate"] == pytest.approx(1 / 8)


def test_sweep_checks_the_llm_input_contract_before_running(tmp_path):
    with pytest.raises(ValueError, match="at most 5 contexts"):
        sweep([Variant(64, 0, 8, False, "cot")], generator=FakeBackend(), tracking_uri=f"sqlite:///{tmp_path}/x.db")


def test_a_generator_that_fails_on_the_first_question_stops_the_run_early():
    from experiments.prompt_optimisation import run_iteration
    from mlflow_ragjudge.backends import BackendError, ErrorKind

    down = FakeBackend([BackendError(ErrorKind.PERMANENT, "model not found", status=404)])
    rag = ToyRAG(load_sample_corpus(), generator=LLMGenerator(down, cache=False))
    with pytest.raises(RuntimeError, match="first question.*model not found"):
        rag.run(load_sample_questions())
    assert len(down.requests) == 1
    with pytest.raises(RuntimeError, match="first scenario.*model not found"):
        run_iteration(1, "zero_shot", generator=down, judge=None)


def test_aurora_retrieval_dataset_finds_the_needle_in_the_long_log():
    from experiments.scenarios import retrieval_dataset

    corpus, rows = retrieval_dataset()
    assert len(rows) == 7 and all(set(r["relevant_doc_ids"]) <= set(corpus) for r in rows)
    question = "Which part replaced the anemometer bearing?"
    one = ToyRAG(corpus, chunk_size=64, overlap=16, top_k=1).answer(question)
    assert one.retrieved_doc_ids == ["AUR-09"]
    assert one.answer.endswith("replaced with part")  # the chunk boundary cuts the needle sentence ...
    three = ToyRAG(corpus, chunk_size=64, overlap=16, top_k=3).answer(question)
    assert three.answer == (  # ... which the overlapping next chunk holds whole, and that copy is preferred
        "Log entry 58: the anemometer bearing was replaced with part AB-7731 after it squealed."
    )
