"""A model family: a chat format at the level of token ids
(:class:`~rlfactory_core.interfaces.ModelFamily`), what the agent loop renders and parses with.

:class:`TemplateFamily` serves any model whose Hugging Face chat template renders
conversations append-only (ChatML, Qwen, Llama 3 ...): the template renders the ids
(:class:`~rlfactory_core.rollout.render.ChatTemplate`, content kept as data), and a tool-call
*format*, a registered :class:`~rlfactory_core.interfaces.ResponseParser` (``qwen3``'s
Hermes ``<tool_call>`` blocks, deepsearch's ``search_r1``, android's ``pythonic``), describes
the tools in the system prompt, reads the model's turn from its text and writes the tool
results as messages. The format is a recipe's choice, apart from the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

from ..errors import ModelError, one_line
from ..types import Message, ParsedTurn, ParseError, ToolResult
from .render import ChatTemplate

__all__ = ["TemplateFamily", "FamilyCheck", "SelfCheckTool", "tool_role_messages", "parse_turn", "parse_error_results", "with_tools_prompt"]


def with_tools_prompt(messages: list[Message], tools: Sequence[Any], parser: Any) -> list[Message]:
    """The opening messages with the tools described in the system prompt by the parser."""
    if not tools:
        return list(messages)
    if messages and messages[0].role == "system":
        first = messages[0]
        system = replace(first, content=parser.render_system_prompt(first.content, tools))
        return [system, *messages[1:]]
    return [Message(role="system", content=parser.render_system_prompt("", tools)), *messages]


def parse_turn(family: Any, completion_ids: Sequence[int], context_ids: Sequence[int]) -> ParsedTurn:
    """The family's reading of a model turn; a family that raises (its contract says never)
    gives a turn with one parse error instead, so one bug never ends the batch."""
    try:
        return family.parse(completion_ids, context_ids)
    except Exception as exc:  # noqa: BLE001 - the contract says never raise; a bug must not end the batch
        text = family.decode(completion_ids)
        return ParsedTurn(text=text, content=text.strip(), errors=[ParseError(f"the parser failed: {one_line(exc)}")])


def parse_error_results(turn: ParsedTurn) -> list[ToolResult]:
    """The parse errors of a turn as tool results the model is shown."""
    return [ToolResult(name="parser", content=f"Error: {e.message}", error="parse_error") for e in turn.errors]


def tool_role_messages(results: Sequence[ToolResult]) -> list[Message]:
    """Each result as a ``tool`` message naming its tool and call: how the families with a
    tool role of their own show results."""
    return [Message(role="tool", content=r.content, name=r.name, tool_call_id=r.call_id or None) for r in results]


class SelfCheckTool:
    """The tool of the families' self-checks' sample round."""

    name = "calculator"
    description = "Evaluate an arithmetic expression."
    parameters = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}


@dataclass
class FamilyCheck:
    """What a family's ``self_check`` found (``rlf doctor --model``): a tool round appended
    turn by turn against ``reference``'s encoding of the whole conversation, and a tool result
    holding the vocabulary's markup adding none of it."""

    ok: bool
    problems: list[str]
    tokens: int = 0
    reference: str = "the render of the whole conversation (self-consistent)"

    def describe(self) -> str:
        if self.ok:
            return (f"token-exact: the {self.tokens} ids of a tool round appended turn by turn match "
                    f"{self.reference}; markup in a tool result stays text")
        return "; ".join(self.problems)


class TemplateFamily:
    """The model's own chat template with a text-level tool-call format (``parser``).

    :param chat: the model's template (its tokenizer, processor and template variables).
    :param parser: the tool-call format (a registered response parser).
    """

    name = "template"
    description = ("the model's own chat template (Hugging Face, append-only) with the run's tool-call format "
                   "(`parser`)")

    def __init__(self, chat: ChatTemplate, parser: Any):
        self.chat, self.parser = chat, parser

    @classmethod
    def build(cls, tokenizer: Any, parser: Any, processor: Any = None, **template_kwargs: Any) -> "TemplateFamily":
        """The family for ``tokenizer``'s chat template (``template_kwargs``: its variables,
        e.g. ``enable_thinking``; one the template never reads is an error, not ignored)."""
        chat = ChatTemplate(tokenizer, processor=processor, **template_kwargs)
        source = chat.tokenizer.chat_template
        source = source if isinstance(source, str) else " ".join(map(str, (source or {}).values()))
        unread = sorted(k for k in template_kwargs if not re.search(rf"\b{re.escape(k)}\b", source))
        if unread:
            raise ModelError(f"model.family_options: the model's chat template never reads {unread}",
                             hint="give only variables its template uses (e.g. enable_thinking for Qwen3's)")
        return cls(chat, parser)

    @property
    def format(self) -> str:
        """The tool-call format's name (the parser's)."""
        return str(getattr(self.parser, "name", type(self.parser).__name__))

    def prompt(self, messages: Sequence[Message], tools: Sequence[Any]) -> tuple[list[Message], list[int]]:
        """The messages as the model sees them (the tools described in the system prompt)
        and their ids, ending with the generation prompt."""
        try:
            shown = with_tools_prompt(list(messages), tools, self.parser)
        except Exception as exc:  # e.g. search_r1, made for one tool, and an env with others
            raise ValueError(f"the {self.format!r} format could not present the tools: {one_line(exc)}") from exc
        return shown, self.chat.prompt_ids(shown)

    def parse(self, completion_ids: Sequence[int], context_ids: Sequence[int]) -> ParsedTurn:
        """The format reads the turn's text (special tokens skipped)."""
        return self.parser.parse(self.decode(completion_ids))

    def tool_messages(self, results: Sequence[ToolResult]) -> list[Message]:
        return list(self.parser.render_tool_results(results))

    def observation_ids(self, completion_ids: Sequence[int], context_ids: Sequence[int],
                        observation: Sequence[Message]) -> list[int]:
        """The template's delta for ``observation`` (computed on a reference conversation,
        so the context itself is not needed)."""
        return self.chat.observation_ids(completion_ids, observation)

    def self_check(self) -> Any:
        """The chat template's token-exactness check (:func:`~rlfactory_core.rollout.render.self_check`)."""
        from .render import self_check

        return self_check(self.chat)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.chat.decode(token_ids)
