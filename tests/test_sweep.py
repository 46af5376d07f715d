"""Variant sweeps: the user's pipeline, one nested child run per variant, generations cached, prompts versioned
in MLflow's registry, the paired comparison on the parent run, bad input refused before anything is paid for."""

from __future__ import annotations

import json
import threading

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

import mlflow_ragjudge as rj
from mlflow_ragjudge import InputError, PromptTemplate
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.workflows import example_rag
from mlflow_ragjudge.workflows.compare import paired_comparison, scores_by_row
from mlflow_ragjudge.workflows.sweep import expand_variants, variant_name, variant_names

CORPUS = {
    "d1": "Paris is the capital of France.",
    "d2": "Berlin is the capital of Germany.",
    "d3": "Madrid is the capital of Spain.",
    "d4": "Rome is the capital of Italy.",
}


class Pipeline:
    """A user's RAG system: retrieves ``top_k`` documents by word overlap, answers from the first, and counts its
    calls per variant (thread-safe)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.lock = threading.Lock()

    def __call__(self, question: str, *, top_k: int = 1, style: str = "plain", prompt: str | None = None):
        with self.lock:
            self.calls.append((question, {"top_k": top_k, "style": style, "prompt": prompt}))
        words = set(question.lower().replace("?", "").split())
        ranked = sorted(CORPUS, key=lambda d: -len(words & set(CORPUS[d].lower().rstrip(".").split())))[:top_k]
        best = CORPUS[ranked[0]]
        text = best if style == "plain" else f"As the documents say: {best.lower()}"
        if prompt:
            text = f"{prompt.split()[0]} {text}"
        return {"answer": text, "contexts": [CORPUS[d] for d in ranked], "retrieved_doc_ids": ranked,
                "citations": ranked[:1]}


@pytest.fixture
def questions():
    return pd.DataFrame({
        "question": ["What is the capital of France?", "What is the capital of Germany?",
                     "What is the capital of Spain?", "What is the capital of Italy?"],
        "reference": ["Paris", ["Berlin", "the city of Berlin"], "Madrid", "Rome"],
        "relevant_doc_ids": [["d1"], ["d2"], ["d3"], ["d4"]],
    })


def test_expand_variants_and_names():
    assert expand_variants({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    assert expand_variants([{"k": 1}]) == [{"k": 1}]
    assert variant_name({"chunk_size": 64, "top_k": 3}) == "cs=64,top_k=3"  # 21 characters would be cut in the UI
    assert variant_name({"top_k": 3}) == "top_k=3" and variant_name({}) == "baseline"
    assert variant_names([{"k": 1, "gen": "x"}, {"k": 2, "gen": "x"}]) == ["k=1", "k=2"]  # constants are not names
    assert variant_names([{"k": 1, "gen": "x"}]) == ["k=1,gen=x"]
    with pytest.raises(ValueError, match="non-empty list"):
        expand_variants({"a": 3})
    with pytest.raises(ValueError, match="identifier"):
        expand_variants([{"top-k": 1}])


@pytest.mark.slow
def test_a_sweep_is_a_parent_run_with_one_child_per_variant(tmp_tracking, questions):
    pipe = Pipeline()
    res = rj.sweep(pipe, {"top_k": [1, 2], "style": ["plain", "quoted"]}, questions, experiment="sweeps",
                   evaluator_config={"judge": "offline:/lexical", "bertscore": False}, data_name="capitals")
    # 19 characters: cut in the UI's runs table, but apart in the 15 it shows ("top_k=1,style=p…")
    assert list(res.run_ids) == ["top_k=1,style=plain", "top_k=1,style=quoted", "top_k=2,style=plain",
                                 "top_k=2,style=quoted"]
    assert res.baseline == "top_k=1,style=plain" and len(pipe.calls) == 16  # every question once per variant
    client = MlflowClient()
    parent = client.get_run(res.parent_run_id)
    assert parent.info.run_name.startswith("sweep-capitals-") and parent.data.params["sweep.variants"] == "4"
    for name, run_id in res.run_ids.items():
        run = client.get_run(run_id)
        assert run.info.run_name == name and run.data.tags["mlflow.parentRunId"] == res.parent_run_id
        assert run.data.params["variant.top_k"] in ("1", "2")
        assert run.data.params["variant.style"] in ("plain", "quoted") and "variant.name" not in run.data.params
        assert run.data.params["ragjudge.judge"] == "offline:/lexical"
        assert "correctness/mean" in run.data.metrics and "citation_validity/mean" in run.data.metrics
        # the headline means come first in the store (the MLflow UI opens its parallel coordinates on the first)
        assert list(run.data.metrics)[:2] == ["_headline/correctness", "_headline/faithfulness"]
        assert run.data.metrics["_headline/correctness"] == run.data.metrics["correctness/mean"]
        assert run.inputs.dataset_inputs[0].dataset.name == "capitals"
        gens = mlflow.load_table("ragjudge/generations.json", run_ids=[run_id])
        assert gens["question"].tolist() == questions["question"].tolist() and gens["generation_error"].isna().all()
        assert rj.load_output(run_id).table["question"].tolist() == questions["question"].tolist()
    # the comparison on the parent: the documented columns, and the same numbers as comparing the children's
    # own per-row results
    logged = mlflow.load_table("ragjudge/comparison.json", run_ids=[res.parent_run_id])
    assert list(logged.columns) == list(res.comparison.columns)[: len(logged.columns)]
    again = paired_comparison({n: scores_by_row(o.results) for n, o in res.outputs.items()}, res.baseline)
    pd.testing.assert_frame_equal(again, res.comparison)
    assert set(res.comparison["variant"]) == set(res.run_ids) - {res.baseline}
    arts = {a.path for a in client.list_artifacts(res.parent_run_id, "ragjudge/plots")}
    assert arts and all(p.endswith(".png") for p in arts)
    # compare_runs over the children gives the same table
    from_runs = rj.compare_runs(res.run_ids, baseline=res.baseline)
    pd.testing.assert_frame_equal(from_runs, res.comparison)


def test_changing_one_variant_regenerates_and_rejudges_only_it(fake_llm, judge, tmp_tracking, questions, tmp_path):
    cfg = {"judge": judge, "metrics": ["correctness", "faithfulness"], "cache": str(tmp_path / "cache")}
    pipe = Pipeline()
    first = rj.sweep(pipe, [{"top_k": 1}, {"top_k": 2}], questions, evaluator_config=cfg)
    assert first.generation["top_k=1"]["generated"] == 4 and len(pipe.calls) == 8
    sent = fake_llm.request_count
    assert sent > 0
    pipe2 = Pipeline()
    second = rj.sweep(pipe2, [{"top_k": 1}, {"top_k": 2, "style": "quoted"}], questions, evaluator_config=cfg)
    assert [c[1]["style"] for c in pipe2.calls] == ["quoted"] * 4  # only the changed variant was generated
    assert second.generation["top_k=1"] == {**second.generation["top_k=1"], "generated": 0, "cached": 4}
    # and only its answers were judged: the unchanged variant's judge calls all came from the cache
    assert all(t.get("cache_hit") for t in second.outputs["top_k=1"].transcripts)
    fresh = [t for t in second.outputs["top_k=2,style=quoted"].transcripts if not t.get("cache_hit")]
    assert fresh and fake_llm.request_count - sent == sum(t["attempts"] for t in fresh)
    assert second.outputs["top_k=1"].metrics["correctness/mean"] == first.outputs["top_k=1"].metrics[
        "correctness/mean"]


def test_the_headline_metrics_asked_for_come_first_in_the_runs_and_the_plots(tmp_tracking, questions):
    res = rj.sweep(Pipeline(), [{"top_k": 1}, {"top_k": 2}], questions, headline=["word_recall", "correctness"],
                   evaluator_config={"judge": "offline:/lexical", "bertscore": False})
    for run_id in res.run_ids.values():
        metrics = MlflowClient().get_run(run_id).data.metrics
        assert list(metrics)[:2] == ["_headline/word_recall", "_headline/correctness"]
        assert not any(k.startswith("_headline/faithfulness") for k in metrics)
    plots = [a.path for a in MlflowClient().list_artifacts(res.parent_run_id, "ragjudge/plots")]
    assert "ragjudge/plots/word_recall.png" in plots and "ragjudge/plots/correctness.png" in plots
    with pytest.raises(ValueError, match="lists of metric names"):
        rj.sweep(Pipeline(), [{"top_k": 1}], questions, headline="correctness")


@pytest.mark.slow
def test_prompt_templates_are_versioned_in_the_registry(tmp_tracking, questions):
    pipe = Pipeline()
    v = [{"prompt": PromptTemplate("capitals-answer", "Briefly: {{question}} {{contexts}}")},
         {"prompt": PromptTemplate("capitals-answer", "Carefully: {{question}} {{contexts}}")}]
    res = rj.sweep(pipe, v, questions, evaluator_config={"judge": "offline:/lexical", "bertscore": False})
    assert list(res.run_ids) == ["prompt=@v1", "prompt=@v2"]  # two versions of one prompt: named by their versions
    assert {c[1]["prompt"] for c in pipe.calls} == {v[0]["prompt"].template, v[1]["prompt"].template}
    client = MlflowClient()
    run = client.get_run(res.run_ids["prompt=@v2"])
    assert run.data.params["prompt.prompt"] == "prompts:/capitals-answer/2"
    assert run.data.params["variant.prompt"] == "capitals-answer@v2"
    linked = json.loads(run.data.tags["mlflow.linkedPrompts"])
    assert linked == [{"name": "capitals-answer", "version": "2"}]
    # the same text again is the same version; an existing version by URI works as a variant too
    again = rj.sweep(Pipeline(), [{"prompt": v[1]["prompt"]}, {"prompt": "prompts:/capitals-answer/1"}], questions,
                     evaluator_config={"judge": "offline:/lexical", "bertscore": False})
    assert list(again.run_ids) == ["prompt=@v2", "prompt=@v1"]
    by_name = rj.sweep(Pipeline(), [{"prompt": v[1]["prompt"]}, {"prompt": "prompts:/capitals-answer/1"}],
                       questions, evaluator_config={"judge": "offline:/lexical", "bertscore": False},
                       baseline="prompt=@v1")
    assert by_name.baseline == "prompt=@v1"  # the baseline by its run name, known once the prompts are registered
    assert mlflow.genai.load_prompt("prompts:/capitals-answer@latest").version == 2


def test_a_failing_question_is_recorded_and_left_out(tmp_tracking, questions):
    def flaky(question, *, top_k=1):
        if "Spain" in question and top_k == 2:
            raise RuntimeError("index shard down")
        return Pipeline()(question, top_k=top_k)

    res = rj.sweep(flaky, {"top_k": [1, 2]}, questions, evaluator_config={"judge": "offline:/lexical",
                                                                          "bertscore": False})
    assert res.generation["top_k=2"]["failed"] == 1
    gens = mlflow.load_table("ragjudge/generations.json", run_ids=[res.run_ids["top_k=2"]])
    assert gens["generation_error"].tolist()[2] == "RuntimeError: index shard down"
    row = res.comparison[res.comparison["metric"] == "correctness"].iloc[0]
    assert row["n"] == 3  # the failed question is not paired
    assert MlflowClient().get_run(res.run_ids["top_k=2"]).data.metrics["generation/failed_rate"] == 0.25


@pytest.mark.parametrize(
    "kwargs, message",
    [
        pytest.param({"variants": {"top_k": []}}, "non-empty list", id="empty-grid-values"),
        pytest.param({"variants": [{"top_k": 1}, {"top_k": 1}]}, "more than once", id="duplicate-variants"),
        pytest.param({"baseline": "top_k=9"}, "is not one of the variants", id="unknown-baseline"),
        pytest.param({"baseline": 5}, "not a variant index", id="baseline-out-of-range"),
        pytest.param({"data": pd.DataFrame({"q": ["x"]})}, "no 'question' column", id="no-question"),
        pytest.param({"data": pd.DataFrame({"question": ["x"], "answer": ["y"]})}, "in a sweep these come from the",
                     id="answers-in-data"),
        pytest.param({"evaluator_config": {"judge": "offline:/lexical", "metricz": []}}, "Unknown ragjudge config",
                     id="bad-config"),
        pytest.param({"evaluator_config": {"judge": "offline:/lexical", "metrics": ["multiturn"]}},
                     "multiturn_system", id="metric-that-cannot-run"),
    ],
)
def test_bad_input_is_refused_before_the_sweep_runs(tmp_tracking, questions, kwargs, message):
    pipe = Pipeline()
    args = {"variants": {"top_k": [1, 2]}, "data": questions, "evaluator_config": {"judge": "offline:/lexical"},
            **kwargs}
    with pytest.raises((ValueError, InputError), match=message):
        rj.sweep(pipe, args.pop("variants"), args.pop("data"), **args)
    assert len(pipe.calls) <= 1  # at most the probe of the first question
    assert not MlflowClient().search_runs(["0"])  # and no run was opened


def test_a_pipeline_returning_the_wrong_thing_fails_on_the_probe(tmp_tracking, questions):
    calls = []

    def bad(question, **params):
        calls.append(question)
        return 42

    with pytest.raises(InputError, match="returned a int for row 0.*return the answer"):
        rj.sweep(bad, {"top_k": [1, 2]}, questions, evaluator_config={"judge": "offline:/lexical"})
    assert len(calls) == 1


def test_an_unusable_tracking_store_is_refused_before_any_generation(tmp_path, questions):
    pipe = Pipeline()
    (tmp_path / "a-file").write_text("not a directory", encoding="utf-8")
    with pytest.raises(InputError, match="cannot be used.*Nothing was generated"):
        rj.sweep(pipe, {"top_k": [1]}, questions, tracking_uri=f"sqlite:///{tmp_path}/a-file/m.db",
                 evaluator_config={"judge": "offline:/lexical"})
    assert pipe.calls == []


def test_compare_runs_refuses_runs_over_other_questions(tmp_tracking, questions):
    a = rj.sweep(Pipeline(), {"top_k": [1]}, questions, evaluator_config={"judge": "offline:/lexical",
                                                                        "bertscore": False})
    b = rj.sweep(Pipeline(), {"top_k": [1]}, questions.iloc[:3], evaluator_config={"judge": "offline:/lexical",
                                                                                  "bertscore": False})
    with pytest.raises(ValueError, match="other rows"):
        rj.compare_runs([a.run_ids["top_k=1"], b.run_ids["top_k=1"]])


@pytest.mark.slow
def test_cli_sweep_with_a_grid_file(tmp_path, tmp_tracking, questions, monkeypatch, capsys):
    (tmp_path / "my_rag.py").write_text(
        "from mlflow_ragjudge.workflows import example_rag\n"
        "def answer(question, **params):\n    return example_rag.answer(question, **params)\n", encoding="utf-8")
    (tmp_path / "grid.json").write_text(json.dumps({"chunk_size": [64, 8], "top_k": [3]}), encoding="utf-8")
    example_rag.sample_questions().to_json(tmp_path / "q.jsonl", orient="records", lines=True)
    monkeypatch.chdir(tmp_path)
    rc = main(["sweep", "q.jsonl", "--pipeline", "my_rag:answer", "--grid", "grid.json", "--retriever",
               "mlflow_ragjudge.workflows.example_rag:retrieve", "--experiment", "cli-sweep",
               "--config", '{"bertscore": false}'])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "chunk_size=8 " in out and "comparison against 'chunk_size=64'" in out  # top_k is the same in both
    assert "offline estimates" in out and "mlflow ui --backend-store-uri" in out
    exp = mlflow.get_experiment_by_name("cli-sweep")
    assert len(MlflowClient().search_runs([exp.experiment_id])) == 3  # the parent and two children
    assert main(["sweep", "q.jsonl", "--pipeline", "my_rag:nope", "--grid", "grid.json"]) == 2
    assert "has no function 'nope'" in capsys.readouterr().err
    # prompt templates in a YAML grid: registered, versioned, the runs named by version
    (tmp_path / "prompts.yaml").write_text(
        "prompt:\n"
        "  - {name: cli-prompt, template: 'Short. {{question}}'}\n"
        "  - {name: cli-prompt, template: 'Long. {{question}} {{contexts}}'}\n", encoding="utf-8")
    (tmp_path / "my_llm_rag.py").write_text(
        "def answer(question, *, prompt):\n    return {'answer': prompt.split('.')[0] + ': ' + question}\n",
        encoding="utf-8")
    assert main(["sweep", "q.jsonl", "--pipeline", "my_llm_rag.py:answer", "--grid", "prompts.yaml",
                 "--experiment", "cli-prompts", "--metrics", "lexical"]) == 0
    out = capsys.readouterr().out
    assert "prompt=@v1" in out and "prompt=@v2" in out  # two versions of one prompt: named by their versions
    assert mlflow.genai.load_prompt("prompts:/cli-prompt/2").template == "Long. {{question}} {{contexts}}"


@pytest.mark.slow
def test_quickstart_is_a_small_sweep(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'qs.db'}"
    assert main(["quickstart", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "three variants" in out and "comparison against 'cs=64,top_k=3'" in out
    assert f"mlflow ui --backend-store-uri {uri}" in out
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name("ragjudge-quickstart")
    runs = MlflowClient().search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(runs) == 4 and len(parents) == 1 and parents[0].info.run_name.startswith("quickstart-offline-lexical-")


def test_a_variant_whose_answers_cannot_be_evaluated_is_recorded_and_the_sweep_goes_on(tmp_tracking, questions):
    def pipeline(question, *, top_k=1):
        out = Pipeline()(question, top_k=top_k)
        return out if top_k == 1 else {"answer": out["answer"]}  # the second variant returns no contexts

    res = rj.sweep(pipeline, {"top_k": [1, 2]}, questions,
                   evaluator_config={"judge": "offline:/lexical", "metrics": ["faithfulness"]})
    assert "needs column(s) ['contexts']" in res.errors["top_k=2"] and res.outputs["top_k=2"] is None
    tags = MlflowClient().get_run(res.run_ids["top_k=2"]).data.tags
    assert tags["ragjudge.status"] == "evaluation_error" and "contexts" in tags["ragjudge.evaluation_error"]
    assert "NOT EVALUATED top_k=2" in res.summary() and len(res.comparison) == 0
