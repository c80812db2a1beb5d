"""The GPU check: proves the CUDA path (correctness) and measures it (speed), in one command.

    PYTHONPATH=/tmp/site:. python3 bench/gpu.py            # on a GPU machine (about 4 minutes on an H100 or H200)
    .venv/bin/python bench/gpu.py --quick                  # the short CPU form (tests/test_gpu_check.py)

On a GPU machine without network, first install the wheels ``scripts/gpu_wheels.sh`` put in
``.whl/`` (``pip install --no-index --no-deps --target /tmp/site .whl/*.whl``).

No checkpoint is needed: the models are built from the configs of real architectures
(SmolLM2-135M's Llama, Qwen2.5-0.5B's Qwen2) with random weights: the layers at the usual
``initializer_range`` (0.02), the embeddings and head 4x larger, so that the next-token
distributions are far from uniform (the table reports their mean entropy): a logprob
comparison on a uniform distribution would prove little.
Scaling every layer up instead (``initializer_range=0.08``) gives the same entropy but a
chaotic network: rounding its weights to bf16 alone moved logprobs by 0.12 on average (0.011
with the scaling used here, SmolLM2's shape, measured on CPU), which would blame bf16 autocast
for what is the random model's sensitivity.

Sections (``--sections`` picks some); each runs on its own, and the JSON (``--out``) is
rewritten after each, so one run yields every result it can even when a section fails:

* ``environment``: device, versions.
* ``sampler``: the hf backend's sampled tokens' logprobs against a full forward of each
  prompt + completion, alone and unpadded (float32 weights; bf16 weights reported too); and
  its greedy tokens against the full forward's argmax, token for token.
* ``trainer``: the trainer's logprobs (:func:`rlfactory_core.training.logprobs.token_logprobs`)
  of those tokens against the sampler's: float32 padded and packed, bf16 autocast padded,
  packed (SDPA), and packed with ``flex_attention`` on CUDA.
* ``grpo_step``: one GRPO update (:func:`rlfactory_core.training.update.update_policy`) on
  those trajectories, padded and packed: finite loss, the same gradient norm both ways, every
  parameter tensor moved.
* ``families``: ``sampler``, ``trainer`` (without flex_attention) and ``grpo_step`` again on
  each model family's architecture (Llama 3, Qwen3, gpt-oss, DeepSeek V3) at a few layers;
  the table shows a summary line per family, the JSON every figure.
* ``fsdp``: ``torchrun --nproc_per_node 1`` (NCCL on CUDA, gloo on CPU): the same update on
  the FSDP2-sharded policy (:mod:`rlfactory_core.training.fsdp`) against the local engine's,
  float32 and bf16 autocast. One rank holds every shard, so the weights must come out the
  same to float32 rounding, not merely close.
* ``generation_speed``: the hf backend's generated tokens/s at batch 1 / 32 / 256.
* ``train_speed``: training (forward + backward) tokens/s with bf16 autocast over rows of
  mixed length: padded (SDPA) against packed (SDPA's block-diagonal mask, and
  ``flex_attention``, which skips the masked blocks, on CUDA); flash-attn when installed.
* ``weight_sync``: the share of a step (generation, update, weight sync) spent copying the
  trainer's weights into the backend.

bf16 on a GPU is not bit-exact: each comparison reports max and mean |delta| and passes
under the tolerance printed beside it. The short CPU form runs every section on a tiny model
with fewer and shorter rows and no ``torch.compile`` path (no flex_attention).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing it (the GPU machine)
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

# The architectures' shapes (their published configs); the weights are random.
ARCHITECTURES = {
    "tiny": ("llama", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)),
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                                   rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                   rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    # The model families' architectures (rlfactory_core.testing.TINY_ARCHITECTURES), each with
    # its own attention and routing at a few layers: their vocabularies, head layouts and
    # special parts (Qwen3's q/k norms; gpt-oss's alternating sliding-window and full layers,
    # attention sinks and top-k experts; DeepSeek V3's latent attention, a dense layer, then
    # routed and shared experts). Real checkpoints of these are 0.6B-671B parameters.
    "llama3-family": ("llama", dict(vocab_size=128256, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                                    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192,
                                    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "qwen3-family": ("qwen3", dict(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                                   max_position_embeddings=8192, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True)),
    "gpt-oss-family": ("gpt_oss", dict(vocab_size=201088, hidden_size=512, intermediate_size=512, num_hidden_layers=4,
                                       num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                       num_local_experts=8, num_experts_per_tok=2, sliding_window=32,
                                       layer_types=["sliding_attention", "full_attention"] * 2,
                                       tie_word_embeddings=False)),
    "deepseek-v3-family": ("deepseek_v3", dict(vocab_size=129280, hidden_size=512, intermediate_size=1536,
                                               num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                                               n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                                               n_group=1, topk_group=1, moe_intermediate_size=256,
                                               first_k_dense_replace=1, q_lora_rank=256, kv_lora_rank=128,
                                               qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64,
                                               max_position_embeddings=8192, tie_word_embeddings=False)),
}
# The short CPU form: the same four architectures, tiny (rlfactory_core.testing.build_tiny_model's shapes).
_TINY_COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
ARCHITECTURES.update({
    "tiny-llama3": ("llama", dict(_TINY_COMMON, num_key_value_heads=1, max_position_embeddings=4096)),
    "tiny-qwen3": ("qwen3", dict(_TINY_COMMON, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096)),
    "tiny-gpt-oss": ("gpt_oss", dict(_TINY_COMMON, num_key_value_heads=1, head_dim=32, num_local_experts=4,
                                     num_experts_per_tok=2, sliding_window=8,
                                     layer_types=["sliding_attention", "full_attention"])),
    "tiny-deepseek-v3": ("deepseek_v3", dict(_TINY_COMMON, num_key_value_heads=2, n_routed_experts=4,
                                             num_experts_per_tok=2, n_group=1, topk_group=1,
                                             moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=None,
                                             kv_lora_rank=16, qk_rope_head_dim=16, qk_nope_head_dim=16,
                                             v_head_dim=32, max_position_embeddings=4096)),
})
EMBEDDING_SCALE = 4.0  # peaked next-token distributions (see the module docstring)
EOS_ID = 0

# Tolerances. float32 is exact up to kernel reassociation; bf16 autocast rounds activations
# to 8 bits of mantissa, so its logprobs differ from float32's by a few hundredths on average.
TOL_FP32_MAX = 2e-3
TOL_BF16_MEAN = 0.05
TOL_BF16_MAX = 0.5  # one token far off (a wrong position or row) fails even when the mean hides it
TOL_FSDP_MAX = 1e-6  # |FSDP - local| of any weight after the step, one rank
TOL_GRAD_NORM_REL = 1e-2  # padded against packed, bf16
# A greedy token is wrong when its logit is below the forward's best by more than this: exact
# ties within float32 noise (~1e-5 here) happen in a near-flat 49k-token distribution.
ARGMAX_MARGIN = 1e-3

PROFILES = {
    "quick": dict(model="tiny", speed_models=["tiny"],
                  families=["tiny-llama3", "tiny-qwen3", "tiny-gpt-oss", "tiny-deepseek-v3"], rows=8, prompt=(8, 24), new_tokens=16,
                  gen_batches=[1, 4], gen_prompt=16, gen_tokens=8,
                  train_rows=8, train_lengths=(32, 160), micro_tokens=512, group_size=4, passes=1),
    "full": dict(model="smollm2-135m", speed_models=["smollm2-135m", "qwen2.5-0.5b"],
                 families=["llama3-family", "qwen3-family", "gpt-oss-family", "deepseek-v3-family"], rows=32, prompt=(16, 96),
                 new_tokens=64, gen_batches=[1, 32, 256], gen_prompt=64, gen_tokens=128,
                 train_rows=64, train_lengths=(256, 2048), micro_tokens=16384, group_size=4, passes=2),
}


# --------------------------------------------------------------------------- helpers


def build_model(name: str, device: torch.device, dtype: torch.dtype = torch.float32, seed: int = 0) -> Any:
    import transformers
    from transformers import AutoModelForCausalLM

    kind, shape = ARCHITECTURES[name]
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                    "qwen3": transformers.Qwen3Config, "gpt_oss": transformers.GptOssConfig,
                    "deepseek_v3": transformers.DeepseekV3Config}[kind]
    config = config_class(**shape, eos_token_id=EOS_ID, bos_token_id=1, pad_token_id=EOS_ID)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        embeddings = {id(m.weight): m.weight for m in (model.get_input_embeddings(), model.get_output_embeddings())}
        for weight in embeddings.values():  # tied: one tensor
            weight.mul_(EMBEDDING_SCALE)
    # transformers' own switch; gpt-oss has no sdpa path (it would drop the attention sinks)
    model.config._attn_implementation = "sdpa" if model._supports_sdpa else "eager"  # noqa: SLF001
    return model.to(device)


def run_config(profile: dict[str, Any], bf16: bool, lr: float = 1e-5) -> Any:
    from rlfactory_core.config import RunConfig

    return RunConfig.model_validate({
        "grpo": {"group_size": profile["group_size"], "micro_batch_tokens": profile["micro_tokens"],
                 "shared_prefix": False},
        "train": {"bf16": bf16, "lr": lr, "seed": 0},
        "rollout": {"sampling": {"temperature": 1.0}},
    })


def random_prompts(count: int, lengths: tuple[int, int], vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(rng.randint(*lengths))] for _ in range(count)]


async def _generate(backend: Any, prompts: list[list[int]], max_tokens: int, seeded: bool,
                    temperature: float) -> list[Any]:
    from rlfactory_core.rollout.backends.base import SamplingParams

    try:
        return await asyncio.gather(*(backend.generate(p, SamplingParams(
            temperature=temperature, max_tokens=max_tokens, seed=i if seeded else None))
            for i, p in enumerate(prompts)))
    finally:
        await backend.close()


def generate(model: Any, prompts: list[list[int]], max_tokens: int, *, seeded: bool = True,
             temperature: float = 1.0, max_batch_size: int = 256) -> list[Any]:
    """The hf backend's generations for ``prompts`` (one request each, batched by the backend)."""
    from rlfactory_core.rollout.backends.hf import HFBackend

    return asyncio.run(_generate(HFBackend(model, max_batch_size=max_batch_size), prompts, max_tokens, seeded,
                                 temperature))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def trajectories_of(prompts: list[list[int]], generations: list[Any], group_size: int) -> list[Any]:
    from rlfactory_core.types import Segment, Trajectory

    return [Trajectory(sample_id=f"row-{i}", prompt_ids=list(p),
                       segments=[Segment("model", list(g.token_ids), list(g.logprobs))], group=i // group_size)
            for i, (p, g) in enumerate(zip(prompts, generations))]


def deltas(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    diff = (a.float().cpu() - b.float().cpu()).abs()[mask.cpu().bool()]
    return {"max_abs_delta": float(diff.max()), "mean_abs_delta": float(diff.mean()), "tokens": int(diff.numel())}


def sampled(ctx: dict[str, Any]) -> dict[str, Any]:
    """The correctness sections' model and trajectories, made once (by the first that needs them)."""
    if "sampled" not in ctx:
        profile, device = ctx["profile"], ctx["device"]
        model = build_model(profile["model"], device)
        prompts = random_prompts(profile["rows"], profile["prompt"], model.config.vocab_size, seed=1)
        generations = generate(model, prompts, profile["new_tokens"])
        ctx["sampled"] = {"model": model, "prompts": prompts, "generations": generations}
    return ctx["sampled"]


# --------------------------------------------------------------------------- sections


def section_environment(ctx: dict[str, Any]) -> dict[str, Any]:
    import transformers

    device = ctx["device"]
    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "device": str(device)}
    for name in ("tensordict", "pydantic", "triton", "flash_attn"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - absent is a fact to report
            out[name] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                   bf16_native=torch.cuda.is_bf16_supported(), nccl=".".join(map(str, torch.cuda.nccl.version())))
    else:
        out.update(cpu=platform.processor() or platform.machine(), cores=os.cpu_count())
    return {"ok": True, **out}


def _full_forward_logprobs(model: Any, prompts: list[list[int]], generations: list[Any]) -> tuple[list[float], list[float], int]:
    """Every sampled token's logprob from a forward of its whole row alone (no padding, no
    cache), the sampler's, and how many sampled tokens score below the forward's best logit
    by more than :data:`ARGMAX_MARGIN` (for greedy generations: tokens that are not the argmax)."""
    device = next(model.parameters()).device
    forward_logprobs, sampler_logprobs, not_argmax = [], [], 0
    with torch.no_grad():
        for prompt, generation in zip(prompts, generations):
            ids = torch.tensor([prompt + list(generation.token_ids)], device=device)
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
            sampled_ids = ids[0, len(prompt):]
            logprobs = torch.log_softmax(logits, -1).gather(-1, sampled_ids[:, None]).squeeze(-1)
            forward_logprobs.extend(logprobs.tolist())
            sampler_logprobs.extend(generation.logprobs)
            below_best = logits.max(-1).values - logits.gather(-1, sampled_ids[:, None]).squeeze(-1)
            not_argmax += int((below_best > ARGMAX_MARGIN).sum())
    return forward_logprobs, sampler_logprobs, not_argmax


def section_sampler(ctx: dict[str, Any]) -> dict[str, Any]:
    data, profile = sampled(ctx), ctx["profile"]
    forward, sampler, _ = _full_forward_logprobs(data["model"], data["prompts"], data["generations"])
    every = torch.ones(len(forward), dtype=torch.bool)
    fp32 = deltas(torch.tensor(forward), torch.tensor(sampler), every)
    out: dict[str, Any] = {"float32": {**fp32, "tolerance": f"max <= {TOL_FP32_MAX}"}}
    # the tokens themselves: greedy ones must be the forward's argmax
    greedy_generations = generate(data["model"], data["prompts"], profile["new_tokens"], seeded=False,
                                  temperature=0.0)
    _, _, not_argmax = _full_forward_logprobs(data["model"], data["prompts"], greedy_generations)
    out["float32 greedy"] = {"tokens": sum(len(g.token_ids) for g in greedy_generations),
                             "not_the_forward_argmax": not_argmax, "tolerance": f"0 (ties within {ARGMAX_MARGIN})"}
    bf16_model = copy.deepcopy(data["model"]).to(torch.bfloat16)
    generations = generate(bf16_model, data["prompts"], profile["new_tokens"])
    forward, sampler, _ = _full_forward_logprobs(bf16_model, data["prompts"], generations)
    bf16 = deltas(torch.tensor(forward), torch.tensor(sampler), torch.ones(len(forward), dtype=torch.bool))
    out["bfloat16_weights"] = {**bf16, "tolerance": f"mean <= {TOL_BF16_MEAN}, max <= {TOL_BF16_MAX}"}
    out["ok"] = (fp32["max_abs_delta"] <= TOL_FP32_MAX and not_argmax == 0
                 and bf16["mean_abs_delta"] <= TOL_BF16_MEAN and bf16["max_abs_delta"] <= TOL_BF16_MAX)
    out["sampled_tokens"] = len(forward)
    return out


def section_trainer(ctx: dict[str, Any]) -> dict[str, Any]:
    from rlfactory_core.training.batch import rows_of, to_tensordict
    from rlfactory_core.training.logprobs import token_logprobs
    from rlfactory_core.training.policy import packing_is_exact

    data, device = sampled(ctx), ctx["device"]
    batch = to_tensordict(trajectories_of(data["prompts"], data["generations"], ctx["profile"]["group_size"]),
                          pad_token_id=EOS_ID)
    micro = rows_of(batch, list(range(batch.batch_size[0])))
    mask = micro["loss_mask"].bool()
    model = copy.deepcopy(data["model"]).train()
    own = model.config._attn_implementation  # noqa: SLF001 - sdpa, or eager where the model has no sdpa
    modes = [("float32 padded", False, False, own), (f"float32 packed {own}", False, True, own),
             ("bf16 padded", True, False, own), (f"bf16 packed {own}", True, True, own)]
    if device.type == "cuda" and not ctx.get("skip_flex"):  # the families skip it: one compile each
        modes.append(("bf16 packed flex_attention", True, True, "flex_attention"))
    out: dict[str, Any] = {"ok": True}
    if not packing_is_exact(model):  # the trainer pads such a model (training.policy.use_packing)
        out["packed"] = {"refused": "the model's causal mask ignores packed positions; the trainer pads it"}
        modes = [mode for mode in modes if not mode[2]]
    with torch.no_grad():
        for label, bf16, packed, attention in modes:
            model.config._attn_implementation = attention  # noqa: SLF001
            try:
                logprobs, entropies = token_logprobs(model, micro, bf16=bf16, entropy=True, packed=packed,
                                                     temperature=1.0)
            except Exception as exc:  # noqa: BLE001 - one mode failing leaves the others' results
                out[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                out["ok"] = False
                continue
            row = deltas(logprobs, micro["logprobs"], mask)
            if bf16:
                tolerance_ok = row["mean_abs_delta"] <= TOL_BF16_MEAN and row["max_abs_delta"] <= TOL_BF16_MAX
                row["tolerance"] = f"mean <= {TOL_BF16_MEAN}, max <= {TOL_BF16_MAX}"
            else:
                tolerance_ok = row["max_abs_delta"] <= TOL_FP32_MAX
                row["tolerance"] = f"max <= {TOL_FP32_MAX}"
            row["mean_entropy"] = float(entropies.cpu()[mask].mean())
            out[label] = row
            out["ok"] = out["ok"] and tolerance_ok
    return out


def section_grpo_step(ctx: dict[str, Any]) -> dict[str, Any]:
    from rlfactory_core.training.batch import build_batch
    from rlfactory_core.training.policy import build_optimizer, packing_is_exact
    from rlfactory_core.training.update import update_policy

    data, device, profile = sampled(ctx), ctx["device"], ctx["profile"]
    trajectories = trajectories_of(data["prompts"], data["generations"], profile["group_size"])
    rewards = [float(i % 3 == 0) for i in range(len(trajectories))]
    out: dict[str, Any] = {"ok": True}
    layouts = [("padded", False)] + [("packed", True)] * packing_is_exact(data["model"])  # else refused: padded
    for label, packed in layouts:
        config = run_config(profile, bf16=device.type == "cuda")
        model = copy.deepcopy(data["model"]).train()
        before = [p.detach().clone() for p in model.parameters()]
        optimizer, _ = build_optimizer(model, config)
        batch = build_batch(trajectories, rewards, config, EOS_ID)
        synchronize(device)
        started = time.perf_counter()
        stats = update_policy(model, None, optimizer, batch, config, packed=packed)
        synchronize(device)
        changes = [float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before)]
        finite = all(torch.isfinite(torch.tensor(stats[k])) for k in ("train/loss", "train/grad_norm"))
        out[label] = {"seconds": round(time.perf_counter() - started, 3), "loss": stats["train/loss"],
                      "grad_norm": stats["train/grad_norm"], "parameter_tensors_moved": sum(c > 0 for c in changes),
                      "parameter_tensors": len(changes), "sampler_logprob_diff": stats["train/sampler_logprob_diff"]}
        out["ok"] = out["ok"] and finite and min(changes) > 0 and stats["train/grad_norm"] > 0
    if "packed" not in out:
        return out
    norms = out["padded"]["grad_norm"], out["packed"]["grad_norm"]
    out["grad_norm_padded_vs_packed"] = {"relative_gap": abs(norms[0] - norms[1]) / max(norms),
                                         "tolerance": f"<= {TOL_GRAD_NORM_REL}"}
    out["ok"] = out["ok"] and out["grad_norm_padded_vs_packed"]["relative_gap"] <= TOL_GRAD_NORM_REL
    return out


def section_fsdp(ctx: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "fsdp.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                   str(Path(__file__).resolve()), "--fsdp-worker", str(result), "--profile", ctx["profile_name"],
                   "--device", ctx["device"].type]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        # A session of its own, so that a timeout kills the rank too (it would hold the GPU's
        # memory through the sections after this one).
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=ctx["fsdp_timeout"])
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"torchrun did not finish in {ctx['fsdp_timeout']} s") from None
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(f"torchrun exited {proc.returncode}: " + " | ".join(output.strip().splitlines()[-8:]))
        return json.loads(result.read_text())


