"""The Qwen3 / Hermes tool-calling format.

Qwen3 (like Qwen2.5, Hermes 2/3 and the models fine-tuned on their data) is shown the tools'
JSON schemas in the system prompt and writes each call as a JSON object between tags::

    <think>
    The user wants the weather; I'll call the tool.
    </think>

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

``<think>...</think>`` is the reasoning of thinking models. When the prompt already opened
the block (templates that end the generation prompt with ``<think>\\n``), the turn has a
``</think>`` without an opening tag and everything before it is reasoning. Tool calls
inside reasoning are drafts and are ignored.

Each ``<tool_call>`` body is one JSON object with a non-empty string ``"name"`` and an
``"arguments"`` object; arguments written as a JSON-encoded string are decoded, missing
ones are ``{}``. The body is read as JSON before looking for ``</tool_call>``, so tags
inside argument strings do not cut a call short. Calls get the ids ``call_0``, ``call_1``,
... in order; ``content`` is the text without reasoning and tool-call blocks. JSON nested
more than :data:`MAX_JSON_DEPTH` levels is refused. Parsing is linear in the length of the
text on any input: the decoder only ever sees one block's object (see ``_object_end``).

The results come back as ``<tool_response>`` blocks, all results of one turn inside a
single user turn::

    <|im_start|>user
    <tool_response>
    18 degrees, sunny
    </tool_response><|im_end|>

:class:`Qwen3Parser` reads and writes exactly the text Qwen3's chat template produces, so a
model sees during RL training what it saw during fine-tuning and will see when served.
Parsing never raises: what cannot be read becomes a :class:`~rlfactory_core.types.ParseError`
whose message is written for the model, so an env can show it and let the model retry.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal, Sequence

from rlfactory_core import Message, ParsedTurn, ParseError, ToolCall, ToolResult

__all__ = [
    "Qwen3Parser",
    "format_tool_call",
    "format_tools_section",
    "TOOLS_HEADER",
    "TOOLS_FOOTER",
    "MAX_JSON_DEPTH",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

#: Text before the tool schemas, verbatim from Qwen3's chat template.
TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>"
)
#: Text after the tool schemas, verbatim from Qwen3's chat template.
TOOLS_FOOTER = (
    "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)

# Every tag that changes how the text around it is read. One pattern, searched from the
# current position, keeps the scan linear in the length of the text.
_TAG = re.compile("|".join(re.escape(t) for t in (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE)))
_WHITESPACE = re.compile(r"\s*")
_FORMAT_HINT = 'write {"name": ..., "arguments": {...}}'
_SNIPPET_CHARS = 200


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON (and every tool server) does not.
    raise ValueError(f"{name} is not allowed in JSON")


def _finite_float(literal: str) -> float:
    # "1e400" would become inf, which no tool server accepts and json.dumps writes as the
    # invalid "Infinity": refuse it here, with the other non-JSON numbers.
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"the number {literal[:20]} is too large")
    return value


# strict=True (the default) also rejects raw control characters such as newlines inside
# strings, as vLLM's and other servers' Hermes parsers do: training on the same rules the
# model will be served with.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)

#: Nesting levels a call's JSON may have (the call object counts as one). Deeper values are
#: refused before decoding: what a tool receives must survive the recursive code after the
#: parser (json.dumps, deepcopy, jsonschema, pickling for Ray), and no tool needs more.
MAX_JSON_DEPTH = 100

# Outside strings, JSON holds only whitespace, ":", ",", numbers and the letters of
# true/false/null; this finds the next character that is none of those: a bracket, a
# quote, or something that cannot be JSON.
_JSON_STRUCTURE = re.compile(r"[^ \t\n\r:,0-9.eE+\-trufalsn]")
# The rest of a string after its opening quote, escapes included, up to the closing quote.
_STRING_TAIL = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKETS = re.compile(r'[\[\]{}"]')


def _object_end(text: str, start: int) -> int | None:
    """Where the object opened by ``text[start] == "{"`` ends, if its brackets close within
    :data:`MAX_JSON_DEPTH` levels; None when they do not (the object cannot be decoded).

    A syntactic scan, so that the decoder is handed exactly one block's JSON and never
    the rest of the turn: a failing decode counts the lines of everything before the
    error in what it was handed, so decoding from each broken block to the end of the
    turn made parsing quadratic. The scan gives up at the first character that cannot be
    JSON outside a string, which keeps the scans of all blocks linear together: a later
    ``<tool_call>`` inside this scan lies in one of its strings, and a scan started there
    runs at most until the quote where this one's string ends (it reads that quote as
    the start of a string, and this scan's next stretch outside strings as its inside).
    """
    depth, pos = 0, start
    while (match := _JSON_STRUCTURE.search(text, pos)) is not None:
        pos = match.end()
        char = match.group()
        if char == '"':
            string = _STRING_TAIL.match(text, pos)
            if string is None:
                return None
            pos = string.end()
        elif char in "{[":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return None
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return pos
        else:
            return None
    return None


def _too_deep(text: str) -> bool:
    """Whether brackets outside strings nest more than :data:`MAX_JSON_DEPTH` levels in ``text``."""
    depth, pos = 0, 0
    while (match := _BRACKETS.search(text, pos)) is not None:
        pos = match.end()
        char = match.group()
        if char == '"':
            string = _STRING_TAIL.match(text, pos)
            if string is None:
                return False
            pos = string.end()
        elif char in "{[":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        else:
            depth -= 1
    return False


def _decode(text: str) -> Any:
    """``text`` (one bounded piece of the turn) as JSON, refusing values nested too deeply."""
    if _too_deep(text):
        raise ValueError(f"it is nested more than {MAX_JSON_DEPTH} levels deep")
    return _DECODER.decode(text)


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages the model reads."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _snippet(text: str, start: int = 0, end: int | None = None, limit: int = _SNIPPET_CHARS) -> str:
    """``text[start:end]``, shortened to ``limit`` characters; copies only what it keeps."""
    end = len(text) if end is None else end
    return text[start:end] if end - start <= limit else text[start : start + limit - 1] + "…"


def _json_error(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        # Some of json's messages end in "at" already ("Unterminated string starting at").
        return f"{exc.msg} char {exc.pos}" if exc.msg.endswith(" at") else f"{exc.msg} at char {exc.pos}"
    if isinstance(exc, RecursionError):  # the decoder's own guard, should a value get past _too_deep
        return "it is nested too deeply"
    return str(exc)


def format_tool_call(call: ToolCall) -> str:
    """The exact text a Qwen3 model writes for ``call``.

    Matches the chat template's rendering of an assistant tool call
    (``<tool_call>\\n{"name": "...", "arguments": {...}}\\n</tool_call>``, non-ASCII kept
    as is), so ``parse(format_tool_call(c))`` gives back ``c``.
    """
    payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{payload}\n{CALL_CLOSE}"


def _tool_schema(tool: Any) -> dict[str, Any]:
    """``{"type": "function", "function": {...}}`` for a tool object or a schema dict.

    Envs may hand over tool objects (the usual case) or ready OpenAI-style schema dicts;
    both are rendered the way Hugging Face's ``apply_chat_template(tools=...)`` would.
    """
    if isinstance(tool, dict):
        if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
            return tool
        return {"type": "function", "function": tool}
    parameters = getattr(tool, "parameters", None)
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": getattr(tool, "description", None) or "",
            "parameters": parameters if parameters is not None else {"type": "object", "properties": {}},
        },
    }


def format_tools_section(tools: Sequence[Any]) -> str:
    """Qwen3's ``# Tools`` section: the header, one JSON schema per line, the instructions."""
    lines = []
    for tool in tools:
        schema = _tool_schema(tool)
        try:
            # Default separators and ensure_ascii=False: what the template's ``tojson`` writes.
            lines.append(json.dumps(schema, ensure_ascii=False))
        except (TypeError, ValueError) as exc:
            name = schema.get("function", {}).get("name", "?")
            raise TypeError(f"tool {name!r}: its schema cannot be written as JSON: {exc}") from exc
    return TOOLS_HEADER + "".join("\n" + line for line in lines) + TOOLS_FOOTER


