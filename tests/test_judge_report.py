"""``ragjudge judge-report`` / ``judge_report``: the judge against people on runs whose numbers are worked out by hand
here, and on NQ301's recorded GPT-4 verdicts (skipped without ../shared/data)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest

from mlflow_ragjudge.adapters.run_log import log_output
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.core.errors import InputError
from mlflow_ragjudge.engine.evaluate import EvalOutput
from mlflow_ragjudge.workflows.judge_report import REPORT_FILE, judge_report

OPENQA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openqa_eval"


def _run(columns: dict[str, list[Any]], name: str = "judged") -> str:
    """A ragjudge run whose per-row table is ``columns`` (logged the way an evaluation is, without traces)."""
    table = pd.DataFrame(columns)
    for col in list(table.columns):  # an evaluation's table has a justification beside each status
        if col.endswith("/status"):
            table[col.replace("/status", "/justification")] = "the judge's reason"
    out = EvalOutput(metrics={}, table=table, results={}, transcripts=[], params={}, config={})
    with mlflow.start_run(run_name=name) as run:
        log_output(out, run.info.run_id, traces=False)
    return run.info.run_id


def _labels(tmp_path: Path, rows: dict[str, Any], column: str, name: str = "labels.csv") -> Path:
    path = tmp_path / name
    pd.DataFrame({"row_id": list(rows), column: list(rows.values())}).to_csv(path, index=False)
    return path


# --------------------------------------------------------------------------- six levels


SIX = {
    "row_id": [f"r{i}" for i in range(8)],
    "correctness/score": [5, 4, 3, 1, 2, None, None, 5],
    "correctness/status": ["scored"] * 5 + ["abstained:not_sure", "failed:parse_error", "scored"],
    "correctness/level": [5, 4, 3, 1, 2, 0, None, 5],
}
SIX_HUMAN = {"r0": 5, "r1": 5, "r2": 3, "r3": 1, "r4": 1, "r5": 4, "r6": 2, "r7": 0}


def test_six_level_report_by_hand(tmp_tracking: str, tmp_path: Path) -> None:
    run_id = _run(SIX)
    report = judge_report(run_id, _labels(tmp_path, SIX_HUMAN, "correctness"))
    # compared: r0..r4 -- r5 the judge was not sure (level 0), r6 it failed, r7 people were not sure (0)
    # pairs (judge, people): (5,5) (4,5) (3,3) (1,1) (2,1): 3 of 5 agree
    assert (report.n, report.n_agree, report.agreement) == (5, 3, 0.6)
    assert report.left_out == {"human_not_sure": 1, "judge_abstained": 1, "judge_failed": 1,
                               "judge_failed_reasons": {"parse_error": 1}, "judge_no_value": 0}
    assert report.labelled == 8 and report.rows == 8
    # quadratic weights (i-j)^2 on levels 1..5. Disagreements: (4,5) and (2,1), weight 1 each: n * sum(w O) = 5 * 2
    # judge's margins: one row at each level; people's: level 1 twice, 3 once, 5 twice.
    # sum_j people_j * sum_i (i-j)^2: level 1 -> 30, level 3 -> 10, level 5 -> 30: 2*30 + 10 + 2*30 = 130
    # kappa = 1 - 10/130 = 12/13
    assert report.kappa_weights == "quadratic"
    assert report.kappa == pytest.approx(12 / 13)
    # unweighted: p_o = .6, p_e = (1*2 + 1*1 + 1*2) / 25 = .2 -> (.6 - .2) / .8 = .5
    assert report.kappa_unweighted == pytest.approx(0.5)
    assert report.confusion["labels"] == [1, 2, 3, 4, 5]
    assert report.confusion["matrix"] == [[1, 1, 0, 0, 0],  # people 1: judge 1 (r3), judge 2 (r4)
                                          [0, 0, 0, 0, 0],
                                          [0, 0, 1, 0, 0],  # people 3: judge 3
                                          [0, 0, 0, 0, 0],
                                          [0, 0, 0, 1, 1]]  # people 5: judge 4 (r1), judge 5 (r0)
    per = {p["label"]: p for p in report.per_label}
    assert (per[1]["precision"], per[1]["recall"]) == (1.0, 0.5)  # judge said 1 once, right; people said 1 twice
    assert (per[2]["precision"], per[2]["recall"]) == (0.0, None)  # nobody's 2 was the judge's 2
    assert [(d["row_id"], d["judge"], d["human"]) for d in report.disagreements] == [("r1", 4, 5), ("r4", 2, 1)]
    assert report.self_consistency is None and report.panel is None


def test_report_is_logged_into_the_run(tmp_tracking: str, tmp_path: Path) -> None:
    run_id = _run(SIX)
    judge_report(run_id, _labels(tmp_path, SIX_HUMAN, "correctness"))
    logged = mlflow.get_run(run_id).data.metrics
    assert logged["judge_report/correctness/kappa"] == pytest.approx(12 / 13)
    assert logged["judge_report/correctness/agreement"] == pytest.approx(0.6)
    assert logged["judge_report/correctness/n"] == 5
    saved = mlflow.artifacts.load_dict(f"runs:/{run_id}/{REPORT_FILE}")
    assert saved["correctness"]["disagreements"][0]["row_id"] == "r1"
    assert saved["correctness"]["confusion"]["rows"] == "people"


def test_log_to_another_run_and_no_log(tmp_tracking: str, tmp_path: Path) -> None:
    run_id = _run(SIX)
    with mlflow.start_run(run_name="review") as review:
        pass
    labels = _labels(tmp_path, SIX_HUMAN, "correctness")
    judge_report(run_id, labels, log_to=review.info.run_id)
    assert "judge_report/correctness/kappa" in mlflow.get_run(review.info.run_id).data.metrics
    assert "judge_report/correctness/kappa" not in mlflow.get_run(run_id).data.metrics
    judge_report(run_id, labels, log=False)
    assert "judge_report/correctness/kappa" not in mlflow.get_run(run_id).data.metrics


# --------------------------------------------------------------------------- pass/fail, repeats


VERDICT = {
    "row_id": ["a", "b", "c", "d", "e"],
    # the per-row score is the mean of the draws (the run's contract with repeats)
    "verdict/score": [1.0, 2 / 3, 0.0, 0.5, 1.0],
    "verdict/status": ["scored"] * 5,
    "verdict/draws": [json.dumps(d) for d in ([1, 1, 1], [1, 0, 1], [0, 0, None], [0, 1, None], [1, None, None])],
}
VERDICT_HUMAN = {"a": "yes", "b": "No", "c": "no", "d": "false", "e": "Pass"}


def test_binary_report_with_the_default_threshold_by_hand(tmp_tracking: str, tmp_path: Path) -> None:
    run_id = _run(VERDICT)
    report = judge_report(run_id, _labels(tmp_path, VERDICT_HUMAN, "label"), metric="verdict")
    # at 0.5: judge pass, pass, fail, pass (0.5 >= 0.5), pass; people pass, fail, fail, fail, pass
    assert report.threshold == 0.5 and report.kappa_weights is None
    assert (report.n, report.n_agree) == (5, 3)
    # p_o = 3/5; judge says pass 4 times, people 2: p_e = (4*2 + 1*3) / 25 = 11/25 -> (.6 - .44) / .56 = 2/7
    assert report.kappa == pytest.approx(2 / 7) and report.kappa == report.kappa_unweighted
    assert report.confusion == {"labels": ["fail", "pass"], "rows": "people", "columns": "judge",
                                "matrix": [[1, 2], [0, 2]]}
    assert [d["row_id"] for d in report.disagreements] == ["b", "d"]


def test_threshold_turns_a_score_into_pass_fail(tmp_tracking: str, tmp_path: Path) -> None:
    run_id = _run(VERDICT)
    report = judge_report(run_id, _labels(tmp_path, VERDICT_HUMAN, "label"), metric="verdict", threshold=0.7)
    # at 0.7 rows b (2/3) and d (1/2) fail, as people said: every row agrees
    assert (report.agreement, report.kappa, report.disagreements) == (1.0, 1.0, [])


def test_a_pass_fail_label_off_the_scale_is_refused(tmp_tracking: str, tmp_path: Path) -> None:
    run_id = _run(VERDICT)
    with pytest.raises(InputError, match=r"Label '4' in column 'label' \(row id a\).*a number in 0..1"):
        judge_report(run_id, _labels(tmp_path, {"a": 4}, "label"), metric="verdict")
    with pytest.raises(InputError, match=r"Label 'maybe'.*yes/no, pass/fail"):
        judge_report(run_id, _labels(tmp_path, {"a": "maybe"}, "label"), metric="verdict")


def test_self_consistency_over_draws_by_hand(tmp_tracking: str, tmp_path: Path) -> None:
    run_id = _run(VERDICT)
    s = judge_report(run_id, _labels(tmp_path, VERDICT_HUMAN, "label"), metric="verdict").self_consistency
    assert s is not None
    # rows with >= 2 scored draws: a (P,P,P) b (P,F,P) c (F,F) d (F,P); e has one draw and is left out
    assert (s["rows"], s["draws"]) == (4, 3)
    assert s["all_agree"] == 0.5 and s["flip_rate"] == 0.5  # a and c agree throughout, b and d flip
    # two draws of a row agree: a 1, b (2*1)/(3*2) = 1/3, c 1, d 0 -> mean 7/12; differ: 5/12
    assert s["pair_disagreement"] == pytest.approx(5 / 12)
    # Fleiss: P_bar = 7/12; of 10 draws 6 pass, 4 fail: P_e = .36 + .16 = .52 -> (7/12 - .52) / .48 = 19/144
    assert s["fleiss_kappa"] == pytest.approx(19 / 144)


# --------------------------------------------------------------------------- a panel


PANEL = {
    "row_id": ["p0", "p1", "p2", "p3"],
    "correctness/score": [5, 4, 2, 1],
    "correctness/status": ["scored"] * 4,
    "correctness/level": [5, 4, 2, 1],
    "correctness/score@judge-a": [5, 4, 2, 1],
    "correctness/score@judge-b": [5, 4, 2, 2],
    "correctness/score@judge-c": [4, 4, 1, 1],
}
PANEL_HUMAN = {"p0": 5, "p1": 4, "p2": 2, "p3": 1}


def test_panel_judges_against_people_and_each_other_by_hand(tmp_tracking: str, tmp_path: Path) -> None:
    krippendorff = pytest.importorskip("krippendorff", reason="krippendorff is in the dev extra")
    sk = pytest.importorskip("sklearn.metrics", reason="scikit-learn is in the dev extra")
    panel = judge_report(_run(PANEL), _labels(tmp_path, PANEL_HUMAN, "correctness")).panel
    assert panel is not None
    judges = panel["judges"]
    assert judges["judge-a"] == {"n": 4, "agreement": 1.0, "kappa": 1.0}
    # judge b vs people: one pair off by one, (2,1): n * sum(w O) = 4 * 1 = 4
    # b's margins: 2 twice, 4, 5; people's: 1, 2, 4, 5. sum w * b_i * p_j: b=2: 2*(1+0+4+9) = 28,
    # b=4: 9+4+0+1 = 14, b=5: 16+9+1+0 = 26 -> 68; kappa = 1 - 4/68 = 16/17
    assert judges["judge-b"]["kappa"] == pytest.approx(16 / 17) and judges["judge-b"]["agreement"] == 0.75
    assert judges["judge-c"]["kappa"] == pytest.approx(
        sk.cohen_kappa_score([4, 4, 1, 1], [5, 4, 2, 1], weights="quadratic", labels=[1, 2, 3, 4, 5]))
    # Fleiss across the three judges: rows (5,5,4) (4,4,4) (2,2,1) (1,2,1): P_u = 1/3, 1, 1/3, 1/3 -> P_bar = 1/2
    # of 12 ratings: 5 twice, 4 four times, 2 three, 1 three: P_e = (4 + 16 + 9 + 9) / 144 = 38/144
    # kappa = (72 - 38) / (144 - 38) = 17/53
    assert panel["fleiss_kappa"] == pytest.approx(17 / 53)
    table = [[5, 4, 2, 1], [5, 4, 2, 2], [4, 4, 1, 1]]  # raters x units, as the krippendorff package takes it
    assert panel["alpha_level"] == "ordinal"
    assert panel["krippendorff_alpha"] == pytest.approx(
        krippendorff.alpha(reliability_data=table, level_of_measurement="ordinal"))


# --------------------------------------------------------------------------- bad input, the command


def test_labels_without_the_row_id_column_fail_before_anything_is_logged(tmp_tracking: str, tmp_path: Path) -> None:
    run_id = _run(SIX)
    path = tmp_path / "no_ids.csv"
    pd.DataFrame({"id": ["r0"], "correctness": [5]}).to_csv(path, index=False)
    with pytest.raises(InputError, match=r"no row id column 'row_id'.*--row-id-column"):
        judge_report(run_id, path)
    # the same file is fine once the id column is named
    assert judge_report(run_id, path, row_id_column="id", log=False).n == 1
    with pytest.raises(InputError, match=r"no metric 'faithfulness'.*\['correctness'\].*--metric"):
        judge_report(run_id, _labels(tmp_path, SIX_HUMAN, "correctness"), metric="faithfulness")
    with pytest.raises(InputError, match=r"row id\(s\) \['zz'\] that run"):
        judge_report(run_id, _labels(tmp_path, {"zz": 3}, "correctness"))
    with pytest.raises(InputError, match=r"Label '7' in column 'correctness' \(row id r0\)"):
        judge_report(run_id, _labels(tmp_path, {"r0": 7}, "correctness"))
    with pytest.raises(InputError, match=r"No row of run .* has a label in 'correctness'"):
        judge_report(run_id, _labels(tmp_path, {"r0": None, "r1": ""}, "correctness"))
    other_runs = tmp_path / "other_run.csv"
    pd.DataFrame({"run_id": ["abc123"], "row_id": ["r0"], "correctness": [5]}).to_csv(other_runs, index=False)
    with pytest.raises(InputError, match=r"labels are for run\(s\) \['abc123'\]"):
        judge_report(run_id, other_runs)
    # a label-sample file of a sweep holds every variant's lines: only this run's are read
    sweep_file = tmp_path / "sweep_labels.csv"
    pd.DataFrame({"run_id": [run_id, "abc123"], "row_id": ["r0", "zz"], "correctness": [5, 1]}).to_csv(sweep_file,
                                                                                                     index=False)
    only_this_run = judge_report(run_id, sweep_file, log=False)
    assert (only_this_run.labelled, only_this_run.n) == (1, 1)
    with pytest.raises(InputError, match=r"Label 'inf'"):
        judge_report(run_id, _labels(tmp_path, {"r0": "inf"}, "correctness"))
    with mlflow.start_run() as other:
        pass
    with pytest.raises(InputError, match="holds no ragjudge evaluation"):
        judge_report(other.info.run_id, _labels(tmp_path, SIX_HUMAN, "correctness"))
    with pytest.raises(InputError, match="No MLflow run 'not-a-run'"):
        judge_report("not-a-run", _labels(tmp_path, SIX_HUMAN, "correctness"))
    assert not any(k.startswith("judge_report/") for k in mlflow.get_run(run_id).data.metrics)
    assert not [a for a in mlflow.MlflowClient().list_artifacts(run_id, "ragjudge") if a.path == REPORT_FILE]


def test_the_command_prints_the_report_and_exits_2_on_bad_input(tmp_tracking: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    run_id = _run(SIX)
    labels = _labels(tmp_path, SIX_HUMAN, "correctness")
    assert main(["judge-report", run_id, "--labels", str(labels), "--metric", "correctness"]) == 0
    text = capsys.readouterr().out
    assert "Cohen's kappa (quadratic) 0.9231" in text and "agreement 0.6000 (3/5)" in text
    assert "r1: judge 4 vs people 5" in text and "judge failed 1 (parse_error 1)" in text
    assert main(["judge-report", run_id, "--labels", str(labels), "--metric", "nope"]) == 2
    assert "no metric 'nope'" in capsys.readouterr().err


def test_labels_from_human_feedback_on_the_runs_traces(tmp_tracking: str) -> None:
    from mlflow.entities import AssessmentSource

    from mlflow_ragjudge.adapters.tracking import run_traces

    table = pd.DataFrame({"question": ["q0", "q1", "q2"], "answer": ["a", "b", "c"], **{k: v[:3] for k, v in SIX.items()
                                                                                          if k != "row_id"},
                          "row_id": ["r0", "r1", "r2"]})
    table["correctness/justification"] = "the judge's reason"
    with mlflow.start_run() as run:
        log_output(EvalOutput(metrics={}, table=table, results={}, transcripts=[], params={}, config={}),
                   run.info.run_id)  # with its rows as traces, each carrying its row id
    traces = run_traces(run.info.run_id)
    people = {"r0": 5, "r1": 3, "r2": 3}
    for trace_id, row_id in zip(traces["trace_id"], traces["client_request_id"], strict=True):
        mlflow.log_feedback(trace_id=trace_id, name="correctness", value=people[row_id],
                            source=AssessmentSource(source_type="HUMAN", source_id="reviewer"))
    report = judge_report(run.info.run_id)  # no label file: the traces' human feedback
    assert report.labels_from == "human feedback on the run's traces"
    # judge 5, 4, 3 vs people 5, 3, 3: r1 differs
    assert (report.n, report.n_agree) == (3, 2)
    trace_of = dict(zip(traces["client_request_id"], traces["trace_id"], strict=True))
    assert report.disagreements == [{"row_id": "r1", "judge": 4, "human": 3, "score": 4.0, "trace_id": trace_of["r1"]}]
    assert "Traces tab" in (report.ui or "")


# --------------------------------------------------------------------------- NQ301: the done-when check


def _verdict(text: str) -> float | None:
    """The recorded GPT-4 reply as a score: 1 when it starts with Yes, 0 with No, None otherwise (unparsed)."""
    head = text.strip().lower()
    return 1.0 if head.startswith("yes") else 0.0 if head.startswith("no") else None


@pytest.mark.skipif(not (OPENQA_DIR / "NQ301_human.tsv").is_file(),
                    reason=f"OpenQA-eval NQ301 not found at {OPENQA_DIR} (it lives beside the project, not in it)")
def test_nq301_gpt4_against_the_human_majority(tmp_tracking: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with (OPENQA_DIR / "NQ301_gpt-4.tsv").open(encoding="utf-8", newline="") as fh:
        gpt4 = list(csv.DictReader(fh, delimiter="\t"))
    with (OPENQA_DIR / "NQ301_human.tsv").open(encoding="utf-8", newline="") as fh:
        human = list(csv.DictReader(fh, delimiter="\t"))
    # The recorded verdicts become a ragjudge run: one row per answer (ids by line: the files' `id` is the
    # question's, shared by its ~5 answers), an unparsed reply a failed row, as the judge's strict parsing fails it.
    ids = [f"nq{i}" for i in range(len(gpt4))]
    scores = [_verdict(g["gpt-4"]) for g in gpt4]
    run_id = _run({"question": [g["Question"] for g in gpt4], "answer": [g["Model answer"] for g in gpt4],
                   "gpt4/score": scores,
                   "gpt4/status": ["scored" if s is not None else "failed:parse_error" for s in scores],
                   "row_id": ids}, name="nq301-gpt4")
    labels = tmp_path / "nq301_human.tsv"
    pd.DataFrame({"row_id": ids, "Acceptable?": [h["Acceptable?"] for h in human]}).to_csv(labels, sep="\t",
                                                                                             index=False)
    code = main(["judge-report", run_id, "--labels", str(labels), "--metric", "gpt4", "--label-column",
                 "Acceptable?", "--show", "3"])
    text = capsys.readouterr().out
    print(text)
    assert code == 0
    saved = mlflow.artifacts.load_dict(f"runs:/{run_id}/{REPORT_FILE}")["gpt4"]
    # docs/meta-evaluation.md, strict parsing: n = 1480, agreement 1256/1480 = 0.8486, kappa 0.6964
    assert (saved["n"], saved["n_agree"]) == (1480, 1256)
    assert saved["agreement"] == pytest.approx(1256 / 1480)
    assert saved["kappa"] == pytest.approx(0.69639, abs=1e-5)
    assert saved["left_out"]["judge_failed"] == 10
    # the confusion matrix of docs/meta-evaluation.md (there: judge rows, people columns)
    assert saved["confusion"]["labels"] == ["fail", "pass"]
    assert saved["confusion"]["matrix"] == [[580, 86], [138, 676]]
    disagreeing = {d["row_id"] for d in saved["disagreements"]}
    assert len(disagreeing) == 224 == 138 + 86
    expected = {i for i, s, h in zip(ids, scores, human, strict=True)
                if s is not None and (s == 1.0) != (h["Acceptable?"] == "Yes")}
    assert disagreeing == expected
    assert "agreement 0.8486 (1256/1480)" in text and "disagreements: 224 rows" in text
    logged = mlflow.get_run(run_id).data.metrics
    assert logged["judge_report/gpt4/n"] == 1480 and logged["judge_report/gpt4/n_disagree"] == 224


def test_a_panel_runs_self_consistency_is_the_first_judges_over_its_own_repeats(tmp_tracking: str,
                                                                                 tmp_path: Path) -> None:
    # two judges x 2 repeats, judge-major in the draws column (as the engine writes it): the second judge always
    # says 1 where the first says 5, which is disagreement between judges, not the first judge's flipping
    table = pd.DataFrame({"row_id": ["a", "b", "c"], "correctness/score": [5, 4, 3],
                          "correctness/status": ["scored"] * 3, "correctness/justification": [""] * 3,
                          "correctness/draws": ["[5, 5, 1, 1]", "[4, 3, 2, 2]", "[3, 3, 3, 3]"]})
    out = EvalOutput(metrics={}, table=table, results={}, transcripts=[], params={},
                     config={"draws": {"judges": ["m1", "m2"], "repeats": 2, "cascade": False}})
    with mlflow.start_run() as run:
        log_output(out, run.info.run_id, traces=False)
    s = judge_report(run.info.run_id, _labels(tmp_path, {"a": 5, "b": 4, "c": 3}, "correctness"),
                     metric="correctness", log=False).self_consistency
    assert s is not None and (s["rows"], s["draws"]) == (3, 2)
    assert s["flip_rate"] == pytest.approx(1 / 3)  # only b's two draws (4, 3) differ
