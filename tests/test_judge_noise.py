"""The judge's own noise: repeated draws (``repeats``), panels of judges (``judge=[...]``) and the cheap-first cascade
(``escalate_to``), end to end -- docs/judge-noise.md.

The noisy judge (tests/noisy_model.py) is the independent schema-following model with a known flip probability per
draw; the panel and cascade judges are scripted per row by a marker in the test's own questions (``QID<n>``), never by
our prompts' wording."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from noisy_model import NoisyModel

from mlflow_ragjudge import FakeBackend, evaluate_frame
from mlflow_ragjudge.adapters.run_load import load_output
from mlflow_ragjudge.engine.draws import combined_value
from mlflow_ragjudge.engine.noise import NoiseSums, noise_stats

TESTS = Path(__file__).resolve().parent


def _rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({
        "question": [f"What does unit {i} store?" for i in range(n)],
        "answer": [f"Unit {i} stores reports and logs for {i % 5 + 1} days." for i in range(n)],
        "reference": [f"Unit {i} stores reports." for i in range(n)],
    })


def _within_3_se(truth: float, low: float, high: float) -> bool:
    """``truth`` within three standard errors of the estimate whose 95 % interval is [low, high] (1.96 SE each side)."""
    mid, half = (low + high) / 2, (high - low) / 2
    return abs(truth - mid) <= half * 3 / 1.96


@pytest.fixture
def noisy(fake_llm, monkeypatch):
    """A judge on the fake server (the real openai SDK) that flips a row's level with probability 0.2 per draw."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-noise-0001")
    model = NoisyModel(0.2, values=[1, 2, 3, 4, 5])  # the scored levels (0 is "not sure": an abstention)
    fake_llm.set_handler(model)
    return model, f"openai:/noisy-judge?base_url={fake_llm.openai_base_url}"


def test_repeats_measure_a_known_flip_rate_and_judge_variance_within_their_intervals(noisy, fake_llm, tmp_path):
    model, uri = noisy
    df, p, n = _rows(150), 0.2, 3
    cfg = {"judge": uri, "metrics": ["correctness"], "context_mode": "none", "progress": False}
    once = evaluate_frame(df, cfg, cache=False)
    single = len(fake_llm.requests_for("openai_chat"))
    assert single == 150 and "correctness/flip_rate" not in once.metrics  # one draw: nothing to measure
    fake_llm.reset()
    fake_llm.set_handler(model)
    out = evaluate_frame(df, cfg, repeats=n, cache=str(tmp_path / "calls"))
    sent = fake_llm.requests_for("openai_chat")
    assert len(sent) == n * single  # exactly n times the judged requests, cold
    # each draw its own request: the seeds a provider takes (draw 0 is the plain request)
    assert sorted({r._get("seed") for r in sent}, key=str) == [1, 2, None]
    m = out.metrics
    truth_flip = 1 - (1 - p) ** n - p ** n
    # the truth within three standard errors (1.5 x the 95 % half-width): one seeded draw of the experiment, which
    # any change of the prompts' wording draws anew (the model hashes the conversation), misses a 95 % interval
    # one time in twenty; a biased estimate misses this one too
    assert _within_3_se(truth_flip, m["correctness/flip_rate_ci_low"], m["correctness/flip_rate_ci_high"]), m
    pairs = [v["score"] for v in model.pairs.values()]
    assert len(pairs) == 150
    truth_var = sum(p * (1 - p) * (a - b) ** 2 for a, b in pairs) / len(pairs)
    assert _within_3_se(truth_var, m["correctness/judge_variance_ci_low"], m["correctness/judge_variance_ci_high"]), m
    assert m["correctness/repeats"] == n and m["correctness/rows_with_repeats"] == 150
    assert 0 < m["correctness/judge_share"] < 1
    # each row's score is its draws' majority (a level stays a level); the draws and their spread are in the table
    draws = [json.loads(d) for d in out.table["correctness/draws"]]
    assert all(len(d) == n for d in draws)
    assert list(out.table["correctness/score"]) == [combined_value(d, "majority") for d in draws]
    assert out.table["correctness/level"].isin([1, 2, 3, 4, 5]).all()
    # the run's statistics are those of the draws in the table
    stats = noise_stats(draws)
    assert stats["flip_rate"] == m["correctness/flip_rate"]
    assert stats["judge_variance"] == pytest.approx(m["correctness/judge_variance"])
    # an identical re-run is free: every draw is its own cache entry
    fake_llm.reset()
    fake_llm.set_handler(model)
    again = evaluate_frame(df, cfg, repeats=n, cache=str(tmp_path / "calls"))
    assert fake_llm.requests_for("openai_chat") == []
    assert again.metrics["correctness/flip_rate"] == m["correctness/flip_rate"]
    assert again.metrics["judge/cache_hits"] == n * single


