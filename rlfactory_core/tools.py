"""Tools: from plain Python functions, from qwen-agent tools, and from names.

``function_tool(fn)`` turns a sync or async function into a :class:`~rlfactory_core.interfaces.Tool`:
the JSON schema comes from the type hints (through pydantic, which also validates the
arguments before the call), the description from the docstring's first paragraph, and
each parameter's description from an ``Args:`` section or ``:param name:`` lines.
A parameter named ``ctx`` is not part of the schema; it receives the call context.

``QwenAgentTool(base_tool)`` adapts a qwen-agent ``BaseTool``; :func:`resolve_tools` turns a
list of specs (tool objects, functions, qwen-agent tools, registered or built-in names)
into tools. qwen-agent is optional and imported only when a spec needs it.

Sync functions (function tools and every qwen-agent tool) run in a dedicated pool of
:data:`TOOL_THREADS` daemon threads, never in asyncio's small default executor, so a few
hanging tools cannot starve the others or block ``asyncio.run``'s shutdown. A thread
running a hung sync function cannot be killed: the tool manager's timeout frees the
trajectory, not the thread, which stays busy until the function returns (and enough hung
threads exhaust the pool). Write tools that may block for long as ``async def``, where a
timeout really cancels the work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import functools
import inspect
import json
import logging
import os
import queue
import re
import sys
import threading
from typing import Any, Callable, Iterable

import pydantic

from .errors import ConfigError, DuplicateComponentError, UnknownComponentError
from .types import ToolResult

__all__ = [
    "FunctionTool",
    "function_tool",
    "ToolArgumentsError",
    "TransientToolError",
    "invalid_text",
    "valid_text",
    "DaemonThreadPool",
    "QwenAgentTool",
    "resolve_tools",
    "run_in_tool_thread",
    "TOOL_THREADS",
]

log = logging.getLogger("rlfactory.tools")

#: Worker threads of the pool that runs sync tools (shared by the whole process).
TOOL_THREADS = 64


class ToolArgumentsError(ValueError):
    """The arguments do not match the tool's schema; the message is written for the model."""


class TransientToolError(Exception):
    """Raise from a tool for a failure worth retrying (rate limit, flaky backend).

    The tool manager retries it a bounded number of times, as it does ``ConnectionError``
    and a returned ``ToolResult(error=..., transient=True)``.
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


# -- the thread pool for sync tools -------------------------------------------------------


class DaemonThreadPool(concurrent.futures.Executor):
    """A minimal thread pool whose workers are daemon threads.

    ``ThreadPoolExecutor`` joins its workers at interpreter exit, so a single hung tool
    would keep a finished training run from exiting; a daemon worker does not. Threads are
    started on demand, up to ``max_workers``, and reused.
    """

    def __init__(self, max_workers: int, thread_name_prefix: str):
        self.max_workers = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._started = 0
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        with self._lock:
            if self._pid != os.getpid():
                self._reset()  # a forked child inherits the queue but none of the threads
            if self._shutdown:
                raise RuntimeError("cannot run a tool after the tool thread pool was shut down")
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._work.put((future, fn, args, kwargs))
            # Like ThreadPoolExecutor: start a thread only when none is idle to take the work.
            if not self._idle.acquire(blocking=False) and self._started < self.max_workers:
                self._started += 1
                threading.Thread(target=self._worker, name=f"{self._prefix}_{self._started}", daemon=True).start()
            return future

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - delivered to the awaiting coroutine
                    future.set_exception(exc)
            # Drop references before idling so an idle worker keeps no arguments alive.
            del future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            for _ in range(self._started):
                self._work.put(None)


_TOOL_POOL = DaemonThreadPool(TOOL_THREADS, thread_name_prefix="rlf-tool")


async def run_in_tool_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run the sync ``fn(*args, **kwargs)`` in the tool thread pool and await its result.

    The caller's context variables are visible in the thread, as with ``asyncio.to_thread``.
    Cancelling the await does not stop a function that is already running.
    """
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    return await loop.run_in_executor(_TOOL_POOL, functools.partial(context.run, fn, *args, **kwargs))


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
    from .plugins import components, get_component  # here: plugins imports this module

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
        from .interfaces import check_component

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

