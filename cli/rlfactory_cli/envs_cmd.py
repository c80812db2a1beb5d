"""``rlf envs``: the environments (task families) plugins provide."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from rlfactory_core.plugins import components

from .console import out

app = typer.Typer(no_args_is_help=True, help="List the environments you can train on.")


@app.command("list")
def list_envs(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Environments registered by installed plugins (use one with `rlf train --env NAME`)."""
    envs = sorted(components("env").values(), key=lambda c: c.name)
    if as_json:
        out.print_json(json.dumps([{"name": c.name, "plugin": c.plugin, "description": c.description} for c in envs]))
        return
    if not envs:
        out.print("No environments installed. Install an env plugin, e.g. `pip install -e plugins/rlfactory-plugin-nl2sql`, "
                  "or write one: `rlf plugins new NAME --kinds env`.")
        return
    table = Table("name", "plugin", "description")
    for c in envs:
        table.add_row(c.name, c.plugin, c.description)
    out.print(table)
