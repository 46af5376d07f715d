"""The bad-input corpus (issue 10): every case is refused with a clear message before any judge call, or has a
documented per-row (or per-run) outcome. Through Python (``evaluate_frame``), ``mlflow.models.evaluate``, the
``mlflow.genai`` scorers and the CLI. "Zero requests" is counted at the fake server, over HTTP.
"""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest

from mlflow_ragjudge import evaluate_frame
from mlflow_ragjudge.cli import main
from mlflow_ragjudge.core.errors import InputError, InvalidTextWarning
from mlflow_ragjudge.core.types import metric_name_part

BASE = {
    "question": ["What is X?", "What is Y?"],
    "answer": ["X is a letter.", "Y is a letter."],
    "reference": ["X is a letter of the alphabet.", "Y is a letter."],
    "contexts": [["X is the 24th letter."], ["Y follows X."]],
}


def frame(**changes) -> pd.DataFrame:
    data = {k: list(v) for k, v in BASE.items()}
    data.update(changes)
    return pd.DataFrame(data, dtype=object)  # object columns keep whatever a caller's pipeline put there


# ----------------------------------------------------------------------------- configuration (Python)

CONFIG_CASES = [
    # key, bad value, a word the message must contain
    ("timeout", "abc", "timeout"), ("timeout", 0, "timeout"), ("timeout", -1, "timeout"),
    ("timeout", True, "timeout"), ("timeout", float("nan"), "timeout"), ("timeout", float("inf"), "timeout"),
    ("max_context_chars", "big", "max_context_chars"), ("max_context_chars", 100, "max_context_chars"),
    ("max_context_chars", 1500.5, "max_context_chars"), ("max_context_chars", True, "max_context_chars"),
    ("cache", 123, "cache"), ("cache", 1.5, "cache"), ("cache", ["a"], "cache"),
    ("max_concurrency", 0, "max_concurrency"), ("max_concurrency", -1, "max_concurrency"),
    ("max_concurrency", "8", "max_concurrency"), ("max_concurrency", 2.5, "max_concurrency"),
    ("max_concurrency", True, "max_concurrency"),
    ("requests_per_minute", -1, "requests_per_minute"), ("requests_per_minute", "600", "requests_per_minute"),
    ("requests_per_minute", float("nan"), "requests_per_minute"),
    ("max_attempts", 0, "max_attempts"), ("max_attempts", "6", "max_attempts"), ("max_attempts", 1.5, "max_attempts"),
    ("relevance_threshold", "x", "relevance_threshold"), ("relevance_threshold", -1, "relevance_threshold"),
    ("relevance_threshold", float("inf"), "relevance_threshold"), ("relevance_threshold", True, "relevance_threshold"),
    ("k", 0, "k must"), ("k", "5", "k must"), ("k", [1, "3"], "k must"), ("k", [], "k must"), ("k", 2.5, "k must"),
    ("n_boot", -1, "n_boot"), ("n_boot", "1000", "n_boot"), ("seed", "0", "seed"), ("seed", 1.5, "seed"),
    ("context_mode", "e3", "context_mode"), ("context_mode", 5, "context_mode"),
    ("judge_output", "xml", "judge_output"), ("bertscore", "yes", "bertscore"),
    ("faithfulness_evidence", "docs", "faithfulness_evidence"),
    ("faithfulness_require_retrieval_hit", "yes", "faithfulness_require_retrieval_hit"),
    ("embeddings", 5, "embeddings"), ("embeddings", "", "embeddings"),
    ("answer_relevancy_n", 0, "answer_relevancy_n"), ("answer_relevancy_n", "3", "answer_relevancy_n"),
    ("dry_run", "yes", "dry_run"), ("progress", "sometimes", "progress"),
    ("multiturn_turns", 1, "multiturn_turns"), ("multiturn_turns", "5", "multiturn_turns"),
    ("multiturn_final_score", "max", "multiturn_final_score"),
    ("max_error_rate", 2, "max_error_rate"), ("max_error_rate", -0.1, "max_error_rate"),
    ("max_error_rate", "0.2", "max_error_rate"),
    ("fail_under", {"correctness": "x"}, "fail_under"), ("fail_under", ["correctness"], "fail_under"),
    ("fail_under", {"nosuch": 3}, "nosuch"),
    ("metrics", ["nosuch"], "nosuch"), ("metrics", [5], "metrics"),
    ("col_mapping", {"nosuch": "x"}, "col_mapping"), ("col_mapping", {"question": 5}, "col_mapping"),
    ("col_mapping", "question=q", "col_mapping"),
    ("group_column", 5, "group_column"), ("group_column", "", "group_column"),
    ("human_columns", [5], "human_columns"), ("language", 5, "language"), ("language", "", "language"),
    ("retriever", "not callable", "retriever"), ("multiturn_system", "x", "multiturn_system"),
    ("timeot", 5, "timeot"), ("ragjudge", {"judge": "x"}, "nested"),
    ("judge", 5, "judge"), ("judge", "not a uri", "not a judge URI"), ("judge", "nosuch:/m", "unknown provider"),
    ("judge", "openai:/", "names no model"), ("judge", "openai:/m?foo=1", "unknown parameter"),
    ("judge", "openai:/m?structured=xml", "structured"),
]


