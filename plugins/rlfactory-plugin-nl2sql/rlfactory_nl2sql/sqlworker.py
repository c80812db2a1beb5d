"""SQL worker processes: where the sandbox runs each query, so that its time limit holds.

SQLite's progress handler stops a statement between virtual-machine instructions, but one
instruction can be one call of a built-in function that runs for minutes: ``replace`` and
``instr`` compare the pattern at every position (a 2 MB text and a 100 kB pattern: seconds;
10 MB and 5 MB: hours), ``trim`` compares every character with every trim character, and
none of them looks at the clock. No limit on sizes makes these cheap, and a thread cannot be
stopped. So a query runs in a worker process (:func:`run`); past its time limit plus a
grace for the handler's own stop, the worker is killed and the query is a ``timeout``. The
workers also run under an address-space limit (``RLIMIT_AS``, :data:`MEMORY_LIMIT`), so
that one query cannot take the machine's memory either (``QueryLimits.max_memory_bytes``).

Workers are new Python processes (no fork of the caller, which may hold threads and GPU
state) that import only this module, :mod:`~rlfactory_nl2sql.engine` and
:mod:`~rlfactory_nl2sql.sqltext`, and they are reused: a pool keeps the idle ones; one that was
killed or died is replaced by a new one on the next query. A worker reads requests on its
stdin and writes answers on the file descriptor it was given as stdout (frames of an
8-byte length and a pickle; both ends are this module), and exits when its stdin closes.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from .engine import QueryLimits, QueryResult
from .sqltext import QueryError

__all__ = ["run", "GRACE_S"]

#: Seconds past a query's time limit before its worker is killed (the progress handler
#: normally stops the statement first, and the worker stays).
GRACE_S = 0.25
_START_TIMEOUT_S = 60.0
_IDLE_KEPT = 16
_FRAME = struct.Struct("<Q")


# The worker imports this package's modules without its __init__ (which loads the env, the
# reward and RLFactory's core): engine, sqltext and this module need the standard library only,
# so a worker starts in a few tens of milliseconds, with `-I -S` (no site-packages, no user
# environment).
_BOOT = ("import sys, types; package = types.ModuleType('rlfactory_nl2sql'); package.__path__ = [sys.argv[1]]; "
         "sys.modules['rlfactory_nl2sql'] = package; from rlfactory_nl2sql.sqlworker import main; main()")


class _Worker:
    def __init__(self) -> None:
        package_dir = str(Path(__file__).resolve().parent)
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _BOOT, package_dir],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         close_fds=True)
        except OSError as exc:  # out of processes, memory or descriptors: the machine's problem, as below
            raise RuntimeError(f"the nl2sql SQL worker process could not start ({exc}): free processes or "
                               "file descriptors (ulimit -n, ulimit -u), or run fewer trajectories at once") from exc
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.fd = self.proc.stdin, self.proc.stdout.fileno()
        # poll, not select: a training process holds many descriptors, and select() refuses
        # those numbered past 1023
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)
        try:
            ready = self._read(time.monotonic() + _START_TIMEOUT_S) == b"ready"
        except TimeoutError:
            ready = False
        if not ready:  # the machine's problem, not the query's: not a QueryError, which the reward scores 0
            code = self.kill()
            raise RuntimeError(f"the nl2sql SQL worker process did not start within {_START_TIMEOUT_S:g} s (exit "
                               f"code {code}): {sys.executable} -I -S could not run rlfactory_nl2sql.sqlworker")

    def _read_exactly(self, n: int, deadline: float) -> bytes | None:
        data = bytearray()
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not self.poller.poll(max(1, int(left * 1000))):
                raise TimeoutError
            chunk = os.read(self.fd, n - len(data))
            if not chunk:
                return None  # the worker exited
            data += chunk
        return bytes(data)

    def _read(self, deadline: float) -> bytes | None:
        head = self._read_exactly(_FRAME.size, deadline)
        return None if head is None else self._read_exactly(_FRAME.unpack(head)[0], deadline)

    def ask(self, request: tuple[Any, ...], deadline: float) -> Any:
        """The worker's answer, None when it died; TimeoutError past ``deadline``."""
        payload = pickle.dumps(request)
        try:
            self.stdin.write(_FRAME.pack(len(payload)) + payload)
            self.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        reply = self._read(deadline)
        return None if reply is None else pickle.loads(reply)

    def kill(self) -> int | None:
        self.proc.kill()
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None
        finally:
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()  # type: ignore[union-attr]
                except OSError:
                    pass


