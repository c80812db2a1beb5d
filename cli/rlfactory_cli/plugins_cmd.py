"""``rlf plugins``: what is installed, and scaffolding for new plugins."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from rlfactory_core.plugins import plugin_infos

from .console import out

app = typer.Typer(no_args_is_help=True, help="List installed plugins; create new ones.")


@app.command("list")
def list_plugins(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (one object per plugin) instead of a table.")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="Include the built-in plugins of rlfactory itself.")] = False,
) -> None:
    """Installed plugins: version, hooks implemented, components provided, status."""
    infos = [info for info in plugin_infos() if show_all or not info.builtin]
    if as_json:
        out.print_json(json.dumps([info.to_dict() for info in infos]))
        return
    if not infos:
        out.print("No plugins installed. `rlf plugins list --all` shows the built-ins; "
                  "`rlf plugins new NAME` starts a new plugin.")
        return
    table = Table("name", "version", "hooks", "components", "status")
    for info in infos:
        comps = "\n".join(f"{kind}: {', '.join(names)}" for kind, names in sorted(info.components.items()))
        status = "[green]ok[/]" if info.status == "ok" else "[red]broken[/] (see below)"
        name = info.name + (" [dim](built-in)[/]" if info.builtin else "")
        table.add_row(name, info.version, "\n".join(h.removeprefix("rlfactory_") for h in info.hooks), comps or "-", status)
    out.print(table)
    for info in infos:
        for problem in info.problems:  # in full, below the table, where nothing truncates them
            out.print(f"[red]broken[/] {info.name}: {problem}", soft_wrap=True, highlight=False)
