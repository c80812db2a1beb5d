"""The run's task: its env, parser, tool manager and reward layers, built from the config.

:func:`build_task` instantiates every component the config names (through the plugin
registry, :mod:`rlfactory_core.plugins`), checks that they fit together (the parser can show
the model the env's tools; the env and the tool manager take their options) and raises a
:class:`~rlfactory_core.errors.ConfigError` naming what is wrong before anything is loaded
or written. The engines build one task per process that runs rollouts (the driver, each of
the ray engine's rollout workers); :meth:`Task.close` releases what the components hold
(an MCP env's servers, a judge's client).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .config import RunConfig
from .errors import ConfigError, RLFactoryError, one_line
from .interfaces import accepts, member

__all__ = ["Task", "build_env", "build_task", "env_option_problems", "option_problems", "parameters_of"]


@dataclass
class Task:
    """What a rollout needs, besides the model."""

    env: Any
    parser: Any
    tool_manager: Any
    rewards: Any  # rlfactory_core.rewards.RewardLayer
    eval_rewards: Any  # config.eval.rewards, or the training layer when those are not set
    offers_tools: bool

    async def close(self) -> None:
        """The rewards (a judge's client), then the tool manager (an MCP env's servers): a
        reward layer logs its rewards' failures to close, and a failing tool manager close
        is ignored (the run's results are saved)."""
        await self.rewards.close()
        if self.eval_rewards is not self.rewards:
            await self.eval_rewards.close()
        with contextlib.suppress(Exception):
            await self.tool_manager.close()


def build_env(config: RunConfig) -> Any:
    """The env of ``config``, its options checked (all unknown ones reported at once)."""
    from .plugins import get_component

    env_cls = get_component("env", config.env)
    env_options = dict(config.env_options)
    problems = env_option_problems(env_cls, config.env, env_options, config.parser)
    if problems:
        raise ConfigError(problems)
    if accepts("env", env_cls, "parser"):
        # An env that writes tool calls itself (worked examples) gets the run's parser.
        env_options.setdefault("parser", config.parser)
    try:
        env = env_cls(**env_options)
    except RLFactoryError:
        raise  # the env's own list of problems
    except Exception as exc:  # noqa: BLE001 - a constructor refusing an option's value is a config problem
        raise ConfigError([f"env_options: the {config.env!r} env refused its options ({one_line(exc)})"]) from exc
    return env


def build_task(config: RunConfig, *, shared_tools: dict[str, Any] | None = None, make_reward: Any = None) -> Task:
    """The env, parser, tool manager and reward layers of ``config``, every option checked.

    The ray engine passes ``shared_tools`` (name -> a stand-in for the env's tool of that
    name, served by a tool actor) and ``make_reward`` (a stand-in for a reward scored on the
    judge pool; see :func:`rlfactory_core.rewards.build_reward_layer`)."""
    from .plugins import get_component
    from .rewards import build_reward_layer

    env = build_env(config)
    parser = get_component("parser", config.parser)
    manager_cls = get_component("tool_manager", config.tool_manager.name)
    tools = list(member("env", env, "tools"))
    if shared_tools:
        missing = sorted(set(shared_tools) - {t.name for t in tools})
        if missing:
            raise ConfigError([f"ray.tool_actors.names: the {config.env!r} env has no tool {name!r} (its tools: "
                               f"{', '.join(t.name for t in tools) or 'none'})" for name in missing])
        tools = [shared_tools.get(t.name, t) for t in tools]
    try:  # e.g. a parser made for one tool (search_r1) and an env with others
        parser.render_system_prompt("", tools)
    except Exception as exc:  # noqa: BLE001 - any refusal is a config problem, reported now
        raise ConfigError([f"parser: {config.parser!r} cannot show the model the {config.env!r} env's tools "
                           f"({one_line(exc)})"]) from exc
    try:
        tool_manager = manager_cls(tools, **config.tool_manager.options)
    except RLFactoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - as for the env: the options were refused
        raise ConfigError([f"tool_manager.options: {one_line(exc)}"]) from exc
    side = config.rollout.tool_exception_side
    rewards = build_reward_layer(config.rewards, tool_manager, make_reward=make_reward, tool_exception_side=side)
    eval_rewards = rewards if config.eval.rewards is None else build_reward_layer(
        config.eval.rewards, tool_manager, make_reward=make_reward, tool_exception_side=side)
    return Task(env=env, parser=parser, tool_manager=tool_manager, rewards=rewards, eval_rewards=eval_rewards,
                 offers_tools=bool(tools))


def parameters_of(target: Any) -> list[inspect.Parameter] | None:
    """The parameters of ``target``'s signature, or None when it cannot be read."""
    try:
        return list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):  # a builtin or C extension: nothing to check against
        return None


def option_problems(target: Any, options: Mapping[str, Any], key: str, what: str, skip: int = 0,
                    internal: Sequence[str] = ()) -> list[str]:
    """Options ``target``'s constructor does not take, and required ones not given. The
    first ``skip`` parameters, and those named in ``internal``, are passed by the run."""
    parameters = parameters_of(target)
    if parameters is None:
        return []
    named = [p for p in parameters[skip:]
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in internal]
    names = [p.name for p in named]
    problems = []
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        problems += [f"{key}.{option}: {what} has no option {option!r} (its options: {', '.join(names) or 'none'})"
                     for option in options if option not in names]
    problems += [f"{key}.{p.name}: {what} needs this option (it has no default)"
                 for p in named if p.default is p.empty and p.name not in options]
    return problems


def env_option_problems(env_cls: Any, env_name: str, options: Mapping[str, Any], parser: str | None) -> list[str]:
    """``env_options`` the env's constructor cannot take, and an ``env_options.parser`` that
    differs from the run's (an env that writes tool calls itself, in worked examples, must
    write them the way the run's parser reads them)."""
    problems = option_problems(env_cls, options, "env_options", f"the {env_name!r} env")
    if parser is not None and accepts("env", env_cls, "parser"):
        chosen = options.get("parser", parser)
        if chosen != parser:
            problems.append(f"env_options.parser is {chosen!r} but the run's parser is {parser!r}: the env would "
                            f"show the model tool calls the parser cannot read; drop env_options.parser (the env "
                            f"then uses the run's parser)")
    return problems
