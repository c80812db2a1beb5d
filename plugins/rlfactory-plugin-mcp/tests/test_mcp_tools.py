"""MCP servers as tools: real servers over stdio (mcp-server-time from PyPI, the test
toolbox), streamable HTTP and SSE on localhost; content types, namespacing, timeouts,
crashes, hangs, pools, concurrency and clean shutdown."""

import asyncio
import json
import logging

import pytest

from mcp_testing import server_processes, stdio_toolbox, time_server
from rlfactory_core import ConfigError, InfrastructureError, ToolCall, Trajectory, outcome_of
from rlfactory_core.testing import ConcurrentToolManager
from rlfactory_mcp import load_mcp_tools, parse_mcp_config


def toolset(config: dict, **kwargs):
    return load_mcp_tools(parse_mcp_config({"mcpServers": config}), **kwargs)


def by_name(tools) -> dict:
    return {tool.name: tool for tool in tools.tools}


async def test_a_real_pypi_server_over_stdio_lists_its_tools_with_schemas_and_answers():
    tools = toolset({"time": time_server()})
    try:
        found = by_name(tools)
        assert sorted(found) == ["convert_time", "get_current_time"]
        schema = found["get_current_time"].parameters
        assert schema["type"] == "object" and schema["required"] == ["timezone"]
        assert found["get_current_time"].description.startswith("Get current time")
        result = await found["convert_time"].call({"source_timezone": "UTC", "time": "12:00",
                                                   "target_timezone": "Asia/Tokyo"})
        assert result.error is None and json.loads(result.content)["target"]["datetime"].endswith("21:00:00+09:00")
        failed = await found["get_current_time"].call({"timezone": "Mars/Olympus_Mons"})
        assert failed.error == "tool_error" and "Invalid timezone" in failed.content
    finally:
        await tools.close()
    assert server_processes() == [], [p.cmdline() for p in server_processes()]


async def test_every_content_type_becomes_an_observation():
    tools = toolset({"box": stdio_toolbox()})
    try:
        found = by_name(tools)
        assert (await found["echo"].call({"text": "hi"})).content == "hi"  # not also {"result": "hi"}
        assert (await found["add"].call({"a": 2, "b": 3})).content == "5"
        assert json.loads((await found["country"].call({"code": "FR"})).content) == {
            "code": "FR", "name": "France", "eu": True}
        assert (await found["picture"].call({})).content == (
            "a red square\n[image: image/png, 100 bytes]\n[resource link: file:///tmp/square.png square.png]\n"
            "note text")
        failed = await found["fail"].call({"reason": "no"})
        assert failed.error == "tool_error" and failed.content.startswith("Error executing tool fail")
        # the server refusing the arguments (JSON-RPC -32602): an invalid-arguments error
        manager = ConcurrentToolManager(tools.tools)
        [refused] = await manager.call([ToolCall("strict", {"value": "z"}, id="1")])
        assert refused.error == "invalid_arguments" and "value 'z' is not allowed" in refused.content
    finally:
        await tools.close()


async def test_streamable_http_and_sse_servers(http_toolbox, sse_toolbox):
    tools = toolset({"web": {"url": http_toolbox, "headers": {"X-Api-Key": "k-123"}},
                     "events": {"url": sse_toolbox, "headers": {"X-Api-Key": "k-456"}}})
    try:
        found = by_name(tools)
        # both servers offer the same tools: each name is namespaced by its server
        assert {"web-echo", "events-echo", "web-add", "events-add"} <= set(found) and "echo" not in found
        assert (await found["web-echo"].call({"text": "over http"})).content == "over http"
        assert (await found["events-add"].call({"a": 40, "b": 2})).content == "42"
        assert found["web-echo"].remote_name == "echo" and found["events-echo"].server == "events"
        # the config's headers reach the servers (e.g. an API key)
        assert (await found["web-header"].call({"name": "X-Api-Key"})).content == "k-123"
        assert (await found["events-header"].call({"name": "X-Api-Key"})).content == "k-456"
    finally:
        await tools.close()


async def test_the_http_timeouts_of_the_config_reach_both_transports(http_toolbox, sse_toolbox):
    """``sse_read_timeout``: how long a response may go without a byte. At 0.5 s a quick
    call answers, and a 2 s tool loses its connection (restarted and retried once, then the
    call's error); with the default (300 s) it answers (see the stdio tests for slow tools)."""
    tools = toolset({"web": {"url": http_toolbox, "timeout": 5, "sse_read_timeout": 0.5},
                     "events": {"url": sse_toolbox, "timeout": 5, "sse_read_timeout": 0.5}})
    try:
        found = by_name(tools)
        quick = await asyncio.gather(found["web-echo"].call({"text": "a"}), found["events-echo"].call({"text": "b"}))
        assert [r.content for r in quick] == ["a", "b"]
        slow = await asyncio.gather(found["web-slow"].call({"seconds": 2}), found["events-slow"].call({"seconds": 2}),
                                    return_exceptions=True)
        assert all("Connection closed" in str(failure) for failure in slow), slow
    finally:
        await tools.close()


async def test_names_are_namespaced_only_where_two_servers_clash_and_include_picks_tools():
    tools = toolset({"one": stdio_toolbox(), "two": stdio_toolbox(), "time": time_server()},
                    include=["one-echo", "two-echo", "get_current_time"])
    try:
        assert sorted(t.name for t in tools.tools) == ["get_current_time", "one-echo", "two-echo"]
    finally:
        await tools.close()
    with pytest.raises(ConfigError, match="include: no tool named 'echo'"):
        toolset({"one": stdio_toolbox(), "two": stdio_toolbox()}, include=["echo"])
    assert server_processes() == [], [p.cmdline() for p in server_processes()]


