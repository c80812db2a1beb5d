"""Built-in tool manager: runs a turn's calls concurrently, each under a timeout."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Sequence

from ..hookspecs import hookimpl
from ..tools import ToolArgumentsError
from ..types import ToolCall, ToolResult


class ConcurrentToolManager:
    """Runs every call of a turn at once; each failure becomes an error result for the model.

    Options: ``timeout_s`` (per call, default 30). Unknown tools, invalid arguments,
    timeouts and exceptions are reported in the result's ``error`` and ``content`` and
    never raised, so one bad call cannot end the rollout of the whole batch.
    """

    name = "concurrent"
    description = "Runs a turn's tool calls concurrently with a per-call timeout; failures become error observations."

    def __init__(self, tools: Sequence[Any], timeout_s: float = 30.0):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.tools = {tool.name: tool for tool in tools}
        self.timeout_s = timeout_s

    async def call(self, calls: Sequence[ToolCall], ctx: dict[str, Any] | None = None) -> list[ToolResult]:
        return list(await asyncio.gather(*(self._call_one(call, ctx) for call in calls)))

    async def _call_one(self, call: ToolCall, ctx: dict[str, Any] | None) -> ToolResult:
        start = time.perf_counter()

        def failed(error: str, content: str) -> ToolResult:
            return ToolResult(name=call.name, call_id=call.id, content=content, error=error,
                              latency_s=time.perf_counter() - start)

        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return failed("unknown_tool", f"Error: there is no tool named {call.name!r}. Available tools: {known}.")
        try:
            result = await asyncio.wait_for(tool.call(call.arguments, ctx), timeout=self.timeout_s)
        except ToolArgumentsError as exc:
            return failed("invalid_arguments", f"Error: {exc}")
        except asyncio.TimeoutError:
            return failed("timeout", f"Error: {call.name} did not finish within {self.timeout_s:g} s.")
        except Exception as exc:  # noqa: BLE001 - a tool's bug is an observation, not a crash
            return failed("exception", f"Error: {call.name} failed: {type(exc).__name__}: {exc}")
        if not isinstance(result, ToolResult):
            result = ToolResult(name=call.name, content=str(result))
        result.call_id = result.call_id or call.id
        result.latency_s = time.perf_counter() - start
        return result

    async def close(self) -> None:
        """Nothing to release: plain tools hold no sessions."""


@hookimpl
def rlfactory_register_tool_managers(register):
    register(ConcurrentToolManager)
