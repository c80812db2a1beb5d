"""The tool execution layer: the concurrent tool manager, the sync-tool thread pool,
qwen-agent tools and tool resolution.

Concurrency is checked with counters and gates (asyncio / threading events), never with
wall-clock measurements; the only times involved are short timeouts that must expire.
"""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
import threading
from typing import Any

import pytest

from rlfactory_core import hookimpl
from rlfactory_core.default_plugins.tool_managers import ERROR_KINDS, ConcurrentToolManager
from rlfactory_core.errors import ConfigError, DuplicateComponentError, RegistrationError, UnknownComponentError
from rlfactory_core.testing import registered_plugin
from rlfactory_core.threads import run_in_tool_thread
from rlfactory_core.tool_resolution import QwenAgentTool, resolve_tools
from rlfactory_core.tools import FunctionTool, TransientToolError, function_tool
from rlfactory_core.types import ToolCall, ToolResult

pytest.importorskip("qwen_agent.tools")
from qwen_agent.llm.schema import ContentItem  # noqa: E402
from qwen_agent.tools.base import BaseTool  # noqa: E402

SHORT = 0.2  # a timeout that must expire; nothing in these tests waits for it on purpose


# -- helpers ------------------------------------------------------------------------------


class Gauge:
    """Counts the calls running now and the most that ever ran at once."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.started = 0

    def enter(self) -> None:
        self.running += 1
        self.started += 1
        self.peak = max(self.peak, self.running)

    def exit(self) -> None:
        self.running -= 1


def gated_tool(name: str, gauge: Gauge, gate: asyncio.Event) -> FunctionTool:
    """An async tool that runs until ``gate`` opens, counted by ``gauge``."""

    async def fn(n: int = 0) -> str:
        gauge.enter()
        try:
            await gate.wait()
        finally:
            gauge.exit()
        return f"{name} {n}"

    return function_tool(fn, name=name, description=f"The {name} tool.")


async def until(condition, max_spins: int = 10_000) -> None:
    """Let the event loop run until ``condition()`` holds (bounded, never by wall clock)."""
    for _ in range(max_spins):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def settle(spins: int = 50) -> None:
    """Give every runnable task many chances to run."""
    for _ in range(spins):
        await asyncio.sleep(0)


class FlakyTool:
    """A plain tool (no ``validate``) that fails ``failures`` times, then answers "ok".

    ``mode`` picks how it fails: raise ``TransientToolError`` / ``ConnectionError`` /
    ``ValueError``, or return a transient error result.
    """

    description = "Fails a few times."
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self, failures: int, mode: str = "transient", name: str = "flaky"):
        self.name = name
        self.failures = failures
        self.mode = mode
        self.runs = 0

    async def call(self, arguments, ctx=None):
        self.runs += 1
        if self.runs > self.failures:
            return "ok"
        if self.mode == "transient":
            raise TransientToolError("rate limited")
        if self.mode == "connection":
            raise ConnectionError("connection reset")
        if self.mode == "result":
            return ToolResult(name=self.name, content="backend busy, try later", error="busy", transient=True)
        raise ValueError("bad input")


class WeatherTool:
    """A plain tool validated by the manager against its JSON schema."""

    name = "weather"
    description = "The weather forecast."
    parameters = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1},
            "units": {"enum": ["metric", "imperial"]},
        },
        "required": ["city"],
        "additionalProperties": False,
    }

    def __init__(self) -> None:
        self.runs = 0

    async def call(self, arguments, ctx=None):
        self.runs += 1
        return f"sunny in {arguments['city']}"


# -- concurrency --------------------------------------------------------------------------


async def test_the_calls_of_a_turn_run_concurrently():
    gauge, gate = Gauge(), asyncio.Event()

    async def barrier(n: int) -> str:
        """Waits until all three calls have started: finishes only if they run at once."""
        gauge.enter()
        if gauge.started == 3:
            gate.set()
        await gate.wait()
        gauge.exit()
        return str(n)

    manager = ConcurrentToolManager([function_tool(barrier)], timeout_s=5)
    results = await manager.call([ToolCall("barrier", {"n": i}, id=str(i)) for i in range(3)])
    assert [(r.error, r.content, r.call_id) for r in results] == [(None, "0", "0"), (None, "1", "1"), (None, "2", "2")]
    assert gauge.peak == 3


async def test_global_limit_holds_across_trajectories():
    gauge, gate = Gauge(), asyncio.Event()
    manager = ConcurrentToolManager([gated_tool("work", gauge, gate)], max_concurrency=3)
    # Ten trajectories, each its own task calling the shared manager with two calls.
    trajectories = [asyncio.create_task(manager.call([ToolCall("work", {"n": 2 * t}), ToolCall("work", {"n": 2 * t + 1})]))
                    for t in range(10)]
    await until(lambda: gauge.running == 3)
    await settle()
    assert (gauge.running, gauge.started) == (3, 3)  # the other 17 calls wait for a slot
    gate.set()
    results = [r for batch in await asyncio.gather(*trajectories) for r in batch]
    assert [r.content for r in results] == [f"work {n}" for n in range(20)]
    assert gauge.peak == 3 and gauge.started == 20
    assert all(r.metadata["attempts"] == 1 and r.metadata["cached"] is False for r in results)
    assert sum(r.metadata["wait_s"] > 0 for r in results) >= 17


async def test_per_tool_limit_holds_while_other_tools_use_the_global_slots():
    slow, fast, gate = Gauge(), Gauge(), asyncio.Event()
    manager = ConcurrentToolManager([gated_tool("slow", slow, gate), gated_tool("fast", fast, gate)],
                                    max_concurrency=4, tool_concurrency={"slow": 2})
    # The "slow" calls are queued first; were they to hold global slots while waiting for
    # their tool's slot, the "fast" calls would find none left.
    tasks = [asyncio.create_task(manager.call([ToolCall("slow", {"n": i})])) for i in range(6)]
    tasks += [asyncio.create_task(manager.call([ToolCall("fast", {"n": i})])) for i in range(2)]
    await until(lambda: slow.running == 2 and fast.running == 2)
    await settle()
    assert (slow.running, slow.started, fast.running) == (2, 2, 2)
    gate.set()
    results = [r for batch in await asyncio.gather(*tasks) for r in batch]
    assert all(r.ok for r in results) and len(results) == 8
    assert (slow.peak, fast.peak, slow.started) == (2, 2, 6)


async def test_an_int_tool_concurrency_limits_each_tool():
    a, b, gate = Gauge(), Gauge(), asyncio.Event()
    manager = ConcurrentToolManager([gated_tool("a", a, gate), gated_tool("b", b, gate)], tool_concurrency=1)
    tasks = [asyncio.create_task(manager.call([ToolCall(name, {})])) for name in "aabb"]
    await until(lambda: a.running == 1 and b.running == 1)
    await settle()
    assert (a.started, b.started) == (1, 1)
    gate.set()
    await asyncio.gather(*tasks)
    assert (a.peak, b.peak, a.started, b.started) == (1, 1, 2, 2)


def test_a_manager_can_be_reused_from_a_new_event_loop():
    # e.g. a trainer that calls asyncio.run() once per step with one shared manager
    manager = ConcurrentToolManager([function_tool(echo_after_yield)], max_concurrency=1)
    for _ in range(2):
        results = asyncio.run(manager.call([ToolCall("echo_after_yield", {"text": str(i)}) for i in range(3)]))
        assert [r.content for r in results] == ["0", "1", "2"]
    assert manager.metrics()["tool_calls"] == 6


async def echo_after_yield(text: str) -> str:
    """Echo the text after a yield, so concurrent calls contend for the single slot."""
    await asyncio.sleep(0)
    return text


# -- timeouts and the thread pool ---------------------------------------------------------


async def test_an_async_tool_that_hangs_times_out_and_is_cancelled():
    cancelled = asyncio.Event()

    async def hang() -> str:
        """Never finishes."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    manager = ConcurrentToolManager([function_tool(hang)], timeout_s=SHORT)
    [result] = await manager.call([ToolCall("hang", {}, id="h")])
    assert (result.error, result.call_id, result.transient) == ("timeout", "h", False)
    assert result.content == f"Error: hang did not finish within {SHORT:g} s."
    assert result.metadata["attempts"] == 1
    await asyncio.wait_for(cancelled.wait(), 5)


