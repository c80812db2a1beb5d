"""``rlf data``: build an env's dataset ahead of training."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rlfactory_core.errors import RLFactoryError
from rlfactory_core.interfaces import member
from rlfactory_core.plugins import get_component

from .console import err, out

app = typer.Typer(no_args_is_help=True, help="Build the datasets of envs that make their own.")


@app.command("build")
def build(
    env: Annotated[str, typer.Argument(help="The env whose data to build, e.g. deepsearch.")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Where to write it (default: the env's data "
                                                                  "directory under $RLFACTORY_HOME).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when a complete build exists.")] = False,
) -> None:
    """Build ENV's dataset (its `build_data` method); training builds it on first use anyway."""
    env_cls = get_component("env", env)
    builder = member("env", env_cls, "build_data")
    if builder is None:
        raise RLFactoryError(f"the {env!r} env does not build its own data",
                             hint="it reads the data you give it; see its documentation")
    path = builder(out_dir, force=force, progress=lambda message: err.print(message, highlight=False))
    out.print(f"{env} data: {path}", highlight=False)
