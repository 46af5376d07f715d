"""JSON read from untrusted text (judge replies) with a bound on nesting, in one pass.

Python's decoder recurses once per level and raises ``RecursionError`` near 1,000 levels -- no
``ValueError``, so a reply 3,000 levels deep escaped every parser as an internal error that lost the
reply and its tokens -- and every recursive walk after it (secret redaction, the transcript, the cache)
has the same limit. Here the depth is measured first, by a linear scan, and deeper than
:data:`MAX_JSON_DEPTH` is a :class:`~mlflow_ragjudge.core.errors.ParseError` (a ``ValueError``): the
reply is recorded as unreadable, with its text and tokens, and asked again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from .errors import ParseError

#: ``json.dumps(value, ensure_ascii=False)`` (every non-ASCII character kept as it is), with one encoder for all calls
#: instead of a new one per call: a per-row table writes a few such cells per row
dumps_text = json.JSONEncoder(ensure_ascii=False).encode

#: JSON in a reply may nest this deep, objects and arrays together (the judges' schemas need 4 levels)
MAX_JSON_DEPTH = 100
#: the characters that matter when matching braces in JSON: braces, brackets, quotes and backslashes
SYNTAX = re.compile(r'[{}\[\]"\\]')


def too_deep(depth: int) -> ParseError:
    """The error for JSON nested ``depth`` levels deep (more than :data:`MAX_JSON_DEPTH`)."""
    return ParseError(f"the reply nests JSON more than {MAX_JSON_DEPTH} levels deep (at least {depth}); "
                      "give one flat JSON object as the instructions show")


def brackets(text: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """The position and character of every ``{ } [ ]`` in ``text`` from ``start`` that is not inside a JSON
    string, in one pass (a backslash in a string escapes whatever follows it)."""
    in_str, skip = False, -1
    for m in SYNTAX.finditer(text, start):
        j = m.start()
        if j < skip:
            continue
        ch = text[j]
        if in_str:
            if ch == "\\":
                skip = j + 2  # the escaped character, whatever it is
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch != "\\":
            yield j, ch


def json_depth(text: str, start: int = 0) -> int:
    """How deep objects and arrays nest in ``text`` from ``start`` (brackets inside JSON strings do not
    count; a closing bracket with none open is ignored); stops counting past :data:`MAX_JSON_DEPTH`."""
    depth = deepest = 0
    for _, ch in brackets(text, start):
        if ch in "{[":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    break
        elif depth:
            depth -= 1
    return deepest


def loads(text: str) -> Any:
    """``json.loads``, refusing JSON nested deeper than :data:`MAX_JSON_DEPTH` with a :class:`ParseError`
    (text that is not JSON raises ``ValueError`` as with ``json.loads``)."""
    if text.lstrip()[:1] in ("{", "["):
        depth = json_depth(text)
        if depth > MAX_JSON_DEPTH:
            raise too_deep(depth)
    try:
        return json.loads(text)
    except RecursionError:  # a thread already deep in its stack
        raise too_deep(MAX_JSON_DEPTH) from None


def value_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep dicts and lists nest in ``value`` (a decoded JSON value), counting at most to ``limit + 1``;
    no recursion, so any depth is measured safely."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list, tuple)):
            if d > deepest:
                deepest = d
                if deepest > limit:
                    return deepest
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest
