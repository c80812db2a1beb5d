"""Loading a model's tokenizer and weights, by any name :func:`resolve_model` accepts.

:func:`load_tokenizer` gives the tokenizer with its chat template; :func:`load_model` the
weights as a transformers ``PreTrainedModel`` on a device, in a dtype given by name or as a
``torch.dtype``. A vision-language model (:data:`~rlfactory_core.models.VISION_MODEL_TYPES`)
loads as ``AutoModelForImageTextToText``; its processor comes from
:func:`~rlfactory_core.models.load_processor`. Every failure is one
:class:`~rlfactory_core.errors.ModelError` line saying what to do.

torch and transformers are imported inside the functions: importing :mod:`rlfactory_core`
must stay light.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelError, one_line
from .resolving import hub_kwargs, load_error, resolve_model
from .tokenizer_sources import TOKENIZER_SOURCES, prepare_tokenizer
from .vision import is_vision_language

if TYPE_CHECKING:  # pragma: no cover - typing only, never imported at run time
    import torch

__all__ = ["load_tokenizer", "load_model"]


def load_tokenizer(name_or_path: str | os.PathLike[str]) -> Any:
    """The tokenizer (with its chat template) of an embedded model, a model directory or a hub
    id; also an offline tokenizer by name (``qwen3``, ``llama3.1`` ...:
    :data:`~rlfactory_core.models.TOKENIZER_SOURCES`) or a directory holding only tokenizer
    files."""
    resolved = _tokenizer_only(name_or_path) or resolve_model(name_or_path)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(resolved), **hub_kwargs(resolved))
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one line for the user
        raise load_error("tokenizer", os.fspath(name_or_path), resolved, exc) from exc


def _tokenizer_only(name_or_path: str | os.PathLike[str]) -> Path | None:
    """An offline tokenizer's directory (built on first use), or a directory with tokenizer
    files and no ``config.json``; None for anything :func:`resolve_model` takes."""
    text = os.fspath(name_or_path)
    if not isinstance(name_or_path, os.PathLike) and text in TOKENIZER_SOURCES:
        return prepare_tokenizer(text)
    path = Path(text).expanduser()
    with contextlib.suppress(OSError):
        if path.is_dir() and not (path / "config.json").exists() and any(
                (path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            return path.absolute()
    return None


_DTYPES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    key = str(dtype).removeprefix("torch.").lower()
    if key not in _DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}", hint="use one of float32, bfloat16, float16, auto")
    return getattr(torch, _DTYPES[key])


def load_model(
    name_or_path: str | os.PathLike[str],
    dtype: torch.dtype | str | None = None,
    device: str | torch.device = "cpu",
) -> Any:
    """A causal LM (transformers ``PreTrainedModel``) on ``device``; a vision-language model
    (LLaVA ...) loads as ``AutoModelForImageTextToText``, which generates text the same way.

    ``dtype``: a ``torch.dtype``, a name (``"bfloat16"``, ``"bf16"``, ``"float32"`` ...),
    ``"auto"`` (the dtype stored in the checkpoint) or ``None`` (transformers' default).
    """
    resolved = resolve_model(name_or_path)
    torch_dtype = _torch_dtype(dtype)
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    kwargs = hub_kwargs(resolved)
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    name = os.fspath(name_or_path)
    auto = AutoModelForImageTextToText if is_vision_language(resolved) else AutoModelForCausalLM
    try:
        model = auto.from_pretrained(str(resolved), **kwargs)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one line for the user
        raise load_error("model", name, resolved, exc) from exc
    try:
        return model.to(device)
    except Exception as exc:  # noqa: BLE001 - e.g. "cuda" on a CPU-only torch
        raise ModelError(f"cannot move model {name!r} to device {str(device)!r}: {one_line(exc)}",
                         hint="use device='cpu', or run `rlf doctor` to see which accelerators torch finds") from exc
