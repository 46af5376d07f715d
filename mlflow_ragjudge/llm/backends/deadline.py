"""A request's ``timeout`` as a deadline for the whole request, its body included.

The HTTP libraries under the SDKs apply a timeout to each operation -- connecting, each read of the socket -- so
a reply whose body trickles in (headers at once, then a byte every second or two: a stalled proxy, a server that
streams its reply slowly) never trips it, and an attempt could take hours. Here every raw request the backends send
(:func:`~._sdk.post`) is watched against ``timeout`` from the moment it is sent: once that passes with the reply
unfinished, one watcher thread shuts the request's connection down, so the read under way ends at once, and the
request fails ``timeout`` (retried as the policy says).

The connection is learned through the HTTP library's public request extensions, on the sending thread: the
``trace`` callback names the network stream of a connection opened for the request, and a reply's
``network_stream`` extension the one it came on (a reused connection). A reused connection is thus known once the
reply's headers are in; while they are awaited, each read is bounded by ``timeout`` as before, and headers that come
after the deadline fail the request when they arrive.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Deadline", "watch", "current", "traced", "attach"]

#: the longest the watcher sleeps without looking at its list (a timer's upper limit is far beyond it)
_NAP = 60.0


class Deadline:
    """One request's deadline: ``fired`` once it passed with the request unfinished; ``stream`` the network stream
    of its connection, once known (shut down when the deadline fires)."""

    __slots__ = ("at", "timeout", "stream", "fired", "done")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.at = time.monotonic() + timeout
        self.stream: Any = None
        self.fired = False
        self.done = False


class _Watcher:
    """The deadlines of the requests in flight, in a heap, and the one daemon thread that acts on them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, deadline: Deadline) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline.at, next(self._seq), deadline))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ragjudge-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def attach(self, deadline: Deadline, stream: Any) -> None:
        with self._cond:
            if deadline.done:
                return
            deadline.stream = stream
            fired = deadline.fired
        if fired:
            _shut(stream)

    def end(self, deadline: Deadline) -> None:
        with self._cond:
            deadline.done = True
            deadline.stream = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait(_NAP)
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._cond.wait(min(left, _NAP))
                    continue
                deadline = heapq.heappop(self._heap)[2]
                deadline.fired = True
                stream = deadline.stream
            if stream is not None:
                _shut(stream)


def _shut(stream: Any) -> None:
    """End the connection under a stream: the blocked or next read returns at once (an orderly shutdown of the
    socket itself, beneath any TLS layer; closing it from another thread would not wake the reader)."""
    with contextlib.suppress(Exception):
        sock = stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


_WATCHER = _Watcher()
_LOCAL = threading.local()

_OPENED = (".connect_tcp.complete", ".connect_unix_socket.complete", ".start_tls.complete")


@contextlib.contextmanager
def watch(timeout: float) -> Any:
    """The requests this thread sends inside the block are one request under ``timeout`` seconds in all; yields
    its :class:`Deadline` (``fired`` tells, after a failure, that the deadline ended it)."""
    deadline = Deadline(timeout)
    before = getattr(_LOCAL, "deadline", None)
    _LOCAL.deadline = deadline
    _WATCHER.add(deadline)
    try:
        yield deadline
    finally:
        _LOCAL.deadline = before
        _WATCHER.end(deadline)


def current() -> Deadline | None:
    """The deadline of the request this thread is sending (None outside :func:`watch`)."""
    return getattr(_LOCAL, "deadline", None)


def traced(deadline: Deadline, inner: Callable[[str, dict[str, Any]], Any] | None) -> Callable[..., Any]:
    """A ``trace`` request extension that tells the watcher the network stream of a connection opened for the
    request (and calls ``inner``, a trace callback already set, first)."""

    def trace(name: str, info: dict[str, Any]) -> Any:
        if inner is not None:
            inner(name, info)
        if name.endswith(_OPENED) and info.get("return_value") is not None:
            _WATCHER.attach(deadline, info["return_value"])

    return trace


def attach(deadline: Deadline, stream: Any) -> None:
    """The request's reply came on ``stream`` (its headers are in): shut it down when the deadline passes."""
    if stream is not None:
        _WATCHER.attach(deadline, stream)
