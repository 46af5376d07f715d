"""A judge whose verdicts are random per draw with a known flip probability, for the judge-noise tests.

:class:`NoisyModel` wraps the independent schema-following model (tests/compliant_model.py) and knows nothing of
mlflow-ragjudge's prompts either. For each conversation (the messages: the same for every draw of a row; the draw's
``seed`` is not part of it) it fixes a *true* value and an *other* value for every enumerated field of the reply's
top-level object, both drawn by a hash of the conversation from the field's enumerated values (or from ``values``
when given: a test restricts them to a scale's scored levels). Each request then answers the true value, or, with
probability ``p``, the other one: its own pseudo-random draw, a hash of the conversation, the request's ``seed`` and
``salt`` -- so a test's numbers do not depend on the order in which threads send the requests, and a client that
sent every draw alike (no seed) would get the same answer each time. So for n draws of one row the chance that they
do not all agree is ``1 - (1 - p)^n - p^n``, and one draw's variance around its row's mean is
``p (1 - p) (true - other)^2`` -- the truths a test compares the package's flip rate and judge variance with.
``pairs`` records each conversation's (true, other) per field.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from typing import Any

from compliant_model import CompliantModel
from fakellm import Reply, Request


def _h(text: str, salt: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{salt}\x00{text}".encode()).digest()[:8], "big")


class NoisyModel:
    """A fake-server handler (or, through ``answer``, an in-process one): the compliant model's reply with every
    enumerated top-level field set to its conversation's true value, or with probability ``p`` its other value."""

    def __init__(self, p: float, *, values: Sequence[Any] | None = None, salt: str = "") -> None:
        self.p = p
        self.values = list(values) if values is not None else None
        self._base = CompliantModel("json_schema")
        self.salt = salt
        self._lock = threading.Lock()
        #: conversation -> field -> (true value, other value)
        self.pairs: dict[str, dict[str, tuple[Any, Any]]] = {}
        self.requests = 0

    def __call__(self, request: Request) -> Any:
        reply = self._base(request)
        schema = request.json_schema
        if request.api == "openai_embeddings" or schema is None:
            return reply
        value = reply if isinstance(reply, dict) else (reply.json if isinstance(reply, Reply) else None)
        if not isinstance(value, dict):
            return reply
        conversation = json.dumps(request.messages, sort_keys=True)
        draw = f"{self.salt}/{request._get('seed')}/{request._get('temperature')}"
        with self._lock:
            self.requests += 1
            for key, sub in (schema.get("properties") or {}).items():
                allowed = self.values if self.values is not None else sub.get("enum")
                if not allowed or len(allowed) < 2 or "enum" not in sub:
                    continue
                true = allowed[_h(conversation, key) % len(allowed)]
                others = [v for v in allowed if v != true]
                other = others[_h(conversation, key + "/other") % len(others)]
                self.pairs.setdefault(conversation, {})[key] = (true, other)
                flipped = _h(conversation + draw, key + "/flip") / 2**64 < self.p
                value[key] = other if flipped else true
        return value
