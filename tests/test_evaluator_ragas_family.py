"""Faithfulness and the RAGAS family through the evaluator, mlflow.models.evaluate, dry_run and the CLI."""

from __future__ import annotations

import json
import re

import mlflow
import pandas as pd
import pytest
from fakellm import Reply
from mlflow.tracking import MlflowClient

from mlflow_ragjudge import InputError, evaluate_frame
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.llm.backends.fake import hashed_embedding


def router(req):
    """Answers every judge prompt of the family, deterministically."""
    if req.api == "openai_embeddings":
        return None  # the server's default: a hashed bag-of-words vector per input
    text = req.last_user_text
    if "Break the TEXT into claims" in text:
        if "I don't know" in text:
            return {"statements": []}
        return {"statements": ["claim one.", "claim two."]}
    if "Decide for each numbered CLAIM" in text:
        return {"verdicts": [{"claim": 1, "reason": "stated", "verdict": "supported"},
                             {"claim": 2, "reason": "absent", "verdict": "unsupported"}]}
    if "The numbered PASSAGES were retrieved" in text:
        n = len(re.findall(r'^<passage-[0-9a-f]{8} n="\d+">$', text, re.M))  # each passage in its own fence
        return {"verdicts": [{"passage": i, "reason": "r", "relevant": i == 2} for i in range(1, n + 1)]}
    if "The numbered STATEMENTS come from the reference" in text:
        return {"verdicts": [{"statement": 1, "reason": "found", "attributed": True},
                             {"statement": 2, "reason": "missing", "attributed": False}]}
    if "numbered sentences" in text:
        return {"sentences": [1], "insufficient_information": False}
    if "Write 3 different questions" in text or "different questions that this response answers" in text:
        return {"questions": ["What is tested here?"] * 3, "noncommittal": False}
    if "Judge how correct the RESPONSE is" in text:
        return "Feedback: fine [RESULT] 4"
    return Reply.error(400, f"unexpected prompt: {text[:60]}")


@pytest.fixture
def judge_handler():
    return router


def embed(texts):
    return [hashed_embedding(t) for t in texts]


@pytest.fixture
def df():
    return pd.DataFrame({
        "question": ["What is tested here?", "What is X?"],
        "answer": ["The evaluator is tested. It runs.", "I don't know."],
        "reference": ["The evaluator. It is tested.", "X is a letter. It is the 24th."],
        "contexts": [["passage A.", "passage B.", "passage C."], ["passage D. Another sentence."]],
        "retrieved_doc_ids": [["a", "b"], ["c"]],
        "relevant_doc_ids": [["b"], ["z"]],
    })


FAMILY = ["faithfulness", "answer_relevancy", "context_precision", "context_recall", "context_relevance"]


def test_family_through_mlflow_evaluate(fake_llm, judge_uri, df, tmp_tracking):
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=df, predictions="answer", targets="reference", model_type="rag",
                               evaluators="ragjudge",
                               evaluator_config={"judge": judge_uri, "metrics": FAMILY, "cache": False,
                                                 "embeddings": embed})
    m = MlflowClient().get_run(run.info.run_id).data.metrics
    # row 0: 1 of 2 claims supported; row 1: "I don't know" has no claims -> abstained, never 0 or 1
    assert m["faithfulness/mean"] == 0.5
    assert m["faithfulness/abstain_rate"] == 0.5 and m["faithfulness/count"] == 2
    # only passage 2 relevant: AP = (1/2 * 1) / 1 for row 0; row 1 has one passage, not relevant -> 0
    assert m["context_precision/mean"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["context_recall/mean"] == 0.5
    # the generated questions equal row 0's question (cosine 1); row 1's differ
    q = embed(["What is tested here?", "What is X?"])
    other = sum(a * b for a, b in zip(q[0], q[1]))
    assert m["answer_relevancy/mean"] == pytest.approx((1.0 + other) / 2)
    assert "context_relevance/mean" in m
    params = MlflowClient().get_run(run.info.run_id).data.params
    versions = json.loads(params["ragjudge.prompt_versions"])
    assert {"faithfulness", "statements", "context_precision", "context_recall", "context_relevance",
            "answer_relevancy"} <= set(versions)
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id,
                                                artifact_path="ragjudge/eval_results_table.json")
    table = json.load(open(local))
    row0 = dict(zip(table["columns"], table["data"][0]))
    claims = json.loads(row0["faithfulness/claims"])
    assert [c["supported"] for c in claims] == [True, False] and claims[1]["reason"] == "absent"
    assert row0["faithfulness/status"] == "scored"


