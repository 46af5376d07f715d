"""Seed 004's prompt-optimisation loop, logged as a sweep over prompt versions.

design -> run -> evaluate -> analyse errors -> change the prompt -> re-evaluate: each iteration's generator
prompt is a version of one prompt in MLflow's prompt registry (``aurora-rag-answer``), and each version is a child
run of one sweep, compared with the first. An example to copy: it uses only the public API.

The system answers the twelve Aurora-3 scenarios of ``experiments/data`` (a fictional weather station, so a model
cannot answer from memory): the answer present, spread over several documents, ambiguous, buried in a long log,
absent (it must refuse with the fixed phrase), contradictory, or the context irrelevant; ten in English, two in
Japanese. The generator gets each scenario's documents (the input contract: a query of at most 256 characters, at
most 5 documents of at most 2,048 tokens, language ``en`` or ``ja``) and must reply with the output contract's
JSON object (``answer``, ``confidence_score``, ``sources`` with ``doc_id`` and ``snippet``, ``status``).

The three iterations are the seed's three prompt styles: zero-shot, few-shot with a not-found example, and
constrained chain-of-thought (relevant passages, integration, a hallucination and gap check, then the answer,
then the JSON after a ``FINAL JSON:`` line).

Each variant is measured with the package's checks -- ``output_contract`` (the reply against the contract's
schema), ``refusal`` (``refusal_correct`` on the unanswerable scenarios, ``false_refusal`` on the others),
``citations`` (cited documents among those given; documents cited / given) -- and the judge's correctness and
faithfulness. The printed error analysis lists each iteration's failures by scenario.

::

    python experiments/prompt_iterations.py --generator openai:/gpt-4o-mini
    python experiments/prompt_iterations.py --generator ollama:/llama3.1 --judge ollama:/llama3.1

A generator model is required: this loop measures a model's behaviour under each prompt.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

import mlflow_ragjudge as rj
from mlflow_ragjudge.llm.backends import ChatRequest

DATA = Path(__file__).resolve().parent / "data"
PROMPT_NAME = "aurora-rag-answer"
NOT_FOUND = {"en": "I cannot find the answer in the provided documents.",
             "ja": "提供された情報には回答が見つかりませんでした。"}
LANGUAGE_NAMES = {"en": "English", "ja": "Japanese"}
COT_MARKER = "FINAL JSON:"
CONTRACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "confidence_score": {"type": "number", "minimum": 0, "maximum": 1},
        "sources": {"type": "array", "items": {
            "type": "object",
            "properties": {"doc_id": {"type": "string"}, "snippet": {"type": "string", "minLength": 1}},
            "required": ["doc_id", "snippet"], "additionalProperties": False}},
        "status": {"enum": ["success", "failure"]},
        "error_message": {"type": "string"},
    },
    "required": ["answer", "confidence_score", "sources", "status"],
    "additionalProperties": False,
}

_CONTRACT = (
    'Reply with one JSON object: {"answer": "<the answer>", "confidence_score": <0.0 to 1.0>, "sources": '
    '[{"doc_id": "<id of a document you used>", "snippet": "<the exact passage you used>"}], "status": "success"}. '
    'When the documents do not contain the answer, the answer is exactly "{{not_found}}", sources is [] and status '
    'is "success". Only when you cannot answer for another reason, reply {"answer": "", "confidence_score": 0.0, '
    '"sources": [], "status": "failure", "error_message": "<why>"}.'
)
_RULES = ("Answer the QUERY using only the CONTEXT documents; add nothing they do not say. If they do not contain "
          'the answer, answer exactly "{{not_found}}". Write the answer in {{language}}.')

PROMPTS = {
    "zero_shot": f"{_RULES}\n{_CONTRACT} Reply with the JSON object only.\n\n# CONTEXT\n{{{{contexts}}}}\n\n"
                 "# QUERY\n{{question}}",
    "few_shot": f"{_RULES} Support the answer with passages quoted from the documents you used.\n{_CONTRACT} Reply "
                "with the JSON object only.\n\n# Example\n## CONTEXT\n[doc_id: ex-1]\nThe kettle boils 1.7 litres.\n"
                "## QUERY\nWhat does the kettle cost?\n## REPLY\n"
                '{"answer": "{{not_found}}", "confidence_score": 0.0, "sources": [], "status": "success"}\n\n'
                "# Your task\n## CONTEXT\n{{contexts}}\n## QUERY\n{{question}}\n## REPLY",
    "cot": "Answer the QUERY using only the CONTEXT documents, writing out each step:\n1. Relevant passages: list "
           "the passages that bear on the query, with their doc_id.\n2. Integration: combine them; if documents "
           "disagree, keep both versions with their doc_id; if the query can be read two ways, answer each.\n"
           "3. Check: every fact must be in step 1's passages and the query fully answered; if the documents "
           'cannot answer it, the answer is exactly "{{not_found}}".\n4. Final answer, in {{language}}.\n'
           f"Then write a line containing only {COT_MARKER} followed by the JSON object.\n{_CONTRACT}\n\n"
           "# CONTEXT\n{{contexts}}\n\n# QUERY\n{{question}}\n\n# STEPS",
}


def scenarios() -> pd.DataFrame:
    """The twelve scenarios: question, reference (the not-found phrase where the right reply is to refuse),
    answerable, relevant_doc_ids, group (the scenario kind), and each scenario's documents (``context_ids``)."""
    rows = pd.read_json(DATA / "aurora_scenarios.jsonl", lines=True, dtype=False)
    return rows.rename(columns={"kind": "group"})


