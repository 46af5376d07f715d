"""The offline judge, ``offline:/lexical``: calibrated lexical evidence, **not a language model** -- what its
scorers share (features, the calibration, support by word overlap); each metric's offline scorer is in the
metric's own module.

It scores correctness, faithfulness and the context metrics of a row from the words the texts share, with no
network, no model download and no PyTorch. Its cut-points are fitted on public human labels (OpenQA-eval NQ301
and MTRAG, one half of each) and shipped with the package (``data/offline_judge.json``); its agreement with the
humans on the other half is in docs/offline-judge.md, with the command that reproduces it
(``tools/offline_judge/fit.py``, beside the package). What it is good for: CI smoke tests, cheap triage, a floor.
What it is not: a judge of meaning. It cannot tell a right answer worded with other words from a wrong one, and it never
sees that a fluent sentence built from the passages' words says something they do not.

How each metric is scored (the same rules as the LLM judges' definitions where a word count can follow them):

* **correctness** (six levels) -- for every acceptable answer of the reference, features of the whole
  response against that answer (:func:`answer_features`); a logistic model -- one for short answers, one for
  long ones (:attr:`Calibration.long`) -- turns them into the probability that a human accepts the response,
  and the best acceptable answer wins. Fitted cut-points on that
  probability give levels 5 and 4 (accepted); below them, fitted cut-points on how much of the answer's
  content the response contains give 3, 2 or 1 (none of it: wrong outright). Two hard rules hold over the
  model: a response that contains none of any acceptable answer (:func:`answer_found`) is never 4 or 5, and a
  number, date or formula that disagrees with a short answer's (:func:`code_conflict`: ``CO2`` for ``H2O``)
  caps the level at 3. Level 0 ("not sure") only when
  the whole response declines to answer (:func:`declines_to_answer`), never because a partial answer says it
  lacks some detail.
* **faithfulness** -- the response is cut into claim-like sentences; each sentence's support is the share of
  its content words found in the evidence; the score is the mean support. Sentences below the fitted
  ``support_threshold`` are listed as unsupported, with the words the evidence lacks.
* **context precision** -- a chunk is relevant when it supports an acceptable answer (share of the answer's
  content words in the chunk at or above the threshold, or the whole answer as a phrase); average precision
  over the ranked chunks, as the LLM metric.
* **context recall** -- each sentence of an acceptable answer is attributed when its support in the contexts is
  at or above the threshold; attributed / all, the best acceptable answer counting.
* **context relevance** -- a context sentence is needed when it shares at least two content words with the
  question and the reference, one of them the reference's; needed / all sentences.

Answer relevancy and multi-turn need a model that writes text; under the offline judge they are skipped with
that reason.

Tokens are :func:`mlflow_ragjudge.core.text.tokenize`'s, then matched leniently (:func:`match_tokens`): accents
folded on Latin letters, thousands separators dropped (``2,579`` is one number), number words and ordinals
read as digits (``eight`` = ``8``, ``14th`` = ``14``), and a light English suffix stripping
(``sharecroppers`` = ``sharecropping``). Content words are the tokens outside a short list of English function
words (:data:`STOPWORDS`). The calibration was fitted on English data; other languages run with the same rules
(CJK text character by character), uncalibrated.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from ..core.constants import DEFAULT_OFFLINE_JUDGE, OFFLINE_PROVIDER, is_offline_judge
from ..core.matching import (
    COURTESY_PATTERN,
    STOPWORDS,
    TextCut,
    content_tokens,
    content_union,
    declines_says,
    declines_to_answer,
    match_tokens,
    text_cut,
)
from ..core.text import TextMemo, cjk_numbers, has_cjk
from .offline_reading import number_forms, number_units, quantity_conflict

__all__ = [
    "OFFLINE_PROVIDER",
    "DEFAULT_OFFLINE_JUDGE",
    "OfflineEvidence", "LEVEL_WORDS", "is_claim_sentence", "support_share", "token_set",
    "Calibration",
    "is_offline_judge",
    "match_tokens",
    "content_tokens",
    "declines_to_answer",
    "answer_features",
    "answer_found",
    "code_conflict",
    "unit_conflict",
    "name_conflict",
    "is_long_answer",
    "AnswerModel",
    "FEATURES",
    "STOPWORDS",
]

CALIBRATION_FILE = "offline_judge.json"


# --------------------------------------------------------------------------- tokens


# --------------------------------------------------------------------------- "not sure"


# --------------------------------------------------------------------------- correctness features

#: the features of one response against one acceptable answer, in the calibration's order
FEATURES = ("recall", "phrase", "char_recall", "number_missing", "number_conflict", "support", "unbacked",
            "response_length", "answer_length", "new_recall")


def _cut(text: str) -> TextCut:
    """The text's :class:`~mlflow_ragjudge.core.matching.TextCut` (a missing text: an empty one; any other object
    that is not a string: the error the tokenizer gives)."""
    if isinstance(text, str):
        return text_cut(text)
    if not text:
        return text_cut("")
    match_tokens(text)  # (the error it always gave)
    return TextCut(text)


def _present(token: str, words: TextCut) -> bool:
    """Whether the response has ``token``, or its initial for a word (``B`` for ``Bhimrao``), or the word for an
    initial. (With the response's one-letter words gathered once, not searched per token.)"""
    if token in words.match_set:
        return True
    if len(token) == 1 and token.isalpha() and token.isascii():  # an initial: "B. R. Ambedkar"
        return any(t[:1] == token for t in words.content)  # a content word starts with it
    return token[:1] in words.initials  # it starts with a one-letter content word


def _trigrams(joined: str) -> tuple[np.ndarray, np.ndarray]:
    """The distinct character trigrams of ``joined``, sorted, and how often each occurs. A trigram is one integer,
    its three code points side by side in 21 bits each (every code point fits), so two trigrams are equal exactly
    when their integers are; counted by numpy, where a ``Counter`` of the substrings cost a row more than all of
    the metric's other work."""
    points = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.uint64)
    n = len(points)
    if n < 3:
        return np.empty(0, np.uint64), np.empty(0, np.intp)
    ids = points[:-2] << _SHIFT_2  # (built in place: numpy's cost here is per call, not per character)
    ids |= points[1:-1] << _SHIFT_1
    ids |= points[2:]
    # what np.unique(ids, return_counts=True) gives, without its general-purpose overhead (a third of the cost on
    # texts of a few hundred characters): sort, then the edges of the runs of equal ids, and each run's length
    ids.sort()
    edges = np.empty(n - 1, bool)
    edges[0] = edges[-1] = True
    np.not_equal(ids[1:], ids[:-1], out=edges[1:-1])
    at = np.flatnonzero(edges)
    return ids[at[:-1]], np.diff(at)


