"""What a checkpoint tells the vLLM backend before its engine starts: the dtype stored in it,
and for a LLaVA model its image token and whether its vision tower's weights must be loaded
renamed; and the prompt form vLLM takes for images (each image's run of image tokens
collapsed to one placeholder, which vLLM expands again itself)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...errors import ModelError
from .vllm_weights import VISION_TOWER_RENAMES, renamed

__all__ = ["MAX_IMAGES_PER_PROMPT", "VisionModel", "vision_of", "collapse_image_runs", "checkpoint_dtype"]


#: Images one prompt may hold (vLLM's ``limit_mm_per_prompt``) unless backend options say.
MAX_IMAGES_PER_PROMPT = 16


@dataclass(frozen=True)
class VisionModel:
    """What the backend needs of a LLaVA model: its image token, and the checkpoint files
    to load renamed after a dummy start (empty when vLLM reads the names as they are)."""

    image_token_id: int
    checkpoint_files: list[str]


def vision_of(model_path: str | Path) -> VisionModel | None:
    """The vision facts of a LLaVA checkpoint (a local directory or a hub id); None for a
    model this backend gives no images to (:func:`~rlfactory_core.models.vision_problem`)."""
    from ...models import model_config, vision_problem

    try:
        config = model_config(model_path)
    except Exception:  # noqa: BLE001 - vLLM reports an unreadable config when it starts
        return None
    if vision_problem(config) is not None:
        return None
    files: list[str] = []
    if isinstance(model_path, Path):  # a hub LLaVA has vLLM's names (vision_tower.vision_model.*)
        from safetensors import safe_open

        files = sorted(str(path) for path in model_path.glob("*.safetensors"))
        needs_renaming = False
        for path in files:
            with safe_open(path, framework="pt", device="cpu") as shard:
                needs_renaming = needs_renaming or any(renamed(name, VISION_TOWER_RENAMES) != name
                                                       for name in shard.keys())
        files = files if needs_renaming else []
    return VisionModel(image_token_id=int(config.image_token_id), checkpoint_files=files)


def collapse_image_runs(ids: list[int], image_token: int, images: int) -> list[int]:
    """``ids`` with each image's run of ``image_token`` cut to one placeholder: the tokens
    per image are the count of image tokens over ``images`` (every image the same size)."""
    count = ids.count(image_token)
    if count == 0 or count % images:
        raise ModelError(f"{images} image(s) given, but the prompt has {count} image token(s)",
                         hint="render the conversation with the model's processor (ChatTemplate(processor=...))")
    per_image = count // images
    out: list[int] = []
    run = 0
    for token in [*ids, None]:
        if token == image_token:
            run += 1
            continue
        if run:
            if run % per_image:
                raise ModelError(f"a run of {run} image tokens is not a whole number of images of {per_image} tokens",
                                 hint="render the conversation with the model's processor")
            out.extend([image_token] * (run // per_image))
            run = 0
        if token is not None:
            out.append(token)
    return out


def checkpoint_dtype(model_path: str | Path) -> str | None:
    """The dtype in a local checkpoint's ``config.json`` (``dtype`` or ``torch_dtype``)."""
    if not isinstance(model_path, Path):
        return None  # a hub id: let vLLM read the config
    try:
        config = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dtype = config.get("dtype") or config.get("torch_dtype")
    return str(dtype).removeprefix("torch.") if dtype else None
