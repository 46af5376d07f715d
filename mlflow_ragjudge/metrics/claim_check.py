"""The claim-checking skeleton shared by faithfulness and context recall, written once.

Both metrics judge a row the same way: obtain a text's claims (the response's for faithfulness, the reference's
for context recall; :class:`~.statements.StatementExtractor`), verify every claim against the passages in one
numbered call (:func:`~.statements.ask_numbered`), and score the verdicts. :func:`check_claims` runs the steps and
the states between them -- the extraction failed, there are no claims, the verification failed -- and keeps the
evidence in ``details`` in the same order for both. What differs is passed in: a :class:`ClaimCheck` (names and
messages) and three functions: ``row`` (one claim's row in ``details``), ``verify`` (how the verdicts are asked
for: faithfulness selects the evidence first, context recall may read them from the combined call) and ``score``
(the formula and the rationale).

Nothing here changes a prompt, a request or a result: the skeleton is the code both judges ran before, once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.types import JudgeResult
from .statements import Extraction, NumberedVerdicts, failed_result

__all__ = ["Claims", "ClaimCheck", "check_claims"]

#: a claim's row in ``details`` (``{"claim", "supported", "reason"}`` ...), kept with the result and in the table
ClaimRow = dict[str, Any]
#: a result's evidence (``JudgeResult.details``), filled step by step
Details = dict[str, Any]
#: transcript records of the row's calls
Calls = list[dict[str, Any]]


@dataclass(frozen=True)
class Claims:
    """The claims to verify and how they were obtained.

    Attributes:
        items: the claims, in order (numbered from 1 in the verification call).
        records: transcript records of the extraction requests made for this row.
        call_ids: ids of the transcript records that produced the claims (also when shared).
        memo_hit: the claims came from an identical extraction already made.
        failed: the extraction that failed, if one did (the row then fails at ``ClaimCheck.extraction_stage``).
        raw: the extraction's raw reply, kept on a no-claims abstention (None: not kept).
        cut: what a runaway extraction's cap left out (recorded as ``statements_cut`` when not empty).
    """

    items: Sequence[str]
    records: Sequence[dict[str, Any]]
    call_ids: Sequence[str]
    memo_hit: bool
    failed: Extraction | None = None
    raw: str | None = None
    cut: object = None


@dataclass(frozen=True)
class ClaimCheck:
    """What a claim-checking metric says in its own words.

    Attributes:
        noun: the claims' name in ``details`` (``claims`` -> ``n_claims`` and the list ``claims``).
        extraction_stage, verification_stage: the ``failed_stage`` of a row failed at either step.
        no_claims: the abstention's reason and message when the text has no claim.
    """

    noun: str
    extraction_stage: str
    verification_stage: str
    no_claims: tuple[str, str]


def check_claims(
    check: ClaimCheck,
    claims: Claims,
    details: Details,
    *,
    row: Callable[[int, str, Mapping[str, Any] | None], ClaimRow],
    verify: Callable[[Sequence[str], Details, Calls], NumberedVerdicts],
    score: Callable[[list[ClaimRow], NumberedVerdicts, Details, Calls], JudgeResult],
) -> JudgeResult:
    """Verify ``claims`` and score them; never raises for model failures.

    Args:
        check: the metric's names and messages.
        claims: the claims and their extraction.
        details: the result's details so far (prompt versions, the passages' count); filled in place.
        row: one claim's row from its number, its text and its verdict entry (None when the reply gave none).
        verify: asks for one verdict per claim (numbered from 1); may add to ``details`` and to the calls.
        score: the score and rationale from the claims' rows (every claim has its verdict).

    Returns:
        Failed at the extraction or the verification (raw replies kept), abstained when there is no claim, else
        what ``score`` returns.
    """
    calls: Calls = list(claims.records)
    details["statements_memo_hit"] = claims.memo_hit
    details["statements_call_ids"] = list(claims.call_ids)
    if claims.failed is not None:
        return failed_result(claims.failed, stage=check.extraction_stage, details=details, calls=calls)
    items = list(claims.items)
    details[f"n_{check.noun}"] = len(items)
    if claims.cut:  # a runaway extraction: only the first claims are verified, and the row says so
        details["statements_cut"] = claims.cut
    if not items:
        details[check.noun] = []
        reason, message = check.no_claims
        return JudgeResult.abstained(reason, message, raw=claims.raw, details=details, calls=calls)
    got = verify(items, details, calls)
    calls += got.records
    got.note(details)
    if not got.ok:
        details[check.noun] = [row(i, c, got.entries.get(i)) for i, c in enumerate(items, 1)]
        return failed_result(got, stage=check.verification_stage, details=details, calls=calls)
    rows = [row(i, c, got.entries[i]) for i, c in enumerate(items, 1)]
    details[check.noun] = rows
    return score(rows, got, details, calls)
