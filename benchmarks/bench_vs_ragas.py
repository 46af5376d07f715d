"""Calls, tokens and wall time per row: mlflow-ragjudge against the real ragas, side by side, offline.

Run by hand from the repository root with the project's environment, after putting ragas in a
separate virtual environment (to keep langchain, instructor and its own openai version out of ours; it
runs in a child process)::

    python3 -m venv /work/venv-ragas
    /work/venv-ragas/bin/pip install "ragas==0.4.3" "langchain-community==0.4.1"
    python benchmarks/bench_vs_ragas.py                      # k = 5 chunks per row
    python benchmarks/bench_vs_ragas.py --k 10               # k = 10
    python benchmarks/bench_vs_ragas.py --ragas-python /path/to/python --json out.json

(``langchain-community`` 0.4.2 dropped ``chat_models.vertexai``, which ``ragas`` 0.4.3 imports at
start-up, hence the pin.)

What it does. One fake OpenAI-compatible server (``tests/fakellm.py``, a real HTTP server) runs in this
process. Both tools talk to it over HTTP with the real ``openai`` SDK:

* ours: ``mlflow_ragjudge.evaluate_frame`` with ``judge="openai:/judge-model?base_url=<server>/v1"``,
  ``embeddings="openai:/emb?base_url=<server>/v1"``, ``cache=False`` (and a fresh ``RAGJUDGE_CACHE_DIR``
  per run, because the embeddings client keeps its own cache);
* ragas: a child process in ragas's venv running this same file with ``--ragas-worker``, through ragas's
  own OpenAI wrappers, ``api_key="sk-fake"``. Two ragas APIs are measured: the **collections** metrics
  (``ragas.metrics.collections``: ``llm_factory`` + ``OpenAIEmbeddings``, the API ragas 0.4 recommends),
  and the deprecated but still common **legacy** ``ragas.evaluate()`` (``LangchainLLMWrapper(ChatOpenAI)``
  + ``LangchainEmbeddingsWrapper``).

The server's handler answers ragas's prompts (routed on the title of the output schema ragas puts in its
prompt, the JSON input block at the end of the prompt parsed for the row's fields) and ours (routed on
substrings of our prompts), from the **same** scripted word-overlap decisions, so both tools get the
same verdicts: statements = the text's sentences; a statement is supported/attributed when half its words
are in the evidence; a chunk is useful when 30 % of the reference's words are in it; answer relevancy's
questions are "What is <6 words of the response>?", and the response is noncommittal when it says
"not sure" or "don't know". Everything each tool sends and receives is counted at the server, per tool and
metric: HTTP requests (chat and embeddings), prompt and completion "tokens" (the fake server's ``usage``
counts whitespace-separated *words*, not BPE tokens: ~1.3 tokens per English word), characters of the
prompt messages, and the bytes of the request bodies (these include JSON schemas sent as
``response_format``, which a provider bills as input too).

Wall time is measured three ways: latency 0 with rows in parallel (each tool's batch API: our
``evaluate_frame``, ragas's ``abatch_score`` / ``evaluate()``), i.e. the client-side CPU cost; and with a
server latency of ``--latency`` seconds (0.2 by default) per request, one row at a time (the time is then
~ requests x latency: the effect of the call count) and rows in parallel (then the longest chain of
*dependent* calls in a row decides).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")
RAGAS_APIS = ("collections", "legacy")
# A warm-up row, scored before the clock starts (imports, SDK clients, connections); its requests carry
# the marker and are left out of every count.
WARMUP_MARKER = "zzwarmup"
WARMUP_ROW = {
    "question": f"{WARMUP_MARKER} what is tested?",
    "answer": f"{WARMUP_MARKER} the warm-up is tested. It runs.",
    "reference": f"{WARMUP_MARKER} the warm-up is tested.",
    "chunks": [f"{WARMUP_MARKER} the warm-up is tested."],
}
DEFAULT_RAGAS_PYTHON = os.environ.get("RAGAS_PYTHON", "/work/venv-ragas/bin/python")

# --------------------------------------------------------------------------- ragas side (ragas's venv)


def _ragas_inputs(metric: str, r: dict[str, Any]) -> dict[str, Any]:
    base = {"user_input": r["question"]}
    if metric == "faithfulness":
        return {**base, "response": r["answer"], "retrieved_contexts": r["chunks"]}
    if metric == "answer_relevancy":
        return {**base, "response": r["answer"]}
    return {**base, "reference": r["reference"], "retrieved_contexts": r["chunks"]}


async def _run_collections(url: str, metric: str, rows: list[dict], mode: str) -> tuple[list[float], float]:
    from openai import AsyncOpenAI
    from ragas.embeddings import OpenAIEmbeddings
    from ragas.llms import llm_factory
    from ragas.metrics import collections as rc

    client = AsyncOpenAI(base_url=url, api_key="sk-fake")
    llm = llm_factory("judge-model", client=client)
    if metric == "faithfulness":
        scorer = rc.Faithfulness(llm=llm)
    elif metric == "answer_relevancy":
        scorer = rc.AnswerRelevancy(llm=llm, embeddings=OpenAIEmbeddings(client=client, model="emb"))
    elif metric == "context_precision":
        scorer = rc.ContextPrecision(llm=llm)
    else:
        scorer = rc.ContextRecall(llm=llm)
    inputs = [_ragas_inputs(metric, r) for r in rows]
    await scorer.ascore(**_ragas_inputs(metric, WARMUP_ROW))
    t0 = time.perf_counter()
    if mode == "seq":
        results = [await scorer.ascore(**i) for i in inputs]
    else:
        results = await scorer.abatch_score(inputs)
    wall = time.perf_counter() - t0
    return [float(x.value) for x in results], wall


def _run_legacy(url: str, metric: str, rows: list[dict], mode: str) -> tuple[list[float], float]:
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    import ragas.metrics as rm
    from langchain_openai import ChatOpenAI
    from langchain_openai import OpenAIEmbeddings as LCEmbeddings
    from ragas import EvaluationDataset, aevaluate
    from ragas.embeddings import LangchainEmbeddingsWrapper
    from ragas.llms import LangchainLLMWrapper
    from ragas.run_config import RunConfig

    llm = LangchainLLMWrapper(ChatOpenAI(model="judge-model", base_url=url, api_key="sk-fake"))
    # check_embedding_ctx_length=False: no tiktoken download (offline); the texts are short anyway
    emb = LangchainEmbeddingsWrapper(LCEmbeddings(model="emb", base_url=url, api_key="sk-fake",
                                                  check_embedding_ctx_length=False))
    scorer = getattr(rm, metric)

    def dataset(rs: list[dict]) -> Any:
        return EvaluationDataset.from_list([_ragas_inputs("context_precision", r) | {"response": r["answer"]}
                                            for r in rs])

    async def both() -> tuple[Any, float]:
        # evaluate() is asyncio.run(aevaluate(...)); the warm-up and the measured run share one event loop
        # because langchain-openai shares one cached async HTTP client across instances, and a connection
        # pooled under an earlier loop fails once and is retried by the SDK (an extra request, ~0.4 s)
        await aevaluate(dataset([WARMUP_ROW]), metrics=[scorer], llm=llm, embeddings=emb, show_progress=False,
                        raise_exceptions=True)
        t0 = time.perf_counter()
        result = await aevaluate(dataset(rows), metrics=[scorer], llm=llm, embeddings=emb, show_progress=False,
                                 raise_exceptions=True, run_config=RunConfig(max_workers=1 if mode == "seq" else 16))
        return result, time.perf_counter() - t0

    result, wall = asyncio.run(both())
    return [float(v) for v in result.to_pandas()[metric].tolist()], wall


def ragas_worker(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--metric", required=True, choices=METRICS)
    ap.add_argument("--rows", required=True, type=Path)
    ap.add_argument("--mode", required=True, choices=("seq", "batch"))
    ap.add_argument("--api", required=True, choices=RAGAS_APIS)
    args = ap.parse_args(argv)
    rows = json.loads(args.rows.read_text())
    if args.api == "collections":
        values, wall = asyncio.run(_run_collections(args.url, args.metric, rows, args.mode))
    else:
        values, wall = _run_legacy(args.url, args.metric, rows, args.mode)
    from importlib.metadata import version

    versions = {p: version(p) for p in ("ragas", "openai", "instructor", "langchain-openai", "langchain-community",
                                         "langchain-core")}
    print("RESULT " + json.dumps({"values": values, "wall": wall, "versions": versions}), flush=True)
    return 0


# --------------------------------------------------------------------------- shared scripted "judge"


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def _overlap(a: str, b: str) -> float:
    wa = _words(a)
    return len(wa & _words(b)) / len(wa) if wa else 0.0


def _sentences(text: str) -> list[str]:
    from mlflow_ragjudge.core.text import split_sentences

    return split_sentences(text)


def supported(statement: str, evidence: str) -> bool:
    return _overlap(statement, evidence) >= 0.5


def useful(reference: str, chunk: str) -> bool:
    return _overlap(reference, chunk) >= 0.3


def questions(response: str, n: int) -> list[str]:
    words = response.split()
    return [f"What is {' '.join(words[i:i + 6])}?" for i in range(n)]


def noncommittal(response: str) -> bool:
    low = response.lower().replace("\u2019", "'")
    return "not sure" in low or "don't know" in low


def _reason(ok: bool, where: str) -> str:
    if ok:
        return f"The statement is stated almost word for word in {where}."
    return "None of the passages mentions this, so the evidence does not back it."


def _section(prompt: str, name: str) -> str:
    """A section's value; values sit between <data-...> fence tags (mlflow_ragjudge.llm.prompts)."""
    m = re.search(rf'(?m)^{re.escape(name)}[^\n]*:\n<(data-[0-9a-f]+) name="\w+">\n(.*?)\n</\1>', prompt, re.S)
    return m.group(2) if m else ""


