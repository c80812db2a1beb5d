"""Scaffolding for new plugins: renders the cookiecutter template shipped with the CLI.

The template's source is ``contrib/cookiecutter-rlfactory-plugin/``; it is packaged as
``rlfactory_cli.plugin_template`` so an installed ``rlf`` can render it too.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Iterable

import yaml

from rlfactory_core.errors import RLFactoryError

__all__ = ["TEMPLATE_KINDS", "DEFAULT_KINDS", "DEFAULT_DESCRIPTION", "check_plugin_name", "parse_kinds", "create_plugin"]

#: The component kinds the plugin template can scaffold, in the order they are listed.
TEMPLATE_KINDS: tuple[str, ...] = ("tool", "reward", "env", "parser")
DEFAULT_KINDS: tuple[str, ...] = ("tool", "reward")
DEFAULT_DESCRIPTION = "Components for RLFactory."
DIST_PREFIX = "rlfactory-plugin-"
# Also checked by the template's hooks/pre_gen_project.py, for direct cookiecutter use.
_NAME_PATTERN = re.compile(r"[a-z0-9]+(?:[-_][a-z0-9]+)*")


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
    # cookiecutter (2.7) also writes each rendered hook script to the temp directory and never
    # removes it: the temp directory is the scratch one while it runs.
    with tempfile.TemporaryDirectory(prefix="rlf-plugins-new-") as scratch:
        config_file = Path(scratch, "cookiecutter.yaml")
        config_file.write_text(yaml.safe_dump({"replay_dir": scratch, "cookiecutters_dir": scratch}))
        temp_dir, tempfile.tempdir = tempfile.tempdir, scratch
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
        finally:
            tempfile.tempdir = temp_dir
    return Path(created)
