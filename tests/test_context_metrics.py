"""Context precision, context recall, context relevance and answer relevancy against the fake LLM server."""

from __future__ import annotations

import math
import re
import threading

import pytest
from fakellm import Reply, embed_text

from mlflow_ragjudge.core.text import split_context_sentences
from mlflow_ragjudge.core.types import Status
from mlflow_ragjudge.llm.client import JudgeClient
from mlflow_ragjudge.metrics import ContextPrecisionJudge, ContextRecallJudge, ContextRelevanceJudge
from mlflow_ragjudge.metrics.answer_relevancy import AnswerRelevancyJudge
from mlflow_ragjudge.metrics.statements import StatementExtractor

PRECISION_MARK = "were retrieved for the QUESTION"
STATEMENTS_MARK = "Break the TEXT into claims"
RECALL_MARK = "come from the reference answer to the QUESTION"
RELEVANCE_MARK = "numbered sentences. Select the fewest sentences"
RELEVANCY_MARK = "Write 3 different questions"

QUESTION = "What does UNION ALL do?"
REFERENCE = "UNION ALL combines two result sets. It keeps duplicate rows. It is faster than UNION."
REF_STATEMENTS = [
    "UNION ALL combines two result sets.",
    "UNION ALL keeps duplicate rows.",
    "UNION ALL is faster than UNION.",
]
CHUNKS = [
    "UNION ALL combines the result sets of two queries and keeps every row, including duplicates.",
    "A tablespace is a storage structure for tables.",
    "UNION ALL is faster than UNION because it does not remove duplicates.",
    "Indexes speed up lookups.",
    "The EXCEPT operator returns rows of the first query only.",
]


def chat_requests(fake_llm):
    return [r for r in fake_llm.requests if r.api in ("openai_chat", "anthropic_messages")]


def by_marker(table):
    """Handler: the first marker found in the prompt picks the reply; embeddings get the default vectors."""

    def handler(req):
        if req.api == "openai_embeddings":
            return None
        text = req.last_user_text
        for marker, reply in table.items():
            if marker in text:
                return reply(req) if callable(reply) else reply
        return Reply.error(400, f"unexpected prompt: {text[:80]}")

    return handler


def chunk_verdicts(*flags):
    return {"verdicts": [{"passage": i, "reason": f"r{i}", "relevant": f} for i, f in enumerate(flags, 1)]}


def recall_verdicts(*flags):
    return {"verdicts": [{"statement": i, "reason": f"r{i}", "attributed": f} for i, f in enumerate(flags, 1)]}


