"""The offline judge (offline:/lexical): its text rules, its scorers, and how the engine, the scorers and the
CLI run it -- skipping what it cannot score, never calling a model."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pandas as pd
import pytest

from mlflow_ragjudge import InputError, evaluate_frame
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.core.constants import is_offline_judge
from mlflow_ragjudge.core.matching import content_tokens, declines_to_answer, match_tokens
from mlflow_ragjudge.metrics.offline import FEATURES, Calibration, OfflineJudge, answer_features
from mlflow_ragjudge.metrics.offline_reading import CONTRADICTED

OFFLINE = "offline:/lexical"


# ----------------------------------------------------------------------------- text rules


@pytest.mark.parametrize(
    "text, tokens",
    [
        pytest.param("Dáin Ironfoot", ["dain", "ironfoot"], id="accents-folded"),
        pytest.param("2,579 steps", ["2579", "step"], id="thousands-separator-and-plural"),
        pytest.param("eight teams, the 14th season", ["8", "team", "the", "14", "season"], id="number-words"),
        pytest.param("the fifteenth season", ["the", "15", "season"], id="ordinal-word"),
        pytest.param("Sharecroppers, sharecropping", ["sharecrop", "sharecrop"], id="suffixes"),
        pytest.param("東京", ["東", "京"], id="cjk-characters-kept"),
        pytest.param("1, 200 and 3,5", ["1", "200", "and", "3", "5"], id="list-commas-are-not-thousands"),
    ],
)
def test_match_tokens(text, tokens):
    assert match_tokens(text) == tokens


def test_content_tokens_drop_function_words():
    assert content_tokens("The capital of France is Paris.") == ["capital", "france", "paris"]


@pytest.mark.parametrize(
    "response, declines",
    [
        pytest.param("I'm not sure; the documentation I found does not say.", True, id="not-sure-and-docs-silent"),
        pytest.param("I do not have specific information about version 6.16.0.", True, id="no-information"),
        pytest.param("Sorry, I don't know.", True, id="sorry-dont-know"),
        pytest.param("I don't know. Feel free to ask anything else!", True, id="decline-plus-courtesy"),
        pytest.param("The context does not mention the release date.", True, id="context-silent"),
        pytest.param("わかりません。", True, id="japanese"),
        pytest.param("The capital is Paris, but there is no information about its population.", False,
                     id="partial-answer-keeps-its-answer"),
        pytest.param("The policy does not cover flood damage.", False, id="negative-fact-is-an-answer"),
        pytest.param("You cannot find duplicates with UNION ALL.", False, id="cannot-in-a-fact"),
        pytest.param("You're welcome! If you have any more questions, feel free to ask.", False,
                     id="courtesy-only-is-not-a-decline"),
        pytest.param("", False, id="empty"),
    ],
)
def test_declines_only_when_the_whole_response_declines(response, declines):
    assert declines_to_answer(response) is declines


def test_a_decline_about_the_question_itself_is_still_a_decline():
    q = "What is the population of Paris?"
    assert declines_to_answer("The population of Paris is not mentioned in the documents.", q)
    assert not declines_to_answer("Paris has 2.1 million people; its suburbs are not mentioned in the documents.", q)


def test_answer_features():
    f = answer_features("who wrote it", "B. R. Ambedkar wrote it", "Bhimrao Ramji Ambedkar")
    assert f is not None and f["recall"] == 1.0 and f["phrase"] == 0.0  # initials match their words
    f = answer_features("when did it open", "It opened in 1850.", "18 January 1788")
    assert f is not None and f["number_missing"] == 1.0 and f["number_conflict"] == 1.0
    f = answer_features("q", "Paris is the capital of France.", "Paris")
    assert f is not None and f["phrase"] == 1.0 and f["recall"] == 1.0
    # the response's words backed by the contexts count as support; other words do not
    assert answer_features("q", "Paris has the Louvre", "Paris", ["The Louvre is in Paris."])["support"] == 1.0
    assert answer_features("q", "Paris has the Louvre", "Paris")["support"] == 0.5
    assert set(f) == set(FEATURES)
    assert answer_features("q", "anything", "   ") is None


# ----------------------------------------------------------------------------- calibration


def test_shipped_calibration_is_consistent():
    cal = Calibration.shipped()
    assert set(cal.features) <= set(FEATURES) and len(cal.weights) == len(cal.features)
    assert 0 < cal.cuts["4"] <= cal.cuts["5"] <= 1.0 + 1e-9
    assert 0 < cal.recall_cuts["2"] <= cal.recall_cuts["3"] <= 1
    assert 0 < cal.support_threshold < 1
    # a contradicted claim's support (at most CONTRADICTED) stays below what a supported claim needs
    assert CONTRADICTED < cal.claim_cut < 1
    held = cal.fit["held_out"]  # the measured agreement travels with the numbers
    assert held["nq301"]["rows"] > 700 and held["mtrag_rows"] > 100
    grid = [(p / 100, r / 20) for p in range(101) for r in range(21)]
    for p, r in grid:  # more probability or more recall never lowers the level
        assert cal.level(p, r) <= cal.level(min(1.0, p + 0.01), r)
        assert cal.level(p, r) <= cal.level(p, min(1.0, r + 0.05))
    assert cal.level(0.0, 0.0) == 1 and cal.level(1.0, 1.0) == 5


def test_calibration_refuses_bad_numbers():
    good = Calibration.shipped().to_dict()
    with pytest.raises(ValueError, match="not increasing"):
        Calibration.from_dict({**good, "cuts": {"4": 0.6, "5": 0.5}})
    with pytest.raises(ValueError, match="above 0"):
        Calibration.from_dict({**good, "recall_cuts": {"2": 0.0, "3": 0.5}})
    with pytest.raises(ValueError, match="unknown"):
        Calibration.from_dict({**good, "features": ["recall", "vibes"], "weights": [1.0, 1.0]})


# ----------------------------------------------------------------------------- the scorers


@pytest.fixture(scope="module")
def judge():
    return OfflineJudge()


def test_correctness_levels_follow_the_evidence(judge):
    q = "Who wrote Hamlet?"
    right = judge.correctness(q, "Hamlet was written by William Shakespeare.", ["William Shakespeare"])
    wrong = judge.correctness(q, "Christopher Marlowe wrote it.", ["William Shakespeare"])
    half = judge.correctness(q, "It was Edmund Shakespeare.", ["William Shakespeare"])
    assert right.is_scored and right.value >= 4, right.rationale
    assert wrong.is_scored and wrong.value == 1, wrong.rationale  # none of the answer: wrong outright
    assert wrong.details["probability"] < half.details["probability"] < right.details["probability"]
    assert "not an LLM" in right.rationale and right.details["judge"] == OFFLINE
    assert 0 < wrong.details["probability"] < right.details["probability"] < 1


def test_correctness_takes_the_best_acceptable_answer(judge):
    res = judge.correctness("Who was the 4th US president?", "James Madison",
                            ["Madison", "James Madison", "the fourth president"])
    assert res.value == 5 and res.details["matched_reference"] == "James Madison"
    alone = judge.correctness("Who was the 4th US president?", "James Madison", ["the fourth president"])
    assert alone.value < res.value


def test_correctness_abstains_only_on_a_whole_decline(judge):
    q = "What is the capital and the population of France?"
    res = judge.correctness(q, "I'm not sure.", ["Paris; 68 million"])
    assert res.status.value == "abstained" and res.reason == "not_sure" and res.details["level"] == 0
    partial = judge.correctness(q, "The capital is Paris, but there is no information about its population.",
                                ["Paris; 68 million"])
    assert partial.is_scored


def test_correctness_sees_the_context_modes_passages(judge):
    q = "What does RUNSTATS do?"
    ref = ["RUNSTATS updates table statistics."]
    extra = "RUNSTATS updates table statistics, which the optimizer reads to choose access plans."
    without = judge.correctness(q, extra, ref)
    with_ctx = judge.correctness(q, extra, ref, ["The optimizer reads statistics to choose access plans."])
    assert with_ctx.details["features"]["support"] > without.details["features"]["support"]
    assert with_ctx.details["probability"] > without.details["probability"]


def test_faithfulness_lists_unsupported_sentences(judge):
    passages = ["UNION removes duplicate rows. UNION ALL keeps every row."]
    res = judge.faithfulness("UNION removes duplicate rows. It was invented by Oracle in 1979.", passages)
    assert res.is_scored and 0 < res.value < 1
    claims = res.details["claims"]
    assert [c["supported"] for c in claims] == [True, False]
    assert "oracle" in claims[1]["reason"] and "invented by Oracle" in res.rationale
    assert res.value == pytest.approx(sum(c["support"] for c in claims) / 2, abs=1e-3)
    assert judge.faithfulness("UNION ALL keeps every row.", passages).value == 1.0


def test_faithfulness_abstains_without_claims_or_evidence(judge):
    assert judge.faithfulness("I don't know.", ["some passage"]).reason == "no_claims"
    assert judge.faithfulness("An answer.", []).reason == "no_evidence"
    one_word = judge.faithfulness("Paris.", ["Paris is the capital."])
    assert one_word.is_scored and one_word.value == 1.0  # a one-word answer is still a claim


def test_context_metrics(judge):
    q = "What does UNION ALL keep?"
    refs = ["UNION ALL keeps duplicate rows."]
    ctx = ["Tablespaces hold tables.", "UNION ALL keeps all rows, including duplicate rows.", "Other text."]
    p = judge.context_precision(q, refs, ctx)
    assert [c["relevant"] for c in p.details["chunks"]] == [False, True, False] and p.value == 0.5
    assert judge.context_precision(q, refs, list(reversed(ctx))).value == 0.5
    assert judge.context_precision(q, refs, [ctx[1], ctx[0]]).value == 1.0
    r = judge.context_recall(["UNION ALL keeps duplicate rows. Oracle designed it in 1979."], ctx)
    assert r.value == 0.5 and [s["attributed"] for s in r.details["statements"]] == [True, False]
    best = judge.context_recall(["Tablespaces hold tables.", "Oracle designed it in 1979."], ctx)
    assert best.value == 1.0 and best.details["matched_reference"] == "Tablespaces hold tables."
    rel = judge.context_relevance(q, refs, ctx)
    assert rel.details["selected"] == [2] and rel.value == pytest.approx(1 / 3)
    assert judge.context_precision(q, refs, []).reason == "no_contexts"
    assert judge.context_recall([], ctx).reason == "no_reference"


# ----------------------------------------------------------------------------- the engine, scorers and CLI


@pytest.fixture
def data():
    return pd.DataFrame({
        "question": ["What does UNION ALL keep?", "Who wrote Hamlet?", "What is X?"],
        "answer": ["UNION ALL keeps duplicate rows.", "Christopher Marlowe.", "I don't know."],
        "reference": ["UNION ALL keeps all rows, duplicates included.", ["William Shakespeare", "Shakespeare"],
                      "X is a letter."],
        "contexts": [["UNION ALL keeps all rows, including duplicates."], ["Hamlet is a tragedy by Shakespeare."],
                     ["Y is a letter."]],
        "retrieved_doc_ids": [["d1"], ["d2"], ["d3"]],
        "relevant_doc_ids": [["d1"], ["d2"], ["d9"]],
    })


def test_evaluate_frame_runs_what_it_can_and_skips_the_rest_with_the_reason(fake_llm, data):
    out = evaluate_frame(data, judge=OFFLINE, bertscore=False, cache=False)
    assert fake_llm.request_count == 0
    assert out.config["metrics_run"] == ["correctness", "lexical", "retrieval", "faithfulness", "context_precision",
                                         "context_recall", "context_relevance"]
    assert "language model" in out.skipped["answer_relevancy"]
    for name in ("correctness", "faithfulness", "context_precision", "context_recall", "context_relevance"):
        assert out.metrics[f"{name}/error_rate"] == 0.0, name
        assert all("offline" in (j or "") or s.startswith("abstained")
                   for j, s in zip(out.table[f"{name}/justification"], out.table[f"{name}/status"]))
    levels = out.table["correctness/level"].tolist()
    assert levels[0] >= 4 and levels[1] <= 2 and levels[2] == 0  # level 0 in the level column, left out of the mean
    assert math.isnan(out.table["correctness/score"].iloc[2])  # and no score
    assert out.metrics["correctness/abstain_rate"] == pytest.approx(1 / 3)
    assert out.params["ragjudge.judge"] == OFFLINE and out.params["ragjudge.judge.provider"] == "offline"
    assert out.params["ragjudge.offline.calibration"] == Calibration.shipped().version
    version = f"offline-lexical-{Calibration.shipped().version}"
    assert json.loads(out.params["ragjudge.prompt_versions"]) == {"offline_judge": version}
    assert out.config["judge"]["kind"].startswith("offline judge") and "judge/calls" not in out.metrics
    assert "uncalibrated" in out.config["judge"]["languages"] and "kappa_and_margin_over_the_best_lexical_baseline" in (
        out.config["judge"]["held_out"])
    claims = json.loads(out.table["faithfulness/claims"][0])
    assert claims[0]["supported"] is True


def test_a_metric_it_cannot_score_asked_by_name_is_an_input_error(fake_llm, data):
    with pytest.raises(InputError, match="cannot score 'answer_relevancy'.*language model"):
        evaluate_frame(data, judge=OFFLINE, metrics=["correctness", "answer_relevancy"])
    assert fake_llm.request_count == 0


def test_dry_run_counts_no_calls(data):
    out = evaluate_frame(data, judge=OFFLINE, dry_run=True, bertscore=False)
    assert out.metrics["estimate/total/calls"] == 0 and out.params["ragjudge.judge"] == OFFLINE


def test_several_context_modes_each_judged_offline(data):
    df = data.assign(reference_contexts=[["UNION ALL keeps duplicates."], ["Shakespeare wrote Hamlet."],
                                         ["X is a letter."]])
    out = evaluate_frame(df, judge=OFFLINE, metrics=["correctness"], context_mode=["generation", "reference"])
    assert {"correctness_generation/mean", "correctness_reference/mean"} <= set(out.metrics)


def test_scorers_on_the_offline_judge(fake_llm):
    from mlflow.entities import AssessmentSourceType

    from mlflow_ragjudge.adapters.scorers import AnswerRelevancy, Correctness, Faithfulness

    fb = Correctness(judge=OFFLINE)(inputs={"question": "Who wrote Hamlet?"}, outputs="William Shakespeare",
                                    expectations={"expected_response": ["Shakespeare", "William Shakespeare"]})
    assert fb.value == 5 and fb.source.source_type == AssessmentSourceType.CODE and fb.source.source_id == OFFLINE
    assert fb.metadata["matched_reference"] == "William Shakespeare"
    fb = Faithfulness(judge=OFFLINE)(inputs={"question": "q"}, outputs={"answer": "Paris is big.",
                                                                        "contexts": ["Paris is big."]})
    assert fb.value == 1.0
    with pytest.raises(ValueError, match="language model"):
        AnswerRelevancy(judge=OFFLINE)
    assert fake_llm.request_count == 0


def test_cli_labels_offline_estimates_and_says_how_to_switch(tmp_path, tmp_tracking, data, capsys):
    path = tmp_path / "d.jsonl"
    data.to_json(path, orient="records", lines=True)
    assert main(["evaluate", str(path), "--judge", OFFLINE, "--config", '{"bertscore": false}']) == 0
    out = capsys.readouterr().out
    assert "OFFLINE judge" in out and "offline estimates" in out and "held-out agreement" in out
    assert "other languages are uncalibrated" in out
    assert "--judge openai:/gpt-4o-mini" in out
    assert "skipped (not in this run):\n  answer_relevancy: the offline judge" in out


def test_cli_evaluate_without_a_judge_uses_the_offline_judge(tmp_path, tmp_tracking, data, capsys):
    path = tmp_path / "d.jsonl"
    data.to_json(path, orient="records", lines=True)
    assert main(["evaluate", str(path), "--config", '{"bertscore": false}']) == 0
    out = capsys.readouterr().out
    assert "judge: offline:/lexical -- the OFFLINE judge" in out and "correctness " in out


def test_the_replaced_demo_judge_names_its_successor(data):
    with pytest.raises(ValueError, match="offline:/lexical.*replaced"):
        evaluate_frame(data, judge="demo:/overlap", metrics=["correctness"])


def test_offline_uri_forms():
    assert is_offline_judge("offline:/lexical") and is_offline_judge("offline")
    assert not is_offline_judge("openai:/gpt-4o-mini") and not is_offline_judge(None)
    with pytest.raises(ValueError, match="Unknown offline judge"):
        evaluate_frame(pd.DataFrame({"question": ["q"], "answer": ["a"], "reference": ["r"]}),
                       judge="offline:/bert", metrics=["correctness"])


@pytest.mark.slow
def test_the_main_job_runs_without_torch(tmp_path):
    """The quickstart with torch made unimportable: the offline judge and every metric run (BERTScore is not asked
    for: it runs only when asked), and nothing imports torch."""
    code = f"""
