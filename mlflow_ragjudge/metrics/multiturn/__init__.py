"""Multi-turn ("continuous response") evaluation (IBM Research, seed 000 section 3; SPEC 2.2).

The question it answers: starting from a target question Q with a gold answer A, how much of A can a
reasonable questioner get out of the RAG system under test, and in how many exchanges? Three LLM agents
hold the conversation with the system:

* the **answer composer** (T2 compose a tentative answer from the Q/A history; T6 rewrite it to the gold
  answer's granularity at the end),
* the **answer judge** (T3 / T7: the six-level context-aware correctness judge of SPEC 2.1, shown the E3
  contexts retrieved with the original Q and A),
* the **question generator** (T4 decide whether more questions are needed; T5 write the next one),

and the loop is::

    T1 ask the system (the target question first, generated ones later); append (question, answer) to history
    T2 compose a tentative answer from the history          -> tentative answer
    T3 judge it                                             -> s_i appended to sigma, review
       s_i == 5: stop
    T4+T5 (one structured call) more questions needed? next question
       needed and the budget allows another turn: go to T1
    T6 rewrite the tentative answer to the gold answer's granularity (no information found only in A)
    T7 judge the final answer                               -> appended to sigma (see "sigma and n" below)

Per item the result is the list of judge scores sigma = [s_0, ..., s_k] (0 <= k < n) and the full
transcript; :func:`wscore`, :func:`lscore` and :func:`mscore` turn sigma into numbers, and
:func:`summarize` averages them over a data set (overall and per group).

**sigma and n (our reading of the paper; see docs/multiturn.md).** sigma holds one score per *judged
answer*: one per T3 and, when the conversation ends through T6, one for T7. ``n`` (``n_turns``, the
paper's maximum number of turns, 5 in its experiment) bounds ``len(sigma)``, as the paper's ``k < n``
requires. With the default ``final_score="append"`` the T7 score is an extra element, so at most ``n - 1``
questions go to the system: after a T3 score below 5 on question ``n - 1`` there is no room for another
question *and* its possible final judgement, so the conversation goes to T6/T7 (the question generator is
not asked, since its question could not be used). With ``final_score="replace"`` the T7 score replaces
the last T3 score instead (sigma then has exactly one element per question, at most ``n`` questions).

**Level 0 ("not sure").** The single-turn correctness metric treats 0 as an abstention left out of the
mean. Inside sigma a 0 is a real judged value of the tentative answer at that turn (nothing usable yet)
and is kept as 0: the paper states every score is >= 0, and dropping it would shorten sigma and change
lscore. So a tentative answer the judge calls "not sure" weighs in wscore like a score of 0.

**Failures.** An item whose system call raises (``system_error``) or whose agent / judge call fails
(``parse_error``, ``timeout``, ...) is a *failed* item with the reason, the failed step, the error and
the partial transcript; its wscore/lscore/mscore are ``None``, never made up from a partial sigma.
"""

from .metric import METRICS
from .runner import MultiTurnRunner, format_history
from .scores import (
    FINAL_SCORE_MODES,
    MULTITURN_METRICS,
    STEPS,
    STOP_REASONS,
    SYSTEM_ERROR,
    MultiTurnResult,
    RagSystem,
    lscore,
    mscore,
    summarize,
    wscore,
)

__all__ = [
    "METRICS",
    "FINAL_SCORE_MODES",
    "MULTITURN_METRICS",
    "STEPS",
    "STOP_REASONS",
    "SYSTEM_ERROR",
    "MultiTurnResult",
    "MultiTurnRunner",
    "RagSystem",
    "format_history",
    "lscore",
    "mscore",
    "summarize",
    "wscore",
]
