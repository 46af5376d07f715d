"""What a ``ragjudge monitor`` pass costs per judged trace (issue 37), and its attach step against MLflow's own
``mlflow.log_feedback`` per trace.

Usage (from the repository root, the project's venv)::

    python benchmarks/monitor_attach.py                       # 200 traces, SQLite and a real mlflow server (1 worker)
    python benchmarks/monitor_attach.py --stores server --server-workers 4 --parts attach,fetch   # its default
    python benchmarks/monitor_attach.py --traces 40 --rounds 2 --stores sqlite     # a quick look
    python benchmarks/monitor_attach.py --json out.json

The app is a small ``@mlflow.trace`` function with a RETRIEVER span (two documents), each trace a different
question and answer. Three parts (``--parts``), on each store (a SQLite file, and a real ``mlflow server`` -- one
worker unless ``--server-workers``, SQLite behind it -- started by ``tests/mlflow_ui.py``):

1. **The attach step.** The Feedback the monitor builds (captured from a real pass of the fake LLM judge over the
   default metrics -- faithfulness, answer relevancy, context relevance: 3 Feedback per trace, with the judge as
   source, a rationale and the identity metadata) are written to fresh traces of the app, ``--traces`` per variant
   in ``--rounds`` blocks, the variants taking turns block by block (order rotated each round); the median over the
   blocks, in ms per trace, with the CPU of this process and of the server:

   * ``ours``: ``MonitorStore.attach_all`` as a pass calls it (``log_assessment`` per Feedback, then the trace tag;
     8 threads on a server, 1 on SQLite), and the same at other thread counts and without the tag;
   * ``log_feedback``: the obvious user loop, ``mlflow.log_feedback(trace_id=, name=, value=, rationale=, source=,
     metadata=)`` per Feedback, serially, no tag.

2. **The fetch step** (``fetch``): ``MonitorStore.fetch`` (``get_trace`` per trace) against MLflow's
   ``TracingClient.batch_get_traces`` on the same traces, alternately.

3. **A whole pass** (``pass``). ``monitor_pass`` over ``--traces`` new traces with the offline judge
   (``offline:/lexical``: the default metrics it can run, faithfulness and context relevance) and with the fake LLM
   judge (``tests/fakellm.py`` with ``tests/compliant_model.py``, ``--latency`` s per request, in a child process so its
   CPU is not this process's), each phase timed by wrapping the monitor's functions here (the product code is not
   changed): setup (the judge's identity by a dry run, the lease, the monitor's run, the watermark), list, fetch,
   read (trace -> row), judge, attach, log (link the traces, the pass's run, the trend, calibration), other.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(tempfile.mkdtemp(prefix="ragjudge-monitor-bench-"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_MODEL_CATALOG_URI", "")
# the app's traces are written synchronously: every one is in the store before the attach step is timed (the async
# exporter's queue would drop traces logged this fast, and write beside the timed step)
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
os.environ["RAGJUDGE_OUTPUT_DIR"] = str(WORK / "outputs")
os.environ["OPENAI_API_KEY"] = "sk-bench-not-a-secret"
for _var in ("RAGJUDGE_MAX_CONCURRENCY", "OPENAI_BASE_URL"):
    os.environ.pop(_var, None)

from _server_process import ServerProcess  # noqa: E402

JUDGE_MODEL = "judge-m"
SERVER_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from fakellm import FakeLLMServer
from compliant_model import CompliantModel

class _Discard(list):  # the server keeps every Request otherwise
    def append(self, item):
        pass

server = FakeLLMServer()
server.requests = _Discard()
server.latency = float(sys.argv[2])
server.set_handler(CompliantModel("json_schema"))
server.start()
print(json.dumps({"url": server.openai_base_url}), flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "stats":
        with server._lock:
            print(json.dumps({"request_count": server.request_count}), flush=True)
    elif command == "quit":
        break
server.stop()
"""

COUNTRIES = [("France", "Paris", "Seine"), ("Germany", "Berlin", "Spree"), ("Italy", "Rome", "Tiber"),
             ("Austria", "Vienna", "Danube"), ("Hungary", "Budapest", "Danube"), ("England", "London", "Thames"),
             ("Portugal", "Lisbon", "Tagus"), ("Spain", "Madrid", "Manzanares"), ("Poland", "Warsaw", "Vistula"),
             ("Czechia", "Prague", "Vltava"), ("Ireland", "Dublin", "Liffey"), ("Russia", "Moscow", "Moskva")]


# ------------------------------------------------------------------------------------------------ the app


