"""Whether a process lives: a private helper of the core (run status, the vLLM weight staging
directories of finished processes), not part of the plugin API."""

from __future__ import annotations

import os

__all__ = ["process_exists"]


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
