"""Human-calibrated estimates in runs: ``human_labels`` in the evaluator, ``label-sample`` / ``calibrate`` after a
run or a sweep, human feedback on ``mlflow.genai`` traces and review queues; bad labels refused before any call."""

from __future__ import annotations

import json
import zlib

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.entities import AssessmentSource
from mlflow.tracking import MlflowClient

import mlflow_ragjudge as rj
from mlflow_ragjudge import InputError, evaluate_frame
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.core.errors import CalibrationWarning
from mlflow_ragjudge.engine.ppi import ppi_mean, ppi_paired_diff
from mlflow_ragjudge.workflows.calibration import CALIBRATED_COLUMNS, calibrate, label_sample
from mlflow_ragjudge.workflows.calibration_traces import calibrate_traces, queue_for_review
from mlflow_ragjudge.workflows.compare import COMPARISON_FILE

N = 90


def _frame(n: int = N, labelled_every: int = 2, seed: int = 0) -> pd.DataFrame:
    """Questions with a correct answer for about 60% of rows, human correctness labels (1..5) on every
    ``labelled_every``-th row (a systematic sample, independent of the answers), empty elsewhere."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        good = rng.random() < 0.6
        rows.append({"question": f"Which town keeps archive {i}?", "reference": f"Town{i}",
                     "answer": f"Archive {i} is kept in Town{i}." if good else "Somewhere up north, I believe.",
                     "human_correctness": (float(rng.choice([4, 5])) if good else float(rng.choice([1, 2])))
                     if i % labelled_every == 0 else None})
    return pd.DataFrame(rows)


def _reference(judge: np.ndarray, human: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float]:
    """ppi_py's PPI++ interval and point estimate (the reference implementation), on rows with a judge score."""
    ppi_py = pytest.importorskip("ppi_py")
    scored = ~np.isnan(judge)
    lab = scored & ~np.isnan(human)
    unl = scored & np.isnan(human)
    low, high = ppi_py.ppi_mean_ci(human[lab], judge[lab], judge[unl], alpha=alpha, lam=None)
    point = ppi_py.ppi_mean_pointestimate(human[lab], judge[lab], judge[unl], lam=None)
    return float(np.ravel(point)[0]), float(np.ravel(low)[0]), float(np.ravel(high)[0])


# --------------------------------------------------------------------------- the evaluator


@pytest.mark.slow
@pytest.mark.inprocess_judge
def test_evaluator_run_with_human_labels_logs_the_calibrated_mean_equal_to_the_reference(fake_llm, judge,
                                                                                          tmp_tracking):
    df = _frame()
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=df, predictions="answer", targets="reference", model_type="rag",
                               evaluators="ragjudge",
                               evaluator_config={"judge": judge, "metrics": ["correctness"], "cache": False,
                                                 "context_mode": "none",
                                                 "human_labels": {"correctness": "human_correctness"}})
    out = rj.load_output(run.info.run_id)
    logged = MlflowClient().get_run(run.info.run_id).data.metrics
    table = out.table
    status = table["correctness/status"].astype(str)
    judge_scores = pd.to_numeric(table["correctness/score"], errors="coerce").where(status == "scored")
    human = pd.to_numeric(table["human_correctness"], errors="coerce").to_numpy(dtype=float)
    point, low, high = _reference(judge_scores.to_numpy(dtype=float), human)
    assert logged["correctness/ppi_mean"] == pytest.approx(point, abs=1e-8)
    assert logged["correctness/ppi_ci_low"] == pytest.approx(low, abs=1e-8)
    assert logged["correctness/ppi_ci_high"] == pytest.approx(high, abs=1e-8)
    labelled_scored = int((~np.isnan(human) & judge_scores.notna().to_numpy()).sum())
    assert logged["correctness/n_labelled"] == labelled_scored >= 30
    assert "correctness/mean" in logged  # the judge-only mean stays beside it
    # the per-row table carries the stable row id and the labels; meta-evaluation uses the mapping
    assert table["row_id"].is_unique and "human_correctness" in table
    assert set(out.meta["human"]) == {"human_correctness"} and set(out.meta["metric"]) == {"correctness"}
    assert logged["meta/correctness/human_correctness/no_abstentions/n"] == labelled_scored


