"""Fingerprints of files, for keys that must change whenever what they name does
(:mod:`rlfactory_core.eval_reuse`; an env's ``data_fingerprint``)."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any, Iterable

__all__ = ["files_fingerprint", "hash_file", "CONTENT_LIMIT"]

#: Files up to this size are fingerprinted by their content; larger ones (a multi-gigabyte
#: database) by their size and modification time, so a key costs milliseconds, not minutes.
CONTENT_LIMIT = 64 << 20


def hash_file(path: str | os.PathLike[str], digest: Any) -> None:
    """Feed ``path``'s bytes to ``digest`` (a hashlib object), a megabyte at a time."""
    with open(path, "rb") as f:
        for block in iter(functools.partial(f.read, 1 << 20), b""):
            digest.update(block)


def files_fingerprint(paths: Iterable[str | os.PathLike[str]]) -> str:
    """A sha256 over ``paths`` (each once, in name order): each file's name and content, or its
    size and modification time when it is larger than :data:`CONTENT_LIMIT`; a missing file
    counts as missing (it changes the fingerprint when it appears)."""
    digest = hashlib.sha256()
    for path in sorted({str(Path(p)) for p in paths}):
        digest.update(Path(path).name.encode() + b"\0")
        try:
            stat = os.stat(path)
        except OSError:
            digest.update(b"missing\0")
            continue
        if stat.st_size > CONTENT_LIMIT:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}\0".encode())
        else:
            hash_file(path, digest)
            digest.update(b"\0")
    return digest.hexdigest()