_idle: list[_Worker] = []
_idle_lock = threading.Lock()
_owner = os.getpid()


def _take() -> _Worker:
    global _owner
    with _idle_lock:
        if _owner != os.getpid():  # a forked child: the pipes belong to the parent's workers
            _idle.clear()
            _owner = os.getpid()
        if _idle:
            return _idle.pop()
    return _Worker()


def _give_back(worker: _Worker) -> None:
    with _idle_lock:
        if _owner == os.getpid() and len(_idle) < _IDLE_KEPT:
            _idle.append(worker)
            return
    worker.kill()


@atexit.register
def _stop_idle() -> None:
    with _idle_lock:
        workers, _idle[:] = list(_idle), []
    for worker in workers:
        worker.kill()


def run(uri: str, statement: str, limits: QueryLimits, label: str) -> QueryResult:
    """:func:`rlfactory_nl2sql.engine.execute` in a worker process, stopped at the time
    limit whatever the query does; raises :class:`QueryError`."""
    worker = _take()
    try:
        reply = worker.ask((uri, statement, limits, label), time.monotonic() + limits.time_limit_s + GRACE_S)
    except TimeoutError:
        worker.kill()
        raise QueryError("timeout", f"the query ran longer than the limit of {limits.time_limit_s:g} s and was "
                                    "stopped; make it cheaper (no cross joins, bounded recursion, smaller "
                                    "values)") from None
    except BaseException:
        worker.kill()
        raise
    if reply is None:
        code = worker.kill()
        raise QueryError("sql_error", f"the query stopped the SQL engine (its worker process exited with code "
                                      f"{code}); make it simpler")
    _give_back(worker)
    if reply[0] == "error":
        raise QueryError(reply[1], reply[2])
    return reply[1]


# --------------------------------------------------------------------------- the worker side


def _write(out: BinaryIO, payload: bytes) -> None:
    out.write(_FRAME.pack(len(payload)) + payload)
    out.flush()


def _read_request(inp: BinaryIO) -> Any:
    head = inp.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    return pickle.loads(inp.read(_FRAME.unpack(head)[0]))


def _exit_with(parent: int) -> None:
    # A worker inside one long C call never reads its stdin's end: it would outlive a parent
    # that died, burning a core. SQLite releases the GIL while it runs, so this thread runs.
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def main() -> None:
    """The worker's loop: one request, one answer, until stdin closes."""
    import resource
    import signal

    from .engine import execute, memory_error

    # Ctrl-C in a terminal reaches the whole process group: the parent decides what stops
    # (it kills its workers), a query in flight is not failed by the keypress.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
    inp = sys.stdin.buffer
    _write(out, b"ready")
    while True:
        request = _read_request(inp)
        if request is None:
            return
        uri, statement, limits, label = request
        memory = limits.max_memory_bytes if hard == resource.RLIM_INFINITY else min(limits.max_memory_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (memory, hard))
        try:
            reply: tuple[Any, ...] = ("ok", execute(uri, statement, limits, label))
        except QueryError as exc:
            reply = ("error", exc.kind, exc.message)
        except MemoryError:
            reply = ("error", "too_large", memory_error(limits))
        try:
            payload = pickle.dumps(reply)
        except MemoryError:
            payload = pickle.dumps(("error", "too_large", memory_error(limits)))
        _write(out, payload)