def test_human_labels_never_reach_a_judge_prompt(fake_llm, judge):
    df = _frame(n=40, labelled_every=1)
    df["human_correctness"] = [5.0 - (i % 5) for i in range(len(df))]  # labels that differ from row to row
    config = {"judge": judge, "metrics": ["correctness"], "cache": False, "context_mode": "none"}
    evaluate_frame(df.drop(columns=["human_correctness"]), config)
    without = sorted(json.dumps(r.body, sort_keys=True) for r in fake_llm.requests)
    fake_llm.requests.clear()
    out = evaluate_frame(df, {**config, "human_labels": {"correctness": "human_correctness"}})
    with_labels = sorted(json.dumps(r.body, sort_keys=True) for r in fake_llm.requests)
    assert without == with_labels and len(without) == 40  # the same requests, byte for byte
    assert "correctness/ppi_mean" in out.metrics


def test_row_ids_are_stable_across_variants_and_repeats():
    a = _frame(n=35, labelled_every=1)
    b = a.assign(answer="another answer")  # another variant's answers to the same questions
    b = pd.concat([b, b.iloc[[0]]], ignore_index=True)  # the first question asked twice
    ta = evaluate_frame(a, judge="offline:/lexical", metrics=["correctness"]).table
    tb = evaluate_frame(b, judge="offline:/lexical", metrics=["correctness"]).table
    assert list(tb["row_id"][:35]) == list(ta["row_id"])
    assert tb["row_id"].iloc[35] == ta["row_id"].iloc[0] + "-2"
    own = evaluate_frame(a.assign(row_id=[f"id{i}" for i in range(35)]), judge="offline:/lexical",
                         metrics=["correctness"]).table
    assert list(own["row_id"]) == [f"id{i}" for i in range(35)]


def _set_label(df: pd.DataFrame, row: int, value: object) -> None:
    df["human_correctness"] = df["human_correctness"].astype(object)
    df.loc[row, "human_correctness"] = value


