"""Which retrieval settings answer best? A variant sweep of a RAG system's chunking, top-k and reranker.

An example to copy: it uses only the public API (``mlflow_ragjudge.sweep`` and the bundled example RAG system,
``mlflow_ragjudge.workflows.example_rag``). Replace ``example_rag.answer`` with your own pipeline,
``pipeline(question, **params) -> {"answer", "contexts", "retrieved_doc_ids", "citations"}``, and the grid with
your own parameters.

::

    python experiments/retrieval_sweep.py                       # 12 variants, the bundled sample, offline judge
    python experiments/retrieval_sweep.py --dataset aurora      # the Aurora-3 corpus (experiments/data)
    python experiments/retrieval_sweep.py --quick               # 3 variants
    python experiments/retrieval_sweep.py --judge openai:/gpt-4o-mini --generator openai:/gpt-4o-mini

Without ``--judge`` the judge is the offline judge (``offline:/lexical``, not an LLM) and without
``--generator`` the example system answers extractively (it copies context sentences: not an LLM either); the
summary says so. Each variant is a child run of one parent run, which holds the paired comparison against the
baseline (the first variant).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import pandas as pd

import mlflow_ragjudge as rj
from mlflow_ragjudge.workflows import example_rag

DATA = Path(__file__).resolve().parent / "data"
GRID = {"chunk_size": [64, 16, 8], "top_k": [3, 1], "reranker": ["off", "coverage"]}
QUICK = [{"chunk_size": 64, "top_k": 3}, {"chunk_size": 16, "top_k": 1}, {"chunk_size": 8, "top_k": 1}]


def aurora() -> tuple[str, pd.DataFrame]:
    """The Aurora-3 corpus and its answerable English questions, with the documents their answers rest on as
    ``relevant_doc_ids`` and the scenario kind as ``group``."""
    rows = pd.read_json(DATA / "aurora_scenarios.jsonl", lines=True, dtype=False)
    rows = rows[(rows["language"] == "en") & rows["answerable"]]
    questions = rows[["question", "reference", "relevant_doc_ids"]].assign(group=rows["kind"]).reset_index(drop=True)
    return str(DATA / "aurora_corpus.json"), questions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=["sample", "aurora"], default="sample")
    ap.add_argument("--quick", action="store_true", help="three variants instead of the 12 of the grid")
    ap.add_argument("--judge", default=rj.DEFAULT_OFFLINE_JUDGE, help="judge URI (default: the offline judge)")
    ap.add_argument("--generator", default="extractive", help="'extractive' (not an LLM) or a model URI")
    ap.add_argument("--experiment", default="ragjudge-retrieval-sweep")
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else ./mlruns)")
    args = ap.parse_args(argv)

    if args.dataset == "aurora":
        corpus, questions = aurora()
    else:
        corpus, questions = None, example_rag.sample_questions()
    # the pipeline: the example system on this corpus, answered by this generator
    pipeline = functools.partial(example_rag.answer, corpus=corpus, generator=args.generator)
    retriever = functools.partial(example_rag.retrieve, corpus=corpus)
    result = rj.sweep(pipeline, QUICK if args.quick else GRID, questions, retriever=retriever,
                      evaluator_config={"judge": args.judge, "bertscore": False, "progress": False},
                      experiment=args.experiment, tracking_uri=args.tracking_uri,
                      data_name=f"{args.dataset}-questions", verbose=True)
    print(result.summary())
    if args.generator == "extractive":
        print("generator: extractive (copies context sentences; not an LLM)")
    print()
    print(table(result))
    return 0


#: the columns of the table in docs/experiments.md: (header, metric)
COLUMNS = (("correctness", "correctness/mean"), ("abstain", "correctness/abstain_rate"),
           ("faithfulness", "faithfulness/mean"), ("context precision", "context_precision/mean"),
           ("context recall", "context_recall/mean"), ("map", "map/mean"), ("recall@3", "recall_at_3/mean"),
           ("ctx ROUGE-L recall", "context_rougeL_recall/mean"))


def table(result: rj.SweepResult) -> str:
    """Each variant's headline means as a Markdown table (the one in docs/experiments.md)."""
    head = "| chunk | k | rerank | " + " | ".join(h for h, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (3 + len(COLUMNS))]
    for name, params in result.variants.items():
        out = result.outputs.get(name)
        cells = [f"{out.metrics[m]:.3f}" if out is not None and m in out.metrics else "-" for _, m in COLUMNS]
        lines.append(f"| {params.get('chunk_size')} | {params.get('top_k')} | {params.get('reranker', 'off')} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