_SHIFT_1, _SHIFT_2 = np.uint64(21), np.uint64(42)


def _shared_trigrams(want: tuple[np.ndarray, np.ndarray], got: tuple[np.ndarray, np.ndarray]) -> int:
    """How many of ``want``'s trigrams ``got`` has, each counted at most as often as ``got`` has it (the size of
    the multiset intersection, ``sum((Counter(want) & Counter(got)).values())``). Both are sorted and distinct, so
    each of ``want``'s trigrams is looked up in ``got`` by binary search (``np.intersect1d`` sorts both again)."""
    if not len(want[0]) or not len(got[0]):
        return 0
    at = np.searchsorted(got[0], want[0])
    at[at == len(got[0])] = 0  # past the end: not there (position 0 holds another trigram or the same one)
    hit = got[0][at] == want[0]
    return int(np.minimum(want[1][hit], got[1][at[hit]]).sum())


def _text_trigrams(text: str) -> tuple[np.ndarray, np.ndarray]:
    """The character trigrams of a text's match tokens joined by spaces (:func:`_trigrams`)."""
    return _trigrams(_cut(text).spaced[1:-1])


#: :func:`_text_trigrams` of the texts read last (a row's response and acceptable answers)
_remembered_trigrams = TextMemo(_text_trigrams)


def _trigrams_of(text: str) -> tuple[np.ndarray, np.ndarray]:
    return _remembered_trigrams(text) if isinstance(text, str) else _text_trigrams(text)


