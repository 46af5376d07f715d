"""The learned pace (:class:`mlflow_ragjudge.llm.pacing.LearnedPace`) against a sliding-window limit someone else uses
too, on a virtual clock: minutes of traffic in milliseconds, every run the same.

Run from the repository root::

    .venv/bin/python benchmarks/pace_sim.py                       # the four scenarios of bench_shared_quota.py
    .venv/bin/python benchmarks/pace_sim.py --limit 100 --window 10 --neighbour 0.6
    .venv/bin/python benchmarks/pace_sim.py --tasks 1 2 4 8 16 --latency 0.3   # a Spark job's tasks

The model: ``--workers`` callers (the gate's concurrency) each take a start from the policy, as
:class:`~mlflow_ragjudge.llm.gate.ProviderGate` does (after any cool-down), and send; a request reaches the server
``UP`` seconds after its start; the server (``--limit`` per sliding ``--window`` seconds, counting every client's
arrivals) answers a refusal ``DOWN`` seconds later with its exact ``retry-after`` (a cool-down for every caller; a
request whose start comes during one is held back, as the wire watch does), an accepted request after
``--latency``. The other user of the key is the same as in benchmarks/bench_shared_quota.py, and so is the measure:
our accepted requests over the first ``--windows`` windows against the physical maximum beside the other's.

This is the policy alone, not the client: the real one (threads, the SDK, the fake server) is measured by
bench_shared_quota.py; tests/test_pacing_sim.py holds the policy to the same scenarios here.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import random
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # (last: a package already on the path, e.g. bench_shared_quota's --rev, comes first)

from mlflow_ragjudge.llm.pacing import LearnedPace  # noqa: E402

SCENARIOS = ("fresh", "prefilled-even", "prefilled-burst", "neighbour")
UP = 0.002
DOWN = 0.002
RECHECK = 1.0  # the gate's ProviderGate.RECHECK


@dataclass
class Limiter:
    """A sliding-window limit over arrival times, whoever sends."""

    limit: int
    window: float
    held: deque[float] = field(default_factory=deque)

    def admit(self, at: float) -> float | None:
        """None: accepted; else the ``retry-after`` (seconds until the oldest request in the window ages out)."""
        while self.held and self.held[0] <= at - self.window:
            self.held.popleft()
        if len(self.held) < self.limit:
            self.held.append(at)
            return None
        return max(0.001, self.held[0] + self.window - at)


def greedy_max(others: list[float], limit: int, window: float, start: float, end: float) -> int:
    """How many requests a client that sends the instant the limiter allows gets in [start, end), beside the other
    client's accepted requests ``others`` (sorted)."""
    ours: deque[float] = deque()
    t, n = start, 0
    while t < end:
        lo, hi = bisect.bisect_right(others, t - window), bisect.bisect_right(others, t)
        while ours and ours[0] <= t - window:
            ours.popleft()
        if (hi - lo) + len(ours) < limit:
            ours.append(t)
            n += 1
            continue
        oldest = min(x for x in (ours[0] if ours else None, others[lo] if lo < hi else None) if x is not None)
        t = max(t + 1e-6, oldest + window + 1e-6)
    return n


