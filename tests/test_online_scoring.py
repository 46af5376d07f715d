"""MLflow 3.18's online scoring (``Scorer.register()`` / ``.start()``, run by the tracking server's job runner) with
our scorers, on a real ``mlflow server`` with job execution and a SQLite store (docs/online-scoring.md).

What the open-source server does, checked here rather than assumed:

* a class-based scorer (``Faithfulness(...)``) is refused when registered, before any request;
* the ``@scorer`` form (``online_scorer``) is refused by a server that does not run custom scorers, registered by one
  that does (``MLFLOW_SERVER_ENABLE_CUSTOM_SCORERS=true``), and its ``.start()`` is refused unless custom scorers run
  in job containers (``MLFLOW_JOB_CUSTOM_SCORER_EXECUTOR_BACKEND=docker``), which a server without a Docker daemon
  refuses to start with;
* the job container's half of online scoring -- MLflow's own functions: the host fetches the traces, the container
  rebuilds the stored scorer from its text and scores them, the host logs the Feedback -- run here without Docker,
  the container's half in a process without a network (``unshare``): the offline judge's Feedback lands on the
  app's own traces with our judge-identity metadata; an LLM judge cannot be reached from there. With a network (an
  executor that had one), the same stored scorer is judged by the fake judge server.

Runs on MLflow >= 3.18 only (scripts/test_mlflow_versions.sh's 3.18 step); skips on older MLflow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pytest
from compliant_model import CompliantModel
from fakellm import FakeLLMServer
from mlflow.entities import Document, SpanType
from mlflow_ui import free_port, start_server
from packaging.version import Version

from mlflow_ragjudge.adapters.scorers import Faithfulness
from mlflow_ragjudge.engine.identity import judge_id

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    Version(mlflow.__version__).release < (3, 18),
    reason=f"online scoring in the open-source tracking server needs MLflow >= 3.18 (this is {mlflow.__version__}); "
           "runs in scripts/test_mlflow_versions.sh's MLflow 3.18 step")]

DOCS = [("d1", "Paris is the capital and the largest city of France."),
        ("d2", "The Seine flows through Paris before it reaches the sea.")]
ANSWER = "Paris is the capital of France. It lies on the Seine."
QUESTIONS = ["What is the capital of France?", "Which river flows through Paris?", "Name the French capital."]


@pytest.fixture
def judge_llm() -> Iterator[FakeLLMServer]:
    """The judge's server: the independent schema-following model, which knows none of our prompts."""
    server = FakeLLMServer().start()
    server.set_handler(CompliantModel("json_schema"))
    yield server
    server.stop()


@pytest.fixture
def server(tmp_path, monkeypatch, fresh_tracking_uri) -> Iterator[tuple[str, Path]]:
    """A real ``mlflow server`` (this MLflow) with job execution, running custom scorers, on SQLite; (url, db)."""
    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_CUSTOM_SCORERS", "true")
    fresh_tracking_uri(tmp_path / "mlflow.db")
    proc, url = start_server(tmp_path, jobs=True)
    mlflow.set_tracking_uri(url)
    yield url, tmp_path / "mlflow.db"
    proc.terminate()
    proc.wait(timeout=30)


def _log_app_traces(experiment: str) -> tuple[str, list[str]]:
    """A small traced RAG app (a RETRIEVER span under the root) answering :data:`QUESTIONS`; (experiment id, trace
    ids)."""
    exp_id = mlflow.set_experiment(experiment).experiment_id

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(query: str) -> list[Document]:
        return [Document(page_content=text, metadata={"doc_uri": doc_id}) for doc_id, text in DOCS]

    @mlflow.trace
    def answer(question: str) -> str:
        retrieve(question)
        return ANSWER

    for q in QUESTIONS:
        answer(q)
    mlflow.flush_trace_async_logging()
    ids = [t.info.trace_id for t in mlflow.search_traces(locations=[exp_id], return_type="list")]
    assert len(ids) == len(QUESTIONS)
    return exp_id, ids


def _offline_versions() -> dict[str, str]:
    from mlflow_ragjudge.metrics.offline import resolve_offline

    return {"offline_judge": resolve_offline("offline:/lexical").version}


