"""Judge-client benchmarks: per-call client overhead, and throughput under a provider rate limit.

Run from the repository root (needs only the package's own dependencies and ``tests/fakellm.py``)::

    python benchmarks/bench_client.py --quick                 # both parts, under a minute
    python benchmarks/bench_client.py                         # full: ~4-5 minutes (2,000 paced calls)
    python benchmarks/bench_client.py --only overhead         # part 1 alone
    python benchmarks/bench_client.py --only throughput --calls 2000 --json out.json

The fake server (``tests/fakellm.py``, OpenAI API) runs in a **separate process**, so its CPU time is not
counted; every call gets the reply ``Feedback: ok [RESULT] 5``. Requests are the project's own correctness
prompt (Prometheus form) rendered with ~1.5 kB of context, ~2.8 kB of messages in all.

1. **Overhead** (server latency 0): the same requests, one thread, interleaved rounds of

   * ``sdk``    -- the raw ``openai`` SDK, ``client.chat.completions.create(...)`` (``max_retries=0``);
   * ``client`` -- ``JudgeClient(OpenAIBackend(..., structured="none"), cache=False).call(req, parse=...)``:
     cache key, gate, backend translation, parse, accounting, redaction and the transcript record;
   * ``cache``  -- the same call through a pre-warmed ``CallCache``: every call is a hit, no request sent.

   For each: wall time and process CPU time (``time.process_time``) per call, median over rounds; the client
   overhead is ``client - sdk`` CPU per call (median of the per-round differences).

2. **Throughput** (server latency 200 ms, ``rate_limit_per_minute`` 600 over a sliding 60 s window):
   ``--calls`` calls from ``--threads`` (16) threads through one ``JudgeClient(cache=False, max_concurrency=8,
   requests_per_minute=594.06)``. Then, against the same server with its window still full from that run,
   ``--compare-calls`` calls from a client with only the concurrency limit (no pacing). Reported: calls ok /
   lost, 429s the server sent, HTTP requests, achieved rate (ok calls / elapsed, per minute).

   Why not exactly 600/min: pacing spaces request *starts* exactly ``60/rpm`` s apart at the client, so at
   600/min request ``i + 600`` is due exactly 60.000 s after request ``i`` -- the very instant request ``i``
   leaves the server's window. Whether it has left depends on which of the two was delayed more between the
   gate and the server, and the first request always is: it builds the SDK client and triggers its lazy
   imports (~0.1 s here), later ones wait for thread wake-up, the GIL, a fresh keep-alive connection. So the
   client leaves ``--slack`` seconds (0.6) per window: ``requests_per_minute = 60 * limit / (window + slack)``,
   594.06/min for 600 per 60 s (1 % below the limit). ``max_concurrency`` 8: by Little's law 10 req/s x 0.2 s
   is 2 requests in flight; a paced caller holds its slot while it sleeps until its start time, so 8 leaves
   room for those sleepers and for latency spikes without ever being the bottleneck.

``--quick``: 300 calls x 3 rounds of overhead, then 150 paced + 150 unpaced calls against a 10 s window with a
limit of 100 (the same 600/min). Everything prints a table; ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = tempfile.mkdtemp(prefix="ragjudge-bench-")
atexit.register(shutil.rmtree, CACHE_DIR, ignore_errors=True)
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["RAGJUDGE_CACHE_DIR"] = CACHE_DIR
for _var in ("RAGJUDGE_MAX_CONCURRENCY", "RAGJUDGE_BACKOFF_SCALE"):  # defined client behaviour
    os.environ.pop(_var, None)
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402
from _server_process import ServerProcess as _ServerProcess  # noqa: E402

from mlflow_ragjudge.llm.backends import ChatRequest  # noqa: E402
from mlflow_ragjudge.llm.backends.openai import OpenAIBackend  # noqa: E402
from mlflow_ragjudge.llm.cache import CallCache  # noqa: E402
from mlflow_ragjudge.llm.client import CallResult, JudgeClient  # noqa: E402
from mlflow_ragjudge.llm.parsing import parse_score_reply  # noqa: E402
from mlflow_ragjudge.llm.prompts import load_prompt  # noqa: E402

MODEL = "prometheus-bench"
API_KEY = "sk-bench-not-a-secret"
REPLY = "Feedback: ok [RESULT] 5"
PROMPT_VERSION = "bench-v1"
ALLOWED = (0, 1, 2, 3, 4, 5)

# The fake server, in its own process. Lines on stdin: "stats" -> one JSON line of counters; "quit".
SERVER_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from fakellm import FakeLLMServer

class _Discard(list):  # the server keeps every Request otherwise; a long run does not need them
    def append(self, item):
        pass

server = FakeLLMServer()
server.requests = _Discard()
server.latency = float(sys.argv[2])
limit = int(sys.argv[3])
server.rate_limit_per_minute = limit if limit > 0 else None
server.rate_limit_window = float(sys.argv[4])
reply = sys.argv[5]
server.set_handler(lambda request: reply)
server.start()
print(json.dumps({"url": server.openai_base_url}), flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "stats":
        with server._lock:
            stats = {"request_count": server.request_count, "rate_limited_count": server.rate_limited_count,
                     "peak_in_flight": server.peak_in_flight, "connection_count": server.connection_count,
                     "errors": len(server.errors)}
        print(json.dumps(stats), flush=True)
    elif command == "quit":
        break
server.stop()
"""


