"""The engine: metrics from the registry (one added here through the public API, as docs/extending.md
shows), one scheduler with no barrier between metrics, one input layer shared by the evaluator and the
scorers, and context precision + recall sharing one call.

The fake server's model is the independent, schema-following one (``compliant_model``); where a test
needs a particular reply it changes the model's *output* (drops list entries, blocks on a row's own
data), never routes on our prompt wording.
"""

from __future__ import annotations

import json
import threading

import pandas as pd
import pytest
from compliant_model import CompliantModel

import mlflow_ragjudge as rj
from mlflow_ragjudge.core.types import JudgeResult
from mlflow_ragjudge.llm.backends import ChatRequest, JsonSchema
from mlflow_ragjudge.metrics.spec import MetricSpec, Outputs, metric_names, register_metric, unregister_metric

RAGAS4 = ["faithfulness", "answer_relevancy", "context_precision", "context_recall"]


def _rows(n: int, k: int = 4) -> pd.DataFrame:
    return pd.DataFrame([
        {"question": f"What does tool {i} do?", "answer": f"Tool {i} cuts wood. It was made in 19{i}0.",
         "reference": f"Tool {i} cuts wood and was made in 19{i}0.",
         "contexts": [f"Passage {j} on tool {i}: it cuts wood." for j in range(k)]}
        for i in range(n)
    ])


def _schema_name(request) -> str | None:
    fmt = request.response_format or {}
    return (fmt.get("json_schema") or {}).get("name")


@pytest.fixture
def emb(fake_llm) -> str:
    return f"openai:/emb?base_url={fake_llm.openai_base_url}"


# --------------------------------------------------------------------------- a metric added through the API


SCORE_SCHEMA = {"type": "object", "properties": {"score": {"type": "integer", "enum": [1, 2, 3]},
                                                 "reason": {"type": "string"}},
                "required": ["score", "reason"], "additionalProperties": False}


def _concise(state, row, ctx) -> JudgeResult:
    """A judged metric written the way a user would: one call through the run's client."""
    request = ChatRequest.of(
        [{"role": "user", "content": f"Rate from 1 to 3 how concise this answer is:\n{row.answer}"}],
        max_tokens=64, json_schema=JsonSchema("concise", SCORE_SCHEMA))
    call = ctx.judge_client.call(request, parse=lambda r: r.data or json.loads(r.text), purpose="concise")
    if not call.ok:
        return JudgeResult.failed(call.failure or "internal_error", call.error, calls=call.records)
    return JudgeResult.scored(float(call.parsed["score"]), call.parsed["reason"], calls=call.records)


@pytest.fixture
def added_metrics():
    specs = [
        MetricSpec("answer_words", requires=(("answer",),),
                   score=lambda state, row, ctx: JudgeResult.scored(float(len((row.answer or "").split()))),
                   description="words in the answer"),
        MetricSpec("concise", requires=(("answer",),), judged=True, score=_concise,
                   estimate=lambda state, row, ctx: {"calls": 1, "input_tokens": 40, "output_tokens": 20},
                   outputs=Outputs(columns={
                       "concise/reason_words": lambda res: len(res["concise"].rationale.split())})),
    ]
    for s in specs:
        register_metric(s)
    yield specs
    for s in specs:
        unregister_metric(s.name)


@pytest.mark.inprocess_judge
def test_a_metric_added_through_the_public_api_runs_like_a_built_in_one(added_metrics, judge, fake_llm):
    assert {"answer_words", "concise"} <= set(metric_names())
    from mlflow_ragjudge.cli import metrics_table

    listed = {line.split()[0] for line in metrics_table().splitlines()[1:]}
    assert listed == set(metric_names()) and "concise" in listed  # `ragjudge metrics` reads the registry
    df = _rows(3)
    out = rj.evaluate_frame(df, judge=judge, metrics=["answer_words", "concise", "correctness"], cache=False)
    assert out.metrics["answer_words/mean"] == pytest.approx(9.0)  # "Tool 0 cuts wood. It was made in 1900."
    assert 1.0 <= out.metrics["concise/mean"] <= 3.0 and out.metrics["concise/error_rate"] == 0.0
    assert out.table["concise/status"].tolist() == ["scored"] * 3
    assert out.table["concise/reason_words"].notna().all()
    assert {t["metric"] for t in out.transcripts} == {"concise", "correctness"}
    assert out.metrics["judge/concise/requests_per_row"] == 1.0
    assert list(out.table.columns[:2]) == ["question", "correctness/score"]  # the headline stays first
    # by default it runs when its columns are there, and the estimate comes from its spec
    est = rj.evaluate_frame(df, judge=judge, metrics=["concise"], dry_run=True)
    assert est.metrics["estimate/concise/calls"] == 3.0
    with pytest.raises(ValueError, match="Unknown metric"):
        rj.evaluate_frame(df, judge=judge, metrics=["not_a_metric"])


