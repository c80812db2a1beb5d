"""MCP server configs: the standard ``mcpServers`` JSON, and RL-Factory's ``mcp_tools.pydata``.

The standard file (Claude Desktop, qwen-agent, RL-Factory, Cursor ...)::

    {"mcpServers": {
        "time":   {"command": "python", "args": ["-m", "mcp_server_time"], "env": {"TZ": "UTC"}},
        "search": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ..."}},
        "legacy": {"url": "http://127.0.0.1:9000/sse", "transport": "sse"}
    }}

A server with ``command`` runs as a subprocess spoken to over stdio; one with ``url`` over
streamable HTTP, or SSE when ``transport`` is ``sse`` (or, with no ``transport``, when the
URL's path ends in ``/sse``, as qwen-agent decides). A ``url`` server may set ``timeout``
and ``sse_read_timeout`` (seconds; the MCP SDK's meaning, see
:func:`rlfactory_mcp.client._http_timeouts`).

RL-Factory keeps the same content in ``envs/configs/mcp_tools.pydata`` as a Python literal,
a list of such dicts (``[{"mcpServers": {...}}]``). It is read with
:func:`ast.literal_eval`, which accepts literals only: the file is never executed.

Every problem of a file is reported at once (:class:`~rlfactory_core.errors.ConfigError`).
"""

from __future__ import annotations

import ast
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from rlfactory_core import ConfigError

__all__ = ["ServerSpec", "load_mcp_config", "parse_mcp_config"]

Transport = Literal["stdio", "streamable-http", "sse"]
_TRANSPORT_NAMES = {"stdio": "stdio", "sse": "sse", "streamable-http": "streamable-http",
                    "streamable_http": "streamable-http", "streamablehttp": "streamable-http", "http": "streamable-http"}
_STDIO_KEYS = {"command", "args", "env", "cwd", "transport", "type", "disabled", "description"}
_HTTP_KEYS = {"url", "transport", "type", "headers", "disabled", "description", "timeout", "sse_read_timeout"}


@dataclass(frozen=True)
class ServerSpec:
    """One server of an MCP config: how to reach it."""

    name: str
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: HTTP servers: seconds for connecting and each request (``timeout``), and for waiting
    #: on the next bytes of a response or event stream (``sse_read_timeout``); None: the MCP
    #: SDK's defaults (30 and 300).
    timeout: float | None = None
    sse_read_timeout: float | None = None

    def describe(self) -> str:
        """The server in a few words, on one line, for messages."""
        if self.transport == "stdio":
            return f"{self.name} ({self.command_line(limit=120)})"
        return f"{self.name} ({self.transport} {self.url})"

    def command_line(self, limit: int = 300) -> str:
        """A stdio server's command as a shell would read it, on one line (newlines in an
        argument, e.g. a ``python -c`` script, written ``\\n``), cut to ``limit`` characters."""
        text = shlex.join([self.command or "", *self.args]).replace("\r", "\\r").replace("\n", "\\n")
        return text if len(text) <= limit else text[: limit - 3] + "..."


