"""Text as the offline judge and the checks compare it: tokens normalised for matching (case, accents, number
words, ordinals, thousands separators, a light English stemmer), content words (no stop words), each text's cut
worked out once for all the metrics of a row (:class:`TextCut`), and whether a whole response declines to answer
("not sure"). Ground floor: only :mod:`mlflow_ragjudge.core.text` below it."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from itertools import chain, filterfalse

from .text import TextMemo, sentence_tuple, split_sentences, token_tuple, tokenize

__all__ = ["STOPWORDS", "match_tokens", "content_tokens", "match_tuple", "content_tuple", "TextCut", "text_cut",
           "content_union", "cut_by_sentence", "declines_to_answer", "DECLINE_PATTERN", "COURTESY_PATTERN"]

#: English function words: never content words
STOPWORDS: frozenset[str] = frozenset(
    """a an the of to in on for and or but nor is are was were be been being am it its this that these those with
    as by at from which who whom whose what when where why how can you your yours i we they he she him her them his
    hers their theirs our ours us me my mine not no do does did done has have had having will would shall should
    could may might must there here also than then so such into about over under after before during between
    through up down out off again further once both each few more most other some any all own same too very just
    only if while because until against above below s t""".split()
)

_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}

_NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80",
                      "ninety": "90", "hundred": "100"})
_ORDINAL_WORDS = {w: str(i) for i, w in enumerate(
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth fourteenth "
    "fifteenth sixteenth seventeenth eighteenth nineteenth twentieth".split(), 1)}

# a thousands separator: a comma after a digit and before exactly three digits (the comma first, so that the regex
# engine skips to the commas in C: the same matches as "(?<=\d),(?=\d{3}(?!\d))" at a twentieth of the cost)
_THOUSANDS = re.compile(r",(?<=\d,)(?=\d{3}(?!\d))")

_ORDINAL_SUFFIX = re.compile(r"^(\d+)(?:st|nd|rd|th)$")

def _stem(t: str) -> str:
    """A light English suffix stripper (plural, -ing, -ed, -er, -al, -ly), for matching only."""
    if len(t) < 4 or not t.isalpha() or not t.isascii():
        return t
    if t.endswith("ies") and len(t) > 4:
        t = t[:-3] + "y"
    elif t.endswith("sses"):
        t = t[:-2]
    elif t.endswith("s") and not t.endswith(("ss", "us", "is")):
        t = t[:-1]
    for suffix, shortest in (("ing", 6), ("ed", 5), ("er", 7)):
        if t.endswith(suffix) and len(t) >= shortest:
            t = t[: -len(suffix)]
            if len(t) > 2 and t[-1] == t[-2] and t[-1] not in "lsz":  # stopp(ed) -> stop
                t = t[:-1]
            return t
    if t.endswith("al") and len(t) >= 8:
        return t[:-2]
    if t.endswith("ly") and len(t) >= 6:
        return t[:-2]
    return t

def _normal_form(t: str) -> str:
    if not t.isascii():
        folded = "".join(c for c in unicodedata.normalize("NFKD", t) if not unicodedata.combining(c))
        if not folded.isascii():
            return t  # CJK and other scripts: as tokenize gives them
        t = folded
    m = _ORDINAL_SUFFIX.match(t)
    if m:
        return m.group(1)
    if t in _NUMBER_WORDS:
        return _NUMBER_WORDS[t]
    if t in _ORDINAL_WORDS:
        return _ORDINAL_WORDS[t]
    if t.isdigit():
        return str(int(t)) if len(t) <= 15 else t
    return _stem(t)

class _NormalTokens(dict[str, str]):
    """Each token's matching form, worked out the first time the token is met: looked up in C
    (``map(_normal_token, tokens)``) where an ``lru_cache`` costs three times as much per token. Forgotten when it
    holds 200,000 tokens."""

    def __missing__(self, t: str) -> str:
        if len(self) >= 200_000:
            self.clear()
        form = self[t] = _normal_form(t)
        return form

_normal_token = _NormalTokens().__getitem__

class TextCut:
    """One text as the offline judge compares it, worked out once and remembered (:func:`text_cut`): its matching
    tokens (:func:`match_tokens`), its content words (:func:`content_tokens`) and, made when first asked for, the
    views of them the metrics read (sets, the phrase form, one-letter words) and its sentences, each cut the same way
    (:attr:`parts`).

    A row's seven offline metrics read the same few texts -- the question, the answer, the reference, the passages
    and their sentences -- again and again: each text is cut here once per row, and every metric reads the cut
    instead of cutting the text again. Nothing here changes after it is made (every caller gets the same object).

    Args:
        text: the text.
        remember_tokens: keep the text's word tokens among the tokens of the texts read last
            (:data:`~mlflow_ragjudge.core.text.token_tuple`: the lexical metrics read a row's whole texts' tokens
            too); a sentence's cut, which only this cut reads, does not.
    """

    __slots__ = ("text", "_remember", "_tokens", "_match", "_content", "_match_set", "_content_set", "_distinct",
                 "_distinct_set", "_spaced", "_initials", "_pairs", "_sentences", "_parts")

    def __init__(self, text: str, remember_tokens: bool = True) -> None:
        self.text = text
        self._remember = remember_tokens
        self._tokens: tuple[str, ...] | None = None
        self._match: tuple[str, ...] | None = None
        self._content: tuple[str, ...] | None = None
        self._match_set: frozenset[str] | None = None
        self._content_set: frozenset[str] | None = None
        self._distinct: tuple[str, ...] | None = None
        self._distinct_set: frozenset[str] | None = None
        self._spaced: str | None = None
        self._initials: frozenset[str] | None = None
        self._pairs: frozenset[tuple[str, str]] | None = None
        self._sentences: tuple[str, ...] | None = None
        self._parts: tuple[TextCut, ...] | None = None

    def pieces(self) -> tuple[TextCut, ...]:
        """The cuts whose tokens, one after the other, are this text's: its sentences' when it is cut by sentence and
        ASCII (see :attr:`match`), else itself alone. What reads all of a text's tokens in order, or their set, reads
        them piece by piece: no tuple of the whole text is made (nor walked by the garbage collector)."""
        parts = self._parts
        return parts if parts is not None and self.text.isascii() else (self,)

    @property
    def tokens(self) -> tuple[str, ...]:
        """The word tokens (:func:`~mlflow_ragjudge.core.text.tokenize`), as the lexical metrics read them."""
        if self._tokens is None:
            if self._parts is not None and self.text.isascii():  # (as :attr:`match`)
                self._tokens = tuple(chain.from_iterable(p.tokens for p in self._parts))
            else:
                self._tokens = (token_tuple if self._remember else token_tuple.uncached)(self.text)
        return self._tokens

    @property
    def match(self) -> tuple[str, ...]:
        """The tokens as the offline judge matches them (:func:`match_tokens`)."""
        if self._match is None:
            parts = self._parts
            text = self.text
            if parts is not None and text.isascii():
                # an ASCII text's tokens are its sentences' tokens one after the other: a sentence ends at punctuation,
                # whitespace or a line break, never inside a token or a number with thousands separators
                self._match = tuple(chain.from_iterable(p.match for p in parts))
            elif "," in text and (joined := _THOUSANDS.sub("", text)) != text:
                # the tokens of the text without its thousands separators ("2,579" is one number)
                self._match = tuple(map(_normal_token, token_tuple.uncached(joined)))
            else:
                self._match = tuple(map(_normal_token, self.tokens))
        return self._match

    @property
    def content(self) -> tuple[str, ...]:
        """The match tokens that are not :data:`STOPWORDS`, in order, repeats kept (:func:`content_tokens`)."""
        if self._content is None:
            parts = self._parts
            if parts is not None and self.text.isascii():  # (as :attr:`match`)
                self._content = tuple(chain.from_iterable(p.content for p in parts))
            else:
                self._content = tuple(filterfalse(STOPWORDS.__contains__, self.match))
        return self._content

    @property
    def match_set(self) -> frozenset[str]:
        """The distinct match tokens."""
        if self._match_set is None:
            self._match_set = frozenset(chain.from_iterable(p.match for p in self.pieces()))
        return self._match_set

    @property
    def content_set(self) -> frozenset[str]:
        """The distinct content words."""
        if self._content_set is None:
            self._content_set = frozenset(chain.from_iterable(p.content for p in self.pieces()))
        return self._content_set

    @property
    def distinct(self) -> tuple[str, ...]:
        """The distinct content words in the order they first occur -- the distinct match tokens when the text has
        no content word (an answer such as "It is"): what an answer asks a response or a passage to contain."""
        if self._distinct is None:
            self._distinct = tuple(dict.fromkeys(self.content or self.match))
        return self._distinct

    @property
    def distinct_set(self) -> frozenset[str]:
        """:attr:`distinct` as a set."""
        if self._distinct_set is None:
            self._distinct_set = frozenset(self.distinct)
        return self._distinct_set

    @property
    def spaced(self) -> str:
        """The match tokens joined by single spaces, with a space before and after (``" t1 t2 ... "``): a token
        sequence occurs in another exactly when its spaced form is a substring of the other's."""
        if self._spaced is None:
            self._spaced = f" {' '.join(self.match)} "
        return self._spaced

    @property
    def initials(self) -> frozenset[str]:
        """The content words that are one ASCII letter (``B. R. Ambedkar``)."""
        if self._initials is None:
            self._initials = frozenset(t for t in self.content if len(t) == 1 and t.isalpha() and t.isascii())
        return self._initials

    @property
    def pairs(self) -> frozenset[tuple[str, str]]:
        """The pairs of content words that follow each other in one sentence, in their order (``("discov",
        "fleming")`` for "discovered by Fleming"): a phrase's words, not only its words."""
        if self._pairs is None:
            self._pairs = frozenset(chain.from_iterable(zip(p.content, p.content[1:]) for p in self.pieces()))
        return self._pairs

    @property
    def sentences(self) -> tuple[str, ...]:
        """The text's sentences (:func:`~mlflow_ragjudge.core.text.split_sentences`)."""
        if self._sentences is None:
            self._sentences = sentence_tuple(self.text)
        return self._sentences

    @property
    def parts(self) -> tuple[TextCut, ...]:
        """The cut of each of :attr:`sentences`, in order: what faithfulness reads of an answer's sentences, context
        recall of a reference's and context relevance of a passage's."""
        return self._parts if self._parts is not None else self.cut_sentences()

    def cut_sentences(self) -> tuple[TextCut, ...]:
        """:attr:`parts`, made now if they are not yet."""
        if self._parts is None:
            self._parts = tuple(map(_sentence_cut, self.sentences))
        return self._parts


