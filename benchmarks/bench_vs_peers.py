"""mlflow-ragjudge side by side with ragas 0.4.3, deepeval 4.3.1 and MLflow 3.17.2's own genai judges on one
independent fake LLM server.

Run by hand from the repository root, after ``bash benchmarks/setup_peers.sh`` (the peers' venvs)::

    .venv/bin/python benchmarks/bench_vs_peers.py --quick --json /tmp/peers_quick.json   # smoke check, minutes
    .venv/bin/python benchmarks/bench_vs_peers.py --scenarios a b d --json /tmp/peers.json
    .venv/bin/python benchmarks/bench_vs_peers.py --scenarios c --json /tmp/peers_c.json    # ours only
    .venv/bin/python benchmarks/bench_vs_peers.py --scenarios a b --ks 5 --seeds 0 1 2 3 4 --tools ours mlflow \
        --no-variants --json /tmp/ab.json     # ours against MLflow's genai judges: defaults, fault mix x 5 seeds
    .venv/bin/python benchmarks/bench_vs_peers.py --scenarios c --c-peers ...                # peers too

What runs. This process starts ``tests/fakellm.py``'s ``FakeLLMServer`` (a real HTTP server speaking the
OpenAI API, in a thread here) whose handler is ``tests/compliant_model.py``'s ``CompliantModel``: an
independent model that fills whatever JSON schema the request carries (``response_format``, a tool's
``parameters``, or a schema written in the prompt; ``prompt_schema_too=True``: when both are there with the
same fields, the prompt's, which may fix the item counts), numbers list items the way a numbered list asks,
and (``example_json=True``) answers a prompt that shows no schema but an example JSON object with an object
of the same keys. It never looks at any tool's prompt wording. Embeddings are the server's hashed bag-of-words
vectors. Each tool then runs in a child process with its own venv's python (this same file with
``--worker TOOL``), pointed at the server over HTTP, at its defaults:

* ours: ``mlflow_ragjudge.evaluate_frame(df, judge="openai:/judge-model?base_url=<server>/v1",
  embeddings="openai:/emb?base_url=<server>/v1", metrics=[the four], cache=False)`` (scenario d: ``cache=``
  a temporary folder), everything else at defaults (8 calls in flight, 6 attempts, 60 s timeout). Its
  embeddings client keeps its own cache in ``$RAGJUDGE_CACHE_DIR``: each run gets a fresh, empty one;
* ragas: the collections metrics (``ragas.metrics.collections``: Faithfulness, AnswerRelevancy,
  ContextPrecision, ContextRecall) with ``llm_factory("judge-model", client=AsyncOpenAI(base_url=...))``
  and ``ragas.embeddings.OpenAIEmbeddings(client=..., model="emb")``, each metric's rows scored with its batch
  API ``abatch_score`` (one metric after the other);
* deepeval: ``FaithfulnessMetric``, ``AnswerRelevancyMetric``, ``ContextualPrecisionMetric``,
  ``ContextualRecallMetric`` with ``model=OpenAIModel(base_url=<server>/v1, api_key=...)`` (deepeval's
  documented way to use an OpenAI-compatible endpoint; no model name, so deepeval's default model name,
  whose capability table makes it send a JSON schema), through ``deepeval.evaluate`` at default configs
  (``AsyncConfig``: 20 test cases at once; ``ErrorConfig``: an error stops the run);
* mlflow: MLflow's built-in genai scorers that measure what our four metrics measure -- ``RetrievalGroundedness``
  (faithfulness), ``RelevanceToQuery`` (answer relevancy), ``RetrievalRelevance`` (context precision: a yes/no
  per retrieved chunk, its ``/precision`` the share of yes) and ``RetrievalSufficiency`` (context recall) --
  with ``model="openai:/judge-model"`` and ``OPENAI_API_BASE`` pointing at the server, through
  ``mlflow.genai.evaluate(data, predict_fn, scorers)`` as MLflow documents it: ``predict_fn`` is a traced RAG app
  whose RETRIEVER span returns the row's contexts, the expectations carry the reference, the run is logged to a
  SQLite store in the run's folder; everything else at its defaults (its own thread pools and retries). Its
  yes/no values count as 1/0; the timed call includes its tracing and logging, which is what a user waits for.

The workers run with telemetry off (``DEEPEVAL_TELEMETRY_OPT_OUT=YES``, ``RAGAS_DO_NOT_TRACK=true``,
``MLFLOW_DISABLE_TELEMETRY=true``, ``DO_NOT_TRACK=1``) and with ``HTTP(S)_PROXY`` set to a local sink that
counts and refuses any connection to a host other than 127.0.0.1: an attempt to reach the internet shows
up in the report as ``outbound``.

Counted at the server, per run: chat and embedding requests, prompt "tokens" (the fake server's usage counts
whitespace-separated words of the messages, ~1.3 BPE tokens per English word), prompt characters, HTTP
429s; measured in the worker: wall time of the scoring call (imports and start-up excluded; the process's
total is reported too); rows lost = rows without a finite score for every one of the four metrics.

Scenarios: a) k=5 and k=10 chunks, 40 rows, 200 ms latency, and ours on one row of them: the critical path
(the dependent calls of a row one after the other, and what the run does around them), measured; b) fault mix:
per request a seeded RNG answers 10 % HTTP 500, hangs 2 % for 30 s before answering, and answers 5 % of chat
requests with a malformed reply (half of them prose where JSON was asked, half the real reply cut off at 20-80 %
of its length) (same seed and mix for every tool; ``--seeds 0 1 2 3 4`` runs every tool once per seed and sums
up), 40 rows, k=5 -- plus, for the peers, the one-switch variants that keep going on errors (deepeval
``ErrorConfig(ignore_errors=True)``, ragas ``asyncio.gather(..., return_exceptions=True)`` over ``ascore``);
c) a 600 requests/min server limit (``rate_limit_per_minute``, a 60 s sliding window, ``retry-after`` on a 429),
240 rows: ours at defaults (nothing configured) against a server that announces its budget on every reply
(``x-ratelimit-*-requests``, as OpenAI does) and one that does not, and ours with ``requests_per_minute=600``
against the one that does not: the share of the limit used and the 429s; d) ours run twice with the same
persistent cache: requests sent by the second run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
METRICS_FOUR = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")
#: ``--metric-set six`` (ours and MLflow only): our six judged metrics against six of MLflow's built-in judges
METRICS_SIX = (*METRICS_FOUR, "correctness", "context_relevance")
METRICS = METRICS_FOUR  # the set of this run (main, and each worker from its spec)
TOOLS = ("ours", "ragas", "deepeval", "mlflow")
PEERS_DIR = Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "ragjudge-peers"))
DEFAULT_PYTHONS = {
    "ours": str(ROOT / ".venv" / "bin" / "python"),
    "ragas": os.environ.get("RAGAS_PYTHON", str(PEERS_DIR / "ragas" / "bin" / "python")),
    "deepeval": os.environ.get("DEEPEVAL_PYTHON", str(PEERS_DIR / "deepeval" / "bin" / "python")),
    "mlflow": os.environ.get("MLFLOW_PEER_PYTHON", str(PEERS_DIR / "mlflow" / "bin" / "python")),
}
QUIET_ENV = {
    "DEEPEVAL_TELEMETRY_OPT_OUT": "YES",
    "DEEPEVAL_NO_INSPECT_PROMPT": "1",  # no "inspect the run?" question at the end of deepeval.evaluate
    "DEEPEVAL_UPDATE_WARNING_OPT_IN": "NO",
    "RAGAS_DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_MODEL_CATALOG_URI": "",  # or MLflow's judges look up a model catalog on the internet first
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OPENAI_API_KEY": "sk-fake",
    "PYTHONUNBUFFERED": "1",
}

# --------------------------------------------------------------------------- synthetic rows (stdlib only)

_PLACES = ("Arden", "Belmont", "Corvel", "Dunmore", "Elsworth", "Fairhaven", "Glenrock", "Harwick", "Istra",
           "Jasper Bay", "Kellin", "Lorwood", "Marlow", "Northgate", "Orrin", "Pellham", "Quarry Hill", "Ravensby")
_KINDS = ("bridge", "library", "observatory", "canal", "museum", "railway station", "lighthouse", "university",
          "botanical garden", "dam", "cathedral", "market hall")
_PEOPLE = ("Ada Morrell", "Bruno Castell", "Clara Wendt", "Dmitri Volkov", "Elena Sato", "Felix Arnaud",
           "Greta Lind", "Hugo Brandt", "Ines Moreau", "Jonas Ek", "Karin Holm", "Luis Ortega")
_MATERIALS = ("granite", "red brick", "limestone", "steel", "oak", "sandstone", "concrete", "cast iron")
_FACTS = (
    "It was restored after a flood in {y2}.",
    "Its main hall seats {n} people.",
    "A festival is held there every {month}.",
    "The city council took it over in {y2}.",
    "Visitors can tour it on weekends.",
    "It appears on the town's coat of arms.",
    "Around {n} visitors come each year.",
    "Its roof was replaced in {y2}.",
)
_MONTHS = ("March", "May", "June", "September", "October", "December")


def _entity(rng: random.Random) -> dict[str, Any]:
    year = rng.randint(1780, 1990)
    return {"place": rng.choice(_PLACES), "kind": rng.choice(_KINDS), "person": rng.choice(_PEOPLE),
            "year": year, "y2": year + rng.randint(15, 30), "material": rng.choice(_MATERIALS),
            "n": rng.choice((120, 450, 800, 1500, 3000, 12000)), "month": rng.choice(_MONTHS)}


def _facts(e: dict[str, Any], rng: random.Random, count: int) -> list[str]:
    base = [f"The {e['kind']} of {e['place']} was built in {e['year']}.",
            f"It was designed by {e['person']}.",
            f"The {e['kind']} is made of {e['material']}."]
    extra = [f.format(**e) for f in rng.sample(_FACTS, len(_FACTS))]
    return (base + extra)[:count]


def make_rows(n: int, k: int, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` deterministic rows: question, an answer of 2-4 sentences, a reference, ``k`` contexts."""
    rng = random.Random(f"{seed}:{n}:{k}")
    rows = []
    for i in range(n):
        e = _entity(rng)
        question = rng.choice((f"When was the {e['kind']} of {e['place']} built, and who designed it?",
                               f"Who designed the {e['kind']} in {e['place']} and what is it made of?",
                               f"What do we know about the history of the {e['kind']} in {e['place']}?"))
        truth = _facts(e, rng, 5)
        reference = " ".join(truth[:3])
        answer_sents = truth[: rng.randint(1, 3)]
        if rng.random() < 0.4:  # some answers add a claim no context supports
            answer_sents.append(f"It was later moved to {rng.choice(_PLACES)}.")
        while len(answer_sents) < 2:
            answer_sents.append(truth[len(answer_sents)])
        answer = " ".join(answer_sents[:4])
        relevant = rng.sample(range(k), min(k, rng.randint(1, 2)))
        contexts = []
        for j in range(k):
            if j in relevant:
                sents = rng.sample(truth, rng.randint(2, 4))
            else:  # a passage about another landmark
                sents = _facts(_entity(rng), rng, rng.randint(2, 4))
            contexts.append(" ".join(sents))
        rows.append({"id": f"row{i}", "question": question, "answer": answer, "reference": reference,
                     "contexts": contexts})
    return rows


