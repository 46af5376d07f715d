"""Every parser and splitter of untrusted text is linear (issue 24, item 4; issue 35).

Judge replies, answers and contexts are untrusted: a reply of ``Score:`` followed by a few hundred spaces
(what a JSON object leaves once it is masked) took 16 s in ``parse_score_reply`` (four adjacent ``\\s*``,
n**4), a 153 KB author list in one context took 69 s in the sentence splitter (n**2), and a run of 64,000 ``!``
with no space after it took 196 s in the splitter (n**2), with the GIL held.

Each case below feeds one parser or splitter an adversarial input at size n and 8n and checks how the time
grows: about 8 for linear work, 64 for quadratic, 4096 for quartic. No time is asserted, only the ratio
(bound 30, generous for a shared machine); each size is timed as the best of a few repeats of a loop long
enough to be measured (the loop length is fixed at size n and reused at 8n), and a ratio over the bound is
measured again, up to three times, before it counts. The sizes are chosen so that
the quadratic and quartic code this replaced finishes the 8n input in seconds, and fails the bound.

What is timed is the work, never a memo: the splitter and the tokenizer remember the texts they read last
(``TextMemo``), so a loop over one text would time dictionary look-ups after its first call (how the quadratic
``!`` run went unseen). Every function is timed through :func:`uncached`, which empties every text memo of the
package before each call; ``test_the_timing_reads_the_text_each_time`` checks that it does.

A second group checks that ordinary replies and texts read exactly as before: the reworked value reader
and clause splitter against the earlier patterns, on random short strings built from the characters that
matter to them.
"""

from __future__ import annotations

import gc
import json
import random
import re
import sys
import time
from collections.abc import Callable

import pytest

from mlflow_ragjudge.core.matching import _CLAUSE_SPLIT, declines_to_answer, match_tokens
from mlflow_ragjudge.core.text import TextMemo, split_sentences, tokenize
from mlflow_ragjudge.llm import parsing
from mlflow_ragjudge.llm.backends.base import ChatResponse
from mlflow_ragjudge.llm.parsing import (
    ParseError,
    extract_json_object,
    iter_json_objects,
    parse_prometheus,
    parse_score_reply,
)
from mlflow_ragjudge.metrics.statements import numbered_parser

GROWTH_BOUND = 30  # linear: ~8; quadratic: 64; quartic: 4096
SCALE = range(0, 6)


def _text_memos() -> list[TextMemo]:
    """Every text memo held by a module of the package (the sentences, tokens and cuts of the texts read last)."""
    found: dict[int, TextMemo] = {}
    for name, module in list(sys.modules.items()):
        if name == "mlflow_ragjudge" or name.startswith("mlflow_ragjudge."):
            for value in list(vars(module).values()):
                if isinstance(value, TextMemo):
                    found[id(value)] = value
    return list(found.values())


def uncached(fn: Callable[[str], object]) -> Callable[[str], object]:
    """``fn``, with every text memo of the package emptied before each call: each call reads its text anew."""
    memos = _text_memos()

    def call(text: str) -> object:
        for memo in memos:
            memo.clear()
        return fn(text)

    return call


