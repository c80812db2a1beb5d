"""The GRPO training loop, top to bottom.

One training step:

1. **Prompts**: the next ``grpo.prompts_per_step`` samples of the training set, in an
   order fixed by ``train.seed`` and the position in the data (a reshuffle per epoch), so
   a resumed run sees exactly the samples the uninterrupted run would have seen.
2. **Rollout**: ``grpo.group_size`` trajectories per prompt, all at once, by the async
   agent loop (``rlfactory_core.rollout``): token-exact, with the sampler's logprobs.
   Sampling seeds are derived from ``train.seed`` and the step (reproducible, different
   every step).
3. **Rewards**: every configured reward scores every trajectory concurrently; the total is
   the weighted sum of those that apply (``rlfactory_core.rewards``). A reward that fails
   or times out on a trajectory gives it the reward's fallback value and is counted
   (``reward/errors``): one bad trajectory never ends the run.
4. **Advantages**: reward minus the group mean, scaled by ``grpo.advantage_norm``; per-turn
   rewards from the env are added on the tokens of their turn and the turns before it
   (``rlfactory_core.training.grpo`` has the formulas and the reasons).
5. **Old logprobs**: the trainer's own logprobs of the sampled tokens before any update.
   With one optimizer step per batch (``epochs = mini_batches = 1``, the default) the
   policy *is* the old policy, so they come from the same forward pass as the loss
   (detached) and the extra pass is skipped. The sampler's logprobs are only used to
   measure the train/inference mismatch (``train/sampler_*``) and, with ``grpo.tis_cap``,
   to weight tokens by a truncated importance ratio.
6. **Update**: ``grpo.epochs`` passes; each splits the batch into ``grpo.mini_batches``
   optimizer steps; each of those accumulates gradients over micro-batches of at most
   ``grpo.micro_batch_tokens`` tokens (trajectories sorted by length, so little padding,
   or packed without any; see Batching below). The loss normalisers are the mini-batch's,
   so accumulation does not change the objective. bf16 autocast, gradient clipping, AdamW,
   the LR schedule stepped per step. Only model tokens carry loss. With ``grpo.kl_coef > 0`` a frozen reference model (or,
   with LoRA, the model with its adapters off) gives the KL term.
7. **Weight sync**: the new weights go to the generation backend in place (vLLM: loaded
   into the running engine; hf: copied between requests), no restart.
8. **Metrics** (JSONL, TensorBoard, W&B) and the live view; loud warnings when the model
   made no tool call in a step although tools were offered, or when every group's rewards
   were constant (nothing to learn).
9. **Eval** every ``eval.every`` steps on held-out samples (and before the first step and
   after the last), with sample trajectories written as text; **checkpoint** every
   ``checkpoint.every`` steps and at the end, atomically (``rlfactory_core.training.checkpoint``).

Engines: the loop drives an engine (``_LocalEngine`` here: everything in this process; or,
with ``engine: ray``, ``rlfactory_core.ray_engine.RayEngine``: rollout workers, an FSDP2
trainer group, a judge pool and tool actors on a Ray cluster). Both run the same functions
(the agent loop, the reward layer, ``_update_policy``) and write the same checkpoints.

Interrupting (Ctrl-C, SIGTERM; ``rlfactory_core.stopping``): the run says at once what will
happen and stops within seconds. A step still in its rollout (or an eval) is dropped: the
rollouts in flight are cancelled, its data position is not advanced and nothing of it is
written, so a resumed run redoes exactly that step (the RNGs are saved as they were before
it). A step past its update is finished and saved. The last finished step is checkpointed;
a second Ctrl-C stops without saving. ``rlf train --resume RUN_DIR`` continues from the
newest checkpoint with the same data order. The engines' own output goes to the run's
``log.txt`` (``rlfactory_core.logs``, set up by the CLI).

Batching: the rollout batch travels as a ``tensordict.TensorDict`` (one row per
trajectory). Micro-batches are trajectories of similar length; the vocabulary projection is
applied only at the positions of sampled tokens. ``attn_implementation`` resolves to
``flash_attention_2`` on a GPU with ``flash-attn`` installed (the ``gpu`` extra), else SDPA.
With flash-attention, micro-batches are packed (``grpo.packing``): the trajectories are
concatenated into one row with positions restarting at each, so no padding is computed and
transformers runs flash-attention's varlen kernel. With SDPA the same packed row works
(transformers builds a block-diagonal mask) and gives the same logprobs and gradients (tested),
but attention then costs the whole [T, T] square; on this CPU that was slower than padding
length-sorted micro-batches, so ``auto`` packs only with flash-attention.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import inspect
import math
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from .config import RunConfig
from .errors import ConfigError, ModelError, RLFactoryError, one_line
from .plugins import notify
from .rollout.backend import GREEDY_TEMPERATURE
from .data import batch_indices, load_samples, read_jsonl_samples
from .task import Task, build_task
from .tools import DaemonThreadPool

__all__ = ["train", "evaluate", "TrainingInterrupted", "load_samples", "read_jsonl_samples"]


class TrainingInterrupted(RLFactoryError):
    """The run was stopped by SIGINT or SIGTERM (:mod:`rlfactory_core.stopping`); the message
    says which step is saved. ``exit_code`` is 128 + the signal's number, as a shell reports
    a process that the signal ended (130 for Ctrl-C)."""

    exit_code = 128 + signal.SIGINT


# --------------------------------------------------------------------------- entry points


def train(config: RunConfig, *, resume: str | os.PathLike[str] | None = None, console: Any = None) -> Path:
    """Run training to ``config.train.steps``; return the run directory.

    Every problem :mod:`rlfactory_core.preflight` can see is raised first, together (one
    :class:`ConfigError`); then the task and the data are built and the model resolved;
    only then is the run announced on ``console`` and its directory written."""
    from .preflight import raise_problems, run_problems

    raise_problems(run_problems(config, purpose="train", resume=resume))
    return asyncio.run(_train(config, resume=Path(resume) if resume else None, console=console))


def evaluate(config: RunConfig, model: str, *, split: str = "test", size: int | None = None,
             report_dir: str | os.PathLike[str] | None = None, console: Any = None) -> dict[str, Any]:
    """Evaluate ``model`` (a model name, a directory, or a run directory: its newest
    checkpoint) on ``split`` (all of it, or its first ``size`` samples); write ``report.json``
    and sample trajectories into ``report_dir`` (when given); return the report. Checked
    first like :func:`train`."""
    from .preflight import raise_problems, run_problems

    raise_problems(run_problems(config, purpose="eval", model=model, split=split, report_dir=report_dir))
    return asyncio.run(_evaluate_only(config, model, split=split, size=size,
                                      report_dir=Path(report_dir) if report_dir else None, console=console))


# --------------------------------------------------------------------------- setup


def _new_run_dir(config: RunConfig) -> Path:
    """The new run's directory, made: ``run_dir``, else ``runs/<env>-<date>-<time>``, with
    ``-2``, ``-3`` ... when another run started in the same second (made exclusively, so
    two runs never share one)."""
    if config.run_dir:
        path = Path(config.run_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    # A qualified env name (dist:env) or one with a slash must stay one directory name.
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in config.env)
    Path("runs").mkdir(exist_ok=True)
    for suffix in ("", *(f"-{n}" for n in range(2, 1000))):
        path = Path("runs") / f"{name}-{stamp}{suffix}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise RLFactoryError(f"runs/{name}-{stamp}-* already exist 999 times", hint="set run_dir")


def _device(config: RunConfig) -> Any:
    import torch

    if config.train.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.train.device)


def _attn_implementation(config: RunConfig, device: Any) -> str:
    choice = config.model.attn_implementation
    if choice != "auto":
        return choice
    if device.type == "cuda":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


def _load_policy(config: RunConfig, model_path: str | Path, device: Any, adapter: Path | None = None) -> Any:
    """The trained model: full weights, or the base model with LoRA adapters (new or resumed)."""
    import torch

    from .models import load_model

    model = load_model(model_path, dtype=config.model.dtype, device=device)
    if not config.model.lora.enabled:
        # dtype "auto" keeps the checkpoint's, often bf16: trained weights must be float32
        # or AdamW's small updates round away (bf16/fp16 are refused by the config).
        model.float()
    model.config._attn_implementation = _attn_implementation(config, device)  # noqa: SLF001
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


def _check_images(config: RunConfig, env: Any, model_path: str | Path, *, training: bool = True) -> Any:
    """The model's processor when it is a supported vision-language model, else None; a
    config error when the env shows the model images (its ``shows_images`` attribute) and
    this model, or the engine (``training``: ``rlf eval`` always runs locally), cannot take
    them."""
    from .models import _config, load_processor, vision_problem

    processor = load_processor(model_path)
    if not getattr(env, "shows_images", False):
        return processor
    problems = []
    problem = vision_problem(_config(model_path))
    if problem is not None:
        problems.append(f"model.name: the {config.env} env shows the model images, but {problem}")
    if training and config.engine == "ray":
        problems.append("engine: the ray engine's workers do not pass images to the model; use engine=local")
    if problems:
        raise ConfigError(problems, hint="use a LLaVA model (CLIP vision tower) with engine=local, or turn the "
                                         "env's images off (android: env_options.screenshot=false)")
    return processor


def _scheduler(optimizer: Any, config: RunConfig) -> Any:
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


def _make_backend(config: RunConfig, model_path: Path | str) -> Any:
    from .rollout import make_backend

    name = config.backend
    try:
        return make_backend(name, str(model_path), **config.backend_options)
    except TypeError as exc:
        raise ConfigError([f"backend_options: the {name!r} backend does not take these options "
                           f"({one_line(exc)})"], hint="vllm takes max_num_seqs, kv_cache_gib, ...; hf takes "
                                                    "max_batch_size, dtype, device") from exc


def _weights_for_backend(policy: Any) -> list[tuple[str, Any]]:
    """``(HF name, tensor)`` of the policy as the backend knows it (LoRA merged in)."""
    if not hasattr(policy, "peft_config"):
        return [(name, tensor.detach()) for name, tensor in policy.state_dict().items()]
    policy.merge_adapter()
    try:
        out = []
        for name, tensor in policy.state_dict().items():
            if "lora_" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            out.append((name, tensor.detach().clone()))
        return out
    finally:
        policy.unmerge_adapter()


def _plugin_versions() -> dict[str, str]:
    from .plugins import plugin_infos

    return {info.name: f"{info.distribution} {info.version}".strip() for info in plugin_infos()}


# --------------------------------------------------------------------------- metrics


def _tool_metrics(prefix: str, rollout: dict[str, float], trajectories: Sequence[Any]) -> dict[str, float]:
    """Per-trajectory and per-call rates from :func:`~rlfactory_core.rollout.rollout_metrics`."""
    n = max(rollout["rollout/trajectories"], 1.0)
    calls = rollout.get("rollout/tool_calls", 0.0)
    metrics = {
        f"{prefix}/calls_per_trajectory": calls / n,
        f"{prefix}/trajectories_with_calls": sum(1 for t in trajectories if t.tool_calls) / n,
        f"{prefix}/error_rate": rollout.get("rollout/tool_errors", 0.0) / calls if calls else 0.0,
        f"{prefix}/parse_errors_per_trajectory": rollout.get("rollout/parse_errors", 0.0) / n,
    }
    for key, count in rollout.items():
        if key.startswith("rollout/tool_errors/"):
            metrics[f"{prefix}/error_rate/{key.rsplit('/', 1)[1]}"] = count / calls if calls else 0.0
    return metrics


# --------------------------------------------------------------------------- tensors
#
# The rollout batch is a ``tensordict.TensorDict`` with batch size ``[B]`` (one row per
# trajectory, right-padded): ``input_ids``, ``attention_mask``, ``loss_mask``,
# ``sampler_logprobs`` and ``advantages`` ([B, L]), ``lengths`` and
# ``sequence_advantages`` ([B]); the update adds ``old_logprobs`` and ``ref_logprobs``.
# Micro-batches are row selections of it, narrowed to their longest row, and each is fed
# to the model padded or packed (``grpo.packing``).


def _turn_reward_tensor(trajectories: Sequence[Any], width: int) -> Any:
    """``[B, L]``: each turn's env reward on the last token of that model turn."""
    import torch

    out = torch.zeros(len(trajectories), width)
    for row, trajectory in enumerate(trajectories):
        position = len(trajectory.prompt_ids)
        model_turn = 0
        for segment in trajectory.segments:
            position += len(segment.token_ids)
            if segment.kind == "model":
                if model_turn < len(trajectory.turn_rewards) and segment.token_ids:
                    out[row, position - 1] += float(trajectory.turn_rewards[model_turn])
                model_turn += 1
    return out


