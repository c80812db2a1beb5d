"""The plugin manager: discovery, isolated loading, and the component registries.

Plugins are found through the ``rlfactory`` entry-point group; the built-ins in
:mod:`rlfactory_core.default_plugins` are registered on the same manager first. Each
plugin is imported, registered and called in isolation: one that fails to import, that
implements an unknown hook, or whose hook raises is recorded as ``broken`` (with the
reason, shown by ``rlf plugins list``) and logged as a warning, while the others keep
working. ``RLFACTORY_STRICT_PLUGINS=1`` turns each of these failures into an exception,
for plugin authors and CI. ``RLFACTORY_LOAD_PLUGINS`` is a comma-separated allow-list of
entry-point or distribution names (set but empty: no external plugins at all).

Registries are built the first time a kind is used: the kind's registration hook is
called one plugin at a time with a ``register`` callback bound to that plugin, so every
component knows which plugin supplied it. A plugin's registrations for a kind land all
together or not at all. A name registered by two plugins is an error naming both; the
name is then unusable (asking for it raises) rather than silently resolved to either.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from .errors import DuplicateComponentError, PluginError, UnknownComponentError
from .interfaces import COMPONENT_KINDS, check_component
from .tools import function_tool

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "Component",
    "get_plugin_manager",
    "plugin_infos",
    "components",
    "get_component",
    "notify",
    "register_commands",
    "add_plugin",
    "reset_plugins",
]

ENTRY_POINT_GROUP = "rlfactory"
STRICT_ENV = "RLFACTORY_STRICT_PLUGINS"
LOAD_ENV = "RLFACTORY_LOAD_PLUGINS"

log = logging.getLogger("rlfactory.plugins")

#: plugin name -> module of the built-ins
DEFAULT_PLUGINS = {
    "rlfactory.tools": "rlfactory_core.default_plugins.tools",
    "rlfactory.tool_managers": "rlfactory_core.default_plugins.tool_managers",
    "rlfactory.rewards": "rlfactory_core.default_plugins.rewards",
}

REGISTRATION_HOOKS = {
    "tool": "rlfactory_register_tools",
    "tool_manager": "rlfactory_register_tool_managers",
    "parser": "rlfactory_register_parsers",
    "env": "rlfactory_register_envs",
    "reward": "rlfactory_register_rewards",
}
assert set(REGISTRATION_HOOKS) == set(COMPONENT_KINDS)


@dataclass
class PluginInfo:
    """What ``rlf plugins list`` shows for one plugin."""

    name: str
    distribution: str
    version: str
    builtin: bool = False
    hooks: list[str] = field(default_factory=list)
    components: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "broken" if self.problems else "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "builtin": self.builtin,
            "hooks": self.hooks,
            "components": self.components,
            "status": self.status,
            "problems": self.problems,
        }


@dataclass
class Component:
    """A registered component: its kind, name, the object itself and the plugin it came from."""

    kind: str
    name: str
    obj: Any
    plugin: str

    @property
    def description(self) -> str:
        return getattr(self.obj, "description", "") or ""


class _State:
    def __init__(self) -> None:
        self.pm: pluggy.PluginManager | None = None
        self.infos: dict[str, PluginInfo] = {}
        self.registries: dict[str, dict[str, Component]] = {}
        self.conflicts: dict[str, dict[str, list[str]]] = {}


_state = _State()


def _strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _report(info: PluginInfo, problem: str, exc: BaseException | None = None) -> None:
    """Record a plugin failure; raise instead when strict mode is on."""
    if problem in info.problems and not _strict():
        return  # registries rebuilt after add_plugin() meet the same failure again
    info.problems.append(problem)
    if _strict():
        raise PluginError(f"plugin {info.name!r}: {problem}",
                          hint=f"unset {STRICT_ENV} to skip broken plugins") from exc
    log.warning("plugin %r is broken and was skipped: %s", info.name, problem)


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with built-ins and entry-point plugins loaded."""
    if _state.pm is None:
        pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        pm.add_hookspecs(hookspecs)
        _state.pm = pm
        try:
            _load_default_plugins(pm)
            _load_entry_point_plugins(pm)
        except BaseException:
            _state.pm = None
            _state.infos.clear()
            raise
    return _state.pm


