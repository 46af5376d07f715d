"""Gates on intervals (issue 36): every output's mean is logged with its 95 % Student-t interval, computed from
mergeable sums (so parts of the data give the interval of the whole); ``fail_under`` passes when the interval lies at
or above the threshold, fails when it lies below, and is undecided in between (``ragjudge evaluate`` exits 6, naming
how many more rows or repeats would decide it); the point rule stays by name; ``compare`` decides "is B better" on the
interval of the difference."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from scipy import stats

from mlflow_ragjudge import evaluate_frame
from mlflow_ragjudge.cli import EXIT_GATE_FAILED, EXIT_GATE_UNDECIDED, EXIT_OK, main
from mlflow_ragjudge.core.types import Aggregate, JudgeResult, Row, aggregate
from mlflow_ragjudge.engine.aggregate import OutputSummary, gate_outcome, output_metrics, summarize_output
from mlflow_ragjudge.engine.config import RagJudgeConfig
from mlflow_ragjudge.engine.intervals import decide_gate, gate_status, mean_interval, more_repeats
from mlflow_ragjudge.engine.parts import evaluate_part, merge_parts, part_summary
from mlflow_ragjudge.workflows.compare import COLUMNS, paired_comparison


def _scored(values):
    return [JudgeResult.scored(float(v)) for v in values]


def _t_interval(values):
    """scipy's own 95 % t-interval of the mean of ``values``: the reference."""
    x = np.asarray(values, dtype=float)
    return stats.t.interval(0.95, df=len(x) - 1, loc=x.mean(), scale=stats.sem(x))


# --------------------------------------------------------------------------- the interval


@pytest.mark.parametrize("values", [
    pytest.param([1, 2, 2, 3, 5, 4, 4, 1], id="levels"),
    pytest.param([0.1, 0.35, 0.9, 0.77, 0.5], id="fractions"),
    pytest.param(list(np.random.default_rng(3).normal(3.2, 0.9, 500)), id="500-normal"),
    pytest.param([0, 1], id="two-rows"),
])
def test_the_interval_is_scipys_t_interval_on_the_same_numbers(values):
    iv = mean_interval(aggregate(_scored(values)))
    low, high = _t_interval(values)
    assert iv is not None and iv.n == len(values)
    assert iv.low == pytest.approx(low, abs=1e-12) and iv.high == pytest.approx(high, abs=1e-12)
    # the slow path (some rows not scored) adds the same sums as the all-scored fast path
    mixed = aggregate([*_scored(values), JudgeResult.abstained("not sure"), JudgeResult.failed("timeout")])
    assert mixed.total_sq == pytest.approx(aggregate(_scored(values)).total_sq, rel=1e-15)
    assert mean_interval(mixed).low == pytest.approx(low, abs=1e-12)


def test_no_interval_under_two_rows_a_constant_column_is_its_point_and_never_nan():
    assert mean_interval(aggregate(_scored([4.0]))) is None
    assert mean_interval(aggregate([JudgeResult.abstained("x")] * 3)) is None
    for value in (3.0, 0.1, 1 / 3):  # 0.1 and 1/3: the sums round, the spread must still read as none
        iv = mean_interval(aggregate(_scored([value] * 1000)))
        assert iv is not None and iv.low == iv.high == pytest.approx(value)
    summary = summarize_output(_scored([4.0]), [Row(index=0)])
    metrics = output_metrics("m", summary, judged=True)
    assert "m/ci_low" not in metrics and all(not math.isnan(v) for v in metrics.values())


def test_parts_merged_give_the_interval_of_the_whole_and_old_summaries_have_none():
    rng = np.random.default_rng(11)
    values = rng.integers(1, 6, 301).astype(float)
    groups = rng.choice(["a", "b"], 301)
    rows = [Row(index=i, group=str(g)) for i, g in enumerate(groups)]
    whole = summarize_output(_scored(values), rows)
    cuts = [0, 17, 150, 151, 301]
    merged = None
    for lo, hi in zip(cuts, cuts[1:]):  # each part through JSON, as Spark's tasks hand them back
        part = OutputSummary.from_dict(json.loads(json.dumps(
            summarize_output(_scored(values[lo:hi]), rows[lo:hi]).to_dict())))
        merged = part if merged is None else merged.merge(part)
    want, got = output_metrics("m", whole, True), output_metrics("m", merged, True)
    assert set(want) == set(got) and {"m/ci_low", "m/ci_high", "m/ci_low/a", "m/ci_high/b"} <= set(got)
    assert all(got[k] == pytest.approx(want[k], abs=1e-12) for k in want)
    low, high = _t_interval(values[groups == "a"])
    assert got["m/ci_low/a"] == pytest.approx(low, abs=1e-12) and got["m/ci_high/a"] == pytest.approx(high, abs=1e-12)
    # a summary saved before total_sq was kept: loads, with no interval (not a zero spread), and merges to none
    old = {k: v for k, v in whole.all.to_dict().items() if k != "total_sq"}
    loaded = Aggregate.from_dict(old)
    assert loaded.total_sq is None and mean_interval(loaded) is None
    assert mean_interval(loaded.merge(whole.all)) is None
    gate = gate_outcome({"m": 2.0}, {"m/mean": loaded.mean}, {"metric": {"m": OutputSummary(loaded)}})
    assert gate[0]["rule"] == "point" and "older version" in gate[0]["message"] and gate[0]["outcome"] == "pass"


def test_a_split_evaluation_gives_the_metrics_and_gates_of_one_process():
    """What ``evaluate_spark`` does with its partitions (engine/parts.py), without Spark: the same intervals and the
    same gate entries as ``evaluate_frame``."""
    df = _retrieval_rows(hits=23, misses=14)
    cfg = RagJudgeConfig.from_dict({"metrics": ["retrieval"], "fail_under": {"precision": 0.55, "recall": 0.2}})
    one = evaluate_frame(df, metrics=["retrieval"], fail_under={"precision": 0.55, "recall": 0.2})
    parts = [json.loads(json.dumps(part_summary(evaluate_part(df.iloc[lo:hi], cfg, first_row=lo), lo)))
             for lo, hi in ((0, 10), (10, 11), (11, 37))]
    merged = merge_parts(parts, cfg)
    assert {k: v for k, v in merged.metrics.items() if "/ci_" in k} == pytest.approx(
        {k: v for k, v in one.metrics.items() if "/ci_" in k}, abs=1e-12)
    gate = gate_outcome(cfg.fail_under, merged.metrics, merged.summaries, cfg.gate_rule)
    assert [g["outcome"] for g in gate] == [g["outcome"] for g in one.gate] == ["undecided", "pass"]
    assert [g["more_rows"] for g in gate[:1]] == [g["more_rows"] for g in one.gate[:1]]


# --------------------------------------------------------------------------- the gate's decision


def test_decide_gate_pass_fail_undecided_and_the_point_rule_by_name():
    values = [0.0] * 10 + [1.0] * 30
    iv = mean_interval(aggregate(_scored(values)))
    low, high = _t_interval(values)
    assert decide_gate("m/mean", low - 0.01, 0.75, iv, rule="interval")["outcome"] == "pass"
    assert decide_gate("m/mean", low, 0.75, iv, rule="interval")["outcome"] == "pass"  # the bound itself passes
    assert decide_gate("m/mean", high + 0.01, 0.75, iv, rule="interval")["outcome"] == "fail"
    g = decide_gate("m/mean", 0.7, 0.75, iv, rule="interval")
    assert g["outcome"] == "undecided" and g["passed"] is False and g["ci_low"] == pytest.approx(low)
    half = (high - low) / 2
    assert g["more_rows"] == math.ceil(40 * (half / 0.05) ** 2) - 40
    assert f"about {g['more_rows']} more rows" in g["message"] and "more_repeats" not in g
    # the rows it names would decide it: the same values repeated to that many rows
    k = math.ceil((40 + g["more_rows"]) / 40)
    assert mean_interval(aggregate(_scored(values * k))).low >= 0.7
    on = decide_gate("m/mean", 0.75, 0.75, iv, rule="interval")
    assert on["outcome"] == "undecided" and on["more_rows"] is None and "sits on the threshold" in on["message"]
    # the point rule: the mean alone, as before
    assert decide_gate("m/mean", 0.7, 0.75, iv, rule="point")["outcome"] == "pass"
    assert decide_gate("m/mean", 0.8, 0.75, iv, rule="point")["outcome"] == "fail"
    # no interval: the point rule decides, and the entry says so
    lone = decide_gate("judge/calls", 3, 10.0, None, rule="interval", no_interval="judge/calls is not an output's mean")
    assert lone["rule"] == "point" and lone["outcome"] == "pass" and "no interval" in lone["message"]
    assert decide_gate("m/mean", 0.7, None, iv, rule="interval")["outcome"] == "fail"  # not produced
    assert gate_status([g, lone]) == "undecided"
    assert gate_status([g, decide_gate("m/mean", 0.9, 0.75, iv, rule="point")]) == "failed"  # a failure outranks
    assert gate_status([lone]) == "passed" and gate_status([]) is None