class ServerProcess(_ServerProcess):
    """``tests/fakellm.py``'s FakeLLMServer running in a child process."""

    def __init__(self, latency: float = 0.0, limit: int = 0, window: float = 60.0) -> None:
        super().__init__(SERVER_SCRIPT, str(ROOT / "tests"), str(latency), str(limit), str(window), REPLY)


class TaggedOpenAIBackend(OpenAIBackend):
    """An OpenAIBackend whose process-wide gate is its own.

    The gate is shared by connection key (provider + base URL) and a later client cannot switch pacing off
    (``requests_per_minute=None`` means "leave as is"), so the unpaced comparison against the same server
    needs a key of its own.
    """

    def __init__(self, *args: Any, tag: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tag = tag

    def connection_key(self) -> str:
        return f"{super().connection_key()}|{self.tag}"


def parse(response: Any) -> dict[str, Any]:
    return parse_score_reply(response, allowed=ALLOWED)


CONTEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
    "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889 as the centrepiece "
    "of the 1889 World's Fair. It is 330 metres tall and was the tallest man-made structure in the world until "
    "the Chrysler Building in New York was finished in 1930. "
)


def make_requests(n: int, offset: int = 0) -> list[ChatRequest]:
    """``n`` distinct requests: the correctness prompt (Prometheus form), ~2.8 kB of messages each."""
    prompt = load_prompt("correctness", "en")
    out = []
    for i in range(offset, offset + n):
        messages = prompt.render(
            "prometheus",
            question=f"Question {i}: who designed the Eiffel Tower, and when was it built?",
            reference="Gustave Eiffel's company designed and built it between 1887 and 1889.",
            contexts="\n".join(f"[{k}] {CONTEXT}" for k in range(1, 4)),
            response=f"It was designed by Gustave Eiffel's engineering company and built from 1887 to 1889 ({i}).",
        )
        out.append(ChatRequest.of(messages, max_tokens=512))
    return out


def openai_backend(url: str, tag: str | None = None) -> OpenAIBackend:
    if tag is None:
        return OpenAIBackend(MODEL, base_url=url, api_key=API_KEY, structured="none")
    return TaggedOpenAIBackend(MODEL, base_url=url, api_key=API_KEY, structured="none", tag=tag)


# --------------------------------------------------------------------------- part 1: overhead


def time_loop(fn: Callable[[ChatRequest], None], requests: Sequence[ChatRequest]) -> tuple[float, float]:
    """(wall ms, CPU ms) per call of ``fn`` over ``requests``."""
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    for request in requests:
        fn(request)
    c1, w1 = time.process_time(), time.perf_counter()
    n = len(requests)
    return (w1 - w0) * 1000 / n, (c1 - c0) * 1000 / n


