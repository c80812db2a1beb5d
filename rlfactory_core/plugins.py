"""The plugin manager: discovery, isolated loading, and the component registries.

Plugins are found through the ``rlfactory`` entry-point group; the built-ins in
:mod:`rlfactory_core.default_plugins` are registered on the same manager first. Each
plugin is imported, registered and called in isolation: one that fails to import, needs
another plugin API (its ``rlfactory_api``: :mod:`rlfactory_core.version`), implements an
unknown hook, or whose hook raises is recorded as ``broken`` (with the reason, shown by
``rlf plugins list``) and logged as a warning, while the others keep working.
``RLFACTORY_STRICT_PLUGINS=1`` turns each of these failures, and every name conflict, into
an exception, for plugin authors and CI. ``RLFACTORY_LOAD_PLUGINS`` is a comma-separated
allow-list of entry-point or distribution names (set but empty: no external plugins at all).

Registries are built on first use: every plugin's registration hooks are called, one
plugin at a time, with a ``register`` callback bound to that plugin, so every component
knows which plugin supplied it. A plugin's registrations land all together or not at all:
one whose registration hook raises is skipped whole, like one that fails to import (no
component of it lands and none of its other hooks is called).

Name conflicts are settled only after every plugin has registered, so the outcome does
not depend on the order plugins load in (``sys.path`` order). A name that two plugins
register for the same kind is refused under its plain name (a training run must never
silently pick one), both plugins show the conflict, and each one's component stays
reachable under a qualified name, ``QUALIFIER:name``, where the qualifier is the
plugin's distribution (``rlfactory-plugin-qwen3:qwen3``) or plugin name: the way out the
error names, accepted wherever a component name is (config, ``--env``,
:func:`get_component`). Two distributions declaring the same entry-point name both load,
as plugins named ``DISTRIBUTION:ENTRY_POINT``.

Size: one module over 600 lines: loading and the registries share one state (``_State``:
the loaded plugins, their reports and the registries built from them) under one lock, and
a rebuild reads and writes both; apart, that state would be private names passed between
modules.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import os
import re
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import pluggy

from . import hookspecs
from .errors import DuplicateComponentError, PluginError, RegistrationError, UnknownComponentError
from .interfaces import COMPONENT_KINDS, check_component
from .tools import function_tool
from .version import VERSION, api_version_problem

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "Conflict",
    "Component",
    "get_plugin_manager",
    "plugin_infos",
    "components",
    "all_components",
    "get_component",
    "usable_name",
    "split_name",
    "notify",
    "register_commands",
    "add_plugin",
    "reset_plugins",
    "watch_plugin_managers",
]

ENTRY_POINT_GROUP = "rlfactory"
STRICT_ENV = "RLFACTORY_STRICT_PLUGINS"
LOAD_ENV = "RLFACTORY_LOAD_PLUGINS"
#: the distribution of a plugin object registered by code (tests), not installed
RUNTIME_DISTRIBUTION = "(registered at run time)"
#: the kind of a :class:`Conflict` over a plugin's own name rather than a component's
ENTRY_POINT_KIND = "entry point"

log = logging.getLogger("rlfactory.plugins")

#: plugin name -> module of the built-ins
DEFAULT_PLUGINS = {
    "rlfactory.tools": "rlfactory_core.default_plugins.tools",
    "rlfactory.tool_managers": "rlfactory_core.default_plugins.tool_managers",
    "rlfactory.rewards": "rlfactory_core.default_plugins.rewards",
    "rlfactory.families": "rlfactory_core.rollout.builtin_families",  # with the families (rollout layer)
}

REGISTRATION_HOOKS = {
    "tool": "rlfactory_register_tools",
    "tool_manager": "rlfactory_register_tool_managers",
    "parser": "rlfactory_register_parsers",
    "env": "rlfactory_register_envs",
    "reward": "rlfactory_register_rewards",
    "family": "rlfactory_register_model_families",
}
assert set(REGISTRATION_HOOKS) == set(COMPONENT_KINDS)


@dataclass
class Conflict:
    """A name that several plugins claim: a component name of one kind, or an entry-point name."""

    kind: str  # a component kind, or ENTRY_POINT_KIND
    name: str
    plugins: list[str]  # every plugin claiming the name, sorted
    use: str  # what names this plugin's one unambiguously
    message: str  # one line for `rlf plugins list`, seen from this plugin


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
    conflicts: list[Conflict] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``broken`` (skipped), ``conflict`` (loaded; some names need qualifying) or ``ok``."""
        return "broken" if self.problems else "conflict" if self.conflicts else "ok"

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
            "conflicts": [asdict(c) for c in self.conflicts],
        }


