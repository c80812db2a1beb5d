"""RLFactory's plugin API: everything a plugin needs, in one import.

    from rlfactory_core import hookimpl, Message, EnvReset, ToolResult, ConfigError, get_component

A plugin imports from ``rlfactory_core`` (and its tests also from ``rlfactory_core.testing``)
and nothing deeper: the modules behind these names may move between releases, the names
here only change with the plugin API's major version (:data:`PLUGIN_API_VERSION`; a plugin
declares the range it supports as ``rlfactory_api = ">=1.0,<2"``, see
:mod:`rlfactory_core.version`). A test keeps first-party plugins to this rule.

Importing this package stays light: it never imports torch, vLLM, Ray or transformers.
The names that need them (model loading, chat templates, backends) and the ones whose
modules read config are loaded on first use, through the module's ``__getattr__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    ConfigError,
    DuplicateComponentError,
    ModelError,
    PluginError,
    RegistrationError,
    RLFactoryError,
    UnknownComponentError,
    one_line,
)
from .fingerprints import files_fingerprint
from .hookspecs import hookimpl
from .interfaces import Env, ModelFamily, ResponseParser, Reward, Tool, ToolManager, check_component, member
from .plugins import get_component
from .text import last_tag_content, tag_contents, without_reasoning
from .threads import run_in_tool_thread
from .tool_resolution import resolve_tools
from .outcomes import CALL_ERRORS, OUTCOMES, outcome_of
from .tools import InfrastructureError, ToolArgumentsError, TransientToolError, function_tool
from .types import (
    EnvReset,
    EnvStep,
    Message,
    ParsedTurn,
    ParseError,
    RewardOutput,
    Sample,
    Segment,
    TokenSequence,
    ToolCall,
    ToolResult,
    Trajectory,
)
from .version import PLUGIN_API_VERSION, VERSION

if TYPE_CHECKING:  # what the lazy names below are, for type checkers and editors
    from .data import read_jsonl_samples
    from .datasets import build_directory
    from .default_plugins.rewards import FormatReward, gold_answers, normalize_answer, same_answer, token_f1
    from .models import load_processor, load_tokenizer, resolve_model, rlfactory_home
    from .rewards import RewardContext
    from .rollout import ChatTemplate, Generation, SamplingParams, TemplateFamily, make_backend

# name -> module that defines it, imported on first access: these modules pull in config,
# model loading or the rollout stack, which a plugin that only registers a tool never needs.
_LAZY = {
    "read_jsonl_samples": "rlfactory_core.data",
    "build_directory": "rlfactory_core.datasets",
    "FormatReward": "rlfactory_core.default_plugins.rewards",
    "gold_answers": "rlfactory_core.default_plugins.rewards",
    "normalize_answer": "rlfactory_core.default_plugins.rewards",
    "same_answer": "rlfactory_core.default_plugins.rewards",
    "token_f1": "rlfactory_core.default_plugins.rewards",
    "rlfactory_home": "rlfactory_core.models",
    "resolve_model": "rlfactory_core.models",
    "load_tokenizer": "rlfactory_core.models",
    "load_processor": "rlfactory_core.models",
    "RewardContext": "rlfactory_core.rewards",
    "ChatTemplate": "rlfactory_core.rollout",
    "TemplateFamily": "rlfactory_core.rollout",
    "Generation": "rlfactory_core.rollout",
    "SamplingParams": "rlfactory_core.rollout",
    "make_backend": "rlfactory_core.rollout",
}

__version__ = VERSION

__all__ = [
    # versions
    "__version__",
    "PLUGIN_API_VERSION",
    # hooks and registries
    "hookimpl",
    "get_component",
    # component interfaces
    "Tool",
    "ResponseParser",
    "ModelFamily",
    "Env",
    "ToolManager",
    "Reward",
    "check_component",
    "member",
    # data types
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
    # errors
    "RLFactoryError",
    "ConfigError",
    "ModelError",
    "PluginError",
    "RegistrationError",
    "DuplicateComponentError",
    "UnknownComponentError",
    "one_line",
    # tools
    "function_tool",
    "resolve_tools",
    "run_in_tool_thread",
    "ToolArgumentsError",
    "TransientToolError",
    "InfrastructureError",
    # whose failure a trajectory's end was (rlfactory_core.outcomes)
    "OUTCOMES",
    "outcome_of",
    "CALL_ERRORS",
    # text of model turns
    "tag_contents",
    "last_tag_content",
    "without_reasoning",
    # an env's data_fingerprint
    "files_fingerprint",
    # loaded on first use
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rlfactory_core' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
