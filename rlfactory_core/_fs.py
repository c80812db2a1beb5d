"""Crash-safe writes: one file replaced whole, one directory published by rename.

A private helper of the core (checkpoints, the embedded-model conversion, metrics, datasets),
not part of the plugin API. Two rules make a write survive a crash or a kill at any moment:

* the new content is written under a temporary name **next to** the target (a rename is only
  atomic within one filesystem), flushed to disk, and renamed over the target: a reader sees
  the old content or the new, whole;
* the files are fsynced before the rename and the parent directory after it: without the
  first a crash can publish a name whose data never reached the disk; without the second the
  rename itself may be lost.

A directory cannot be replaced by one rename, so :func:`replace_dir` moves the old one aside
first; the caller names the aside path, because only the caller knows how to recover from a
crash between the two renames (checkpoints put ``.old-step-...`` back; a model conversion
starts again).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

__all__ = ["write_text_atomic", "fsync_dir", "fsync_tree", "temp_path_beside", "replace_dir",
           "remove_tree"]


def write_text_atomic(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``text`` so that a crash leaves the old file or the new, whole.

    The temporary file has a unique name (``.NAME.XXXX.tmp``), so one left by a killed
    writer never stands in the way of the next write, and it is removed when the write
    fails in this process (KeyboardInterrupt included).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make the entries of ``directory`` (a rename into it) durable.

    Errors are ignored: some filesystems and platforms cannot fsync a directory, and
    there the rename is as durable as they make it.
    """
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(directory: str | os.PathLike[str]) -> None:
    """Flush every file under ``directory`` (recursively) and every directory in it to disk,
    before a rename publishes it."""
    root = Path(directory)
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for path in [root, *(p for p in sorted(root.rglob("*")) if p.is_dir() and not p.is_symlink())]:
        fsync_dir(path)


def temp_path_beside(target: str | os.PathLike[str], tag: str) -> Path:
    """A fresh hidden name next to ``target``: ``.NAME.TAG-PID-XXXXXXXX``.

    Hidden, so listings of the parent skip it; the pid and random part keep two processes
    (or a leftover of a killed one) from colliding; ``.NAME.TAG-*`` finds the leftovers.
    Nothing is created.
    """
    target = Path(target)
    return target.parent / f".{target.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def replace_dir(staged: str | os.PathLike[str], target: str | os.PathLike[str], *,
                aside: str | os.PathLike[str]) -> None:
    """Publish the complete directory ``staged`` as ``target`` by renames (same filesystem).

    When ``target`` exists (and is not an empty directory) it is renamed to ``aside`` first,
    ``staged`` takes its place and the old copy is then removed: a complete copy exists
    under one of the two names at every moment. If the second rename fails the old copy is
    put back and the error raised. The parent directory is fsynced last. ``staged`` should
    already be on disk (:func:`fsync_tree`).
    """
    staged, target, aside = Path(staged), Path(target), Path(aside)
    try:
        # Succeeds when the target is absent (or an empty directory), also when another
        # process removed it since the caller looked.
        os.replace(staged, target)
    except OSError:
        if not (target.exists() or target.is_symlink()):
            raise
        remove_tree(aside)
        os.replace(target, aside)
        try:
            os.replace(staged, target)
        except BaseException:
            if not (target.exists() or target.is_symlink()):
                os.replace(aside, target)
            raise
        remove_tree(aside)
    fsync_dir(target.parent)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a directory tree, a file or a symlink (not what it points to) if it is there;
    errors are ignored (what cannot be removed is a leftover, never a failure)."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        with contextlib.suppress(OSError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)
