"""Chunk-level ROUGE-L per row: ``rouge_score``'s Python LCS table against our compiled kernel, side by side.

Run from the repository root with the project's venv (a few seconds)::

    .venv/bin/python benchmarks/bench_lcs.py
    .venv/bin/python benchmarks/bench_lcs.py --rows 500 --repeat 5

On ``benchmarks/throughput.py``'s synthetic rows (5 contexts of ~120 words against a reference of ~45 words),
for each row: ``rouge_score.rouge_scorer.RougeScorer(["rougeL"], tokenizer=<our tokenizer>).score(reference,
"\\n".join(contexts))`` -- what :func:`mlflow_ragjudge.metrics.lexical.context_rouge_l` ran before issue 26 --
and ``context_rouge_l(contexts, reference)`` today. Both are timed on the same rows, best of ``--repeat`` passes,
with our tokenizer's memo cleared before each pass (so every text is tokenised, as in a run), and their
numbers are checked to be equal (to 1e-12) before any timing is reported. Prints microseconds per row and the
ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from throughput import make_rows  # noqa: E402

from mlflow_ragjudge.core.text import token_tuple, tokenize  # noqa: E402
from mlflow_ragjudge.metrics.lexical import context_rouge_l  # noqa: E402


class _OurTokens:
    def tokenize(self, text: str) -> list[str]:
        return tokenize(text)


def _best(fn: Any, pairs: list[tuple[list[str], str]], repeat: int, before: Any = None) -> float:
    best = float("inf")
    for _ in range(repeat):
        if before is not None:
            before()
        t0 = time.perf_counter()
        for contexts, reference in pairs:
            fn(contexts, reference)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200, help="rows (default 200)")
    p.add_argument("--repeat", type=int, default=3, help="passes; the best counts (default 3)")
    a = p.parse_args(argv)
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_OurTokens())
    df = make_rows(a.rows)
    pairs = [(list(r.contexts), r.reference) for r in df.itertuples()]

    def theirs(contexts: list[str], reference: str) -> Any:
        return scorer.score(reference, "\n".join(c for c in contexts if c))["rougeL"]

    for contexts, reference in pairs:  # equal first: a fast wrong answer is no result
        ours, ref = context_rouge_l(contexts, reference), theirs(contexts, reference)
        for key, theirs_value in (("precision", ref.precision), ("recall", ref.recall), ("f1", ref.fmeasure)):
            assert abs(ours[key] - theirs_value) <= 1e-12, (key, ours, ref)  # type: ignore[operator]
    slow = _best(theirs, pairs, a.repeat, before=token_tuple.clear)
    fast = _best(context_rouge_l, pairs, a.repeat, before=token_tuple.clear)
    print(f"{a.rows} rows (5 contexts x ~120 words vs a ~45-word reference), best of {a.repeat}; scores equal "
          "to 1e-12")
    print("| implementation | us per row | rows/s |\n|---|---:|---:|")
    for name, t in (("rouge_score (Python LCS table, our tokenizer)", slow),
                    ("context_rouge_l (rapidfuzz LCSseq)", fast)):
        print(f"| {name} | {1e6 * t / a.rows:,.1f} | {a.rows / t:,.0f} |")
    print(f"ratio: {slow / fast:,.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
