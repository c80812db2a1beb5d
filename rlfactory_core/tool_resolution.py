"""Tools from specs: registered names, qwen-agent tools and their built-ins, functions.

:func:`resolve_tools` turns a list of specs (tool objects, functions, qwen-agent tools,
registered or built-in names) into tools; ``QwenAgentTool(base_tool)`` adapts a qwen-agent
``BaseTool``. qwen-agent is optional and imported only when a spec needs it.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import sys
from typing import Any, Iterable

from .errors import ConfigError, DuplicateComponentError, UnknownComponentError
from .interfaces import check_component
from .plugins import components, get_component
from .threads import run_in_tool_thread
from .tools import function_tool
from .types import ToolResult

__all__ = ["QwenAgentTool", "resolve_tools"]

log = logging.getLogger("rlfactory.tools")


# -- qwen-agent tools ---------------------------------------------------------------------

_QWEN_MISSING_HINT = "`pip install qwen-agent` adds qwen-agent's built-in tools (storage, code_interpreter, ...)"


def _qwen_base_tool_class() -> type | None:
    """qwen-agent's ``BaseTool`` if qwen-agent is already imported, else None.

    Nothing can be a qwen-agent tool before qwen-agent was imported, so looking in
    ``sys.modules`` answers "is this a qwen-agent tool?" without importing it.
    """
    module = sys.modules.get("qwen_agent.tools.base")
    return getattr(module, "BaseTool", None)


def _qwen_tool_registry() -> dict[str, type] | None:
    """qwen-agent's built-in tools by name, or None when qwen-agent is not installed."""
    try:
        from qwen_agent.tools import TOOL_REGISTRY
    except ImportError:
        return None
    except OSError as exc:  # installed, but a native library it loads (libsndfile) is missing
        log.warning("qwen-agent is installed but cannot be imported, its built-in tools are unavailable: %s", exc)
        return None
    return TOOL_REGISTRY


