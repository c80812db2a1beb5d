"""Built-in tool manager: runs tool calls concurrently under limits, timeouts, retries and an
optional result cache; every failure becomes an error result for the model."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import logging
import time
from collections import OrderedDict
from typing import Any, Collection, Mapping, Sequence

from ..errors import ConfigError, DuplicateComponentError, RegistrationError
from ..hookspecs import hookimpl
from ..interfaces import check_component, member
from ..outcomes import TOOL_ERROR_KINDS
from ..tools import InfrastructureError, ToolArgumentsError, TransientToolError, invalid_text, valid_text
from ..types import ToolCall, ToolResult

__all__ = ["ConcurrentToolManager", "ERROR_KINDS"]

log = logging.getLogger("rlfactory.tools")

#: The values of ``ToolResult.error`` this manager produces: the core's kinds
#: (:data:`rlfactory_core.outcomes.TOOL_ERROR_KINDS`) but the parser's ``parse_error``.
ERROR_KINDS = tuple(kind for kind in TOOL_ERROR_KINDS if kind != "parse_error")

# Never contained: they stop the process, cancel the caller, or close the coroutine.
_PROPAGATE = (KeyboardInterrupt, SystemExit, asyncio.CancelledError, GeneratorExit)
_TRANSIENT_EXCEPTIONS = (TransientToolError, ConnectionError)
_MAX_MESSAGE_CHARS = 1000  # an exception can carry a whole HTML page; the model needs the gist
_MAX_SCHEMA_ERRORS = 5


class ConcurrentToolManager:
    """Runs tool calls concurrently; each failure becomes an error result for the model.

    One instance is shared by every trajectory of a rollout: ``call()`` may be awaited by
    many tasks at once, and the limits below hold across all of them. ``call()`` never
    raises (except for cancellation, ``KeyboardInterrupt`` and ``SystemExit``): unknown
    tools, invalid arguments, timeouts and exceptions (any ``BaseException`` of a tool)
    come back as results whose ``error`` is one of :data:`ERROR_KINDS` and whose
    ``content`` explains the failure to the model:

    * ``unknown_tool``: no tool has the called name, or the episode does not offer it
      (``ctx["tool_names"]``, set by the rollout to the names of the tools the env's
      ``reset`` returned; the tools themselves must be among the manager's);
    * ``invalid_arguments``: the arguments hold a string that is not valid Unicode (a lone
      surrogate, e.g. from the JSON escape ``"\\ud800"``: no tool ever receives one), or
      fail the tool's ``validate()`` (function tools) or, for other tools, its
      ``parameters`` JSON schema; checked before the call;
    * ``timeout``: an attempt ran longer than ``timeout_s``;
    * ``exception``: the tool raised;
    * ``tool_error``: the tool returned a ``ToolResult`` with ``error`` set (its own error
      string is kept in ``metadata["tool_error"]``).

    Options:

    * ``timeout_s`` (30): limit on each attempt's run time; time spent waiting for a
      concurrency slot does not count. A sync tool's thread cannot be stopped: the timeout
      frees the trajectory, not the thread (see :mod:`rlfactory_core.threads`).
    * ``max_concurrency`` (64): calls running at once, over all trajectories.
    * ``tool_concurrency`` (None): per-tool limit on calls running at once; an int applies
      to each tool, a dict maps tool names to limits (unnamed tools: no own limit).
    * ``max_retries`` (2): retries of a transient failure: a tool raising
      ``TransientToolError`` or ``ConnectionError``, or returning
      ``ToolResult(error=..., transient=True)``. Other exceptions are not retried; a tool
      raising ``InfrastructureError`` (its service failed) gets a result marked
      ``infrastructure=True`` (:mod:`rlfactory_core.outcomes`).
    * ``retry_backoff_s`` (0.05) / ``max_retry_backoff_s`` (2.0): the wait before the first
      retry, doubled for each further one, capped. A retry waits for a slot again.
    * ``retry_timeouts`` (False): whether a timed-out attempt is retried too.
    * ``cache`` (False) / ``cache_size`` (4096): an LRU cache of successful results keyed by
      tool name and arguments; True for every tool or a collection of tool names. Enable it
      only for tools whose result depends on the arguments alone (not on ``ctx`` or on
      state such as a storage tool's). Identical calls made while one is running share it.

    Every result's ``metadata`` has ``attempts`` (tool runs; 0 when served from the cache),
    ``wait_s`` (seconds waiting for concurrency slots) and ``cached``; ``latency_s`` is the
    tool's own run time over all attempts.

    :meth:`metrics` returns these counters (all ints, since construction or the last reset):

    * ``tool_calls``: calls received, including ones for unknown tools;
    * ``tool_calls/<name>``: calls of each of the manager's tools (unknown names are only
      counted in ``tool_errors/unknown_tool``, so a model cannot create unbounded keys);
    * ``tool_errors/<kind>``: results with that error, for each kind in :data:`ERROR_KINDS`;
    * ``tool_retries``: attempts made after a transient failure;
    * ``tool_cache_hits``: calls answered from the cache or by sharing an identical call.

    Limits and in-flight sharing are bound to the event loop that uses them; a manager
    used from a new event loop (one ``asyncio.run`` per step) starts with fresh ones.
    """

    name = "concurrent"
    description = ("Runs tool calls concurrently under global and per-tool limits, with per-call timeouts, "
                   "retries of transient failures and an optional result cache; failures become error observations.")

    def __init__(
        self,
        tools: Sequence[Any],
        *,
        timeout_s: float = 30.0,
        max_concurrency: int = 64,
        tool_concurrency: int | Mapping[str, int] | None = None,
        max_retries: int = 2,
        retry_backoff_s: float = 0.05,
        max_retry_backoff_s: float = 2.0,
        retry_timeouts: bool = False,
        cache: bool | Collection[str] = False,
        cache_size: int = 4096,
    ):
        self.tools: dict[str, Any] = {}
        for tool in tools:
            _check_tool(tool)
            if tool.name in self.tools:
                raise DuplicateComponentError(f"the tool manager was given two tools named {tool.name!r}",
                                              hint="each tool name may appear once: the model calls tools by name")
            self.tools[tool.name] = tool

        problems: list[str] = []
        _check_number(problems, "timeout_s", timeout_s, minimum=0, inclusive=False)
        _check_int(problems, "max_concurrency", max_concurrency, minimum=1)
        _check_int(problems, "max_retries", max_retries, minimum=0)
        _check_number(problems, "retry_backoff_s", retry_backoff_s, minimum=0, inclusive=True)
        _check_number(problems, "max_retry_backoff_s", max_retry_backoff_s, minimum=0, inclusive=True)
        _check_int(problems, "cache_size", cache_size, minimum=1)
        if not isinstance(retry_timeouts, bool):
            problems.append(f"retry_timeouts must be true or false, got {retry_timeouts!r}")
        self.tool_limits = self._tool_limits(problems, tool_concurrency)
        self.cached_tools = self._cached_tools(problems, cache)
        if problems:
            raise ConfigError([f"tool manager {self.name!r}: {p}" for p in problems],
                              hint="see the ConcurrentToolManager docstring for its options")

        self.timeout_s = float(timeout_s)
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.retry_backoff_s = float(retry_backoff_s)
        self.max_retry_backoff_s = float(max_retry_backoff_s)
        self.retry_timeouts = retry_timeouts
        self.cache_size = cache_size
        self._validators = {name: _schema_validator(tool) for name, tool in self.tools.items()}
        self._cache: OrderedDict[tuple[str, str], ToolResult] = OrderedDict()
        self._loop_state: _LoopState | None = None
        self._metrics: dict[str, int] = {}
        self._reset_metrics()

    def _tool_limits(self, problems: list[str], tool_concurrency: Any) -> dict[str, int]:
        if tool_concurrency is None:
            return {}
        if isinstance(tool_concurrency, Mapping):
            unknown = sorted(set(tool_concurrency) - set(self.tools))
            if unknown:
                problems.append(f"tool_concurrency names unknown tools {', '.join(map(repr, unknown))} "
                                f"(tools: {', '.join(sorted(self.tools)) or 'none'})")
            for name, limit in tool_concurrency.items():
                _check_int(problems, f"tool_concurrency[{name!r}]", limit, minimum=1)
            return {name: limit for name, limit in tool_concurrency.items() if name in self.tools}
        if _check_int(problems, "tool_concurrency", tool_concurrency, minimum=1,
                      expected="a positive integer or a mapping of tool names to positive integers"):
            return {name: tool_concurrency for name in self.tools}
        return {}

    def _cached_tools(self, problems: list[str], cache: Any) -> frozenset[str]:
        if isinstance(cache, bool):
            return frozenset(self.tools) if cache else frozenset()
        if isinstance(cache, str) or not isinstance(cache, Collection):
            problems.append(f"cache must be true, false or a list of tool names, got {cache!r}")
            return frozenset()
        unknown = sorted(set(cache) - set(self.tools))
        if unknown:
            problems.append(f"cache names unknown tools {', '.join(map(repr, unknown))} "
                            f"(tools: {', '.join(sorted(self.tools)) or 'none'})")
        return frozenset(cache) & frozenset(self.tools)

    # -- public API -----------------------------------------------------------------------

    async def call(self, calls: Sequence[ToolCall], ctx: dict[str, Any] | None = None) -> list[ToolResult]:
        """Run ``calls`` concurrently; one result per call, in order. Never raises."""
        return list(await asyncio.gather(*(self._call_one(call, ctx) for call in calls)))

    def metrics(self, reset: bool = False) -> dict[str, int]:
        """A copy of the counters (see the class docstring); ``reset=True`` also zeroes them."""
        snapshot = dict(self._metrics)
        if reset:
            self._reset_metrics()
        return snapshot

    async def close(self) -> None:
        """Close the tools that hold resources (a ``close()`` method, sync or async: a
        retriever client, a server session); a tool whose close fails is logged and the
        others are still closed. A shared in-flight call still running ends by itself within
        ``timeout_s`` per attempt."""
        for tool in self.tools.values():
            close = member("tool", tool, "close")
            if not callable(close):
                continue
            try:
                result = close()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # noqa: BLE001 - closing must reach every tool
                log.warning("closing the tool %r failed: %s", tool.name, _describe(exc))

    # -- one call -------------------------------------------------------------------------

    async def _call_one(self, call: ToolCall, ctx: dict[str, Any] | None) -> ToolResult:
        try:
            result = await self._dispatch(call, ctx)
        except _PROPAGATE:
            raise
        except BaseException as exc:  # noqa: BLE001 - a bug here must not end the rollout of a batch
            log.exception("tool manager failed on a call of %r", call.name)
            result = _failure(call.name, "exception", f"Error: {call.name} failed: {_describe(exc)}")
        result.call_id = call.id
        if isinstance(result.content, str):
            # Lone surrogates (bytes decoded with surrogateescape, an echoed exception) would
            # make the observation impossible to tokenize; the model sees U+FFFD instead.
            result.content = valid_text(result.content)
        if result.error is not None:
            self._count(f"tool_errors/{result.error}")
        return result

    async def _dispatch(self, call: ToolCall, ctx: dict[str, Any] | None) -> ToolResult:
        self._count("tool_calls")
        # One manager serves every episode; an episode may offer only some of its tools.
        offered = (ctx or {}).get("tool_names")
        tool = self.tools.get(call.name) if offered is None or call.name in offered else None
        if tool is None:
            known = ", ".join(sorted(self.tools if offered is None else offered)) or "none"
            return _failure(call.name, "unknown_tool",
                            f"Error: there is no tool named {call.name!r}. Available tools: {known}.")
        self._count(f"tool_calls/{call.name}")
        if call.invalid is not None:  # the parser could not read its arguments (ToolCall.invalid)
            return _failure(call.name, "invalid_arguments", f"Error: {call.invalid}")
        problem = self._validate(tool, call.arguments)
        if problem is not None:
            return _failure(call.name, "invalid_arguments", f"Error: {problem}")
        if call.name not in self.cached_tools:
            return await self._execute(tool, call.arguments, ctx)
        return await self._call_cached(tool, call.arguments, ctx)

    def _validate(self, tool: Any, arguments: Any) -> str | None:
        """The problem with ``arguments``, written for the model, or None when they are valid."""
        problem = invalid_text(arguments)
        if problem is not None:
            return f"invalid arguments for {tool.name}: {problem}"
        validate = member("tool", tool, "validate")
        if callable(validate):
            try:
                validate(arguments)
            except ToolArgumentsError as exc:
                return str(exc)
            return None
        validator = self._validators.get(tool.name)
        if validator is None:
            return None
        errors = sorted(validator.iter_errors(arguments), key=lambda e: [str(p) for p in e.absolute_path])
        if not errors:
            return None
        problems = [_schema_error_text(e) for e in errors[:_MAX_SCHEMA_ERRORS]]
        if len(errors) > _MAX_SCHEMA_ERRORS:
            problems.append(f"and {len(errors) - _MAX_SCHEMA_ERRORS} more")
        return f"invalid arguments for {tool.name}: " + "; ".join(problems)

    async def _call_cached(self, tool: Any, arguments: Any, ctx: dict[str, Any] | None) -> ToolResult:
        key = (tool.name, _canonical_json(arguments))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self._count("tool_cache_hits")
            return _served_copy(hit)
        state = self._state()
        task = state.in_flight.get(key)
        leader = task is None
        if leader:
            # A task of its own, so one caller's cancellation cannot fail the callers sharing it.
            task = asyncio.ensure_future(self._execute_and_store(tool, arguments, ctx, key))
            state.in_flight[key] = task
            task.add_done_callback(lambda t: state.in_flight.pop(key, None) if state.in_flight.get(key) is t else None)
        result = await asyncio.shield(task)
        if leader or not result.ok:
            return _copy(result)
        self._count("tool_cache_hits")
        return _served_copy(result)

    async def _execute_and_store(self, tool: Any, arguments: Any, ctx: dict[str, Any] | None,
                                 key: tuple[str, str]) -> ToolResult:
        result = await self._execute(tool, arguments, ctx)
        if result.ok:
            self._cache[key] = _copy(result)
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return result

    async def _execute(self, tool: Any, arguments: Any, ctx: dict[str, Any] | None) -> ToolResult:
        """Run the tool with retries of transient failures; the result carries the bookkeeping."""
        state = self._state()
        attempts, wait_s, run_s = 0, 0.0, 0.0
        while True:
            attempts += 1
            waited, ran, result = await self._attempt(state, tool, arguments, ctx)
            wait_s += waited
            run_s += ran
            if result.ok or not result.transient or attempts > self.max_retries:
                break
            self._count("tool_retries")
            await asyncio.sleep(min(self.retry_backoff_s * 2 ** (attempts - 1), self.max_retry_backoff_s))
        if not result.ok and attempts > 1 and result.error in ("timeout", "exception"):
            result.content += f" (gave up after {attempts} attempts)"
        result.latency_s = run_s
        result.metadata.update(attempts=attempts, wait_s=wait_s, cached=False)
        return result

    async def _attempt(self, state: _LoopState, tool: Any, arguments: Any,
                       ctx: dict[str, Any] | None) -> tuple[float, float, ToolResult]:
        """One run of the tool inside its concurrency slots: (wait_s, run_s, result)."""
        queued = time.perf_counter()
        # Per-tool slot first: a call waiting for its tool must not hold a global slot.
        async with state.tool_slots.get(tool.name) or contextlib.nullcontext(), state.slots:
            started = time.perf_counter()
            task = asyncio.ensure_future(_run_tool(tool, arguments, ctx))
            try:
                done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
            except BaseException:
                task.cancel()
                raise
            finished = time.perf_counter()
        waited, ran = started - queued, finished - started
        if not done:
            # Not awaited: a tool that ignores cancellation must not hold the trajectory.
            task.cancel()
            task.add_done_callback(_retrieve_outcome)
            return waited, ran, _failure(tool.name, "timeout",
                                         f"Error: {tool.name} did not finish within {self.timeout_s:g} s.",
                                         transient=self.retry_timeouts)
        value, exc = task.result()
        if exc is None:
            return waited, ran, _as_result(tool.name, value)
        if isinstance(exc, ToolArgumentsError):
            return waited, ran, _failure(tool.name, "invalid_arguments", f"Error: {_truncate(str(exc))}")
        log.debug("tool %r raised", tool.name, exc_info=exc)
        failure = _failure(tool.name, "exception", f"Error: {tool.name} failed: {_describe(exc)}",
                           transient=isinstance(exc, _TRANSIENT_EXCEPTIONS))
        if isinstance(exc, InfrastructureError):
            failure.infrastructure = True
        return waited, ran, failure

    # -- bookkeeping ----------------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        if self._loop_state is None or self._loop_state.loop is not loop:
            self._loop_state = _LoopState(loop, self.max_concurrency, self.tool_limits)
        return self._loop_state

    def _count(self, key: str) -> None:
        self._metrics[key] = self._metrics.get(key, 0) + 1

    def _reset_metrics(self) -> None:
        self._metrics = {"tool_calls": 0, "tool_retries": 0, "tool_cache_hits": 0}
        self._metrics.update({f"tool_errors/{kind}": 0 for kind in ERROR_KINDS})
        self._metrics.update({f"tool_calls/{name}": 0 for name in self.tools})


class _LoopState:
    """What must belong to one event loop: the semaphores and the shared in-flight calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_concurrency: int, tool_limits: Mapping[str, int]):
        self.loop = loop
        self.slots = asyncio.Semaphore(max_concurrency)
        self.tool_slots = {name: asyncio.Semaphore(limit) for name, limit in tool_limits.items()}
        self.in_flight: dict[tuple[str, str], asyncio.Future[ToolResult]] = {}


