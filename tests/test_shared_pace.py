"""One ``requests_per_minute`` for several processes (mlflow_ragjudge.llm.shared_pace; issue 38).

Processes that name the same pace file space their starts as one process does, so together they stay under the
provider's limit; a process that cannot use the file paces alone and loses nothing. The processes here are real
(spawned), each with its own judge client and threads, against one fake server whose limiter counts a sliding
window: the server's own count is what is asserted, not our bookkeeping.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mlflow_ragjudge.llm.backends import ChatRequest
from mlflow_ragjudge.llm.backends.base import BackendError, ErrorKind, RateInfo
from mlflow_ragjudge.llm.client import JudgeClient
from mlflow_ragjudge.llm.gate import ProviderGate
from mlflow_ragjudge.llm.shared_pace import SharedPace, SharedPaceWarning

KEY = "sk-test-shared-pace"


def _send(url: str, pace: str | None, rpm: float, calls: int, start_at: float, out: multiprocessing.Queue) -> None:
    """One process of a job: ``calls`` requests from 8 threads, paced at ``rpm`` (with the pace file ``pace``)."""
    os.environ["OPENAI_API_KEY"] = KEY
    os.environ["RAGJUDGE_BACKOFF_SCALE"] = "0"
    client = JudgeClient(f"openai:/judge-model?base_url={url}", cache=False, requests_per_minute=rpm,
                         shared_pace=pace, max_attempts=1)
    time.sleep(max(0.0, start_at - time.time()))  # both processes begin together
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(
            lambda i: client.call(ChatRequest.of([{"role": "user", "content": f"{os.getpid()} {i}"}])),
            range(calls)))
    out.put({"ok": sum(r.ok for r in results), "failed": [r.error for r in results if not r.ok][:3]})


def _two_processes(fake_llm, pace: Path | None, rpm: float, calls: int) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 4.0  # past both processes' imports
    procs = [ctx.Process(target=_send, args=(fake_llm.openai_base_url, str(pace) if pace else None, rpm, calls,
                                             start_at, out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return got


def _most_in_any_window(times: list[float], window: float) -> int:
    times = sorted(times)
    most, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        most = max(most, i - j + 1)
    return most


@pytest.mark.slow
def test_two_processes_sharing_a_pace_file_never_exceed_the_limit_together(fake_llm, tmp_path):
    # the server takes 20 requests per sliding 4 s (300 a minute); each process is told 270 a minute (the key's
    # limit less the 10 % a job leaves for the jitter of its requests' way to the server: this machine is shared)
    fake_llm.rate_limit_per_minute, fake_llm.rate_limit_window = 20, 4.0
    fake_llm.rate_limit_headers = False
    # each process alone paces at 270, so two of them without the file send nearly twice what the server takes
    alone = _two_processes(fake_llm, None, 270, 16)
    assert fake_llm.rate_limited_count > 0, alone
    fake_llm.reset()
    together = _two_processes(fake_llm, tmp_path / "job.pace", 270, 16)
    arrivals = [r.received_at for r in fake_llm.requests]
    assert fake_llm.rate_limited_count == 0, _most_in_any_window(arrivals, 4.0)
    assert [g["ok"] for g in together] == [16, 16], together
    assert len(arrivals) == 32 and _most_in_any_window(arrivals, 4.0) <= 20
    # and the starts were one pace: 32 starts 60 / (0.99 x 270) s apart take 31 such gaps at least
    assert max(arrivals) - min(arrivals) >= 31 * 60 / (0.99 * 270) - 0.5


def test_claims_from_two_connections_are_spaced_as_one_pace(tmp_path):
    # two SharedPace objects on one file are two processes' connections: their claims interleave on one pace
    a, b = SharedPace(tmp_path / "p.pace"), SharedPace(tmp_path / "p.pace")
    now = time.time()
    starts = [(a if i % 2 else b).claim("openai|http://x", 0.5, now) for i in range(6)]
    assert starts == pytest.approx([now + 0.5 * i for i in range(6)])
    # another connection key has its own pace
    assert a.claim("openai|http://y", 0.5, now) == pytest.approx(now)
    # a claim later than the pace's next start is taken as asked
    assert b.claim("openai|http://x", 0.5, now + 100) == pytest.approx(now + 100)
    a.close()
    b.close()


def test_a_pace_file_that_cannot_be_used_is_said_once_and_the_process_paces_alone(tmp_path, fake_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    bad = blocker / "job.pace"  # its folder is a file: it cannot be created
    gate = ProviderGate()
    gate.configure(None, 6000, shared_pace=bad, connection="openai|http://z")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        starts = [gate.rpm.schedule(100.0) for _ in range(3)]
    said = [w for w in caught if issubclass(w.category, SharedPaceWarning)]
    assert len(said) == 1 and str(bad) in str(said[0].message) and "paces its requests_per_minute alone" in str(
        said[0].message)
    assert starts == pytest.approx([100.0, 100.01, 100.02], abs=1e-3)  # 6000/min at 99 %: 0.0101 s apart
    # and a client with it loses no call
    client = JudgeClient(f"openai:/judge-model?base_url={fake_llm.openai_base_url}", cache=False,
                         requests_per_minute=6000, shared_pace=tmp_path / "a-file" / "other.pace")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SharedPaceWarning)
        assert all(client.call(ChatRequest.of([{"role": "user", "content": str(i)}])).ok for i in range(3))


def test_the_setting_is_checked_before_any_call():
    with pytest.raises(ValueError, match="shared_pace=.* must be None or the path of a pace file"):
        JudgeClient("openai:/m?base_url=http://127.0.0.1:9", cache=False, shared_pace=3, check_ready=False)
    from mlflow_ragjudge.engine.config import RagJudgeConfig

    with pytest.raises(Exception, match="shared_pace"):
        RagJudgeConfig.from_dict({"judge": "offline:/lexical", "shared_pace": 3})


def test_a_429_one_process_got_is_waited_out_and_learned_by_the_others(tmp_path):
    """Two gates on one pace file (as two processes, each with its own connection to it): a 429 with ``retry-after``
    in one is written to the file; the other holds a request already started on its way out, waits the quiet out
    before its next start, and learns from it as from its own 429 (the job meets the wall once, not once per
    process). Without the file, the other knows nothing."""
    path = tmp_path / "job.pace"
    first, second = ProviderGate(), ProviderGate()
    first.configure(shared_pace=path, connection="openai|https://x")
    # its own connection to the file: another process's view of it
    second.rpm.shared, second.rpm.connection = SharedPace(path), "openai|https://x"
    started = second.acquire()
    first.cool_down(1.2)
    time.sleep(2 * SharedPace.QUIET_READ_EVERY)  # (a process reads the file's quiet at most that often)
    with pytest.raises(BackendError) as held:
        second.before_wire()
    assert held.value.kind is ErrorKind.HELD and 0.5 < held.value.retry_after <= 1.2
    second.release()
    ticket = second.acquire()
    assert ticket.seq == started.seq + 1 and ticket.waited >= 0.5  # (at least the rest of the quiet)
    assert second.learned.last_429 > 0  # learned from: taken as its own 429
    second.release()

    alone = ProviderGate()
    alone.configure(connection="openai|https://x")
    first.cool_down(1.0)
    time.sleep(2 * SharedPace.QUIET_READ_EVERY)
    alone.acquire()
    alone.before_wire()  # nothing to hold it: no file
    assert alone.learned.last_429 < 0


def test_an_announced_budget_is_split_between_the_processes_of_a_pace_file(tmp_path):
    """The budget a server announces in its headers is the key's: two processes of one pace file that both send on
    the connection each take half of the ``remaining`` their replies announce (at the window's turn both would
    otherwise spend the same requests); alone, a process takes all of it."""
    path = tmp_path / "job.pace"
    gates = []
    for pid in (101, 202):  # two processes' views of the file
        gate = ProviderGate()
        gate.rpm.shared, gate.rpm.connection = SharedPace(path), "openai|https://x"
        gate.rpm.shared.pid = pid
        gates.append(gate)
    gates[0].observe(0.1, RateInfo(remaining=40, limit=600, reset=10.0))
    assert gates[0].budget.left == 40  # the only one that has sent so far
    gates[1].observe(0.1, RateInfo(remaining=40, limit=600, reset=10.0))
    assert gates[1].budget.left == 20  # two senders now: its half
    time.sleep(SharedPace.USERS_EVERY + 0.05)
    gates[0].observe(0.1, RateInfo(remaining=30, limit=600, reset=10.0))
    assert gates[0].budget.left == 15
    alone = ProviderGate()
    alone.observe(0.1, RateInfo(remaining=30, limit=600, reset=10.0))
    assert alone.budget.left == 30
