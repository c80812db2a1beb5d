"""Typed objects passed between the stages of a rollout and a training step.

Plain dataclasses, no behaviour beyond conversion helpers, so every stage (parser, tool
manager, env, reward, trainer) can be tested with hand-built values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

__all__ = [
    "Message",
    "ToolCall",
    "ToolResult",
    "ParseError",
    "ParsedTurn",
    "Sample",
    "Segment",
    "TokenSequence",
    "Trajectory",
    "RewardOutput",
    "EnvReset",
    "EnvStep",
]

Role = Literal["system", "user", "assistant", "tool"]

#: One dataset row. Envs define which keys they need (e.g. ``question``, ``answer``); the
#: core only relies on ``id`` when present.
Sample = Mapping[str, Any]


@dataclass
class ToolCall:
    """A call the model asked for: tool ``name`` with JSON ``arguments``.

    ``invalid``: set by a parser when the call names its tool but its arguments cannot be
    used (not valid JSON, not an object; ``arguments`` is then ``{}``): the tool manager
    answers it with an ``invalid_arguments`` error without running the tool. A call whose
    tool cannot be read at all is a ``ParseError`` instead."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    invalid: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.invalid is not None:
            out["invalid"] = self.invalid
        return out


@dataclass
class Message:
    """One chat message, convertible to the dict form chat templates expect.

    ``images``: pictures shown with the message to a vision-language model (a
    ``PIL.Image.Image``, or the bytes of a PNG / JPEG file), placed before its text. A
    message with images renders its content as parts, ``[{"type": "image"}, ...,
    {"type": "text", "text": content}]``, the shape multimodal chat templates expect; the
    image data itself goes to the model through its processor, not through the template.
    """

    role: Role
    content: str
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)
    #: an assistant message's reasoning (``<think>`` text, harmony's analysis), apart from
    #: its content: set where a family re-renders a conversation from parsed turns
    reasoning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        content: Any = self.content
        if self.images:
            content = [*({"type": "image"} for _ in self.images), {"type": "text", "text": self.content}]
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning  # the key chat templates and renderers read
        if self.tool_calls:
            # The OpenAI / HF chat-template shape: {"type": "function", "function": {...}}.
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return out


@dataclass
class ToolResult:
    """What running one :class:`ToolCall` produced.

    ``content`` is the text the model will see. ``error`` is set when the call failed
    (unknown tool, invalid arguments, timeout, exception); the content then explains the
    failure to the model so it can recover. ``transient`` marks errors worth retrying.
    ``infrastructure``, for a failure: ``True`` when the tool's service failed (down, a
    5xx, a lost connection: not the call's fault, never trained as the model's mistake),
    ``False`` when the call did; ``None`` (unmarked): decided by the error kind
    (:mod:`rlfactory_core.outcomes`).
    """

    name: str
    content: str
    call_id: str = ""
    error: str | None = None
    transient: bool = False
    latency_s: float = 0.0
    infrastructure: bool | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class ParseError:
    """A part of the model's text the parser could not understand, kept for an observation."""

    message: str
    snippet: str = ""


@dataclass
class ParsedTurn:
    """A parser's reading of one model turn.

    ``content`` is the visible text with tool-call blocks and reasoning removed;
    ``reasoning`` is the ``<think>`` text (if the family has one); ``tool_calls`` are the
    well-formed calls in order; ``errors`` are the malformed ones. ``text`` is the raw turn.
    """

    text: str
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)


@dataclass
class Segment:
    """A run of trajectory tokens written by one side.

    ``kind`` is ``"model"`` (sampled by the policy: loss mask 1, ``logprobs`` from the
    sampler, one per token) or ``"observation"`` (rendered tool results and chat-template
    glue: loss mask 0, no logprobs). ``num_messages`` is how many of the trajectory's
    ``messages`` the segment renders (1 for a model turn), which marks turn boundaries in
    the conversation. ``policy_version`` (model segments the backend sampled): the weight
    version that sampled them (:class:`~rlfactory_core.rollout.Generation`); None where no
    policy did (a replayed demonstration).
    """

    kind: Literal["model", "observation"]
    token_ids: list[int]
    logprobs: list[float] | None = None
    num_messages: int = 1
    policy_version: int | None = None

    @property
    def loss_mask(self) -> int:
        return 1 if self.kind == "model" else 0


