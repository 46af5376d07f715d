"""The text pieces rewritten for speed in the third round of issue 26 say what the code before them said.

Each is compared with the code it replaced (copied here as the reference) on random text built from the corners the
rules care about: abbreviations, initials, dotted acronyms, numbers, closing quotes and brackets, CJK terminators,
line breaks and other whitespace, letters that case-fold to several (``ß``, ``ﬁ``) or to ASCII (``ſ``, ``İ``),
digits that are not decimal (``²``). The offline metrics' results as a whole are checked by
``tests/test_offline_speed.py``.
"""

from __future__ import annotations

import random
import re

import pytest

from mlflow_ragjudge.core import text
from mlflow_ragjudge.core.matching import STOPWORDS, content_tokens, content_union, match_tokens, text_cut
from mlflow_ragjudge.core.text import ABBREVIATIONS, NUMBER_ABBREVIATIONS, split_sentences

# --------------------------------------------------------------------------- the sentence splitter it replaced

_CLOSERS = "\"'”’)]}」』）】〕》〉"
_OLD_BOUNDARY = re.compile(f"[.!?…。！？．｡](?:(?<=[.!?…])[.!?…]*|[。！？．｡]*)[{re.escape(_CLOSERS)}]*")
_OLD_CJK = frozenset("。！？．｡")
_OLD_OPENERS = frozenset("\"'“‘([{「『（【〔《〈")
_OLD_DOTTED = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")
_OLD_NON_SPACE = re.compile(r"\S")


def _old_word_before(line: str, start: int, end: int) -> str:
    i = end
    while i > start and (line[i - 1].isalnum() or line[i - 1] in "_."):
        i -= 1
    return line[i:end]


def _old_abbreviation(word: str, following: str) -> bool:
    word = word.lstrip(".")
    if not word:
        return False
    lowered = word.casefold()
    if lowered in ABBREVIATIONS:
        return True
    if lowered in NUMBER_ABBREVIATIONS:
        return following[:1].isdigit()
    if len(word) == 1 and word.isalpha():
        return True
    return "." in word and _OLD_DOTTED.fullmatch(word) is not None


def _old_split_line(line: str) -> list[str]:
    sentences: list[str] = []
    start = 0
    for match in _OLD_BOUNDARY.finditer(line):
        end = match.end()
        punct = match.group(0)
        nxt = line[end: end + 1]
        if punct[0] in _OLD_CJK:
            if punct == "．" and nxt.isdigit() and line[match.start() - 1: match.start()].isdigit():
                continue
            closed = punct[-1] in _CLOSERS
            if closed and nxt and not nxt.isspace() and nxt not in _OLD_OPENERS:
                continue
            sentences.append(line[start:end])
            start = end
            continue
        if nxt and not nxt.isspace():
            continue
        following = line[end + 1: end + 2]
        if not following or following.isspace():
            seen = _OLD_NON_SPACE.search(line, end)
            following = seen.group(0) if seen else ""
        if following.islower():
            continue
        if (punct.startswith(".") and not punct.startswith("..")
                and _old_abbreviation(_old_word_before(line, start, match.start()), following)):
            continue
        sentences.append(line[start:end])
        start = end
    sentences.append(line[start:])
    return sentences


def _old_sentences(value: str) -> list[str]:
    return [s.strip() for line in value.splitlines() for s in _old_split_line(line) if s.strip()]


# --------------------------------------------------------------------------- random text with the rules' corners

_WORDS = ["Dr", "dr", "e.g", "i.e", "No", "no", "Fig", "U.S", "u.s.a", "J", "a", "approx", "messrs", "Messrs", "St",
          "tower", "town", "century", "engineers", "1843", "3", "x2", "abc_", "_", "ﬁg", "İ", "ı", "ſt", "Straße", "é",
          "Ⅻ", "²", "٣", "１", "東京", "はい", "A.B", "a.²", "Zürich", "MRS", "vs", "al", "sept", "ed", "Jan", "東",
          "Wednesday", "approximately"]
_PUNCT = [".", "..", "...", "!", "?", "?!", ".!", "…", "。", "！", "？", "．", "｡", ".'", '."', ".)", "。」", "」", "’",
          ")", "", "", "", ""]
_SPACES = [" ", " ", " ", "  ", "\t", "\u00a0", "\u3000", "", "\n", "\r\n", " \n", "\x1c", "\u2028"]