def _build_batch(trajectories: Sequence[Any], rewards: Sequence[float], config: RunConfig, pad_id: int,
                 processor: Any = None) -> Any:
    """The rollout batch as a TensorDict (see above), with per-token advantages; with
    images (a vision-language model's ``processor``), their model inputs too."""
    import torch

    from .training.grpo import group_advantages, token_advantages
    from .rollout import to_tensordict

    td = to_tensordict(trajectories, pad_token_id=pad_id, layout="padded")
    if processor is not None and any(t.images for t in trajectories):
        _add_image_inputs(td, trajectories, processor)
    advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32), config.grpo.group_size,
                                  config.grpo.advantage_norm)
    turn_rewards = None
    if config.grpo.turn_rewards and any(any(t.turn_rewards) for t in trajectories):
        turn_rewards = _turn_reward_tensor(trajectories, td["input_ids"].shape[1])
    td["sampler_logprobs"] = td.pop("logprobs")
    td["advantages"] = token_advantages(advantages, td["loss_mask"], turn_rewards)
    td["sequence_advantages"] = advantages
    del td["position_ids"], td["prompt_lengths"]
    return td


def _add_image_inputs(td: Any, trajectories: Sequence[Any], processor: Any) -> None:
    """Each row's images as model inputs: ``image_inputs`` (a TensorDict of the image
    processor's tensors, ``[B, most images in a row, ...]``, zero-padded) and
    ``image_counts`` (``[B]``). Row ``r``'s first ``image_counts[r]`` entries are its images
    in the order of its image tokens."""
    import torch
    from tensordict import TensorDict

    from .rollout.render import image_inputs

    # A trajectory's images are those of its messages, which it gets only with its prompt's
    # ids; a row without image tokens (defensively) gets none.
    from .rollout.render import trajectory_ids

    image_token = getattr(processor, "image_token_id", None)
    rows = [t.images if t.images and (image_token is None or image_token in trajectory_ids(t)) else []
            for t in trajectories]
    if not any(rows):
        return
    per_row = [image_inputs(processor, images) if images else None for images in rows]
    template = next(p for p in per_row if p is not None)
    most = max(len(images) for images in rows)
    padded = {}
    for key, value in template.items():
        out = torch.zeros((len(trajectories), most, *value.shape[1:]), dtype=value.dtype)
        for row, inputs in enumerate(per_row):
            if inputs is not None:
                if tuple(inputs[key].shape[1:]) != tuple(value.shape[1:]):
                    raise ModelError(f"the image processor gives {key} of different shapes per image "
                                     f"({tuple(inputs[key].shape[1:])} vs {tuple(value.shape[1:])})",
                                     hint="training takes models whose processor resizes every image to one "
                                          "shape (LLaVA's CLIP processor)")
                out[row, :len(inputs[key])] = inputs[key]
        padded[key] = out
    td["image_inputs"] = TensorDict(padded, batch_size=[len(trajectories)])
    td["image_counts"] = torch.tensor([len(images) for images in rows], dtype=torch.int64)


