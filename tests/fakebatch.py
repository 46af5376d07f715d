"""The batch APIs of the fake LLM server: OpenAI's Files + Batches and Anthropic's Message Batches, over HTTP, for
the real SDKs.

Each line of a batch is answered by the server's own reply logic (scripted queue, then handler), as if it had
been sent synchronously: the same request body gets the same reply either way. The batch endpoints are not behind
the synchronous rate limiter (``rate_limit_per_minute``), as a provider's batch queue is not.

Settings on :class:`BatchAPI` (``server.batches``):

* ``delay``: seconds from creation until the batch has ended (``validating`` for the first tenth, OpenAI; then
  ``in_progress``; then ``completed`` / ``ended``);
* ``expire_after``: a batch older than this ends as ``expired`` (OpenAI) / with ``expired`` lines (Anthropic),
  only the first ``expire_fraction`` of its lines answered; ``expire_batches``: the next this-many batches to end
  expire that way;
* ``fail_lines``: custom ids answered with a 500 line error the first time they appear (retryable);
* ``lost_results``: batch ids whose results cannot be downloaded (404).

Faults in the results, as a provider's storage or a proxy could produce them (they know nothing of the requests'
content):

* ``garbage_batches``: the next this-many batches to end carry one unreadable line among their results (OpenAI's
  output file, Anthropic's results stream). ``garbage_mode``: ``"extra"`` (a line added to the real ones, the
  default) or ``"truncate"`` (the first answered line cut in half: its reply is lost);
* ``duplicate_errors``: the next this-many batches to end report their first answered line twice: its reply, then
  a 500 error for the same ``custom_id`` (OpenAI: in the error file; Anthropic: a second, errored result);
* :meth:`BatchAPI.forget`: the provider no longer has a batch (every request about it is a 404).

Counters: ``submitted`` (every custom id ever submitted, in order), ``created`` (batch ids), ``polls``, ``served``
(every custom id answered with a reply, in order).
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fakellm import FakeLLMServer, Request

OPENAI_BATCH = "openai_batch"
ANTHROPIC_BATCH = "anthropic_batch"


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class _FakeBatch:
    id: str
    kind: str  # "openai" | "anthropic"
    lines: list[tuple[str, dict[str, Any]]]  # (custom id, request body)
    created: float
    input_file_id: str | None = None
    metadata: dict[str, Any] | None = None
    cancel_at: float | None = None
    results: list[dict[str, Any]] | None = None  # per line, once ended
    status: str = "validating"
    ended_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    ending: bool = False
    garbage: str | None = None  # "extra" / "truncate": one unreadable result line (see the module docstring)
    duplicate_error: bool = False  # the first answered line is also reported as an error


class BatchAPI:
    """Batch endpoints of a :class:`FakeLLMServer` (see the module docstring)."""

    def __init__(self, server: FakeLLMServer) -> None:
        self.server = server
        self.delay = 0.2
        self.expire_after: float | None = None
        self.expire_batches = 0  # the next this-many batches to end, end as expired
        self.expire_fraction = 0.5
        self.fail_lines: set[str] = set()
        self.lost_results: set[str] = set()
        self.garbage_batches = 0
        self.garbage_mode = "extra"
        self.duplicate_errors = 0
        self.served: list[str] = []
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, _FakeBatch] = {}
        self.submitted: list[str] = []
        self.created: list[str] = []
        self.polls = 0
        self.processing_s = 0.0  # seconds spent answering batch lines (the fake provider's own work)
        self._failed_once: set[str] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ routing

    @staticmethod
    def api_of(path: str) -> str | None:
        p = path.rstrip("/")
        if p.startswith("/v1/"):
            p = p[3:]
        if p.startswith("/files") or p.startswith("/batches"):
            return OPENAI_BATCH
        if p.startswith("/messages/batches"):
            return ANTHROPIC_BATCH
        return None

    def handle(self, request: Request) -> tuple[int, dict[str, str], bytes]:
        p = request.path.rstrip("/")
        if p.startswith("/v1/"):
            p = p[3:]
        parts = p.strip("/").split("/")
        method = request.method
        try:
            if parts[0] == "files":
                if method == "POST" and len(parts) == 1:
                    return self._upload(request)
                if method == "GET" and len(parts) == 3 and parts[2] == "content":
                    return self._file_content(parts[1])
            if parts[0] == "batches":
                if method == "POST" and len(parts) == 1:
                    return self._openai_create(request)
                if method == "GET" and len(parts) == 2:
                    return self._json(self._openai_view(self._get(parts[1])))
                if method == "POST" and len(parts) == 3 and parts[2] == "cancel":
                    return self._json(self._openai_view(self._cancel(parts[1])))
            if parts[:2] == ["messages", "batches"]:
                rest = parts[2:]
                if method == "POST" and not rest:
                    return self._anthropic_create(request)
                if method == "GET" and len(rest) == 1:
                    return self._json(self._anthropic_view(self._get(rest[0]), request))
                if method == "GET" and len(rest) == 2 and rest[1] == "results":
                    return self._anthropic_results(rest[0])
                if method == "POST" and len(rest) == 2 and rest[1] == "cancel":
                    return self._json(self._anthropic_view(self._cancel(rest[0]), request))
        except KeyError as e:
            return self._error(404, f"No such object: {e}")
        return self._error(404, f"Unknown batch endpoint {method} {request.path}")

    def _json(self, payload: Any, status: int = 200) -> tuple[int, dict[str, str], bytes]:
        return status, {"content-type": "application/json"}, json.dumps(payload).encode()

    def _error(self, status: int, message: str) -> tuple[int, dict[str, str], bytes]:
        return self._json({"error": {"message": message, "type": "invalid_request_error"},
                           "type": "error"}, status)

    def _get(self, batch_id: str) -> _FakeBatch:
        with self._lock:
            self.polls += 1
            batch = self.batches[batch_id]
        self._advance(batch)
        return batch

    def forget(self, batch_id: str) -> None:
        """The provider no longer has this batch (deleted, another organisation, past retention): a 404 from now on."""
        with self._lock:
            del self.batches[batch_id]

    # ------------------------------------------------------------------ OpenAI

    def _upload(self, request: Request) -> tuple[int, dict[str, str], bytes]:
        ctype = request.headers.get("content-type", "")
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {ctype}\r\n\r\n".encode() + request.raw_body)
        content, filename, purpose = b"", "upload.jsonl", ""
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if name == "file":
                content = part.get_payload(decode=True) or b""
                filename = part.get_filename() or filename
            elif name == "purpose":
                purpose = (part.get_payload(decode=True) or b"").decode()
        file_id = _id("file-")
        with self._lock:
            self.files[file_id] = content
        return self._json({"id": file_id, "object": "file", "bytes": len(content), "created_at": int(time.time()),
                           "filename": filename, "purpose": purpose, "status": "processed"})

    def _file_content(self, file_id: str) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            owner = next((b for b in self.batches.values() if file_id in (b.output_file_id, b.error_file_id)), None)
            if owner is not None and owner.id in self.lost_results:
                return self._error(404, f"File {file_id} was deleted")
            data = self.files[file_id]
        return 200, {"content-type": "application/octet-stream"}, data

    def _openai_create(self, request: Request) -> tuple[int, dict[str, str], bytes]:
        body = request.body or {}
        file_id = body.get("input_file_id")
        with self._lock:
            raw = self.files.get(file_id)
        if raw is None:
            return self._error(400, f"input_file_id {file_id!r} does not exist")
        if body.get("endpoint") != "/v1/chat/completions":
            return self._error(400, f"endpoint {body.get('endpoint')!r} is not supported here")
        lines = []
        for text in raw.decode().splitlines():
            if text.strip():
                rec = json.loads(text)
                lines.append((str(rec["custom_id"]), rec["body"]))
        ids = [c for c, _ in lines]
        if len(set(ids)) != len(ids):
            return self._error(400, "custom_id values must be unique within a batch")
        batch = _FakeBatch(_id("batch_"), "openai", lines, time.time(), input_file_id=file_id,
                           metadata=body.get("metadata"))
        self._register(batch)
        return self._json(self._openai_view(batch))

    def _openai_view(self, b: _FakeBatch) -> dict[str, Any]:
        n = len(b.lines)
        counts = b.counts or {"total": n, "completed": 0, "failed": 0}
        return {
            "id": b.id, "object": "batch", "endpoint": "/v1/chat/completions", "errors": None,
            "input_file_id": b.input_file_id, "completion_window": "24h", "status": b.status,
            "output_file_id": b.output_file_id, "error_file_id": b.error_file_id,
            "created_at": int(b.created), "in_progress_at": int(b.created),
            "expires_at": int(b.created + 86400), "finalizing_at": None,
            "completed_at": int(b.ended_at) if b.ended_at and b.status == "completed" else None,
            "failed_at": None, "expired_at": int(b.ended_at) if b.status == "expired" else None,
            "cancelling_at": int(b.cancel_at) if b.cancel_at else None,
            "cancelled_at": int(b.ended_at) if b.status == "cancelled" else None,
            "request_counts": {"total": n, "completed": counts.get("completed", 0), "failed": counts.get("failed", 0)},
            "metadata": b.metadata,
        }

    # ------------------------------------------------------------------ Anthropic

    def _anthropic_create(self, request: Request) -> tuple[int, dict[str, str], bytes]:
        reqs = (request.body or {}).get("requests") or []
        lines = [(str(r["custom_id"]), r["params"]) for r in reqs]
        ids = [c for c, _ in lines]
        if not lines or len(set(ids)) != len(ids):
            return self._error(400, "requests must be a non-empty list with unique custom_id values")
        batch = _FakeBatch(_id("msgbatch_"), "anthropic", lines, time.time())
        self._register(batch)
        return self._json(self._anthropic_view(batch, request))

    def _anthropic_view(self, b: _FakeBatch, request: Request) -> dict[str, Any]:
        n = len(b.lines)
        ended = b.results is not None
        counts = {"processing": 0 if ended else n, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if ended:
            for r in b.results or []:
                counts[{"succeeded": "succeeded", "errored": "errored", "canceled": "canceled",
                        "expired": "expired"}[r["result"]["type"]]] += 1
        host = request.headers.get("host", "127.0.0.1")
        return {
            "id": b.id, "type": "message_batch",
            "processing_status": "ended" if ended else ("canceling" if b.cancel_at else "in_progress"),
            "request_counts": counts, "ended_at": _iso(b.ended_at), "created_at": _iso(b.created),
            "expires_at": _iso(b.created + 86400), "archived_at": None, "cancel_initiated_at": _iso(b.cancel_at),
            "results_url": f"http://{host}/v1/messages/batches/{b.id}/results" if ended else None,
        }

    def _anthropic_results(self, batch_id: str) -> tuple[int, dict[str, str], bytes]:
        b = self._get(batch_id)
        if b.results is None:
            return self._error(400, f"batch {batch_id} has not ended")
        if batch_id in self.lost_results:
            return self._error(404, f"results of {batch_id} are no longer available")
        data = _with_garbage([json.dumps(r) for r in b.results], b.garbage).encode()
        return 200, {"content-type": "application/binary"}, data

    # ------------------------------------------------------------------ processing

    def _register(self, batch: _FakeBatch) -> None:
        with self._lock:
            self.batches[batch.id] = batch
            self.created.append(batch.id)
            self.submitted.extend(c for c, _ in batch.lines)

    def _cancel(self, batch_id: str) -> _FakeBatch:
        with self._lock:
            b = self.batches[batch_id]
            if b.results is None and b.cancel_at is None:
                b.cancel_at = time.time()
                b.status = "cancelling"
        self._advance(b)
        return b

    def _advance(self, b: _FakeBatch) -> None:
        """Move a batch along its life by the clock (processing its lines once it ends)."""
        with self._lock:
            if b.results is not None or b.ending:
                return
            age = time.time() - b.created
            if b.cancel_at is not None:
                self._end(b, answered=0, how="canceled")
                return
            if self.expire_batches > 0 and age >= self.delay:
                self.expire_batches -= 1
                self._end(b, answered=int(len(b.lines) * self.expire_fraction), how="expired")
                return
            if self.expire_after is not None and age >= self.expire_after:
                self._end(b, answered=int(len(b.lines) * self.expire_fraction), how="expired")
                return
            if age < self.delay:
                b.status = "validating" if age < self.delay / 10 else "in_progress"
                return
            self._end(b, answered=len(b.lines), how="completed")

    def _end(self, b: _FakeBatch, *, answered: int, how: str) -> None:
        from fakellm import ANTHROPIC_MESSAGES, OPENAI_CHAT, Request, _anthropic_message, _openai_chat

        b.ending = True  # another poll arriving while the lines are answered leaves them alone
        if self.garbage_batches > 0:
            self.garbage_batches -= 1
            b.garbage = self.garbage_mode
        if self.duplicate_errors > 0:
            self.duplicate_errors -= 1
            b.duplicate_error = True
        started = time.perf_counter()
        results: list[dict[str, Any]] = []
        ok = bad = 0
        for i, (cid, body) in enumerate(b.lines):
            if i >= answered:
                results.append({"custom_id": cid, "state": "expired" if how == "expired" else "canceled"})
                bad += 1
                continue
            openai = b.kind == "openai"
            req = Request(api=OPENAI_CHAT if openai else ANTHROPIC_MESSAGES,
                          path="/v1/chat/completions" if openai else "/v1/messages", headers={}, body=body,
                          id=_id("req_"), received_at=time.monotonic())
            if cid in self.fail_lines and cid not in self._failed_once:
                self._failed_once.add(cid)
                results.append({"custom_id": cid, "state": "error", "status": 500,
                                "error": {"message": "The server had an error processing this line.",
                                          "type": "server_error"}})
                bad += 1
                continue
            self._lock.release()  # the handler may take its time; other requests go on meanwhile
            try:
                reply = self.server._next_reply(req)
            finally:
                self._lock.acquire()
            if reply.is_error:
                status = reply.status if reply.status >= 400 else 500
                results.append({"custom_id": cid, "state": "error", "status": status,
                                "error": {"message": reply.error_message or "error", "type": "invalid_request_error"
                                          if status < 500 else "api_error"}})
                bad += 1
                continue
            body_out = _openai_chat(req, reply) if openai else _anthropic_message(req, reply)
            results.append({"custom_id": cid, "state": "ok", "body": body_out})
            self.served.append(cid)
            ok += 1
        first_ok = next((r["custom_id"] for r in results if r["state"] == "ok"), None)
        if b.duplicate_error and first_ok is not None:  # reported twice: its reply, then an error
            results.append({"custom_id": first_ok, "state": "error", "status": 500,
                            "error": {"message": "The server had an error processing this line.",
                                      "type": "server_error"}})
        b.ended_at = time.time()
        self.processing_s += time.perf_counter() - started
        b.counts = {"total": len(b.lines), "completed": ok, "failed": bad}
        if b.kind == "openai":
            b.status = {"completed": "completed", "expired": "expired", "canceled": "cancelled"}[how]
            out_lines, err_lines = [], []
            for r in results:
                rid = _id("batch_req_")
                if r["state"] == "ok":
                    out_lines.append({"id": rid, "custom_id": r["custom_id"], "error": None,
                                      "response": {"status_code": 200, "request_id": _id("req_"), "body": r["body"]}})
                elif r["state"] == "error":
                    err_lines.append({"id": rid, "custom_id": r["custom_id"], "error": None,
                                      "response": {"status_code": r["status"], "request_id": _id("req_"),
                                                   "body": {"error": r["error"]}}})
                else:
                    code = "batch_expired" if r["state"] == "expired" else "batch_cancelled"
                    err_lines.append({"id": rid, "custom_id": r["custom_id"], "response": None,
                                      "error": {"code": code, "message": f"This request was {r['state']}."}})
            if out_lines:
                b.output_file_id = _id("file-")
                self.files[b.output_file_id] = _with_garbage([json.dumps(x) for x in out_lines], b.garbage).encode()
            if err_lines:
                b.error_file_id = _id("file-")
                self.files[b.error_file_id] = "".join(json.dumps(x) + "\n" for x in err_lines).encode()
        else:
            b.status = "ended"
        b.results = []
        for r in results:
            if r["state"] == "ok":
                res: dict[str, Any] = {"type": "succeeded", "message": r["body"]}
            elif r["state"] == "error":
                res = {"type": "errored", "error": {"type": "error", "error": {
                    "type": "api_error" if r["status"] >= 500 else "invalid_request_error",
                    "message": r["error"]["message"]}}}
            else:
                res = {"type": r["state"]}
            b.results.append({"custom_id": r["custom_id"], "result": res})


def _with_garbage(lines: list[str], garbage: str | None) -> str:
    """JSON Lines text of ``lines``, with one unreadable line when ``garbage`` says so: ``"extra"`` adds one in the
    middle, ``"truncate"`` cuts the first line in half (what a torn write or a proxy's cut leaves)."""
    lines = list(lines)
    if garbage == "extra":
        lines.insert(len(lines) // 2, '{"id": "batch_req_0", "custom_id": "req-')
    elif garbage == "truncate" and lines:
        lines[0] = lines[0][: len(lines[0]) // 2]
    return "".join(line + "\n" for line in lines)
