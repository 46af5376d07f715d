"""Speed of mlflow_ragjudge's retrieval metrics against ranx, pytrec_eval and ir-measures.

Run by hand (the peers are dev-only dependencies, not package requirements)::

    pip install ranx pytrec-eval-terrier ir-measures
    python benchmarks/bench_retrieval.py                      # 100,000 queries x 100 retrieved ids
    python benchmarks/bench_retrieval.py --queries 2000       # a quick look

Workload: synthetic, seeded. Each query retrieves ``--depth`` distinct string ids (ranked best first) from a
pool of one million documents and has 1-10 gold documents with grades 1-3, about half of them among the
retrieved. Every tool computes the same measures: P@{1,3,5,10}, recall@{1,3,5,10}, MAP, MRR (reciprocal
rank) and nDCG@10, and their means over the queries.

The input is what a ``retrieved_doc_ids`` / ``relevant_doc_ids`` DataFrame holds: a ranked list of ids and
a dict id -> grade per query. The peers want ``{query: {doc: score}}`` dicts, so their *total* time
includes building those (scores ``depth - rank``, no ties); the *compute* column is the time after the
conversion. ranx compiles with numba on first use; a warm-up call is made first and not timed. ranx runs
on all cores (numba threads); everything else is single-threaded. mlflow_ragjudge computes more than is
asked (F1, hit rate, nDCG at every k, full nDCG) and validates every row first.

Before timing, the per-query values of every tool are compared with ours on the first ``--sample`` queries
and the largest absolute difference per tool is printed.
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlflow_ragjudge.metrics.retrieval import aggregate_queries, score_queries, score_query  # noqa: E402

KS = (1, 3, 5, 10)
# Our metric name -> (pytrec_eval name, ranx name, ir_measures name).
MEASURES: dict[str, tuple[str, str, str]] = {
    **{f"precision_at_{k}": (f"P_{k}", f"precision@{k}", f"P@{k}") for k in KS},
    **{f"recall_at_{k}": (f"recall_{k}", f"recall@{k}", f"R@{k}") for k in KS},
    "map": ("map", "map", "AP"),
    "mrr": ("recip_rank", "mrr", "RR"),
    "ndcg_at_10": ("ndcg_cut_10", "ndcg@10", "nDCG@10"),
}

Data = tuple[list[list[str]], list[dict[str, int]]]


def make_data(num_queries: int, depth: int, seed: int) -> Data:
    """Return seeded synthetic rankings (distinct ids, best first) and graded gold ids per query."""
    rng = random.Random(seed)
    retrieved: list[list[str]] = []
    relevant: list[dict[str, int]] = []
    for _ in range(num_queries):
        ranking: list[str] = []
        seen: set[str] = set()
        while len(ranking) < depth:
            doc = f"d{rng.randrange(1_000_000)}"
            if doc not in seen:
                seen.add(doc)
                ranking.append(doc)
        gold: dict[str, int] = {}
        for _ in range(rng.randint(1, 10)):
            doc = ranking[rng.randrange(depth)] if rng.random() < 0.5 else f"d{rng.randrange(1_000_000)}"
            gold[doc] = rng.randint(1, 3)
        retrieved.append(ranking)
        relevant.append(gold)
    return retrieved, relevant


def to_trec_dicts(data: Data) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    """Convert ranked lists to the peers' ``{query: {doc: grade}}`` and ``{query: {doc: score}}``."""
    retrieved, relevant = data
    qrels = {f"q{i}": gold for i, gold in enumerate(relevant)}
    run = {
        f"q{i}": {doc: float(len(ranking) - r) for r, doc in enumerate(ranking)}
        for i, ranking in enumerate(retrieved)
    }
    return qrels, run


# ---------------------------------------------------------------------------------------------------------
# One function per tool: (data) -> (means, seconds spent after converting the input)
# ---------------------------------------------------------------------------------------------------------


def ours_per_query(data: Data) -> tuple[dict[str, float], float]:
    retrieved, relevant = data
    per_query = [score_query(r, g, ks=KS) for r, g in zip(retrieved, relevant, strict=True)]
    return aggregate_queries(per_query), float("nan")