def test_calls_per_row_faithfulness_at_most_two_and_precision_one(fake_llm, judge_uri, df):
    evaluate_frame(df.iloc[:1], judge=judge_uri, metrics=["faithfulness", "context_precision"], cache=False)
    prompts = [r.last_user_text for r in fake_llm.requests]
    assert sum("claims" in p and "Break the TEXT" in p for p in prompts) == 1
    assert sum("Decide for each numbered CLAIM" in p for p in prompts) == 1
    assert sum("The numbered PASSAGES" in p for p in prompts) == 1  # 3 chunks, one call
    assert fake_llm.request_count == 3


def test_reference_statements_extracted_once_for_recall(fake_llm, judge_uri, df):
    out = evaluate_frame(df, judge=judge_uri, metrics=["context_recall", "faithfulness"], cache=False)
    extractions = [r.last_user_text for r in fake_llm.requests if "Break the TEXT" in r.last_user_text]
    # one extraction per distinct text: 2 references + 2 answers, each exactly once
    assert len(extractions) == 4 and len(set(extractions)) == 4
    assert out.metrics["context_recall/mean"] == 0.5


def test_dry_run_estimates_without_calls(fake_llm, judge_uri, df):
    out = evaluate_frame(df, judge=judge_uri, metrics=["correctness", *FAMILY], embeddings=embed, dry_run=True)
    assert fake_llm.request_count == 0
    est = out.table.set_index("metric")
    assert est.loc["correctness", "calls"] == 2
    assert est.loc["faithfulness", "calls"] <= 4 and est.loc["context_precision", "calls"] == 2
    assert est.loc["answer_relevancy", "calls"] == 2
    assert out.metrics["estimate/total/calls"] == est["calls"].sum()
    assert out.metrics["estimate/total/input_tokens"] > 0
    assert out.config["dry_run"] is True


def test_faithfulness_against_gold_documents(fake_llm, judge_uri, df):
    gold = df.assign(gold_documents=[["gold one."], ["gold two."]])
    evaluate_frame(gold, judge=judge_uri, metrics=["faithfulness"], faithfulness_evidence="gold", cache=False)
    verify = [r.last_user_text for r in fake_llm.requests if "Decide for each numbered CLAIM" in r.last_user_text]
    assert verify and "gold one." in verify[0] and "passage A." not in verify[0]
    with pytest.raises(InputError, match="gold_documents"):
        evaluate_frame(df, judge=judge_uri, metrics=["faithfulness"], faithfulness_evidence="gold")


def test_faithfulness_only_on_retrieval_hits(fake_llm, judge_uri, df):
    out = evaluate_frame(df, judge=judge_uri, metrics=["faithfulness"], faithfulness_require_retrieval_hit=True,
                         cache=False)
    res = out.results["faithfulness"]
    assert res[0].status.value == "scored" and res[1].reason == "retrieval_miss"


def test_default_metrics_cover_the_family_when_a_judge_is_given(fake_llm, judge_uri, df):
    out = evaluate_frame(df, judge=judge_uri, cache=False, embeddings=embed, bertscore=False)
    assert set(out.config["metrics_run"]) >= {"correctness", "lexical", "retrieval", *FAMILY}


def test_answer_relevancy_without_embeddings_is_a_clear_error(fake_llm, judge_uri, df, monkeypatch):
    import mlflow_ragjudge.metrics.lexical as lexical

    def unavailable(*a, **k):
        raise lexical.LocalModelUnavailable("no model here", "pip install 'mlflow-ragjudge[local]'")

    monkeypatch.setattr(lexical.LocalEmbedder, "load", classmethod(lambda cls, *a, **k: unavailable()))
    with pytest.raises(InputError, match="needs embeddings"):
        evaluate_frame(df, judge=judge_uri, metrics=["answer_relevancy"])
    out = evaluate_frame(df, judge=judge_uri, cache=False, bertscore=False)  # by default: skipped with the reason
    assert "answer_relevancy" in out.skipped and "answer_relevancy" not in out.config["metrics_run"]
    assert fake_llm.request_count > 0


def test_embeddings_from_the_providers_api(fake_llm, judge_uri, df):
    out = evaluate_frame(df.iloc[:1], judge=judge_uri, metrics=["answer_relevancy"], cache=False,
                         embeddings=f"openai:/embedder?base_url={fake_llm.openai_base_url}")
    assert any(r.api == "openai_embeddings" for r in fake_llm.requests)
    res = out.results["answer_relevancy"][0]
    assert res.status.value == "scored", (res.reason, res.rationale)


