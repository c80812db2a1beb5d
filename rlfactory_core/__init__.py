"""RLFactory core: hook specs, the plugin manager, component interfaces and shared types.

Importing this package stays light: it never imports torch, vLLM or Ray.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .hookspecs import hookimpl
from .tools import function_tool

try:
    __version__ = version("rlfactory")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "hookimpl", "function_tool"]
