"""Third-party output goes to the run's log file; the terminal keeps what needs the user.

vLLM, torch, transformers, Ray and the processes they start (vLLM's engine core and its
workers) print warnings a user cannot act on (Triton, NUMA binding, LD_PRELOAD, chunked
prefill, deprecations) straight to file descriptors 1 and 2, from C code and from child
processes as well as through Python. Redirecting ``sys.stdout`` / ``sys.stderr`` or the
``logging`` handlers would miss most of it, so :func:`capture_output` works one level down:
it points descriptors 1 and 2 at a file, which every child process then inherits. Python's
own streams, ``warnings`` and the handlers vLLM and ``logging`` bound to ``sys.stdout`` /
``sys.stderr`` write to those descriptors, so they follow. rlfactory's own output (the live
view, its messages and warnings, errors) is written to copies of the original descriptors,
:attr:`OutputCapture.stdout` and :attr:`OutputCapture.stderr`.

Until the run has a directory, the output is kept in an unlinked temporary file;
:func:`log_to` copies it into the run's ``log.txt`` and points the descriptors there (in
append mode, so a resumed run adds to its log). A command that fails keeps its log:
:meth:`OutputCapture.stop` with ``keep=True`` writes one that never reached a run directory
to the temporary directory, and :meth:`OutputCapture.tail` gives its last lines to show.

Only a process whose ``sys.stdout`` and ``sys.stderr`` are still the interpreter's own is
captured: where something else has replaced them (pytest's capture, a notebook), that
something already decides where output goes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, TextIO

__all__ = ["OutputCapture", "capture_output", "log_to", "active_capture", "LOG_FILE"]

#: The log file's name in a run directory.
LOG_FILE = "log.txt"

_FDS = (1, 2)
_active: OutputCapture | None = None


class OutputCapture:
    """Descriptors 1 and 2 pointed at a log (see the module docstring); build it with
    :func:`capture_output`."""

    def __init__(self) -> None:
        #: Where the log is: the run's ``log.txt`` after :func:`log_to`, the kept temporary
        #: log after ``stop(keep=True)``, else None.
        self.path: Path | None = None
        #: The terminal (or whatever fds 1 and 2 were), for rlfactory's own output.
        self.stdout: TextIO | None = None
        self.stderr: TextIO | None = None
        self._saved: dict[int, int] = {}
        self._buffer = -1  # the temporary log's descriptor
        self._copied = 0  # bytes of the temporary log already in ``path``

    def start(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        fd, name = tempfile.mkstemp(prefix="rlf-", suffix=".log")
        os.unlink(name)  # nothing is left behind unless the log is kept
        _append_mode(fd)  # every process shares the descriptor: writes must not overwrite each other
        self._buffer = fd
        for target in _FDS:
            self._saved[target] = os.dup(target)  # not inherited: children never write to the terminal
        self.stdout = _text_stream(self._saved[1], sys.stdout)
        self.stderr = _text_stream(self._saved[2], sys.stderr)
        for target in _FDS:
            os.dup2(fd, target)

    def log_to(self, path: str | os.PathLike[str]) -> None:
        """Move the log to ``path`` (appended to): what was written so far, and from now on
        everything written to descriptors 1 and 2 here and in processes started later."""
        path = Path(path)
        if self.path is not None and self.path == path:
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self._copied = _copy(self._buffer, self._copied, target)
            for fd in _FDS:
                os.dup2(target, fd)
        finally:
            os.close(target)
        self.path = path

    def tail(self, lines: int = 20) -> list[str]:
        """The last ``lines`` non-empty lines of the log."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        try:
            if self.path is not None:
                with open(self.path, "rb") as f:
                    data = _last_bytes(f.fileno())
            else:
                data = _last_bytes(self._buffer)
        except OSError:
            return []
        text = data.decode("utf-8", errors="replace")
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def stop(self, *, keep: bool = False) -> None:
        """Give descriptors 1 and 2 back. ``keep``: a log that never reached a run
        directory is written to the temporary directory (``path`` says where); otherwise it
        is dropped."""
        for stream in (sys.stdout, sys.stderr, self.stdout, self.stderr):
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.flush()
        try:
            if self.path is not None:
                # Late output of processes started before the run directory existed.
                with open(self.path, "ab") as f:
                    self._copied = _copy(self._buffer, self._copied, f.fileno())
            elif keep and os.fstat(self._buffer).st_size:
                stamp = time.strftime("%Y%m%d-%H%M%S")
                kept = Path(tempfile.gettempdir()) / f"rlf-{stamp}-{os.getpid()}.log"
                with open(kept, "wb") as f:
                    _copy(self._buffer, 0, f.fileno())
                self.path = kept
        finally:
            for target, saved in self._saved.items():
                os.dup2(saved, target)
            for stream in (self.stdout, self.stderr):
                with contextlib.suppress(Exception):
                    if stream is not None:
                        stream.close()  # closes the saved descriptor too
            self._saved.clear()
            if self._buffer >= 0:
                os.close(self._buffer)
                self._buffer = -1


@contextlib.contextmanager
def capture_output() -> Iterator[OutputCapture | None]:
    """Descriptors 1 and 2 into a log while the block runs (see the module docstring);
    yields the capture, or None where the process's streams are not its own (nothing is
    captured then). The log is dropped unless :func:`log_to` gave it a place or the caller
    stopped it itself with ``keep=True``."""
    global _active
    if _active is not None or not _streams_are_the_processes():
        yield None
        return
    capture = OutputCapture()
    capture.start()
    _active = capture
    try:
        yield capture
    finally:
        _active = None
        if capture._saved:  # noqa: SLF001 - not stopped by the caller
            capture.stop()


def active_capture() -> OutputCapture | None:
    """The capture in force, if any."""
    return _active


def log_to(path: str | os.PathLike[str]) -> None:
    """Send the captured output to ``path`` (see :meth:`OutputCapture.log_to`); nothing
    happens when no capture is in force."""
    if _active is not None:
        _active.log_to(path)


def _streams_are_the_processes() -> bool:
    if os.name != "posix":
        return False
    try:
        return (sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__
                and sys.stdout.fileno() == 1 and sys.stderr.fileno() == 2)
    except (AttributeError, ValueError, OSError):  # closed, or not backed by a descriptor
        return False


def _append_mode(fd: int) -> None:
    import fcntl

    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)


def _text_stream(fd: int, like: TextIO) -> TextIO:
    return os.fdopen(fd, "w", buffering=1, encoding=getattr(like, "encoding", None) or "utf-8",
                     errors=getattr(like, "errors", None) or "backslashreplace")


def _copy(source: int, offset: int, target: int) -> int:
    """Append ``source``'s bytes from ``offset`` to ``target``; the new offset."""
    while True:
        chunk = os.pread(source, 1 << 20, offset)
        if not chunk:
            return offset
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view):]
        offset += len(chunk)


def _last_bytes(fd: int, size: int = 64 * 1024) -> bytes:
    end = os.fstat(fd).st_size
    return os.pread(fd, size, max(0, end - size))