def _timed(fn: Callable[[str], object], text: str, loops: int, limit: float = float("inf")) -> float:
    """CPU seconds of this thread for ``loops`` calls of ``fn(text)``, with the garbage collector off as ``timeit``
    does (its passes grow with the objects alive: noise that is no part of the parser); ``inf`` once past ``limit``.
    CPU time, not the wall clock: on a shared machine with more runnable processes than cores, a timing of 100 ms
    waits for the CPU several times, and the wall clock counts the waits as work."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.thread_time()
        for _ in range(loops):
            _quietly(fn, text)
            if time.thread_time() - t0 > limit:
                return float("inf")
        return time.thread_time() - t0
    finally:
        if enabled:
            gc.enable()


def _quietly(fn: Callable[[str], object], text: str) -> None:
    try:
        fn(text)
    except ParseError:  # refusing a reply is an outcome like any other: only the time is measured
        pass


def growth(fn: Callable[[str], object], make: Callable[[int], str], n: int, attempts: int = 3) -> float:
    """time(fn(make(8n))) / time(fn(make(n))), each the best of a few repeats of the same number of calls.

    The machine is shared: a burst of load during one timing inflates the ratio, so a ratio over the bound
    is measured again (up to ``attempts`` times) and the lowest counts. Super-linear code stays over the
    bound every time; a load burst does not last that long. A timing of 8n is abandoned once it passes the
    bound (``inf``), so super-linear code costs seconds here, not minutes."""
    fn = uncached(fn)
    small, big = make(n), make(8 * n)
    loops = 1
    while _timed(fn, small, loops) < 0.01 and loops < 10_000:
        loops *= 4
    ratios = []
    for _ in range(attempts):
        t_small = min(_timed(fn, small, loops) for _ in range(5))
        t_big = float("inf")
        for _ in range(3):  # (one timing past the bound is enough: super-linear code is not timed three times)
            t_big = min(t_big, _timed(fn, big, loops, limit=GROWTH_BOUND * t_small))
            if t_big == float("inf"):
                break
        ratios.append(t_big / t_small)
        if ratios[-1] < GROWTH_BOUND:
            break
    return min(ratios)


def score_reply(text: str) -> dict:
    return parse_score_reply(ChatResponse(text=text), allowed=SCALE)


def prometheus(text: str) -> tuple[int, str]:
    return parse_prometheus(text, SCALE)


def objects(text: str) -> list:
    return list(iter_json_objects(text))


_STATEMENTS_SCHEMA = {
    "type": "object", "required": ["verdicts"],
    "properties": {"verdicts": {"type": "array", "items": {
        "type": "object", "required": ["claim", "verdict"],
        "properties": {"claim": {"type": "integer"}, "verdict": {"type": "string"}}}}},
}


def numbered(text: str) -> dict:
    return numbered_parser(_STATEMENTS_SCHEMA, list_key="verdicts", index_key="claim", numbers=range(1, 50),
                           noun="claim")(ChatResponse(text=text))


# (name, function, input of size ~n, n): each input is what the function meets in a reply, an answer or a context
CASES = [
    # judge replies: score markers
    ("score-then-spaces", score_reply, lambda n: "Score:" + " " * n + "x", 20),
    ("score-then-masked-json", score_reply,
     lambda n: "Score: " + json.dumps({"feedback": "fine " * n, "score": 4}), 4),
    ("score-colons-and-stars", score_reply, lambda n: "Score:" + " :" * n + " *" * n + " (" * n, 10),
    ("many-score-prefixes", score_reply, lambda n: "Score: " * n + "Score: 4", 1000),
    ("many-agreeing-verdicts", score_reply, lambda n: "Score: 4\n" * n, 1000),
    ("many-result-markers", prometheus, lambda n: "Feedback: fine. [RESULT] 3\n" * n, 1000),
    ("result-then-spaces", prometheus, lambda n: "[RESULT]" + " " * n + "(" + " " * n + "x", 16),
    ("star-run-before-feedback", prometheus, lambda n: "*" * n + " [RESULT] 4", 1500),
    ("value-then-spaces-then-word", prometheus, lambda n: "[RESULT] 4" + " " * n + "points", 8000),
    # judge replies: JSON
    ("nested-prose-braces", objects, lambda n: "{a " * n + "}" * n, 500),
    ("deep-json-arrays", extract_json_object, lambda n: '{"score": 4, "x": ' + "[" * n + "]" * n + "}", 800),
    ("many-different-objects", extract_json_object, lambda n: "".join(f'{{"score": {i}}} ' for i in range(n)), 500),
    ("many-objects-in-prose-braces", objects, lambda n: "{ " + '{"a": 1} x ' * n + "}", 1000),
    ("long-json-string", score_reply, lambda n: '{"score": 4, "feedback": "' + "a\\\"{}" * n + '"}', 2000),
    ("many-numbered-entries", numbered,
     lambda n: json.dumps({"verdicts": [{"claim": i % 60, "verdict": "yes"} for i in range(n)]}), 400),
    # answers and contexts: sentences, clauses, tokens
    ("author-list-of-initials", split_sentences, lambda n: ", ".join(f"{chr(65 + i % 26)}. Smith" for i in range(n)),
     250),
    ("titles-and-acronyms", split_sentences, lambda n: "Dr. U.S. e.g. No. 5 " * n, 120),
    ("lowercase-after-periods", split_sentences, lambda n: "word. next. " * n, 1500),
    ("spaces-after-a-period", split_sentences, lambda n: ("x." + " " * n + "y. ") * 40, 50),
    ("no-sentence-end", split_sentences, lambda n: "a" * (50 * n), 800),
    ("cjk-quotes", split_sentences, lambda n: "「はい。」と言った。" * n, 1500),
    # a run of sentence-ending punctuation with no space after it: each of its characters was a candidate read to
    # the run's end (n**2; the splitter before b19430a takes 2 s of CPU on each of these 8n inputs, 64 KB: minutes)
    ("run-of-!-then-a-letter", split_sentences, lambda n: "Sorry" + "!" * n + "x", 1000),
    ("run-of-?-then-a-letter", split_sentences, lambda n: "Why" + "?" * n + "x", 1000),
    ("run-of-.-then-a-letter", split_sentences, lambda n: "So" + "." * n + "x", 1000),
    ("run-of-…-then-a-letter", split_sentences, lambda n: "Hm" + "…" * n + "x", 1000),
    ("mixed-run-of-!?.", split_sentences, lambda n: "Huh" + "!?." * (n // 3) + "x", 1000),
    ("run-then-closers-then-a-letter", split_sentences, lambda n: "Oh" + "!?" * (n // 2) + ")\"]" * n + "x", 400),
    ("punctuation-and-closers-alternating", split_sentences, lambda n: "Oh" + "!)" * n + "x", 2000),
    ("run-then-spaces-to-the-end", split_sentences, lambda n: "Done" + "!" * n + " " * n, 1000),
    ("sentence-ends-one-after-another", split_sentences, lambda n: "Hi! " * n, 2000),
    ("cjk-terminator-run", split_sentences, lambda n: "はい" + "。！？" * n + "x", 2000),
    ("full-width-decimals", split_sentences, lambda n: "１１．５" * n, 2000),
    ("nested-brackets-and-quotes", split_sentences, lambda n: "\"(「" * n + "Yes." + "」)\"" * n + " and so", 2000),
    ("long-word-before-a-period", split_sentences, lambda n: "a" * (20 * n) + ". Then", 800),
    ("periods-inside-tokens", split_sentences, lambda n: "v1.2.3" * n, 2000),
    ("many-lines", split_sentences, lambda n: "a.\n" * n, 2000),
    # the word before each period was read back to the sentence's start when no " " was in it: n**2 until the search
    # was bounded by the longest abbreviation (an initial, which is no sentence end, then tabs or ideographic spaces)
    ("initials-after-tabs", split_sentences, lambda n: ("A." + "\t" * 30) * n, 4000),
    ("initials-after-ideographic-spaces", split_sentences, lambda n: ("B." + "\u3000" * 30) * n, 4000),
    ("spaces-in-an-answer", declines_to_answer, lambda n: "a" + " " * (20 * n) + "b", 40),
    ("spaces-after-i", declines_to_answer, lambda n: "I" + " " * (20 * n) + "know", 40),
    ("courtesy-punctuation", declines_to_answer, lambda n: "Sorry" + "!" * (20 * n) + "x", 400),
    ("thousands-separators", match_tokens, lambda n: "1,000," * n, 1200),
    ("combining-marks", tokenize, lambda n: "e\u0301" * (20 * n), 400),
]


@pytest.mark.parametrize("name, fn, make, n", CASES, ids=[c.values[0] if hasattr(c, "values") else c[0] for c in CASES])
def test_time_grows_linearly_with_the_input(name, fn, make, n):
    ratio = growth(fn, make, n)
    shown = f"{ratio:.0f}x" if ratio != float("inf") else f"over {GROWTH_BOUND}x"
    assert ratio < GROWTH_BOUND, f"{name}: 8x the input took {shown} the time (bound {GROWTH_BOUND}; linear: ~8)"


def test_the_timing_reads_the_text_each_time():
    # split_sentences remembers the texts it read last: its first call on a text does the work, the next ones look
    # it up. Through uncached() every call does the work: the timings above are of the splitter, not of a look-up.
    text = "Sorry" + "!" * 20_000 + " Then a sentence. " * 2_000
    first = _timed(split_sentences, text, 1)
    hit = min(_timed(split_sentences, text, 1) for _ in range(5))
    if first < 20 * hit:
        pytest.skip("split_sentences remembers no text (no memo to empty): nothing to check here")
    work = min(_timed(uncached(split_sentences), text, 1) for _ in range(5))
    assert work > 20 * hit, f"uncached() took {work:.2g} s, a memo hit {hit:.2g} s: it timed a look-up"
    assert uncached(split_sentences)(text) == split_sentences(text)


def test_a_reply_like_the_reported_one_reads_as_before():
    # "Score:" then a JSON object of a few hundred characters: the object is the verdict; the marker, followed
    # by the object's masked span (spaces), is none
    reply = "Score: " + json.dumps({"feedback": "The response matches the reference. " * 8, "score": 4})
    assert len(reply) > 276
    assert score_reply(reply) == {"score": 4, "feedback": "The response matches the reference. " * 7
                                  + "The response matches the reference."}


def test_json_nested_past_the_cap_is_a_parse_error_not_a_recursion_error():
    for text in ("[" * 3000 + "]" * 3000, '{"score": 4, "x": ' + "[" * 3000 + "]" * 3000 + "}",
                 "{a " * 3000 + "}" * 3000):
        with pytest.raises(ParseError, match="levels deep"):
            extract_json_object(text)
    # nesting up to the cap is read
    deep = {"score": 4, "x": json.loads("[" * 90 + "]" * 90)}
    assert extract_json_object(json.dumps(deep)) == deep


def test_objects_inside_prose_braces_are_found_each_span_decoded_once():
    text = 'Note {my view: {"score": 2} and {"a": {"b": 1}, bad} end} then {"score": 2}'
    found = [(obj, text[s:e]) for obj, s, e in iter_json_objects(text)]
    assert found == [({"score": 2}, '{"score": 2}'), ({"b": 1}, '{"b": 1}'), ({"score": 2}, '{"score": 2}')]


# ----------------------------------------------------------------------------- nothing else changed

# the patterns these replace, as they were (the oracle for ordinary replies)
_OLD_VALUE = re.compile(
    r"\s*[:=]?\s*\**\s*[\(\[]?\s*(?P<num>[+-]?\d+)(?P<tail>(?:[.,]\d+)?)\s*"
    r"(?:(?:/|out\s+of)\s*(?P<den>\d+))?\s*[\)\]]?\**"
    r"(?=$|[\s.,;!)\]*_`\"'~\-–])",
    re.IGNORECASE,
)
_OLD_STARTS_NUMERIC = re.compile(r"\s*[:=]?\s*\**\s*[\(\[]?\s*[+-]?\d")
_OLD_FEEDBACK = re.compile(r"\**feedback\**\s*:\**", re.IGNORECASE)
_OLD_CLAUSE = re.compile(r"[;:,，、]|\s+(?:but|however|although|though|and)\s+|。", re.IGNORECASE)


def _random_strings(pieces: list[str], count: int, longest: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        yield "".join(rng.choice(pieces) for _ in range(rng.randint(0, longest)))


def test_values_after_a_marker_read_exactly_as_the_earlier_pattern():
    pieces = [" ", " ", "\n", ":", "=", "*", "*", "(", "[", ")", "]", "+", "-", "4", "5", "1", ".", ",", "/",
              "out of", "out  of", "x", "a", "~", "_", "feedback"]
    for s in _random_strings(pieces, 30_000, 10, seed=1):
        m = _OLD_VALUE.match(s)
        assert parsing._read_value(s, 0) == (
            None if m is None else (m.group("num"), m.group("tail"), m.group("den"), m.end())), s
        assert bool(parsing._STARTS_NUMERIC.match(s)) == bool(_OLD_STARTS_NUMERIC.match(s)), s
        assert [x.span() for x in parsing._FEEDBACK_LABEL.finditer(s)] == [x.span() for x in _OLD_FEEDBACK.finditer(s)]


def test_clauses_split_exactly_as_the_earlier_pattern():
    pieces = ["a", "b", " ", " ", "  ", "\t", "and", "but", "However", ",", ";", ":", "。", "、", "x"]
    for s in _random_strings(pieces, 30_000, 12, seed=2):
        assert _CLAUSE_SPLIT.split(s) == _OLD_CLAUSE.split(s), s
