"""The component interfaces plugins implement, and the checks ``register`` applies.

Six kinds of component are registered by name through the hooks in
:mod:`rlfactory_core.hookspecs`:

=============  ==========================  =================================================
kind           what is registered          interface
=============  ==========================  =================================================
tool           an instance (or a function)  :class:`Tool`
parser         an instance                  :class:`ResponseParser`
env            a class                      :class:`Env` (instantiated with config options)
tool_manager   a class                      :class:`ToolManager` (instantiated per env)
reward         a class                      :class:`Reward` (instantiated with config options)
family         a class                      :class:`ModelFamily` (built with the model's tokenizer)
=============  ==========================  =================================================

Stateless components (tools, parsers) are registered as ready instances; components that
take options from the config are registered as classes so each run builds its own.
The Protocols below describe the required members; :data:`MEMBERS` lists every member
the core reads, required and optional, with the optional ones' defaults (PLUGINS.md renders
it). :func:`check_component` enforces the required ones at registration, with a message
naming exactly what is missing; the core reads the optional ones only through
:func:`member` and :func:`accepts`, so their defaults live in one place.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Mapping, Protocol, Sequence

from .errors import RegistrationError
from .types import EnvReset, EnvStep, Message, ParsedTurn, RewardOutput, Sample, ToolCall, ToolResult, Trajectory

__all__ = [
    "Tool",
    "ResponseParser",
    "ModelFamily",
    "Env",
    "ToolManager",
    "Reward",
    "COMPONENT_KINDS",
    "Member",
    "MEMBERS",
    "member",
    "accepts",
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


class ModelFamily(Protocol):
    """A model's chat format at the level of token ids: what the agent loop renders and
    parses with (:mod:`rlfactory_core.rollout.family`; ``TemplateFamily`` is the model's own
    chat template with a :class:`ResponseParser` as its tool-call format).

    Text the model did not write (messages, tool results) reaches the ids as data: never as
    the family's special tokens. Ids are appended, never re-rendered: the model's sampled
    tokens stay as sampled. Where the format itself rewrites earlier turns, the family says
    so (``observation_ids`` returns None) and the rollout starts a new sequence of the
    trajectory from ``prompt`` of the whole conversation (:class:`~rlfactory_core.types.Trajectory`)."""

    name: str

    def prompt(self, messages: Sequence[Message], tools: Sequence[Tool]) -> tuple[list[Message], list[int]]:
        """The opening messages as the model sees them (``tools`` described where the family
        describes them) and their ids, ending with the generation prompt. Also the prompt of
        a later sequence: then ``messages`` is the conversation so far, its assistant
        messages as parsed (``content``, ``reasoning``, ``tool_calls``)."""

    def parse(self, completion_ids: Sequence[int], context_ids: Sequence[int]) -> ParsedTurn:
        """Read one model turn from its sampled ids (``context_ids``: every id before them).
        Never raises on model output."""

    def tool_messages(self, results: Sequence[ToolResult]) -> list[Message]:
        """The messages that show the model the results of its calls."""

    def observation_ids(self, completion_ids: Sequence[int], context_ids: Sequence[int],
                        observation: Sequence[Message]) -> list[int] | None:
        """The ids to append after the model turn ``completion_ids`` (``context_ids``: every
        id before it) so that the context shows ``observation`` and opens the next model turn
        (the model wrote none of them); None where the format renders the conversation so
        far differently from the ids sampled (the rollout then starts a new sequence)."""

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ids the model wrote, for records and messages."""


class Env(Protocol):
    """A task family: builds episodes, holds per-trajectory state, decides when they end.

    An env whose messages carry images (``Message.images``, for vision-language models)
    sets the optional attribute ``shows_images = True`` (on the instance or the class), so
    that ``rlf train`` refuses a text-only model before the first rollout."""

    name: ClassVar[str]
    description: ClassVar[str]

    async def reset(self, sample: Sample) -> EnvReset:
        """Start an episode for ``sample``: opening messages, tools, private state.

        The tools are :class:`Tool` objects (``rlfactory_core.resolve_tools`` makes
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
    third parameter named ``context`` (a ``rlfactory_core.RewardContext``: the
    env's state and tools). It returns a number, a ``RewardOutput``, or ``None`` when the
    reward does not apply to the sample. An optional ``close()`` (sync or async) is called
    at the end of the run."""

    name: ClassVar[str]
    description: ClassVar[str]

    async def score(self, trajectory: Trajectory, sample: Sample) -> RewardOutput | float | None:
        """The reward for ``trajectory`` of ``sample``, with named components for logging."""