def test_more_repeats_is_the_smallest_that_decides_or_none_when_the_questions_spread_is_too_wide():
    rng = np.random.default_rng(5)
    values = rng.normal(3.6, 0.6, 60)
    iv = mean_interval(aggregate(_scored(values)))
    x = iv.mean - 0.8 * iv.half_width  # inside the interval: undecided
    distance = iv.mean - x
    judge_var, reps = 0.8, 2
    r = more_repeats(iv, distance, judge_var, reps)
    between = max(0.0, iv.variance - judge_var / reps)

    def half(r_):
        return iv.t * math.sqrt((between + judge_var / r_) / iv.n)

    assert r is not None and r > reps and half(r) < distance and half(r - 1) >= distance
    # the questions' own spread alone too wide: no number of repeats decides it
    assert more_repeats(iv, distance, iv.variance * 0.05, 1) is None
    # through gate_outcome: the run's judge variance and repeats metrics
    summaries = {"correctness": {"correctness": OutputSummary(aggregate(_scored(values)))}}
    metrics = {"correctness/mean": iv.mean, "correctness/judge_variance": judge_var, "correctness/repeats": 2.0}
    g = gate_outcome({"correctness": x}, metrics, summaries)[0]
    assert g["outcome"] == "undecided" and g["more_repeats"] == r and f"repeats={r} per row (now 2)" in g["message"]
    g = gate_outcome({"correctness": x}, {**metrics, "correctness/judge_variance": iv.variance * 0.05,
                                           "correctness/repeats": 1.0}, summaries)[0]
    assert g["more_repeats"] is None and "no number of repeats decides it" in g["message"]


def test_config_gate_rule_is_checked_and_recorded():
    with pytest.raises(ValueError, match="gate_rule"):
        RagJudgeConfig.from_dict({"gate_rule": "strict"})
    df = _retrieval_rows(hits=30, misses=10)
    out = evaluate_frame(df, metrics=["retrieval"], fail_under={"precision": 0.7}, gate_rule="point")
    assert out.gate[0]["rule"] == "point" and out.gate_passed and out.config["gate"] == out.gate


# --------------------------------------------------------------------------- the command line


def _retrieval_rows(hits: int, misses: int) -> pd.DataFrame:
    """Rows whose precision (no cut-off) is 1 (the one retrieved document is relevant) or 0 (it is not)."""
    rows = [{"retrieved_doc_ids": ["d1"], "relevant_doc_ids": ["d1"]}] * hits
    rows += [{"retrieved_doc_ids": ["x"], "relevant_doc_ids": ["d1"]}] * misses
    order = np.random.default_rng(1).permutation(len(rows))
    return pd.DataFrame([rows[i] for i in order])


@pytest.fixture
def rows_40(tmp_path):
    """30 hits and 10 misses: precision's mean 0.75, its 95 % interval about [0.61, 0.89]."""
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _retrieval_rows(30, 10).to_dict("records")), encoding="utf-8")
    return path


def _cli(path, *gates):
    args = ["evaluate", str(path), "--metrics", "retrieval"]
    for g in gates:
        args += ["--fail-under", g] if "=" in g else ["--gate-rule", g]
    return main(args)


