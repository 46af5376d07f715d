"""Language-aware text utilities: tokens and sentences, with no heavy imports.

The lexical metrics (word recall, ROUGE-L) and the claim/sentence based judges
share these two functions so that English, Japanese and Chinese text is cut the
same way everywhere.

Tokenisation rule (:func:`tokenize`):

1. The text is Unicode-normalised with NFKC (full-width ``ＡＩ１２`` becomes
   ``AI12``, half-width katakana becomes full-width, ligatures are split) and
   case-folded (``Straße`` -> ``strasse``).
2. Every CJK ideograph, kana and hangul character is one token on its own, so a
   Japanese or Chinese sentence (written without spaces) is not one giant token.
   The ranges are listed in :data:`CJK_RANGES`; the iteration mark ``々`` and the
   prolonged sound mark ``ー`` count as CJK characters too.
3. Any other maximal run of letters and digits (Unicode ``str.isalnum``, no
   underscore), together with the combining marks that follow a letter, is one
   token. Everything else (spaces, punctuation, symbols, ``_``) separates tokens.

For plain ASCII text this gives exactly the tokens of ``rouge_score``'s default
tokenizer without stemming (lowercase, ``[^a-z0-9]+`` as separators), which is
what lets :func:`mlflow_ragjudge.metrics.lexical.rouge_l` reproduce its numbers. Outside
ASCII the two differ on purpose: ``rouge_score`` deletes every non-ASCII letter
(``café`` -> ``caf``, and a Japanese sentence -> no tokens at all).

Scripts written without spaces that are not CJK (Thai, Lao, Khmer, ...) are not
segmented: a run of such letters is one token.

Sentence rule (:func:`split_sentences`): a sentence ends

* at a line break;
* right after ``。``, ``！``, ``？``, ``．`` or ``｡`` (and any closing quotes or
  brackets after them), with or without a following space -- except when a
  closing bracket follows and the text goes straight on (``「はい。」と言った。``
  is one sentence);
* after ``.``, ``!``, ``?`` or ``…`` (and closing quotes/brackets) when
  whitespace follows and the next word does not start with a lowercase letter,
  unless the period ends a title or Latin abbreviation (``Dr.``, ``vs.``, ``e.g.``,
  :data:`ABBREVIATIONS`), an abbreviation followed by a number (``No. 5``,
  ``Fig. 3``, :data:`NUMBER_ABBREVIATIONS`), a single-letter initial
  (``J. Smith``; not a unit after a degree sign: ``+50 °C.`` ends a sentence) or a dotted acronym (``U.S.``).

A period inside a number (``3.5``, full-width ``１１．５``), a version (``v1.2.3``), a URL or a file name
is never followed by whitespace, so it never splits.
"""

from __future__ import annotations

import functools
import re
import unicodedata
import warnings
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, Generic, TypeVar

from .errors import InvalidTextWarning

__all__ = [
    "CJK_RANGES",
    "normalize",
    "is_cjk_char",
    "has_cjk",
    "tokenize",
    "token_tuple",
    "TextMemo",
    "word_set",
    "split_sentences",
    "sentence_tuple",
    "ABBREVIATIONS",
    "NUMBER_ABBREVIATIONS",
    "clean_text",
    "as_text_list",
    "nonblank_passages",
    "Repairs",
    "split_context_sentences",
    "non_latin_script",
]

T = TypeVar("T")

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(value: str) -> tuple[str, int]:
    """The text with lone surrogates (invalid Unicode, e.g. from a JSON ``"\\ud800"`` escape) replaced by
    U+FFFD, and how many were replaced. UTF-8 cannot encode such text: left in, it would make a judge
    request or the logged table fail after the judge calls were paid for."""
    if value.isascii():  # (no surrogate in it: told without reading the text)
        return value, 0
    return _SURROGATE.subn("\ufffd", value)

