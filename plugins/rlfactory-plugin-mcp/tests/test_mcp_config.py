"""MCP config files: the standard mcpServers JSON and RL-Factory's mcp_tools.pydata."""

import json

import pytest

from rlfactory_core import ConfigError
from rlfactory_mcp import ServerSpec, load_mcp_config, parse_mcp_config


def test_the_standard_file_with_stdio_streamable_http_and_sse_servers(tmp_path):
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {
        "time": {"command": "python", "args": ["-m", "mcp_server_time", 3], "env": {"TZ": "UTC"}},
        "search": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer k"}},
        "legacy": {"url": "http://127.0.0.1:9000/sse"},
        "named": {"url": "http://127.0.0.1:9000/events", "transport": "sse"},
        "typed": {"url": "https://example.org/mcp", "type": "streamable_http"},
        "off": {"command": "nothing", "disabled": True},
    }}))
    servers = load_mcp_config(path)
    assert list(servers) == ["time", "search", "legacy", "named", "typed"]  # disabled servers are left out
    assert servers["time"] == ServerSpec(name="time", transport="stdio", command="python",
                                         args=("-m", "mcp_server_time", "3"), env={"TZ": "UTC"})
    assert (servers["search"].transport, servers["search"].headers) == ("streamable-http", {"Authorization": "Bearer k"})
    assert servers["legacy"].transport == "sse"  # the URL names an SSE endpoint, as qwen-agent decides
    assert servers["named"].transport == "sse" and servers["typed"].transport == "streamable-http"
    assert servers["time"].describe() == "time (python -m mcp_server_time 3)"


def test_a_server_is_described_on_one_line_as_a_shell_reads_its_command():
    script = ServerSpec(name="inline", transport="stdio", command="python",
                        args=("-c", "import sys\nprint('hi there')"))
    assert script.describe() == "inline (python -c 'import sys\\nprint('\"'\"'hi there'\"'\"')')"
    long = ServerSpec(name="long", transport="stdio", command="npx", args=("x" * 500,))
    assert len(long.command_line()) == 300 and long.command_line().endswith("...")


def test_rl_factorys_pydata_list_is_read_as_a_literal_never_executed(tmp_path):
    path = tmp_path / "mcp_tools.pydata"
    path.write_text("[\n  {'mcpServers': {'time': {'command': 'python', 'args': ['-m', 'mcp_server_time']}}},\n"
                    "  {'mcpServers': {'search': {'url': 'http://127.0.0.1:8000/mcp'}}},\n]\n")
    assert list(load_mcp_config(path)) == ["time", "search"]

    marker = tmp_path / "executed"
    hostile = tmp_path / "hostile.pydata"
    hostile.write_text(f"[__import__('pathlib').Path({str(marker)!r}).touch()]")
    with pytest.raises(ConfigError, match="not a Python literal .* nothing in it may be code"):
        load_mcp_config(hostile)
    assert not marker.exists()


def test_every_problem_of_a_file_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        parse_mcp_config([
            {"mcpServers": {
                "a": {"command": "", "args": "not a list", "env": {"K": 1.5, "B": True}},
                "b": {"url": "ftp://host/x"},
                "c": {"command": "x", "url": "http://h/mcp"},
                "d": {"url": "http://h/mcp", "transport": "carrier-pigeon", "colour": "red"},
                "e": "python server.py",
            }},
            {"servers": {}},
            {"mcpServers": {"f": {"command": "python"}}},
            {"mcpServers": {"f": {"command": "python"}}},
        ], source="cfg")
    errors = info.value.errors
    assert "cfg[0].mcpServers.a.command: must be a non-empty string, got ''" in errors
    assert any(e.startswith("cfg[0].mcpServers.a.args: must be a list of strings") for e in errors)
    assert "cfg[0].mcpServers.a.env: the value(s) of 'B' must be strings" in errors
    assert "cfg[0].mcpServers.b.url: must be an http(s) URL, got 'ftp://host/x'" in errors
    assert any(e.startswith("cfg[0].mcpServers.c: give either \"command\"") and "not both" in e for e in errors)
    assert any("'carrier-pigeon' is not one of stdio, streamable-http, sse" in e for e in errors)
    assert any("unknown key(s) 'colour'" in e for e in errors)
    assert "cfg[0].mcpServers.e: expected an object, got str" in errors
    assert any(e.startswith("cfg[1]: expected an object with an \"mcpServers\" key") for e in errors)
    assert any("a server named 'f' is already configured" in e for e in errors)
    assert len(errors) == 10


@pytest.mark.parametrize("text, message", [
    ("{", r"not valid JSON \(line 1"),
    ('{"mcpServers": {}}', "no servers configured"),
    ('{"mcpServers": {"x": {"command": "a", "disabled": true}}}', "no servers configured"),
])
def test_unusable_files_are_named(tmp_path, text, message):
    path = tmp_path / "servers.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_mcp_config(path)
    with pytest.raises(ConfigError, match="cannot read it"):
        load_mcp_config(tmp_path / "missing.json")


def test_http_timeouts_are_read_and_checked():
    servers = parse_mcp_config({"mcpServers": {
        "search": {"url": "http://127.0.0.1:8000/mcp", "timeout": 10, "sse_read_timeout": 600.5},
        "plain": {"url": "http://127.0.0.1:9000/sse"},
    }})
    assert (servers["search"].timeout, servers["search"].sse_read_timeout) == (10.0, 600.5)
    assert (servers["plain"].timeout, servers["plain"].sse_read_timeout) == (None, None)  # the SDK's 30 and 300
    with pytest.raises(ConfigError) as info:
        parse_mcp_config({"mcpServers": {
            "a": {"url": "http://h/mcp", "timeout": "30s", "sse_read_timeout": 0},
            "b": {"url": "http://h/sse", "timeout": True},
            "c": {"command": "python", "timeout": 5},
        }}, source="cfg")
    assert info.value.errors == [
        "cfg.mcpServers.a.timeout: must be a number of seconds > 0, got '30s'",
        "cfg.mcpServers.a.sse_read_timeout: must be a number of seconds > 0, got 0",
        "cfg.mcpServers.b.timeout: must be a number of seconds > 0, got True",
        "cfg.mcpServers.c: unknown key(s) 'timeout' for a stdio server (known: args, command, cwd, description, "
        "disabled, env, transport, type)"]
