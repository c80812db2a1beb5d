"""What went wrong with an MCP server, in words a user can act on: the cause of a failed
start (inside the exception groups of anyio task groups), and the connection errors that
mean the server is gone."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from rlfactory_core import one_line

from .config import ServerSpec

__all__ = ["CONNECTION_CLOSED", "SPAWN_ERRORS", "cause_in_words", "is_connection_closed", "leaves",
           "offending_input", "quiet_sdk_parse_errors"]

CONNECTION_CLOSED = -32000  # the MCP SDK's error code for a connection that ended
#: What starting a process raises when there is none: no command, no cwd, not executable.
SPAWN_ERRORS = (FileNotFoundError, PermissionError, NotADirectoryError)


def quiet_sdk_parse_errors() -> None:
    """The MCP SDK logs a traceback for each stdout line of a server that is not JSON-RPC;
    the session's message handler (:mod:`rlfactory_mcp.client`) says it in one line instead,
    or in the startup error."""
    sdk_log = logging.getLogger("mcp.client.stdio")
    if not any(isinstance(f, _SDKParseErrorFilter) for f in sdk_log.filters):
        sdk_log.addFilter(_SDKParseErrorFilter())


class _SDKParseErrorFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Failed to parse JSONRPC message from server"


def offending_input(exc: Exception) -> str:
    """The stdout line a JSON-RPC parse error is about, quoted and cut short."""
    line = None
    errors = getattr(exc, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            line = next((e.get("input") for e in errors() if isinstance(e.get("input"), str)), None)
    if line is None:
        return one_line(exc)
    return repr(line if len(line) <= 120 else line[:117] + "...")


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order, cancellations left out:
    anyio task groups wrap the one error that matters in a group of one."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [] if isinstance(exc, asyncio.CancelledError) else [exc]


def cause_in_words(spec: ServerSpec, error: BaseException | None) -> str:
    """What ``error`` (raised while connecting to ``spec``) means for the user, one line."""
    found = leaves(error) if error is not None else []
    if not found:
        return "the connection ended during the MCP handshake"
    exc = found[0]
    if isinstance(exc, FileNotFoundError) and spec.transport == "stdio":
        if spec.cwd and exc.filename == spec.cwd:
            return f"its working directory {spec.cwd!r} (cwd) does not exist (command: {spec.command_line()})"
        return f"command not found: {spec.command!r} (install the server, or give the command's full path)"
    if isinstance(exc, PermissionError) and spec.transport == "stdio":
        return f"cannot run {spec.command!r}: {exc.strerror or exc}"
    name = type(exc).__name__  # httpx's and httpx2's errors alike, without importing either
    if spec.transport != "stdio":
        if name in ("ConnectError", "ConnectTimeout") or isinstance(exc, OSError):
            return f"nothing answers at {spec.url} ({one_line(exc)})"
        response = getattr(exc, "response", None)
        if name == "HTTPStatusError" and response is not None:
            return f"{spec.url} answered HTTP {response.status_code}, not MCP ({one_line(exc)})"
        if name == "MCPError" and not is_connection_closed(exc):
            return f"{spec.url} refused the MCP handshake ({one_line(exc)})"
    if is_connection_closed(exc):
        if spec.transport == "stdio":
            return "it exited (or closed its stdout) during the MCP handshake"
        return "the server closed the connection during the MCP handshake"
    return one_line(exc)


def is_connection_closed(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection to the server ended (the server is gone)."""
    import anyio

    code = getattr(getattr(exc, "error", None), "code", getattr(exc, "code", None))
    return code == CONNECTION_CLOSED or isinstance(
        exc, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, ConnectionError, EOFError))