def test_repeat_temperature_is_sent_with_every_draw(noisy, fake_llm):
    _, uri = noisy
    evaluate_frame(_rows(4), judge=uri, metrics=["correctness"], repeats=2, repeat_temperature=0.7, cache=False,
                   progress=False)
    sent = fake_llm.requests_for("openai_chat")
    assert len(sent) == 8 and {r.temperature for r in sent} == {0.7}


def test_noise_sums_of_parts_merge_into_the_statistics_of_the_whole():
    rows = [[1, 1, 2], [3, 3, 3], [5, 4], [2, 2, 2], [1, 5, 5], [4]]
    whole = noise_stats(rows)
    merged = NoiseSums.of(rows[:2]).merge(NoiseSums.of(rows[2:])).stats()
    assert merged.keys() == whole.keys()
    assert all(merged[k] == pytest.approx(whole[k]) for k in whole)
    # by hand: 5 rows with two or more draws, 3 of them not all equal
    assert whole["rows_with_repeats"] == 5 and whole["flip_rate"] == pytest.approx(3 / 5)
    # within-row variances: 1/3, 0, 1/2, 0, 16/3 -> mean 37/30
    assert whole["judge_variance"] == pytest.approx((1 / 3 + 0 + 0.5 + 0 + 16 / 3) / 5)


@pytest.mark.parametrize(("values", "rule", "want"), [
    pytest.param([3, 4, 4], "majority", 4, id="majority"),
    pytest.param([3, 5], "majority", 3, id="a-tie-goes-to-the-value-nearest-the-mean-then-the-lower"),
    pytest.param([2, 2, 5, 5, 3], "majority", 2, id="tie-nearest-the-mean-3.4-is-2-or-5:-2-is-nearer"),
    pytest.param([1, 2, 4, 5], "median", 3.0, id="median-of-an-even-count"),
    pytest.param([1, 2, 6], "mean", 3.0, id="mean"),
    pytest.param([], "mean", None, id="no-values"),
])
def test_combined_value_rules(values, rule, want):
    assert combined_value([float(v) for v in values], rule) == want


# ----------------------------------------------------------------------------- panels

#: each judge's level per row (QID0..QID7), chosen so that the judges agree on some rows and not on others
LEVELS = {"ja": [5, 4, 3, 2, 1, 5, 4, 3], "jb": [5, 4, 2, 2, 1, 4, 4, 3], "jc": [4, 4, 3, 1, 1, 5, 3, 3]}


def _scripted(name: str, levels: dict[str, list[int]], seen: list[int] | None = None) -> FakeBackend:
    def handler(request):
        text = " ".join(m["content"] for m in request.messages)
        i = int(re.search(r"QID(\d+)\b", text).group(1))
        if seen is not None:
            seen.append(i)
        level = levels[name][i]
        if isinstance(level, dict):  # per draw: the seed the draw was sent with
            level = level[request.seed]
        return {"feedback": f"judge {name} on row {i}", "score": level}
    return FakeBackend(handler=handler, model=name)


