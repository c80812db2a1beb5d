"""Helpers of the mcp plugin's tests: the test toolbox server (stdio, streamable HTTP,
SSE), the real ``mcp-server-time`` from PyPI, and the server processes still running:
this process's children, or any process on the machine carrying a marker (for servers
started by a subprocess, which are re-parented if it leaves them behind).
(A module of its own: several test directories of the repository have a conftest.py.)"""

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

TOOLBOX = Path(__file__).resolve().parent / "servers" / "toolbox.py"
MARKER_VAR = "RLFACTORY_MCP_TEST_MARKER"


def stdio_toolbox() -> dict:
    return {"command": sys.executable, "args": [str(TOOLBOX), "stdio"]}


def time_server() -> dict:
    return {"command": sys.executable, "args": ["-m", "mcp_server_time"]}


def server_processes() -> list[psutil.Process]:
    """The stdio MCP servers (toolbox or mcp_server_time) this process started and that
    still run; the HTTP and SSE fixture servers are not counted."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            line = child.cmdline()
            ours = line[-2:] == [str(TOOLBOX), "stdio"] or line[-2:] == ["-m", "mcp_server_time"]
            if ours and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:
            continue
    return found


def new_marker() -> str:
    return f"rlf-mcp-test-{uuid.uuid4().hex}"


def marked(server: dict, marker: str, *, outlives_stdin: bool = False) -> dict:
    """A stdio server config whose process (and its children) carry ``marker`` in their
    environment. ``outlives_stdin`` (the toolbox only): the server keeps running after its
    stdin closes, as some servers do, so that only a kill ends it; a server left behind is
    then still there to be found, however late one looks."""
    env = {**server.get("env", {}), MARKER_VAR: marker}
    if outlives_stdin:
        env["TOOLBOX_OUTLIVE_STDIN"] = "1"
    return {**server, "env": env}


def marked_processes(marker: str) -> list[psutil.Process]:
    """Every process on the machine (zombies aside) whose environment carries ``marker``."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARKER_VAR) == marker and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def assert_none_left(marker: str) -> None:
    """Fail, naming them, if processes carrying ``marker`` still run; kill them first so
    that a failing test leaves nothing behind."""
    left = marked_processes(marker)
    described = []
    for process in left:
        try:
            described.append(f"{process.pid} (parent {process.ppid()}): {' '.join(process.cmdline())}")
            process.kill()
        except psutil.Error:
            continue
    assert not described, f"server processes left behind: {described}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve(mode: str):
    """Start the toolbox over ``mode`` (http or sse) on a free port; wait until it listens."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, str(TOOLBOX), mode, str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the toolbox {mode} server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.1)
    else:
        process.kill()
        raise RuntimeError(f"the toolbox {mode} server did not listen on port {port}")
    return process, port
