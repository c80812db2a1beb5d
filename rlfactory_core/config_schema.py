"""The run configuration's schema: every section of a run's config, validated by pydantic
(unknown keys, bad types and out-of-range values are errors), and the checks across sections
(:class:`RunConfig`). :mod:`rlfactory_core.config` builds a config from its layers (the env's
defaults, presets, files, overrides) and re-exports these names.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from .models import DEFAULT_MODEL
from .outcomes import FailureHandling
from .rollout.agent_loop import RolloutConfig

__all__ = [
    "RunConfig", "ModelSection", "LoraSection", "GRPOSection", "TrainSection", "DataSection", "EvalSection",
    "CheckpointSection", "LoggingSection", "RewardSpec", "ToolManagerSpec", "RaySection", "ColdStartSection",
    "RayRole", "JudgeRole", "ToolActorsSection",
]


def _yaml_on_off(cls: Any, value: Any) -> Any:
    """YAML 1.1 reads ``on``/``off`` as booleans: map them back for on/off/auto fields."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class _Section(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)


def _field(default: Any = ..., description: str = "", **kwargs: Any) -> Any:
    if callable(default) and not isinstance(default, (int, float, str, bool)) and default is not ...:
        return pydantic.Field(default_factory=default, description=description, **kwargs)
    return pydantic.Field(default, description=description, **kwargs)


class LoraSection(_Section):
    enabled: bool = _field(False, "train LoRA adapters (peft) instead of all weights")
    r: int = _field(16, "adapter rank", ge=1)
    alpha: float = _field(32.0, "adapter scaling numerator (scale = alpha / r)", gt=0)
    dropout: float = _field(0.0, "dropout on the adapter input", ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = _field(
        "all-linear", "module names to adapt, or 'all-linear'")


class ModelSection(_Section):
    name: str = _field(DEFAULT_MODEL, "embedded model name, local directory or hub id (the policy)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = _field(
        "float32", "dtype of the loaded weights; weights trained in full stay float32 (AdamW updates are "
                   "far below bf16's precision), bfloat16/float16 only as a LoRA base; train.bf16 autocast "
                   "does the bf16 compute")
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = _field(
        "auto", "auto = flash_attention_2 on a GPU with flash-attn installed, else sdpa, else eager (each where "
                "the model supports it: gpt-oss runs eager, as sdpa would drop its attention sinks)")
    gradient_checkpointing: bool = _field(False, "recompute activations in the backward pass (less memory)")
    lora: LoraSection = _field(LoraSection, "LoRA adapters")
    family: str = _field("auto", "the chat format at the level of token ids (a registered model family: template, "
                                 "qwen3, llama3, gpt-oss, deepseek-v4 ...); auto = the one whose anchor tokens the "
                                 "tokenizer has, else template (the model's own chat template)")
    family_options: dict[str, Any] = _field(dict, "options of the family's build (e.g. qwen3's thinking_retention)")


class ToolManagerSpec(_Section):
    name: str = _field("concurrent", "registered tool manager")
    options: dict[str, Any] = _field(dict, "its constructor options (timeout_s, max_concurrency, ...)")


class RewardSpec(_Section):
    name: str = _field(..., "registered reward")
    weight: float = _field(1.0, "weight in the total reward")
    options: dict[str, Any] = _field(dict, "its constructor options")
    timeout_s: float | None = _field(60.0, "seconds one score may take; longer is a reward error (null = no limit)",
                                     gt=0)
    fallback: float = _field(0.0, "the value a trajectory gets from this reward when scoring it fails")
    max_concurrency: int = _field(64, "trajectories this reward scores at once (a judge endpoint's capacity)",
                                  ge=1)


class GRPOSection(_Section):
    group_size: int = _field(4, "trajectories per prompt (the GRPO group)", ge=2)
    prompts_per_step: int = _field(8, "prompts per rollout batch", ge=1)
    advantage_norm: Literal["group", "batch", "none"] = _field(
        "group", "scale advantages by the group std (GRPO), the batch std, or not at all (Dr. GRPO)")
    clip_low: float = _field(0.2, "lower clip of the ratio: 1 - clip_low", ge=0, lt=1)
    clip_high: float = _field(0.28, "upper clip of the ratio: 1 + clip_high (DAPO clip-higher)", ge=0)
    kl_coef: float = _field(0.0, "KL penalty to the frozen reference model; 0 keeps no reference", ge=0)
    kl_estimator: Literal["k1", "k3"] = _field("k3", "KL estimator (Schulman's k1 or k3)")
    loss_agg: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"] = _field(
        "token_mean", "how per-token losses become one number")
    tis_cap: float | None = _field(
        None, "truncated importance sampling: weight tokens by min(pi_old / pi_sampler, tis_cap); "
              "null = off", gt=0)
    epochs: int = _field(1, "passes over each rollout batch", ge=1)
    mini_batches: int = _field(1, "optimizer steps per epoch (the batch split into this many)", ge=1)
    micro_batch_tokens: int = _field(
        2048, "tokens per forward/backward, padding included (gradient accumulation; memory grows with it)",
        ge=64)
    packing: Literal["auto", "on", "off"] = _field(
        "auto", "feed micro-batches without padding (trajectories concatenated, positions restarting); "
                "auto = on with flash-attention 2 (its varlen kernel), off with SDPA, where the block-diagonal "
                "mask costs more than the little padding of length-sorted micro-batches")
    _packing_on_off = pydantic.field_validator("packing", mode="before")(_yaml_on_off)
    shared_prefix: bool = _field(
        True, "compute the prompt a group's trajectories share once per micro-batch in the update (exact: the "
              "same logprobs and gradients, a fraction of the compute); padded micro-batches of text only")
    entropy_coef: float = _field(0.0, "entropy bonus coefficient (0 = only measured)", ge=0)
    turn_rewards: bool = _field(
        True, "add the env's per-turn rewards (placed on each turn's last token) to the advantage")
    dynamic_sampling: bool = _field(
        False, "DAPO's dynamic sampling: drop groups whose rewards are all equal (no gradient) and roll out the "
               "next prompts until the batch holds prompts_per_step groups (rlfactory_core.training.assembly)")
    max_extra_rollouts: int = _field(
        2, "with dynamic_sampling: extra rollouts a step may make to fill its batch; then it trains on what it "
           "has", ge=0)
    overlong_filter: bool = _field(
        False, "DAPO's overlong filtering: trajectories a limit cut off (the last turn at max_tokens_per_turn, or "
               "ended by the token budget or max_turns) carry no loss (rlfactory_core.training.overlong)")
    overlong_buffer: int = _field(
        0, "DAPO's soft overlong penalty: a trajectory longer than rollout.max_trajectory_tokens - overlong_buffer "
           "tokens loses reward linearly, up to overlong_penalty at the limit; 0 = off", ge=0)
    overlong_penalty: float = _field(1.0, "the soft overlong penalty's largest value (reward lost at the limit)",
                                     ge=0)


