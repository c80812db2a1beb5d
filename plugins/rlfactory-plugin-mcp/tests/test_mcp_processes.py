"""Server processes of a process that holds live stdio sessions and is killed: they are
found on the whole machine by a marker in their environment (they are re-parented once
their parent is gone, so a search among this process's children would not see them)."""

import asyncio
import json
import signal
import subprocess
import sys
import time

from mcp_testing import marked, marked_processes, new_marker, stdio_toolbox
from rlfactory_mcp import load_mcp_tools, parse_mcp_config

# Loads the tools of the config given as argv[1] (their stderr logs in argv[2]), opens a session
# with every server (a call of each server's echo), says "ready", and waits to be killed.
HOLDER = """
import asyncio, json, sys
from rlfactory_mcp import load_mcp_tools, parse_mcp_config

tools = load_mcp_tools(parse_mcp_config(json.loads(sys.argv[1])), log_dir=sys.argv[2])

async def main():
    results = await asyncio.gather(*(t.call({"text": "hi"}) for t in tools.tools if t.name.endswith("echo")))
    assert len(results) == len(tools.pools) and all(r.content == "hi" for r in results), results
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def wait_for_none(marker: str, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_a_killed_process_leaves_only_servers_that_outlive_their_stdin(tmp_path):
    """SIGTERM ends a plain Python process at once, without closing anything. Its stdio
    servers see their stdin close: one that exits then (the toolbox, like most servers)
    is gone; one that does not (``outlives_stdin``) stays, re-parented, and only its marker
    finds it: what the orphan checks of the end-to-end tests look for. (A known limit: the
    SDK ends such servers on a clean close, which a killed process never reaches.)"""
    plain, lasting = new_marker(), new_marker()
    servers = {"box": marked(stdio_toolbox(), plain), "lasting": marked(stdio_toolbox(), lasting, outlives_stdin=True)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps({"mcpServers": servers}), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline()
        assert line.strip() == "ready", holder.communicate(timeout=30)[1][-2000:]
        assert [p.ppid() for p in marked_processes(plain) + marked_processes(lasting)] == [holder.pid] * 2
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(10) == -signal.SIGTERM
        assert wait_for_none(plain, 10) == []
        [left] = marked_processes(lasting)
        assert left.ppid() != holder.pid and left.is_running()
    finally:
        holder.kill()
        for process in marked_processes(lasting):
            process.kill()
    assert wait_for_none(lasting, 10) == []


def test_a_clean_close_ends_even_a_server_that_outlives_its_stdin():
    """The SDK closes stdin, waits 2 s, then terminates the server's process group: the
    end-to-end tests' servers, which outlive their stdin, are ended by a clean close."""
    marker = new_marker()
    tools = load_mcp_tools(parse_mcp_config({"mcpServers": {"box": marked(stdio_toolbox(), marker,
                                                                             outlives_stdin=True)}}))

    async def call_and_close():
        try:
            echo = next(t for t in tools.tools if t.name == "echo")
            assert (await echo.call({"text": "x"})).content == "x"
            assert len(marked_processes(marker)) == 1
        finally:
            await tools.close()

    asyncio.run(call_and_close())
    assert marked_processes(marker) == []