def test_bad_server_options_are_reported_together():
    # (servers that cannot start: test_mcp_failures.py)
    with pytest.raises(ConfigError) as info:
        toolset({"box": stdio_toolbox()}, servers={"box": {"pool_size": 0, "speed": 2}, "other": {}})
    assert len(info.value.errors) == 3
    assert server_processes() == [], [p.cmdline() for p in server_processes()]


async def test_many_concurrent_calls_share_one_session():
    tools = toolset({"box": stdio_toolbox()})
    manager = ConcurrentToolManager(tools.tools)
    try:
        calls = [ToolCall("whoami", {"seconds": 0.3}, id=str(i)) for i in range(64)]
        results = await manager.call(calls)
        assert all(r.error is None for r in results)
        answers = [json.loads(r.content) for r in results]
        assert len({a["pid"] for a in answers}) == 1  # one server process for all of them
        assert max(a["peak"] for a in answers) > 8  # the calls ran at once, not one by one
    finally:
        await manager.close()  # closes the tools, hence the servers
    assert server_processes() == [], [p.cmdline() for p in server_processes()]


async def test_a_pool_spreads_calls_over_server_processes():
    tools = toolset({"box": stdio_toolbox()}, servers={"box": {"pool_size": 3}})
    try:
        tool = by_name(tools)["one_at_a_time"]
        results = await asyncio.gather(*(tool.call({"seconds": 0.2}) for _ in range(12)))
        assert len({json.loads(r.content)["pid"] for r in results}) == 3
        assert len(server_processes()) == 3
    finally:
        await tools.close()
    assert server_processes() == [], [p.cmdline() for p in server_processes()]


async def test_a_killed_server_is_restarted_and_the_call_retried():
    tools = toolset({"box": stdio_toolbox()})
    try:
        echo = by_name(tools)["echo"]
        assert (await echo.call({"text": "before"})).content == "before"
        [process] = server_processes()
        process.kill()
        process.wait(10)
        assert (await echo.call({"text": "after"})).content == "after"
        assert tools.restarts == 1
        [new_process] = server_processes()
        assert new_process.pid != process.pid
        # a tool that kills its server: restarted and retried once, then the connection is lost again
        with pytest.raises(Exception, match="Connection closed"):
            await by_name(tools)["crash"].call({})
        assert (await echo.call({"text": "still"})).content == "still"
        assert tools.restarts == 3  # the crash's retry, and the call after it
        # through the tool manager: a transient failure, retried once more, then the service's
        # (rlfactory_core.outcomes: tool_unavailable), not the model's call's
        crash = by_name(tools)["crash"]
        manager = ConcurrentToolManager([crash], max_retries=1, retry_backoff_s=0.0)
        [lost] = await manager.call([ToolCall(name=crash.name, arguments={})], {})
        ended = Trajectory(sample_id="s", prompt_ids=[1], tool_results=[lost], stop_reason="env_done")
        assert lost.transient and outcome_of(ended) == "tool_unavailable"
    finally:
        await tools.close()
    assert server_processes() == [], [p.cmdline() for p in server_processes()]


async def test_a_slow_tool_times_out_and_a_hung_server_is_restarted(caplog):
    tools = toolset({"box": stdio_toolbox()}, servers={"box": {"timeout_s": 1, "probe_timeout_s": 1}})
    try:
        found = by_name(tools)
        # slow, but the server still answers: a timeout, no restart
        with pytest.raises(TimeoutError, match="slow on MCP server 'box' took longer than 1 s") as slow:
            await found["slow"].call({"seconds": 5})
        assert isinstance(slow.value, InfrastructureError)  # the service's failure, not the call's
        manager = ConcurrentToolManager([found["slow"]], timeout_s=30)
        [result] = await manager.call([ToolCall(name=found["slow"].name, arguments={"seconds": 5})], {})
        ended = Trajectory(sample_id="s", prompt_ids=[1], tool_results=[result], stop_reason="env_done")
        assert result.infrastructure is True and outcome_of(ended) == "tool_infra_error"
        assert tools.restarts == 0
        # Five calls hang the server: the probe fails, it is restarted and the calls retried
        # (and they hang it again: it is dropped). One warning line for each of those two
        # events, however many calls saw them.
        with caplog.at_level(logging.INFO):
            failures = await asyncio.gather(*(found["hang"].call({}) for _ in range(5)), return_exceptions=True)
        assert all(isinstance(f, TimeoutError) and "hang on MCP server 'box' took longer than 1 s" in str(f)
                   for f in failures), failures
        assert tools.restarts == 1
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 2, warnings
        assert warnings[0].endswith("does not answer (hung), with 5 calls in flight: restarting it, "
                                    "and retrying them once")
        assert warnings[1].endswith("does not answer (hung), with 5 calls in flight, again after its restart: "
                                    "stopping it; the next call starts it afresh")
        # the hung server was dropped: the next call gets a fresh one
        assert (await found["echo"].call({"text": "alive"})).content == "alive"
    finally:
        await tools.close()
    assert server_processes() == [], [p.cmdline() for p in server_processes()]


def test_sessions_follow_the_event_loop():
    tools = toolset({"box": stdio_toolbox()})
    echo = by_name(tools)["echo"]
    for run in ("first", "second"):  # two asyncio.run: each opens (and closes) its own session
        async def call_and_close(text=run):
            try:
                return (await echo.call({"text": text})).content
            finally:
                await tools.close()

        assert asyncio.run(call_and_close()) == run
    assert server_processes() == [], [p.cmdline() for p in server_processes()]
