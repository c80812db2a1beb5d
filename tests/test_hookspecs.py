"""Docs and tests keep up with the hooks: PLUGINS.md is generated, every hook is documented,
and the hook-call recorder behind the root conftest.py's session check (every hook is
called by some test, through the real plugin manager) catches a hook never called."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pluggy
import pytest

from rlfactory_core import hookimpl, hookspecs, plugins
from rlfactory_core.testing import HookCallRecorder, registered_plugin

ROOT = Path(__file__).resolve().parent.parent
HOOKS = sorted(name for name, fn in vars(hookspecs).items() if name.startswith("rlfactory_") and inspect.isfunction(fn))


def test_plugins_md_is_up_to_date():
    result = subprocess.run([sys.executable, "scripts/generate_plugins_md.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_fully_documented(hook):
    fn = getattr(hookspecs, hook)
    doc = inspect.getdoc(fn) or ""
    for param in inspect.signature(fn).parameters:
        assert f":param {param}:" in doc, f"{hook}: parameter {param!r} is not documented"
    assert ":return:" in doc, f"{hook}: the return value is not documented"
    assert "Calling convention:" in doc, f"{hook}: the calling convention is not documented"
    assert re.search(r"Added in \d+\.\d+", doc), f"{hook}: the version it was added in is missing"
    plugins_md = (ROOT / "PLUGINS.md").read_text()
    assert f"### `{hook}`" in plugins_md


class FakeSpecs:
    """Two hooks of a throwaway project: the recorder must tell the called one from the other."""

    @pluggy.HookspecMarker("rlf_fake")
    def fake_called(self, value):
        """Called by the test."""

    @pluggy.HookspecMarker("rlf_fake")
    def fake_forgotten(self, value):
        """Never called."""

    @pluggy.HookspecMarker("rlf_fake")
    def fake_unimplemented(self, value):
        """Called, but no plugin implements it."""


class FakePlugin:
    @pluggy.HookimplMarker("rlf_fake")
    def fake_called(self, value):
        return value

    @pluggy.HookimplMarker("rlf_fake")
    def fake_forgotten(self, value):
        return value


def test_the_recorder_names_a_hook_that_was_never_called():
    pm = pluggy.PluginManager("rlf_fake")
    pm.add_hookspecs(FakeSpecs)
    pm.register(FakePlugin())
    recorder = HookCallRecorder()
    stop = recorder.watch(pm)
    assert pm.hook.fake_called(value=1) == [1]
    pm.hook.fake_unimplemented(value=1)  # reached no implementation: proves nothing
    assert recorder.never_called(FakeSpecs, "rlf_fake") == ["fake_forgotten", "fake_unimplemented"]
    stop()
    pm.hook.fake_forgotten(value=1)  # after stop(): not recorded
    assert recorder.never_called(FakeSpecs, "rlf_fake") == ["fake_forgotten", "fake_unimplemented"]
    with pytest.raises(ValueError, match="declares no hookspec of project 'rlfactory'"):
        recorder.never_called(FakeSpecs)


class TrainStartObserver:
    @hookimpl
    def rlfactory_on_train_start(self, config):
        self.config = config


def test_the_recorder_sees_hooks_the_core_calls_on_every_plugin_manager():
    """The core calls each plugin's implementation alone (isolation), through pluggy: the
    recorder installed by start() sees those calls on managers built after it started."""
    recorder = HookCallRecorder()
    stop = recorder.start()
    try:
        observer = TrainStartObserver()
        with registered_plugin(observer, name="train-start-observer"):  # a fresh plugin manager
            plugins.notify("rlfactory_on_train_start", config="the config")
    finally:
        stop()
    assert observer.config == "the config"
    assert "rlfactory_on_train_start" in recorder.called
    assert "rlfactory_on_train_end" in recorder.never_called()


def test_a_session_that_calls_no_hook_fails_naming_them():
    """The root conftest.py's session check, forced on a one-test run that calls no hook:
    the test passes, the session fails and names every hook."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_hookspecs.py::test_hook_is_fully_documented[rlfactory_on_train_end]"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "RLFACTORY_HOOK_COVERAGE": "1"})
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout
    for hook in HOOKS:
        assert f"{hook}: no test called it" in result.stdout


def test_importing_the_core_stays_light():
    code = ("import sys, rlfactory_core, rlfactory_core.plugins, rlfactory_core.models; "
            "rlfactory_core.plugins.plugin_infos(); "
            "print(sorted(m for m in ('torch', 'vllm', 'ray', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