def _rows_of(batch: Any, rows: Sequence[int]) -> Any:
    """The micro-batch of ``rows``: a TensorDict narrowed to its longest row."""
    micro = batch[list(rows)]
    width = int(micro["lengths"].max())
    images = micro.pop("image_inputs", None)  # per image, not per token: not narrowed
    micro = micro.apply(lambda t: t[:, :width] if t.dim() > 1 else t)
    if images is not None:
        micro["image_inputs"] = images
    return micro


def _micro_image_inputs(micro: Any, device: Any, dtype: Any) -> dict[str, Any] | None:
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


def _micro_batches(rows: Sequence[int], lengths: Any, token_budget: int, packed: bool = False) -> list[list[int]]:
    """``rows`` grouped by length (so that little padding is computed), at most
    ``token_budget`` tokens each (at least one row): counted padded (rows x longest row)
    or, ``packed``, as the sum of the rows' lengths."""
    ordered = sorted(rows, key=lambda r: int(lengths[r]))
    batches: list[list[int]] = []
    current: list[int] = []
    for row in ordered:
        candidate = [int(lengths[r]) for r in current] + [int(lengths[row])]
        tokens = sum(candidate) if packed else max(candidate) * len(candidate)
        if current and tokens > token_budget:
            batches.append(current)
            current = []
        current.append(row)
    if current:
        batches.append(current)
    return batches


def _use_packing(config: RunConfig, attn_implementation: str) -> bool:
    """Packing pays only where attention skips the masked-out blocks: flash-attention's
    varlen path. SDPA applies a packed batch's block-diagonal mask to the full
    [T, T] score matrix, which on this CPU made a forward of 4 length-sorted
    trajectories ~20% slower than padding them (see ``grpo.packing``)."""
    if config.grpo.packing == "auto":
        return attn_implementation.startswith("flash_attention")
    return config.grpo.packing == "on"