@pytest.mark.timeout(30)  # the failure this guards against is a hang
async def test_a_tool_that_ignores_cancellation_still_frees_the_trajectory():
    release = asyncio.Event()

    async def stubborn() -> str:
        """Swallows the first cancellation and keeps running."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()
        return "late"

    manager = ConcurrentToolManager([function_tool(stubborn)], timeout_s=SHORT)
    [result] = await manager.call([ToolCall("stubborn", {})])
    assert result.error == "timeout"
    release.set()
    await settle()


async def test_sync_tools_that_overrun_the_timeout_do_not_starve_the_other_sync_tools():
    release = threading.Event()
    blocked = 10  # more than asyncio's default executor has threads here (min(32, cpus + 4))

    def stuck(n: int) -> str:
        """Blocks its thread until released."""
        release.wait(timeout=30)
        return "late"

    def whoami() -> str:
        """The name of the thread running the tool."""
        return threading.current_thread().name

    manager = ConcurrentToolManager([function_tool(stuck), function_tool(whoami)], timeout_s=SHORT)
    try:
        results = await manager.call([ToolCall("stuck", {"n": i}) for i in range(blocked)])
        assert [r.error for r in results] == ["timeout"] * blocked
        # The stuck threads are still busy; another sync tool still gets a thread at once.
        [result] = await manager.call([ToolCall("whoami", {})])
        assert result.ok and result.content.startswith("rlf-tool")
    finally:
        release.set()


async def test_sync_tools_run_in_the_dedicated_pool_with_the_callers_context():
    request_id = contextvars.ContextVar("request_id", default="none")
    request_id.set("r-42")

    def probe() -> tuple[str, str]:
        return threading.current_thread().name, request_id.get()

    name, seen = await run_in_tool_thread(probe)
    assert name.startswith("rlf-tool") and seen == "r-42"
    assert threading.current_thread().daemon is False  # the caller's thread is untouched
    with pytest.raises(ZeroDivisionError):
        await run_in_tool_thread(lambda: 1 / 0)


def test_the_pool_threads_are_daemons_so_a_hung_tool_cannot_block_exit():
    code = (
        "import asyncio, threading\n"
        "from rlfactory_core.threads import run_in_tool_thread\n"
        "async def main():\n"
        "    try:\n"
        "        await asyncio.wait_for(run_in_tool_thread(threading.Event().wait), 0.05)\n"
        "    except asyncio.TimeoutError:\n"
        "        print('timed out')\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "timed out"), done.stderr


# -- retries ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, kind", [("transient", "exception"), ("connection", "exception"), ("result", "tool_error")])
async def test_transient_failures_are_retried_until_they_succeed(mode, kind):
    tool = FlakyTool(failures=2, mode=mode)
    manager = ConcurrentToolManager([tool], max_retries=2, retry_backoff_s=0.001)
    [result] = await manager.call([ToolCall("flaky", {}, id="f")])
    assert (result.ok, result.content, result.call_id, result.metadata["attempts"]) == (True, "ok", "f", 3)
    assert tool.runs == 3
    metrics = manager.metrics()
    assert metrics["tool_retries"] == 2 and metrics[f"tool_errors/{kind}"] == 0


@pytest.mark.parametrize("mode, kind, content", [
    ("transient", "exception", "Error: flaky failed: TransientToolError: rate limited (gave up after 3 attempts)"),
    ("connection", "exception", "Error: flaky failed: ConnectionError: connection reset (gave up after 3 attempts)"),
    ("result", "tool_error", "backend busy, try later"),
])
async def test_transient_failures_give_up_after_max_retries(mode, kind, content):
    tool = FlakyTool(failures=100, mode=mode)
    manager = ConcurrentToolManager([tool], max_retries=2, retry_backoff_s=0.001)
    [result] = await manager.call([ToolCall("flaky", {})])
    assert (result.error, result.content, result.transient, result.metadata["attempts"]) == (kind, content, True, 3)
    assert tool.runs == 3
    assert manager.metrics()["tool_retries"] == 2 and manager.metrics()[f"tool_errors/{kind}"] == 1
    if kind == "tool_error":
        assert result.metadata["tool_error"] == "busy"  # the tool's own error string is kept


async def test_max_retries_zero_never_retries():
    tool = FlakyTool(failures=1)
    [result] = await ConcurrentToolManager([tool], max_retries=0).call([ToolCall("flaky", {})])
    assert (result.error, result.metadata["attempts"], tool.runs) == ("exception", 1, 1)


async def test_other_exceptions_are_not_retried():
    tool = FlakyTool(failures=1, mode="value")
    manager = ConcurrentToolManager([tool], max_retries=5, retry_backoff_s=0.001)
    [result] = await manager.call([ToolCall("flaky", {})])
    assert (result.error, result.transient, result.metadata["attempts"], tool.runs) == ("exception", False, 1, 1)
    assert result.content == "Error: flaky failed: ValueError: bad input"
    assert manager.metrics()["tool_retries"] == 0


@pytest.mark.parametrize("retry_timeouts, attempts", [(False, 1), (True, 3)])
async def test_timeouts_are_retried_only_when_enabled(retry_timeouts, attempts):
    runs = []

    async def hang() -> str:
        """Never finishes."""
        runs.append(1)
        await asyncio.Event().wait()
        return ""

    manager = ConcurrentToolManager([function_tool(hang)], timeout_s=0.05, max_retries=2,
                                    retry_backoff_s=0.001, retry_timeouts=retry_timeouts)
    [result] = await manager.call([ToolCall("hang", {})])
    assert (result.error, result.metadata["attempts"], len(runs)) == ("timeout", attempts, attempts)
    assert manager.metrics()["tool_retries"] == attempts - 1


async def test_base_exceptions_of_a_tool_are_contained_but_cancellation_propagates():
    class Meltdown(BaseException):
        pass

    def melt() -> str:
        """Raises a BaseException that is not an Exception."""
        raise Meltdown("core breach")

    cancelled = asyncio.Event()

    async def hang() -> str:
        """Never finishes."""
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return ""

    manager = ConcurrentToolManager([function_tool(melt), function_tool(hang)], timeout_s=30)
    [result] = await manager.call([ToolCall("melt", {})])
    assert (result.error, result.content) == ("exception", "Error: melt failed: Meltdown: core breach")

    trajectory = asyncio.create_task(manager.call([ToolCall("hang", {})]))
    await settle()
    trajectory.cancel()
    with pytest.raises(asyncio.CancelledError):
        await trajectory
    assert cancelled.is_set()  # the tool was cancelled with its trajectory


# -- cache --------------------------------------------------------------------------------


async def test_cache_serves_identical_calls_and_copies_results():
    runs = []

    def square(x: int, label: str = "") -> str:
        """Square a number."""
        runs.append(x)
        return str(x * x)

    manager = ConcurrentToolManager([function_tool(square)], cache=True)
    [first] = await manager.call([ToolCall("square", {"x": 3, "label": "a"}, id="1")])
    [again] = await manager.call([ToolCall("square", {"label": "a", "x": 3}, id="2")])  # key order differs
    [other] = await manager.call([ToolCall("square", {"x": 4, "label": "a"}, id="3")])
    assert [r.content for r in (first, again, other)] == ["9", "9", "16"]
    assert runs == [3, 4]
    assert (first.metadata["cached"], again.metadata["cached"], other.metadata["cached"]) == (False, True, False)
    assert (again.call_id, again.metadata["attempts"], again.latency_s) == ("2", 0, 0.0)
    again.content = "tampered"
    [third] = await manager.call([ToolCall("square", {"x": 3, "label": "a"})])
    assert third.content == "9"
    assert manager.metrics()["tool_cache_hits"] == 2


async def test_failures_are_not_cached():
    tool = FlakyTool(failures=1, mode="value")
    manager = ConcurrentToolManager([tool], cache=True)
    results = [(await manager.call([ToolCall("flaky", {})]))[0] for _ in range(3)]
    assert [r.error for r in results] == ["exception", None, None]
    assert [r.metadata["cached"] for r in results] == [False, False, True]
    assert tool.runs == 2


async def test_identical_concurrent_calls_share_one_run():
    gauge, gate = Gauge(), asyncio.Event()
    manager = ConcurrentToolManager([gated_tool("lookup", gauge, gate)], cache=True)
    tasks = [asyncio.create_task(manager.call([ToolCall("lookup", {"n": 1}, id=str(i))])) for i in range(5)]
    await until(lambda: gauge.running == 1)
    await settle()
    gate.set()
    results = [r for batch in await asyncio.gather(*tasks) for r in batch]
    assert gauge.started == 1
    assert [r.call_id for r in results] == ["0", "1", "2", "3", "4"]
    assert all(r.content == "lookup 1" for r in results)
    assert sorted(r.metadata["cached"] for r in results) == [False, True, True, True, True]
    assert manager.metrics()["tool_cache_hits"] == 4


async def test_a_cancelled_caller_does_not_fail_the_calls_sharing_its_run():
    gauge, gate = Gauge(), asyncio.Event()
    manager = ConcurrentToolManager([gated_tool("lookup", gauge, gate)], cache=True)
    leader = asyncio.create_task(manager.call([ToolCall("lookup", {})]))
    await until(lambda: gauge.running == 1)
    follower = asyncio.create_task(manager.call([ToolCall("lookup", {})]))
    await settle()
    leader.cancel()
    await settle()
    gate.set()
    [result] = await follower
    assert result.ok and result.content == "lookup 0" and gauge.started == 1
    assert leader.cancelled()


async def test_cache_evicts_the_least_recently_used_and_can_be_limited_to_some_tools():
    runs = []

    def double(x: int) -> int:
        """Double it."""
        runs.append(("double", x))
        return 2 * x

    def triple(x: int) -> int:
        """Triple it."""
        runs.append(("triple", x))
        return 3 * x

    manager = ConcurrentToolManager([function_tool(double), function_tool(triple)], cache=["double"], cache_size=2)
    for x in (1, 2, 1, 3, 2, 1):  # 1 is refreshed before 3 arrives, so 2 is the one evicted
        await manager.call([ToolCall("double", {"x": x})])
    for _ in range(2):
        await manager.call([ToolCall("triple", {"x": 1})])
    assert runs == [("double", 1), ("double", 2), ("double", 3), ("double", 2), ("double", 1),
                    ("triple", 1), ("triple", 1)]


# -- argument validation and unknown tools ------------------------------------------------


async def test_jsonschema_validation_for_a_tool_without_validate():
    tool = WeatherTool()
    manager = ConcurrentToolManager([tool])
    results = await manager.call([
        ToolCall("weather", {"city": "Oslo", "days": 2}),
        ToolCall("weather", {"days": "two", "units": "kelvin", "extra": 1}),
        ToolCall("weather", {"city": "Oslo", "days": 0}),
        ToolCall("weather", "Oslo"),  # a parser may hand over a non-object
    ])
    assert [r.error for r in results] == [None, "invalid_arguments", "invalid_arguments", "invalid_arguments"]
    assert results[0].content == "sunny in Oslo" and tool.runs == 1
    assert results[1].content == (
        "Error: invalid arguments for weather: 'city' is a required property; "
        "Additional properties are not allowed ('extra' was unexpected); "
        "days: 'two' is not of type 'integer'; units: 'kelvin' is not one of ['metric', 'imperial']"
    )
    assert results[2].content == "Error: invalid arguments for weather: days: 0 is less than the minimum of 1"
    assert results[3].content == "Error: invalid arguments for weather: 'Oslo' is not of type 'object'"
    assert manager.metrics()["tool_errors/invalid_arguments"] == 3


async def test_function_tools_are_validated_by_their_own_validate():
    runs = []

    def add(a: int, b: int) -> int:
        """Add two integers."""
        runs.append((a, b))
        return a + b

    [bad, good] = await ConcurrentToolManager([function_tool(add)]).call(
        [ToolCall("add", {"a": 1, "b": "x"}), ToolCall("add", {"a": 1, "b": "2"})])
    assert bad.error == "invalid_arguments" and "b: Input should be a valid integer" in bad.content
    assert (good.content, runs) == ("3", [(1, 2)])


async def test_no_tool_receives_text_that_is_not_unicode():
    """A JSON "\\ud800" escape decodes to a lone surrogate, which no file, socket or database
    takes: the manager refuses it before any tool (schema-checked or function) runs."""
    runs = []

    def echo(text: str, items: list = []) -> str:  # noqa: B006 - never mutated
        """Echo the text."""
        runs.append(text)
        return text

    weather = WeatherTool()
    manager = ConcurrentToolManager([function_tool(echo), weather])
    results = await manager.call([
        ToolCall("echo", {"text": "a\ud800b"}),
        ToolCall("echo", {"text": "ok", "items": [{"deep": ["x", "\udfff"]}]}),
        ToolCall("weather", {"city": "Oslo", "\udc80": 1}),
        ToolCall("weather", {"city": "Oslo\ud83d"}),
        ToolCall("echo", {"text": "fine: é \U0001F600"}),
    ])
    assert [r.error for r in results] == ["invalid_arguments"] * 4 + [None]
    assert results[0].content == (
        "Error: invalid arguments for echo: the value of text holds a lone surrogate (\\ud800 at char 1), which "
        "is not valid Unicode text; write the character itself, or both halves of a surrogate pair (\\ud83d\\ude00)")
    assert "the value of items[0].deep[1] holds a lone surrogate (\\udfff at char 0)" in results[1].content
    assert "the key '\\udc80' holds a lone surrogate" in results[2].content
    assert "the value of city holds a lone surrogate" in results[3].content
    assert runs == ["fine: é \U0001F600"] and weather.runs == 0
    for result in results:
        result.content.encode("utf-8")  # the messages themselves can be tokenized


async def test_tool_results_that_are_not_unicode_reach_the_model_as_replacement_characters():
    def undecodable() -> str:
        """Bytes decoded with surrogateescape, as os.listdir or a subprocess may give."""
        return b"caf\xe9".decode("utf-8", "surrogateescape")

    [result] = await ConcurrentToolManager([function_tool(undecodable)]).call([ToolCall("undecodable", {})])
    assert result.ok and result.content == "caf\ufffd"


async def test_a_tool_with_an_invalid_schema_is_called_unchecked(caplog):
    class Loose(WeatherTool):
        name = "loose"
        parameters = {"type": "object", "properties": {"city": {"type": "string", "required": True}}}

    manager = ConcurrentToolManager([Loose()])
    assert "invalid parameters schema" in caplog.text
    [result] = await manager.call([ToolCall("loose", {"city": "Rome"})])
    assert result.content == "sunny in Rome"


async def test_unknown_tool():
    manager = ConcurrentToolManager([WeatherTool(), FlakyTool(0)])
    [result] = await manager.call([ToolCall("wether", {"city": "Oslo"}, id="u")])
    assert (result.error, result.call_id, result.name) == ("unknown_tool", "u", "wether")
    assert result.content == "Error: there is no tool named 'wether'. Available tools: flaky, weather."
    metrics = manager.metrics()
    assert metrics["tool_errors/unknown_tool"] == 1 and "tool_calls/wether" not in metrics


async def test_a_tool_the_episode_does_not_offer_is_unknown_to_it():
    """The rollout passes ctx["tool_names"]: the tools this episode's reset returned."""
    manager = ConcurrentToolManager([WeatherTool(), FlakyTool(0)])
    offered, hidden = await manager.call([ToolCall("weather", {"city": "Oslo"}), ToolCall("flaky", {})],
                                         {"tool_names": {"weather"}})
    assert offered.ok
    assert hidden.error == "unknown_tool"
    assert hidden.content == "Error: there is no tool named 'flaky'. Available tools: weather."