def test_register_refuses_a_duplicate_and_a_spec_without_a_scorer():
    with pytest.raises(ValueError, match="already registered"):
        register_metric(MetricSpec("correctness", requires=(("answer",),), score=lambda s, r, c: None))
    with pytest.raises(ValueError, match="exactly one of score= and score_batch="):
        MetricSpec("x", requires=(("answer",),))


def test_a_metric_that_raises_fails_its_rows_and_the_run_goes_on(judge):
    def flaky(state, row, ctx):
        if row.index == 1:
            raise KeyError("boom")
        return JudgeResult.scored(1.0)

    register_metric(MetricSpec("flaky", requires=(("answer",),), score=flaky))
    try:
        out = rj.evaluate_frame(_rows(3), metrics=["flaky", "lexical"], bertscore=False)
    finally:
        unregister_metric("flaky")
    assert out.results["flaky"][1].reason == "internal_error" and "boom" in out.results["flaky"][1].rationale
    assert out.metrics["flaky/mean"] == 1.0 and out.metrics["word_recall/mean"] > 0


# --------------------------------------------------------------------------- one scheduler


def test_a_hung_call_holds_only_its_own_row(fake_llm, judge):
    """No barrier between metrics: while one row's first call is held at the server, every other row
    finishes all its metrics (asserted on the server's request log, not on a clock)."""
    model = CompliantModel("json_schema")
    release = threading.Event()
    held = threading.Event()

    def handler(request):
        if "tool 0 " in json.dumps(request.messages) and not release.is_set():  # the row's own data
            held.set()
            release.wait(20)
        return model(request)

    # a first run settles the connection's structured-output mode (until then structured requests go one
    # at a time, by design), then the server's log starts afresh
    rj.evaluate_frame(_rows(1).assign(question="warm-up?"), judge=judge, metrics=["correctness"], cache=False)
    fake_llm.set_handler(handler)
    fake_llm.reset()
    fake_llm.set_handler(handler)
    df = _rows(4)
    done: dict = {}
    t = threading.Thread(target=lambda: done.setdefault("out", rj.evaluate_frame(
        df, judge=judge, metrics=["correctness", "faithfulness", "context_relevance"], cache=False)))
    t.start()
    assert held.wait(10)
    # the other three rows need 1 + 2 + 1 requests each; they all arrive while row 0 is held
    assert fake_llm.wait_for_requests(1 + 3 * 4, timeout=15)
    assert t.is_alive()
    release.set()
    t.join(30)
    out = done["out"]
    # every row judged, none failed (the independent model picks its verdicts by a hash of the conversation, so a
    # correctness reply may be level 0, "not sure": an abstention, a judgement like any other)
    statuses = [s for c in out.table.columns if c.endswith("/status") for s in out.table[c]]
    assert statuses and all(s == "scored" or s.startswith("abstained") for s in statuses), statuses


# --------------------------------------------------------------------------- fewer calls


def test_four_ragas_metrics_cost_five_requests_per_row(fake_llm, judge, emb):
    df = _rows(5)
    out = rj.evaluate_frame(df, judge=judge, embeddings=emb, metrics=RAGAS4, cache=False)
    chat = [r for r in fake_llm.requests if r.api == "openai_chat"]
    assert len(chat) == 5 * len(df)
    names = [_schema_name(r) for r in chat]
    assert names.count("context_verdicts") == len(df)  # precision and recall verdicts in one call per row
    assert names.count("statements") == 2 * len(df)  # the response's claims and the reference's statements
    for m in RAGAS4:
        assert out.table[f"{m}/status"].tolist() == ["scored"] * len(df)
    assert out.config["prompt_versions"]["context_verdicts"] == "context_verdicts-v3-en"
    # the shared call is recorded once as sent and once as shared (no tokens)
    shared = [t for t in out.transcripts if t.get("shared")]
    assert len(shared) >= len(df) and all(t["input_tokens"] == 0 for t in shared)
    # alone, each keeps its single call
    fake_llm.reset()
    fake_llm.set_handler(CompliantModel("json_schema"))
    rj.evaluate_frame(df, judge=judge, metrics=["context_precision"], cache=False)
    assert [_schema_name(r) for r in fake_llm.requests] == ["context_precision_verdicts"] * len(df)


