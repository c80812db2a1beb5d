"""``rlf ui``: the local web UI over a runs directory."""

from __future__ import annotations

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
    runs_dir.mkdir(parents=True, exist_ok=True)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        err.print(f"[red]error:[/red] cannot listen on {host}:{port} ({exc.strerror}); "
                  f"pick another with --port (0: any free port)")
        raise typer.Exit(1) from None
    sock.listen(128)  # connections made once the URL is printed wait for the server, not refused
    port = sock.getsockname()[1]
    token = token or new_token()
    hosts = ["127.0.0.1", "localhost", "[::1]"] + ([] if host in LOOPBACK else [f"[{host}]" if ":" in host else host])
    app = create_app(runs_dir, token=token, port=port, allowed_hosts=hosts)
    shown = "127.0.0.1" if host in ("127.0.0.1", "0.0.0.0", "localhost") else (f"[{host}]" if ":" in host else host)
    out.print(f"rlf ui: {runs_dir.resolve()}")
    out.print(f"open  http://{shown}:{port}/?token={token}")
    if host not in LOOPBACK:
        err.print(f"[yellow]warning:[/yellow] listening on {host}: other machines can reach this UI; anyone with "
                  f"the token can start processes here")
    config = uvicorn.Config(app, log_level=os.environ.get("RLF_UI_LOG_LEVEL", "warning"), access_log=False)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