# -- metrics ------------------------------------------------------------------------------


async def test_metrics_count_calls_errors_retries_and_cache_hits():
    async def hang() -> str:
        """Never finishes."""
        await asyncio.Event().wait()
        return ""

    class BrokenResult(FlakyTool):
        async def call(self, arguments, ctx=None):
            return ToolResult(name=self.name, content="no such page", error="not_found")

    tools = [FlakyTool(failures=1), WeatherTool(), function_tool(hang), BrokenResult(0, name="broken_result")]
    manager = ConcurrentToolManager(tools, timeout_s=SHORT, retry_backoff_s=0.001, cache=["weather"])
    assert manager.metrics() == {
        "tool_calls": 0, "tool_retries": 0, "tool_cache_hits": 0,
        **{f"tool_errors/{kind}": 0 for kind in ERROR_KINDS},
        "tool_calls/flaky": 0, "tool_calls/weather": 0, "tool_calls/hang": 0, "tool_calls/broken_result": 0,
    }
    await manager.call([
        ToolCall("flaky", {}),                    # one transient failure, then ok
        ToolCall("weather", {"city": "Oslo"}),    # ok
        ToolCall("weather", {}),                  # invalid arguments
        ToolCall("hang", {}),                     # timeout
        ToolCall("broken_result", {}),            # the tool reports its own error
        ToolCall("nope", {}),                     # unknown
    ])
    await manager.call([ToolCall("weather", {"city": "Oslo"})])  # cache hit
    expected = {
        "tool_calls": 7, "tool_retries": 1, "tool_cache_hits": 1,
        "tool_errors/unknown_tool": 1, "tool_errors/invalid_arguments": 1, "tool_errors/timeout": 1,
        "tool_errors/exception": 0, "tool_errors/tool_error": 1,
        "tool_calls/flaky": 1, "tool_calls/weather": 3, "tool_calls/hang": 1, "tool_calls/broken_result": 1,
    }
    assert manager.metrics(reset=True) == expected
    assert set(manager.metrics().values()) == {0}