def _numbered(block: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"(?m)^\[\d+\] (.*)$", block)]


class Judge:
    """Answers both tools' prompts with the same decisions. Not thread-safe on its own: called under a lock."""

    _RAGAS_SCHEMA = re.compile(r'"title": "(\w+)", "type": "object"\}Do not')

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.asked: Counter[str] = Counter()  # answer relevancy: which of the repeated single-question calls
        self.completion_words = 0
        self.unrouted: list[str] = []

    def reset(self) -> None:
        with self.lock:
            self.asked.clear()
            self.completion_words = 0
            self.unrouted.clear()

    def __call__(self, req: Any) -> Any:
        if req.api == "openai_embeddings":
            return None  # the server's hashed bag-of-words vectors, for both tools
        with self.lock:
            text = req.last_user_text
            warmup = WARMUP_MARKER in text
            m = self._RAGAS_SCHEMA.search(text)
            reply = self._ragas(m.group(1), text) if m else self._ours(text)
            if reply is None:
                self.unrouted.append(text[:200])
                reply = {"error": "unexpected prompt"}
            if not warmup:  # a provider bills every one of n choices (legacy ragas asks n = 3 at once)
                self.completion_words += len(json.dumps(reply).split()) * int(req.body.get("n") or 1)
            return reply

    # ragas: the row's fields are the JSON block after the last "input:" of the prompt
    def _ragas(self, schema: str, text: str) -> dict | None:
        start = text.rfind("\ninput: ")
        end = text.rfind("\nOutput:")
        data = json.loads(text[start + len("\ninput: "):end])
        if schema == "StatementGeneratorOutput":
            return {"statements": _sentences(data["answer"])}
        if schema == "NLIStatementOutput":
            ctx = data["context"]
            return {"statements": [{"statement": s, "reason": _reason(supported(s, ctx), "the context"),
                                    "verdict": int(supported(s, ctx))} for s in data["statements"]]}
        if schema in ("ContextPrecisionOutput", "Verification"):
            ok = useful(data["answer"], data["context"])
            return {"reason": _reason(ok, "the context"), "verdict": int(ok)}
        if schema in ("ContextRecallOutput", "ContextRecallClassifications"):
            ctx = data["context"]
            return {"classifications": [
                {"statement": s, "reason": _reason(supported(s, ctx), "the context"),
                 "attributed": int(supported(s, ctx))}
                for s in _sentences(data["answer"])]}
        if schema in ("AnswerRelevanceOutput", "ResponseRelevanceOutput"):
            resp = data["response"]
            i = self.asked[resp] % 3  # ragas asks strictness = 3 times; give the i-th of our 3 questions
            self.asked[resp] += 1
            return {"question": questions(resp, 3)[i], "noncommittal": int(noncommittal(resp))}
        return None

    # ours: the same decisions, on our prompts (see mlflow_ragjudge/llm/prompts)
    @staticmethod
    def _ours(text: str) -> dict | None:
        if "Break the TEXT below" in text:
            return {"statements": _sentences(_section(text, "TEXT"))}
        if "Decide for each numbered CLAIM" in text:
            evidence = _section(text, "EVIDENCE")
            return {"verdicts": [
                {"claim": i, "reason": _reason(supported(c, evidence), "the evidence"),
                 "verdict": "supported" if supported(c, evidence) else "unsupported"}
                for i, c in enumerate(_numbered(_section(text, "CLAIMS")), 1)]}
        if "were retrieved for the QUESTION" in text:
            ref = _section(text, "REFERENCE ANSWER")
            return {"verdicts": [
                {"passage": i, "reason": _reason(useful(ref, p), f"passage {i}"), "relevant": useful(ref, p)}
                for i, p in enumerate(_numbered(_section(text, "PASSAGES")), 1)]}
        if "come from the reference answer" in text:
            ctx = _section(text, "CONTEXT")
            return {"verdicts": [
                {"statement": i, "reason": _reason(supported(s, ctx), "the context"), "attributed": supported(s, ctx)}
                for i, s in enumerate(_numbered(_section(text, "STATEMENTS")), 1)]}
        m = re.search(r"Write (\d+) different questions", text)
        if m:
            resp = _section(text, "RESPONSE")
            return {"questions": questions(resp, int(m.group(1))), "noncommittal": noncommittal(resp)}
        return None


