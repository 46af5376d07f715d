"""The offline judge reads what a response asserts (issue 39): a right answer in another number form passes, an
amount in another currency or scale is a conflict, and a short answer that is denied, offered among alternatives
or found only inside a question is not accepted -- in English, Japanese and Chinese -- while the same answer
asserted, in any of these wordings' plain counterparts, still passes."""

from __future__ import annotations

import pytest

from mlflow_ragjudge.core.text import cjk_numbers, numerals_as_digits
from mlflow_ragjudge.metrics.correctness import UNASSERTED_LEVEL
from mlflow_ragjudge.metrics.offline import OfflineJudge
from mlflow_ragjudge.metrics.offline_reading import _keys, number_forms, quantities, quantity_conflict, unasserted

JUDGE = OfflineJudge()


def level(question: str, response: str, reference: str) -> int:
    result = JUDGE.correctness(question, response, [reference])
    return int(result.value)


CAPITAL = "What is the capital of Australia?"
PENICILLIN = "Who discovered penicillin?"
WAR = "In which year did the Second World War end?"
CAPITAL_JA = "オーストラリアの首都はどこですか？"
PENICILLIN_JA = "ペニシリンを発見したのは誰ですか？"
WAR_JA = "第二次世界大戦が終わったのは何年ですか？"
CAPITAL_ZH = "澳大利亚的首都是哪里？"
PENICILLIN_ZH = "谁发现了青霉素？"

#: (question, response, reference, why): each names the answer without asserting it
NOT_ASSERTED = [
    # denied
    (CAPITAL, "It is not Canberra.", "Canberra", "denied"),
    (CAPITAL, "The capital isn't Canberra; many people think so.", "Canberra", "denied"),
    (PENICILLIN, "Alexander Fleming did not discover penicillin.", "Alexander Fleming", "denied"),
    (PENICILLIN, "Penicillin was never discovered by Alexander Fleming.", "Alexander Fleming", "denied"),
    (WAR, "The war did not end in 1945.", "1945", "denied"),
    (CAPITAL_JA, "キャンベラではありません。", "キャンベラ", "denied"),
    (CAPITAL_JA, "首都はキャンベラではなく、シドニーです。", "キャンベラ", "denied"),
    (PENICILLIN_JA, "フレミングはペニシリンを発見していません。", "フレミング", "denied"),
    (CAPITAL_ZH, "首都不是堪培拉。", "堪培拉", "denied"),
    (PENICILLIN_ZH, "弗莱明没有发现青霉素。", "弗莱明", "denied"),
    # one of several alternatives
    (CAPITAL, "It could be Sydney, Melbourne, Canberra, Perth, Brisbane or Adelaide.", "Canberra", "alternatives"),
    (CAPITAL, "Either Sydney or Canberra.", "Canberra", "alternatives"),
    (WAR, "1944 or 1945 or 1946", "1945", "alternatives"),
    (WAR, "It ended in 1944, 1945 or 1946.", "1945", "alternatives"),
    (CAPITAL_JA, "シドニー、メルボルン、キャンベラのいずれかです。", "キャンベラ", "alternatives"),
    (CAPITAL_JA, "キャンベラかシドニーかメルボルンです。", "キャンベラ", "alternatives"),
    (WAR_JA, "1944年か1945年か1946年です。", "1945年", "alternatives"),
    (CAPITAL_ZH, "可能是悉尼、墨尔本或堪培拉。", "堪培拉", "alternatives"),
    # only inside a question
    (CAPITAL, "What is the capital of Australia, Canberra? I do not know.", "Canberra", "question"),
    (CAPITAL, "Is it Canberra? I don't know.", "Canberra", "question"),
    (CAPITAL, "You asked whether the capital is Canberra. I cannot answer that.", "Canberra", "question"),
    (CAPITAL_JA, "首都はキャンベラですか？わかりません。", "キャンベラ", "question"),
    (CAPITAL_ZH, "首都是堪培拉吗？我不知道。", "堪培拉", "question"),
]