def test_cli_interval_gate_passes_fails_and_is_undecided_with_exit_6_naming_more_rows(rows_40, tmp_tracking, capsys):
    low, high = _t_interval([1.0] * 30 + [0.0] * 10)
    assert 0.5 < low < 0.7 < 0.75 < 0.8 < high < 0.95
    assert _cli(rows_40, "precision=0.5") == EXIT_OK
    out = capsys.readouterr().out
    assert f"gate passed: precision/mean = 0.7500, 95% interval [{low:.4f}, {high:.4f}] over 40 rows" in out
    assert _cli(rows_40, "precision=0.95") == EXIT_GATE_FAILED
    assert "gate FAILED: precision/mean" in capsys.readouterr().out
    assert _cli(rows_40, "precision=0.7") == EXIT_GATE_UNDECIDED == 6
    captured = capsys.readouterr()
    more = math.ceil(40 * ((high - low) / 2 / 0.05) ** 2) - 40
    assert f"gate UNDECIDED: precision/mean = 0.7500, 95% interval [{low:.4f}, {high:.4f}]" in captured.out
    assert (f"straddles 0.7: undecided; about {more} more rows ({40 + more} in all) at the same spread would decide it"
            in captured.out)
    assert "error: gate undecided: precision/mean" in captured.err
    run = MlflowClient().search_runs(["0"], order_by=["attributes.start_time DESC"])[0]
    assert run.data.tags["ragjudge.gate"] == "undecided"
    assert json.loads(run.data.tags["ragjudge.gate.detail"])[0]["more_rows"] == more
    assert run.data.metrics["precision/ci_low"] == pytest.approx(low, abs=1e-12)
    # a failed gate outranks an undecided one
    assert _cli(rows_40, "precision=0.7", "recall=0.95") == EXIT_GATE_FAILED


def test_cli_point_rule_by_name_reproduces_the_old_gate(rows_40, tmp_tracking, capsys):
    assert _cli(rows_40, "precision=0.7", "point") == EXIT_OK  # the mean 0.75 >= 0.7
    assert "the mean is at or above 0.7 (point rule): passed" in capsys.readouterr().out
    assert _cli(rows_40, "precision=0.8", "point") == EXIT_GATE_FAILED  # 0.75 < 0.8 ...
    assert _cli(rows_40, "precision=0.8") == EXIT_GATE_UNDECIDED  # ... which the interval does not decide