def cut_by_sentence(texts: Iterable[str | None]) -> None:
    """Cut each text into its sentences now (:attr:`TextCut.parts`), before anything reads its words: an ASCII text's
    words are then read from its sentences' cuts, not cut a second time. The engine does this once per row for the
    texts that a metric of the run reads sentence by sentence (``MetricSpec.needs.sentences``); it changes no result.
    (Only ASCII texts: only theirs are read from their sentences.)"""
    for text in texts:
        if isinstance(text, str) and text.isascii():
            text_cut(text).cut_sentences()


def _cut_sentence(sentence: str) -> TextCut:
    return TextCut(sentence, remember_tokens=False)


#: the cuts of the sentences read last: a passage's sentences, remembered on their own (a sentence that another
#: passage repeats -- a disclaimer, a heading, the same fact in two documents -- is cut once)
_sentence_cut: TextMemo[TextCut] = TextMemo(_cut_sentence)

#: the :class:`TextCut` of the texts read last (:class:`~mlflow_ragjudge.core.text.TextMemo`)
text_cut: TextMemo[TextCut] = TextMemo(TextCut)


def match_tuple(text: str) -> tuple[str, ...]:
    """:func:`match_tokens` of a string, as the tuple its :class:`TextCut` holds (no copy)."""
    return text_cut(text).match


