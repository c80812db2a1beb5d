"""RLFactory plugin: MCP servers as tools, and the env ``mcp``.

Installing this distribution registers the env ``mcp`` (:mod:`rlfactory_mcp.env`): tasks
from a JSONL file, tools from an MCP config file. Any env can use MCP tools too:
:func:`load_mcp_tools` turns a config into tools (:mod:`rlfactory_mcp.client`);
:func:`load_mcp_config` reads the standard ``mcpServers`` JSON and RL-Factory's
``mcp_tools.pydata`` (:mod:`rlfactory_mcp.config`).
"""

from __future__ import annotations

from rlfactory_core import hookimpl

from .client import MCPServerError, MCPTool, MCPToolset, ServerOptions, load_mcp_tools, result_text
from .config import ServerSpec, load_mcp_config, parse_mcp_config
from .env import MCPEnv

#: the plugin API versions this plugin works with (checked when rlfactory loads it)
rlfactory_api = ">=1.3,<2"  # InfrastructureError came in 1.3

__all__ = ["MCPEnv", "MCPServerError", "MCPTool", "MCPToolset", "ServerOptions", "ServerSpec", "load_mcp_config",
           "load_mcp_tools", "parse_mcp_config", "result_text", "rlfactory_register_envs"]


@hookimpl
def rlfactory_register_envs(register):
    register(MCPEnv)