@pytest.mark.parametrize("key, value, word", CONFIG_CASES,
                         ids=[f"{k}={v!r}"[:40] for k, v, _ in CONFIG_CASES])
def test_bad_config_is_refused_before_any_call(fake_llm, judge, key, value, word):
    config = {"judge": judge, "metrics": ["correctness"], key: value}
    with pytest.raises(ValueError) as e:
        evaluate_frame(frame(), config)
    assert word in str(e.value), str(e.value)
    assert len(str(e.value)) < 1000  # one clear message, not a dump
    assert fake_llm.request_count == 0


# ----------------------------------------------------------------------------- data (Python)


def _retriever(value):
    def retrieve(query):
        if isinstance(value, Exception):
            raise value
        return value

    return retrieve


DATA_CASES = [
    # id, data, extra config, a phrase the message must contain
    ("empty-frame", pd.DataFrame(), {}, "no rows"),
    ("not-a-frame", [{"question": "q"}], {}, "pandas DataFrame"),
    ("missing-reference", frame().drop(columns=["reference"]), {}, "needs column(s) ['reference']"),
    ("question-none", frame(question=["q", None]), {}, "'question' row 1 is empty"),
    ("question-nan", frame(question=["q", float("nan")]), {}, "'question' row 1 is empty"),
    ("question-int", frame(question=["q", 5]), {}, "'question' row 1 holds a int"),
    ("answer-list", frame(answer=["a", ["b"]]), {}, "'answer' row 1 holds a list"),
    ("reference-dict", frame(reference=["r", {"a": 1}]), {}, "'reference' row 1 holds a dict"),
    ("contexts-plain-string", frame(contexts=["one passage", ["x"]]), {"metrics": ["faithfulness"]},
     "'contexts' row 0 holds a string"),
    ("contexts-int", frame(contexts=[5, ["x"]]), {"metrics": ["faithfulness"]}, "'contexts' row 0 holds a int"),
    ("contexts-item-int", frame(contexts=[["x", 5], ["y"]]), {"metrics": ["faithfulness"]}, "item 1 is a int"),
    ("contexts-dict", frame(contexts=[{"a": "b"}, ["y"]]), {"metrics": ["faithfulness"]}, "holds a dict"),
    ("retrieved-ids-string", frame(retrieved_doc_ids=["d1", ["d2"]], relevant_doc_ids=[["d1"], ["d2"]]),
     {"metrics": ["correctness", "retrieval"]}, "'retrieved_doc_ids' row 0 holds a string"),
    ("relevant-ids-int", frame(retrieved_doc_ids=[["d1"], ["d2"]], relevant_doc_ids=[5, ["d2"]]),
     {"metrics": ["correctness", "retrieval"]}, "'relevant_doc_ids' row 0 holds a int"),
    ("relevant-grade-text", frame(retrieved_doc_ids=[["d1"], ["d2"]], relevant_doc_ids=[{"d1": "high"}, ["d2"]]),
     {"metrics": ["correctness", "retrieval"]}, "high"),
    ("human-text", frame(expert=[4, "abc"]), {"human_columns": ["expert"]}, "holds 'abc'"),
    ("human-inf", frame(expert=[4, float("inf")]), {"human_columns": ["expert"]}, "finite"),
    ("human-minus-inf", frame(expert=[float("-inf"), 3]), {"human_columns": ["expert"]}, "finite"),
    ("human-missing-column", frame(), {"human_columns": ["expert"]}, "'expert'"),
    ("group-missing-column", frame(), {"group_column": "team"}, "group_column='team'"),
    ("group-name-collision", frame(group=["a:b", "a_b__" + metric_name_part("a:b").rsplit("__", 1)[1]]), {},
     "same metric name"),
    ("human-name-collision", frame(**{"x:y": [1, 2], "x_y__" + metric_name_part("x:y").rsplit("__", 1)[1]: [1, 2]}),
     {"human_columns": ["x:y", "x_y__" + metric_name_part("x:y").rsplit("__", 1)[1]]}, "same metric name"),
    ("retriever-raises", frame(), {"retriever": _retriever(RuntimeError("index down")), "context_mode": "reference"},
     "retriever raised on row 0"),
    ("retriever-int", frame(), {"retriever": _retriever(5), "context_mode": "reference"}, "returned a int"),
    ("retriever-dict", frame(), {"retriever": _retriever({"d1": "text"}), "context_mode": "reference"},
     "returned a dict"),
    ("retriever-str", frame(), {"retriever": _retriever("a passage"), "context_mode": "reference"},
     "returned a string"),
    ("retriever-int-items", frame(), {"retriever": _retriever([1, 2]), "context_mode": "reference"},
     "returned int items"),
    ("reference-mode-without-retriever", frame(), {"context_mode": "reference"}, "needs contexts retrieved"),
    ("generation-mode-without-contexts", frame().drop(columns=["contexts"]), {"context_mode": "generation"},
     "needs a 'contexts' column"),
    ("gold-mode-without-gold", frame(), {"context_mode": "gold"}, "'gold_documents'"),
    ("multiturn-without-system", frame(), {"metrics": ["multiturn"]}, "multiturn_system"),
    ("judged-without-judge", frame(), {"judge": None, "metrics": ["faithfulness"]}, "need a judge model"),
    ("col-mapping-to-missing", frame(), {"col_mapping": {"question": "query"}}, "['query']"),
    ("fail-under-metric-not-run", frame(), {"fail_under": {"faithfulness": 0.5}}, "does not produce"),
]


