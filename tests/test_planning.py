"""Planning rows, repeats and labels (engine/planning.py, workflows/planning.py, ``ragjudge plan``).

(a) the formulas, checked by simulation: evaluations of the planned size, drawn from the two-level model with known
    σ²_b and σ²_w, give intervals of about the asked width, and detect the asked difference about as often as the
    asked power;
(b) the floor: when the rows' own spread is too large no number of repeats reaches the target, and the plan says so;
(c) the variance components and the cost read from a run's per-row table and transcripts;
(d) the labels column is labels_needed's answer;
(e) the CLI on saved runs, and bad input.
"""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import mlflow
import numpy as np
import pandas as pd
import pytest

from mlflow_ragjudge.adapters.run_log import log_output
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.core.errors import InputError
from mlflow_ragjudge.engine.evaluate import EvalOutput
from mlflow_ragjudge.engine.planning import MIN_ROWS, DrawCost, VarianceComponents, plan_evaluation
from mlflow_ragjudge.engine.ppi import labels_needed, ppi_mean
from mlflow_ragjudge.workflows.planning import draw_cost, paired_components, plan, row_draws, variance_components

Z95 = NormalDist().inv_cdf(0.975)


def _simulated_half_widths(n: int, r: int, var_b: float, var_w: float, rng: np.random.Generator,
                           sims: int = 2000) -> np.ndarray:
    """``sims`` evaluations of ``n`` rows x ``r`` draws from the two-level model: each one's 95 % half-width."""
    true = rng.normal(0.0, math.sqrt(var_b), (sims, n, 1))
    means = (true + rng.normal(0.0, math.sqrt(var_w), (sims, n, r))).mean(axis=2)
    return Z95 * means.std(axis=1, ddof=1) / math.sqrt(n)


# ----------------------------------------------------------------------------- (a) the formulas, by simulation


@pytest.mark.parametrize("var_b, var_w", [(0.5, 1.0), (0.2, 2.0), (1.0, 0.0)], ids=["mixed", "judge-heavy", "no-noise"])
def test_the_planned_rows_give_intervals_of_about_the_asked_width(var_b, var_w):
    rng = np.random.default_rng(7)
    width = 0.2
    p = plan_evaluation(VarianceComponents(var_b + var_w / 3, var_w, 200, 3), width=width)
    for r in (1, 3, 10):
        n = p.option(r).rows
        assert n is not None and n > MIN_ROWS  # the formula, not the floor, decides
        got = 2 * _simulated_half_widths(n, r, var_b, var_w, rng, sims=600).mean()
        # N is rounded up, so the mean width is at most the target and less than one row's worth below it; the
        # sample sd's small bias (E s < σ) and 600 simulations' noise stay within 3 %
        assert 0.97 * width <= got <= 1.005 * width, (r, n, got)
    # and the formula itself: N(r) = ceil(z² (σ²_b + σ²_w / r) / h²)
    assert p.option(5).rows == math.ceil(Z95 ** 2 * (var_b + var_w / 5) / (width / 2) ** 2)


def test_more_repeats_need_fewer_rows_but_more_judged_draws():
    p = plan_evaluation(VarianceComponents(0.5 + 1.0 / 3, 1.0, 200, 3), width=0.2, cost=DrawCost(2.0, 800.0, 0.001))
    rows = [o.rows for o in p.options]
    draws = [o.draws for o in p.options]
    assert rows == sorted(rows, reverse=True) and rows[0] > rows[-1]
    assert draws == sorted(draws)  # N(r) · r = k² (σ²_b r + σ²_w): more rows are the cheaper way when rows can be had
    for o in p.options:
        assert o.draws == o.rows * o.repeats
        assert o.requests == pytest.approx(2.0 * o.draws) and o.usd == pytest.approx(0.001 * o.draws)
        assert o.tokens == pytest.approx(800.0 * o.draws)


