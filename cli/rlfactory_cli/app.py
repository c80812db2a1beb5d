"""The root ``rlf`` app and the one place where errors become a red line and an exit code."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

import typer

from rlfactory_core import __version__
from rlfactory_core.errors import RLFactoryError

from . import envs_cmd, plugins_cmd
from .console import err, out, setup_logging

app = typer.Typer(
    name="rlf",
    help="RLFactory: reinforcement-learning post-training for LLMs that use tools over many turns.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # errors are handled in main(); configs can hold secrets
    add_completion=False,
)
app.add_typer(plugins_cmd.app, name="plugins")
app.add_typer(envs_cmd.app, name="envs")


def _add_optional_groups() -> None:
    """Command groups added by other modules of this package as they exist."""
    import importlib

    for module_name, group in (("models_cmd", "models"),):
        try:
            module = importlib.import_module(f"{__package__}.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{module_name}":
                raise
            continue
        app.add_typer(module.app, name=group)
    try:
        from .doctor_cmd import doctor
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.doctor_cmd":
            raise
    else:
        app.command("doctor")(doctor)


_add_optional_groups()


def _version(value: bool) -> None:
    if value:
        out.print(f"rlf {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """RLFactory: reinforcement-learning post-training for LLMs that use tools over many turns."""


def _debug() -> bool:
    return os.environ.get("RLFACTORY_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def _fail(message: str, hint: str | None) -> int:
    err.print(f"[bold red]Error:[/] {message}", markup=True, highlight=False, soft_wrap=True)
    if hint:
        err.print(f"[dim]hint: {hint}[/]", markup=True, highlight=False, soft_wrap=True)
    return 1


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` and return the exit code (what tests call)."""
    setup_logging()
    from rlfactory_core.plugins import register_commands

    try:
        register_commands(app)
        # Standalone mode: typer reports its own usage errors; ours propagate to here.
        app(args=argv, prog_name="rlf")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except RLFactoryError as exc:
        if _debug():
            raise
        return _fail(exc.message, exc.hint)
    except KeyboardInterrupt:
        err.print("Interrupted.")
        return 130
    except Exception as exc:  # noqa: BLE001 - the one boundary that turns bugs into one line
        if _debug():
            raise
        return _fail(f"{type(exc).__name__}: {exc}", "this is a bug in rlfactory or a plugin; "
                     "rerun with RLFACTORY_DEBUG=1 for the traceback and report it")
    return 0


def main() -> None:
    sys.exit(run())