@dataclass
class TokenSequence:
    """One token sequence of a trajectory: ``prompt_ids`` followed by its ``segments``."""

    prompt_ids: list[int]
    segments: list[Segment] = field(default_factory=list)


@dataclass
class Trajectory:
    """One episode: the prompt tokens followed by alternating model / observation segments.

    Token ids are kept exactly as produced; model output is never re-tokenized from text.

    Most episodes are one sequence. A family whose format rewrites earlier turns (gpt-oss
    drops past analysis after a final answer, DeepSeek renders several tool results at once)
    cannot append the next observation: the rollout then renders the conversation afresh as
    the prompt of a new sequence, and the finished one moves to ``earlier_sequences``.
    ``prompt_ids`` and ``segments`` are always the last sequence; each sampled token is in
    exactly one sequence as a model segment (later sequences hold it as prompt).
    """

    sample_id: str
    prompt_ids: list[int]
    messages: list[Message] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    final_answer: str | None = None
    stop_reason: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    # The env's per-trajectory state (from ``env.reset``) after the episode, for rewards;
    # not saved with the trajectory.
    env_state: Any = field(default=None, repr=False, compare=False)
    # The trajectory's group: the index, in the rollout call's samples, of the sample it was
    # rolled out for (the ``group_size`` trajectories of one sample share it). Advantages
    # are computed per group; None for a trajectory no rollout made. Last, so that fields
    # passed by position keep their places.
    group: int | None = None
    #: the sequences finished before the last one, in order (see above)
    earlier_sequences: list[TokenSequence] = field(default_factory=list)

    @property
    def sequences(self) -> list[TokenSequence]:
        """Every sequence in order, the last one (``prompt_ids``, ``segments``) included."""
        return [*self.earlier_sequences, TokenSequence(self.prompt_ids, self.segments)]

    @property
    def all_segments(self) -> list[Segment]:
        """The segments of every sequence, in order."""
        return [segment for sequence in self.sequences for segment in sequence.segments]

    @property
    def num_turns(self) -> int:
        return sum(1 for s in self.all_segments if s.kind == "model")

    @property
    def images(self) -> list[Any]:
        """The images of the conversation in the order their tokens appear in the ids."""
        return [image for message in self.messages for image in message.images]


@dataclass
class RewardOutput:
    """A reward's score for one trajectory: the ``value`` used for training, and named
    ``components`` logged as metrics (e.g. ``{"format": 0.1, "exact_match": 1.0}``).

    ``correct``: whether the answer is right, for the ``reward/accuracy`` metric (None: this
    reward does not judge correctness). ``turn_rewards``: per-turn (process) rewards, one
    per model turn in order, added to the env's per-turn rewards."""

    value: float
    components: dict[str, float] = field(default_factory=dict)
    correct: bool | None = None
    turn_rewards: list[float] | None = None


@dataclass
class EnvReset:
    """What :meth:`Env.reset` returns: the opening messages, the tools the model may call in
    this episode, and the env's private per-trajectory ``state``."""

    messages: list[Message]
    tools: list[Any] = field(default_factory=list)
    state: Any = None


@dataclass
class EnvStep:
    """What :meth:`Env.step` returns: extra messages to show the model next (feedback such
    as "no tool call found"; the rollout engine itself renders the turn's tool results
    through the parser), whether the episode ended, an optional per-turn reward, and the
    final answer when the env recognised one."""

    observation: list[Message] = field(default_factory=list)
    done: bool = False
    reward: float | None = None
    final_answer: str | None = None
