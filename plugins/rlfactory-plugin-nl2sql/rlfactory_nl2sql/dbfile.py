"""Which file a sandbox connection opens for a database, so that reading it creates no file
beside it and sees every committed row.

A database in rollback-journal mode (the default, and Spider's and BIRD's files) opens with
``mode=ro``: SQLite reads it without a journal and without writing anything.

A database in WAL mode (``PRAGMA journal_mode=WAL``, recorded in its header) is different:
even a read-only connection creates the ``-wal`` and ``-shm`` files beside it, and
committed rows may live in the ``-wal`` file until a checkpoint copies them into the
database file. ``immutable=1`` alone stops the file creation but reads the database file
only, so it would miss those rows: a wrong answer, silently. So:

* no ``-wal`` file, or an empty one: every committed row is in the database file, which is
  opened with ``mode=ro&immutable=1`` (no lock, no ``-shm``);
* a ``-wal`` file with frames: the database and its ``-wal`` are copied into a private
  temporary directory, the copy is checkpointed there (its rows are all in one file) and
  the copy is what the queries read. The copy is kept while the two files stay unchanged
  (their size, modification time and inode), so it is made once per version of the
  database; a few are kept, the oldest removed, all of them when the process exits.

The sandbox reads datasets: a database that a writer changes while it is queried gives the
state of some recent commit, and a copy that changed under the copying is retried, then
refused with a message saying so.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import sqlite3
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from .sqltext import QueryError

__all__ = ["database_uri", "is_wal"]

_HEADER = b"SQLite format 3\x00"
_COPIES_KEPT = 16
_COPY_TRIES = 3
_copies: OrderedDict[str, Path] = OrderedDict()
_lock = threading.Lock()
_root: Path | None = None


def is_wal(path: Path) -> bool:
    """Whether the database file at ``path`` is in WAL mode (its header's read and write
    versions, bytes 18 and 19, are 2)."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(20)
    except OSError:
        return False
    return len(header) == 20 and header.startswith(_HEADER) and 2 in (header[18], header[19])


def _stat_key(path: Path) -> tuple[int, int, int]:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return (0, 0, 0)
    return (stat.st_size, stat.st_mtime_ns, stat.st_ino)


def database_uri(path: Path) -> tuple[str, str]:
    """``(uri, version)`` for the database file ``path``: the ``file:`` URI a read-only
    connection opens, and a text that changes when what it reads changes (the schema cache's
    key). Raises :class:`QueryError` (``no_database``) when a WAL copy cannot be made."""
    path = path.resolve()
    stat = path.stat()
    plain = f"{path.resolve().as_uri()}?mode=ro"
    if not is_wal(path):
        return plain, f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    wal = Path(f"{path}-wal")
    wal_key = _stat_key(wal)
    if wal_key[0] == 0:
        return f"{plain}&immutable=1", f"{path}:{stat.st_size}:{stat.st_mtime_ns}:wal-empty"
    copy = _checkpointed_copy(path, wal)
    return f"{copy.as_uri()}?mode=ro&immutable=1", str(copy)


def _copy_dir() -> Path:
    global _root
    if _root is None or not _root.is_dir():
        _root = Path(tempfile.mkdtemp(prefix="rlfactory-nl2sql-wal-"))
        atexit.register(shutil.rmtree, _root, True)
    return _root


def _checkpointed_copy(path: Path, wal: Path) -> Path:
    """A private copy of ``path`` with the committed frames of ``wal`` checkpointed into it."""
    with _lock:  # one copy at a time: concurrent queries on a new version wait for the same copy
        for _ in range(_COPY_TRIES):
            version = (_stat_key(path), _stat_key(wal))
            name = hashlib.sha256(f"{path}\0{version}".encode()).hexdigest()[:24]
            if name in _copies and _copies[name].is_file():
                _copies.move_to_end(name)
                return _copies[name]
            copy = _copy_dir() / f"{name}.sqlite"
            shutil.copyfile(path, copy)
            shutil.copyfile(wal, f"{copy}-wal")
            if (_stat_key(path), _stat_key(wal)) != version:  # written while copied: the two may not match
                _remove(copy)
                continue
            try:
                conn = sqlite3.connect(copy, isolation_level=None)
                try:
                    # leaving WAL mode checkpoints every committed frame into the copy's file
                    conn.execute("PRAGMA journal_mode=DELETE")
                finally:
                    conn.close()
            except sqlite3.Error as exc:
                _remove(copy)
                raise QueryError("no_database", f"the WAL-mode database {path} cannot be read with its -wal file: "
                                                f"{exc}") from None
            _copies[name] = copy
            while len(_copies) > _COPIES_KEPT:
                _remove(_copies.popitem(last=False)[1])
            return copy
    raise QueryError("no_database", f"the WAL-mode database {path} changed every time it was copied (a writer is "
                                    "busy on it); query it when the writes are done")


def _remove(copy: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.unlink(f"{copy}{suffix}")
        except FileNotFoundError:
            pass
