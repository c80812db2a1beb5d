"""FSDP2 for a trainer group (the ray engine's, or ranks started by ``torchrun``): sharding,
and the conversions that keep its checkpoints in the local engine's format (full HF weights;
AdamW state indexed by parameter order), so a run resumes on either engine. It imports only
torch: the GPU check (``bench/gpu.py``) runs it under ``torchrun`` where Ray is not installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["FSDP_PREFIX", "ScoredLogitsModule", "shard", "trainable_names", "full_model_state",
           "load_local_optimizer_state", "local_optimizer_state"]


FSDP_PREFIX = "lm."  # the FSDP root wraps the HF model as `lm`


class ScoredLogitsModule(torch.nn.Module):
    """The FSDP root: the HF model, called for the logits of the scored positions only
    (:func:`rlfactory_core.training.logprobs.scored_logits`). The root's hooks gather the parameters outside the decoder
    layers (embeddings, final norm, head), so the forward must enter through the root."""

    computes_scored_logits = True

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, targets: Any) -> Any:
        from .logprobs import scored_logits

        return scored_logits(self.lm, input_ids, attention_mask, position_ids, targets)


def shard(model: torch.nn.Module) -> ScoredLogitsModule:
    """``model`` sharded with FSDP2: each decoder layer is a unit, the rest is the root's.

    Gradients are summed over the ranks, not averaged: each rank's loss already carries the
    whole batch's normaliser (:func:`rlfactory_core.training.update.update_policy`). A plain sum also avoids the
    average op, which gave gradients ~1/world^2 of the true ones over gloo (measured)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    root = ScoredLogitsModule(model)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for layer in getattr(decoder, "layers", None) or []:
        fully_shard(layer)
    fully_shard(root)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return root


def trainable_names(model: torch.nn.Module) -> list[str]:
    """The names of the parameters ``torch.optim.AdamW(p for p in model.parameters() if
    p.requires_grad)`` indexes, in its order (tied weights once)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def full_model_state(policy: torch.nn.Module) -> dict[str, Any]:
    """The whole model (HF names, on CPU), gathered from every rank's shards: a collective,
    every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {name.removeprefix(FSDP_PREFIX): tensor for name, tensor in state.items()}


def load_local_optimizer_state(policy: torch.nn.Module, optimizer: Any, names: list[str], checkpoint: Path) -> None:
    """A local-format optimizer state (AdamW's, indexed by parameter order ``names``) into the shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    saved = torch.load(checkpoint / "optimizer.pt", weights_only=False)
    by_name = {"state": {FSDP_PREFIX + names[i]: s for i, s in saved["state"].items()},
               "param_groups": [{**g, "params": [FSDP_PREFIX + names[i] for i in g["params"]]}
                                for g in saved["param_groups"]]}
    set_optimizer_state_dict(policy, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def local_optimizer_state(policy: torch.nn.Module, optimizer: Any, names: list[str]) -> dict[str, Any]:
    """The sharded optimizer's whole state, indexed like ``torch.optim.AdamW`` over the
    parameters in order ``names``, on rank 0 (``{}`` on the others: with ``cpu_offload`` the
    full state is gathered to rank 0 only). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state = get_optimizer_state_dict(policy, optimizer,
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not state:
        return {}
    index = {name: i for i, name in enumerate(names)}
    return {"state": {index[name.removeprefix(FSDP_PREFIX)]: s for name, s in state["state"].items()},
            "param_groups": [{**g, "params": [index[n.removeprefix(FSDP_PREFIX)] for n in g["params"]]}
                             for g in state["param_groups"]]}