#: Code point ranges (inclusive) whose characters are one token each.
CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x3005, 0x3007),  # 々 〆 〇
    (0x3040, 0x309F),  # Hiragana
    (0x30A0, 0x30FF),  # Katakana (incl. ー)
    (0x3130, 0x318F),  # Hangul Compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana Phonetic Extensions
    (0x3400, 0x4DBF),  # CJK Unified Ideographs Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xA960, 0xA97F),  # Hangul Jamo Extended-A
    (0xAC00, 0xD7AF),  # Hangul Syllables
    (0xD7B0, 0xD7FF),  # Hangul Jamo Extended-B
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0xFF66, 0xFF9F),  # Half-width katakana (NFKC maps most of them away)
    (0x20000, 0x2FA1F),  # CJK Unified Ideographs Extensions B-F, Compatibility Supplement
    (0x30000, 0x323AF),  # CJK Unified Ideographs Extensions G-H
)


def _char_class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges)


_CJK_CLASS = _char_class(CJK_RANGES)
_CJK_RE = re.compile(f"[{_CJK_CLASS}]")


@functools.cache
def _token_re() -> re.Pattern[str]:
    # Combining marks (categories Mn, Mc, Me) are not alphanumeric for Python's
    # regex engine, so "\w+" would cut "é" written as e + U+0301, or a Devanagari
    # word at each vowel sign. Collect them from the Basic Multilingual Plane once
    # (a few milliseconds) and let them continue a word.
    ranges: list[tuple[int, int]] = []
    for cp in range(0x300, 0x10000):
        if unicodedata.category(chr(cp)).startswith("M"):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))
    marks = _char_class(tuple(ranges))
    word_start = f"[^\\W_{_CJK_CLASS}]"
    word_cont = f"(?:[^\\W_{_CJK_CLASS}]|[{marks}])"
    return re.compile(f"[{_CJK_CLASS}]|{word_start}{word_cont}*")


def normalize(text: str) -> str:
    """NFKC-normalise and case-fold ``text`` (step 1 of the tokenisation rule).

    Args:
        text: any string.

    Returns:
        The normalised string.
    """
    return unicodedata.normalize("NFKC", text).casefold()


def is_cjk_char(char: str) -> bool:
    """Whether ``char`` (one character) is a CJK ideograph, kana or hangul.

    Args:
        char: a single character.

    Returns:
        True when the character lies in :data:`CJK_RANGES`.
    """
    return bool(_CJK_RE.fullmatch(char))


def has_cjk(text: str) -> bool:
    """Whether ``text`` contains at least one CJK ideograph, kana or hangul.

    Args:
        text: any string.

    Returns:
        True when some character lies in :data:`CJK_RANGES`.
    """
    return _CJK_RE.search(unicodedata.normalize("NFKC", text)) is not None


class TextMemo(Generic[T]):
    """A function of one text, remembered for the texts seen last.

    The offline metrics read the same texts many times: in one row the seven metrics tokenise the same contexts,
    answer and reference again and again (each metric is written on its own, with plain text in and out). The
    engine scores a row's metrics one after the other, so remembering the last texts' results makes each text's
    tokens cost once per row, with no change to any function's signature.

    Bounded by the characters of the texts it holds (``max_chars``): when a new text would pass the bound, all is
    forgotten and it starts again -- cheaper than keeping an order of use, and a run reads its rows in order, so
    what is dropped is rows already done. A text longer than the bound is not remembered. Results must be
    immutable (tuples): every caller gets the same object. Safe from several threads: a dict's ``get`` and
    item assignment are atomic, and two threads computing the same text's result get equal ones.
    """

    def __init__(self, fn: Callable[[str], T], max_chars: int = 500_000) -> None:
        self._fn = fn
        self._max_chars = max_chars
        self._data: dict[str, T] = {}
        self._chars = 0

    def __call__(self, text: str) -> T:
        got = self._data.get(text)
        if got is None:
            got = self._fn(text)
            size = len(text)
            if size <= self._max_chars:
                if self._chars + size > self._max_chars:
                    self._data = {}
                    self._chars = 0
                self._data[text] = got
                self._chars += size
        return got

    def uncached(self, text: str) -> T:
        """The function's result for ``text``, worked out now and not remembered (a text that is read once)."""
        got = self._data.get(text)
        return self._fn(text) if got is None else got

    def clear(self) -> None:
        self._data = {}
        self._chars = 0


