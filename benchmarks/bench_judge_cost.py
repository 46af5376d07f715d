"""Calls and tokens per row of the claim-based judges, against ragas's published call pattern.

Run by hand (offline: a local fake LLM server answers; no key, no network)::

    python benchmarks/bench_judge_cost.py              # the 8 sample rows, 5 chunks per row
    python benchmarks/bench_judge_cost.py --k 10       # 10 chunks per row
    python benchmarks/bench_judge_cost.py --json out.json

What is measured. Every judge runs on every row of ``mlflow_ragjudge/data/sample_rag.jsonl`` through the
real ``openai`` SDK against ``tests/fakellm.py`` (cache off), and the script records the chat requests
that reach the server and the prompt/completion token counts the server reports in ``usage``. The fake
server counts *whitespace-separated words*, not BPE tokens: English prose is about 1.3 tokens per word
with OpenAI's tokenizers, so multiply by ~1.3 for real tokens. The replies come from the independent
schema-following model of the tests (``tests/compliant_model.py``: it follows the JSON schema a request carries and
never reads our wording), so the completion sizes are of the right shape but not a real model's length. (Until
2026-11-27 a scripted word-overlap judge that routed on our prompts' wording answered here; it broke when the
passages were fenced one by one.) Each row's contexts are padded to ``--k`` chunks
with distractor passages from the other rows (k is what context precision's cost depends on).

The ragas column follows ragas's published design (``ragas/metrics/collections/*/metric.py``): two calls
for faithfulness (statements, then one NLI call over all of them), one call *per chunk* for context
precision, ``strictness = 3`` separate calls of one question each for answer relevancy, one call for
context recall (reference sentences classified directly) and for context relevance. It is measured by
running *our* prompts in ragas's call pattern (one chunk per context-precision call, three single-question
calls for answer relevancy, reference sentences without an extraction call for context recall), so the
difference is the call pattern alone. ragas's own prompts add few-shot examples to every call, which this
does not count: its real token figures are higher still.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from compliant_model import CompliantModel  # noqa: E402
from fakellm import FakeLLMServer  # noqa: E402

from mlflow_ragjudge.core.text import split_sentences  # noqa: E402
from mlflow_ragjudge.llm.backends import ChatRequest, JsonSchema  # noqa: E402
from mlflow_ragjudge.llm.client import JudgeClient  # noqa: E402
from mlflow_ragjudge.metrics import ContextPrecisionJudge, ContextRecallJudge, ContextRelevanceJudge  # noqa: E402
from mlflow_ragjudge.metrics.answer_relevancy import AnswerRelevancyJudge  # noqa: E402
from mlflow_ragjudge.metrics.faithfulness import FaithfulnessJudge  # noqa: E402
from mlflow_ragjudge.metrics.statements import StatementExtractor  # noqa: E402

DATA = ROOT / "mlflow_ragjudge" / "data" / "sample_rag.jsonl"
METRICS = ("faithfulness", "answer_relevancy", "context_precision", "context_recall", "context_relevance")


# --------------------------------------------------------------------------- a scripted overlap "judge"


# --------------------------------------------------------------------------- measurement


def load_rows(k: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    pool = [c for r in rows for c in r["contexts"]]
    for i, r in enumerate(rows):
        ctx = list(r["contexts"])[:k]
        j = i
        while len(ctx) < k:  # distractors from the other rows, deterministic
            j = (j + 1) % len(pool)
            if pool[j] not in ctx:
                ctx.append(pool[j])
        r["chunks"] = ctx
    return rows


def measure(server: FakeLLMServer, uri: str, run_row: Callable[[JudgeClient, dict], None], rows: list[dict]) -> dict:
    server.reset()
    client = JudgeClient(uri, cache=False)
    for row in rows:
        run_row(client, row)
    n = len(rows)
    chat = len(server.requests_for("openai_chat"))
    embeds = len(server.requests_for("openai_embeddings"))
    return {
        "rows": n,
        "requests_per_row": chat / n,
        "embedding_requests_per_row": embeds / n,
        "prompt_tokens_per_row": client.usage.input_tokens / n,
        "completion_tokens_per_row": client.usage.output_tokens / n,
    }


def ours(metric: str) -> Callable[[JudgeClient, dict], None]:
    def run(client: JudgeClient, r: dict) -> None:
        if metric == "faithfulness":
            res = FaithfulnessJudge(client).judge(r["question"], r["answer"], r["chunks"])
        elif metric == "answer_relevancy":
            res = AnswerRelevancyJudge(client, embed=client.embed).judge(r["question"], r["answer"])
        elif metric == "context_precision":
            res = ContextPrecisionJudge(client).judge(r["question"], r["reference"], r["chunks"])
        elif metric == "context_recall":
            res = ContextRecallJudge(client).judge(r["question"], r["reference"], r["chunks"])
        else:
            res = ContextRelevanceJudge(client).judge(r["question"], r["chunks"])
        if not res.is_scored:
            raise RuntimeError(f"{metric} did not score a row: {res.reason} {res.rationale}")

    return run


def ragas_pattern(metric: str) -> Callable[[JudgeClient, dict], None]:
    """Our prompts, ragas's call pattern."""

    def run(client: JudgeClient, r: dict) -> None:
        if metric == "faithfulness":  # ragas: statements, then one NLI call -- the same pattern
            FaithfulnessJudge(client).judge(r["question"], r["answer"], r["chunks"])
        elif metric == "answer_relevancy":  # ragas: strictness=3 calls of one question each, then 2 embeddings
            judge = AnswerRelevancyJudge(client, embed=client.embed, n=1)
            questions: list[str] = []
            for _ in range(3):
                request = ChatRequest.of(judge._messages(r["answer"]), max_tokens=judge.max_tokens,  # noqa: SLF001
                                         json_schema=JsonSchema("answer_relevancy_questions", judge.call_schema()))
                call = client.call(request, parse=judge._parse, purpose="ragas_pattern")  # noqa: SLF001
                questions += call.parsed["questions"] if call.ok else []
            client.embed([r["question"]])
            client.embed(questions)
        elif metric == "context_precision":  # ragas: one call per retrieved chunk
            judge = ContextPrecisionJudge(client)
            for chunk in r["chunks"]:
                judge.judge(r["question"], r["reference"], [chunk])
        elif metric == "context_recall":  # ragas: reference sentences classified in one call, no extraction
            judge = ContextRecallJudge(client)
            statements = split_sentences(r["reference"])
            messages = judge._messages(r["question"], statements, r["chunks"])  # noqa: SLF001 - bench only
            client.call(ChatRequest.of(messages, max_tokens=2048,
                                       json_schema=JsonSchema("context_recall_verdicts", judge.schema)),
                        purpose="ragas_pattern")
        else:
            ContextRelevanceJudge(client).judge(r["question"], r["chunks"])

    return run


