"""Variant sweep (SPEC section 1): chunk size x top-k x reranker [x prompt style], one MLflow run per variant.

Every variant of :class:`experiments.toy_rag.ToyRAG` answers the same questions; each is scored by the
``ragjudge`` evaluator (``mlflow.models.evaluate(..., model_type="rag", evaluators="ragjudge")``) with
correctness (E3: the variant's own retriever, queried with question + reference, supplies the judge's
contexts, as seed 000 proposes), retrieval and lexical metrics, and logged as one run under one experiment
with the variant's settings as ``variant.*`` params. A comparison table sorted by the headline metric is
printed at the end.

Offline by default: the judge is ``offline:/lexical`` (the offline judge: calibrated lexical evidence, not an
LLM) and the generator
is the extractive stand-in. Numbers produced that way exercise the pipeline; they are not LLM measurements.

    python -m experiments.sweep_variants --quick
    python -m experiments.sweep_variants --judge openai:/gpt-4o-mini --generator openai:/gpt-4o-mini
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file (python experiments/sweep_variants.py): make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from experiments.contract import MAX_CONTEXTS, MAX_DOC_TOKENS, is_refusal  # noqa: E402
from experiments.rag_prompts import STYLES, prompt_version  # noqa: E402
from experiments.scenarios import retrieval_dataset  # noqa: E402
from experiments.text_utils import approx_tokens  # noqa: E402
from experiments.toy_rag import (  # noqa: E402
    CoverageReranker,
    Document,
    ExtractiveGenerator,
    Generator,
    LLMGenerator,
    ToyRAG,
    load_sample_corpus,
    load_sample_questions,
)
from mlflow_ragjudge.backends import Backend  # noqa: E402

__all__ = ["FULL_GRID", "QUICK_GRID", "Variant", "build_grid", "format_table", "main", "run_variant", "sweep"]

DEFAULT_EXPERIMENT = "ragjudge-variant-sweep"
DEFAULT_JUDGE = "offline:/lexical"
HEADLINE = "correctness/mean"
EVAL_COLUMNS = ["question", "answer", "reference", "contexts", "retrieved_doc_ids", "relevant_doc_ids", "group"]
TABLE_METRICS = [
    "correctness/mean",
    "correctness/abstain_rate",
    "map/mean",
    "recall_at_3/mean",
    "mrr/mean",
    "context_rougeL_recall/mean",
    "rougeL/mean",
    "rag/not_found_rate",
    "rag/format_adherence_rate",  # LLM generators only
    "rag/generation_error_rate",  # LLM generators only
]


@dataclass(frozen=True)
class Variant:
    """One configuration of the toy RAG system."""

    chunk_size: int
    overlap: int
    top_k: int
    reranker: bool
    prompt_style: str | None = None  # only with an LLM generator

    @property
    def name(self) -> str:
        out = f"chunk={self.chunk_size}/{self.overlap} k={self.top_k} rerank={'on' if self.reranker else 'off'}"
        return out + (f" style={self.prompt_style}" if self.prompt_style else "")

    def params(self) -> dict[str, Any]:
        p: dict[str, Any] = {
            "variant.name": self.name,
            "variant.chunk_size": self.chunk_size,
            "variant.chunk_overlap": self.overlap,
            "variant.top_k": self.top_k,
            "variant.reranker": CoverageReranker.name if self.reranker else "none",
            "variant.retriever": "bm25",
        }
        if self.prompt_style:
            p["variant.prompt_style"] = self.prompt_style
            p["variant.prompt_version"] = prompt_version(self.prompt_style)
        return p


def build_grid(
    chunk_sizes: Sequence[int],
    top_ks: Sequence[int],
    rerankers: Sequence[bool],
    styles: Sequence[str | None] = (None,),
    overlap_ratio: float = 0.25,
) -> list[Variant]:
    """The cross product; each chunk size overlaps its neighbour by ``int(chunk_size * overlap_ratio)`` tokens."""
    if not 0 <= overlap_ratio < 1:
        raise ValueError(f"overlap_ratio={overlap_ratio} must be in [0, 1).")
    return [
        Variant(cs, int(cs * overlap_ratio), k, rr, st)
        for cs, k, rr, st in itertools.product(chunk_sizes, top_ks, rerankers, styles)
    ]


FULL_GRID = build_grid(chunk_sizes=(8, 16, 64), top_ks=(1, 3), rerankers=(False, True))
QUICK_GRID = [Variant(64, 16, 3, False), Variant(8, 2, 1, True)]


def _generator(spec: str | Backend, style: str | None, structured: bool, cache: bool) -> Generator:
    if isinstance(spec, str) and spec == "extractive":
        return ExtractiveGenerator()
    return LLMGenerator(spec, style or "zero_shot", structured=structured and style != "cot", cache=cache)


def run_variant(
    variant: Variant,
    corpus: Sequence[Document],
    questions: pd.DataFrame,
    *,
    judge: str | None = DEFAULT_JUDGE,
    generator: str | Backend = "extractive",
    structured: bool = False,
    bertscore: bool = False,
    cache: bool = True,
) -> dict[str, Any]:
    """Answer the questions with one variant and log one MLflow run (in the current experiment).

    Returns a row of the comparison table: the variant's settings, its run id and its metrics.
    """
    import mlflow

    if not (isinstance(generator, str) and generator == "extractive") and variant.prompt_style is None:
        variant = replace(variant, prompt_style="zero_shot")  # an LLM generator always runs some prompt style
    rag = ToyRAG(
        corpus,
        chunk_size=variant.chunk_size,
        overlap=variant.overlap,
        top_k=variant.top_k,
        reranker=CoverageReranker() if variant.reranker else None,
        generator=_generator(generator, variant.prompt_style, structured, cache),
    )
    t0 = time.perf_counter()
    df = rag.run(questions)
    gen_seconds = time.perf_counter() - t0
    failed = df["generation_error"].astype(bool)
    if failed.all():  # nothing to evaluate: stop before logging a run of empty answers
        raise ValueError(f"The generator failed on every question of {variant.name}: {df['generation_error'].iloc[0]}")
    metrics = ["retrieval", "lexical"] + (["correctness"] if judge else [])
    config: dict[str, Any] = {"metrics": metrics, "bertscore": bertscore, "cache": cache, "progress": False}
    if judge:
        config.update(judge=judge, retriever=rag.retrieve_texts, context_mode="reference")
    not_found = df["answer"].map(lambda a: bool(a) and is_refusal(a))
    extra = {
        "rag/not_found_rate": float(not_found.mean()),
        "rag/chunks_in_index": float(len(rag.chunks)),
        "rag/mean_context_tokens": float(df["contexts"].map(lambda cs: sum(approx_tokens(c) for c in cs)).mean()),
        "rag/generation_seconds": round(gen_seconds, 4),
    }
    generator_name = generator if isinstance(generator, str) else generator.uri
    if generator_name != "extractive":
        extra["rag/format_adherence_rate"] = float(df["format_ok"].fillna(False).astype(bool).mean())
        extra["rag/generation_error_rate"] = float(failed.mean())
    with mlflow.start_run(run_name=variant.name) as run:
        mlflow.log_params(
            {**variant.params(), "variant.generator": generator_name, "variant.corpus_docs": len(corpus),
             "variant.questions": len(questions)}
        )
        mlflow.set_tags(
            {
                "ragjudge.experiment": "variant-sweep",
                "offline_stand_ins": str(generator_name == "extractive"
                                         or (judge or "").startswith("offline:")).lower(),
            }
        )
        result = mlflow.models.evaluate(
            data=df[EVAL_COLUMNS],
            predictions="answer",
            targets="reference",
            model_type="rag",
            evaluators="ragjudge",
            evaluator_config=config,
        )
        mlflow.log_metrics(extra)
        outputs = df[["question", "answer", "retrieved_doc_ids", "chunk_ids", "relevant_doc_ids"]].copy()
        outputs["relevant_doc_ids"] = outputs["relevant_doc_ids"].map(lambda v: json.dumps(v))
        mlflow.log_table(outputs, artifact_file="variant/outputs.json")
    row: dict[str, Any] = {"variant": variant.name, "chunk": variant.chunk_size, "overlap": variant.overlap,
                           "k": variant.top_k, "rerank": "on" if variant.reranker else "off"}
    if variant.prompt_style:
        row["style"] = variant.prompt_style
    row.update({m: {**result.metrics, **extra}.get(m) for m in TABLE_METRICS})
    row["run_id"] = run.info.run_id
    return row


def sweep(
    variants: Sequence[Variant],
    *,
    corpus: Sequence[Document] | None = None,
    questions: pd.DataFrame | None = None,
    judge: str | None = DEFAULT_JUDGE,
    generator: str | Backend = "extractive",
    experiment: str = DEFAULT_EXPERIMENT,
    tracking_uri: str | None = None,
    headline: str = HEADLINE,
    structured: bool = False,
    bertscore: bool = False,
    cache: bool = True,
    progress: bool = False,
) -> pd.DataFrame:
    """Run every variant (one MLflow run each) and return the comparison table, best ``headline`` first.

    ``corpus``/``questions`` default to the package's bundled sample. ``tracking_uri`` None keeps MLflow's
    current one. Ties on the headline are broken by ``map/mean``, then by the variant name.
    """
    import mlflow

    if not variants:
        raise ValueError("No variants to run: give at least one chunk size, top-k and reranker setting.")
    if not (isinstance(generator, str) and generator == "extractive"):  # the LLM input contract, checked up front
        too_many = sorted({v.top_k for v in variants if v.top_k > MAX_CONTEXTS})
        too_long = sorted({v.chunk_size for v in variants if v.chunk_size > MAX_DOC_TOKENS})
        if too_many or too_long:
            raise ValueError(
                f"An LLM generator takes at most {MAX_CONTEXTS} contexts of at most {MAX_DOC_TOKENS} tokens (the "
                f"input contract); top_k {too_many} / chunk_size {too_long} exceed it: lower them."
            )
    corpus = list(corpus) if corpus is not None else load_sample_corpus()
    questions = questions if questions is not None else load_sample_questions()
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment)
    rows = []
    for i, v in enumerate(variants, 1):
        if progress:
            print(f"[{i}/{len(variants)}] {v.name}", file=sys.stderr, flush=True)
        rows.append(
            run_variant(v, corpus, questions, judge=judge, generator=generator, structured=structured,
                        bertscore=bertscore, cache=cache)
        )
    table = pd.DataFrame(rows)
    if headline not in table.columns:
        raise ValueError(f"headline={headline!r} is not a table column; use one of {TABLE_METRICS}.")
    keys = [headline, "map/mean", "variant"]
    return table.sort_values(keys, ascending=[False, False, True], na_position="last", kind="stable").reset_index(
        drop=True
    )


def format_table(table: pd.DataFrame) -> str:
    """A fixed-width text table (metrics to 3 decimals, run ids to 8 characters)."""
    shown = table.drop(columns=["variant"]).dropna(axis=1, how="all").copy()
    shown["run_id"] = shown["run_id"].str[:8]
    rename = {m: m.replace("/mean", "").replace("_rate", "") for m in TABLE_METRICS}
    return shown.rename(columns=rename).to_string(index=False, float_format=lambda x: f"{x:.3f}", na_rep="-")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _bools(text: str) -> list[bool]:
    table = {"on": True, "off": False, "true": True, "false": False}
    try:
        return [table[x.strip().lower()] for x in text.split(",") if x.strip()]
    except KeyError as e:
        raise SystemExit(f"error: --rerankers takes on/off values, got {e.args[0]!r}") from None


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.sweep_variants",
        description="Run the toy RAG over a grid of variants; log one MLflow run per variant; print a table.",
    )
    p.add_argument("--judge", default=DEFAULT_JUDGE,
                   help="judge URI for correctness, or 'none' (default: offline:/lexical, the offline judge, "
                        "not an LLM)")
    p.add_argument("--generator", default="extractive",
                   help="'extractive' (offline stand-in, default) or an LLM URI such as openai:/gpt-4o-mini")
    p.add_argument("--styles", default=",".join(STYLES),
                   help=f"prompt styles to sweep with an LLM generator (default: {','.join(STYLES)})")
    p.add_argument("--structured", action="store_true",
                   help="ask the LLM generator for the contract JSON schema (zero_shot/few_shot; cot stays free text)")
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    p.add_argument("--tracking-uri",
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///experiments.db)")
    p.add_argument("--quick", action="store_true", help="a 2-variant grid instead of the full one")
    p.add_argument("--chunk-sizes", default="8,16,64", help="tokens per chunk (default 8,16,64)")
    p.add_argument("--top-ks", default="1,3", help="chunks retrieved (default 1,3)")
    p.add_argument("--rerankers", default="off,on", help="reranker settings (default off,on)")
    p.add_argument("--overlap-ratio", type=float, default=0.25, help="chunk overlap / chunk size (default 0.25)")
    p.add_argument("--dataset", choices=("sample", "aurora"), default="sample",
                   help="'sample': the package's bundled 10-document corpus and 8 questions (default); 'aurora': "
                        "the prompt-optimisation corpus (11 English documents, one a ~1,300-token log) and its 7 "
                        "answerable English questions")
    p.add_argument("--corpus", help="a JSON file {doc_id: text} (overrides --dataset)")
    p.add_argument("--questions",
                   help="a JSONL file with question, reference, relevant_doc_ids[, group] (default: the bundled "
                        "sample questions)")
    p.add_argument("--headline", default=HEADLINE, help=f"metric to sort by (default {HEADLINE})")
    p.add_argument("--bertscore", action="store_true", help="also compute BERTScore (needs the local model)")
    p.add_argument("--no-cache", action="store_true", help="do not use the judge-call cache")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    args = _build_parser().parse_args(argv)
    judge = None if args.judge.lower() == "none" else args.judge
    llm = args.generator != "extractive"
    styles: list[str | None] = [s.strip() for s in args.styles.split(",") if s.strip()] if llm else [None]
    bad = [s for s in styles if s is not None and s not in STYLES]
    if bad:
        print(f"error: unknown prompt style(s) {bad}; use {', '.join(STYLES)}", file=sys.stderr)
        return 2
    if args.quick:
        variants = [Variant(v.chunk_size, v.overlap, v.top_k, v.reranker, st) for v in QUICK_GRID for st in styles]
    else:
        variants = build_grid(_ints(args.chunk_sizes), _ints(args.top_ks), _bools(args.rerankers), styles,
                              args.overlap_ratio)
    corpus: list[Document] | None = None
    questions: pd.DataFrame | None = None
    if args.dataset == "aurora":
        docs, rows = retrieval_dataset()
        corpus, questions = [Document(k, v) for k, v in docs.items()], pd.DataFrame(rows)
    if args.corpus:
        data = json.loads(Path(args.corpus).read_text(encoding="utf-8"))
        corpus = [Document(str(k), str(v)) for k, v in data.items()]
    if args.questions:
        questions = pd.read_json(args.questions, lines=True, dtype=False)
    if questions is not None and "group" not in questions.columns:
        questions["group"] = "all"
    tracking = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///experiments.db"
    try:
        table = sweep(variants, corpus=corpus, questions=questions, judge=judge, generator=args.generator,
                      experiment=args.experiment, tracking_uri=tracking, headline=args.headline,
                      structured=args.structured, bertscore=args.bertscore, cache=not args.no_cache, progress=True)
    except (ValueError, RuntimeError) as e:  # includes mlflow_ragjudge.InputError
        print(f"error: {e}", file=sys.stderr)
        return 2
    stand_ins = [x for x, on in (("offline judge offline:/lexical", (judge or "").startswith("offline:")),
                                 ("extractive generator", not llm)) if on]
    print(f"{len(table)} variants on {args.corpus or args.dataset}, sorted by {args.headline} "
          f"(experiment {args.experiment!r} at {tracking})")
    if stand_ins:
        print(f"offline stand-ins: {', '.join(stand_ins)} - these numbers are not LLM measurements")
    print(format_table(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