# -- construction -------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"timeout_s": 0}, "timeout_s must be a number > 0 (seconds), got 0"),
    ({"timeout_s": float("nan")}, "timeout_s must be a number > 0"),
    ({"max_concurrency": 0}, "max_concurrency must be a positive integer, got 0"),
    ({"max_concurrency": 2.5}, "max_concurrency must be a positive integer, got 2.5"),
    ({"max_retries": -1}, "max_retries must be an integer >= 0, got -1"),
    ({"retry_backoff_s": -0.1}, "retry_backoff_s must be a number >= 0 (seconds), got -0.1"),
    ({"retry_timeouts": "yes"}, "retry_timeouts must be true or false, got 'yes'"),
    ({"cache": "weather"}, "cache must be true, false or a list of tool names, got 'weather'"),
    ({"cache": ["wether"]}, "cache names unknown tools 'wether' (tools: weather)"),
    ({"cache_size": 0}, "cache_size must be a positive integer, got 0"),
    ({"tool_concurrency": 0}, "tool_concurrency must be a positive integer or a mapping of tool names"),
    ({"tool_concurrency": {"wether": 1}}, "tool_concurrency names unknown tools 'wether' (tools: weather)"),
    ({"tool_concurrency": {"weather": True}}, "tool_concurrency['weather'] must be a positive integer, got True"),
])
def test_invalid_options_are_rejected_with_a_clear_message(options, message):
    with pytest.raises(ConfigError, match="tool manager 'concurrent': ") as info:
        ConcurrentToolManager([WeatherTool()], **options)
    assert message in str(info.value)