@pytest.mark.parametrize("change, message", [
    (lambda df, cfg: cfg.update(human_labels={"correctness": "nope"}), "'nope', which is not a column"),
    (lambda df, cfg: cfg.update(human_labels={"faithfulness": "human_correctness"}),
     "human_labels names metric 'faithfulness', which this run does not produce"),
    (lambda df, cfg: _set_label(df, 4, 7.0), "holds 7, off the correctness scale 1..5"),
    (lambda df, cfg: _set_label(df, 6, "good"), "holds 'good'; labels must be numbers"),
    (lambda df, cfg: df.__setitem__("human_correctness", df["human_correctness"].where(df.index < 40)),
     "labels 20 row(s) of 90; a calibrated interval needs at least 30"),
    (lambda df, cfg: cfg.update(human_labels={"correctness": 3}), "human_labels="),
])
def test_bad_human_labels_are_refused_before_any_judge_call(fake_llm, judge, change, message):
    df = _frame()
    cfg = {"judge": judge, "metrics": ["correctness"], "cache": False, "context_mode": "none",
           "human_labels": {"correctness": "human_correctness"}}
    change(df, cfg)
    with pytest.raises((InputError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        evaluate_frame(df, cfg)
    assert fake_llm.requests == []


def test_a_six_level_not_sure_label_is_no_label_and_is_counted():
    df = _frame(n=80, labelled_every=1)
    df.loc[:9, "human_correctness"] = 0.0  # "not sure"
    out = evaluate_frame(df, judge="offline:/lexical", metrics=["correctness"],
                         human_labels={"correctness": "human_correctness"})
    cal = out.config["calibration"]["correctness"]
    assert cal["n_human_not_sure"] == 10
    assert cal["n_labelled"] + cal["n_excluded_labelled"] == 70


def test_labels_chosen_by_the_judges_verdict_are_warned_about():
    df = _frame(n=120, labelled_every=1)
    good = df["answer"].str.contains("Town")
    keep = good | (np.arange(len(df)) % 6 == 0)  # every correct answer labelled, few of the others
    df["human_correctness"] = df["human_correctness"].where(keep)
    with pytest.warns(CalibrationWarning, match="do not look like a random sample"):
        out = evaluate_frame(df, judge="offline:/lexical", metrics=["correctness"],
                             human_labels={"correctness": "human_correctness"})
    assert "warning" in out.config["calibration"]["correctness"]


@pytest.mark.slow
def test_cli_evaluate_with_human_labels(tmp_path, tmp_tracking, capsys):
    path = tmp_path / "data.csv"
    _frame().to_csv(path, index=False)
    code = main(["evaluate", str(path), "--metrics", "correctness", "--human-labels",
                 "correctness=human_correctness"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "correctness: calibrated by 45 human labels" in text
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    assert run.data.metrics["correctness/n_labelled"] == 45


# --------------------------------------------------------------------------- labels after a sweep


def _pipeline(question: str, *, quality: int, paraphrase: bool = False) -> dict:
    """A RAG system whose answer to question i is right for a fixed share ``quality`` of the questions; with
    ``paraphrase`` a right answer does not repeat the town's name (the lexical judge misses it, people do not)."""
    i = int(question.split()[-1].rstrip("?"))
    right = zlib.crc32(f"{quality}-{i}".encode()) % 100 < quality
    if right:
        text = f"It is in the town numbered {i}." if paraphrase else f"Archive {i} is kept in Town{i}."
    else:
        text = "Somewhere up north, I believe."
    return {"answer": text, "contexts": [f"Archive {i} is kept in Town{i}."]}


def _truth(answer: str) -> float:
    """What a person says: right answers (worded either way) 5, others 1."""
    return 5.0 if ("Town" in answer or "town numbered" in answer) else 1.0


def _sweep(n: int = 80):
    questions = pd.DataFrame({"question": [f"Which town keeps archive {i}?" for i in range(n)],
                              "reference": [f"Town{i}" for i in range(n)]})
    variants = [{"quality": 50, "paraphrase": False}, {"quality": 90, "paraphrase": True}]
    return rj.sweep(_pipeline, variants, questions, verbose=False,
                    evaluator_config={"judge": "offline:/lexical", "metrics": ["correctness"]})


def _fill(path, fn=_truth, only=None) -> pd.DataFrame:
    frame = pd.read_csv(path, dtype={"row_id": str, "run_id": str, "item_id": str})
    frame["correctness"] = [fn(a) if (only is None or only(k)) else None
                            for k, a in enumerate(frame["answer"].fillna(""))]
    frame.to_csv(path, index=False)
    return frame


@pytest.mark.slow
def test_a_sweep_labelled_after_the_run_shows_the_calibrated_difference(tmp_tracking, tmp_path):
    result = _sweep()
    parent = result.parent_run_id
    path = tmp_path / "labels.csv"
    sample = label_sample(parent, 40, seed=3, path=path)
    # the same 40 questions in both variants, shuffled together, blind to the judge
    assert len(sample) == 80 and sample.groupby("run_id")["row_id"].nunique().tolist() == [40, 40]
    assert set(sample.groupby("run_id")["row_id"].apply(frozenset)) == {frozenset(sample["row_id"])}
    assert not any("score" in c or "status" in c or "justification" in c for c in sample.columns)
    assert sample["correctness"].isna().all()
    assert list(sample["run_id"][:10]) != sorted(sample["run_id"][:10])  # variants interleaved
    labels = _fill(path)
    out = calibrate(parent, path)

    # the parent's comparison gains the calibrated difference, equal to PPI on the per-row differences
    table = mlflow.load_table(COMPARISON_FILE, run_ids=[parent])
    assert len(table) == 1 and set(CALIBRATED_COLUMNS) <= set(table.columns)
    row = table.iloc[0]
    base, variant = result.baseline, next(n for n in result.run_ids if n != result.baseline)
    outs = {n: rj.load_output(result.run_ids[n]) for n in result.run_ids}
    judge = {n: o.table.set_index("row_id")["correctness/score"].astype(float) for n, o in outs.items()}
    human = {n: labels[labels["run_id"] == result.run_ids[n]].set_index("row_id")["correctness"].astype(float)
             for n in result.run_ids}
    ids = list(judge[base].index)
    expected = ppi_paired_diff(judge[variant].reindex(ids), judge[base].reindex(ids),
                               human[variant].reindex(ids), human[base].reindex(ids))
    assert row["ppi_diff"] == pytest.approx(expected.mean, abs=1e-12)
    assert (row["ppi_ci_low"], row["ppi_ci_high"]) == pytest.approx((expected.ci_low, expected.ci_high), abs=1e-12)
    assert row["n_labelled"] == 40
    ppi_py = pytest.importorskip("ppi_py")
    d_judge = (judge[variant].reindex(ids) - judge[base].reindex(ids)).to_numpy()
    d_human = (human[variant].reindex(ids) - human[base].reindex(ids)).to_numpy()
    lab = ~np.isnan(d_human)
    low, high = ppi_py.ppi_mean_ci(d_human[lab], d_judge[lab], d_judge[~lab], alpha=0.05)
    assert (row["ppi_ci_low"], row["ppi_ci_high"]) == pytest.approx((low[0], high[0]), abs=1e-8)

    # the lexical judge misses the paraphrased right answers: it says the variant is worse, the labels say better
    assert row["mean_diff"] < 0 and row["ppi_diff"] > 0
    assert row["judge_conclusion"] == "worse" and row["calibrated_conclusion"] == "better"
    assert row["conclusions_agree"] is False or row["conclusions_agree"] == False  # noqa: E712 (from JSON)
    assert "DISAGREE" in out.summary()
    client = MlflowClient()
    assert client.get_run(parent).data.metrics["sweep/calibrated_disagreements"] == 1
    plots = [a.path for a in client.list_artifacts(parent, "ragjudge/plots")]
    assert "ragjudge/plots/calibrated_correctness.png" in plots
    # each variant's run has its calibrated mean and keeps its labels
    for name, rid in result.run_ids.items():
        metrics = client.get_run(rid).data.metrics
        est = out.estimates[name]["correctness"]
        assert metrics["correctness/ppi_mean"] == pytest.approx(est.mean)
        assert metrics["correctness/n_labelled"] == 40
        kept = mlflow.load_table("ragjudge/human_labels.json", run_ids=[rid])
        assert len(kept) == 40 and set(kept["row_id"]) == set(sample["row_id"])
        assert metrics["meta/correctness/human_labels/n"] == 40  # agreement of judge and humans on those rows
    # calibrating again replaces the comparison's calibrated columns instead of appending rows
    calibrate(parent, path)
    assert len(mlflow.load_table(COMPARISON_FILE, run_ids=[parent])) == 1


@pytest.mark.slow
def test_label_sample_and_calibrate_from_the_cli(tmp_tracking, tmp_path, capsys):
    result = _sweep(n=60)
    path = tmp_path / "labels.jsonl"
    assert main(["label-sample", result.parent_run_id, "--n", "35", "--seed", "2", "--out", str(path)]) == 0
    assert "70 rows to label" in capsys.readouterr().out
    frame = pd.read_json(path, lines=True, dtype=False)
    frame["correctness"] = [_truth(a) for a in frame["answer"]]
    frame.to_json(path, orient="records", lines=True)
    assert main(["calibrate", result.parent_run_id, "--labels", str(path), "--target-width", "1.0"]) == 0
    text = capsys.readouterr().out
    assert "calibrated difference" in text and "labels with the judge" in text


@pytest.mark.slow
@pytest.mark.parametrize("edit, message", [
    (lambda f: f.assign(row_id=f["row_id"].where(f.index != 0, "not-a-row")), "row id\\(s\\) \\['not-a-row'\\]"),
    (lambda f: f.assign(correctness=f["correctness"].where(f.index != 1, 9)), "Label 9 for 'correctness'"),
    (lambda f: f.assign(correctness=f["correctness"].astype(object).where(f.index != 1, "yes")), "'yes'"),
    (lambda f: f.assign(correctness=f["correctness"].where(f.index < 20)), "fewer than the 30"),
    (lambda f: f.assign(faithfulness=1.0), "'faithfulness', which is not a judged metric"),
    (lambda f: f.assign(run_id="0123456789abcdef"), "not variants of sweep"),
    (lambda f: f.drop(columns=["row_id"]), "no 'row_id' column"),
])
def test_bad_label_files_are_refused_and_nothing_is_logged(tmp_tracking, tmp_path, edit, message):
    result = _sweep(n=40)
    path = tmp_path / "labels.csv"
    label_sample(result.parent_run_id, 40, path=path)
    frame = _fill(path)
    with pytest.raises(InputError, match=message):
        calibrate(result.parent_run_id, edit(frame))
    for rid in result.run_ids.values():
        assert "correctness/ppi_mean" not in MlflowClient().get_run(rid).data.metrics


@pytest.mark.slow
def test_labels_outside_the_drawn_sample_are_warned_about(tmp_tracking, tmp_path):
    result = _sweep(n=80)
    path = tmp_path / "labels.csv"
    result.label_sample(35, seed=0, path=path)
    frame = pd.read_csv(path, dtype=str)
    extra = []
    for _name, rid in result.run_ids.items():  # a few rows the labeller picked by hand
        t = rj.load_output(rid).table
        for row_id, answer in zip(t["row_id"], t["answer"]):
            if row_id not in set(frame["row_id"]) and len(extra) < 6:
                extra.append({"run_id": rid, "row_id": row_id, "answer": answer})
    frame = pd.concat([frame, pd.DataFrame(extra)], ignore_index=True)
    frame["correctness"] = [_truth(a) for a in frame["answer"].fillna("")]
    with pytest.warns(CalibrationWarning, match="not in the random sample label-sample drew"):
        result.calibrate(frame)
    assert set(CALIBRATED_COLUMNS) <= set(result.comparison.columns)  # the sweep's result has them too


# --------------------------------------------------------------------------- mlflow.genai: traces


@pytest.mark.slow
def test_human_feedback_on_traces_calibrates_a_genai_run(tmp_tracking):
    rng = np.random.default_rng(0)
    truth = rng.integers(1, 6, size=70).astype(float)
    with mlflow.start_run() as run:
        for i in range(70):
            with mlflow.start_span(name="rag") as span:
                span.set_inputs({"question": f"q{i}"})
                span.set_outputs({"answer": f"a{i}"})
    traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list", flush=True)
    by_answer = {json.loads(t.data.response)["answer"]: t.info.trace_id for t in traces}
    judge, human = np.full(70, np.nan), np.full(70, np.nan)
    judge_src = AssessmentSource(source_type="LLM_JUDGE", source_id="openai:/gpt-4o-mini")
    for i in range(70):
        tid = by_answer[f"a{i}"]
        judge[i] = min(5.0, truth[i] + (i % 3 == 0))  # a lenient judge
        mlflow.log_feedback(trace_id=tid, name="correctness", value=judge[i], source=judge_src)
        if i % 2 == 0:  # labelled by a person, who changed their mind: the latest label counts
            mlflow.log_feedback(trace_id=tid, name="correctness", value=1.0,
                                source=AssessmentSource(source_type="HUMAN", source_id="bob"))
            mlflow.log_feedback(trace_id=tid, name="correctness", value=truth[i],
                                source=AssessmentSource(source_type="HUMAN", source_id="bob"))
            human[i] = truth[i]
    got = calibrate_traces(run.info.run_id, ["correctness"])["correctness"]
    expected = ppi_mean(judge, human)
    assert (got.mean, got.ci_low, got.ci_high) == pytest.approx((expected.mean, expected.ci_low, expected.ci_high))
    assert got.n_labelled == 35
    assert MlflowClient().get_run(run.info.run_id).data.metrics["correctness/ppi_mean"] == pytest.approx(got.mean)
    with pytest.raises(InputError, match="has a judge assessment named 'faithfulness'"):
        calibrate_traces(run.info.run_id, ["faithfulness"])


def test_review_queue_holds_a_random_sample_of_the_runs_traces(tmp_tracking):
    from mlflow.entities import AssessmentSource, AssessmentSourceType
    from mlflow.genai import review_queues

    with mlflow.start_run() as run:
        ids = []
        for i in range(12):
            with mlflow.start_span(name="rag") as span:
                span.set_inputs({"question": f"q{i}"})
            ids.append(span.trace_id)
    mlflow.flush_trace_async_logging()
    for i, trace_id in enumerate(ids):  # the judge's scores a queue needs (a metric without them is refused)
        mlflow.log_feedback(trace_id=trace_id, name="correctness", value=float(1 + i % 5),
                            source=AssessmentSource(source_type=AssessmentSourceType.LLM_JUDGE, source_id="j"))
    queue = queue_for_review(run.info.run_id, ["correctness"], n=5, seed=2)
    items = review_queues.list_review_queue_items(queue.queue_id)
    assert len(items) == 5
    assert len(queue.schema_ids) == 1
    sample = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/ragjudge/label_sample.json")
    assert sample["seed"] == 2 and len(sample["trace_ids"]) == 5


# --------------------------------------------------------------------------- labels that carry no variance


@pytest.mark.slow
def test_cli_calibrate_with_identical_labels_reports_the_exact_bound_and_warns(tmp_tracking, tmp_path, capsys):
    """Every labelled answer of both variants rated 5: each run's labels and the paired differences (all 0) carry
    no variance. Before, calibrate printed "[5.000, 5.000]" and "[+0.000, +0.000]" as 95 % intervals."""
    result = _sweep(n=60)
    path = tmp_path / "labels.csv"
    label_sample(result.parent_run_id, 40, seed=1, path=path)
    _fill(path, fn=lambda answer: 5.0)
    assert main(["calibrate", result.parent_run_id, "--labels", str(path)]) == 0
    text = capsys.readouterr().out
    assert "calibrated 5.000 [5.000, 5.000]" not in text and "+0.000 [+0.000, +0.000]" not in text
    share = 0.025 ** (1 / 40)
    assert f"[{5 - 4 * (1 - share):.3f}, 5.000]" in text  # each run: the exact bound on the scale 1..5
    assert f"[{-4 * (1 - share):+.3f}, {4 * (1 - share):+.3f}]" in text  # the paired difference's bound
    assert text.count("carry no variance") == 3  # the two runs and the one comparison
    assert "label differences are all 0" in text and "normal-approximation interval" in text
    out = calibrate(result.parent_run_id, path, log=False)
    for per in out.estimates.values():
        est = per["correctness"]
        assert est.interval == "exact_no_variance" and "carry no variance" in est.warning


@pytest.mark.slow
def test_cli_evaluate_with_identical_human_labels_warns(tmp_path, tmp_tracking, capsys):
    path = tmp_path / "data.csv"
    _frame().assign(human_correctness=lambda f: f["human_correctness"].where(f["human_correctness"].isna(), 4.0)
                    ).to_csv(path, index=False)
    code = main(["evaluate", str(path), "--judge", "offline:/lexical", "--metrics", "correctness",
                 "--human-labels", "correctness=human_correctness"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "correctness: calibrated by 45 human labels" in text
    assert "warning: The 45 human labels are all 4: they carry no variance" in text
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    assert run.data.metrics["correctness/ppi_ci_high"] > run.data.metrics["correctness/ppi_ci_low"]