def test_paired_detection_at_the_planned_rows_has_about_the_asked_power():
    rng = np.random.default_rng(11)
    var_b, var_w, delta = 0.3, 0.8, 0.15  # components of the per-row differences
    p = plan_evaluation(VarianceComponents(var_b + var_w / 2, var_w, 100, 2, paired=True), detect=delta, power=0.8)
    assert p.variants == 2
    for r in (1, 3):
        n = p.option(r).rows
        assert n is not None
        sims = 2000
        true = delta + rng.normal(0, math.sqrt(var_b), (sims, n, 1))
        diffs = (true + rng.normal(0, math.sqrt(var_w), (sims, n, r))).mean(axis=2)
        low = diffs.mean(axis=1) - Z95 * diffs.std(axis=1, ddof=1) / math.sqrt(n)
        power = float((low > 0).mean())
        # 2000 simulations: the standard error of a share near 0.8 is 0.009; ±0.03 is over 3 of them
        assert abs(power - 0.8) < 0.03, (r, n, power)


def test_unpaired_detection_plans_twice_the_variance_per_variant():
    comps = VarianceComponents(1.2, None, 100)
    paired_like = plan_evaluation(comps, detect=0.2)
    unpaired = plan_evaluation(comps, detect=0.2, unpaired=True)
    k = (Z95 + NormalDist().inv_cdf(0.8)) ** 2
    assert paired_like.option(1).rows == math.ceil(k * 1.2 / 0.2 ** 2)
    assert unpaired.option(1).rows == math.ceil(k * 2 * 1.2 / 0.2 ** 2)
    assert unpaired.variants == 2 and "independent samples" in unpaired.text()


# ----------------------------------------------------------------------------- (b) the floor; no repeats


def test_when_the_rows_spread_is_the_limit_no_number_of_repeats_reaches_the_width_and_the_plan_says_so():
    var_b, var_w, n = 2.0, 0.5, 100
    p = plan_evaluation(VarianceComponents(var_b + var_w / 3, var_w, n, 3), width=0.4)
    floor = Z95 * math.sqrt(var_b / n)
    assert p.floor == pytest.approx(floor) and floor > 0.2  # the asked half-width is below the floor
    assert p.repeats_at_pilot_rows is None
    assert all(o.rows > n for o in p.options)  # even 10 draws per row need more rows than the pilot has
    assert p.rows_unlimited_repeats == math.ceil(Z95 ** 2 * var_b / 0.2 ** 2)
    text = p.text()
    assert "no number of repeats reaches" in text and "Only more rows help" in text
    # and by simulation: 100 rows x 50 draws still give intervals wider than asked
    got = 2 * _simulated_half_widths(n, 50, var_b, var_w, np.random.default_rng(3), sims=300).mean()
    assert got > 0.4 * 1.1


def test_when_repeats_can_reach_the_width_the_plan_names_how_many():
    var_b, var_w, n = 0.2, 3.0, 200
    p = plan_evaluation(VarianceComponents(var_b + var_w / 2, var_w, n, 2), width=0.3)
    r = p.repeats_at_pilot_rows
    assert r is not None and r > 1
    k2 = (Z95 / 0.15) ** 2
    assert k2 * (var_b + var_w / r) <= n < k2 * (var_b + var_w / (r - 1))
    assert f"{r} draws per row reach it" in p.text()
    wide = plan_evaluation(VarianceComponents(var_b + var_w / 2, var_w, n, 2), width=1.0)
    assert wide.repeats_at_pilot_rows == 1 and "already reach it with one draw" in wide.text()


def test_without_repeats_only_one_draw_is_planned_and_more_draws_are_a_range():
    p = plan_evaluation(VarianceComponents(1.5, None, 80), width=0.3, cost=DrawCost(1.0))
    one = math.ceil((Z95 / 0.15) ** 2 * 1.5)
    assert p.option(1).rows == one
    three = p.option(3)
    # all of the variance the judge's: N(1) / 3; none of it: N(1)
    assert three.rows is None and three.rows_range == (math.ceil((Z95 / 0.15) ** 2 * 1.5 / 3), one)
    assert p.floor is None and p.repeats_at_pilot_rows is None
    assert "--repeats 3" in p.text() and "not separated" in p.text()


