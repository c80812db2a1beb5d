"""The parser ``search_r1``: Search-R1's own tag format for its one tool.

Search-R1 trains its models to search by writing the query between tags, and shows the
passages between ``<information>`` tags::

    <search> capital of Paraguay </search>
    ...
    <information>Doc 1(Title: "Asunción") Asunción is the capital city of Paraguay.</information>

There is no JSON to get right, which is why small models (the embedded 135M one) follow it
far more often than a JSON tool call. This parser reads ``<search>q</search>`` as the call
``search({"query": q})`` of the env's ``search`` tool and renders its results as one user
turn with an ``<information>`` block per call. The tools section of the system prompt is
Search-R1's sentence about the tags, not a JSON schema.

Reasoning inside ``<think>...</think>`` is not read for calls (a query drafted while
thinking is not a search), as in the ``qwen3`` parser. A ``<search>`` without its closing
tag, or with nothing in it, is a parse error whose message tells the model the format.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from rlfactory_core import Message, ParsedTurn, ParseError, ToolCall, ToolResult

__all__ = ["SearchR1Parser"]

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S)
_SNIPPET_CHARS = 80


class SearchR1Parser:
    """``<search> query </search>`` calls and ``<information>`` results (Search-R1's format).

    :param tool: the tool a ``<search>`` block calls (the deepsearch env's is ``search``).
    :param argument: the tool's argument that receives the query text.
    """

    name = "search_r1"
    description = "Search-R1's tags: <search> query </search> calls the search tool, results in <information>"

    def __init__(self, tool: str = "search", argument: str = "query"):
        self.tool, self.argument = tool, argument

    def render_system_prompt(self, system_prompt: str, tools: Sequence[Any]) -> str:
        """``system_prompt`` plus Search-R1's sentence on how to search, when the search
        tool is offered. Other tools cannot be called in this format: naming them is an
        error, not something to leave for the model to discover."""
        names = [tool.name for tool in tools]
        others = [name for name in names if name != self.tool]
        if others:
            raise ValueError(f"the search_r1 parser can only call the {self.tool!r} tool, the env also offers "
                             f"{', '.join(others)}; use a general parser (qwen3)")
        if not names:
            return system_prompt
        section = (f"To search, write the query between {SEARCH_OPEN} and {SEARCH_CLOSE}; the top results "
                   f"come back between {INFO_OPEN} and {INFO_CLOSE}.")
        return f"{system_prompt}\n\n{section}" if system_prompt else section

    def parse(self, text: str) -> ParsedTurn:
        """Every ``<search>...</search>`` outside reasoning is a call; never raises."""
        if not isinstance(text, str):
            return ParsedTurn(text="" if text is None else str(text),
                              errors=[ParseError(f"expected the model's text, got {type(text).__name__}")])
        visible = _THINK.sub("", text)
        thoughts = [m.group(0).removeprefix("<think>").removesuffix("</think>").strip() for m in _THINK.finditer(text)]
        reasoning = "\n".join(thoughts) if thoughts else None
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        content: list[str] = []
        position = 0
        while (start := visible.find(SEARCH_OPEN, position)) != -1:
            content.append(visible[position:start])
            body_start = start + len(SEARCH_OPEN)
            end = visible.find(SEARCH_CLOSE, body_start)
            if end == -1:
                errors.append(ParseError(f"{SEARCH_OPEN} is not closed; write {SEARCH_OPEN} query {SEARCH_CLOSE}",
                                         visible[start:start + _SNIPPET_CHARS]))
                position = len(visible)
                break
            query = visible[body_start:end].strip()
            if query:
                calls.append(ToolCall(name=self.tool, arguments={self.argument: query}, id=f"call_{len(calls)}"))
            else:
                # The blank between the tags may be megabytes long: keep at most a snippet's worth.
                block_end = end + len(SEARCH_CLOSE)
                snippet = (visible[start:block_end] if block_end - start <= _SNIPPET_CHARS
                           else f"{SEARCH_OPEN} {SEARCH_CLOSE}")
                errors.append(ParseError(f"the search is empty; write {SEARCH_OPEN} query {SEARCH_CLOSE}", snippet))
            position = end + len(SEARCH_CLOSE)
        content.append(visible[position:])
        return ParsedTurn(text=text, content="".join(content).strip(), reasoning=reasoning,
                          tool_calls=calls, errors=errors)

    def render_tool_results(self, results: Sequence[ToolResult]) -> list[Message]:
        """One user turn: each result (or error explanation) in an ``<information>`` block."""
        if not results:
            return []
        blocks = [f"{INFO_OPEN}{_text(result.content)}{INFO_CLOSE}" for result in results]
        return [Message(role="user", content="\n".join(blocks))]

    def format_tool_call(self, call: ToolCall) -> str:
        """A call as the model writes it (for worked examples in prompts)."""
        return f"{SEARCH_OPEN} {call.arguments[self.argument]} {SEARCH_CLOSE}"

    def __repr__(self) -> str:
        return f"SearchR1Parser(tool={self.tool!r}, argument={self.argument!r})"


def _text(content: Any) -> str:
    return content if isinstance(content, str) else str(content)
