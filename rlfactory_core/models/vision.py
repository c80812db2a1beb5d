"""Which vision-language models take images, and the check a run makes before it starts.

Images reach a model only through an architecture whose image path is implemented and
tested end to end (:data:`VISION_MODEL_TYPES` with a :data:`VISION_TOWER_TYPES` tower);
anything else is refused with the reason (:func:`vision_problem`), never run approximately.
:func:`check_images` is that refusal for a whole run (``rlf train``, ``rlf eval``): an env
that shows the model images needs such a model, and the local engine.

:func:`model_config` reads a model's transformers config (local directory or hub id) without
loading weights; the backends use it too (vLLM reads the image token from it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ModelError
from ..interfaces import member
from .resolving import hub_kwargs, load_error, resolve_model

if TYPE_CHECKING:  # pragma: no cover - typing only: config imports models for DEFAULT_MODEL
    from ..config import RunConfig

__all__ = [
    "VISION_MODEL_TYPES",
    "VISION_TOWER_TYPES",
    "model_config",
    "vision_problem",
    "is_vision_language",
    "load_processor",
    "check_images",
]

#: Vision-language architectures whose image path is implemented and tested end to end
#: (generation and training see the same image tokens and pixels): an image processor that
#: gives every image one shape, image tokens at ordinary 1D positions. Others (Qwen2-VL's 3D
#: positions, LLaVA-NeXT's per-image patch counts) are refused, not run approximately.
VISION_MODEL_TYPES = ("llava",)
#: The vision towers tested under them (LLaVA is also the wrapper of e.g. Pixtral, whose
#: images vary in size and whose weights are named otherwise).
VISION_TOWER_TYPES = ("clip_vision_model",)


def model_config(resolved: str | Path) -> Any:
    """The transformers config of a model (``resolved`` as :func:`resolve_model` gives it:
    a directory or a hub id), read without loading any weights."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(resolved), **hub_kwargs(resolved))


def vision_problem(config: Any) -> str | None:
    """Why images cannot be given to a model with this transformers ``config``, in a
    phrase; None when they can (:data:`VISION_MODEL_TYPES` with a
    :data:`VISION_TOWER_TYPES` tower)."""
    model_type = getattr(config, "model_type", None)
    vision = getattr(config, "vision_config", None)
    if vision is None:
        return f"{model_type!r} is a text-only model"
    if model_type not in VISION_MODEL_TYPES or getattr(vision, "model_type", None) not in VISION_TOWER_TYPES:
        return (f"images for {model_type!r} models with a {getattr(vision, 'model_type', '?')!r} vision tower are "
                f"not supported yet (supported: {', '.join(VISION_MODEL_TYPES)} with "
                f"{', '.join(VISION_TOWER_TYPES)})")
    return None


def is_vision_language(resolved: str | Path) -> bool:
    """Whether the model is one of :data:`VISION_MODEL_TYPES`, which transformers loads as
    ``AutoModelForImageTextToText`` (other multimodal models load as causal LMs, as before)."""
    try:
        config = model_config(resolved)
    except Exception:  # noqa: BLE001 - the model loader reports an unreadable config
        return False
    return getattr(config, "vision_config", None) is not None and config.model_type in VISION_MODEL_TYPES


def load_processor(name_or_path: str | os.PathLike[str]) -> Any:
    """The processor (tokenizer plus image processor) of a vision-language model; None for
    a text-only model."""
    resolved = resolve_model(name_or_path)
    if not is_vision_language(resolved):
        return None
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(str(resolved), **hub_kwargs(resolved))
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one line for the user
        raise load_error("processor", os.fspath(name_or_path), resolved, exc) from exc
    if getattr(processor, "image_processor", None) is None:
        raise ModelError(f"the processor of {os.fspath(name_or_path)!r} has no image processor",
                         hint="save the model's full processor (processor.save_pretrained) into its directory")
    return processor



def check_images(config: RunConfig, env: Any, model_path: str | os.PathLike[str], *, training: bool = True) -> Any:
    """The model's processor when it is a supported vision-language model, else None.

    Raises a :class:`ConfigError` when the env shows the model images (its ``shows_images``
    attribute) and this model, or the engine, cannot take them. ``training``: whether
    ``config.engine`` runs it (``rlf eval`` always runs locally, so it passes False).
    """
    processor = load_processor(model_path)
    if not member("env", env, "shows_images"):
        return processor
    problems = []
    problem = vision_problem(model_config(resolve_model(model_path)))
    if problem is not None:
        problems.append(f"model.name: the {config.env} env shows the model images, but {problem}")
    if training and config.engine == "ray":
        problems.append("engine: the ray engine's workers do not pass images to the model; use engine=local")
    if problems:
        raise ConfigError(problems, hint="use a LLaVA model (CLIP vision tower) with engine=local, or turn the "
                                         "env's images off (android: env_options.screenshot=false)")
    return processor