#: the same answers asserted: they pass
ASSERTED = [
    (CAPITAL, "The capital of Australia is Canberra.", "Canberra"),
    (CAPITAL, "It is Canberra, not Sydney.", "Canberra"),
    (CAPITAL, "Not Sydney but Canberra.", "Canberra"),
    (CAPITAL, "Canberra is not the largest city, but it is the capital.", "Canberra"),
    (CAPITAL, "Canberra, which was chosen as a compromise between Sydney or Melbourne.", "Canberra"),
    (PENICILLIN, "Alexander Fleming discovered penicillin in 1928.", "Alexander Fleming"),
    (PENICILLIN, "Alexander Fleming, not Florey, discovered penicillin.", "Alexander Fleming"),
    (WAR, "It ended in 1945.", "1945"),
    (WAR, "It was not until 1945 that the war ended.", "1945"),
    (WAR, "Is that hard? No: it ended in 1945.", "1945"),
    (CAPITAL_JA, "首都はキャンベラです。", "キャンベラ"),
    (CAPITAL_JA, "シドニーではなくキャンベラです。", "キャンベラ"),
    (PENICILLIN_JA, "フレミングがペニシリンを発見しました。", "フレミング"),
    (WAR_JA, "1945年に終わりました。", "1945年"),
    (CAPITAL_ZH, "首都是堪培拉，不是悉尼。", "堪培拉"),
    (PENICILLIN_ZH, "弗莱明发现了青霉素。", "弗莱明"),
]


@pytest.mark.parametrize(("question", "response", "reference", "why"), NOT_ASSERTED)
def test_an_answer_named_but_not_asserted_is_not_accepted(question, response, reference, why):
    said = unasserted(question, response, reference)
    expected = {"denied": "denied", "alternatives": "one of several alternatives", "question": "only inside a question"}
    assert said is not None and said.startswith(expected[why]), said
    result = JUDGE.correctness(question, response, [reference])
    assert result.value <= UNASSERTED_LEVEL < 4
    assert "does not assert it" in result.rationale and result.details["unasserted"] == said


@pytest.mark.parametrize(("question", "response", "reference"), ASSERTED)
def test_the_same_answer_asserted_passes(question, response, reference):
    assert unasserted(question, response, reference) is None
    assert level(question, response, reference) >= 4


@pytest.mark.parametrize(("text", "written"), [
    ("About 14,000,000 people.", "About 14 million people."),
    ("14 000 000", "14 million"),
    ("fourteen million", "14 million"),
    ("1,400 million", "1.4 billion"),
    ("1,400,000,000", "1.4 billion"),
    ("$1.5 billion", "$1.5 billion"),
    ("nineteen sixty-nine", "1969"),
    ("twenty twenty-one", "2021"),
    ("two thousand five hundred and five", "2505"),
    ("one two three", "one two three"),  # a list of numbers, not one number
    ("2,579 people", "2,579 people"),  # below a million: digits, as the tokenizer reads them
    ("約1400万人", "約14 million人"),
    ("14億人", "1.4 billion人"),
    ("一千四百万人", "14 million人"),
])
def test_numbers_are_written_in_one_form(text, written):
    assert number_forms(text) == written


def test_digits_mixed_with_cjk_numerals_are_one_number():
    # 1400万 was read as 1400 and 10000 (140010000): the digits are the numeral's multiplicand
    assert numerals_as_digits("1400万人") == "14000000人" and cjk_numbers("約1400万人") == ["14000000"]
    assert numerals_as_digits("2万1000") == "21000" and numerals_as_digits("1.4億") == "140000000"
    assert numerals_as_digits("二〇二三年") == "2023年" and numerals_as_digits("两万一千公里") == "21000公里"


@pytest.mark.parametrize(("question", "response", "reference"), [
    ("How many people live in Tokyo?", "About 14,000,000 people.", "14 million"),
    ("How many people live in Tokyo?", "Fourteen million.", "14,000,000"),
    ("What is the population of China?", "1.4 billion", "1,400,000,000"),
    ("What is the population of China?", "About 1,400 million people.", "1.4 billion"),
    ("When did Apollo 11 land on the moon?", "nineteen sixty-nine", "1969"),
    ("When did Apollo 11 land on the moon?", "In nineteen sixty-nine.", "1969"),
    ("How much did it cost?", "It cost 1,000 US dollars.", "$1,000"),
    ("東京の人口は？", "約1400万人です。", "14,000,000人"),
    ("東京の人口は？", "約1400万人です。", "一千四百万人"),
    ("中国的人口是多少？", "大约14亿。", "1,400,000,000"),
])
def test_a_right_answer_in_another_number_form_passes(question, response, reference):
    assert level(question, response, reference) >= 4