@dataclass
class Component:
    """A registered component: its kind, name, the object itself and the plugin it came from."""

    kind: str
    name: str
    obj: Any
    plugin: str
    distribution: str = ""

    @property
    def description(self) -> str:
        return getattr(self.obj, "description", "") or ""


class _State:
    def __init__(self) -> None:
        self.pm: pluggy.PluginManager | None = None
        self.infos: dict[str, PluginInfo] = {}
        self.built = False
        # kind -> name -> the one component of that name (conflicting names left out)
        self.registries: dict[str, dict[str, Component]] = {}
        # kind -> name -> every component registered under that name (for qualified names)
        self.by_name: dict[str, dict[str, list[Component]]] = {}
        self.warned: set[tuple[str, str, tuple[str, ...]]] = set()


_state = _State()
# Loading plugins and building registries, one thread at a time (reentrant: a registration
# hook may ask for the plugin manager).
_BUILD_LOCK = threading.RLock()
_watchers: list[Callable[[pluggy.PluginManager], Any]] = []  # see watch_plugin_managers


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


def _normalise_dist(name: str) -> str:
    """A distribution name as packaging compares them (PEP 503: case, '-', '_', '.' alike)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with built-ins and entry-point plugins loaded."""
    if _state.pm is None:
        with _BUILD_LOCK:
            if _state.pm is None:
                _load_plugin_manager()
    return _state.pm


def _load_plugin_manager() -> None:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for watcher in list(_watchers):
        watcher(pm)
    _state.pm = pm
    try:
        _load_default_plugins(pm)
        _load_entry_point_plugins(pm)
    except BaseException:
        _state.pm = None
        _state.infos.clear()
        raise


def watch_plugin_managers(callback: Callable[[pluggy.PluginManager], Any]) -> Callable[[], None]:
    """Call ``callback(pm)`` with the plugin manager in use, if any, and with each one built
    later (after :func:`reset_plugins`), before plugins load on it: how tests install pluggy's
    hook-call monitoring (``pm.add_hookcall_monitoring``) on every manager, which sees every
    hook call (see ``_call_impl``). Returns a function that stops the calls."""
    with _BUILD_LOCK:
        _watchers.append(callback)
        if _state.pm is not None:
            callback(_state.pm)
    return lambda: _watchers.remove(callback) if callback in _watchers else None


def reset_plugins() -> None:
    """Forget the plugin manager and registries; the next use reloads everything (tests)."""
    _state.pm = None
    _state.infos.clear()
    _state.warned.clear()
    _forget_registries()


def _forget_registries() -> None:
    _state.built = False
    _state.registries.clear()
    _state.by_name.clear()


def _load_default_plugins(pm: pluggy.PluginManager) -> None:
    for plugin_name, module_name in DEFAULT_PLUGINS.items():
        module = importlib.import_module(module_name)
        info = PluginInfo(name=plugin_name, distribution="rlfactory", version=VERSION, builtin=True)
        _state.infos[plugin_name] = info
        _register(pm, module, info)


