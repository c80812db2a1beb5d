"""Helpers of the mcp plugin's tests: the test toolbox server (stdio, streamable HTTP,
SSE), the real ``mcp-server-time`` from PyPI, and the server processes still running.
(A module of its own: several test directories of the repository have a conftest.py.)"""

import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

TOOLBOX = Path(__file__).resolve().parent / "servers" / "toolbox.py"


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