class ColdStartSection(_Section):
    """A supervised warm-up before the first step (rlfactory_core.training.cold_start), for tasks whose base
    model almost never succeeds, so that reinforcement learning has rewards to learn from."""

    source: Literal["off", "rejection", "demonstrations", "auto"] = _field(
        "off", "off; rejection: the model's own trajectories that the training rewards call correct; "
               "demonstrations: the env's demonstrations from the training split's gold answers (its tools really "
               "called, kept when the rewards call them correct); auto: rejection first, then demonstrations to "
               "fill up to cold_start.examples")
    # YAML (files and key=value overrides alike) reads a bare `off` as false
    _source_off = pydantic.field_validator("source", mode="before")(
        lambda cls, value: "off" if value is False else value)
    examples: int = _field(64, "trajectories to train on (at most one per training sample)", ge=1)
    epochs: int = _field(2, "passes over the examples", ge=1)
    lr: float = _field(1e-5, "AdamW learning rate of the warm-up (its own optimizer, constant)", gt=0)
    batch_size: int = _field(8, "examples per optimizer step (micro-batched by grpo.micro_batch_tokens)", ge=1)
    max_rollouts: int = _field(
        256, "rejection: trajectories rolled out at most (grpo.group_size per prompt) while looking for "
             "correct ones", ge=1)
    eval: bool = _field(True, "evaluate right after the warm-up (cold_start/eval/*: what the warm-up alone gives)")