def content_tuple(text: str) -> tuple[str, ...]:
    """:func:`content_tokens` of a string, as the tuple its :class:`TextCut` holds (no copy)."""
    return text_cut(text).content


_unions: dict[tuple[str, ...], frozenset[str]] = {}


def content_union(texts: Iterable[str]) -> frozenset[str]:
    """The content words of all ``texts`` together, remembered for the last few sequences of texts: the offline
    correctness, faithfulness and context recall of a row each ask for the words of the same passages."""
    key = tuple(texts)
    try:
        got = _unions.get(key)
    except TypeError:  # an item that is no string (and cannot be a key): its words, not remembered
        return frozenset().union(*map(content_tokens, key))
    if got is None:
        if len(_unions) >= 64:  # the rows read before: never asked for again
            _unions.clear()
        got = _unions[key] = frozenset(chain.from_iterable(map(_content_pieces, key)))
    return got


def _content_pieces(text: str) -> Iterator[str]:
    """A text's content words, piece by piece (:meth:`TextCut.pieces`)."""
    if not isinstance(text, str):
        return iter(content_tokens(text))
    return chain.from_iterable(p.content for p in text_cut(text).pieces())


def match_tokens(text: str | None) -> list[str]:
    """The tokens of ``text`` as the offline judge compares them (see the module docstring)."""
    if not text:
        return []
    if not isinstance(text, str):  # the error it always gave
        return [_normal_token(t) for t in tokenize(_THOUSANDS.sub("", text))]
    return list(match_tuple(text))

