"""The back end of ``rlf ui``'s **New run** page: the form, what is installed, validation,
MCP tool listing and the YAML export. Plain functions returning JSON-serialisable data;
the routes (``app.py``) only call them.

:func:`form_schema`
    The form, generated from :class:`~rlfactory_core.config.RunConfig`'s JSON schema: one
    field per setting (every leaf key ``rlf train --help-config`` lists), grouped by
    section in the schema's order, the settings users change most in a "main" group first.
    A setting added to the schema later appears here with no change to this module.
:func:`choices`
    The installed envs, tools, rewards, parsers and tool managers (each with the plugin and
    distribution it comes from), the models, the presets, and the plugins that failed to load.
:func:`validate`
    The posted form checked by the same function as ``rlf train``
    (:func:`rlfactory_core.preflight.preflight`: the schema, then the components, their
    options, the data and model paths and the run directory; no model, env instance or
    network), every problem at once, one line each with its key; when it passes, the
    config and its YAML for ``rlf train --config FILE``.
:func:`mcp_tools` (async)
    The tools each server of an ``mcpServers`` JSON exposes, through the MCP plugin's public
    functions; one error line per server that cannot be started or listed.
:func:`to_yaml`
    A validated config as the YAML file ``rlf train --config`` reads back to the same config.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from rlfactory_core.config import PRESETS, RunConfig, merge_dicts, merge_layers, parse_overrides, validate_config
from rlfactory_core.errors import ConfigError, RLFactoryError, one_line

__all__ = ["MAIN_SETTINGS", "NOT_OFFERED", "form_schema", "choices", "validate", "mcp_tools", "to_yaml"]

#: The settings a user changes most, shown first and open; every other setting is in its
#: section's group, collapsed. A key that leaves the schema is simply not shown.
MAIN_SETTINGS: tuple[str, ...] = (
    "env", "preset", "model.name", "parser", "tool_manager.name", "rewards", "env_options",
    "rollout.max_turns", "rollout.max_tokens_per_turn", "grpo.group_size", "grpo.prompts_per_step",
    "train.steps", "train.lr", "train.seed", "train.mode", "eval.every", "data.train_size", "backend",
)
#: Settings the form does not offer: Launch refuses them (a launched run is written into the
#: UI's runs directory under a name chosen for it).
NOT_OFFERED = ("run_dir",)

#: Settings whose value is the name of an installed component: the list to pick it from in
#: :func:`choices` (``rewards[].name``: the ``name`` of each item of ``rewards``).
_COMPONENT_OF = {"env": "envs", "parser": "parsers", "tool_manager.name": "tool_managers",
                 "rewards[].name": "rewards", "eval.rewards[].name": "rewards", "model.name": "models"}

_GENERAL = "general"  # the group of the top-level settings that belong to no section
_CONSTRAINTS = {"minimum": "ge", "maximum": "le", "exclusiveMinimum": "gt", "exclusiveMaximum": "lt",
                "minLength": "min_length", "maxLength": "max_length", "minItems": "min_items",
                "maxItems": "max_items"}
# "key: message" or "key (value) ...": the key a problem line of the config checks names.
_KEYED = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+|\[\d+\])*)(?P<sep>: | \()")


# --------------------------------------------------------------------------- the form


def form_schema(env: str | None = None, preset: str | None = None) -> dict[str, Any]:
    """The New-run form, generated from :class:`RunConfig`'s JSON schema.

    ``env`` and ``preset``: the defaults shown are those ``rlf train --env ENV --preset
    PRESET`` would use (an env's ``config_defaults`` change rewards, parser, turn lengths
    ...; the preset goes over them); an env that is not installed adds nothing, and an
    unknown preset gives the schema's own defaults (``defaults_for`` says which were used).

    Returns ``{"fields": {key: field}, "groups": [group], "main": [key], "presets": {name:
    {key: value}}, "defaults_for": {"env": str, "preset": str | None}}``. ``fields`` is in
    the schema's order; each field is::

        {"key": "grpo.group_size", "section": "grpo", "group": "grpo" (or "main"),
         "title": "Group Size", "description": str, "type": TYPE, "nullable": bool,
         "default": the value rlf train would use (JSON), "constraints": {"ge": 2, ...},
         "choices": [...] (type "enum" only), "items": ITEM (type "list" only),
         "component": "envs" | "parsers" | "rewards" | "tool_managers" | "models" | None}

    TYPE is ``int``, ``float``, ``bool``, ``str``, ``enum``, ``list``, ``dict`` or
    ``json`` (a union the other types cannot say, e.g. a list of names or ``all-linear``:
    a YAML/JSON text). ITEM is ``{"type": TYPE, ...}``, and for a list of objects (the
    rewards) ``{"type": "object", "fields": {name: field}}`` with the same field shape.
    ``component``: the value is the name of an installed component, listed by
    :func:`choices` under that key. A group is ``{"name", "title", "description",
    "collapsed": bool, "keys": [key]}``: "main" first (:data:`MAIN_SETTINGS`, open), then
    ``general`` (top-level settings) and one group per section and sub-section (``model``,
    ``model.lora`` ...) in the schema's order, collapsed; each key is in exactly one group.
    """
    schema = RunConfig.model_json_schema()
    defs = schema.get("$defs", {})
    fields: dict[str, dict[str, Any]] = {}
    sections: dict[str, dict[str, Any]] = {}
    _walk(schema, defs, "", "", fields, sections)
    fields = {key: field for key, field in _with_preset(fields).items() if key not in NOT_OFFERED}

    effective, used_env, used_preset = _effective_defaults(env, preset)
    for key, field in fields.items():
        if key == "preset":
            field["default"] = used_preset
        else:
            field["default"] = _lookup(effective, key.split("."), field.get("default"))

    main = [key for key in MAIN_SETTINGS if key in fields]
    groups = [{"name": "main", "title": "Main settings",
               "description": "what most runs change; everything else is in the sections below",
               "collapsed": False, "keys": main}]
    for name, section in sections.items():
        keys = [key for key, field in fields.items() if field["group"] == name and key not in main]
        if keys:
            groups.append({**section, "collapsed": True, "keys": keys})
    for key in main:
        fields[key]["group"] = "main"
    presets = {name: _flatten(values) for name, values in PRESETS.items()}
    return {"fields": fields, "groups": groups, "main": main, "presets": presets,
            "defaults_for": {"env": used_env, "preset": used_preset}}


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` replaced by the definition (its own keys, e.g. the
    description, winning)."""
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is None:
        return node
    target = defs[ref.rsplit("/", 1)[-1]]
    return {**_resolve(target, defs), **node}