# ASCII bytes as tokenize keeps them: a letter lowercased, a digit as it is, anything else a separator
_ASCII_TOKEN_BYTES = bytes(c + 32 if 65 <= c <= 90 else c if 97 <= c <= 122 or 48 <= c <= 57 else 32
                           for c in range(256))


def _tokens(text: str) -> tuple[str, ...]:
    """The tokenisation rule. Plain ASCII text (most English) takes a shortcut with the same result: NFKC leaves
    ASCII as it is, case-folding is lowercasing, no ASCII character is CJK or a combining mark, so the tokens are
    the runs of ``[a-z0-9]`` of the lowercased text -- cut by ``bytes.translate`` and ``split`` in C, about ten
    times faster than the regular expression."""
    if text.isascii():
        return tuple(text.encode("ascii").translate(_ASCII_TOKEN_BYTES).decode("ascii").split())
    return tuple(_token_re().findall(normalize(text)))


#: the tokens of the texts read last (:class:`TextMemo`)
token_tuple: TextMemo[tuple[str, ...]] = TextMemo(_tokens)


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lowercase word tokens, one token per CJK character.

    See the module docstring for the full rule. The tokens of recent texts are remembered
    (:func:`token_tuple`, the same tokens as a tuple, without the copy).

    Args:
        text: the text to tokenise; ``None`` is treated as empty.

    Returns:
        The tokens in order (duplicates kept).

    Examples:
        >>> tokenize("The Db2 UNION_ALL, v1.2!")
        ['the', 'db2', 'union', 'all', 'v1', '2']
        >>> tokenize("東京は日本の首都です。")
        ['東', '京', 'は', '日', '本', 'の', '首', '都', 'で', 'す']
    """
    if not text:
        return []
    if not isinstance(text, str):  # the error it always gave
        return _token_re().findall(normalize(text))
    return list(token_tuple(text))


def word_set(text: str) -> set[str]:
    """The set of distinct tokens of ``text`` (see :func:`tokenize`).

    Args:
        text: the text to tokenise.

    Returns:
        The distinct tokens.
    """
    return set(tokenize(text))


#: Lowercased abbreviations (without their final period) after which a period
#: never ends a sentence: titles before a name, and Latin abbreviations.
ABBREVIATIONS: frozenset[str] = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "rev", "gen", "col", "lt",
        "capt", "sgt", "gov", "sen", "rep", "hon", "messrs",
        "e.g", "i.e", "cf", "vs", "viz", "al",
    }
)  # fmt: skip

#: Lowercased abbreviations after which a period does not end a sentence when a
#: number follows ("No. 5", "Fig. 3", "Mar. 2024", "ca. 1900"); before a capitalised
#: word they are taken as sentence ends ("The answer is no. The ...").
NUMBER_ABBREVIATIONS: frozenset[str] = frozenset(
    {
        "no", "nos", "vol", "vols", "pp", "fig", "figs", "eq", "eqs", "ch", "sec", "sect", "ref",
        "refs", "art", "ca", "approx", "est", "ed", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
        "sep", "sept", "oct", "nov", "dec",
    }
)  # fmt: skip

# A candidate boundary: a run of Western or of CJK terminal punctuation, then closing quotes/brackets.
_CLOSERS = "\"'”’)]}」』）】〕》〉"
# (Written with one character class first, ``[.!?…。！？．｡]``, so that the regex engine skips to the candidates in
# C: the same matches as ``(?:[.!?…]+|[。！？．｡]+)[closers]*`` at a fifth of the cost.)
_BOUNDARY_RE = re.compile(f"[.!?…。！？．｡](?:(?<=[.!?…])[.!?…]*|[。！？．｡]*)[{re.escape(_CLOSERS)}]*")
# What a line is cut at (re.split): the candidates above that can end a sentence -- a Western one only where whitespace
# or the line's end follows it (one inside a token, "3.5", "e.g.", is never a boundary, and is left inside its piece,
# so the word before a later candidate is still whole) -- each as four items: the candidate; the rest of a Western run
# after its first character (None for a CJK one); the first character after the whitespace that follows it (None at
# the line's end); and the text up to the next candidate. (The same single class first: the engine skips in C.) A
# Western run is a candidate at its first character only, and is read once (possessively): tried again from each of
# its characters, a run of n "!" not followed by whitespace ("Sorry!!!...!x") cost n**2 steps -- 64 KB took minutes.
_PIECES_RE = re.compile(f"([.!?…。！？．｡](?:(?<=[.!?…])(?<![.!?…][.!?…])([.!?…]*+)[{re.escape(_CLOSERS)}]*+"
                        f"(?=\\s+(\\S)|\\s*\\Z)"
                        f"|(?<=[。！？．｡])[。！？．｡]*[{re.escape(_CLOSERS)}]*))")
_OPENERS = frozenset("\"'“‘([{「『（【〔《〈")
_DOTTED_ACRONYM_RE = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")
#: an abbreviation is at most this long (a word of more letters and digits is none, nor a dotted acronym)
_LONGEST_ABBREVIATION = max(map(len, ABBREVIATIONS | NUMBER_ABBREVIATIONS))


def _word_before(line: str, start: int, end: int) -> str:
    """The run of word characters and periods that ends at ``end`` (and starts at ``start`` or later).

    Read backwards from ``end``, so the cost is the word's length: the words before successive candidate
    boundaries do not overlap, and a line is read once however many boundaries it has. (Searching the
    whole sentence so far with ``[\\w.]+$``, once per boundary, was quadratic: a 153 KB author list of
    initials -- ``A. Smith, B. Jones, ...``, where no boundary ends a sentence -- took 69 s.)
    """
    i = end
    while i > start and (line[i - 1].isalnum() or line[i - 1] in "_."):
        i -= 1
    return line[i:end]


#: signs a one-letter unit follows: a period after it ends a sentence (``+50 °C.``), an initial's does not
_UNIT_SIGNS = frozenset("°℃℉")


def _ends_with_abbreviation(word: str, following: str) -> bool:
    """Whether the period after ``word`` ends an abbreviation or an initial, not a sentence (``following``:
    the first character after the whitespace that follows the period)."""
    word = word.lstrip(".")
    if not word:
        return False
    lowered = word.casefold()
    if lowered in ABBREVIATIONS:
        return True
    if lowered in NUMBER_ABBREVIATIONS:
        return following[:1].isdigit()
    if len(word) == 1 and word.isalpha():  # an initial: "J. Smith", "(a. ...)"
        return True
    return "." in word and _DOTTED_ACRONYM_RE.fullmatch(word) is not None  # "U.S", "e.g", "a.m"


def _abbreviation_before(line: str, start: int, at: int, following: str) -> bool:
    """:func:`_ends_with_abbreviation` of the word before the period at ``at`` (:func:`_word_before`), answered
    directly for the usual sentence end: a word of letters and digits only after a space (or at the sentence's
    start), which is no dotted acronym and, longer than any abbreviation, none at all.

    Only the last ``_LONGEST_ABBREVIATION + 1`` characters before ``at`` are searched for the space: searching back
    to the sentence's start was quadratic when no space followed an initial (``("A." + "\t" * 30) * n``, where no
    candidate ends the sentence, 1 MB in a second)."""
    reach = max(start, at - _LONGEST_ABBREVIATION - 1)
    space = line.rfind(" ", reach, at)
    if space < 0 and reach > start:  # no space within reach: the word holds more than any abbreviation ...
        if line[reach:at].isalnum():  # ... of letters and digits (no dotted acronym either: its parts are letters)
            return False
        return _ends_with_abbreviation(_word_before(line, start, at), following)  # separators in it: exactly
    word = line[space + 1 if space >= 0 else start: at]
    if not word.isalnum():  # periods, underscores or other separators in it (or no word): read it exactly
        exact = _word_before(line, start, at)
        if len(exact) == 1 and at - 1 > start and line[at - 2] in _UNIT_SIGNS:
            return False  # a unit, not an initial: "+50 °C. Then ...", "20 °F."
        return _ends_with_abbreviation(exact, following)
    if len(word) > _LONGEST_ABBREVIATION:  # (case folding never shortens a word)
        return False
    lowered = word.casefold()  # (no period in it: no dotted acronym)
    if lowered in ABBREVIATIONS:
        return True
    if lowered in NUMBER_ABBREVIATIONS:
        return following[:1].isdigit()
    return len(word) == 1 and word.isalpha()


def _split_line(line: str) -> list[str]:
    """The sentences of one line. Every step looks at a bounded neighbourhood of a candidate boundary (the
    characters around it, the word before it, the first character after the spaces that follow it) and
    never copies the rest of the line, so the cost is linear in the line's length. The line is cut at every
    candidate by the regex engine first (:data:`_PIECES_RE`); each candidate is then kept as a boundary or not."""
    pieces = _PIECES_RE.split(line)
    if len(pieces) == 1:
        return pieces
    sentences: list[str] = []
    start = end = 0
    for before, punct, rest, following in zip(pieces[::4], pieces[1::4], pieces[2::4], pieces[3::4]):
        end += len(before) + len(punct)
        if rest is None:  # CJK terminators (the character right after them decides)
            nxt = line[end: end + 1]
            if punct == "．" and nxt.isdigit() and before[-1:].isdigit():
                continue  # full-width decimal point: "１１．５"
            if punct[-1] in _CLOSERS and nxt and not nxt.isspace() and nxt not in _OPENERS:
                continue  # 「はい。」と言った。: the quotation is part of a longer sentence
        else:  # Western, followed by whitespace or the line's end
            if following is None:
                following = ""
            elif following.islower():
                continue  # "e.g. the", "approx. five"
            if punct[0] == "." and not rest.startswith(".") and _abbreviation_before(line, start, end - len(punct),
                                                                                     following):
                continue
        sentences.append(line[start:end])
        start = end
    sentences.append(line[start:])
    return sentences


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences (rule in the module docstring).

    Args:
        text: the text to split; ``None`` is treated as empty.

    Returns:
        The sentences, stripped of surrounding whitespace, empty ones dropped.

    Examples:
        >>> split_sentences("Use e.g. UNION. It costs 3.5 units! Done")
        ['Use e.g. UNION.', 'It costs 3.5 units!', 'Done']
        >>> split_sentences("東京は首都です。大阪は違います！")
        ['東京は首都です。', '大阪は違います！']
    """
    if not text:
        return []
    if not isinstance(text, str):  # the error it always gave
        return list(_sentences(text))
    return list(sentence_tuple(text))