def fsdp_worker(path: Path, profile_name: str, device_type: str) -> None:
    """One torchrun rank: the local engine's update and the FSDP2 one from the same weights."""
    import torch.distributed as dist

    from rlfactory_core.training.batch import build_batch
    from rlfactory_core.training.fsdp import full_model_state, shard
    from rlfactory_core.training.policy import build_optimizer
    from rlfactory_core.training.update import DataParallel, update_policy

    profile = PROFILES[profile_name]
    cuda = device_type == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {"backend": dist.get_backend(), "world_size": world, "ok": True}
    model = build_model(profile["model"], device)
    prompts = random_prompts(profile["rows"], profile["prompt"], model.config.vocab_size, seed=2)
    trajectories = trajectories_of(prompts, generate(copy.deepcopy(model), prompts, profile["new_tokens"]),
                                   profile["group_size"])
    rewards = [float(i % 3 == 0) for i in range(len(trajectories))]
    initial = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    for label, bf16 in (("float32", False), ("bf16", True)):
        config = run_config(profile, bf16=bf16)
        local = copy.deepcopy(model).train()
        optimizer, _ = build_optimizer(local, config)
        local_stats = update_policy(local, None, optimizer, build_batch(trajectories, rewards, config, EOS_ID), config)
        sharded = shard(copy.deepcopy(model).train())
        optimizer, _ = build_optimizer(sharded, config)
        fsdp_stats = update_policy(sharded, None, optimizer, build_batch(trajectories, rewards, config, EOS_ID),
                                   config, dp=DataParallel(rank, world))
        full = full_model_state(sharded)
        local_state = {k: v.detach().cpu() for k, v in local.state_dict().items()}
        gaps = [(full[k].float() - local_state[k].float()).abs() for k in local_state]
        updates = [(local_state[k].float() - initial[k].float()).abs() for k in local_state]
        mean_gap = float(sum(g.sum() for g in gaps) / sum(g.numel() for g in gaps))
        mean_update = float(sum(u.sum() for u in updates) / sum(u.numel() for u in updates))
        row = {"max_abs_weight_delta": max(float(g.max()) for g in gaps), "mean_abs_weight_delta": mean_gap,
               "mean_abs_update": mean_update, "relative": mean_gap / mean_update if mean_update else float("inf"),
               "local_grad_norm": local_stats["train/grad_norm"], "fsdp_grad_norm": fsdp_stats["train/grad_norm"],
               "local_loss": local_stats["train/loss"], "fsdp_loss": fsdp_stats["train/loss"],
               "tolerance": f"max |delta| <= {TOL_FSDP_MAX}"}
        out[label] = row
        out["ok"] = out["ok"] and mean_update > 0 and row["max_abs_weight_delta"] <= TOL_FSDP_MAX
    if rank == 0:
        path.write_text(json.dumps(out))
    dist.destroy_process_group()