def test_a_pilot_without_variance_plans_the_minimum_and_says_why():
    p = plan_evaluation(VarianceComponents(0.0, 0.0, 50, 2), width=0.1)
    assert all(o.rows == MIN_ROWS for o in p.options)
    assert "no variance" in p.text()


# ----------------------------------------------------------------------------- (c) reading a run


def _run_output(n: int = 300, r: int = 3, var_b: float = 0.6, var_w: float = 0.9, seed: int = 0, *,
                shift: float = 0.0, true: np.ndarray | None = None, calls_per_draw: int = 2) -> EvalOutput:
    """A run's output as ``load_output`` gives it: ``correctness`` with ``r`` draws per row (JSON lists)."""
    rng = np.random.default_rng(seed)
    if true is None:
        true = rng.normal(3.0, math.sqrt(var_b), n)
    n = len(true)
    draws = true[:, None] + shift + rng.normal(0, math.sqrt(var_w), (n, r))
    table = pd.DataFrame({
        "row_id": [f"q{i:03d}" for i in range(n)], "question": [f"question {i}" for i in range(n)],
        "correctness/score": draws.mean(axis=1), "correctness/status": ["scored"] * n,
        "correctness/justification": [""] * n,
        "correctness/draws": [json.dumps([float(x) for x in d]) for d in draws]})
    transcripts = [{"metric": "correctness", "row": i, "input_tokens": 400, "output_tokens": 40, "cost_usd": 0.0002,
                    "cache_hit": False, "attempts": 1} for i in range(n) for _ in range(r * calls_per_draw)]
    return EvalOutput(metrics={"correctness/mean": float(table["correctness/score"].mean())}, table=table, results={},
                      transcripts=transcripts, params={}, config={"repeats": r})


def test_the_components_read_from_the_draws_match_the_truth():
    c = variance_components(_run_output(n=2000, var_b=0.6, var_w=0.9), "correctness")
    assert c.rows == 2000 and c.repeats == 3
    # 2000 rows x 3 draws: σ²_w's relative standard error is about sqrt(2 / 4000) = 2.2 %, σ²_b's about 5 %
    assert c.within == pytest.approx(0.9, rel=0.08) and c.between == pytest.approx(0.6, rel=0.15)


def test_paired_components_of_two_runs_on_the_same_rows():
    rng = np.random.default_rng(5)
    true = rng.normal(3.0, 0.8, 2000)
    a = _run_output(true=true + rng.normal(0, math.sqrt(0.3), 2000), var_w=0.9, seed=1)
    b = _run_output(true=true, var_w=0.5, seed=2)
    c = paired_components(a, b, "correctness")
    assert c.paired and c.rows == 2000
    # the differences' σ²_b is the 0.3 added to a's rows; σ²_w the sum of both judges' 0.9 + 0.5
    assert c.within == pytest.approx(1.4, rel=0.08) and c.between == pytest.approx(0.3, rel=0.25)


def test_draws_with_nulls_unbalanced_repeats_and_rows_without_a_score():
    table = pd.DataFrame({"row_id": ["a", "b", "c", "d"], "x/score": [2.0, 4.0, None, 3.0],
                          "x/status": ["scored", "scored", "failed:timeout", "scored"],
                          "x/draws": ["[1, 3, null]", [4, 4, 4], None, "[2, 4]"]})
    out = EvalOutput(metrics={}, table=table, results={}, transcripts=[], params={}, config={})
    got = row_draws(out, "x")
    assert got.to_dict() == {"a": [1.0, 3.0], "b": [4.0, 4.0, 4.0], "d": [2.0, 4.0]}
    c = variance_components(out, "x")
    # pooled within: ((1-2)² + (3-2)² + 0 + (2-3)² + (4-3)²) / (1 + 2 + 1) = 1
    assert c.within == pytest.approx(1.0)
    means = [2.0, 4.0, 3.0]
    assert c.between == pytest.approx(np.var(means, ddof=1) - 1.0 * np.mean([1 / 2, 1 / 3, 1 / 2]))


