"""Helpers for testing plugins against the real plugin manager, the way the core tests do.

    from rlfactory_core import hookimpl
    from rlfactory_core.testing import registered_plugin

    class MyTestPlugin:
        @hookimpl
        def rlfactory_register_tools(self, register):
            register(my_tool)

    def test_my_tool_is_registered():
        with registered_plugin(MyTestPlugin(), name="my-test-plugin") as pm:
            assert get_component("tool", "my_tool")
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import pluggy

from . import plugins

__all__ = ["registered_plugin"]


@contextmanager
def registered_plugin(plugin: Any, name: str = "test-plugin") -> Iterator[pluggy.PluginManager]:
    """Register ``plugin`` on a freshly loaded plugin manager for the duration of the block.

    The plugin gets the checks an installed plugin gets (unknown hooks, bad hook
    arguments); with ``RLFACTORY_STRICT_PLUGINS=1`` those raise. Registries are rebuilt
    inside the block (so the plugin's components are visible) and again after it (so they
    are gone). Yields the plugin manager.
    """
    plugins.reset_plugins()
    pm = plugins.get_plugin_manager()
    plugins.add_plugin(plugin, name)
    try:
        yield pm
    finally:
        plugins.reset_plugins()