def answer_features(question: str, response: str, answer: str, contexts: Sequence[str] = ()) -> dict[str, float] | None:
    """The evidence that ``response`` gives ``answer`` (one acceptable answer), or None when the answer has no
    tokens. All shares are in [0, 1]:

    * ``recall`` -- share of the answer's distinct content words found in the response (an initial matches a
      word it starts: ``B. R.`` matches ``Bhimrao Ramji``); for an answer in a script written without spaces
      (Japanese, Chinese), the share of its character pairs (bigrams) found, numerals read as digits;
    * ``phrase`` -- 1 when the answer's whole token sequence appears in the response;
    * ``char_recall`` -- share of the answer's character trigrams found in the response (spelling variants:
      ``Abidali`` / ``Abid Ali``);
    * ``number_missing`` -- 1 when a number of the answer is not in the response;
    * ``number_conflict`` -- 1 when the answer has numbers and the response gives others (not in the question)
      and none of the answer's;
    * ``support`` -- share of the response's content words found in the answer, the contexts or the question
      (how much of the response is backed by what the judge trusts);
    * ``unbacked`` -- share of the response's content words found in neither the answer nor the question;
    * ``response_length``, ``answer_length`` -- log(1 + content words) of the response and of the answer;
    * ``new_recall`` -- ``recall`` of the answer's content words that are not in the question (:func:`_new_recall`).

    A calibration uses some of these (:attr:`Calibration.features`).
    """
    # numbers in one form: 14 million = 14,000,000 = fourteen million; 两万一千 = 21000; 1400万 = 14000000
    answer, response, question = number_forms(answer), number_forms(response), number_forms(question)
    a = _cut(answer)
    distinct = a.distinct
    if not distinct:
        return None
    r = _cut(response)
    resp_content = r.content
    said = r.match_set
    answered = a.distinct_set
    asked = _cut(question).content_set
    # the answer's words the response has as they are (the intersection of two sets, in C), then the rest by initial
    found = len(answered & said) + sum(_present(t, r) for t in distinct if t not in said)
    recall = found / len(distinct)
    if has_cjk(answer):
        recall = _pair_recall(answer, response)
    phrase = float(a.spaced in r.spaced)
    want = _trigrams_of(answer)
    char_recall = _shared_trigrams(want, _trigrams_of(response)) / max(1, int(want[1].sum()))
    numbers = [t for t in distinct if t.isdigit()]
    given = [t for t in resp_content if t.isdigit() and t not in asked]
    passages = content_union(contexts)  # the row's passages' words, gathered once for every metric of the row
    return {
        "recall": recall,
        "phrase": phrase,
        "char_recall": char_recall,
        "number_missing": float(any(t not in said for t in numbers)),
        "number_conflict": float(bool(numbers) and bool(given) and not any(t in answered for t in given)),
        "support": (sum(t in answered or t in asked or t in passages for t in resp_content) / len(resp_content))
        if resp_content else 0.0,
        "unbacked": (sum(t not in answered and t not in asked for t in resp_content) / len(resp_content))
        if resp_content else 0.0,
        "response_length": math.log1p(len(resp_content)),
        "answer_length": math.log1p(len(distinct)),
        "new_recall": _new_recall(distinct, r, asked, recall),
    }


#: a response "contains" an acceptable answer when it has some of its content words, the whole answer as a phrase, or
#: at least this share of its character trigrams (spelling variants: ``Abidali`` / ``Abid Ali``)
FOUND_CHAR_RECALL = 0.5


def answer_found(features: dict[str, float], response: str = "", answer: str = "") -> bool:
    """Whether the response contains something of the acceptable answer these features describe: the answer as a
    phrase, one of its content words that the question does not already say, or (where the question says none of
    them) at least half of its character trigrams. For an answer written without spaces (Japanese, Chinese), where
    a single shared character means little (``山`` of ``富士山`` in ``北岳は山です``), something is at least half of
    the answer's character bigrams, or the whole answer."""
    if features["phrase"] > 0:
        return True
    if answer and has_cjk(answer):  # (recall is then the share of the answer's character pairs found)
        return features["recall"] >= 0.5
    # a word of the answer the question already says is no evidence (new_recall: "Battle of Appomattox" does not
    # contain "Battle of Antietam" for "which battle ended ...?"), and a spelling variant counts only where the
    # question gives none of the answer's words (its trigrams would be the question's)
    return features["new_recall"] > 0 or (features["char_recall"] >= FOUND_CHAR_RECALL
                                          and features["new_recall"] == features["recall"])