def _token_logprobs(model: Any, micro: Any, *, bf16: bool, entropy: bool, entropy_grad: bool = False,
                    packed: bool = False, temperature: float = 1.0) -> tuple[Any, Any]:
    """``[b, l]`` logprobs (and entropies) under ``model`` of the tokens of the micro-batch
    ``micro`` where its ``loss_mask`` is 1; zeros elsewhere. Only the masked positions'
    logits are normalised. The entropy carries a gradient only with ``entropy_grad`` (an
    entropy bonus).

    ``temperature``: the sampling temperature of the rollout. The policy that sampled the
    tokens is ``softmax(logits / T)``, and that is the policy the ratio, the KL and the
    sampler comparison are about (as in verl and TRL); the backends report their logprobs
    the same way (``rollout.backend``). Greedy (``T`` below the backends' threshold) scores
    the raw logits, as the backends do.

    ``packed``: the rows' real tokens are concatenated into one row, with positions
    restarting at each trajectory and no attention mask; transformers then keeps the
    trajectories apart (flash-attention's varlen kernel, or a block-diagonal mask), and no
    padding token is computed. The results are scattered back to the padded layout."""
    import torch

    from .training.grpo import entropy_from_logits

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
    images = _micro_image_inputs(micro, device, next(model.parameters()).dtype)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)
    # Token t is predicted from position t - 1. Packed, position t - 1 may be the end of the
    # previous trajectory, but only for a trajectory's first token, which is a prompt token
    # and never scored.
    targets = scored[:, 1:].bool()
    with autocast:
        if isinstance(model, torch.nn.Module) and getattr(model, "computes_scored_logits", False):
            chosen = model(model_ids, model_mask, model_positions, targets).float()  # an FSDP root (ray engine)
        else:
            chosen = _scored_logits(model, model_ids, model_mask, model_positions, targets, images).float()
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


def _scored_logits(model: Any, input_ids: Any, attention_mask: Any, position_ids: Any, targets: Any,
                   images: dict[str, Any] | None = None) -> Any:
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
    if decoder is not None:
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False).last_hidden_state
        return head(hidden[:, :-1][targets])
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits
    return logits[:, :-1][targets]


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


@dataclass(frozen=True)
class _DataParallel:
    """This process's place in a trainer group (the ray engine): every rank holds the whole
    batch and takes every ``world``-th micro-batch. FSDP2 runs collectives in each forward
    and backward, so every rank runs the same number of them: a rank with fewer real
    micro-batches runs a zero-weight one."""

    rank: int
    world: int

    def rounds(self, micro_batches: list[list[int]]) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches as ``(rows, real)``; ``real`` is False for padding."""
        mine = micro_batches[self.rank::self.world]
        count = math.ceil(len(micro_batches) / self.world)
        return [(mine[i], True) if i < len(mine) else (micro_batches[0], False) for i in range(count)]


def _forward_no_grad(model: Any, batch: Any, rows: list[int], config: RunConfig, packed: bool,
                     dp: _DataParallel | None = None) -> Any:
    import torch

    out = torch.zeros(batch["loss_mask"].shape, dtype=torch.float32)
    micro_batches = _micro_batches(rows, batch["lengths"], config.grpo.micro_batch_tokens, packed)
    with torch.no_grad():
        for micro_rows, real in dp.rounds(micro_batches) if dp else [(m, True) for m in micro_batches]:
            micro = _rows_of(batch, micro_rows)
            logprobs, _ = _token_logprobs(model, micro, bf16=config.train.bf16, entropy=False, packed=packed,
                                          temperature=config.rollout.sampling.temperature)
            if real:
                out[micro_rows, :logprobs.shape[1]] = logprobs.cpu()
    if dp:  # each rank filled its rows, zeros elsewhere
        torch.distributed.all_reduce(out)
        # FSDP2 keeps per-iteration state that only a backward clears; left over from
        # forwards without one, it kept the next backward from reducing the root's
        # gradients (embeddings, final norm: None), so clear it.
        model.reset_iter_state()
    return out


def _update_policy(model: Any, reference: Any, optimizer: Any, batch: Any, config: RunConfig, *,
                   step: int = 0, packed: bool = False, dp: _DataParallel | None = None) -> dict[str, float]:
    """The optimizer steps on one rollout batch (a TensorDict, see above); their statistics.

    ``dp``: one rank of an FSDP2 trainer group (the ray engine). The mini-batches and their
    loss normalisers are the whole batch's, as here; each rank back-propagates its share of
    the micro-batches and FSDP sums the ranks' gradients (the ray engine sets it to sum, not
    average), so the gradient, the clipping and the step are the ones a single process
    computes (tested for parity)."""
    import torch

    from .training.grpo import aggregate, kl_penalty, masked_mean, policy_loss, truncated_importance_weights

    g = config.grpo
    rows = list(range(batch.batch_size[0]))
    on_policy = g.epochs * g.mini_batches == 1
    if not on_policy:
        batch["old_logprobs"] = _forward_no_grad(model, batch, rows, config, packed, dp)
    if g.kl_coef > 0:
        if reference is None:  # LoRA: the base model is the adapters switched off
            with model.disable_adapter():
                batch["ref_logprobs"] = _forward_no_grad(model, batch, rows, config, packed, dp)
        else:
            batch["ref_logprobs"] = _forward_no_grad(reference, batch, rows, config, packed, dp)

    sums: Counter[str] = Counter()
    counts: Counter[str] = Counter()

    def record(key: str, value: Any, weight: float = 1.0) -> None:
        sums[key] += float(value) * weight
        counts[key] += weight

    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    ranks = dp.world if dp else 1
    shuffler = random.Random(f"{config.train.seed}:minibatches:{step}")
    for _epoch in range(g.epochs):
        order = list(rows)
        shuffler.shuffle(order)
        size = math.ceil(len(order) / g.mini_batches)
        for start in range(0, len(order), size):
            mini = order[start:start + size]
            num_tokens = float(batch["loss_mask"][mini].sum())
            if num_tokens == 0:
                continue
            optimizer.zero_grad(set_to_none=True)
            micro_batches = _micro_batches(mini, batch["lengths"], g.micro_batch_tokens, packed)
            for micro_rows, real in dp.rounds(micro_batches) if dp else [(m, True) for m in micro_batches]:
                micro = _rows_of(batch, micro_rows).to(device)
                mask = micro["loss_mask"]
                logprobs, entropies = _token_logprobs(model, micro, bf16=config.train.bf16, entropy=True,
                                                      entropy_grad=g.entropy_coef > 0, packed=packed,
                                                      temperature=config.rollout.sampling.temperature)
                old = logprobs.detach() if on_policy else micro["old_logprobs"]
                sampler = micro["sampler_logprobs"]
                weights = truncated_importance_weights(old, sampler, g.tis_cap) if g.tis_cap else None
                per_token, stats = policy_loss(logprobs, old, micro["advantages"], mask, clip_low=g.clip_low,
                                               clip_high=g.clip_high, weights=weights)
                if g.kl_coef > 0:
                    kl = kl_penalty(logprobs, micro["ref_logprobs"], g.kl_estimator)
                    per_token = per_token + g.kl_coef * kl
                if g.entropy_coef > 0:
                    per_token = per_token - g.entropy_coef * entropies
                loss = aggregate(per_token, mask, g.loss_agg, num_tokens=num_tokens, num_sequences=len(mini))
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
                diff = (old - sampler).abs()
                record("train/sampler_logprob_diff", masked_mean(diff, mask), tokens)
                record("train/sampler_kl", masked_mean(torch.exp(sampler - old) - (sampler - old) - 1, mask), tokens)
                if weights is not None:
                    record("train/tis_weight_mean", masked_mean(weights, mask), tokens)
                sums["train/trained_tokens"] += tokens
            grad_norm = torch.nn.utils.clip_grad_norm_(params, config.train.max_grad_norm or float("inf"))
            if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2: the norm over all shards
                grad_norm = grad_norm.full_tensor()
            # the same on every rank: counted once when the ranks' statistics are merged
            sums["train/grad_norm"] += float(grad_norm) / ranks
            counts["train/grad_norm"] += 1 / ranks
            optimizer.step()
            counts["train/loss"] += 1 / ranks
            sums["train/optimizer_steps"] += 1 / ranks
    if dp:
        sums, counts = _merge_rank_statistics(sums, counts)
    out = {}
    for key, total in sums.items():
        if key in ("train/ratio_max", "train/trained_tokens", "train/optimizer_steps"):
            out[key] = total
        elif counts[key]:
            out[key] = total / counts[key]
    if "train/optimizer_steps" in out:
        out["train/optimizer_steps"] = round(out["train/optimizer_steps"])
    out.setdefault("train/kl", 0.0)
    return out


def _merge_rank_statistics(sums: Counter[str], counts: Counter[str]) -> tuple[Counter[str], Counter[str]]:
    """Every rank's sums and weights added up (``train/ratio_max``: the largest)."""
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


