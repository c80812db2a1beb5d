"""Whether a process lives: a private helper of the core (run status, the vLLM weight staging
and socket directories of finished processes), not part of the plugin API."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["process_exists", "remove_dead_process_directories"]


def process_exists(pid: int) -> bool:
    """Whether ``pid`` names a live process on this host (a zombie not yet reaped counts: its
    parent still has to wait for it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_dead_process_directories(root: str | Path, prefix: str) -> list[Path]:
    """Remove the directories ``root/<prefix><pid>-*`` whose process no longer runs (a run
    killed outright leaves them); this process's and others' live ones stay. Returns what
    was removed."""
    removed = []
    for path in Path(root).glob(f"{prefix}*-*"):
        pid = path.name.removeprefix(prefix).split("-", 1)[0]
        if not path.is_dir() or not pid.isdigit() or int(pid) == os.getpid() or process_exists(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed
