"""What a response asserts about an answer, read without a model: the offline judge's reading of number forms,
quantities with a currency or a temperature scale, and the ways a response can name the right answer without
giving it (issue 39).

* :func:`number_forms` writes numbers in one form before any comparison: scale words (``14 million``,
  ``1.4 billion``, ``1,400 million``), digits grouped by spaces (``14 000 000``), numbers and years spelled out
  (``fourteen million``, ``nineteen sixty-nine``), and Chinese / Japanese numerals, mixed with digits or not
  (``1400万``, ``14億``, ``两万一千``) -- all become digits (``14000000``, ``1969``).
* :func:`quantities` reads amounts of money with their currency (``$1,000``, ``€1,000``, ``500 GBP``, ``1000円``)
  and temperatures with their scale (``20 °C``, ``68°F``, ``摂氏20度``); :func:`quantity_conflict` finds a
  response that gives the answer's amount in another currency or scale.
* :func:`unasserted` finds a response that names the answer only where it does not assert it: denied
  (``It is not Canberra.``, ``Alexander Fleming did not discover penicillin.``, ``キャンベラではありません``), as one
  of several alternatives (``Sydney, Melbourne, Canberra or Perth``, ``1944 or 1945 or 1946``), or inside a
  question (``Is it Canberra? I do not know.``).

The rules read English, Japanese and Chinese cue words; a language without them is read for numbers only.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from ..core.matching import STOPWORDS, match_tokens
from ..core.text import has_cjk, numerals_as_digits, split_sentences

__all__ = ["number_forms", "quantities", "quantity_conflict", "number_units", "UNITS", "unasserted", "Support",
           "WINDOW", "KEY_PENALTY", "PHRASE_WEIGHT"]

# ----------------------------------------------------------------------------------------------- number forms

_SMALL = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_SCALE = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_WORD = "|".join(sorted([*_SMALL, *_TENS, "hundred", *_SCALE], key=len, reverse=True))
#: a run of at least two number words (one word alone is the tokenizer's: ``eight`` = ``8``)
_WORD_RUN = re.compile(rf"\b(?:{_WORD})(?:(?:\s+and\s+|[\s-]+)(?:{_WORD}))+\b", re.IGNORECASE)
#: digits (thousands grouped by commas, or a decimal part) followed by a scale word
_SCALED = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3}){1,4}|\d{1,15})(?:\.(\d{1,9}))?\s*"
                     r"(thousand|million|billion|trillion|bn)\b", re.IGNORECASE)
_ANY_NUMBER = re.compile(rf"\d|\b(?:{_WORD})\b", re.IGNORECASE)


def _words_value(words: list[str]) -> int | None:
    """The value of a run of English number words, or None when the run is not one number (``one two three``)."""
    groups: list[int] = []  # year form: two numbers of two digits (nineteen sixty-nine, twenty twenty-one)
    for w in words:
        if w in _TENS:
            groups.append(_TENS[w])
        elif w in _SMALL and groups and groups[-1] % 10 == 0 and groups[-1] >= 20 and _SMALL[w] < 10:
            groups[-1] += _SMALL[w]  # sixty-nine
        elif w in _SMALL:
            groups.append(_SMALL[w])
        else:
            break
    else:
        if len(groups) == 2 and 10 <= groups[0] <= 99 and 10 <= groups[1] <= 99:
            return groups[0] * 100 + groups[1]
    total = current = 0
    last = ""  # what the previous word was: "unit", "teen", "tens", "hundred", "scale", "and"
    for w in words:
        if w == "and":
            if last not in ("hundred", "scale"):
                return None
            last = "and"
        elif w in _SMALL:
            v = _SMALL[w]
            if last in ("unit", "teen") or (last == "tens" and v >= 10):
                return None
            current += v
            last = "unit" if v < 10 else "teen"
        elif w in _TENS:
            if last in ("unit", "teen", "tens"):
                return None
            current += _TENS[w]
            last = "tens"
        elif w == "hundred":
            if last in ("hundred", "scale", "and"):
                return None
            current = (current or 1) * 100
            last = "hundred"
        else:
            if last == "and":
                return None
            total += (current or 1) * _SCALE[w]
            current = 0
            last = "scale"
    return None if last == "and" else total + current


def _written(value: Decimal | int) -> str:
    """A number in the one form every text gets: from a million up, a mantissa and a scale word (``14 million``,
    ``1.4 billion``, ``2.45 billion``: the form answers most often take, whose words the judge's features were
    fitted on), below it digits."""
    value = Decimal(value)
    for scale in ("trillion", "billion", "million"):
        if abs(value) >= _SCALE[scale]:
            mantissa = (value / _SCALE[scale]).normalize()
            return f"{format(mantissa, 'f')} {scale}"
    return str(int(value)) if value == value.to_integral_value() else format(value.normalize(), "f")


def _spelled(m: re.Match[str]) -> str:
    words = [w for w in re.split(r"[\s-]+", m.group(0).lower()) if w]
    value = _words_value(words)
    return m.group(0) if value is None else _written(value)


def _scaled(m: re.Match[str]) -> str:
    whole, part, scale = m.group(1).replace(",", ""), m.group(2) or "", m.group(3).lower()
    try:
        value = Decimal(f"{whole}.{part}" if part else whole) * (10**9 if scale == "bn" else _SCALE[scale])
    except InvalidOperation:
        return m.group(0)
    return _written(value)


#: a number of seven digits or more, its thousands grouped by commas or spaces or not at all
_LARGE = re.compile(r"(?<![\d.,])(?:\d{1,3}(?:,\d{3}){2,4}|\d{1,3}(?:[ \u00a0\u202f\u2009]\d{3}){2,4}|\d{7,15})"
                    r"(?!\d|[.,]\d|\s\d)")


@functools.lru_cache(maxsize=8192)
def number_forms(text: str) -> str:
    """``text`` with its numbers written in one form: scale words, grouped thousands, English numbers and years
    spelled out, Chinese / Japanese numerals (mixed with digits or not). From a million up a number is a mantissa
    and a scale word, below it digits: ``About 14,000,000 people``, ``14 000 000`` and ``fourteen million`` all
    say ``14 million``; ``1,400 million`` says ``1.4 billion``; ``nineteen sixty-nine`` says ``1969``.

    >>> number_forms("14,000,000; 1,400 million; fourteen million; nineteen sixty-nine; 14 000 000; 1400万人")
    '14 million; 1.4 billion; 14 million; 1969; 14 million; 14 million人'
    """
    if not isinstance(text, str) or not text:
        return text
    if has_cjk(text):
        text = numerals_as_digits(text)
    if not _ANY_NUMBER.search(text):
        return text
    text = _WORD_RUN.sub(_spelled, text)
    text = _SCALED.sub(_scaled, text)
    return _LARGE.sub(lambda m: _written(int(re.sub(r"\D", "", m.group(0)))), text)


# ----------------------------------------------------------------------------------------------- quantities

#: units as the match tokens spell them (lowercase, plural stripped), by kind: a number of the answer given in
#: another unit of the same kind is another quantity (330 feet for 330 metres)
_UNIT_SPELLINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "length": {"m": ("m", "metre", "meter"), "km": ("km", "kilometre", "kilometer"), "cm": ("cm", "centimetre",
               "centimeter"), "mm": ("mm", "millimetre", "millimeter"), "mi": ("mile",), "ft": ("ft", "feet", "foot"),
               "in": ("inche", "inch"), "yd": ("yard", "yd")},
    "mass": {"kg": ("kg", "kilogram"), "g": ("gram",), "lb": ("lb", "lbs"), "t": ("tonne", "ton"),
             "oz": ("ounce", "oz")},
    "temperature": {"°c": ("celsius", "centigrade"), "°f": ("fahrenheit",), "k": ("kelvin",)},
    "time": {"s": ("second",), "min": ("minute",), "h": ("hour",), "d": ("day",), "wk": ("week",), "yr": ("year",)},
    "money": {"$": ("dollar", "usd"), "€": ("euro", "eur"), "¥": ("yen",)},
}
UNITS = {unit: (kind, name) for kind, names in _UNIT_SPELLINGS.items() for name, spellings in names.items()
         for unit in spellings}


def number_units(tokens: Sequence[str]) -> set[tuple[str, str, str]]:
    """(number, kind, unit) for each number directly followed by a unit (:data:`UNITS`)."""
    return {(t, *UNITS[u]) for t, u in zip(tokens, tokens[1:]) if u in UNITS and any(c.isdigit() for c in t)}



#: a currency as written, by what it names; ``$`` and ``¥`` alone name a family (US, Canadian ... dollars; yen or
#: yuan), met by any of its members
_CURRENCIES = {
    "us$": "USD", "usd": "USD", "us dollars": "USD", "us dollar": "USD", "美元": "USD", "米ドル": "USD",
    "$": "$", "dollars": "$", "dollar": "$", "ドル": "$",
    "a$": "AUD", "aud": "AUD", "c$": "CAD", "cad": "CAD", "hk$": "HKD", "hkd": "HKD",
    "€": "EUR", "eur": "EUR", "euros": "EUR", "euro": "EUR", "ユーロ": "EUR", "欧元": "EUR",
    "£": "GBP", "gbp": "GBP", "pounds sterling": "GBP", "pounds": "GBP", "pound": "GBP", "sterling": "GBP",
    "ポンド": "GBP", "英镑": "GBP",
    "¥": "¥", "￥": "¥", "jpy": "JPY", "yen": "JPY", "円": "JPY", "日元": "JPY",
    "cny": "CNY", "rmb": "CNY", "yuan": "CNY", "元": "CNY", "人民币": "CNY", "人民元": "CNY",
    "₹": "INR", "inr": "INR", "rupees": "INR", "rupee": "INR", "₩": "KRW", "krw": "KRW", "ウォン": "KRW",
    "chf": "CHF", "swiss francs": "CHF",
}
_FAMILIES = {"$": {"USD", "AUD", "CAD", "HKD"}, "¥": {"JPY", "CNY"}}
_SCALES_T = {"c": "°C", "celsius": "°C", "centigrade": "°C", "℃": "°C", "摂氏": "°C", "摄氏": "°C",
             "f": "°F", "fahrenheit": "°F", "℉": "°F", "華氏": "°F", "华氏": "°F", "k": "K", "kelvin": "K"}


def _alternation(words: list[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


_AMOUNT = r"(\d{1,3}(?:,\d{3}){1,5}(?:\.\d{1,6})?|\d{1,18}(?:\.\d{1,6})?)"  # (bounded: no number past int's digits)
_SYMBOLS = [k for k in _CURRENCIES if not k.isalpha() or not k.isascii()]
_NAMES = [k for k in _CURRENCIES if k.replace(" ", "").isalpha() and k.isascii()]
_MONEY_BEFORE = re.compile(rf"(?:(?<![A-Za-z])({_alternation([s for s in _SYMBOLS if not s[-1].isalpha()])})|"
                           rf"\b({_alternation(['usd', 'eur', 'gbp', 'jpy', 'cny', 'inr', 'aud', 'cad', 'chf'])}))"
                           rf"\s?{_AMOUNT}", re.IGNORECASE)
_MONEY_AFTER = re.compile(rf"{_AMOUNT}\s?(?:({_alternation([s for s in _SYMBOLS if s[0] not in '$€£¥￥₹₩'])})|"
                          rf"({_alternation(_NAMES)})\b)", re.IGNORECASE)
_DEGREES = re.compile(rf"(?:(摂氏|摄氏|華氏|华氏)\s?)?(-?{_AMOUNT})\s?(?:(℃|℉)|(?:°|º|˚)\s?([CFK])\b|"
                      r"degrees?\s+(celsius|centigrade|fahrenheit)\b|(kelvin)\b|度)", re.IGNORECASE)


def _amount(text: str) -> str:
    value = Decimal(text.replace(",", ""))
    return str(int(value)) if value == value.to_integral_value() else format(value.normalize(), "f")


@functools.lru_cache(maxsize=4096)
def quantities(text: str) -> frozenset[tuple[str, str, str]]:
    """The amounts of money and the temperatures ``text`` gives, as ``(amount, "money" | "temperature", unit)``
    (numbers read by :func:`number_forms` first): ``$1,000`` -> ``("1000", "money", "$")``, ``500 GBP`` ->
    ``("500", "money", "GBP")``, ``20 °C`` -> ``("20", "temperature", "°C")``."""
    if not isinstance(text, str) or not text:
        return frozenset()
    text = number_forms(text)
    found: set[tuple[str, str, str]] = set()
    for m in _MONEY_BEFORE.finditer(text):
        found.add((_amount(m.group(3)), "money", _CURRENCIES[(m.group(1) or m.group(2)).lower()]))
    for m in _MONEY_AFTER.finditer(text):
        found.add((_amount(m.group(1)), "money", _CURRENCIES[(m.group(2) or m.group(3)).lower()]))
    for m in _DEGREES.finditer(text):
        scale = m.group(4) or m.group(5) or m.group(6) or m.group(7) or m.group(1)
        if scale is None:  # 度 with no scale named: a temperature in the scale the reader assumes
            continue
        sign = "-" if m.group(2).startswith("-") else ""
        found.add((sign + _amount(m.group(3)), "temperature", _SCALES_T[scale.lower()]))
    return frozenset(found)


def _same_unit(a: str, b: str) -> bool:
    return a == b or b in _FAMILIES.get(a, ()) or a in _FAMILIES.get(b, ())


def quantity_conflict(response: str, answer: str) -> str | None:
    """An amount of the answer's given in another currency or temperature scale, with the answer's own nowhere in
    the response (``€1,000`` for ``$1,000``, ``500 GBP`` for ``500 USD``, ``20 °F`` for ``20 °C``): returns it
    (``1000 EUR``), or None."""
    wanted = quantities(answer)
    if not wanted:
        return None
    said = quantities(response)
    for amount, kind, unit in said:
        same = [u for a, k, u in wanted if a == amount and k == kind]
        if same and not any(_same_unit(u, v) for u in same for a2, k2, v in said if a2 == amount and k2 == kind):
            return f"{amount} {unit}"
    return None


# ----------------------------------------------------------------------------------------------- what is asserted

_NEGATION = re.compile(r"\b(?:not|no|never|neither|nor|cannot|none|nobody|nothing|isn't|wasn't|aren't|weren't|"
                       r"doesn't|don't|didn't|hasn't|haven't|hadn't|won't|wouldn't|couldn't|shouldn't|"
                       r"isn’t|wasn’t|doesn’t|didn’t|rather\s+than|instead\s+of)\b", re.IGNORECASE)
#: a negation word that bounds or stresses instead of denying: "not until 1945", "not only", "no later than"
_NOT_DENIAL = re.compile(r"\s+(?:until|till|only|just|merely|simply|later|earlier|more|less|fewer|longer|sooner|"
                         r"before|after|far|unlike)\b", re.IGNORECASE)
_CLAUSE = re.compile(r"[;:,，、]|\s+(?:but|however|although|though|whereas|while|yet)\s+|\s[—–-]\s", re.IGNORECASE)
#: a yes or no that answers the question before the claim ("No, you can deploy them worldwide."): no denial
_ANSWER_WORD = re.compile(r"^[\s*\"'“]*(?:no|yes)\b[,.!:;]?\s+", re.IGNORECASE)
_OR = re.compile(r"\s*(?:,\s*(?:or\s+)?|\s+or\s+|/)\s*", re.IGNORECASE)
_HEDGE = re.compile(r"^\W*(?:(?:it|that|this|the\s+answer)\s+(?:could|might|may|would)\s+be|(?:it|that|this|the\s+"
                    r"answer)\s+is\s+(?:either|possibly|probably|perhaps|maybe|likely)|either|possibly|probably|"
                    r"perhaps|maybe|one\s+of)\s+", re.IGNORECASE)
_HEDGED = re.compile(r"\b(?:could|might|may\s+be|possibly|probably|perhaps|maybe|either|one\s+of)\b",
                     re.IGNORECASE)
_RESTATED = re.compile(r"^\W*(?:you\s+(?:asked|want\s+to\s+know|are\s+asking)|your\s+question|the\s+question\s+"
                       r"(?:is|asks|was))\b", re.IGNORECASE)
# Japanese and Chinese: a denial right after the answer (キャンベラではありません) or before it (不是堪培拉), a verb
# denied at the clause's end, alternatives (AかB, A或B), questions
_JA_DENIED_AFTER = re.compile(r"^\s*(?:で|じゃ)?(?:は)?(?:ない|ありません|ございません|なく|なかった)"
                              r"|^\s*(?:ではなく|じゃなく)")
_ZH_DENIED_BEFORE = re.compile(r"(?:不是|并非|並非|并不是|而非|没有|沒有)\s*$")
_ZH_DENIED = re.compile(r"没有|沒有|不是|并非|並非|从未|從未|未曾|并未|不")
_CJK_DENIED_END = re.compile(r"(?:ない|ません|なかった|ませんでした|ず|不是|没有|沒有|并非)[。．.!！]?\s*$")
#: か between two items: followed by the start of a word in katakana, kanji, digits or Latin letters (not わかり)
_KA = r"か(?=[\u30A0-\u30FF\u4E00-\u9FFF0-9A-Za-z])"
_CJK_OR = re.compile(rf"または|もしくは|あるいは|のいずれか|のどれか|かもしれ|或者|还是|還是|或是|或|可能是|{_KA}")
_CJK_ITEM = re.compile(rf"[、，,・/]|または|もしくは|あるいは|或者|还是|還是|或是|或|{_KA}")


def _is_question(sentence: str) -> bool:
    s = sentence.rstrip()
    return s.endswith(("?", "？")) or bool(_RESTATED.match(s)) or s.endswith(("ですか。", "ますか。", "吗。", "嗎。"))


def _mention(words: list[str], keys: frozenset[str]) -> int:
    """The index of the first of ``words`` (match tokens) that is one of the answer's ``keys``, or -1."""
    for i, w in enumerate(words):
        if w in keys:
            return i
    return -1