def test_a_combined_reply_that_misses_entries_is_completed_by_number(fake_llm, judge, emb):
    """A sloppy model drops the last entry of every list in its first combined reply: each metric asks
    about its own missing numbers only, and every row is scored."""
    model = CompliantModel("json_schema")
    dropped: list[int] = []

    def handler(request):
        reply = model(request)
        if _schema_name(request) == "context_verdicts" and isinstance(reply, dict):
            reply = {k: (v[:-1] if isinstance(v, list) and len(v) > 1 else v) for k, v in reply.items()}
            dropped.append(1)
        return reply

    fake_llm.set_handler(handler)
    df = _rows(3)
    out = rj.evaluate_frame(df, judge=judge, metrics=["context_precision", "context_recall"], cache=False)
    assert len(dropped) == len(df)
    for m in ("context_precision", "context_recall"):
        assert out.table[f"{m}/status"].tolist() == ["scored"] * len(df)
        for res in out.results[m]:
            assert res.details["combined_call"] is True and res.details["salvaged"]["asked_again"]
    names = [_schema_name(r) for r in fake_llm.requests]
    assert names.count("context_precision_verdicts") == len(df) and names.count("context_recall_verdicts") == len(df)


# --------------------------------------------------------------------------- one input layer


def test_evaluator_and_scorer_treat_a_raising_retriever_alike(fake_llm, judge):
    def retriever(query):
        raise ConnectionError("index offline")

    df = _rows(2)
    with pytest.raises(rj.InputError, match="retriever raised on row 0 .*index offline") as err:
        rj.evaluate_frame(df, judge=judge, metrics=["correctness"], retriever=retriever, cache=False)
    from mlflow_ragjudge.adapters.scorers import Correctness

    fb = Correctness(judge=judge, retriever=retriever, cache=False)(
        inputs={"question": "q"}, outputs="a", expectations={"expected_response": "r"})
    assert fb.error.error_code == "invalid_input"
    assert fb.error.error_message.split(" on row")[0] == str(err.value).split(" on row")[0]
    assert fake_llm.request_count == 0


def test_scorer_refuses_retriever_output_the_evaluator_refuses(fake_llm, judge):
    from mlflow_ragjudge.adapters.scorers import Correctness

    fb = Correctness(judge=judge, retriever=lambda q: {"d1": "text"}, cache=False)(
        inputs={"question": "q"}, outputs="a", expectations={"expected_response": "r"})
    assert fb.error.error_code == "invalid_input" and "returned a dict" in fb.error.error_message
    assert fake_llm.request_count == 0


# --------------------------------------------------------------------------- the client as the policy point


def test_an_unknown_exception_in_a_backend_is_an_internal_error_not_retried(judge):
    from mlflow_ragjudge.llm.backends import FakeBackend

    calls = []

    class Broken(FakeBackend):
        def chat(self, request, *, timeout=None):
            calls.append(1)
            raise ValueError("a bug in our code")

    client = rj.JudgeClient(Broken(), cache=False)
    res = client.call(ChatRequest.of([{"role": "user", "content": "x"}]))
    assert not res.ok and res.failure.value == "internal_error" and "a bug in our code" in res.error
    assert len(calls) == 1


def test_embeddings_go_through_the_run_client(fake_llm, judge, emb, tmp_path):
    df = _rows(6)
    cache = tmp_path / "cache"
    first = rj.evaluate_frame(df, judge=judge, embeddings=emb, metrics=["answer_relevancy"], cache=str(cache))
    assert first.table["answer_relevancy/status"].tolist() == ["scored"] * len(df)
    # a noncommittal response scores 0 with no embedding; the model answered committal for some rows
    assert any(not r.details["noncommittal"] for r in first.results["answer_relevancy"])
    embeds = [r for r in fake_llm.requests if r.api == "openai_embeddings"]
    assert first.config["usage"]["embedding_requests"] == len(embeds) >= 1  # counted by the run's client
    n = fake_llm.request_count
    again = rj.evaluate_frame(df, judge=judge, embeddings=emb, metrics=["answer_relevancy"], cache=str(cache))
    assert fake_llm.request_count == n  # an identical re-run sends nothing: chat and embeddings both cached
    assert again.metrics["answer_relevancy/mean"] == first.metrics["answer_relevancy/mean"]


