"""The component interfaces plugins implement, and the checks ``register`` applies.

Five kinds of component are registered by name through the hooks in
:mod:`rlfactory_core.hookspecs`:

=============  ==========================  =================================================
kind           what is registered          interface
=============  ==========================  =================================================
tool           an instance (or a function)  :class:`Tool`
parser         an instance                  :class:`ResponseParser`
env            a class                      :class:`Env` (instantiated with config options)
tool_manager   a class                      :class:`ToolManager` (instantiated per env)
reward         a class                      :class:`Reward` (instantiated with config options)
=============  ==========================  =================================================

Stateless components (tools, parsers) are registered as ready instances; components that
take options from the config are registered as classes so each run builds its own.
The Protocols below are the documentation; :func:`check_component` is the enforcement,
with a message naming exactly what is missing.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Protocol, Sequence

from .errors import RegistrationError
from .types import EnvReset, EnvStep, Message, ParsedTurn, RewardOutput, Sample, ToolCall, ToolResult, Trajectory

__all__ = [
    "Tool",
    "ResponseParser",
    "Env",
    "ToolManager",
    "Reward",
    "COMPONENT_KINDS",
    "check_component",
]


class Tool(Protocol):
    """A callable tool. ``parameters`` is a JSON schema (type ``object``) of the arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any] | None = None) -> ToolResult | str:
        """Run the tool. Return a :class:`ToolResult` or plain text; raise on failure
        (the tool manager turns exceptions into error observations)."""


class ResponseParser(Protocol):
    """Model-family specific translation between tool calls and text. Never raises on model text."""

    name: str

    def render_system_prompt(self, system_prompt: str, tools: Sequence[Tool]) -> str:
        """The system prompt with the tools' schemas described the way the family expects."""

    def parse(self, text: str) -> ParsedTurn:
        """Read one model turn: content, reasoning, tool calls and parse errors. Never raises."""

    def render_tool_results(self, results: Sequence[ToolResult]) -> list[Message]:
        """The messages that show the model the results of its calls."""


class Env(Protocol):
    """A task family: builds episodes, holds per-trajectory state, decides when they end.

    An env whose messages carry images (``Message.images``, for vision-language models)
    sets the optional attribute ``shows_images = True`` (on the instance or the class), so
    that ``rlf train`` refuses a text-only model before the first rollout."""

    name: ClassVar[str]
    description: ClassVar[str]

    async def reset(self, sample: Sample) -> EnvReset:
        """Start an episode for ``sample``: opening messages, tools, private state.

        The tools are :class:`Tool` objects (``rlfactory_core.tools.resolve_tools`` makes
        them from functions, qwen-agent tools and registered names; do it once, not per
        episode). The parser describes them in the system prompt; the rollout's tool
        manager, shared by all episodes, must hold them, and calls of a tool this episode
        did not offer are answered ``unknown_tool``."""

    async def step(self, state: Any, turn: ParsedTurn, results: Sequence[ToolResult]) -> EnvStep:
        """Advance after one model turn and the results of its tool calls."""

    async def close(self, state: Any) -> None:
        """Release the episode's resources. Always called, also after errors and cancellation."""


class ToolManager(Protocol):
    """Runs the tool calls of one env instance; turns every failure into an error result."""

    name: ClassVar[str]
    description: ClassVar[str]

    async def call(self, calls: Sequence[ToolCall], ctx: dict[str, Any] | None = None) -> list[ToolResult]:
        """Run ``calls`` (concurrently where possible); one result per call, in order. Never raises."""

    async def close(self) -> None:
        """Stop what the manager started (sessions, connections)."""


class Reward(Protocol):
    """Scores a finished trajectory (``rlfactory_core.rewards`` runs it).

    ``score`` may be ``async def`` or a plain function (run in a thread), and may take a
    third parameter named ``context`` (a ``rlfactory_core.rewards.RewardContext``: the
    env's state and tools). It returns a number, a ``RewardOutput``, or ``None`` when the
    reward does not apply to the sample. An optional ``close()`` (sync or async) is called
    at the end of the run."""

    name: ClassVar[str]
    description: ClassVar[str]

    async def score(self, trajectory: Trajectory, sample: Sample) -> RewardOutput | float | None:
        """The reward for ``trajectory`` of ``sample``, with named components for logging."""


# kind -> (must be a class?, attributes that must be str, methods: name -> must be async)
_REQUIREMENTS: dict[str, tuple[bool, tuple[str, ...], dict[str, bool]]] = {
    "tool": (False, ("name", "description"), {"call": True}),
    "parser": (False, ("name",), {"render_system_prompt": False, "parse": False, "render_tool_results": False}),
    "env": (True, ("name", "description"), {"reset": True, "step": True, "close": True}),
    "tool_manager": (True, ("name", "description"), {"call": True, "close": True}),
    "reward": (True, ("name", "description"), {"score": False}),  # sync rules run in a thread
}

COMPONENT_KINDS: tuple[str, ...] = tuple(_REQUIREMENTS)


def check_component(kind: str, obj: Any) -> None:
    """Raise :class:`RegistrationError` naming every way ``obj`` fails the ``kind`` interface."""
    must_be_class, str_attrs, methods = _REQUIREMENTS[kind]
    label = getattr(obj, "name", None) or getattr(obj, "__name__", None) or type(obj).__name__
    problems: list[str] = []
    if must_be_class and not inspect.isclass(obj):
        problems.append(f"must be a class (it is instantiated with config options), got {type(obj).__name__}")
    if not must_be_class and inspect.isclass(obj):
        problems.append("must be an instance, got a class")
    for attr in str_attrs:
        value = getattr(obj, attr, None)
        if not isinstance(value, str) or (attr == "name" and not value):
            problems.append(f"attribute '{attr}' must be a non-empty string" if attr == "name"
                            else f"attribute '{attr}' must be a string")
    if kind == "tool" and not isinstance(getattr(obj, "parameters", None), dict):
        problems.append("attribute 'parameters' must be a JSON-schema dict")
    for method, must_be_async in methods.items():
        fn = getattr(obj, method, None)
        if fn is None or not callable(fn):
            problems.append(f"missing method '{method}'")
        elif must_be_async and not inspect.iscoroutinefunction(fn):
            problems.append(f"method '{method}' must be 'async def'")
    if problems:
        raise RegistrationError(
            f"{kind} {label!r} does not satisfy the {kind} interface: " + "; ".join(problems),
            hint=f"see rlfactory_core.interfaces for the {kind} interface",
        )