def test_a_panels_run_is_planned_from_its_first_judges_draws():
    # two judges x 2 repeats, judge-major: the second judge (another model) reads every row two levels higher
    table = pd.DataFrame({"row_id": ["a", "b"], "x/score": [2.0, 4.0], "x/status": ["scored", "scored"],
                          "x/draws": ["[1, 3, 3, 5]", "[4, 4, 6, 6]"]})
    out = EvalOutput(metrics={}, table=table, results={}, transcripts=[], params={},
                     config={"draws": {"judges": ["m1", "m2"], "repeats": 2, "cascade": False}})
    assert row_draws(out, "x").to_dict() == {"a": [1.0, 3.0], "b": [4.0, 4.0]}


def test_without_a_draws_column_the_runs_own_judge_variance_metrics_are_used():
    out = _run_output(n=100)
    out.table = out.table.drop(columns=["correctness/draws"])
    c = variance_components(out, "correctness")
    assert c.within is None and c.repeats == 1  # no repeats seen: the split is unknown
    out.metrics.update({"correctness/judge_variance": 0.9, "correctness/repeats": 3.0})
    c = variance_components(out, "correctness")
    assert c.within == 0.9 and c.repeats == 3 and "judge_variance" in c.source


def test_the_cost_per_row_draw_counts_cache_hits_but_not_shared_calls():
    out = _run_output(n=10, r=3, calls_per_draw=2)
    cost = draw_cost(out, "correctness", 3)
    assert cost is not None
    assert cost.requests == pytest.approx(2.0) and cost.tokens == pytest.approx(2 * 440)
    assert cost.usd == pytest.approx(2 * 0.0002)
    # a re-run from the cache still costs the same cold; a call another metric shared costs nothing
    for rec in out.transcripts[:30]:
        rec.update(cache_hit=True, input_tokens=0, output_tokens=0, cost_usd=0.0)
    out.transcripts[0]["shared"] = True
    cost = draw_cost(out, "correctness", 3)
    assert cost.requests == pytest.approx((60 - 1) / 30) and cost.usd == pytest.approx(0.0002 * (59 / 30))


# ----------------------------------------------------------------------------- (d) labels


def _calibrated_pilot():
    rng = np.random.default_rng(2)
    human = rng.integers(1, 6, 400).astype(float)
    judge = np.clip(human + rng.normal(0.3, 0.8, 400), 1, 5)
    labels = np.full(400, np.nan)
    labels[:120] = human[:120]
    return ppi_mean(judge, labels)


@pytest.mark.parametrize("goal", [{"width": 0.4}, {"detect": 0.3}, {"detect": 0.3, "unpaired": True}],
                         ids=["width", "detect-paired", "detect-unpaired"])
def test_the_labels_column_is_labels_needed_for_the_same_target(goal):
    est = _calibrated_pilot()
    p = plan_evaluation(VarianceComponents(1.0, 0.5, 400, 2, paired="width" not in goal and not goal.get("unpaired")),
                        labels=est, **goal)
    if "width" in goal:
        width = goal["width"]
    else:  # the width whose labels give the power: 2 δ z_{α/2} / (z_{α/2} + z_β), / √2 for two samples
        width = 2 * 0.3 * Z95 / (Z95 + NormalDist().inv_cdf(0.8)) / (math.sqrt(2) if goal.get("unpaired") else 1)
    assert p.labels is not None and p.labels.equivalent_width == pytest.approx(width)
    # PPI at the pilot's 400 judged rows, and at 2 and 4 times the rows the judge alone needs with one draw
    one = p.option(1).rows
    assert [m for m, _ in p.labels.ppi] == sorted({400, 2 * one, 4 * one})
    for m, n in p.labels.ppi:
        assert n == labels_needed(est, width, n_rows=m)["ppi"]
    assert p.labels.classical == labels_needed(est, width)["classical"]
    frame = p.to_frame().set_index("option")
    for m, n in p.labels.ppi:
        line = frame.loc[f"human labels + judge (PPI), {m} rows x 2 draw(s)"]
        assert line["labels"] == n and line["judged_draws"] == m * 2 * p.variants
    assert frame.loc["human labels alone", "labels"] == p.labels.classical
    more_rows = [n for _, n in p.labels.ppi if n is not None]
    assert more_rows == sorted(more_rows, reverse=True)  # more judged rows, fewer labels