class TrainSection(_Section):
    steps: int = _field(50, "training steps (one rollout batch each)", ge=1)
    lr: float = _field(1e-6, "AdamW learning rate", gt=0)
    weight_decay: float = _field(0.0, "AdamW weight decay", ge=0)
    betas: tuple[float, float] = _field((0.9, 0.999), "AdamW betas")
    warmup_steps: int = _field(0, "linear warm-up steps", ge=0)
    scheduler: Literal["constant", "linear", "cosine"] = _field("constant", "learning-rate schedule after warm-up")
    max_grad_norm: float = _field(1.0, "gradient clipping (0 = off)", ge=0)
    bf16: Literal["auto"] | bool = _field(
        "auto", "bf16 autocast for forward/backward: auto = where bf16 matmuls are the fast ones (a GPU, a CPU "
                "with AMX), float32 elsewhere (on AVX2 bf16 is emulated, ~35x slower; AVX512-BF16 alone 1.75x)")
    seed: int = _field(0, "seed of data order, sampling and initialisation")
    device: str = _field("auto", "training device: auto (cuda when available), cpu, cuda, cuda:1 ...")
    threads: int | None = _field(None, "torch CPU threads for training (default: torch's)", ge=1)
    mode: Literal["sync", "one_step_off", "async"] = _field(
        "sync", "the schedule: sync = each step rolls out, then trains; one_step_off = step k+1's rollout runs "
                "while step k trains (its tokens one policy version old at most); async = groups generated "
                "continuously, up to train.max_staleness versions ahead (docs/training.md)")
    max_staleness: int = _field(
        1, "modes other than sync: how many policy versions older than the trainer's a trained token's "
           "sampler may be", ge=0)
    overlap_cores: Literal["auto", "split", "take_turns"] = _field(
        "auto", "modes other than sync on the local engine on a CPU: how generation and the update share the "
                "cores. split = vLLM's worker on the first half, the update on the rest (the hf backend cannot be "
                "split: both on every core); take_turns = both on every core, generation paused (its requests "
                "kept) while the update computes; auto = take_turns (bench/README.md, async_modes). Setting "
                "train.threads or VLLM_CPU_OMP_THREADS_BIND keeps your binding (no split). The ray engine's roles "
                "share cores by ray.placement instead")
    generation_order: Literal["auto", "oldest_first", "backend"] = _field(
        "auto", "modes other than sync, when rollouts of several steps (or an eval) overlap: oldest_first = a "
                "turn starts only when no older step's turn generates or waits (the step the trainer waits for "
                "goes first), backend = all batched together in the backend's order; auto = oldest_first when "
                "generation runs on a CPU (a decode step costs in proportion to its sequences), backend on a GPU")
    weight_push: Literal["auto", "changed", "all"] = _field(
        "auto", "what each weight sync sends the generation backends: changed = only the decoder layers with a "
                "value that changed in the sampler's dtype (keeps one copy of the sent weights), all = every "
                "tensor, auto = changed for LoRA (only the adapted layers change), all otherwise (AdamW moves "
                "every tensor each step: bench/README.md); the ray engine sends all")


class DataSection(_Section):
    train_file: str | None = _field(None, "JSONL of training samples; default: the env's own train split")
    eval_file: str | None = _field(None, "JSONL of held-out samples; default: the env's own test split")
    train_size: int | None = _field(None, "use at most this many training samples", ge=1)
    eval_size: int | None = _field(64, "held-out samples per evaluation (the split's first N); null = all of them",
                                   ge=1)
    eval_split: str = _field(
        "test", "the env's split that evaluation during training uses (tune on validation, report on test)",
        min_length=1)
    shuffle: bool = _field(True, "reshuffle the training samples every epoch (seeded)")


