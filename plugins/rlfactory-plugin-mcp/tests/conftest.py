"""Fixtures: the test toolbox served over streamable HTTP and SSE on localhost."""

import pytest

from mcp_testing import serve


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
