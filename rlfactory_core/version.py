"""The package version and the plugin API version, and the check of a plugin's declared range.

The plugin API is what ``rlfactory_core`` exports (its ``__all__``) plus the hooks of
:mod:`rlfactory_core.hookspecs` and the interfaces of :mod:`rlfactory_core.interfaces`,
and, for a plugin's tests, what ``rlfactory_core.testing`` exports (its ``__all__``).
``PLUGIN_API_VERSION`` is ``MAJOR.MINOR``: the minor grows when something is added (a
hook, an argument, an optional member, an exported name), the major when something a
plugin may use is removed or changed. A plugin states the range it works with as the
attribute ``rlfactory_api`` (a PEP 440 specifier set, e.g. ``">=1.0,<2"``) of the object
its entry point loads (its package module, usually). The plugin manager skips a plugin
whose range does not include the running API and reports it as broken, so a plugin built
for another API fails with one line that says so instead of with an ``AttributeError``
deep inside a run. A plugin that declares nothing is loaded as before.

Kept apart from ``rlfactory_core/__init__.py`` so that core modules can read the versions
without importing the package they are part of.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

__all__ = ["VERSION", "__version__", "PLUGIN_API_VERSION", "API_ATTRIBUTE", "api_version_problem"]

try:
    VERSION = version("rlfactory")
except PackageNotFoundError:  # running from a source tree that is not installed
    VERSION = "0.0.0+unknown"
#: the package's ``__version__`` (``rlfactory_core.__version__``); core modules import ``VERSION``
__version__ = VERSION

#: the version of the plugin API this rlfactory provides (see the module docstring)
PLUGIN_API_VERSION = "1.3"
#: the attribute in which a plugin declares the plugin API versions it supports
API_ATTRIBUTE = "rlfactory_api"

_EXAMPLE = f'{API_ATTRIBUTE} = ">=1.0,<2"'


def api_version_problem(plugin: Any) -> str | None:
    """Why ``plugin`` (the object its entry point loaded) cannot run on this plugin API,
    in one line that says what to do; ``None`` when it can or declares nothing."""
    declared = getattr(plugin, API_ATTRIBUTE, None)
    if declared is None:
        return None
    if not isinstance(declared, str):
        return (f"declares {API_ATTRIBUTE} = {declared!r}, which is not a version range: write it as a string, "
                f"e.g. {_EXAMPLE}")
    try:
        spec = SpecifierSet(declared)
    except InvalidSpecifier:
        return f"declares {API_ATTRIBUTE} = {declared!r}, which is not a version range: write e.g. {_EXAMPLE}"
    running = Version(PLUGIN_API_VERSION)
    if running in spec:
        return None
    fix = ("upgrade rlfactory to a release with that plugin API" if _asks_newer(spec, running)
           else "upgrade the plugin to a release that supports it (or install an rlfactory it supports)")
    return (f"needs plugin API {declared!r} but rlfactory {VERSION} provides plugin API {PLUGIN_API_VERSION}: "
            f"{fix}")


def _asks_newer(spec: SpecifierSet, running: Version) -> bool:
    """Whether some clause of ``spec`` that excludes ``running`` wants a newer API (a lower
    bound above it) rather than an older one."""
    for clause in spec:
        if clause.contains(running, prereleases=True):
            continue
        if clause.operator in (">", ">="):
            return True
        if clause.operator in ("<", "<="):
            continue
        try:
            bound = Version(clause.version.removesuffix(".*"))
        except ValueError:  # an arbitrary-equality clause ('===') names no comparable version
            continue
        if bound > running:
            return True
    return False