def _new_recall(distinct: Sequence[str], r: TextCut, asked: Collection[str], recall: float) -> float:
    """The share of the answer's content words **not in the question** that the response has: a word of the
    answer the question already says (``Washington`` of ``Washington metropolitan area`` for "where are the
    Washington Redskins based?") is no evidence that the response found the answer. ``recall`` when none or all of
    the answer's words are in the question."""
    new = [t for t in distinct if t not in asked]
    if not new or len(new) == len(distinct):
        return recall
    return sum(_present(t, r) for t in new) / len(new)


def _pair_recall(answer: str, response: str) -> float:
    """For an answer written without spaces, where a character alone means little (山 of 富士山 in 北岳は山です): the
    share of the answer's character pairs (bigrams of its tokens) that the response has (numbers written in
    numerals already read as digits by :func:`answer_features`); an answer of one token: 1 when the response has
    it."""
    want = match_tokens(answer)
    got = match_tokens(response)
    if len(want) < 2:
        return float(bool(want) and want[0] in got)
    pairs = _bigrams(want)
    return len(pairs & _bigrams(got)) / len(pairs)


def _bigrams(tokens: Sequence[str]) -> set[tuple[str, str]]:
    return set(zip(tokens, tokens[1:]))


#: month names as a date's part (``month:7`` for ``July`` and ``Jul``)
MONTHS = {name: f"month:{i}" for i, names in enumerate((
    ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
    ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
    ("december", "dec")), start=1) for name in names}
#: the month names read in a response ("may" is also the verb: read in an answer only)
RESPONSE_MONTHS = {k: v for k, v in MONTHS.items() if k != "may"}


def _codes(tokens: Iterable[str], months: dict[str, str] | None = None) -> list[str]:
    """Numbers, years, and codes with digits (chemical formulas ``h2o``, ``co2``; model numbers), and with
    ``months``, month names as ``month:N``. (A word of letters only -- most -- is passed over in C: no letter is a
    digit.)"""
    if months is None:
        return [t for t in tokens if not t.isalpha() and any(c.isdigit() for c in t)]
    return [months[t] if t in months else t for t in tokens
            if t in months or (not t.isalpha() and any(c.isdigit() for c in t))]


#: content words of an answer short enough that its number, date or formula is the answer (the conflict rule)
SHORT_ANSWER = 6


def code_conflict(question: str, response: str, answer: str) -> str | None:
    """A number, date or formula of the response that disagrees with a short answer's (at most
    :data:`SHORT_ANSWER` content words, where the number is the answer): the answer has some, the
    response gives others (not taken from the question) and none of the answer's -- or, for a date with a month
    name, not all of its parts (``June 20, 1969`` or ``July 21, 1969`` for ``July 20, 1969``). Returns the first
    such token of the response (a month as ``month:N``), or None (``CO2`` for the answer ``H2O``; ``1970`` for
    ``1969``)."""
    question, response, answer = number_forms(question), number_forms(response), number_forms(answer)
    tokens = _cut(answer)
    if len(tokens.content) > SHORT_ANSWER:
        return None  # a long answer's numbers are details of many; the rule is for answers that are a number
    cjk = has_cjk(answer) or has_cjk(response)  # numbers may be written in numerals there: 两万一千 = 21000
    wanted = set(_codes(tokens.match, months=MONTHS)) | (set(cjk_numbers(answer)) if cjk else set())
    if not wanted:
        return None
    said = _codes([*_cut(response).match, *(cjk_numbers(response) if cjk else ())], months=RESPONSE_MONTHS)
    asked = {*_codes(_cut(question).match, months=MONTHS), *(cjk_numbers(question) if cjk else ())}
    given = [t for t in said if t not in asked and t not in wanted]
    if not given:
        return None
    # a date with a month is wrong when any of its parts is (June 20 or July 21 for July 20, 1969); otherwise the
    # response must give none of the answer's numbers (2.4 for 2.45 billion years is an approximation, not a conflict)
    date = any(t.startswith("month:") for t in wanted)
    if (wanted <= set(said)) if date else any(t in wanted for t in said):
        return None
    return given[0]


