"""Sweeps that meet objects, failures and long names: object-valued parameters keyed by a stable identity (and a
warning for those without one), pipeline failures recorded per row from the very first question, a parameter
that collides with the question argument refused, a variant whose pipeline failed everywhere an exit 3 with the
reason, and long variant names kept distinct (docs/sweeps.md, docs/failure-modes.md "Sweeps that meet failures")."""

from __future__ import annotations

import json
import re
import threading

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

import mlflow_ragjudge as rj
from mlflow_ragjudge import InputError
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.core.errors import UnstableParameterWarning
from mlflow_ragjudge.workflows.sweep import expand_variants, variant_names
from mlflow_ragjudge.workflows.sweep.variants import MAX_NAME, SHORT_NAME, short_key, short_value

OFFLINE = {"judge": "offline:/lexical", "bertscore": False}
CORPUS = {"d1": "Paris is the capital of France.", "d2": "Berlin is the capital of Germany.",
          "d3": "Madrid is the capital of Spain."}


@pytest.fixture
def questions():
    return pd.DataFrame({"question": ["What is the capital of France?", "What is the capital of Germany?",
                                      "What is the capital of Spain?"],
                         "reference": ["Paris", "Berlin", "Madrid"]})


class Reranker:
    """A user's reranker object; ``cache_key`` names its configuration when ``keyed``."""

    def __init__(self, order: str, keyed: bool = True) -> None:
        self.order = order
        if keyed:
            self.cache_key = f"reranker-{order}"

    def rank(self, docs: list[str]) -> list[str]:
        return sorted(docs, reverse=self.order == "desc")