def test_every_invalid_option_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        ConcurrentToolManager([WeatherTool()], timeout_s=-1, max_concurrency=0)
    assert len(info.value.errors) == 2


def test_tools_the_manager_cannot_use_are_rejected_at_construction():
    class SyncCall(WeatherTool):
        def call(self, arguments, ctx=None):
            return "sync"

    with pytest.raises(RegistrationError, match="method 'call' must be 'async def'") as info:
        ConcurrentToolManager([SyncCall()])
    assert "resolve_tools" in str(info.value)
    with pytest.raises(RegistrationError, match="attribute 'name' must be a non-empty string"):
        ConcurrentToolManager([echo_after_yield])  # a bare function: resolve_tools() wraps it
    with pytest.raises(DuplicateComponentError, match="two tools named 'weather'"):
        ConcurrentToolManager([WeatherTool(), WeatherTool()])


# -- qwen-agent tools ---------------------------------------------------------------------


class Shout(BaseTool):
    """A qwen-agent tool in the old list format (not registered: the registry is global)."""

    name = "shout"
    description = "Shout the text."
    parameters = [
        {"name": "text", "type": "string", "description": "what to shout", "required": True},
        {"name": "times", "type": "integer", "description": "how often", "required": False},
    ]

    def call(self, params, **kwargs):
        params = self._verify_json_format_args(params)
        return " ".join([params["text"].upper()] * params.get("times", 1))


