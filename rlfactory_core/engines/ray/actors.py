"""The ray engine's actors: trainer ranks, rollout workers, the judge pool and tool actors,
with the stand-ins the rollout workers use for shared tools and pooled rewards. See
:mod:`rlfactory_core.engines.ray` for the roles."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
from pathlib import Path
from typing import Any, Sequence

import ray
import torch

from ...config import RunConfig
from ...errors import ConfigError, one_line
from ...interfaces import member
from ...training.fsdp import full_model_state, load_local_optimizer_state, local_optimizer_state, shard, trainable_names

__all__ = ["TrainerWorker", "RolloutWorker", "JudgeActor", "ToolActor", "SharedTool", "PooledReward",
           "quiet_worker", "threads_for", "role_threads"]


def quiet_worker(threads: int) -> None:
    """Per-actor process setup: torch threads (Ray's default is one per reserved CPU),
    no progress bars in the driver's log."""
    torch.set_num_threads(max(1, threads))
    with contextlib.suppress(Exception):
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()


def threads_for(config: RunConfig, cpus: float) -> int:
    return config.train.threads or max(1, round(cpus))


def role_threads(config: RunConfig, role: str) -> int:
    """Torch threads of a trainer rank or rollout worker: ``train.threads``, else its CPUs;
    colocated, the whole bundle's, since the two take turns (rollout, then update)."""
    r = config.ray
    cpus = r.trainer.cpus + r.rollout.cpus if r.placement == "colocated" else getattr(r, role).cpus
    return threads_for(config, cpus)


class TrainerWorker:
    """One rank of the FSDP2 trainer group."""

    def __init__(self, rank: int, world: int, threads: int):
        quiet_worker(threads)
        self.rank, self.world = rank, world

    def rendezvous_address(self) -> tuple[str, int]:
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, config_json: dict[str, Any], address: tuple[str, int], model_path: str,
              base_path: str, checkpoint: str | None) -> None:
        """Join the group; load and shard the policy (and the reference), build the optimizer
        (the local engine's setup, :mod:`rlfactory_core.training.policy`, with FSDP2 between
        loading and the optimizer); resume a checkpoint's optimizer, schedule and RNGs."""
        import torch.distributed as dist

        from ...training.checkpoint import set_rng_state
        from ...training.policy import (FrozenReference, attn_implementation, build_optimizer, load_policy,
                                        load_reference, use_packing)
        from ...training.update import DataParallel

        config = self.config = RunConfig.model_validate(config_json)
        cuda = torch.cuda.is_available() and config.train.device != "cpu"
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{address[0]}:{address[1]}",
                                rank=self.rank, world_size=self.world)
        self.dp = DataParallel(self.rank, self.world)
        policy = load_policy(config, model_path, device)
        self.names = trainable_names(policy)
        self.hf_model = policy  # its config and save_pretrained; the parameters are the shards
        # decided before sharding: the packing check's forward then needs no collective
        self.packed = use_packing(config, attn_implementation(config, device, policy), policy)
        self.policy = shard(policy)
        reference = load_reference(config, base_path, device, policy)  # a frozen copy: LoRA is refused here
        self.reference = FrozenReference(shard(reference.model)) if reference is not None else None
        self.optimizer, self.scheduler = build_optimizer(self.policy, config)
        if checkpoint is not None:
            load_local_optimizer_state(self.policy, self.optimizer, self.names, Path(checkpoint))
            self.scheduler.load_state_dict(torch.load(Path(checkpoint) / "scheduler.pt", weights_only=False))
            set_rng_state(torch.load(Path(checkpoint) / "rng.pt", weights_only=False))

    def update(self, batch: Any, step: int) -> tuple[dict[str, float], Any]:
        """One update of the group (a Ray actor runs its calls on one thread: the update
        stays on it, as the engine protocol asks); its statistics and the recorded rows'
        logprobs before it (``trainer_logprobs``, None when no row is recorded)."""
        from ...training.policy import return_freed_memory, step_scheduler
        from ...training.update import update_policy

        stats = update_policy(self.policy, self.reference, self.optimizer, batch, self.config, step=step,
                              packed=self.packed, dp=self.dp)
        return_freed_memory()
        step_scheduler(self.scheduler)
        stats["train/lr"] = self.scheduler.get_last_lr()[0]
        return stats, batch.get("trainer_logprobs", None)

    def supervised_update(self, batch: Any) -> dict[str, float]:
        """The group's cold-start warm-up (:mod:`rlfactory_core.training.cold_start`), with an
        optimizer of its own over this rank's shards, dropped afterwards."""
        from ...training.cold_start import supervised_update, warm_up_optimizer
        from ...training.policy import return_freed_memory

        optimizer = warm_up_optimizer(self.policy, self.config)
        stats = supervised_update(self.policy, optimizer, batch, self.config, packed=self.packed, dp=self.dp)
        del optimizer
        return_freed_memory()
        return stats

    @ray.method(num_returns=2)
    def gather_weights(self) -> tuple[list[tuple[str, Any]] | None, int]:
        """Rank 0: ``(HF name, tensor)`` of the whole policy and its size in bytes."""
        state = full_model_state(self.policy)
        if self.rank != 0:
            return None, 0
        return list(state.items()), sum(t.numel() * t.element_size() for t in state.values())

    def save(self, run_dir: str, step: int, state: dict[str, Any], tokenizer_path: str) -> None:
        """Every rank gathers; rank 0 writes the checkpoint in the local engine's format."""
        from ...models import load_tokenizer
        from ...training.checkpoint import save_checkpoint

        model_state = full_model_state(self.policy)
        optimizer_state = local_optimizer_state(self.policy, self.optimizer, self.names)
        if self.rank != 0:
            return
        save_checkpoint(run_dir, step, model=self.hf_model, tokenizer=load_tokenizer(tokenizer_path),
                        optimizer=None, scheduler=self.scheduler, state=state,
                        config=self.config.model_dump(mode="json"), keep=self.config.checkpoint.keep,
                        model_state=model_state, optimizer_state=optimizer_state)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class SharedTool:
    """A rollout worker's stand-in for an env tool served by a tool actor."""

    def __init__(self, name: str, description: str, parameters: dict[str, Any], actor: Any):
        self.name, self.description, self.parameters = name, description, parameters
        self._actor = actor

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any] | None = None) -> Any:
        sample = (ctx or {}).get("sample")
        try:
            return await self._actor.call.remote(arguments, {"sample": sample})
        except ray.exceptions.RayTaskError as exc:  # the tool raised: its own message
            raise RuntimeError(one_line(exc.cause) if exc.cause is not None else one_line(exc)) from None
        except ray.exceptions.RayActorError as exc:
            from ...tools import TransientToolError

            # transient: the tool manager retries it (max_retries) while Ray restarts the actor
            raise TransientToolError(f"the shared {self.name!r} tool's actor is unavailable "
                                     f"({type(exc).__name__}); Ray restarts it") from None