def _allowed_plugins() -> set[str] | None:
    raw = os.environ.get(LOAD_ENV)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _load_entry_point_plugins(pm: pluggy.PluginManager) -> None:
    allowed = _allowed_plugins()
    allowed_dists = {_normalise_dist(name) for name in allowed or ()}
    found: list[tuple[str, str, importlib.metadata.EntryPoint]] = []
    seen: set[tuple[str, str]] = set()
    seen_dists: set[str] = set()
    for dist in importlib.metadata.distributions():
        dist_name = dist.metadata["Name"] or "?"
        key = _normalise_dist(dist_name)
        if dist.metadata["Name"] and key in seen_dists:
            continue  # the same distribution twice on sys.path: the first is the one imports find
        seen_dists.add(key)
        for ep in dist.entry_points:
            if ep.group != ENTRY_POINT_GROUP or (key, ep.name) in seen:
                continue
            seen.add((key, ep.name))
            if allowed is not None and not {ep.name, f"{dist_name}:{ep.name}"} & allowed and key not in allowed_dists:
                continue
            found.append((dist_name, dist.version or "?", ep))
    # Loaded in name order, not sys.path order, so nothing about the outcome (which of two
    # distributions holding one module is reported, the observers' calling order) depends on
    # where a package happens to be installed.
    found.sort(key=lambda f: (_normalise_dist(f[0]), f[2].name))
    # Two distributions declaring one entry-point name (or a built-in's name) both load, under
    # names that say whose they are: keeping the first would let sys.path order choose.
    claims: dict[str, list[str]] = {}
    for dist_name, _, ep in found:
        claims.setdefault(ep.name, []).append(dist_name)
    for dist_name, version, ep in found:
        rivals = sorted(d for d in claims[ep.name] if d != dist_name)
        builtin = ep.name in DEFAULT_PLUGINS
        name = f"{dist_name}:{ep.name}" if rivals or builtin else ep.name
        info = _state.infos[name] = PluginInfo(name=name, distribution=dist_name, version=version)
        if rivals or builtin:
            others = [f"built-in plugin {ep.name!r}"] * builtin + [f"{d} (loaded as plugin {d + ':' + ep.name!r})"
                                                                    for d in rivals]
            info.conflicts.append(Conflict(
                kind=ENTRY_POINT_KIND, name=ep.name, use=name,
                plugins=sorted([f"{d}:{ep.name}" for d in claims[ep.name]] + [ep.name] * builtin),
                message=f"entry point {ep.name!r} is also declared by {' and '.join(others)}; "
                        f"this one is loaded as plugin {name!r}"))
        try:
            plugin = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure is the plugin's
            _report(info, f"failed to import {ep.value!r}: {type(exc).__name__}: {exc}", exc)
            continue
        _register(pm, plugin, info)


def _describe(plugin_name: str) -> str:
    info = _state.infos.get(plugin_name)
    if info is None or info.distribution in ("", plugin_name, RUNTIME_DISTRIBUTION):
        return f"plugin {plugin_name!r}"
    return f"plugin {plugin_name!r} ({info.distribution})"


def _register(pm: pluggy.PluginManager, plugin: Any, info: PluginInfo) -> None:
    if problem := api_version_problem(plugin):  # before any hook lands: it would fail mid-run
        _report(info, problem)
        return
    other = pm.get_name(plugin) if pm.is_registered(plugin) else None
    if other is not None:
        _report(info, f"is the same module as {_describe(other)}: one package installed under two "
                      f"distribution names? uninstall one")
        return
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


def add_plugin(plugin: Any, name: str, distribution: str = RUNTIME_DISTRIBUTION, version: str = "") -> PluginInfo:
    """Register a plugin object at run time with the same checks entry-point plugins get.

    Registries already built are dropped, so the plugin's components appear on next use.
    Raises :class:`PluginError` when a plugin of that name is already loaded."""
    pm = get_plugin_manager()
    if name in _state.infos or pm.has_plugin(name):
        loaded = _state.infos.get(name)
        source = f" from {loaded.distribution}" if loaded and loaded.distribution != RUNTIME_DISTRIBUTION else ""
        raise PluginError(f"a plugin named {name!r} is already loaded{source}",
                          hint="register the new one under another name")
    info = _state.infos[name] = PluginInfo(name=name, distribution=distribution, version=version)
    _register(pm, plugin, info)
    _forget_registries()
    return info


