"""CPU per row of the retrieval metric alone through ``evaluate_frame`` (one process, no LLM): the path that makes
28 results per labelled row (``JudgeResult.scored_each``, docs/scaling.md "Speed tricks on the main path").

Run from the repository root, alternating two trees (the package is imported from the path given)::

    for i in 1 2 3 4 5; do
        python benchmarks/bench_retrieval_rows.py /path/to/tree-a 20000
        python benchmarks/bench_retrieval_rows.py /path/to/tree-b 20000
    done

Rows are synthetic and seeded: 20 retrieved ids each, 4 gold ids (3 of them retrieved). Printed: process CPU
milliseconds per row of the ``evaluate_frame`` call (imports and row building not counted).
"""

from __future__ import annotations

import random
import sys
import time


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    import pandas as pd

    from mlflow_ragjudge import evaluate_frame

    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    rng = random.Random(0)
    rows = []
    for i in range(n):
        retrieved = [f"d{rng.randrange(5000)}" for _ in range(20)]
        rows.append({"question": f"q{i}", "retrieved_doc_ids": retrieved,
                     "relevant_doc_ids": rng.sample(retrieved, 3) + [f"d{rng.randrange(5000)}"]})
    frame = pd.DataFrame(rows)
    started = time.process_time()
    evaluate_frame(frame, metrics=["retrieval"])
    print(f"{sys.argv[1]}: {1000 * (time.process_time() - started) / n:.4f} CPU ms per row")


if __name__ == "__main__":
    main()
