"""The built-in model families, registered as the plugin ``rlfactory.families`` through the
same plugin manager as external plugins (``rlfactory_core.plugins.DEFAULT_PLUGINS`` names
this module; it lives with the families, a layer above the plugin manager):
``template`` (the model's own chat template with the run's tool-call format) and the
families ``renderers`` renders (Qwen3, Llama 3, gpt-oss, DeepSeek V3/R1/V4, GLM 4.5) and
Mistral's, which mistral-common encodes."""

from __future__ import annotations

from ..hookspecs import hookimpl
from .family import TemplateFamily
from .mistral_family import MistralFamily
from .renderers_family import RENDERERS_FAMILIES


@hookimpl
def rlfactory_register_model_families(register):
    register(TemplateFamily)
    for family in RENDERERS_FAMILIES:
        register(family)
    register(MistralFamily)