# ----------------------------------------------------------------------------- (e) saved runs, the CLI, bad input


def _log(out: EvalOutput, name: str = "pilot") -> str:
    with mlflow.start_run(run_name=name) as run:
        log_output(out, run.info.run_id)
    return run.info.run_id


def test_cli_plan_on_a_saved_run_prints_the_table_of_the_components_it_read(tmp_tracking, capsys):
    out = _run_output(n=120)
    rid = _log(out)
    assert main(["plan", rid, "--metric", "correctness", "--width", "0.3"]) == 0
    printed = capsys.readouterr().out
    want = plan_evaluation(variance_components(out, "correctness"), width=0.3)
    for o in want.options:
        line = next(ln for ln in printed.splitlines() if ln.startswith(f"{o.repeats} draw(s)/row"))
        assert line.split()[2] == f"{o.rows:,}"
        assert line.split()[4] == f"{o.rows * o.repeats * 2:,}"  # two requests per row-draw, from the transcripts
    assert "σ²_w" in printed and "label-sample" in printed  # no labels yet: how to get them
    # the run read back plans as the output in hand did
    assert plan(rid, metric="correctness", width=0.3).options == plan(out, metric="correctness", width=0.3).options


def test_cli_plan_of_two_runs_is_paired_and_a_calibrated_run_gets_the_labels_lines(tmp_tracking, tmp_path, capsys):
    from mlflow_ragjudge.workflows.calibration import calibrate

    rng = np.random.default_rng(9)
    true = np.clip(rng.normal(3.0, 0.8, 200), 1, 5)
    a, b = _run_output(true=true, seed=1, shift=0.2), _run_output(true=true, seed=2)
    ra, rb = _log(a, "a"), _log(b, "b")
    assert main(["plan", ra, rb, "--metric", "correctness", "--detect", "0.1"]) == 0
    printed = capsys.readouterr().out
    assert "(paired)" in printed and "rows per variant" in printed and "differences of two variants" in printed
    # labels stored by `ragjudge calibrate` make the labels lines appear, with labels_needed's numbers
    labels = pd.DataFrame({"row_id": [f"q{i:03d}" for i in range(60)],
                           "correctness": np.clip(np.round(true[:60] + rng.normal(0, 0.5, 60)), 1, 5)})
    with pytest.warns(Warning):
        calibrate(ra, labels)
    assert main(["plan", ra, "--metric", "correctness", "--width", "0.4"]) == 0
    printed = capsys.readouterr().out
    est = ppi_mean(a.table["correctness/score"].to_numpy(),
                   labels.set_index("row_id")["correctness"].reindex(a.table["row_id"]).to_numpy())
    ppi_lines = [ln.split() for ln in printed.splitlines() if ln.startswith("labels + 3 draw(s)/row")]
    assert ppi_lines and ppi_lines[0][4] == "200"  # the pilot's rows first
    for line in ppi_lines:
        want = labels_needed(est, 0.4, n_rows=int(line[4].replace(",", "")))
        assert line[-1] == (f"{want['ppi']:,}" if want["ppi"] is not None else "-")
    alone_line = next(ln for ln in printed.splitlines() if ln.startswith("labels alone"))
    assert alone_line.split()[-1] == f"{labels_needed(est, 0.4)['classical']:,}"