import sys, importlib.abc
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'sentence_transformers'):
            raise ImportError('no ' + name + ' here')
sys.meta_path.insert(0, NoTorch())
from mlflow_ragjudge.cli import main
rc = main(['quickstart', '--tracking-uri', 'sqlite:///{tmp_path / "qs.db"}'])
assert 'torch' not in sys.modules
sys.exit(rc)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "offline estimates" in proc.stdout and "bertscore" not in proc.stdout
    means = [float(m) for m in re.findall(r"correctness=([0-9.]+)", proc.stdout)]
    assert len(means) == 3 and not any(math.isnan(m) for m in means) and "faithfulness=" in proc.stdout


# ----------------------------------------------------------------------------- hard rules, languages (issue 27)

#: (question, a response that contains none of the reference, the reference): never a passing level
NOTHING_OF_THE_REFERENCE = [
    ("What is the chemical formula of water?", "The chemical formula of water is CO2.", ["H2O"]),
    ("阿波罗11号哪年登月？", "阿波罗11号于1970年登月。", ["1969年"]),
    ("水の化学式は何ですか？", "水の化学式はCO2です。", ["H2O"]),
    ("日本の首都はどこですか？", "日本の首都は大阪です。", ["東京"]),
    ("中国的首都是哪里？", "中国的首都是上海。", ["北京"]),
    ("When did Apollo 11 land on the Moon?", "Apollo 11 landed on the Moon in 1970.", ["1969"]),
    ("Who wrote the Virginia Plan?", "Edmund Randolph proposed the Virginia Plan at the Constitutional Convention "
     "in Philadelphia, where the delegates debated it at length.", ["Madison", "James Madison"]),
    # the answer's word the question already says is no evidence (an NQ301 row the humans rejected)
    ("which battle ended britain's support for the south", "The Battle of Appomattox Court House in April 1865 "
     "ended Britain's support for the Confederacy in the American Civil War.",
     ["Battle of Antietam", "the Battle of Antietam"]),
]


