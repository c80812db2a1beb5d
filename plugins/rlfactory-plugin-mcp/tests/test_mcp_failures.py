"""Failures told the way a user can act on them: a server that cannot start is one line
with the cause first (then its stderr and command), and a server that fails under many
calls is one line per event (its restart), with the number of calls it affected (a hung
server: test_mcp_tools.py)."""

import asyncio
import http.server
import logging
import sys
import threading

import pytest

from mcp_testing import TOOLBOX, _free_port, marked, marked_processes, new_marker, server_processes, stdio_toolbox
from rlfactory_mcp import MCPServerError, load_mcp_tools, parse_mcp_config


def toolset(config: dict, **kwargs):
    return load_mcp_tools(parse_mcp_config({"mcpServers": config}), **kwargs)


def python(script: str) -> dict:
    return {"command": sys.executable, "args": ["-c", script]}


def startup_error(name: str, server: dict, tmp_path) -> str:
    """The message of the error that starting ``server`` raises. connect_timeout_s is long:
    each failure must be recognised as it happens, not by waiting for the timeout."""
    with pytest.raises(MCPServerError) as info:
        toolset({name: server}, log_dir=tmp_path, servers={"*": {"connect_timeout_s": 120}})
    message = str(info.value)
    assert "\n" not in message and "ExceptionGroup" not in message and "TaskGroup" not in message, message
    assert message.startswith(f"MCP server '{name}' could not be started: ") or message.startswith(
        f"MCP server {name} ("), message
    return message


def test_a_server_that_exits_at_once_is_named_with_the_end_of_its_stderr(tmp_path):
    message = startup_error("broken", python(
        "import sys; print('loading config', file=sys.stderr); print('boom: no API key', file=sys.stderr); "
        "sys.exit(3)"), tmp_path)
    cause = "could not be started: it exited (or closed its stdout) during the MCP handshake; "
    assert cause + "its stderr ends with: loading config | boom: no API key (command: " in message
    assert f"(command: {sys.executable} -c 'import sys; print(" in message
    assert f"stderr log: {tmp_path}/mcp-broken-" in message


def test_a_server_that_dies_during_the_handshake_is_named_with_its_stderr(tmp_path):
    # reads the initialize request, then fails
    message = startup_error("dies", python(
        "import sys; sys.stdin.readline(); print('crashed while initializing', file=sys.stderr); sys.exit(1)"),
        tmp_path)
    assert "during the MCP handshake; its stderr ends with: crashed while initializing (command: " in message


def test_a_command_that_is_not_found_is_named(tmp_path):
    message = startup_error("missing", {"command": "/no/such/mcp-server", "args": ["--port", "1"]}, tmp_path)
    assert message == ("MCP server 'missing' could not be started: command not found: '/no/such/mcp-server' "
                       "(install the server, or give the command's full path)")


def test_a_program_that_is_not_an_mcp_server_is_named_with_what_it_wrote(tmp_path, caplog):
    """It prints on stdout and waits: the handshake ends a few seconds after the first line
    that is not JSON-RPC (not after connect_timeout_s), the MCP SDK's traceback per line is
    not logged, and the process is stopped."""
    marker = new_marker()
    server = marked(python("import time\nfor _ in range(5): print('Hello! Serving on port 8080', flush=True)\n"
                           "time.sleep(600)"), marker)
    with caplog.at_level(logging.DEBUG):
        message = startup_error("chatty", server, tmp_path)
    assert ("could not be started: it wrote 'Hello! Serving on port 8080' on stdout, which is not a JSON-RPC "
            "message, and did not complete the MCP handshake: it is not an MCP server, or it prints to stdout") in message
    assert "its stderr is empty (command: " in message and "-c 'import time\\nfor _ in range(5)" in message
    assert "stderr log" not in message and not list(tmp_path.glob("mcp-chatty-*"))  # an empty log is not kept
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert marked_processes(marker) == []