def _denied_en(clause: str, keys: frozenset[str], asked: frozenset[str]) -> str | None:
    """The negation word that denies the answer in ``clause`` (English), or None: before the answer ("is not
    Canberra"), or after it with the question's words after the negation ("Fleming did not discover penicillin"
    for "who discovered penicillin?")."""
    words = match_tokens(clause)
    at = _mention(words, keys)
    if at < 0:
        return None
    for m in _NEGATION.finditer(clause):
        if _NOT_DENIAL.match(clause, m.end()):
            continue
        before = match_tokens(clause[:m.start()])
        if len(before) <= at:  # the negation comes before the answer
            return m.group(0)
        after = [t for t in match_tokens(clause[m.end():]) if t not in STOPWORDS]
        if any(t in asked for t in after):
            return m.group(0)
    return None


def _alternatives_en(sentence: str, keys: frozenset[str], known: frozenset[str]) -> bool:
    """Whether ``sentence`` offers the answer as one of several alternatives: a run of short items joined by
    ``or`` (or by commas after a hedge: "it could be ..."), the answer's among them with another that is neither
    the answer's nor the question's words."""
    body = _HEDGE.sub("", sentence.strip().rstrip(".!"))
    seps = list(_OR.finditer(body))
    if not seps:
        return False
    items, at = [], 0
    for m in seps:
        items.append((body[at:m.start()], m.group(0)))
        at = m.end()
    items.append((body[at:], ""))
    hedged = bool(_HEDGED.search(sentence))
    run: list[tuple[list[str], str]] = []
    runs: list[list[tuple[list[str], str]]] = []
    for text, sep in items:
        words = match_tokens(text)
        if 0 < len(words) <= 4:
            run.append((words, sep))
        else:
            if run:
                runs.append(run)
            run = []
    if run:
        runs.append(run)
    for r in runs:
        if len(r) < 2 or not any(_mention(w, keys) >= 0 for w, _ in r):
            continue
        joined_by_or = any("or" in sep.lower().split() or "/" in sep for _, sep in r[:-1])
        others = [w for w, _ in r if _mention(w, keys) < 0 and any(t not in known and t not in STOPWORDS for t in w)]
        if others and (joined_by_or or hedged):
            return True
    return False


