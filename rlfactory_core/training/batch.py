"""The rollout batch: trajectories as tensors, with their advantages, and its micro-batches.

The batch is a ``tensordict.TensorDict`` with batch size ``[B]`` (one row per token sequence,
right-padded: a trajectory is one sequence unless its model family rewrote earlier turns,
:class:`~rlfactory_core.types.Trajectory`): ``input_ids``, ``attention_mask``, ``loss_mask``,
``sampler_logprobs`` and ``advantages`` ([B, L]), with the trainer's version ``staleness``
([B, L], each sampled token's age in versions), ``lengths``, ``prompt_lengths``,
``trajectory`` (the row's trajectory), ``trajectory_tokens`` (the loss tokens of the row's
trajectory, all its rows together: the per-trajectory loss averages over them) and
``sequence_advantages`` (the row's trajectory's advantage) ([B]); with images, their
model inputs (``image_inputs``, ``image_counts``); ``recorded`` ([B], the rows the run records
token by token, when it records any). The rows of one trajectory share its group and its
advantage. The update adds ``old_logprobs`` and ``ref_logprobs``,
and for recorded rows ``trainer_logprobs``. Micro-batches are row selections of it (trajectories of similar length,
at most ``grpo.micro_batch_tokens`` tokens), narrowed to their longest row, and each is fed
to the model padded or packed (``grpo.packing``, :mod:`.logprobs`).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..config import RunConfig
from ..errors import ModelError

__all__ = ["to_tensordict", "build_batch", "turn_reward_tensor", "rows_of", "micro_batches", "micro_image_inputs",
           "sequence_rows", "trajectory_rows"]


def sequence_rows(trajectories: Sequence[Any]) -> list[tuple[int, Any]]:
    """The batch's rows: ``(trajectory index, token sequence)`` for every sequence of every
    trajectory, in order."""
    return [(index, sequence) for index, trajectory in enumerate(trajectories) for sequence in trajectory.sequences]


def trajectory_rows(batch: Any) -> list[list[int]]:
    """For each trajectory of ``batch`` (in order), the rows of its sequences."""
    out: list[list[int]] = []
    for row, index in enumerate(batch["trajectory"].tolist()):
        while len(out) <= index:
            out.append([])
        out[index].append(row)
    return out


def _rows(trajectory: Any, sequence: Any) -> tuple[list[int], list[int], list[float], list[int]]:
    ids = list(sequence.prompt_ids)
    mask = [0] * len(ids)
    logprobs = [0.0] * len(ids)
    versions = [-1] * len(ids)
    for segment in sequence.segments:
        ids.extend(segment.token_ids)
        mask.extend([segment.loss_mask] * len(segment.token_ids))
        version = segment.policy_version if segment.kind == "model" and segment.policy_version is not None else -1
        versions.extend([version] * len(segment.token_ids))
        if segment.kind == "model":
            if segment.logprobs is None or len(segment.logprobs) != len(segment.token_ids):
                raise ValueError(f"trajectory {trajectory.sample_id}: a model segment has "
                                 f"{len(segment.token_ids)} tokens but "
                                 f"{'no' if segment.logprobs is None else len(segment.logprobs)} logprobs")
            logprobs.extend(segment.logprobs)
        else:
            logprobs.extend([0.0] * len(segment.token_ids))
    return ids, mask, logprobs, versions


def to_tensordict(trajectories: Sequence[Any], pad_token_id: int = 0) -> Any:
    """The trajectories' sequences (:func:`sequence_rows`, one row each) as ``[B, L]`` tensors,
    right-padded to the longest: ``input_ids``
    (prompt, then every model and observation segment, in order), ``attention_mask`` (1 on
    real tokens), ``loss_mask`` (1 on tokens the model sampled), ``logprobs`` (the sampler's,
    where ``loss_mask`` is 1, else 0), ``versions`` (the policy version that sampled each model
    token, -1 elsewhere or where the backend does not say); and ``lengths``,
    ``prompt_lengths`` and ``trajectory`` (``[B]``). A model segment without a logprob for
    each of its tokens is refused."""
    import torch
    from tensordict import TensorDict

    if not trajectories:
        raise ValueError("no trajectories to convert")
    sequences = sequence_rows(trajectories)
    rows = [_rows(trajectories[index], sequence) for index, sequence in sequences]
    lengths = torch.tensor([len(ids) for ids, _, _, _ in rows], dtype=torch.int64)
    prompt_lengths = torch.tensor([len(sequence.prompt_ids) for _, sequence in sequences], dtype=torch.int64)
    batch, width = len(rows), int(lengths.max())
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((batch, width), dtype=torch.int64)
    loss_mask = torch.zeros((batch, width), dtype=torch.int64)
    logprobs = torch.zeros((batch, width), dtype=torch.float32)
    versions = torch.full((batch, width), -1, dtype=torch.int64)
    for row, (ids, mask, lps, vs) in enumerate(rows):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids, dtype=torch.int64)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(mask, dtype=torch.int64)
        logprobs[row, :n] = torch.tensor(lps, dtype=torch.float32)
        versions[row, :n] = torch.tensor(vs, dtype=torch.int64)
    return TensorDict({"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask,
                       "logprobs": logprobs, "versions": versions, "lengths": lengths,
                       "prompt_lengths": prompt_lengths,
                       "trajectory": torch.tensor([index for index, _ in sequences], dtype=torch.int64)},
                      batch_size=[batch])


def turn_reward_tensor(trajectories: Sequence[Any], width: int,
                       reward_turn_rewards: Sequence[Sequence[float]] | None = None) -> Any:
    """``[B, L]`` (a row per sequence, :func:`sequence_rows`): each model turn's reward on the
    last token of that turn: the env's (``trajectory.turn_rewards``) plus the rewards'
    (``reward_turn_rewards[i]`` of trajectory ``i``, from
    :class:`rlfactory_core.rewards.ScoredBatch`). A trajectory's turns are counted across its
    sequences."""
    import torch

    sequences = sequence_rows(trajectories)
    out = torch.zeros(len(sequences), width)
    model_turns = [0] * len(trajectories)
    for row, (index, sequence) in enumerate(sequences):
        trajectory = trajectories[index]
        extra = reward_turn_rewards[index] if reward_turn_rewards is not None else ()
        position = len(sequence.prompt_ids)
        for segment in sequence.segments:
            position += len(segment.token_ids)
            if segment.kind == "model":
                model_turn = model_turns[index]
                if segment.token_ids:
                    if model_turn < len(trajectory.turn_rewards):
                        out[row, position - 1] += float(trajectory.turn_rewards[model_turn])
                    if model_turn < len(extra):
                        out[row, position - 1] += float(extra[model_turn])
                model_turns[index] += 1
    return out


def build_batch(trajectories: Sequence[Any], rewards: Sequence[float], config: RunConfig, pad_id: int,
                processor: Any = None, *, reward_turn_rewards: Sequence[Sequence[float]] | None = None,
                policy_version: int | None = None, masked: Sequence[bool] | None = None,
                weights: Sequence[float] | None = None) -> Any:
    """The rollout batch as a TensorDict (see above), with per-token advantages computed
    within each trajectory's ``group``; with images (a vision-language model's
    ``processor``), their model inputs too. With ``grpo.overlong_filter`` the rows of
    cut-off trajectories get an empty loss mask. ``reward_turn_rewards``: the rewards' per-turn
    rewards of each row, added to the env's. ``policy_version``: the trainer's version the
    update starts from; each sampled token's ``staleness`` is how many versions older the
    weights that sampled it were (0 where the backend did not say). ``masked``: per trajectory,
    whether it is a failure left out (:mod:`rlfactory_core.outcomes`): no loss, and out of its
    group's mean and std. ``weights``: per trajectory, the importance weight undoing the
    selection of resampling (:func:`rlfactory_core.resampling.selection_weights`), or None."""
    import torch

    from .grpo import group_advantages, token_advantages

    groups = [t.group for t in trajectories]
    if any(group is None for group in groups):
        raise ValueError("every trajectory needs its group (set by the rollout) for group advantages")
    td = to_tensordict(trajectories, pad_token_id=pad_id)
    index = td["trajectory"]
    if processor is not None and any(t.images for t in trajectories):
        _add_image_inputs(td, trajectories, processor)
    include = None if masked is None else [not m for m in masked]
    advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32), groups, config.grpo.advantage_norm,
                                  include=include, weights=weights)
    row_advantages = advantages[index]
    turn_rewards = None
    has_turn_rewards = any(any(t.turn_rewards) for t in trajectories) or any(
        any(r) for r in reward_turn_rewards or ())
    if config.grpo.turn_rewards and has_turn_rewards:
        turn_rewards = turn_reward_tensor(trajectories, td["input_ids"].shape[1], reward_turn_rewards)
        # a token is credited with the turn rewards after it in its trajectory: those of the
        # trajectory's later sequences too
        per_row = turn_rewards.sum(-1)
        later = torch.zeros_like(per_row)
        for rows in trajectory_rows(td):
            for k, row in enumerate(rows):
                later[row] = per_row[rows[k + 1:]].sum()
        row_advantages = row_advantages + later
    td["sampler_logprobs"] = td.pop("logprobs")
    versions = td.pop("versions")
    if policy_version is not None:
        td["staleness"] = torch.where(versions >= 0, (policy_version - versions).clamp(min=0), 0) * td["loss_mask"]
    if config.grpo.overlong_filter:  # cut-off trajectories carry no loss (training.overlong)
        from .overlong import cut_off

        for row, trajectory_index in enumerate(index.tolist()):
            if cut_off(trajectories[trajectory_index]):
                td["loss_mask"][row] = 0
    if masked is not None:  # the failures left out carry no loss either
        for row, trajectory_index in enumerate(index.tolist()):
            if masked[trajectory_index]:
                td["loss_mask"][row] = 0
    td["advantages"] = token_advantages(row_advantages, td["loss_mask"], turn_rewards)
    td["sequence_advantages"] = advantages[index]
    per_trajectory = torch.zeros(len(trajectories), dtype=torch.int64).index_add_(0, index, td["loss_mask"].sum(-1))
    td["trajectory_tokens"] = per_trajectory[index]
    return td


def _add_image_inputs(td: Any, trajectories: Sequence[Any], processor: Any) -> None:
    """Each row's images as model inputs: ``image_inputs`` (a TensorDict of the image
    processor's tensors, ``[B, most images in a row, ...]``, zero-padded) and
    ``image_counts`` (``[B]``). Row ``r``'s first ``image_counts[r]`` entries are its images
    in the order of its image tokens."""
    import torch
    from tensordict import TensorDict


    from ..rollout.render import image_inputs


    # A trajectory's images are those of its messages, which it gets only with its prompt's
    # ids; a row without image tokens (defensively) gets none.
    from ..rollout.render import trajectory_ids

    if any(t.images and t.earlier_sequences for t in trajectories):
        raise ModelError("a trajectory with images is several token sequences (its model family rewrote earlier "
                         "turns): training images over several sequences is not supported",
                         hint="use a model family that appends each turn (the model's chat template)")
    image_token = getattr(processor, "image_token_id", None)
    rows = []
    for index in td["trajectory"].tolist():  # a trajectory with images is one row
        t = trajectories[index]
        rows.append(t.images if t.images and (image_token is None or image_token in trajectory_ids(t)) else [])
    if not any(rows):
        return
    per_row = [image_inputs(processor, images) if images else None for images in rows]
    template = next(p for p in per_row if p is not None)
    most = max(len(images) for images in rows)
    padded = {}
    for key, value in template.items():
        out = torch.zeros((len(rows), most, *value.shape[1:]), dtype=value.dtype)
        for row, inputs in enumerate(per_row):
            if inputs is not None:
                if tuple(inputs[key].shape[1:]) != tuple(value.shape[1:]):
                    raise ModelError(f"the image processor gives {key} of different shapes per image "
                                     f"({tuple(inputs[key].shape[1:])} vs {tuple(value.shape[1:])})",
                                     hint="training takes models whose processor resizes every image to one "
                                          "shape (LLaVA's CLIP processor)")
                out[row, :len(inputs[key])] = inputs[key]
        padded[key] = out
    td["image_inputs"] = TensorDict(padded, batch_size=[len(rows)])
    td["image_counts"] = torch.tensor([len(images) for images in rows], dtype=torch.int64)


def rows_of(batch: Any, rows: Sequence[int]) -> Any:
    """The micro-batch of ``rows``: a TensorDict narrowed to its longest row."""
    micro = batch[list(rows)]
    width = int(micro["lengths"].max())
    images = micro.pop("image_inputs", None)  # per image, not per token: not narrowed
    micro = micro.apply(lambda t: t[:, :width] if t.dim() > 1 else t)
    if images is not None:
        micro["image_inputs"] = images
    return micro


def micro_image_inputs(micro: Any, device: Any, dtype: Any) -> dict[str, Any] | None:
    """The micro-batch's images as model inputs, concatenated in row order (the order of
    their image tokens in a padded or packed batch); None without images."""
    import torch


    if "image_inputs" not in micro.keys():
        return None
    counts = [int(c) for c in micro["image_counts"]]
    if not any(counts):
        return None
    out = {}
    for key, value in micro["image_inputs"].items():
        joined = torch.cat([value[row, :count] for row, count in enumerate(counts) if count])
        out[key] = joined.to(device, dtype=dtype if joined.is_floating_point() else joined.dtype)
    return out


def micro_batches(rows: Sequence[int], lengths: Any, token_budget: int, packed: bool = False,
                  shared_prompts: Any = None, common_prefix: int = 0) -> list[list[int]]:
    """``rows`` grouped by length (so that little padding is computed), at most
    ``token_budget`` tokens each (at least one row): counted padded (rows x longest row)
    or, ``packed``, as the sum of the rows' lengths. ``common_prefix``: tokens every row
    starts with, computed once per padded micro-batch (``grpo.shared_prefix`` over rows of
    different prompts that share a system prompt, as the cold start's examples do), so a
    micro-batch costs them once plus every row's rest.

    ``shared_prompts``: the batch (``input_ids``, ``prompt_lengths``), to plan for a shared
    prompt (``grpo.shared_prefix``): rows with the same prompt (a GRPO group) go into
    micro-batches of their own, each costing its prompt once plus every row's rest, padded
    (:func:`rlfactory_core.training.logprobs.token_logprobs` then computes the prompt once)."""
    if shared_prompts is not None and not packed:
        return _shared_prompt_micro_batches(rows, lengths, token_budget, shared_prompts)
    ordered = sorted(rows, key=lambda r: int(lengths[r]))
    batches: list[list[int]] = []
    current: list[int] = []
    for row in ordered:
        candidate = [int(lengths[r]) for r in current] + [int(lengths[row])]
        shared = 0 if packed else min(common_prefix, min(candidate) - 1)
        tokens = sum(candidate) if packed else shared + (max(candidate) - shared) * len(candidate)
        if current and tokens > token_budget:
            batches.append(current)
            current = []
        current.append(row)
    if current:
        batches.append(current)
    return batches


def _shared_prompt_micro_batches(rows: Sequence[int], lengths: Any, token_budget: int,
                                 batch: Any) -> list[list[int]]:
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for row in rows:
        prompt = tuple(batch["input_ids"][row, :int(batch["prompt_lengths"][row])].tolist())
        by_prompt.setdefault(prompt, []).append(row)
    batches: list[list[int]] = []
    for prompt, members in by_prompt.items():
        shared = len(prompt)
        current: list[int] = []
        for row in sorted(members, key=lambda r: int(lengths[r])):
            longest = max([int(lengths[r]) for r in current] + [int(lengths[row])])
            if current and shared + (len(current) + 1) * (longest - shared) > token_budget:
                batches.append(current)
                current = []
            current.append(row)
        batches.append(current)
    return batches
