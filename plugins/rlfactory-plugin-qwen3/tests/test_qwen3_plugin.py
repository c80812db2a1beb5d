"""The installed plugin is found through its entry point by the real plugin manager.

Needs the distribution installed (``pip install -e plugins/rlfactory-plugin-qwen3``), as
every plugin does to be found at all.
"""

from __future__ import annotations

import asyncio
import importlib.metadata

import pytest

import rlfactory_plugin_qwen3
from rlfactory_core import plugins
from rlfactory_core.errors import UnknownComponentError
from rlfactory_core.interfaces import check_component
from rlfactory_core.tools import function_tool
from rlfactory_core.types import ToolCall, ToolResult
from rlfactory_plugin_qwen3 import Qwen3Parser, format_tool_call

DIST = "rlfactory-plugin-qwen3"


@pytest.fixture
def fresh_plugins(monkeypatch):
    """The real plugin manager, reloaded from the installed entry points, reset afterwards."""
    monkeypatch.delenv(plugins.LOAD_ENV, raising=False)
    monkeypatch.delenv(plugins.STRICT_ENV, raising=False)
    plugins.reset_plugins()
    yield monkeypatch
    plugins.reset_plugins()


def test_distribution_declares_the_entry_point():
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{DIST} is not installed; run: pip install -e plugins/rlfactory-plugin-qwen3")
    [entry_point] = [ep for ep in dist.entry_points if ep.group == plugins.ENTRY_POINT_GROUP]
    assert (entry_point.name, entry_point.value) == ("qwen3", "rlfactory_plugin_qwen3")
    assert entry_point.load() is rlfactory_plugin_qwen3


@pytest.mark.exercises_hook("rlfactory_register_parsers")
def test_parser_is_registered_through_the_plugin_manager(fresh_plugins):
    component = plugins.components("parser")["qwen3"]
    assert component.plugin == "qwen3"
    assert component.kind == "parser"
    assert isinstance(component.obj, Qwen3Parser)
    assert component.obj.tool_role == "user"
    assert component.description
    assert plugins.get_component("parser", "qwen3") is component.obj


@pytest.mark.exercises_hook("rlfactory_register_parsers")
def test_registered_parser_works_end_to_end(fresh_plugins):
    parser = plugins.get_component("parser", "qwen3")
    call = ToolCall(name="search", arguments={"query": "RLFactory"})
    turn = parser.parse("<think>\nsearch it\n</think>\n\n" + format_tool_call(call))
    assert turn.tool_calls == [ToolCall(name="search", arguments={"query": "RLFactory"}, id="call_0")]
    [message] = parser.render_tool_results([ToolResult(name="search", content="found", call_id="call_0")])
    assert message.content == "<tool_response>\nfound\n</tool_response>"


@pytest.mark.parametrize("allowed", ["qwen3", DIST])
@pytest.mark.exercises_hook("rlfactory_register_parsers")
def test_plugin_loads_cleanly_in_strict_mode(fresh_plugins, allowed):
    # Strict mode turns any import, hook or registration problem of a loaded plugin into an
    # exception; the allow-list keeps other installed plugins out of this test.
    fresh_plugins.setenv(plugins.STRICT_ENV, "1")
    fresh_plugins.setenv(plugins.LOAD_ENV, allowed)
    [info] = [info for info in plugins.plugin_infos() if info.name == "qwen3"]
    assert info.status == "ok", info.problems
    assert info.distribution == DIST
    assert not info.builtin
    assert info.hooks == ["rlfactory_register_parsers"]
    assert info.components == {"parser": ["qwen3"]}


def test_parser_is_absent_when_external_plugins_are_disabled(fresh_plugins):
    fresh_plugins.setenv(plugins.LOAD_ENV, "")
    with pytest.raises(UnknownComponentError, match="qwen3"):
        plugins.get_component("parser", "qwen3")


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

    parser = plugins.get_component("parser", "qwen3")
    turn = parser.parse(format_tool_call(ToolCall("echo", {"text": "ok"}))
                        + '<tool_call>{"name": "echo", "arguments": {"text": "a\\ud800b"}}</tool_call>')
    assert [c.arguments["text"] for c in turn.tool_calls] == ["ok", "a\ud800b"]
    manager = plugins.get_component("tool_manager", "concurrent")([function_tool(echo)])
    good, bad = asyncio.run(manager.call(turn.tool_calls))
    assert (good.ok, bad.error) == (True, "invalid_arguments")
    assert "the value of text holds a lone surrogate" in bad.content
    assert received == ["ok"]
