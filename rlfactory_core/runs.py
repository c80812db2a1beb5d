"""A run's directory: made once per run, never shared, with what it was run with.

``config.yaml`` is the validated config (``rlf train --resume`` and ``rlf eval`` read it),
``plugins.yaml`` the plugins and their versions that the run loaded.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from ._fs import write_text_atomic
from .config import RunConfig
from .errors import RLFactoryError

__all__ = ["new_run_dir", "write_run_files"]


def new_run_dir(config: RunConfig) -> Path:
    """The new run's directory, made: ``run_dir``, else ``runs/<env>-<date>-<time>``, with
    ``-2``, ``-3`` ... when another run started in the same second (made exclusively, so
    two runs never share one)."""
    if config.run_dir:
        path = Path(config.run_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    # A qualified env name (dist:env) or one with a slash must stay one directory name.
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in config.env)
    Path("runs").mkdir(exist_ok=True)
    for suffix in ("", *(f"-{n}" for n in range(2, 1000))):
        path = Path("runs") / f"{name}-{stamp}{suffix}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise RLFactoryError(f"runs/{name}-{stamp}-* already exist 999 times", hint="set run_dir")


def write_run_files(run_dir: Path, config: RunConfig) -> None:
    """``config.yaml`` and ``plugins.yaml`` in ``run_dir``."""
    import yaml

    from .plugins import plugin_infos

    versions = {info.name: f"{info.distribution} {info.version}".strip() for info in plugin_infos()}
    # whole or not at all: `rlf ui` reads them while the run starts
    write_text_atomic(run_dir / "config.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    write_text_atomic(run_dir / "plugins.yaml", yaml.safe_dump(versions, sort_keys=True))
