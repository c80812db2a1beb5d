"""User-facing errors.

Every error a user can cause (bad config, missing plugin, broken model cache ...) is a
subclass of :class:`RLFactoryError`. It carries a one-line message saying what is wrong and
a ``hint`` saying what to do. The CLI turns these into one red line plus the hint and exit
code 1; tracebacks are shown only with ``RLFACTORY_DEBUG=1``.
"""

from __future__ import annotations

__all__ = [
    "RLFactoryError",
    "PluginError",
    "RegistrationError",
    "DuplicateComponentError",
    "UnknownComponentError",
    "ModelError",
    "ConfigError",
    "Interrupted",
    "one_line",
]


class RLFactoryError(Exception):
    """Base class of every error meant for the user, not the developer."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class PluginError(RLFactoryError):
    """A plugin failed to import, or one of its hooks raised (fatal only in strict mode)."""


class RegistrationError(RLFactoryError, TypeError):
    """A plugin passed ``register`` something that does not satisfy the component interface."""


class DuplicateComponentError(RLFactoryError):
    """Two plugins registered a component of the same kind under the same name."""


class UnknownComponentError(RLFactoryError, KeyError):
    """Config or code asked for a component name that no loaded plugin registered."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return RLFactoryError.__str__(self)


class ModelError(RLFactoryError):
    """A model name could not be resolved, prepared or loaded."""


class Interrupted(RLFactoryError):
    """The user stopped the command (Ctrl-C, SIGTERM); the message says what was kept. Not a
    failure: the CLI prints it as ``stopped: ...`` and exits with ``exit_code``, 128 + the
    signal's number as a shell reports it (130 for Ctrl-C)."""

    exit_code = 130


class ConfigError(RLFactoryError):
    """The configuration is invalid; ``errors`` lists every problem found, not just the first.

    Each problem is one line (the CLI prints one per line, so a line break inside one, e.g.
    from a quoted exception, is folded into a space), and a problem found twice by two
    checks is listed once."""

    def __init__(self, errors: list[str], hint: str | None = None):
        lines = (" ".join(part.strip() for part in str(e).splitlines() if part.strip()) for e in errors)
        self.errors = list(dict.fromkeys(line for line in lines if line))
        message = "invalid config: " + "; ".join(self.errors)
        super().__init__(message, hint)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first non-empty line of the message``, cut to ``limit`` characters: how an
    exception is shown in one line of a terminal, a table cell or a trajectory's metadata."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