# --------------------------------------------------------------------------- measurement (our venv)


def _count(server: Any, judge: Judge, rows: int) -> dict[str, float]:
    marker = WARMUP_MARKER.encode()
    chat = [r for r in server.requests_for("openai_chat") if marker not in r.raw_body]
    emb = [r for r in server.requests_for("openai_embeddings") if marker not in r.raw_body]
    return {
        "chat_requests": len(chat) / rows,
        "embedding_requests": len(emb) / rows,
        # the fake server's usage: max(1, words of all message contents) per request
        "prompt_tokens": sum(max(1, len(r.prompt_text.split())) for r in chat) / rows,
        "completion_tokens": judge.completion_words / rows,
        "prompt_chars": sum(len(r.prompt_text) for r in chat) / rows,
        "request_bytes": sum(len(r.raw_body) for r in chat) / rows,
        "embedding_tokens": sum(max(1, len(t.split())) for r in emb for t in r.inputs) / rows,
        # requests the openai SDK sent again (both tools use it; it numbers its attempts in this header)
        "sdk_retries": sum(r.headers.get("x-stainless-retry-count", "0") != "0" for r in chat + emb),
    }


def run_ours(url: str, metric: str, rows: list[dict], mode: str, cache_dir: Path) -> tuple[list[float | None], float]:
    import pandas as pd

    from mlflow_ragjudge import evaluate_frame
    from mlflow_ragjudge.llm.client import JudgeClient

    os.environ["RAGJUDGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cache_", dir=cache_dir)
    df = pd.DataFrame([{"question": r["question"], "answer": r["answer"], "reference": r["reference"],
                        "contexts": r["chunks"]} for r in rows])
    uri = f"openai:/judge-model?base_url={url}"
    cfg = {"judge": uri, "metrics": [metric], "cache": False, "embeddings": f"openai:/emb?base_url={url}",
           "progress": False}
    client = JudgeClient(uri, cache=False)
    evaluate_frame(pd.DataFrame([{"question": WARMUP_ROW["question"], "answer": WARMUP_ROW["answer"],
                                  "reference": WARMUP_ROW["reference"], "contexts": WARMUP_ROW["chunks"]}]),
                   cfg, client=client)
    t0 = time.perf_counter()
    if mode == "seq":
        results = [evaluate_frame(df.iloc[[i]].reset_index(drop=True), cfg, client=client).results[metric][0]
                   for i in range(len(df))]
    else:
        results = evaluate_frame(df, cfg, client=client).results[metric]
    wall = time.perf_counter() - t0
    bad = [r for r in results if r.status.value == "failed"]
    if bad:
        raise RuntimeError(f"ours/{metric}: {len(bad)} rows failed: {bad[0].reason} {bad[0].rationale}")
    return [r.value for r in results], wall