def _random_text(rng: random.Random) -> str:
    if rng.random() < 0.3:  # no structure at all
        return "".join(rng.choice(_WORDS + _PUNCT + _SPACES + ["a", "B", "1"]) for _ in range(rng.randint(0, 30)))
    out: list[str] = []
    for _ in range(rng.randint(0, 14)):
        r = rng.random()
        if r < 0.5:
            out.append(rng.choice(_WORDS))
        elif r < 0.8:
            out.append(rng.choice(_PUNCT))
        else:
            out.append(rng.choice(["(", "「", "“", "'", ",", "5", "a", "Q", "-"]))
        out.append(rng.choice(_SPACES))
    return "".join(out)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sentences_are_cut_as_before(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(20_000):
        value = _random_text(rng)
        assert split_sentences(value) == _old_sentences(value), value


def test_sentences_of_prose_are_cut_as_before() -> None:
    prose = ("Dr. Smith met J. R. Tolkien in the U.S. Navy yard. It cost approx. 3.5 million, see Fig. 3. "
             "The answer is no. The tower (built 1843.) fell! Was it the engineers? Yes... maybe. e.g. the "
             "Messrs. Brown and Co. 東京は首都です。「はい。」と言った。１１．５です。 Done")
    for line in (prose, prose.replace(". ", ".\n"), prose.replace(" ", "  ")):
        assert split_sentences(line) == _old_sentences(line)


# --------------------------------------------------------------------------- a text's cut and the row's passages


def test_a_cut_holds_the_tokens_the_functions_give() -> None:
    rng = random.Random(4)
    for _ in range(5_000):
        value = _random_text(rng) + rng.choice(["", " 1,200 and 12,000,000", " 2,5793"])
        cut = text_cut(value)
        assert list(cut.match) == match_tokens(value)
        assert list(cut.content) == [t for t in match_tokens(value) if t not in STOPWORDS]
        assert cut.sentences == tuple(split_sentences(value))
        assert [list(p.content) for p in cut.parts] == [content_tokens(s) for s in split_sentences(value)]
        assert cut.distinct == tuple(dict.fromkeys(content_tokens(value) or match_tokens(value)))


def test_content_union_is_every_passage_s_words() -> None:
    passages = ["The tower was built in 1843.", "", "It cost 1,200 pounds; the town paid.", "東京の塔"]
    want = {t for p in passages for t in content_tokens(p)}
    assert content_union(passages) == want
    assert content_union(passages) is content_union(list(passages))  # remembered for the row's other metrics
    assert content_union([None, "a tower"]) == {"tower"}  # type: ignore[list-item]


def test_the_word_before_a_period_is_read_as_before() -> None:
    rng = random.Random(5)
    letters = ["a", "B", "1", "٣", "²", "_", ".", " ", "(", "ſt", "ß", "İ", "é", "東", "Dr", "no", "e.g", "U.S", "mrs",
               "approx", "tower", "x"]
    for _ in range(20_000):
        line = "".join(rng.choice(letters) for _ in range(rng.randint(0, 6))) + "."
        at = len(line) - 1
        start = rng.randint(0, at)
        following = rng.choice(["", "T", "5", "x"])
        assert (text._abbreviation_before(line, start, at, following)
                == _old_abbreviation(_old_word_before(line, start, at), following)), (line, start, following)


# --------------------------------------------------------------------------- "declines": the words it needs first

_DECLINE_WORDS = ("i I İ ı ı'm i'm im Im I'M am not NOT nOt no No NO n0 sure unsure unſure unknown unable to find "
                  "answer say know don't dont do did didn't have any information details the context contexts "
                  "document passage text source sources provided does mention insufficient enough there is are "
                  "mentioned in specific relevant available about idea cannot can't could couldn't determine tell "
                  "ſay _i i_ 1i i1 é K k").split()
_JAPANESE = ["わかりません", "分かりません", "不明です", "情報がありません", "記載がありません", "見つかりません",
             "お答えできません", "答えられません", "わ", "分か", "見"]


def test_declines_says_as_the_pattern_does() -> None:
    from mlflow_ragjudge.core.matching import DECLINE_PATTERN, declines_says

    rng = random.Random(6)
    seps = [" ", "  ", "\t", "\n", ".", ",", "'", "-", "_", "", "(", "\u00a0", "\u3000"]
    for _ in range(50_000):
        value = "".join(rng.choice(_DECLINE_WORDS + _JAPANESE) + rng.choice(seps) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.3:
            value = rng.choice(seps) + value
        assert declines_says(value) == (DECLINE_PATTERN.search(value) is not None), value