def ours_batch(data: Data) -> tuple[dict[str, float], float]:
    retrieved, relevant = data
    return aggregate_queries(score_queries(retrieved, relevant, ks=KS)), float("nan")


def pytrec_eval_tool(data: Data) -> tuple[dict[str, float], float]:
    import pytrec_eval

    qrels, run = to_trec_dicts(data)
    start = time.perf_counter()
    evaluator = pytrec_eval.RelevanceEvaluator(
        qrels, {"P.1,3,5,10", "recall.1,3,5,10", "map", "recip_rank", "ndcg_cut.10"}
    )
    per_query = evaluator.evaluate(run)
    means = {
        ours: sum(q[names[0]] for q in per_query.values()) / len(per_query)
        for ours, names in MEASURES.items()
    }
    return means, time.perf_counter() - start


def ranx_tool(data: Data) -> tuple[dict[str, float], float]:
    from ranx import Qrels, Run, evaluate

    qrels, run = to_trec_dicts(data)
    start = time.perf_counter()
    results = evaluate(Qrels(qrels), Run(run), [names[1] for names in MEASURES.values()])
    assert isinstance(results, dict)
    return {ours: float(results[names[1]]) for ours, names in MEASURES.items()}, time.perf_counter() - start


def ir_measures_tool(data: Data) -> tuple[dict[str, float], float]:
    import ir_measures

    qrels, run = to_trec_dicts(data)
    start = time.perf_counter()
    measures = [ir_measures.parse_measure(names[2]) for names in MEASURES.values()]
    results = ir_measures.calc_aggregate(measures, qrels, run)
    by_name = {str(measure): value for measure, value in results.items()}
    return {ours: float(by_name[names[2]]) for ours, names in MEASURES.items()}, time.perf_counter() - start


def warm_up_ranx() -> None:
    from ranx import Qrels, Run, evaluate

    evaluate(Qrels({"q": {"a": 1}}), Run({"q": {"a": 1.0, "b": 0.5}}), [n[1] for n in MEASURES.values()])


# ---------------------------------------------------------------------------------------------------------
# Per-query agreement on a sample
# ---------------------------------------------------------------------------------------------------------


def per_query_peers(data: Data, available: set[str]) -> dict[str, dict[str, dict[str, float]]]:
    """Return tool -> query -> our metric name -> value, for each available peer."""
    qrels, run = to_trec_dicts(data)
    out: dict[str, dict[str, dict[str, float]]] = {}
    if "pytrec_eval" in available:
        import pytrec_eval

        evaluator = pytrec_eval.RelevanceEvaluator(
            qrels, {"P.1,3,5,10", "recall.1,3,5,10", "map", "recip_rank", "ndcg_cut.10"}
        )
        got = evaluator.evaluate(run)
        out["pytrec_eval"] = {q: {ours: got[q][names[0]] for ours, names in MEASURES.items()} for q in got}
    if "ranx" in available:
        from ranx import Qrels, Run, evaluate

        ranx_run = Run(run)
        evaluate(Qrels(qrels), ranx_run, [names[1] for names in MEASURES.values()])
        out["ranx"] = {
            q: {ours: float(ranx_run.scores[names[1]][q]) for ours, names in MEASURES.items()} for q in qrels
        }
    if "ir_measures" in available:
        import ir_measures

        wanted = {names[2]: ours for ours, names in MEASURES.items()}
        measures = [ir_measures.parse_measure(name) for name in wanted]
        table: dict[str, dict[str, float]] = {}
        for metric in ir_measures.iter_calc(measures, qrels, run):
            table.setdefault(metric.query_id, {})[wanted[str(metric.measure)]] = float(metric.value)
        out["ir_measures"] = table
    return out


def check_agreement(data: Data, available: set[str]) -> dict[str, float]:
    """Return tool -> largest absolute per-query difference from ours over every compared measure."""
    retrieved, relevant = data
    ours = {
        f"q{i}": score_query(r, g, ks=KS) for i, (r, g) in enumerate(zip(retrieved, relevant, strict=True))
    }
    worst: dict[str, float] = {}
    for tool, table in per_query_peers(data, available).items():
        worst[tool] = max(abs(ours[q][name] - table[q][name]) for q in ours for name in MEASURES)
    return worst