class _Reader:
    """One pass over one turn. Kept apart from the parser so the parser stays stateless."""

    def __init__(self, text: str):
        self.text = text
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.saw_think = False
        self.calls: list[ToolCall] = []
        self.errors: list[ParseError] = []
        self.attempts = 0  # <tool_call> blocks seen, so messages can say "tool call 2"

    def read(self) -> ParsedTurn:
        text, pos = self.text, 0
        while True:
            match = _TAG.search(text, pos)
            if match is None:
                self.content.append(text[pos:])
                break
            self.content.append(text[pos : match.start()])
            tag = match.group()
            if tag == THINK_OPEN:
                pos = self._think_block(match.end())
            elif tag == THINK_CLOSE:
                self._think_close(match.start())
                pos = match.end()
            elif tag == CALL_OPEN:
                self.attempts += 1
                pos = self._tool_call(match.start(), match.end())
            else:  # CALL_CLOSE with no open block before it
                self._error(f"found {CALL_CLOSE} without a matching {CALL_OPEN}; "
                            f"start each call with {CALL_OPEN} and {_FORMAT_HINT}",
                            max(0, match.end() - _SNIPPET_CHARS), match.end())
                pos = match.end()
        for index, call in enumerate(self.calls):
            call.id = f"call_{index}"
        reasoning = None
        if self.saw_think:
            reasoning = "\n\n".join(part.strip() for part in self.reasoning if part.strip())
        return ParsedTurn(text=text, content="".join(self.content).strip(), reasoning=reasoning,
                          tool_calls=self.calls, errors=self.errors)

    def _error(self, message: str, start: int, end: int) -> None:
        """Record a problem with ``text[start:end]`` (only a snippet of it is kept)."""
        self.errors.append(ParseError(message=message, snippet=_snippet(self.text, start, end)))

    def _think_block(self, start: int) -> int:
        """Read ``<think>...`` from just after the tag; return where reading goes on."""
        self.saw_think = True
        end = self.text.find(THINK_CLOSE, start)
        if end == -1:
            # Usually a turn cut off by the token limit while still thinking.
            self.reasoning.append(self.text[start:])
            self._error(f"the {THINK_OPEN} block is not closed: end your reasoning with {THINK_CLOSE}; "
                        f"tool calls inside it are ignored", start - len(THINK_OPEN), len(self.text))
            return len(self.text)
        self.reasoning.append(self.text[start:end])
        return end + len(THINK_CLOSE)

    def _think_close(self, at: int) -> None:
        if self.saw_think:
            end = at + len(THINK_CLOSE)
            self._error(f"found {THINK_CLOSE} without a matching {THINK_OPEN}", max(0, end - _SNIPPET_CHARS), end)
            return
        # The prompt opened the block: everything so far was reasoning, including any
        # tool calls the model drafted while thinking.
        self.saw_think = True
        self.reasoning = [self.text[:at]]
        self.content.clear()
        self.calls.clear()
        self.errors.clear()
        self.attempts = 0

    def _tool_call(self, block_start: int, body_start: int) -> int:
        """Read one ``<tool_call>`` block; return where reading goes on."""
        text, n = self.text, self.attempts
        # First read the body as JSON, so tags inside argument strings ("<think>",
        # "</tool_call>") cannot end the block early. The decoder gets only the object's
        # own text (see _object_end), never the rest of the turn.
        json_start = _WHITESPACE.match(text, body_start).end()
        if text.startswith("{", json_start):
            json_end = _object_end(text, json_start)
            if json_end is not None:
                try:
                    value, length = _DECODER.raw_decode(text[json_start:json_end])
                except (ValueError, RecursionError):
                    pass
                else:
                    close_at = _WHITESPACE.match(text, json_start + length).end()
                    if text.startswith(CALL_CLOSE, close_at):
                        end = close_at + len(CALL_CLOSE)
                        self._accept(value, n, block_start, end)
                        return end
        # Not a well-formed block: the body runs to the next tag, and the error says why.
        match = _TAG.search(text, body_start)
        if match is None or match.group() != CALL_CLOSE:
            # Cut off by the token limit, or the model started something else (another
            # call, a think block) first. Stop at that tag so it is still read.
            end = match.start() if match is not None else len(text)
            self._error(f"tool call {n} is not closed: end it with {CALL_CLOSE}", block_start, end)
            return end
        # The body up to the next tag: a bounded piece, decoded again for the error message.
        body = text[body_start : match.start()].strip()
        snippet = (block_start, match.end())
        if not body:
            self._error(f"tool call {n} is empty; {_FORMAT_HINT}", *snippet)
            return match.end()
        try:
            value = _decode(body)
        except (ValueError, RecursionError) as exc:
            self._error(f"tool call {n} is not valid JSON: {_json_error(exc)}; {_FORMAT_HINT}", *snippet)
        else:
            self._accept(value, n, *snippet)
        return match.end()

    def _accept(self, value: Any, n: int, start: int, end: int) -> None:
        """Check a decoded body's shape (the block is ``text[start:end]``); keep it as a call
        or record why not."""
        snippet = (start, end)
        if not isinstance(value, dict):
            self._error(f"tool call {n} must be a JSON object, got {_json_type(value)}; {_FORMAT_HINT}", *snippet)
            return
        name = value.get("name")
        if name is None:
            self._error(f'tool call {n} has no "name"; {_FORMAT_HINT}', *snippet)
            return
        if not isinstance(name, str):
            self._error(f'the "name" of tool call {n} must be a string, got {_json_type(name)}', *snippet)
            return
        if not name.strip():
            self._error(f'the "name" of tool call {n} is empty; give the name of one of the tools', *snippet)
            return
        if "arguments" not in value:
            arguments: Any = {}  # a tool without parameters is often called this way
        else:
            arguments = value["arguments"]
            if isinstance(arguments, str):
                # Qwen models sometimes write the arguments as a JSON-encoded string, the
                # way the OpenAI API transports them.
                try:
                    arguments = _decode(arguments)
                except (ValueError, RecursionError) as exc:
                    # the tool is known: the call stays, and the tool manager answers
                    # invalid_arguments (ToolCall.invalid), the rule of every format
                    self.calls.append(ToolCall(name=name, arguments={}, invalid=(
                        f'the "arguments" of tool call {n} ({name}) are a string that is not valid JSON '
                        f"({_json_error(exc)}); write the arguments as a JSON object")))
                    return
            if not isinstance(arguments, dict):
                self.calls.append(ToolCall(name=name, arguments={}, invalid=(
                    f'the "arguments" of tool call {n} ({name}) must be a JSON object, got '
                    f"{_json_type(arguments)}; {_FORMAT_HINT}")))
                return
        self.calls.append(ToolCall(name=name, arguments=arguments))