def plugin_infos() -> list[PluginInfo]:
    """Every plugin seen, built-ins first, with the components each provides."""
    _build_registries()
    return sorted(_state.infos.values(), key=lambda i: (not i.builtin, i.name))


def _impls(hook_name: str, registration_order: bool = False) -> list[pluggy.HookImpl]:
    """The hook's implementations in pluggy's calling order (last registered first), or in
    registration order: built-ins, then installed plugins, then ones added at run time."""
    pm = get_plugin_manager()
    impls = getattr(pm.hook, hook_name).get_hookimpls()
    return list(impls) if registration_order else list(reversed(impls))


def _call_impl(hook_name: str, impl: pluggy.HookImpl, **kwargs: Any) -> Any:
    # Through pluggy (hook-call monitors see it), one plugin alone (its failure is its own);
    # pluggy passes only the arguments the implementation asks for: that is what lets hooks grow.
    pm = get_plugin_manager()
    results = pm.subset_hook_caller(hook_name, [p for p in pm.get_plugins() if p is not impl.plugin])(**kwargs)
    return results[0] if results else None


def _info_for(plugin_name: str) -> PluginInfo:
    info = _state.infos.get(plugin_name)
    if info is None:  # registered directly on the manager, e.g. by a test
        info = _state.infos[plugin_name] = PluginInfo(name=plugin_name, distribution=RUNTIME_DISTRIBUTION, version="")
    return info


def _collect(info: PluginInfo, impls: dict[str, pluggy.HookImpl]) -> list[Component] | None:
    """Call one plugin's registration hooks; its components, or None when a hook raised."""
    staged: list[Component] = []
    distribution = "" if info.distribution == RUNTIME_DISTRIBUTION else info.distribution
    for kind, impl in impls.items():
        names: set[str] = set()

        def register(obj: Any, _kind: str = kind, _names: set = names) -> None:
            obj = _normalise(_kind, obj)
            check_component(_kind, obj)
            name = obj.name
            if ":" in name:
                raise RegistrationError(f"{_kind} name {name!r} contains ':', which is kept for qualified names "
                                        f"('distribution:name')", hint="rename the component")
            if name in _names:
                raise DuplicateComponentError(f"plugin {info.name!r} registers {_kind} {name!r} twice",
                                              hint="register each name once")
            _names.add(name)
            staged.append(Component(kind=_kind, name=name, obj=obj, plugin=info.name, distribution=distribution))

        try:
            _call_impl(REGISTRATION_HOOKS[kind], impl, register=register)
        except Exception as exc:  # noqa: BLE001 - isolate the plugin
            _report(info, f"{REGISTRATION_HOOKS[kind]} failed: {type(exc).__name__}: {exc}", exc)
            return None
    return staged


def _build_registries() -> None:
    """Every kind's registry, built once from every plugin; conflicts settled at the end.
    Under a lock: observers are notified from tool and reward threads too, and two builds at
    once would call registration hooks twice and unregister a broken plugin twice."""
    if _state.built:
        return
    with _BUILD_LOCK:
        if not _state.built:
            _build_registries_now()