# ---------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------


def time_tool(
    fn: Callable[[Data], tuple[dict[str, float], float]], data: Data, repeat: int
) -> tuple[float, float, dict[str, float]]:
    best_total, best_compute = float("inf"), float("inf")
    means: dict[str, float] = {}
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        means, compute = fn(data)
        best_total = min(best_total, time.perf_counter() - start)
        if compute == compute:  # NaN: the tool has no separate conversion step
            best_compute = min(best_compute, compute)
    return best_total, best_compute, means


DISTRIBUTIONS = {
    "pytrec_eval": ("pytrec-eval-terrier", "pytrec-eval"),
    "ranx": ("ranx",),
    "ir_measures": ("ir-measures",),
}


def _version(module: str) -> str:
    from importlib import metadata

    for distribution in DISTRIBUTIONS[module]:
        try:
            return f"{distribution} {metadata.version(distribution)}"
        except metadata.PackageNotFoundError:
            continue
    return f"{module} (version unknown)"


def available_peers() -> tuple[set[str], list[str]]:
    found: set[str] = set()
    missing: list[str] = []
    for name in ("pytrec_eval", "ranx", "ir_measures"):
        try:
            __import__(name)
        except ImportError as error:
            missing.append(f"{name} ({error})")
        else:
            found.add(name)
    return found, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--depth", type=int, default=100, help="retrieved ids per query")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="best of this many timed runs per tool")
    parser.add_argument("--sample", type=int, default=2000, help="queries compared per query with each peer")
    args = parser.parse_args(argv)

    found, missing = available_peers()
    print(f"python {platform.python_version()} on {platform.machine()}, {platform.processor() or 'cpu'}")
    for name in sorted(found):
        print(f"  {_version(name)}")
    for line in missing:
        print(f"  skipped, not installed: {line}")

    start = time.perf_counter()
    data = make_data(args.queries, args.depth, args.seed)
    print(
        f"data: {args.queries:,} queries x {args.depth} retrieved ids, seed {args.seed} "
        f"(made in {time.perf_counter() - start:.1f}s)"
    )

    sample = (data[0][: args.sample], data[1][: args.sample])
    if "ranx" in found:
        warm_up_ranx()
    for tool, diff in check_agreement(sample, found).items():
        print(f"agreement on {len(sample[0]):,} queries: max |ours - {tool}| = {diff:.3g}")

    tools: list[tuple[str, Callable[[Data], tuple[dict[str, float], float]], bool]] = [
        ("mlflow_ragjudge score_query (per query)", ours_per_query, False),
        ("mlflow_ragjudge score_queries (batch)", ours_batch, False),
    ]
    tools += [
        (name, fn, True)
        for name, fn in [
            ("pytrec_eval", pytrec_eval_tool),
            ("ranx", ranx_tool),
            ("ir_measures", ir_measures_tool),
        ]
        if name in found
    ]

    rows: list[tuple[str, float, float, bool]] = []
    reference: dict[str, float] | None = None
    for name, fn, is_peer in tools:
        total, compute, means = time_tool(fn, data, args.repeat)
        if reference is None:
            reference = means
        else:
            worst = max(abs(means[m] - reference[m]) for m in MEASURES)
            if worst > 1e-9:
                print(f"WARNING: {name}'s means differ from ours by up to {worst:.3g}")
        rows.append((name, total, compute, is_peer))
        print(f"  timed {name}: {total:.2f}s", flush=True)

    fastest_total = min((total for _, total, _, is_peer in rows if is_peer), default=float("nan"))
    fastest_compute = min((compute for _, _, compute, is_peer in rows if is_peer), default=float("nan"))
    print()
    print(
        "| tool | total (s) | compute only (s) | total / fastest peer's total "
        "| total / fastest peer's compute only |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, total, compute, _ in rows:
        compute_text = "-" if compute == float("inf") else f"{compute:.2f}"
        print(
            f"| {name} | {total:.2f} | {compute_text} | {total / fastest_total:.2f} "
            f"| {total / fastest_compute:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