def run_ragas(python: str, url: str, metric: str, rows_file: Path, mode: str, api: str) -> tuple[list, float, dict]:
    env = {**os.environ, "RAGAS_DO_NOT_TRACK": "true", "OPENAI_API_KEY": "sk-fake"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [python, str(Path(__file__).resolve()), "--ragas-worker", "--url", url, "--metric", metric,
         "--rows", str(rows_file), "--mode", mode, "--api", api],
        capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=600,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"ragas worker ({api}/{metric}/{mode}) failed, exit {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    out = json.loads(line[len("RESULT "):])
    return out["values"], out["wall"], out["versions"]


def _mean(values: list) -> float | None:
    vals = [v for v in values if v is not None and v == v]
    return sum(vals) / len(vals) if vals else None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_judge_cost import load_rows  # the same padded rows as the simulated comparison
    from fakellm import FakeLLMServer

    import mlflow_ragjudge

    os.environ.setdefault("OPENAI_API_KEY", "sk-fake")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    rows = [{k: r[k] for k in ("question", "answer", "reference", "chunks")} for r in load_rows(args.k)]
    n = len(rows)
    tools = ["ours"] + [f"ragas_{api}" for api in args.ragas_apis]
    from importlib.metadata import version

    out: dict[str, Any] = {"k": args.k, "rows": n, "latency": args.latency, "results": {}, "versions": {
        "mlflow_ragjudge": getattr(mlflow_ragjudge, "__version__", "?"), "openai": version("openai"),
        "python": sys.version.split()[0]}}
    judge = Judge()
    with tempfile.TemporaryDirectory() as tmp, FakeLLMServer() as server:
        rows_file = Path(tmp) / "rows.json"
        rows_file.write_text(json.dumps(rows))
        server.set_handler(judge)
        url = server.openai_base_url
        for metric in args.metrics:
            out["results"][metric] = {}
            for tool in tools:
                fig: dict[str, Any] = {}
                for label, latency, mode in (("batch_l0", 0.0, "batch"), ("seq_lat", args.latency, "seq"),
                                             ("batch_lat", args.latency, "batch")):
                    server.latency = latency
                    server.reset()
                    judge.reset()
                    if tool == "ours":
                        values, wall = run_ours(url, metric, rows, mode, Path(tmp))
                    else:
                        values, wall, versions = run_ragas(args.ragas_python, url, metric, rows_file, mode,
                                                           tool.removeprefix("ragas_"))
                        out["versions"]["ragas_venv"] = versions
                    if server.errors or judge.unrouted:
                        raise RuntimeError(f"{tool}/{metric}: server errors {server.errors[:1]}, "
                                           f"unrouted prompts {judge.unrouted[:1]}")
                    counts = _count(server, judge, n)
                    if counts["sdk_retries"]:
                        raise RuntimeError(f"{tool}/{metric}/{label}: {counts['sdk_retries']} requests were retries")
                    if label == "batch_l0":
                        fig.update(counts)
                        fig["mean_score"] = _mean(values)
                        fig["scores"] = values
                    elif counts["chat_requests"] != fig["chat_requests"]:  # same work whatever the timing
                        raise RuntimeError(f"{tool}/{metric}/{label}: {counts['chat_requests']} chat requests/row "
                                           f"against {fig['chat_requests']} at latency 0")
                    fig[f"wall_{label}"] = wall / n
                out["results"][metric][tool] = fig
                print(f"  {metric:18s} {tool:18s} chat/row {fig['chat_requests']:5.2f}  "
                      f"emb/row {fig['embedding_requests']:4.2f}  prompt tok/row {fig['prompt_tokens']:7.0f}  "
                      f"mean {fig['mean_score'] if fig['mean_score'] is None else round(fig['mean_score'], 3)}",
                      file=sys.stderr, flush=True)
    return out


# --------------------------------------------------------------------------- report


COLUMNS = (
    ("chat_requests", "chat req", "{:.2f}"),
    ("embedding_requests", "emb req", "{:.2f}"),
    ("prompt_tokens", "prompt tok", "{:.0f}"),
    ("completion_tokens", "compl tok", "{:.0f}"),
    ("prompt_chars", "prompt chars", "{:.0f}"),
    ("request_bytes", "req bytes", "{:.0f}"),
    ("wall_batch_l0", "ms, lat 0", "{:.1f}"),
    ("wall_seq_lat", "s, seq", "{:.2f}"),
    ("wall_batch_lat", "s, parallel", "{:.3f}"),
)


def _fmt(key: str, fmt: str, value: float) -> str:
    return fmt.format(value * 1000 if key == "wall_batch_l0" else value)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else ("—" if not a else "∞")


def report(res: dict[str, Any], peer: str) -> str:
    lat = res["latency"]
    lines = [f"{res['rows']} rows, k = {res['k']} chunks per row; tokens = words counted by the fake server; "
             f"per-row figures; 'ms, lat 0' = wall ms per row at latency 0, rows in parallel; 's, seq' = wall s per "
             f"row at {lat} s latency, one row at a time; 's, parallel' = the same with rows in parallel; "
             f"peer = {peer}", ""]
    head = "| metric | tool | " + " | ".join(c[1] for c in COLUMNS) + " | mean score |"
    lines += [head, "|---|---|" + "---:|" * (len(COLUMNS) + 1)]
    totals: dict[str, dict[str, float]] = {}
    for metric, by_tool in res["results"].items():
        for tool in ("ours", peer):
            fig = by_tool[tool]
            t = totals.setdefault(tool, dict.fromkeys((c[0] for c in COLUMNS), 0.0))
            for key, _, _ in COLUMNS:
                t[key] += fig[key]
            score = "—" if fig["mean_score"] is None else f"{fig['mean_score']:.3f}"
            lines.append(f"| {metric} | {'ours' if tool == 'ours' else 'ragas'} | "
                         + " | ".join(_fmt(k, f, fig[k]) for k, _, f in COLUMNS) + f" | {score} |")
        o, g = by_tool["ours"], by_tool[peer]
        lines.append(f"| {metric} | *ours/ragas* | " + " | ".join(_ratio(o[k], g[k]) for k, _, _ in COLUMNS) + " | |")
    label = "all four" if len(res["results"]) == 4 else "total"
    for tool in ("ours", peer):
        lines.append(f"| **{label}** | **{'ours' if tool == 'ours' else 'ragas'}** | "
                     + " | ".join(f"**{_fmt(k, f, totals[tool][k])}**" for k, _, f in COLUMNS) + " | |")
    lines.append(f"| **{label}** | ***ours/ragas*** | "
                 + " | ".join(f"**{_ratio(totals['ours'][k], totals[peer][k])}**" for k, _, _ in COLUMNS) + " | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--ragas-worker"]:
        return ragas_worker(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=5, help="chunks per row (default 5)")
    ap.add_argument("--latency", type=float, default=0.2, help="server latency per request for the timed runs")
    ap.add_argument("--ragas-python", default=DEFAULT_RAGAS_PYTHON,
                    help=f"python of the venv with ragas (default {DEFAULT_RAGAS_PYTHON}, or $RAGAS_PYTHON)")
    ap.add_argument("--ragas-apis", nargs="+", default=list(RAGAS_APIS), choices=RAGAS_APIS)
    ap.add_argument("--metrics", nargs="+", default=list(METRICS), choices=METRICS)
    ap.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    args = ap.parse_args(argv)
    if not Path(args.ragas_python).exists():
        ap.error(f"no python at {args.ragas_python}: create ragas's venv first (see the module docstring)")
    res = measure(args)
    v = res["versions"]
    peer = ", ".join(f"{k} {x}" for k, x in v.get("ragas_venv", {}).items())
    print(f"ours: mlflow-ragjudge {v['mlflow_ragjudge']}, openai {v['openai']}; ragas's venv: {peer}; "
          f"Python {v['python']}\n")
    for api in args.ragas_apis:
        title = ("ragas collections metrics (ragas.metrics.collections, llm_factory)" if api == "collections"
                 else "ragas legacy evaluate() (LangchainLLMWrapper(ChatOpenAI), deprecated in 0.4)")
        print(f"## vs {title}\n")
        print(report(res, f"ragas_{api}") + "\n")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