@pytest.mark.slow
def test_the_installed_command_exits_6_on_an_undecided_gate(rows_40, tmp_path):
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'g.db'}")
    proc = subprocess.run([sys.executable, "-m", "mlflow_ragjudge", "evaluate", str(rows_40), "--metrics",
                           "retrieval", "--fail-under", "precision=0.7"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 6, proc.stderr[-2000:]
    assert "gate UNDECIDED: precision/mean" in proc.stdout and "more rows" in proc.stdout


def test_an_offline_judged_run_logs_scipys_interval_of_its_score_column(tmp_tracking):
    """A judged output (the offline judge's correctness, no LLM): ``ci_low``/``ci_high`` are scipy's t-interval of
    the per-row table's scored values."""
    from offline_rows import make_rows

    df = make_rows(60)
    out = evaluate_frame(df, judge="offline:/lexical", metrics=["correctness"], cache=False)
    scores = out.table["correctness/score"].dropna().astype(float)
    low, high = _t_interval(scores)
    assert len(scores) == out.metrics["correctness/n_scored"] >= 2
    assert out.metrics["correctness/ci_low"] == pytest.approx(low, abs=1e-12)
    assert out.metrics["correctness/ci_high"] == pytest.approx(high, abs=1e-12)


# --------------------------------------------------------------------------- is B better


def test_compare_decides_better_worse_undecided_on_the_interval_of_the_difference():
    rng = np.random.default_rng(2)
    base = {i: float(v) for i, v in enumerate(rng.uniform(0.2, 0.6, 50))}
    scores = {
        "base": {"m": base, "lscore": base},
        "up": {"m": {i: v + 0.2 + rng.normal(0, 0.02) for i, v in base.items()},
               "lscore": {i: v + 0.2 for i, v in base.items()}},  # lower is better: worse
        "down": {"m": {i: v - 0.2 + rng.normal(0, 0.02) for i, v in base.items()},
                 "lscore": {i: v - 0.2 + rng.normal(0, 0.02) for i, v in base.items()}},
        "noise": {"m": {i: v + rng.normal(0.01, 0.3) for i, v in base.items()}, "lscore": dict(base)},
    }
    table = paired_comparison(scores, "base", metrics=["m", "lscore"], n_boot=500).set_index(["variant", "metric"])
    assert list(COLUMNS[-2:]) == ["decision", "more_rows"] and COLUMNS[:2] == ["variant", "metric"]
    d = table["decision"].to_dict()
    assert d[("up", "m")] == "better" and d[("down", "m")] == "worse" and d[("noise", "m")] == "undecided"
    assert d[("up", "lscore")] == "worse" and d[("down", "lscore")] == "better"
    assert d[("noise", "lscore")] == "undecided" and table.loc[("noise", "lscore"), "more_rows"] is None  # no diff
    noisy = table.loc[("noise", "m")]
    assert noisy["ci_low"] < 0 < noisy["ci_high"]
    half = noisy["mean_diff"] - noisy["ci_low"] if noisy["mean_diff"] > 0 else noisy["ci_high"] - noisy["mean_diff"]
    assert type(noisy["more_rows"]) is int
    assert noisy["more_rows"] == max(1, math.ceil(50 * (half / abs(noisy["mean_diff"])) ** 2) - 50)
    assert table.loc[("up", "m"), "more_rows"] is None
    # the Holm p-values are as before: decided rows here are also significant, the undecided one is not
    assert table.loc[("up", "m"), "significant"] and not noisy["significant"]


@pytest.mark.slow
def test_spark_gates_on_the_merged_sums_as_one_process_does(tmp_path):
    """``evaluate_spark`` over three partitions: the same intervals and the same gate entries as ``evaluate_frame``
    (the gate is computed on the driver from the partitions' merged sums)."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    import shutil

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java (17 or newer)")
    from pyspark.sql import SparkSession

    from mlflow_ragjudge.core.errors import SparkPandasWarning
    from mlflow_ragjudge.spark import evaluate_spark

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("ragjudge-gates").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    try:
        df = _retrieval_rows(hits=30, misses=10)
        cfg = {"metrics": ["retrieval"], "fail_under": {"precision": 0.7, "recall": 0.5, "map": 0.95}, "cache": False}
        one = evaluate_frame(df, cfg)
        with warnings.catch_warnings():  # PySpark's note on pandas 3 (tests/test_spark.py checks it)
            warnings.simplefilter("ignore", SparkPandasWarning)
            res = evaluate_spark(spark.createDataFrame(df).repartition(3), cfg, log=False)
        assert [g["outcome"] for g in res.gate] == ["undecided", "pass", "fail"]
        for got, want in zip(res.gate, one.gate):
            assert {k: v for k, v in got.items() if k not in ("ci_low", "ci_high")} == {
                k: v for k, v in want.items() if k not in ("ci_low", "ci_high")}
            assert got["ci_low"] == pytest.approx(want["ci_low"], abs=1e-12)
        assert res.metrics["precision/ci_high"] == pytest.approx(one.metrics["precision/ci_high"], abs=1e-12)
        res.unpersist()
    finally:
        spark.stop()


def test_the_sweeps_summary_shows_each_decision_and_their_counts():
    from mlflow_ragjudge.workflows.sweep import SweepResult

    rng = np.random.default_rng(4)
    base = {i: float(v) for i, v in enumerate(rng.uniform(0.2, 0.6, 30))}
    scores = {"base": {"m": base}, "up": {"m": {i: v + 0.3 + rng.normal(0, 0.02) for i, v in base.items()}},
              "noise": {"m": {i: v + rng.normal(0.02, 0.3) for i, v in base.items()}}}
    table = paired_comparison(scores, "base", n_boot=300)
    result = SweepResult("parent", {}, table, "base", {})
    text = result.summary(headline=())
    noisy = table[table["variant"] == "noise"].iloc[0]
    assert noisy["decision"] == "undecided" and type(noisy["more_rows"]) is int
    assert f"undecided (~{noisy['more_rows']} more rows)" in text
    assert "BETTER" in text and "1 better, 0 worse, 1 undecided" in text
    assert list(result.decided("better")["variant"]) == ["up"]