# --------------------------------------------------------------------------- workers (each in its tool's venv)


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _worker_ours(spec: dict[str, Any]) -> dict[str, Any]:
    import pandas as pd

    import mlflow_ragjudge
    from mlflow_ragjudge import evaluate_frame

    url = spec["url"]
    rows = spec["rows"]
    df = pd.DataFrame([{k: r[k] for k in ("question", "answer", "reference", "contexts")} for r in rows])
    t0 = time.perf_counter()
    extra = {"requests_per_minute": float(spec["variant"][3:])} if str(spec.get("variant")).startswith("rpm") else {}
    out = evaluate_frame(df, judge=f"openai:/judge-model?base_url={url}", embeddings=f"openai:/emb?base_url={url}",
                         metrics=list(METRICS), cache=spec.get("cache", False), **extra)
    wall = time.perf_counter() - t0
    scores: dict[str, list[float | None]] = {}
    reasons: dict[str, int] = {}
    examples: dict[str, str] = {}
    abstained: dict[str, list[int]] = {}
    for m in METRICS:
        res = out.results[m]
        scores[m] = [_finite(r.value) if r.status.value == "scored" else None for r in res]
        # the judge's "not sure" (correctness level 0) is the model's answer, not a row lost to the run
        abstained[m] = [i for i, r in enumerate(res) if r.status.value == "abstained"]
        for r in res:
            if r.status.value not in ("scored", "abstained"):
                key = f"{m}:{r.status.value}:{getattr(r.reason, 'value', r.reason)}"
                reasons[key] = reasons.get(key, 0) + 1
                examples.setdefault(key, str(r.rationale)[:400])
    usage = out.config.get("usage", {})
    by_metric = {m: {k: round(v, 3) for k, v in u.items()}
                 for m, u in (out.config.get("usage_by_metric") or {}).items()}
    return {"scores": scores, "abstained": abstained, "wall": wall, "failures": reasons,
            "failure_examples": examples, "package_file": mlflow_ragjudge.__file__,
            "tool_usage": {k: usage.get(k) for k in ("requests", "calls", "cache_hits", "input_tokens",
                                                        "output_tokens", "retries") if k in usage},
            "usage_by_metric": by_metric,
            "versions": {"mlflow_ragjudge": mlflow_ragjudge.__version__, **_versions("openai", "pandas")}}