@pytest.mark.inprocess_judge
def test_client_records_are_bounded(judge):
    from mlflow_ragjudge.llm.client import RECENT_RECORDS

    client = rj.JudgeClient(judge, cache=False)
    assert client.records.maxlen == RECENT_RECORDS


def test_adaptive_timeout_follows_observed_latency(monkeypatch):
    from mlflow_ragjudge.llm.client import ProviderGate

    monkeypatch.delenv("RAGJUDGE_TAIL_TIMEOUT_FLOOR")  # the product's floor (the suite sets a long one)
    gate = ProviderGate()
    assert gate.adaptive_timeout(60.0) == 60.0  # nothing seen yet: the configured timeout
    for _ in range(ProviderGate.MIN_OBSERVATIONS):
        gate.observe(0.2)
    assert gate.adaptive_timeout(60.0) == ProviderGate.MIN_ADAPTIVE_TIMEOUT
    for _ in range(200):
        gate.observe(5.0)
    assert gate.adaptive_timeout(60.0) == 20.0 and gate.adaptive_timeout(15.0) == 15.0  # 4 x p95, capped
    monkeypatch.setenv("RAGJUDGE_TAIL_TIMEOUT_FLOOR", "50")  # a machine that wants a longer floor
    assert gate.adaptive_timeout(60.0) == 50.0


def test_a_call_hung_far_past_the_usual_latency_is_sent_again(fake_llm, judge, monkeypatch):
    """After 20 quick replies, one request hangs: its first attempt is abandoned at the adaptive timeout
    and the second attempt answers; the row is scored and nothing is counted twice."""
    monkeypatch.setenv("RAGJUDGE_TAIL_TIMEOUT_FLOOR", "0.3")
    model = CompliantModel("json_schema")
    seen = {"n": 0}
    release = threading.Event()

    def handler(request):
        seen["n"] += 1
        if seen["n"] == 25:  # one hang, then the server is healthy again
            release.wait(10)
        return model(request)

    fake_llm.set_handler(handler)
    client = rj.JudgeClient(judge, cache=False, timeout=30)
    client.gate._latencies.clear()
    results = [client.call(ChatRequest.of([{"role": "user", "content": f"say {i}"}],
                                          json_schema=JsonSchema("s", SCORE_SCHEMA))) for i in range(30)]
    release.set()
    assert all(r.ok for r in results)
    retried = [r for r in results if r.records[-1]["attempts"] == 2]
    assert len(retried) == 1 and client.usage.retries == 1
    assert fake_llm.request_count == 31
    assert client.usage.input_tokens == sum(r.records[-1]["input_tokens"] for r in results)


def test_a_first_request_that_hangs_before_the_latency_is_known_is_sent_again(fake_llm, judge, monkeypatch):
    """The very first request hangs, while 15 others sent at the same time answer at once: it was sent before the
    connection knew its server's usual latency, so it is watched; once the others have taught the latency, it is
    left and sent again (attempt 2) instead of holding its row until the hang ends (attempt 1, 30 s later)."""
    # a 3-s floor: well under the 30-s hang, and above what a quick reply takes on a loaded CI machine (with a 1-s
    # floor a fresh-clone CI run saw 6 of the 15 quick replies pass it and be sent again)
    monkeypatch.setenv("RAGJUDGE_TAIL_TIMEOUT_FLOOR", "3.0")
    model = CompliantModel("json_schema")
    release = threading.Event()
    seen = {"n": 0, "hung": None}
    lock = threading.Lock()

    def handler(request):
        with lock:
            seen["n"] += 1
            first = seen["n"] == 1
            if first:
                seen["hung"] = request.last_user_text  # which of the 16 requests hangs (the test's own text)
        if first:
            release.wait(30)
        return model(request)

    fake_llm.set_handler(handler)
    client = rj.JudgeClient(judge, cache=False, timeout=60)
    request = [ChatRequest.of([{"role": "user", "content": f"say {i}"}], json_schema=JsonSchema("s", SCORE_SCHEMA))
               for i in range(16)]
    results: list = [None] * 16
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, client.call(request[i])))
               for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    release.set()
    assert all(r.ok for r in results)
    # the hung one was left and sent again, not waited for (its thread would have joined only after the 30-s hang)
    hung = next(i for i in range(16) if seen["hung"] and f"say {i}" == seen["hung"].strip())
    assert results[hung].records[-1]["attempts"] == 2
    # and not every watched request: on a loaded machine a slow quick reply may pass the floor too (a fresh-clone CI
    # run saw 6 of 15 at a 1-s floor, a machine with three busy loops on two cores 3 of 15 at 3 s), but a policy that
    # sent every watched request again would leave none at one attempt
    attempts = sorted(r.records[-1]["attempts"] for r in results)
    assert attempts[-1] == 2 and attempts.count(1) >= 8
    assert fake_llm.request_count == 16 + client.usage.retries