def name_conflict(question: str, response: str, answer: str) -> str | None:
    """A name of the response that shares a word with a short answer's name but is another name: the response
    has some of the answer's words that the question does not already say and misses others, and in a run of
    capitalised words a found word stands beside a word that is neither the answer's nor the question's, nor a
    title (:data:`TITLES`), nor a spelling of a missing word (:func:`_variant`): ``Nicky Hilton`` for ``Paris
    Hilton``, ``Emmitt Smith`` for ``Timmy Smith``. Returns that word, or None."""
    a = _cut(answer)
    if len(a.content) > SHORT_ANSWER:
        return None
    asked = _cut(question).match_set
    new = [t for t in a.distinct if t not in asked]
    r = _cut(response)
    found = {t for t in new if t in r.match_set}
    if not found or len(found) == len(new):
        return None
    answered = a.distinct_set
    missing = [t for t in new if t not in found]
    for run in _CAPITALISED_RUN.finditer(response):
        words = run.group(0).split()
        tokens = [match_tokens(w) for w in words]
        for i, ts in enumerate(tokens):
            if not any(t in found for t in ts):
                continue
            for j in (i - 1, i + 1):  # the found word's neighbours in the name
                if 0 <= j < len(words) and tokens[j] and all(
                        t not in answered and t not in asked and t not in STOPWORDS and t not in TITLES
                        and not any(_variant(t, m) for m in missing) for t in tokens[j]):
                    return words[j]
    return None


#: words that stand before a name without being one (a title, a rank, a kind of place)
TITLES = frozenset("queen king prince princess sir lady lord dr doctor mr mrs ms president saint st pope emperor "
                   "general captain mount mounts lake river cape fort port".split())


def _variant(word: str, other: str) -> bool:
    """Whether two words may be spellings of one name: one holds the other, or they share their first three
    letters (``dave`` / ``david``, ``yevgenia`` / ``evgenia``, ``abidali`` / ``abid``)."""
    return (len(word) >= 3 and len(other) >= 3 and (word in other or other in word)) or word[:3] == other[:3]


_CAPITALISED_RUN = re.compile(r"\b[A-Z][\w'’-]*(?:\s+[A-Z][\w'’-]*)+")


def unit_conflict(response: str, answer: str) -> str | None:
    """A quantity of a short answer given in another unit of the same kind (``330 feet`` for ``330 metres``; an
    amount in another currency, ``€1,000`` for ``$1,000``; a temperature in another scale,
    :func:`~.offline_reading.quantity_conflict`) with the answer's own nowhere in the response; returns it
    (``330 ft``, ``1000 EUR``), or None."""
    response, answer = number_forms(response), number_forms(answer)
    tokens = _cut(answer)
    if len(tokens.content) > SHORT_ANSWER:
        return None
    wanted = number_units(tokens.match)
    if not wanted:
        return quantity_conflict(response, answer)
    said = number_units(_cut(response).match)
    if wanted & said:
        return None
    for number, kind, unit in said:
        if any(number == n and kind == k for n, k, _ in wanted):
            return f"{number} {unit}"
    return quantity_conflict(response, answer)


# --------------------------------------------------------------------------- calibration


def is_long_answer(features: dict[str, float]) -> bool:
    """Whether the acceptable answer ``features`` describe (:func:`answer_features`) has more than
    :data:`SHORT_ANSWER` distinct content words (its ``answer_length`` is log(1 + that count))."""
    return round(math.expm1(features["answer_length"])) > SHORT_ANSWER


@dataclass(frozen=True)
class AnswerModel:
    """One logistic model of "a human accepts the response" and its probability cut-points (levels 4 and 5)."""

    features: tuple[str, ...]
    weights: tuple[float, ...]
    bias: float
    cuts: dict[str, float]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AnswerModel:
        return cls(tuple(d["features"]), tuple(float(w) for w in d["weights"]), float(d["bias"]),
                   {str(k): float(v) for k, v in d["cuts"].items()})

    def to_dict(self) -> dict[str, Any]:
        return {"features": list(self.features), "weights": list(self.weights), "bias": self.bias,
                "cuts": self.cuts}

    def probability(self, features: dict[str, float]) -> float:
        z = self.bias + math.fsum(w * features[f] for f, w in zip(self.features, self.weights))
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0