def simulate(scenario: str, *, limit: int = 600, window: float = 60.0, windows: int = 2, workers: int = 16,
             latency: float = 0.2, neighbour: float = 0.4, neighbour_span: tuple[float, float] | None = None,
             pace: LearnedPace | None = None, jitter: float = 0.1, seed: int = 0,
             after: Callable[[float, LearnedPace, Limiter], None] | None = None) -> dict[str, Any]:
    """One scenario on a virtual clock; ``after(t, pace, limiter)`` is called after every event (for tests).
    ``neighbour_span``: the neighbour sends only from its first to its second time (none before: a fresh window)."""
    pace = pace if pace is not None else LearnedPace()
    rng = random.Random(seed)  # each reply's latency within +-jitter of ``latency``
    server = Limiter(limit, window)
    theirs: list[float] = []
    if scenario == "prefilled-even":
        theirs += [-window + (i + 0.5) * window / limit for i in range(limit)]
    elif scenario == "prefilled-burst":
        theirs += [-window / 2] * limit
    every = window / (neighbour * limit) if neighbour > 0 else 0.0
    if scenario == "neighbour" and neighbour_span is None:
        theirs += [-window + (i + 0.5) * every for i in range(int(window / every))]
    elif scenario != "fresh" and scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}: one of {SCENARIOS}")
    server.held.extend(theirs)
    horizon = windows * window
    events: list[tuple[float, int, str, int]] = []
    seq = 0

    def push(t: float, kind: str, worker: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, worker))

    if scenario == "neighbour":
        push(neighbour_span[0] if neighbour_span else 0.5 * every, "neighbour", -1)
    push(0.0, "acquire", 0)  # the first request goes alone (ProviderGate: until its attempt ends)
    opened = False
    cool_until = 0.0
    ours_ok: list[float] = []
    ours_refused: list[float] = []
    started: dict[int, float] = {}
    retry_of: dict[int, float] = {}
    given: dict[int, tuple[float, int]] = {}
    while events:
        t, _, kind, w = heapq.heappop(events)
        if t >= horizon + window:
            break
        if kind == "neighbour":
            if server.admit(t) is None:
                theirs.append(t)
            if neighbour_span is None or t + every < neighbour_span[1]:
                push(t + every, "neighbour", -1)
        elif kind == "acquire":
            if t < cool_until:  # the gate waits out a cool-down before the request counts as started
                push(cool_until, "acquire", w)
                continue
            if t >= horizon:
                continue  # past the measured windows: this caller stops
            start = pace.schedule(max(t, cool_until), t, cool_until)
            given[w] = (start, pace.version)
            push(min(start, t + RECHECK), "wait", w)
        elif kind == "wait":  # the gate sleeps a second at a time, and asks again if the pace changed
            start, version = given[w]
            if pace.stale(start, version, t):
                push(t, "acquire", w)
            elif t >= start:
                push(t, "wire", w)
            else:
                push(min(start, t + RECHECK), "wait", w)
        elif kind == "wire":
            if t < cool_until:  # held back on its way out: a 429 since it started asked for quiet
                push(cool_until, "acquire", w)
                continue
            started[w] = t
            push(t + UP, "arrive", w)
        elif kind == "arrive":
            retry = server.admit(t)
            if retry is None:
                ours_ok.append(t)
                push(t + latency * rng.uniform(1 - jitter, 1 + jitter), "accepted", w)
            else:
                ours_refused.append(t)
                push(t + DOWN, "refused", w)
                retry_of[w] = retry  # (the retry-after travels with the reply)
        elif kind == "accepted":
            pace.accepted.append(started[w])
            if not opened:
                opened = True
                for other in range(1, workers):
                    push(t, "acquire", other)
            push(t, "acquire", w)
        elif kind == "refused":
            retry = retry_of[w]
            cool_until = max(cool_until, t + retry)
            pace.refused(t, retry, cool_until, learn=True, settle=2 * latency)
            if not opened:
                opened = True
                for other in range(1, workers):
                    push(t, "acquire", other)
            push(t, "acquire", w)
        if after is not None:
            after(t, pace, server)
    first = min(ours_ok + ours_refused) if ours_ok or ours_refused else 0.0
    end = first + horizon
    got = sum(1 for x in ours_ok if x < end)
    refused = sum(1 for x in ours_refused if x < end)
    best = greedy_max(sorted(theirs), limit, window, first, end)
    return {"scenario": scenario, "limit": limit, "window": window, "ours_accepted": got, "ours_refused": refused,
            "refused_per_accepted": refused / max(1, got), "physical_max": best,
            "share_of_max": got / best if best else None,
            "theirs_accepted_in_run": sum(1 for x in theirs if first <= x < end),
            "refused_at": [round(x - first, 3) for x in ours_refused if x < end]}