def load_mcp_config(path: str | Path) -> dict[str, ServerSpec]:
    """The servers of an MCP config file (``.json``, or RL-Factory's ``.pydata``), by name."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"MCP config {path}: cannot read it ({exc.strerror or exc})"]) from exc
    if path.suffix == ".pydata":
        try:
            data = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
            raise ConfigError([f"MCP config {path}: not a Python literal ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else 'invalid'}); RL-Factory's "
                               "mcp_tools.pydata is a list like [{'mcpServers': {...}}], and nothing in it "
                               "may be code"]) from exc
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError([f"MCP config {path}: not valid JSON (line {exc.lineno}: {exc.msg})"],
                              hint='the file is {"mcpServers": {"name": {"command": ..., "args": [...]}}}') from exc
    return parse_mcp_config(data, source=str(path))


def parse_mcp_config(data: Any, source: str = "MCP config") -> dict[str, ServerSpec]:
    """The servers of an already-parsed config: a ``{"mcpServers": {...}}`` dict or a list
    of them (RL-Factory's form). Disabled servers (``"disabled": true``) are left out."""
    blocks = data if isinstance(data, list) else [data]
    problems: list[str] = []
    servers: dict[str, ServerSpec] = {}
    for number, block in enumerate(blocks):
        where = source if len(blocks) == 1 and not isinstance(data, list) else f"{source}[{number}]"
        if not isinstance(block, dict) or "mcpServers" not in block:
            problems.append(f"{where}: expected an object with an \"mcpServers\" key, got "
                            f"{_kind(block)}{' with keys ' + ', '.join(map(repr, block)) if isinstance(block, dict) else ''}")
            continue
        entries = block["mcpServers"]
        if not isinstance(entries, dict):
            problems.append(f"{where}.mcpServers: expected an object of servers by name, got {_kind(entries)}")
            continue
        for name, entry in entries.items():
            spec = _server(f"{where}.mcpServers.{name}", str(name), entry, problems)
            if spec is None:
                continue
            if spec.name in servers:
                problems.append(f"{where}.mcpServers.{name}: a server named {name!r} is already configured; "
                                "server names must be unique")
                continue
            servers[spec.name] = spec
    if not problems and not servers:
        problems.append(f"{source}: no servers configured (every entry of mcpServers is disabled or it is empty)")
    if problems:
        raise ConfigError(problems, hint='each server is {"command": ..., "args": [...], "env": {...}} '
                                         'or {"url": ..., "transport": "streamable-http"|"sse", "headers": {...}}')
    return servers


def _server(where: str, name: str, entry: Any, problems: list[str]) -> ServerSpec | None:
    if not isinstance(entry, dict):
        problems.append(f"{where}: expected an object, got {_kind(entry)}")
        return None
    if entry.get("disabled") is True:
        return None
    before = len(problems)
    if not name or any(ch.isspace() for ch in name):
        problems.append(f"{where}: the server name {name!r} must be non-empty and without spaces")
    transport_value = entry.get("transport", entry.get("type"))
    transport = None
    if transport_value is not None:
        transport = _TRANSPORT_NAMES.get(str(transport_value).lower())
        if transport is None:
            problems.append(f"{where}.transport: {transport_value!r} is not one of stdio, streamable-http, sse")
    has_command, has_url = "command" in entry, "url" in entry
    if has_command == has_url:
        problems.append(f"{where}: give either \"command\" (a server run over stdio) or \"url\" (an HTTP server), "
                        f"{'not both' if has_command else 'found neither'}")
        return None
    if has_command:
        unknown = sorted(set(entry) - _STDIO_KEYS)
        if unknown:
            problems.append(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} for a stdio server "
                            f"(known: {', '.join(sorted(_STDIO_KEYS))})")
        if transport not in (None, "stdio"):
            problems.append(f"{where}.transport: a server with a command speaks stdio, not {transport}")
        command = entry["command"]
        if not isinstance(command, str) or not command.strip():
            problems.append(f"{where}.command: must be a non-empty string, got {command!r}")
        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
            problems.append(f"{where}.args: must be a list of strings, got {args!r}")
            args = []
        env = _string_map(f"{where}.env", entry.get("env", {}), problems)
        cwd = entry.get("cwd")
        if cwd is not None and (not isinstance(cwd, str) or not Path(cwd).expanduser().is_dir()):
            problems.append(f"{where}.cwd: {cwd!r} is not a directory")
        if len(problems) > before:
            return None
        return ServerSpec(name=name, transport="stdio", command=command, args=tuple(str(a) for a in args), env=env,
                          cwd=str(Path(cwd).expanduser()) if cwd else None)
    unknown = sorted(set(entry) - _HTTP_KEYS)
    if unknown:
        problems.append(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} for an HTTP server "
                        f"(known: {', '.join(sorted(_HTTP_KEYS))})")
    url = entry["url"]
    parsed = urlparse(url) if isinstance(url, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
        problems.append(f"{where}.url: must be an http(s) URL, got {url!r}")
    if transport == "stdio":
        problems.append(f"{where}.transport: a server with a url speaks streamable-http or sse, not stdio")
    headers = _string_map(f"{where}.headers", entry.get("headers", {}), problems)
    timeouts = {}
    for key in ("timeout", "sse_read_timeout"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            problems.append(f"{where}.{key}: must be a number of seconds > 0, got {value!r}")
        timeouts[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if len(problems) > before:
        return None
    assert parsed is not None
    if transport is None:  # qwen-agent's rule: an SSE endpoint is named so
        transport = "sse" if parsed.path.rstrip("/").endswith("/sse") else "streamable-http"
    return ServerSpec(name=name, transport=transport, url=url, headers=headers, **timeouts)


def _string_map(where: str, value: Any, problems: list[str]) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        problems.append(f"{where}: must be an object of strings, got {value!r}")
        return {}
    bad = [k for k, v in value.items() if not isinstance(v, (str, int, float)) or isinstance(v, bool)]
    if bad:
        problems.append(f"{where}: the value(s) of {', '.join(map(repr, bad))} must be strings")
        return {}
    return {k: str(v) for k, v in value.items()}


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
