"""The built-in tools, tool manager and reward, and tools made from functions."""

from __future__ import annotations

import asyncio

import pytest

from rlfactory_core import function_tool
from rlfactory_core.default_plugins.rewards import ExactMatchReward, normalize_answer
from rlfactory_core.default_plugins.tool_managers import ConcurrentToolManager
from rlfactory_core.default_plugins.tools import calculator
from rlfactory_core.tools import ToolArgumentsError
from rlfactory_core.types import ToolCall, ToolResult, Trajectory


def search(query: str, top_k: int = 3) -> list[str]:
    """Search the corpus.

    Args:
        query: what to look for.
        top_k: how many passages to return.
    """
    return [f"{query} #{i}" for i in range(top_k)]


async def fetch(url: str, ctx=None) -> str:
    """Fetch a page.

    :param url: the address.
    """
    return f"{url} for {ctx['who']}"


def test_function_tool_schema_comes_from_hints_and_docstring():
    tool = function_tool(search)
    assert (tool.name, tool.description) == ("search", "Search the corpus.")
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for."},
            "top_k": {"type": "integer", "description": "how many passages to return.", "default": 3},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    assert function_tool(fetch).parameters["properties"] == {"url": {"type": "string", "description": "the address."}}


async def test_function_tool_validates_and_passes_ctx():
    tool = function_tool(search)
    assert (await tool.call({"query": "x", "top_k": "2"})).content == '["x #0", "x #1"]'  # "2" coerces
    with pytest.raises(ToolArgumentsError, match="top_k: Input should be a valid integer"):
        await tool.call({"query": "x", "top_k": "many"})
    with pytest.raises(ToolArgumentsError, match="query: Field required"):
        await tool.call({})
    with pytest.raises(ToolArgumentsError, match="extra: Extra inputs are not permitted"):
        await tool.call({"query": "x", "extra": 1})
    assert (await function_tool(fetch).call({"url": "a.b"}, ctx={"who": "me"})).content == "a.b for me"


@pytest.mark.parametrize("expression,expected", [
    ("(3 + 4) * 2", "14"), ("2 ** 10", "1024"), ("7 / 2", "3.5"), ("sqrt(16) + abs(-1)", "5"), ("-3 % 5", "2"),
])
def test_calculator(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize("expression,error", [
    ("__import__('os')", "unsupported expression"), ("2 ** 99999", "too large"), ("1 +", "not an arithmetic"),
    ("True + 1", "unsupported expression"),
])
def test_calculator_rejects_what_is_not_arithmetic(expression, error):
    with pytest.raises(ValueError, match=error):
        calculator(expression)


async def test_concurrent_tool_manager_turns_every_failure_into_an_error_result():
    started = []

    async def slow(seconds: float) -> str:
        """Sleep."""
        started.append(seconds)
        await asyncio.sleep(seconds)
        return "done"

    def crash() -> str:
        """Always fails."""
        raise RuntimeError("disk full")

    manager = ConcurrentToolManager([function_tool(calculator), function_tool(slow), function_tool(crash)], timeout_s=0.5)
    results = await manager.call([
        ToolCall("calculator", {"expression": "1+1"}, id="a"),
        ToolCall("nope", {}, id="b"),
        ToolCall("calculator", {"expr": "1"}, id="c"),
        ToolCall("slow", {"seconds": 30}, id="d"),
        ToolCall("crash", {}, id="e"),
        ToolCall("slow", {"seconds": 0.01}, id="f"),
    ])
    assert [r.error for r in results] == [None, "unknown_tool", "invalid_arguments", "timeout", "exception", None]
    assert [r.call_id for r in results] == list("abcdef")
    assert results[0].content == "2" and results[5].content == "done"
    assert "Available tools: calculator, crash, slow" in results[1].content
    assert "RuntimeError: disk full" in results[4].content
    assert sorted(started) == [0.01, 30]  # both ran: the calls of a turn run concurrently
    await manager.close()


async def test_tool_manager_accepts_a_tool_result_from_the_tool():
    class Lookup:
        name, description, parameters = "lookup", "Look up.", {"type": "object", "properties": {}}

        async def call(self, arguments, ctx=None):
            return ToolResult(name="lookup", content="found", metadata={"hits": 1})

    [result] = await ConcurrentToolManager([Lookup()]).call([ToolCall("lookup", {}, id="x")])
    assert (result.content, result.call_id, result.error) == ("found", "x", None)
    # The tool's own metadata is kept; the manager adds its bookkeeping next to it.
    assert result.metadata == {"hits": 1, "attempts": 1, "wait_s": result.metadata["wait_s"], "cached": False}


async def test_tool_manager_close_closes_tools_that_hold_resources():
    closed = []

    class Session:  # async close
        name, description, parameters = "session", "Holds a session.", {"type": "object", "properties": {}}

        async def call(self, arguments, ctx=None):
            return "ok"

        async def close(self):
            closed.append("session")

    class Broken(Session):  # a failing close does not stop the others
        name = "broken"

        async def close(self):
            raise OSError("already gone")

    class Client(Session):  # sync close
        name = "client"

        def close(self):
            closed.append("client")

    await ConcurrentToolManager([Session(), Broken(), Client()]).close()
    assert closed == ["session", "client"]


def test_normalize_answer():
    assert normalize_answer("  The Eiffel-Tower! ") == "eiffeltower"


async def test_exact_match_reward():
    reward = ExactMatchReward()
    hit = await reward.score(Trajectory(sample_id="1", prompt_ids=[], final_answer="the Paris."), {"answer": ["Paris", "paris, france"]})
    miss = await reward.score(Trajectory(sample_id="1", prompt_ids=[], final_answer=None), {"answer": "Paris"})
    assert (hit.value, hit.correct, miss.value, miss.correct) == (1.0, True, 0.0, False)
    # no gold answers: the reward does not apply (multi-task data); the layer logs the share it applied to
    assert await reward.score(Trajectory(sample_id="1", prompt_ids=[]), {"question": "?"}) is None


@pytest.mark.parametrize("answer, expected, value", [
    ("-2585", "2585", 0.0), ("1.5", "15", 0.0), ("-12", "-12", 1.0), ("1,024", "1024", 1.0), ("7.0", "7", 1.0),
])
async def test_exact_match_compares_numbers_as_numbers(answer, expected, value):
    # normalising "-2585" would drop the sign and score a wrong answer as right
    output = await ExactMatchReward().score(Trajectory(sample_id="1", prompt_ids=[], final_answer=answer),
                                            {"answer": expected})
    assert output.value == value