def test_cli_estimate(fake_llm, judge_uri, df, tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    df.to_json(path, orient="records", lines=True)
    assert main(["estimate", str(path), "--judge", judge_uri, "--metrics", "correctness,faithfulness"]) == 0
    out = capsys.readouterr().out
    assert "faithfulness" in out and "calls" in out and "total" in out
    assert fake_llm.request_count == 0


def test_family_as_genai_scorers(fake_llm, judge_uri, tmp_tracking):
    from mlflow_ragjudge.adapters.scorers import ContextPrecision, Faithfulness

    data = [
        {"inputs": {"question": "What is tested here?"},
         "outputs": {"answer": "The evaluator is tested.", "contexts": ["passage A.", "passage B."]},
         "expectations": {"expected_response": "The evaluator."}},
        {"inputs": {"question": "What is X?"}, "outputs": {"answer": "I don't know.", "contexts": ["passage D."]},
         "expectations": {"expected_response": "X is a letter."}},
    ]
    result = mlflow.genai.evaluate(data=data, scorers=[Faithfulness(judge_uri, cache=False),
                                                       ContextPrecision(judge_uri, cache=False)])
    assert result.metrics["faithfulness/mean"] == 0.5  # the refusal abstains: not a number
    assert result.metrics["context_precision/mean"] == pytest.approx(0.25)
    fb = Faithfulness(judge_uri, cache=False)(inputs={"question": "q"}, outputs={"answer": "I don't know."},
                                              expectations={})
    assert fb.error.error_code == "invalid_input" and "contexts" in fb.error.error_message
    refusal = Faithfulness(judge_uri, cache=False)(inputs="q", outputs={"answer": "I don't know.",
                                                                         "contexts": ["c."]})
    assert refusal.value is None and refusal.metadata["status"] == "abstained"


def test_malformed_and_mismatched_verdicts_fail_rows_not_the_run(fake_llm, judge_uri, df, tmp_path, capsys,
                                                                  tmp_tracking):
    def broken(req):
        text = req.prompt_text
        if "Decide for each numbered CLAIM" in text:
            if "could not be read" in req.last_user_text:  # the re-ask gets a list one verdict short
                return {"verdicts": [{"claim": 1, "reason": "ok", "verdict": "supported"}]}
            return '{"verdicts": [{"claim": 1, "reason": "cut off'  # truncated JSON
        return router(req)

    fake_llm.set_handler(broken)
    path = tmp_path / "d.jsonl"
    df.to_json(path, orient="records", lines=True)
    uri = judge_uri
    # half the rows failed: the run completes and is logged, and the CLI says so with exit code 3
    assert main(["evaluate", str(path), "--judge", uri, "--metrics", "faithfulness", "--no-cache"]) == 3
    captured = capsys.readouterr()
    assert "FAILING" in captured.out and "'faithfulness' failed on 1 of 2 rows" in captured.err
    run = MlflowClient().search_runs([mlflow.get_experiment_by_name("Default").experiment_id])[0]
    assert run.data.metrics["faithfulness/error_rate"] == 0.5  # row 0 failed; row 1 (refusal) abstained
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id,
                                                artifact_path="ragjudge/eval_results_table.json")
    table = json.load(open(local))
    row0 = dict(zip(table["columns"], table["data"][0]))
    assert row0["faithfulness/status"].startswith("failed:") and row0["faithfulness/score"] is None
    transcripts = mlflow.artifacts.download_artifacts(run_id=run.info.run_id,
                                                      artifact_path="ragjudge/judge_transcripts.jsonl")
    raws = [json.loads(line)["raw_reply"] for line in open(transcripts)]
    assert any(r and r.startswith('{"verdicts": [{"claim": 1, "reason": "cut off') for r in raws)


def test_usage_per_metric_is_logged(fake_llm, judge_uri, df):
    out = evaluate_frame(df.iloc[:1], judge=judge_uri, metrics=["faithfulness", "context_precision"], cache=False)
    assert out.metrics["judge/faithfulness/requests"] == 2 and out.metrics["judge/context_precision/requests"] == 1
    assert out.metrics["judge/faithfulness/requests_per_row"] == 2
    assert out.metrics["judge/faithfulness/input_tokens"] > 0
    assert out.config["usage_by_metric"]["context_precision"]["cache_hits"] == 0
    again = evaluate_frame(df.iloc[:1], judge=judge_uri, metrics=["context_precision"])  # cache on: miss
    assert again.metrics["judge/context_precision/requests"] == 1
    third = evaluate_frame(df.iloc[:1], judge=judge_uri, metrics=["context_precision"])  # now a hit
    assert third.metrics["judge/context_precision/requests"] == 0
    assert third.metrics["judge/context_precision/cache_hits"] == 1