class Counting:
    """A pipeline taking a reranker object; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()
        self.seen: list[object] = []

    def __call__(self, question: str, *, reranker, top_k: int = 1):
        with self.lock:
            self.calls += 1
            self.seen.append(reranker)
        words = set(question.lower().rstrip("?").split())
        hits = [d for d in CORPUS if words & set(CORPUS[d].lower().rstrip(".").split()) - {"is", "the", "of",
                                                                                              "capital"}]
        docs = reranker.rank(hits or list(CORPUS))[:top_k]
        return {"answer": CORPUS[docs[0]], "contexts": [CORPUS[d] for d in docs], "retrieved_doc_ids": docs}


def _all_logged_text(run_ids: list[str]) -> str:
    """Every param, tag and run name of the runs."""
    client = MlflowClient()
    parts = []
    for rid in run_ids:
        run = client.get_run(rid)
        parts += [run.info.run_name, json.dumps(run.data.params), json.dumps(run.data.tags)]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------ identities


def test_objects_with_a_cache_key_are_not_generated_again_and_names_carry_no_address(tmp_tracking, questions,
                                                                                         tmp_path):
    cfg = {**OFFLINE, "cache": str(tmp_path / "cache")}
    first = Counting()
    res = rj.sweep(first, {"reranker": [Reranker("asc"), Reranker("desc")]}, questions, evaluator_config=cfg)
    assert first.calls == 6
    assert list(res.run_ids) == ["rer=reranker-asc", "rer=reranker-desc"]  # short enough for the UI's runs table
    # a re-run (new objects, as a new process would build them) answers from the cache: 0 more pipeline calls
    again = Counting()
    res2 = rj.sweep(again, {"reranker": [Reranker("asc"), Reranker("desc")]}, questions, evaluator_config=cfg)
    assert again.calls == 0
    assert all(g["cached"] == 3 and g["generated"] == 0 for g in res2.generation.values())
    logged = _all_logged_text([res.parent_run_id, res2.parent_run_id, *res.run_ids.values(), *res2.run_ids.values()])
    assert "0x" not in logged and "object at" not in logged
    # a changed configuration is a new key: generated again
    third = Counting()
    rj.sweep(third, {"reranker": [Reranker("asc"), Reranker("desc-v2", keyed=True)]}, questions, evaluator_config=cfg)
    assert third.calls == 3


def test_a_labelled_object_is_keyed_by_its_label_and_the_pipeline_gets_the_object(tmp_tracking, questions,
                                                                                     tmp_path):
    cfg = {**OFFLINE, "cache": str(tmp_path / "cache")}
    pipe = Counting()
    variants = [{"reranker": ("plain", Reranker("asc", keyed=False))},
                {"reranker": ("reversed", Reranker("desc", keyed=False))}]
    res = rj.sweep(pipe, variants, questions, evaluator_config=cfg)
    assert list(res.run_ids) == ["reranker=plain", "reranker=reversed"]
    assert pipe.calls == 6 and all(isinstance(r, Reranker) for r in pipe.seen)
    again = Counting()
    rj.sweep(again, [{"reranker": ("plain", Reranker("asc", keyed=False))},
                     {"reranker": ("reversed", Reranker("desc", keyed=False))}], questions, evaluator_config=cfg)
    assert again.calls == 0
    assert MlflowClient().get_run(res.run_ids["reranker=plain"]).data.params["variant.reranker"] == "plain"


def test_an_object_without_a_stable_identity_is_warned_about_and_never_answered_from_a_stale_key(
        tmp_tracking, questions, tmp_path):
    cfg = {**OFFLINE, "cache": str(tmp_path / "cache")}
    pipe = Counting()
    with pytest.warns(UnstableParameterWarning, match=r"\['reranker'\].*cache_key.*\('label', object\)"):
        res = rj.sweep(pipe, {"reranker": [Reranker("asc", keyed=False), Reranker("desc", keyed=False)]},
                       questions, evaluator_config=cfg)
    names = list(res.run_ids)
    # the 4 hex digits come from the objects' ids: when the two share their first two (1 run in 256) the shortened
    # names would look alike in the runs table, and the names keep the key whole (variant_names' last resort)
    assert len(set(names)) == 2 and all(re.fullmatch(r"(?:rer|reranker)=Reranker#[0-9a-f]{4}", n) for n in names)
    assert "0x" not in _all_logged_text([res.parent_run_id, *res.run_ids.values()])
    again = Counting()
    with pytest.warns(UnstableParameterWarning):
        rj.sweep(again, {"reranker": [Reranker("asc", keyed=False), Reranker("desc", keyed=False)]}, questions,
                 evaluator_config=cfg)
    assert again.calls == 6  # regenerated, as the warning says (never a cached answer of another object)


# ------------------------------------------------------------------------------------------------ failures


def test_a_pipeline_failure_on_the_very_first_question_is_recorded_and_the_sweep_goes_on(tmp_tracking, questions):
    calls = []

    def flaky(question, *, top_k=1):
        calls.append((question, top_k))
        if "France" in question and top_k == 1:
            raise RuntimeError("index shard down")
        return {"answer": "Berlin" if "Germany" in question else "Madrid", "contexts": list(CORPUS.values())}

    res = rj.sweep(flaky, {"top_k": [1, 2]}, questions, evaluator_config=OFFLINE)
    assert res.generation["top_k=1"]["failed"] == 1 and res.generation["top_k=2"]["failed"] == 0
    assert len(calls) == 6  # every question once per variant: the probe's failure is not asked again
    gens = mlflow.load_table("ragjudge/generations.json", run_ids=[res.run_ids["top_k=1"]])
    assert gens["generation_error"].tolist()[0] == "RuntimeError: index shard down"
    assert res.outputs["top_k=1"] is not None and len(res.outputs["top_k=1"].table) == 2
    # 1 of 3 is more than max_error_rate (0.2): reported, with the first error
    assert "failed on 1 of 3 questions" in res.generation_failures["top_k=1"] and "top_k=2" not in \
        res.generation_failures
    assert "GENERATION FAILED top_k=1" in res.summary()


def test_a_parameter_named_like_the_question_argument_is_refused_before_any_call(tmp_tracking, questions):
    calls = []

    def pipeline(question, **params):
        calls.append(question)
        return "x"

    with pytest.raises(InputError, match=r"'question' collides with the pipeline's own argument.*Rename"):
        rj.sweep(pipeline, {"question": ["a", "b"]}, questions, evaluator_config=OFFLINE)

    def named_q(q, *, top_k=1):
        calls.append(q)
        return "x"

    with pytest.raises(InputError, match=r"'q' collides"):
        rj.sweep(named_q, {"q": ["a", "b"]}, questions, evaluator_config=OFFLINE)
    with pytest.raises(InputError, match=r"\['topk'\] are not arguments of the pipeline"):
        rj.sweep(named_q, {"topk": [1, 2]}, questions, evaluator_config=OFFLINE)
    assert calls == [] and not MlflowClient().search_runs(["0"])


def test_a_variant_whose_pipeline_failed_everywhere_exits_3_and_says_why(tmp_path, tmp_tracking, questions,
                                                                            monkeypatch, capsys):
    (tmp_path / "down_rag.py").write_text(
        "def answer(question, *, backend):\n"
        "    if backend == 'down':\n        raise ConnectionError('vector store unreachable')\n"
        "    return {'answer': 'Paris', 'contexts': ['Paris is the capital of France.']}\n", encoding="utf-8")
    (tmp_path / "grid.json").write_text(json.dumps({"backend": ["up", "down"]}), encoding="utf-8")
    questions.to_json(tmp_path / "q.jsonl", orient="records", lines=True)
    monkeypatch.chdir(tmp_path)
    rc = main(["sweep", "q.jsonl", "--pipeline", "down_rag.py:answer", "--grid", "grid.json",
               "--experiment", "down", "--config", '{"bertscore": false}'])
    captured = capsys.readouterr()
    assert rc == 3, captured.out + captured.err
    assert ("variant 'backend=down': the pipeline failed on 3 of 3 questions" in captured.err
            and "ConnectionError: vector store unreachable" in captured.err)
    assert "GENERATION FAILED backend=down" in captured.out
    exp = mlflow.get_experiment_by_name("down")
    runs = {r.info.run_name: r for r in MlflowClient().search_runs([exp.experiment_id])}
    assert runs["backend=down"].data.tags["ragjudge.generation_error"] == "ConnectionError: vector store unreachable"


# ------------------------------------------------------------------------------------------------ long names


def test_variants_that_agree_on_a_long_beginning_are_distinct_with_short_unique_names(tmp_tracking, questions):
    preamble = "You are a careful assistant. " * 12  # 348 characters in common
    prompts = [preamble + "Answer in one word.", preamble + "Answer in one sentence."]
    seen = []

    def pipeline(question, *, prompt):
        seen.append(prompt)
        return {"answer": "Paris", "contexts": ["Paris is the capital of France."]}

    res = rj.sweep(pipeline, {"prompt": prompts}, questions, evaluator_config=OFFLINE)
    names = list(res.run_ids)
    assert len(names) == 2 and names[0] != names[1] and all(len(n) <= MAX_NAME for n in names)
    assert set(seen) == set(prompts)  # each variant got its full prompt
    assert res.variants[names[1]]["prompt"] == prompts[1]
    # the names are a pure function of the parameters: the same on every run
    assert variant_names([{"prompt": p} for p in prompts]) == names
    # distinct parameters that print alike (1 and "1") get distinct names too
    assert len(set(variant_names([{"k": 1}, {"k": "1"}]))) == 2


def test_names_fit_the_ui_runs_table_or_differ_in_what_it_shows():
    # the MLflow UI's runs table shows about SHORT_NAME characters of a child run's name (tests/test_mlflow_server_ui)
    grid = expand_variants({"chunk_size": [256, 512], "top_k": [3, 5]})
    names = variant_names(grid)
    assert names == ["cs=256,top_k=3", "cs=256,top_k=5", "cs=512,top_k=3", "cs=512,top_k=5"]
    assert all(len(n) <= SHORT_NAME for n in names)
    # too long to fit at any level: the parameter names stay readable as long as what the table shows differs
    styles = variant_names(expand_variants({"top_k": [1, 2], "style": ["plain", "quoted"]}))
    assert styles[1] == "top_k=1,style=quoted" and len({n[: SHORT_NAME - 1] for n in styles}) == 4
    # no spaces, values compact, a prompt's version kept when its name is cut
    assert variant_names([{"temperature": 0.30000000000000004}, {"temperature": 0.7}]) == [
        "temperature=0.3", "temperature=0.7"]
    assert variant_names([{"temperature": 0.3, "max_tokens": 64}, {"temperature": 0.7, "max_tokens": 512}]) == [
        "temp=0.3,mt=64", "temp=0.7,mt=512"]
    assert short_value(["a", "b"]) == "[a,b]" and short_value({"k": 1}) == "{k:1}"
    assert short_value("a-very-long-prompt-name@v12").endswith("…@v12") and len(
        short_value("a-very-long-prompt-name@v12")) == 16
    assert short_key("chunk_size", 1) == "cs" and short_key("top_k", 1) == "top_k" and short_key("top_k", 2) == "tk"
    # versions of one registered prompt are named by their versions; of several prompts, by name and version
    assert variant_names([{"prompt": "rag@v1"}, {"prompt": "rag@v2"}]) == ["prompt=@v1", "prompt=@v2"]
    assert variant_names([{"prompt": "rag@v1"}, {"prompt": "terse@v1"}]) == ["prompt=rag@v1", "prompt=terse@v1"]
