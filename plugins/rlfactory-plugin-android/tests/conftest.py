"""Fixtures of the android plugin's tests: ``fake``, the FAKE adb (``fake_adb.py``: there is
no Android device on CI) as an executable, with what it was asked."""

from __future__ import annotations

import shlex
import sys

import pytest

from android_testing import HERE, FakeAdb


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeAdb:
    log = tmp_path / "adb.log"
    wrapper = tmp_path / "adb"
    # exec: the fake replaces the shell, so a timeout's kill reaches it
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(HERE / "fake_adb.py"))} "$@"\n')
    wrapper.chmod(0o755)
    for name in ("FAKE_ADB_DUMP", "FAKE_ADB_DEAD", "FAKE_ADB_HANG", "FAKE_ADB_BAD_PNG", "FAKE_ADB_NO_CONTACTS",
                 "FAKE_ADB_NO_DEVICES", "FAKE_ADB_PROVIDER_ERROR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_ADB_LOG", str(log))
    return FakeAdb(wrapper, log)