class EvalSection(_Section):
    every: int = _field(10, "evaluate every N steps (0 = only before and after training)", ge=0)
    temperature: float = _field(0.0, "sampling temperature for evaluation (0 = greedy)", ge=0)
    save_samples: int = _field(8, "trajectories written as text at each evaluation", ge=0)
    rewards: list[RewardSpec] | None = _field(
        None, "the rewards of evaluation (e.g. plain exact match where training adds format terms); "
              "null = the training rewards")
    splits: list[str] = _field(
        list, "more of the env's splits, each evaluated whole before training, after the cold start and at the "
              "last step (metrics eval/<split>/...); the periodic evals use data.eval_split")
    reuse_untrained: bool = _field(
        False, "reuse the eval before training from an earlier run of the same model files on the same samples "
               "with the same settings, code and machine kind ($RLFACTORY_HOME/evals): every seed of a recipe "
               "evaluates its starting model once. Only where the env fingerprints its data (data_fingerprint); "
               "greedy evals only, or with train.seed in the key")

    @pydantic.field_validator("splits")
    @classmethod
    def _distinct_splits(cls, splits: list[str]) -> list[str]:
        repeated = sorted({s for s in splits if splits.count(s) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} named twice")
        bad = [s for s in splits if not s.strip(".") or not all(ch.isalnum() or ch in "_-." for ch in s)]
        if bad:
            raise ValueError(f"split names are letters, digits, '_', '-' and '.': {bad!r}")
        # their metrics are eval/<split>/..., beside eval/reward/... and the cold start's samples
        reserved = sorted(set(splits) & {"reward", "tools", "outcome", "rollout", "cold_start"})
        if reserved:
            raise ValueError(f"{', '.join(reserved)} would mix with the eval's own metrics or files; "
                             "these names cannot be eval splits")
        return splits


class CheckpointSection(_Section):
    every: int = _field(10, "checkpoint every N steps (the last step always)", ge=1)
    keep: int = _field(2, "checkpoints kept (older ones are deleted)", ge=1)


class LoggingSection(_Section):
    tensorboard: bool = _field(True, "write TensorBoard events to RUN_DIR/tensorboard")
    wandb_project: str | None = _field(None, "Weights & Biases project; null = off")
    wandb_entity: str | None = _field(None, "Weights & Biases entity (team)")
    live: Literal["auto", "on", "off"] = _field("auto", "rich live view: auto = when stdout is a terminal")

    _live_on_off = pydantic.field_validator("live", mode="before")(_yaml_on_off)
    no_tool_call_warning: bool = _field(True, "warn when a step makes no tool call although tools are offered")
    record_train_groups: int = _field(
        2, "whole groups of training trajectories recorded token by token each step "
           "(RUN_DIR/trajectories/train, read by `rlf ui`); 0 = none", ge=0)
    record_eval: bool = _field(True, "record every eval trajectory token by token (RUN_DIR/trajectories/eval)")


class RayRole(_Section):
    workers: int = _field(1, "actors in this role", ge=0)
    cpus: float = _field(1.0, "CPUs reserved per actor (also its torch threads, rounded, unless train.threads)", gt=0)
    gpus: float = _field(0.0, "GPUs reserved per actor (fractions share a GPU)", ge=0)


class JudgeRole(RayRole):
    workers: int = _field(1, "judge actors (used only when `rewards` names some)", ge=1)
    rewards: list[str] = _field(list, "rewards (names from `rewards`) scored on the judge pool instead of "
                                      "in every rollout worker: judge models, loaded once")


class ToolActorsSection(_Section):
    names: list[str] = _field(list, "env tools served by one shared actor each (a retriever, a rate-limited "
                                    "API) instead of a copy in every rollout worker")
    cpus: float = _field(1.0, "CPUs reserved per tool actor", gt=0)
    max_concurrency: int = _field(64, "calls a tool actor runs at once", ge=1)


class RaySection(_Section):
    """The ``ray`` engine (``engine: ray``): where each role runs (rlfactory_core.engines.ray)."""

    address: str | None = _field(None, "cluster to join (else $RAY_ADDRESS, else a local cluster is started)")
    num_cpus: int | None = _field(None, "CPUs a started local cluster offers (default: this machine's)", ge=1)
    num_gpus: int | None = _field(None, "GPUs a started local cluster offers (default: the visible ones)", ge=0)
    placement: Literal["colocated", "separate"] = _field(
        "colocated", "colocated: trainer and rollout worker i share bundle i and take turns (sync: rollout, "
                     "then update; other train.modes: generation pauses, its requests kept, while the update "
                     "computes, so the rollout's waits still overlap it); separate: each role has its own "
                     "placement group and both run at once")
    trainer: RayRole = _field(RayRole, "the FSDP2 trainer group (torch.distributed: gloo on CPU, NCCL on GPU)")
    rollout: RayRole = _field(RayRole, "rollout workers: each runs the agent loop and rewards with its own backend")
    judge: JudgeRole = _field(JudgeRole, "a pool for model-based rewards")
    tool_actors: ToolActorsSection = _field(ToolActorsSection, "tools shared by all rollout workers")
    max_restarts: int = _field(3, "replacements of dead rollout workers per step (the rollouts and weight "
                                  "pushes between two updates) before the run fails", ge=0)
    worker_logs: bool = _field(False, "show the actors' output (vLLM, transformers) in the run's output; it is "
                                      "always in /tmp/ray/session_latest/logs")
    placement_timeout_s: float = _field(60.0, "how long to wait for the cluster to place the actors", gt=0)


class RunConfig(_Section):
    """Everything a run needs. Unknown keys are errors."""

    env: str = _field("arithmetic", "registered env name")
    env_options: dict[str, Any] = _field(dict, "options for the env's constructor")
    parser: str = _field("qwen3", "registered response parser")
    tool_manager: ToolManagerSpec = _field(ToolManagerSpec, "the tool manager shared by all trajectories")
    rewards: list[RewardSpec] = _field(
        lambda: [RewardSpec(name="exact_match")], "reward components, summed with their weights")
    engine: Literal["local", "ray"] = _field(
        "local", "where work runs: local (this process) or ray (actors on a Ray cluster, see `ray`)")
    ray: RaySection = _field(RaySection, "roles and resources of the ray engine")
    backend: Literal["auto", "hf", "vllm"] = _field("auto", "generation backend: auto = vllm when importable")
    backend_options: dict[str, Any] = _field(dict, "backend constructor options (max_num_seqs, kv_cache_gib, ...)")
    model: ModelSection = _field(ModelSection, "the policy model")
    rollout: RolloutConfig = _field(RolloutConfig, "trajectory generation")
    failures: FailureHandling = _field(
        FailureHandling, "how each outcome class trains: the policy's mistakes penalised as scored, the "
                         "infrastructure's failures masked (rlfactory_core.outcomes)")
    grpo: GRPOSection = _field(GRPOSection, "the algorithm")
    train: TrainSection = _field(TrainSection, "the optimizer and the run length")
    cold_start: ColdStartSection = _field(ColdStartSection, "a supervised warm-up before the first step")
    data: DataSection = _field(DataSection, "samples")
    eval: EvalSection = _field(EvalSection, "held-out evaluation")
    checkpoint: CheckpointSection = _field(CheckpointSection, "checkpoints")
    logging: LoggingSection = _field(LoggingSection, "metrics and the terminal view")
    run_dir: str | None = _field(None, "where everything is written; default runs/<env>-<date>-<time>")

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        # every rule across settings at once, one line each (config_errors splits them)
        problems = self.consistency_problems()
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def consistency_problems(self) -> list[str]:
        """What the settings get wrong together, one line each, every rule checked."""
        problems: list[str] = []
        for key, rewards in (("rewards", self.rewards), ("eval.rewards", self.eval.rewards)):
            if rewards is None and key == "eval.rewards":
                continue
            if not rewards:
                problems.append(f"{key}: at least one reward is needed")
                continue
            names = [r.name for r in rewards]
            if len(set(names)) != len(names):
                problems.append(f"{key}: each reward may appear once, got {names}")
        if self.model.dtype in ("bfloat16", "float16") and not self.model.lora.enabled:
            # bf16 keeps 8 significant bits: an AdamW step of ~lr changes a weight of size w only
            # when lr > w / 256, so at the usual 1e-6 nearly every update rounds away silently.
            problems.append(f"model.dtype: {self.model.dtype} weights would round away most AdamW updates "
                            f"(8 significant bits); train float32 weights (train.bf16 autocast still "
                            f"computes in bf16) or LoRA adapters on a {self.model.dtype} base "
                            f"(model.lora.enabled=true)")
        batch = self.grpo.prompts_per_step * self.grpo.group_size
        if self.grpo.mini_batches > batch:
            problems.append(f"grpo.mini_batches ({self.grpo.mini_batches}) is more than the trajectories per "
                            f"step ({batch} = prompts_per_step x group_size)")
        if self.engine == "ray":
            if self.model.lora.enabled:
                problems.append("model.lora.enabled: the ray engine trains all weights (FSDP2); "
                                "use engine=local for LoRA")
            if self.train.weight_push == "changed":
                # measured (bench/weight_sync.py): a full AdamW step moves every tensor, so there
                # is nothing to leave out, and rank 0 would hold a second copy of the model
                problems.append("train.weight_push: changed saves nothing on the ray engine, which trains all "
                                "weights (each step changes every tensor); use all or auto")
            if self.ray.trainer.workers < 1 or self.ray.rollout.workers < 1:
                problems.append("ray.trainer.workers and ray.rollout.workers must be at least 1")
            names = {r.name for r in [*self.rewards, *(self.eval.rewards or [])]}
            unknown = [n for n in self.ray.judge.rewards if n not in names]
            if unknown:
                problems.append(f"ray.judge.rewards: {unknown} are not in rewards or eval.rewards "
                                f"(configured: {sorted(names)})")
            pooled = sorted({r.name for r in self.rewards} & set(self.ray.judge.rewards))
            if self.cold_start.source in ("demonstrations", "auto") and pooled:
                problems.append(f"cold_start.source: demonstrations are scored in the driver process, which cannot "
                                f"reach the judge pool that scores {pooled} (ray.judge.rewards); use "
                                f"cold_start.source=rejection, or score them in the rollout workers")
        if self.rollout.max_trajectory_tokens < self.rollout.max_tokens_per_turn:
            problems.append("rollout.max_trajectory_tokens must be at least rollout.max_tokens_per_turn")
        if self.grpo.overlong_buffer >= self.rollout.max_trajectory_tokens:
            problems.append(f"grpo.overlong_buffer ({self.grpo.overlong_buffer}) must be less than "
                            f"rollout.max_trajectory_tokens ({self.rollout.max_trajectory_tokens}): the penalty "
                            f"starts that many tokens before the limit")
        return problems