@pytest.mark.parametrize("argv, words", [
    (["--metric", "correctnes", "--width", "0.3"], ["'correctnes'", "outputs with a score are: correctness"]),
    (["--metric", "correctness", "--width", "0"], ["width=0.0", "positive"]),
    (["--metric", "correctness", "--width", "-0.2"], ["width=-0.2", "positive"]),
    (["--metric", "correctness", "--detect", "0.1", "--power", "1.2"], ["power=1.2", "between 0 and 1"]),
    (["--metric", "correctness", "--width", "0.3", "--alpha", "0"], ["alpha=0.0", "between 0 and 1"]),
], ids=["unknown-metric", "zero-width", "negative-width", "power", "alpha"])
def test_cli_plan_refuses_bad_input_naming_the_value_and_the_fix(tmp_tracking, capsys, argv, words):
    rid = _log(_run_output(n=40))
    assert main(["plan", rid, *argv]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_plan_needs_exactly_one_target_and_a_known_run(tmp_tracking):
    out = _run_output(n=40)
    with pytest.raises(ValueError, match="exactly one of them"):
        plan(out, metric="correctness")
    with pytest.raises(ValueError, match="exactly one of them"):
        plan(out, metric="correctness", width=0.2, detect=0.1)
    with pytest.raises(InputError, match="No MLflow run 'nope'"):
        plan("nope", metric="correctness", width=0.2)
    with pytest.raises(SystemExit):  # argparse: --width and --detect are exclusive
        main(["plan", "x", "--metric", "correctness", "--width", "0.2", "--detect", "0.1"])


def test_a_sweep_parent_plans_the_comparison_that_needs_the_most_rows(tmp_tracking, capsys):
    rng = np.random.default_rng(4)
    true = rng.normal(3.0, 0.8, 150)
    base = _run_output(true=true, seed=1)
    near = _run_output(true=true + rng.normal(0, 0.2, 150), seed=2)
    far = _run_output(true=true + rng.normal(0, 1.0, 150), seed=3)  # its differences from the baseline vary most
    with mlflow.start_run(run_name="sweep", tags={"ragjudge.sweep": "parent"}) as parent:
        pid = parent.info.run_id
    ids = {}
    for name, out in (("base", base), ("near", near), ("far", far)):
        tags = {"ragjudge.sweep.parent": pid, **({"ragjudge.sweep.baseline": "true"} if name == "base" else {})}
        with mlflow.start_run(run_name=name, tags=tags) as run:
            log_output(out, run.info.run_id)
        ids[name] = run.info.run_id
    got = plan(pid, metric="correctness", detect=0.3)
    want = plan_evaluation(paired_components(far, base, "correctness"), detect=0.3, variants=3,
                           cost=DrawCost(2.0, 880.0, 0.0004))
    assert got.variants == 3
    assert [(o.rows, o.draws, o.requests, o.tokens) for o in got.options] == \
        [(o.rows, o.draws, o.requests, o.tokens) for o in want.options]
    assert [o.usd for o in got.options] == pytest.approx([o.usd for o in want.options])
    assert "a sweep of 3 variants" in got.text() and "far" in got.components.source
    assert main(["plan", pid, "--metric", "correctness", "--detect", "0.3"]) == 0
    assert "(paired)" in capsys.readouterr().out


def test_the_offline_judge_has_no_judge_noise_and_costs_no_requests():
    out = _run_output(n=60)
    out.table = out.table.drop(columns=["correctness/draws"])
    out.transcripts, out.params = [], {"ragjudge.judge": "offline:/lexical"}
    c = variance_components(out, "correctness")
    assert c.within == 0.0 and "offline judge" in c.source
    p = plan_evaluation(c, width=0.3, cost=draw_cost(out, "correctness"))
    assert len({o.rows for o in p.options}) == 1 and all(o.requests == 0 for o in p.options)
    assert "repeats change nothing" in p.text()