def bench_overhead(calls: int, rounds: int) -> dict[str, Any]:
    requests = make_requests(calls)
    with ServerProcess(latency=0.0) as server:
        sdk = openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0)
        backend = openai_backend(server.url)
        cache = CallCache(Path(CACHE_DIR) / "overhead.sqlite")

        def sdk_call(request: ChatRequest) -> None:
            messages: Any = list(request.messages)  # the SDK's TypedDicts; these are plain role/content dicts
            completion = sdk.chat.completions.create(
                model=MODEL, messages=messages, temperature=request.temperature,
                max_tokens=request.max_tokens, timeout=60.0,
            )
            if completion.choices[0].message.content != REPLY:
                raise AssertionError(completion)

        def client_fn(client: JudgeClient) -> Callable[[ChatRequest], None]:
            def call(request: ChatRequest) -> None:
                result = client.call(request, parse=parse, prompt_version=PROMPT_VERSION, purpose="bench")
                if not result.ok or result.parsed["score"] != 5:
                    raise AssertionError(result)
            return call

        # Pre-warm the cache with every request (one HTTP call each), then warm up all three paths.
        warm = JudgeClient(backend, cache=cache)
        for request in requests:
            client_fn(warm)(request)
        sdk_before = server.stats()["request_count"]
        for request in requests[:20]:
            sdk_call(request)
            client_fn(JudgeClient(backend, cache=False))(request)
            client_fn(JudgeClient(backend, cache=cache))(request)

        per_round: list[dict[str, tuple[float, float]]] = []
        order = ["sdk", "client", "cache"]
        for r in range(rounds):
            # Fresh clients per round (a run's transcript list starts empty); the backend and its connection
            # pool are reused, as they are within a run.
            fns: dict[str, Callable[[ChatRequest], None]] = {
                "sdk": sdk_call,
                "client": client_fn(JudgeClient(backend, cache=False)),
                "cache": client_fn(cache_client := JudgeClient(backend, cache=cache)),
            }
            row = {name: time_loop(fns[name], requests) for name in order}
            if cache_client.usage.cache_hits != calls or cache_client.usage.requests != 0:
                raise AssertionError(f"cache path sent requests: {cache_client.summary()}")
            per_round.append(row)
            print(f"  round {r + 1}/{rounds}: " + "  ".join(
                f"{name} {row[name][0]:.3f} ms wall / {row[name][1]:.3f} ms CPU" for name in order), flush=True)
            order = order[1:] + order[:1]  # rotate, so no path always runs first
        stats = server.stats()
    expected = sdk_before + 20 * 2 + rounds * calls * 2
    if stats["request_count"] != expected:
        raise AssertionError(f"server saw {stats['request_count']} requests, expected {expected}")

    def med(name: str, i: int) -> float:
        return statistics.median(row[name][i] for row in per_round)

    overhead = [row["client"][1] - row["sdk"][1] for row in per_round]
    overhead_wall = [row["client"][0] - row["sdk"][0] for row in per_round]
    return {
        "calls_per_round": calls,
        "rounds": rounds,
        "request_chars": sum(len(m["content"]) for m in requests[0].messages),
        "wall_ms": {name: round(med(name, 0), 4) for name in ("sdk", "client", "cache")},
        "cpu_ms": {name: round(med(name, 1), 4) for name in ("sdk", "client", "cache")},
        "client_overhead_cpu_ms": round(statistics.median(overhead), 4),
        "client_overhead_cpu_ms_range": [round(min(overhead), 4), round(max(overhead), 4)],
        "client_overhead_wall_ms": round(statistics.median(overhead_wall), 4),
        "rounds_detail": per_round,
    }


# --------------------------------------------------------------------------- part 2: throughput


