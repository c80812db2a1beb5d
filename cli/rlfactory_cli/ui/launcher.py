"""Runs the UI starts, stops and resumes: ``rlf train`` as a child process.

A launched run is an ordinary ``rlf train --config RUN_DIR/ui-config.yaml`` in a new session
(closing the UI or pressing Ctrl-C in its terminal does not stop it), its terminal output in
``RUN_DIR/console.txt``. Stop sends SIGTERM, which the run answers by finishing or dropping
its step and checkpointing (rlfactory_core.stopping); resume is ``rlf train --resume RUN_DIR``.
A process is only signalled when the run's ``status.json`` names it on this host and it holds
the run's lock file open (``rlfactory_core.run_status.hold_run``: a pid the system reused, or
another run's trainer, is left alone), or when this UI launched it and it still runs. A resume
is refused while a trainer holds the run (the trainer refuses a second one too) or while this
UI's last child for it has not yet written its end; a child that has, and has let go of the
lock, is only exiting and does not hold the resume back.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from rlfactory_core.run_status import ENDED_STATES, LOCK_FILE, RunStatus, holds_run, read_status, still_exiting

from .security import run_dir_of

__all__ = ["Launcher", "LaunchError", "CONFIG_FILE", "CONSOLE_FILE"]

CONFIG_FILE = "ui-config.yaml"
CONSOLE_FILE = "console.txt"


class LaunchError(ValueError):
    """A launch, stop or resume that cannot be done; the message says why."""


class Launcher:
    """Starts ``rlf train`` runs in ``runs_dir`` and keeps their processes reaped."""

    def __init__(self, runs_dir: str | Path, *, python: str = sys.executable):
        self.runs_dir = Path(runs_dir).resolve()
        self.python = python
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping: dict[str, tuple[int, float]] = {}  # run -> (pid signalled, when): until it has ended
        self.lock = threading.Lock()

    def launch(self, config: dict[str, Any]) -> str:
        """A new run of ``config`` (validated by the caller); its directory's name."""
        name = self._new_name(str(config.get("env") or "run"))
        run_dir = self.runs_dir / name
        run_dir.mkdir(parents=True)
        (run_dir / CONFIG_FILE).write_text(yaml.safe_dump({**config, "run_dir": str(run_dir)}, sort_keys=False))
        self._spawn(name, ["train", "--config", str(run_dir / CONFIG_FILE)], run_dir)
        return name

    def resume(self, name: str) -> None:
        run_dir = run_dir_of(self.runs_dir, name)
        problem = self._resume_problem(name, run_dir, read_status(run_dir))
        if problem:
            raise LaunchError(problem)
        self._spawn(name, ["train", "--resume", str(run_dir)], run_dir)

    def controls(self, name: str, run_dir: Path, status: RunStatus) -> dict[str, Any]:
        """What the run page shows and offers, from the run's real state: ``state`` (the
        status's, or ``starting`` from the launch until the new process writes its status,
        ``stopping`` from a stop until the run has ended), ``message``, ``can_stop``,
        ``can_resume`` (when not, ``message`` says why)."""
        with self.lock:
            child = self.children.get(name)
            stop = self.stopping.get(name)
            if stop is not None and status.state != "running" and not self._alive(child, stop[0]):
                del self.stopping[name]  # it has ended: the stop is history, its status says how
                stop = None
        if child is not None and child.poll() is None and status.pid != child.pid:
            return {"state": "starting", "message": f"starting (pid {child.pid}): loading the model and the data",
                    "can_stop": True, "can_resume": False}
        if stop is not None:
            when = datetime.fromtimestamp(stop[1]).strftime("%H:%M:%S")
            return {"state": "stopping", "can_stop": False, "can_resume": False,
                    "message": f"stop sent to pid {stop[0]} at {when}: the run finishes or drops its step, "
                               "saves a checkpoint and stops"}
        if status.state == "running":
            return {"state": "running", "message": status.message, "can_stop": True, "can_resume": False}
        problem = self._resume_problem(name, run_dir, status)
        message = "; ".join(part for part in (status.message, problem) if part)
        return {"state": status.state, "message": message, "can_stop": False, "can_resume": problem is None}

    def _resume_problem(self, name: str, run_dir: Path, status: RunStatus) -> str | None:
        """Why ``name`` cannot be resumed now (None: it can)."""
        with self.lock:
            child = self.children.get(name)
        # This UI's child still runs: starting (its status.json is still the last process's) or
        # training. Once it has written its end and let go of the lock, only its interpreter is
        # exiting (seconds on a busy machine) and the run is free: the resume may go ahead.
        starting_or_training = child is not None and child.poll() is None and not (
            status.pid == child.pid and status.state in ENDED_STATES and not _in_use(run_dir))
        if starting_or_training and status.state != "running" and status.pid != child.pid:
            return f"{name} was just launched (pid {child.pid}) and is starting"
        if status.state == "running" or starting_or_training or _in_use(run_dir):
            pid = status.pid or child and child.pid
            if still_exiting(run_dir, status):
                return f"{name} has {status.state} but its process (pid {pid}) is still exiting: resume once it has"
            return f"{name} is running (pid {pid}): stop it first"
        if status.state == "finished":
            return "finished: every step is done, so there is nothing to resume"
        if not (run_dir / "config.yaml").exists():
            return f"{name} has no config.yaml: it never started, so there is nothing to resume"
        if not (run_dir / "checkpoints").is_dir() or not any((run_dir / "checkpoints").iterdir()):
            return "no checkpoint to resume from"
        return None

    def delete(self, name: str) -> None:
        """Delete the run ``name``: its own directory, or, for a run that is a symlink in the
        runs directory, only the link (its target is left alone). Refused while it runs."""
        entry = self.runs_dir / name
        run_dir = run_dir_of(self.runs_dir, name)  # a run directly in the runs directory, or PathRefused
        status = read_status(run_dir)
        with self.lock:
            child = self.children.get(name)
        if status.state == "running" or _in_use(run_dir) or (child is not None and child.poll() is None):
            raise LaunchError(f"{name} is running: stop it first, then delete it")
        if entry.is_symlink():
            entry.unlink()
        else:
            shutil.rmtree(entry)  # never follows a symlink inside it: a link is removed, its target kept
        with self.lock:
            self.children.pop(name, None)
            self.stopping.pop(name, None)

    def stop(self, name: str) -> int:
        """SIGTERM to the run's ``rlf train``; its pid."""
        run_dir = run_dir_of(self.runs_dir, name)
        status = read_status(run_dir)
        pid = status.pid
        if pid is None or status.host not in ("", socket.gethostname()):
            # just launched: its status.json may not be written yet
            with self.lock:
                child = self.children.get(name)
            if child is None or child.poll() is not None:
                raise LaunchError(f"{name} is not running ({status.state})")
            pid = child.pid
        elif status.state != "running":
            raise LaunchError(f"{name} is not running ({status.state})")
        if not self._launched(pid) and not holds_run(pid, run_dir):
            raise LaunchError(f"process {pid} does not hold {name}'s lock: it is not that run's rlf train, "
                              f"so it is not signalled")
        os.kill(pid, signal.SIGTERM)
        with self.lock:
            self.stopping[name] = (pid, time.time())
        return pid

    def close(self) -> None:
        """Forget the children (they keep running: a run outlives its UI)."""
        with self.lock:
            self.children.clear()

    def _new_name(self, env: str) -> str:
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", env)[:60] + "-" + datetime.now().strftime("%Y%m%d-%H%M%S")
        for suffix in ("", *(f"-{n}" for n in range(2, 1000))):
            if not (self.runs_dir / f"{stem}{suffix}").exists():
                return f"{stem}{suffix}"
        raise LaunchError(f"{stem}-* exist 999 times")

    def _spawn(self, name: str, args: list[str], run_dir: Path) -> None:
        console = open(run_dir / CONSOLE_FILE, "ab")
        try:
            child = subprocess.Popen([self.python, "-m", "rlfactory_cli", *args], stdin=subprocess.DEVNULL,
                                     stdout=console, stderr=subprocess.STDOUT, cwd=self.runs_dir,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        finally:
            console.close()
        with self.lock:
            self.children[name] = child
        # reaped when it ends: a zombie would look alive to the status check
        threading.Thread(target=child.wait, name=f"reap-{name}", daemon=True).start()

    @staticmethod
    def _alive(child: subprocess.Popen[bytes] | None, pid: int) -> bool:
        """Whether the stopped process still runs (this UI's child: not yet reaped)."""
        return child is not None and child.pid == pid and child.poll() is None

    def _launched(self, pid: int) -> bool:
        """Whether ``pid`` is a run this UI started and that still runs."""
        with self.lock:
            return any(child.pid == pid and child.poll() is None for child in self.children.values())


def _in_use(run_dir: Path) -> bool:
    """Whether an ``rlf train`` holds ``run_dir``'s lock (rlfactory_core.run_status.hold_run)."""
    import fcntl

    try:
        with open(run_dir / LOCK_FILE, "r", encoding="utf-8") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
    except FileNotFoundError:
        return False
    return False