@dataclass(frozen=True)
class Member:
    """One member of a component that the core (or another plugin) reads.

    ``form`` is ``attribute``, ``method``, ``async method`` or ``parameter`` (a parameter of
    the method ``of``; ``__init__`` for the constructor). A required member is checked by
    :func:`check_component` at registration; an optional one is read through
    :func:`member` or :func:`accepts`, which supply ``default`` when it is absent."""

    kind: str
    name: str
    form: str
    signature: str
    required: bool
    doc: str
    default: Any = None
    of: str = ""


_EMPTY: Mapping[str, Any] = MappingProxyType({})

#: Every member of every component kind that is read outside the component itself: the
#: contract, rendered into PLUGINS.md. Optional members' defaults are defined here and
#: nowhere else.
MEMBERS: tuple[Member, ...] = (
    Member("tool", "name", "attribute", "name: str", True, "the name the model calls it by"),
    Member("tool", "description", "attribute", "description: str", True, "shown to the model with the schema"),
    Member("tool", "parameters", "attribute", "parameters: dict", True,
           "JSON schema (type `object`) of the arguments; the tool manager validates calls against it"),
    Member("tool", "call", "async method", "async call(arguments: dict, ctx: dict | None = None) -> ToolResult | str",
           True, "run the tool; raise on failure (the tool manager turns it into an error observation)"),
    Member("tool", "validate", "method", "validate(arguments: dict) -> None", False,
           "check the arguments instead of the JSON schema; raise `ToolArgumentsError` with a message for the "
           "model"),
    Member("tool", "close", "method", "close() -> None  (or async)", False,
           "release what the tool holds (a client, a session); called when the tool manager closes"),
    Member("parser", "name", "attribute", "name: str", True, "the registered name"),
    Member("parser", "render_system_prompt", "method",
           "render_system_prompt(system_prompt: str, tools: Sequence[Tool]) -> str", True,
           "the system prompt with the tools described the way the model family expects"),
    Member("parser", "parse", "method", "parse(text: str) -> ParsedTurn", True,
           "one model turn read into content, reasoning, tool calls and parse errors; never raises"),
    Member("parser", "render_tool_results", "method",
           "render_tool_results(results: Sequence[ToolResult]) -> list[Message]", True,
           "the messages that show the model its calls' results"),
    Member("parser", "format_tool_call", "method", "format_tool_call(call: ToolCall) -> str", False,
           "a call as the model would write it; envs that show worked examples (few-shot turns) use it and "
           "refuse a parser without it"),
    Member("env", "name", "attribute", "name: ClassVar[str]", True, "the registered name (`--env NAME`)"),
    Member("env", "description", "attribute", "description: ClassVar[str]", True, "shown by `rlf plugins list`"),
    Member("env", "reset", "async method", "async reset(sample: Sample) -> EnvReset", True,
           "start an episode: opening messages, the tools offered, private state"),
    Member("env", "step", "async method",
           "async step(state, turn: ParsedTurn, results: Sequence[ToolResult]) -> EnvStep", True,
           "advance after one model turn and its tool results"),
    Member("env", "close", "async method", "async close(state) -> None", True,
           "release the episode's resources; always called, also after errors and cancellation"),
    Member("env", "tools", "attribute", "tools: Sequence[Tool]", False,
           "every tool an episode may offer; the run's tool manager is built with them (`cls(tools, **options)`)",
           default=()),
    Member("env", "dataset", "method", "dataset(size: int | None = None, split: str = 'train') -> Iterable[Sample]",
           False, "the env's own samples, used when the config names no data file; without it the config must",
           default=None),
    Member("env", "split", "parameter", "split: str", False,
           "the split `dataset` returns; without it the config must give JSONL files (evaluation would otherwise "
           "run on training samples)", of="dataset"),
    Member("env", "config_defaults", "attribute", "config_defaults: ClassVar[dict]", False,
           "a partial run config (rewards, turn lengths ...) applied over the built-in defaults and under the "
           "user's config", default=_EMPTY),
    Member("env", "shows_images", "attribute", "shows_images: bool", False,
           "true when its messages carry images (`Message.images`): a text-only model is refused before the "
           "first rollout", default=False),
    Member("env", "data_fingerprint", "method", "data_fingerprint(samples: Sequence[Sample]) -> str | None", False,
           "what the episodes of `samples` read besides the samples and the installed code (a corpus, database "
           "files), as a string that changes whenever any of it does; `\"\"` when they read nothing else, None when "
           "they depend on what cannot be fingerprinted (a live service). With it, `eval.reuse_untrained` reuses "
           "the untrained model's eval of the same samples across runs (rlfactory_core.eval_reuse)", default=None),
    Member("env", "build_data", "method",
           "build_data(out_dir: Path | None, *, force: bool, progress: Callable[[str], None]) -> Path", False,
           "build the env's data ahead of training (`rlf data build ENV`); a class or static method",
           default=None),
    Member("env", "demonstration", "async method", "async demonstration(sample: Sample, parser) -> list[str] | None",
           False, "a worked episode for the cold start (`cold_start.source: demonstrations`): the assistant turns of "
           "a successful episode as the model would write them (tool calls written with `parser.format_tool_call`), "
           "typically from the sample's gold answer; the core replays them through the agent loop (the tools really "
           "run, the observations are rendered as in a rollout) and keeps those the training rewards call correct. "
           "None: no demonstration for this sample", default=None),
    Member("env", "parser", "parameter", "parser: str", False,
           "when the constructor has this parameter, it receives the run's parser name (an env that writes tool "
           "calls itself, e.g. worked examples)", of="__init__"),
    Member("tool_manager", "name", "attribute", "name: ClassVar[str]", True, "the registered name"),
    Member("tool_manager", "description", "attribute", "description: ClassVar[str]", True,
           "shown by `rlf plugins list`"),
    Member("tool_manager", "call", "async method",
           "async call(calls: Sequence[ToolCall], ctx: dict | None = None) -> list[ToolResult]", True,
           "run the calls, one result per call in order; never raises"),
    Member("tool_manager", "close", "async method", "async close() -> None", True,
           "stop what the manager started (sessions, connections)"),
    Member("tool_manager", "tools", "attribute", "tools: Mapping[str, Tool]", False,
           "name -> tool it serves; rewards see the names (`RewardContext.tool_names`)", default=_EMPTY),
    Member("reward", "name", "attribute", "name: ClassVar[str]", True, "the registered name"),
    Member("reward", "description", "attribute", "description: ClassVar[str]", True, "shown by `rlf plugins list`"),
    Member("reward", "score", "method",
           "score(trajectory: Trajectory, sample: Sample) -> RewardOutput | float | None  (or async)", True,
           "the reward of a finished trajectory; `None` when it does not apply to the sample"),
    Member("reward", "context", "parameter", "context: RewardContext", False,
           "when `score` has this parameter, it receives the env's state and tools (`RewardContext`)", of="score"),
    Member("reward", "close", "method", "close() -> None  (or async)", False,
           "release what the reward holds (a judge's client); called at the end of the run", default=None),
    Member("family", "name", "attribute", "name: ClassVar[str]", True, "the registered name (`model.family`)"),
    Member("family", "description", "attribute", "description: ClassVar[str]", True,
           "shown by `rlf plugins list` and when a run says which family it uses"),
    Member("family", "build", "method", "build(tokenizer, **options) -> ModelFamily  (a classmethod)", True,
           "the run's family for the model's tokenizer, with `model.family_options`; raise `ModelError` naming "
           "what does not fit"),
    Member("family", "parser", "parameter", "parser: ResponseParser", False,
           "when `build` has this parameter, it gets the run's tool-call format (the `parser` key: a recipe's "
           "choice, apart from the model); a family without it writes tool calls in its own format",
           of="build"),
    Member("family", "processor", "parameter", "processor: Any", False,
           "when `build` has this parameter, it gets the model's image processor (None for text-only models)",
           of="build"),
    Member("family", "anchors", "attribute", "anchors: ClassVar[dict[str, int | None]]", False,
           "token -> id the model's tokenizer must have (None: one token, any id); a `model.family` whose anchors "
           "fail is refused before the run starts. Empty: any tokenizer", default=_EMPTY),
    Member("family", "detected", "attribute", "detected: ClassVar[bool]", False,
           "whether `model.family: auto` picks this family when its anchors hold (one family must match)",
           default=False),
    Member("family", "native_format", "attribute", "native_format: ClassVar[str]", False,
           "the registered parser whose format is this family's own (a run may name it in `parser`)",
           default=None),
    Member("family", "prompt", "method", "prompt(messages, tools) -> tuple[list[Message], list[int]]", True,
           "the opening messages as the model sees them and their ids, ending with the generation prompt"),
    Member("family", "parse", "method", "parse(completion_ids, context_ids) -> ParsedTurn", True,
           "read one model turn from its sampled ids; never raises on model output"),
    Member("family", "tool_messages", "method", "tool_messages(results) -> list[Message]", True,
           "the messages that show the model the results of its calls"),
    Member("family", "observation_ids", "method", "observation_ids(completion_ids, context_ids, observation) -> "
           "list[int] | None", True, "the ids appended after a model turn: the observation and the next turn's "
           "opening; None where the format rewrites earlier turns here (a new sequence starts from `prompt`)"),
    Member("family", "decode", "method", "decode(token_ids) -> str", True, "the text of ids the model wrote"),
    Member("family", "self_check", "method", "self_check() -> report with `ok: bool` and `describe() -> str`", False,
           "a token-exactness check on a sample tool round, run by `rlf doctor --model`", default=None),
    Member("family", "stop_token_ids", "attribute", "stop_token_ids: Sequence[int]", False,
           "the ids that end a model turn besides the model's EOS (gpt-oss's <|call|>); a turn keeps its last id",
           default=()),
)