def test_the_estimate_follows_the_call_plan(fake_llm, judge, emb):
    """dry_run counts what a run sends: with precision and recall together, one combined call and one
    extraction per row for the pair (3 calls alone, as two single metrics)."""
    df = _rows(4)
    both = rj.evaluate_frame(df, judge=judge, metrics=["context_precision", "context_recall"], dry_run=True)
    alone = rj.evaluate_frame(df, judge=judge, metrics=["context_recall"], dry_run=True)
    assert both.metrics["estimate/total/calls"] == 2 * len(df)
    assert alone.metrics["estimate/total/calls"] == 2 * len(df)
    assert fake_llm.request_count == 0
    out = rj.evaluate_frame(df, judge=judge, metrics=["context_precision", "context_recall"], cache=False)
    assert fake_llm.request_count == both.metrics["estimate/total/calls"]
    sent = sum(t["input_tokens"] for t in out.transcripts)
    assert both.metrics["estimate/total/input_tokens"] >= sent  # an upper bound (the server counts words)


def test_a_scorer_for_a_metric_that_cannot_run_is_refused_when_built(judge):
    from mlflow_ragjudge.adapters.scorers import MetricScorer

    with pytest.raises(ValueError, match="multiturn_system"):
        MetricScorer("multiturn", judge)


def test_options_are_per_metric_one_user_key_each_metrics_own_default_and_check():
    from mlflow_ragjudge.engine.config import RagJudgeConfig
    from mlflow_ragjudge.metrics.spec import Option

    loose = Option("shared_limit", 10, lambda v: isinstance(v, int), "a whole number", "10")
    strict = Option("shared_limit", 3, lambda v: isinstance(v, int) and v <= 5, "a whole number <= 5", "3")
    seen: dict[str, int] = {}

    def reading(name: str, opt: Option[int]) -> MetricSpec[None]:
        def score(state: None, row, ctx) -> JudgeResult:
            seen[name] = opt.read(ctx.cfg)
            return JudgeResult.scored(1.0)
        return MetricSpec(name, requires=(("answer",),), score=score, options=(opt,))

    specs = [reading("loose_metric", loose), reading("strict_metric", strict)]
    for s in specs:
        register_metric(s)
    try:
        rj.evaluate_frame(_rows(1), metrics=["loose_metric", "strict_metric"])
        assert seen == {"loose_metric": 10, "strict_metric": 3}  # not given: each metric's own default
        rj.evaluate_frame(_rows(1), metrics=["loose_metric", "strict_metric"], shared_limit=4)
        assert seen == {"loose_metric": 4, "strict_metric": 4}  # given: both read the one user key
        with pytest.raises(ValueError, match=r"shared_limit=7 is not valid for metric 'strict_metric'.*<= 5"):
            RagJudgeConfig.from_dict({"shared_limit": 7})  # the metric that refuses it is named
        with pytest.raises(KeyError, match=r"metric 'strict_metric' has no option 'limit' \(its options: shared_limit"):
            specs[1].option("limit")
        with pytest.raises(AttributeError):
            RagJudgeConfig().shared_limit  # noqa: B018 -- no global namespace of options
    finally:
        for s in specs:
            unregister_metric(s.name)
