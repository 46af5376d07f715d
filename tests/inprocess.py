"""An in-process judge for unit tests that need a judge that answers, and nothing of the wire.

:class:`CompliantBackend` is a :class:`~mlflow_ragjudge.llm.backends.Backend` (the package's scripted
``FakeBackend``) whose replies come from the same independent model the fake HTTP server runs for the ``judge``
fixture (tests/compliant_model.py: it follows the JSON schema of the request and knows nothing of our prompts). Each
request is shown to the model as the body the OpenAI backend sends a server in ``json_schema`` mode (the messages,
and the schema as ``response_format``), so it answers exactly what the ``judge`` fixture's server answers -- without
a socket, a thread per request, the SDK or the structured-output negotiation.

Use it (the ``compliant_judge`` fixture in conftest.py) where a test checks what the package does with a judge's
replies. Keep the fake server (tests/fakellm.py, the ``judge`` and ``fake_llm`` fixtures) where the test is about
the wire: the openai and anthropic SDKs, the request bodies, structured-output negotiation, rate limits, failures, a
judge URI given to the CLI or to another process.
"""

from __future__ import annotations

from typing import Any

from compliant_model import CompliantModel
from fakellm import OPENAI_CHAT, Reply, Request

from mlflow_ragjudge.llm.backends import BackendError, ChatRequest, ChatResponse, ErrorKind, FakeBackend


class CompliantBackend(FakeBackend):
    """A backend answered in-process by :class:`~compliant_model.CompliantModel` in ``json_schema`` mode.

    Records every request (``requests``, ``embed_requests``) like ``FakeBackend``; embeddings are its hashed
    bag-of-words vectors.
    """

    def __init__(self, model: str = "m", **options: Any) -> None:
        super().__init__(handler=self._answer, model=model)
        self._model = CompliantModel("json_schema", **options)

    def _answer(self, request: ChatRequest) -> Any:
        body: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in request.messages],
                                "temperature": request.temperature, "max_tokens": request.max_tokens}
        if request.seed is not None:
            body["seed"] = request.seed
        if request.json_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": request.json_schema.name, "schema": request.json_schema.schema, "strict": True}}
        reply = self._model(Request(api=OPENAI_CHAT, path="/v1/chat/completions", headers={}, body=body))
        if isinstance(reply, Reply):
            if reply.is_error:
                raise BackendError(ErrorKind.PERMANENT, reply.error_message or "refused", status=reply.status)
            return reply.json if reply.json is not None else (reply.text or "ok")
        return reply  # a dict (structured output) or a str

    def chat(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        response = super().chat(request, timeout=timeout)
        # as the OpenAI backend records it on a server that enforces the schema
        response.structured_mode = "json_schema" if request.json_schema is not None else "text"
        if request.json_schema is None:
            response.data = None  # a plain-text request is answered in text, never as structured output
        return response