_DECLARED: dict[tuple[str, str], Member] = {(m.kind, m.name): m for m in MEMBERS}
COMPONENT_KINDS: tuple[str, ...] = tuple(dict.fromkeys(m.kind for m in MEMBERS))
# Registered as classes (instantiated with config options) rather than as instances.
_CLASSES = frozenset({"env", "tool_manager", "reward", "family"})


def _declared(kind: str, name: str, forms: tuple[str, ...]) -> Member:
    declared = _DECLARED.get((kind, name))
    if declared is None or declared.form not in forms:
        raise KeyError(f"{kind} member {name!r} ({' or '.join(forms)}) is not declared in "
                       f"rlfactory_core.interfaces.MEMBERS; declare it there before reading it")
    return declared


def member(kind: str, obj: Any, name: str) -> Any:
    """``obj``'s member ``name`` of the ``kind`` interface; for an optional member that
    ``obj`` lacks (or sets to ``None``), its default from :data:`MEMBERS`."""
    declared = _declared(kind, name, ("attribute", "method", "async method"))
    value = getattr(obj, name, None)
    return declared.default if value is None else value


def accepts(kind: str, fn: Any, name: str) -> bool:
    """Whether ``fn`` (a component's method, or its class for a constructor parameter) has
    the optional parameter ``name`` that :data:`MEMBERS` declares for ``kind``; ``False``
    when its signature cannot be read."""
    _declared(kind, name, ("parameter",))
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def check_component(kind: str, obj: Any) -> None:
    """Raise :class:`RegistrationError` naming every way ``obj`` fails the ``kind`` interface."""
    if kind not in COMPONENT_KINDS:
        raise ValueError(f"unknown component kind {kind!r}; expected one of {', '.join(COMPONENT_KINDS)}")
    must_be_class = kind in _CLASSES
    label = getattr(obj, "name", None) or getattr(obj, "__name__", None) or type(obj).__name__
    problems: list[str] = []
    if must_be_class and not inspect.isclass(obj):
        problems.append(f"must be a class (it is instantiated with config options), got {type(obj).__name__}")
    if not must_be_class and inspect.isclass(obj):
        problems.append("must be an instance, got a class")
    required = [m for m in MEMBERS if m.kind == kind and m.required]
    for attr in (m.name for m in required if m.form == "attribute"):
        value = getattr(obj, attr, None)
        if attr == "parameters":
            if not isinstance(value, dict):
                problems.append("attribute 'parameters' must be a JSON-schema dict")
        elif not isinstance(value, str) or (attr == "name" and not value):
            problems.append(f"attribute '{attr}' must be a non-empty string" if attr == "name"
                            else f"attribute '{attr}' must be a string")
    for method in (m for m in required if m.form in ("method", "async method")):
        fn = getattr(obj, method.name, None)
        if fn is None or not callable(fn):
            problems.append(f"missing method '{method.name}'")
        elif method.form == "async method" and not inspect.iscoroutinefunction(fn):
            problems.append(f"method '{method.name}' must be 'async def'")
    if problems:
        raise RegistrationError(
            f"{kind} {label!r} does not satisfy the {kind} interface: " + "; ".join(problems),
            hint=f"see rlfactory_core.interfaces for the {kind} interface",
        )
