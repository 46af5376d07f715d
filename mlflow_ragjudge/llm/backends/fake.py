"""A scripted in-process backend for users' own tests (no network, no SDK).

Example::

    from mlflow_ragjudge.llm.backends import FakeBackend
    judge = FakeBackend(["Feedback: matches the reference. [RESULT] 5"])

Replies are consumed in order; when the script runs out, ``handler`` (if any)
answers, else the last reply repeats. A reply may be a string, a dict (returned as
structured output), a :class:`ChatResponse`, or a :class:`BackendError` to raise.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Union

from .base import Backend, BackendError, ChatRequest, ChatResponse, EmbedResponse

Reply = Union[str, dict, ChatResponse, BackendError]


class FakeBackend(Backend):
    """Deterministic scripted judge. Thread-safe; records every request."""

    provider = "fake"
    supports_json_schema = True

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        *,
        handler: Callable[[ChatRequest], Reply] | None = None,
        model: str = "scripted",
        embedding_dim: int = 64,
    ) -> None:
        self.model = model
        self._queue: deque[Reply] = deque(replies)
        self._last: Reply | None = None
        self._handler = handler
        self._lock = threading.Lock()
        self.requests: list[ChatRequest] = []
        self.embed_requests: list[list[str]] = []
        self.embedding_dim = embedding_dim

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def _next(self, request: ChatRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self._queue:
                self._last = self._queue.popleft()
                return self._last
        if self._handler is not None:
            return self._handler(request)
        if self._last is not None:
            return self._last
        return "ok"

    def chat(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        reply = self._next(request)
        if isinstance(reply, BackendError):
            raise reply
        if isinstance(reply, ChatResponse):
            return reply
        prompt_tokens = sum(len(m["content"].split()) for m in request.messages)
        if isinstance(reply, dict):
            text = json.dumps(reply, ensure_ascii=False)
            return ChatResponse(text, dict(reply), prompt_tokens, len(text.split()), self.model, "stop")
        return ChatResponse(str(reply), None, prompt_tokens, len(str(reply).split()), self.model, "stop")

    def embed(self, texts: list[str], *, timeout: float) -> EmbedResponse:
        with self._lock:
            self.embed_requests.append(list(texts))
        return EmbedResponse(
            [hashed_embedding(t, self.embedding_dim) for t in texts], sum(len(t.split()) for t in texts), self.model
        )


def hashed_embedding(text: str, dim: int = 64) -> list[float]:
    """A bag-of-words vector: texts that share words point the same way (for tests)."""
    vec = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
        vec[h % dim] += 1.0 if (h >> 32) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec))
    return [v / norm for v in vec] if norm else vec
