"""A directory of its own for each vLLM engine's IPC socket files, removed with the engine.

vLLM's processes talk over ZeroMQ ``ipc://`` sockets, files named by a UUID in
``VLLM_RPC_BASE_PATH`` (default: the temp directory). vLLM 0.32 leaves them behind: every
engine start left 7 socket files in /tmp after a clean exit (and the same after a killed
run), so a day of runs and tests left hundreds there. :func:`private_socket_directory` makes a
directory named after this process for the engine's processes to inherit (they are spawned
while :func:`.vllm_cpu.environment` sets ``VLLM_RPC_BASE_PATH`` to it); the backend removes it
when it closes, and a later engine start removes those of processes that are gone (a run
killed outright). A user who sets ``VLLM_RPC_BASE_PATH`` keeps theirs, untouched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..._proc import remove_dead_process_directories

__all__ = ["private_socket_directory", "remove_socket_directory"]

_PREFIX = "rlf-vllm-"


def private_socket_directory() -> str | None:
    """A new directory for one engine's socket files (removing those left by dead
    processes first); ``None`` when the user set ``VLLM_RPC_BASE_PATH``."""
    if "VLLM_RPC_BASE_PATH" in os.environ:
        return None
    base = Path(tempfile.gettempdir())
    remove_dead_process_directories(base, _PREFIX)
    # short: a socket's path must fit in 107 bytes, and vLLM adds a 36-character UUID
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)


def remove_socket_directory(path: str | None) -> None:
    """Remove a directory :func:`private_socket_directory` made (``None``: nothing)."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)