class ToolActor:
    """Serves one env tool to every rollout worker (``ray.tool_actors``)."""

    def __init__(self, config_json: dict[str, Any], name: str):
        quiet_worker(1)
        from ...task import build_env

        config = RunConfig.model_validate(config_json)
        tools = {t.name: t for t in member("env", build_env(config), "tools")}
        if name not in tools:
            raise ConfigError([f"ray.tool_actors.names: the {config.env!r} env has no tool {name!r}"])
        self.tool = tools[name]

    def describe(self) -> tuple[str, str, dict[str, Any]]:
        return self.tool.name, self.tool.description, self.tool.parameters

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any]) -> Any:
        return await self.tool.call(arguments, ctx)


class PooledReward:
    """A rollout worker's stand-in for a reward scored on the judge pool."""

    def __init__(self, name: str, pool: list[Any]):
        self.name, self.description = name, f"{name}, scored on the ray judge pool"
        self._pool = itertools.cycle(pool) if pool else None

    async def score(self, trajectory: Any, sample: Any) -> Any:
        if self._pool is None:
            raise RuntimeError(f"the {self.name!r} reward runs on the judge pool, which this process has no handle to")
        actor = next(self._pool)
        try:
            return await actor.score.remote(self.name, dataclasses.replace(trajectory, env_state=None), sample)
        except ray.exceptions.RayTaskError as exc:
            raise RuntimeError(one_line(exc.cause) if exc.cause is not None else one_line(exc)) from None
        except ray.exceptions.RayActorError as exc:  # counted as a reward error; Ray restarts the actor
            raise RuntimeError(f"the judge pool actor is unavailable ({type(exc).__name__})") from None