class Qwen3Parser:
    """Response parser for Qwen3 / Hermes-style tool calling, registered as ``qwen3``.

    :param tool_role: ``"user"`` (the default) returns all results of a turn as one user
        message of ``<tool_response>`` blocks: exactly what Qwen3's template renders for
        tool messages, and it works with any chat template, also those without a tool
        role (SmolLM2's). ``"tool"`` returns one ``tool`` message per result, for
        templates that render tool messages themselves.
    """

    name = "qwen3"
    description = "Qwen3 / Hermes tool calling: <tool_call> JSON blocks, <think> reasoning, <tool_response> results"

    def __init__(self, tool_role: Literal["user", "tool"] = "user"):
        if tool_role not in ("user", "tool"):
            raise ValueError(f'tool_role must be "user" or "tool", got {tool_role!r}')
        self.tool_role = tool_role

    def render_system_prompt(self, system_prompt: str, tools: Sequence[Any]) -> str:
        """``system_prompt`` followed by Qwen3's tools section; unchanged when there are no tools.

        With an empty system prompt the section stands alone, as in the template when the
        conversation has no system message.
        """
        if not tools:
            return system_prompt
        section = format_tools_section(tools)
        return f"{system_prompt}\n\n{section}" if system_prompt else section

    def parse(self, text: str) -> ParsedTurn:
        """Read one model turn. Never raises; see the module docstring for the format."""
        if not isinstance(text, str):
            return ParsedTurn(text="" if text is None else str(text),
                              errors=[ParseError(f"expected the model's text, got {type(text).__name__}")])
        try:
            return _Reader(text).read()
        except Exception as exc:  # noqa: BLE001 - a parser bug must not end a rollout
            return ParsedTurn(text=text, content=text.strip(), errors=[ParseError(
                f"the response could not be read ({type(exc).__name__}); "
                f"write each call as {CALL_OPEN}\n{{\"name\": ..., \"arguments\": {{...}}}}\n{CALL_CLOSE}",
                _snippet(text))])

    def render_tool_results(self, results: Sequence[ToolResult]) -> list[Message]:
        """The messages showing the model its results, in call order.

        Error results are rendered like any other: their content already explains the
        failure to the model.
        """
        if not results:
            return []
        if self.tool_role == "tool":
            return [Message(role="tool", content=_text(r.content), name=r.name, tool_call_id=r.call_id or None)
                    for r in results]
        # Qwen3's template wraps consecutive tool messages in one user turn, each as
        # "\n<tool_response>\n...\n</tool_response>" after "<|im_start|>user"; a user message
        # with these blocks joined by "\n" renders to the same text. It also starts and ends
        # with the tags, which is how the template tells tool results from a new question.
        blocks = [f"{RESPONSE_OPEN}\n{_text(r.content)}\n{RESPONSE_CLOSE}" for r in results]
        return [Message(role="user", content="\n".join(blocks))]

    format_tool_call = staticmethod(format_tool_call)

    def __repr__(self) -> str:
        return f"Qwen3Parser(tool_role={self.tool_role!r})"


def _text(content: Any) -> str:
    # A tool manager should hand over text; a stray non-string must not break the rollout.
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
