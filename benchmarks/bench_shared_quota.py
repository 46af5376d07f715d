"""The judge client behind a rate limit that someone else uses too: a window already filled, a neighbour beside us.

Run from the repository root (each scenario lasts ``--windows`` server windows; at the defaults, 60 s)::

    .venv/bin/python benchmarks/bench_shared_quota.py --json /tmp/quota.json          # all scenarios, ~10 min
    .venv/bin/python benchmarks/bench_shared_quota.py --rev HEAD~2 --json /tmp/q0.json # the package at a revision
    .venv/bin/python benchmarks/bench_shared_quota.py --scenarios neighbour --windows 1   # one minute

(The client takes a window it cannot prove shorter for a minute, the providers' unit: a server window of a few
seconds with someone else in it is slow to measure; benchmarks/pace_sim.py runs the policy alone in milliseconds.)

The server is ``tests/fakellm.py``'s, in this process: ``--limit`` requests per sliding ``--window`` seconds (600 per
60 s), ``retry-after`` on a 429 and no rate-limit headers (the hard case: a server that announces its budget is
followed by its headers), 200 ms latency. Our client is a ``JudgeClient`` at its defaults (nothing configured), called
from 64 threads. The other user of the key is simulated inside the server's limiter, where it counts:

* ``fresh``: nobody else (the reference);
* ``prefilled-even``: another client sent ``--limit`` requests evenly over the window before ours starts, so the
  window frees a request at a time as theirs age out;
* ``prefilled-burst``: another client sent ``--limit`` requests at once half a window before ours starts;
* ``neighbour``: another client sends ``--neighbour`` of the limit (default 0.4) at a fixed rate from a window
  before ours starts until ours ends; its requests are refused, like ours, when the window is full.

Measured over the first ``--windows`` windows of our run (from our first request): our accepted requests against
the **physical maximum** -- what a client that sends the instant the server would accept (no latency, no refusal)
gets in the same time, given the other client's accepted requests -- and our refusals per accepted request.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

from _at_rev import in_child, rerun_at  # noqa: E402

if not in_child():
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("OPENAI_API_KEY", "sk-bench-quota")

from pace_sim import greedy_max, scenario_arguments  # noqa: E402


def run_scenario(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from fakellm import FakeLLMServer

    from mlflow_ragjudge.llm.backends import ChatRequest
    from mlflow_ragjudge.llm.client import JudgeClient

    limit, window = args.limit, args.window
    ours_ok: list[float] = []
    ours_refused: list[float] = []
    theirs: list[float] = []
    stop = threading.Event()
    with FakeLLMServer() as server:
        server.latency = 0.2
        server.rate_limit_per_minute, server.rate_limit_window = limit, window
        server.rate_limit_headers = False
        original = server._rate_limit

        def counted(request: Any) -> Any:
            refused = original(request)
            (ours_refused if refused is not None else ours_ok).append(time.monotonic())
            return refused

        server._rate_limit = counted  # type: ignore[method-assign]
        now = time.monotonic()
        with server._lock:
            if name == "prefilled-even":
                theirs += [now - window + (i + 0.5) * window / limit for i in range(limit)]
            elif name == "prefilled-burst":
                theirs += [now - window / 2] * limit
            server._window.extend(theirs)
        neighbour = None
        if name == "neighbour":
            every = window / (args.neighbour * limit)
            with server._lock:  # its last window, already in the limiter
                past = [now - window + (i + 0.5) * every for i in range(int(window / every))]
                server._window.extend(past)
                theirs += past

            def send() -> None:
                t = now + 0.5 * every
                while not stop.is_set():
                    stop.wait(max(0.0, t - time.monotonic()))
                    at = time.monotonic()
                    with server._lock:
                        while server._window and server._window[0] <= at - window:
                            server._window.popleft()
                        if len(server._window) < limit:
                            server._window.append(at)
                            theirs.append(at)
                    t += every

            neighbour = threading.Thread(target=send, daemon=True)
            neighbour.start()
        start = time.monotonic()
        horizon = start + args.windows * window
        client = JudgeClient(f"openai:/judge-model?base_url={server.openai_base_url}", cache=False)
        sent = 0
        lock = threading.Lock()

        def one(i: int) -> bool:
            nonlocal sent
            if time.monotonic() >= horizon:  # past the measured windows: stop asking
                return True
            with lock:
                sent += 1
            return client.call(ChatRequest.of([{"role": "user", "content": f"q {i}"}])).ok

        with ThreadPoolExecutor(64) as pool:
            results = list(pool.map(one, range(args.calls or 10 * limit * args.windows)))
        stop.set()
        if neighbour is not None:
            neighbour.join()
    first = min(ours_ok + ours_refused) if ours_ok or ours_refused else start
    end = first + args.windows * window
    got = sum(1 for t in ours_ok if t < end)
    refused = sum(1 for t in ours_refused if t < end)
    best = greedy_max(sorted(theirs), limit, window, first, end)
    return {"scenario": name, "limit": limit, "window": window, "ours_accepted": got, "ours_refused": refused,
            "refused_per_accepted": refused / max(1, got), "physical_max": best,
            "share_of_max": got / best if best else None, "calls_lost": sum(1 for r in results if not r),
            "theirs_accepted_in_run": sum(1 for t in theirs if first <= t < end), "calls_sent": sent}


def report(res: dict[str, Any]) -> str:
    lines = [f"{res['measured']}; server: {res['limit']} per sliding {res['window']:g} s, retry-after only, 200 ms; "
             f"measured over the first {res['windows']} windows", "",
             "| scenario | ours accepted | physical max | share of max | refusals / accepted | theirs accepted | "
             "calls lost |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["scenarios"]:
        lines.append(f"| {r['scenario']} | {r['ours_accepted']} | {r['physical_max']} | {r['share_of_max']:.3f} | "
                     f"{r['refused_per_accepted']:.3f} | {r['theirs_accepted_in_run']} | {r['calls_lost']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    scenario_arguments(ap)
    ap.add_argument("--calls", type=int, default=0)
    ap.add_argument("--rev", help="measure the package as committed at this git revision (git archive)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.rev and not in_child():
        return rerun_at(args.rev, __file__, argv)
    import mlflow_ragjudge

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    measured = (f"mlflow_ragjudge at {args.rev}" if args.rev else f"the working tree (HEAD {commit})")
    res = {"measured": measured, "package": mlflow_ragjudge.__file__, "limit": args.limit, "window": args.window,
           "windows": args.windows, "scenarios": []}
    for name in args.scenarios:
        print(f"scenario {name} ...", file=sys.stderr, flush=True)
        r = run_scenario(name, args)
        print(f"  {json.dumps(r)}", file=sys.stderr, flush=True)
        res["scenarios"].append(r)
    print(report(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
