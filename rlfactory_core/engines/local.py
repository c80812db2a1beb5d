"""The local engine: the policy, its optimizer and one generation backend in this process.

:class:`LocalRollout` is the rollout half (the agent loop and the rewards with one
backend); the local engine uses it, ``rlf eval`` uses it alone, and so does each of the ray
engine's rollout workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from pathlib import Path
from typing import Any, AsyncIterator, Sequence

from ..config import RunConfig
from ..errors import ConfigError, one_line
from ..rollout.priority import OldestFirstGate, gated
from ..task import Task
from ..threads import DaemonThreadPool
from ..training.policy import (attn_implementation, build_optimizer, load_policy, load_reference,
                               return_freed_memory, step_scheduler, training_device, use_packing,
                               weights_for_backend)
from ..training.update import update_policy
from ..training.weight_push import ChangedWeights, pushes_changed_only
from .base import RolloutGroup, RolloutResult, resumed_version

__all__ = ["LocalEngine", "LocalRollout", "backend_for", "oldest_first", "overlap_core_split", "takes_turns"]


def backend_for(config: RunConfig, model_path: Path | str) -> Any:
    """The config's generation backend (``backend``, ``backend_options``) for ``model_path``;
    options the backend does not take are a config error."""
    from ..rollout import make_backend

    name = config.backend
    try:
        return make_backend(name, str(model_path), **config.backend_options)
    except TypeError as exc:
        raise ConfigError([f"backend_options: the {name!r} backend does not take these options "
                           f"({one_line(exc)})"], hint="vllm takes max_num_seqs, kv_cache_gib, ...; hf takes "
                                                    "max_batch_size, dtype, device") from exc


def oldest_first(config: RunConfig) -> bool:
    """Whether a rollout gives the oldest step's turns the backend first
    (``train.generation_order``; :mod:`rlfactory_core.rollout.priority`): only the schedules
    that overlap rollouts need an order; ``auto`` orders them when generation runs on a CPU."""
    if config.train.mode == "sync" or config.train.generation_order == "backend":
        return False
    if config.train.generation_order == "oldest_first":
        return True
    import torch

    return not torch.cuda.is_available()


def takes_turns(config: RunConfig) -> bool:
    """Whether an overlapping schedule (``train.mode`` other than sync) on the local engine on a
    CPU pauses generation while the update computes, both using every core
    (``train.overlap_cores``: take_turns, the default). With vLLM on 2 cores, both computing on
    the same cores at once oversubscribed them (0.56-0.68x of sync); split between them, the
    update ran on one core (0.67-0.93x of sync where both phases compute); taking turns, each
    phase has every core while the rollout's waits (tools, servers) still overlap the update
    (0.94-0.98x there over 3 seeds, and async 1.29x against split's 1.10x with 8-12 s searches:
    bench/README.md, ``bench/async_modes.py``). The hf backend generates on a thread of this
    process, whose torch threads would contend with the update's the same way, and cannot be
    given cores of its own: it takes turns too (``split`` leaves it on every core)."""
    import torch

    if config.train.mode == "sync" or config.train.overlap_cores == "split":
        return False
    return training_device(config).type == "cpu" and not torch.cuda.is_available()


def overlap_core_split(config: RunConfig) -> tuple[list[int], list[int]] | None:
    """``(rollout cores, update cores)`` for an overlapping schedule (``train.mode`` other than
    sync) on the local engine on a CPU with vLLM, with ``train.overlap_cores: split``: the first
    half of this process's cores for vLLM's worker, the rest for the update (its threads and its
    thread's affinity). None when the cores are not split (sync, ``take_turns``, a GPU, one
    core, the hf backend) or the user chose (``train.threads``, vLLM's binding variables)."""
    import torch

    from ..rollout.backends.vllm_cpu import BINDING_VARIABLES

    cores = sorted(os.sched_getaffinity(0))
    if config.train.mode == "sync" or config.train.overlap_cores != "split" or config.backend == "hf" \
            or config.train.threads or len(cores) < 2 \
            or any(name in os.environ for name in BINDING_VARIABLES) \
            or training_device(config).type != "cpu" or torch.cuda.is_available():
        return None
    half = len(cores) // 2
    return cores[:half], cores[half:]


_NOT_PAUSED = contextlib.nullcontext()


class LocalRollout:
    """Rollout and rewards with one generation backend, in this process (also what each of
    the ray engine's rollout workers runs)."""

    def __init__(self, task: Task, backend: Any, family: Any, gate: OldestFirstGate | None = None):
        self.task, self.backend, self.family, self.gate = task, backend, family, gate

    @classmethod
    async def open(cls, config: RunConfig, task: Task, model_path: Path | str, tokenizer: Any,
                   processor: Any = None) -> LocalRollout:
        """The config's backend for ``model_path``, started (a backend that fails to start is
        closed), with ``task``, the model family (its chat template, the task's tool-call
        format) and, by ``train.generation_order``, the gate that lets the oldest step's turns
        go first (:mod:`rlfactory_core.rollout.priority`)."""
        from ..families import build_family

        family = build_family(config, task, tokenizer, processor)  # a config error before the engine starts
        backend = backend_for(config, model_path)
        try:
            if hasattr(backend, "start"):  # vLLM starts its engine processes; hf needs nothing
                await backend.start()
        except BaseException:
            await backend.close()
            raise
        return cls(task, backend, family,
                   OldestFirstGate() if oldest_first(config) else None)

    async def rollout(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                      rewards: str = "train", priority: int | None = None) -> RolloutResult:
        """``group_size`` trajectories per sample, scored by the run's ``train`` or ``eval``
        rewards, their turns generated at ``priority`` (the step they are for: see
        :class:`~rlfactory_core.engines.base.Engine`); also the phases' times (``time/rollout``,
        ``time/reward``)."""
        from ..rollout import rollout

        t = time.perf_counter()
        trajectories = await rollout(samples, env=self.task.env, family=self.family,
                                     tool_manager=self.task.tool_manager, backend=gated(self.backend, self.gate, priority),
                                     config=rollout_config, group_size=group_size)
        times = {"time/rollout": time.perf_counter() - t}
        t = time.perf_counter()
        layer = self.task.rewards if rewards == "train" else self.task.eval_rewards
        scored = await layer.score(trajectories, [samples[t.group] for t in trajectories])
        times["time/reward"] = time.perf_counter() - t
        return RolloutResult(trajectories, scored, times)

    async def rollout_groups(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                             rewards: str = "train", priority: int | None = None) -> AsyncIterator[RolloutGroup]:
        """:meth:`rollout`, each sample's group scored and yielded as soon as it finished."""
        from ..rollout import rollout_groups

        layer = self.task.rewards if rewards == "train" else self.task.eval_rewards
        stream = rollout_groups(samples, env=self.task.env, family=self.family,
                                tool_manager=self.task.tool_manager, backend=gated(self.backend, self.gate, priority),
                                config=rollout_config, group_size=group_size)
        async with contextlib.aclosing(stream):
            async for trajectories in stream:
                index = trajectories[0].group
                scored = await layer.score(trajectories, [samples[index]] * len(trajectories))
                yield RolloutGroup(index, trajectories, scored)

    async def close(self) -> None:
        """The backend, then the task (rewards, tool servers)."""
        try:
            await self.backend.close()
        finally:
            await self.task.close()


class LocalEngine:
    """The policy (and the reference model), its optimizer, and the generation backend, all
    in this process."""

    def __init__(self, config: RunConfig, task: Task, tokenizer: Any, *, base_path: Path,
                 checkpoint: Path | None, processor: Any = None):
        self.config, self.task, self.tokenizer, self.processor = config, task, tokenizer, processor
        self.base_path, self.checkpoint = base_path, checkpoint
        self.policy_version = 0  # of the trainer's weights (engines.base); start sets a resumed run's

    async def start(self) -> dict[str, Any] | None:
        """Load the models and the backend; the checkpoint's state (None for a new run)."""
        from ..training.checkpoint import load_checkpoint

        config, checkpoint = self.config, self.checkpoint
        device = training_device(config)
        model_path = checkpoint / "model" if checkpoint else self.base_path
        adapter = checkpoint / "adapter" if checkpoint and (checkpoint / "adapter").exists() else None
        # Every update on one thread: glibc gives each thread its own malloc arena, and the
        # gigabytes an update frees would otherwise stay behind in whichever arena the executor's
        # thread of the moment used (a deepsearch run grew ~3 GB a step and was OOM-killed).
        # A daemon thread: a run stopped without saving exits without waiting for the update.
        self.train_thread = DaemonThreadPool(1, thread_name_prefix="rlf-train")
        self.policy = load_policy(config, self.base_path if adapter else model_path, device, adapter)
        self.reference = load_reference(config, self.base_path, device, self.policy)
        self.packed = use_packing(config, attn_implementation(config, device, self.policy), self.policy)
        self.optimizer, self.scheduler = build_optimizer(self.policy, config)
        state = None
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, optimizer=self.optimizer, scheduler=self.scheduler)
        self.policy_version = resumed_version(state)
        import torch

        from ..rollout.backends.vllm_cpu import environment

        split = overlap_core_split(config)
        binding = {}
        if split is not None:  # rollout and update side by side: each its own cores, not both on all
            rollout_cpus, train_cpus = split
            binding = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, rollout_cpus))}
            torch.set_num_threads(len(train_cpus))
            await self._on_train_thread(os.sched_setaffinity, 0, train_cpus)  # this thread (Linux: per thread)
        with environment(binding):
            self.generation = await LocalRollout.open(config, self.task, model_path, self.tokenizer, self.processor)
        self.backend = self.generation.backend
        self.backend.weight_version = self.policy_version
        self.pushed = ChangedWeights(getattr(self.backend, "weight_dtype", None)) \
            if pushes_changed_only(config) else None
        return state

    async def rollout(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                      rewards: str = "train", priority: int | None = None) -> RolloutResult:
        return await self.generation.rollout(samples, rollout_config, group_size=group_size, rewards=rewards,
                                             priority=priority)

    async def rollout_groups(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                             rewards: str = "train", priority: int | None = None) -> AsyncIterator[RolloutGroup]:
        stream = self.generation.rollout_groups(samples, rollout_config, group_size=group_size, rewards=rewards,
                                                priority=priority)
        async with contextlib.aclosing(stream):
            async for group in stream:
                yield group

    async def update(self, batch: Any, step: int) -> dict[str, float]:
        paused = getattr(self.backend, "paused", None) if takes_turns(self.config) else None
        async with (paused() if paused is not None else _NOT_PAUSED) as pausing_s:
            stats = await self._on_train_thread(update_policy, self.policy, self.reference, self.optimizer, batch,
                                                self.config, step=step, packed=self.packed)
        if pausing_s is not None:  # what taking turns cost the update: waiting for generation to pause
            stats["time/pause_generation"] = pausing_s
        return_freed_memory()
        step_scheduler(self.scheduler)
        self.policy_version += 1
        stats["train/lr"] = self.scheduler.get_last_lr()[0]
        return stats

    async def supervised_update(self, batch: Any) -> dict[str, float]:
        from ..training.cold_start import supervised_update, warm_up_optimizer

        def warm_up() -> dict[str, float]:
            optimizer = warm_up_optimizer(self.policy, self.config)  # its own, dropped afterwards
            return supervised_update(self.policy, optimizer, batch, self.config, packed=self.packed)

        stats = await self._on_train_thread(warm_up)
        return_freed_memory()
        self.policy_version += 1
        return stats

    async def sync_weights(self) -> dict[str, float]:
        def changed() -> tuple[list[tuple[str, Any]], dict[str, float]]:
            weights = weights_for_backend(self.policy)
            return (weights, {}) if self.pushed is None else self.pushed.select(weights)

        # on the training thread: LoRA merges into the policy, and the comparison takes a while
        weights, metrics = await self._on_train_thread(changed)
        pause = await self.backend.update_weights(weights, version=self.policy_version)
        return metrics if pause is None else {**metrics, "weight_sync/pause_s": float(pause)}

    async def save(self, run_dir: Path, step: int, *, state: dict[str, Any], tokenizer: Any) -> None:
        from ..training.checkpoint import save_checkpoint

        # on the training thread: the policy's tensors are read where they are written
        await self._on_train_thread(
            save_checkpoint, run_dir, step, model=self.policy, tokenizer=tokenizer, optimizer=self.optimizer,
            scheduler=self.scheduler, state={**state, "policy_version": self.policy_version},
            config=self.config.model_dump(mode="json"),
            keep=self.config.checkpoint.keep)

    async def _on_train_thread(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            self.train_thread, functools.partial(function, *args, **kwargs))

    async def close(self) -> None:
        if hasattr(self, "train_thread"):
            self.train_thread.shutdown()
        if hasattr(self, "backend"):
            await self.backend.close()
