"""Single-machine throughput: rows per second of the offline metrics and of the LLM-judge pipeline.

Run from the repository root with the project's venv (no network, no API key; about 4 minutes on a 2-core
machine)::

    .venv/bin/python benchmarks/throughput.py --out /tmp/throughput.json
    .venv/bin/python benchmarks/throughput.py --quick                       # ~70 s, smaller counts
    .venv/bin/python benchmarks/throughput.py --only offline --rows 5000

Two parts, both through the public :func:`mlflow_ragjudge.evaluate_frame`:

1. **Offline metrics** (no LLM, no server): ``judge="offline:/lexical"``, ``bertscore=False``, ``cache=False``
   on ``--rows`` synthetic rows (default 2,000) of realistic size -- a question of ~17 words, an answer of ~60
   words, a reference of ~45 words, 5 contexts of ~120 words, 10 retrieved ids and 1-3 relevant ids. Each metric
   alone (correctness, faithfulness, context_precision, context_recall, context_relevance, lexical, retrieval --
   which with contexts and a reference present also computes its chunk-level ROUGE-L coverage -- and retrieval on
   the id columns only), then all seven in one run. Wall time and process CPU time (``time.process_time``) of the
   call; each configuration is warmed up once on 20 rows first (imports, the offline judge's calibration file).

2. **Judge pipeline** against ``tests/fakellm.py``'s fake OpenAI server **in a child process** (so its CPU is
   not counted here), with ``tests/compliant_model.py``'s ``CompliantModel("json_schema")`` as the model: an
   independent schema-following fake that knows none of our prompts. ``evaluate_frame(df,
   judge="openai:/judge-model?base_url=<server>/v1", metrics=[correctness, faithfulness, context_precision,
   context_recall], cache=False)`` with ``OPENAI_API_KEY`` set to a dummy ``sk-`` value, on ``--judge-rows``
   rows (default 300). Each scenario gets a fresh server (a new port, so a fresh process-wide provider gate):

   * ``lat0``: server latency 0, default (adaptive) concurrency -- what this host's CPU allows;
   * ``lat0-c2``: the same with 2 calls in flight (fewer threads: less CPU lost to switching between them);
   * ``lat0+ar``: the defaults with answer_relevancy added (and its embeddings request): the five-metric plan;
   * ``lat300-c16`` / ``lat300-c64``: 300 ms per request, the connection's limit fixed at 16 / 64 in flight
     (``configure_provider(judge, max_concurrency=N)`` and the run's ``max_concurrency=N``);
   * ``lat1000-c256``: 1 s per request, 256 in flight (what a slow real model needs at a high rate limit);
   * ``rpm600``: the server allows 600 requests per sliding 60 s window (``rate_limit_per_minute``), 300 ms
     latency, ``requests_per_minute=600`` in the run's config, on ``--rate-rows`` rows (default 80, ~40 s). Its
     steady rate is known in advance -- 600/min divided by the calls per row, as the run's pacing holds it from
     the first request -- and the run checks it;
   * ``sdk-floor``: the raw ``openai`` SDK, one thread, latency 0, requests of the same size with a JSON
     schema: the CPU per request under any Python client on this host.

   Counted at the server: chat and embedding requests, 429s, peak in flight, prompt words and characters (the
   fake server's ``usage.prompt_tokens`` is a whitespace word count, ~1.3 BPE tokens per English word), its own
   CPU time. Measured here: wall time, process CPU time (client + engine + SDK, all threads), rows where a
   metric failed (abstentions, the fake model's own verdicts, are not failures). A warm-up run of 5 rows on its
   own server comes first (SDK imports, first connections). The completions are the fake's short sentences,
   not a real model's: prompt sizes are real, completion sizes are not.

Everything prints a table and the command line; ``--out PATH`` also writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import random
import resource
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORK = tempfile.mkdtemp(prefix="ragjudge-throughput-")
atexit.register(shutil.rmtree, WORK, ignore_errors=True)
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["RAGJUDGE_CACHE_DIR"] = str(Path(WORK) / "cache")
os.environ["RAGJUDGE_OUTPUT_DIR"] = str(Path(WORK) / "outputs")
os.environ["OPENAI_API_KEY"] = "sk-test-throughput-not-a-secret"
for _var in ("RAGJUDGE_MAX_CONCURRENCY", "RAGJUDGE_BACKOFF_SCALE", "OPENAI_BASE_URL"):  # defined behaviour
    os.environ.pop(_var, None)
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
from _server_process import ServerProcess as _ServerProcess  # noqa: E402

from mlflow_ragjudge import evaluate_frame  # noqa: E402
from mlflow_ragjudge.llm.client import configure_provider  # noqa: E402

OFFLINE_METRICS = ("correctness", "faithfulness", "context_precision", "context_recall", "context_relevance",
                   "lexical", "retrieval")
JUDGED = ("correctness", "faithfulness", "context_precision", "context_recall")
MODEL = "judge-model"

# --------------------------------------------------------------------------- synthetic rows

_FIRST = ("Anna", "Boris", "Clara", "Daniel", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Karin", "Luis",
          "Mara", "Nils", "Olga", "Pavel", "Rosa", "Stefan", "Tara", "Viktor")
_LAST = ("Berg", "Costa", "Dahl", "Engel", "Fischer", "Gruber", "Holm", "Ivanova", "Jensen", "Keller", "Lind",
         "Moreau", "Novak", "Ortega", "Petrov", "Quist", "Rossi", "Sato", "Tanaka", "Weber")
_PLACES = ("Aldmoor", "Brenton", "Calder Bay", "Dunmore", "Eastwick", "Fairholm", "Glenrock", "Harwick",
           "Ironbridge", "Kestrel Point", "Larchmont", "Millbrook", "Northgate", "Oakridge", "Pinehurst",
           "Queensford", "Redcliff", "Stonehaven", "Thornbury", "Westmere")
_THINGS = ("bridge", "library", "observatory", "railway station", "lighthouse", "museum", "cathedral", "market hall",
           "water tower", "theatre", "harbour wall", "town hall", "botanical garden", "power station", "university")
_MATERIALS = ("granite", "red brick", "limestone", "steel", "oak", "sandstone", "reinforced concrete", "cast iron")
_VERBS = ("designed", "funded", "restored", "extended", "surveyed", "inspected", "renovated", "managed")
_GROUPS = ("the city council", "a private trust", "the regional railway company", "a group of local merchants",
           "the national heritage board", "the university's engineering faculty", "a shipping company")
_EVENTS = ("a severe flood", "a fire in the east wing", "a long economic depression", "two years of war",
           "a major storm", "the collapse of the old quay", "an outbreak of cholera")
_MONTHS = ("January", "March", "May", "June", "August", "September", "October", "December")


def _entity(rng: random.Random) -> dict[str, Any]:
    year = rng.randint(1780, 1960)
    return {"thing": rng.choice(_THINGS), "place": rng.choice(_PLACES),
            "person": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", "other": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
            "year": year, "y2": year + rng.randint(12, 40), "y3": year + rng.randint(45, 90),
            "material": rng.choice(_MATERIALS), "verb": rng.choice(_VERBS), "group": rng.choice(_GROUPS),
            "event": rng.choice(_EVENTS), "n": rng.choice((120, 450, 800, 1500, 3000, 12000, 40000)),
            "h": rng.randint(12, 140), "month": rng.choice(_MONTHS)}


_FACT_TEMPLATES = (
    "The {thing} in {place} was completed in {year} after nearly six years of work.",
    "Its original plans were drawn up by the engineer {person}, who had trained abroad.",
    "The main structure is built almost entirely of {material} quarried close to the town.",
    "In {y2} the building was {verb} by {group}, which still owns part of it today.",
    "It was badly damaged by {event} in {y3} and partly closed for several years.",
    "About {n} visitors come to see it every year, most of them in the summer months.",
    "At {h} metres it is one of the tallest structures in the whole region.",
    "A public festival has been held beside it every {month} since the early twentieth century.",
    "The later extension was designed by {other}, a student of the original engineer.",
    "Local newspapers at the time criticised the project for its very high cost.",
    "Guided tours of the upper floors are offered on weekends and public holidays.",
    "A small exhibition inside explains how the {thing} was built and later repaired.",
)


def _facts(e: dict[str, Any]) -> list[str]:
    return [t.format(**e) for t in _FACT_TEMPLATES]


def _passage(sentences: list[str], rng: random.Random, words: int) -> str:
    out: list[str] = []
    pool = list(sentences)
    rng.shuffle(pool)
    while sum(len(s.split()) for s in out) < words:
        out.append(pool[len(out) % len(pool)])
    return " ".join(out)


def make_rows(n: int, seed: int = 11) -> pd.DataFrame:
    """``n`` deterministic rows: question ~17 words, answer ~60, reference ~45, 5 contexts of ~120 words,
    10 retrieved ids and 1-3 relevant ids (~2)."""
    rng = random.Random(f"{seed}:{n}")
    rows = []
    for i in range(n):
        e = _entity(rng)
        facts = _facts(e)
        question = (f"When was the {e['thing']} in {e['place']} built, who designed it, and what happened to it "
                    "later?")
        reference = " ".join(facts[:3])
        answer_sents = facts[:2] + rng.sample(facts[3:], 1)
        if rng.random() < 0.4:  # some answers add a claim no context supports
            answer_sents.append(f"It was moved stone by stone to {rng.choice(_PLACES)} in {e['y2'] + 3}.")
        else:
            answer_sents.append(facts[rng.randint(3, len(facts) - 1)])
        answer = " ".join(answer_sents)
        relevant_pos = sorted(rng.sample(range(5), rng.randint(1, 2)))
        contexts = []
        for j in range(5):
            if j in relevant_pos:
                contexts.append(_passage(facts, rng, 115))
            else:
                contexts.append(_passage(_facts(_entity(rng)), rng, 115))
        ids = [f"doc{rng.randint(0, 99999):05d}" for _ in range(10)]
        relevant = [ids[p] for p in relevant_pos] + ([f"doc-missing-{i}"] if rng.random() < 0.5 else [])
        rows.append({"question": question, "answer": answer, "reference": reference, "contexts": contexts,
                     "retrieved_doc_ids": ids, "relevant_doc_ids": relevant})
    return pd.DataFrame(rows)


def row_sizes(df: pd.DataFrame) -> dict[str, float]:
    def words(s: str) -> int:
        return len(s.split())

    return {"question_words": df["question"].map(words).mean(), "answer_words": df["answer"].map(words).mean(),
            "reference_words": df["reference"].map(words).mean(),
            "contexts_per_row": df["contexts"].map(len).mean(),
            "context_words": df["contexts"].map(lambda cs: sum(words(c) for c in cs) / len(cs)).mean(),
            "retrieved_ids": df["retrieved_doc_ids"].map(len).mean(),
            "relevant_ids": df["relevant_doc_ids"].map(len).mean()}


# --------------------------------------------------------------------------- part 1: offline metrics


def _rows_with(out: Any, names: tuple[str, ...] | list[str], status: str) -> int:
    """Rows where any of ``names``'s results has ``status`` (``failed``: a call or parse failed; ``abstained``:
    the judge's own verdict, e.g. correctness 0 = not sure)."""
    rows = set()
    for name in names:
        for i, r in enumerate(out.results.get(name, [])):
            if r.status.value == status:
                rows.add(i)
    return len(rows)


