"""``rlf ui``: the local web UI over a runs directory."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Annotated, Optional

import typer

from .console import err, out

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def ui(
    runs_dir: Annotated[Path, typer.Argument(help="the directory of runs to show (rlf train writes runs/)")] = Path("runs"),
    host: Annotated[str, typer.Option("--host", help="address to listen on; anything but loopback lets other "
                                                      "machines reach the UI (the token still guards it)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="port to listen on (0: a free one)", min=0, max=65535)] = 8765,
    token: Annotated[Optional[str], typer.Option(
        "--token", envvar="RLF_UI_TOKEN", help="the access token (default: a new random one, printed)")] = None,
) -> None:
    """Watch runs, read every trajectory token by token, and launch new runs, in the browser."""
    try:
        import uvicorn

        from .ui.app import create_app
        from .ui.security import check_token, new_token
    except ImportError as exc:
        err.print(f"[red]error:[/red] rlf ui needs the ui extra ({exc.name} is missing): "
                  f"pip install 'rlfactory[ui]'")
        raise typer.Exit(1) from None
    if token is not None:
        try:
            check_token(token)
        except ValueError as exc:
            err.print(f"[red]error:[/red] --token: {exc} (or leave it out for a random one)")
            raise typer.Exit(2) from None
    if runs_dir.exists() and not runs_dir.is_dir():
        err.print(f"[red]error:[/red] {runs_dir} is a file; give the directory of runs (rlf train writes runs/)")
        raise typer.Exit(2)
    if not runs_dir.exists():
        err.print(f"[yellow]note:[/yellow] {runs_dir} does not exist yet: made it, empty (runs launched from "
                  f"the UI go there)")
        runs_dir.mkdir(parents=True)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        what = "--port (0: any free port)" if exc.errno == errno.EADDRINUSE else "--host (an address of this machine)"
        err.print(f"[red]error:[/red] cannot listen on {host}:{port} ({exc.strerror or exc}); pick another {what}")
        raise typer.Exit(1) from None
    sock.listen(128)  # connections made once the URL is printed wait for the server, not refused
    port = sock.getsockname()[1]
    token = token or new_token()
    hosts = ["127.0.0.1", "localhost", "[::1]", *_names_of(host)]
    app = create_app(runs_dir, token=token, port=port, allowed_hosts=hosts)
    shown = "127.0.0.1" if host in LOOPBACK else (_names_of(host) or ["127.0.0.1"])[0]
    out.print(f"rlf ui: {runs_dir.resolve()}")
    out.print(f"open  http://{shown}:{port}/?token={token}")
    if host not in LOOPBACK:
        err.print(f"[yellow]warning:[/yellow] listening on {host}: other machines can reach this UI; anyone with "
                  f"the token can start processes here")
    config = uvicorn.Config(app, log_level=os.environ.get("RLF_UI_LOG_LEVEL", "warning"), access_log=False)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])


def _names_of(host: str) -> list[str]:
    """The Host header values a browser on another machine sends for ``host``: the address
    itself, or for a wildcard (0.0.0.0, ::) this machine's name and addresses. Other names
    stay refused (DNS rebinding)."""
    if host in LOOPBACK:
        return []
    if host not in ("0.0.0.0", "::", ""):
        return [f"[{host}]" if ":" in host else host]
    name = socket.gethostname()
    names = [name, socket.getfqdn()]
    try:
        names += socket.gethostbyname_ex(name)[2]
    except OSError:
        pass
    return list(dict.fromkeys(n for n in names if n and not n.startswith("127.")))
