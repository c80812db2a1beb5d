"""Trajectories to training tensors (a ``tensordict.TensorDict``), padded or packed.

Per-token keys, aligned with ``input_ids`` (position ``t`` describes token ``t``):

=================  =======  ==============================================================
key                dtype    meaning
=================  =======  ==============================================================
``input_ids``      int64    prompt, then every model and observation segment, in order
``attention_mask`` int64    1 on real tokens, 0 on padding (padded layout only)
``loss_mask``      int64    1 on tokens the model sampled, 0 on prompt, observations, padding
``logprobs``       float32  the sampler's logprob of token ``t`` where ``loss_mask`` is 1, else 0
``position_ids``   int64    0, 1, 2 ... within each trajectory
=================  =======  ==============================================================

Per-trajectory keys: ``prompt_lengths`` and ``lengths`` (int64, ``[B]``).

Layouts: ``padded`` gives ``[B, L]`` tensors right-padded to the longest trajectory
(batch size ``[B]``); ``packed`` concatenates all trajectories into ``[T]`` tensors with
``cu_seqlens`` (int32, ``[B + 1]``, the offsets of each trajectory; batch size ``[]``),
the varlen layout of flash-attention, with no padding at all.
"""

from __future__ import annotations

from typing import Literal, Sequence

from ..types import Trajectory

__all__ = ["to_tensordict"]


def _rows(trajectory: Trajectory) -> tuple[list[int], list[int], list[float]]:
    ids = list(trajectory.prompt_ids)
    mask = [0] * len(ids)
    logprobs = [0.0] * len(ids)
    for segment in trajectory.segments:
        ids.extend(segment.token_ids)
        mask.extend([segment.loss_mask] * len(segment.token_ids))
        if segment.kind == "model":
            if segment.logprobs is None or len(segment.logprobs) != len(segment.token_ids):
                raise ValueError(f"trajectory {trajectory.sample_id}: a model segment has "
                                 f"{len(segment.token_ids)} tokens but "
                                 f"{'no' if segment.logprobs is None else len(segment.logprobs)} logprobs")
            logprobs.extend(segment.logprobs)
        else:
            logprobs.extend([0.0] * len(segment.token_ids))
    return ids, mask, logprobs


def to_tensordict(trajectories: Sequence[Trajectory], pad_token_id: int = 0,
                  layout: Literal["padded", "packed"] = "padded"):
    """Tensors for ``trajectories`` in the given layout (see the module docstring)."""
    import torch
    from tensordict import TensorDict

    if layout not in ("padded", "packed"):
        raise ValueError(f"layout must be 'padded' or 'packed', got {layout!r}")
    if not trajectories:
        raise ValueError("no trajectories to convert")
    rows = [_rows(t) for t in trajectories]
    lengths = torch.tensor([len(ids) for ids, _, _ in rows], dtype=torch.int64)
    prompt_lengths = torch.tensor([len(t.prompt_ids) for t in trajectories], dtype=torch.int64)
    if layout == "packed":
        return TensorDict({
            "input_ids": torch.tensor([i for ids, _, _ in rows for i in ids], dtype=torch.int64),
            "loss_mask": torch.tensor([m for _, mask, _ in rows for m in mask], dtype=torch.int64),
            "logprobs": torch.tensor([lp for _, _, lps in rows for lp in lps], dtype=torch.float32),
            "position_ids": torch.cat([torch.arange(int(n)) for n in lengths]),
            "cu_seqlens": torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)]),
            "lengths": lengths,
            "prompt_lengths": prompt_lengths,
        }, batch_size=[])
    batch, width = len(rows), int(lengths.max())
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((batch, width), dtype=torch.int64)
    loss_mask = torch.zeros((batch, width), dtype=torch.int64)
    logprobs = torch.zeros((batch, width), dtype=torch.float32)
    for row, (ids, mask, lps) in enumerate(rows):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids, dtype=torch.int64)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(mask, dtype=torch.int64)
        logprobs[row, :n] = torch.tensor(lps, dtype=torch.float32)
    position_ids = torch.arange(width).expand(batch, width) * attention_mask
    return TensorDict({
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        "position_ids": position_ids,
        "lengths": lengths,
        "prompt_lengths": prompt_lengths,
    }, batch_size=[batch])