def reset_plugins() -> None:
    """Forget the plugin manager and registries; the next use reloads everything (tests)."""
    _state.pm = None
    _state.infos.clear()
    _state.registries.clear()
    _state.conflicts.clear()


def _load_default_plugins(pm: pluggy.PluginManager) -> None:
    from . import __version__  # here: the package's __init__ may still be importing us

    for plugin_name, module_name in DEFAULT_PLUGINS.items():
        module = importlib.import_module(module_name)
        info = PluginInfo(name=plugin_name, distribution="rlfactory", version=__version__, builtin=True)
        _state.infos[plugin_name] = info
        _register(pm, module, info)


def _allowed_plugins() -> set[str] | None:
    raw = os.environ.get(LOAD_ENV)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _load_entry_point_plugins(pm: pluggy.PluginManager) -> None:
    allowed = _allowed_plugins()
    seen: set[str] = set()
    for dist in importlib.metadata.distributions():
        dist_name = dist.metadata["Name"] or "?"
        for ep in dist.entry_points:
            if ep.group != ENTRY_POINT_GROUP or ep.name in seen:
                continue  # the same dist can be visible twice on sys.path
            seen.add(ep.name)
            if allowed is not None and ep.name not in allowed and dist_name not in allowed:
                continue
            info = PluginInfo(name=ep.name, distribution=dist_name, version=dist.version or "?")
            _state.infos[ep.name] = info
            try:
                plugin = ep.load()
            except Exception as exc:  # noqa: BLE001 - any import failure is the plugin's
                _report(info, f"failed to import {ep.value!r}: {type(exc).__name__}: {exc}", exc)
                continue
            _register(pm, plugin, info)


def _register(pm: pluggy.PluginManager, plugin: Any, info: PluginInfo) -> None:
    try:
        pm.register(plugin, name=info.name)
    except Exception as exc:  # noqa: BLE001 - pluggy validation: bad argument names etc.
        _report(info, f"invalid hook implementation: {exc}", exc)
        return
    problems = []
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.spec is None:
            problems.append(f"implements unknown hook {caller.name!r} (a typo? see PLUGINS.md)")
            continue
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper):
                problems.append(f"hook {caller.name!r} is a wrapper; RLFactory hooks take plain implementations")
        info.hooks.append(caller.name)
    info.hooks.sort()
    if problems:
        pm.unregister(plugin)
        info.hooks.clear()
        _report(info, "; ".join(problems))


def add_plugin(plugin: Any, name: str, distribution: str = "(registered at run time)", version: str = "") -> PluginInfo:
    """Register a plugin object at run time with the same checks entry-point plugins get.

    Registries already built are dropped, so the plugin's components appear on next use.
    """
    pm = get_plugin_manager()
    info = _state.infos[name] = PluginInfo(name=name, distribution=distribution, version=version)
    _register(pm, plugin, info)
    _state.registries.clear()
    _state.conflicts.clear()
    return info


def plugin_infos() -> list[PluginInfo]:
    """Every plugin seen, built-ins first, with the components each provides."""
    get_plugin_manager()
    for kind in COMPONENT_KINDS:
        components(kind)
    return sorted(_state.infos.values(), key=lambda i: (not i.builtin, i.name))


def _impls(hook_name: str, registration_order: bool = False) -> list[pluggy.HookImpl]:
    """The hook's implementations in pluggy's calling order (last registered first), or in
    registration order: built-ins, then installed plugins, then ones added at run time, so
    that in a name clash the plugin that came later is the one reported."""
    pm = get_plugin_manager()
    impls = getattr(pm.hook, hook_name).get_hookimpls()
    return list(impls) if registration_order else list(reversed(impls))


def _call_impl(impl: pluggy.HookImpl, **kwargs: Any) -> Any:
    # Pass only the arguments the implementation asks for: that is what lets hooks grow.
    return impl.function(**{name: kwargs[name] for name in impl.argnames})


