"""Test-set generation (seed 001, SPEC 2.9): an LLM reads a document and proposes at most one question with
its answer, or says none can be made. Each result is a (question, reference answer, gold document id) row;
a corpus mixes such positive documents with many distractors, so retrieval is tested against noise.

::

    from mlflow_ragjudge import JudgeClient
    from mlflow_ragjudge.testset import generate_testset
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

from .backends import ChatRequest, ChatResponse, JsonSchema
from .client import JudgeClient
from .parsing import parse_json_reply
from .prompts import load_prompt

__all__ = ["generate_testset", "TestsetReport"]

MAX_DOCUMENT_CHARS = 12_000


@dataclass
class TestsetReport:
    """What happened to every document asked: generated, declined (no question), or failed (with reason)."""

    generated: list[str] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


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
) -> tuple[pd.DataFrame, TestsetReport]:
    """Ask the model for at most one question per document.

    Args:
        documents: document id -> text (the whole corpus, distractors included).
        client: the model that writes the questions.
        sample: ask only this many documents, drawn with ``seed`` (the rest stay as distractors).
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
    ids = sorted(documents, key=str)
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
    report = TestsetReport()
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
    columns = ["question", "reference", "relevant_doc_ids", "gold_documents", "evidence_contexts",
               "source_doc_id", "generation_status"]
    return pd.DataFrame(rows, columns=columns), report