async def _run_tool(tool: Any, arguments: Any, ctx: dict[str, Any] | None) -> tuple[Any, BaseException | None]:
    """The tool's return value or exception as a value, so that any ``TimeoutError`` seen
    around this coroutine is the manager's own deadline, never one the tool raised."""
    try:
        return await tool.call(arguments, ctx), None
    except _PROPAGATE:
        raise
    except BaseException as exc:  # noqa: BLE001 - a tool's failure is an observation, not a crash
        return None, exc


def _retrieve_outcome(task: asyncio.Future) -> None:
    # Keeps asyncio from logging "exception was never retrieved" for an abandoned attempt.
    if not task.cancelled():
        task.exception()


def _check_tool(tool: Any) -> None:
    try:
        check_component("tool", tool)
    except RegistrationError as exc:
        raise RegistrationError(
            f"the tool manager cannot use it: {exc.message}",
            hint="rlfactory_core.resolve_tools() turns functions, names and qwen-agent tools into tools",
        ) from None


def _check_int(problems: list[str], name: str, value: Any, minimum: int, expected: str | None = None) -> bool:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = expected or ("a positive integer" if minimum == 1 else f"an integer >= {minimum}")
        problems.append(f"{name} must be {expected}, got {value!r}")
        return False
    return True


def _check_number(problems: list[str], name: str, value: Any, minimum: float, inclusive: bool) -> None:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    # Written so that NaN fails too.
    if not is_number or not (value >= minimum if inclusive else value > minimum):
        expected = f"a number >= {minimum:g}" if inclusive else f"a number > {minimum:g}"
        problems.append(f"{name} must be {expected} (seconds), got {value!r}")


