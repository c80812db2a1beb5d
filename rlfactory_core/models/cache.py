"""Preparing a directory of ``$RLFACTORY_HOME`` once: under a lock, into a temporary directory,
published by rename only when complete.

The embedded model (:mod:`.embedded`) and the offline tokenizers (:mod:`.tokenizer_sources`)
are built this way, so an interruption or two processes preparing at once never leave a
half-written directory: a killed run leaves only a hidden temporary directory, which the next
run removes; one waiting for another's lock finds the finished directory and returns it.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Callable, Iterator

from .._fs import fsync_tree, remove_tree, replace_dir, temp_path_beside
from ..errors import ModelError, one_line

__all__ = ["HOME_ENV", "Progress", "prepare_once"]

#: The environment variable that moves the cache (:func:`~rlfactory_core.models.rlfactory_home`).
HOME_ENV = "RLFACTORY_HOME"

Progress = Callable[[str], None]

log = logging.getLogger("rlfactory.models")


@contextlib.contextmanager
def _locked(lock_path: Path, progress: Progress) -> Iterator[None]:
    """An exclusive lock between processes, released when the process dies.

    ``flock`` on a file rather than "the lock file exists": a file left by a killed run
    would block the next one forever, while the kernel drops an ``flock`` with its process.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX (Windows): no cross-process guard
        yield
        return
    try:
        fh = open(lock_path, "a+b")
    except OSError as exc:
        raise ModelError(f"cannot write to the cache {lock_path.parent}: {exc.strerror or exc}",
                         hint=f"set {HOME_ENV} to a writable directory") from exc
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another process to finish preparing (lock {lock_path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError as exc:  # e.g. some network filesystems: prepare unguarded
            log.warning("cannot lock %s (%s); preparing without a lock", lock_path, exc)
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_leftovers(parent: Path, name: str) -> None:
    """Remove temporary directories of ``name`` left by killed runs (call under the lock)."""
    for pattern in (f".{name}.partial-*", f".{name}.old-*"):  # temp_path_beside's names
        for leftover in parent.glob(pattern):
            remove_tree(leftover)


def prepare_once(target: Path, *, is_complete: Callable[[Path], bool], build: Callable[[Path], None],
                 what: str, progress: Progress, force: bool = False) -> Path:
    """Make ``target`` a complete directory, building it with ``build(temporary_dir)`` unless
    ``is_complete(target)`` (checked again under the lock) and not ``force``.

    ``what`` names the work in messages ("converting embedded model 'x'"). A failure of
    ``build`` is one :class:`ModelError` line; nothing it wrote is kept. A target there that
    is incomplete (or forced) is replaced only once the new one is complete.
    """
    if not force and is_complete(target):
        return target
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create the cache {parent}: {exc.strerror or exc}",
                         hint=f"set {HOME_ENV} to a writable directory") from exc
    with _locked(parent / f".{target.name}.lock", progress):
        if not force and is_complete(target):  # another process finished while we waited
            return target
        _remove_leftovers(parent, target.name)
        tmp = temp_path_beside(target, "partial")
        tmp.mkdir()
        try:
            build(tmp)
            fsync_tree(tmp)
        except BaseException as exc:  # KeyboardInterrupt too: never leave a half-written dir
            remove_tree(tmp)
            if isinstance(exc, ModelError) or not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit ... stay what they are
            raise ModelError(f"{what} failed: {one_line(exc)}",
                             hint="nothing was kept, so running it again starts from scratch; "
                             "RLFACTORY_DEBUG=1 shows the traceback") from exc
        # A crash between replace_dir's two renames leaves no target, which the next run
        # treats as "not prepared" (and _remove_leftovers clears the aside copy).
        replace_dir(tmp, target, aside=temp_path_beside(target, "old"))
    return target