@pytest.mark.parametrize("question,response,references", NOTHING_OF_THE_REFERENCE)
def test_no_passing_level_for_a_response_with_none_of_the_reference(question, response, references):
    res = OfflineJudge().correctness(question, response, references)
    assert res.value is not None and res.value <= 3, (res.value, res.rationale)
    assert "none of any acceptable answer is in the response" in res.rationale


@pytest.mark.parametrize("question,response,reference", [
    # 1,000 km for 21,000 km: most of the characters, the wrong number
    ("长城有多长？", "长城有一千公里长。", "两万一千公里"),
    ("東京タワーの高さは？", "高さは三百メートルです。", "333メートル"),
    ("阿波罗11号哪年登月？", "一九七〇年。", "1969年"),
])
def test_a_number_in_numerals_that_disagrees_is_not_a_passing_level(question, response, reference):
    res = OfflineJudge().correctness(question, response, [reference])
    assert res.value is not None and res.value <= 3, (res.value, res.rationale)


def test_numbers_in_numerals_and_in_digits_are_the_same_answer():
    judge = OfflineJudge()
    assert judge.correctness("长城有多长？", "长城长21000公里。", ["两万一千公里"]).value >= 4
    assert judge.correctness("阿波罗11号哪年登月？", "一九六九年。", ["1969年"]).value >= 4