class Rich(BaseTool):
    name = "rich"
    description = "Returns a structured value."
    parameters = {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}

    def call(self, params, **kwargs):
        kind = self._verify_json_format_args(params)["kind"]
        if kind == "items":
            return [ContentItem(text="a caption"), ContentItem(image="cat.png"), ContentItem(text="the end")]
        return {"kind": kind, "values": [1, 2]}


class NeedsKey(BaseTool):
    name = "needs_key"
    description = "Needs an API key."
    parameters = {"type": "object", "properties": {}, "required": []}

    def __init__(self, cfg=None):
        super().__init__(cfg)
        if "api_key" not in self.cfg:
            raise ValueError("api_key is required")

    def call(self, params, **kwargs):
        return "authorised"


async def test_the_qwen_agent_storage_builtin_by_name_puts_and_gets(tmp_path, plugin_manager):
    [storage] = resolve_tools([("storage", {"storage_root_path": str(tmp_path / "store")})])
    assert isinstance(storage, QwenAgentTool) and storage.name == "storage"
    assert storage.parameters["required"] == ["operate"]
    manager = ConcurrentToolManager([storage], timeout_s=10)
    put, get, missing = await manager.call([
        ToolCall("storage", {"operate": "put", "key": "notes/today", "value": "buy milk"}),
        ToolCall("storage", {"operate": "get", "key": "notes/yesterday"}),
        ToolCall("storage", {"operate": "bogus"}),
    ])
    assert (put.error, put.content) == (None, "Successfully saved notes/today.")
    assert (tmp_path / "store" / "notes" / "today").read_text() == "buy milk"
    assert get.error == "exception" and "KeyNotExistsError: Get Failed: notes/yesterday does not exist" in get.content
    [got] = await manager.call([ToolCall("storage", {"operate": "get", "key": "notes/today"})])
    assert (got.error, got.content) == (None, "buy milk")
    # The dict form of a spec with cfg is the same tool.
    [same] = resolve_tools([{"name": "storage", "cfg": {"storage_root_path": str(tmp_path / "store")}}])
    assert (await same.call({"operate": "get", "key": "notes/today"})).content == "buy milk"


