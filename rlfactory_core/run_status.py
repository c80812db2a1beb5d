"""Whether a run is running, finished, failed, interrupted or died: ``status.json`` in its directory.

``rlf train`` writes the file when the run starts, rewrites it every :data:`HEARTBEAT_S`
seconds while the process lives (from a daemon thread, so a long update or a busy event loop
does not hold it back) with the last finished step, and writes how the run ended:
``finished``, ``interrupted`` (a stop request; the message says which step is saved) or
``failed`` (the error's line). A process killed with SIGKILL, or a machine that lost power,
writes nothing more, so :func:`read_status` calls a run ``died`` when its file still says
``running`` but the heartbeat is older than :data:`STALE_AFTER_S`, or, on the same host,
its process is gone. A run made before this file existed is ``finished`` when its metrics
reached the configured steps, else ``unknown``; a torn or malformed file is ``unknown`` with
the reason, never an exception.

The file (``version`` 1)::

    {"version": 1, "state": "running", "pid": 1234, "host": "box", "started_at": 1764280000.0,
     "updated_at": 1764280120.5, "step": 3, "steps": 8, "message": ""}
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal

from ._fs import write_text_atomic
from ._proc import process_exists
from .errors import RLFactoryError

__all__ = ["STATUS_FILE", "LOCK_FILE", "HEARTBEAT_S", "STALE_AFTER_S", "RunStatus", "StatusWriter", "read_status",
           "hold_run", "holds_run", "still_exiting", "RunInUse", "ENDED_STATES"]

#: Held (``flock``) by the one ``rlf train`` working in a run directory, for its whole life.
LOCK_FILE = ".lock"

STATUS_FILE = "status.json"
#: How often a live run rewrites its status.
HEARTBEAT_S = 10.0
#: A ``running`` status not rewritten for this long belongs to a process that died. Six missed
#: heartbeats: a machine under load (a 2-core box compiling while it trains) still beats.
STALE_AFTER_S = 60.0
VERSION = 1

State = Literal["running", "finished", "failed", "interrupted", "died", "unknown"]
#: The states a trainer writes as it ends (StatusWriter.end).
ENDED_STATES = ("finished", "failed", "interrupted")


@dataclass(frozen=True)
class RunStatus:
    """A run's state as :func:`read_status` sees it; ``message`` says why for ``failed``,
    ``interrupted``, ``died`` and ``unknown``."""

    state: State
    step: int | None = None
    steps: int | None = None
    pid: int | None = None
    host: str = ""
    started_at: float | None = None
    updated_at: float | None = None
    message: str = ""


class StatusWriter:
    """The training process's side: :meth:`start`, :meth:`step` after each finished step,
    and one :meth:`end`. The heartbeat thread stops at :meth:`end` (or with the process)."""

    def __init__(self, run_dir: Path, *, steps: int, step: int = 0, heartbeat_s: float = HEARTBEAT_S):
        self._path = Path(run_dir) / STATUS_FILE
        self._heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._record = {"version": VERSION, "state": "running", "pid": os.getpid(), "host": socket.gethostname(),
                        "started_at": time.time(), "updated_at": time.time(), "step": step, "steps": steps,
                        "message": ""}

    def start(self) -> "StatusWriter":
        self._write()
        self._thread = threading.Thread(target=self._beat, name="rlf-status-heartbeat", daemon=True)
        self._thread.start()
        return self

    def step(self, step: int) -> None:
        """``step`` is finished (written at once, not at the next heartbeat)."""
        self._write(step=step)

    def end(self, state: Literal["finished", "failed", "interrupted"], message: str = "") -> None:
        """The run's end; the heartbeat stops first, so it cannot overwrite it. A write that
        fails (a full disk) is left: it must not hide the error that ended a failed run."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self._write(state=state, message=message)
        except OSError:
            pass

    def _beat(self) -> None:
        while not self._stopped.wait(self._heartbeat_s):
            try:
                self._write()
            except OSError:  # a full disk or a removed run directory: the run itself decides what that means
                pass

    def _write(self, **changes: object) -> None:
        with self._lock:
            if self._record["state"] != "running":
                return  # ended: nothing after the end
            self._record.update(changes, updated_at=time.time())
            write_text_atomic(self._path, json.dumps(self._record) + "\n")