class _NotMCP(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(404)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def not_mcp_url():
    """An HTTP server on localhost that answers every request with 404."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotMCP)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
def test_http_servers_that_refuse_or_do_not_speak_mcp_are_named_with_their_url(tmp_path, not_mcp_url, transport):
    path = "/sse" if transport == "sse" else "/mcp"
    nobody = f"http://127.0.0.1:{_free_port()}{path}"
    message = startup_error("web", {"url": nobody, "transport": transport}, tmp_path)
    assert message.startswith(f"MCP server web ({transport} {nobody}) could not be started: nothing answers at "
                              f"{nobody} (ConnectError: "), message
    message = startup_error("web", {"url": not_mcp_url + path, "transport": transport}, tmp_path)
    refusal = ("answered HTTP 404, not MCP (HTTPStatusError: " if transport == "sse"
               else "refused the MCP handshake (MCPError: Not Found)")
    assert f"could not be started: {not_mcp_url}{path} {refusal}" in message, message


def test_a_server_that_cannot_start_stops_rlf_train_with_one_error_line(capsys, tmp_path):
    """What a user of ``rlf train --env mcp`` sees: one error line (and at most a hint),
    nothing before it, and nothing written."""
    from rlfactory_cli.app import run
    from rlfactory_core.testing import reset_plugins

    config = tmp_path / "servers.json"
    config.write_text('{"mcpServers": {"broken": {"command": "%s", "args": ["-c", '
                      '"import sys; sys.exit(\'boom: no API key\')"]}}}' % sys.executable)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "What time is it?", "answer": "noon"}\n')
    reset_plugins()
    code = run(["train", "--env", "mcp", "--run-dir", str(tmp_path / "run"), f"env_options.mcp_config={config}",
                f"env_options.data={tasks}", f"env_options.test_data={tasks}", f"env_options.log_dir={tmp_path}"])
    out, err = capsys.readouterr()
    assert code == 1
    lines = (out + err).strip().splitlines()
    assert len(lines) <= 2 and lines[0].startswith("Error: MCP server 'broken' could not be started: it exited"), lines
    assert "its stderr ends with: boom: no API key (command: " in lines[0]
    assert not (tmp_path / "run").exists()


async def test_a_server_killed_with_40_calls_in_flight_is_one_warning_with_the_count(caplog):
    """The issue's case: all 40 calls see the connection close; one line says it, with the
    count, and the one restart serves every retry."""
    tools = toolset({"box": stdio_toolbox()})
    slow = next(tool for tool in tools.tools if tool.name == "slow")
    try:
        await slow.call({"seconds": 0})  # the session is open: the calls below all go out on it
        session = tools.pools["box"]._slots[0]
        with caplog.at_level(logging.INFO):
            calls = [asyncio.create_task(slow.call({"seconds": 1})) for _ in range(40)]
            while session.in_flight < 40:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # the requests reach the server
            [process] = server_processes()
            process.kill()
            results = await asyncio.gather(*calls)
        assert [r.content for r in results] == ["slept 1.0"] * 40 and tools.restarts == 1
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith("MCP server box (")
        assert warnings[0].endswith("lost its connection (MCPError: Connection closed), with 40 calls in flight: "
                                    "restarting it, and retrying them once")
    finally:
        await tools.close()
    assert server_processes() == [], [p.cmdline() for p in server_processes()]




async def test_a_server_that_prints_a_banner_on_stdout_works_with_one_warning_per_start(caplog):
    """A line on stdout before the handshake (printed before the MCP SDK takes over stdout)
    is not fatal when the handshake follows: one warning line, not the MCP SDK's traceback,
    and the server serves its calls."""
    banner = ("import runpy, sys; print('Toolbox v1.0 starting', flush=True); "
              f"sys.argv = [{str(TOOLBOX)!r}, 'stdio']; runpy.run_path(sys.argv[0], run_name='__main__')")
    with caplog.at_level(logging.INFO):
        tools = toolset({"box": python(banner)})
        echo = next(tool for tool in tools.tools if tool.name == "echo")
        try:
            assert (await echo.call({"text": "hi"})).content == "hi" and tools.restarts == 0
        finally:
            await tools.close()
    # one line per server process: the one that listed the tools, and the one for the call
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings
    assert all(w.endswith("wrote a line on stdout that is not a JSON-RPC message (ignored; later ones are not "
                          "shown): 'Toolbox v1.0 starting'") for w in warnings), warnings
