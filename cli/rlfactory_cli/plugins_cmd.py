"""``rlf plugins``: what is installed, and scaffolding for new plugins."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from rlfactory_core.plugins import PluginInfo, plugin_infos

from .console import err, out
from .scaffold import DEFAULT_DESCRIPTION, DEFAULT_KINDS, TEMPLATE_KINDS, create_plugin, parse_kinds

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="List installed plugins; create new ones.")

@app.command("list")
def list_plugins(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (one object per plugin) instead of a table.")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="Include the built-in plugins of rlfactory itself.")] = False,
) -> None:
    """Installed plugins: version, hooks implemented, components provided, status."""
    everything = plugin_infos()
    infos = [info for info in everything if show_all or not info.builtin]
    hidden = len(everything) - len(infos)
    if as_json:
        out.print_json(json.dumps([info.to_dict() for info in infos]))
        return
    if not infos:
        out.print("No plugins installed. `rlf plugins list --all` shows the built-ins; "
                  "`rlf plugins new NAME` starts a new plugin.")
        return
    table = Table("name", "version", "hooks", "components", "status")
    for info in infos:
        status = {"ok": "[green]ok[/]", "conflict": "[yellow]conflict[/] (see below)"}.get(
            info.status, "[red]broken[/] (see below)")
        name = escape(info.name) + (" [dim](built-in)[/]" if info.builtin else "")
        table.add_row(name, escape(info.version), "\n".join(h.removeprefix("rlfactory_") for h in info.hooks),
                      _components_cell(info), status)
    out.print(table)
    # In full, below the table, where nothing truncates them; escaped: a plugin's text is not markup.
    for info in infos:
        for problem in info.problems:
            out.print(f"[red]broken[/] {escape(info.name)}: {escape(problem)}", soft_wrap=True, highlight=False)
        for conflict in info.conflicts:
            out.print(f"[yellow]conflict[/] {escape(info.name)}: {escape(conflict.message)}", soft_wrap=True,
                      highlight=False)
    if hidden:
        out.print(f"[dim]and {hidden} built-in plugins of rlfactory: `rlf plugins list --all` shows them[/]")


def _components_cell(info: PluginInfo) -> str:
    clashing = {(c.kind, c.name) for c in info.conflicts}
    lines = [f"{kind}: " + ", ".join(escape(n) + (" [yellow](conflict)[/]" if (kind, n) in clashing else "") for n in names)
             for kind, names in sorted(info.components.items())]
    return "\n".join(lines) or "-"


@app.command("new")
def new_plugin(
    name: Annotated[str, typer.Argument(
        help="Plugin name: lowercase letters and digits, separated by '-' or '_'. "
             "'demo' creates rlfactory-plugin-demo with the module rlfactory_plugin_demo.",
        metavar="NAME", show_default=False,
    )],
    description: Annotated[str, typer.Option(help="One-line description for pyproject.toml and the README.")] = DEFAULT_DESCRIPTION,
    kinds: Annotated[str, typer.Option(
        help=f"Component kinds to scaffold, comma-separated, from: {', '.join(TEMPLATE_KINDS)}.",
    )] = ",".join(DEFAULT_KINDS),
    output_dir: Annotated[Path, typer.Option(
        "--output-dir", "-o", help="Where to create the plugin's directory.", file_okay=False,
    )] = Path("."),
) -> None:
    """Create a new plugin package: working components of the chosen kinds, and their tests.

    Prints the new directory on stdout; next steps on stderr.
    """
    path = create_plugin(name, description=description, kinds=kinds, output_dir=output_dir)
    out.print(str(path), soft_wrap=True, highlight=False, markup=False)
    # The test extra brings pytest; quoted whole, as shells would expand or reject `[test]`.
    err.print(f"Created {path.name} ({', '.join(parse_kinds(kinds))}). Next steps:\n"
              f"  pip install -e {shlex.quote(f'{path}[test]')}\n"
              f"  rlf plugins list    # shows {name!r} with its components\n"
              f"  pytest {shlex.quote(str(path))}", soft_wrap=True, highlight=False, markup=False)
