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

__all__ = ["training_device", "attn_implementation", "use_packing", "packing_is_exact", "load_policy", "load_reference",
           "FrozenReference", "AdaptersOff",
           "build_optimizer", "lr_scheduler", "step_scheduler", "weights_for_backend", "return_freed_memory"]


def training_device(config: RunConfig) -> Any:
    import torch

    if config.train.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.train.device)


def attn_implementation(config: RunConfig, device: Any, model: Any = None) -> str:
    """The attention kernel the trainer runs ``model`` with: ``model.attn_implementation``, or
    for ``auto`` flash_attention_2 on a GPU with flash-attn, else sdpa, else eager, each only
    where the model's class supports it. gpt-oss does not support sdpa: transformers' sdpa
    path ignores its attention sinks (and no error says so), which moved a tiny gpt-oss
    model's logprobs by up to 0.27 against its own eager forward and the sampler's. An
    explicit choice the model does not support is a :class:`ConfigError`. Without ``model``
    (the packing decision before one is loaded), what ``auto`` picks for a model that
    supports everything."""
    import importlib.util

    if model is not None and hasattr(model, "get_base_model"):  # LoRA: the model under the adapters
        model = model.get_base_model()

    def supported(name: str) -> bool:
        if model is None or name == "eager":
            return True
        if name == "flash_attention_2":  # gpt-oss: only the kernels that know its sinks
            kernels = getattr(model, "_compatible_flash_implementations", None)
            return bool(getattr(model, "_supports_flash_attn", False)) and (kernels is None or name in kernels)
        return bool(getattr(model, "_supports_sdpa", False))

    choice = config.model.attn_implementation
    if choice != "auto":
        if not supported(choice):
            raise ConfigError([f"model.attn_implementation={choice}: {type(model).__name__} does not support it "
                               f"(transformers would drop what its attention needs); use auto or eager"])
        return choice
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None and supported("flash_attention_2"):
        return "flash_attention_2"
    return "sdpa" if supported("sdpa") else "eager"


def use_packing(config: RunConfig, implementation: str, model: Any = None) -> bool:
    """Packing pays only where attention skips the masked-out blocks: flash-attention's
    varlen path. SDPA applies a packed batch's block-diagonal mask to the full
    [T, T] score matrix, which on this CPU made a forward of 4 length-sorted
    trajectories ~20% slower than padding them (see ``grpo.packing``).

    With ``model``, packing is also checked to keep trajectories apart (:func:`packing_is_exact`)
    before it is used: where it does not, ``auto`` pads and ``on`` is a :class:`ConfigError`."""
    wanted = (implementation.startswith("flash_attention") if config.grpo.packing == "auto"
              else config.grpo.packing == "on")
    # flash-attention's varlen kernel separates the trajectories by their positions itself
    if wanted and model is not None and not implementation.startswith("flash_attention") \
            and not packing_is_exact(model):
        if config.grpo.packing == "on":
            raise ConfigError([f"grpo.packing=on: {type(model).__name__} lets packed trajectories attend to each "
                               f"other with attention {implementation} (its causal mask ignores the restarting "
                               "positions); use grpo.packing=off or auto"])
        return False
    return wanted


def packing_is_exact(model: Any) -> bool:
    """Whether ``model`` keeps packed trajectories apart: a short random sequence's logits after
    another one in a packed row (positions restarting, no mask) against the same sequence
    alone, as a relative difference (probabilities would hide it: a random model's are
    near-uniform over the vocabulary). transformers finds the packed boundaries from the positions in
    the causal-mask builder, which most models call with them; gpt-oss's does not, and its
    packed rows attended across trajectories (logprobs off by up to 0.5 on a tiny model)."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    parameter = next(base.parameters())
    generator = torch.Generator().manual_seed(0)
    vocab = base.get_input_embeddings().num_embeddings
    first, second = (torch.randint(1, vocab, (1, n), generator=generator) for n in (5, 4))
    packed_ids = torch.cat([first, second], 1).to(parameter.device)
    positions = torch.cat([torch.arange(5), torch.arange(4)])[None].to(parameter.device)
    training = base.training
    base.eval()  # no dropout
    try:
        with torch.no_grad():
            alone = base(input_ids=second.to(parameter.device), use_cache=False).logits.float()
            packed = base(input_ids=packed_ids, position_ids=positions, use_cache=False).logits[:, 5:].float()
    finally:
        base.train(training)
    # float32 agrees to rounding (~1e-6); a bf16 LoRA base to bf16's (~1e-2)
    tolerance = 1e-4 if parameter.dtype == torch.float32 else 5e-2
    return bool((alone - packed).norm() <= tolerance * alone.norm())


def load_policy(config: RunConfig, model_path: str | Path, device: Any, adapter: Path | None = None) -> Any:
    """The trained model: full weights, or the base model with LoRA adapters (new or resumed)."""
    import torch

    from ..models import load_model

    model = load_model(model_path, dtype=config.model.dtype, device=device)
    if not config.model.lora.enabled:
        # dtype "auto" keeps the checkpoint's, often bf16: trained weights must be float32
        # or AdamW's small updates round away (bf16/fp16 are refused by the config).
        model.float()
    model.config._attn_implementation = attn_implementation(config, device, model)  # noqa: SLF001
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
    reference.config._attn_implementation = attn_implementation(config, device, reference)  # noqa: SLF001
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
