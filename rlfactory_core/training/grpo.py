"""GRPO's advantages and losses, as pure functions of tensors.

Shapes: ``B`` trajectories, ``L`` tokens each (padded layout; ``mask`` is 1 on the tokens
the model sampled, the only ones that carry loss). Token-level tensors are aligned with
``input_ids``: position ``t`` is about token ``t`` (its logprob given the tokens before it).

The choices, each a config key of ``grpo``:

* **Advantages** (:func:`group_advantages`): reward minus the mean of its group of ``G``
  trajectories of the same prompt, divided by the group's std (``group``, GRPO), the
  batch's std (``batch``, more stable when groups are nearly uniform), or nothing
  (``none``, Dr. GRPO: no difficulty bias). A group whose rewards are all equal gets
  advantage 0 whatever the scaling.
* **Per-turn rewards** (:func:`token_advantages`): a reward the env gives for a turn sits
  on that turn's last model token; a token's advantage is the trajectory's advantage plus
  the (undiscounted) sum of the turn rewards at or after it, so a turn is credited with
  what it and the later turns earned. Turn rewards are shaping terms on the scale the env
  chose: they are not normalised with the outcome reward.
* **Policy loss** (:func:`policy_loss`): PPO's clipped surrogate with separate lower and
  upper clips (DAPO's clip-higher: ``1 - clip_low <= ratio <= 1 + clip_high``), the ratio
  taken against the old policy's logprobs as the trainer recomputes them. Optionally each
  token is weighted by a truncated importance weight ``min(pi_old / pi_sampler, cap)``
  (:func:`truncated_importance_weights`), which corrects for the inference engine sampling
  from slightly different probabilities than the trainer computes.
* **Off-policy tokens** (:func:`decoupled_policy_loss`, the decoupled objective of AReaL /
  "Batch size-invariance for policy optimization"): a token sampled by older weights (an
  asynchronous schedule, :mod:`rlfactory_core.loops`) has three policies: the *behaviour*
  policy that sampled it (the sampler's logprobs), the *proximal* policy the clip is centred
  on (the weights at the update's start: the old logprobs) and the policy being trained.
  ``loss_t = -min(r_t A_t, clip(r_t) A_t) * min(pi_prox / pi_behav, cap)`` with ``r_t =
  pi / pi_prox``: the clip bounds each update's step from where the weights are, whatever
  the sampler's age, and the truncated importance weight corrects for the age (and the
  sampler's numerics) with bounded variance. Synchronous training is the special case
  ``pi_behav = pi_prox`` up to numerics, so one formula serves every schedule.
* **KL** (:func:`kl_penalty`): to a frozen reference model, estimator k1 (``log p - log
  ref``) or k3 (``exp(ref - p) - (ref - p) - 1``, unbiased and non-negative).
* **Aggregation** (:func:`aggregate`): ``token_mean`` (every token weighs the same: long
  answers weigh more), ``seq_mean_token_sum`` (the sum over a trajectory's tokens, averaged
  over trajectories; Dr. GRPO's choice with a constant normaliser) or
  ``seq_mean_token_mean`` (each trajectory weighs the same: the original GRPO). The
  normalisers are those of the whole mini-batch, passed in, so that summing the losses of
  its micro-batches gives exactly the mini-batch's loss (gradient accumulation does not
  change the objective). A trajectory of several token sequences (rows) is one sequence
  here: its rows' tokens are averaged together (``sequence_tokens``) and it is counted once.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch

__all__ = [
    "group_advantages", "token_advantages", "policy_loss", "kl_penalty", "aggregate",
    "truncated_importance_weights", "decoupled_policy_loss", "entropy_from_logits", "masked_mean", "AdvantageNorm", "LossAgg",
]

AdvantageNorm = Literal["group", "batch", "none"]
LossAgg = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor | Sequence[int], norm: AdvantageNorm = "group",
                     eps: float = 1e-6, include: torch.Tensor | Sequence[bool] | None = None,
                     weights: torch.Tensor | Sequence[float] | None = None) -> torch.Tensor:
    """``[B]`` advantages for ``[B]`` rewards; ``groups[i]`` is row ``i``'s group (the
    trajectories of one prompt), in any order. Each reward minus its group's mean, divided
    by the group's unbiased std (``group``), the batch's (``batch``) or nothing (``none``).
    Groups may differ in size (a trajectory lost to a failure leaves its group smaller); a
    group of one has advantage 0. ``include`` (``[B]`` bools, default all): rows left out
    (a masked failure: :mod:`rlfactory_core.outcomes`) get advantage 0 and count in no
    mean or std, as if their group were smaller. ``weights`` (``[B]`` positive importance
    weights, :func:`rlfactory_core.resampling.selection_weights`): a group's mean is the
    weighted mean, its std the unbiased weighted one (reliability weights: ``sum w (r - mean)^2
    / (V1 - V2 / V1)``, ``V1 = sum w``, ``V2 = sum w^2``; the plain std when the weights are
    equal), and each advantage is scaled by its weight over the group's mean weight, so the
    group's policy gradient estimates the unselected distribution's (the clipped surrogate is
    linear in a positive advantage scale)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(rewards.shape)}")
    groups = torch.as_tensor(groups)
    if groups.shape != rewards.shape or groups.is_floating_point():
        raise ValueError(f"groups must be {rewards.numel()} integer group ids, got {tuple(groups.shape)} "
                         f"{groups.dtype}")
    if norm not in ("group", "batch", "none"):
        raise ValueError(f"advantage norm must be 'group', 'batch' or 'none', got {norm!r}")
    kept = torch.ones(rewards.shape, dtype=torch.bool) if include is None else \
        torch.as_tensor(include, dtype=torch.bool)
    if kept.shape != rewards.shape:
        raise ValueError(f"include must be {rewards.numel()} bools, got {tuple(kept.shape)}")
    rewards = rewards.float()
    if weights is not None:
        return _weighted_group_advantages(rewards, groups, norm, eps, kept, torch.as_tensor(weights).float())
    centred = torch.zeros_like(rewards)
    group_std = torch.zeros_like(rewards)
    for group in groups[kept].unique():
        rows = (groups == group) & kept
        values = rewards[rows]
        centred[rows] = values - values.mean()
        if values.numel() > 1:
            group_std[rows] = values.std()
    if norm == "none":
        return centred
    if norm == "group":
        return centred / (group_std + eps)
    std = rewards[kept].std() if int(kept.sum()) > 1 else rewards.new_zeros(())
    return centred / (std + eps)