def _cjk_mention(text: str, answer: str) -> int:
    return text.find(answer) if answer else -1


def unasserted(question: str, response: str, answer: str) -> str | None:
    """Why ``response`` names the acceptable ``answer`` (a short one) without asserting it, or None when some
    sentence asserts it: ``"denied ('not')"``, ``"one of several alternatives"`` or ``"only inside a question"``.
    A sentence that names the answer is read on its own; the response asserts the answer when any of them does.
    An answer that is itself a yes/no or a negation is not read."""
    response, answer, question = number_forms(response), number_forms(answer), number_forms(question or "")
    cjk = has_cjk(answer)
    answer_words = match_tokens(answer)
    if not answer_words or _NEGATION.search(answer) or set(answer_words) <= {"yes", "no"}:
        return None
    asked = frozenset(t for t in match_tokens(question) if t not in STOPWORDS)
    keys = frozenset(t for t in answer_words if t not in STOPWORDS and t not in asked) or \
        frozenset(t for t in answer_words if t not in STOPWORDS)
    known = asked | frozenset(answer_words)
    compact = re.sub(r"\s+", "", answer)
    reasons: list[str] = []
    for sentence in split_sentences(response):
        if cjk:
            at = _cjk_mention(sentence, compact)
            if at < 0:
                continue
            if _is_question(sentence):
                reasons.append("only inside a question")
                continue
            rest, before = sentence[at + len(compact):], sentence[:at]
            if _JA_DENIED_AFTER.match(rest) or _ZH_DENIED_BEFORE.search(before):
                reasons.append("denied")
                continue
            clause_end = re.split(r"[、，,]", rest, maxsplit=1)[0] if re.search(r"[、，,]", rest) else rest
            zh = _ZH_DENIED.search(clause_end)  # Chinese denies before the verb: 弗莱明没有发现青霉素
            denied_tail = clause_end if _CJK_DENIED_END.search(clause_end) else clause_end[zh.end():] if zh else ""
            if any(a + b in question for a, b in zip(denied_tail, denied_tail[1:]) if not a.isspace()):
                reasons.append("denied")
                continue
            if _CJK_OR.search(sentence) and len([p for p in _CJK_ITEM.split(sentence) if p.strip()]) >= 2 and any(
                    p.strip() and compact not in p and not set(p.strip()) <= set(question) for p in
                    _CJK_ITEM.split(sentence)):
                reasons.append("one of several alternatives")
                continue
            return None
        if _mention(match_tokens(sentence), keys) < 0:
            continue
        if _is_question(sentence):
            reasons.append("only inside a question")
            continue
        if _alternatives_en(sentence, keys, known):
            reasons.append("one of several alternatives")
            continue
        parts = [c for c in _CLAUSE.split(sentence) if c]
        denied = [w for c in parts if (w := _denied_en(c, keys, asked))]
        clauses = [c for c in parts if _mention(match_tokens(c), keys) >= 0]
        if clauses and len(denied) == len(clauses):
            reasons.append(f"denied ('{denied[0].lower()}')")
            continue
        return None
    return reasons[0] if reasons else None