def content_tokens(text: str | None) -> list[str]:
    """:func:`match_tokens` without :data:`STOPWORDS` (order and repeats kept)."""
    if not text or not isinstance(text, str):
        return [t for t in match_tokens(text) if t not in STOPWORDS]
    return list(content_tuple(text))

# A clause that only declines: says it does not know, or that the sources do not say.
_SOURCES = (r"(?:context|contexts|document|documents|documentation|passage|passages|text|texts|source|sources|article|"
            r"articles|information|manual|page|pages|search\s+results?)")

DECLINE_PATTERN = re.compile(
    r"\bi\s+(?:do\s+not|don'?t|did\s+not|didn'?t)\s+(?:know|have\s+(?:any\s+|specific\s+|enough\s+|the\s+|that\s+)?"
    r"(?:information|details|knowledge|data))"
    r"|\bi\s+(?:cannot|can'?t|could\s+not|couldn'?t|am\s+unable\s+to|'m\s+unable\s+to|am\s+not\s+able\s+to|"
    r"was\s+unable\s+to)\s+(?:find|answer|determine|say|tell|confirm|provide|locate)"
    r"|\bi\s+have\s+no\s+(?:information|idea|details|data)"
    r"|\b(?:i'?m|i\s+am)\s+(?:not\s+sure|unsure|not\s+certain)"
    r"|^\W*(?:not\s+sure|unsure|unknown|no\s+idea|unable\s+to\s+(?:answer|determine|find))\b"
    rf"|\b{_SOURCES}\s+(?:provided\s+|given\s+|i\s+found\s+|available\s+|above\s+)?(?:does|do|did)\s+not\s+"
    r"(?:say|mention|specify|state|provide|contain|include|cover|indicate|explain|answer|tell|give)"
    rf"|\bnot\s+(?:mentioned|specified|stated|provided|given|covered|found|available)\s+in\s+(?:the\s+|these\s+)?"
    rf"(?:provided\s+|given\s+|available\s+)?{_SOURCES}"
    r"|\bthere\s+(?:is|are)\s+no\s+(?:specific\s+|relevant\s+|further\s+)?(?:information|mention|details)\b"
    r"|\bno\s+(?:specific\s+|relevant\s+)?information\s+(?:is\s+)?(?:available|provided|given|about|on|regarding)\b"
    r"|\b(?:insufficient|not\s+enough)\s+information\b"
    r"|わかりません|分かりません|不明です|情報がありません|記載がありません|見つかりません|お答えできません|答えられません",
    re.IGNORECASE,
)

# DECLINE_PATTERN.search, fast (declines_says below): every match of the pattern starts at the text's start (its
# "^\W*" alternative, or any other), at a word that follows a non-word character (the English alternatives all start
# with "\b" and a letter), or at one of the Japanese phrases. The search for the second kind starts from the
# non-word characters, which the regex engine skips to in C, instead of trying eleven alternatives at every character.
_AFTER_NON_WORD = re.compile(rf"\W(?=(?:{DECLINE_PATTERN.pattern}))", re.IGNORECASE)
# (the first characters of the pattern's Japanese phrases: its alternatives that are not ASCII)
_JAPANESE_FIRST = re.compile("[" + "".join(sorted({a[0] for a in DECLINE_PATTERN.pattern.split("|")
                                                   if not a.isascii()})) + "]")