def check_input(question: str, docs: list[tuple[str, str]], language: str) -> None:
    """Seed 004's input contract; a violation is a ValueError naming the field and the fix."""
    if not question.strip() or len(question) > 256:
        raise ValueError(f"query: {len(question)} characters; give a question of 1 to 256 characters")
    if len(docs) > 5:
        raise ValueError(f"contexts: {len(docs)} documents; keep the 5 most relevant")
    for doc_id, text in docs:
        tokens = len(re.findall(r"[\u3040-\u30ff\u3400-\u9fff]|[^\s\u3040-\u30ff\u3400-\u9fff]+", text))
        if tokens > 2048:
            raise ValueError(f"contexts[{doc_id}]: about {tokens} tokens; cut documents to 2,048 tokens")
    if language not in NOT_FOUND:
        raise ValueError(f"language: {language!r}; use 'en' or 'ja'")


def contract_json(reply: str) -> str:
    """The contract object's text: after the last ``FINAL JSON:`` line when there is one (the chain-of-thought
    style writes its steps first), else the reply as it is."""
    if COT_MARKER in reply:
        return reply.rsplit(COT_MARKER, 1)[1].strip()
    return reply.strip()


@functools.lru_cache(maxsize=8)
def _client(uri: str) -> rj.JudgeClient:
    return rj.JudgeClient(uri)


def answer(question: str, *, prompt: str, generator: str, table: str = str(DATA / "aurora_scenarios.jsonl"),
           corpus: str = str(DATA / "aurora_corpus.json")) -> dict[str, Any]:
    """The pipeline: the scenario's documents, the prompt, the generator, the contract object read."""
    rows = {r["question"]: r for r in map(json.loads, Path(table).read_text("utf-8").splitlines()) if r}
    docs_text = json.loads(Path(corpus).read_text("utf-8"))
    row = rows[question]
    docs = [(d, docs_text[d]) for d in row["context_ids"]]
    check_input(question, docs, row["language"])
    rendered = (prompt.replace("{{contexts}}", "\n\n".join(f"[doc_id: {d}]\n{t}" for d, t in docs))
                .replace("{{question}}", question).replace("{{not_found}}", NOT_FOUND[row["language"]])
                .replace("{{language}}", LANGUAGE_NAMES[row["language"]]))
    call = _client(generator).call(ChatRequest.of([{"role": "user", "content": rendered}], max_tokens=1024),
                                   purpose="generate")
    if not call.ok:
        raise RuntimeError(f"the generator failed: {call.error}")
    raw = contract_json(call.raw or "")
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    text = obj.get("answer") if isinstance(obj, dict) and isinstance(obj.get("answer"), str) else raw
    cited = [s.get("doc_id") for s in obj.get("sources", []) if isinstance(s, dict)] if isinstance(obj, dict) else []
    return {"answer": text or "(empty answer)", "raw_output": raw, "contexts": [t for _, t in docs],
            "retrieved_doc_ids": [d for d, _ in docs], "citations": [c for c in cited if isinstance(c, str)]}


