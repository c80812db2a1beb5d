"""The policy, its reference model and its optimizer: what every engine sets up the same way.

The local engine calls these in its process; each rank of the ray engine's trainer group
calls them too, and shards the models (FSDP2) between loading and building the optimizer.
"""

from __future__ import annotations

import ctypes
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..config import RunConfig
from ..errors import ConfigError

__all__ = ["training_device", "attn_implementation", "use_packing", "load_policy", "load_reference",
           "FrozenReference", "AdaptersOff",
           "build_optimizer", "lr_scheduler", "step_scheduler", "weights_for_backend", "return_freed_memory"]


def training_device(config: RunConfig) -> Any:
    import torch

    if config.train.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.train.device)


def attn_implementation(config: RunConfig, device: Any) -> str:
    choice = config.model.attn_implementation
    if choice != "auto":
        return choice
    if device.type == "cuda":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


def use_packing(config: RunConfig, implementation: str) -> bool:
    """Packing pays only where attention skips the masked-out blocks: flash-attention's
    varlen path. SDPA applies a packed batch's block-diagonal mask to the full
    [T, T] score matrix, which on this CPU made a forward of 4 length-sorted
    trajectories ~20% slower than padding them (see ``grpo.packing``)."""
    if config.grpo.packing == "auto":
        return implementation.startswith("flash_attention")
    return config.grpo.packing == "on"


def load_policy(config: RunConfig, model_path: str | Path, device: Any, adapter: Path | None = None) -> Any:
    """The trained model: full weights, or the base model with LoRA adapters (new or resumed)."""
    import torch

    from ..models import load_model

    model = load_model(model_path, dtype=config.model.dtype, device=device)
    if not config.model.lora.enabled:
        # dtype "auto" keeps the checkpoint's, often bf16: trained weights must be float32
        # or AdamW's small updates round away (bf16/fp16 are refused by the config).
        model.float()
    model.config._attn_implementation = attn_implementation(config, device)  # noqa: SLF001
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if config.model.lora.enabled:
        try:
            from peft import LoraConfig, PeftModel, get_peft_model
        except ImportError as exc:
            raise ConfigError(["model.lora.enabled: peft is not installed"],
                              hint="pip install peft, or set model.lora.enabled=false") from exc
        if adapter is not None:
            model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
        else:
            lora = config.model.lora
            model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                     target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    model.train()
    torch.manual_seed(config.train.seed)
    return model


class FrozenReference:
    """The KL term's reference: a frozen copy of the base model."""

    def __init__(self, model: Any):
        self.model = model

    @contextmanager
    def scoring(self) -> Iterator[Any]:
        """The model that scores the reference logprobs."""
        yield self.model


class AdaptersOff:
    """With LoRA, the KL term's reference is the policy with its adapters switched off: the
    base model, without a second copy of it."""

    def __init__(self, policy: Any):
        self.policy = policy

    @contextmanager
    def scoring(self) -> Iterator[Any]:
        with self.policy.disable_adapter():
            yield self.policy


def load_reference(config: RunConfig, base_path: str | Path, device: Any, policy: Any) -> Any:
    """The KL term's reference (something with a ``scoring()`` context that gives the model
    to score with), or None without a KL term: the policy with its adapters off with LoRA,
    else a frozen copy of the base model."""
    if not config.grpo.kl_coef > 0:
        return None
    if config.model.lora.enabled:
        return AdaptersOff(policy)
    from ..models import load_model

    reference = load_model(base_path, dtype=config.model.dtype, device=device).eval()
    reference.config._attn_implementation = attn_implementation(config, device)  # noqa: SLF001
    reference.requires_grad_(False)
    return FrozenReference(reference)


def build_optimizer(model: Any, config: RunConfig) -> tuple[Any, Any]:
    """AdamW over the model's trainable parameters (in ``model.parameters()`` order: the
    order a checkpoint's optimizer state is indexed by) and its learning-rate schedule."""
    import torch

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.train.lr,
                                  betas=tuple(config.train.betas), weight_decay=config.train.weight_decay)
    return optimizer, lr_scheduler(optimizer, config)


def lr_scheduler(optimizer: Any, config: RunConfig) -> Any:
    import torch

    warmup, total, kind = config.train.warmup_steps, config.train.steps, config.train.scheduler

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def step_scheduler(scheduler: Any) -> None:
    """Advance the LR schedule one training step. A step whose gradient was zero took no
    optimizer step (:func:`rlfactory_core.training.update.update_policy`); torch's warning
    that the schedule then "skips its first value" does not apply to a schedule stepped per
    training step, so it is silenced here."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
        scheduler.step()


def weights_for_backend(policy: Any) -> list[tuple[str, Any]]:
    """``(HF name, tensor)`` of the policy as the backend knows it (LoRA merged in)."""
    if not hasattr(policy, "peft_config"):
        return [(name, tensor.detach()) for name, tensor in policy.state_dict().items()]
    policy.merge_adapter()
    try:
        out = []
        for name, tensor in policy.state_dict().items():
            if "lora_" in name:
                continue
            # the merged layers are copied before unmerging restores them; the rest are the
            # frozen base weights, which nothing changes
            merged = ".base_layer." in name
            name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            out.append((name, tensor.detach().clone() if merged else tensor.detach()))
        return out
    finally:
        policy.unmerge_adapter()


def return_freed_memory() -> None:
    """Give the memory an update freed back to the OS (glibc keeps freed pages otherwise,
    and RSS only grows); a no-op where libc has no ``malloc_trim``."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