@pytest.mark.parametrize("data, extra, phrase", [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES])
def test_bad_data_is_refused_before_any_call(fake_llm, judge, data, extra, phrase):
    config = {"judge": judge, "metrics": ["correctness"], **extra}
    with pytest.raises((InputError, ValueError)) as e:
        evaluate_frame(data, config)
    assert phrase in str(e.value), str(e.value)
    assert fake_llm.request_count == 0


# ----------------------------------------------------------------------------- documented per-row / per-run outcomes


@pytest.mark.inprocess_judge
def test_lone_surrogates_are_replaced_with_a_warning_and_the_run_completes(fake_llm, judge, tmp_tracking):
    df = frame(answer=["X is a letter \ud800.", "Y"], group=["g\udfff", "h"])
    with pytest.warns(InvalidTextWarning, match="lone surrogates"):
        out = evaluate_frame(df, judge=judge, metrics=["correctness", "lexical"], bertscore=False)
    assert out.table["answer"][0] == "X is a letter \ufffd."
    assert out.config["text_repairs"] == [{"row": 0, "column": "answer", "replaced": 1},
                                          {"row": 0, "column": "group", "replaced": 1}]
    assert out.metrics["correctness/count"] == 2
    from mlflow_ragjudge.adapters.run_log import log_output

    with mlflow.start_run() as run:  # the table and transcripts log (this crashed after paid calls before)
        log_output(out, run.info.run_id)
    assert mlflow.load_table("ragjudge/eval_results_table.json", run_ids=[run.info.run_id])["answer"][0] == \
        "X is a letter \ufffd."


@pytest.mark.inprocess_judge
def test_long_and_odd_group_names_are_logged_under_distinct_recognisable_names(fake_llm, judge, tmp_tracking):
    long = "team-" + "x" * 300
    df = pd.DataFrame({**{k: v * 2 for k, v in BASE.items()}, "group": ["a:b", "a_b", long, "日本語"]})
    out = evaluate_frame(df, judge=judge, metrics=["correctness"])
    names = {g: metric_name_part(g) for g in ("a:b", "a_b", long, "日本語")}
    assert len(set(names.values())) == 4 and names["a_b"] == "a_b" and names["日本語"] == "日本語"
    assert names[long].startswith("team-xxxx") and len(names[long]) <= 100
    for n in names.values():
        assert f"correctness/count/{n}" in out.metrics
    assert out.config["metric_name_parts"] == {"a:b": names["a:b"], long: names[long]}
    from mlflow_ragjudge.adapters.run_log import log_output

    with mlflow.start_run() as run:
        log_output(out, run.info.run_id)  # MLflow accepts every name (it refused the 305-character one before)
    logged = mlflow.get_run(run.info.run_id).data.metrics
    assert all(f"correctness/count/{n}" in logged for n in names.values())