def _build_registries_now() -> None:
    hooks_of: dict[str, dict[str, pluggy.HookImpl]] = {}  # plugin -> kind -> impl, in registration order
    for kind, hook_name in REGISTRATION_HOOKS.items():
        for impl in _impls(hook_name, registration_order=True):
            hooks_of.setdefault(impl.plugin_name, {})[kind] = impl
    by_name: dict[str, dict[str, list[Component]]] = {kind: {} for kind in COMPONENT_KINDS}
    for info in _state.infos.values():
        info.components.clear()
        info.conflicts = [c for c in info.conflicts if c.kind == ENTRY_POINT_KIND]
    pm = get_plugin_manager()
    for plugin_name, impls in hooks_of.items():
        info = _info_for(plugin_name)
        landed = _collect(info, impls)
        if landed is None:
            # Skipped whole: a half-initialised plugin's observers must not shape a run either.
            pm.unregister(name=plugin_name)
            continue
        for component in landed:
            by_name[component.kind].setdefault(component.name, []).append(component)
            info.components.setdefault(component.kind, []).append(component.name)
    registries: dict[str, dict[str, Component]] = {kind: {} for kind in COMPONENT_KINDS}
    conflicts: list[tuple[str, str, list[Component]]] = []
    for kind, names in by_name.items():
        for name, claimed in names.items():
            if len(claimed) == 1:
                registries[kind][name] = claimed[0]
            else:
                conflicts.append((kind, name, claimed))
    if conflicts and _strict():
        kind, name, claimed = min(conflicts, key=lambda c: (c[0], c[1]))
        raise PluginError(
            f"{kind} {name!r} is registered by {' and '.join(sorted(_describe(c.plugin) for c in claimed))}",
            hint=f"unset {STRICT_ENV} to load both and name one as {_qualified_names(claimed)}, or uninstall one")
    for kind, name, claimed in conflicts:
        owners = sorted(c.plugin for c in claimed)
        if (kind, name, tuple(owners)) not in _state.warned:  # once, not at every rebuild
            _state.warned.add((kind, name, tuple(owners)))
            log.warning("%s %r is registered by %s: refused under that name; name the one you mean as %s",
                        kind, name, " and ".join(_describe(o) for o in owners), _qualified_names(claimed))
        for component in claimed:
            others = " and ".join(_describe(o) for o in owners if o != component.plugin)
            use = _qualified_name(component, claimed)
            _info_for(component.plugin).conflicts.append(Conflict(
                kind=kind, name=name, plugins=owners, use=use,
                message=f"{kind} {name!r} is also registered by {others}: neither is used under that name; "
                        f"this one is {use!r}"))
    for info in _state.infos.values():
        for names in info.components.values():
            names.sort()
        info.conflicts.sort(key=lambda c: (c.kind, c.name))
    _state.registries, _state.by_name, _state.built = registries, by_name, True


def _chosen(claimed: list[Component], qualifier: str) -> list[Component]:
    """The components among ``claimed`` that ``qualifier`` names: by distribution first (one
    name per installation: a stray plugin whose entry point is called ``rlfactory`` cannot
    shadow ``rlfactory:calculator``), by plugin name when no distribution matches."""
    if not qualifier:
        return []
    by_distribution = [c for c in claimed
                       if c.distribution and _normalise_dist(qualifier) == _normalise_dist(c.distribution)]
    return by_distribution or [c for c in claimed if qualifier == c.plugin]


def _qualified_name(component: Component, claimed: list[Component]) -> str:
    """``QUALIFIER:name`` naming ``component`` alone among ``claimed`` (its distribution,
    else its plugin name)."""
    for qualifier in (component.distribution, component.plugin):
        if qualifier and _chosen(claimed, qualifier) == [component]:
            return f"{qualifier}:{component.name}"
    return f"{component.plugin}:{component.name}"


def _qualified_names(claimed: list[Component]) -> str:
    return " or ".join(repr(_qualified_name(c, claimed)) for c in sorted(claimed, key=lambda c: c.plugin))


def usable_name(component: Component) -> str:
    """The name that reaches ``component`` alone: its plain name, or ``QUALIFIER:name`` when
    other plugins registered that name too."""
    components(component.kind)
    claimed = _state.by_name[component.kind].get(component.name, [])
    return component.name if len(claimed) <= 1 else _qualified_name(component, claimed)