def sweep_recall(server: FakeLLMServer, uri: str, rows: list[dict], variants: int) -> dict[str, float]:
    """Context recall over ``variants`` retriever variants that share each row's reference.

    Ours: one extraction per distinct (question, reference), sent once by the de-duplicating client (as every
    evaluation builds it), plus one attribution call per variant. ragas's pattern: one call per variant.
    """
    out = {}
    for name in ("ours", "ragas_pattern"):
        server.reset()
        client = JudgeClient(uri, cache=False, dedupe=True)  # as the evaluator and the scorers build it
        extractor = StatementExtractor(client)
        for v in range(variants):
            for r in rows:
                chunks = r["chunks"][v % len(r["chunks"]):] + r["chunks"][: v % len(r["chunks"])]
                if name == "ours":
                    ContextRecallJudge(client, extractor=extractor).judge(r["question"], r["reference"], chunks)
                else:
                    ragas_pattern("context_recall")(client, {**r, "chunks": chunks})
        out[name] = len(server.requests_for("openai_chat")) / (len(rows) * variants)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=5, help="chunks per row (default 5)")
    ap.add_argument("--variants", type=int, default=3, help="variants sharing a reference, for the sweep line")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    rows = load_rows(args.k)
    results: dict[str, dict[str, dict]] = {}
    with FakeLLMServer() as server:
        server.set_handler(CompliantModel("json_schema"))
        os.environ["OPENAI_API_KEY"] = "sk-bench-not-a-real-key"
        uri = f"openai:/judge-model?base_url={server.openai_base_url}"
        for metric in METRICS:
            results[metric] = {
                "ours": measure(server, uri, ours(metric), rows),
                "ragas_pattern": measure(server, uri, ragas_pattern(metric), rows),
            }
        sweep = sweep_recall(server, uri, rows, args.variants)
    print(f"{len(rows)} rows, k = {args.k} chunks per row; tokens = words counted by the fake server\n")
    print("| metric | requests/row ours | requests/row ragas | prompt tok/row ours | prompt tok/row ragas "
          "| completion tok/row ours | completion tok/row ragas |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    total = {"ours": [0.0, 0.0, 0.0], "ragas_pattern": [0.0, 0.0, 0.0]}
    for metric, pair in results.items():
        o, g = pair["ours"], pair["ragas_pattern"]
        for key, fig in (("ours", o), ("ragas_pattern", g)):
            total[key][0] += fig["requests_per_row"]
            total[key][1] += fig["prompt_tokens_per_row"]
            total[key][2] += fig["completion_tokens_per_row"]
        print(f"| {metric} | {o['requests_per_row']:.2f} | {g['requests_per_row']:.2f} | "
              f"{o['prompt_tokens_per_row']:.0f} | {g['prompt_tokens_per_row']:.0f} | "
              f"{o['completion_tokens_per_row']:.0f} | {g['completion_tokens_per_row']:.0f} |")
    o, g = total["ours"], total["ragas_pattern"]
    print(f"| **all five** | **{o[0]:.2f}** | **{g[0]:.2f}** | **{o[1]:.0f}** | **{g[1]:.0f}** | "
          f"**{o[2]:.0f}** | **{g[2]:.0f}** |")
    ar = results["answer_relevancy"]
    print(f"\nanswer_relevancy embedding requests/row: ours {ar['ours']['embedding_requests_per_row']:.2f}, "
          f"ragas pattern {ar['ragas_pattern']['embedding_requests_per_row']:.2f}")
    print(f"context_recall in a sweep of {args.variants} variants sharing the reference, requests per row and "
          f"variant: ours {sweep['ours']:.2f}, ragas pattern {sweep['ragas_pattern']:.2f}")
    if args.json:
        payload = {"k": args.k, "rows": len(rows), "results": results, "context_recall_sweep": sweep}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
