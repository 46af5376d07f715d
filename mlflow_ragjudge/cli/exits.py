"""The exit codes of ``ragjudge`` (docs/failure-modes.md)."""

from __future__ import annotations

#: done, every gate passed
EXIT_OK = 0
#: bad input or configuration, found before any judge call (nothing was sent)
EXIT_BAD_INPUT = 2
#: logged, but rows failed: a judged metric failed on more than --max-error-rate of its rows, or (sweep) a variant's
#: pipeline raised on more than max_error_rate of its questions
EXIT_JUDGE_FAILURES = 3
#: logged, but a --fail-under gate was not met (its interval lies below the threshold, or with --gate-rule point its
#: mean does)
EXIT_GATE_FAILED = 4
#: evaluated, but MLflow could not take the results (saved locally first; ragjudge log-saved logs them later); or,
#: with --spark, logged but --spark-output could not be written (the message says where the results are)
EXIT_NOT_LOGGED = 5
#: logged, no gate failed, but a --fail-under gate is undecided: the interval of its mean straddles the threshold
#: (the message names how many more rows or repeats would decide it)
EXIT_GATE_UNDECIDED = 6
