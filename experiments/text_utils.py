"""Text analysis shared by the experiments: one token rule and one term rule (sentences: the package's
``mlflow_ragjudge.text.split_sentences``).

Token rule (used for chunk sizes and the input contract's 2048-token limit): a *token* is a run of
non-space characters that contains no CJK character, or one CJK character (kana, kanji). For English
this counts whitespace words (a real BPE tokenizer gives about 1.3 tokens per English word, so a
2048-"token" document here is roughly 2,700 model tokens); for Japanese it counts characters (about one
model token per character for common tokenizers). It is an approximation, stated as such.

Term rule (BM25, the reranker, the extractive generator and the hallucination proxy): lower-cased Latin
words and numbers with a light plural stemmer, English stop words dropped; CJK runs become character
bigrams, and bigrams made only of hiragana (mostly particles and inflections) are dropped.
"""

from __future__ import annotations

import re

__all__ = [
    "CJK_CHARS",
    "STOPWORDS",
    "approx_tokens",
    "content_terms",
    "token_spans",
]

CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
_TOKEN = re.compile(rf"[{CJK_CHARS}]|[^\s{CJK_CHARS}]+")
_LATIN = re.compile(r"[a-z0-9]+(?:['.][a-z0-9]+)*")
_CJK_RUN = re.compile(rf"[{CJK_CHARS}]+")
_HIRAGANA_ONLY = re.compile(r"^[\u3040-\u309f]+$")

STOPWORDS = frozenset(
    """a an and are as at be been but by can could did do does for from had has have how i if in into is it
    its me my not of on or our should so than that the their them then there these they this those to was
    we were what when where which who why will with would you your about also between""".split()
)


def token_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of the tokens of ``text`` under the token rule above."""
    return [m.span() for m in _TOKEN.finditer(text)]


def approx_tokens(text: str) -> int:
    """Approximate token count: whitespace words, with each CJK character counted as one token."""
    return len(_TOKEN.findall(text))


def _stem(word: str) -> str:
    """A light plural stemmer: ``indexes -> index``, ``queries -> query``, ``rows -> row``."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("xes", "ches", "shes", "sses")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def content_terms(text: str) -> list[str]:
    """Content terms of ``text`` in order (with repeats), per the term rule in the module docstring."""
    lowered = text.lower()
    out = [_stem(w) for w in _LATIN.findall(lowered) if w not in STOPWORDS]
    for run in _CJK_RUN.findall(lowered):
        grams = [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]
        out.extend(g for g in grams if not _HIRAGANA_ONLY.match(g))
    return out
