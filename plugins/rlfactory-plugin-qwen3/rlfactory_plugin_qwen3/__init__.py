"""RLFactory plugin: the response parser for Qwen3 / Hermes-style tool calling.

Installing this distribution registers the parser ``qwen3`` (select it with
``parser: qwen3`` in a run config). The format itself is described in
:mod:`rlfactory_plugin_qwen3.parser`.
"""

from __future__ import annotations

from rlfactory_core import hookimpl

from .parser import TOOLS_FOOTER, TOOLS_HEADER, Qwen3Parser, format_tool_call, format_tools_section

#: the plugin API versions this plugin works with (checked when rlfactory loads it)
rlfactory_api = ">=1.0,<2"

__all__ = [
    "Qwen3Parser",
    "format_tool_call",
    "format_tools_section",
    "TOOLS_HEADER",
    "TOOLS_FOOTER",
    "rlfactory_register_parsers",
]


@hookimpl
def rlfactory_register_parsers(register):
    # The default tool_role ("user") renders correctly with every chat template.
    register(Qwen3Parser())