def test_the_japanese_case_of_the_issue_is_wrong_not_largely_correct():
    res = OfflineJudge().correctness("水の化学式は何ですか？", "水の化学式はCO2です。", ["H2O"])
    assert res.value == 1  # it was level 4 ("largely correct") while saying 0 % of the reference was found


def test_a_number_or_formula_that_disagrees_counts_against_the_answer():
    judge = OfflineJudge()
    wrong_year = judge.correctness("When did Apollo 11 land?", "Apollo 11 landed on the Moon in July 1970.",
                                   ["July 1969"])
    right_year = judge.correctness("When did Apollo 11 land?", "Apollo 11 landed on the Moon in July 1969.",
                                   ["July 1969"])
    assert right_year.value >= 4 and wrong_year.value <= 3 < right_year.value
    assert "the response gives 1970, the reference does not" in wrong_year.rationale
    # a date with a month is wrong when any of its parts is; more detail is not a conflict
    q = "When did Apollo 11 land on the Moon?"
    for wrong in ("Apollo 11 landed on June 20, 1969.", "July 21, 1969", "July 1970"):
        res = judge.correctness(q, wrong, ["July 20, 1969"])
        assert res.value <= 3 and "the reference does not" in res.rationale, (wrong, res.rationale)
    assert "month 6" in judge.correctness(q, "June 20, 1969", ["July 20, 1969"]).rationale
    for right in ("Apollo 11 landed on July 20, 1969.", "On July 20, 1969 at 20:17 UTC.",
                  "It may have been July 20, 1969."):
        assert judge.correctness(q, right, ["July 20, 1969"]).value >= 4, right
    # a quantity in another unit of the same kind is another quantity
    for question, wrong, right, ref in (("How tall is the tower?", "The tower is 330 feet tall.",
                                         "The tower is 330 metres tall.", "330 metres"),
                                        ("How long does it take?", "It takes 3 minutes.", "It takes 3 hours.",
                                         "3 hours")):
        res = judge.correctness(question, wrong, [ref])
        assert res.value <= 3 and "the reference does not" in res.rationale, (wrong, res.rationale)
        assert judge.correctness(question, right, [ref]).value >= 4, right
    # the answer's own unit given too (a conversion beside it) is no conflict
    assert "the reference does not" not in judge.correctness(
        "How tall is the tower?", "It is 330 m (1,083 ft) tall.", ["330 metres"]).rationale
    # another name sharing a word with the answer's (NQ301 rows the humans rejected, and a made-up one)
    for question, wrong, ref in (("Which heiress starred in The Simple Life?", "Nicky Hilton starred in it.",
                                  "Paris Hilton"),
                                 ("who has the most rushing yards in a super bowl", "Emmitt Smith", "Timmy Smith"),
                                 ("what mlb teams did deion sanders play for", "Atlanta Falcons", "Atlanta Braves")):
        res = judge.correctness(question, wrong, [ref])
        assert res.value <= 3 and "the reference does not" in res.rationale, (wrong, res.rationale)
    # a spelling of the same name, a middle name, a title are not another name
    for question, right, ref in (("who is the lead singer of depeche mode", "Dave Gahan is the lead singer.",
                                  "David Gahan"),
                                 ("Which heiress starred in The Simple Life?", "Paris Whitney Hilton did.",
                                  "Paris Hilton"),
                                 ("who won the silver medal in womens figure skating", "Yevgenia Medvedeva",
                                  "Evgenia Medvedeva")):
        assert "the reference does not" not in judge.correctness(question, right, [ref]).rationale, right
    # without a month, a number of the answer given is enough: an approximation is not a conflict
    assert "the reference does not" not in judge.correctness(
        "When did the atmosphere change?", "About 2.4 billion years ago.", ["around 2.45 billion years ago"]).rationale
    # a long reference's numbers are details among many: the rule is for answers that are a number
    long_ref = ("The treaty was signed in 1648 after thirty years of war, ending the conflict between the Catholic "
                "and Protestant states of the Holy Roman Empire.")
    res = judge.correctness("How did the war end?", "The war ended with the Peace of Westphalia in 1649, between the "
                            "Catholic and Protestant states of the Holy Roman Empire.", [long_ref])
    assert "the reference does not" not in res.rationale


