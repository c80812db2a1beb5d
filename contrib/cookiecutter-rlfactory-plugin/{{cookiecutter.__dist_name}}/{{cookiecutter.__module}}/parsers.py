"""The ``{{ cookiecutter.__slug }}`` response parser: tool calls written as one JSON object per line.

A model turn in this format::

    I will count them.
    {"tool": "word_count", "arguments": {"text": "to be or not to be"}}

Lines that do not start with ``{`` are the turn's visible content. A line that starts with
``{`` but is not a well-formed call becomes a ``ParseError`` (which the env can show the
model), never an exception: ``parse`` must accept any text a model writes.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from rlfactory_core import Message, ParsedTurn, ParseError, ToolCall, ToolResult

__all__ = ["JsonLinesParser"]

CALL_FORMAT = '{"tool": NAME, "arguments": {...}}'
MAX_SNIPPET_CHARS = 200  # of a malformed call, kept for the feedback message


class JsonLinesParser:
    """Reads and writes the one-JSON-object-per-line tool-call format.

    Registered as an instance: it holds no state, so one serves every rollout.
    """

    name = "{{ cookiecutter.__slug }}"

    def render_system_prompt(self, system_prompt: str, tools: Sequence[Any]) -> str:
        """``system_prompt`` followed by the tools' schemas and how to call them."""
        if not tools:
            return system_prompt
        schemas = [
            json.dumps({"name": tool.name, "description": tool.description, "parameters": tool.parameters},
                       ensure_ascii=False)
            for tool in tools
        ]
        instructions = (
            f"To call a tool, write a line holding only a JSON object: {CALL_FORMAT}. "
            "Write one line per call. When you know the answer, reply without any tool call."
        )
        sections = [system_prompt.strip(), "You can call these tools:\n" + "\n".join(schemas), instructions]
        return "\n\n".join(section for section in sections if section)

    def parse(self, text: str) -> ParsedTurn:
        """Split ``text`` into content lines, tool calls and malformed calls. Never raises."""
        content_lines: list[str] = []
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        for line in text.splitlines():
            stripped = line.strip()
            if not stripped.startswith("{"):
                content_lines.append(line)
                continue
            call, problem = _read_call(stripped)
            if call is None:
                errors.append(ParseError(message=problem, snippet=stripped[:MAX_SNIPPET_CHARS]))
            else:
                call.id = f"call_{len(calls)}"
                calls.append(call)
        return ParsedTurn(text=text, content="\n".join(content_lines).strip(), tool_calls=calls, errors=errors)

    def render_tool_results(self, results: Sequence[ToolResult]) -> list[Message]:
        """One ``tool`` message per result, in the order of the calls."""
        return [
            Message(role="tool", content=result.content, name=result.name, tool_call_id=result.call_id or None)
            for result in results
        ]


def _read_call(line: str) -> tuple[ToolCall | None, str]:
    """The call written on ``line``, or ``None`` and what is wrong with it."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        return None, f"not valid JSON ({getattr(exc, 'msg', type(exc).__name__)}); write {CALL_FORMAT}"
    if not isinstance(obj, dict):
        return None, f"not a JSON object; write {CALL_FORMAT}"
    name = obj.get("tool")
    if not isinstance(name, str) or not name:
        return None, 'a tool call needs a "tool" key with the tool\'s name'
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        # the tool is named: keep the call, marked invalid; the tool manager answers it with an
        # invalid_arguments error without running the tool (the rule of every format)
        return ToolCall(name=name, arguments={}, invalid=f'the "arguments" of {name!r} must be a JSON object'), ""
    return ToolCall(name=name, arguments=arguments), ""
