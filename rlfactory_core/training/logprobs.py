"""The policy's logprobs (and entropies) of the sampled tokens of a micro-batch.

Only the positions that predict a sampled token go through the vocabulary projection
(prompts and observations are most of a trajectory, and [tokens, vocab] logits most of the
memory). A micro-batch is fed padded, or packed into one row with positions restarting at
each trajectory (``grpo.packing``): flash-attention's varlen kernel then skips padding
entirely; SDPA gives the same numbers through a block-diagonal mask.
"""

from __future__ import annotations

import functools
from typing import Any

from ..rollout import GREEDY_TEMPERATURE
from .batch import micro_image_inputs

__all__ = ["token_logprobs", "scored_logits", "bf16_autocast", "bf16_warning", "native_bf16", "cpu_bf16_is_fast"]


@functools.cache
def native_bf16(device_type: str) -> bool:
    """Whether ``device_type``'s bf16 matmuls are faster than its float32 ones: a CUDA GPU
    that supports bf16, or a CPU with AMX (oneDNN's bf16 tile kernels, :func:`cpu_bf16_is_fast`).

    Measured on 2-core CPUs (bench/README.md, ``bench/bf16_cpu.py``): on an AVX2 AMD EPYC
    (2026-11-26) torch has no bf16 GEMM and falls back to its reference loop, a 1024x1024
    bf16 matmul 3.8 s against 0.11 s in float32, a GRPO step's update over 10 minutes instead
    of ~25 s; on an AVX512-BF16 Intel Xeon without AMX (2026-11-27), where oneDNN does have
    bf16 kernels, the policy's forward and backward under bf16 autocast ran at 0.57x the speed
    of float32 (the casts and the float32 ops around them cost more than the matmuls save)."""
    import torch

    if device_type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device_type == "cpu":
        try:
            onednn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # noqa: SLF001 - torch's own probe
        except (AttributeError, RuntimeError):
            return False
        return onednn_bf16 and cpu_bf16_is_fast(_cpu_flags())
    return False


def cpu_bf16_is_fast(flags: set[str]) -> bool:
    """Whether a CPU with these feature ``flags`` (``/proc/cpuinfo``'s names) multiplies bf16
    faster than float32: with AMX's bf16 tiles (``amx_bf16``), not with AVX512-BF16 alone
    (:func:`native_bf16` has the measurements)."""
    return {"amx_bf16", "amx_tile"} <= flags


def _cpu_flags() -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (Linux); empty elsewhere, so an unknown
    CPU trains in float32, which is never the slow choice by much."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def bf16_autocast(setting: bool | str, device: Any) -> bool:
    """``train.bf16`` resolved for ``device``: ``auto`` is bf16 autocast where the device's
    bf16 matmuls are the fast ones (:func:`native_bf16`), float32 elsewhere; true / false as given."""
    if setting == "auto":
        return native_bf16(device.type)
    return bool(setting)


def bf16_warning(setting: bool | str, device: Any) -> str | None:
    """A one-line warning when bf16 autocast was asked for where float32 is faster (:func:`native_bf16`)."""
    if setting is True and not native_bf16(device.type):
        return (f"train.bf16=true on a {device.type} whose bf16 matmuls are slower than float32 ones (no AMX: "
                f"emulated or unaccelerated); set train.bf16=auto (the default) or false")
    return None


def token_logprobs(model: Any, micro: Any, *, bf16: bool | str, entropy: bool, entropy_grad: bool = False,
                    packed: bool = False, temperature: float = 1.0, shared_prefix: bool = False) -> tuple[Any, Any]:
    """``[b, l]`` logprobs (and entropies) under ``model`` of the tokens of the micro-batch
    ``micro`` where its ``loss_mask`` is 1; zeros elsewhere. Only the masked positions'
    logits are normalised. The entropy carries a gradient only with ``entropy_grad`` (an
    entropy bonus).

    ``temperature``: the sampling temperature of the rollout. The policy that sampled the
    tokens is ``softmax(logits / T)``, and that is the policy the ratio, the KL and the
    sampler comparison are about (as in verl and TRL); the backends report their logprobs
    the same way (:mod:`rlfactory_core.rollout.backends.base`). Greedy (``T`` below the backends' threshold) scores
    the raw logits, as the backends do.

    ``packed``: the rows' real tokens are concatenated into one row, with positions
    restarting at each trajectory and no attention mask; transformers then keeps the
    trajectories apart (flash-attention's varlen kernel, or a block-diagonal mask), and no
    padding token is computed. The results are scattered back to the padded layout.

    ``shared_prefix`` (padded only): the tokens every row of the micro-batch has in common
    at its start (a GRPO group's prompt, see :func:`.batch.micro_batches`) go through the
    model once, and the rows' rest attends to their keys and values; gradients from every
    row flow back into that one computation, so the numbers are the unshared ones (to float
    rounding) for a fraction of the compute: with a 350-token prompt and 8 rows of 200 more,
    1,950 tokens instead of 4,400."""
    import torch

    from .grpo import entropy_from_logits

    device = next(model.parameters()).device
    input_ids, attention_mask = micro["input_ids"].to(device), micro["attention_mask"].to(device)
    loss_mask = micro["loss_mask"].to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    if packed:
        real = attention_mask.bool()
        # right-padded rows: row-major selection keeps each trajectory contiguous, in order
        model_ids, model_mask, model_positions = input_ids[real][None], None, position_ids[real][None]
        scored = loss_mask[real][None]
    else:
        model_ids, model_mask, model_positions, scored = input_ids, attention_mask, position_ids, loss_mask
    images = micro_image_inputs(micro, device, next(model.parameters()).dtype)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16_autocast(bf16, device))
    # Token t is predicted from position t - 1. Packed, position t - 1 may be the end of the
    # previous trajectory, but only for a trajectory's first token, which is a prompt token
    # and never scored.
    targets = scored[:, 1:].bool()
    with autocast:
        if isinstance(model, torch.nn.Module) and getattr(model, "computes_scored_logits", False):
            chosen = model(model_ids, model_mask, model_positions, targets).float()  # an FSDP root (ray engine)
        else:
            prefix = common_prefix_length(model_ids, model_mask) if shared_prefix and not packed else 0
            chosen = scored_logits(model, model_ids, model_mask, model_positions, targets, images,
                                   shared_prefix=prefix).float()
    if temperature >= GREEDY_TEMPERATURE:
        chosen = chosen / temperature
    token_ids = model_ids[:, 1:][targets]

    def unpack(values: Any) -> Any:
        flat = torch.zeros(scored.shape, dtype=torch.float32, device=device)
        flat[:, 1:][targets] = values
        if not packed:
            return flat
        out = torch.zeros(loss_mask.shape, dtype=torch.float32, device=device)
        out[real] = flat[0]
        return out

    logprobs = unpack(chosen.gather(-1, token_ids[:, None]).squeeze(-1) - torch.logsumexp(chosen, -1))
    entropies = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropies = unpack(entropy_from_logits(chosen))
    return logprobs, entropies


