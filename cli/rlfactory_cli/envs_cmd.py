"""``rlf envs``: the environments (task families) plugins provide."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from rlfactory_core.plugins import all_components, usable_name

from .console import out

app = typer.Typer(no_args_is_help=True, help="List the environments you can train on.")


@app.command("list")
def list_envs(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Environments registered by installed plugins (use one with `rlf train --env NAME`)."""
    # Every env, those whose name two plugins registered under the qualified name `--env` takes.
    envs = [(usable_name(c), c) for c in all_components("env")]
    if as_json:
        out.print_json(json.dumps([{"name": name, "plugin": c.plugin, "description": c.description}
                                   for name, c in envs]))
        return
    if not envs:
        out.print("No environments installed. Install an env plugin, e.g. `pip install -e plugins/rlfactory-plugin-nl2sql`, "
                  "or write one: `rlf plugins new NAME --kinds env`.")
        return
    table = Table("name", "plugin", "description")
    for name, c in envs:
        table.add_row(escape(name), escape(c.plugin), escape(c.description))
    out.print(table)