# ----------------------------------------------------------------------------------------------- what supports a claim

#: sentences of one passage read together as what supports a claim (a claim is supported by what one passage, or a
#: few adjacent sentences of it, says -- not by words borrowed from several)
WINDOW = 3
#: what each key word of a claim (a name, a number) that the evidence lacks takes off its support
KEY_PENALTY = 0.2
#: the weight of the phrase share in a claim's support: the share of its pairs of adjacent content words that one
#: sentence of the evidence has, adjacent and in the same order (the rest: its words found anywhere in the evidence)
PHRASE_WEIGHT = 0.5
#: the highest support of a contradicted claim: below any support threshold the calibration may fit (0.40 ...)
CONTRADICTED = 0.25
#: the share of a claim's other words the passage's sentence nearest it must hold to contradict it (by another key
#: word of the same kind, or by a denial): all of them
CONTRADICTS_AT = 1.0
#: the same for a claim in Chinese or Japanese, where every character is a token and particles differ between
#: sentences that say the same (在 ... 的, は / が)
CONTRADICTS_AT_CJK = 0.7

_NAME = re.compile(r"(?<![A-Za-z0-9])[A-Z][A-Za-z'’-]*")
_DIGITS = re.compile(r"[^\W_]*\d[^\W_]*")
_DENIAL_CJK = re.compile(r"ない|ません|なかった|ず[、。]|不是|没有|沒有|并非|從未|从未|未曾")


