"""The engine's garbage-collector tuning (``engine/collector.py:results_kept_frozen``), measured end to end: one process
alternates ``evaluate_frame`` on the offline benchmark's rows (all seven metrics, ``offline:/lexical``,
``bertscore=False``, ``cache=False``) with the tuning as it is and with it replaced by a context that does nothing.
Prints the CPU milliseconds per row of every run and their medians (docs/scaling.md, "The garbage collector during
scoring").

    .venv/bin/python benchmarks/gc_freeze.py --rows 2000 --pairs 6      # about a minute on an idle 2-core host
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings
from collections.abc import Callable, Iterator

from throughput import OFFLINE_METRICS, make_rows

import mlflow_ragjudge.engine.schedule as schedule
from mlflow_ragjudge import evaluate_frame


@contextlib.contextmanager
def _no_freezing() -> Iterator[Callable[[], None]]:
    yield lambda: None


def alternate(rows: int, pairs: int, variants: dict[str, Callable[[], None]]) -> None:
    """``evaluate_frame`` on ``rows`` of the offline rows, ``pairs`` times under each variant (each a function that
    switches the package to it), alternating which goes first; prints each variant's CPU ms per row."""
    df = make_rows(rows)
    cfg = {"judge": "offline:/lexical", "metrics": list(OFFLINE_METRICS), "bertscore": False, "cache": False,
           "progress": False}
    runs: dict[str, list[float]] = {name: [] for name in variants}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluate_frame(df.head(20), cfg)  # warm-up
        for i in range(pairs):
            for name in (list(runs) if i % 2 == 0 else list(runs)[::-1]):  # alternating which goes first
                variants[name]()
                cpu0 = time.process_time()
                evaluate_frame(df, cfg)
                runs[name].append(1000 * (time.process_time() - cpu0) / rows)
    for name, ms in runs.items():
        print(f"{name:16s} median {statistics.median(ms):.3f} CPU ms/row  runs {[round(x, 3) for x in ms]}")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--pairs", type=int, default=6)
    a = p.parse_args()
    tuned = schedule.results_kept_frozen

    def use(kept: Callable[..., contextlib.AbstractContextManager[Callable[[], None]]]) -> Callable[[], None]:
        return lambda: setattr(schedule, "results_kept_frozen", kept)

    try:
        alternate(a.rows, a.pairs, {"with the tuning": use(tuned), "without": use(_no_freezing)})
    finally:
        schedule.results_kept_frozen = tuned  # type: ignore[assignment]


if __name__ == "__main__":
    main()