def run_load(
    url: str, server: ServerProcess, calls: int, threads: int, max_concurrency: int, client_rpm: float | None,
    tag: str, offset: int,
) -> dict[str, Any]:
    """``calls`` calls through one JudgeClient from a thread pool; counters from both ends."""
    client = JudgeClient(openai_backend(url, tag), cache=False, max_concurrency=max_concurrency,
                         requests_per_minute=client_rpm)
    requests = make_requests(calls, offset)
    before = server.stats()
    done = 0
    lock = threading.Lock()
    step = max(1, calls // 10)
    t0 = time.perf_counter()

    def one(request: ChatRequest) -> CallResult:
        nonlocal done
        result = client.call(request, parse=parse, prompt_version=PROMPT_VERSION, purpose="bench")
        with lock:
            done += 1
            if done % step == 0:
                print(f"    {tag}: {done}/{calls} calls, {time.perf_counter() - t0:.0f} s", flush=True)
        return result

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(one, requests))
    elapsed = time.perf_counter() - t0
    after = server.stats()
    ok = sum(r.ok for r in results)
    usage = client.summary()
    attempts = [rec.get("attempts", 0) for r in results for rec in r.records]
    return {
        "calls": calls,
        "threads": threads,
        "max_concurrency": max_concurrency,
        "client_requests_per_minute": client_rpm,
        "ok": ok,
        "lost": calls - ok,
        "failures": dict(Counter(r.failure.value for r in results if r.failure is not None)),
        "server_requests": after["request_count"] - before["request_count"],
        "server_429s": after["rate_limited_count"] - before["rate_limited_count"],
        "client_requests": usage["requests"],
        "client_rate_limited": usage["rate_limited"],
        "client_retries": usage["retries"],
        "max_attempts_per_call": max(attempts, default=0),
        # which calls needed more than one attempt (0-based, first 20): tells a cold-start 429 from a steady one
        "retried_calls": [i for i, r in enumerate(results) if sum(rec.get("attempts", 0) for rec in r.records) > 1][
            :20],
        "gate_peak_slots": usage["peak_in_flight"],
        "elapsed_s": round(elapsed, 2),
        "achieved_per_minute": round(ok / elapsed * 60, 1),
    }


def bench_throughput(
    calls: int, compare_calls: int, rpm: int, window: float, client_rpm: float, latency: float, threads: int,
    max_concurrency: int,
) -> dict[str, Any]:
    limit = round(rpm * window / 60)
    out: dict[str, Any] = {"server": {"latency_s": latency, "rate_limit_per_minute": rpm, "window_s": window,
                                      "limit_per_window": limit}}
    with ServerProcess(latency=latency, limit=limit, window=window) as server:
        print(f"  paced: {calls} calls, client requests_per_minute={client_rpm:g}, max_concurrency="
              f"{max_concurrency}, {threads} threads", flush=True)
        paced = run_load(server.url, server, calls, threads, max_concurrency, client_rpm, "paced", 0)
        paced["achieved_fraction_of_limit"] = round(paced["achieved_per_minute"] / rpm, 4)
        out["paced"] = paced
        if compare_calls <= 0:
            out["server_final"] = server.stats()
            return out
        print(f"  unpaced: {compare_calls} calls, max_concurrency={max_concurrency} only, same server right "
              "after (window full)", flush=True)
        unpaced = run_load(server.url, server, compare_calls, threads, max_concurrency, None, "unpaced", calls)
        out["unpaced_after"] = unpaced
        out["server_final"] = server.stats()
    return out


# --------------------------------------------------------------------------- report


def print_overhead(res: dict[str, Any]) -> None:
    print(f"\nClient overhead: {res['calls_per_round']} calls x {res['rounds']} rounds, server latency 0, "
          f"{res['request_chars']} chars of messages per request (medians over rounds)")
    print(f"  {'path':<8} {'wall ms/call':>13} {'CPU ms/call':>12}")
    for name in ("sdk", "client", "cache"):
        print(f"  {name:<8} {res['wall_ms'][name]:>13.3f} {res['cpu_ms'][name]:>12.3f}")
    lo, hi = res["client_overhead_cpu_ms_range"]
    print(f"  client overhead (client - sdk): {res['client_overhead_cpu_ms']:.3f} ms CPU per call "
          f"(rounds: {lo:.3f} .. {hi:.3f}), {res['client_overhead_wall_ms']:.3f} ms wall")
    print(f"  cache hit: {res['cpu_ms']['cache']:.3f} ms CPU per call")