def _info_for(plugin_name: str) -> PluginInfo:
    info = _state.infos.get(plugin_name)
    if info is None:  # registered directly on the manager, e.g. by a test
        info = _state.infos[plugin_name] = PluginInfo(name=plugin_name, distribution="(registered at run time)", version="")
    return info


def components(kind: str) -> dict[str, Component]:
    """Name -> :class:`Component` for one kind (``tool``, ``parser``, ``env``, ``tool_manager``,
    ``reward``), built on first use."""
    if kind not in REGISTRATION_HOOKS:
        raise ValueError(f"unknown component kind {kind!r}; expected one of {', '.join(COMPONENT_KINDS)}")
    if kind in _state.registries:
        return _state.registries[kind]
    registry: dict[str, Component] = {}
    conflicts: dict[str, list[str]] = {}
    for info in _state.infos.values():
        info.components.pop(kind, None)
    for impl in _impls(REGISTRATION_HOOKS[kind], registration_order=True):
        info = _info_for(impl.plugin_name)
        staged: dict[str, Component] = {}

        def register(obj: Any, _plugin: str = impl.plugin_name, _staged: dict = staged) -> None:
            obj = _normalise(kind, obj)
            check_component(kind, obj)
            name = obj.name
            other = registry.get(name) or _staged.get(name)
            if other is not None:
                conflicts.setdefault(name, [other.plugin]).append(_plugin)
                raise DuplicateComponentError(
                    f"{kind} {name!r} is registered by both plugin {other.plugin!r} and plugin {_plugin!r}",
                    hint="uninstall one of them, or limit loading with RLFACTORY_LOAD_PLUGINS",
                )
            _staged[name] = Component(kind=kind, name=name, obj=obj, plugin=_plugin)

        try:
            _call_impl(impl, register=register)
        except Exception as exc:  # noqa: BLE001 - isolate the plugin
            _report(info, f"{REGISTRATION_HOOKS[kind]} failed: {type(exc).__name__}: {exc}", exc)
            continue
        registry.update(staged)
        if staged:
            info.components.setdefault(kind, []).extend(sorted(staged))
    for name in conflicts:
        registry.pop(name, None)
    _state.registries[kind] = registry
    _state.conflicts[kind] = conflicts
    return registry


def _normalise(kind: str, obj: Any) -> Any:
    if kind == "tool" and inspect.isfunction(obj):
        return function_tool(obj)
    return obj


def get_component(kind: str, name: str) -> Any:
    """The registered object named ``name``; a clear error when it is missing or ambiguous."""
    registry = components(kind)
    if name in registry:
        return registry[name].obj
    owners = _state.conflicts.get(kind, {}).get(name)
    if owners:
        raise DuplicateComponentError(
            f"{kind} {name!r} is registered by several plugins ({', '.join(map(repr, owners))}); refusing to pick one",
            hint="uninstall one of them, or limit loading with RLFACTORY_LOAD_PLUGINS",
        )
    available = ", ".join(sorted(registry)) or "none"
    raise UnknownComponentError(
        f"no {kind.replace('_', ' ')} named {name!r} (available: {available})",
        hint="install the plugin that provides it; `rlf plugins list` shows what is loaded",
    )


def notify(hook_name: str, **kwargs: Any) -> list[Any]:
    """Call an observer hook on every plugin, each in isolation; return the non-None results."""
    results = []
    for impl in _impls(hook_name):
        try:
            result = _call_impl(impl, **kwargs)
        except Exception as exc:  # noqa: BLE001 - an observer must not kill a training run
            _report(_info_for(impl.plugin_name), f"{hook_name} raised {type(exc).__name__}: {exc}", exc)
            continue
        if result is not None:
            results.append(result)
    return results


def register_commands(app: Any) -> None:
    """Let every plugin add its commands to the ``rlf`` typer app (isolated per plugin)."""
    notify("rlfactory_register_commands", app=app)

