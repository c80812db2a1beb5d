"""The optimizer steps on one rollout batch: ``grpo.epochs`` passes of ``grpo.mini_batches``
steps, each accumulating gradients over micro-batches (:mod:`.batch`); the loss and its
statistics from :mod:`.grpo`. The same function runs in one process (the local engine) and
on every rank of an FSDP2 trainer group (the ray engine, with a :class:`DataParallel`).

It runs on the engine's one dedicated training thread (see
:class:`rlfactory_core.engines.local.LocalEngine`): never call it from a thread pool that
changes threads between steps.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..config import RunConfig
from .batch import micro_batches, rows_of, trajectory_rows
from .logprobs import token_logprobs

__all__ = ["update_policy", "batch_logprobs", "shares_prompts", "DataParallel", "SINGLE_PROCESS"]


@dataclass(frozen=True)
class DataParallel:
    """This process's place in a trainer group (the ray engine): every rank holds the whole
    batch and takes every ``world``-th micro-batch. FSDP2 runs collectives in each forward
    and backward, so every rank runs the same number of them: a rank with fewer real
    micro-batches runs a zero-weight one. :data:`SINGLE_PROCESS` (rank 0 of 1) is the local
    engine's: every micro-batch, no collectives, so the update has one code path."""

    rank: int
    world: int

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def rounds(self, planned: list[list[int]]) -> list[tuple[list[int], bool]]:
        """This rank's share of the whole batch's micro-batches (``planned``, the rows of
        each), as ``(rows, real)``; ``real`` is False for padding."""
        mine = planned[self.rank::self.world]
        count = math.ceil(len(planned) / self.world)
        return [(mine[i], True) if i < len(mine) else (planned[0], False) for i in range(count)]

    def combine_rows(self, out: Any, model: Any) -> None:
        """Every rank's rows of ``out`` (each filled its own, zeros elsewhere) on every rank."""
        if not self.distributed:
            return
        import torch

        torch.distributed.all_reduce(out)
        # FSDP2 keeps per-iteration state that only a backward clears; left over from
        # forwards without one, it kept the next backward from reducing the root's
        # gradients (embeddings, final norm: None), so clear it.
        model.reset_iter_state()

    def combine_statistics(self, sums: Counter[str], counts: Counter[str]) -> tuple[Counter[str], Counter[str]]:
        """Every rank's sums and weights added up (``train/ratio_max``: the largest)."""
        if not self.distributed:
            return sums, counts
        import torch.distributed as dist

        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (dict(sums), dict(counts)))
        all_sums: Counter[str] = Counter()
        all_counts: Counter[str] = Counter()
        for rank_sums, rank_counts in gathered:
            for key, value in rank_sums.items():
                all_sums[key] = max(all_sums[key], value) if key == "train/ratio_max" else all_sums[key] + value
            all_counts.update(rank_counts)
        return all_sums, all_counts


SINGLE_PROCESS = DataParallel(rank=0, world=1)


def shares_prompts(config: RunConfig, batch: Any, packed: bool, model: Any = None) -> bool:
    """Whether micro-batches compute a group's common prompt once (``grpo.shared_prefix``):
    padded micro-batches of text on a model that scores through its decoder (images, packing,
    gradient checkpointing and the ray engine's FSDP root take the plain path, and their
    micro-batches are planned by length alone)."""
    if getattr(model, "computes_scored_logits", False) or getattr(model, "is_gradient_checkpointing", False):
        return False
    return config.grpo.shared_prefix and not packed and "image_inputs" not in batch.keys() and \
        "prompt_lengths" in batch.keys()


def batch_logprobs(model: Any, batch: Any, rows: list[int], config: RunConfig, packed: bool,
                   dp: DataParallel = SINGLE_PROCESS) -> Any:
    """``[B, L]`` logprobs under ``model`` of the sampled tokens of ``rows`` of the batch, without
    gradient (old and reference logprobs); zeros elsewhere. In a trainer group every rank
    computes its share and the result is the whole batch's on every rank."""
    import torch

    out = torch.zeros(batch["loss_mask"].shape, dtype=torch.float32)
    shared = shares_prompts(config, batch, packed, model)
    planned = micro_batches(rows, batch["lengths"], config.grpo.micro_batch_tokens, packed,
                            shared_prompts=batch if shared else None)
    with torch.no_grad():
        for micro_rows, real in dp.rounds(planned):
            micro = rows_of(batch, micro_rows)
            logprobs, _ = token_logprobs(model, micro, bf16=config.train.bf16, entropy=False, packed=packed,
                                          temperature=config.rollout.sampling.temperature, shared_prefix=shared)
            if real:
                out[micro_rows, :logprobs.shape[1]] = logprobs.cpu()
    dp.combine_rows(out, model)
    return out


