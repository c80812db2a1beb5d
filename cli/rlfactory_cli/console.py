"""Two consoles: data goes to stdout, diagnostics (progress, warnings, errors) to stderr."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler

__all__ = ["out", "err", "setup_logging"]

out = Console()
err = Console(stderr=True)


def setup_logging() -> None:
    """Route rlfactory's log records (e.g. broken-plugin warnings) to stderr, once."""
    logger = logging.getLogger("rlfactory")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        logger.addHandler(RichHandler(console=err, show_time=False, show_path=False))
        logger.setLevel(logging.INFO)
        logger.propagate = False