@pytest.fixture
def client(fake_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-context-0001")
    return JudgeClient(f"openai:/judge-model?base_url={fake_llm.openai_base_url}", cache=False)


@pytest.fixture
def sharing_client(fake_llm, monkeypatch):
    """A client that sends identical requests once (as the evaluator's and the scorers' clients do)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-context-0001")
    return JudgeClient(f"openai:/judge-model?base_url={fake_llm.openai_base_url}", cache=False, dedupe=True)


# --------------------------------------------------------------------------- context precision


def test_context_precision_one_request_for_five_chunks(fake_llm, client):
    fake_llm.set_handler(by_marker({PRECISION_MARK: chunk_verdicts(True, False, True, False, False)}))
    judge = ContextPrecisionJudge(client)
    result = judge.judge(QUESTION, REFERENCE, CHUNKS)

    assert result.status is Status.SCORED
    assert result.value == pytest.approx((1 / 1 + 2 / 3) / 2)  # relevant at ranks 1 and 3
    assert len(chat_requests(fake_llm)) == 1  # ragas sends one per chunk: 5
    prompt = chat_requests(fake_llm)[0].last_user_text
    assert "PASSAGES (5):" in prompt and all(f' n="{i}">' in prompt for i in range(1, 6))
    assert REFERENCE in prompt and QUESTION in prompt
    assert [c["relevant"] for c in result.details["chunks"]] == [True, False, True, False, False]
    assert [c["rank"] for c in result.details["chunks"]] == [1, 2, 3, 4, 5]
    assert result.details["n_relevant"] == 2 and "rank(s) [1, 3]" in result.rationale
    assert judge.prompt_versions == {"context_precision": "context_precision-v4-en"}
    assert judge.estimate(QUESTION, REFERENCE, CHUNKS)["calls"] == 1


def test_context_precision_rewards_early_relevant_chunks(fake_llm, client):
    judge = ContextPrecisionJudge(client)
    fake_llm.set_handler(by_marker({PRECISION_MARK: chunk_verdicts(True, True, False, False, False)}))
    early = judge.judge(QUESTION, REFERENCE, CHUNKS).value
    fake_llm.set_handler(by_marker({PRECISION_MARK: chunk_verdicts(False, False, False, True, True)}))
    late = judge.judge(QUESTION, REFERENCE, CHUNKS).value
    assert early == 1.0 and late == pytest.approx((1 / 4 + 2 / 5) / 2)


def test_context_precision_none_relevant_scores_zero(fake_llm, client):
    fake_llm.set_handler(by_marker({PRECISION_MARK: chunk_verdicts(False, False, False, False, False)}))
    result = ContextPrecisionJudge(client).judge(QUESTION, REFERENCE, CHUNKS)
    assert result.status is Status.SCORED and result.value == 0.0
    assert "None of the 5 chunks" in result.rationale


def test_context_precision_short_verdict_list_asks_again_for_the_missing_passages(fake_llm, client):
    fake_llm.script(chunk_verdicts(True, False, True),
                    {"verdicts": [{"passage": 5, "reason": "r5", "relevant": True},
                                  {"passage": 4, "reason": "r4", "relevant": False}]})
    result = ContextPrecisionJudge(client).judge(QUESTION, REFERENCE, CHUNKS)
    assert result.status is Status.SCORED
    assert [c["relevant"] for c in result.details["chunks"]] == [True, False, True, False, True]
    assert result.value == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)
    again = chat_requests(fake_llm)[1].last_user_text
    assert ' n="4">' in again and ' n="5">' in again and ' n="1">' not in again  # each passage in its own fence


def test_context_precision_still_short_after_asking_again_fails_inconsistent(fake_llm, client):
    fake_llm.set_handler(lambda req: chunk_verdicts(True, False, True))  # never a verdict for passages 4 and 5
    result = ContextPrecisionJudge(client).judge(QUESTION, REFERENCE, CHUNKS)
    assert result.status is Status.FAILED and result.reason == "inconsistent"
    assert "passage number(s) [4, 5]" in result.rationale
    assert result.raw is not None and '"verdicts"' in result.raw


def test_context_precision_extra_verdicts_are_set_aside(fake_llm, client):
    fake_llm.set_handler(lambda req: chunk_verdicts(*(True,) * 6))
    result = ContextPrecisionJudge(client).judge(QUESTION, REFERENCE, CHUNKS)
    assert result.status is Status.SCORED and result.value == 1.0
    assert result.details["reply_problems"] == [{"reply": 1, "not_asked": [6]}]


def test_context_precision_keeps_ranks_of_empty_chunks(fake_llm, client):
    fake_llm.set_handler(by_marker({PRECISION_MARK: chunk_verdicts(False, True)}))
    result = ContextPrecisionJudge(client).judge(QUESTION, REFERENCE, ["", CHUNKS[0]])
    assert result.value == pytest.approx(0.5)  # the relevant chunk is at rank 2
    assert ' n="1">\n(empty passage)\n</passage-' in chat_requests(fake_llm)[0].last_user_text


def test_context_precision_abstains_without_contexts_or_reference(fake_llm, client):
    judge = ContextPrecisionJudge(client)
    assert judge.judge(QUESTION, REFERENCE, []).reason == "no_contexts"
    assert judge.judge(QUESTION, REFERENCE, None).reason == "no_contexts"
    assert judge.judge(QUESTION, "  ", CHUNKS).reason == "no_reference"
    assert fake_llm.request_count == 0


def test_context_precision_through_anthropic(fake_llm, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-anthropic-context-01")
    client = JudgeClient(f"anthropic:/claude-judge?base_url={fake_llm.anthropic_base_url}", cache=False)
    fake_llm.set_handler(by_marker({PRECISION_MARK: chunk_verdicts(False, True, True, False, False)}))
    result = ContextPrecisionJudge(client).judge(QUESTION, REFERENCE, CHUNKS)
    assert result.value == pytest.approx((1 / 2 + 2 / 3) / 2)
    (req,) = chat_requests(fake_llm)
    assert req.api == "anthropic_messages" and req.tool_choice["name"] == "context_precision_verdicts"


# --------------------------------------------------------------------------- context recall


def test_context_recall_reuses_the_reference_statements(fake_llm, sharing_client):
    client = sharing_client
    fake_llm.set_handler(by_marker({
        STATEMENTS_MARK: {"statements": REF_STATEMENTS},
        RECALL_MARK: recall_verdicts(True, True, False),
    }))
    judge = ContextRecallJudge(client)
    first = judge.judge(QUESTION, REFERENCE, CHUNKS[:2])
    second = judge.judge(QUESTION, REFERENCE, CHUNKS[2:])

    assert first.value == pytest.approx(2 / 3) and second.value == pytest.approx(2 / 3)
    prompts = [r.last_user_text for r in chat_requests(fake_llm)]
    assert sum(STATEMENTS_MARK in p for p in prompts) == 1  # one extraction for the same reference
    assert sum(RECALL_MARK in p for p in prompts) == 2
    assert [c["purpose"] for c in first.calls] == ["statements", "context_recall"]
    assert [c["purpose"] for c in second.calls] == ["context_recall"]
    assert second.details["statements_memo_hit"] is True
    assert first.details["statements"][2] == {"statement": REF_STATEMENTS[2], "attributed": False, "reason": "r3"}
    assert "STATEMENTS (3):" in prompts[1] and "[1] UNION ALL combines two result sets." in prompts[1]
    assert judge.estimate(QUESTION, REFERENCE, CHUNKS)["calls"] == 1  # the extraction is memoised


def test_statement_memo_is_shared_across_judges_and_threads(fake_llm, sharing_client):
    client = sharing_client
    fake_llm.latency = 0.05  # keep the first extraction in flight while the others arrive
    fake_llm.set_handler(by_marker({
        STATEMENTS_MARK: {"statements": REF_STATEMENTS},
        RECALL_MARK: recall_verdicts(True, False, True),
    }))
    extractor = StatementExtractor(client)
    judges = [ContextRecallJudge(client, extractor=extractor) for _ in range(8)]
    results = [None] * len(judges)

    def run(i):
        results[i] = judges[i].judge(QUESTION, REFERENCE, CHUNKS)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(judges))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.value == pytest.approx(2 / 3) for r in results)
    prompts = [r.last_user_text for r in chat_requests(fake_llm)]
    assert sum(STATEMENTS_MARK in p for p in prompts) == 1
    # the eight attribution requests are identical too: the client sends them once as well
    assert sum(RECALL_MARK in p for p in prompts) == 1
    assert extractor.misses == 1 and extractor.hits == 7
    # exactly one result carries the extraction's transcript record
    assert sum(any(c["purpose"] == "statements" for c in r.calls) for r in results) == 1


def test_a_failed_extraction_is_not_memoised(fake_llm, sharing_client):
    client = sharing_client
    fake_llm.script(Reply.error(400, "bad request"))
    fake_llm.set_handler(by_marker({
        STATEMENTS_MARK: {"statements": REF_STATEMENTS},
        RECALL_MARK: recall_verdicts(True, True, True),
    }))
    judge = ContextRecallJudge(client)
    failed = judge.judge(QUESTION, REFERENCE, CHUNKS)
    assert failed.status is Status.FAILED and failed.reason == "provider_error"
    assert failed.details["failed_stage"] == "reference statement extraction"
    ok = judge.judge(QUESTION, REFERENCE, CHUNKS)
    assert ok.status is Status.SCORED and ok.value == 1.0
    assert ok.details["statements_memo_hit"] is False


def test_context_recall_abstentions_and_empty_retrieval(fake_llm, client):
    fake_llm.set_handler(by_marker({STATEMENTS_MARK: {"statements": []}}))
    judge = ContextRecallJudge(client)
    no_statements = judge.judge(QUESTION, "N/A", CHUNKS)
    assert no_statements.status is Status.ABSTAINED and no_statements.reason == "no_statements"
    assert len(chat_requests(fake_llm)) == 1  # no attribution call
    fake_llm.reset()
    assert judge.judge(QUESTION, "", CHUNKS).reason == "no_reference"
    empty = judge.judge(QUESTION, REFERENCE, [])
    assert empty.status is Status.SCORED and empty.value == 0.0 and "No contexts" in empty.rationale
    assert fake_llm.request_count == 0


def test_context_recall_inconsistent_attribution(fake_llm, client):
    fake_llm.set_handler(by_marker({
        STATEMENTS_MARK: {"statements": REF_STATEMENTS},
        RECALL_MARK: recall_verdicts(True, True),
        "could not be read": recall_verdicts(True, True),
    }))
    result = ContextRecallJudge(client).judge(QUESTION, REFERENCE, CHUNKS)
    assert result.reason == "inconsistent" and "statement number(s) [3]" in result.rationale
    assert [s["attributed"] for s in result.details["statements"]] == [True, True, None]


# --------------------------------------------------------------------------- context relevance


def test_context_relevance_english(fake_llm, client):
    fake_llm.set_handler(by_marker({RELEVANCE_MARK: {"sentences": [1, 3]}}))
    contexts = ["UNION ALL keeps duplicates. It was added in 1992.", "UNION ALL is fast. Dr. Smith said so."]
    judge = ContextRelevanceJudge(client)
    result = judge.judge(QUESTION, contexts)
    assert result.status is Status.SCORED and result.value == pytest.approx(2 / 4)
    prompt = chat_requests(fake_llm)[0].last_user_text
    assert "split into 4 numbered sentences" in prompt
    # each sentence between its own numbered tags, under its passage's heading
    assert re.search(r'Passage 2:\n<(sentence-[0-9a-f]{8}) n="3">\nUNION ALL is fast\.\n</\1>\n'
                     r'<\1 n="4">\nDr\. Smith said so\.\n</\1>', prompt)
    assert [s["sentence"] for s in result.details["selected"]] == ["UNION ALL keeps duplicates.", "UNION ALL is fast."]
    assert judge.estimate(QUESTION, contexts)["calls"] == 1


def test_context_relevance_splits_japanese_sentences(fake_llm, client):
    contexts = [
        "東京タワーは東京都港区にある電波塔です。高さは333メートルです！",
        "1958年に開業しました。観光客も多いですか？はい。",
    ]
    assert [s for _, s in split_context_sentences(contexts)] == [
        "東京タワーは東京都港区にある電波塔です。",
        "高さは333メートルです！",
        "1958年に開業しました。",
        "観光客も多いですか？",
        "はい。",
    ]
    fake_llm.set_handler(lambda req: {"sentences": [2]})
    result = ContextRelevanceJudge(client, language="ja").judge("東京タワーの高さは？", contexts)
    assert result.value == pytest.approx(1 / 5)
    prompt = chat_requests(fake_llm)[0].last_user_text
    assert "5 個の番号付きの文" in prompt and ' n="2">\n高さは333メートルです！\n</sentence-' in prompt


def test_context_relevance_insufficient_information_scores_zero(fake_llm, client):
    fake_llm.set_handler(by_marker({RELEVANCE_MARK: {"sentences": []}}))
    result = ContextRelevanceJudge(client).judge(QUESTION, CHUNKS[1:2])
    assert result.status is Status.SCORED and result.value == 0.0
    assert result.details["insufficient_information"] is True


def test_context_relevance_inconsistent_selection(fake_llm, client):
    fake_llm.set_handler(lambda req: {"sentences": [1, 9]})
    result = ContextRelevanceJudge(client).judge(QUESTION, CHUNKS[:2])
    assert result.status is Status.FAILED and result.reason == "inconsistent" and "[9] do not exist" in result.rationale
    assert len(chat_requests(fake_llm)) == 2  # re-asked once: the same inconsistent answer twice is the model's


def test_context_relevance_schema_allows_only_existing_sentences(fake_llm, client):
    fake_llm.set_handler(lambda req: {"sentences": []})
    ContextRelevanceJudge(client).judge(QUESTION, ["One. Two.", "Three."])
    schema = chat_requests(fake_llm)[0].json_schema
    assert schema["properties"]["sentences"]["items"] == {"type": "integer", "enum": [1, 2, 3]}
    assert schema["properties"]["sentences"]["maxItems"] == 3
    assert set(schema["properties"]) == {"sentences"}  # no second flag that could contradict the list


def test_context_relevance_repeated_numbers_count_once(fake_llm, client):
    fake_llm.set_handler(lambda req: {"sentences": [1, 1, 2]})
    result = ContextRelevanceJudge(client).judge(QUESTION, ["One. Two. Three. Four."])
    assert result.value == pytest.approx(2 / 4) and result.details["n_repeated_numbers"] == 1


def test_context_relevance_abstains_without_sentences(fake_llm, client):
    assert ContextRelevanceJudge(client).judge(QUESTION, ["", "  \n "]).reason == "no_contexts"
    assert fake_llm.request_count == 0


# --------------------------------------------------------------------------- answer relevancy


def _cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_answer_relevancy_with_the_servers_embeddings(fake_llm, client):
    generated = ["What does UNION ALL do?", "Does UNION ALL keep duplicate rows?", "How is UNION ALL different?"]
    fake_llm.set_handler(by_marker({RELEVANCY_MARK: {"questions": generated, "noncommittal": False}}))
    judge = AnswerRelevancyJudge(client, embed=client.embed)
    result = judge.judge(QUESTION, "UNION ALL combines two result sets and keeps duplicate rows.")

    q = embed_text(QUESTION)
    expected = sum(_cos(q, embed_text(g)) for g in generated) / 3
    assert result.status is Status.SCORED and result.value == pytest.approx(expected)
    assert result.value == pytest.approx(sum(g["similarity"] for g in result.details["generated_questions"]) / 3)
    assert len(chat_requests(fake_llm)) == 1  # ragas asks three times
    embeds = fake_llm.requests_for("openai_embeddings")
    assert len(embeds) == 1 and embeds[0].inputs == [QUESTION, *generated]
    assert judge.prompt_versions == {"answer_relevancy": "answer_relevancy-v3-en"}
    assert judge.estimate(QUESTION, "x")["calls"] == 1


def test_answer_relevancy_noncommittal_scores_zero_without_embedding(fake_llm, client):
    fake_llm.set_handler(by_marker({RELEVANCY_MARK: {"questions": ["What is UNION ALL?"], "noncommittal": True}}))
    result = AnswerRelevancyJudge(client, embed=client.embed).judge(QUESTION, "I'm not sure, it depends.")
    assert result.status is Status.SCORED and result.value == 0.0
    assert result.details["noncommittal"] is True and "noncommittal" in result.rationale
    assert fake_llm.requests_for("openai_embeddings") == []


def test_answer_relevancy_empty_response_scores_zero_without_a_request(fake_llm, client):
    result = AnswerRelevancyJudge(client, embed=client.embed).judge(QUESTION, "  ")
    assert result.status is Status.SCORED and result.value == 0.0 and result.details["empty_response"] is True
    assert fake_llm.request_count == 0


def test_answer_relevancy_fewer_questions_are_used_as_they_are(fake_llm, client):
    fake_llm.script({"questions": ["Only one?"], "noncommittal": False})
    result = AnswerRelevancyJudge(client, embed=client.embed).judge(QUESTION, "UNION ALL keeps duplicates.")
    assert result.status is Status.SCORED and result.details["n_generated"] == 1
    assert len(result.details["generated_questions"]) == 1
    assert len(chat_requests(fake_llm)) == 1  # no re-ask
    schema = chat_requests(fake_llm)[0].json_schema["properties"]["questions"]
    assert schema["minItems"] == schema["maxItems"] == 3  # the schema asked for exactly 3


def test_answer_relevancy_no_question_is_reasked(fake_llm, client):
    fake_llm.script({"questions": [" "], "noncommittal": False},
                    {"questions": ["A?", "B?", "C?"], "noncommittal": False})
    result = AnswerRelevancyJudge(client, embed=client.embed).judge(QUESTION, "UNION ALL keeps duplicates.")
    assert result.status is Status.SCORED and result.details["n_generated"] == 3
    assert "no question was generated" in chat_requests(fake_llm)[1].last_user_text


def test_answer_relevancy_embedding_failure_fails_the_row(fake_llm, client):
    def handler(req):
        if req.api == "openai_embeddings":
            return Reply.error(400, "embedding model not found")
        return {"questions": ["A?", "B?", "C?"], "noncommittal": False}

    fake_llm.set_handler(handler)
    result = AnswerRelevancyJudge(client, embed=client.embed).judge(QUESTION, "UNION ALL keeps duplicates.")
    assert result.status is Status.FAILED and result.reason == "provider_error"
    assert "embedding model not found" in result.rationale
    assert [g["question"] for g in result.details["generated_questions"]] == ["A?", "B?", "C?"]


def test_answer_relevancy_local_embed_callable(fake_llm, client):
    fake_llm.set_handler(lambda req: {"questions": ["What does UNION ALL do?"] * 3, "noncommittal": False})

    def embed(texts):  # any callable works: LocalEmbedder.embed in production
        return [[1.0, 0.0] if re.search("UNION", t) else [0.0, 1.0] for t in texts]

    result = AnswerRelevancyJudge(client, embed=embed, n=3).judge(QUESTION, "It keeps duplicates.")
    assert result.value == pytest.approx(1.0)
    broken = AnswerRelevancyJudge(client, embed=lambda texts: [[1.0]]).judge(QUESTION, "It keeps duplicates.")
    assert broken.status is Status.FAILED and broken.reason == "internal_error"
    assert "1 vectors for 4 texts" in broken.rationale


def test_answer_relevancy_japanese_prompt(fake_llm, client):
    fake_llm.set_handler(lambda req: {"questions": ["東京タワーの高さは?"] * 2, "noncommittal": False})
    judge = AnswerRelevancyJudge(client, embed=client.embed, n=2, language="ja")
    result = judge.judge("東京タワーの高さは?", "東京タワーの高さは333メートルです。")
    assert result.status is Status.SCORED
    assert "異なる質問を 2 個" in chat_requests(fake_llm)[0].last_user_text
    assert judge.prompt_versions == {"answer_relevancy": "answer_relevancy-v2-ja"}


@pytest.mark.parametrize("given, expected", [
    pytest.param(None, [], id="none"),
    pytest.param([], [], id="empty-list"),
    pytest.param("one passage", ["one passage"], id="a-str-is-one-passage"),
    pytest.param("  \n\t", [], id="a-blank-str"),
    pytest.param(["a", "", "  ", None, "\u3000", "b"], ["a", "b"], id="blank-items-dropped-in-order"),
    pytest.param([" a "], [" a "], id="kept-as-given-not-stripped"),
    pytest.param([3], ["3"], id="items-as-text"),
])
def test_one_blank_passage_filter_for_every_metric(given, expected):
    from mlflow_ragjudge.core.text import nonblank_passages

    assert nonblank_passages(given) == expected