@pytest.mark.inprocess_judge
def test_retriever_returning_none_means_no_contexts(fake_llm, judge):
    out = evaluate_frame(frame(), judge=judge, metrics=["correctness"], retriever=_retriever(None),
                         context_mode="reference")
    assert all(r.details["context_info"]["n_given"] == 0 for r in out.results["correctness"])


# ----------------------------------------------------------------------------- mlflow.models.evaluate


def _model(out):
    def predict(features):  # mlflow.models.evaluate wraps a function into a pyfunc model
        return out

    return predict


MLFLOW_CASES = [
    ("timeout-text", {"timeout": "abc"}, None, "timeout"),
    ("unknown-key", {"timeot": 5}, None, "timeot"),
    ("model-returns-none", {}, _model(None), "returned NoneType"),
    ("model-returns-str", {}, _model("one answer"), "returned str"),
    ("model-frame-without-answer", {}, _model(pd.DataFrame({"x": [1, 2], "y": [1, 2]})), "'answer' column"),
    ("model-too-few", {}, _model(["only one"]), "1 outputs for 2 rows"),
    ("max-concurrency-zero", {"max_concurrency": 0}, None, "max_concurrency"),
    ("human-inf", {"human_columns": ["expert"]}, None, "finite"),
]


@pytest.mark.parametrize("config, model, phrase", [c[1:] for c in MLFLOW_CASES], ids=[c[0] for c in MLFLOW_CASES])
def test_bad_input_through_mlflow_models_evaluate(fake_llm, judge, tmp_tracking, config, model, phrase):
    df = frame(expert=[4, float("inf")]).drop(columns=[] if model is None else ["answer"])
    with mlflow.start_run(), pytest.raises(Exception) as e:
        mlflow.models.evaluate(
            data=df, model=model, predictions=None if model is not None else "answer", targets="reference",
            model_type="rag", evaluators="ragjudge",
            evaluator_config={"judge": judge, "metrics": ["correctness"], **config})
    assert phrase in str(e.value), str(e.value)
    assert fake_llm.request_count == 0


# ----------------------------------------------------------------------------- scorers


SCORER_CASES = [
    ("correctness-cache-int", "Correctness", {"cache": 123}, "cache"),
    ("correctness-concurrency-zero", "Correctness", {"max_concurrency": 0}, "max_concurrency"),
    ("correctness-mode", "Correctness", {"context_mode": "e3"}, "context_mode"),
    ("faithfulness-cache-int", "Faithfulness", {"cache": 123}, "cache"),
    ("faithfulness-timeout", "Faithfulness", {"timeout": "abc"}, "timeout"),
    ("context-precision-language", "ContextPrecision", {"language": 5}, "language"),
]


@pytest.mark.parametrize("cls, kwargs, phrase", [c[1:] for c in SCORER_CASES], ids=[c[0] for c in SCORER_CASES])
def test_bad_scorer_settings_are_refused_at_construction(fake_llm, judge, cls, kwargs, phrase):
    from mlflow_ragjudge.adapters import scorers

    with pytest.raises(ValueError) as e:
        getattr(scorers, cls)(judge, **kwargs)
    assert phrase in str(e.value)
    assert fake_llm.request_count == 0


def test_a_scorer_row_missing_its_inputs_is_a_documented_per_row_failure(fake_llm, judge):
    from mlflow_ragjudge.adapters.scorers import Correctness

    feedback = Correctness(judge, cache=False)(inputs={"question": "q"}, outputs="a", expectations={})
    assert feedback.error.error_code == "invalid_input" and "reference" in feedback.error.error_message
    assert fake_llm.request_count == 0


# ----------------------------------------------------------------------------- the CLI


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


GOOD_JSONL = "\n".join(json.dumps({k: v[i] for k, v in BASE.items()}) for i in range(2))