def _return_freed_memory() -> None:
    """Give the memory an update freed back to the OS (glibc keeps freed pages otherwise,
    and RSS only grows); a no-op where libc has no ``malloc_trim``."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------- rollout helpers


def _rollout_config(config: RunConfig, step: int, *, temperature: float | None = None) -> Any:
    rollout = config.rollout.model_copy(deep=True)
    base = rollout.sampling.seed if rollout.sampling.seed is not None else config.train.seed * 1_000_003
    rollout.sampling.seed = base + step * 10_007
    if temperature is not None:
        rollout.sampling.temperature = temperature
    return rollout


async def _run_eval(step: int, samples: Sequence[Any], engine: Any, config: RunConfig, out_dir: Path | None,
                    tokenizer: Any) -> dict[str, float]:
    from .rollout import rollout_metrics

    trajectories, scored, _ = await engine.rollout(
        samples, _rollout_config(config, -1, temperature=config.eval.temperature), group_size=1, rewards="eval")
    metrics = scored.metrics("eval/reward")
    rollout_stats = rollout_metrics(trajectories)
    metrics.update(_tool_metrics("eval/tools", rollout_stats, trajectories))
    metrics.update({k.replace("rollout/", "eval/rollout/"): v for k, v in rollout_stats.items()})
    if out_dir is not None and config.eval.save_samples:
        _save_samples(out_dir / f"step-{step:06d}.jsonl", trajectories[:config.eval.save_samples],
                      samples, scored, tokenizer)
    return metrics


def _save_samples(path: Path, trajectories: Sequence[Any], samples: Sequence[Any], scored: Any,
                  tokenizer: Any) -> None:
    """Trajectories as readable text: the whole conversation as the model saw it, with
    each reward's score and any reward errors."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row, (trajectory, sample) in enumerate(zip(trajectories, samples)):
            ids = list(trajectory.prompt_ids) + [i for s in trajectory.segments for i in s.token_ids]
            f.write(json.dumps({
                "sample_id": trajectory.sample_id, "reward": scored.totals[row], "rewards": scored.components[row],
                "reward_errors": trajectory.metadata.get("reward_errors", []),
                "final_answer": trajectory.final_answer,
                "expected": sample.get("answer", sample.get("answers")) if hasattr(sample, "get") else None,
                "stop_reason": trajectory.stop_reason, "turns": trajectory.num_turns,
                "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in trajectory.tool_calls],
                "text": tokenizer.decode(ids),
            }, ensure_ascii=False) + "\n")


class _NotScoredHere:
    """The driver's placeholder for a reward the ray engine scores on its judge pool."""

    description = "scored on the ray judge pool"

    def __init__(self, name: str):
        self.name = name

    def score(self, trajectory: Any, sample: Any) -> None:
        raise RLFactoryError(f"the {self.name!r} reward is scored on the ray judge pool, not in the driver")


# --------------------------------------------------------------------------- engines
#
# The loop below drives an engine: ``rollout`` (trajectories and their rewards), ``update``
# (the optimizer steps on a batch), ``sync_weights`` (the new policy to the generation
# backends) and ``save`` (a checkpoint). ``_LocalEngine`` does all of it in this process;
# ``rlfactory_core.ray_engine.RayEngine`` places the same work on Ray actors.