def _container_half(serialized: str, exp_id: str, trace_ids: list[str], db: Path, workdir: Path,
                    network: bool) -> tuple[Any, float]:
    """Online scoring's job-container path, MLflow's own functions, without Docker: the host fetches the traces into
    an input folder (``_plan_invoke_scorer_job_for_docker``), a separate process -- without a network unless
    ``network`` -- rebuilds the stored scorer and scores them (``_score_traces_from_file``, what the container
    runs), and the host checks its output and logs the Feedback on the traces (the plan's ``finalize``)."""
    from mlflow.genai.scorers.job import _plan_invoke_scorer_job_for_docker
    from mlflow.server.constants import BACKEND_STORE_URI_ENV_VAR

    os.environ[BACKEND_STORE_URI_ENV_VAR] = f"sqlite:///{db}"  # as on the job runner: the server's backend store
    workdir.mkdir()
    plan = _plan_invoke_scorer_job_for_docker(
        params={"experiment_id": exp_id, "serialized_scorer": serialized, "trace_ids": trace_ids,
                "scorer_version": 1, "log_assessments": True},
        input_dir=workdir, container_input_dir=str(workdir))
    code = ("import json, sys, importlib; mod, fn = sys.argv[1].rsplit('.', 1); "
            "print(json.dumps(getattr(importlib.import_module(mod), fn)(**json.loads(sys.argv[2]))))")
    cmd = [sys.executable, "-c", code, plan.fn_fullname, json.dumps(plan.params)]
    if not network:
        cmd = ["unshare", "--map-root-user", "--net", *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", BACKEND_STORE_URI_ENV_VAR))}
    env["MLFLOW_SERVER_ENABLE_CUSTOM_SCORERS"] = "true"  # the operator's opt-in, as in the container's environment
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir, timeout=600)
    seconds = time.monotonic() - start
    assert out.returncode == 0, out.stderr[-3000:]
    return plan.finalize(json.loads(out.stdout.strip().splitlines()[-1])), seconds


def _feedbacks(trace_ids: list[str], name: str) -> dict[str, Any]:
    found = {}
    for tid in trace_ids:
        fbs = [a for a in mlflow.get_trace(tid).search_assessments(name=name) if a.feedback is not None]
        if fbs:
            (found[tid],) = fbs
    return found


def _network_namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--map-root-user", "--net", "true"], capture_output=True).returncode == 0


def test_online_scoring_with_our_scorers(server, judge_llm, tmp_path):
    from mlflow.genai.scorers import ScorerSamplingConfig
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from mlflow_ragjudge.adapters.online import online_scorer

    url, db = server
    exp_id, trace_ids = _log_app_traces("rag-app")
    judge = f"openai:/judge-m?base_url={judge_llm.openai_base_url}"

    # 1. a class-based scorer: refused by the client before anything is sent
    with pytest.raises(mlflow.exceptions.MlflowException) as refused:
        Faithfulness(judge=judge, cache=False).register(experiment_id=exp_id)
    assert "Scorer must be a builtin or decorator scorer to be registered. Got ScorerKind.CLASS." in str(refused.value)

    # 2. the @scorer form: registered by the server; started only with job containers (none on this server)
    offline = online_scorer("faithfulness", "offline:/lexical").register(experiment_id=exp_id)
    llm = online_scorer("faithfulness", judge).register(experiment_id=exp_id)
    assert (offline.name, llm.name) == ("faithfulness_offline", "faithfulness")
    with pytest.raises(mlflow.exceptions.MlflowException) as not_started:
        llm.start(experiment_id=exp_id, sampling_config=ScorerSamplingConfig(sample_rate=1.0))
    assert ("Scorer 'faithfulness' does not use a gateway model. Automatic evaluation is only supported for scorers "
            "that use gateway models.") in str(not_started.value)

    # 3. the job container's half, MLflow's own code, on the scorers as the server stored them
    store = SqlAlchemyStore(f"sqlite:///{db}", str(tmp_path / "artifacts"))
    stored = {name: store.get_scorer(exp_id, name)._serialized_scorer for name in ("faithfulness_offline",
                                                                                  "faithfulness")}
    if _network_namespaces():
        # without a network, as in a job container: the offline judge scores every trace
        result, seconds = _container_half(stored["faithfulness_offline"], exp_id, trace_ids, db,
                                          tmp_path / "c1", network=False)
        print(f"\noffline judge, network-less: {len(trace_ids)} traces in {seconds:.1f} s")
        got = _feedbacks(trace_ids, "faithfulness_offline")
        assert set(got) == set(trace_ids)  # the app's own traces, no new ones
        assert len(mlflow.search_traces(locations=[exp_id], return_type="list")) == len(trace_ids)
        offline_id = judge_id("faithfulness", "offline:/lexical", _offline_versions(), {})
        for fb in got.values():
            assert fb.value is not None and fb.error is None
            assert fb.metadata["ragjudge.judge_id"] == offline_id
            assert fb.metadata["ragjudge.judge"] == "offline:/lexical"
            assert fb.metadata["mlflow.assessment.scorerName"] == "faithfulness_offline"  # the host adds it
            assert fb.source.source_type == "CODE"  # the host keeps no source the container claims
        # ... and an LLM judge cannot be reached: every trace gets a failed Feedback, no request arrives
        before = len(judge_llm.requests)
        result, seconds = _container_half(stored["faithfulness"], exp_id, trace_ids, db, tmp_path / "c2",
                                          network=False)
        print(f"LLM judge, network-less: {len(trace_ids)} traces failed in {seconds:.1f} s")
        failed = _feedbacks(trace_ids, "faithfulness")
        assert set(failed) == set(trace_ids)
        assert all(fb.value is None and fb.error is not None for fb in failed.values())
        assert len(judge_llm.requests) == before
        print("the LLM judge's error:", next(iter(failed.values())).error.error_code)
    else:
        print("\nno network namespaces here (unshare): the network-less run is left out")

    # with a network (an executor that had one): the same stored scorer, judged by the fake judge server
    result, seconds = _container_half(stored["faithfulness"], exp_id, trace_ids, db, tmp_path / "c3", network=True)
    print(f"LLM judge, with a network: {len(trace_ids)} traces in {seconds:.1f} s, {len(judge_llm.requests)} requests")
    assert judge_llm.requests
    from mlflow_ragjudge.llm.backends import resolve_backend
    from mlflow_ragjudge.llm.prompts import load_prompt

    uri = resolve_backend(judge).uri
    versions = {n: f"{p.name}-v{p.version}-{p.language}"
                for n, p in (("statements", load_prompt("statements")), ("faithfulness", load_prompt("faithfulness")))}
    for tid in trace_ids:
        fbs = [a for a in mlflow.get_trace(tid).search_assessments(name="faithfulness") if a.feedback is not None
               and a.error is None]
        assert len(fbs) == 1, [(a.value, a.error) for a in fbs]
        assert fbs[0].value is not None
        assert fbs[0].metadata["ragjudge.judge_id"] == judge_id("faithfulness", uri, versions, {})
        assert fbs[0].metadata["ragjudge.judge"] == uri
    # a trace that already has this judgment (same name and judge identity, not an error: attached by an earlier
    # pass or by `ragjudge monitor`) is not judged again: no request, no new Feedback
    sent, count = len(judge_llm.requests), {tid: len(_all_feedback(tid, "faithfulness")) for tid in trace_ids}
    again, _ = _container_half(stored["faithfulness"], exp_id, trace_ids, db, tmp_path / "c4", network=True)
    assert again == {tid: {"assessments": [], "failures": []} for tid in trace_ids}
    assert len(judge_llm.requests) == sent
    assert {tid: len(_all_feedback(tid, "faithfulness")) for tid in trace_ids} == count


