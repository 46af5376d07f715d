"""The command's standard streams, made safe to write to when nobody reads them any more.

``ragjudge evaluate ... 2>&1 | head -2`` closes the pipe after two lines; ``2>&-`` starts the process with no
stderr at all. Either way a ``print`` raises (``BrokenPipeError``, or ``print`` falls back to stdout when
``sys.stderr`` is None), and a run that was already paid for would end in a traceback, or never end when the write
happened in a thread others wait on. For the duration of a command, :func:`guarded_streams` puts a thin wrapper
around ``sys.stdout`` and ``sys.stderr``: a write that fails because the reader left is dropped, the stream is
pointed at the null device (so the interpreter's final flush does not fail either), and the command goes on to its
exit code. Nothing else changes: the wrapper hands every other attribute to the stream it wraps.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class GuardedStream:
    """A text stream whose writes never raise because the reader went away (see the module docstring).

    Args:
        stream: the stream to write to; None when the process has none (started with it closed).
    """

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        #: writes dropped since the reader left (or because there is no stream)
        self.dropped = 0

    @property
    def broken(self) -> bool:
        return self.stream is None

    def write(self, text: str) -> int:
        if self.stream is not None:
            try:
                return self.stream.write(text)
            except (OSError, ValueError):  # EPIPE, EIO, "I/O operation on closed file"
                self._lost()
        self.dropped += 1
        return len(text)

    def flush(self) -> None:
        if self.stream is not None:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._lost()

    def close(self) -> None:
        """Nothing: the interpreter owns the standard streams (a logging handler that kept this wrapper closes it
        at exit, after the reader may have left)."""

    def isatty(self) -> bool:
        if self.stream is None:
            return False
        try:
            return bool(self.stream.isatty())
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:
        if self.stream is None:
            raise AttributeError(f"{name!r}: this stream was closed")
        return getattr(self.stream, name)

    def _lost(self) -> None:
        """The reader left: point the file descriptor at the null device (what is still buffered, and the
        interpreter's flush at exit, go there), and drop every later write."""
        stream, self.stream = self.stream, None
        with contextlib.suppress(Exception):
            fd = stream.fileno()  # type: ignore[union-attr]
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)


@contextlib.contextmanager
def guarded_streams() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` wrapped in :class:`GuardedStream` while the block runs, then given back."""
    saved = sys.stdout, sys.stderr
    guards = GuardedStream(saved[0]), GuardedStream(saved[1])
    sys.stdout, sys.stderr = guards  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.stdout is guards[0]:
            sys.stdout = saved[0]
        if sys.stderr is guards[1]:
            sys.stderr = saved[1]
