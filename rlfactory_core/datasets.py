"""Datasets that plugins build on the user's machine (``rlf data build ENV``), built atomically.

:func:`build_directory` is the whole procedure: nothing to do when ``out_dir`` already holds
a complete build; otherwise the files are written into a temporary directory beside
``out_dir``, flushed to disk and moved into place by renames once complete
(:mod:`rlfactory_core._fs`), so a reader sees the previous build or the new one, and an
interrupted build leaves no half dataset. A directory holding
anything but the dataset's own files is never replaced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from ._fs import fsync_tree, remove_tree, replace_dir, temp_path_beside
from .errors import RLFactoryError

__all__ = ["build_directory"]


def build_directory(out_dir: Path, *, label: str, owned: Iterable[str], is_complete: Callable[[Path], bool],
                    write: Callable[[Path], None], force: bool = False,
                    progress: Callable[[str], None] | None = None) -> Path:
    """Build a dataset into ``out_dir``; returns it.

    :param label: the dataset's name in messages (``"the deepsearch dataset"``).
    :param owned: the top-level names the dataset consists of (files or directories); a
        directory with any other entry is refused.
    :param is_complete: whether a directory holds an intact, current build.
    :param write: writes every file into the staging directory it is given (the marker of
        completeness, e.g. a manifest, last).
    :param force: rebuild even when a complete build is there.
    :param progress: called with one-line messages.
    """
    report = progress or (lambda message: None)
    if not force and is_complete(out_dir):
        report(f"{label} in {out_dir} is complete (force rebuilds it)")
        return out_dir
    _check_replaceable(out_dir, set(owned), label)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staged = temp_path_beside(out_dir, "building")
    staged.mkdir()
    try:
        write(staged)
        if not force and is_complete(out_dir):
            return out_dir  # another process finished the same build meanwhile
        fsync_tree(staged)
        # Readers see the old build or the new one, never a mix.
        replace_dir(staged, out_dir, aside=temp_path_beside(out_dir, "old"))
    finally:
        remove_tree(staged)
    report(f"{label} ready in {out_dir}")
    return out_dir


def _check_replaceable(directory: Path, owned: set[str], label: str) -> None:
    """Refuse to replace a directory that holds anything but a (possibly broken) build."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise RLFactoryError(f"{directory} is a file, not a directory",
                             hint="pass a new or empty directory as the dataset's out_dir")
    foreign = sorted(p.name for p in directory.iterdir() if p.name not in owned)
    if foreign:
        raise RLFactoryError(f"{directory} holds files that are not part of {label} "
                             f"({', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''})",
                             hint="pass a new or empty directory as out_dir; a rebuild replaces the whole directory")