def update_policy(model: Any, reference: Any, optimizer: Any, batch: Any, config: RunConfig, *,
                   step: int = 0, packed: bool = False, dp: DataParallel = SINGLE_PROCESS) -> dict[str, float]:
    """The optimizer steps on one rollout batch (a TensorDict, see above); their statistics.
    ``reference``: the KL term's (:func:`rlfactory_core.training.policy.load_reference`),
    None without one.

    ``dp``: one rank of an FSDP2 trainer group (the ray engine). The mini-batches and their
    loss normalisers are the whole batch's, as here; each rank back-propagates its share of
    the micro-batches and FSDP sums the ranks' gradients (the ray engine sets it to sum, not
    average), so the gradient, the clipping and the step are the ones a single process
    computes (tested for parity).

    A mini-batch whose gradient is exactly zero (every advantage zero, no KL or entropy term)
    takes no optimizer step (``train/optimizer_steps`` counts the steps taken): a step of
    Adam on a zero gradient still moves every weight by its momentum.

    A batch with ``recorded`` (``[B]``, the rows the run records token by token) gets
    ``trainer_logprobs`` (``[B, L]``): those rows' logprobs under the policy before this
    update (zeros in other rows)."""
    import torch

    from .grpo import aggregate, decoupled_policy_loss, kl_penalty, masked_mean

    g = config.grpo
    rows = list(range(batch.batch_size[0]))
    on_policy = g.epochs * g.mini_batches == 1
    if not on_policy:
        batch["old_logprobs"] = batch_logprobs(model, batch, rows, config, packed, dp)
    # The recorded rows' logprobs before the update (rlfactory_core.records), for the trainer
    # to read back: the old logprobs, or, on policy, the first pass's own (detached).
    recorded = batch["recorded"].bool() if "recorded" in batch.keys() else None
    if recorded is not None and not on_policy:
        batch["trainer_logprobs"] = batch["old_logprobs"] * recorded[:, None]
    kept = torch.zeros(batch["loss_mask"].shape, dtype=torch.float32) \
        if recorded is not None and on_policy and bool(recorded.any()) else None
    if g.kl_coef > 0:  # the reference: a frozen copy, or the LoRA policy with its adapters off
        with reference.scoring() as scorer:
            batch["ref_logprobs"] = batch_logprobs(scorer, batch, rows, config, packed, dp)

    sums: Counter[str] = Counter()
    counts: Counter[str] = Counter()

    def record(key: str, value: Any, weight: float = 1.0) -> None:
        sums[key] += float(value) * weight
        counts[key] += weight

    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    shared = shares_prompts(config, batch, packed, model)
    ranks = dp.world
    shuffler = random.Random(f"{config.train.seed}:minibatches:{step}")
    # mini-batches of whole trajectories: a trajectory's sequences (rows) stay together
    by_trajectory = trajectory_rows(batch) if "trajectory" in batch.keys() else [[row] for row in rows]
    for epoch in range(g.epochs):
        order = list(range(len(by_trajectory)))
        shuffler.shuffle(order)
        size = math.ceil(len(order) / g.mini_batches)
        for start in range(0, len(order), size):
            members = order[start:start + size]
            mini = [row for member in members for row in by_trajectory[member]]
            num_tokens = float(batch["loss_mask"][mini].sum())
            # trajectories without a loss token (filtered, or nothing sampled) are not averaged over
            num_sequences = sum(int(batch["loss_mask"][by_trajectory[member]].sum()) > 0 for member in members)
            if num_tokens == 0:
                continue
            optimizer.zero_grad(set_to_none=True)
            planned = micro_batches(mini, batch["lengths"], g.micro_batch_tokens, packed,
                                    shared_prompts=batch if shared else None)
            for micro_rows, real in dp.rounds(planned):
                micro = rows_of(batch, micro_rows).to(device)
                mask = micro["loss_mask"]
                logprobs, entropies = token_logprobs(model, micro, bf16=config.train.bf16, entropy=True,
                                                      entropy_grad=g.entropy_coef > 0, packed=packed,
                                                      temperature=config.rollout.sampling.temperature,
                                                      shared_prefix=shared)
                old = logprobs.detach() if on_policy else micro["old_logprobs"]
                if kept is not None and real and epoch == 0:
                    for i, row in enumerate(micro_rows):
                        if recorded[row]:
                            kept[row, :old.shape[1]] = old[i].float().cpu()
                sampler = micro["sampler_logprobs"]
                per_token, stats = decoupled_policy_loss(logprobs, old, sampler, micro["advantages"], mask,
                                                         clip_low=g.clip_low, clip_high=g.clip_high, cap=g.tis_cap)
                if g.kl_coef > 0:
                    kl = kl_penalty(logprobs, micro["ref_logprobs"], g.kl_estimator)
                    per_token = per_token + g.kl_coef * kl
                if g.entropy_coef > 0:
                    per_token = per_token - g.entropy_coef * entropies
                loss = aggregate(per_token, mask, g.loss_agg, num_tokens=num_tokens, num_sequences=num_sequences,
                                 sequence_tokens=micro.get("trajectory_tokens", None))
                if not real:  # padding for the collectives: no gradient, no statistics
                    (loss * 0.0).backward()
                    continue
                loss.backward()
                tokens = float(mask.sum())
                sums["train/loss"] += float(loss.detach())
                if g.kl_coef > 0:
                    record("train/kl", masked_mean(kl.detach(), mask), tokens)
                record("train/entropy", masked_mean(entropies.detach(), mask), tokens)
                record("train/clip_fraction", stats["clip_fraction"], tokens)
                record("train/ratio_mean", stats["ratio_mean"], tokens)
                sums["train/ratio_max"] = max(sums["train/ratio_max"], float(stats["ratio_max"]))
                _record_sampler_gap(record, old, sampler, mask, micro.get("staleness", None))
                if "is_weight_mean" in stats:
                    record("train/tis_weight_mean", stats["is_weight_mean"], tokens)
                sums["train/trained_tokens"] += tokens
            grad_norm = torch.nn.utils.clip_grad_norm_(params, config.train.max_grad_norm or float("inf"))
            if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2: the norm over all shards
                grad_norm = grad_norm.full_tensor()
            # the same on every rank: counted once when the ranks' statistics are merged
            sums["train/grad_norm"] += float(grad_norm) / ranks
            counts["train/grad_norm"] += 1 / ranks
            counts["train/loss"] += 1 / ranks
            if float(grad_norm) == 0.0:
                # Nothing to learn here (every advantage zero: constant or masked groups; no KL
                # or entropy term): Adam's momentum alone would repeat earlier updates with no
                # new evidence, so the weights stay as they are.
                continue
            optimizer.step()
            sums["train/optimizer_steps"] += 1 / ranks
    if kept is not None:
        dp.combine_rows(kept, model)
        batch["trainer_logprobs"] = kept
    sums, counts = dp.combine_statistics(sums, counts)
    out = {}
    for key, total in sums.items():
        if key in ("train/ratio_max", "train/trained_tokens", "train/optimizer_steps"):
            out[key] = total
        elif counts[key]:
            out[key] = total / counts[key]
    if "train/optimizer_steps" in out:
        out["train/optimizer_steps"] = round(out["train/optimizer_steps"])
    out.setdefault("train/kl", 0.0)
    out.setdefault("train/optimizer_steps", 0)
    return out


def _record_sampler_gap(record: Any, old: Any, sampler: Any, mask: Any, staleness: Any) -> None:
    """``train/sampler_logprob_diff`` and ``train/sampler_kl`` (the k3 estimate of KL(sampler ||
    trainer), the tokens being the sampler's draws) over the tokens the current weights
    sampled: the train/inference numerics gap; ``train/stale_sampler_*`` over the tokens older
    weights sampled (an asynchronous schedule), where the policy's drift adds to it;
    ``train/stale_token_fraction``."""
    import torch

    from .grpo import kl_penalty, masked_mean

    gaps = {"logprob_diff": (sampler - old).abs(), "kl": kl_penalty(sampler, old, "k3")}
    stale = staleness > 0 if staleness is not None else torch.zeros_like(mask, dtype=torch.bool)
    for prefix, part in (("train/sampler_", mask * ~stale), ("train/stale_sampler_", mask * stale)):
        tokens = float(part.sum())
        if tokens:
            for name, gap in gaps.items():
                record(prefix + name, masked_mean(gap, part), tokens)
    record("train/stale_token_fraction", masked_mean(stale.float(), mask), float(mask.sum()))
