"""MLflow's own evaluation tools read our runs (MLflow 3.18): ``mlflow.genai.compare_evaluations`` pairs every row of
two ``ragjudge`` runs of the same questions and compares every metric, numerically, with the per-row table's values,
whichever path made the runs (``ragjudge evaluate``, ``mlflow.models.evaluate``, two sweep variants, two
``mlflow.genai.evaluate`` runs with our scorers); ``quality_criteria`` and ``pass_if`` see our scorers' numbers.
Skipped, saying why, on an MLflow without them."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

import mlflow_ragjudge as rj
from mlflow_ragjudge import load_output
from mlflow_ragjudge.adapters.scorers import Correctness, Faithfulness, LexicalOverlap, RetrievalMetrics
from mlflow_ragjudge.cli import main

HAS_COMPARE = hasattr(mlflow.genai, "compare_evaluations")
needs_compare = pytest.mark.skipif(not HAS_COMPARE, reason=f"MLflow {mlflow.__version__} has no "
                                   "mlflow.genai.compare_evaluations (new in 3.18)")
OFFLINE = "offline:/lexical"
METRICS = ["correctness", "lexical", "retrieval", "faithfulness"]

# eight rows; the first question is asked twice (with another reference): pairing on the question alone would be
# ambiguous, the rows' ids keep them apart
QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?", "When did Apollo 11 land on the Moon?",
             "What is the boiling point of water at sea level?", "Which planet is the largest?",
             "What is the capital of France?", "Who painted the Mona Lisa?", "What gas do plants absorb?"]
REFERENCES = ["Paris", "William Shakespeare", "1969", "100 degrees Celsius", "Jupiter", "Paris, on the Seine",
              "Leonardo da Vinci", "Carbon dioxide"]
GOOD = ["Paris is the capital of France.", "Hamlet was written by William Shakespeare.",
        "Apollo 11 landed in July 1969.", "Water boils at 100 degrees Celsius at sea level.",
        "Jupiter is the largest planet.", "Paris, which lies on the Seine.", "Leonardo da Vinci painted it.",
        "Plants absorb carbon dioxide."]
WORSE = ["Lyon is the capital of France.", "Hamlet was written by William Shakespeare.", "I do not know.",
         "Water boils at 90 degrees.", "Saturn is the largest planet.", "Paris.", "Leonardo da Vinci painted it.",
         "Plants absorb oxygen."]


def _frame(answers: list[str]) -> pd.DataFrame:
    return pd.DataFrame({
        "question": QUESTIONS, "answer": answers, "reference": REFERENCES,
        "contexts": [[f"{r} is the answer to: {q}", "An unrelated passage about rivers."]
                     for q, r in zip(QUESTIONS, REFERENCES)],
        "retrieved_doc_ids": [[f"d{i}", "x"] if i % 3 else ["x", f"d{i}"] for i in range(len(QUESTIONS))],
        "relevant_doc_ids": [[f"d{i}"] for i in range(len(QUESTIONS))],
    })


def _experiment(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _table_values(run_id: str) -> dict[tuple[str, str], float]:
    """(trace id, metric) -> the per-row table's value, through each trace's ``ragjudge.row``."""
    table = load_output(run_id).table
    eid = MlflowClient().get_run(run_id).info.experiment_id
    traces = mlflow.search_traces(run_id=run_id, locations=[eid], return_type="list")
    out = {}
    for t in traces:
        i = int(t.info.trace_metadata["ragjudge.row"])
        for col in table.columns:
            if col.endswith("/score"):
                v = table[col].iloc[i]
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    out[(t.info.trace_id, col[: -len("/score")])] = float(v)
    return out


def _check_pairs_every_row(candidate: str, baseline: str, n: int, from_table: bool = True) -> Any:
    result = mlflow.genai.compare_evaluations(candidate, baseline)
    assert len(result.paired_rows) == n and not result.unpaired_baseline_trace_ids
    assert {r["paired_on"] for r in result.paired_rows} == {"eval_request_id"}
    if from_table:
        base, cand = _table_values(baseline), _table_values(candidate)
        metrics = {m for _, m in base} & {m for _, m in cand}
        assert set(result.scorers) == metrics, set(result.scorers) ^ metrics  # every metric, none missing
        for row in result.paired_rows:
            for name, s in row["scores"].items():  # the same numbers as the per-row tables
                assert s["baseline"] == pytest.approx(base[(row["baseline_trace_id"], name)])
                assert s["candidate"] == pytest.approx(cand[(row["candidate_trace_id"], name)])
            # a metric is left out of a row only where a run has no number for it (an abstention, a failure)
            for name in metrics - set(row["scores"]):
                assert ((row["baseline_trace_id"], name) not in base or (row["candidate_trace_id"], name) not in cand)
    for name, comparison in result.scorers.items():
        assert comparison.n_paired >= 1 and comparison.diff is not None, name
    return result


@needs_compare
def test_compare_evaluations_pairs_two_cli_runs(tmp_tracking, tmp_path):
    exp = _experiment("cli-compare")
    runs = []
    for name, answers in (("good", GOOD), ("worse", WORSE)):
        path = tmp_path / f"{name}.jsonl"
        _frame(answers).to_json(path, orient="records", lines=True)
        assert main(["evaluate", str(path), "--judge", OFFLINE, "--metrics", ",".join(METRICS), "--experiment", exp,
                     "--run-name", name, "--tracking-uri", tmp_tracking, "--no-cache"]) == 0
        runs.append(MlflowClient().search_runs([mlflow.get_experiment_by_name(exp).experiment_id],
                                               f"tags.mlflow.runName = '{name}'")[0].info.run_id)
    result = _check_pairs_every_row(runs[1], runs[0], len(QUESTIONS))
    assert {"correctness", "faithfulness", "word_recall", "rougeL", "mrr"} <= set(result.scorers)
    assert result.scorers["correctness"].diff < 0  # the worse answers are worse


@needs_compare
def test_compare_evaluations_pairs_two_mlflow_models_evaluate_runs(tmp_tracking):
    runs = []
    for answers in (GOOD, WORSE):
        with mlflow.start_run() as run:
            mlflow.models.evaluate(data=_frame(answers), predictions="answer", targets="reference", model_type="rag",
                                   evaluators="ragjudge",
                                   evaluator_config={"judge": OFFLINE, "metrics": METRICS, "cache": False})
        runs.append(run.info.run_id)
    _check_pairs_every_row(runs[1], runs[0], len(QUESTIONS))


@needs_compare
def test_compare_evaluations_pairs_two_sweep_variants(tmp_tracking):
    by_question = {q: (g, w) for q, g, w in zip(QUESTIONS, GOOD, WORSE)}

    def pipeline(question: str, quality: str) -> dict[str, Any]:
        g, w = by_question[question]
        return {"answer": g if quality == "good" else w, "contexts": [f"Passage on {question}"]}

    data = _frame(GOOD).drop(columns=["answer", "contexts", "retrieved_doc_ids", "relevant_doc_ids"])
    data = data.drop_duplicates("question").reset_index(drop=True)  # a sweep asks each question once
    result = rj.sweep(pipeline, {"quality": ["good", "worse"]}, data,
                      evaluator_config={"judge": OFFLINE, "metrics": ["correctness", "lexical"], "cache": False},
                      experiment=_experiment("sweep-compare"), plots=False)
    base, cand = list(result.run_ids.values())
    compared = _check_pairs_every_row(cand, base, len(data))
    assert compared.scorers["correctness"].diff < 0


@needs_compare
def test_compare_evaluations_pairs_two_genai_evaluate_runs_with_our_scorers(tmp_tracking):
    def data(answers: list[str]) -> list[dict[str, Any]]:
        frame = _frame(answers)
        return [{"inputs": {"question": r.question, "row": i},
                 "outputs": {"answer": r.answer, "contexts": r.contexts, "retrieved_doc_ids": r.retrieved_doc_ids},
                 "expectations": {"expected_response": r.reference, "relevant_doc_ids": r.relevant_doc_ids}}
                for i, r in enumerate(frame.itertuples())]

    scorers = [Correctness(judge=OFFLINE, name="correctness"), Faithfulness(judge=OFFLINE), LexicalOverlap(),
               RetrievalMetrics(ks=(1, 2))]
    base = mlflow.genai.evaluate(data=data(GOOD), scorers=scorers)
    cand = mlflow.genai.evaluate(data=data(WORSE), scorers=scorers)
    result = _check_pairs_every_row(cand.run_id, base.run_id, len(QUESTIONS), from_table=False)
    assert {"correctness", "faithfulness_offline", "word_recall", "rougeL", "mrr"} <= set(result.scorers)
    assert result.scorers["correctness"].value_type == "numeric"  # levels as numbers, not categories
    assert result.scorers["correctness"].diff == pytest.approx(
        cand.metrics["correctness/mean"] - base.metrics["correctness/mean"], abs=0.6)


def _faithfulness_rows(answers: list[str]) -> list[dict[str, Any]]:
    # no expectations: MLflow's EvaluationResult.passed also asks an expectation to pass (an expected_response is no
    # yes/no rating), so an evaluation with a reference cannot pass there (docs/mlflow.md)
    return [{"inputs": {"question": q}, "outputs": {"answer": a, "contexts": [f"{r} is the answer to: {q}"]}}
            for q, a, r in zip(QUESTIONS, answers, REFERENCES)]


@pytest.mark.slow
def test_pass_if_decides_evaluation_result_passed(tmp_tracking):
    def scorer() -> Faithfulness:
        return Faithfulness(judge=OFFLINE, name="faithfulness", pass_if=lambda v: v >= 0.5)

    ok = mlflow.genai.evaluate(data=_faithfulness_rows(REFERENCES), scorers=[scorer()])
    assert ok.passed, ok.reason
    bad = mlflow.genai.evaluate(data=_faithfulness_rows(["Zebras sleep standing up in the savanna."] * 8),
                                scorers=[scorer()])
    assert not bad.passed and "faithfulness" in bad.reason


@pytest.mark.skipif(not HAS_COMPARE, reason=f"MLflow {mlflow.__version__} has no quality_criteria (new in 3.18)")
def test_quality_criteria_read_our_scorers_means(tmp_tracking):
    ok = mlflow.genai.evaluate(data=_faithfulness_rows(REFERENCES), scorers=[Faithfulness(judge=OFFLINE,
                                                                                          name="faithfulness")],
                               quality_criteria="faithfulness >= 0.5")
    tags = MlflowClient().get_run(ok.run_id).data.tags
    assert any("faithfulness/mean" in v for k, v in tags.items() if "criteria" in k.lower()), tags


def test_row_traces_carry_the_row_id_as_the_evaluation_request_id(tmp_tracking):
    """What compare_evaluations (and MLflow's evaluation UI) pair rows on: the row's stable id, so that a question
    asked twice stays two rows."""
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=_frame(GOOD), predictions="answer", targets="reference", model_type="rag",
                               evaluators="ragjudge", evaluator_config={"judge": OFFLINE, "metrics": ["lexical"]})
    table = load_output(run.info.run_id).table
    traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list")
    ids = {t.info.tags["mlflow.eval.requestId"]: int(t.info.trace_metadata["ragjudge.row"]) for t in traces}
    assert len(ids) == len(QUESTIONS) == len(set(json.dumps(q) for q in QUESTIONS)) + 1
    assert all(str(table["row_id"].iloc[i]) == rid for rid, i in ids.items())
