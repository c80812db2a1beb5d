"""Tools from plain Python functions.

``function_tool(fn)`` turns a sync or async function into a :class:`~rlfactory_core.interfaces.Tool`:
the JSON schema comes from the type hints (through pydantic, which also validates the
arguments before the call), the description from the docstring's first paragraph, and
each parameter's description from an ``Args:`` section or ``:param name:`` lines.
A parameter named ``ctx`` is not part of the schema; it receives the call context.
Sync functions run in a worker thread so a slow tool never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from typing import Any, Callable

import pydantic

from .types import ToolResult

__all__ = ["FunctionTool", "function_tool", "ToolArgumentsError"]


class ToolArgumentsError(ValueError):
    """The arguments do not match the tool's schema; the message is written for the model."""


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
    """A tool backed by a Python function. Build it with :func:`function_tool`."""

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
            value = await asyncio.to_thread(self.fn, **kwargs)
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