def run_offline(df: pd.DataFrame, metrics: list[str], label: str | None = None) -> dict[str, Any]:
    cfg = {"judge": "offline:/lexical", "metrics": metrics, "bertscore": False, "cache": False, "progress": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluate_frame(df.head(20), cfg)  # warm-up
        cpu0, t0 = time.process_time(), time.perf_counter()
        out = evaluate_frame(df, cfg)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    judged = [m for m in metrics if m in ("correctness", "faithfulness", "context_precision", "context_recall",
                                          "context_relevance")]
    return {"label": label or (metrics[0] if len(metrics) == 1 else "+".join(metrics)), "metrics": metrics,
            "columns": list(df.columns), "rows": len(df), "wall_s": wall, "cpu_s": cpu, "rows_per_s": len(df) / wall,
            "cpu_ms_per_row": 1000 * cpu / len(df), "failed_rows": _rows_with(out, judged, "failed"),
            "logged_metrics": len(out.metrics)}


# --------------------------------------------------------------------------- part 2: the judge pipeline

# The fake server, in its own process. Lines on stdin: "stats" -> one JSON line of counters; "quit".
SERVER_SCRIPT = r"""
import json, sys, threading, time
sys.path.insert(0, sys.argv[1])
from fakellm import FakeLLMServer
from compliant_model import CompliantModel

class _Discard(list):  # the server keeps every Request otherwise
    def append(self, item):
        pass

model = CompliantModel("json_schema")
counts = {"chat": 0, "embeddings": 0, "prompt_words": 0, "prompt_chars": 0, "max_tokens": 0, "embedding_texts": 0}
lock = threading.Lock()

def handler(request):
    with lock:
        if request.api == "openai_chat":
            text = request.prompt_text
            counts["chat"] += 1
            now = time.time()  # (wall clock: the bench compares it with its own)
            counts["first_chat_at"] = min(counts.get("first_chat_at") or now, now)
            counts["last_chat_at"] = max(counts.get("last_chat_at") or now, now)
            counts["prompt_words"] += max(1, len(text.split()))
            counts["prompt_chars"] += len(text)
            counts["max_tokens"] += int(request.max_tokens or 0)
        elif request.api == "openai_embeddings":
            counts["embeddings"] += 1
            counts["embedding_texts"] += len(request.inputs)
    return model(request)

server = FakeLLMServer()
server.requests = _Discard()
server.latency = float(sys.argv[2])
limit = int(sys.argv[3])
server.rate_limit_per_minute = limit if limit > 0 else None
server.rate_limit_headers = not (len(sys.argv) > 4 and sys.argv[4] == "no-headers")
refused_at = []  # (wall clock) when each 429 was answered
_limit = server._rate_limit

def _counted(request):
    refused = _limit(request)
    if refused is not None:
        refused_at.append(round(time.time(), 3))
    return refused

server._rate_limit = _counted
server.set_handler(handler)
server.start()
print(json.dumps({"url": server.openai_base_url}), flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "stats":
        with server._lock:
            stats = {"http_requests": server.request_count, "http_429": server.rate_limited_count,
                     "peak_in_flight": server.peak_in_flight, "server_errors": len(server.errors),
                     "cpu_s": time.process_time(), "refused_at": list(refused_at)}
        with lock:
            stats.update(counts)
        print(json.dumps(stats), flush=True)
    elif command == "quit":
        break
server.stop()
"""


class ServerProcess(_ServerProcess):
    """``tests/fakellm.py``'s FakeLLMServer with ``CompliantModel("json_schema")``, in a child process."""

    def __init__(self, latency: float = 0.0, limit: int = 0, headers: bool = True) -> None:
        super().__init__(SERVER_SCRIPT, str(ROOT / "tests"), str(latency), str(limit),
                         *(() if headers else ("no-headers",)))


def run_judge(df: pd.DataFrame, *, name: str, latency: float, concurrency: int | None = None, limit: int = 0,
              rpm: float | None = None, relevancy: bool = False) -> dict[str, Any]:
    """One evaluate_frame run of the judged metrics against a fresh fake server; server-side counts are the
    difference of its counters before and after the run."""
    metrics = list(JUDGED) + (["answer_relevancy"] if relevancy else [])
    with ServerProcess(latency, limit) as server:
        judge = f"openai:/{MODEL}?base_url={server.url}"
        cfg: dict[str, Any] = {"judge": judge, "metrics": metrics, "cache": False, "progress": False}
        if relevancy:
            cfg["embeddings"] = f"openai:/emb?base_url={server.url}"
        if concurrency is not None:
            configure_provider(judge, max_concurrency=concurrency)
            cfg["max_concurrency"] = concurrency
        if rpm is not None:
            cfg["requests_per_minute"] = rpm
        before = server.stats()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cpu0, t0 = time.process_time(), time.perf_counter()
            out = evaluate_frame(df, cfg)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        after = server.stats()
    s = {k: (after[k] - before[k]) if k != "peak_in_flight" else after[k] for k in after
         if k in before and k not in ("refused_at", "first_chat_at", "last_chat_at")}
    n = len(df)
    usage = out.config.get("usage", {})
    return {
        "scenario": name, "rows": n, "metrics": metrics, "latency_s": latency, "max_concurrency": concurrency,
        "server_limit_per_min": limit or None, "requests_per_minute": rpm,
        "wall_s": wall, "cpu_s": cpu, "rows_per_s": n / wall,
        "chat_requests": s["chat"], "chat_per_row": s["chat"] / n, "chat_per_s": s["chat"] / wall,
        "embedding_requests": s["embeddings"], "embedding_per_row": s["embeddings"] / n,
        "http_requests": s["http_requests"], "http_429": s["http_429"],
        "accepted_per_s": (s["http_requests"] - s["http_429"]) / wall, "peak_in_flight": s["peak_in_flight"],
        "server_errors": s["server_errors"],
        "cpu_ms_per_request": 1000 * cpu / max(1, s["http_requests"]), "cpu_ms_per_row": 1000 * cpu / n,
        "client_cores": cpu / wall, "server_cpu_s": s["cpu_s"], "server_cores": s["cpu_s"] / wall,
        "prompt_words_per_row": s["prompt_words"] / n, "prompt_chars_per_row": s["prompt_chars"] / n,
        "words_per_chat_request": s["prompt_words"] / max(1, s["chat"]),
        "max_tokens_per_row": s["max_tokens"] / n,  # what a rate limiter may reserve for the completions
        "client_input_tokens_per_row": (usage.get("input_tokens") or 0) / n,
        "client_output_tokens_per_row": (usage.get("output_tokens") or 0) / n,
        "failed_rows": _rows_with(out, metrics, "failed"), "abstained_rows": _rows_with(out, metrics, "abstained"),
        # what a worker would hand back per row in a distributed run: the per-row table, and every call's record
        "table_json_bytes_per_row": len(out.table.to_json(orient="records", default_handler=str)) / n,
        "transcript_json_bytes_per_row": len(json.dumps(out.transcripts, default=str)) / n,
        "usage_by_metric": {m: {k: round(v, 3) for k, v in u.items()}
                            for m, u in (out.config.get("usage_by_metric") or {}).items()},
    }


FLOOR_SCHEMA = {"type": "object", "properties": {"score": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
                                                 "reason": {"type": "string"}},
                "required": ["score", "reason"], "additionalProperties": False}


def run_sdk_floor(df: pd.DataFrame, calls: int) -> dict[str, Any]:
    """The floor under any Python client on this host: the raw ``openai`` SDK, one thread, ``calls`` chat
    requests of the same size as the pipeline's (the row's question, answer, reference and contexts, with a
    JSON schema), against the same kind of fake server at latency 0."""
    import openai

    with ServerProcess(0.0) as server:
        sdk = openai.OpenAI(base_url=server.url, api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
        rows = df.to_dict("records")

        def messages(r: dict[str, Any]) -> list[dict[str, str]]:
            ctx = "\n".join(f"[{j + 1}] {c}" for j, c in enumerate(r["contexts"]))
            return [{"role": "system", "content": "You grade answers. Reply with JSON."},
                    {"role": "user", "content": f"Question: {r['question']}\nReference: {r['reference']}\n"
                                                f"Passages:\n{ctx}\nAnswer: {r['answer']}\nScore the answer 1-5."}]

        fmt = {"type": "json_schema", "json_schema": {"name": "score", "schema": FLOOR_SCHEMA, "strict": True}}
        for r in rows[:10]:  # warm-up
            sdk.chat.completions.create(model=MODEL, messages=messages(r), max_tokens=256, response_format=fmt)
        before = server.stats()
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i in range(calls):
            reply = sdk.chat.completions.create(model=MODEL, messages=messages(rows[i % len(rows)]), max_tokens=256,
                                                response_format=fmt)
            json.loads(reply.choices[0].message.content or "{}")
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        after = server.stats()
        sdk.close()
    return {"scenario": "sdk-floor", "calls": calls, "wall_s": wall, "cpu_s": cpu,
            "cpu_ms_per_request": 1000 * cpu / calls, "requests_per_s": calls / wall,
            "words_per_chat_request": (after["prompt_words"] - before["prompt_words"]) / calls,
            "server_cores": (after["cpu_s"] - before["cpu_s"]) / wall}


# --------------------------------------------------------------------------- report


def report(res: dict[str, Any]) -> str:
    lines = [f"command: {res['command']}", f"machine: {res['machine']}", f"started: {res['started']}", ""]
    sz = res["row_sizes"]
    lines.append("rows: question {question_words:.0f} words, answer {answer_words:.0f}, reference "
                 "{reference_words:.0f}, {contexts_per_row:.0f} contexts x {context_words:.0f} words, "
                 "{retrieved_ids:.0f} retrieved ids, {relevant_ids:.1f} relevant ids".format(**sz))
    if res.get("offline"):
        lines += ["", "1. offline metrics (judge=offline:/lexical, bertscore=False, cache=False; one process)", "",
                  "| metrics | rows | wall s | rows/s | CPU ms/row | rows failed |", "|---|---:|---:|---:|---:|---:|"]
        for r in res["offline"]:
            lines.append(f"| {r['label']} | {r['rows']:,} | {r['wall_s']:.2f} | {r['rows_per_s']:,.0f} | "
                         f"{r['cpu_ms_per_row']:.2f} | {r['failed_rows']} |")
    if res.get("judge"):
        lines += ["", "2. judge pipeline: correctness, faithfulness, context_precision, context_recall "
                  "(+ answer_relevancy in lat0+ar); fake OpenAI server in a child process, "
                  "CompliantModel('json_schema'), cache=False", "",
                  "| scenario | rows | latency | in flight cap / peak | rows/s | chat req/row | chat req/s | 429s | "
                  "CPU ms/request | client cores | server cores | prompt words/row | rows failed | wall s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in res["judge"]:
            cap = r["max_concurrency"] or "adaptive"
            lines.append(
                f"| {r['scenario']} | {r['rows']} | {int(r['latency_s'] * 1000)} ms | {cap} / {r['peak_in_flight']} | "
                f"{r['rows_per_s']:.2f} | {r['chat_per_row']:.2f} | {r['chat_per_s']:.1f} | {r['http_429']} | "
                f"{r['cpu_ms_per_request']:.2f} | {r['client_cores']:.2f} | {r['server_cores']:.2f} | "
                f"{r['prompt_words_per_row']:,.0f} | {r['failed_rows']} | {r['wall_s']:.1f} |")
        for r in res["judge"]:
            if r["requests_per_minute"]:
                accepted_per_row = (r["http_requests"] - r["http_429"]) / r["rows"]
                expected = (r["server_limit_per_min"] / 60.0) / accepted_per_row
                lines.append(f"\n{r['scenario']}: expected steady rate = ({r['server_limit_per_min']}/60 req/s) / "
                             f"{accepted_per_row:.2f} req/row = {expected:.2f} rows/s; measured {r['rows_per_s']:.2f} "
                             f"rows/s over {r['wall_s']:.0f} s ({r['accepted_per_s'] * 60:.0f} accepted req/min, "
                             f"{r['http_429']} x 429)")
        base = next((r for r in res["judge"] if r["scenario"] == "lat0"), None)
        if base:
            lines.append("per metric (lat0): " + "; ".join(
                f"{m} {u.get('requests_per_row', 0):.2f} req/row" for m, u in base["usage_by_metric"].items())
                + f"; prompt words per request {base['words_per_chat_request']:.0f}, completion words per row "
                  f"{base['client_output_tokens_per_row']:.0f}, max_tokens asked per row "
                  f"{base['max_tokens_per_row']:.0f}; per-row table {base['table_json_bytes_per_row'] / 1024:.1f} kB "
                  f"and transcripts {base['transcript_json_bytes_per_row'] / 1024:.1f} kB of JSON per row")
    if res.get("sdk_floor"):
        f = res["sdk_floor"]
        lines.append(f"sdk-floor: raw openai SDK, one thread, latency 0, {f['calls']} requests of "
                     f"{f['words_per_chat_request']:.0f} prompt words: {f['cpu_ms_per_request']:.2f} CPU ms/request, "
                     f"{f['requests_per_s']:.0f} requests/s")
    lines.append(f"peak RSS of this process: {res['max_rss_mb']:.0f} MB")
    return "\n".join(lines)


def machine() -> str:
    import openai

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, openai "
            f"{openai.__version__}, pandas {pd.__version__}; load average at start {load:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000, help="rows for the offline metrics (default 2000)")
    p.add_argument("--judge-rows", type=int, default=300, help="rows per judge scenario (default 300)")
    p.add_argument("--rate-rows", type=int, default=80, help="rows of the rate-limited scenario (default 80)")
    p.add_argument("--rpm", type=int, default=600, help="the server's limit per minute, and the run's "
                   "requests_per_minute, in the rate-limited scenario (default 600)")
    p.add_argument("--only", choices=("offline", "judge"), help="run one part")
    p.add_argument("--quick", action="store_true", help="500 offline rows, 60 judge rows, 30 rate-limited rows")
    p.add_argument("--out", help="write every figure as JSON here")
    a = p.parse_args(argv)
    if a.quick:
        a.rows, a.judge_rows, a.rate_rows = 500, 60, 30
    shown = sys.argv[1:] if argv is None else argv
    res: dict[str, Any] = {"command": " ".join([".venv/bin/python benchmarks/throughput.py", *shown]),
                           "machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"command: {res['command']}", file=sys.stderr, flush=True)
    df_all = make_rows(max(a.rows, a.judge_rows, a.rate_rows))
    res["row_sizes"] = {k: round(float(v), 2) for k, v in row_sizes(df_all).items()}
    t_start = time.perf_counter()
    if a.only in (None, "offline"):
        df = df_all.head(a.rows)
        res["offline"] = []
        runs: list[tuple[pd.DataFrame, list[str], str | None]] = [(df, [m], None) for m in OFFLINE_METRICS]
        runs.append((df[["question", "retrieved_doc_ids", "relevant_doc_ids"]], ["retrieval"], "retrieval, ids only"))
        runs.append((df, list(OFFLINE_METRICS), "all seven together"))
        for frame, metrics, label in runs:
            r = run_offline(frame, metrics, label)
            res["offline"].append(r)
            print(f"  offline {r['label']:30.30s} {r['rows_per_s']:8.0f} rows/s ({r['wall_s']:.1f} s)",
                  file=sys.stderr, flush=True)
    if a.only in (None, "judge"):
        res["judge"] = []
        # warm-up: SDK imports and the first connections, on rows not measured
        run_judge(make_rows(5, seed=99), name="warm-up", latency=0.0)
        df = df_all.head(a.judge_rows)
        scenarios: list[dict[str, Any]] = [
            {"name": "lat0", "latency": 0.0},
            {"name": "lat0-c2", "latency": 0.0, "concurrency": 2},
            {"name": "lat0+ar", "latency": 0.0, "relevancy": True},
            {"name": "lat300-c16", "latency": 0.3, "concurrency": 16},
            {"name": "lat300-c64", "latency": 0.3, "concurrency": 64},
            {"name": "lat1000-c256", "latency": 1.0, "concurrency": 256},
            {"name": f"rpm{a.rpm}", "latency": 0.3, "limit": a.rpm, "rpm": float(a.rpm), "rows": a.rate_rows},
        ]
        for sc in scenarios:
            frame = df_all.head(sc.pop("rows")) if "rows" in sc else df
            r = run_judge(frame, **sc)
            res["judge"].append(r)
            print(f"  judge {r['scenario']:14s} {r['rows_per_s']:7.2f} rows/s {r['chat_per_row']:.2f} req/row "
                  f"{r['chat_per_s']:6.1f} req/s CPU {r['cpu_ms_per_request']:.2f} ms/req 429s {r['http_429']} "
                  f"failed {r['failed_rows']} ({r['wall_s']:.1f} s)", file=sys.stderr, flush=True)
        res["sdk_floor"] = run_sdk_floor(df, calls=min(1000, 5 * len(df)))
    res["total_s"] = round(time.perf_counter() - t_start, 1)
    res["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(report(res))
    print(f"total {res['total_s']} s")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2, default=str))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
