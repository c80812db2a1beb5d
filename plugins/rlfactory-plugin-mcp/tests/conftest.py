"""Fixtures: the test toolbox served over streamable HTTP and SSE on localhost; each test's
servers log their stderr in its own temporary directory, not the machine's."""

import tempfile

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


@pytest.fixture(autouse=True)
def server_logs_in_the_tests_directory(tmp_path, monkeypatch):
    """The default ``log_dir`` is the temp directory: this test's, so no run leaves logs in /tmp."""
    logs = tmp_path / "server-logs"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
