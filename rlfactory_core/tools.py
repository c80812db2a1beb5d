"""Tools from plain Python functions, and the rules every tool call's text obeys.

A leaf module of the core: it imports nothing that imports it back. Threads for sync
tools are :mod:`rlfactory_core.threads`; turning names and qwen-agent tools into tools is
:mod:`rlfactory_core.tool_resolution`.

``function_tool(fn)`` turns a sync or async function into a :class:`~rlfactory_core.interfaces.Tool`:
the JSON schema comes from the type hints (through pydantic, which also validates the
arguments before the call), the description from the docstring's first paragraph, and
each parameter's description from an ``Args:`` section or ``:param name:`` lines.
A parameter named ``ctx`` is not part of the schema; it receives the call context.

Sync functions run in the tool thread pool (:func:`rlfactory_core.threads.run_in_tool_thread`).
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any, Callable

import pydantic

from .threads import run_in_tool_thread
from .types import ToolCall, ToolResult

__all__ = [
    "FunctionTool",
    "function_tool",
    "ToolArgumentsError",
    "TransientToolError",
    "InfrastructureError",
    "invalid_text",
    "arguments_problem",
    "named_call",
    "MAX_ARGUMENT_DEPTH",
    "valid_text",
]


class ToolArgumentsError(ValueError):
    """The arguments do not match the tool's schema; the message is written for the model."""


class TransientToolError(Exception):
    """Raise from a tool for a failure worth retrying (rate limit, flaky backend).

    The tool manager retries it a bounded number of times, as it does ``ConnectionError``
    and a returned ``ToolResult(error=..., transient=True)``; once the retries are spent the
    trajectory's outcome is ``tool_unavailable``, the infrastructure's
    (:mod:`rlfactory_core.outcomes`).
    """


class InfrastructureError(Exception):
    """Raise from a tool when its service failed, not the call (a 5xx, a server that is
    down, a lost connection), and retrying now would not help.

    The result is an ``exception`` marked ``infrastructure=True``: the trajectory's outcome is
    ``tool_infra_error``, never trained as the model's mistake. A plain exception is the
    call's fault by default (:mod:`rlfactory_core.outcomes`).
    """


# -- text that is not Unicode --------------------------------------------------------------
#
# A Python str may hold lone surrogates (U+D800-U+DFFF): JSON's "\ud800" escape decodes to
# one, and bytes decoded with errors="surrogateescape" hold them. They cannot be encoded as
# UTF-8, so a tool that writes such a string to a file, socket, database or subprocess
# fails deep inside, and a tokenizer refuses such a tool result outright.

_MAX_PATH_CHARS = 200