@pytest.mark.parametrize(("question", "response", "reference", "conflict"), [
    ("How much did it cost?", "It cost €1,000.", "$1,000", "1000 EUR"),
    ("How much did it cost?", "It cost 500 GBP.", "500 USD", "500 GBP"),
    ("How much did it cost?", "¥1000", "€1000", "1000 ¥"),
    ("What was the temperature?", "It was 20 °F.", "20 °C", "20 °F"),
    ("What was the temperature?", "It was 20 degrees Fahrenheit.", "20℃", "20 °F"),
    ("いくらでしたか？", "1000ユーロでした。", "1000ドル", "1000 EUR"),
    ("気温は？", "華氏20度でした。", "摂氏20度", "20 °F"),
])
def test_an_amount_in_another_currency_or_scale_is_a_conflict(question, response, reference, conflict):
    assert quantity_conflict(response, reference) == conflict
    assert level(question, response, reference) <= 3


def test_currencies_of_one_family_and_one_code_agree():
    assert quantities("$1,000") == {("1000", "money", "$")}
    assert quantity_conflict("1,000 US dollars", "$1,000") is None  # $ names the family, USD a member
    assert quantity_conflict("1000 dollars", "USD 1000") is None
    assert quantity_conflict("¥500", "500円") is None
    assert quantity_conflict("It cost 1,000 euros and 500 dollars.", "$500") is None  # the answer's own is there


def test_the_public_rows_are_untouched_where_no_rule_reads_them():
    """A response that asserts an answer in words the rules never read gets what it got (regression guard for the
    cue lists: ``may`` of a date is not a hedge, a comma in a date is not a list)."""
    assert unasserted("When did the episode air?", "May 22, 2018", "February 27, 2018") is None
    assert unasserted("When was it released?", "January 12, 2017", "January 2017") is None


# ----------------------------------------------------------------------------------------------- faithfulness

#: (claim, passages, what the reason names): the passage nearest the claim says something else in its key part
CONTRADICTED = [
    # entity
    ("The largest planet is Saturn.", ["Jupiter is the largest planet in the Solar System.",
                                       "Saturn is known for its rings."], "Jupiter"),
    ("Penicillin was discovered by Florey.", ["Penicillin was discovered by Fleming in 1928."], "Fleming"),
    ("最大の惑星は土星です。", ["最大の惑星は木星です。", "土星は環で知られています。"], "木星"),
    ("日本の首都は大阪です。", ["日本の首都は東京です。"], "東京"),
    ("最大的行星是土星。", ["最大的行星是木星。", "土星以其光环闻名。"], "木星"),
    # number, code
    ("The bridge has 12 towers.", ["The bridge has 14 towers along its length."], "14"),
    ("水の化学式はCO2です。", ["水の化学式はH2Oです。", "二酸化炭素の化学式はCO2です。"], "H2O"),
    ("水的化学式是CO2。", ["水的化学式是H2O。"], "H2O"),
    # date
    ("The bridge opened in 1932.", ["The bridge opened in 1931 after six years of work."], "1931"),
    ("The bridge opened in June 1931.", ["The bridge opened in July 1931 after six years of work."], "July"),
    ("東京タワーは1960年に完成した。", ["東京タワーは1958年に完成しました。"], "1958"),
    ("埃菲尔铁塔于1890年建成。", ["埃菲尔铁塔于1889年建成。"], "1889"),
    # unit, currency
    ("The bridge is 330 feet long.", ["The bridge is 330 metres long."], "330 m"),
    ("The ticket cost $50.", ["The ticket cost €50 at the door."], "50 EUR"),
    # negation
    ("The tower is not in Paris.", ["The tower is in Paris, France."], "denies"),
    ("Penicillin was discovered by Fleming.", ["Penicillin was not discovered by Fleming."], "denies"),
    ("東京タワーは1958年に完成しなかった。", ["東京タワーは1958年に完成しました。"], "denies"),
    ("埃菲尔铁塔不是在1889年建成的。", ["埃菲尔铁塔于1889年建成。"], "denies"),
]