def _qwen_parameters_schema(parameters: Any) -> dict[str, Any]:
    """qwen-agent's parameters as a JSON schema object.

    qwen-agent accepts either a JSON schema or its older list form,
    ``[{"name", "type", "description", "required"}, ...]``.
    """
    if isinstance(parameters, dict):
        return copy.deepcopy(parameters)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in parameters or []:
        name = param["name"]
        properties[name] = {k: copy.deepcopy(v) for k, v in param.items() if k not in ("name", "required")}
        if param.get("required"):
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _qwen_result_text(value: Any) -> str:
    """A qwen-agent tool's return value as text for the model."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        from qwen_agent.llm.schema import ContentItem

        if all(isinstance(item, ContentItem) for item in value):
            # Non-text items (images, files) are named rather than silently dropped.
            return "\n".join(item.text if item.type == "text" else f"[{item.type}: {item.value}]" for item in value)
    return json.dumps(value, ensure_ascii=False, default=str)


class QwenAgentTool:
    """A qwen-agent ``BaseTool`` instance as a :class:`~rlfactory_core.interfaces.Tool`.

    ``parameters`` is the tool's JSON schema (qwen-agent's list form is converted). The
    sync ``base_tool.call(json_arguments)`` runs in the tool thread pool; a str result is the
    content, a list of ``ContentItem`` is joined text, anything else is JSON-encoded.
    Exceptions propagate, for the tool manager to report.
    """

    def __init__(self, base_tool: Any):
        base_class = _qwen_base_tool_class()
        if base_class is None or not isinstance(base_tool, base_class):
            raise TypeError(f"QwenAgentTool needs a qwen-agent BaseTool instance, got {base_tool!r}")
        self.base_tool = base_tool
        self.name: str = base_tool.name
        self.description: str = base_tool.description or ""
        self.parameters: dict[str, Any] = _qwen_parameters_schema(base_tool.parameters)

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any] | None = None) -> ToolResult:
        value = await run_in_tool_thread(self.base_tool.call, json.dumps(arguments, ensure_ascii=False))
        return ToolResult(name=self.name, content=_qwen_result_text(value))

    def __repr__(self) -> str:
        return f"<QwenAgentTool {self.name}>"


def _make_qwen_tool(tool_class: type, cfg: dict[str, Any] | None, label: str) -> QwenAgentTool:
    try:
        base_tool = tool_class(cfg) if cfg is not None else tool_class()
    except Exception as exc:  # noqa: BLE001 - e.g. a missing API key: say which tool and why
        raise ConfigError(
            [f"qwen-agent tool {label} could not be created: {type(exc).__name__}: {exc}"],
            hint="pass its settings as (name, cfg) or {'name': ..., 'cfg': {...}}",
        ) from exc
    return QwenAgentTool(base_tool)


# -- resolving tool specs -----------------------------------------------------------------


def _tool_by_name(name: str, cfg: dict[str, Any] | None) -> Any:
    if cfg is None:
        try:
            return get_component("tool", name)
        except UnknownComponentError:
            pass  # maybe a qwen-agent built-in
    elif name in components("tool"):
        raise ConfigError([f"tool {name!r} is registered by a plugin and takes no cfg"],
                          hint="a cfg is only for qwen-agent built-in tools")
    registry = _qwen_tool_registry()
    if registry is not None and name in registry:
        return _make_qwen_tool(registry[name], cfg, repr(name))
    registered = ", ".join(sorted(components("tool"))) or "none"
    if registry is None:
        message = f"no tool named {name!r} (registered tools: {registered})"
        hint = f"install the plugin that provides it; {_QWEN_MISSING_HINT}"
    else:
        builtins = ", ".join(sorted(registry))
        message = f"no tool named {name!r} (registered tools: {registered}; qwen-agent built-in tools: {builtins})"
        hint = "install the plugin that provides it; `rlf plugins list` shows what is loaded"
    raise UnknownComponentError(message, hint=hint)


def _resolve_one(spec: Any) -> Any:
    base_class = _qwen_base_tool_class()
    if isinstance(spec, str):
        return _tool_by_name(spec, None)
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], dict):
        return _resolve_with_cfg(spec[0], spec[1])
    if isinstance(spec, dict):
        unknown = set(spec) - {"name", "cfg"}
        if "name" not in spec or unknown:
            raise ConfigError([f"a tool given as a dict needs 'name' and may have 'cfg', got keys {sorted(spec)}"])
        cfg = spec.get("cfg")
        if cfg is not None and not isinstance(cfg, dict):
            raise ConfigError([f"the cfg of tool {spec['name']!r} must be a dict, got {type(cfg).__name__}"])
        return _resolve_with_cfg(spec["name"], cfg) if cfg is not None else _resolve_one(spec["name"])
    if base_class is not None and isinstance(spec, base_class):
        return QwenAgentTool(spec)
    if base_class is not None and inspect.isclass(spec) and issubclass(spec, base_class):
        return _make_qwen_tool(spec, None, spec.__name__)
    if hasattr(spec, "call"):
        check_component("tool", spec)  # names what is missing, e.g. "method 'call' must be 'async def'"
        return spec
    if inspect.isfunction(spec) or inspect.ismethod(spec):
        return function_tool(spec)
    raise TypeError(
        f"cannot make a tool from {spec!r}: expected a tool object (name, description, parameters, "
        "async call), a function, a qwen-agent BaseTool, a tool name, or (name, cfg)"
    )


def _resolve_with_cfg(name: Any, cfg: dict[str, Any]) -> Any:
    base_class = _qwen_base_tool_class()
    if base_class is not None and inspect.isclass(name) and issubclass(name, base_class):
        return _make_qwen_tool(name, cfg, name.__name__)
    if not isinstance(name, str):
        raise TypeError(f"a (name, cfg) tool spec needs a tool name or a qwen-agent BaseTool class, got {name!r}")
    return _tool_by_name(name, cfg)


def resolve_tools(specs: Iterable[Any]) -> list[Any]:
    """Turn tool specs into :class:`~rlfactory_core.interfaces.Tool` objects, in order.

    Each spec is one of:

    * a tool object (``name``, ``description``, ``parameters`` and ``async call``): kept;
    * a plain function, sync or async: wrapped with :func:`function_tool`;
    * a qwen-agent ``BaseTool`` instance, or subclass (instantiated without cfg): adapted
      with :class:`QwenAgentTool`;
    * a name: a tool registered by a plugin, else a qwen-agent built-in tool
      (``qwen_agent.tools.TOOL_REGISTRY``, e.g. ``"storage"``);
    * ``(name, cfg)`` or ``{"name": name, "cfg": cfg}``: a qwen-agent built-in (or
      ``BaseTool`` subclass) created with ``cfg``.

    Raises :class:`~rlfactory_core.errors.UnknownComponentError` for a name nothing
    provides, :class:`~rlfactory_core.errors.DuplicateComponentError` when two specs give
    the same tool name, and ``TypeError`` for a spec that is none of the above.
    """
    if isinstance(specs, (str, bytes, dict)):
        raise TypeError(f"resolve_tools expects a list of tool specs, got a {type(specs).__name__}: {specs!r}")
    tools = [_resolve_one(spec) for spec in specs]
    _check_unique_names(tools)
    return tools


def _check_unique_names(tools: Iterable[Any]) -> None:
    seen: set[str] = set()
    duplicates: list[str] = []
    for tool in tools:
        if tool.name in seen and tool.name not in duplicates:
            duplicates.append(tool.name)
        seen.add(tool.name)
    if duplicates:
        raise DuplicateComponentError(
            f"more than one tool named {', '.join(map(repr, duplicates))} in one tool list",
            hint="each tool name may appear once: the model calls tools by name",
        )