@pytest.mark.parametrize("question,reference,right,partial,wrong", [
    ("東京タワーの高さは？", "333メートル", "東京タワーの高さは333メートルです。", "高さは約300メートルです。",
     "東京タワーはとても高いです。"),
    ("日本で一番高い山は何ですか？", "富士山", "日本で一番高い山は富士山です。", "富士という名前の山です。",
     "日本で一番高い山は北岳です。"),
    ("中国的首都是哪里？", "北京", "中国的首都是北京。", "北方的一个城市，北边。", "中国的首都是上海。"),
    ("长城有多长？", "两万一千公里", "长城长两万一千公里。", "长城有一千公里长。", "长城很长很长。"),
    ("长城有多长？", "两万一千公里", "长城长21000公里。", "长城长两万公里左右。", "长城很长很长。"),
    ("東京タワーの高さは？", "333メートル", "高さは三百三十三メートルです。", "高さは三百メートルを超えます。",
     "東京タワーはとても高いです。"),
    # Korean: syllables are tokens, as kana and ideographs are
    ("한국의 수도는 어디입니까?", "서울특별시", "대한민국의 수도는 서울특별시입니다.", "수도는 서울입니다.",
     "한국의 수도는 부산입니다."),
])
def test_japanese_and_chinese_answers_order_right_partial_wrong(question, reference, right, partial, wrong):
    judge = OfflineJudge()
    levels = [judge.correctness(question, r, [reference]).value for r in (right, partial, wrong)]
    assert levels[0] >= 4 and levels[2] <= 2, levels
    assert levels[0] >= levels[1] >= levels[2] and levels[0] > levels[2], levels