def _sentences(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for line in text.splitlines():
        out.extend(filter(None, map(str.strip, _split_line(line))))  # stripped, the empty ones left out
    return tuple(out)


#: the sentences of the texts read last (:class:`TextMemo`)
sentence_tuple: TextMemo[tuple[str, ...]] = TextMemo(_sentences)


def as_text_list(contexts: Sequence[str] | str | None) -> list[str]:
    """A list of passages as text: None -> [], a str -> [it], None items -> ""."""
    if contexts is None:
        return []
    if isinstance(contexts, str):
        return [contexts]
    return ["" if c is None else str(c) for c in contexts]


def nonblank_passages(passages: Sequence[object] | str | None) -> list[str]:
    """The passages a judge is shown: every item as text, blank ones left out, in order.

    Blank means None, or text that is empty or only whitespace once converted with ``str`` (spaces, tabs,
    line breaks, and Unicode spaces such as U+3000 that :meth:`str.strip` removes). None or an empty list gives
    ``[]``; a single str is one passage. Every metric that shows or counts passages (faithfulness's evidence,
    context precision and recall, correctness's and multi-turn's judge contexts, the offline judge) filters
    them here, so "no passages" means the same thing to all of them.
    """
    if passages is None:
        return []
    if isinstance(passages, str):
        passages = [passages]
    return [text for text in ("" if p is None else str(p) for p in passages) if text.strip()]


def split_context_sentences(contexts: Sequence[str] | None) -> list[tuple[int, str]]:
    """``(passage number, sentence)`` for every sentence of every passage, in order.

    Sentences are cut by :func:`mlflow_ragjudge.core.text.split_sentences` (English, Japanese and
    Chinese terminators; line breaks).
    """
    out: list[tuple[int, str]] = []
    for i, passage in enumerate(as_text_list(contexts), 1):
        out.extend((i, s) for s in split_sentences(passage))
    return out


class Repairs:
    """Text repairs made while reading the data: recorded in the run's config and announced once."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def text(self, value: Any, column: str, row: int) -> Any:
        if isinstance(value, str):
            value, n = clean_text(value)
            if n:
                self.items.append({"row": row, "column": column, "replaced": n})
        return value

    def announce(self) -> None:
        if self.items:
            total = sum(i["replaced"] for i in self.items)
            where = ", ".join(f"row {i['row']} '{i['column']}'" for i in self.items[:5])
            more = f" and {len(self.items) - 5} more" if len(self.items) > 5 else ""
            warnings.warn(
                f"{total} invalid character(s) (lone surrogates, which UTF-8 cannot encode) were replaced with "
                f"U+FFFD in {where}{more}; fix the data's encoding to keep the original text.",
                InvalidTextWarning, stacklevel=3,
            )


_SCRIPTS = (("CJK", ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFF66, 0xFF9F))),
            ("Hangul", ((0x1100, 0x11FF), (0xAC00, 0xD7AF))), ("Cyrillic", ((0x0400, 0x04FF),)),
            ("Greek", ((0x0370, 0x03FF),)), ("Arabic", ((0x0600, 0x06FF),)), ("Hebrew", ((0x0590, 0x05FF),)),
            ("Devanagari", ((0x0900, 0x097F),)), ("Thai", ((0x0E00, 0x0E7F),)))


def non_latin_script(text: str | None, share: float = 0.3) -> str | None:
    """The name of the non-Latin script (``CJK``, ``Hangul``, ``Cyrillic`` ...) that at least ``share`` of the
    text's letters are written in, or None (mostly Latin letters, or no letters)."""
    counts: dict[str, int] = {}
    letters = 0
    for ch in text or "":
        if not ch.isalpha():
            continue
        letters += 1
        code = ord(ch)
        for name, ranges in _SCRIPTS:
            if any(lo <= code <= hi for lo, hi in ranges):
                counts[name] = counts.get(name, 0) + 1
                break
    if not letters or not counts:
        return None
    name, n = max(counts.items(), key=lambda kv: kv[1])
    return name if n / letters >= share else None


# --------------------------------------------------------------------------- numbers written in CJK numerals

_CJK_DIGITS = {"〇": 0, "零": 0, "一": 1, "二": 2, "两": 2, "兩": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7,
               "八": 8, "九": 9}
_CJK_UNITS = {"十": 10, "百": 100, "千": 1000}
_CJK_BIG_UNITS = {"万": 10**4, "萬": 10**4, "亿": 10**8, "億": 10**8, "兆": 10**12}
_CJK_NUMERALS = "".join([*_CJK_DIGITS, *_CJK_UNITS, *_CJK_BIG_UNITS])
#: a run of numerals, digits among them where a numeral follows (1400万 = 14000000, 2万1000 = 21000, 1.4億)
_CJK_NUMBER_RE = re.compile(rf"(?:\d+(?:\.\d+)?)?(?:[{_CJK_NUMERALS}]+(?:\d+(?:\.\d+)?)?)+")
_CJK_PIECE = re.compile(r"\d+(?:\.\d+)?|.")


def _cjk_number(run: str) -> str:
    pieces = _CJK_PIECE.findall(run)
    if not any(c in _CJK_UNITS or c in _CJK_BIG_UNITS for c in pieces):  # digit by digit: 二〇二三 = 2023
        return "".join(str(_CJK_DIGITS[c]) if c in _CJK_DIGITS else c for c in pieces)
    total = section = digit = Decimal(0)
    for c in pieces:
        if c in _CJK_DIGITS:
            digit = Decimal(_CJK_DIGITS[c])
        elif c in _CJK_UNITS:
            section += (digit or 1) * _CJK_UNITS[c]  # 十 alone is ten
            digit = Decimal(0)
        elif c in _CJK_BIG_UNITS:
            total += (section + digit or 1) * _CJK_BIG_UNITS[c]
            section = digit = Decimal(0)
        else:  # digits among the numerals: 1400万
            digit = Decimal(c)
    value = total + section + digit
    return str(int(value)) if value == value.to_integral_value() else format(value.normalize(), "f")


def cjk_numbers(text: str | None) -> list[str]:
    """The numbers ``text`` writes in Chinese / Japanese numerals, as digit strings, in order (``两万一千`` ->
    ``21000``, ``三百`` -> ``300``, ``二〇二三`` -> ``2023``, ``十五`` -> ``15``; ``一`` of ``一番`` is 1 too: a
    number the answer does not give, which only counts where the answer is a number). Numbers in Arabic digits are
    the tokenizer's."""
    if not text:
        return []
    return [_cjk_number(m.group(0)) for m in _CJK_NUMBER_RE.finditer(text)]


def numerals_as_digits(text: str) -> str:
    """``text`` with each run of Chinese / Japanese numerals written in digits (:func:`cjk_numbers`):
    ``长城长两万一千公里`` -> ``长城长21000公里``."""
    return _CJK_NUMBER_RE.sub(lambda m: _cjk_number(m.group(0)), text)


# --------------------------------------------------------------------------- languages written in Latin letters

# Frequent function words of some languages written in Latin letters, none of them an English word a reader would
# meet in English text ("a", "in", "is", "die", "me" ... are left out)
_FUNCTION_WORDS = {
    "French": "le la les des du est et une un que qui dans pour pas sur avec ce cette sont il elle au aux par ou ne "
              "se nous vous ils été être était où mais plus son sa ses leur quel quelle comment pourquoi",
    "German": "der das und ist nicht ein eine einen dem den zu mit von auf für sich auch es im sind wird wurde war "
              "als bei oder aber wie noch nach dass er sie wir ich welche welcher wann warum wo",
    "Spanish": "el la los las de del y que en es un una por con para se lo al su sus como más pero fue son está este "
               "esta ha muy entre cuando también cuál qué dónde quién",
    "Italian": "il lo la gli le di del della e è che un una per con non si da dei nel nella sono ha come più anche ma "
               "questo questa alla al quale dove chi perché",
    "Portuguese": "o os as da do das dos de e é que um uma para com não em no na se por mais foi são como mas ao sua "
                  "seu está qual onde quem porque",
    "Dutch": "de het een en van dat niet op te zijn met voor er maar ook als bij aan om wordt werd naar dit deze wat "
             "hij zij ze nog welke waar waarom",
    "Swedish": "och att det som en är på för med har inte av till den ett om var jag vad när hur vilken också eller "
               "finns kan",
    "Danish": "og at det som en er på til med har ikke af den et om var jeg hvad hvornår hvordan hvilken også eller "
              "findes kan",
    "Norwegian": "og at det som en er på til med har ikke av den et om var jeg hva når hvordan hvilken også eller "
                 "finnes kan",
    "Polish": "i w nie na się z do że jest to jak co po ale czy jego od przez dla był była są ten ta które który gdzie "
              "kiedy jaka jaki",
    "Czech": "a v se na je že s z do to jak co ale by jeho od pro byl byla jsou ten ta které který kde kdy jaké jaký "
             "není",
    "Romanian": "și în de la cu pe este că un o nu se din care mai ce sunt pentru fost sau cel cea unde când cum",
    "Turkish": "ve bir bu da de için ile ne çok daha olarak olan gibi kadar var değil mi mı nedir nerede hangi nasıl "
               "kim",
    "Indonesian": "dan yang di ke dari ini itu dengan untuk tidak ada adalah akan pada juga atau sudah apa siapa "
                  "dimana kapan bagaimana berapa",
    "Vietnamese": "là của và các có không được trong những cho với một này người đã khi thì cũng như gì nào đâu bao",
    "Finnish": "ja on ei se että oli ovat kun mutta tai myös hän joka mikä missä milloin miten kuka mitä",
    "Hungarian": "és a az ez hogy nem egy van meg de csak mint volt már mi mit hol mikor hogyan melyik ki vagy ezt azt "
                 "pedig amely ami",
}
_ENGLISH_WORDS = frozenset("the of and to is in that it was for on are with as his her they be at this have from or by "
                           "not but what which when where who why how an were there been has had their its will would "
                           "can does did you we he she".split())
# words of both English and another language's list (Portuguese "a", "do", "no"; ...), and short words that are
# also names or abbreviations in English text ("Van Gogh", "Ki Hajar", "et al."): counted for neither
_SHARED_WORDS = _ENGLISH_WORDS | {"a", "do", "no", "so", "me", "die", "den", "van", "am", "also", "war", "hat", "will",
                                   "i", "o", "s", "z", "ne", "mi", "ki", "ta", "te", "se",
                                   "by", "pro", "cum", "meg", "mint", "ten", "kim", "bao", "gi", "dan", "di", "ke",
                                   "ada", "apa", "the", "can", "kan", "et", "av", "far", "men", "mit", "vi"}
_OTHER_WORDS = {lang: frozenset(words.split()) - _SHARED_WORDS for lang, words in _FUNCTION_WORDS.items()}
_LATIN_WORD_RE = re.compile(r"[^\W\d_]+")
#: a text of at least this many distinct words, none of them an English function word, is not taken for English
#: (a question and its answer in English nearly always have one: of the 1,856 English rows of NQ301, MTRAG and the
#: bundled sample, 3 are taken for another language, the answers to one keyword query: "india south africa test
#: series 2018 highest runs")
UNIDENTIFIED_MIN_WORDS = 3
UNIDENTIFIED_LANGUAGE = (f"a language other than English (no English function word among {UNIDENTIFIED_MIN_WORDS} "
                         "or more words)")


def latin_language(text: str | None) -> str | None:
    """The language, other than English, that a text in Latin letters is written in, told by its function words
    (French, German, Spanish, Italian, Portuguese, Dutch, Swedish, Danish, Norwegian, Polish, Czech, Romanian,
    Turkish, Indonesian, Vietnamese, Finnish or Hungarian; close languages may be told one for the other), or None:
    English, too few function words to tell, or another script (:func:`non_latin_script`). Another language is
    named when at least two distinct words of the text are its function words (and not English ones) and they
    outnumber the distinct English function words: ``Quelle est la capitale de la France ?`` is French; ``The Musée
    de la Ville is in Paris.`` is English. A text of :data:`UNIDENTIFIED_MIN_WORDS` distinct words or more with no
    English function word at all is :data:`UNIDENTIFIED_LANGUAGE` (Lithuanian, Estonian, Swahili ...: not English,
    whatever it is); give it a question and its answer together (an English question has one: who, what, the, of
    ...), not a bare sentence such as ``La La Land won six Oscars.``"""
    words = {w.lower() for w in _LATIN_WORD_RE.findall(text or "")}
    english = len(words & _ENGLISH_WORDS)
    hits = {lang: len(words & vocab) for lang, vocab in _OTHER_WORDS.items()}
    lang, n = max(hits.items(), key=lambda kv: kv[1])
    if n >= 2 and n > english:
        return lang
    if english == 0 and len(words) >= UNIDENTIFIED_MIN_WORDS:
        return UNIDENTIFIED_LANGUAGE
    return None