class _LocalRollout:
    """Rollout and rewards with one generation backend, in this process (also what each of
    the ray engine's rollout workers runs)."""

    def __init__(self, task: Task, backend: Any, chat: Any):
        self.task, self.backend, self.chat = task, backend, chat

    async def rollout(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                      rewards: str = "train") -> tuple[list[Any], Any, dict[str, float]]:
        """``group_size`` trajectories per sample, scored by the run's ``train`` or ``eval``
        rewards; also the phases' times (``time/rollout``, ``time/reward``)."""
        from .rollout import rollout

        t = time.perf_counter()
        trajectories = await rollout(samples, env=self.task.env, parser=self.task.parser,
                                     tool_manager=self.task.tool_manager, backend=self.backend, chat=self.chat,
                                     config=rollout_config, group_size=group_size)
        times = {"time/rollout": time.perf_counter() - t}
        t = time.perf_counter()
        layer = self.task.rewards if rewards == "train" else self.task.eval_rewards
        scored = await layer.score(trajectories, [s for s in samples for _ in range(group_size)])
        times["time/reward"] = time.perf_counter() - t
        return trajectories, scored, times


class _LocalEngine:
    """The policy (and the reference model), its optimizer, and the generation backend, all
    in this process."""

    def __init__(self, config: RunConfig, task: Task, tokenizer: Any, *, base_path: Path,
                 checkpoint: Path | None, processor: Any = None):
        self.config, self.task, self.tokenizer, self.processor = config, task, tokenizer, processor
        self.base_path, self.checkpoint = base_path, checkpoint

    async def start(self) -> dict[str, Any] | None:
        """Load the models and the backend; the checkpoint's state (None for a new run)."""
        import torch

        from .training.checkpoint import load_checkpoint
        from .models import load_model
        from .rollout import ChatTemplate

        config, checkpoint = self.config, self.checkpoint
        device = _device(config)
        model_path = checkpoint / "model" if checkpoint else self.base_path
        adapter = checkpoint / "adapter" if checkpoint and (checkpoint / "adapter").exists() else None
        self.policy = _load_policy(config, self.base_path if adapter else model_path, device, adapter)
        self.reference = None
        if config.grpo.kl_coef > 0 and not config.model.lora.enabled:
            self.reference = load_model(self.base_path, dtype=config.model.dtype, device=device).eval()
            self.reference.config._attn_implementation = _attn_implementation(config, device)  # noqa: SLF001
            self.reference.requires_grad_(False)
        self.packed = _use_packing(config, _attn_implementation(config, device))
        # Every update on one thread: glibc gives each thread its own malloc arena, and the
        # gigabytes an update frees would otherwise stay behind in whichever arena the executor's
        # thread of the moment used (a deepsearch run grew ~3 GB a step and was OOM-killed).
        # A daemon thread: a run stopped without saving exits without waiting for the update.
        self.train_thread = DaemonThreadPool(1, thread_name_prefix="rlf-train")
        self.optimizer = torch.optim.AdamW([p for p in self.policy.parameters() if p.requires_grad],
                                           lr=config.train.lr, betas=tuple(config.train.betas),
                                           weight_decay=config.train.weight_decay)
        self.scheduler = _scheduler(self.optimizer, config)
        state = None
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, optimizer=self.optimizer, scheduler=self.scheduler)
        self.backend = _make_backend(config, model_path)
        if hasattr(self.backend, "start"):
            await self.backend.start()
        self.generation = _LocalRollout(self.task, self.backend, ChatTemplate(self.tokenizer, processor=self.processor))
        return state

    async def rollout(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                      rewards: str = "train") -> tuple[list[Any], Any, dict[str, float]]:
        return await self.generation.rollout(samples, rollout_config, group_size=group_size, rewards=rewards)

    async def update(self, batch: Any, step: int) -> dict[str, float]:
        stats = await asyncio.get_running_loop().run_in_executor(
            self.train_thread, functools.partial(_update_policy, self.policy, self.reference, self.optimizer,
                                                 batch, self.config, step=step, packed=self.packed))
        _return_freed_memory()
        self.scheduler.step()
        stats["train/lr"] = self.scheduler.get_last_lr()[0]
        return stats

    async def sync_weights(self) -> dict[str, float]:
        await self.backend.update_weights(_weights_for_backend(self.policy))
        return {}

    def save(self, run_dir: Path, step: int, *, state: dict[str, Any], tokenizer: Any) -> None:
        from .training.checkpoint import save_checkpoint

        save_checkpoint(run_dir, step, model=self.policy, tokenizer=tokenizer, optimizer=self.optimizer,
                        scheduler=self.scheduler, state=state, config=self.config.model_dump(mode="json"),
                        keep=self.config.checkpoint.keep)

    async def close(self) -> None:
        if hasattr(self, "train_thread"):
            self.train_thread.shutdown()
        if hasattr(self, "backend"):
            await self.backend.close()


# --------------------------------------------------------------------------- the loop


def _eval_summary(metrics: dict[str, Any]) -> str:
    """``reward R, accuracy A``; no accuracy when no reward judges correctness."""
    text = f"reward {metrics['eval/reward/mean']:.3f}"
    if "eval/reward/accuracy" in metrics:
        text += f", accuracy {metrics['eval/reward/accuracy']:.3f}"
    return text


def _say(console: Any, text: str) -> None:
    """A line for the user at once (a stop request's answer), above the live view."""
    from rich.text import Text

    if console is None:
        from rich.console import Console

        console = Console(stderr=True)
    console.print(Text(text, style="bold yellow"), soft_wrap=True)


def _interrupted(stop: Any, run_dir: Path, saved: int) -> TrainingInterrupted:
    """The error that ends a stopped run: what was saved, how to go on, the exit code of the signal."""
    resume = f"; continue with `rlf train --resume {run_dir}`"
    if stop.hard:
        message = "without saving: " + (f"the newest checkpoint is step {saved}{resume}" if saved
                                        else "the run has no checkpoint")
    elif saved:
        message = f"step {saved} is saved{resume}"
    else:
        message = "no step had finished, nothing to save"
    error = TrainingInterrupted(message)
    error.exit_code = 128 + int(stop.signum or signal.SIGINT)
    return error