def test_answer_relevancy_refuses_other_languages_with_an_english_only_embedder(fake_llm):
    from mlflow_ragjudge.core.types import Status
    from mlflow_ragjudge.llm.client import JudgeClient
    from mlflow_ragjudge.metrics.answer_relevancy import AnswerRelevancyJudge

    def english_only(texts):
        raise AssertionError("an English-only model must not be asked to compare Japanese text")

    english_only.languages = ("en",)
    client = JudgeClient(f"openai:/m?base_url={fake_llm.openai_base_url}", cache=False, check_ready=False)
    judge = AnswerRelevancyJudge(client, embed=english_only)
    for question, response in (("水の化学式は何ですか？", "水の化学式はH2Oです。"),
                               ("中国的首都是哪里？", "中国的首都是北京。"),
                               ("Какая столица России?", "Столица России — Москва."),
                               ("Quelle est la capitale de la France ?", "La capitale de la France est Paris."),
                               ("Wie hoch ist der Mount Everest?", "Der Mount Everest ist 8849 Meter hoch."),
                               ("¿Cuál es la capital de España?", "La capital de España es Madrid.")):
        res = judge.judge(question, response)
        assert res.status is Status.ABSTAINED and res.reason == "unsupported_language", res
        assert res.value is None and "English-only" in res.rationale and "embeddings=" in res.rationale
    assert fake_llm.request_count == 0  # refused before the question-generation call: nothing paid for
    # the run's language setting says it too, whatever the script
    ja = AnswerRelevancyJudge(client, embed=english_only, language="ja")
    assert ja.judge("What is H2O?", "Water.").reason == "unsupported_language"
    # English with names from other languages is English
    for question, response in (("Where is the Musée de la Ville?", "The Musée de la Ville is in Paris."),
                               ("Who directed La La Land?", "Damien Chazelle directed La La Land."),
                               ("What is El Niño?", "El Niño is a climate pattern of the Pacific.")):
        assert judge._unsupported_language(question, response) is None, question
    # an embedder not known to be English-only (a multilingual URI, your callable) is used
    assert AnswerRelevancyJudge(client, embed=lambda t: [[1.0]] * len(t))._unsupported_language("水", "水") is None