# Every English match of the pattern has one of these words at a word's start, where it begins or inside it: "i"
# before whitespace, "'m" or "m" (its first four alternatives), "no" or "not" before whitespace (the sources'
# "... do not say", "not mentioned in", "there is no", "no information", "not enough", "not sure"), "insufficient",
# "unsure", "unknown", "unable". A text with none of them and none of the Japanese phrases' first characters does
# not decline: told by one search that skips to the non-word characters in C and tries four short alternatives
# there, with the pattern's IGNORECASE (so "İ", "ı", "ſ" are read as the pattern reads them).
_DECLINE_WORD = r"i(?:\s|'?m)|not?\s|insufficient|un(?:sure|known|able)"
_DECLINE_WORD_FIRST = re.compile(f"(?:{_DECLINE_WORD})", re.IGNORECASE)
_DECLINE_WORD_AFTER = re.compile(rf"\W(?=(?:{_DECLINE_WORD}))", re.IGNORECASE)


def declines_says(text: str) -> bool:
    """Whether some part of ``text`` declines (``DECLINE_PATTERN.search(text) is not None``, at a fraction of its
    cost: most of a row's sentences are tested, few decline)."""
    if not (_DECLINE_WORD_FIRST.match(text) or _DECLINE_WORD_AFTER.search(text) or _JAPANESE_FIRST.search(text)):
        return False  # (6 -> 1.6 us for a sentence of an answer)
    if DECLINE_PATTERN.match(text) or _AFTER_NON_WORD.search(text):
        return True
    return _JAPANESE_FIRST.search(text) is not None and DECLINE_PATTERN.search(text) is not None


# Courtesy that carries no answer either way.
COURTESY_PATTERN = re.compile(
    r"^\W*(?:sorry|i'?m\s+sorry|unfortunately|thank\s+you|thanks|you'?re\s+welcome|hope\s+this\s+helps"
    r"|i\s+hope\s+this\s+helps|feel\s+free\s+to\s+ask.*|let\s+me\s+know.*|if\s+you\s+have\s+any\s+(?:more|other|"
    r"further)\s+questions.*|please\s+(?:let|ask).*|stay\s+safe|good\s+luck)\W*$",
    re.IGNORECASE,
)

# "(?<!\s)": a conjunction's leading spaces are matched from the first space of a run only (tried from each of
# a run's n spaces, the pattern was n**2: 20,000 spaces in an answer took seconds)
_CLAUSE_SPLIT = re.compile(r"[;:,，、]|(?<!\s)\s+(?:but|however|although|though|and)\s+|。", re.IGNORECASE)

def _clauses(text: str) -> list[str]:
    return [c.strip() for s in split_sentences(text) for c in _CLAUSE_SPLIT.split(s) if c and c.strip()]

def declines_to_answer(response: str | None, question: str | None = None) -> bool:
    """Whether the **whole** response declines to answer ("not sure", level 0 of the six-level rubric).

    The response is cut into clauses (sentences, then ``;`` ``,`` ``but`` ...). It declines when at least one
    clause says it does not know / the sources do not say, and no other clause carries content: every other
    clause is courtesy ("Sorry", "feel free to ask") or has no content word beyond the question's. A partial
    answer that adds "there is no information about X" keeps its answer, so it is graded, not abstained.
    """
    text = response or ""
    clauses = _each_clause(text) if isinstance(text, str) else iter(_clauses(text))
    asked: set[str] | None = None
    declined = False
    for clause in clauses:
        if asked is None:
            asked = set(content_tokens(question))
        if declines_says(clause):
            declined = True
        elif COURTESY_PATTERN.match(clause):
            continue
        elif any(t not in asked for t in content_tokens(clause)):
            return False
    return declined

def _each_clause(text: str) -> Iterator[str]:
    """:func:`_clauses`, one at a time: most responses are found not to decline at their first clause, so the rest
    of the response is never cut into clauses."""
    for sentence in split_sentences(text):
        for clause in _CLAUSE_SPLIT.split(sentence):
            if clause and clause.strip():
                yield clause.strip()