def read_status(run_dir: str | os.PathLike[str], *, now: float | None = None) -> RunStatus:
    """``run_dir``'s status (see the module docstring); never raises for a run's files."""
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    path = run_dir / STATUS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return _status_from_metrics(run_dir)
    except OSError as exc:
        return RunStatus("unknown", message=f"{STATUS_FILE}: cannot be read ({exc.strerror or exc})")
    try:
        record = json.loads(text)
        status = RunStatus(state=record["state"], step=_int_or_none(record.get("step")),
                           steps=_int_or_none(record.get("steps")), pid=_int_or_none(record.get("pid")),
                           host=str(record.get("host", "")), started_at=_float_or_none(record.get("started_at")),
                           updated_at=_float_or_none(record.get("updated_at")), message=str(record.get("message", "")))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return RunStatus("unknown", message=f"{STATUS_FILE}: malformed ({type(exc).__name__}: {exc})")
    if status.state not in ("running", *ENDED_STATES):
        return RunStatus("unknown", message=f"{STATUS_FILE}: unknown state {status.state!r}")
    if status.state != "running":
        return status
    if status.host == socket.gethostname() and status.pid is not None and not process_exists(status.pid):
        return _died(status, f"its process {status.pid} is gone")
    if status.updated_at is None or now - status.updated_at > STALE_AFTER_S:
        age = "never" if status.updated_at is None else f"{now - status.updated_at:.0f} s ago"
        return _died(status, f"its last heartbeat was {age}")
    return status


def _died(status: RunStatus, why: str) -> RunStatus:
    step = f"; step {status.step} is the last finished" if status.step else ""
    return RunStatus(**{**asdict(status), "state": "died",
                        "message": f"stopped without a word ({why}: killed or out of memory?){step}"})


def _status_from_metrics(run_dir: Path) -> RunStatus:
    """A run made before ``status.json``: finished when its metrics reached the configured steps."""
    steps = last = None
    try:
        import yaml

        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        from .metrics import read_metrics  # skips a torn last line

        steps = int(config["train"]["steps"])
        last = max((int(record["step"]) for record in read_metrics(run_dir)), default=None)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return RunStatus("unknown", steps=steps, step=last,
                         message=f"no {STATUS_FILE} (a run from before it) and {type(exc).__name__}: {exc}")
    if last is not None and last >= steps:
        return RunStatus("finished", step=last, steps=steps)
    return RunStatus("unknown", step=last, steps=steps,
                     message=f"no {STATUS_FILE} (a run from before it): stopped or still running at step {last}")


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[arg-type]


def _float_or_none(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


class RunInUse(RLFactoryError):
    """Another process trains in the run directory."""


def hold_run(run_dir: str | os.PathLike[str]) -> IO[str]:
    """Take ``run_dir``'s lock for this process's life (keep the returned file open; closing
    it, or the process ending however it ends, releases it), so two trainers never write one
    run (a double-clicked resume, a second terminal). The file names the holder's pid.

    Raises:
        RunInUse: another process holds it.
    """
    import fcntl

    path = Path(run_dir) / LOCK_FILE
    handle = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise RunInUse(f"{run_dir} is in use by another rlf train (pid {holder})",
                       hint="stop that one first (rlf ui's Stop, or Ctrl-C in its terminal)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def still_exiting(run_dir: str | os.PathLike[str], status: RunStatus) -> bool:
    """Whether a run that wrote its end (``interrupted``, ``finished``, ``failed``) still has its
    process, on this host, holding the run: it is closing its engines, and a resume now would
    find the run in use. A UI offers resume once this is false."""
    return (status.state in ENDED_STATES and status.pid is not None
            and status.host in ("", socket.gethostname()) and process_exists(status.pid)
            and holds_run(status.pid, run_dir))


def holds_run(pid: int, run_dir: str | os.PathLike[str]) -> bool:
    """Whether process ``pid`` has ``run_dir``'s lock file open (Linux: ``/proc/PID/fd``): the
    proof that it is that run's trainer, not a process that reused the number."""
    lock = (Path(run_dir) / LOCK_FILE).resolve()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if Path(os.readlink(fd)) == lock:
                return True
        except OSError:
            continue
    return False
