"""Test-set generation (seed 001, SPEC 2.9): an LLM reads a document and proposes at most one question with
its answer, or says none can be made. Each result is a (question, reference answer, gold document id) row;
a corpus mixes such positive documents with many distractors, so retrieval is tested against noise.

::

    from mlflow_ragjudge import JudgeClient
    from mlflow_ragjudge.workflows.testset import generate_testset
    df = generate_testset({"d1": "...", "d2": "..."}, JudgeClient("openai:/gpt-4o-mini"), sample=50, seed=0)

The output has the evaluator's columns: ``question``, ``reference``, ``relevant_doc_ids`` (the source
document), ``gold_documents`` (its text), ``evidence_contexts`` (the evidence sentences the writer quoted;
not E3, which is retrieved with question + reference: ``context_mode='evidence'`` judges with them), plus
``source_doc_id`` and ``generation_status``; documents that yield no question are reported, not dropped
silently.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..llm.backends import ChatRequest, ChatResponse, JsonSchema
from ..llm.client import JudgeClient
from ..llm.parsing import parse_json_reply
from ..llm.prompts import load_prompt

__all__ = ["generate_testset", "TestsetReport"]

MAX_DOCUMENT_CHARS = 12_000


@dataclass
class TestsetReport:
    """What happened to every document asked: generated, declined (no question), or failed (with reason)."""

    generated: list[str] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    #: documents under ``min_positive_chars``: never asked, kept as distractors
    too_short: list[str] = field(default_factory=list)
    #: with ``distractors_per_positive``: the corpus to index, the positives (documents with a question, the
    #: gold ids) mixed with that many distractors each, drawn with the seed
    corpus_ids: list[str] = field(default_factory=list)
    distractor_ids: list[str] = field(default_factory=list)


def _parser(schema: dict[str, Any]) -> Any:
    def parse(response: ChatResponse) -> dict[str, Any]:
        obj = parse_json_reply(response, schema)
        if obj["has_question"] and not (obj["question"].strip() and obj["answer"].strip()):
            # "a question can be made" but none was written: nothing usable, so the document counts as
            # declined (never a made-up item), and the note says why
            return {**obj, "has_question": False, "note": "has_question was true but the question or answer was empty"}
        return obj

    return parse


def generate_testset(
    documents: Mapping[str, str],
    client: JudgeClient,
    *,
    sample: int | None = None,
    seed: int = 0,
    language: str = "en",
    workers: int = 8,
    min_positive_chars: int = 0,
    distractors_per_positive: int | None = None,
) -> tuple[pd.DataFrame, TestsetReport]:
    """Ask the model for at most one question per document.

    Seed 001's corpus recipe, as options: positive documents (those a question is written from) have at least
    ``min_positive_chars`` characters, so a question has substance to come from; and the corpus a retriever is
    measured on mixes the positives with ``distractors_per_positive`` distractors each (``report.corpus_ids``),
    so retrieval is measured against noise. The gold ids are each row's ``relevant_doc_ids``.

    Args:
        documents: document id -> text (the whole corpus, distractors included).
        client: the model that writes the questions.
        sample: ask only this many documents, drawn with ``seed`` (the rest stay as distractors).
        min_positive_chars: documents shorter than this are never asked (reported as ``too_short``).
        distractors_per_positive: build ``report.corpus_ids``: the positives plus this many documents without a
            question per positive, drawn with ``seed`` (all of them when there are fewer).
        language: prompt language (``en``, ``ja``).
        workers: documents asked in parallel (the client's provider limit still applies).

    Returns:
        The test set (one row per generated question) and a report of every document asked.

    Raises:
        ValueError: an empty corpus, a non-string document, or ``sample`` out of range (before any call).
    """
    if not documents:
        raise ValueError("documents is empty: pass a mapping of document id -> text")
    for doc_id, text in documents.items():
        if not isinstance(text, str):
            raise ValueError(f"document {doc_id!r} is a {type(text).__name__}; documents must be text (str)")
    if isinstance(min_positive_chars, bool) or not isinstance(min_positive_chars, int) or min_positive_chars < 0:
        raise ValueError(f"min_positive_chars={min_positive_chars!r} must be a whole number >= 0")
    if distractors_per_positive is not None and (isinstance(distractors_per_positive, bool) or not isinstance(
            distractors_per_positive, int) or distractors_per_positive < 0):
        raise ValueError(f"distractors_per_positive={distractors_per_positive!r} must be a whole number >= 0")
    too_short = sorted((d for d, t in documents.items() if len(t.strip()) < min_positive_chars), key=str)
    ids = sorted((d for d in documents if len(documents[d].strip()) >= min_positive_chars), key=str)
    if not ids:
        raise ValueError(f"no document has min_positive_chars={min_positive_chars} characters; lower it")
    if sample is not None:
        if not 1 <= sample <= len(ids):
            raise ValueError(f"sample={sample} must be between 1 and the number of documents ({len(ids)})")
        ids = sorted(random.Random(seed).sample(ids, sample), key=str)
    prompt = load_prompt("testset", language)
    schema = prompt.schema or {}
    version = f"testset-v{prompt.version}-{prompt.language}"

    def ask(doc_id: str) -> tuple[str, Any]:
        text = documents[doc_id]
        if not text.strip():
            return doc_id, None
        messages = prompt.render("json", doc_id=str(doc_id), document=text[:MAX_DOCUMENT_CHARS])
        request = ChatRequest.of(messages, max_tokens=512, json_schema=JsonSchema("testset_item", schema))
        return doc_id, client.call(request, parse=_parser(schema), prompt_version=version, purpose="testset")

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        outcomes = list(pool.map(ask, ids))
    report = TestsetReport(too_short=too_short)
    rows = []
    for doc_id, call in outcomes:
        if call is None:
            report.declined.append(doc_id)
            continue
        if not call.ok:
            report.failed[doc_id] = f"{call.failure.value if call.failure else 'failed'}: {call.error}"
            continue
        item = call.parsed
        if not item["has_question"]:
            report.declined.append(doc_id)
            continue
        report.generated.append(doc_id)
        rows.append({
            "question": item["question"].strip(),
            "reference": item["answer"].strip(),
            "relevant_doc_ids": [doc_id],
            "gold_documents": [documents[doc_id]],
            "evidence_contexts": [item["evidence"].strip()] if item["evidence"].strip() else [],
            "source_doc_id": doc_id,
            "generation_status": "generated",
        })
    if distractors_per_positive is not None:
        others = sorted((d for d in documents if d not in set(report.generated)), key=str)
        want = min(len(others), distractors_per_positive * len(report.generated))
        report.distractor_ids = sorted(random.Random(seed).sample(others, want), key=str)
        report.corpus_ids = sorted([*report.generated, *report.distractor_ids], key=str)
    columns = ["question", "reference", "relevant_doc_ids", "gold_documents", "evidence_contexts",
               "source_doc_id", "generation_status"]
    return pd.DataFrame(rows, columns=columns), report