class JudgeActor:
    """Holds the judge-pool rewards (``ray.judge.rewards``), built once from their specs."""

    def __init__(self, config_json: dict[str, Any], threads: int):
        quiet_worker(threads)
        from ...plugins import get_component
        from ...preflight import judge_pool_problem

        config = RunConfig.model_validate(config_json)
        specs = {s.name: s for s in [*config.rewards, *(config.eval.rewards or [])]}
        self.rewards = {}
        for name in config.ray.judge.rewards:
            reward_cls = get_component("reward", name)
            problem = judge_pool_problem(name, reward_cls)  # checked before the run too (preflight)
            if problem:
                raise ConfigError([problem])
            self.rewards[name] = reward_cls(**specs[name].options)

    def ready(self) -> bool:
        return True

    async def score(self, name: str, trajectory: Any, sample: Any) -> Any:
        import inspect

        reward = self.rewards[name]
        if inspect.iscoroutinefunction(reward.score):
            return await reward.score(trajectory, sample)
        return await asyncio.get_running_loop().run_in_executor(None, reward.score, trajectory, sample)


class RolloutWorker:
    """Runs the agent loop and the rewards on its share of the prompts, with its own backend."""

    def __init__(self, threads: int):
        quiet_worker(threads)
        self.finished = 0  # rollout calls that returned
        self.pause: contextlib.AsyncExitStack | None = None  # generation paused for the ranks' update

    def pid(self) -> int:
        return os.getpid()

    def rollouts_done(self) -> int:
        return self.finished

    async def start(self, config_json: dict[str, Any], model_path: str, tokenizer_path: str,
                    tools: dict[str, Any], judges: list[Any], weights: Any = None, version: int | None = None) -> None:
        from ...models import load_tokenizer
        from ...task import build_task
        from ..local import LocalRollout

        config = RunConfig.model_validate(config_json)
        shared = {}
        for name, actor in tools.items():
            tool_name, description, parameters = await actor.describe.remote()
            shared[name] = SharedTool(tool_name, description, parameters, actor)
        pooled = set(config.ray.judge.rewards)
        task = build_task(config, shared_tools=shared,
                           make_reward=lambda spec: PooledReward(spec.name, judges) if spec.name in pooled else None)
        self.generation = await LocalRollout.open(config, task, model_path, load_tokenizer(tokenizer_path))
        if weights is not None:
            await self.generation.backend.update_weights(weights, version)
        elif version is not None:  # the checkpoint's weights, loaded from model_path
            self.generation.backend.weight_version = version

    async def rollout(self, samples: Sequence[Any], rollout_config: Any, group_size: int,
                      rewards: str, priority: int | None = None) -> tuple[list[Any], Any, dict[str, float]]:
        trajectories, scored, times = await self.generation.rollout(samples, rollout_config, group_size=group_size,
                                                                    rewards=rewards, priority=priority)
        for trajectory in trajectories:  # the env's live state stays here (connections, sandboxes)
            trajectory.env_state = None
        self.finished += 1
        return trajectories, scored, times

    async def rollout_groups(self, samples: Sequence[Any], rollout_config: Any, group_size: int,
                             rewards: str, priority: int | None = None) -> Any:
        """:meth:`rollout`, streamed (a Ray streaming generator): each sample's ``(index,
        trajectories, scored)`` as soon as its group finished."""
        async for index, trajectories, scored in self.generation.rollout_groups(
                samples, rollout_config, group_size=group_size, rewards=rewards, priority=priority):
            for trajectory in trajectories:  # the env's live state stays here
                trajectory.env_state = None
            yield index, trajectories, scored
        self.finished += 1

    async def update_weights(self, weights: list[tuple[str, Any]], version: int | None = None) -> float | None:
        return await self.generation.backend.update_weights(weights, version)

    async def pause_generation(self) -> float | None:
        """Freeze generation (the backend's ``paused()``) until :meth:`resume_generation`: the
        seconds it took to take effect, or None for a backend that cannot pause."""
        paused = getattr(self.generation.backend, "paused", None)
        if paused is None or self.pause is not None:
            return None
        pause = self.pause = contextlib.AsyncExitStack()  # before the await: a second call returns at once
        seconds = await pause.enter_async_context(paused())
        if self.pause is not pause:  # resumed while the pause took effect (the driver's update ended)
            await pause.aclose()
            return None
        return seconds

    async def resume_generation(self) -> None:
        pause, self.pause = self.pause, None
        if pause is not None:
            await pause.aclose()

    async def close(self) -> None:
        await self.resume_generation()  # a driver stopped inside its update never resumed it
        generation = getattr(self, "generation", None)
        if generation is not None:
            await generation.close()