@dataclass(frozen=True)
class Calibration:
    """The fitted numbers of the offline judge (``data/offline_judge.json``, written by
    ``tools/offline_judge/fit.py``, beside the package, not in it).

    Attributes:
        version: calibration version (recorded with every result and in the run's params).
        features: feature names, in the order of ``weights``.
        weights, bias: the logistic model: P(a human accepts the response) = sigmoid(bias + weights . features).
        cuts: probability cut-points ``{"4": c4, "5": c5}``: level 5 from ``c5``, level 4 from ``c4`` (levels 4-5
            are "a human accepts it").
        recall_cuts: below ``c4`` the level says how much of the best acceptable answer the response contains:
            ``{"2": r2, "3": r3}`` on :func:`answer_features`' ``recall`` -- level 3 from ``r3``, 2 from ``r2``,
            else 1 (no content word of any acceptable answer: wrong outright).
        support_threshold: a sentence is supported by passages when at least this share of its content words
            occur in them (context recall, context precision).
        claim_threshold: a claim of the response is supported when its support (faithfulness: its words and its
            phrases found, less its missing names and numbers, :class:`~.offline_reading.Support`) reaches this;
            None (calibrations 1-3): ``support_threshold``.
        fit: provenance and held-out measurements (data, split rule, sizes, agreement).
        long: the model of **long answers** (more than :data:`SHORT_ANSWER` distinct content words: a reference
            that is a passage, MTRAG's, rather than an entity, NQ's), its own ``features``, ``weights``, ``bias``
            and probability ``cuts``; None: one model for every answer (calibration 1). What makes a human accept
            a long answer differs from a short one's (how much of the reference it covers and whether the rest is
            backed by the passages, against whether the entity is named), and one model fitted on both passed
            nearly every long answer.
    """

    version: str
    features: tuple[str, ...]
    weights: tuple[float, ...]
    bias: float
    cuts: dict[str, float]
    recall_cuts: dict[str, float]
    support_threshold: float
    fit: dict[str, Any] = field(default_factory=dict)
    long: AnswerModel | None = None
    claim_threshold: float | None = None

    @property
    def claim_cut(self) -> float:
        """The support a claim needs to count as supported (:attr:`claim_threshold`, else :attr:`support_threshold`)."""
        return self.support_threshold if self.claim_threshold is None else self.claim_threshold

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        cal = cls(str(d["version"]), tuple(d["features"]), tuple(float(w) for w in d["weights"]), float(d["bias"]),
                  {str(k): float(v) for k, v in d["cuts"].items()},
                  {str(k): float(v) for k, v in d["recall_cuts"].items()}, float(d["support_threshold"]),
                  dict(d.get("fit", {})), AnswerModel.from_dict(d["long"]) if d.get("long") else None,
                  float(d["claim_threshold"]) if d.get("claim_threshold") is not None else None)
        models = [("", cal.features, cal.weights, cal.cuts)]
        if cal.long is not None:
            models.append(("long-answer model ", cal.long.features, cal.long.weights, cal.long.cuts))
        for what, features, weights, cuts in models:
            if len(features) != len(weights) or set(features) - set(FEATURES):
                raise ValueError(f"offline judge calibration {cal.version}: {what}features {features} do not match "
                                 f"weights or are unknown (known: {FEATURES})")
            if [cuts["4"], cuts["5"]] != sorted([cuts["4"], cuts["5"]]):
                raise ValueError(f"offline judge calibration {cal.version}: {what}cut-points {cuts} are not "
                                 "increasing")
        if cal.recall_cuts["2"] > cal.recall_cuts["3"]:
            raise ValueError(f"offline judge calibration {cal.version}: recall cut-points {cal.recall_cuts} are not "
                             "increasing")
        if cal.recall_cuts["2"] <= 0:
            raise ValueError(f"offline judge calibration {cal.version}: recall cut-point 2 must be above 0 (a "
                             "response with no word of the answer is level 1)")
        return cal

    def to_dict(self) -> dict[str, Any]:
        out = {"version": self.version, "features": list(self.features), "weights": list(self.weights),
               "bias": self.bias, "cuts": self.cuts, "recall_cuts": self.recall_cuts,
               "support_threshold": self.support_threshold,
               **({"claim_threshold": self.claim_threshold} if self.claim_threshold is not None else {})}
        if self.long is not None:
            out["long"] = self.long.to_dict()
        return {**out, "fit": self.fit}

    @staticmethod
    @functools.cache
    def shipped() -> Calibration:
        """The calibration shipped with the package."""
        text = (resources.files("mlflow_ragjudge") / "data" / CALIBRATION_FILE).read_text(encoding="utf-8")
        return Calibration.from_dict(json.loads(text))

    def model(self, features: dict[str, float]) -> AnswerModel:
        """The model that judges a response against the acceptable answer ``features`` describe: the long-answer
        model for an answer of more than :data:`SHORT_ANSWER` distinct content words, where the calibration has
        one; the main model otherwise."""
        if self.long is not None and is_long_answer(features):
            return self.long
        return self._main

    @functools.cached_property
    def _main(self) -> AnswerModel:
        return AnswerModel(self.features, self.weights, self.bias, self.cuts)

    def probability(self, features: dict[str, float]) -> float:
        """P(a human accepts the response), from the model of this answer's length (:meth:`model`)."""
        return self.model(features).probability(features)

    def level(self, p: float, recall: float, features: dict[str, float] | None = None) -> int:
        """The six-level score (1..5) of a response with acceptance probability ``p`` whose best acceptable
        answer's content words it contains at share ``recall`` (the probability cut-points of the model of that
        answer, described by ``features``; the main model's without them)."""
        cuts = self.cuts if features is None else self.model(features).cuts
        if p >= cuts["5"]:
            return 5
        if p >= cuts["4"]:
            return 4
        if recall >= self.recall_cuts["3"]:
            return 3
        return 2 if recall >= self.recall_cuts["2"] else 1