def make_app() -> Callable[[int], str]:
    import mlflow
    from mlflow.entities import Document, SpanType

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(query: str, i: int) -> list[Document]:
        country, city, river = COUNTRIES[i % len(COUNTRIES)]
        return [Document(page_content=f"{city} is the capital and the largest city of {country} (record {i}).",
                         metadata={"doc_uri": f"doc-{i}-a"}),
                Document(page_content=f"The {river} flows through {city}; the city has {1000 + i} bridges and "
                                      "parks.", metadata={"doc_uri": f"doc-{i}-b"})]

    @mlflow.trace
    def app(question: str, i: int) -> str:
        retrieve(question, i)
        country, city, river = COUNTRIES[i % len(COUNTRIES)]
        return f"{city} is the capital of {country}. It lies on the {river} and has {1000 + i} bridges."

    def ask(i: int) -> str:
        country = COUNTRIES[i % len(COUNTRIES)][0]
        return app(f"What is the capital of {country}, and what river runs through it? (user {i})", i)

    return ask


def log_traces(experiment: str, start: int, n: int) -> tuple[list[str], float]:
    """``n`` new traces of the app in ``experiment``; their ids (oldest first) and the seconds it took."""
    import mlflow

    exp_id = mlflow.set_experiment(experiment).experiment_id
    ask = make_app()
    t0 = time.perf_counter()
    for i in range(start, start + n):
        ask(i)
    mlflow.flush_trace_async_logging()
    took = time.perf_counter() - t0
    ids = [t.info.trace_id for t in mlflow.search_traces(locations=[exp_id], return_type="list",
                                                          include_spans=False, max_results=100_000,
                                                          order_by=["timestamp_ms ASC"])]
    assert len(ids) >= n, f"{len(ids)} traces in the store, {n} logged"
    return ids[-n:], took


# ---------------------------------------------------------------------------------- the Feedback the monitor builds


def capture_feedback(judge: str, n: int = 12) -> list[tuple[list[Any], tuple[str, str] | None]]:
    """The ``(Feedback, tag)`` of each trace as a real pass hands them to ``attach_all`` (a throwaway SQLite store)."""
    import mlflow

    from mlflow_ragjudge.adapters.monitor_store import MonitorStore
    from mlflow_ragjudge.workflows.monitor import monitor_pass

    mlflow.set_tracking_uri(f"sqlite:///{WORK / 'capture.db'}")
    name = f"capture-{uuid.uuid4().hex[:6]}"
    log_traces(name, 0, n)
    got: list[tuple[list[Any], tuple[str, str] | None]] = []
    real = MonitorStore.attach_all

    def spy(self: MonitorStore, items: Any, should_stop: Any) -> Any:
        got.extend((copy.deepcopy(list(fbs)), mark) for _, fbs, mark, _ in items)
        return real(self, items, should_stop)

    MonitorStore.attach_all = spy  # type: ignore[method-assign]
    try:
        os.environ["RAGJUDGE_CACHE_DIR"] = str(WORK / f"cache-{uuid.uuid4().hex[:6]}")
        monitor_pass(name, judge, settle=0)
    finally:
        MonitorStore.attach_all = real  # type: ignore[method-assign]
    return got


def fresh(template: list[tuple[list[Any], tuple[str, str] | None]], trace_ids: list[str], tag: bool = True
          ) -> list[tuple[str, list[Any], tuple[str, str] | None]]:
    """The attach items for ``trace_ids``: each a copy of a captured trace's Feedback (ids cleared)."""
    items = []
    for k, tid in enumerate(trace_ids):
        fbs, mark = template[k % len(template)]
        fbs = copy.deepcopy(fbs)
        for fb in fbs:
            fb.trace_id, fb.assessment_id = tid, None
        items.append((tid, fbs, mark if tag else None, ()))
    return items


# ------------------------------------------------------------------------------------------------ part 1: attach


