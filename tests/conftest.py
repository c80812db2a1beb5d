"""Shared fixtures of the core tests: the production plugin manager, the CLI runner. The model
fixtures (default_model_dir, tiny_model_dir, tiny_vlm_dir) live in the root conftest.py,
shared with the plugins' tests."""

from __future__ import annotations

import pytest

from rlfactory_core import plugins


@pytest.fixture
def plugin_manager(monkeypatch):
    """The real plugin manager, freshly loaded; test plugins registered on it are dropped after.

    Register a test plugin with ``plugin_manager.register(obj, name="...")``; registries are
    rebuilt on next use because the state is reset before and after the test.
    """
    monkeypatch.delenv(plugins.STRICT_ENV, raising=False)
    plugins.reset_plugins()
    yield plugins.get_plugin_manager()
    plugins.reset_plugins()


@pytest.fixture
def rlf(capsys):
    """Run the CLI in-process: ``rlf("plugins", "list")`` -> (exit code, stdout, stderr)."""
    from rlfactory_cli.app import run

    def _run(*args: str):
        plugins.reset_plugins()
        code = run(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium (tests/browser.py), one per test module: a start takes 0.4-1 s on 2
    cores, so a module's tests share it (and its cookies and storage). Missing, it fails."""
    from browser import chromium

    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


@pytest.fixture(scope="session")
def ui_runs_dir(tmp_path_factory, tiny_model_dir):
    """A runs directory for the `rlf ui` tests (tests/ui_runs.py): a real short training run
    and runs made before records, damaged and killed. Shared: copy it before changing it."""
    from ui_runs import make_runs

    return make_runs(tmp_path_factory.mktemp("ui"), tiny_model_dir)