def _schema_validator(tool: Any) -> Any:
    """A compiled jsonschema validator for a tool without its own ``validate()``, or None."""
    if callable(member("tool", tool, "validate")):
        return None
    import jsonschema  # here: plugin loading imports this module and must stay light

    schema = tool.parameters
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        log.warning("tool %r has an invalid parameters schema, its arguments are not checked: %s",
                    tool.name, exc.message)
        return None
    return validator_class(schema)


def _schema_error_text(error: Any) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    message = _truncate(error.message, 200)
    return f"{path}: {message}" if path else message


def _canonical_json(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)


def _truncate(text: str, limit: int = _MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe(exc: BaseException) -> str:
    return _truncate(f"{type(exc).__name__}: {exc}")


def _failure(name: str, kind: str, content: str, transient: bool = False) -> ToolResult:
    return ToolResult(name=name, content=content, error=kind, transient=transient)


def _as_result(name: str, value: Any) -> ToolResult:
    if isinstance(value, ToolResult):
        # A copy: a tool may return the same object twice (a constant), and we annotate it.
        result = _copy(value)
        result.name = name
        if result.infrastructure not in (True, False, None):  # a mark that is not one reads as none
            log.warning("tool %r returned infrastructure=%r (not True, False or None): read as None", name,
                        result.infrastructure)
            result.infrastructure = None
        if result.error is not None:
            result.metadata["tool_error"] = result.error
            result.error = "tool_error"
        return result
    if isinstance(value, str):
        return ToolResult(name=name, content=value)
    return ToolResult(name=name, content=json.dumps(value, ensure_ascii=False, default=str))


def _copy(result: ToolResult) -> ToolResult:
    return dataclasses.replace(result, metadata=dict(result.metadata))


def _served_copy(result: ToolResult) -> ToolResult:
    """A stored result as the answer to another call: no run, no wait."""
    served = _copy(result)
    served.latency_s = 0.0
    served.metadata.update(attempts=0, wait_s=0.0, cached=True)
    return served


@hookimpl
def rlfactory_register_tool_managers(register):
    register(ConcurrentToolManager)
