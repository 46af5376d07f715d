"""Tests for mlflow_ragjudge.core.text: tokenisation and sentence splitting."""

from __future__ import annotations

import random
import string

import pytest

from mlflow_ragjudge.core.text import (
    UNIDENTIFIED_LANGUAGE,
    cjk_numbers,
    has_cjk,
    is_cjk_char,
    latin_language,
    normalize,
    numerals_as_digits,
    split_sentences,
    tokenize,
    word_set,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", [], id="empty"),
        pytest.param("   \n\t ", [], id="whitespace"),
        pytest.param("Hello, World!", ["hello", "world"], id="lowercase-punct"),
        pytest.param("Db2 v11.5 costs $3.50", ["db2", "v11", "5", "costs", "3", "50"], id="digits-kept"),
        pytest.param("UNION_ALL don't", ["union", "all", "don", "t"], id="underscore-apostrophe-split"),
        pytest.param("Café CAFÉ Straße", ["café", "café", "strasse"], id="unicode-latin-casefold"),
        pytest.param("cafe\u0301", ["café"], id="combining-accent-nfkc"),
        pytest.param("ＡＩ２０２４", ["ai2024"], id="fullwidth-latin-nfkc"),
        pytest.param("हिन्दी भाषा", ["हिन्दी", "भाषा"], id="devanagari-marks-stay-in-word"),
        pytest.param("Привет, мир", ["привет", "мир"], id="cyrillic"),
    ],
)
def test_tokenize_latin_and_other_alphabets(text: str, expected: list[str]) -> None:
    assert tokenize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("東京は日本の首都です。", list("東京は日本の首都です"), id="japanese"),
        pytest.param("北京是中国的首都。", list("北京是中国的首都"), id="chinese"),
        pytest.param("서울은 수도", ["서", "울", "은", "수", "도"], id="korean-hangul"),
        pytest.param("ｶﾀｶﾅ", list("カタカナ"), id="halfwidth-katakana"),
        pytest.param("人々のデータ", list("人々のデータ"), id="iteration-and-long-vowel-marks"),
        pytest.param(
            "Db2のバージョン11.5を使う",
            ["db2", "の", "バ", "ー", "ジ", "ョ", "ン", "11", "5", "を", "使", "う"],
            id="mixed-latin-cjk",
        ),
        pytest.param("１１．５です", ["11", "5", "で", "す"], id="fullwidth-digits"),
    ],
)
def test_tokenize_cjk_one_token_per_character(text: str, expected: list[str]) -> None:
    assert tokenize(text) == expected


def test_tokenize_matches_rouge_score_default_tokenizer_on_ascii() -> None:
    rouge_tokenize = pytest.importorskip("rouge_score.tokenize")
    rng = random.Random(1234)
    alphabet = string.printable + "___---...'''"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert tokenize(text) == rouge_tokenize.tokenize(text, None), text


def test_word_set_and_helpers() -> None:
    assert word_set("the cat and THE dog") == {"the", "cat", "and", "dog"}
    assert normalize("ＡＢＣ Straße") == "abc strasse"
    assert is_cjk_char("漢") and is_cjk_char("か") and is_cjk_char("カ") and is_cjk_char("한")
    assert not is_cjk_char("a") and not is_cjk_char("。")
    assert has_cjk("Db2 の設定") and not has_cjk("plain English, café")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", [], id="empty"),
        pytest.param("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"], id="basic"),
        pytest.param("It costs 3.5 units. Next.", ["It costs 3.5 units.", "Next."], id="decimal"),
        pytest.param("Use e.g. UNION here. Done.", ["Use e.g. UNION here.", "Done."], id="eg-abbrev"),
        pytest.param("That is i.e. the rule. Ok.", ["That is i.e. the rule.", "Ok."], id="ie-abbrev"),
        pytest.param("Ask Dr. Smith. He knows.", ["Ask Dr. Smith.", "He knows."], id="title"),
        pytest.param("J. R. Tolkien wrote it. Yes.", ["J. R. Tolkien wrote it.", "Yes."], id="initials"),
        pytest.param("In the U.S. Army. Then.", ["In the U.S. Army.", "Then."], id="dotted-acronym"),
        pytest.param(
            "It runs up to +50 °C. The sheet says 60°F. Fine.",
            ["It runs up to +50 °C.", "The sheet says 60°F.", "Fine."],
            id="degree-unit-no-initial",
        ),
        pytest.param(
            "See v1.2.3 and example.com. Fine.", ["See v1.2.3 and example.com.", "Fine."], id="no-space"
        ),
        pytest.param('He said "stop." Then left.', ['He said "stop."', "Then left."], id="closing-quote"),
        pytest.param("Wait... What?! Really.", ["Wait...", "What?!", "Really."], id="ellipsis-multi"),
        pytest.param("lower. case continues", ["lower. case continues"], id="lowercase-next-no-split"),
        pytest.param("See No. 5 and Fig. 3 here.", ["See No. 5 and Fig. 3 here."], id="number-abbrev"),
        pytest.param("The answer is no. The rest.", ["The answer is no.", "The rest."], id="no-as-a-word"),
        pytest.param("Apples, pears, etc. Then more.", ["Apples, pears, etc.", "Then more."], id="etc-final"),
        pytest.param("Line one\nLine two\n\n- item", ["Line one", "Line two", "- item"], id="newlines"),
        pytest.param(
            "東京は首都です。大阪は違います！本当？はい",
            ["東京は首都です。", "大阪は違います！", "本当？", "はい"],
            id="japanese",
        ),
        pytest.param("北京是首都。上海不是！对吗？", ["北京是首都。", "上海不是！", "对吗？"], id="chinese"),
        pytest.param(
            "彼は「はい。」と言った。次です。", ["彼は「はい。」と言った。", "次です。"], id="ja-quote-inside"
        ),
        pytest.param("「はい。」「いいえ。」", ["「はい。」", "「いいえ。」"], id="ja-two-quotes"),
        pytest.param("第一文．第二文．", ["第一文．", "第二文．"], id="fullwidth-period"),
        pytest.param("バージョン１１．５です。", ["バージョン１１．５です。"], id="fullwidth-decimal"),
        pytest.param("Db2を使う。It works. 完了。", ["Db2を使う。", "It works.", "完了。"], id="mixed"),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


