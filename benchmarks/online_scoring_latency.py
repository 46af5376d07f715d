"""How long MLflow 3.18's online scoring takes to judge a new trace, on a real ``mlflow server`` with job execution
and SQLite (docs/online-scoring.md#timing-when-a-started-scorer-judges-a-trace).

Our scorers cannot be started online on a server without Docker job containers (docs/online-scoring.md), so this
times the one kind the open-source server runs on its own: MLflow's ``make_judge`` on an AI-gateway endpoint of the
server, the endpoint pointing at the fake judge server (``tests/fakellm.py`` + ``tests/compliant_model.py``). It logs
three traces of a small traced app, then polls every 5 s, up to ``--bound`` seconds, for the judge's Feedback on
them, and prints the seconds from logging to the first and to the last. With MLflow 3.18.0 laid over (as
scripts/test_mlflow_versions.sh does):

    PYTHONPATH=.mlflow-overlay/3.18.0:$PWD .venv/bin/python benchmarks/online_scoring_latency.py [--bound 900]

``MLFLOW_ONLINE_SCORING_DEFAULT_TRACE_COMPLETION_BUFFER_SECONDS`` (default 300) and the other server settings are
read from the environment by the server it starts. The gateway refuses upstreams on private addresses (the fake
server is on 127.0.0.1) unless ``MLFLOW_GATEWAY_API_BASE_ALLOW_PRIVATE_IPS=true``, which this script sets for its
server; without it every Feedback is an error, but arrives as late.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import mlflow  # noqa: E402
from compliant_model import CompliantModel  # noqa: E402
from fakellm import FakeLLMServer  # noqa: E402
from mlflow.entities import Document, SpanType  # noqa: E402
from mlflow_ui import start_server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bound", type=float, default=900, help="give up after this many seconds (default 900)")
    args = ap.parse_args()
    from mlflow.entities.gateway_endpoint import GatewayEndpointModelConfig, GatewayModelLinkageType
    from mlflow.genai.judges import make_judge
    from mlflow.genai.scorers import ScorerSamplingConfig
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    os.environ.setdefault("MLFLOW_CRYPTO_KEK_PASSPHRASE", "online-scoring-latency-benchmark")
    os.environ.setdefault("MLFLOW_GATEWAY_API_BASE_ALLOW_PRIVATE_IPS", "true")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    fake = FakeLLMServer().start()
    fake.set_handler(CompliantModel("json_schema"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = SqlAlchemyStore(f"sqlite:///{work / 'mlflow.db'}", str(work / "artifacts"))
        secret = store.create_gateway_secret(secret_name="fake", secret_value={"api_key": "sk-fake"},
                                             provider="openai", auth_config={"api_base": fake.openai_base_url})
        model = store.create_gateway_model_definition(name="fake-judge", secret_id=secret.secret_id,
                                                      provider="openai", model_name="judge-m")
        store.create_gateway_endpoint(name="judge", usage_tracking=False, model_configs=[GatewayEndpointModelConfig(
            model_definition_id=model.model_definition_id, linkage_type=GatewayModelLinkageType.PRIMARY)])
        proc, url = start_server(work, jobs=True)
        try:
            mlflow.set_tracking_uri(url)
            exp_id = mlflow.set_experiment("rag-app").experiment_id
            judge = make_judge(name="answers_question", model="gateway:/judge", feedback_value_type=str,
                               instructions="Does {{ outputs }} answer {{ inputs }}? Answer yes or no.")
            judge.register(experiment_id=exp_id).start(experiment_id=exp_id,
                                                       sampling_config=ScorerSamplingConfig(sample_rate=1.0))

            @mlflow.trace(span_type=SpanType.RETRIEVER)
            def retrieve(query: str) -> list[Document]:
                return [Document(page_content="Paris is the capital of France.", metadata={"doc_uri": "d1"})]

            @mlflow.trace
            def answer(question: str) -> str:
                retrieve(question)
                return "Paris."

            for q in ("What is the capital of France?", "Name the French capital.", "Capital of France?"):
                answer(q)
            mlflow.flush_trace_async_logging()
            logged = time.time()
            ids = [t.info.trace_id for t in mlflow.search_traces(locations=[exp_id], return_type="list")]
            first = None
            while time.time() - logged < args.bound:
                done = {tid: fb for tid in ids
                        for fb in mlflow.get_trace(tid).search_assessments(name="answers_question")[:1]}
                if done and first is None:
                    first = time.time() - logged
                if len(done) == len(ids):
                    fb, last = next(iter(done.values())), time.time() - logged
                    print(f"{len(ids)} traces: first Feedback {first:.0f} s after logging, all {last:.0f} s; "
                          f"{len(fake.requests)} judge requests; e.g. value={fb.value!r} error="
                          f"{fb.error.error_code if fb.error else None}")
                    return
                time.sleep(5)
            print(f"within {args.bound:.0f} s: {len(done)} of {len(ids)} traces judged")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            fake.stop()


if __name__ == "__main__":
    main()