def scenario_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of a shared-quota scenario (here and in bench_shared_quota.py)."""
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    ap.add_argument("--limit", type=int, default=600)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--neighbour", type=float, default=0.4, help="the neighbour's share of the limit")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    scenario_arguments(ap)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--jitter", type=float, default=0.1, help="each reply's latency within +- this share")
    ap.add_argument("--tasks", type=int, nargs="*", help="instead: a Spark job of this many tasks (several: one "
                    "run each), --requests between them, with and without the pace file's shared quiet")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.tasks:
        print(f"virtual clock; a job of {args.requests} requests, {args.limit} per sliding {args.window:g} s, "
              f"{args.latency:g} s latency (+-{args.jitter:.0%}), {args.workers} callers per task\n")
        print("| tasks | shared quiet | seconds | sliding minimum | ratio | refusals / accepted |\n"
              "|---:|---|---:|---:|---:|---:|")
        jobs = []
        for n in args.tasks:
            for share in (False, True):
                r = simulate_job(n, args.requests, limit=args.limit, window=args.window, workers=args.workers,
                                 latency=args.latency, share_quiet=share, jitter=args.jitter)
                r.pop("refused_at")
                jobs.append(r | {"share_quiet": share})
                print(f"| {n} | {'yes' if share else 'no'} | {r['seconds']} | {r['minimum_seconds']} | "
                      f"{r['ratio']:.3f} | {r['refused_per_accepted']:.3f} |")
        if args.json:
            args.json.write_text(json.dumps(jobs, indent=1))
        return 0
    rows = [simulate(s, limit=args.limit, window=args.window, windows=args.windows, workers=args.workers,
                     latency=args.latency, neighbour=args.neighbour, jitter=args.jitter) for s in args.scenarios]
    print(f"virtual clock; {args.limit} per sliding {args.window:g} s, exact retry-after, {args.latency:g} s latency, "
          f"{args.workers} callers; the first {args.windows} windows\n")
    print("| scenario | ours accepted | physical max | share of max | refusals / accepted |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['scenario']} | {r['ours_accepted']} | {r['physical_max']} | {r['share_of_max']:.3f} | "
              f"{r['refused_per_accepted']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0



def simulate_job(tasks: int, requests: int, *, limit: int = 600, window: float = 60.0, workers: int = 16,
                 latency: float = 0.3, share_quiet: bool = False, jitter: float = 0.1,
                 seed: int = 0) -> dict[str, Any]:
    """A Spark job on a virtual clock: ``tasks`` processes (each its own gate: cool-down and pace), ``requests``
    between them, all started at once against one sliding-window limit; with ``share_quiet`` a 429's quiet is
    shared through the job's pace file (:mod:`mlflow_ragjudge.llm.shared_pace`): every task waits it out and learns
    from it as from its own. The job's time against the limit's minimum for that many requests (a client that
    sends the instant the limiter allows), and its refusals."""
    server = Limiter(limit, window)
    paces = [LearnedPace() for _ in range(tasks)]
    rng = random.Random(seed)
    cool = [0.0] * tasks
    shared = 0.0  # the pace file's quiet
    left = [requests // tasks + (1 if i < requests % tasks else 0) for i in range(tasks)]
    events: list[tuple[float, int, str, int, int]] = []
    seq = 0

    def push(t: float, kind: str, task: int, w: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, task, w))

    opened = [False] * tasks
    for i in range(tasks):
        push(0.0, "acquire", i, 0)
    given: dict[tuple[int, int], tuple[float, int]] = {}
    started: dict[tuple[int, int], float] = {}
    busy: dict[tuple[int, int], bool] = {}
    refused = accepted = 0
    refused_at: list[float] = []
    done_at = 0.0
    while events:
        t, _, kind, i, w = heapq.heappop(events)
        pace, key = paces[i], (i, w)
        if share_quiet and shared > cool[i] + 1e-6 and kind in ("acquire", "wait") and shared > t:
            cool[i] = shared  # another task's 429, read from the file: waited out and learned from
            pace.refused(t, shared - t, shared, learn=True, settle=2 * latency)
        if kind == "acquire":
            if not busy.get(key):
                if left[i] <= 0:
                    continue
                left[i] -= 1
                busy[key] = True
            if t < cool[i]:
                push(cool[i], "acquire", i, w)
                continue
            start = pace.schedule(max(t, cool[i]), t, cool[i])
            given[key] = (start, pace.version)
            push(min(start, t + RECHECK), "wait", i, w)
        elif kind == "wait":
            start, version = given[key]
            if pace.stale(start, version, t):
                push(t, "acquire", i, w)
            elif t >= start:
                if t < cool[i]:
                    push(cool[i], "acquire", i, w)
                else:
                    started[key] = t
                    push(t + UP, "arrive", i, w)
            else:
                push(min(start, t + RECHECK), "wait", i, w)
        elif kind == "arrive":
            retry = server.admit(t)
            if retry is None:
                accepted += 1
                push(t + latency * rng.uniform(1 - jitter, 1 + jitter), "accepted", i, w)
            else:
                refused += 1
                refused_at.append(t)
                push(t + DOWN, "refused", i, w)
                given[key] = (retry, -1)
        elif kind == "accepted":
            pace.accepted.append(started[key])
            busy[key] = False
            done_at = max(done_at, t)
            push(t, "acquire", i, w)
            if not opened[i]:
                opened[i] = True
                for other in range(1, workers):
                    push(t, "acquire", i, other)
        elif kind == "refused":
            retry = given[key][0]
            cool[i] = max(cool[i], t + retry)
            shared = max(shared, cool[i])
            pace.refused(t, retry, cool[i], learn=True, settle=2 * latency)
            push(t, "acquire", i, w)
            if not opened[i]:
                opened[i] = True
                for other in range(1, workers):
                    push(t, "acquire", i, other)
    # the minimum: the first `limit` at once, then a window later the next, ...
    full, rest = divmod(requests, limit)
    minimum = (full - 1 if rest == 0 else full) * window + latency
    return {"tasks": tasks, "requests": requests, "accepted": accepted, "refused": refused,
            "seconds": round(done_at, 1), "minimum_seconds": round(minimum, 1),
            "ratio": round(done_at / minimum, 3), "refused_per_accepted": round(refused / max(1, accepted), 4),
            "refused_at": refused_at}


if __name__ == "__main__":
    sys.exit(main())