#: the same facts in other words: still supported
PARAPHRASED = [
    ("The largest planet is Jupiter.", ["Jupiter is the largest planet in the Solar System.",
                                        "Saturn is known for its rings."]),
    ("Fleming discovered penicillin in 1928.", ["Penicillin was discovered by Fleming in 1928."]),
    ("The bridge opened in 1931.", ["The bridge opened in 1931 after six years of work."]),
    ("The bridge is 330 metres long.", ["The bridge is 330 metres long."]),
    ("The city has about 14 million people.", ["The city has 14,000,000 inhabitants and many people."]),
    ("The tower stands in Paris.", ["The tower is in Paris, France."]),
    ("It was not until 1931 that the bridge opened.", ["The bridge opened in 1931 after six years of work."]),
    ("最大の惑星は木星です。", ["最大の惑星は木星です。", "土星は環で知られています。"]),
    ("東京は日本の首都である。", ["日本の首都は東京です。"]),
    ("東京タワーは1958年に完成した。", ["東京タワーは1958年に完成しました。"]),
    ("埃菲尔铁塔是在1889年建成的。", ["埃菲尔铁塔于1889年建成。"]),
    ("最大的行星是木星。", ["最大的行星是木星。"]),
]


#: the shapes of generated answers (markdown headings, list items, a yes or no before the claim, a negation in
#: another clause of the passage's sentence, the key word one sentence away): the same facts, no contradiction
FORMATTED = [
    ("**Reach out to the Trust team** by emailing verify@example.com.",
     ["Contact the Trust team by email at verify@example.com."]),
    ("- **Getting Started:** Create some namespaces with sample images.",
     ["Step 2: Authorize a user to access namespaces. Create some namespaces with sample images."]),
    ("**Metered Charges**: A unit-based pricing model where you pay for what you consume.",
     ["Metered Usage is a unit-based pricing model in which you pay for what you consume."]),
    ("### Key Elements of the Benchmark: the recommendations of the Center for Internet Security.",
     ["The CIS benchmark recommendations are provided by the Center for Internet Security."]),
    ("- Navigate to the Payments page in the console.",
     ["Depending on your account type, you can use the Payments page in the console."]),
    ("No, you can deploy the clusters worldwide, not just in the USA.",
     ["You can deploy the clusters worldwide, in the USA and elsewhere."]),
    ("You only pay for what you use on a monthly basis.",
     ["You pay only for what you use on a monthly basis, with no long-term contracts."]),
    ("Grealish will be in the squad for the trip to Manchester.",  # a negation of another verb, in the same clause
     ["Grealish has not been fined over the incident and will be in the squad for the trip to Manchester."]),
    ("The child is expected to make a full recovery.",
     ["The child's details have not been released but the child is expected to make a full recovery."]),
    ("The Amazon River is the largest river in South America.",
     ["The Amazon River drains much of the continent. It is the largest river in South America, ahead of the "
      "Parana."]),
]


@pytest.mark.parametrize(("claim", "passages"), FORMATTED)
def test_headings_list_items_and_answer_words_are_not_read_as_contradictions(claim, passages):
    """Words a heading or a list item capitalises are no names, a yes or no answers the question, and a negation in
    another clause of the passage's sentence denies something else: none of them contradicts the claim (MTRAG's
    generated answers had 55 claims contradicted, 47 by these shapes)."""
    result = JUDGE.faithfulness(claim, passages)
    (row,) = result.details["claims"]
    assert "contradicted" not in row["reason"] and "missing_names_or_numbers" not in row, row


def test_a_heading_keeps_its_acronyms_and_a_line_without_one_its_names():
    assert _keys("**Phishing and IRS Scams**: Report to the IRS.", skip_first=True)["name"] == {"irs"}
    assert _keys("The capital of Australia: Canberra.", skip_first=True)["name"] == {"australia", "canberra"}
    assert _keys("- **Build an Unencrypted Image**:", skip_first=True)["name"] == frozenset()
    # a line that is no heading keeps its names after the first word
    assert _keys("* Jupiter is larger than Saturn.", skip_first=True)["name"] == {"saturn"}
    result = JUDGE.faithfulness("- **Largest planet:** The largest planet is Saturn.",
                                ["Jupiter is the largest planet in the Solar System."])
    assert "Jupiter" in result.details["claims"][0]["reason"]  # a contradiction after a heading is still one


@pytest.mark.parametrize(("claim", "passages", "named"), CONTRADICTED)
def test_a_contradicted_claim_is_unsupported(claim, passages, named):
    result = JUDGE.faithfulness(claim, passages)
    (row,) = result.details["claims"]
    assert not row["supported"] and row["support"] < result.details["support_threshold"]
    assert row["reason"].startswith("contradicted:") and named in row["reason"], row["reason"]