def test_answer_relevancy_with_the_local_minilm_skips_japanese_rows_and_scores_english_ones(fake_llm, tmp_path):
    """Through the whole evaluation, with the real local MiniLM (skipped where it cannot load): the Japanese rows
    are not scored, with their reason; the English row is; no judge call is made for the refused rows."""
    from compliant_model import CompliantModel

    from mlflow_ragjudge.llm.local_model import LocalEmbedder, LocalModelUnavailable

    try:
        LocalEmbedder.load()
    except LocalModelUnavailable as e:
        pytest.skip(f"the local MiniLM cannot load here ({e.reason})")
    fake_llm.set_handler(CompliantModel("json_schema"))
    frame = pd.DataFrame({
        "question": ["水の化学式は何ですか？", "中国的首都是哪里？", "What is the chemical formula of water?"],
        "answer": ["水の化学式はH2Oです。", "中国的首都是北京。", "Water is H2O."],
    })
    out = evaluate_frame(frame, {"judge": f"openai:/m?base_url={fake_llm.openai_base_url}", "embeddings": "local",
                                 "metrics": ["answer_relevancy"], "cache": str(tmp_path / "cache"),
                                 "progress": False})
    res = out.results["answer_relevancy"]
    assert [r.reason for r in res[:2]] == ["unsupported_language", "unsupported_language"]
    assert all(r.value is None and "English-only" in r.rationale for r in res[:2])
    assert res[2].status.value == "scored" and res[2].value is not None
    assert out.table["answer_relevancy/score"].iloc[:2].isna().all()
    assert len([r for r in fake_llm.requests if r.path.endswith("/chat/completions")]) == 1  # the English row's


