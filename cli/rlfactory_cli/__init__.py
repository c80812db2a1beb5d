"""The ``rlf`` command line: a thin typer app over rlfactory_core's library functions."""

__all__ = ["main"]


def main() -> None:
    from .app import main as _main

    _main()