def _weighted_group_advantages(rewards: torch.Tensor, groups: torch.Tensor, norm: AdvantageNorm, eps: float,
                               kept: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """:func:`group_advantages` with importance ``weights`` (its docstring)."""
    if weights.shape != rewards.shape or not bool((weights[kept] > 0).all()):
        raise ValueError(f"weights must be {rewards.numel()} positive numbers, got {tuple(weights.shape)}")
    centred = torch.zeros_like(rewards)
    group_std = torch.zeros_like(rewards)
    scale = torch.zeros_like(rewards)
    for group in groups[kept].unique():
        rows = (groups == group) & kept
        values, w = rewards[rows], weights[rows]
        centred[rows] = values - (w * values).sum() / w.sum()
        scale[rows] = w / w.mean()
        if values.numel() > 1:
            v1, v2 = w.sum(), (w * w).sum()
            group_std[rows] = ((w * centred[rows] ** 2).sum() / (v1 - v2 / v1)).sqrt()
    if norm == "none":
        return centred * scale
    if norm == "group":
        return centred / (group_std + eps) * scale
    std = rewards[kept].std() if int(kept.sum()) > 1 else rewards.new_zeros(())
    return centred / (std + eps) * scale


def token_advantages(advantages: torch.Tensor, mask: torch.Tensor,
                     turn_rewards: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, L]`` per-token advantages: the trajectory's advantage on each of its model tokens,
    plus, when ``turn_rewards`` (``[B, L]``, each turn's reward on its last model token, 0
    elsewhere) is given, the sum of the turn rewards from that token to the end."""
    out = advantages.float()[:, None].expand_as(mask).clone()
    if turn_rewards is not None:
        to_go = turn_rewards.float().flip(-1).cumsum(-1).flip(-1)
        out = out + to_go
    return out * mask


def truncated_importance_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                                 cap: float) -> torch.Tensor:
    """``min(exp(old - sampler), cap)``: how much more likely the trainer's old policy finds a
    token than the engine that sampled it did, capped. No gradient flows through it."""
    return torch.exp(old_logprobs - sampler_logprobs).clamp(max=cap).detach()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1 (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: LossAgg,
              num_tokens: float | None = None, num_sequences: float | None = None,
              sequence_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """One number from ``[B, L]`` per-token values over the masked tokens.

    ``num_tokens`` / ``num_sequences`` are the normalisers of the whole mini-batch when this
    is one micro-batch of it (default: this batch's own). A row without a masked token (a
    filtered trajectory) is not a sequence the ``seq_mean`` modes average over.
    ``sequence_tokens`` (``[B]``): the masked tokens of each row's trajectory, where a
    trajectory spans several rows (``seq_mean_token_mean`` averages over them; default: the
    row's own); ``num_sequences`` then counts trajectories."""
    mask = mask.to(per_token.dtype)
    summed = per_token * mask
    if mode == "token_mean":
        denominator = mask.sum() if num_tokens is None else torch.tensor(float(num_tokens))
        return summed.sum() / denominator.clamp(min=1)
    sequences = float((mask.sum(-1) > 0).sum()) if num_sequences is None else float(num_sequences)
    if mode == "seq_mean_token_sum":
        return summed.sum() / max(sequences, 1.0)
    if mode == "seq_mean_token_mean":
        tokens = mask.sum(-1) if sequence_tokens is None else sequence_tokens.to(per_token.dtype)
        per_sequence = summed.sum(-1) / tokens.clamp(min=1)
        return per_sequence.sum() / max(sequences, 1.0)
    raise ValueError(f"loss aggregation must be token_mean, seq_mean_token_sum or seq_mean_token_mean, got {mode!r}")


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
               estimator: Literal["k1", "k3"] = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from the sampled tokens' logprobs."""
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        delta = ref_logprobs - logprobs
        return torch.exp(delta) - delta - 1
    raise ValueError(f"KL estimator must be 'k1' or 'k3', got {estimator!r}")


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.28,
                weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped-surrogate loss ``[B, L]`` (aggregate it with :func:`aggregate`) and
    its statistics over the masked tokens: ``clip_fraction`` (tokens whose gradient the clip
    removed), ``ratio_mean``, ``ratio_max``.

    ``loss_t = -min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t) * w_t`` with
    ``r_t = exp(logprobs - old_logprobs)`` and optional weights ``w`` (truncated importance
    sampling)."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights
    with torch.no_grad():
        maskf = mask.to(ratio.dtype)
        was_clipped = (clipped < unclipped).to(ratio.dtype)
        stats = {
            "clip_fraction": masked_mean(was_clipped, maskf),
            "ratio_mean": masked_mean(ratio, maskf),
            "ratio_max": (ratio * maskf).max() if maskf.any() else ratio.new_ones(()),
        }
    return per_token, stats


def decoupled_policy_loss(logprobs: torch.Tensor, proximal_logprobs: torch.Tensor,
                          behaviour_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                          clip_low: float = 0.2, clip_high: float = 0.28,
                          cap: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The decoupled objective (see the module docstring): :func:`policy_loss` against the
    ``proximal`` policy, each token weighted by ``min(pi_prox / pi_behav, cap)``
    (:func:`truncated_importance_weights`); ``cap=None`` leaves the weights out (the
    behaviour policy is then taken to be the proximal one). Its statistics are
    :func:`policy_loss`'s, with ``is_weight_mean`` (over the masked tokens) when weighted."""
    weights = truncated_importance_weights(proximal_logprobs, behaviour_logprobs, cap) if cap else None
    per_token, stats = policy_loss(logprobs, proximal_logprobs, advantages, mask, clip_low=clip_low,
                                   clip_high=clip_high, weights=weights)
    if weights is not None:
        stats["is_weight_mean"] = masked_mean(weights, mask)
    return per_token, stats


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's next-token distribution (natural log), ``[..., V] -> [...]``."""
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return log_z - (probs * logits).sum(-1)