def _all_feedback(trace_id: str, name: str) -> list[Any]:
    return [a for a in mlflow.get_trace(trace_id).search_assessments(name=name) if a.feedback is not None]


def test_custom_scorers_off_the_server_refuses_registration(tmp_path, monkeypatch, fresh_tracking_uri, judge_llm):
    from mlflow_ragjudge.adapters.online import online_scorer

    monkeypatch.delenv("MLFLOW_SERVER_ENABLE_CUSTOM_SCORERS", raising=False)
    fresh_tracking_uri(tmp_path / "mlflow.db")
    proc, url = start_server(tmp_path, jobs=True)
    try:
        mlflow.set_tracking_uri(url)
        exp_id = mlflow.set_experiment("rag-app").experiment_id
        with pytest.raises(mlflow.exceptions.MlflowException) as refused:
            online_scorer("faithfulness", "offline:/lexical").register(experiment_id=exp_id)
        assert "Custom scorer registration (using @scorer decorator) is disabled by default" in str(refused.value)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_job_containers_need_a_docker_daemon(tmp_path):
    """Custom scorers run online only in job containers: a server asked for them (the docker executor) checks for a
    Docker daemon when it starts, and exits when there is none."""
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="true", MLFLOW_SERVER_ENABLE_CUSTOM_SCORERS="true",
               MLFLOW_JOB_CUSTOM_SCORER_EXECUTOR_BACKEND="docker", MLFLOW_SERVER_JOB_EXECUTION_ENGINE="executor",
               MLFLOW_DISABLE_TELEMETRY="true")
    try:
        import docker

        docker.from_env().ping()
        pytest.skip("a Docker daemon answers here: the server would start")
    except Exception:
        pass
    out = subprocess.run(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(free_port()),
         "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--workers", "1"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode != 0
    assert ("The docker job executor cannot reach the Docker daemon" in out.stderr
            or "The docker job executor requires the 'docker' package" in out.stderr), out.stderr[-2000:]