def print_throughput(res: dict[str, Any]) -> None:
    s = res["server"]
    print(f"\nThroughput: server latency {s['latency_s']:g} s, limit {s['limit_per_window']} requests per sliding "
          f"{s['window_s']:g} s window ({s['rate_limit_per_minute']}/min)")
    cols = {"calls": "calls", "ok": "ok", "lost": "lost", "server_429s": "429s", "server_requests": "requests",
            "max_attempts_per_call": "max attempts", "elapsed_s": "elapsed s", "achieved_per_minute": "ok/min"}
    print("  " + f"{'run':<9}" + "".join(f"{h:>13}" for h in cols.values()))
    for name in ("paced", "unpaced_after"):
        if name in res:
            row = res[name]
            print("  " + f"{name.split('_')[0]:<9}" + "".join(f"{row[c]!s:>13}" for c in cols))
    paced = res["paced"]
    print(f"  paced: client requests_per_minute {paced['client_requests_per_minute']:g}, achieved "
          f"{paced['achieved_fraction_of_limit']:.1%} of the limit; calls retried: {paced['retried_calls'] or 'none'}")
    if "unpaced_after" in res:
        unpaced = res["unpaced_after"]
        print(f"  unpaced: failures {unpaced['failures'] or 'none'}, client retries {unpaced['client_retries']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a run under a minute (smaller counts, 10 s window)")
    ap.add_argument("--only", choices=("overhead", "throughput"), help="run one part only")
    ap.add_argument("--overhead-calls", type=int, help="calls per path per round (default 1000; quick 300)")
    ap.add_argument("--rounds", type=int, help="overhead rounds (default 7; quick 3)")
    ap.add_argument("--calls", type=int, help="paced calls (default 2000; quick 150)")
    ap.add_argument("--compare-calls", type=int, help="unpaced calls (default 300; quick 150; 0: skip)")
    ap.add_argument("--rpm", type=int, default=600, help="the server's limit per minute (default 600)")
    ap.add_argument("--window", type=float, help="the server's sliding window, s (default 60; quick 10)")
    ap.add_argument("--slack", type=float, default=0.6,
                    help="seconds of slack per server window left by the client's pacing (default 0.6)")
    ap.add_argument("--client-rpm", type=float,
                    help="client requests_per_minute (default: limit per window / (window + slack))")
    ap.add_argument("--latency", type=float, default=0.2, help="server latency for the throughput part, s")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--max-concurrency", type=int, default=8)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    quick = args.quick
    def pick(value: Any, full: Any, short: Any) -> Any:
        return value if value is not None else short if quick else full

    overhead_calls = pick(args.overhead_calls, 1000, 300)
    rounds = pick(args.rounds, 7, 3)
    calls = pick(args.calls, 2000, 150)
    compare_calls = pick(args.compare_calls, 300, 150)
    window = pick(args.window, 60.0, 10.0)
    limit = round(args.rpm * window / 60)
    client_rpm = args.client_rpm or round(60 * limit / (window + args.slack), 2)

    info = {"python": platform.python_version(), "openai": openai.__version__, "machine": platform.machine(),
            "cpus": os.cpu_count(), "argv": sys.argv[1:] if argv is None else argv}
    print(f"Python {info['python']}, openai {info['openai']}, {info['cpus']} CPUs ({info['machine']})", flush=True)
    results: dict[str, Any] = {"info": info}
    if args.only in (None, "overhead"):
        print(f"\n[1] overhead: {overhead_calls} calls per path x {rounds} rounds", flush=True)
        results["overhead"] = bench_overhead(overhead_calls, rounds)
    if args.only in (None, "throughput"):
        print(f"\n[2] throughput: {calls} paced + {compare_calls} unpaced calls", flush=True)
        results["throughput"] = bench_throughput(calls, compare_calls, args.rpm, window, client_rpm,
                                                 args.latency, args.threads, args.max_concurrency)
    if "overhead" in results:
        print_overhead(results["overhead"])
    if "throughput" in results:
        print_throughput(results["throughput"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
