"""The root ``rlf`` app and the one place where errors become a red line and an exit code."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated, Optional, Sequence

import typer
from rich.markup import escape

from rlfactory_core import __version__
from rlfactory_core.errors import ConfigError, RLFactoryError

from .console import err, out, setup_logging
from .quiet import set_verbose

__all__ = ["build_app", "run", "main"]

HELP = "RLFactory: reinforcement-learning post-training for LLMs that use tools over many turns."

#: (module in this package, command name): a module with a typer ``app`` is a command
#: group; otherwise its function of the command's name (or ``<name>_command``) is a
#: single command.
_COMMAND_MODULES = (
    ("plugins_cmd", "plugins"),
    ("envs_cmd", "envs"),
    ("models_cmd", "models"),
    ("doctor_cmd", "doctor"),
    ("train_cmd", "train"),
    ("train_cmd", "eval"),
    ("data_cmd", "data"),
    ("plot_cmd", "plot"),
    ("ui_cmd", "ui"),
)


def _version(value: bool) -> None:
    if value:
        out.print(f"rlf {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Show the engines' own output (vLLM, torch, ...) in the terminal "
                                             "instead of the run's log.txt."),
    ] = False,
) -> None:
    """RLFactory: reinforcement-learning post-training for LLMs that use tools over many turns."""
    if verbose:
        set_verbose()


def build_app(with_plugin_commands: bool = True) -> typer.Typer:
    """A fresh app: the built-in command groups, plus the commands plugins add."""
    app = typer.Typer(
        name="rlf",
        help=HELP,
        no_args_is_help=True,
        pretty_exceptions_enable=False,  # errors are handled in run(); configs can hold secrets
        add_completion=False,
    )
    app.callback()(_root)
    for module_name, name in _COMMAND_MODULES:
        module = importlib.import_module(f"{__package__}.{module_name}")
        if hasattr(module, "app"):
            app.add_typer(module.app, name=name)
        else:
            # `eval_command`, not `eval`: the function may not shadow a builtin
            app.command(name)(getattr(module, name, None) or getattr(module, f"{name}_command"))
    if with_plugin_commands:
        from rlfactory_core.plugins import register_commands

        register_commands(app)
    return app


def _debug() -> bool:
    return os.environ.get("RLFACTORY_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def _fail(message: str, hint: str | None, problems: Sequence[str] = ()) -> int:
    """The red ``Error:`` line, one indented line per problem, and the hint. Messages are
    escaped: they quote user input and exception text, whose brackets are not markup."""
    err.print(f"[bold red]Error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    for problem in problems:
        err.print(f"  {escape(problem)}", markup=True, highlight=False, soft_wrap=True)
    if hint:
        err.print(f"[dim]hint: {escape(hint)}[/]", markup=True, highlight=False, soft_wrap=True)
    return 1


def _fail_with(exc: RLFactoryError) -> int:
    problems = exc.errors if isinstance(exc, ConfigError) else []
    if len(problems) > 1:  # one line each, all of them
        return _fail(f"invalid config: {len(problems)} problems", exc.hint, problems)
    return _fail(exc.message, exc.hint)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    setup_logging()
    set_verbose(False)  # a flag of this call only (tests run several in one process)
    try:
        app = build_app()
        # Standalone mode: typer reports its own usage errors; ours propagate to here.
        app(args=argv, prog_name="rlf")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except RLFactoryError as exc:
        if getattr(exc, "exit_code", None):  # TrainingInterrupted: the stop the user asked for, not a failure
            err.print(f"[yellow]stopped:[/] {escape(exc.message)}", markup=True, highlight=False, soft_wrap=True)
            return exc.exit_code
        if _debug():
            raise
        return _fail_with(exc)
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