@pytest.mark.parametrize(("claim", "passages"), PARAPHRASED)
def test_the_same_facts_in_other_words_stay_supported(claim, passages):
    result = JUDGE.faithfulness(claim, passages)
    (row,) = result.details["claims"]
    assert row["supported"] and "contradicted" not in row["reason"], row


def test_a_claim_is_supported_by_one_passage_not_by_words_borrowed_from_several():
    """Every word of the claim is somewhere, but no one passage says it: below the claim one passage says whole."""
    whole = JUDGE.faithfulness("Marie Curie won the Nobel Prize in Physics in Warsaw.",
                               ["Marie Curie won the Nobel Prize in Physics in 1903, in Stockholm."]).details["claims"]
    scattered = JUDGE.faithfulness("Marie Curie won the Nobel Prize in Physics in Warsaw.",
                                   ["Marie Curie was born in Warsaw.", "Physics prizes are awarded in Stockholm.",
                                    "The Nobel Prize was first awarded in 1901."]).details["claims"]
    assert scattered[0]["words_found"] > 0.8 and scattered[0]["words_found_in_one_passage"] < 0.45
    assert not scattered[0]["supported"] and "only across passages" in scattered[0]["reason"]
    together = JUDGE.faithfulness("Marie Curie won the Nobel Prize in Physics.",
                                  ["Marie Curie won the Nobel Prize in Physics in 1903."]).details["claims"]
    assert together[0]["support"] == 1.0 > scattered[0]["support"] and together[0]["supported"]
    assert whole[0]["words_found_in_one_passage"] < 1.0  # (Warsaw is not in that passage)


def test_a_claim_one_sentence_says_outranks_one_spliced_from_two_or_with_its_roles_swapped():
    """Every word of the claim is in the evidence, but no sentence says it: the phrase share (pairs of adjacent
    words one sentence has, in order) tells a claim a sentence makes from one built of two, or with who did what
    swapped; a word the sentence lacks costs its own share, not its neighbours' pairs."""
    article = ["The mayor opened the new library in March. Engineers finished the bridge in 1931."]
    said = JUDGE.faithfulness("Engineers finished the bridge in 1931.", article).details["claims"][0]
    spliced = JUDGE.faithfulness("The mayor opened the bridge in 1931.", article).details["claims"][0]
    assert said["words_found"] == spliced["words_found"] == 1.0
    assert said["phrases_found_in_one_sentence"] == 1.0 > spliced["phrases_found_in_one_sentence"]
    assert said["support"] == 1.0 > spliced["support"]
    right = JUDGE.faithfulness("Arsenal beat Chelsea at home.", ["Arsenal beat Chelsea at home on Sunday."])
    swapped = JUDGE.faithfulness("Chelsea beat Arsenal at home.", ["Arsenal beat Chelsea at home on Sunday."])
    assert right.value == 1.0 > swapped.value
    other_verb = JUDGE.faithfulness("The tower stands in Paris.", ["The tower is in Paris, France."])
    (row,) = other_verb.details["claims"]
    assert row["words_found"] == pytest.approx(2 / 3, abs=1e-4) and row["phrases_found_in_one_sentence"] == 0.5


def test_a_missing_name_or_number_weighs_more_than_a_missing_word():
    passage = ["The museum opened in 1998 in the old harbour district."]
    name = JUDGE.faithfulness("The museum opened in 1998 in the harbour district of Rotterdam.", passage)
    word = JUDGE.faithfulness("The museum opened in 1998 in the harbour district of the town.", passage)
    assert name.details["claims"][0]["missing_names_or_numbers"] == ["rotterdam"]
    assert name.value < word.value


def test_hostile_numbers_and_long_texts_cost_no_error():
    """Thousands of digits or of number words, long runs of cues: read in bounded time, nothing raised (Python
    refuses to turn an int of over 4,300 digits into text: no rule makes one)."""
    texts = ["1," + ",".join(["000"] * 3000), "$" + "9" * 6000, "9" * 6000 + " million", " ".join(["one"] * 5000),
             "nineteen " * 3000, "1 000 " * 3000, "東京" * 5000 + "1400万" * 100, "or " * 10000 + "Canberra",
             "not " * 5000]
    for text in texts:
        number_forms(text)
        quantities(text)
        unasserted("What is the capital?", text, "Canberra")
        assert JUDGE.correctness("What is the capital?", text, ["Canberra"]).status.value in ("scored", "abstained")
        assert JUDGE.faithfulness(text, [text[:5000], "Canberra is the capital."]).status.value in ("scored",
                                                                                                    "abstained")