#: Below this many common tokens a shared prefix is not worth a second forward call.
MIN_SHARED_PREFIX = 16


def common_prefix_length(input_ids: Any, attention_mask: Any) -> int:
    """How many tokens at the start every row has, identical and real; 0 when sharing them
    would not pay (one row, fewer than :data:`MIN_SHARED_PREFIX`). At most the width less one,
    so the rows keep a token of their own."""
    import torch

    if input_ids.shape[0] < 2:
        return 0
    same = ((input_ids == input_ids[:1]) & attention_mask.bool()).all(0)
    length = int(torch.cumprod(same.int(), 0).sum())
    length = min(length, input_ids.shape[1] - 1)
    return length if length >= MIN_SHARED_PREFIX else 0


def scored_logits(model: Any, input_ids: Any, attention_mask: Any, position_ids: Any, targets: Any,
                   images: dict[str, Any] | None = None, shared_prefix: int = 0) -> Any:
    """``[N, V]`` logits of the positions that predict the ``targets`` (``[b, l-1]`` bool).

    The vocabulary projection only where a sampled token is scored: prompts and
    observations are most of a trajectory, and [tokens, vocab] logits are most of the
    memory (49k x 4 bytes a token for SmolLM2). ``images``: a vision-language model's image
    inputs, in the order of the image tokens; the body is then the whole multimodal model
    (vision tower, projector, language model), not just the language decoder."""
    if images:
        head = model.get_output_embeddings()
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # through peft
        hidden = base.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False, **images).last_hidden_state
        return head(hidden[:, :-1][targets])
    decoder, head = _decoder_and_head(model)
    if decoder is not None and shared_prefix and not getattr(model, "is_gradient_checkpointing", False):
        # (gradient checkpointing turns the key/value cache off inside the decoder)
        hidden = _shared_prefix_hidden(model, decoder, input_ids, attention_mask, position_ids, shared_prefix)
        return head(hidden[:, :-1][targets])
    if decoder is not None:
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False).last_hidden_state
        return head(hidden[:, :-1][targets])
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits
    return logits[:, :-1][targets]


def _shared_prefix_hidden(model: Any, decoder: Any, input_ids: Any, attention_mask: Any, position_ids: Any,
                          prefix: int) -> Any:
    """``[b, l, h]`` hidden states: the first ``prefix`` tokens (the same in every row)
    computed once, the rest of each row on top of their key/value cache."""
    import torch
    from transformers import DynamicCache

    rows = input_ids.shape[0]
    cache = DynamicCache(config=getattr(model, "config", None))
    head_hidden = decoder(input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix],
                          position_ids=position_ids[:1, :prefix], past_key_values=cache,
                          use_cache=True).last_hidden_state
    cache.batch_repeat_interleave(rows)  # differentiable: every row's gradient reaches the one prefix
    tail_hidden = decoder(input_ids=input_ids[:, prefix:], attention_mask=attention_mask,
                          position_ids=position_ids[:, prefix:], past_key_values=cache,
                          use_cache=True).last_hidden_state
    return torch.cat([head_hidden.expand(rows, -1, -1), tail_hidden], dim=1)


def _decoder_and_head(model: Any) -> tuple[Any, Any]:
    """The transformer body and the LM head of a causal LM (also through a peft wrapper);
    ``(None, None)`` when the model does not expose them the standard way."""
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None, None
    scale = getattr(getattr(model, "config", None), "logit_scale", None) or getattr(
        getattr(model, "config", None), "final_logit_softcapping", None)
    if decoder is None or head is None or scale:  # models that post-process logits take the full path
        return None, None
    return decoder, head
