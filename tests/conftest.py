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



@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir):
    """A 3-layer Llama with the default model's tokenizer (real chat template, real ids);
    random weights: it never makes a tool call and answers nothing right."""
    from rlfactory_core.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), default_model_dir)


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory, default_model_dir):
    """A tiny random LLaVA (2-layer Llama + 1-layer CLIP, 4 image tokens per image) with the
    default model's tokenizer and a processor: the image path's mechanics, end to end."""
    from rlfactory_core.testing import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("tiny-vlm"), default_model_dir)