async def test_a_custom_qwen_agent_tool_with_list_parameters():
    tool = QwenAgentTool(Shout())
    assert (tool.name, tool.description) == ("shout", "Shout the text.")
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "what to shout"},
            "times": {"type": "integer", "description": "how often"},
        },
        "required": ["text"],
    }
    manager = ConcurrentToolManager([tool])
    ok, missing, wrong_type = await manager.call([
        ToolCall("shout", {"text": "hi", "times": 2}), ToolCall("shout", {}), ToolCall("shout", {"text": 3}),
    ])
    assert (ok.error, ok.content) == (None, "HI HI")
    assert missing.content == "Error: invalid arguments for shout: 'text' is a required property"
    assert wrong_type.content == "Error: invalid arguments for shout: text: 3 is not of type 'string'"


async def test_qwen_agent_results_become_text():
    tool = QwenAgentTool(Rich())
    assert (await tool.call({"kind": "items"})).content == "a caption\n[image: cat.png]\nthe end"
    assert (await tool.call({"kind": "dict"})).content == '{"kind": "dict", "values": [1, 2]}'
    with pytest.raises(TypeError, match="needs a qwen-agent BaseTool instance"):
        QwenAgentTool(WeatherTool())


# -- resolve_tools ------------------------------------------------------------------------


def echo(text: str) -> str:
    """Echo the text."""
    return text


