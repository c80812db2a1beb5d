"""MCP servers as RLFactory tools: long-lived sessions, pools, timeouts, restarts.

:func:`load_mcp_tools` reads an MCP config (:mod:`rlfactory_mcp.config`), lists every
server's tools once, and returns one :class:`MCPTool` per tool, with the server's name,
description and JSON schema, ready for any tool manager.

How calls reach the servers:

* **One long-lived session per server** (per process), opened on the first call and shared
  by all concurrent calls: MCP multiplexes requests over one connection. For servers that
  handle one call at a time, ``pool_size: N`` starts N processes (or HTTP sessions) and
  sends each call to the one with the fewest calls in flight.
* **Per-call timeout** (``timeout_s``). A call that runs out of time is followed by a
  liveness probe (a ``tools/list`` request, ``probe_timeout_s``): if the server answers, the
  tool is just slow and the call fails as a timeout; if not, the server is hung.
* **Restarts**: a server whose connection closed (crashed, killed) or that is hung is
  restarted, and the call retried once. Concurrent calls that saw the same failure share
  one restart, one liveness probe and one warning line, which counts them. A failure of
  the retry is the call's error.
* **Clean shutdown**: :meth:`MCPToolset.close` (the tool manager's ``close()`` at the end of
  a run) ends every session; the MCP SDK terminates each stdio server's process tree.
  A server's stderr goes to a log file (``stderr_log``).
* **Startup failures** are one line, the cause first (:mod:`rlfactory_mcp.failures`): a
  command not found, a process that exited (with the end of its stderr), a program that
  writes something else than JSON-RPC on stdout (it fails a few seconds later, not after
  ``connect_timeout_s``), an HTTP server that refuses the connection or the handshake;
  then a stdio server's command and stderr log.
* **Results** (:func:`result_text`, in :mod:`rlfactory_mcp.results`): text content and
  embedded text resources as they are; structured content as JSON (unless the text parts
  already say it, as the spec recommends servers send); images, audio, binary resources
  and resource links as a short note (``[image: image/png, 2048 bytes]``). ``isError``
  results become tool errors the model sees; the server's refusal of the arguments
  (``-32602``) an invalid-arguments error.

Sessions belong to the event loop that opened them; a toolset used from a new loop (a
second ``asyncio.run``) drops the old sessions and opens new ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from rlfactory_core import (ConfigError, InfrastructureError, RLFactoryError, ToolArgumentsError, ToolResult,
                            TransientToolError, one_line)

from .config import ServerSpec, load_mcp_config
from .failures import (SPAWN_ERRORS, cause_in_words, is_connection_closed, leaves, offending_input,
                       quiet_sdk_parse_errors)
from .results import result_text

__all__ = ["MCPTool", "MCPToolset", "MCPServerError", "ServerOptions", "load_mcp_tools", "result_text"]

log = logging.getLogger("rlfactory.mcp")

_INVALID_PARAMS = -32602
# How long a server that wrote a non-JSON-RPC line during the handshake has to complete it.
_NOT_MCP_GRACE_S = 3.0
_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")
# The MCP SDK's MCP_DEFAULT_TIMEOUT and MCP_DEFAULT_SSE_READ_TIMEOUT (in a private module).
_HTTP_TIMEOUT_S = 30.0
_SSE_READ_TIMEOUT_S = 300.0


class MCPTimeoutError(InfrastructureError, TimeoutError):
    """A call the server did not answer in time (a slow tool, or a hung server, restarted): the
    service's failure, not the call's (rlfactory_core.outcomes)."""


class MCPConnectionLost(TransientToolError):
    """The server's connection was lost again after a restart: worth a later retry (the tool
    manager's); once retries are spent, the trajectory's outcome is tool_unavailable."""


class MCPServerError(RLFactoryError):
    """A server could not be started, reached or listed."""


@dataclass(frozen=True)
class ServerOptions:
    """How RLFactory runs one server (the MCP config says only how to reach it)."""

    pool_size: int = 1
    timeout_s: float = 60.0
    connect_timeout_s: float = 30.0
    probe_timeout_s: float = 5.0

    @staticmethod
    def problems(where: str, options: Mapping[str, Any]) -> list[str]:
        known = set(ServerOptions.__dataclass_fields__)
        problems = [f"{where}: unknown option {key!r} (options: {', '.join(sorted(known))})"
                    for key in options if key not in known]
        for key in known & set(options):
            value = options[key]
            if key == "pool_size":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    problems.append(f"{where}.pool_size: must be an integer >= 1, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                problems.append(f"{where}.{key}: must be a number of seconds > 0, got {value!r}")
        return problems


# --------------------------------------------------------------------------- sessions


class _Session:
    """One open connection to one server. Its owner task enters the MCP client's context
    and leaves it on :meth:`close`: anyio requires both in the same task."""

    def __init__(self, spec: ServerSpec, options: ServerOptions, stderr_log: Path):
        self.spec, self.options, self.stderr_log = spec, options, stderr_log
        self.client: Any = None
        self.in_flight = 0  # calls sent on this session and not answered
        # What went wrong with this session, told once by the call that restarts it: the
        # calls that saw the same failure share that restart and that one line.
        self.failure: str | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._owner: asyncio.Task | None = None
        self._connecting: Any = None  # the anyio cancel scope of the connection, until it is open
        self._not_mcp: str | None = None  # the first stdout line that was not a JSON-RPC message
        self._probe: asyncio.Task | None = None

    async def open(self) -> "_Session":
        self._owner = asyncio.create_task(self._own(), name=f"mcp-session-{self.spec.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.options.connect_timeout_s)
        except asyncio.TimeoutError:
            await self.close()
            raise self._startup_error(self._startup_cause() if self._not_mcp is not None else
                                      f"it did not answer the MCP handshake within "
                                      f"{self.options.connect_timeout_s:g} s (connect_timeout_s)") from None
        if self._error is not None or self.client is None:
            await self.close()
            raise self._startup_error(self._startup_cause()) from self._error
        return self

    async def _own(self) -> None:
        import anyio
        from mcp import Client

        quiet_sdk_parse_errors()
        try:
            with contextlib.ExitStack() as files:
                errlog = (files.enter_context(open(self.stderr_log, "a", encoding="utf-8"))
                          if self.spec.transport == "stdio" else None)
                # Cancelled when the server writes something that is not MCP and does not
                # complete the handshake soon after (_on_message): a program that is not
                # an MCP server fails now, not after connect_timeout_s.
                with anyio.CancelScope() as self._connecting:
                    async with Client(_transport(self.spec, errlog), mode="auto",
                                      message_handler=self._on_message) as client:
                        self._connecting = None
                        if self._not_mcp is not None:  # a banner before the handshake
                            self._warn_not_mcp()
                        self.client = client
                        self._ready.set()
                        await self._stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - reported by open() or seen by the next call
            self._error = exc
        finally:
            self._connecting = None
            self.client = None
            if self.spec.transport == "stdio":
                with contextlib.suppress(OSError):
                    if self.stderr_log.stat().st_size == 0:  # a server that said nothing leaves no file
                        self.stderr_log.unlink()
            self._ready.set()

    async def _on_message(self, message: Any) -> None:
        """The MCP SDK's message handler: server notifications (ignored) and transport
        errors, here a line on a stdio server's stdout that is not a JSON-RPC message. Said
        once per session; during the handshake, the server has _NOT_MCP_GRACE_S more to
        complete it (a banner line) before it is taken for something else than MCP."""
        if not isinstance(message, Exception) or self._not_mcp is not None:
            return
        self._not_mcp = offending_input(message)
        if self._connecting is not None:
            asyncio.get_running_loop().call_later(_NOT_MCP_GRACE_S, self._give_up_connecting)
        else:
            self._warn_not_mcp()

    def _give_up_connecting(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()

    def _warn_not_mcp(self) -> None:
        log.warning("MCP server %s wrote a line on stdout that is not a JSON-RPC message (ignored; later ones are "
                    "not shown): %s", self.spec.describe(), self._not_mcp)

    def _startup_cause(self) -> str:
        """Why the connection could not be opened, in words (the stderr tail comes after)."""
        if self._not_mcp is not None:
            return (f"it wrote {self._not_mcp} on stdout, which is not a JSON-RPC message, and did not complete "
                    "the MCP handshake: it is not an MCP server, or it prints to stdout (an MCP stdio server "
                    "may log to stderr only)")
        return cause_in_words(self.spec, self._error)

    def _startup_error(self, cause: str) -> "MCPServerError":
        """The cause first, then what to look at: a stdio server's stderr and command, or an
        HTTP server's URL."""
        if self.spec.transport != "stdio":
            return MCPServerError(f"MCP server {self.spec.describe()} could not be started: {cause}")
        found = leaves(self._error) if self._error is not None else []
        if found and isinstance(found[0], SPAWN_ERRORS):  # no process: no stderr to show
            return MCPServerError(f"MCP server {self.spec.name!r} could not be started: {cause}")
        kept = f"; stderr log: {self.stderr_log}" if self.stderr_log.exists() else ""
        return MCPServerError(f"MCP server {self.spec.name!r} could not be started: {cause}; {self._stderr_tail()} "
                              f"(command: {self.spec.command_line()}{kept})")

    async def close(self) -> None:
        self._stop.set()
        if self._owner is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._owner), 10)
        except asyncio.TimeoutError:  # a transport that will not close: cancel it
            self._owner.cancel()
            with contextlib.suppress(BaseException):
                await self._owner
        except BaseException:  # noqa: BLE001 - closing must not fail
            pass

    async def responsive(self) -> bool:
        """Whether the server still answers (a ``tools/list`` that skips the client's cache).
        Calls that time out together share one probe."""
        if self.client is None:
            return False
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._probe_once())
        return await asyncio.shield(self._probe)

    async def _probe_once(self) -> bool:
        try:
            await asyncio.wait_for(self.client.list_tools(cache_mode="bypass"), self.options.probe_timeout_s)
            return True
        except asyncio.CancelledError:
            raise
        except BaseException:  # noqa: BLE001 - any failure means no
            return False

    def failed(self, what: str) -> None:
        """Record what happened to this session, with the calls it had in flight then; the
        first report counts (the others are the same event seen by other calls)."""
        if self.failure is None:
            self.failure = f"{what}, with {self.in_flight} call{'s' if self.in_flight != 1 else ''} in flight"

    def _stderr_tail(self) -> str:
        """The last lines of a stdio server's stderr, joined on one line."""
        try:
            tail = [line.strip() for line in self.stderr_log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            tail = []
        return f"its stderr ends with: {' | '.join(tail[-3:])[-500:]}" if tail else "its stderr is empty"


def _transport(spec: ServerSpec, errlog: Any) -> Any:
    if spec.transport == "stdio":
        from mcp.client.stdio import StdioServerParameters, stdio_client

        assert spec.command is not None
        return stdio_client(StdioServerParameters(command=spec.command, args=list(spec.args), env=dict(spec.env),
                                                  cwd=spec.cwd), errlog=errlog)
    assert spec.url is not None
    timeout, read_timeout = _http_timeouts(spec)
    if spec.transport == "sse":
        from mcp.client.sse import sse_client

        return sse_client(spec.url, headers=dict(spec.headers) or None, timeout=timeout, sse_read_timeout=read_timeout)
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    client = httpx2.AsyncClient(headers=dict(spec.headers), timeout=httpx2.Timeout(timeout, read=read_timeout))
    return _closing(streamable_http_client(spec.url, http_client=client), client)


def _http_timeouts(spec: ServerSpec) -> tuple[float, float]:
    """An HTTP server's ``(timeout, sse_read_timeout)`` in seconds: the config's, else the
    MCP SDK's defaults (30 for connecting and each request, 300 for waiting on the next
    bytes of a response or event stream). The same for SSE and streamable HTTP, as in the
    SDK's own ``sse_client`` (whose bare default of 5 s is not used)."""
    return (spec.timeout if spec.timeout is not None else _HTTP_TIMEOUT_S,
            spec.sse_read_timeout if spec.sse_read_timeout is not None else _SSE_READ_TIMEOUT_S)


@contextlib.asynccontextmanager
async def _closing(transport: Any, http_client: Any):
    try:
        async with transport as streams:
            yield streams
    finally:
        await http_client.aclose()


class _ServerPool:
    """``pool_size`` sessions with one server, opened on first use, each restarted when it
    dies or hangs."""

    def __init__(self, spec: ServerSpec, options: ServerOptions, log_dir: Path):
        self.spec, self.options = spec, options
        self._log_dir = log_dir
        self._slots: list[_Session | None] = [None] * options.pool_size
        self._load = [0] * options.pool_size  # calls routed to each slot and not finished
        self._locks: list[asyncio.Lock] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.restarts = 0

    def _stderr_log(self, slot: int) -> Path:
        return self._log_dir / f"mcp-{_TOOL_NAME.sub('_', self.spec.name)}-{os.getpid()}-{slot}.log"

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # sessions of a finished loop cannot be used (or closed) here
            self._loop, self._slots = loop, [None] * self.options.pool_size
            self._load = [0] * self.options.pool_size
            self._locks = [asyncio.Lock() for _ in self._slots]

    async def _session(self, slot: int, replacing: _Session | None = None) -> _Session:
        """The open session in ``slot``; opens one if there is none, or if ``replacing`` is
        still the one there (it failed: only the first caller to see that restarts it)."""
        assert self._locks is not None
        async with self._locks[slot]:
            current = self._slots[slot]
            if current is not None and current is not replacing and current.client is not None:
                return current
            if current is not None:
                self._slots[slot] = None
                await current.close()
                self.restarts += 1
                # One line per restart, however many calls saw the failure.
                log.warning("MCP server %s %s: restarting it%s", self.spec.describe(),
                            current.failure or "lost its connection",
                            ", and retrying them once" if current.failure else "")
            session = await _Session(self.spec, self.options, self._stderr_log(slot)).open()
            self._slots[slot] = session
            return session

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        self._bind_loop()
        # The slot with the fewest calls routed to it, counted from the moment of routing
        # (a burst of first calls spreads over slots whose sessions are still opening).
        slot = min(range(len(self._load)), key=self._load.__getitem__)
        self._load[slot] += 1
        try:
            return await self._call_in(slot, tool, arguments)
        finally:
            self._load[slot] -= 1

    async def _call_in(self, slot: int, tool: str, arguments: dict[str, Any]) -> Any:
        session = await self._session(slot)
        for attempt in (1, 2):
            # Counted until the failure is handled: the first call to report it counts the
            # calls still on the session, itself included.
            session.in_flight += 1
            try:
                return await asyncio.wait_for(session.client.call_tool(tool, arguments), self.options.timeout_s)
            except asyncio.TimeoutError:
                timed_out = MCPTimeoutError(f"{tool} on MCP server {self.spec.name!r} took longer than "
                                            f"{self.options.timeout_s:g} s")
                if await session.responsive():
                    raise timed_out from None  # the tool is slow, the server is fine
                session.failed("does not answer (hung)")
                if attempt == 2:  # hung again: the next call gets a fresh server
                    await self._discard(slot, session)
                    raise timed_out from None
            except Exception as exc:
                if attempt == 2 and _connection_lost(exc, session):
                    raise MCPConnectionLost(f"MCP server {self.spec.name!r} lost its connection again after a "
                                            f"restart: {one_line(exc)}") from exc
                if attempt == 2 or not _connection_lost(exc, session):
                    raise
                session.failed(f"lost its connection ({one_line(exc)})")
            finally:
                session.in_flight -= 1
            session = await self._session(slot, replacing=session)
        raise AssertionError("unreachable")

    async def _discard(self, slot: int, session: _Session) -> None:
        assert self._locks is not None
        async with self._locks[slot]:
            if self._slots[slot] is not session:
                return  # another call that saw it hang dropped it (and said so) already
            self._slots[slot] = None
        log.warning("MCP server %s %s, again after its restart: stopping it; the next call starts it afresh",
                    self.spec.describe(), session.failure or "does not answer (hung)")
        await session.close()

    async def list_tools(self) -> list[Any]:
        self._bind_loop()
        session = await self._session(0)
        tools: list[Any] = []
        cursor = None
        for _ in range(1000):  # a server whose cursor never ends cannot hang startup
            page = await asyncio.wait_for(session.client.list_tools(cursor=cursor), self.options.timeout_s)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def close(self) -> None:
        sessions = [s for s in self._slots if s is not None]
        self._slots = [None] * self.options.pool_size
        if self._loop is asyncio.get_running_loop():
            await asyncio.gather(*(s.close() for s in sessions))


def _connection_lost(exc: BaseException, session: _Session) -> bool:
    return is_connection_closed(exc) or session.client is None  # or the session ended under the call


# --------------------------------------------------------------------------- tools


class MCPTool:
    """One tool of one MCP server, as an RLFactory tool."""

    def __init__(self, name: str, remote_name: str, server: str, description: str, parameters: dict[str, Any],
                 pool: _ServerPool):
        self.name, self.remote_name, self.server = name, remote_name, server
        self.description, self.parameters = description, parameters
        self._pool = pool
        self._toolset: MCPToolset | None = None

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any] | None = None) -> ToolResult:
        from mcp.shared.exceptions import MCPError

        try:
            result = await self._pool.call(self.remote_name, arguments)
        except MCPError as exc:
            if exc.error.code == _INVALID_PARAMS:
                raise ToolArgumentsError(f"{self.name}: {exc.error.message}") from exc
            raise
        text = result_text(result)
        if result.is_error:
            return ToolResult(name=self.name, content=text or f"{self.name} failed", error="tool_error")
        return ToolResult(name=self.name, content=text)

    async def close(self) -> None:
        """Close the toolset this tool belongs to (every server's sessions): tool managers
        close their tools at the end of a run. Closing twice is harmless."""
        if self._toolset is not None:
            await self._toolset.close()

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r}, server={self.server!r})"