CLI_CASES = [
    # id, file name, file text (None: the file is missing), extra args, phrase
    ("missing-file", "nope.jsonl", None, [], "No such file"),
    ("unsupported-extension", "d.txt", "x", [], "unsupported file type"),
    ("jsonl-array-line", "d.jsonl", '[1, 2]\n', [], "line 1 is a JSON list"),
    ("jsonl-invalid-line", "d.jsonl", GOOD_JSONL + "\n{not json", [], "line 3 is not valid JSON"),
    ("jsonl-empty", "d.jsonl", "\n\n", [], "has no rows"),
    ("json-object", "d.json", '{"question": "q"}', [], "JSON list of row objects"),
    ("csv-contexts-not-a-list", "d.csv", "question,answer,reference,contexts\nq,a,r,just text\n",
     ["--metrics", "faithfulness"], "'contexts' row 0 holds a string"),
    ("config-not-json", "d.jsonl", GOOD_JSONL, ["--config", "{oops"], "--config is not valid JSON"),
    ("config-a-list", "d.jsonl", GOOD_JSONL, ["--config", "[1]"], "--config must be a JSON object"),
    ("config-bad-value", "d.jsonl", GOOD_JSONL, ["--config", '{"timeout": "abc"}'], "timeout"),
    ("col-without-equals", "d.jsonl", GOOD_JSONL, ["--col", "question"], "NAME=VALUE"),
    ("fail-under-without-equals", "d.jsonl", GOOD_JSONL, ["--fail-under", "correctness"], "NAME=VALUE"),
    ("fail-under-not-a-number", "d.jsonl", GOOD_JSONL, ["--fail-under", "correctness=high"], "must be a number"),
    ("max-concurrency-zero", "d.jsonl", GOOD_JSONL, ["--max-concurrency", "0"], "max_concurrency"),
    ("max-error-rate-two", "d.jsonl", GOOD_JSONL, ["--max-error-rate", "2"], "max_error_rate"),
    ("k-zero", "d.jsonl", GOOD_JSONL, ["--k", "0"], "k must"),
    ("unknown-metric", "d.jsonl", GOOD_JSONL, ["--metrics", "nosuch"], "nosuch"),
    ("unknown-provider", "d.jsonl", GOOD_JSONL, ["--judge", "nosuch:/m"], "unknown provider"),
    ("human-column-missing", "d.jsonl", GOOD_JSONL, ["--human-columns", "expert"], "'expert'"),
    ("group-column-missing", "d.jsonl", GOOD_JSONL, ["--group-column", "team"], "group_column='team'"),
]


@pytest.mark.parametrize("name, text, args, phrase", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_bad_cli_input_exits_2_without_a_traceback_or_a_call(fake_llm, judge, tmp_path, tmp_tracking, capsys,
                                                             name, text, args, phrase):
    path = str(tmp_path / name) if text is None else _write(tmp_path, name, text)
    argv = ["evaluate", path, *args]
    if "--judge" not in args:
        argv += ["--judge", judge]
    if "--metrics" not in args:
        argv += ["--metrics", "correctness"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and phrase in err and "Traceback" not in err, err
    assert fake_llm.request_count == 0
    assert not mlflow.search_runs(search_all_experiments=True).shape[0]  # no empty run left behind


def test_cli_jsonl_with_invalid_unicode_runs_with_a_warning(fake_llm, judge, tmp_path, tmp_tracking, capsys):
    line = json.dumps({"question": "What is X?", "answer": "X is a letter", "reference": "X is a letter."})
    path = _write(tmp_path, "d.jsonl", line.replace("X is a letter", "X is a letter \\ud800", 1) + "\n" + line)
    with pytest.warns(InvalidTextWarning, match=r"line\(s\) \[1\]"):
        assert main(["evaluate", path, "--judge", judge, "--metrics", "correctness"]) == 0
    run = mlflow.search_runs(search_all_experiments=True)
    assert run.shape[0] == 1 and run["metrics.correctness/count"][0] == 2


def test_testset_corpus_errors_exit_2(tmp_path, capsys, judge):
    bad = _write(tmp_path, "c.jsonl", '{"id": "d1"}\n')
    assert main(["testset", bad, "--judge", judge, "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "needs an 'id' and a 'text'" in capsys.readouterr().err


def test_the_corpus_has_at_least_100_cases():
    n = len(CONFIG_CASES) + len(DATA_CASES) + len(MLFLOW_CASES) + len(SCORER_CASES) + len(CLI_CASES)
    assert n >= 100, n
