"""``rlf plugins``: what is installed, and scaffolding for new plugins."""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from pathlib import Path
from typing import Annotated, Iterable

import typer
import yaml
from rich.table import Table

from rlfactory_core.errors import RLFactoryError
from rlfactory_core.plugins import plugin_infos

from .console import err, out

__all__ = ["app", "TEMPLATE_KINDS", "DEFAULT_KINDS", "check_plugin_name", "parse_kinds", "create_plugin"]

app = typer.Typer(no_args_is_help=True, help="List installed plugins; create new ones.")

#: The component kinds the plugin template can scaffold, in the order they are listed.
TEMPLATE_KINDS: tuple[str, ...] = ("tool", "reward", "env", "parser")
DEFAULT_KINDS: tuple[str, ...] = ("tool", "reward")
DEFAULT_DESCRIPTION = "Components for RLFactory."
DIST_PREFIX = "rlfactory-plugin-"
# Also checked by the template's hooks/pre_gen_project.py, for direct cookiecutter use.
_NAME_PATTERN = re.compile(r"[a-z0-9]+(?:[-_][a-z0-9]+)*")


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


def check_plugin_name(name: str) -> None:
    """Raise :class:`RLFactoryError` unless ``name`` can name a plugin (``demo`` gives the
    distribution ``rlfactory-plugin-demo`` and the module ``rlfactory_plugin_demo``)."""
    if name.startswith(DIST_PREFIX):
        short = name[len(DIST_PREFIX):]
        raise RLFactoryError(f"plugin name {name!r} already starts with {DIST_PREFIX!r}",
                             hint=f"pass {short!r}: the distribution is named {DIST_PREFIX}{short}")
    if not _NAME_PATTERN.fullmatch(name):
        raise RLFactoryError(f"invalid plugin name {name!r}: use lowercase letters and digits, "
                             "separated by single '-' or '_' (e.g. 'web-search')")


def parse_kinds(kinds: str | Iterable[str]) -> list[str]:
    """The component kinds in ``kinds`` (a comma-separated string or a list), deduplicated and
    in template order; :class:`RLFactoryError` naming the valid ones for an unknown or empty list."""
    parts = kinds.split(",") if isinstance(kinds, str) else list(kinds)
    wanted = {part.strip().lower() for part in parts if part.strip()}
    valid = ", ".join(TEMPLATE_KINDS)
    unknown = sorted(wanted - set(TEMPLATE_KINDS))
    if unknown:
        raise RLFactoryError(f"unknown component kind{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(map(repr, unknown))}; choose from {valid}")
    if not wanted:
        raise RLFactoryError(f"no component kinds given; choose one or more of {valid}")
    return [kind for kind in TEMPLATE_KINDS if kind in wanted]


def create_plugin(
    name: str,
    description: str = DEFAULT_DESCRIPTION,
    kinds: str | Iterable[str] = DEFAULT_KINDS,
    output_dir: str | Path = ".",
) -> Path:
    """Render the plugin template into ``output_dir/rlfactory-plugin-NAME``; return that directory.

    Raises :class:`RLFactoryError` for an invalid name, description or kind, and when the
    directory already exists (nothing is overwritten).
    """
    # Imported here: only this command needs cookiecutter and the template.
    from cookiecutter.exceptions import CookiecutterException
    from cookiecutter.main import cookiecutter

    from .plugin_template import TEMPLATE_DIR

    check_plugin_name(name)
    chosen = parse_kinds(kinds)
    description = description.strip()
    if "\n" in description or "\r" in description:
        raise RLFactoryError("the description must be a single line")
    target = Path(output_dir).resolve() / f"{DIST_PREFIX}{name}"
    if target.exists():
        raise RLFactoryError(f"{target} already exists; nothing was overwritten",
                             hint="choose another NAME or --output-dir, or remove that directory first")
    # A private cookiecutter config: the user's ~/.cookiecutterrc must not change what is
    # generated, and rendering should not leave a replay file in their home directory.
    with tempfile.TemporaryDirectory(prefix="rlf-plugins-new-") as scratch:
        config_file = Path(scratch, "cookiecutter.yaml")
        config_file.write_text(yaml.safe_dump({"replay_dir": scratch, "cookiecutters_dir": scratch}))
        try:
            created = cookiecutter(
                str(TEMPLATE_DIR),
                no_input=True,
                extra_context={"plugin_name": name, "description": description, "kinds": ",".join(chosen)},
                output_dir=str(target.parent),
                config_file=str(config_file),
            )
        except CookiecutterException as exc:
            raise RLFactoryError(f"could not render the plugin template: {exc}",
                                 hint="rerun with RLFACTORY_DEBUG=1 for the traceback") from exc
    return Path(created)


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
    quoted = shlex.quote(str(path))
    err.print(f"Created {path.name} ({', '.join(parse_kinds(kinds))}). Next steps:\n"
              f"  pip install -e {quoted}\n"
              f"  rlf plugins list    # shows {name!r} with its components\n"
              f"  pytest {quoted}", soft_wrap=True, highlight=False, markup=False)