@pytest.mark.parametrize("text,numbers", [
    ("两万一千公里", ["21000"]), ("三百メートル", ["300"]), ("二〇二三年", ["2023"]), ("十五", ["15"]),
    ("一千", ["1000"]), ("三万五千", ["35000"]), ("两亿", ["200000000"]), ("一百零五", ["105"]),
    ("第三十二届", ["32"]), ("九千九百九十九", ["9999"]), ("长城很长", []), ("", []), (None, []),
])
def test_cjk_numbers(text, numbers):
    assert cjk_numbers(text) == numbers


def test_numerals_as_digits():
    assert numerals_as_digits("长城长两万一千公里，约三百年") == "长城长21000公里，约300年"
    assert tokenize(numerals_as_digits("高さは三百三十三メートル")) == tokenize("高さは333メートル")


@pytest.mark.parametrize("text,language", [
    ("Quelle est la capitale de la France ?", "French"),
    ("Wie hoch ist der Mount Everest?", "German"),
    ("¿Cuál es la capital de España?", "Spanish"),
    ("Qual è la capitale d'Italia? La capitale è Roma.", "Italian"),
    ("Qual é a capital do Brasil?", "Portuguese"),
    ("Wat is de hoofdstad van Nederland?", "Dutch"),
    ("Vad är huvudstaden i Sverige? Huvudstaden är Stockholm och den ligger vid kusten.", "Swedish"),
    ("Jaka jest stolica Polski? Stolicą Polski jest Warszawa, która leży nad Wisłą.", "Polish"),
    ("Care este capitala României? Capitala este București, cel mai mare oraș din țară.", "Romanian"),
    ("Türkiye'nin başkenti nedir? Başkent Ankara ve çok büyük bir şehir.", "Turkish"),
    ("Apa ibu kota Indonesia? Ibu kota Indonesia adalah Jakarta dan itu kota yang besar.", "Indonesian"),
    ("Thủ đô của Việt Nam là gì? Thủ đô của Việt Nam là Hà Nội và đây là một thành phố lớn.", "Vietnamese"),
    ("Mikä on Suomen pääkaupunki? Pääkaupunki on Helsinki ja se on myös suurin kaupunki.", "Finnish"),
    ("Mi Magyarország fővárosa? A főváros Budapest, és ez a legnagyobb város is.", "Hungarian"),
    ("Who is Ki Hajar Dewantara? He founded Taman Siswa in Yogyakarta.", None),
    ("Van Gogh painted The Starry Night in 1889 at Saint-Rémy.", None),
    ("Is it ok to run it twice? No, it is not.", None),
    ("I went to the store and bought milk, eggs and bread.", None),
    ("Kokia yra Lietuvos sostinė? Lietuvos sostinė yra Vilnius, didžiausias šalies miestas.", UNIDENTIFIED_LANGUAGE),
    ("Kokia Lietuvos sostinė? Vilnius.", UNIDENTIFIED_LANGUAGE),
    ("RUNSTATS collects statistics; REORG reclaims space.", UNIDENTIFIED_LANGUAGE),  # no English function word
    ("What does RUNSTATS do? It collects statistics.", None),
    ("Vilnius", None), ("Paris, France", None),  # too short to tell: no verdict
    ("What is the capital of Spain?", None),
    ("The Musée de la Ville is in Paris.", None),
    ("Which film won six Oscars? La La Land won six Oscars.", None),  # a row: the question's "which"
    ("Der Spiegel reported it in 1990.", None),
    ("El Niño is a climate pattern that affects the Pacific.", None),
    ("How do I create an index in Db2? Use the CREATE INDEX statement on the table.", None),
    ("Paris", None), ("", None), (None, None), ("東京は日本の首都です", None),
])
def test_latin_language(text, language):
    assert latin_language(text) == language
