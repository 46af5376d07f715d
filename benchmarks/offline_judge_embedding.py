"""Does embedding evidence help the offline judge? A measurement, not a shipped feature.

Adds one feature -- the cosine similarity of the response and the acceptable answer under the local MiniLM
(the ``local`` extra) -- to the offline judge's correctness model, refits on random halves of the public data
exactly as ``python -m tools.offline_judge report --splits`` does, and prints the held-out NQ301 agreement and the MTRAG
correctness / completeness Spearman with and without it. Needs torch (the ``local`` extra) and ../shared/data::

    .venv/bin/python benchmarks/offline_judge_embedding.py --data ../shared/data --splits 20
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tools/ (the fit and the public data's readers) is beside the package, not in it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--splits", type=int, default=20)
    args = ap.parse_args()

    from scipy import stats

    import mlflow_ragjudge.metrics.offline as offline
    import tools.offline_judge.fit as fit
    from mlflow_ragjudge.metrics.lexical import LocalEmbedder
    from tools.offline_judge.public_data import load_mtrag, load_nq301

    nq, m = load_nq301(args.data), load_mtrag(args.data)
    embedder = LocalEmbedder.load()
    texts = sorted({*nq["answer"], *(r for refs in nq["references"] for r in refs), *m["response"], *m["reference"]})
    vectors = dict(zip(texts, (np.asarray(v) for v in embedder.embed(texts))))
    plain = offline.answer_features

    def with_embedding(question: str, response: str, answer: str, contexts: Any = ()) -> dict[str, float] | None:
        f = plain(question, response, answer, contexts)
        if f is not None:
            a, b = vectors.get(response), vectors.get(answer)
            f["embedding"] = float(a @ b) if a is not None and b is not None else 0.0
        return f

    def measure(features: tuple[str, ...], long_features: tuple[str, ...]) -> dict[str, float]:
        rng = np.random.default_rng(0)
        qids, tids = sorted(nq["question_id"].unique()), sorted(m["task_id"].unique())
        cache: dict[str, Any] = {}
        agree, spear = [], []
        for _ in range(args.splits):
            nq_fit = set(rng.choice(qids, len(qids) // 2, replace=False))
            m_fit = set(rng.choice(tids, len(tids) // 2, replace=False))
            cal = fit.fit_calibration(nq, m, nq_fit=nq_fit, m_fit=m_fit, features=features,
                                      long_features=long_features, _cache=cache)
            judge = offline.OfflineJudge(cal)
            ho = nq[~nq["question_id"].isin(nq_fit)]
            got = [(res := judge.correctness(r.question, r.answer, list(r.references))).is_scored
                   and res.value >= 4 for r in ho.itertuples()]
            agree.append(float(np.mean(np.array(got) == ho["human"].to_numpy())))
            mh = m[~m["task_id"].isin(m_fit)]
            pairs = [(res.value, c) for r, c in zip(mh.itertuples(), mh["completeness"])
                     if (res := judge.correctness(r.question, r.response, [r.reference], r.passages)).is_scored]
            spear.append(float(stats.spearmanr(*zip(*pairs)).statistic))
        return {"nq301_agreement": float(np.mean(agree)), "mtrag_correctness_completeness": float(np.mean(spear))}

    base = fit.USED
    print(f"{args.splits} random halves, held-out means")
    print("lexical features only:        ", measure(base, fit.LONG_USED))
    from mlflow_ragjudge.metrics import correctness

    # the judge (correctness's offline scorer) and the fit read it from their modules
    correctness.answer_features = fit.answer_features = with_embedding
    print("plus MiniLM cosine similarity:", measure((*base, "embedding"), (*fit.LONG_USED, "embedding")))


if __name__ == "__main__":
    main()
