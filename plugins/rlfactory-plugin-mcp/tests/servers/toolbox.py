"""An MCP server for the tests, with a tool for each behaviour the client must handle.

    python toolbox.py stdio              # over stdin/stdout (TOOLBOX_OUTLIVE_STDIN=1: keeps
                                         # running after stdin closes, until killed)
    python toolbox.py http PORT          # streamable HTTP on 127.0.0.1:PORT/mcp
    python toolbox.py sse PORT           # SSE on 127.0.0.1:PORT/sse
"""

import asyncio
import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.server.mcpserver.utilities.types import Image
from mcp_types import EmbeddedResource, ResourceLink, TextContent, TextResourceContents

server = MCPServer("toolbox")
_serial = asyncio.Lock()
_in_flight = 0
_peak = 0


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def country(code: str) -> dict:
    """Facts about a country, as structured content."""
    return {"code": code, "name": {"FR": "France", "JP": "Japan"}.get(code, "unknown"), "eu": code == "FR"}


@server.tool()
def picture() -> list:
    """A caption, an image, a linked and an embedded resource."""
    png = bytes.fromhex("89504e470d0a1a0a") + b"\0" * 92  # 100 bytes
    return [TextContent(type="text", text="a red square"), Image(data=png, format="png"),
            ResourceLink(type="resource_link", uri="file:///tmp/square.png", name="square.png"),
            EmbeddedResource(type="resource", resource=TextResourceContents(uri="memo://note", text="note text"))]


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ValueError(reason)


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The value of a request header (HTTP transports), or "none"."""
    headers = ctx.headers or {}
    return headers.get(name.lower(), "none")


@server.tool()
def strict(value: str) -> str:
    """Refuses every value with a JSON-RPC invalid-params error (as strict servers do)."""
    raise MCPError(-32602, f"value {value!r} is not allowed: use one of 'a', 'b'")


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep (without blocking the server), then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
async def whoami(seconds: float = 0.0) -> dict:
    """This server process's pid and the peak number of calls it ran at once."""
    global _in_flight, _peak
    _in_flight += 1
    _peak = max(_peak, _in_flight)
    try:
        await asyncio.sleep(seconds)
        return {"pid": os.getpid(), "peak": _peak}
    finally:
        _in_flight -= 1


@server.tool()
async def one_at_a_time(seconds: float = 0.05) -> dict:
    """A tool that serves one call at a time (a lock around its work); returns the pid."""
    async with _serial:
        await asyncio.sleep(seconds)
        return {"pid": os.getpid()}


@server.tool()
def crash() -> str:
    """Kill this server process."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Block the server's event loop (a hung process): nothing is answered any more."""
    time.sleep(3600)
    return "never"


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        server.run("stdio")
        if os.environ.get("TOOLBOX_OUTLIVE_STDIN"):  # a server that only a kill ends
            time.sleep(3600)
    elif mode == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif mode == "sse":
        server.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: stdio, http PORT or sse PORT")