# ----------------------------------------------------------------------------- long answers, answers without spaces


def test_a_long_answer_is_judged_by_the_long_answer_model():
    from mlflow_ragjudge.metrics.offline_evidence import SHORT_ANSWER, is_long_answer

    cal = Calibration.shipped()
    assert cal.long is not None and set(cal.long.features) <= set(FEATURES)
    short = answer_features("Who wrote it?", "Tolstoy wrote it.", "Leo Tolstoy")
    long_ref = "The bridge was designed by a Scottish engineer and completed in 1890 after seven years of work."
    long = answer_features("Who built the bridge?", "A Scottish engineer designed it.", long_ref)
    assert not is_long_answer(short) and is_long_answer(long)
    assert cal.model(short).weights == cal.weights and cal.model(long) is cal.long
    # an answer of exactly SHORT_ANSWER distinct content words is short, one more is long
    words = ["granite", "harbour", "museum", "railway", "council", "festival", "merchants"]
    assert not is_long_answer(answer_features("q", "x", " ".join(words[:SHORT_ANSWER])))
    assert is_long_answer(answer_features("q", "x", " ".join(words[:SHORT_ANSWER + 1])))
    # routing shown by a long-answer model that never accepts: long references fall below level 4, short ones
    # are judged as before
    never = Calibration.from_dict({**cal.to_dict(), "long": {**cal.long.to_dict(), "weights": [0.0] * len(
        cal.long.features), "bias": -30.0}})
    judge, strict = OfflineJudge(), OfflineJudge(never)
    q, right = "Who built the bridge?", ("The bridge was designed by a Scottish engineer and completed in 1890 "
                                         "after seven years of work.")
    assert judge.correctness(q, right, [long_ref]).value == 5 and strict.correctness(q, right, [long_ref]).value <= 3
    assert (strict.correctness("Who wrote it?", "Leo Tolstoy", ["Leo Tolstoy"]).value
            == judge.correctness("Who wrote it?", "Leo Tolstoy", ["Leo Tolstoy"]).value == 5)


def test_a_calibration_without_a_long_answer_model_judges_every_answer_with_one():
    d = Calibration.shipped().to_dict()
    del d["long"]
    one = Calibration.from_dict(d)
    assert one.long is None and "long" not in one.to_dict()
    long = answer_features("q", "x", "the bridge was designed by a Scottish engineer in 1890 after seven years")
    assert one.model(long).weights == one.weights
    assert Calibration.from_dict(Calibration.shipped().to_dict()) == Calibration.shipped()


def test_a_bad_long_answer_model_is_refused():
    good = Calibration.shipped().to_dict()
    with pytest.raises(ValueError, match="long-answer model cut-points"):
        Calibration.from_dict({**good, "long": {**good["long"], "cuts": {"4": 0.9, "5": 0.5}}})
    with pytest.raises(ValueError, match="long-answer model features"):
        Calibration.from_dict({**good, "long": {**good["long"], "features": ["recall"], "weights": [1.0, 2.0]}})


def test_an_answer_without_spaces_is_found_by_its_character_pairs():
    """One shared character (山 of 富士山) is not a share of the answer: recall counts character pairs."""
    wrong = answer_features("日本で一番高い山は何ですか？", "日本で一番高い山は北岳です。", "富士山")
    half = answer_features("日本で一番高い山は何ですか？", "富士という名前の山です。", "富士山")
    right = answer_features("日本で一番高い山は何ですか？", "日本で一番高い山は富士山です。", "富士山")
    assert (wrong["recall"], half["recall"], right["recall"]) == (0.0, 0.5, 1.0)
    # Latin text keeps its word recall
    assert answer_features("q", "Mount Fuji is high.", "Mount Fuji")["recall"] == 1.0
