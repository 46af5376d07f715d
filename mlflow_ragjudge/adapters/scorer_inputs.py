"""What an ``mlflow.genai`` scorer is given -- ``inputs``, ``outputs``, ``expectations`` and the ``trace`` -- mapped to
the same :class:`~mlflow_ragjudge.core.types.Row` the evaluator reads from a DataFrame, with the same checks
(:mod:`mlflow_ragjudge.engine.inputs`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlflow.genai.utils.trace_utils import extract_retrieval_context_from_trace

from ..core.types import Row
from ..engine.inputs import Repairs, as_flag, as_list, as_references, passages, set_references

__all__ = ["question_of", "answer_of", "reference_of", "references_of", "trace_documents", "row_from_mlflow",
           "missing_fields", "SCORER_SOURCES"]


def question_of(inputs: Any) -> str | None:
    if isinstance(inputs, str):
        return inputs
    if isinstance(inputs, dict):
        for key in ("question", "query", "input", "inputs", "request"):
            v = inputs.get(key)
            if isinstance(v, str):
                return v
        if len(inputs) == 1:
            v = next(iter(inputs.values()))
            return v if isinstance(v, str) else None
    return None

def answer_of(outputs: Any) -> str | None:
    if isinstance(outputs, str):
        return outputs
    if isinstance(outputs, dict):
        for key in ("answer", "response", "output", "outputs"):
            v = outputs.get(key)
            if isinstance(v, str):
                return v
    return None

def reference_of(expectations: dict[str, Any] | None) -> str | None:
    """The (first) reference answer of a scorer's expectations."""
    answers = references_of(expectations)
    return answers[0] if answers else None

def references_of(expectations: dict[str, Any] | None) -> list[str] | None:
    """Every acceptable reference answer of a scorer's expectations (a str, or a list of str)."""
    if not expectations:
        return None
    for key in ("expected_response", "reference", "expected_answer", "ground_truth"):
        v = expectations.get(key)
        if isinstance(v, str):
            return [v]
        if isinstance(v, (list, tuple)) and v:
            return as_references(list(v), f"expectations['{key}']", 0, required=False)
    return None

def trace_documents(trace: Any) -> list[dict[str, Any]]:
    """Documents of the trace's top-level RETRIEVER spans: ``{"text", "id"}``."""
    if trace is None:
        return []
    docs: list[dict[str, Any]] = []
    for chunks in extract_retrieval_context_from_trace(trace).values():
        for c in chunks:
            if isinstance(c, dict):
                meta = c.get("metadata") or {}
                docs.append({
                    "text": c.get("content") or c.get("page_content") or c.get("text") or "",
                    "id": c.get("doc_uri") or c.get("id") or meta.get("doc_uri") or meta.get("id")
                    or meta.get("doc_id") or meta.get("chunk_id"),
                })
            elif isinstance(c, str):
                docs.append({"text": c, "id": None})
    return docs

#: where a scorer reads each field, for its error messages
SCORER_SOURCES = {
    "question": "inputs['question']",
    "answer": "outputs",
    "reference": "expectations['expected_response']",
    "contexts": "outputs['contexts'] or a RETRIEVER span",
    "reference_contexts": "expectations['reference_contexts'] or a retriever",
    "gold_documents": "expectations['gold_documents']",
    "retrieved_doc_ids": "outputs['retrieved_doc_ids'] or the RETRIEVER span's document ids",
    "relevant_doc_ids": "expectations['relevant_doc_ids']",
    "citations": "outputs['citations']",
    "answerable": "expectations['answerable']",
}

def row_from_mlflow(inputs: Any = None, outputs: Any = None, expectations: dict[str, Any] | None = None,
                    trace: Any = None, *, relevance_threshold: float = 1) -> Row:
    """A scorer's arguments as a :class:`Row`, with the evaluator's cell checks (an :class:`InputError`
    names the field and the fix)."""
    repairs = Repairs()
    exp = expectations or {}
    out = outputs if isinstance(outputs, dict) else {}
    docs = trace_documents(trace) if trace is not None else []
    contexts: Any = out.get("contexts")
    if contexts is None and docs:
        contexts = [d["text"] for d in docs]
    retrieved: Any = out.get("retrieved_doc_ids")
    if retrieved is None and docs:
        retrieved = [d["id"] for d in docs if d["id"] is not None] or None
    row = Row(index=0, relevance_threshold=relevance_threshold)
    row.question = repairs.text(question_of(inputs), "inputs", 0)
    row.answer = repairs.text(answer_of(outputs), "outputs", 0)
    set_references(row, references_of(exp), "expectations", repairs)
    row.contexts = passages(contexts, "outputs['contexts']", 0, repairs)
    row.reference_contexts = passages(exp.get("reference_contexts"), "expectations['reference_contexts']", 0, repairs)
    row.evidence_contexts = passages(exp.get("evidence_contexts"), "expectations['evidence_contexts']", 0, repairs)
    row.gold_documents = passages(exp.get("gold_documents"), "expectations['gold_documents']", 0, repairs)
    row.retrieved_doc_ids = as_list(retrieved, "outputs['retrieved_doc_ids']", 0)
    relevant = exp.get("relevant_doc_ids", exp.get("expected_document_ids"))
    row.relevant_doc_ids = as_list(relevant, "expectations['relevant_doc_ids']", 0, mapping_ok=True)
    row.citations = as_list(out.get("citations"), "outputs['citations']", 0)
    if isinstance(out.get("raw_output"), str):
        row.raw_output = repairs.text(out["raw_output"], "outputs['raw_output']", 0)
    if exp.get("answerable") is not None:
        row.answerable = as_flag(exp.get("answerable"), "expectations['answerable']", 0)
    return row

def missing_fields(row: Row, needed: Sequence[str]) -> list[str]:
    """The fields of ``needed`` that a scorer's row lacks, described with where they come from."""
    return [f"{c} ({SCORER_SOURCES.get(c, c)})" for c in needed if getattr(row, c, None) is None]