def _is_section(node: Mapping[str, Any]) -> bool:
    return node.get("type") == "object" and "properties" in node


def _walk(model: Mapping[str, Any], defs: Mapping[str, Any], prefix: str, group: str,
          fields: dict[str, dict[str, Any]], sections: dict[str, dict[str, Any]]) -> None:
    """Every leaf of ``model`` into ``fields``; every section into ``sections``, in order.
    A leaf is what :func:`rlfactory_core.config.describe` calls one: anything but a
    nested model (a model that may be null, or a list of them, is a leaf)."""
    if not prefix:
        sections[_GENERAL] = {"name": _GENERAL, "title": _GENERAL,
                              "description": "the env, the components and where the run goes"}
    for name, raw in model.get("properties", {}).items():
        key = f"{prefix}{name}"
        node = _resolve(raw, defs)
        if _is_section(node):
            sections[key] = {"name": key, "title": key, "description": raw.get("description")
                             or node.get("description") or ""}
            _walk(node, defs, key + ".", key, fields, sections)
            continue
        fields[key] = {"key": key, "section": key.split(".")[0] if prefix else _GENERAL,
                       "group": group or _GENERAL, **_describe_node(node, defs),
                       "component": _COMPONENT_OF.get(key)}


def _describe_node(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """Title, description, type, nullability, choices, items and constraints of one leaf."""
    info: dict[str, Any] = {"title": node.get("title", ""), "description": node.get("description", ""),
                            "default": node.get("default")}
    info.update(_type_of(node, defs))
    return info


def _type_of(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    branches = [_resolve(b, defs) for b in node.get("anyOf", [])] or [dict(node)]
    nullable = any(b.get("type") == "null" for b in branches)
    branches = [b for b in branches if b.get("type") != "null"]
    constraints = {name: branch[k] for branch in [node, *branches] for k, name in _CONSTRAINTS.items() if k in branch}
    out: dict[str, Any] = {"nullable": nullable, "constraints": constraints}
    if not branches:
        return {**out, "type": "json"}
    choices: list[Any] = []
    if all("enum" in b or "const" in b or b.get("type") == "boolean" for b in branches) and \
            any("enum" in b or "const" in b for b in branches):
        for b in branches:
            choices += b["enum"] if "enum" in b else [b["const"]] if "const" in b else [True, False]
        return {**out, "type": "enum", "choices": choices}
    if len(branches) > 1:
        return {**out, "type": "json"}
    branch = branches[0]
    kind = branch.get("type")
    if kind == "array":
        items = branch.get("items") or (branch.get("prefixItems") or [{}])[0]
        items = _resolve(items, defs)
        if _is_section(items):
            item = {"type": "object",
                    "fields": {name: {"key": name, **_describe_node(_resolve(sub, defs), defs),
                                      "required": name in items.get("required", [])}
                               for name, sub in items["properties"].items()}}
        else:
            item = _type_of(items, defs)
        return {**out, "type": "list", "items": item}
    simple = {"integer": "int", "number": "float", "boolean": "bool", "string": "str", "object": "dict"}
    return {**out, "type": simple.get(kind, "json")}


def _with_preset(fields: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``preset`` (a config-file key, not a schema one) after ``env``."""
    preset = {"key": "preset", "section": _GENERAL, "group": _GENERAL, "title": "Preset",
              "description": "a named starting point applied under the other settings: "
                             + ", ".join(PRESETS) + " (empty: none)",
              "default": None, "type": "enum", "choices": list(PRESETS), "nullable": True, "constraints": {},
              "component": None}
    out: dict[str, dict[str, Any]] = {}
    for key, field in fields.items():
        out[key] = field
        if key == "env":
            out["preset"] = preset
    out.setdefault("preset", preset)
    return out


def _effective_defaults(env: str | None, preset: str | None) -> tuple[dict[str, Any], str, str | None]:
    """The config ``rlf train`` builds from nothing but ``env`` and ``preset``."""
    base = {"env": env} if env else {}
    data, problems = merge_layers(base=base, preset=preset)
    config, schema_problems = validate_config(data)
    if config is None or problems or schema_problems:
        return RunConfig().model_dump(mode="json"), RunConfig.model_fields["env"].default, None
    return config.model_dump(mode="json"), config.env, preset


def _lookup(tree: Any, parts: list[str], fallback: Any) -> Any:
    for part in parts:
        if not isinstance(tree, Mapping) or part not in tree:
            return fallback
        tree = tree[part]
    return tree


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; a setting that is itself a mapping
    (``backend_options``) is kept whole."""
    out: dict[str, Any] = {}
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and value and _fields().get(key, {}).get("type") != "dict":
            out.update(_flatten(value, f"{key}."))
        else:
            out[key] = _jsonable(value)
    return out


def _jsonable(value: Any) -> Any:
    """``value`` as JSON data (what JSON cannot hold becomes its ``repr``)."""
    return json.loads(json.dumps(value, default=repr))


# --------------------------------------------------------------------------- what is installed


def choices() -> dict[str, Any]:
    """What the form can pick from, as installed now.

    Returns::

        {"envs": [{"name", "plugin", "distribution", "description", "options": [OPTION],
                   "parser": str, "rewards": [str], "tools": [str] | None, "defaults": {...}}],
         "tools": [{"name", "plugin", "distribution", "description", "parameters": {JSON schema}}],
         "rewards": [{"name", "plugin", "distribution", "description", "options": [OPTION]}],
         "parsers": [{"name", "plugin", "distribution", "description"}],
         "tool_managers": [{"name", "plugin", "distribution", "description", "options": [OPTION]}],
         "models": {"default": str, "embedded": [str], "available": [MODEL]},
         "presets": [str],
         "errors": [{"plugin", "distribution", "message"}],     # broken plugins, skipped
         "warnings": [{"plugin", "distribution", "message"}]}   # name conflicts

    ``name`` is what the config takes (``QUALIFIER:name`` where two plugins registered the
    name). OPTION is ``{"name", "required": bool, "default": JSON or None}``, from the
    constructor's signature (``**kwargs``: ``{"name": "**kwargs", "required": false}``).
    An env's ``parser`` and ``rewards`` are what a run on it uses unless the config says
    otherwise (its ``config_defaults``, else the schema's); ``tools`` are the tools its class
    declares, None when they are only known once it is built with its options (most envs:
    nothing is instantiated here). MODEL is a row of ``rlf models list``: ``{"name",
    "source", "prepared", "path", "size", "description", "license", "default"}``.
    A plugin that fails to load is an entry of ``errors``, never an exception.
    """
    from rlfactory_core.interfaces import member
    from rlfactory_core.plugins import all_components, plugin_infos, usable_name
    from rlfactory_core.task import parameters_of

    infos = plugin_infos()  # loads every plugin, each in isolation
    by_plugin = {info.name: info for info in infos}
    schema_defaults = RunConfig().model_dump(mode="json")

    def row(component: Any) -> dict[str, Any]:
        info = by_plugin.get(component.plugin)
        return {"name": usable_name(component), "plugin": component.plugin,
                "distribution": component.distribution or (info.distribution if info else ""),
                "description": str(component.description or "")}

    def options(target: Any, skip: int = 0) -> list[dict[str, Any]]:
        parameters = parameters_of(target)
        if parameters is None:
            return []
        out = []
        for p in parameters[skip:]:
            if p.kind is p.VAR_KEYWORD:
                out.append({"name": f"**{p.name}", "required": False, "default": None})
            elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                out.append({"name": p.name, "required": p.default is p.empty,
                            "default": None if p.default is p.empty else _jsonable(p.default)})
        return out

    envs = []
    for component in all_components("env"):
        defaults = _jsonable(dict(member("env", component.obj, "config_defaults") or {}))
        rewards = defaults.get("rewards", schema_defaults["rewards"])
        declared = member("env", component.obj, "tools") or ()
        envs.append({**row(component), "options": options(component.obj),
                     "parser": defaults.get("parser", schema_defaults["parser"]),
                     "rewards": [r.get("name") for r in rewards if isinstance(r, Mapping)],
                     "tools": [getattr(t, "name", str(t)) for t in declared] or None,
                     "defaults": defaults})
    tools = [{**row(c), "parameters": _jsonable(getattr(c.obj, "parameters", {}) or {})}
             for c in all_components("tool")]
    rewards = [{**row(c), "options": options(c.obj)} for c in all_components("reward")]
    parsers = [row(c) for c in all_components("parser")]
    # A tool manager's first argument is the env's tools, passed by the run, not an option.
    managers = [{**row(c), "options": options(c.obj, skip=1)} for c in all_components("tool_manager")]

    errors = [{"plugin": info.name, "distribution": info.distribution, "message": problem}
              for info in infos for problem in info.problems]
    warnings = [{"plugin": info.name, "distribution": info.distribution, "message": conflict.message}
                for info in infos for conflict in info.conflicts]
    return {"envs": envs, "tools": tools, "rewards": rewards, "parsers": parsers, "tool_managers": managers,
            "models": _models(errors), "presets": list(PRESETS), "errors": errors, "warnings": warnings}


def _models(errors: list[dict[str, Any]]) -> dict[str, Any]:
    from rlfactory_core.models import DEFAULT_MODEL, EMBEDDED_MODELS, list_models

    try:
        available = _jsonable(list_models())
    except (OSError, RLFactoryError) as exc:  # an unreadable cache must not hide the rest of the page
        errors.append({"plugin": "", "distribution": "rlfactory", "message": f"models: {one_line(exc)}"})
        available = []
    return {"default": DEFAULT_MODEL, "embedded": list(EMBEDDED_MODELS), "available": available}


# --------------------------------------------------------------------------- validation


def validate(values: Mapping[str, Any], runs_dir: str | Path | None = None) -> dict[str, Any]:
    """Check a posted New-run form the way ``rlf train`` checks its config.

    ``values``: dotted keys (``grpo.group_size``) or whole sections (``tool_manager``: an
    object, ``rewards``: a list of ``{name, weight, options, ...}``) to their values. A
    string is taken as typed for a ``str`` or text-choice setting (empty: null, where the
    setting may be null), and read as YAML otherwise, as ``rlf train KEY=VALUE`` reads it
    (``"1e-6"``, ``"true"``, ``"[a, b]"``, ``"{k: v}"``); other JSON values as they are.
    The values are one layer over the env's defaults and the preset (``preset`` among
    them), like a ``--config`` file: post only what the user set, or the env's defaults
    (its parser, rewards ...) are overwritten by the schema's.

    The check is :func:`rlfactory_core.preflight.preflight`, the one ``rlf train`` runs
    before anything else: unknown keys, types and ranges, then the env, parser, tool manager
    and rewards installed, their options against their constructors, data files, the model
    (an embedded model's package, a local directory; a hub id as given), optional packages
    the settings need, and the run directory. Nothing is loaded or instantiated, no network.

    With ``runs_dir`` (the UI's: what Launch runs), a ``run_dir`` is refused too: a launched
    run goes into ``runs_dir`` under a name chosen for it, so Check and Launch agree.

    Returns ``{"ok": bool, "errors": [{"key": str, "message": str}], "config": dict | None,
    "yaml": str | None}``: every problem at once, ``key`` the dotted setting it is about
    (``rewards[0].weight``, ``grpo.group_size``) or ``""`` for one about several; ``config``
    (JSON data, every setting) and ``yaml`` (:func:`to_yaml`) when ``ok``.
    """
    from rlfactory_core.preflight import preflight

    if not isinstance(values, Mapping):
        return _result([f"the form must be an object of settings, got {type(values).__name__}"], None)
    tree, problems = _tree(values, _fields())
    try:
        config, checked = preflight(base=tree, purpose="train")
    except RLFactoryError as exc:  # e.g. strict plugin loading
        return _result([*problems, one_line(exc)], None)
    problems = list(dict.fromkeys([*problems, *checked]))
    if runs_dir is not None and tree.get("run_dir"):
        problems.append(f"run_dir: runs launched here are written into {runs_dir} under a name chosen for them: "
                        "leave it empty (or export the YAML and run rlf train yourself)")
    return _result(problems, config if not problems else None)


@functools.lru_cache(maxsize=1)
def _fields() -> dict[str, dict[str, Any]]:
    """Every setting's field (the schema's defaults), by key; read-only (cached)."""
    schema = RunConfig.model_json_schema()
    fields: dict[str, dict[str, Any]] = {}
    _walk(schema, schema.get("$defs", {}), "", "", fields, {})
    return _with_preset(fields)


def _tree(values: Mapping[str, Any], fields: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The form's values as nested config data, strings converted by their settings'
    types; and the values that could not be read."""
    tree: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in values.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            problems.append(f"{key!r}: not a setting (a dotted key such as train.lr)")
            continue
        value, found = _coerce(key, value, fields.get(key))
        problems += found
        if found and not isinstance(value, (list, dict)):
            continue  # left out: the schema would report the same value again, less clearly
        update: Any = value
        for part in reversed(key.split(".")):
            update = {part: update}
        tree = merge_dicts(tree, update)
    return tree, problems


def _coerce(key: str, value: Any, field: Mapping[str, Any] | None) -> tuple[Any, list[str]]:
    """``value`` typed for ``field`` (text kept for text settings, read as YAML for the
    others; the items of a list of objects and the settings of a section given whole by
    their own fields), and the parts that could not be read."""
    if isinstance(value, str):
        kind = field.get("type") if field else None
        if field is not None and field.get("nullable") and not value.strip():
            return None, []
        if kind == "str" or (kind == "enum" and all(isinstance(c, str) for c in field.get("choices", []))):
            return value, []
        return _read_yaml(key, value)
    problems: list[str] = []
    item = (field or {}).get("items") or {}
    if isinstance(value, list) and item.get("type") == "object":  # rewards: [{name, weight, ...}]
        out: list[Any] = []
        for i, entry in enumerate(value):
            if isinstance(entry, Mapping):
                entry, found = _coerce_each(f"{key}[{i}]", entry, item["fields"])
                problems += found
            out.append(entry)
        return out, problems
    if isinstance(value, Mapping) and field is None:  # a section given whole: tool_manager = {name, options}
        known = _fields()
        return _coerce_each(key, value, {name: known.get(f"{key}.{name}") for name in value})
    return copy.deepcopy(value), problems


def _coerce_each(key: str, values: Mapping[str, Any], fields: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    problems: list[str] = []
    for name, sub in values.items():
        value, found = _coerce(f"{key}.{name}", sub, fields.get(name))
        problems += found
        if not found or isinstance(value, (list, dict)):  # what was read is checked with the rest
            out[name] = value
    return out, problems


def _read_yaml(key: str, text: str) -> tuple[Any, list[str]]:
    """``text`` read as ``rlf train key=text`` reads it (YAML; ``1e-6`` a number)."""
    tree, problems = parse_overrides([f"value={text}"])
    if problems:
        return None, [f"{key}:" + problems[0].removeprefix("value:")]
    return tree["value"], []


def _result(problems: list[str], config: RunConfig | None) -> dict[str, Any]:
    errors = [_error(line) for line in ConfigError(problems).errors] if problems else []
    if errors or config is None:
        return {"ok": False, "errors": errors or [{"key": "", "message": "the config is not valid"}],
                "config": None, "yaml": None}
    data = config.model_dump(mode="json")
    return {"ok": True, "errors": [], "config": data, "yaml": to_yaml(data)}


def _error(line: str) -> dict[str, str]:
    """One problem line as ``{"key", "message"}``: ``key: message`` split; a line that
    starts with a key followed by a parenthesis keeps it in the message."""
    match = _KEYED.match(line)
    if match is None:  # a check across settings: "rollout.max_trajectory_tokens must be ..."
        first = line.split(" ", 1)[0]
        return {"key": first if first in _fields() else "", "message": line}
    if match["key"] == "config":
        return {"key": "", "message": line}
    if match["sep"] == ": ":
        return {"key": match["key"], "message": line[match.end():]}
    return {"key": match["key"], "message": line}


# --------------------------------------------------------------------------- YAML


def to_yaml(config: Mapping[str, Any]) -> str:
    """``config`` (a validated config as JSON data, :func:`validate`'s ``config``) as the
    YAML file ``rlf train --config FILE`` reads back to the same config: every setting, in
    the schema's order, as a run's own ``config.yaml`` is written."""
    header = "# rlf train --config THIS_FILE  (written by rlf ui; every setting, in the order of rlf train --help-config)\n"
    return header + yaml.safe_dump(_jsonable(dict(config)), sort_keys=False, allow_unicode=True)


# --------------------------------------------------------------------------- MCP servers


async def mcp_tools(mcp_servers_json: str, timeout_s: float = 20) -> dict[str, Any]:
    """Start each server of an ``mcpServers`` JSON, list its tools, stop it.

    Returns ``{"servers": [{"name": str, "transport": "stdio" | "streamable-http" | "sse",
    "tools": [{"name", "description", "input_schema"}], "error": str | None}],
    "errors": [str]}``. ``errors`` holds what stops every server from being tried (text that
    is not JSON, a config the MCP plugin refuses: one line per problem, or the plugin not
    installed); a server that cannot be started or listed within ``timeout_s`` (for the
    handshake and for the listing each) has its one-line ``error`` and no tools, the others
    are listed all the same. Servers are tried concurrently; none is left running.

    Tool names are as each server gives them; a run on the ``mcp`` env renames tools that
    two servers both offer to ``<server>-<tool>``.
    """
    try:
        data = json.loads(mcp_servers_json)
    except (TypeError, json.JSONDecodeError) as exc:
        where = f" (line {exc.lineno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        return {"servers": [], "errors": [f"not valid JSON{where}; the text is "
                                          '{"mcpServers": {"name": {"command": ..., "args": [...]}}}']}
    try:
        from rlfactory_mcp import load_mcp_tools, parse_mcp_config
    except ImportError as exc:
        return {"servers": [], "errors": [f"the MCP plugin is not installed ({one_line(exc)}); "
                                          "pip install plugins/rlfactory-plugin-mcp"]}
    try:
        specs = parse_mcp_config(data, source="mcpServers JSON")
    except ConfigError as exc:
        return {"servers": [], "errors": list(exc.errors)}

    options = {"*": {"connect_timeout_s": float(timeout_s), "timeout_s": float(timeout_s)}}

    async def one(name: str, spec: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"name": name, "transport": spec.transport, "tools": [], "error": None}
        try:
            # The plugin's own listing (its loop, in a thread): start, list every page, stop.
            toolset = await asyncio.wait_for(
                asyncio.to_thread(load_mcp_tools, {name: spec}, servers=options), 2 * timeout_s + 10)
        except asyncio.TimeoutError:
            row["error"] = f"MCP server {spec.describe()} did not list its tools within {2 * timeout_s + 10:g} s"
        except RLFactoryError as exc:  # MCPServerError, ConfigError: written for the user already
            row["error"] = " ".join(exc.message.split())
        except Exception as exc:  # noqa: BLE001 - one server's failure is its own row
            row["error"] = f"MCP server {spec.describe()}: {one_line(exc)}"
        else:
            row["tools"] = [{"name": tool.name, "description": tool.description,
                             "input_schema": _jsonable(tool.parameters)} for tool in toolset.tools]
        return row

    servers = await asyncio.gather(*(one(name, spec) for name, spec in specs.items()))
    return {"servers": list(servers), "errors": []}