def section_generation_speed(ctx: dict[str, Any]) -> dict[str, Any]:
    profile, device = ctx["profile"], ctx["device"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out: dict[str, Any] = {"ok": True, "dtype": str(dtype).removeprefix("torch."),
                           "prompt_tokens": profile["gen_prompt"], "new_tokens": profile["gen_tokens"]}
    for name in profile["speed_models"]:
        model = build_model(name, device, dtype=dtype)
        vocab = model.config.vocab_size
        generate(model, random_prompts(2, (8, 8), vocab, seed=0), 4, seeded=False)  # warm-up
        rows = {}
        for batch in profile["gen_batches"]:
            prompts = random_prompts(batch, (profile["gen_prompt"], profile["gen_prompt"]), vocab, seed=batch)
            synchronize(device)
            t = time.perf_counter()
            generations = generate(model, prompts, profile["gen_tokens"], seeded=False)
            synchronize(device)
            seconds = time.perf_counter() - t
            tokens = sum(len(g.token_ids) for g in generations)
            rows[f"batch {batch}"] = {"tokens_per_s": round(tokens / seconds, 1), "tokens": tokens,
                                      "seconds": round(seconds, 3)}
        out[name] = rows
        del model
        _free(device)
    return out


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _training_batch(profile: dict[str, Any], vocab: int) -> Any:
    """Rows of mixed length (uniform in ``train_lengths``), a quarter prompt, the rest sampled."""
    from rlfactory_core.training.batch import to_tensordict
    from rlfactory_core.types import Segment, Trajectory

    rng = random.Random(3)
    trajectories = []
    for i in range(profile["train_rows"]):
        length = rng.randint(*profile["train_lengths"])
        prompt = [rng.randrange(2, vocab) for _ in range(length // 4)]
        completion = [rng.randrange(2, vocab) for _ in range(length - len(prompt))]
        trajectories.append(Trajectory(sample_id=f"row-{i}", prompt_ids=prompt,
                                       segments=[Segment("model", completion, [0.0] * len(completion))], group=i))
    return to_tensordict(trajectories, pad_token_id=EOS_ID)


def section_train_speed(ctx: dict[str, Any]) -> dict[str, Any]:
    from rlfactory_core.training.batch import micro_batches, rows_of
    from rlfactory_core.training.logprobs import token_logprobs

    profile, device = ctx["profile"], ctx["device"]
    bf16 = device.type == "cuda"
    extra = []
    if device.type == "cuda":
        extra.append(("packed flex_attention", True, "flex_attention"))
        if ctx["versions"].get("flash_attn"):
            extra.append(("packed flash_attention_2", True, "flash_attention_2"))
    out: dict[str, Any] = {"ok": True, "bf16_autocast": bf16, "rows": profile["train_rows"],
                           "row_lengths": list(profile["train_lengths"]), "micro_batch_tokens": profile["micro_tokens"]}
    for index, name in enumerate(profile["speed_models"]):
        # flex_attention compiles once per micro-batch shape (transformers: dynamic=False), about
        # half a minute each: measured on the first model only, to keep the check short.
        modes = [("padded sdpa", False, "sdpa"), ("packed sdpa", True, "sdpa")] + (extra if index == 0 else [])
        model = build_model(name, device).train()
        batch = _training_batch(profile, model.config.vocab_size)
        real_tokens = int(batch["attention_mask"].sum())
        rows = {"real_tokens": real_tokens}
        for label, packed, attention in modes:
            model.config._attn_implementation = attention  # noqa: SLF001
            planned = micro_batches(list(range(batch.batch_size[0])), batch["lengths"], profile["micro_tokens"], packed)

            def one_pass() -> None:
                for micro_rows in planned:
                    micro = rows_of(batch, micro_rows).to(device)
                    logprobs, _ = token_logprobs(model, micro, bf16=bf16, entropy=False, packed=packed)
                    (-(logprobs * micro["loss_mask"]).sum() / real_tokens).backward()
                model.zero_grad(set_to_none=True)

            try:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                synchronize(device)
                t = time.perf_counter()
                one_pass()  # warm-up (flex_attention compiles here)
                synchronize(device)
                warmup = time.perf_counter() - t
                t = time.perf_counter()
                for _ in range(profile["passes"]):
                    one_pass()
                synchronize(device)
                seconds = (time.perf_counter() - t) / profile["passes"]
            except Exception as exc:  # noqa: BLE001 - one mode failing leaves the others' results
                rows[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                out["ok"] = False
                _free(device)
                continue
            rows[label] = {"tokens_per_s": round(real_tokens / seconds, 1), "seconds_per_pass": round(seconds, 3),
                           "warmup_seconds": round(warmup, 2), "micro_batches": len(planned)}
            if device.type == "cuda":
                rows[label]["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        out[name] = rows
        del model
        _free(device)
    return out


def section_weight_sync(ctx: dict[str, Any]) -> dict[str, Any]:
    from rlfactory_core.rollout.backends.hf import HFBackend
    from rlfactory_core.training.batch import build_batch
    from rlfactory_core.training.policy import build_optimizer, weights_for_backend
    from rlfactory_core.training.update import update_policy

    profile, device = ctx["profile"], ctx["device"]
    policy = build_model(profile["model"], device).train()
    backend = HFBackend(copy.deepcopy(policy), max_batch_size=256)
    config = run_config(profile, bf16=device.type == "cuda")
    optimizer, _ = build_optimizer(policy, config)
    prompts = random_prompts(profile["rows"] * 2, profile["prompt"], policy.config.vocab_size, seed=4)

    async def step() -> dict[str, float]:
        from rlfactory_core.rollout.backends.base import SamplingParams

        times = {}
        t = time.perf_counter()
        generations = await asyncio.gather(*(backend.generate(p, SamplingParams(max_tokens=profile["new_tokens"]))
                                             for p in prompts))
        times["generation"] = time.perf_counter() - t
        trajectories = trajectories_of(prompts, generations, profile["group_size"])
        t = time.perf_counter()
        update_policy(policy, None, optimizer, build_batch(trajectories, [float(i % 2) for i in range(len(prompts))],
                                                           config, EOS_ID), config)
        synchronize(device)
        times["update"] = time.perf_counter() - t
        t = time.perf_counter()
        await backend.update_weights(weights_for_backend(policy))
        synchronize(device)
        times["weight_sync"] = time.perf_counter() - t
        return times

    async def steps() -> list[dict[str, float]]:
        try:
            return [await step() for _ in range(2)]  # the first warms up
        finally:
            await backend.close()

    times = asyncio.run(steps())[-1]
    total = sum(times.values())
    served = backend.model.state_dict()
    in_sync = all(torch.equal(served[name], tensor) for name, tensor in weights_for_backend(policy))
    return {"ok": in_sync,
            **{f"{k}_s": round(v, 4) for k, v in times.items()},
            "weight_sync_share": round(times["weight_sync"] / total, 4),
            "parameters_m": round(sum(p.numel() for p in policy.parameters()) / 1e6, 1)}


def section_families(ctx: dict[str, Any]) -> dict[str, Any]:
    """The sampler, trainer and GRPO-step checks again on each model family's architecture
    (``PROFILES[...]["families"]``), each with its own model and trajectories; flex_attention
    is left to the main sections (it compiles once per shape)."""
    out: dict[str, Any] = {"ok": True}
    for name in ctx["profile"]["families"]:
        family_ctx = {**ctx, "profile": {**ctx["profile"], "model": name}, "skip_flex": True}
        family_ctx.pop("sampled", None)
        row: dict[str, Any] = {}
        for label, section in (("sampler", section_sampler), ("trainer", section_trainer),
                               ("grpo_step", section_grpo_step)):
            try:
                result = section(family_ctx)
            except Exception as exc:  # noqa: BLE001 - one family failing leaves the others' results
                result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
            row[label] = result
        model = family_ctx["sampled"]["model"] if "sampled" in family_ctx else None
        summary = {"ok": all(r.get("ok") for r in row.values()),
                   "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1) if model else None}
        for label, result in row.items():
            if "error" in result:
                summary[f"{label} error"] = result["error"]
        if "float32" in row["sampler"]:
            summary["sampler fp32 max"] = row["sampler"]["float32"]["max_abs_delta"]
            summary["greedy not argmax"] = row["sampler"]["float32 greedy"]["not_the_forward_argmax"]
            summary["sampler bf16 mean"] = row["sampler"]["bfloat16_weights"]["mean_abs_delta"]
        for mode, figures in row["trainer"].items():
            if isinstance(figures, dict) and "mean_abs_delta" in figures:
                summary[f"trainer {mode} max/mean"] = [round(figures["max_abs_delta"], 6),
                                                       round(figures["mean_abs_delta"], 6)]
        if "padded" in row["grpo_step"]:
            step = row["grpo_step"]
            summary["step moved tensors"] = [step["padded"]["parameter_tensors_moved"], step["padded"]["parameter_tensors"]]
            summary["step grad norm padded/packed"] = [step["padded"]["grad_norm"],
                                                       step["packed"]["grad_norm"] if "packed" in step else "refused"]
        out[name] = {"summary": summary, "details": row}
        out["ok"] = out["ok"] and summary["ok"]
    return out


SECTIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "environment": section_environment, "sampler": section_sampler, "trainer": section_trainer,
    "grpo_step": section_grpo_step, "families": section_families, "fsdp": section_fsdp, "generation_speed": section_generation_speed,
    "weight_sync": section_weight_sync, "train_speed": section_train_speed,  # last: flex_attention compiles
}


# --------------------------------------------------------------------------- the table


def table(results: dict[str, Any]) -> str:
    """One line per measured figure: section, what, value(s), verdict."""
    lines = [f"{'section':<17} {'what':<44} {'figures':<58} result", "-" * 128]

    def line(section: str, what: str, figures: str, verdict: str = "") -> None:
        lines.append(f"{section:<17} {what:<44} {figures:<58} {verdict}")

    for section, result in results.items():
        verdict = "ok" if result.get("ok") else "FAILED"
        if "error" in result:  # the section raised: its error (the traceback went to the log and the JSON)
            line(section, "error", result["error"].splitlines()[0][:58], verdict)
            continue
        for key, value in result.items():
            if key in ("ok", "seconds"):
                continue
            if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values() if not isinstance(v, int)):
                for sub, figures in value.items():
                    if isinstance(figures, dict) and sub != "details":  # a family's details stay in the JSON
                        line(section, f"{key}: {sub}", _figures(figures), verdict)
            elif isinstance(value, dict):
                line(section, key, _figures(value), verdict)
            else:
                line(section, key, str(value), "")
    return "\n".join(lines)


def _figures(values: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in values.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the short CPU form (tiny model, few rows)")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, from: " + ", ".join(SECTIONS))
    parser.add_argument("--out", default="gpu_check.json", help="where the JSON goes (rewritten after each section)")
    parser.add_argument("--profile", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fsdp-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fsdp_worker:
        fsdp_worker(Path(args.fsdp_worker), args.profile, args.device)
        return 0
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    profile_name = "quick" if args.quick else "full"
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    ctx: dict[str, Any] = {"device": device, "profile": PROFILES[profile_name], "profile_name": profile_name,
                           # the GPU's takes ~30 s; bounded so that a hang leaves the speed sections
                           # their time in a 10-minute call. On CPU, torchrun and gloo start slowly.
                           "fsdp_timeout": 300 if args.quick else 240}
    try:
        ctx["versions"] = section_environment(ctx)
    except Exception:  # noqa: BLE001 - the environment section reports it; the rest can run
        ctx["versions"] = {}
    results: dict[str, Any] = {}
    out = Path(args.out)
    for name in chosen:
        print(f"[gpu check] {name} ...", flush=True)
        t = time.perf_counter()
        try:
            results[name] = SECTIONS[name](ctx)
        except Exception as exc:  # noqa: BLE001 - a failed section is reported; the next runs
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                             "traceback": traceback.format_exc()[-3000:]}
        results[name]["seconds"] = round(time.perf_counter() - t, 1)
        print(f"[gpu check] {name}: {'ok' if results[name].get('ok') else 'FAILED'} "
              f"({results[name]['seconds']} s)", flush=True)
        if "traceback" in results[name]:
            print(results[name]["traceback"], flush=True)
        out.write_text(json.dumps({"profile": profile_name, "sections": results}, indent=1))
    print(table(results))
    print(f"[gpu check] written: {out}")
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