_MONTH_NAMES = frozenset("january february march april may june july august september october november december "
                         "jan feb mar apr jun jul aug sep sept oct nov dec".split())


#: what opens a line before its first word: list bullets and numbers, markdown headings, quotes; then emphasis
_BULLET = re.compile(r"[\s\"'“‘(#>•·–—-]*(?:\d{1,2}[.)]\s+)?")
_EMPHASIS = re.compile(r"[\s*_\"'“‘(]*")
#: a heading that opens a line, ended by a colon: a bold span (``**Tax Benefits:**``, ``**Data Engine**:``) or up to
#: eight words in title case (``Equity Building:``, ``Key Elements of the Benchmark:``)
_HEADING = re.compile(r"\*\*[^*\n]{1,80}?(?::\s*\*\*|\*\*\s*:)|"
                      r"[A-Z][\w'’-]*(?:\s+(?:[A-Z][\w'’-]*|of|and|or|the|for|to|in|on|a|an|with|by|vs\.?|&)){0,7}"
                      r"\s*:")
_ACRONYM = re.compile(r"[A-Z][A-Z0-9&]+s?")


def _opening(text: str) -> tuple[int, int]:
    """Where ``text``'s heading (``**Tax Benefits:**``, ``Equity Building:``) begins and where the words after it
    begin, past the bullets and emphasis that open the line: ``(start, end)``; ``start == end``, the first word, when
    there is no heading."""

    def past(pattern: re.Pattern[str], at: int) -> int:  # (both patterns match the empty string)
        m = pattern.match(text, at)
        return m.end() if m else at

    start = past(_BULLET, 0)
    heading = _HEADING.match(text, start)
    first = past(_EMPHASIS, start)
    return (first, past(_EMPHASIS, heading.end())) if heading else (first, first)