def error_analysis(result: rj.SweepResult) -> str:
    """Each iteration's failures by scenario: broken format, refusal failures, false refusals, unsupported
    sentences, invalid citations."""
    lines = []
    for name, out in result.outputs.items():
        if out is None:
            lines.append(f"{name}: no answers")
            continue
        t = out.table
        fails: list[str] = []
        for i, q in enumerate(t["question"]):
            modes = []
            if t.get("output_contract/score") is not None and t["output_contract/score"][i] == 0:
                modes.append(f"broken_format ({t['output_contract/violation'][i]})")
            if t.get("refusal_correct/score") is not None and t["refusal_correct/score"][i] == 0:
                modes.append("refusal_failure")
            if t.get("false_refusal/score") is not None and t["false_refusal/score"][i] == 1:
                modes.append("false_refusal")
            if t.get("faithfulness/score") is not None and (t["faithfulness/score"][i] or 1) < 0.75:
                modes.append("unsupported")
            if t.get("citation_validity/score") is not None and (t["citation_validity/score"][i] or 1) < 1:
                modes.append("invalid_citation")
            if modes:
                fails.append(f"  - {q[:70]}: {', '.join(modes)}")
        lines.append(f"{name}: {len(fails)} scenario(s) with failures" + ("\n" + "\n".join(fails) if fails else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generator", required=True, help="the generator model URI, e.g. openai:/gpt-4o-mini")
    ap.add_argument("--judge", default=rj.DEFAULT_OFFLINE_JUDGE, help="judge URI (default: the offline judge)")
    ap.add_argument("--styles", default=",".join(PROMPTS), help="the iterations, in order")
    ap.add_argument("--experiment", default="ragjudge-prompt-iterations")
    ap.add_argument("--tracking-uri")
    args = ap.parse_args(argv)
    styles = [s.strip() for s in args.styles.split(",") if s.strip()]
    unknown = [s for s in styles if s not in PROMPTS]
    if unknown:
        ap.error(f"unknown style(s) {unknown}; use {', '.join(PROMPTS)}")
    variants = [{"prompt": rj.PromptTemplate(PROMPT_NAME, PROMPTS[s], commit_message=f"seed 004 style {s}"),
                 "generator": args.generator} for s in styles]
    data = scenarios()[["question", "reference", "answerable", "relevant_doc_ids", "group"]]
    result = rj.sweep(answer, variants, data, experiment=args.experiment, tracking_uri=args.tracking_uri,
                      data_name="aurora-scenarios", verbose=True,
                      evaluator_config={"judge": args.judge, "output_schema": CONTRACT_SCHEMA,
                                        "refusal_phrases": list(NOT_FOUND.values()), "bertscore": False,
                                        "metrics": ["correctness", "faithfulness", "output_contract", "refusal",
                                                    "citations", "lexical"], "progress": False})
    print(result.summary(headline=("output_contract", "refusal_correct", "false_refusal", "citation_validity",
                                   "correctness", "faithfulness")))
    print("iterations (prompt versions):", ", ".join(f"{s} = {n}" for s, n in zip(styles, result.run_ids)))
    print(error_analysis(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