def _surrogate_at(text: str) -> int | None:
    """The index of the first character of ``text`` that UTF-8 cannot encode, or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _shown(text: str) -> str:
    # Escaped, so the message itself can be encoded (and tokenized).
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_TEXT_HOLDERS = (str, dict, list, tuple)


def _path(node: tuple | None) -> str:
    """``a.b[2]`` from the chain of ``(parent, key or index)`` pairs ending at ``node``."""
    labels = []
    while node is not None:
        node, label = node
        labels.append(f"[{label}]" if isinstance(label, int) else f".{label}")
    return "".join(reversed(labels)).lstrip(".")


#: Nesting levels the arguments of a parsed call may have (the arguments object is level 1):
#: what a tool receives must survive the recursive code after the parser (json.dumps,
#: jsonschema, deepcopy, pickling for Ray).
MAX_ARGUMENT_DEPTH = 100


def arguments_problem(arguments: Any) -> str | None:
    """Why ``arguments`` (a parsed call's) cannot go to a tool: not a dict, a key that is not
    a string, nesting past :data:`MAX_ARGUMENT_DEPTH`, or a value JSON cannot hold (NaN,
    infinity); None when they can. Walked with a list, not recursion: the walk holds where
    a parser might not."""
    if not isinstance(arguments, dict):
        return f"arguments are {type(arguments).__name__}, not a dict"
    stack: list[tuple[Any, int]] = [(arguments, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_ARGUMENT_DEPTH:
            return f"arguments nest more than {MAX_ARGUMENT_DEPTH} levels deep"
        if isinstance(value, dict):
            if any(not isinstance(key, str) for key in value):
                return "arguments have a key that is not a string"
            stack.extend((item, depth + 1) for item in value.values() if isinstance(item, (dict, list)))
        else:
            stack.extend((item, depth + 1) for item in value if isinstance(item, (dict, list)))
    try:
        json.dumps(arguments, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"arguments are not JSON: {exc}"
    return None


def named_call(name: str, arguments: Any, call_id: str = "") -> ToolCall:
    """A call the model named, from its ``arguments`` as a format read them (an object, JSON
    text, or None where they could not be read). Arguments a tool cannot take
    (:func:`arguments_problem`) give a call with ``invalid`` set, which the tool manager
    answers ``invalid_arguments`` without running the tool: one rule for every format."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            arguments = None
    problem = arguments_problem(arguments) if arguments is not None else "arguments are not valid JSON"
    if problem is not None:
        return ToolCall(name, {}, call_id, invalid=f"the arguments of {name!r} cannot be used: {problem}; write them "
                                                   "as one JSON object")
    return ToolCall(name, arguments, call_id)


def invalid_text(arguments: Any) -> str | None:
    """Where ``arguments`` hold a string that is not valid Unicode text, written for the
    model; None when every string in them (keys included, at any depth) encodes as UTF-8.

    Walked with a list, not recursion, so arguments of any depth are checked, and paths
    are only spelled out for the string at fault. The tool manager calls it before
    validating a call's arguments: no tool receives such text.
    """
    stack: list[tuple[Any, tuple | None]] = [(arguments, None)]
    while stack:
        value, node = stack.pop()
        if isinstance(value, str):
            at = _surrogate_at(value)
            if at is not None:
                where = f"the value of {_path(node)}" if node is not None else "the arguments"
                return (f"{where[:_MAX_PATH_CHARS]} holds a lone surrogate ({_shown(value[at])} at char {at}), "
                        "which is not valid Unicode text; write the character itself, or both halves of a "
                        "surrogate pair (\\ud83d\\ude00)")
        elif isinstance(value, dict):
            for key, item in value.items():
                key_text = key if isinstance(key, str) else str(key)
                at = _surrogate_at(key_text)
                if at is not None:
                    where = f"the key '{_shown(key_text)}'" + (f" in {_path(node)}" if node is not None else "")
                    return (f"{where[:_MAX_PATH_CHARS]} holds a lone surrogate ({_shown(key_text[at])} at char "
                            f"{at}), which is not valid Unicode text; write the character itself")
                if isinstance(item, _TEXT_HOLDERS):
                    stack.append((item, (node, key_text)))
        elif isinstance(value, (list, tuple)):
            stack.extend((item, (node, index)) for index, item in enumerate(value) if isinstance(item, _TEXT_HOLDERS))
    return None


def valid_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (a pair of surrogates kept as
    the one character it stands for)."""
    if _surrogate_at(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


# -- tools from functions -----------------------------------------------------------------


def _param_docs(doc: str) -> dict[str, str]:
    docs: dict[str, str] = {}
    for match in re.finditer(r"^\s*:param\s+(\w+):\s*(.+)$", doc, re.MULTILINE):
        docs[match.group(1)] = match.group(2).strip()
    section = re.search(r"^\s*(Args|Arguments|Parameters):\s*\n((?:\s+.+\n?)+)", doc, re.MULTILINE)
    if section:
        for match in re.finditer(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+)$", section.group(2), re.MULTILINE):
            docs.setdefault(match.group(1), match.group(2).strip())
    return docs


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's auto-generated ``title`` keys: they cost prompt tokens and say nothing."""
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title" or not isinstance(v, str)}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


class FunctionTool:
    """A tool backed by a Python function. Build it with :func:`function_tool`.

    A sync function runs in the tool thread pool (see the module docstring for what a
    timeout can and cannot do to it); an async one runs on the event loop.
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None, description: str | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        self.description = description if description is not None else doc.split("\n\n")[0].strip()
        param_docs = _param_docs(doc)
        signature = inspect.signature(fn)
        hints = _type_hints(fn)
        fields: dict[str, Any] = {}
        self._takes_ctx = False
        for param in signature.parameters.values():
            if param.name == "ctx":
                self._takes_ctx = True
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {self.name!r}: *args/**kwargs cannot be described by a JSON schema")
            annotation = hints.get(param.name, Any)
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (annotation, pydantic.Field(default, description=param_docs.get(param.name)))
        self._arguments_model = pydantic.create_model(
            f"{self.name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )
        self.parameters = _strip_titles(self._arguments_model.model_json_schema())

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments converted to the function's types; :class:`ToolArgumentsError` if invalid."""
        try:
            model = self._arguments_model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {problems}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any] | None = None) -> ToolResult:
        kwargs = self.validate(arguments)
        if self._takes_ctx:
            kwargs["ctx"] = ctx
        if inspect.iscoroutinefunction(self.fn):
            value = await self.fn(**kwargs)
        else:
            value = await run_in_tool_thread(self.fn, **kwargs)
        if isinstance(value, ToolResult):
            return value
        content = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        return ToolResult(name=self.name, content=content)

    def __repr__(self) -> str:
        return f"<FunctionTool {self.name}>"


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable forward refs: fall back to "any JSON value"
        return {}


def function_tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
                  description: str | None = None) -> Any:
    """Make a tool from a function; usable as ``function_tool(fn)`` or ``@function_tool(name=...)``."""
    if fn is None:
        return lambda f: FunctionTool(f, name=name, description=description)
    return FunctionTool(fn, name=name, description=description)