def _keys(text: str, skip_first: bool) -> dict[str, frozenset[str]]:
    """The key words of ``text`` by kind, as match tokens: ``"year"`` (four digits from 1000 to 2099), ``"number"``
    (other words written with digits), ``"code"`` (letters and digits: ``co2``), ``"month"`` (a month's name),
    ``"unit"`` (a number with its unit, currency or scale: ``330 ft``, ``1000 EUR``) and ``"name"`` (another
    capitalised word in Latin letters, not a function word; with ``skip_first``, not the line's first word after its
    bullets and emphasis, nor a heading's words but its acronyms, nor the word after the heading). Number
    words and ordinals (``three``, ``first``) are no key: the tokenizer reads them as digits, but they are rarely
    what a claim asserts."""
    keys: dict[str, set[str]] = {"year": set(), "number": set(), "code": set(), "month": set(), "name": set(),
                                 "unit": set()}
    for m in _DIGITS.finditer(text):
        for t in match_tokens(m.group(0)):
            if t.isdigit():
                keys["year" if len(t) == 4 and 1000 <= int(t) <= 2099 else "number"].add(t)
            elif any(c.isdigit() for c in t):
                keys["code"].add(t)
    keys["unit"] = {f"{n} {u}" for n, _, u in number_units(match_tokens(text))} | \
        {f"{a} {u}" for a, _, u in quantities(text)}
    start, end = _opening(text) if skip_first else (-1, -1)
    for m in _NAME.finditer(text):
        word = m.group(0).lower()
        if word in _MONTH_NAMES:
            keys["month"].add(word[:3])
        elif m.start() in (start, end) or (start <= m.start() < end and not _ACRONYM.fullmatch(m.group(0))):
            continue  # the line's first word, or a title's (an acronym in a title is still a name: IRS)
        else:
            keys["name"].update(t for t in match_tokens(m.group(0)) if t.isalpha() and t not in STOPWORDS)
    return {k: frozenset(v) for k, v in keys.items()}


