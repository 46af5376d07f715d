"""A metric added the way docs/extending.md says -- one module (``tests/plugins/answer_brevity.py``: its spec, its
own setting, its LLM scorer and its offline scorer) ending in one ``register_metric`` line -- runs through every
entry point: ``mlflow.models.evaluate``, an ``mlflow.genai`` ``MetricScorer`` and the CLI (a real subprocess with
``--plugin``).

The judge is the independent, schema-following model on the fake server: it knows nothing of the metric, so the
tests assert what the metric's own rule decides (answers over the word limit score 0 without a call) and that the
judge's ratings land in the metric's range, not particular ratings.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from compliant_model import CompliantModel
from mlflow import MlflowClient

import mlflow_ragjudge as rj
from mlflow_ragjudge.metrics.spec import metric_names, unregister_metric

PLUGIN = Path(__file__).parent / "plugins" / "answer_brevity.py"
ROWS = [
    {"question": "What does the saw cut?", "answer": "Wood.", "reference": "The saw cuts wood."},
    {"question": "Who made the saw?", "answer": "It was made by a small family firm that began, as the records "
     "kept in the town archive show, in a shed behind the house in 1900.", "reference": "A family firm."},
    {"question": "When was it made?", "answer": "In 1900.", "reference": "In 1900."},
    {"question": "Where is it sold?", "answer": "It is sold in many shops across the country and also online "
     "through several of the large retailers.", "reference": "In shops."},
]
LONG = [False, True, False, True]  # over 5 words
RATINGS = {0.5, 0.75, 1.0}  # the judge's 1..3, as the metric maps them


@pytest.fixture
def answer_brevity():
    """The plugin module imported as user code imports it; the metric is unregistered afterwards."""
    spec = importlib.util.spec_from_file_location("answer_brevity_plugin", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its last line registers the metric
    assert "answer_brevity" in metric_names()
    yield module
    unregister_metric("answer_brevity")


@pytest.fixture
def judge(fake_llm) -> str:
    fake_llm.set_handler(CompliantModel("json_schema"))
    return f"openai:/m?base_url={fake_llm.openai_base_url}"


def _check_scores(values: list) -> None:
    for value, long in zip(values, LONG, strict=True):
        assert (value == 0.0) if long else (value in RATINGS), (values, LONG)


@pytest.mark.slow
def test_through_mlflow_models_evaluate(answer_brevity, judge, fake_llm, tmp_tracking, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with mlflow.start_run() as run:
        mlflow.models.evaluate(
            data=pd.DataFrame(ROWS), model_type="rag", evaluators="ragjudge",
            evaluator_config={"judge": judge, "metrics": ["answer_brevity"], "brevity_max_words": 5, "cache": False},
        )
    logged = MlflowClient().get_run(run.info.run_id).data
    out = rj.load_output(run.info.run_id)
    _check_scores(out.table["answer_brevity/score"].tolist())
    assert out.table["answer_brevity/over_limit"].tolist() == LONG  # the metric's own table column
    assert logged.metrics["answer_brevity/n_scored"] == 4 and logged.metrics["answer_brevity/error_rate"] == 0
    assert logged.params["ragjudge.metrics"] == "answer_brevity"
    assert out.config["config"]["brevity_max_words"] == 5  # its setting, in the run record
    # its own rule: only the two short answers were sent to the judge, each once
    assert len(fake_llm.requests) == 2
    assert {t["metric"] for t in out.transcripts} == {"answer_brevity"}


def test_through_an_mlflow_genai_scorer(answer_brevity, judge, fake_llm, tmp_tracking, monkeypatch):
    from mlflow_ragjudge.adapters.scorers import MetricScorer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    scorer = MetricScorer("answer_brevity", judge=judge, cache=False, brevity_max_words=5)
    data = [{"inputs": {"question": r["question"]}, "outputs": r["answer"]} for r in ROWS]
    result = mlflow.genai.evaluate(data=data, scorers=[scorer])
    by_answer = {}
    for trace in mlflow.search_traces(run_id=result.run_id, return_type="list"):
        feedback = {a.name: a for a in trace.info.assessments}
        if "answer_brevity" in feedback:
            by_answer[str(trace.data.response)] = feedback["answer_brevity"]
    values = [by_answer[next(k for k in by_answer if r["answer"][:20] in k)].value for r in ROWS]
    _check_scores(values)
    assert len(fake_llm.requests) == 2


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlflow_ragjudge", *args], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_through_the_cli_with_plugin(judge, fake_llm, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    uri = f"sqlite:///{tmp_path / 'cli.db'}"
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, OPENAI_API_KEY="sk-test")
    assert "answer_brevity" not in metric_names()  # nothing registered it in this process

    listed = _cli("metrics", "--plugin", str(PLUGIN), env=env)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert any(line.split()[0] == "answer_brevity" for line in listed.stdout.splitlines()[1:])

    common = ("evaluate", str(data), "--plugin", str(PLUGIN), "--metrics", "answer_brevity", "--no-cache",
              "--experiment", "plugin")
    proc = _cli(*common, "--judge", judge, "--config", '{"brevity_max_words": 5}', env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "answer_brevity" in proc.stdout
    assert len(fake_llm.requests) == 2
    offline = _cli(*common, "--judge", "offline:/lexical", "--config", '{"brevity_max_words": 5}', env=env)
    assert offline.returncode == 0, offline.stderr[-2000:]

    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name("plugin")
    runs = MlflowClient().search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    llm_run, offline_run = runs
    _check_scores(rj.load_output(llm_run.info.run_id).table["answer_brevity/score"].tolist())
    # the offline judge ran the metric's offline scorer: 1 for short answers, 0 over the limit, no call
    assert rj.load_output(offline_run.info.run_id).table["answer_brevity/score"].tolist() == [0.0 if x else 1.0
                                                                                               for x in LONG]
    assert len(fake_llm.requests) == 2

    # its setting is checked like a built-in one: before any call, naming the key and the fix
    bad = _cli(*common, "--judge", judge, "--config", '{"brevity_max_words": 0}', env=env)
    assert bad.returncode == 2 and "brevity_max_words=0" in bad.stderr and "whole number > 0" in bad.stderr
    assert len(fake_llm.requests) == 2