def split_name(name: str) -> tuple[str | None, str]:
    """``(qualifier, name)`` of a component name as config gives it: ``"qwen3"`` ->
    ``(None, "qwen3")``, ``"rlfactory-plugin-qwen3:qwen3"`` -> ``("rlfactory-plugin-qwen3", "qwen3")``.
    Component names never hold ':' (register refuses them), so the last one splits."""
    qualifier, sep, bare = name.rpartition(":")
    return (qualifier, bare) if sep else (None, name)


def components(kind: str) -> dict[str, Component]:
    """Name -> :class:`Component` for one kind (``tool``, ``parser``, ``env``, ``tool_manager``,
    ``reward``): every name that exactly one plugin registered (see :func:`all_components`)."""
    if kind not in REGISTRATION_HOOKS:
        raise ValueError(f"unknown component kind {kind!r}; expected one of {', '.join(COMPONENT_KINDS)}")
    _build_registries()
    return _state.registries[kind]


def all_components(kind: str) -> list[Component]:
    """Every component of one kind, those whose name several plugins registered included,
    sorted by name and plugin."""
    components(kind)
    return sorted((c for claimed in _state.by_name[kind].values() for c in claimed), key=lambda c: (c.name, c.plugin))


def _normalise(kind: str, obj: Any) -> Any:
    if kind == "tool" and inspect.isfunction(obj):
        return function_tool(obj)
    return obj


def get_component(kind: str, name: str) -> Any:
    """The registered object named ``name``, or ``QUALIFIER:name`` for the one from the
    plugin whose distribution or plugin name is the qualifier; a clear error when it is
    missing or ambiguous."""
    registry = components(kind)
    label = kind.replace("_", " ")
    qualifier, bare = split_name(name)
    claimed = _state.by_name[kind].get(bare, [])
    if qualifier is None:
        if name in registry:
            return registry[name].obj
        if claimed:
            raise DuplicateComponentError(
                f"{label} {name!r} is registered by {' and '.join(sorted(_describe(c.plugin) for c in claimed))}; "
                f"refusing to pick one",
                hint=f"write {_qualified_names(claimed)} where the name goes (the config, --env, key=value), "
                     f"or uninstall one of them")
    else:
        chosen = _chosen(claimed, qualifier)
        if len(chosen) == 1:
            return chosen[0].obj
        if len(chosen) > 1:
            raise DuplicateComponentError(
                f"{label} {name!r}: {qualifier!r} names several plugins "
                f"({', '.join(sorted(_describe(c.plugin) for c in chosen))})",
                hint=f"name the one you mean as {_qualified_names(claimed)}")
        if claimed:
            raise UnknownComponentError(
                f"no {label} {bare!r} from {qualifier!r}: it comes from "
                f"{' and '.join(sorted(_describe(c.plugin) for c in claimed))}; write {_qualified_names(claimed)}",
                hint="the part before ':' is a distribution or plugin name, as `rlf plugins list` shows them")
    available = sorted(registry) + [_qualified_name(c, cs) for cs in _state.by_name[kind].values() if len(cs) > 1
                                    for c in cs]
    raise UnknownComponentError(
        f"no {label} named {name!r} (available: {', '.join(sorted(available)) or 'none'})",
        hint="install the plugin that provides it; `rlf plugins list` shows what is loaded",
    )


def notify(hook_name: str, **kwargs: Any) -> list[Any]:
    """Call an observer hook on every plugin, each in isolation; return the non-None results."""
    _build_registries()  # first, so a plugin whose registration failed is never called, whenever this runs
    results = []
    for impl in _impls(hook_name):
        try:
            result = _call_impl(hook_name, impl, **kwargs)
        except Exception as exc:  # noqa: BLE001 - an observer must not kill a training run
            _report(_info_for(impl.plugin_name), f"{hook_name} raised {type(exc).__name__}: {exc}", exc)
            continue
        if result is not None:
            results.append(result)
    return results


def register_commands(app: Any) -> None:
    """Let every plugin add its commands to the ``rlf`` typer app (isolated per plugin)."""
    notify("rlfactory_register_commands", app=app)