class MCPToolset:
    """The tools of every server of an MCP config, and the sessions behind them.

    Built by :func:`load_mcp_tools`; ``tools`` are :class:`MCPTool` objects. ``close()`` ends
    every session (the tools' ``close()`` does it too, so a tool manager that closes its
    tools closes the servers)."""

    def __init__(self, pools: dict[str, _ServerPool], tools: list[MCPTool]):
        self.pools, self.tools = pools, tools
        for tool in tools:
            tool._toolset = self

    async def close(self) -> None:
        await asyncio.gather(*(pool.close() for pool in self.pools.values()))

    @property
    def restarts(self) -> int:
        return sum(pool.restarts for pool in self.pools.values())


def load_mcp_tools(config: str | os.PathLike[str] | Mapping[str, ServerSpec], *,
                   servers: Mapping[str, Mapping[str, Any]] | None = None,
                   include: Iterable[str] | None = None, log_dir: str | os.PathLike[str] | None = None) -> MCPToolset:
    """Start every server of ``config`` (a file or parsed specs), list its tools, stop it
    again, and return the toolset; the sessions for calls open on the first call, in the
    event loop that makes it.

    :param servers: per-server options by server name (:class:`ServerOptions`: ``pool_size``,
        ``timeout_s``, ``connect_timeout_s``, ``probe_timeout_s``); the key ``"*"`` sets them
        for every server.
    :param include: only these tools (their final names); unknown names are an error.
    :param log_dir: where the servers' stderr logs go (default: the temp directory).

    Tool names clash when two servers offer the same name: those tools are then named
    ``<server>-<tool>``. Raises :class:`ConfigError` for bad options and
    :class:`MCPServerError` naming the server that could not be started or listed.
    """
    specs = load_mcp_config(config) if isinstance(config, (str, os.PathLike)) else dict(config)
    servers = dict(servers or {})
    problems = [f"servers.{name}: no server {name!r} in the MCP config (servers: {', '.join(specs)})"
                for name in servers if name != "*" and name not in specs]
    for name, options in servers.items():
        if not isinstance(options, Mapping):
            problems.append(f"servers.{name}: must be an object of options, got {options!r}")
        else:
            problems += ServerOptions.problems(f"servers.{name}", options)
    if problems:
        raise ConfigError(problems)
    directory = Path(log_dir) if log_dir is not None else Path(tempfile.gettempdir())
    directory.mkdir(parents=True, exist_ok=True)
    pools = {name: _ServerPool(spec, ServerOptions(**{**servers.get("*", {}), **servers.get(name, {})}), directory)
             for name, spec in specs.items()}
    listed = _run_in_own_loop(_list_all(pools))
    counts: dict[str, int] = {}
    for remote in listed.values():
        for tool in remote:
            counts[tool.name] = counts.get(tool.name, 0) + 1
    tools: list[MCPTool] = []
    for server, remote in listed.items():
        for tool in remote:
            name = tool.name if counts[tool.name] == 1 else f"{_TOOL_NAME.sub('_', server)}-{tool.name}"
            schema = dict(tool.input_schema or {}) or {"type": "object", "properties": {}}
            tools.append(MCPTool(name, tool.name, server, (tool.description or "").strip() or tool.name, schema,
                                 pools[server]))
    if include is not None:
        wanted = list(include)
        known = {tool.name for tool in tools}
        missing = [name for name in wanted if name not in known]
        if missing:
            raise ConfigError([f"include: no tool named {name!r} (the servers offer: {', '.join(sorted(known))})"
                               for name in missing])
        tools = [tool for tool in tools if tool.name in wanted]
    return MCPToolset(pools, tools)


async def _list_all(pools: dict[str, _ServerPool]) -> dict[str, list[Any]]:
    async def one(pool: _ServerPool) -> list[Any]:
        try:
            return await pool.list_tools()
        except MCPServerError:
            raise
        except Exception as exc:  # noqa: BLE001 - named with its server
            raise MCPServerError(f"MCP server {pool.spec.describe()} did not list its tools: "
                                 f"{cause_in_words(pool.spec, exc)}") from exc
        finally:
            await pool.close()

    results = await asyncio.gather(*(one(pool) for pool in pools.values()), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        if len(errors) == 1:
            raise errors[0]
        raise MCPServerError("; ".join(one_line(e) for e in errors))
    return dict(zip(pools, results))  # type: ignore[arg-type]


def _run_in_own_loop(coroutine: Any) -> Any:
    """Run ``coroutine`` to completion in a fresh event loop, also when the caller's thread
    already runs one (envs are built inside the trainer's loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlfactory-mcp-list") as pool:
        return pool.submit(asyncio.run, coroutine).result()

