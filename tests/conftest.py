"""Shared fixtures: the production plugin manager, the CLI runner, the default model."""

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


@pytest.fixture(scope="session")
def default_model_dir():
    """The embedded default model converted to an HF directory (shared cache, converted once)."""
    from rlfactory_core.models import DEFAULT_MODEL, prepare_model

    return prepare_model(DEFAULT_MODEL)

