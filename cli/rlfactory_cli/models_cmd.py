"""``rlf models``: the embedded models and the local model cache.

Data (the table, the JSON, the prepared path) goes to stdout; progress goes to stderr, so
``MODEL=$(rlf models prepare)`` captures just the path.
"""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from rlfactory_core.models import DEFAULT_MODEL, list_models, models_dir, prepare_model

from .console import err, out

app = typer.Typer(no_args_is_help=True, help="List and prepare models (the embedded default and the local cache).")


def _size(size: Optional[int]) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


@app.command("list")
def list_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (one object per model) instead of a table.")] = False,
) -> None:
    """Embedded models (prepared or not) and other model directories in the cache."""
    rows = list_models()
    if as_json:
        out.print_json(json.dumps(rows))
        return
    # The paths all start with the cache dir in the title (the JSON has them in full).
    table = Table("name", "prepared", "size", "source", title=f"models in {models_dir()}",
                  caption="* the default model" if any(row["default"] for row in rows) else None)
    table.columns[0].no_wrap = True
    for row in rows:
        name = ("* " if row["default"] else "") + escape(row["name"])
        prepared = "[green]yes[/]" if row["prepared"] else "[yellow]no[/]"
        table.add_row(name, prepared, _size(row["size"]), escape(row["source"]))
    out.print(table)
    if not all(row["prepared"] for row in rows if row["default"]):
        err.print("The default model is not prepared yet: `rlf models prepare` converts it once "
                  "(it is also prepared on first use).", markup=False, highlight=False)


@app.command("prepare")
def prepare_cmd(
    name: Annotated[str, typer.Argument(help="Embedded model to prepare.", show_default=True)] = DEFAULT_MODEL,
    force: Annotated[bool, typer.Option("--force", help="Convert again even if the cache looks complete.")] = False,
) -> None:
    """Convert an embedded model into a Hugging Face directory in the cache; print its path."""
    path = prepare_model(name, force=force,
                         progress=lambda msg: err.print(msg, markup=False, highlight=False, soft_wrap=True))
    out.print(str(path), markup=False, highlight=False, soft_wrap=True)
