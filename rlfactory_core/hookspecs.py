"""Every hook RLFactory calls. PLUGINS.md is generated from this file (``make docs``).

A plugin is a module (or object) with functions named like these hooks and decorated with
``@rlfactory_core.hookimpl``; it is found through the ``rlfactory`` entry-point group::

    [project.entry-points.rlfactory]
    my_plugin = "my_plugin"

An implementation may accept any subset of a hook's parameters (pluggy passes only the
ones it names), which is how hooks grow new parameters without breaking old plugins.
Hooks are never renamed.

Registration hooks are called once per process when a registry is first used, one plugin
at a time, so a failure is attributed to its plugin and does not stop the others; a plugin
whose registration hook raises is skipped whole (none of its components land and none of
its other hooks is called).
Observer hooks are called at named points of the rollout and training loop; a raising
observer is reported and skipped (fatal with ``RLFACTORY_STRICT_PLUGINS=1``).
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

__all__ = ["hookspec", "hookimpl", "PROJECT_NAME"]

PROJECT_NAME = "rlfactory"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# ---------------------------------------------------------------------------------------
# Registration: components referred to by name in the config
# ---------------------------------------------------------------------------------------


@hookspec
def rlfactory_register_tools(register: Callable[..., None]) -> None:
    """Register tools the model can call.

    :param register: call ``register(tool)`` once per tool. ``tool`` is an object with
        ``name``, ``description``, ``parameters`` (a JSON schema) and
        ``async call(arguments, ctx)`` (see ``rlfactory_core.Tool``), or a plain
        function (sync or async) that is wrapped with ``rlfactory_core.function_tool`` (its
        schema comes from the type hints, its description from the docstring). Raises
        ``RegistrationError`` (a ``TypeError``) when the object does not fit or its name
        holds ``:``, and ``DuplicateComponentError`` when this plugin already registered
        the name. A name another plugin also registers is not an error here: both
        plugins show the conflict, and the name works only qualified, ``DIST:name``.
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called, once per process, one plugin at
    a time. Added in 0.1.0.
    """


@hookspec
def rlfactory_register_tool_managers(register: Callable[..., None]) -> None:
    """Register tool managers: what runs an env's tool calls (concurrency, timeouts, retries).

    :param register: call ``register(cls)`` with a class whose ``name`` and ``description``
        are strings and which has ``async call(calls, ctx) -> list[ToolResult]`` and
        ``async close()`` (``rlfactory_core.ToolManager``). It is instantiated
        as ``cls(tools, **options)``. Raises ``RegistrationError`` or
        ``DuplicateComponentError`` as for tools.
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called, once per process, one plugin at
    a time. Added in 0.1.0.
    """


@hookspec
def rlfactory_register_parsers(register: Callable[..., None]) -> None:
    """Register response parsers: the model-family specific tool-call format.

    :param register: call ``register(parser)`` with an instance that has ``name``,
        ``render_system_prompt(system_prompt, tools) -> str``,
        ``parse(text) -> ParsedTurn`` (must never raise on model text, and must take time
        linear in its length: ``rlfactory_core.testing.check_parser_conformance`` checks
        both on an adversarial corpus; a call that names its tool but whose arguments cannot
        be used is returned with ``ToolCall.invalid`` set, which the tool manager answers
        with an ``invalid_arguments`` error, and one that names no tool is a ``ParseError``) and
        ``render_tool_results(results) -> list[Message]``
        (``rlfactory_core.ResponseParser``). Raises ``RegistrationError`` or
        ``DuplicateComponentError`` as for tools.
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called, once per process, one plugin at
    a time. Added in 0.1.0.
    """


@hookspec
def rlfactory_register_envs(register: Callable[..., None]) -> None:
    """Register environments: task families with their data, tools and episode logic.

    :param register: call ``register(cls)`` with a class whose ``name`` and
        ``description`` are strings and which has ``async reset(sample) -> EnvReset``,
        ``async step(state, turn, results) -> EnvStep`` and ``async close(state)``
        (``rlfactory_core.Env``). It is instantiated with the env options of
        the config (options it does not take are config errors, all reported at once; a
        constructor that takes a ``parser`` gets the run's parser name unless the options
        set it, and setting a different one is an error). Raises ``RegistrationError`` or
        ``DuplicateComponentError`` as for tools.
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called, once per process, one plugin at
    a time. Added in 0.1.0.
    """


@hookspec
def rlfactory_register_rewards(register: Callable[..., None]) -> None:
    """Register reward functions: rules, model judges, tool-verified checks.

    :param register: call ``register(cls)`` with a class whose ``name`` and
        ``description`` are strings and which has a method
        ``score(trajectory, sample) -> RewardOutput | float | None``
        (``rlfactory_core.Reward``): ``async def`` or a plain function (run in
        a thread); with a third parameter named ``context`` it gets a
        ``rlfactory_core.RewardContext`` (the env's per-trajectory state and
        ``await context.call_tool(name, arguments)`` through the run's tool manager).
        ``None`` means the reward does not apply to the sample. The class is instantiated
        once per run with the reward's ``options`` from the config; an optional
        ``close()`` is called at the end. Raises ``RegistrationError`` or
        ``DuplicateComponentError`` as for tools.
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called, once per process, one plugin at
    a time. Added in 0.1.0.
    """


@hookspec
def rlfactory_register_model_families(register: Callable[..., None]) -> None:
    """Register model families: a model's chat format at the level of token ids.

    :param register: call ``register(cls)`` with a class whose ``name`` and
        ``description`` are strings, with a classmethod ``build(tokenizer, **options)`` that
        returns the run's family (``model.family_options`` are its options; a ``parser``
        parameter gets the run's tool-call format, a ``processor`` parameter the model's
        image processor) and with the methods of ``rlfactory_core.ModelFamily``:
        ``prompt(messages, tools)``, ``parse(completion_ids, context_ids)`` (never raises on
        model output), ``tool_messages(results)``, ``observation_ids(completion_ids,
        context_ids, observation)`` (append-only: the ids the model wrote stay as written;
        None where the format rewrites earlier turns, and the trajectory goes on in a new
        sequence rendered by ``prompt`` from the whole conversation) and ``decode(ids)``. Optional ``anchors`` (token -> id the tokenizer must have) and
        ``detected`` (``model.family: auto`` picks the family when its anchors hold). Raises
        ``RegistrationError`` or ``DuplicateComponentError`` as for tools.
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called, once per process, one plugin at
    a time. Added in 0.2.0 (plugin API 1.2).
    """


@hookspec
def rlfactory_register_commands(app: Any) -> None:
    """Add commands to the ``rlf`` command line.

    :param app: the root ``typer.Typer`` application. Add a command with
        ``@app.command()`` or a group with ``app.add_typer(sub_app, name="...")``.
        A plugin whose hook raises is reported by ``rlf plugins list`` and the CLI keeps
        working without its commands.
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called, once, when the CLI starts, one
    plugin at a time. Added in 0.1.0.
    """


# ---------------------------------------------------------------------------------------
# Observers: named points of the rollout and training loop
# ---------------------------------------------------------------------------------------


@hookspec
def rlfactory_on_env_step(trajectory: Any, turn: Any, results: Any, step: Any) -> float | None:
    """Called after every env step of every trajectory (loggers, tracing, process rewards).

    :param trajectory: the ``rlfactory_core.Trajectory`` so far, including this turn.
    :param turn: the ``ParsedTurn`` the model just produced.
    :param results: the list of ``ToolResult`` for the turn's tool calls (may be empty).
    :param step: the ``EnvStep`` the env returned for this turn.
    :return: ``None``, or a float added to this turn's reward (process-reward shaping);
        the floats of all plugins are summed.

    Calling convention: every implementation is called, results collected; an
    implementation that raises is reported and skipped. With ``engine: ray`` it is called
    in the rollout worker that runs the trajectory (a process of its own, where installed
    plugins are loaded the same way). Added in 0.1.0.
    """


@hookspec
def rlfactory_on_trajectory_end(trajectory: Any, sample: Any) -> None:
    """Called once per trajectory after it ended and was closed, before rewards are scored.

    :param trajectory: the finished ``rlfactory_core.Trajectory`` (its
        ``stop_reason`` says why it ended).
    :param sample: the dataset row the trajectory was generated for.
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called; an implementation that raises is
    reported and skipped. With ``engine: ray`` it is called in the rollout worker that ran
    the trajectory. Added in 0.1.0.
    """


@hookspec
def rlfactory_on_train_start(config: Any) -> None:
    """Called once before the first training step.

    :param config: the validated run configuration (read it, do not change it).
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called; an implementation that raises is
    reported and skipped. Added in 0.1.0.
    """


@hookspec
def rlfactory_on_train_step_end(step: int, metrics: dict[str, float]) -> None:
    """Called after every training step (one rollout batch and its updates), with that
    step's metrics (loggers, early stopping).

    :param step: the number of the step just finished, counting from 1.
    :param metrics: metric name -> value for this step (see the metrics table in the
        README); a copy, so changing it has no effect.
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called; an implementation that raises is
    reported and skipped. Added in 0.1.0.
    """


@hookspec
def rlfactory_on_train_end(step: int, metrics: dict[str, float]) -> None:
    """Called once when training stops, normally or after an interruption.

    :param step: the number of the last finished step (0 when none finished).
    :param metrics: the last step's metrics (empty when none finished).
    :return: nothing; the return value is ignored.

    Calling convention: every implementation is called; an implementation that raises is
    reported and skipped. Added in 0.1.0.
    """
