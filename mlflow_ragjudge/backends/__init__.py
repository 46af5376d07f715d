"""Judge-model backends and their resolution from MLflow-style URIs."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from .base import Backend, BackendError, ChatRequest, ChatResponse, EmbedResponse, ErrorKind, JsonSchema
from .fake import DemoBackend, FakeBackend

__all__ = [
    "Backend",
    "BackendError",
    "ChatRequest",
    "ChatResponse",
    "EmbedResponse",
    "ErrorKind",
    "DemoBackend",
    "FakeBackend",
    "JsonSchema",
    "resolve_backend",
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
PROVIDERS = ("openai", "anthropic", *_COMPATIBLE_DEFAULTS, "demo")


def resolve_backend(judge: str | Backend) -> Backend:
    """Turn a judge URI (or a backend object) into a backend.

    Forms: ``openai:/<model>``, ``anthropic:/<model>``, ``vllm:/<model>``,
    ``ollama:/<model>``, ``llamacpp:/<model>``, ``tgi:/<model>``,
    ``lmstudio:/<model>`` (OpenAI-compatible servers at their default local
    address), each with optional query parameters ``base_url=`` and, for the
    OpenAI-style ones, ``structured=json_schema|json_object|none``. Example:
    ``openai:/prometheus-8x7b-v2?base_url=http://gpu-box:8000/v1``.

    Raises:
        ValueError: the URI is malformed or names no known provider; a key is missing.
    """
    if isinstance(judge, Backend):
        return judge
    if not isinstance(judge, str) or ":/" not in judge:
        raise ValueError(
            f"Judge {judge!r} is not a judge URI. Use '<provider>:/<model>', e.g. 'openai:/gpt-4o-mini' or "
            f"'anthropic:/claude-3-5-haiku-latest', or pass a Backend object. Providers: {', '.join(PROVIDERS)}."
        )
    provider, _, rest = judge.partition(":/")
    provider = provider.strip().lower()
    parts = urlsplit("x:/" + rest)  # reuse the URL parser for the ?query part only
    model = rest.split("?", 1)[0].lstrip("/")
    params = dict(parse_qsl(parts.query))
    if not model:
        raise ValueError(f"Judge URI {judge!r} names no model: use '{provider}:/<model-name>'.")
    unknown = set(params) - {"base_url", "structured"}
    if unknown:
        raise ValueError(f"Judge URI {judge!r} has unknown parameter(s) {sorted(unknown)}; "
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
    if provider == "demo":
        return DemoBackend(model)
    raise ValueError(
        f"Judge URI {judge!r} names unknown provider {provider!r}. Known providers: {', '.join(PROVIDERS)}; "
        "any OpenAI-compatible server works as 'openai:/<model>?base_url=http://host:port/v1'."
    )
