"""Names the whole package shares: the logical data columns, the context modes of the six-level judge and their
provenance, and the offline judge's URI. The ground floor: this module imports nothing of the package."""

from __future__ import annotations

from typing import Any

#: the package's version (``mlflow_ragjudge.__version__``), recorded with every run
VERSION = "0.1.0"

#: logical column -> what it holds (used in error messages)
LOGICAL_COLUMNS: dict[str, str] = {
    "question": "the user's question (str)",
    "answer": "the RAG system's response (str)",
    "reference": "the reference (gold) answer (str), or a list of acceptable answers (list of str)",
    "contexts": "the passages the RAG retrieved and used (list of str)",
    "retrieved_doc_ids": "ranked ids of the retrieved documents (list of str/int)",
    "relevant_doc_ids": "gold document ids (list of str/int, or dict id -> graded relevance)",
    "reference_contexts": "passages retrieved with question + reference answer, for E3 (list of str)",
    "evidence_contexts": "evidence the test-set writer quoted for its answer (list of str; context_mode 'evidence')",
    "gold_documents": "gold document texts (list of str)",
    "group": "a group label for per-group breakdowns (str)",
    "answerable": "whether the question can be answered from the corpus (bool; False rows must be refused)",
    "citations": "ids of the documents the answer cites (list of str/int)",
    "row_id": "a stable id of the row (str/int, unique); default: derived from the question and reference, so the "
              "same question has the same id in every variant",
    "raw_output": "the system's raw reply when 'answer' was extracted from it (str; output_contract reads it)",
}

CONTEXT_MODES = ("auto", "reference", "generation", "evidence", "gold", "none")

#: where the six-level judge's contexts came from, per context mode (recorded per row and per run)
CONTEXT_PROVENANCE = {
    "reference": "retrieved_with_question_and_reference",
    "generation": "generation_contexts",
    "evidence": "evidence_from_testset",
    "gold": "gold",
    "none": "none",
}


OFFLINE_PROVIDER = "offline"

#: the offline judge's URI (the only model today)
DEFAULT_OFFLINE_JUDGE = "offline:/lexical"

OFFLINE_MODELS = ("lexical",)

def is_offline_judge(judge: Any) -> bool:
    """Whether ``judge`` names the offline judge (``offline:/lexical``; ``offline`` alone is accepted too)."""
    return isinstance(judge, str) and (judge.strip().lower() == OFFLINE_PROVIDER
                                       or judge.strip().lower().startswith(OFFLINE_PROVIDER + ":/"))

#: how the draws of a row (repeats) and the judges of a panel are combined into the row's value (docs/judge-noise.md):
#: ``auto`` takes the majority on the six-level outputs (a level stays a level) and the mean elsewhere
PANEL_RULES = ("auto", "mean", "majority", "median")
#: when the cascade's first judge is unsure about a row, so that ``escalate_to`` judges it again
ESCALATE_WHEN = ("abstain", "spread", "threshold")