def tree_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` and its descendants, from /proc (0 without /proc)."""
    if pid is None or not Path("/proc").is_dir():
        return 0.0
    stats: dict[int, tuple[int, float]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            stats[int(d.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    family, total, grew = {pid}, 0.0, True
    while grew:
        more = {p for p, (ppid, _) in stats.items() if ppid in family} - family
        grew = bool(more)
        family |= more
    for p in family:
        total += stats.get(p, (0, 0.0))[1]
    return total


def ours(workers: int | None, tag: bool = True) -> Callable[[str, list[Any]], None]:
    def run(experiment: str, items: list[Any]) -> None:
        from mlflow_ragjudge.adapters.monitor_store import MonitorStore

        store = MonitorStore(experiment, workers=workers)
        if not tag:
            items = [(tid, fbs, None, ()) for tid, fbs, _, _ in items]
        done, errors = store.attach_all(items, lambda: False)
        assert len(done) == len(items) > 0 and not errors, errors[:3]
    return run


def users_loop(experiment: str, items: list[Any]) -> None:
    import mlflow

    for tid, fbs, _ in items:
        for fb in fbs:
            mlflow.log_feedback(trace_id=tid, name=fb.name, value=fb.value, rationale=fb.rationale, source=fb.source,
                                metadata=fb.metadata, error=fb.error)


LOOP = "mlflow.log_feedback loop (serial)"


def attach_part(label: str, uri: str, template: list[Any], args: argparse.Namespace, results: dict,
                server_pid: int | None) -> None:
    """Each variant attaches to ``--traces`` fresh traces in ``--rounds`` blocks; the variants take turns block by
    block (the order rotated each round), so a burst of load on the machine hits them alike; per variant the median
    over its blocks of wall ms per trace, and the CPU ms per trace of this process and of the server."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    remote = uri.startswith("http")
    variants: dict[str, Callable[[str, list[Any]], None]] = {
        f"ours ({8 if remote else 1} thread{'s' if remote else ''}, as a pass)": ours(None),
        LOOP: users_loop,
        "ours without the tag": ours(None, tag=False),
    }
    for w in ([1, 4, 16] if remote else [2]):
        variants[f"ours, {w} thread{'s' if w > 1 else ''}"] = ours(w)
    n, rounds = args.traces, args.rounds
    block = max(1, n // rounds)
    experiment = f"bench-attach-{uuid.uuid4().hex[:6]}"
    ids, took = log_traces(experiment, 0, block * rounds * len(variants))
    print(f"[{label}] {len(ids)} app traces logged: {took / len(ids) * 1000:.1f} ms per trace", flush=True)
    per = len(template[0][0])
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    srv: dict[str, list[float]] = {v: [] for v in variants}
    names = list(variants)
    slot = 0
    for r in range(rounds):
        for v in names[r % len(names):] + names[: r % len(names)]:
            items = fresh(template, ids[slot * block: (slot + 1) * block])  # copies made before the clock starts
            slot += 1
            s0, c0, t0 = tree_cpu(server_pid), time.process_time(), time.perf_counter()
            variants[v](experiment, items)
            wall[v].append((time.perf_counter() - t0) / block)
            cpu[v].append((time.process_time() - c0) / block)
            srv[v].append((tree_cpu(server_pid) - s0) / block)
        print(f"  [{label} round {r + 1}/{rounds}] " + ", ".join(f"{v}: {wall[v][-1] * 1000:.1f}" for v in names)
              + " ms/trace", flush=True)
    # what is on the traces: every variant wrote `per` Feedback to each of its traces
    traces = mlflow.search_traces(locations=[mlflow.set_experiment(experiment).experiment_id],
                                  return_type="list", include_spans=False, max_results=100_000)
    counts = Counter(len(t.info.assessments) for t in traces)
    assert counts == Counter({per: len(ids)}), counts
    base = statistics.median(wall[LOOP])
    for v in names:
        med = statistics.median(wall[v])
        entry = {"store": label, "variant": v, "traces": block * rounds, "blocks": rounds, "feedback_per_trace": per,
                 "ms_per_trace": round(med * 1000, 2), "ms_per_feedback": round(med * 1000 / per, 2),
                 "vs_log_feedback": round(med / base, 3),
                 "mean_ms_per_trace": round(statistics.fmean(wall[v]) * 1000, 2),
                 "cpu_ms_per_trace": round(statistics.median(cpu[v]) * 1000, 2),
                 "server_cpu_ms_per_trace": round(statistics.median(srv[v]) * 1000, 2) if remote else None,
                 "blocks_ms_per_trace": [round(t * 1000, 1) for t in wall[v]]}
        results.setdefault("attach", []).append(entry)
        print(json.dumps(entry), flush=True)


def fetch_part(label: str, uri: str, args: argparse.Namespace, results: dict) -> None:
    """The pass's fetch step (``MonitorStore.fetch``: ``TracingClient.get_trace`` per trace, 8 threads on a server)
    against MLflow's ``TracingClient.batch_get_traces`` (trace infos in one request, then the spans 10 traces a
    request), alternating, on ``--traces`` traces (read only: the same traces each round)."""
    import mlflow
    from mlflow.tracing.client import TracingClient

    from mlflow_ragjudge.adapters.monitor_store import MonitorStore

    mlflow.set_tracking_uri(uri)
    experiment = f"bench-fetch-{uuid.uuid4().hex[:6]}"
    ids, _ = log_traces(experiment, 0, args.traces)
    store = MonitorStore(experiment)
    client = TracingClient(uri)
    ways = {"MonitorStore.fetch (get_trace per trace)": lambda: store.fetch(ids),
            "TracingClient.batch_get_traces": lambda: {t.info.trace_id: t for t in client.batch_get_traces(ids)}}
    wall: dict[str, list[float]] = {w: [] for w in ways}
    rounds = max(3, min(args.rounds, 5))
    for r in range(rounds):
        for w in list(ways)[r % 2:] + list(ways)[: r % 2]:
            t0 = time.perf_counter()
            got = ways[w]()
            wall[w].append((time.perf_counter() - t0) / len(ids))
            assert len(got) == len(ids) and all(len(t.data.spans) == 2 for t in got.values()), w
    for w, times in wall.items():
        entry = {"store": label, "fetch": w, "traces": len(ids), "rounds": rounds,
                 "ms_per_trace": round(statistics.median(times) * 1000, 2),
                 "rounds_ms_per_trace": [round(t * 1000, 2) for t in times]}
        results.setdefault("fetch", []).append(entry)
        print(json.dumps(entry), flush=True)


# ------------------------------------------------------------------------------------------------ part 2: a whole pass


class Phases:
    """Wraps the monitor's functions with ``time.perf_counter`` (innermost first: a phase inside another is taken
    out of the outer one's time)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._undo: list[tuple[Any, str, Any]] = []
        self._stack: list[list[float]] = []

    def wrap(self, owner: Any, attr: str, phase: str) -> None:
        real = getattr(owner, attr)

        def timed(*a: Any, **kw: Any) -> Any:
            self._stack.append([0.0])
            t0 = time.perf_counter()
            try:
                return real(*a, **kw)
            finally:
                took = time.perf_counter() - t0
                inner = self._stack.pop()[0]
                self.spent[phase] = self.spent.get(phase, 0.0) + took - inner
                if self._stack:
                    self._stack[-1][0] += took

        setattr(owner, attr, timed)
        self._undo.append((owner, attr, real))

    def undo(self) -> None:
        for owner, attr, real in reversed(self._undo):
            setattr(owner, attr, real)
        self._undo.clear()


PHASES = ("setup", "list", "fetch", "read", "judge", "attach", "log", "other")


def one_pass(label: str, judge_label: str, judge: str, metrics: list[str] | None, n: int, server: ServerProcess | None,
             results: dict) -> None:
    from mlflow_ragjudge.adapters import monitor_store as ms
    from mlflow_ragjudge.workflows import monitor as mon

    experiment = f"bench-pass-{uuid.uuid4().hex[:6]}"
    log_traces(experiment, 0, n)
    os.environ["RAGJUDGE_CACHE_DIR"] = str(WORK / f"cache-{uuid.uuid4().hex[:6]}")  # every request sent
    before = server.stats()["request_count"] if server else 0
    ph = Phases()
    S = ms.MonitorStore
    ph.wrap(mon, "identify", "setup")
    ph.wrap(mon, "_parent_run", "setup")
    ph.wrap(S, "take_lease", "setup")
    ph.wrap(S, "release_lease", "setup")
    ph.wrap(S, "state", "setup")
    ph.wrap(S, "set_state", "setup")
    ph.wrap(S, "list_traces", "list")
    ph.wrap(S, "fetch", "fetch")
    ph.wrap(mon, "plan_work", "read")
    ph.wrap(mon, "judge_rows", "judge")
    ph.wrap(S, "attach_all", "attach")
    ph.wrap(S, "link", "log")
    ph.wrap(mon, "_calibrate", "log")
    ph.wrap(mon, "_log_pass", "log")
    try:
        t0 = time.perf_counter()
        result = mon.monitor_pass(experiment, judge, metrics, settle=0, max_traces=n)
        total = time.perf_counter() - t0
    finally:
        ph.undo()
    assert len(result.judged) == n and not result.errors, (len(result.judged), result.errors[:3])
    spent = dict(ph.spent)
    spent["other"] = total - sum(spent.values())
    requests = (server.stats()["request_count"] - before) if server else 0
    entry = {"store": label, "judge": judge_label, "traces": n, "feedback": result.attached,
             "judge_requests": requests, "total_s": round(total, 2),
             "ms_per_trace": round(total / n * 1000, 1),
             **{f"{p}_ms_per_trace": round(spent.get(p, 0.0) / n * 1000, 2) for p in PHASES},
             **{f"{p}_share": round(spent.get(p, 0.0) / total, 3) for p in PHASES}}
    results.setdefault("pass", []).append(entry)
    print(f"  [{label} pass, {judge_label}] {n} traces, {result.attached} Feedback, {requests} judge requests: "
          f"{total:.1f} s = {total / n * 1000:.0f} ms/trace; "
          + ", ".join(f"{p} {spent.get(p, 0.0) / n * 1000:.1f}" for p in PHASES) + " (ms/trace)", flush=True)


# ------------------------------------------------------------------------------------------------ main


def run_store(label: str, uri: str, template: list[Any], server: ServerProcess, args: argparse.Namespace,
              results: dict, server_pid: int | None = None) -> None:
    import mlflow

    mlflow.set_tracking_uri(uri)
    os.environ["MLFLOW_TRACKING_URI"] = uri
    if "attach" in args.parts:
        attach_part(label, uri, template, args, results, server_pid)
    if "fetch" in args.parts:
        fetch_part(label, uri, args, results)
    if "pass" in args.parts:
        for _ in range(args.pass_rounds):
            # the offline judge cannot run answer relevancy: the two default metrics it can run
            one_pass(label, "offline:/lexical", "offline:/lexical", ["faithfulness", "context_relevance"],
                     args.traces, None, results)
            one_pass(label, f"fake LLM, {args.latency:g} s", f"openai:/{JUDGE_MODEL}?base_url={server.url}", None,
                     args.traces, server, results)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=10, help="blocks per attach variant (medians over them)")
    ap.add_argument("--pass-rounds", type=int, default=1)
    ap.add_argument("--latency", type=float, default=0.2, help="the fake LLM judge's seconds per request")
    ap.add_argument("--stores", default="sqlite,server")
    ap.add_argument("--parts", default="attach,fetch,pass")
    ap.add_argument("--server-workers", type=int, default=1, help="the mlflow server's worker processes")
    ap.add_argument("--json")
    args = ap.parse_args()

    import mlflow

    results: dict[str, Any] = {"args": vars(args), "python": sys.version.split()[0], "mlflow": mlflow.__version__}
    try:
        with ServerProcess(SERVER_SCRIPT, str(ROOT / "tests"), str(args.latency)) as server:
            template = capture_feedback(f"openai:/{JUDGE_MODEL}?base_url={server.url}")
            print(f"captured the Feedback of {len(template)} traces ({len(template[0][0])} per trace: "
                  f"{', '.join(fb.name for fb in template[0][0])})", flush=True)
            stores = args.stores.split(",")
            if "sqlite" in stores:
                run_store("sqlite", f"sqlite:///{WORK / 'bench.db'}", template, server, args, results)
            if "server" in stores:
                label = "server" if args.server_workers == 1 else f"server ({args.server_workers} workers)"
                from mlflow_ui import start_server

                (WORK / "server").mkdir()
                proc, url = start_server(WORK / "server", workers=args.server_workers)
                try:
                    run_store(label, url, template, server, args, results, proc.pid)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    print("\n" + table(results))
    print("\ncommand: python benchmarks/monitor_attach.py " + " ".join(sys.argv[1:]))
    return 0


def table(results: dict) -> str:
    lines = []
    if results.get("attach"):
        lines += ["| store | attach step | ms per trace | ms per Feedback | / log_feedback loop | client CPU ms "
                  "per trace | server CPU ms per trace |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {e['store']} | {e['variant']} | {e['ms_per_trace']:.1f} | {e['ms_per_feedback']:.1f} | "
                  f"{e['vs_log_feedback']:.2f} | {e['cpu_ms_per_trace']:.1f} | "
                  + (f"{e['server_cpu_ms_per_trace']:.1f}" if e["server_cpu_ms_per_trace"] is not None else "-")
                  + " |" for e in results["attach"]]
    if results.get("fetch"):
        lines += ["", "| store | fetch step | ms per trace |", "|---|---|---|"]
        lines += [f"| {e['store']} | {e['fetch']} | {e['ms_per_trace']:.2f} |" for e in results["fetch"]]
    if results.get("pass"):
        lines += ["", "| store | judge | ms per trace | " + " | ".join(PHASES) + " |",
                  "|---|---|---|" + "---|" * len(PHASES)]
        lines += [f"| {e['store']} | {e['judge']} | {e['ms_per_trace']:.0f} | "
                  + " | ".join(f"{e[p + '_ms_per_trace']:.1f} ({e[p + '_share']:.0%})" for p in PHASES) + " |"
                  for e in results["pass"]]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
