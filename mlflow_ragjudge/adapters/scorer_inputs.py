"""What an ``mlflow.genai`` scorer is given -- ``inputs``, ``outputs``, ``expectations`` and the ``trace`` -- mapped to
the same :class:`~mlflow_ragjudge.core.types.Row` the evaluator reads from a DataFrame, with the same checks
(:mod:`mlflow_ragjudge.engine.inputs`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.types import Row
from ..engine.inputs import Repairs, as_flag, as_list, as_references, passages, repaired_ids, set_references
from .trace_fields import answer_of, question_of, retrieved, root_span, where_answer, where_question


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

@dataclass
class ScorerRow:
    """A scorer's arguments read as a :class:`Row`, with where each field came from (``sources``: field -> place,
    e.g. ``{"question": "inputs", "answer": "trace root span outputs", "contexts": "RETRIEVER spans: retrieve (3
    documents)"}``) and, for a field that could not be found, what was looked for (``looked``)."""

    row: Row
    sources: dict[str, str] = field(default_factory=dict)
    looked: dict[str, str] = field(default_factory=dict)


def read_scorer_args(inputs: Any = None, outputs: Any = None, expectations: dict[str, Any] | None = None,
                     trace: Any = None, *, relevance_threshold: float = 1,
                     retriever_spans: str | Sequence[str] = "all") -> ScorerRow:
    """A scorer's arguments as a :class:`Row`, with the evaluator's cell checks (an :class:`InputError` names the
    field and the fix). The question and answer come from ``inputs`` / ``outputs`` in any shape an app logs
    (:mod:`~mlflow_ragjudge.adapters.trace_fields`), else from the trace's root span; the contexts from
    ``outputs["contexts"]``, else the trace's RETRIEVER spans (``retriever_spans`` picks them)."""
    repairs = Repairs()
    exp = expectations or {}
    out = outputs if isinstance(outputs, dict) else {}
    found = ScorerRow(Row(index=0, relevance_threshold=relevance_threshold))
    row = found.row
    root = root_span(trace) if trace is not None else None

    question = _read(found, "question", question_of, inputs, "inputs", root.inputs if root else None, where_question)
    answer = _read(found, "answer", answer_of, outputs, "outputs", root.outputs if root else None, where_answer)

    docs = retrieved(trace, retriever_spans) if trace is not None else None
    contexts: Any = out.get("contexts")
    if contexts is not None:
        found.sources["contexts"] = "outputs['contexts']"
    elif docs is not None and docs.documents:
        contexts = [d.text for d in docs.documents]
        found.sources["contexts"] = "RETRIEVER spans: " + docs.describe()
    elif docs is not None and docs.available:
        found.looked["contexts"] = (f"the trace's RETRIEVER spans {docs.available} do not match "
                                    f"retriever_spans={retriever_spans!r}" if not docs.spans else
                                    f"the trace's RETRIEVER spans ({docs.describe()}) hold no document text")
    retrieved_ids: Any = out.get("retrieved_doc_ids")
    if retrieved_ids is None and docs is not None and docs.documents:
        retrieved_ids = [d.id for d in docs.documents if d.id is not None] or None
        if retrieved_ids is not None:
            found.sources["retrieved_doc_ids"] = "RETRIEVER spans: " + docs.describe()

    row.question = repairs.text(question, "inputs", 0)
    row.answer = repairs.text(answer, "outputs", 0)
    set_references(row, references_of(exp), "expectations", repairs)
    row.contexts = passages(contexts, "outputs['contexts']", 0, repairs)
    row.reference_contexts = passages(exp.get("reference_contexts"), "expectations['reference_contexts']", 0, repairs)
    row.evidence_contexts = passages(exp.get("evidence_contexts"), "expectations['evidence_contexts']", 0, repairs)
    row.gold_documents = passages(exp.get("gold_documents"), "expectations['gold_documents']", 0, repairs)
    # document ids: lone surrogates repaired as the evaluator repairs them (engine.inputs.read_rows)
    where = "outputs['retrieved_doc_ids']"
    row.retrieved_doc_ids = repaired_ids(as_list(retrieved_ids, where, 0), where, 0, repairs)
    relevant = exp.get("relevant_doc_ids", exp.get("expected_document_ids"))
    where = "expectations['relevant_doc_ids']"
    row.relevant_doc_ids = repaired_ids(as_list(relevant, where, 0, mapping_ok=True), where, 0, repairs)
    row.citations = repaired_ids(as_list(out.get("citations"), "outputs['citations']", 0), "outputs['citations']", 0,
                                 repairs)
    if isinstance(out.get("raw_output"), str):
        row.raw_output = repairs.text(out["raw_output"], "outputs['raw_output']", 0)
    if exp.get("answerable") is not None:
        row.answerable = as_flag(exp.get("answerable"), "expectations['answerable']", 0)
    return found


def _read(found: ScorerRow, field_name: str, reader: Callable[[Any], str | None], given: Any, given_name: str,
          root_value: Any, looked_for: Callable[[Any], str]) -> str | None:
    """A field read from what the scorer was given, else from the trace's root span; where it came from, or what was
    looked for, noted in ``found``."""
    for value, place in ((given, given_name), (root_value, f"the trace's root span {given_name}")):
        text = reader(value)
        if text is not None:
            found.sources[field_name] = place
            return text
    found.looked[field_name] = looked_for(given)
    return None


def row_from_mlflow(inputs: Any = None, outputs: Any = None, expectations: dict[str, Any] | None = None,
                    trace: Any = None, *, relevance_threshold: float = 1) -> Row:
    """:func:`read_scorer_args`'s row alone."""
    return read_scorer_args(inputs, outputs, expectations, trace, relevance_threshold=relevance_threshold).row


def missing_fields(row: Row, needed: Sequence[str], looked: dict[str, str] | None = None) -> list[str]:
    """The fields of ``needed`` that a scorer's row lacks, each with what was looked for (``looked``, from
    :class:`ScorerRow`) or where it comes from."""
    looked = looked or {}
    return [looked.get(c) or f"{c} ({SCORER_SOURCES.get(c, c)})" for c in needed if getattr(row, c, None) is None]