def _surface(text: str, token: str, kind: str = "") -> str:
    """The word of ``text`` whose match token is ``token`` (``Jupiter`` for ``jupit``; a month by its first three
    letters; a number with its unit as read), or the token."""
    if kind == "unit":
        return token
    if kind == "month":
        m = re.search(rf"\b{token}[a-z]*\b", text, re.IGNORECASE)
        return m.group(0) if m else token
    for pattern in (r"[A-Za-z0-9]+(?:[.,'’-][A-Za-z0-9]+)*", r"[^\W_]+"):  # a word in Latin letters or digits first
        for m in re.finditer(pattern, text):
            if token in match_tokens(m.group(0)):
                return m.group(0)
    return token


_KANJI_KANA = re.compile(r"[\u4E00-\u9FFF\u30A0-\u30FF]")


#: Chinese characters that are function words (the copula, prepositions, particles, negation): no span of their own
_ZH_FUNCTION = frozenset("是在于於的了和与與及不也都就而被把为為以之其这這那有着著过過"
                         "所从從向对對由将將已并並或但则則却卻")


def _content_char(span: str) -> bool:
    return any(_KANJI_KANA.match(c) and c not in _ZH_FUNCTION for c in span)


def _swapped_cjk(claim: str, sentence: str) -> tuple[str, str] | None:
    """In Chinese or Japanese, where names are no capitalised words: the claim and the sentence say the same but for
    one span of kanji or katakana replaced by another (最大的行星是土星 / 最大的行星是木星), as (the claim's span, the
    sentence's), each with the character that follows it where both share it (土星, 木星); or None."""
    a, b = re.sub(r"[\s。．.!！?？、，,]", "", claim), re.sub(r"[\s。．.!！?？、，,]", "", sentence)
    if not a or not b or len(b) > 1.7 * len(a) or len(a) > 1.7 * len(b):
        return None  # (then no matching can reach the ratio below: 2 * matched / (len(a) + len(b)) < 0.75)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if matcher.ratio() < 0.75:
        return None
    replaced = [op for op in matcher.get_opcodes() if op[0] == "replace"]
    if len(replaced) != 1:
        return None
    _, i1, i2, j1, j2 = replaced[0]
    mine, theirs = a[i1:i2], b[j1:j2]
    if not (_content_char(mine) and _content_char(theirs)):
        return None
    if any(c in b for c in mine if _KANJI_KANA.match(c)):  # the sentence has the claim's span elsewhere
        return None
    if i2 < len(a) and j2 < len(b) and a[i2] == b[j2] and _KANJI_KANA.match(a[i2]):
        mine, theirs = mine + a[i2], theirs + b[j2]
    return mine, theirs


def _denies(text: str) -> bool:
    """Whether ``text`` denies something: a negation that is not a bound or a stress ("not until 1931", "not only")."""
    return any(not _NOT_DENIAL.match(text, m.end()) for m in _NEGATION.finditer(text)) or \
        bool(_DENIAL_CJK.search(text))


#: how many words after a negation it bears on ("not [even] discovered by"; "does not [easily] fit")
_NEGATION_REACH = 3


def _denies_one_of(text: str, words: frozenset[str]) -> bool:
    """Whether a negation in ``text`` (English) bears on one of ``words``: one of them is among the
    :data:`_NEGATION_REACH` words that follow it, in its clause (not "not until", "not only": those bound or stress)."""
    for m in _NEGATION.finditer(text):
        if _NOT_DENIAL.match(text, m.end()):
            continue
        rest = _CLAUSE.split(text[m.end():], maxsplit=1)[0]
        if any(t in words for t in match_tokens(rest)[:_NEGATION_REACH]):
            return True
    return False


