"""A vLLM general plugin (entry point group ``vllm.general_plugins``): vLLM runs
:func:`register` in each of its processes (engine core, workers, model inspection).

vLLM 0.32's LLaVA model imports ``vllm/model_executor/models/pixtral.py``, which imports
transformers' torchvision-based Pixtral image processor for one helper,
``_num_image_tokens``. The CPU install has no torchvision (its PyPI wheel is a CUDA build
that breaks ``import vllm`` there, so ``make install`` removes it), and LLaVA could not be
loaded at all. Where torchvision is missing, that module's name is served by transformers'
PIL implementation of the same processor, which defines the same helper. With torchvision
installed nothing changes. Registering imports nothing but the standard library (finding
the PIL module imports its parent packages, ``transformers``, which vLLM imports anyway):
this runs in every vLLM process of every user of the environment.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Any

__all__ = ["register"]

_TORCHVISION_MODULE = "transformers.models.pixtral.image_processing_pixtral"
_PIL_MODULE = "transformers.models.pixtral.image_processing_pil_pixtral"


class _PilPixtralProcessor(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds :data:`_TORCHVISION_MODULE` as the already-importable :data:`_PIL_MODULE`."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _TORCHVISION_MODULE:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: Any) -> Any:
        return importlib.import_module(_PIL_MODULE)

    def exec_module(self, module: Any) -> None:
        pass  # the PIL module is already executed


def register() -> None:
    """Install the alias when torchvision is missing (idempotent: vLLM may call it twice)."""
    if any(isinstance(finder, _PilPixtralProcessor) for finder in sys.meta_path):
        return
    if importlib.util.find_spec("torchvision") is not None:
        return
    if importlib.util.find_spec(_PIL_MODULE) is None:  # another transformers: leave vLLM's import as it is
        return
    sys.meta_path.insert(0, _PilPixtralProcessor())
