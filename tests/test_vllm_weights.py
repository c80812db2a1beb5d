"""How weight updates travel to vLLM's workers (:mod:`rlfactory_core.rollout.backends.vllm_weights`):
the staged safetensors shards and their directories. None of it needs vLLM, so these run
without it; loading the shards into a real engine is tests/test_vllm_backend.py's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from rlfactory_core.errors import ModelError
from rlfactory_core.rollout.backends import vllm_weights
from rlfactory_core.rollout.backends.vllm_weights import (
    VISION_TOWER_RENAMES,
    remove_orphaned_staging,
    renamed,
    staging_directory,
    write_shards,
)


def test_staging_directories_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    dead_pid = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_pid.wait()
    dead = tmp_path / f"rlfactory-weights-{dead_pid.pid}-abc"
    live = tmp_path / f"rlfactory-weights-{os.getppid()}-def"  # the process that started pytest runs
    ours = tmp_path / f"rlfactory-weights-{os.getpid()}-ghi"
    unnamed = tmp_path / "rlfactory-weights-xyz"  # no pid in the name: not ours to judge
    for directory in (dead, live, ours, unnamed):
        directory.mkdir()
        (directory / "shard-00000.safetensors").write_bytes(b"x" * 16)
    assert remove_orphaned_staging(str(tmp_path)) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (live, ours, unnamed))


def test_shards_are_bounded_hold_every_tensor_once_and_tied_tensors_are_copied(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_weights, "SHARD_BYTES", 1024)
    embed = torch.arange(64, dtype=torch.float32).reshape(8, 8)  # 256 bytes
    big = torch.ones(512, dtype=torch.float32)  # 2 KiB: over the bound, a shard of its own
    tensors = [("embed.weight", embed), ("head.weight", embed), ("norm.weight", torch.full((4,), 2.0)),
               ("big.weight", big), ("last.weight", torch.zeros(3))]
    paths = write_shards(tensors, tmp_path)
    shards = [load_file(str(path)) for path in paths]
    assert [sorted(shard) for shard in shards] == [["embed.weight", "head.weight", "norm.weight"], ["big.weight"],
                                                   ["last.weight"]]
    loaded = {name: tensor for shard in shards for name, tensor in shard.items()}
    for name, tensor in tensors:
        torch.testing.assert_close(loaded[name], tensor)

    with pytest.raises(ModelError, match="'embed.weight' was given twice"):
        write_shards([("embed.weight", embed), ("embed.weight", embed)], tmp_path / "again")


def test_a_staging_directory_is_named_for_this_process_and_removed_afterwards():
    with staging_directory([("w", torch.zeros(4))]) as staging:
        assert staging.is_dir() and staging.name.startswith(f"rlfactory-weights-{os.getpid()}-")
        (staging / "shard-00000.safetensors").write_bytes(b"x")
    assert not staging.exists()


def test_vision_tower_names_are_mapped_once():
    assert renamed("vision_tower.embeddings.patch.weight", VISION_TOWER_RENAMES) == \
        "vision_tower.vision_model.embeddings.patch.weight"
    assert renamed("model.vision_tower.encoder.weight", VISION_TOWER_RENAMES) == \
        "model.vision_tower.vision_model.encoder.weight"
    already = "vision_tower.vision_model.embeddings.patch.weight"
    assert renamed(already, VISION_TOWER_RENAMES) == already
    assert renamed("model.layers.0.mlp.up_proj.weight", VISION_TOWER_RENAMES) == "model.layers.0.mlp.up_proj.weight"