class Support:
    """How the evidence supports one claim sentence: the share of its content words found anywhere in the evidence
    (``share``); the share of its pairs of adjacent content words that one sentence has, adjacent and in the same
    order (``phrase_share``: what one sentence says, not its words alone -- "Fleming discovered" is not in "Florey
    discovered penicillin, and Fleming ..."; a word the sentence lacks is skipped, so that "the tower stands in
    Paris" keeps "tower Paris" of "the tower is in Paris" and loses only the missing word); the share of its words
    found in the best window of :data:`WINDOW` adjacent sentences of one passage (``window_share``, that window's text
    in ``window``); the claim's names and numbers found nowhere (``missing_keys``); and a contradiction
    (``contradiction``: what the window's sentence nearest the claim says instead) or None.

    ``support`` is the word share and the phrase share weighed by :data:`PHRASE_WEIGHT` (half each) less
    :data:`KEY_PENALTY` per missing key, in [0, 1]; a contradicted claim's support is at most :data:`CONTRADICTED`.
    (A claim of one content word has no pair: its phrase share is its window share.)"""

    __slots__ = ("share", "phrase_share", "window_share", "window", "missing", "missing_keys", "contradiction",
                 "support")

    def __init__(self, claim: str, tokens: Sequence[str], backed: frozenset[str],
                 passages: Sequence[Sequence[Any]]) -> None:
        distinct = frozenset(tokens)
        n = len(tokens)
        self.share = sum(t in backed for t in tokens) / n if n else 1.0
        self.missing = [t for t in dict.fromkeys(tokens) if t not in backed]
        best, window, best_sentence, phrase = -1.0, "", "", 0
        for sentences in passages:
            hits = [s.content_set & distinct for s in sentences]
            for i in range(len(sentences)):
                if not hits[i]:
                    continue
                if n > 1 and len(hits[i]) > 1:  # the claim's words this sentence has, in the claim's order
                    said = [t for t in tokens if t in hits[i]]
                    phrase = max(phrase, len(sentences[i].pairs.intersection(zip(said, said[1:]))))
                found = frozenset().union(*hits[i:i + WINDOW])
                share = sum(t in found for t in tokens) / n if n else 1.0
                if share > best:
                    best, window = share, " ".join(s.text for s in sentences[i:i + WINDOW])
                    top = max(range(i, min(i + WINDOW, len(sentences))), key=lambda j: len(hits[j]))
                    best_sentence = sentences[top].text
        self.window_share, self.window = max(0.0, best), window
        pairs = len(set(zip(tokens, tokens[1:])))  # (distinct: "create an index ... CREATE INDEX" has one pair twice)
        self.phrase_share = min(1.0, phrase / pairs) if n > 1 else self.window_share
        keys = _keys(claim, skip_first=True)
        words = set(match_tokens(claim))  # (a month is a key by its name; its match token may differ)
        self.missing_keys = [t for kind in ("name", "year", "number", "code") for t in sorted(keys[kind])
                             if t in distinct and t not in backed]
        self.contradiction = self._contradiction(claim, distinct | words, keys, best_sentence, window) \
            if window else None
        support = (1 - PHRASE_WEIGHT) * self.share + PHRASE_WEIGHT * self.phrase_share \
            - KEY_PENALTY * len(self.missing_keys)
        support = min(1.0, max(0.0, support))
        self.support = min(support, CONTRADICTED) if self.contradiction else support

    @staticmethod
    def _contradiction(claim: str, words: frozenset[str] | set[str], keys: dict[str, frozenset[str]],
                       sentence: str, window: str) -> str | None:
        """What the passage's sentence nearest the claim says instead, when it says all the rest of the claim (and
        two of its words or more): another key word of the same kind in place of one of the claim's (a name, a year, a
        number, a code, a month) that the sentences around it (``window``) do not give either, or a denial where the
        claim has none (or the reverse): a negation that bears on a word both say (:func:`_denies_one_of`; in Chinese
        and Japanese, any denial in the sentence)."""
        said = frozenset(match_tokens(sentence))
        mine = frozenset().union(*keys.values())
        plain = frozenset(match_tokens(_DENIAL_CJK.sub(" ", _NEGATION.sub(" ", claim))))  # its words but a denial
        others = [t for t in words if t in plain and t not in mine and t not in STOPWORDS and t not in _MONTH_NAMES
                  and t not in UNITS and t not in _CURRENCIES]
        enough = CONTRADICTS_AT_CJK if has_cjk(claim) else CONTRADICTS_AT  # (one character a token: particles too)
        if not sentence or not others or sum(t in said for t in others) / len(others) < enough or \
                len(others) + sum(t in said for t in mine) < 2:
            return None  # the sentence does not say what the claim says, but for its key words (or says one word)
        theirs, near = _keys(sentence, skip_first=False), _keys(window, skip_first=False)
        around = frozenset(match_tokens(window))
        for kind in ("year", "number", "code", "unit", "month", "name"):
            by_set = kind in ("month", "unit")  # (compared as read: a month by its name, a number with its unit)
            lost = sorted(t for t in keys[kind] if t not in (near[kind] if by_set else around))
            instead = sorted(t for t in theirs[kind] if t not in keys[kind] and (by_set or t not in words))
            if kind == "unit":  # the same number in another unit: 330 m where the claim says 330 ft
                instead = [t for t in instead if t.split()[0] in {u.split()[0] for u in lost}]
            if lost and instead:
                return (f"the passage gives '{_surface(sentence, instead[0], kind)}' where the claim says "
                        f"'{_surface(claim, lost[0], kind)}'")
        if has_cjk(claim):
            swapped = _swapped_cjk(claim, sentence)
            if swapped:
                return f"the passage gives '{swapped[1]}' where the claim says '{swapped[0]}'"
        if has_cjk(claim) or has_cjk(sentence):
            denied, theirs_denied = _denies(claim), _denies(sentence)
        else:  # a negation that bears on what both say ("not discovered by"; not "has not been fined ... and will be")
            shared = frozenset(t for t in words if t in said and t not in STOPWORDS)
            denied = _denies_one_of(_ANSWER_WORD.sub("", claim, count=1), shared)
            theirs_denied = _denies_one_of(sentence, shared)
        if denied != theirs_denied:
            return "the passage denies what the claim says" if theirs_denied else \
                "the claim denies what the passage says"
        return None
