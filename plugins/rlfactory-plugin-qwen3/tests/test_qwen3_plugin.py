"""The installed plugin is found through its entry point by the real plugin manager.

Needs the distribution installed (``pip install -e plugins/rlfactory-plugin-qwen3``), as
every plugin does to be found at all.
"""

from __future__ import annotations

import asyncio

import pytest

import rlfactory_plugin_qwen3
from rlfactory_core import (ToolCall, ToolResult, UnknownComponentError, check_component, function_tool,
                            get_component)
from rlfactory_core.testing import assert_discovered, components, installed_plugins
from rlfactory_plugin_qwen3 import Qwen3Parser, format_tool_call

DIST = "rlfactory-plugin-qwen3"


@pytest.fixture
def fresh_plugins():
    """The real plugin manager, reloaded from the installed entry points, reset afterwards."""
    with installed_plugins() as pm:
        yield pm


def test_the_plugin_is_discovered_through_its_entry_point():
    # Strict mode, the plugin loaded alone: any import, hook or registration problem raises.
    info = assert_discovered(DIST, {"parser": ["qwen3"]}, plugin=rlfactory_plugin_qwen3)
    assert info.name == "qwen3"


def test_parser_is_registered_through_the_plugin_manager(fresh_plugins):
    component = components("parser")["qwen3"]
    assert component.plugin == "qwen3"
    assert component.kind == "parser"
    assert isinstance(component.obj, Qwen3Parser)
    assert component.obj.tool_role == "user"
    assert component.description
    assert get_component("parser", "qwen3") is component.obj


def test_registered_parser_works_end_to_end(fresh_plugins):
    parser = get_component("parser", "qwen3")
    call = ToolCall(name="search", arguments={"query": "RLFactory"})
    turn = parser.parse("<think>\nsearch it\n</think>\n\n" + format_tool_call(call))
    assert turn.tool_calls == [ToolCall(name="search", arguments={"query": "RLFactory"}, id="call_0")]
    [message] = parser.render_tool_results([ToolResult(name="search", content="found", call_id="call_0")])
    assert message.content == "<tool_response>\nfound\n</tool_response>"


def test_parser_is_absent_when_external_plugins_are_disabled():
    with installed_plugins(load=""), pytest.raises(UnknownComponentError, match="qwen3"):
        get_component("parser", "qwen3")


def test_parser_satisfies_the_interface():
    check_component("parser", Qwen3Parser())
    check_component("parser", Qwen3Parser(tool_role="tool"))


def test_a_lone_surrogate_escape_never_reaches_the_tool(fresh_plugins):
    """The parser keeps what the JSON says; the tool manager, the one place every parser's
    calls go through, refuses text that is not Unicode before the tool runs."""
    received = []

    def echo(text: str) -> str:
        """Echo the text."""
        received.append(text)
        return text

    parser = get_component("parser", "qwen3")
    turn = parser.parse(format_tool_call(ToolCall("echo", {"text": "ok"}))
                        + '<tool_call>{"name": "echo", "arguments": {"text": "a\\ud800b"}}</tool_call>')
    assert [c.arguments["text"] for c in turn.tool_calls] == ["ok", "a\ud800b"]
    manager = get_component("tool_manager", "concurrent")([function_tool(echo)])
    good, bad = asyncio.run(manager.call(turn.tool_calls))
    assert (good.ok, bad.error) == (True, "invalid_arguments")
    assert "the value of text holds a lone surrogate" in bad.content
    assert received == ["ok"]
