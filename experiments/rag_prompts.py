"""The three generator prompt styles of seed 004 (SPEC 2.8), as versioned data.

* ``zero_shot`` - answer only from the context; the fixed not-found phrase when the context lacks the answer.
* ``few_shot`` - the same rules plus worked examples: an answer with cited snippets from two documents, and a
  not-found case.
* ``cot`` - constrained chain-of-thought: (1) identify the relevant passages, (2) integrate them, (3) check
  for hallucination and missing information, (4) answer; the reasoning comes first, then a ``FINAL JSON:``
  line with the contract object.

Every style asks for the output contract of :mod:`experiments.contract`. The instructions are in English for
both languages (the article's are Japanese); the answer language and the not-found phrase follow the input's
``language``. A style's version is a hash of its template text, so editing a prompt changes the version that
reaches the judge-client cache key and the MLflow params.
"""

from __future__ import annotations

import hashlib
import json

from experiments.contract import COT_MARKER, NOT_FOUND, GenerationInput

__all__ = ["STYLES", "prompt_version", "render"]

STYLES = ("zero_shot", "few_shot", "cot")
_LANGUAGE_NAMES = {"en": "English", "ja": "Japanese"}

SYSTEM = "You are an assistant specialised in information retrieval and summarisation."

_CONTRACT = """Reply with one JSON object:
{{"answer": "<the answer>", "confidence_score": <number from 0.0 to 1.0>, "sources": [{{"doc_id": "<id of a context \
document you used>", "snippet": "<the exact passage you used, copied from that document>"}}], "status": "success"}}
When the context does not contain the answer, the answer is exactly "{not_found}", sources is [] and status is \
"success". Only if you cannot answer for another reason (the request asks for personal data, or is unethical), reply \
{{"answer": "", "confidence_score": 0.0, "sources": [], "status": "failure", "error_message": "<why>"}}."""

_RULES = """Answer the QUERY using only the information in the CONTEXT documents. Do not add anything the context \
does not say. If the context does not contain the answer, answer exactly: "{not_found}"
Write the answer in {language_name}."""

ZERO_SHOT = (
    _RULES
    + "\n"
    + _CONTRACT
    + """ Reply with the JSON object only, no other text.

# CONTEXT
{context}

# QUERY
{query}"""
)

FEW_SHOT = (
    _RULES
    + """ Support the answer with passages quoted from the documents you used.
"""
    + _CONTRACT
    + """ Reply with the JSON object only, no other text.

# Example 1
## CONTEXT
[doc_id: ex-1]
RAG (retrieval-augmented generation) is a technique in which a large language model retrieves information from \
an external knowledge source and answers from it, which reduces hallucination.

[doc_id: ex-2]
RAG was proposed in 2020 by researchers at Facebook AI.
## QUERY
When was RAG proposed, and by whom?
## REPLY
{{"answer": "RAG was proposed in 2020 by researchers at Facebook AI.", "confidence_score": 0.95, "sources": \
[{{"doc_id": "ex-2", "snippet": "RAG was proposed in 2020 by researchers at Facebook AI."}}], "status": "success"}}

# Example 2
## CONTEXT
[doc_id: ex-3]
Training a large language model needs a great deal of data and compute.
## QUERY
What is the model size of RAG?
## REPLY
{{"answer": "{not_found}", "confidence_score": 0.0, "sources": [], "status": "success"}}

# Your task
## CONTEXT
{context}
## QUERY
{query}
## REPLY"""
)

COT = (
    """Answer the QUERY using only the CONTEXT documents, following these steps and writing each one out:
1. Relevant passages: list the passages of the context that bear directly on the query, with their doc_id.
2. Integration: if several passages are relevant, combine them into the key facts that answer the query. If the \
documents disagree, say so and keep both versions with their doc_id. If the query can be read in more than one \
way, answer each reading the context supports.
3. Hallucination and gap check: check that every fact you will state is in the passages from step 1 and that they \
answer the query fully. If the context alone cannot answer it, the answer is exactly: "{not_found}"
4. Final answer: write the answer in {language_name}, from steps 1-3 only.
After step 4 write a line containing only """
    + COT_MARKER
    + """ and then the JSON object, with nothing after it.
"""
    + _CONTRACT
    + """

# CONTEXT
{context}

# QUERY
{query}

# STEPS"""
)

_TEMPLATES = {"zero_shot": ZERO_SHOT, "few_shot": FEW_SHOT, "cot": COT}


def prompt_version(style: str) -> str:
    """``<style>-<8 hex digits of the template's SHA-256>``."""
    body = json.dumps([SYSTEM, _TEMPLATES[style]], ensure_ascii=False)
    return f"{style}-{hashlib.sha256(body.encode()).hexdigest()[:8]}"


def format_context(inp: GenerationInput) -> str:
    return "\n\n".join(f"[doc_id: {c.doc_id}]\n{c.text}" for c in inp.contexts) or "(no documents)"


def render(style: str, inp: GenerationInput) -> list[dict[str, str]]:
    """The chat messages for ``style`` on a validated input."""
    if style not in _TEMPLATES:
        raise ValueError(f"Unknown prompt style {style!r}; use one of {', '.join(STYLES)}.")
    user = _TEMPLATES[style].format(
        context=format_context(inp),
        query=inp.query,
        not_found=NOT_FOUND[inp.language],
        language_name=_LANGUAGE_NAMES[inp.language],
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
