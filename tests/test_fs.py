"""rlfactory_core._fs: crash-safe writes, killed for real (SIGKILL) at the worst moment.

The child process replaces ``os.replace`` with a SIGKILL of itself, so it dies with the new
content complete on disk under its temporary name and the rename not yet done: what a
power cut or ``kill -9`` at that instant leaves.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlfactory_core._fs import replace_dir, temp_path_beside, write_text_atomic

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")


def killed_before_rename(code: str) -> None:
    """Run ``code`` in a child whose first ``os.replace`` kills it instead of renaming."""
    prelude = "import os, signal\nos.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_a_write_killed_before_its_rename_keeps_the_old_file_and_the_next_write_works(tmp_path):
    path = tmp_path / "latest"
    write_text_atomic(path, "step-000001\n")

    killed_before_rename(f"""
        from rlfactory_core._fs import write_text_atomic
        write_text_atomic({str(path)!r}, "step-000002\\n")
    """)
    assert path.read_text() == "step-000001\n"
    leftovers = [p for p in tmp_path.iterdir() if p != path]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".latest.")
    assert leftovers[0].read_text() == "step-000002\n"  # written whole, never published

    write_text_atomic(path, "step-000003\n")
    assert path.read_text() == "step-000003\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["latest", leftovers[0].name])


def test_a_failed_write_removes_its_temporary_file(tmp_path):
    path = tmp_path / "missing-dir" / "file.txt"
    with pytest.raises(FileNotFoundError):
        write_text_atomic(path, "x")
    (tmp_path / "out.txt").write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(tmp_path / "out.txt", "\udcff")  # a lone surrogate cannot be encoded
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"] and (tmp_path / "out.txt").read_text() == "old"


def build(directory: Path, text: str) -> Path:
    directory.mkdir()
    (directory / "data.txt").write_text(text)
    (directory / "sub").mkdir()
    (directory / "sub" / "more.txt").write_text(text)
    return directory


def test_replace_dir_publishes_a_new_directory_and_replaces_an_old_one(tmp_path):
    target = tmp_path / "ds"
    replace_dir(build(temp_path_beside(target, "building"), "v1"), target, aside=temp_path_beside(target, "old"))
    assert (target / "data.txt").read_text() == "v1"
    replace_dir(build(temp_path_beside(target, "building"), "v2"), target, aside=temp_path_beside(target, "old"))
    assert (target / "sub" / "more.txt").read_text() == "v2"
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]  # neither the staging nor the old copy is left


def test_a_directory_swap_killed_before_its_rename_keeps_the_old_directory(tmp_path):
    target = tmp_path / "ds"
    build(target, "v1")
    staged = build(temp_path_beside(target, "building"), "v2")
    aside = tmp_path / ".ds.old"

    killed_before_rename(f"""
        from rlfactory_core._fs import replace_dir
        replace_dir({str(staged)!r}, {str(target)!r}, aside={str(aside)!r})
    """)
    assert (target / "data.txt").read_text() == "v1" and not aside.exists()
    # The staged copy of a killed writer is a leftover; the next swap goes through.
    replace_dir(build(temp_path_beside(target, "building"), "v3"), target, aside=aside)
    assert (target / "data.txt").read_text() == "v3" and not aside.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ds", staged.name])


def test_temp_names_are_hidden_unique_and_next_to_the_target(tmp_path):
    target = tmp_path / "models" / "smollm2"
    first, second = temp_path_beside(target, "partial"), temp_path_beside(target, "partial")
    assert first != second and first.parent == second.parent == target.parent
    assert first.name.startswith(".smollm2.partial-") and not first.exists()
