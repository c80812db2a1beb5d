"""The parser ``pythonic``: tool calls written as Python calls, one per line.

::

    open_app(app="Settings")
    tap(element=4)

A call is a line that holds nothing but ``name(argument=value, ...)`` (or Llama's list of
calls, ``[tap(element=4), press_key(key="back")]``), its values Python literals: strings,
numbers, ``True``/``False``/``None``, lists and dicts of them. Any other line is the turn's
text: "Done." ends an android episode. The tools section of the system prompt is one
signature line per tool (``tap(element: int = None, x: int = None, y: int = None): Tap an
element ...``), not a JSON schema; results come back as one user turn, each result after
the tool's name.

Why it exists: with Qwen3's JSON format the android env's seven tool schemas take ~1,000
tokens of every prompt, and the worked examples' calls twice what they take here; on a
2-core CPU, training cost grows with every token of context (bench/README.md, android's
cold start). It reads like code, which small models have seen plenty of.

Reasoning inside ``<think>...</think>`` is not read for calls, as in the other parsers. A
line that starts like a call (a name and an opening parenthesis) but is not one, names its
arguments by position, or gives a value that is not a literal is a parse error whose
message tells the model the format. Lines longer than :data:`MAX_CALL_CHARS` or nested
deeper than :data:`MAX_CALL_DEPTH` are errors too, which keeps the work linear in the text.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any, Sequence

from rlfactory_core import Message, ParsedTurn, ParseError, ToolCall, ToolResult

__all__ = ["PythonicParser", "MAX_CALL_CHARS", "MAX_CALL_DEPTH", "format_signature"]

#: The longest line read as a call; a longer one is a parse error (tool calls are short).
MAX_CALL_CHARS = 4000
#: The deepest bracket nesting a call's line may have.
MAX_CALL_DEPTH = 32
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S)
_CALL_START = re.compile(r"\[?\s*[A-Za-z_][A-Za-z0-9_]*\(")
_FORMAT_HINT = 'write name(argument=value), e.g. tap(element=3), on a line of its own'
_SNIPPET_CHARS = 120
_JSON_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list",
               "object": "dict", "null": "None"}


class _NotACall(ValueError):
    """A line that starts like a call but is not one; the message is for the model."""


def _schema(tool: Any) -> tuple[str, str, dict[str, Any]]:
    """(name, description, JSON-schema parameters) of a tool object or an OpenAI-style dict."""
    if isinstance(tool, dict):
        spec = tool.get("function", tool) if tool.get("type") == "function" else tool
        return str(spec.get("name", "")), str(spec.get("description") or ""), dict(spec.get("parameters") or {})
    return str(tool.name), str(getattr(tool, "description", None) or ""), dict(getattr(tool, "parameters", None) or {})


def _type_text(spec: Any) -> str:
    if not isinstance(spec, dict):
        return "any"
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return " | ".join(_literal(value) for value in spec["enum"])
    kind = spec.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    names = [_JSON_TYPES.get(k, "any") for k in kinds if isinstance(k, str)]
    return " | ".join(names) if names else "any"


def format_signature(tool: Any) -> str:
    """One line for ``tool``: its Python-style signature (required arguments first, the
    others ``= None``) and its description."""
    name, description, parameters = _schema(tool)
    properties = parameters.get("properties") if isinstance(parameters.get("properties"), dict) else {}
    required = [key for key in parameters.get("required") or [] if key in properties]
    optional = [key for key in properties if key not in required]
    parts = [f"{key}: {_type_text(properties[key])}" for key in required]
    parts += [f"{key}: {_type_text(properties[key])} = None" for key in optional]
    line = f"{name}({', '.join(parts)})"
    return f"{line}: {description}" if description else line


def _literal(value: Any) -> str:
    """``value`` (JSON data) as the Python literal a model writes for it."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a valid Python string literal
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(str(k))}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


def _depth(line: str) -> int:
    """The deepest bracket nesting of ``line``, counting brackets inside strings too (a
    bound, not a parse)."""
    depth = deepest = 0
    for char in line:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest


def _json_value(node: ast.AST, where: str) -> Any:
    """The JSON value of a literal node; ``_NotACall`` for anything else. Recursion is
    bounded by :data:`MAX_CALL_DEPTH` (checked on the line first)."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise _NotACall(f"{where}: {node.value} is not a finite number")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) \
            and isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float):
        value = node.operand.value
        if isinstance(value, float) and not math.isfinite(value):
            raise _NotACall(f"{where}: {value} is not a finite number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_json_value(item, where) for item in node.elts]
    if isinstance(node, ast.Dict):
        result = {}
        for key, value in zip(node.keys, node.values):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise _NotACall(f"{where}: dict keys must be strings in quotes")
            result[key.value] = _json_value(value, where)
        return result
    raise _NotACall(f"{where}: the value must be a literal (a number, \"text\", True, False, None, "
                    f"a list or a dict), not {type(node).__name__}")


def _read_call(node: ast.AST) -> ToolCall:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise _NotACall(f"this is not a tool call; {_FORMAT_HINT}")
    name = node.func.id
    try:
        return ToolCall(name=name, arguments=_read_arguments(name, node))
    except _NotACall as exc:
        # the tool is named: the call stays, and the tool manager answers invalid_arguments
        # without running it (ToolCall.invalid), the rule of every format
        return ToolCall(name=name, arguments={}, invalid=str(exc))


def _read_arguments(name: str, node: ast.Call) -> dict[str, Any]:
    if node.args:
        raise _NotACall(f"{name}: name every argument, e.g. {name}(element=3), not by position")
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise _NotACall(f"{name}: write each argument as name=value (no **)")
        if keyword.arg in arguments:
            raise _NotACall(f"{name}: the argument {keyword.arg} is given twice")
        arguments[keyword.arg] = _json_value(keyword.value, f"{name}({keyword.arg}=...)")
    return arguments


def _read_line(line: str) -> list[ToolCall]:
    """The calls a line holds; ``_NotACall`` when it starts like a call but is not one."""
    if len(line) > MAX_CALL_CHARS:
        raise _NotACall(f"the call is longer than {MAX_CALL_CHARS} characters")
    if _depth(line) > MAX_CALL_DEPTH:
        raise _NotACall(f"the call nests brackets more than {MAX_CALL_DEPTH} deep")
    try:
        tree = ast.parse(line, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise _NotACall(f"the call is not well-formed; {_FORMAT_HINT}") from None
    body = tree.body
    nodes = body.elts if isinstance(body, ast.List) else [body]
    return [_read_call(node) for node in nodes]


class PythonicParser:
    """Tool calls as Python calls, one per line (see the module docstring); registered as
    ``pythonic``."""

    name = "pythonic"
    description = "tool calls as Python calls on their own lines: tap(element=3); signatures, not JSON schemas"

    def render_system_prompt(self, system_prompt: str, tools: Sequence[Any]) -> str:
        """``system_prompt`` plus how to call and one signature line per tool; unchanged
        without tools."""
        if not tools:
            return system_prompt
        section = ("To call a tool, write the call on a line of its own, with named arguments:\n"
                   + "\n".join(format_signature(tool) for tool in tools))
        return f"{system_prompt}\n\n{section}" if system_prompt else section

    def parse(self, text: str) -> ParsedTurn:
        """Read one model turn; never raises."""
        if not isinstance(text, str):
            return ParsedTurn(text="" if text is None else str(text),
                              errors=[ParseError(f"expected the model's text, got {type(text).__name__}")])
        thoughts = [m.group(0).removeprefix("<think>").removesuffix("</think>").strip() for m in _THINK.finditer(text)]
        visible = _THINK.sub("", text)
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        content: list[str] = []
        for line in visible.split("\n"):
            stripped = line.strip()
            if not _CALL_START.match(stripped):
                content.append(line)
                continue
            try:
                found = _read_line(stripped)
            except _NotACall as exc:
                errors.append(ParseError(str(exc), stripped[:_SNIPPET_CHARS]))
                continue
            for call in found:
                calls.append(ToolCall(name=call.name, arguments=call.arguments, id=f"call_{len(calls)}",
                                      invalid=call.invalid))
        return ParsedTurn(text=text, content="\n".join(content).strip(),
                          reasoning="\n".join(thoughts) if thoughts else None, tool_calls=calls, errors=errors)

    def render_tool_results(self, results: Sequence[ToolResult]) -> list[Message]:
        """One user turn: each result (or error explanation) after its tool's name."""
        if not results:
            return []
        return [Message(role="user", content="\n\n".join(f"{r.name} returned:\n{_text(r.content)}" for r in results))]

    def format_tool_call(self, call: ToolCall) -> str:
        """The line a model writes for ``call`` (worked examples, demonstrations);
        ``parse`` reads it back as ``call``."""
        return f"{call.name}({', '.join(f'{key}={_literal(value)}' for key, value in call.arguments.items())})"

    def __repr__(self) -> str:
        return "PythonicParser()"


def _text(content: Any) -> str:
    return content if isinstance(content, str) else str(content)
