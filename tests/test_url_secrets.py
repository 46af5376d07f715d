"""A secret in a base URL's query (``...?base_url=http://gateway/v1?token=...``): the SDKs appended the request path
after the query (``/v1?token=Tchat/completions``, a 404 that echoed the token), and the token reached stderr, the
transcripts, the per-row table, config.json and a run tag. Now the query goes to the server as a query on every
request, after the path, and its values are scrubbed like passwords wherever a URI is shown, logged or saved
(docs/failure-modes.md, "Secrets in URLs")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from compliant_model import CompliantModel
from fakellm import Reply
from mlflow.tracking import MlflowClient

from mlflow_ragjudge.adapters.tracking import safe_tracking_uri
from mlflow_ragjudge.llm.backends import ChatRequest, resolve_backend, safe_judge_uri
from mlflow_ragjudge.llm.backends.anthropic import AnthropicBackend

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "SECRET-query-token-7f3a9c"
ROWS = [
    {"question": "What is the capital of France?", "answer": "Paris is the capital of France.",
     "contexts": ["Paris is the capital and largest city of France."], "reference": "Paris"},
    {"question": "Who wrote Hamlet?", "answer": "Hamlet was written by Shakespeare.",
     "contexts": ["Hamlet is a tragedy written by William Shakespeare."], "reference": "William Shakespeare"},
]


def _evaluate(tmp_path: Path, judge: str) -> tuple[subprocess.CompletedProcess, str]:
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in ROWS), encoding="utf-8")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-url-secrets", "MLFLOW_TRACKING_URI": uri,
           "RAGJUDGE_CACHE_DIR": str(tmp_path / "cache"), "RAGJUDGE_OUTPUT_DIR": str(tmp_path / "outputs"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "mlflow_ragjudge", "evaluate", str(data), "--judge", judge,
                           "--metrics", "correctness,faithfulness", "--experiment", "url-secrets"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    return proc, uri


def _assert_nowhere(tmp_path: Path, proc: subprocess.CompletedProcess, uri: str) -> None:
    """The token is in no output, no file under the run's folder (the tracking database, every artifact: the
    per-row table, transcripts, config.json; the cache; saved outputs) and no param, tag or name of any run."""
    assert TOKEN not in proc.stdout and TOKEN not in proc.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "rows.jsonl"]
    assert any(p.name == "config.json" for p in files) and any("transcripts" in p.name for p in files)
    leaked = [str(p) for p in files if TOKEN.encode() in p.read_bytes()]
    assert not leaked, leaked
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("url-secrets")
    runs = client.search_runs([exp.experiment_id])
    assert runs
    for run in runs:
        blob = json.dumps([run.info.run_name, run.data.params, run.data.tags, run.data.metrics])
        assert TOKEN not in blob


@pytest.mark.slow
def test_a_token_in_the_base_url_query_reaches_the_server_as_a_query_and_nowhere_else(fake_llm, tmp_path):
    fake_llm.set_handler(CompliantModel("json_schema"))
    judge = f"openai:/judge-model?base_url={fake_llm.openai_base_url}?token={TOKEN}"
    proc, uri = _evaluate(tmp_path, judge)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # every request went to the API's path, with the token as a query parameter
    assert fake_llm.requests and all(r.path == "/v1/chat/completions" for r in fake_llm.requests)
    assert all(r.query == {"token": [TOKEN]} for r in fake_llm.requests)
    _assert_nowhere(tmp_path, proc, uri)
    # what is recorded says a token was given, not what it is
    config = json.loads(next(tmp_path.rglob("config.json")).read_text(encoding="utf-8"))
    assert "token=***" in json.dumps(config)


@pytest.mark.slow
def test_a_server_that_echoes_the_token_in_its_errors_does_not_leak_it(fake_llm, tmp_path):
    def echoing(request):  # a real server's 404 names the URL it was asked for, query and all
        query = "&".join(f"{k}={v[0]}" for k, v in request.query.items())
        return Reply.error(404, f"Unknown request URL: POST {request.path}?{query}. Please check the URL.")

    fake_llm.set_handler(echoing)
    proc, uri = _evaluate(tmp_path, f"openai:/judge-model?base_url={fake_llm.openai_base_url}?token={TOKEN}")
    assert proc.returncode == 3, proc.stderr[-3000:]  # every row failed, each with its reason
    assert "Unknown request URL: POST /v1/chat/completions?token=***" in proc.stderr
    _assert_nowhere(tmp_path, proc, uri)


def test_anthropic_and_embeddings_requests_carry_the_query_after_the_path(fake_llm):
    anth = AnthropicBackend("claude-test", base_url=f"{fake_llm.anthropic_base_url}?token={TOKEN}", api_key="k-1")
    fake_llm.script("fine")
    assert anth.chat(ChatRequest.of([{"role": "user", "content": "hi"}]), timeout=10).text == "fine"
    assert fake_llm.requests[-1].path == "/v1/messages" and fake_llm.requests[-1].query == {"token": [TOKEN]}
    emb = resolve_backend(f"openai:/text-embedding-3-small?base_url={fake_llm.openai_base_url}?token={TOKEN}")
    assert len(emb.embed(["a", "b"], timeout=10).vectors) == 2
    assert fake_llm.requests[-1].path == "/v1/embeddings" and fake_llm.requests[-1].query == {"token": [TOKEN]}
    assert TOKEN in anth.secrets() and TOKEN in emb.secrets()
    assert TOKEN not in anth.connection_key() and TOKEN not in json.dumps(emb.identity())


@pytest.mark.parametrize("uri", [
    f"openai:/m?base_url=http://gw:8000/v1?token={TOKEN}",
    f"openai:/m?base_url=http://gw:8000/v1?api-version=1&token={TOKEN}",  # a second parameter of the base URL
    f"openai:/m?base_url=http://user:{TOKEN}@gw:8000/v1",
    f"anthropic:/claude?base_url=https://gw/v1?key={TOKEN}",
])
def test_every_shown_uri_masks_query_values(uri):
    shown = safe_judge_uri(uri)
    assert TOKEN not in shown and "gw" in shown
    backend = resolve_backend(uri)
    assert TOKEN in backend.secrets()
    if "@" not in uri:  # a query is sent apart from the base URL (user:password@ stays in it, for the HTTP client)
        assert TOKEN not in (backend.base_url or "")
    assert TOKEN not in safe_tracking_uri(f"https://tracking.example/?token={TOKEN}")