async def test_resolve_tools_accepts_every_kind_of_spec(tmp_path, plugin_manager):
    weather = WeatherTool()
    shout = Shout()
    tools = resolve_tools([
        weather,                                                 # a tool object: kept as is
        echo,                                                    # a function
        "calculator",                                            # registered by a plugin
        ("storage", {"storage_root_path": str(tmp_path)}),       # a qwen-agent built-in with cfg
        shout,                                                   # a qwen-agent tool instance
        Rich,                                                    # a qwen-agent tool class
        (NeedsKey, {"api_key": "k"}),                            # a qwen-agent tool class with cfg
    ])
    assert [t.name for t in tools] == ["weather", "echo", "calculator", "storage", "shout", "rich", "needs_key"]
    assert tools[0] is weather
    assert isinstance(tools[1], FunctionTool) and isinstance(tools[2], FunctionTool)
    assert all(isinstance(t, QwenAgentTool) for t in tools[3:]) and tools[4].base_tool is shout
    results = await ConcurrentToolManager(tools).call([
        ToolCall("echo", {"text": "hey"}), ToolCall("calculator", {"expression": "6*7"}),
        ToolCall("needs_key", {}),
    ])
    assert [r.content for r in results] == ["hey", "42", "authorised"]


def test_resolve_tools_takes_a_registered_tool_before_a_qwen_agent_builtin(plugin_manager):
    class StoragePlugin:
        @hookimpl
        def rlfactory_register_tools(self, register):
            def storage(key: str) -> str:
                """Our own storage."""
                return key

            register(storage)

    with registered_plugin(StoragePlugin(), name="own-storage"):
        [tool] = resolve_tools(["storage"])
        assert isinstance(tool, FunctionTool) and tool.description == "Our own storage."
        with pytest.raises(ConfigError, match="registered by a plugin and takes no cfg"):
            resolve_tools([("storage", {"storage_root_path": "/tmp"})])


def test_resolve_tools_rejects_duplicates_and_bad_specs(plugin_manager):
    with pytest.raises(DuplicateComponentError, match="more than one tool named 'echo'"):
        resolve_tools([echo, function_tool(echo)])
    with pytest.raises(DuplicateComponentError, match="'calculator'"):
        resolve_tools(["calculator", "calculator"])
    with pytest.raises(TypeError, match="cannot make a tool from 42"):
        resolve_tools([42])

    class SyncCall(WeatherTool):
        def call(self, arguments, ctx=None):
            return "sync"

    with pytest.raises(RegistrationError, match="method 'call' must be 'async def'"):
        resolve_tools([SyncCall()])
    with pytest.raises(RegistrationError, match="must be an instance, got a class"):
        resolve_tools([WeatherTool])
    with pytest.raises(TypeError, match="expects a list of tool specs, got a str"):
        resolve_tools("calculator")
    with pytest.raises(ConfigError, match="needs 'name' and may have 'cfg'"):
        resolve_tools([{"name": "storage", "config": {}}])
    with pytest.raises(ConfigError, match=r"qwen-agent tool NeedsKey could not be created: ValueError: api_key is required"):
        resolve_tools([NeedsKey])


def test_resolve_tools_names_what_is_available_for_an_unknown_name(plugin_manager):
    with pytest.raises(UnknownComponentError) as info:
        resolve_tools(["calculater"])
    message = str(info.value)
    assert "no tool named 'calculater'" in message and "registered tools: calculator" in message
    assert "qwen-agent built-in tools: " in message and "storage" in message


def test_without_qwen_agent_an_unknown_name_says_how_to_get_its_builtins(plugin_manager, monkeypatch):
    monkeypatch.setitem(sys.modules, "qwen_agent.tools", None)  # makes the import fail
    with pytest.raises(UnknownComponentError) as info:
        resolve_tools(["storage"])
    assert "registered tools: calculator" in str(info.value)
    assert "`pip install qwen-agent` adds qwen-agent's built-in tools" in str(info.value)


def test_importing_the_tool_layer_imports_neither_qwen_agent_nor_jsonschema():
    code = ("import sys, rlfactory_core.tools, rlfactory_core.tool_resolution, "
            "rlfactory_core.default_plugins.tool_managers\n"
            "print(sorted(m for m in ('qwen_agent', 'jsonschema') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


async def test_a_call_whose_arguments_the_parser_could_not_read_is_answered_invalid_arguments_unrun():
    ran = []

    def search(query: str) -> str:
        """Search.

        :param query: what to look for
        """
        ran.append(query)
        return query

    manager = ConcurrentToolManager([function_tool(search)], timeout_s=5)
    [result] = await manager.call([ToolCall("search", {}, id="c1", invalid="the arguments are not valid JSON")])
    assert (result.error, result.content, result.call_id) == ("invalid_arguments",
                                                              "Error: the arguments are not valid JSON", "c1")
    assert ran == []
    # an unknown tool is still unknown_tool, whatever its arguments
    [unknown] = await manager.call([ToolCall("nope", {}, id="c2", invalid="broken")])
    assert unknown.error == "unknown_tool"
