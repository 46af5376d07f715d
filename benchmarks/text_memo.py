"""The offline metrics' text memo (``core/text.py:TextMemo``: ``token_tuple``, ``sentence_tuple``,
``core/matching.py:text_cut`` ...), measured end to end: one process alternates ``evaluate_frame`` on the offline
benchmark's rows (all seven metrics, ``offline:/lexical``, ``bertscore=False``, ``cache=False``) with the memos as
they are and with every memo made a pass-through (each call works its text out again). Prints the CPU milliseconds
per row of every run and their medians (docs/scaling.md, "Speed tricks on the main path").

    .venv/bin/python benchmarks/text_memo.py --rows 2000 --pairs 4
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from gc_freeze import alternate

from mlflow_ragjudge.core.text import TextMemo


def _pass_through(self: TextMemo, text: str):  # type: ignore[no-untyped-def]
    return self._fn(text)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--pairs", type=int, default=4)
    a = p.parse_args()
    remembered = TextMemo.__call__

    def use(call: Callable[..., object]) -> Callable[[], None]:
        return lambda: setattr(TextMemo, "__call__", call)

    try:
        alternate(a.rows, a.pairs, {"with the memos": use(remembered), "without": use(_pass_through)})
    finally:
        TextMemo.__call__ = remembered  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