def _qid_rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({"question": [f"QID{i}: which unit stores the logs?" for i in range(n)],
                         "answer": [f"Unit {i}." for i in range(n)], "reference": [f"Unit {i}." for i in range(n)]})


def _fleiss_by_hand(units: list[list[int]]) -> float:
    """Fleiss (1971): P_i = (sum_j n_ij^2 - m) / (m (m - 1)) per unit with m raters, P-bar their mean, p_j the share
    of all ratings in category j, P_e = sum_j p_j^2; kappa = (P-bar - P_e) / (1 - P_e)."""
    m = len(units[0])
    cats = sorted({v for u in units for v in u})
    p_i = [(sum(u.count(c) ** 2 for c in cats) - m) / (m * (m - 1)) for u in units]
    p_bar = sum(p_i) / len(units)
    p_e = sum((sum(u.count(c) for u in units) / (m * len(units))) ** 2 for c in cats)
    return (p_bar - p_e) / (1 - p_e)


def test_a_panel_of_three_judges_keeps_each_judges_scores_and_gives_the_kappa_computed_by_hand():
    judges = [_scripted(name, LEVELS) for name in LEVELS]
    out = evaluate_frame(_qid_rows(8), judge=judges, metrics=["correctness"], context_mode="none", cache=False,
                         progress=False)
    m, table = out.metrics, out.table
    for name, levels in LEVELS.items():
        assert table[f"correctness/score@{name}"].tolist() == levels
        assert m[f"correctness/by_judge/{name}/mean"] == pytest.approx(sum(levels) / 8)
        assert all(len(b.requests) == 8 for b in judges)
    # the panel's verdict per row: the majority of the three (a three-way tie: the value nearest their mean)
    units = [list(u) for u in zip(*LEVELS.values())]
    assert table["correctness/score"].tolist() == [combined_value([float(v) for v in u], "majority") for u in units]
    assert m["correctness/mean"] == pytest.approx(sum(table["correctness/score"]) / 8)
    # row 0: 5,5,4 -> P = (4 + 1 - 3) / 6 = 1/3 ... every unit by the formula in _fleiss_by_hand
    assert m["correctness/panel/fleiss_kappa"] == pytest.approx(_fleiss_by_hand(units))
    assert -1 <= m["correctness/panel/alpha"] <= 1
    assert {k for k in m if "/panel/kappa/" in k} == {"correctness/panel/kappa/ja__jb",
                                                      "correctness/panel/kappa/ja__jc",
                                                      "correctness/panel/kappa/jb__jc"}
    assert out.params["ragjudge.judges"] == "ja,jb,jc"
    # every judge's calls are in the transcripts, each naming its judge
    assert sorted({t["judge"] for t in out.transcripts}) == ["ja", "jb", "jc"]


def test_the_panels_agreement_equals_statsmodels_sklearn_and_krippendorff():
    fleiss = pytest.importorskip("statsmodels.stats.inter_rater")
    metrics = pytest.importorskip("sklearn.metrics")
    judges = [_scripted(name, LEVELS) for name in LEVELS]
    out = evaluate_frame(_qid_rows(8), judge=judges, metrics=["correctness"], context_mode="none", cache=False,
                         progress=False)
    units = [list(u) for u in zip(*LEVELS.values())]
    table, _ = fleiss.aggregate_raters(units)
    assert out.metrics["correctness/panel/fleiss_kappa"] == pytest.approx(fleiss.fleiss_kappa(table))
    assert out.metrics["correctness/panel/kappa/ja__jb"] == pytest.approx(
        metrics.cohen_kappa_score(LEVELS["ja"], LEVELS["jb"], weights="quadratic"))
    kr = pytest.importorskip("krippendorff")
    assert out.metrics["correctness/panel/alpha"] == pytest.approx(
        kr.alpha(reliability_data=[LEVELS[n] for n in LEVELS], level_of_measurement="ordinal"))


# ----------------------------------------------------------------------------- the cascade

def test_a_cascade_sends_the_second_judge_only_the_rows_the_rule_names():
    # the cheap judge: level 0 ("not sure") on rows 3 and 6; 3 and 4 sit at the 3.5 threshold (rows 1, 2)
    cheap = {"cheap": [5, 4, 3, 0, 1, 5, 0, 2]}
    strong = {"strong": [5, 5, 2, 2, 1, 4, 4, 3]}
    seen: list[int] = []
    first, second = _scripted("cheap", cheap), _scripted("strong", strong, seen)
    out = evaluate_frame(_qid_rows(8), judge=first, escalate_to=second, fail_under={"correctness": 3.5},
                         metrics=["correctness"], context_mode="none", cache=False, progress=False)
    assert sorted(seen) == [1, 2, 3, 6]
    assert out.table["correctness/escalated"].tolist() == [i in (1, 2, 3, 6) for i in range(8)]
    # the second judge's verdict on the rows it was sent, the first's elsewhere
    want = [strong["strong"][i] if i in (1, 2, 3, 6) else cheap["cheap"][i] for i in range(8)]
    assert out.table["correctness/score"].tolist() == want
    assert out.metrics["correctness/escalated"] == 4
    assert out.metrics["judge/escalation/requests"] == 4
    assert out.metrics["judge/escalation/requests_saved"] == 4  # one request per row, 4 rows not sent
    # only abstentions
    seen.clear()
    evaluate_frame(_qid_rows(8), judge=_scripted("cheap", cheap), escalate_to=_scripted("strong", strong, seen),
                   escalate_when=["abstain"], fail_under={"correctness": 3.5}, metrics=["correctness"],
                   context_mode="none", cache=False, progress=False)
    assert sorted(seen) == [3, 6]


def test_a_cascade_escalates_the_rows_whose_repeated_draws_disagree():
    # row 5's two draws differ (the plain request says 2, the draw sent with seed 1 says 4); the rest agree
    levels = {"cheap": [5, 4, 3, 2, 1, {None: 2, 1: 4}, 4, 3]}
    seen: list[int] = []
    out = evaluate_frame(_qid_rows(8), judge=_scripted("cheap", levels),
                         escalate_to=_scripted("strong", {"strong": [1] * 8}, seen), escalate_when=["spread"],
                         repeats=2, metrics=["correctness"], context_mode="none", cache=False, progress=False)
    assert seen == [5, 5]  # both draws of the second judge, on row 5 only
    assert out.metrics["correctness/flip_rate"] == pytest.approx(1 / 8)
    assert out.table["correctness/score"].tolist()[5] == 1


# ----------------------------------------------------------------------------- settings and estimates

@pytest.mark.parametrize(("settings", "says"), [
    pytest.param({"judge": "offline:/lexical", "repeats": 3}, "offline judge", id="offline-repeats"),
    pytest.param({"judge": ["offline:/lexical", "openai:/gpt-4o-mini"]}, "offline judge", id="offline-in-panel"),
    pytest.param({"judge": ["openai:/a", "openai:/b"], "escalate_to": "openai:/c"}, "panel", id="panel-cascade"),
    pytest.param({"judge": "openai:/a", "repeats": 0}, "repeats=0", id="repeats-0"),
    pytest.param({"judge": "openai:/a", "panel_rule": "vote"}, "panel_rule='vote'", id="rule"),
    pytest.param({"judge": "openai:/a", "escalate_when": ["unsure"]}, "escalate_when", id="when"),
])
def test_bad_noise_settings_are_refused_before_any_call(settings, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        evaluate_frame(_rows(2), settings, metrics=["correctness"], cache=False)


def test_a_dry_run_counts_every_draw_of_every_judge():
    one = evaluate_frame(_rows(5), judge="openai:/gpt-4o-mini", metrics=["correctness"], dry_run=True)
    many = evaluate_frame(_rows(5), judge=["openai:/gpt-4o-mini", "openai:/gpt-4.1-mini"], repeats=3,
                          metrics=["correctness"], dry_run=True)
    assert many.metrics["estimate/total/calls"] == 6 * one.metrics["estimate/total/calls"] == 30


# ----------------------------------------------------------------------------- with the rest of the product

@pytest.mark.inprocess_judge
def test_repeats_compose_with_human_calibration(judge):
    df = _rows(120)
    df["human_correctness"] = [float(i % 5 + 1) if i % 2 == 0 else None for i in range(120)]
    out = evaluate_frame(df, judge=judge, metrics=["correctness"], repeats=2, context_mode="none", cache=False,
                         human_labels={"correctness": "human_correctness"}, progress=False)
    assert "correctness/ppi_mean" in out.metrics and "correctness/flip_rate" in out.metrics
    scored_labelled = out.table["correctness/score"].notna() & out.table["human_correctness"].notna()
    assert out.metrics["correctness/n_labelled"] == scored_labelled.sum() >= 30


def test_the_cli_runs_a_panel_with_repeats_and_logs_one_feedback_per_judge(fake_llm, monkeypatch, tmp_tracking,
                                                                           tmp_path, capsys):
    import mlflow
    from compliant_model import CompliantModel

    from mlflow_ragjudge.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-panel-0001")
    fake_llm.set_handler(CompliantModel("json_schema"))
    data = tmp_path / "rows.jsonl"
    _rows(6).to_json(data, orient="records", lines=True)
    url = fake_llm.openai_base_url
    rc = main(["evaluate", str(data), "--judge", f"openai:/judge-a?base_url={url}", "--judge",
               f"openai:/judge-b?base_url={url}", "--repeats", "2", "--metrics", "correctness",
               "--context-mode", "none", "--no-cache"])
    assert rc == 0, capsys.readouterr()
    assert len(fake_llm.requests_for("openai_chat")) == 6 * 2 * 2
    run = mlflow.search_runs(experiment_ids=["0"], output_format="list")[0]
    metrics = run.data.metrics
    assert {"correctness/flip_rate", "correctness/by_judge/judge-b/flip_rate", "correctness/panel/fleiss_kappa",
            "correctness/by_judge/judge-a/mean"} <= set(metrics)
    assert run.data.params["ragjudge.judges"] == "judge-a,judge-b"
    traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list")
    assert len(traces) == 6
    table = load_output(run.info.run_id).table
    for label in ("judge-a", "judge-b"):
        with_feedback = [a for t in traces for a in t.info.assessments if a.name == f"correctness@{label}"]
        # one Feedback per judge on every row the judge scored (a row it abstained on: the row's own says why)
        assert len(with_feedback) == table[f"correctness/score@{label}"].notna().sum() >= 1
        assert {a.source.source_id for a in with_feedback} == {label}
    panel = [a for t in traces for a in t.info.assessments if a.name == "correctness"]
    assert len(panel) == 6 and {a.source.source_id for a in panel} == {"panel:judge-a,judge-b"}


def test_a_sweep_with_repeats_logs_the_flip_rate_of_every_variant(tmp_tracking):
    from mlflow_ragjudge.workflows.sweep import sweep

    sys.path.insert(0, str(TESTS))
    from inprocess import CompliantBackend

    questions = pd.DataFrame({"question": [f"What does unit {i} store?" for i in range(6)],
                              "reference": [f"Unit {i} stores reports." for i in range(6)]})

    def answer(question: str, style: str) -> str:
        return f"{style}: {question.replace('What does', '').replace('?', '')} stores reports."

    result = sweep(answer, [{"style": "short"}, {"style": "long"}], questions,
                   evaluator_config={"judge": CompliantBackend(), "metrics": ["correctness"], "repeats": 2,
                                     "context_mode": "none", "cache": False, "progress": False})
    import mlflow

    for run_id in result.run_ids.values():
        metrics = mlflow.get_run(run_id).data.metrics
        assert metrics["correctness/repeats"] == 2 and "correctness/flip_rate" in metrics
    assert math.isfinite(result.comparison["mean_diff"].iloc[0])


def test_a_row_whose_draw_a_stop_left_unjudged_is_interrupted_not_scored_from_fewer_draws():
    from mlflow_ragjudge.core.types import JudgeResult, Status
    from mlflow_ragjudge.engine.draws import combine

    done = [JudgeResult.scored(4.0, "ok"), JudgeResult.scored(5.0, "ok")]
    stopped = JudgeResult.failed("interrupted", "not judged: the evaluation was stopped (SIGINT) first")
    row = combine([*done, stopped], "mean")
    assert row.status is Status.FAILED and row.reason == "interrupted"
    # a draw that failed for another reason is left out, as an abstaining row is left out of a mean
    row = combine([*done, JudgeResult.failed("parse_error", "unreadable")], "mean")
    assert row.status is Status.SCORED and row.value == 4.5


def test_a_judge_that_never_flips_has_a_flip_rate_interval_from_exactly_zero():
    stats = noise_stats([[3.0, 3.0, 3.0]] * 10)
    assert stats["flip_rate"] == 0 and stats["flip_rate_ci_low"] == 0.0
    assert stats["flip_rate_ci_high"] == pytest.approx(0.2775, abs=1e-4)  # Wilson, n = 10, k = 0: z^2 / (n + z^2)
    assert stats["judge_variance"] == 0 and "judge_share" not in stats  # no variance at all: no share to give


def test_a_scorer_with_repeats_judges_each_row_n_times_and_says_so_in_the_feedback(noisy, fake_llm):
    from mlflow_ragjudge.adapters.scorers import Correctness

    _, uri = noisy
    scorer = Correctness(judge=uri, cache=False, repeats=3, context_mode="none")
    feedback = [scorer(inputs={"question": f"What does unit {i} store?"}, outputs=f"Unit {i} stores reports.",
                       expectations={"expected_response": f"Unit {i} stores reports."}) for i in range(12)]
    assert len(fake_llm.requests_for("openai_chat")) == 36
    assert sorted({r._get("seed") for r in fake_llm.requests_for("openai_chat")}, key=str) == [1, 2, None]
    for fb in feedback:
        draws = json.loads(fb.metadata["draws"])
        assert len(draws) == 3 and fb.value == combined_value([float(d) for d in draws], "majority")
    assert any(len(set(json.loads(fb.metadata["draws"]))) > 1 for fb in feedback)  # p = 0.2: some rows flip
    with pytest.raises(ValueError, match="one scorer per judge"):
        Correctness(judge=[uri, uri])


def test_a_panel_on_a_continuous_score_gives_alpha_and_no_kappa():
    from inprocess import CompliantBackend

    df = pd.DataFrame({"question": [f"What does unit {i} store?" for i in range(8)],
                       "answer": [f"Unit {i} stores reports. It runs at night. It has {i} disks." for i in range(8)],
                       "contexts": [[f"Unit {i} stores reports at night."] for i in range(8)]})
    out = evaluate_frame(df, judge=[CompliantBackend(model="a"), CompliantBackend(model="b")],
                         metrics=["faithfulness"], cache=False, progress=False)
    values = out.table["faithfulness/score@a"].dropna()
    assert values.nunique() > 1 and not values.isin([0.0, 1.0]).all()  # a share of claims, not a verdict
    assert not any("/panel/fleiss_kappa" in k or "/panel/kappa/" in k for k in out.metrics)
    # the two judges are the same model answering alike: perfect agreement on the interval scale
    assert out.metrics["faithfulness/panel/alpha"] == pytest.approx(1.0)


def test_a_panels_agreement_split_over_parts_adds_up_to_the_whole():
    """What a Spark run does on its partitions: each part hands back its panel sums (coincidences, confusion
    matrices, Fleiss' sums) and its judge-noise sums; merged, they give the numbers of one process."""
    from mlflow_ragjudge.engine.config import RagJudgeConfig
    from mlflow_ragjudge.engine.parts import evaluate_part, merge_parts, part_summary

    levels = {name: [v for _ in range(3) for v in vs] for name, vs in LEVELS.items()}  # 24 rows
    cfg = RagJudgeConfig.from_dict({"judge": [_scripted(n, levels) for n in levels], "metrics": ["correctness"],
                                    "context_mode": "none", "cache": False, "progress": False})
    rows = _qid_rows(24)
    whole = evaluate_frame(rows, cfg)
    parts = [part_summary(evaluate_part(rows.iloc[a:b].reset_index(drop=True), cfg, first_row=a), a)
             for a, b in ((0, 7), (7, 15), (15, 24))]
    merged = merge_parts(json.loads(json.dumps(parts)), cfg).metrics  # through JSON, as the executors send them
    panel = {k: v for k, v in whole.metrics.items() if "/panel/" in k or "/by_judge/" in k}
    assert len(panel) == 8  # alpha, Fleiss, three pairs, three judges' means
    assert {k: merged[k] for k in panel} == pytest.approx(panel)


def test_repeats_on_a_plain_text_server_score_every_row_with_each_draw(fake_llm, monkeypatch):
    """A server that refuses any response_format and answers in prose-wrapped JSON: the connection negotiates down
    to plain text once, and every draw of every row is scored; the draws are still distinct requests (their seeds)."""
    from compliant_model import CompliantModel

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-noise-text-1")
    fake_llm.set_handler(CompliantModel("text"))
    uri = f"openai:/text-judge?base_url={fake_llm.openai_base_url}"
    out = evaluate_frame(_rows(10), judge=uri, metrics=["correctness"], repeats=2, context_mode="none", cache=False,
                         progress=False)
    assert out.metrics["correctness/n_failed"] == 0 and out.metrics["correctness/repeats"] == 2
    sent = [r for r in fake_llm.requests_for("openai_chat") if r.response_format is None]
    assert len(sent) == 20 and {r._get("seed") for r in sent} == {None, 1}
    assert all(len(json.loads(d)) == 2 for d in out.table["correctness/draws"])


def test_a_panel_with_repeats_and_its_judge_report_on_a_real_mlflow_server_in_a_named_experiment(
        fake_llm, monkeypatch, mlflow_server, tmp_path, capsys):
    import mlflow
    from compliant_model import CompliantModel

    from mlflow_ragjudge.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-panel-srv-1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    fake_llm.set_handler(CompliantModel("json_schema"))
    data = tmp_path / "rows.jsonl"
    _rows(6).to_json(data, orient="records", lines=True)
    url = fake_llm.openai_base_url
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_server)
    try:
        rc = main(["evaluate", str(data), "--judge", f"openai:/judge-a?base_url={url}", "--judge",
                   f"openai:/judge-b?base_url={url}", "--repeats", "2", "--metrics", "correctness",
                   "--context-mode", "none", "--no-cache", "--experiment", "panel-on-a-server",
                   "--run-name", "panel"])
        assert rc == 0, capsys.readouterr()
        exp = mlflow.get_experiment_by_name("panel-on-a-server")
        run = mlflow.search_runs(experiment_ids=[exp.experiment_id], output_format="list")[0]
        assert {"correctness/flip_rate", "correctness/panel/alpha"} <= set(run.data.metrics)
        traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list")
        assert len(traces) == 6
        assert any(a.name == "correctness@judge-b" for t in traces for a in t.info.assessments)
        table = load_output(run.info.run_id).table
        labels = tmp_path / "labels.csv"
        pd.DataFrame({"row_id": table["row_id"], "correctness": [5, 4, 3, 2, 1, 5]}).to_csv(labels, index=False)
        assert main(["judge-report", run.info.run_id, "--labels", str(labels)]) == 0
        metrics = mlflow.get_run(run.info.run_id).data.metrics
        assert metrics["judge_report/correctness/n"] == (table["correctness/score"].notna()).sum()
        assert main(["plan", run.info.run_id, "--metric", "correctness", "--width", "0.5"]) == 0
    finally:
        mlflow.set_tracking_uri(before)
