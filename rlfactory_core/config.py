"""The run configuration: one validated schema, YAML files, ``key=value`` overrides, presets.

A run's config is built in layers, later ones winning key by key:

1. the schema's defaults (:class:`RunConfig`);
2. the env's ``config_defaults`` (how its author tuned the task: rewards, turn lengths ...);
3. a preset (``preset: cpu-smoke`` or ``--preset``), see :data:`PRESETS`;
4. YAML files (``--config FILE``, several allowed);
5. ``key=value`` overrides on the command line (dotted keys, YAML values:
   ``train.lr=2e-6``, ``rollout.sampling.temperature=0.8``, ``rewards=[{name: exact_match}]``).

Everything is checked before anything runs: unknown keys, bad types and out-of-range
values are all reported together, one line each, naming the key
(:class:`~rlfactory_core.errors.ConfigError`), and :mod:`rlfactory_core.preflight` adds, in
the same pass, what the config names (components, their options, paths).
``rlf train --help-config`` prints every key with its default and help text (:func:`describe`).
The schema itself, section by section, is :mod:`rlfactory_core.config_schema` (its names are
re-exported here).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pydantic
import yaml

from .config_schema import (CheckpointSection, ColdStartSection, DataSection, EvalSection, GRPOSection,
                            LoggingSection, LoraSection, ModelSection, RaySection, RewardSpec, RunConfig,
                            ToolManagerSpec, TrainSection)
from .errors import ConfigError

__all__ = [
    "RunConfig", "PRESETS", "CONFIG_HINT", "load_config", "merge_layers", "merge_dicts", "validate_config", "parse_overrides",
    "describe", "config_errors",
    "ModelSection", "LoraSection", "GRPOSection", "TrainSection", "DataSection", "EvalSection",
    "CheckpointSection", "LoggingSection", "RewardSpec", "ToolManagerSpec", "RaySection", "ColdStartSection",
]


#: What every config error's hint says.
CONFIG_HINT = "`rlf train --help-config` lists every key with its default"

#: Named starting points, applied before config files and overrides.
PRESETS: dict[str, dict[str, Any]] = {
    # A few-minute run on a 2-core CPU with the embedded model (about 7 minutes here): the
    # settings of tests/test_learning.py, where held-out accuracy on the arithmetic tool task
    # goes from ~0.4 to ~0.8 in five steps.
    "cpu-smoke": {
        "rollout": {"max_turns": 3, "max_tokens_per_turn": 48, "max_trajectory_tokens": 1024,
                    "sampling": {"temperature": 0.7}},
        "grpo": {"group_size": 8, "prompts_per_step": 4, "advantage_norm": "group", "micro_batch_tokens": 2048},
        "train": {"steps": 10, "lr": 1e-5, "bf16": "auto"},
        "data": {"eval_size": 64},
        "eval": {"every": 5, "temperature": 0.7},
        "checkpoint": {"every": 5},
    },
    # One GPU: vLLM generation, bigger batches, longer turns, flash attention when installed.
    "gpu": {
        "backend": "vllm",
        "backend_options": {"gpu_memory_utilization": 0.4},
        "model": {"dtype": "float32", "attn_implementation": "auto", "gradient_checkpointing": True},
        "rollout": {"max_turns": 8, "max_tokens_per_turn": 512, "max_trajectory_tokens": 4096},
        "grpo": {"group_size": 8, "prompts_per_step": 64, "mini_batches": 4, "micro_batch_tokens": 32768},
        "train": {"steps": 200, "lr": 1e-6, "warmup_steps": 10},
        "eval": {"every": 20},
        "checkpoint": {"every": 20},
    },
}


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def merge_dicts(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``update`` merged into ``base`` key by key (nested dicts merge, everything else replaces)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge_dicts(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_overrides(items: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """``["a.b=1", "c=x"]`` -> ``{"a": {"b": 1}, "c": "x"}`` and the problems found (values
    are read as YAML, so ``1e-6`` is a number and ``[a, b]`` a list)."""
    tree: dict[str, Any] = {}
    problems = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            problems.append(f"{item!r}: an override is KEY=VALUE with a dotted key, e.g. train.lr=1e-6")
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
            if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
                value = float(value)  # YAML 1.1 reads 1e-6 (no dot) as a string
        except yaml.YAMLError as exc:
            problems.append(f"{key}: the value {raw!r} is not valid YAML ({str(exc).splitlines()[0]})")
            continue
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return tree, problems


def _read_yaml(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, [f"config file {str(path)!r} does not exist"]
    except (OSError, UnicodeDecodeError) as exc:
        return {}, [f"config file {str(path)!r} cannot be read: {exc}"]
    except yaml.YAMLError as exc:
        return {}, [f"config file {str(path)!r} is not valid YAML: {' '.join(str(exc).split())}"]
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        return {}, [f"config file {str(path)!r} must hold a mapping of keys, got {type(data).__name__}"]
    return data, []


def _location(loc: Sequence[Any]) -> str:
    parts = []
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif parts:
            parts.append(f".{part}")
        else:
            parts.append(str(part))
    return "".join(parts) or "config"


def config_errors(error: pydantic.ValidationError) -> list[str]:
    """One line per problem: ``key: what is wrong``."""
    lines = []
    for item in error.errors():
        loc = [part for part in item["loc"] if not (isinstance(part, str) and part.startswith("function-after"))]
        kind = item["type"]
        if kind == "extra_forbidden":
            lines.append(f"{_location(loc)}: unknown key (see `rlf train --help-config` for the keys)")
        elif kind == "value_error" and not loc:  # the checks across settings: one line each
            lines += str(item["msg"]).removeprefix("Value error, ").split("\n")
        else:
            value = item.get("input")
            shown = "" if isinstance(value, (dict, list)) or value is None else f" (got {value!r})"
            message = str(item["msg"]).removeprefix("Value error, ")  # a validator's own words
            lines.append(f"{_location(loc)}: {message}{shown}")
    return lines


def merge_layers(
    files: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
    *,
    preset: str | None = None,
    base: Mapping[str, Any] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The layers of :func:`load_config` merged into plain data, not yet validated (the
    schema's defaults not yet applied), and the problems found reading them (a missing file,
    a bad override, an unknown preset)."""
    problems: list[str] = []
    data: dict[str, Any] = {}
    layers: list[Mapping[str, Any]] = [dict(base or {})]
    for path in files:
        layer, file_problems = _read_yaml(path)
        problems += file_problems
        layers.append(layer)
    layers.append(dict(flags or {}))
    override_tree, override_problems = parse_overrides(overrides)
    problems += override_problems
    layers.append(override_tree)
    # The preset may be chosen in any layer; the last one to name it wins.
    for layer in layers:
        if isinstance(layer, Mapping) and layer.get("preset") is not None:
            preset = layer["preset"]
    env_name = RunConfig.model_fields["env"].default
    for layer in layers:
        if isinstance(layer, Mapping) and isinstance(layer.get("env"), str):
            env_name = layer["env"]
    data = merge_dicts(data, _env_defaults(env_name))
    if preset is not None:
        if not isinstance(preset, str) or preset not in PRESETS:
            problems.append(f"preset: unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        else:
            data = merge_dicts(data, PRESETS[preset])
    for layer in layers:
        data = merge_dicts(data, {k: v for k, v in layer.items() if k != "preset"})
    return data, problems


def validate_config(data: Mapping[str, Any]) -> tuple[RunConfig | None, list[str]]:
    """``data`` checked against the schema: the config, or None and one line per problem.

    Every problem at once: pydantic checks the rules across settings
    (:meth:`RunConfig.consistency_problems`) only once every setting is valid, so when some
    are not, the rules are also checked on ``data`` without those settings (their defaults in
    their place), keeping the lines that do not name one of them (a rule about a setting
    that was dropped would be about its default, not what was given)."""
    try:
        return RunConfig.model_validate(dict(data)), []
    except pydantic.ValidationError as exc:
        problems = config_errors(exc)
        dropped = [_clean_loc(item["loc"]) for item in exc.errors()]
        dropped = [loc for loc in dropped if loc]
        if not dropped:
            return None, problems
        repaired = copy.deepcopy(dict(data))
        for loc in dropped:
            _drop(repaired, loc)
        try:
            RunConfig.model_validate(repaired)
            return None, problems  # nothing wrong across the other settings
        except pydantic.ValidationError as again:
            if any(_clean_loc(item["loc"]) for item in again.errors()):
                return None, problems  # still invalid without them: the lines above say why
            across = config_errors(again)  # the rules across settings alone
        # a dropped setting by its dotted key or its own name (group_size), not its section's
        names = {name for loc in dropped for parts in [[p for p in loc if isinstance(p, str)]] if parts
                 for name in (".".join(parts), parts[-1])}
        more = [line for line in across if not any(re.search(rf"\b{re.escape(name)}\b", line) for name in names)]
        return None, list(dict.fromkeys([*problems, *more]))


def _clean_loc(loc: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(part for part in loc if not (isinstance(part, str) and part.startswith("function-after")))


def _drop(data: Any, loc: Sequence[Any]) -> None:
    """Remove the value at ``loc`` (keys and list indices) from ``data``, where it is there."""
    for part in loc[:-1]:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(data, dict):
        data.pop(loc[-1], None)
    elif isinstance(data, list) and isinstance(loc[-1], int) and 0 <= loc[-1] < len(data):
        data[loc[-1]] = None  # an item: the rule about it (a reward's name) is not known without it


def load_config(
    files: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
    *,
    preset: str | None = None,
    base: Mapping[str, Any] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> RunConfig:
    """The validated config from the env's defaults, a preset, ``base``, files, ``flags``
    (command-line options such as ``--env``) and overrides, in that order; raises
    :class:`ConfigError` listing every problem at once.

    The env's defaults are its class attribute ``config_defaults`` (a partial config, e.g.
    the deepsearch env's rewards and turn lengths), so ``rlf train --env NAME`` runs the task
    as its author tuned it and every later layer can change any of it.

    This checks the config alone; :func:`rlfactory_core.preflight.preflight` also checks
    what it names (components, their options, paths) in the same pass."""
    data, problems = merge_layers(files, overrides, preset=preset, base=base, flags=flags)
    config, schema_problems = validate_config(data)
    problems += schema_problems
    if problems:
        raise ConfigError(problems, hint=CONFIG_HINT)
    assert config is not None
    return config


def _env_defaults(env_name: str) -> dict[str, Any]:
    """The registered env's ``config_defaults``; nothing for an env that is not installed
    (the run reports that itself, with the list of installed envs)."""
    from .errors import RLFactoryError
    from .interfaces import member
    from .plugins import get_component

    try:
        defaults = member("env", get_component("env", env_name), "config_defaults")
    except RLFactoryError:
        return {}
    return copy.deepcopy(dict(defaults))


def describe(model: type[pydantic.BaseModel] = RunConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """Every key of the schema as ``(dotted key, default, help)``, sections flattened."""
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
            rows += describe(annotation, key + ".")
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, pydantic.BaseModel):
            default = default.model_dump()
        if isinstance(default, list):
            default = [d.model_dump() if isinstance(d, pydantic.BaseModel) else d for d in default]
        rows.append((key, yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("\n...").strip(),
                     field.description or ""))
    return rows
