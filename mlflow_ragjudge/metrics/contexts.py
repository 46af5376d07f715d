"""The passages the six-level correctness judge sees, the paper's key variable (SPEC 2.1): which context mode a run
uses (E3 ``reference``: retrieved with question + reference answer; E2 ``generation``; ``evidence``; ``gold``;
``none``), and each row's contexts for it -- retrieved once per row. Correctness owns this, multi-turn's judge uses
the same (its E3 query comes from :func:`e3_query` too), and so do the ``mlflow.genai`` scorers: one rule, here.

:func:`prepare_judge_contexts` is the ``prepare`` hook of the metrics that judge with these contexts: the engine
calls it before any judge call, and it does the work once per run whichever of them asks first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..core.constants import CONTEXT_PROVENANCE
from ..core.errors import InputError
from ..core.text import Repairs
from ..core.types import Row
from .spec import Prepared, RunContext

__all__ = ["e3_query", "passages_from_retriever", "resolve_context_mode", "resolve_context_modes", "primary_mode",
           "resolve_row_contexts", "resolve_judge_contexts", "prepare_judge_contexts"]


def e3_query(question: str, reference: str | Sequence[str]) -> str:
    """The E3 retrieval query: question and reference answer concatenated (seed 000, section 2); with several
    acceptable answers, each on its own line after the question."""
    answers = [reference] if isinstance(reference, str) else list(reference)
    return "\n".join([question, *answers])

def passages_from_retriever(out: Any, row: int) -> list[str]:
    """The passages of a retriever's output (str, dicts with ``text`` / ``page_content``, ``(id, text)`` pairs,
    LangChain / MLflow documents), or an :class:`InputError` saying what it returned and what it must return."""
    if out is None:
        return []
    if isinstance(out, (str, bytes)):
        raise InputError(f"The retriever returned a string for row {row}; it must return a list of passages.")
    if isinstance(out, dict):
        raise InputError(
            f"The retriever returned a dict for row {row} (keys {list(out)[:3]}); it must return a list of passages "
            "(str, dicts with 'text', or (id, text) pairs), e.g. [{'id': 'd1', 'text': '...'}] -- its keys would "
            "otherwise be judged as passages."
        )
    if not isinstance(out, Iterable) or hasattr(out, "page_content"):
        raise InputError(
            f"The retriever returned a {type(out).__name__} for row {row}; it must return a list of passages "
            "(str, dicts with 'text', or (id, text) pairs)."
        )
    passages = []
    for item in out:
        if isinstance(item, str):
            passages.append(item)
        elif isinstance(item, dict) and isinstance(text := item.get("text", item.get("page_content")), str):
            passages.append(text)
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], str):
            passages.append(item[1])
        elif hasattr(item, "page_content"):  # LangChain / MLflow Document
            passages.append(str(item.page_content))
        else:
            raise InputError(
                f"The retriever returned {type(item).__name__} items for row {row}; return str passages, "
                "dicts with 'text', or (id, text) pairs."
            )
    return passages

def resolve_context_mode(mode: str, *, retriever: Any, has: Callable[[str], bool]) -> str:
    """The context mode a run (or a scorer's row) uses; ``has(logical)`` says whether a column is there.

    ``auto``: ``reference`` (E3) when a retriever or reference contexts are given, else ``generation`` (E2)
    when there are contexts, else ``evidence`` when a test set's evidence is there, else ``none``. ``auto``
    never calls anything E3 that was not retrieved with question + reference. An explicit mode whose input is
    missing is an :class:`InputError`.
    """
    if mode == "auto":
        if retriever is not None or has("reference_contexts"):
            return "reference"
        if has("contexts"):
            return "generation"
        if has("evidence_contexts"):
            return "evidence"
        return "none"
    if mode == "reference" and retriever is None and not has("reference_contexts"):
        raise InputError(
            "context_mode='reference' (E3) needs contexts retrieved with question + reference answer: pass "
            "retriever=<callable query -> passages> or add a 'reference_contexts' column."
        )
    if mode == "generation" and not has("contexts"):
        raise InputError("context_mode='generation' (E2) needs a 'contexts' column (the passages the RAG used).")
    if mode == "evidence" and not has("evidence_contexts"):
        raise InputError("context_mode='evidence' needs an 'evidence_contexts' column (as `ragjudge testset` writes).")
    if mode == "gold" and not has("gold_documents"):
        raise InputError("context_mode='gold' needs a 'gold_documents' column (list of gold document texts).")
    return mode

def resolve_context_modes(setting: str | list[str], *, retriever: Any, has: Callable[[str], bool]) -> list[str]:
    """:func:`resolve_context_mode` for each mode of a setting that may be a list; the primary mode (E3 when it
    is among them, else the first) is :func:`primary_mode`."""
    wanted = setting if isinstance(setting, list) else [setting]
    return [resolve_context_mode(m, retriever=retriever, has=has) for m in wanted]

def primary_mode(modes: Sequence[str]) -> str:
    """The mode that multi-turn and single-mode readers use: E3 when it is among ``modes``, else the first."""
    return "reference" if "reference" in modes else modes[0]

def resolve_row_contexts(row: Row, modes: Sequence[str], retriever: Callable[[str], Any] | None,
                         repairs: Repairs | None = None) -> None:
    """A row's judge contexts for every mode (``row.judge_contexts_by_mode`` when there are several), with
    ``judge_contexts`` / ``context_mode`` set to the primary mode's; the retriever is called once per row."""
    primary = primary_mode(modes)
    if len(modes) == 1:
        resolve_judge_contexts(row, primary, retriever, repairs)
        return
    for m in modes:
        resolve_judge_contexts(row, m, retriever, repairs)
        row.judge_contexts_by_mode[m] = list(row.judge_contexts or [])
    row.judge_contexts, row.context_mode = list(row.judge_contexts_by_mode[primary]), primary

def resolve_judge_contexts(row: Row, mode: str, retriever: Callable[[str], Any] | None,
                           repairs: Repairs | None = None) -> None:
    """Set ``row.judge_contexts`` and ``row.context_mode``; calls the retriever for E3 when one is given."""
    repairs = repairs if repairs is not None else Repairs()
    row.context_mode = mode
    if mode == "reference":
        if retriever is not None:
            try:
                out = retriever(e3_query(row.question or "", row.acceptable_answers or [""]))
            except Exception as e:
                raise InputError(
                    f"The retriever raised on row {row.index} ({type(e).__name__}: {e}); fix the retriever or "
                    "precompute a 'reference_contexts' column."
                ) from e
            row.judge_contexts = [repairs.text(p, "retriever output", row.index)
                                  for p in passages_from_retriever(out, row.index)]
        else:
            row.judge_contexts = row.reference_contexts or []
    elif mode == "generation":
        row.judge_contexts = row.contexts or []
    elif mode == "evidence":
        row.judge_contexts = row.evidence_contexts or []
    elif mode == "gold":
        row.judge_contexts = row.gold_documents or []
    else:
        row.judge_contexts = []


def prepare_judge_contexts(ctx: RunContext) -> Prepared:
    """Resolve the run's context mode(s) and every row's judge contexts (E3 retrieval included), once per run;
    records the mode and where the contexts came from (``context_mode``, ``context_modes``,
    ``context_provenance``, and the params ``ragjudge.context_mode`` ...)."""
    return ctx.shared("judge_contexts", lambda: _prepare(ctx))


def _prepare(ctx: RunContext) -> Prepared:
    cfg = ctx.cfg
    modes = resolve_context_modes(cfg.context_mode, retriever=cfg.retriever, has=ctx.has_column)
    if ("reference" in modes and cfg.retriever is None and ctx.has_column("reference_contexts")
            and ctx.has_raw_columns("source_doc_id", "generation_status")):
        # a test set written by an earlier `ragjudge testset`, which put its writer's evidence there
        raise InputError(
            f"Column '{cfg.column('reference_contexts')}' of this test set (it has source_doc_id and "
            "generation_status, as `ragjudge testset` writes) holds the question writer's evidence, not passages "
            "retrieved with question + reference answer (E3). Rename it to 'evidence_contexts' to judge with it "
            "(context_mode='evidence'), or pass retriever=<callable query -> passages> for E3.")
    for r in ctx.rows:
        resolve_row_contexts(r, modes, cfg.retriever, ctx.repairs)
    mode = primary_mode(modes)
    ctx.context_mode = mode
    all_modes = list(ctx.rows[0].judge_contexts_by_mode) if ctx.rows and ctx.rows[0].judge_contexts_by_mode else None
    return Prepared(
        record={"context_mode": mode, "context_modes": all_modes, "context_provenance": CONTEXT_PROVENANCE.get(mode)},
        params={"ragjudge.context_mode": mode, "ragjudge.context_provenance": CONTEXT_PROVENANCE.get(mode, "n/a"),
                "ragjudge.context_modes": ",".join(all_modes or []) or mode})