def _uncancel() -> None:
    """Forget the cancellation a stop request caused, so the clean-up's own timeouts and
    task groups work as usual."""
    task = asyncio.current_task()
    while task is not None and task.cancelling():
        task.uncancel()


async def _train(config: RunConfig, *, resume: Path | None, console: Any) -> Path:
    import torch
    import yaml

    from .training.checkpoint import rng_state, set_rng_state, latest_checkpoint
    from .logs import LOG_FILE, log_to
    from .metrics import LiveView, MetricsLogger
    from .models import load_tokenizer, resolve_model
    from .rollout import rollout_metrics
    from .stopping import PhaseDropped, RunStopper

    # ---- the task, the data and the model path: every check that needs them, before the
    # run is announced or anything written (the config's own checks ran in train()).
    checkpoint = latest_checkpoint(resume) if resume is not None else None
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    random.seed(config.train.seed)
    torch.manual_seed(config.train.seed)
    pooled = set(config.ray.judge.rewards) if config.engine == "ray" else set()
    # The ray engine's rollout workers score; here the task gives the data and checks the
    # config, so judge-pool rewards (a judge model) are not loaded in this process.
    task = build_task(config, make_reward=lambda spec: _NotScoredHere(spec.name) if spec.name in pooled else None)
    try:
        train_samples = load_samples(config, task.env, "train", config.data.train_size)
        eval_samples = load_samples(config, task.env, "test", config.data.eval_size)
        if not train_samples:
            raise ConfigError(["data: the training set is empty"])
        base_path = resolve_model(config.model.name)  # an embedded name is prepared (converted once) here
        tokenizer = load_tokenizer(base_path)
        processor = _check_images(config, task.env, base_path)
    except BaseException:
        await task.close()  # an MCP env's servers, a judge's client
        raise

    # ---- write the run directory, announce
    run_dir = resume if resume is not None else _new_run_dir(config)
    if console is not None:
        from rich.markup import escape

        console.print(f"[bold]rlf train[/] env [cyan]{escape(config.env)}[/], model [cyan]"
                      f"{escape(config.model.name)}[/], {config.train.steps} steps of {config.grpo.prompts_per_step} "
                      f"prompts x {config.grpo.group_size}, run in [cyan]{escape(str(run_dir))}[/]"
                      + (f" (resuming after {checkpoint.name})" if checkpoint is not None else ""), highlight=False,
                      soft_wrap=True)
    log_to(run_dir / LOG_FILE)  # the engines' output, captured by the CLI until now
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    (run_dir / "plugins.yaml").write_text(yaml.safe_dump(_plugin_versions(), sort_keys=True))

    # ---- the engine (model, optimizer, generation)
    if config.engine == "ray":
        from .ray_engine import RayEngine

        engine: Any = RayEngine(config, base_path=base_path, checkpoint=checkpoint, console=console)
    else:
        engine = _LocalEngine(config, task, tokenizer, base_path=base_path, checkpoint=checkpoint,
                              processor=processor)
    # From here on a stop request is answered (rlfactory_core.stopping): first the start.
    stop = RunStopper(functools.partial(_say, console)).install()
    try:
        resumed = await engine.start()
    except BaseException as exc:
        stop.closing()
        if stop.requested and isinstance(exc, asyncio.CancelledError):
            _uncancel()
        try:
            await engine.close()
            await task.close()
        finally:
            stop.remove()
        if stop.requested and isinstance(exc, asyncio.CancelledError):
            raise _interrupted(stop, run_dir, 0 if checkpoint is None else int(checkpoint.name.split("-")[1])) \
                from None
        raise
    state = {"position": 0}
    start_step = 0
    if resumed is not None:
        state, start_step = resumed, int(resumed["step"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    logger = MetricsLogger(run_dir, tensorboard=config.logging.tensorboard,
                           wandb_project=config.logging.wandb_project, wandb_entity=config.logging.wandb_entity,
                           run_name=run_dir.name, config=config.model_dump(mode="json"),
                           resume_step=start_step if checkpoint else None)
    live = {"auto": None, "on": True, "off": False}[config.logging.live]
    view = LiveView(config.train.steps, start_step=start_step, enabled=live, console=console)
    G = config.grpo.group_size
    last_saved = start_step
    step = start_step
    rng_before_step = None
    finished_step, last_metrics = start_step, {}
    notify("rlfactory_on_train_start", config=config)

    def save(at_step: int) -> None:
        nonlocal last_saved
        # A vision-language model's processor saves its tokenizer and its image processor.
        engine.save(run_dir, at_step, state={"position": state["position"]}, tokenizer=processor or tokenizer)
        last_saved = at_step

    try:
        with view:
            if start_step == 0:
                view.phase("eval")
                metrics = await stop.droppable(
                    _run_eval(0, eval_samples, engine, config, run_dir / "samples", tokenizer))
                logger.log(0, metrics)
                view.message(f"eval before training: {_eval_summary(metrics)}, "
                             f"tool calls/trajectory {metrics['eval/tools/calls_per_trajectory']:.2f}")
            for step in range(start_step + 1, config.train.steps + 1):
                if stop.requested:
                    raise PhaseDropped
                stop.at(step, finished=finished_step)
                # A dropped step leaves the RNGs as they were before it (its checkpoint says so).
                rng_before_step = rng_state()
                times: dict[str, float] = {}
                started = time.perf_counter()

                # 1-2. prompts and rollout
                view.phase("rollout")
                indices = batch_indices(len(train_samples), config.grpo.prompts_per_step, config.train.seed,
                                         state["position"], shuffle=config.data.shuffle)
                samples = [train_samples[i] for i in indices]
                trajectories, scored, rollout_times = await stop.droppable(engine.rollout(
                    samples, _rollout_config(config, step), group_size=G, rewards="train"))
                times.update(rollout_times)  # time/rollout, time/reward
                totals = scored.totals

                # 4-6. advantages and the update (not droppable: half an update cannot be undone;
                # from here on a stop request finishes the step and saves it)
                rng_before_step = None
                view.phase("train")
                t = time.perf_counter()
                batch = _build_batch(trajectories, totals, config, pad_id, processor)
                train_stats = await engine.update(batch, step)
                sequence_advantages, batch_tokens = batch["sequence_advantages"], float(batch["attention_mask"].sum())
                del batch
                state["position"] += len(indices)
                stop.updated()
                times["time/train"] = time.perf_counter() - t

                # 7. weight sync (not when stopping: no generation follows)
                sync_metrics: dict[str, float] = {}
                if not stop.requested:
                    view.phase("weight sync")
                    t = time.perf_counter()
                    sync_metrics = await engine.sync_weights()
                    times["time/weight_sync"] = time.perf_counter() - t

                # 8. metrics and warnings
                metrics = scored.metrics("reward")
                groups = [totals[i:i + G] for i in range(0, len(totals), G)]
                metrics["reward/constant_groups"] = sum(1 for grp in groups if max(grp) == min(grp)) / len(groups)
                adv = sequence_advantages
                metrics.update({"advantage/mean": float(adv.mean()), "advantage/std": float(adv.std()),
                                "advantage/max": float(adv.max()), "advantage/min": float(adv.min())})
                metrics.update(train_stats)
                metrics.update(sync_metrics)
                rollout_stats = rollout_metrics(trajectories)
                metrics.update(rollout_stats)
                metrics.update(_tool_metrics("tools", rollout_stats, trajectories))
                n = len(trajectories)
                metrics["time/generation_per_trajectory"] = sum(t_.metadata.get("generation_s", 0.0)
                                                                for t_ in trajectories) / n
                metrics["time/tools_per_trajectory"] = sum(t_.metadata.get("tool_s", 0.0) for t_ in trajectories) / n
                metrics["throughput/rollout_tokens_per_s"] = (
                    metrics["rollout/model_tokens_mean"] * n / max(times["time/rollout"], 1e-9))
                metrics["throughput/train_tokens_per_s"] = (
                    batch_tokens * config.grpo.epochs / max(times["time/train"], 1e-9))
                if task.offers_tools and config.logging.no_tool_call_warning and metrics["rollout/tool_calls"] == 0:
                    view.warn(f"step {step}: the model made no tool call in "
                                 f"{n} trajectories although the env offers tools; check the parser "
                                 f"({config.parser}) and the prompt, or add a format reward / few-shot turns")
                if metrics["reward/constant_groups"] == 1.0:
                    view.warn(f"step {step}: every group's rewards are constant "
                                 f"(all {totals[0]:g}): nothing to learn from this step; make the task easier or "
                                 "the reward denser, or raise grpo.group_size")

                # 9. eval and checkpoint (when stopping: no eval, and the step is saved)
                if config.eval.every and step % config.eval.every == 0 or step == config.train.steps:
                    view.phase("eval")
                    t = time.perf_counter()
                    with contextlib.suppress(PhaseDropped):  # the step is finished without its eval
                        metrics.update(await stop.droppable(_run_eval(step, eval_samples, engine, config,
                                                                      run_dir / "samples", tokenizer)))
                        times["time/eval"] = time.perf_counter() - t
                        view.message(f"eval at step {step}: {_eval_summary(metrics)}")
                if step % config.checkpoint.every == 0 or step == config.train.steps or stop.requested:
                    view.phase("checkpoint")
                    t = time.perf_counter()
                    save(step)
                    times["time/checkpoint"] = time.perf_counter() - t
                times["time/step"] = time.perf_counter() - started
                metrics.update(times)
                metrics["samples"] = [str(s.get("id", "")) if hasattr(s, "get") else "" for s in samples]
                logger.log(step, metrics)
                view.update(step, metrics)
                finished_step = step
                last_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
                notify("rlfactory_on_train_step_end", step=step, metrics=dict(last_metrics))
    except (PhaseDropped, asyncio.CancelledError):
        if not stop.requested:  # cancelled by the caller, not by a signal
            raise
        _uncancel()
        # The model is that of the last finished step: a dropped step's update never ran.
        if not stop.hard and finished_step > last_saved:
            if rng_before_step is not None:
                set_rng_state(rng_before_step)
            save(finished_step)
        raise _interrupted(stop, run_dir, last_saved) from None
    finally:
        stop.closing()  # a signal now says what is happening: vLLM's shutdown takes seconds
        try:
            notify("rlfactory_on_train_end", step=finished_step, metrics=dict(last_metrics))
            logger.close()
            await engine.close()
            await task.close()
        finally:
            stop.remove()
    return run_dir


async def _evaluate_only(config: RunConfig, model: str, *, split: str, size: int | None, report_dir: Path | None,
                         console: Any) -> dict[str, Any]:
    import json

    from .models import load_tokenizer
    from .preflight import resolve_eval_model
    from .rollout import ChatTemplate

    # a run's newest checkpoint, a checkpoint, an embedded name (prepared), a directory or a hub id
    path = resolve_eval_model(model)
    task = build_task(config)
    try:
        # The whole split unless a size is given: `rlf eval` reports on the split, not on the
        # data.eval_size subset that periodic evaluation during training uses.
        samples = load_samples(config, task.env, split, size)
        tokenizer = load_tokenizer(path)
        processor = _check_images(config, task.env, path, training=False)
        backend = _make_backend(config, path)
    except BaseException:
        await task.close()
        raise
    try:
        if hasattr(backend, "start"):
            await backend.start()
        chat = ChatTemplate(tokenizer, processor=processor)
        metrics = await _run_eval(0, samples, _LocalRollout(task, backend, chat), config,
                                  report_dir / "samples" if report_dir else None, tokenizer)
    finally:
        await backend.close()
        await task.close()
    report = {"model": str(path), "env": config.env, "split": split, "samples": len(samples),
              "metrics": metrics}
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "report.json").write_text(json.dumps(report, indent=2))
    return report
