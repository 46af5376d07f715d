"""Judge-model backends and their resolution from MLflow-style URIs."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlsplit

from ...core.constants import DEFAULT_OFFLINE_JUDGE
from .base import Backend, BackendError, ChatRequest, ChatResponse, EmbedResponse, ErrorKind, JsonSchema, safe_url
from .fake import FakeBackend

__all__ = [
    "Backend",
    "BackendError",
    "ChatRequest",
    "ChatResponse",
    "EmbedResponse",
    "ErrorKind",
    "FakeBackend",
    "JsonSchema",
    "resolve_backend",
    "safe_judge_uri",
    "safe_url",
    "PROVIDERS",
]

# OpenAI-compatible local servers, by their usual default address.
_COMPATIBLE_DEFAULTS = {
    "vllm": "http://localhost:8000/v1",
    "ollama": "http://localhost:11434/v1",
    "llamacpp": "http://localhost:8080/v1",
    "tgi": "http://localhost:8080/v1",
    "lmstudio": "http://localhost:1234/v1",
}
PROVIDERS = ("openai", "anthropic", *_COMPATIBLE_DEFAULTS)


def safe_judge_uri(judge: str | Backend | None) -> str | None:
    """A judge (or embeddings) URI fit to record or print: a ``base_url`` parameter keeps scheme, host, port, path
    and its query's keys (no ``user:password@``, every query value ``***``); ``structured`` is kept; any other
    parameter's value is ``***``; a backend object becomes its ``provider:/model``."""
    if judge is None:
        return None
    if isinstance(judge, Backend):
        return judge.uri
    text = _USERINFO.sub(r"\1", str(judge))
    if "?" not in text:
        return text
    head, _, query = text.partition("?")
    shown = [(k, safe_url(v) if k == "base_url" else v if k == "structured" else "***")
             for k, v in _uri_params(query)]
    return head + "?" + "&".join(f"{k}={quote(str(v), safe=':/?=&*')}" for k, v in shown)


_KNOWN_PARAMS = ("base_url", "structured")


def _uri_params(query: str) -> list[tuple[str, str]]:
    """A judge URI's parameters, in order. One that follows a ``base_url`` carrying a query of its own is part of
    that query: ``?base_url=http://gw/v1?token=T&sig=S`` is the base URL ``http://gw/v1?token=T&sig=S``."""
    out: list[tuple[str, str]] = []
    for k, v in parse_qsl(query, keep_blank_values=True):
        if out and k not in _KNOWN_PARAMS and out[-1][0] == "base_url" and "?" in out[-1][1]:
            out[-1] = ("base_url", f"{out[-1][1]}&{quote(k, safe='')}={quote(v, safe='')}")
        else:
            out.append((k, v))
    return out


# user:password@ in any URL inside a string (a base_url parameter, or a URL given where a URI belongs)
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s?#]*@")


def resolve_backend(judge: str | Backend) -> Backend:
    """Turn a judge URI (or a backend object) into a backend.

    Forms: ``openai:/<model>``, ``anthropic:/<model>``, ``vllm:/<model>``,
    ``ollama:/<model>``, ``llamacpp:/<model>``, ``tgi:/<model>``,
    ``lmstudio:/<model>`` (OpenAI-compatible servers at their default local
    address), each with optional query parameters ``base_url=`` and, for the
    OpenAI-style ones, ``structured=auto|json_schema|json_schema_basic|json_object|text``
    (default ``auto``: negotiated with the server). Example:
    ``openai:/prometheus-8x7b-v2?base_url=http://gpu-box:8000/v1``.

    An API key is checked when the first request is about to be sent
    (:meth:`Backend.check_ready`), so an estimate needs none.

    Raises:
        ValueError: the URI is malformed or names no known provider.
    """
    if isinstance(judge, Backend):
        return judge
    if isinstance(judge, str) and judge.strip().lower().split(":/")[0] in ("offline", "demo"):
        was = " (the demo:/overlap stand-in was replaced by it)" if judge.strip().lower().startswith("demo") else ""
        raise ValueError(
            f"{DEFAULT_OFFLINE_JUDGE!r} is the offline judge{was}: calibrated lexical evidence, not a language "
            "model. It scores correctness, faithfulness and the context metrics in evaluate_frame, the ragjudge "
            "evaluator, the CLI and the scorers; what you asked for here needs an LLM judge, e.g. "
            "'openai:/gpt-4o-mini'.")
    if not isinstance(judge, str) or ":/" not in judge:
        shown = safe_judge_uri(judge) if isinstance(judge, str) else type(judge).__name__
        raise ValueError(
            f"Judge {shown!r} is not a judge URI. Use '<provider>:/<model>', e.g. 'openai:/gpt-4o-mini' or "
            f"'anthropic:/claude-3-5-haiku-latest', or pass a Backend object. Providers: {', '.join(PROVIDERS)}."
        )
    shown = safe_judge_uri(judge)  # error messages never repeat credentials
    provider, _, rest = judge.partition(":/")
    provider = provider.strip().lower()
    parts = urlsplit("x:/" + rest)  # reuse the URL parser for the ?query part only
    model = rest.split("?", 1)[0].lstrip("/")
    params = dict(_uri_params(parts.query))
    if not model:
        raise ValueError(f"Judge URI {shown!r} names no model: use '{provider}:/<model-name>'.")
    unknown = set(params) - {"base_url", "structured"}
    if unknown:
        raise ValueError(f"Judge URI {shown!r} has unknown parameter(s) {sorted(unknown)}; "
                         "known: base_url, structured.")
    if provider == "openai" or provider in _COMPATIBLE_DEFAULTS:
        from .openai import OpenAIBackend

        base_url = params.get("base_url") or (
            None if provider == "openai" else _COMPATIBLE_DEFAULTS[provider])
        backend = OpenAIBackend(model, base_url=base_url, structured=params.get("structured"))
        if provider != "openai":
            backend.provider = "openai"  # same API; the base URL keeps the connection key apart
        return backend
    if provider == "anthropic":
        if "structured" in params:
            raise ValueError("'structured' applies to OpenAI-style servers; Anthropic uses tool use.")
        from .anthropic import AnthropicBackend

        return AnthropicBackend(model, base_url=params.get("base_url"))
    raise ValueError(
        f"Judge URI {shown!r} names unknown provider {provider!r}. Known providers: {', '.join(PROVIDERS)}; "
        "any OpenAI-compatible server works as 'openai:/<model>?base_url=http://host:port/v1'."
    )