def _ragas_inputs(metric: str, r: dict[str, Any]) -> dict[str, Any]:
    if metric == "faithfulness":
        return {"user_input": r["question"], "response": r["answer"], "retrieved_contexts": r["contexts"]}
    if metric == "answer_relevancy":
        return {"user_input": r["question"], "response": r["answer"]}
    return {"user_input": r["question"], "reference": r["reference"], "retrieved_contexts": r["contexts"]}


def _worker_ragas(spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    from openai import AsyncOpenAI
    from ragas.embeddings import OpenAIEmbeddings
    from ragas.llms import llm_factory
    from ragas.metrics import collections as rc

    rows = spec["rows"]
    keep_going = spec.get("variant") == "return_exceptions"

    async def run() -> tuple[dict[str, list[float | None]], dict[str, int], float]:
        client = AsyncOpenAI(base_url=spec["url"], api_key="sk-fake")
        llm = llm_factory("judge-model", client=client)
        emb = OpenAIEmbeddings(client=client, model="emb")
        scorers = {"faithfulness": rc.Faithfulness(llm=llm),
                   "answer_relevancy": rc.AnswerRelevancy(llm=llm, embeddings=emb),
                   "context_precision": rc.ContextPrecision(llm=llm),
                   "context_recall": rc.ContextRecall(llm=llm)}
        scores: dict[str, list[float | None]] = {}
        errors: dict[str, int] = {}
        t0 = time.perf_counter()
        for m in METRICS:
            inputs = [_ragas_inputs(m, r) for r in rows]
            if keep_going:
                got = await asyncio.gather(*(scorers[m].ascore(**i) for i in inputs), return_exceptions=True)
                scores[m] = []
                for g in got:
                    if isinstance(g, BaseException):
                        key = f"{m}:{type(g).__name__}"
                        errors[key] = errors.get(key, 0) + 1
                        scores[m].append(None)
                    else:
                        scores[m].append(_finite(g.value))
                continue
            try:
                got = await scorers[m].abatch_score(inputs)
            except Exception as e:  # noqa: BLE001 - the batch API fails whole: every row of the metric is lost
                errors[f"{m}:{type(e).__name__}: {str(e)[:160]}"] = len(rows)
                scores[m] = [None] * len(rows)
            else:
                scores[m] = [_finite(g.value) for g in got]
        return scores, errors, time.perf_counter() - t0

    scores, errors, wall = asyncio.run(run())
    return {"scores": scores, "wall": wall, "failures": errors,
            "versions": _versions("ragas", "openai", "instructor", "langchain-core", "langchain-community")}


def _worker_deepeval(spec: dict[str, Any]) -> dict[str, Any]:
    from deepeval import evaluate
    from deepeval.evaluate.configs import ErrorConfig
    from deepeval.metrics import (
        AnswerRelevancyMetric,
        ContextualPrecisionMetric,
        ContextualRecallMetric,
        FaithfulnessMetric,
    )
    from deepeval.models import OpenAIModel
    from deepeval.test_case import LLMTestCase

    rows = spec["rows"]
    model_kw = {"model": spec["deepeval_model"]} if spec.get("deepeval_model") else {}
    model = OpenAIModel(base_url=spec["url"], api_key="sk-fake", **model_kw)
    metrics = {"faithfulness": FaithfulnessMetric(model=model),
               "answer_relevancy": AnswerRelevancyMetric(model=model),
               "context_precision": ContextualPrecisionMetric(model=model),
               "context_recall": ContextualRecallMetric(model=model)}
    by_name = {metric.__name__: m for m, metric in metrics.items()}
    cases = [LLMTestCase(name=r["id"], input=r["question"], actual_output=r["answer"], expected_output=r["reference"],
                         retrieval_context=r["contexts"]) for r in rows]
    kwargs: dict[str, Any] = {}
    if spec.get("variant") == "ignore_errors":
        kwargs["error_config"] = ErrorConfig(ignore_errors=True)
    scores = {m: [None] * len(rows) for m in METRICS}
    errors: dict[str, int] = {}
    t0 = time.perf_counter()
    try:
        result = evaluate(test_cases=cases, metrics=list(metrics.values()), **kwargs)
    except Exception as e:  # noqa: BLE001 - deepeval's default ErrorConfig stops the run at the first error
        wall = time.perf_counter() - t0
        errors[f"evaluate:{type(e).__name__}: {str(e)[:160]}"] = len(rows)
    else:
        wall = time.perf_counter() - t0
        index = {r["id"]: i for i, r in enumerate(rows)}
        for tr in result.test_results:
            i = index[tr.name]
            for md in tr.metrics_data or []:
                m = by_name.get(md.name)
                if m is None:
                    continue
                if md.error:
                    key = f"{m}:{md.error[:80]}"
                    errors[key] = errors.get(key, 0) + 1
                scores[m][i] = None if md.error else _finite(md.score)
    return {"scores": scores, "wall": wall, "failures": errors, "model": model.get_model_name(),
            "versions": _versions("deepeval", "openai", "pydantic", "tenacity")}


#: MLflow's built-in genai scorers that measure what our four metrics measure (scenario "mlflow"): each a yes/no
#: judge per row (RetrievalRelevance: per retrieved chunk, its "/precision" the share of yes), mapped to 1.0/0.0
MLFLOW_SCORERS = {"faithfulness": "RetrievalGroundedness", "answer_relevancy": "RelevanceToQuery",
                  "context_precision": "RetrievalRelevance", "context_recall": "RetrievalSufficiency"}
MLFLOW_VALUE_COLUMNS = {"faithfulness": "retrieval_groundedness", "answer_relevancy": "relevance_to_query",
                        "context_precision": "retrieval_relevance/precision",
                        "context_recall": "retrieval_sufficiency"}
#: ``--metric-set six``: MLflow's six single-turn built-ins that read a RAG row. MLflow has one judge of each
#: passage's relevance (RetrievalRelevance), which stands for our context relevance here; our context precision
#: (is each passage useful for the reference answer?) has no built-in counterpart, so the sixth is Completeness
#: (does the answer address every part of the question?), one of MLflow's shortest judge prompts -- the cheaper
#: side of the choice for MLflow, so the token comparison does not flatter us.
MLFLOW_SCORERS_SIX = {"faithfulness": "RetrievalGroundedness", "answer_relevancy": "RelevanceToQuery",
                      "context_relevance": "RetrievalRelevance", "context_recall": "RetrievalSufficiency",
                      "correctness": "Correctness", "completeness": "Completeness"}
MLFLOW_VALUE_COLUMNS_SIX = {**MLFLOW_VALUE_COLUMNS, "context_relevance": "retrieval_relevance/precision",
                            "correctness": "correctness", "completeness": "completeness"}


def _worker_mlflow(spec: dict[str, Any]) -> dict[str, Any]:
    """MLflow's own judges the way its docs use them: ``mlflow.genai.evaluate(data, predict_fn, scorers)`` where
    ``predict_fn`` is a traced RAG app whose RETRIEVER span returns the row's contexts, judge
    ``openai:/judge-model`` with ``OPENAI_API_BASE`` pointing at the server, everything else at its defaults."""
    os.environ["OPENAI_API_BASE"] = spec["url"]
    import mlflow
    import mlflow.genai.scorers as ms
    from mlflow.entities import Document, SpanType

    rows = spec["rows"]
    mlflow.set_tracking_uri(f"sqlite:///{Path.cwd() / 'mlflow.db'}")
    mlflow.set_experiment("bench-mlflow-genai")
    by_id = {r["id"]: r for r in rows}

    @mlflow.trace(span_type=SpanType.CHAIN)
    def rag_app(question: str, row_id: str) -> str:
        row = by_id[row_id]
        with mlflow.start_span(name="retrieve", span_type=SpanType.RETRIEVER) as span:
            span.set_inputs({"query": question})
            span.set_outputs([Document(page_content=c, metadata={"doc_uri": f"{row_id}/{j}"})
                              for j, c in enumerate(row["contexts"])])
        return row["answer"]

    names, columns = ((MLFLOW_SCORERS_SIX, MLFLOW_VALUE_COLUMNS_SIX) if set(METRICS) == set(METRICS_SIX)
                      else (MLFLOW_SCORERS, MLFLOW_VALUE_COLUMNS))
    judged = list(names) if names is MLFLOW_SCORERS_SIX else list(METRICS)
    scorers = [getattr(ms, names[m])(model="openai:/judge-model") for m in judged]
    data = [{"inputs": {"question": r["question"], "row_id": r["id"]},
             "expectations": {"expected_response": r["reference"]}} for r in rows]
    t0 = time.perf_counter()
    result = mlflow.genai.evaluate(data=data, predict_fn=rag_app, scorers=scorers)
    wall = time.perf_counter() - t0
    df = result.result_df
    scores: dict[str, list[float | None]] = {m: [None] * len(rows) for m in judged}
    errors: dict[str, int] = {}
    index = {r["id"]: i for i, r in enumerate(rows)}
    for _, rec in df.iterrows():
        inputs = rec.get("request") if "request" in df.columns else rec.get("inputs")
        if isinstance(inputs, str):
            inputs = json.loads(inputs)
        i = index[inputs["row_id"]]
        for m in judged:
            col = columns[m]
            value = rec.get(col + "/value", rec.get(col))
            if isinstance(value, str):
                value = {"yes": 1.0, "no": 0.0}.get(value.lower())
            value = _finite(value)
            if value is None:
                why = rec.get(col + "/error") or rec.get(col + "/rationale") or rec.get("state") or "no value"
                key = f"{m}:{str(why)[:120]}"
                errors[key] = errors.get(key, 0) + 1
            scores[m][i] = value
    sample = {str(c): repr(df.iloc[0][c])[:300] for c in df.columns if str(c).endswith(("/value", "/rationale"))}
    return {"scores": scores, "wall": wall, "failures": errors, "failure_examples": sample,
            "versions": _versions("mlflow", "mlflow-skinny", "openai", "litellm")}


def _versions(*packages: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in packages:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            pass
    return out


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True, choices=TOOLS)
    ap.add_argument("--spec", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    global METRICS
    METRICS = tuple(spec.get("metrics") or METRICS_FOUR)
    fn = {"ours": _worker_ours, "ragas": _worker_ragas, "deepeval": _worker_deepeval,
          "mlflow": _worker_mlflow}[args.worker]
    result = fn(spec)
    args.out.write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------- the server side (our venv)


class ProxySink:
    """A local 'proxy' the workers' HTTP(S)_PROXY points at: it records where a client tried to go, refuses."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = False
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    first = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                    self.attempts.append(" ".join(first.split()[:2]))
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self._sock.close()


class FaultMix:
    """Wraps a handler: per request (in arrival order) a seeded RNG picks HTTP 500, a hang, a malformed reply."""

    def __init__(self, inner: Any, seed: int, p500: float, phang: float, pmalformed: float, hang: float) -> None:
        self.inner = inner
        self.rng = random.Random(seed)
        self.p500, self.phang, self.pmal, self.hang = p500, phang, pmalformed, hang
        self.lock = threading.Lock()
        self.counts = {"500": 0, "hang": 0, "malformed": 0, "ok": 0}

    def __call__(self, request: Any) -> Any:
        from fakellm import Reply, _coerce_reply

        with self.lock:
            u = self.rng.random()
            if u < self.p500:
                kind = "500"
            elif u < self.p500 + self.phang:
                kind = "hang"
            elif u < self.p500 + self.phang + self.pmal and request.api == "openai_chat":
                kind = "malformed"
            else:
                kind = "ok"
            self.counts[kind] += 1
        if kind == "500":
            return Reply.error(500)
        if kind == "malformed":
            # half of them prose where JSON was asked, half the model's real reply cut off mid-way (what a proxy
            # that drops the connection's tail delivers, with a normal finish reason)
            with self.lock:
                truncate, cut = self.rng.random() < 0.5, self.rng.random()
            full = _coerce_reply(self.inner(request))
            text = full.text if full.text is not None else (json.dumps(full.json) if full.json is not None else "")
            if truncate and len(text) > 2:
                return Reply(text=text[: max(1, int(len(text) * (0.2 + 0.6 * cut)))])
            return Reply(text="I looked at the material carefully and everything seems fine to me, overall.")
        reply = self.inner(request)
        if kind == "hang":
            reply = _coerce_reply(reply)
            reply.delay += self.hang
        return reply


def _model() -> Any:
    """The server's handler: the independent compliant model, with the options that let it answer every tool."""
    from compliant_model import CompliantModel

    return CompliantModel(example_json=True, prompt_schema_too=True)


def _prompt_words(req: Any) -> int:
    return max(1, len(req.prompt_text.split()))  # what the fake server reports as usage.prompt_tokens


def run_tool(tool: str, pythons: dict[str, str], server: Any, handler: Any, rows: list[dict[str, Any]],
             work: Path, sink: ProxySink, *, label: str, cache: Any = False, env_cache: Path | None = None,
             variant: str | None = None, deepeval_model: str | None = None, ours_src: Path | None = None,
             timeout: float = 3600) -> dict[str, Any]:
    """Run one tool's worker against the server; return the server-side counts and the worker's figures."""
    server.reset()
    server.set_handler(handler)
    tag = f"{label}-{tool}" + (f"-{variant}" if variant else "")
    run_dir = Path(tempfile.mkdtemp(prefix=tag + "-", dir=work))
    spec = {"url": server.openai_base_url, "rows": rows, "cache": str(cache) if cache else False,
            "variant": variant, "deepeval_model": deepeval_model, "metrics": list(METRICS)}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPENAI_BASE_URL", "VIRTUAL_ENV")}
    env.update(QUIET_ENV)
    env["RAGJUDGE_CACHE_DIR"] = str(env_cache or (run_dir / "ragjudge-cache"))
    env["RAGJUDGE_OUTPUT_DIR"] = str(run_dir / "outputs")
    env["HOME_FOR_TOOL"] = str(run_dir)
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env[key] = sink.url
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    if tool == "ours" and ours_src is not None:
        env["PYTHONPATH"] = str(ours_src)  # the package exported from a commit, ahead of the editable install
    sink_before = len(sink.attempts)
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as out, open(run_dir / "stderr.log", "w") as err:
        proc = subprocess.run([pythons[tool], str(Path(__file__).resolve()), "--worker", tool, "--spec",
                               str(run_dir / "spec.json"), "--out", str(run_dir / "result.json")],
                              stdout=out, stderr=err, env=env, cwd=run_dir, timeout=timeout)
    process_wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if proc.returncode != 0 or not (run_dir / "result.json").exists():
        tail = (run_dir / "stderr.log").read_text()[-3000:]
        raise RuntimeError(f"{tag}: worker exit {proc.returncode}; logs in {run_dir}\n{tail}")
    res = json.loads((run_dir / "result.json").read_text())
    n = len(rows)
    reqs = list(server.requests)
    chat = [r for r in reqs if r.api == "openai_chat"]
    emb = [r for r in reqs if r.api == "openai_embeddings"]
    abstained = res.get("abstained", {})
    lost = sum(1 for i in range(n) if any(v[i] is None and i not in abstained.get(m, ()) for m, v in
                                          res["scores"].items()))
    fig = {
        "tool": tool, "variant": variant, "rows": n,
        "chat_requests": len(chat), "embedding_requests": len(emb),
        "chat_per_row": len(chat) / n, "emb_per_row": len(emb) / n,
        "prompt_tokens_per_row": sum(_prompt_words(r) for r in chat) / n,
        "prompt_chars_per_row": sum(len(r.prompt_text) for r in chat) / n,
        "request_bytes_per_row": sum(len(r.raw_body) for r in chat) / n,
        "embedding_texts_per_row": sum(len(r.inputs) for r in emb) / n,
        "http_429": server.rate_limited_count,
        "accepted_requests": server.request_count - server.rate_limited_count,
        "peak_in_flight": server.peak_in_flight,
        # first to last request received: the share of the wall time the tool spent talking to the server
        "request_span": (max(r.received_at for r in reqs) - min(r.received_at for r in reqs)) if reqs else 0.0,
        "structured": _structured_kinds(chat),
        "wall": res["wall"], "wall_per_row": res["wall"] / n, "process_wall": process_wall,
        "worker_cpu_s": worker_cpu,  # CPU seconds of the worker process, start-up and imports included
        "rows_lost": lost,
        "mean_scores": {m: _mean(v) for m, v in res["scores"].items()},
        "failures": res.get("failures", {}),
        "server_errors": [repr(e) for e in server.errors[:3]],
        "outbound": sink.attempts[sink_before:],
        "versions": res.get("versions", {}),
    }
    if "tool_usage" in res:
        fig["tool_usage"] = res["tool_usage"]
    for key in ("model", "package_file", "failure_examples", "usage_by_metric"):
        if key in res:
            fig[key] = res[key]
    if isinstance(handler, FaultMix):
        fig["faults_injected"] = dict(handler.counts)
    print(f"  {tag:34s} chat/row {fig['chat_per_row']:6.2f} emb/row {fig['emb_per_row']:5.2f} "
          f"prompt tok/row {fig['prompt_tokens_per_row']:7.0f} wall/row {fig['wall_per_row']:6.3f}s "
          f"(run {fig['wall']:.1f}s, process {process_wall:.1f}s) lost {lost}/{n} 429s {fig['http_429']}"
          + (f" OUTBOUND {fig['outbound'][:3]}" if fig["outbound"] else ""), file=sys.stderr, flush=True)
    return fig


def _structured_kinds(chat: list[Any]) -> dict[str, int]:
    """How the requests asked for structure: response_format json_schema/json_object, tools, or nothing; and
    how many carried a JSON schema in the prompt text too."""
    from compliant_model import schema_in_conversation

    out: dict[str, int] = {}
    for r in chat:
        if schema_in_conversation(r) is not None:
            out["schema_in_prompt"] = out.get("schema_in_prompt", 0) + 1
        fmt = r.response_format
        if isinstance(fmt, dict) and fmt.get("type"):
            kind = f"response_format:{fmt['type']}"
        elif r.tools:
            kind = "tools"
        else:
            kind = "none"
        out[kind] = out.get(kind, 0) + 1
    return out


def _mean(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


# --------------------------------------------------------------------------- scenarios


def scenario_a(ctx: dict[str, Any], k: int) -> dict[str, Any]:
    rows = make_rows(ctx["rows"], k)
    ctx["server"].latency = ctx["latency"]
    out = {"k": k, "rows": len(rows), "latency": ctx["latency"], "tools": {}}
    for tool in ctx["tools"]:
        out["tools"][tool] = run_tool(tool, ctx["pythons"], ctx["server"], _model(), rows,
                                      ctx["work"], ctx["sink"], label=f"a-k{k}", deepeval_model=ctx["deepeval_model"],
                                      ours_src=ctx["ours_src"])
    if "ours" in ctx["tools"]:
        # the critical path, measured: the same metrics on one row (its dependent calls one after the other, and
        # everything a run does around them); no run of many rows can take less
        one = run_tool("ours", ctx["pythons"], ctx["server"], _model(), rows[:1], ctx["work"], ctx["sink"],
                       label=f"a-k{k}-one-row", ours_src=ctx["ours_src"])
        out["critical_path"] = {"wall": one["wall"], "chat_requests": one["chat_requests"],
                                "embedding_requests": one["embedding_requests"]}
    return out


def scenario_b(ctx: dict[str, Any], seed: int) -> dict[str, Any]:
    rows = make_rows(ctx["rows"], 5)
    ctx["server"].latency = ctx["latency"]
    out = {"k": 5, "rows": len(rows), "latency": ctx["latency"], "hang": ctx["hang"],
           "mix": {"http_500": 0.10, "hang": 0.02, "malformed": 0.05}, "seed": seed, "tools": {}}
    runs = [(t, None) for t in ctx["tools"]]
    if ctx["variants"]:
        runs += [(t, v) for t, v in (("ragas", "return_exceptions"), ("deepeval", "ignore_errors"))
                 if t in ctx["tools"]]
    for tool, variant in runs:
        handler = FaultMix(_model(), seed, 0.10, 0.02, 0.05, ctx["hang"])
        key = tool + (f"+{variant}" if variant else "")
        out["tools"][key] = run_tool(tool, ctx["pythons"], ctx["server"], handler, rows, ctx["work"], ctx["sink"],
                                     label=f"b-s{seed}", variant=variant, deepeval_model=ctx["deepeval_model"],
                                     ours_src=ctx["ours_src"])
    return out


def scenario_c(ctx: dict[str, Any]) -> dict[str, Any]:
    rows = make_rows(ctx["c_rows"], 5)
    server = ctx["server"]
    server.latency = ctx["latency"]
    server.rate_limit_per_minute = ctx["rpm"]
    server.rate_limit_window = 60.0
    out = {"k": 5, "rows": len(rows), "latency": ctx["latency"], "limit_per_minute": ctx["rpm"], "tools": {}}
    # the server announcing its budget on every reply (x-ratelimit-*), or only retry-after on a 429; ours at
    # defaults on both, and with requests_per_minute set to the limit on the second
    runs = [("ours", None, True), ("ours", None, False), ("ours", f"rpm{ctx['rpm']}", False)]
    runs += [(t, None, True) for t in ctx["tools"] if t != "ours" and ctx["c_peers"]]
    try:
        for tool, variant, headers in runs:
            server.rate_limit_headers = headers
            key = tool + (f"+{variant}" if variant else "") + ("" if headers else " (no headers)")
            fig = run_tool(tool, ctx["pythons"], server, _model(), rows, ctx["work"], ctx["sink"],
                           label="c" + ("" if headers else "-noheaders"), variant=variant,
                           deepeval_model=ctx["deepeval_model"], ours_src=ctx["ours_src"])
            minutes = fig["wall"] / 60.0
            fig["limit_used"] = fig["accepted_requests"] / (ctx["rpm"] * minutes) if minutes else None
            # the same over the time the tool talked to the server: first request received to the last reply
            # (its latency after the last request), without the run's start-up (the SDK's import) and assembly
            talked = (fig["request_span"] + ctx["latency"]) / 60.0
            fig["limit_used_while_sending"] = fig["accepted_requests"] / (ctx["rpm"] * talked) if talked else None
            fig["http_429_share"] = fig["http_429"] / max(1, fig["accepted_requests"])
            fig["rate_limit_headers"] = headers
            print(f"    limit used {fig['limit_used']:.3f} (while sending {fig['limit_used_while_sending']:.3f}), "
                  f"429s {fig['http_429']} ({100 * fig['http_429_share']:.1f}% of accepted)", file=sys.stderr,
                  flush=True)
            out["tools"][key] = fig
    finally:
        server.rate_limit_per_minute = None
        server.rate_limit_headers = True
    return out


def scenario_d(ctx: dict[str, Any]) -> dict[str, Any]:
    rows = make_rows(ctx["rows"], 5)
    ctx["server"].latency = ctx["latency"]
    cache = Path(tempfile.mkdtemp(prefix="d-cache-", dir=ctx["work"]))
    env_cache = Path(tempfile.mkdtemp(prefix="d-envcache-", dir=ctx["work"]))
    out: dict[str, Any] = {"k": 5, "rows": len(rows), "latency": ctx["latency"], "runs": {}}
    for label, envc in (("first", env_cache), ("second", env_cache),
                        ("second_fresh_RAGJUDGE_CACHE_DIR", None)):
        out["runs"][label] = run_tool("ours", ctx["pythons"], ctx["server"], _model(), rows,
                                      ctx["work"], ctx["sink"], label=f"d-{label}", cache=cache, env_cache=envc,
                                      ours_src=ctx["ours_src"])
    return out


# --------------------------------------------------------------------------- report

COLS = (("chat_per_row", "chat req/row", "{:.2f}"), ("emb_per_row", "emb req/row", "{:.2f}"),
        ("prompt_tokens_per_row", "prompt tok/row", "{:.0f}"), ("prompt_chars_per_row", "prompt chars/row", "{:.0f}"),
        ("wall_per_row", "wall s/row", "{:.3f}"), ("wall", "wall s", "{:.1f}"), ("rows_lost", "rows lost", "{:d}"))


def _ratio(a: float, b: float) -> str:
    if not b:
        return "—" if not a else "∞"
    return f"{a / b:.2f}"


def _table(tools: dict[str, dict[str, Any]], cols: tuple = COLS, ratios: bool = True) -> list[str]:
    lines = ["| tool | " + " | ".join(c[1] for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for name, fig in tools.items():
        lines.append(f"| {name} | " + " | ".join(f.format(fig[k]) for k, _, f in cols) + " |")
    if ratios and "ours" in tools:
        for peer in ("ragas", "deepeval", "mlflow"):
            if peer in tools:
                o, p = tools["ours"], tools[peer]
                lines.append(f"| *ours/{peer}* | " + " | ".join(_ratio(o[k], p[k]) for k, _, _ in cols) + " |")
    return lines


def report(res: dict[str, Any]) -> str:
    out = []
    for key, sc in res["scenarios"].items():
        if key.startswith("a"):
            out.append(f"### a) k = {sc['k']}, {sc['rows']} rows, latency {sc['latency'] * 1000:.0f} ms")
            out += [""] + _table(sc["tools"]) + [""]
            cp = sc.get("critical_path")
            if cp and "ours" in sc["tools"]:
                out.append(f"Critical path (ours on one row: {cp['chat_requests']} chat + {cp['embedding_requests']} "
                           f"embedding requests, two of them dependent): {cp['wall']:.2f} s; ours on "
                           f"{sc['rows']} rows: {sc['tools']['ours']['wall']:.2f} s = "
                           f"{sc['tools']['ours']['wall'] / cp['wall']:.1f}x the critical path.")
                out.append("")
        elif key.startswith("b"):
            out.append(f"### b) fault mix (10 % HTTP 500, 2 % hang {sc['hang']:g} s, 5 % malformed), "
                       f"{sc['rows']} rows, k = 5, latency {sc['latency'] * 1000:.0f} ms, seed {sc['seed']}")
            cols = (("wall", "wall s", "{:.1f}"), ("wall_per_row", "wall s/row", "{:.3f}"),
                    ("rows_lost", "rows lost", "{:d}"), ("chat_per_row", "chat req/row", "{:.2f}"))
            out += [""] + _table(sc["tools"], cols) + [""]
            for name, fig in sc["tools"].items():
                out.append(f"- {name}: faults injected {fig.get('faults_injected')}; failures "
                           f"{json.dumps(fig['failures'])[:400]}")
            out.append("")
        elif key == "c":
            out.append(f"### c) rate limit {sc['limit_per_minute']}/min, {sc['rows']} rows, k = 5, "
                       f"latency {sc['latency'] * 1000:.0f} ms")
            cols = (("wall", "wall s", "{:.1f}"), ("accepted_requests", "accepted req", "{:d}"),
                    ("http_429", "429s", "{:d}"), ("http_429_share", "429s / accepted", "{:.3f}"),
                    ("limit_used", "limit used (wall)", "{:.3f}"),
                    ("limit_used_while_sending", "limit used (while sending)", "{:.3f}"),
                    ("rows_lost", "rows lost", "{:d}"))
            out += [""] + _table(sc["tools"], cols, ratios=False) + [""]
        elif key == "d":
            out.append(f"### d) ours re-run with a persistent cache, {sc['rows']} rows, k = 5")
            cols = (("chat_requests", "chat requests", "{:d}"), ("embedding_requests", "embedding requests", "{:d}"),
                    ("wall", "wall s", "{:.2f}"), ("rows_lost", "rows lost", "{:d}"))
            out += [""] + _table(sc["runs"], cols, ratios=False) + [""]
    seeds = {k: sc for k, sc in res["scenarios"].items() if k.startswith("b")}
    if len(seeds) > 1:
        out += _seeds_summary(seeds)
    return "\n".join(out)


def _seeds_summary(seeds: dict[str, dict[str, Any]]) -> list[str]:
    """Scenario b over several seeds: each tool's wall time per seed, rows lost in all, and ours against each peer
    (the ratio of the walls, seed by seed)."""
    names = list(next(iter(seeds.values()))["tools"])
    out = [f"### b) over {len(seeds)} seeds: wall s per seed, rows lost in all", "",
           "| tool | " + " | ".join(f"seed {sc['seed']}" for sc in seeds.values()) + " | rows lost | median |",
           "|---|" + "---:|" * (len(seeds) + 2)]
    for name in names:
        walls = [sc["tools"][name]["wall"] for sc in seeds.values()]
        lost = sum(sc["tools"][name]["rows_lost"] for sc in seeds.values())
        rows = sum(sc["rows"] for sc in seeds.values())
        out.append(f"| {name} | " + " | ".join(f"{w:.1f}" for w in walls)
                   + f" | {lost} of {rows} | {sorted(walls)[len(walls) // 2]:.1f} |")
    if "ours" in names:
        for peer in (n for n in names if n != "ours"):
            ratios = [sc["tools"]["ours"]["wall"] / sc["tools"][peer]["wall"] for sc in seeds.values()]
            out.append(f"| *ours/{peer}* | " + " | ".join(f"{r:.2f}" for r in ratios) + " | | "
                       f"{sorted(ratios)[len(ratios) // 2]:.2f} |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--worker" in argv:
        return worker_main(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", nargs="+", default=["a", "b", "d"], choices=["a", "b", "c", "d"],
                    help="which scenarios (default a b d; c is the rate-limit run, ours only unless --c-peers)")
    ap.add_argument("--quick", action="store_true",
                    help="8 rows, latency 50 ms, hang 5 s, k = 5 only, scenarios a b d (a smoke check)")
    ap.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    ap.add_argument("--metric-set", choices=("four", "six"), default="four",
                    help="four: the RAGAS-family four every tool has (default); six: our six judged metrics against "
                         "six of MLflow's built-in judges (tools ours and mlflow only; see MLFLOW_SCORERS_SIX)")
    ap.add_argument("--rows", type=int, help="rows for a, b, d (default 40; quick 8)")
    ap.add_argument("--ks", nargs="+", type=int, help="chunks per row for scenario a (default 5 10; quick 5)")
    ap.add_argument("--latency", type=float, help="server latency in s (default 0.2; quick 0.05)")
    ap.add_argument("--hang", type=float, help="seconds a 'hang' fault waits before answering (default 30; quick 5)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1],
                    help="fault-mix RNG seeds for scenario b, one run of each tool per seed (default 1)")
    ap.add_argument("--no-variants", dest="variants", action="store_false",
                    help="scenario b: skip the peers' keep-going variants")
    ap.add_argument("--c-rows", type=int, default=240, help="rows for scenario c (default 240)")
    ap.add_argument("--rpm", type=int, default=600, help="scenario c: the server's limit per minute (default 600)")
    ap.add_argument("--c-peers", action="store_true", help="scenario c: run the peers too")
    ap.add_argument("--ours-rev", default=None,
                    help="measure mlflow_ragjudge as committed at this git revision (e.g. HEAD: `git archive` into a "
                         "temporary folder, put first on the worker's PYTHONPATH) instead of the working tree")
    ap.add_argument("--deepeval-model", default=None,
                    help="model name given to deepeval's OpenAIModel (default: none, deepeval's own default)")
    for tool in TOOLS:
        ap.add_argument(f"--{tool}-python", default=DEFAULT_PYTHONS[tool], help=f"python of {tool}'s venv")
    ap.add_argument("--json", type=Path, help="write every figure to this JSON file")
    args = ap.parse_args(argv)
    if args.metric_set == "six":
        if set(args.tools) - {"ours", "mlflow"}:
            ap.error("--metric-set six compares ours with MLflow's judges only: add --tools ours mlflow")
        global METRICS
        METRICS = METRICS_SIX
    if args.quick:
        defaults = {"rows": 8, "ks": [5], "latency": 0.05, "hang": 5.0}
        if "--scenarios" not in argv:
            args.scenarios = ["a", "b", "d"]
    else:
        defaults = {"rows": 40, "ks": [5, 10], "latency": 0.2, "hang": 30.0}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    pythons = {t: getattr(args, f"{t}_python") for t in TOOLS}
    for tool in args.tools:
        if not Path(pythons[tool]).exists():
            ap.error(f"no python for {tool} at {pythons[tool]}: run `bash benchmarks/setup_peers.sh` first")

    sys.path.insert(0, str(ROOT / "tests"))
    from fakellm import FakeLLMServer

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    rev = args.ours_rev or "HEAD"
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "mlflow_ragjudge"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    measured = f"mlflow_ragjudge at {commit}" if args.ours_rev else (
        f"the working tree (HEAD {commit}{', with uncommitted changes under mlflow_ragjudge/' if dirty else ''})")
    res: dict[str, Any] = {"started": started, "commit": commit, "ours_measured": measured, "argv": argv,
                           "python": sys.version.split()[0], "cpus": os.cpu_count(), "metrics": list(METRICS),
                           "scenarios": {},
                           "scenario_seconds": {}}
    sink = ProxySink()
    with tempfile.TemporaryDirectory(prefix="bench_vs_peers_") as tmp, FakeLLMServer() as server:
        ctx = {"server": server, "sink": sink, "work": Path(tmp), "pythons": pythons, "tools": args.tools,
               "rows": args.rows, "latency": args.latency, "hang": args.hang,
               "variants": args.variants, "c_rows": args.c_rows, "rpm": args.rpm, "c_peers": args.c_peers,
               "deepeval_model": args.deepeval_model, "ours_src": None}
        if args.ours_rev:
            src = Path(tmp) / "ours-src"
            src.mkdir()
            archive = subprocess.run(["git", "archive", commit, "mlflow_ragjudge"], cwd=ROOT, capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
            ctx["ours_src"] = src
        jobs: list[tuple[str, Any]] = []
        for s in args.scenarios:
            if s == "a":
                jobs += [(f"a_k{k}", lambda k=k: scenario_a(ctx, k)) for k in args.ks]
            elif s == "b":
                jobs += [(f"b_s{seed}" if len(args.seeds) > 1 else "b", lambda seed=seed: scenario_b(ctx, seed))
                         for seed in args.seeds]
            else:
                fn = {"c": scenario_c, "d": scenario_d}[s]
                jobs.append((s, lambda fn=fn: fn(ctx)))
        for name, job in jobs:
            print(f"scenario {name} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            res["scenarios"][name] = job()
            res["scenario_seconds"][name] = round(time.perf_counter() - t0, 1)
            if args.json:  # keep what finished, should a later scenario fail
                args.json.write_text(json.dumps(res, indent=2, default=str))
    sink.close()
    versions = {name: fig.get("versions") for sc in res["scenarios"].values()
                for name, fig in (sc.get("tools") or sc.get("runs") or {}).items()}
    res["versions"] = versions
    print(f"{started}; ours = {measured}; versions: {json.dumps(versions)}\n")
    print(report(res))
    print("\nscenario seconds: " + json.dumps(res["scenario_seconds"]))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