# --------------------------------------------------------------------------- the judge

LEVEL_WORDS = {5: "correct and complete", 4: "largely correct, but incomplete", 3: "partly correct, partly wrong",
                2: "mostly wrong", 1: "wrong"}


def is_claim_sentence(sentence: str) -> bool:
    s = sentence.strip()
    return bool(s) and not s.endswith(("?", "？")) and not COURTESY_PATTERN.match(s) and not declines_says(s)


def support_share(tokens: Sequence[str], backed: Collection[str]) -> tuple[float, list[str]]:
    if not tokens:
        return 1.0, []
    missing = [t for t in dict.fromkeys(tokens) if t not in backed]
    return sum(t in backed for t in tokens) / len(tokens), missing


def token_set(texts: Iterable[str]) -> set[str]:
    """The content words of all ``texts`` (:func:`~mlflow_ragjudge.core.matching.content_union`, as a new set)."""
    return set(content_union(texts))


@dataclass
class OfflineEvidence:
    """What every offline scorer works from: the calibration, the offline judge's name and version, and the labels
    each result carries (``details["judge"] = "offline:/lexical"``, the calibration version). Each metric's offline
    scorer lives in the metric's own module (``offline_correctness`` in :mod:`~mlflow_ragjudge.metrics.correctness`
    ...); :class:`~mlflow_ragjudge.metrics.offline.OfflineJudge` gathers them.

    Args:
        calibration: the fitted numbers (default: the shipped ones).
    """

    calibration: Calibration = field(default_factory=Calibration.shipped)

    @property
    def uri(self) -> str:
        return DEFAULT_OFFLINE_JUDGE

    @property
    def version(self) -> str:
        return f"offline-lexical-{self.calibration.version}"

    def details(self, **kw: Any) -> dict[str, Any]:
        return {"judge": self.uri, "calibration": self.calibration.version, **kw}


    def supports_answer(self, passage: str, answer: str) -> bool:
        a = _cut(answer)
        want = a.distinct
        if not want:
            return False
        have = _cut(passage)
        # (the answer's words are distinct: how many the passage has is the size of the two sets' intersection)
        share = len(a.distinct_set & have.match_set) / len(want)
        if share >= self.calibration.support_threshold:
            return True
        # the whole answer as a phrase: possible only where the passage has every word of it (share 1), so only a
        # threshold above 1 leaves it to decide
        return share == 1 and a.spaced in have.spaced
