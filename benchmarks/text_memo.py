"""The offline metrics' text memo (``core/text.py:TextMemo``: ``token_tuple``, ``sentence_tuple``,
``core/matching.py:text_cut`` ...), measured end to end: one process alternates ``evaluate_frame`` on the offline
benchmark's rows (all seven metrics, ``offline:/lexical``, ``bertscore=False``, ``cache=False``) with the memos as
they are and with every memo made a pass-through (each call works its text out again). Prints the CPU milliseconds
per row of every run and their medians (docs/scaling.md, "Speed tricks on the main path").

    .venv/bin/python benchmarks/text_memo.py --rows 2000 --pairs 4
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from throughput import OFFLINE_METRICS, make_rows

from mlflow_ragjudge import evaluate_frame
from mlflow_ragjudge.core.text import TextMemo


def _pass_through(self: TextMemo, text: str):  # type: ignore[no-untyped-def]
    return self._fn(text)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--pairs", type=int, default=4)
    a = p.parse_args()
    df = make_rows(a.rows)
    cfg = {"judge": "offline:/lexical", "metrics": list(OFFLINE_METRICS), "bertscore": False, "cache": False,
           "progress": False}
    remembered = TextMemo.__call__
    runs: dict[str, list[float]] = {"with the memos": [], "without": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluate_frame(df.head(20), cfg)  # warm-up
        for i in range(a.pairs):
            for name in (list(runs) if i % 2 == 0 else list(runs)[::-1]):  # alternating which goes first
                TextMemo.__call__ = remembered if name == "with the memos" else _pass_through  # type: ignore
                cpu0 = time.process_time()
                evaluate_frame(df, cfg)
                runs[name].append(1000 * (time.process_time() - cpu0) / a.rows)
    TextMemo.__call__ = remembered  # type: ignore[method-assign]
    for name, ms in runs.items():
        print(f"{name:15s} median {statistics.median(ms):.3f} CPU ms/row  runs {[round(x, 3) for x in ms]}")


if __name__ == "__main__":
    main()
