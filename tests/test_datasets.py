"""rlfactory_core.datasets.build_directory: atomic dataset builds."""

import pytest

from rlfactory_core.datasets import build_directory
from rlfactory_core.errors import RLFactoryError


def complete(directory):
    return (directory / "done").is_file()


def writer(text):
    def write(staged):
        (staged / "data.txt").write_text(text)
        (staged / "done").write_text("")  # the marker last
    return write


def test_builds_skips_a_complete_build_and_rebuilds_when_forced(tmp_path):
    out = tmp_path / "ds"
    messages = []
    assert build_directory(out, label="the test dataset", owned=["data.txt", "done"], is_complete=complete,
                           write=writer("v1"), progress=messages.append) == out
    assert (out / "data.txt").read_text() == "v1" and messages == [f"the test dataset ready in {out}"]
    build_directory(out, label="the test dataset", owned=["data.txt", "done"], is_complete=complete,
                    write=writer("v2"))
    assert (out / "data.txt").read_text() == "v1"  # complete: nothing to do
    build_directory(out, label="the test dataset", owned=["data.txt", "done"], is_complete=complete,
                    write=writer("v2"), force=True)
    assert (out / "data.txt").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no staging left behind


def test_a_failed_build_keeps_the_previous_one_and_foreign_directories_are_refused(tmp_path):
    out = tmp_path / "ds"
    build_directory(out, label="the test dataset", owned=["data.txt", "done"], is_complete=complete,
                    write=writer("v1"))

    def broken(staged):
        (staged / "data.txt").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_directory(out, label="the test dataset", owned=["data.txt", "done"], is_complete=complete,
                        write=broken, force=True)
    assert (out / "data.txt").read_text() == "v1" and sorted(p.name for p in tmp_path.iterdir()) == ["ds"]

    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    with pytest.raises(RLFactoryError, match="holds files that are not part of the test dataset \\(notes.txt\\)"):
        build_directory(home, label="the test dataset", owned=["data.txt", "done"], is_complete=complete,
                        write=writer("v1"))
    assert (home / "notes.txt").read_text() == "mine"
