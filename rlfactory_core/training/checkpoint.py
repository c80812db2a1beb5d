"""Checkpoints of a training run, written atomically, and resuming from them.

Layout of ``RUN_DIR/checkpoints/step-000010/``:

==================  ======================================================================
``model/``          the policy in HF format (safetensors + config + tokenizer), loadable by
                    transformers and vLLM; with LoRA the adapters merged in
``adapter/``        with LoRA only: the peft adapter (what training resumes from)
``optimizer.pt``    AdamW state
``scheduler.pt``    learning-rate scheduler state
``rng.pt``          Python, NumPy and torch (CPU and CUDA) RNG states
``state.json``      step, data position (epoch and index), and what else the trainer keeps
``config.yaml``     the resolved run config
==================  ======================================================================

A checkpoint is built in a ``.tmp-step-...`` directory next to the others, fsynced, and
renamed into place in one ``os.replace``: an interrupted write leaves at worst a temporary
directory (removed by the next save), never a half-written ``step-...``. A step saved again
replaces the old copy only after moving it aside (``.old-step-...``, put back if the save
dies in between), so a complete copy of it exists at every moment. ``latest`` (a
one-line file, also replaced atomically) names the newest one. The renames and fsyncs are
:mod:`rlfactory_core._fs`'s, shared with the other writers that must survive a crash.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Mapping

import yaml

from .._fs import fsync_tree, replace_dir, write_text_atomic
from ..errors import RLFactoryError

__all__ = ["save_checkpoint", "latest_checkpoint", "load_checkpoint", "list_checkpoints", "CheckpointError",
           "rng_state", "set_rng_state"]

_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RLFactoryError):
    """A checkpoint is missing or unreadable."""


def rng_state() -> dict[str, Any]:
    """The states of Python's, torch's (and CUDA's) random generators, for :func:`set_rng_state`."""
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy comes with torch
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Put the random generators back as :func:`rng_state` saw them."""
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    scheduler: Any,
    state: Mapping[str, Any],
    config: Mapping[str, Any],
    keep: int = 2,
    model_state: Mapping[str, Any] | None = None,
    optimizer_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` (see the module docstring) and keep the newest ``keep``.

    ``model_state`` / ``optimizer_state``: the full states to write instead of
    ``model.state_dict()`` / ``optimizer.state_dict()`` (the ray engine gathers them from
    its FSDP shards; ``model`` then gives the HF config and format)."""
    import torch

    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    _recover_interrupted_saves(root)
    name = f"step-{step:06d}"
    tmp = root / f".tmp-{name}"
    tmp.mkdir()
    try:
        if hasattr(model, "peft_config"):
            model.save_pretrained(tmp / "adapter")
            merged = _merged_copy(model)
            merged.save_pretrained(tmp / "model", safe_serialization=True)
            del merged
        elif model_state is not None:
            model.save_pretrained(tmp / "model", state_dict=dict(model_state), safe_serialization=True)
        else:
            model.save_pretrained(tmp / "model", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "model")
        torch.save(dict(optimizer_state) if optimizer_state is not None else optimizer.state_dict(),
                   tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2), encoding="utf-8")
        (tmp / "config.yaml").write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
        fsync_tree(tmp)
    except Exception as exc:  # (an interrupt leaves the .tmp- directory to the next save's recovery)
        shutil.rmtree(tmp, ignore_errors=True)  # half a checkpoint is only wasted space
        if _disk_full(exc, root):
            raise RLFactoryError(f"checkpoint {name} could not be written: the disk of {root} is full "
                                 f"({shutil.disk_usage(root).free / 2**20:.0f} MiB free)",
                                 hint="free space there, or keep fewer checkpoints (checkpoint.keep); the run "
                                      "continues from its last checkpoint with rlf train --resume") from exc
        raise
    final = root / name
    # The same step saved again (e.g. after an interrupt) replaces the old copy, which is
    # moved aside under the name _recover_interrupted_saves and latest_checkpoint know.
    replace_dir(tmp, final, aside=root / f".old-{name}")
    write_text_atomic(root / "latest", name + "\n")
    for old in list_checkpoints(run_dir)[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _disk_full(exc: BaseException, root: Path) -> bool:
    """Whether writing under ``root`` failed for want of space: ENOSPC anywhere in the chain,
    or (torch's writer reports it as "unexpected pos" without an errno) under 256 MiB free."""
    import errno

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(root).free < 256 * 2**20
    except OSError:
        return False


def _merged_copy(peft_model: Any) -> Any:
    """A plain HF model with the LoRA adapters merged in, leaving ``peft_model`` as it was."""
    import copy

    return copy.deepcopy(peft_model).merge_and_unload()


def _recover_interrupted_saves(root: Path) -> None:
    """Clean up after a save that was killed (only the writer calls this: a half-written
    ``.tmp-step-*`` of a running save must not be touched by readers): the ``.tmp-step-*`` is
    removed; a ``.old-step-*`` (moved aside to be replaced) goes back into place when its
    replacement never arrived, and is removed when it did."""
    for leftover in root.glob(".tmp-step-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    for aside in root.glob(".old-step-*"):
        final = root / aside.name.removeprefix(".old-")
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(aside, final)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` (``latest``, else the highest step).
    Read-only, so it is safe beside a running save: where a re-save of the ``latest`` step
    died between its two renames, that step's moved-aside copy (``.old-step-...``, which the
    next save puts back) is returned."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8").strip()
        if _STEP_DIR.match(name):
            for candidate in (root / name, root / f".old-{name}"):
                if (candidate / "state.json").is_file():
                    return candidate
    complete = [p for p in list_checkpoints(run_dir) if (p / "state.json").is_file()]
    return complete[-1] if complete else None


def load_checkpoint(path: str | Path, *, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """Restore the optimizer, scheduler and RNG states saved in ``path``; return its state.json.
    (The model is loaded from ``path/model`` or ``path/adapter`` by the caller.)"""
    import torch

    path = Path(path)
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint {path} cannot be loaded: {exc}",
                              hint="resume from an earlier checkpoint (delete this one) or start a new run") from exc
    return state
