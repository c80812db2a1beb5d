"""Fixtures: the test toolbox served over streamable HTTP and SSE on localhost."""

import pytest

from mcp_testing import serve


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama with the default model's tokenizer: a run's mechanics in seconds."""
    from rlfactory_core.models import DEFAULT_MODEL, prepare_model
    from rlfactory_core.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), prepare_model(DEFAULT_MODEL))


def _served(mode: str, path: str):
    process, port = serve(mode)
    yield f"http://127.0.0.1:{port}{path}"
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def http_toolbox():
    """The toolbox over streamable HTTP on localhost: its URL."""
    yield from _served("http", "/mcp")


@pytest.fixture(scope="module")
def sse_toolbox():
    """The toolbox over SSE on localhost: its URL."""
    yield from _served("sse", "/sse")
