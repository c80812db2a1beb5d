"""The ray engine (``engine: ray``): the training loop of :mod:`rlfactory_core.trainer`, with
its work placed on Ray actors.

Roles (``ray.*`` in the config sets each one's actors and resources):

* **Rollout workers** (``ray.rollout``): each builds the run's task (env, parser, tool
  manager, rewards) and its own generation backend (vLLM or hf), and runs the agent loop
  *and the rewards* on its share of the step's prompts, so the env's per-trajectory state
  and the tools stay where the episode ran. The prompts are split into contiguous chunks
  and each chunk keeps the sampling seeds it has on the local engine (trajectory ``i`` uses
  ``seed + i``), so the same weights give the same trajectories on either engine.
* **Trainer group** (``ray.trainer``): N actors in one ``torch.distributed`` group (gloo on
  CPU, NCCL on GPU). The policy, and the reference model when ``grpo.kl_coef > 0``, are
  sharded with FSDP2 (``fully_shard`` on every decoder layer, then on the whole model);
  each rank back-propagates every N-th micro-batch of the same batch, and the update is the
  single-process one (``trainer._update_policy`` with a ``_DataParallel``; tested to give
  the same weights as the local engine).
* **Judge pool** (``ray.judge``, used when ``ray.judge.rewards`` names rewards): those
  rewards (a judge model) are built once, on their own resources, and the rollout workers'
  reward layers send them the trajectories; timeouts, fallbacks and error counts stay the
  reward layer's.
* **Tool actors** (``ray.tool_actors.names``): one actor serves each named env tool for the
  whole job (one retriever in memory, one rate limit for an API); the rollout workers' tool
  managers call it like a local tool, so its failures reach the model as tool errors. The
  tool gets the sample in its context, not the env state.

Each step: the driver (``rlf train``) sends the prompts to the rollout workers and gathers
trajectories and rewards; builds the batch (advantages) and puts it in the object store
once; every trainer rank updates; rank 0 gathers the full weights from the shards
(``get_model_state_dict``, full and on CPU), and that one object goes to every rollout
worker, which loads it into its backend in place (``weight_sync/mb`` and
``weight_sync/ms_per_mb`` are logged). The latest weights stay in the object store, so a
replacement worker starts from them.

Faults: a rollout worker that dies is replaced (same placement bundle, latest weights) and
its prompts run again; one found dead when the new weights are pushed is replaced by a worker
that starts from them; both count against ``ray.max_restarts`` replacements a step, beyond
which the run fails saying so (0: any lost worker ends the run); tool and judge actors are
restarted by Ray, and the calls that failed meanwhile are tool errors or reward errors. A
trainer rank that dies ends the run with a message naming it: its shards are gone; resume
from the last checkpoint (``rlf train --resume``, on either engine).

Checkpoints are the local engine's format: rank 0 writes the full weights in HF format and
the optimizer state indexed like ``torch.optim.AdamW`` over the model's parameters, so a
ray run resumes on the local engine and a local run on the ray engine.

Placement: ``colocated`` (the default) gives trainer rank i and rollout worker i one bundle
(``cpus``/``gpus`` of both roles): they take turns (rollout, then update), as verl's hybrid
engine does; ``separate`` gives each role its own placement group. Requests the cluster
cannot meet are reported with what the cluster has. The cluster is ``ray.address``, else
``$RAY_ADDRESS``, else a local one started for the run (``ray.num_cpus``/``ray.num_gpus``);
an address where nothing answers is refused at once (``ray.init`` would retry it for minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import time
from pathlib import Path
from typing import Any, Sequence

import ray
import torch

from .config import RunConfig
from .errors import ConfigError, RLFactoryError, one_line

__all__ = ["RayEngine"]

_PREFIX = "lm."  # the FSDP root wraps the HF model as `lm`


# --------------------------------------------------------------------------- in the actors


def _quiet_worker(threads: int) -> None:
    """Per-actor process setup: torch threads (Ray's default is one per reserved CPU),
    no progress bars in the driver's log."""
    torch.set_num_threads(max(1, threads))
    with contextlib.suppress(Exception):
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()


def _threads(config: RunConfig, cpus: float) -> int:
    return config.train.threads or max(1, round(cpus))


def _role_threads(config: RunConfig, role: str) -> int:
    """Torch threads of a trainer rank or rollout worker: ``train.threads``, else its CPUs;
    colocated, the whole bundle's, since the two take turns (rollout, then update)."""
    r = config.ray
    cpus = r.trainer.cpus + r.rollout.cpus if r.placement == "colocated" else getattr(r, role).cpus
    return _threads(config, cpus)


class _ScoredLogitsModule(torch.nn.Module):
    """The FSDP root: the HF model, called for the logits of the scored positions only
    (``trainer._scored_logits``). The root's hooks gather the parameters outside the decoder
    layers (embeddings, final norm, head), so the forward must enter through the root."""

    computes_scored_logits = True

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, targets: Any) -> Any:
        from .trainer import _scored_logits

        return _scored_logits(self.lm, input_ids, attention_mask, position_ids, targets)


def _shard(model: torch.nn.Module) -> _ScoredLogitsModule:
    """``model`` sharded with FSDP2: each decoder layer is a unit, the rest is the root's.

    Gradients are summed over the ranks, not averaged: each rank's loss already carries the
    whole batch's normaliser (``trainer._update_policy``). A plain sum also avoids the
    average op, which gave gradients ~1/world^2 of the true ones over gloo (measured)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    root = _ScoredLogitsModule(model)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for layer in getattr(decoder, "layers", None) or []:
        fully_shard(layer)
    fully_shard(root)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return root


def _trainable_names(model: torch.nn.Module) -> list[str]:
    """The names of the parameters ``torch.optim.AdamW(p for p in model.parameters() if
    p.requires_grad)`` indexes, in its order (tied weights once)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


class _TrainerWorker:
    """One rank of the FSDP2 trainer group."""

    def __init__(self, rank: int, world: int, threads: int):
        _quiet_worker(threads)
        self.rank, self.world = rank, world

    def rendezvous_address(self) -> tuple[str, int]:
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, config_json: dict[str, Any], address: tuple[str, int], model_path: str,
              base_path: str, checkpoint: str | None) -> None:
        import torch.distributed as dist

        from .training.checkpoint import set_rng_state
        from .models import load_model
        from .trainer import _DataParallel, _attn_implementation, _load_policy, _scheduler, _use_packing

        config = self.config = RunConfig.model_validate(config_json)
        cuda = torch.cuda.is_available() and config.train.device != "cpu"
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{address[0]}:{address[1]}",
                                rank=self.rank, world_size=self.world)
        self.dp = _DataParallel(self.rank, self.world)
        policy = _load_policy(config, model_path, device)
        self.names = _trainable_names(policy)
        self.hf_model = policy  # its config and save_pretrained; the parameters are the shards
        self.policy = _shard(policy)
        self.reference = None
        if config.grpo.kl_coef > 0:
            reference = load_model(base_path, dtype=config.model.dtype, device=device).eval()
            reference.config._attn_implementation = _attn_implementation(config, device)  # noqa: SLF001
            reference.requires_grad_(False)
            self.reference = _shard(reference)
        self.packed = _use_packing(config, _attn_implementation(config, device))
        self.optimizer = torch.optim.AdamW([p for p in self.policy.parameters() if p.requires_grad],
                                           lr=config.train.lr, betas=tuple(config.train.betas),
                                           weight_decay=config.train.weight_decay)
        self.scheduler = _scheduler(self.optimizer, config)
        if checkpoint is not None:
            self._load_optimizer(Path(checkpoint))
            self.scheduler.load_state_dict(torch.load(Path(checkpoint) / "scheduler.pt", weights_only=False))
            set_rng_state(torch.load(Path(checkpoint) / "rng.pt", weights_only=False))

    def _load_optimizer(self, checkpoint: Path) -> None:
        """A local-format optimizer state (AdamW's, indexed by parameter order) into the shards."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        saved = torch.load(checkpoint / "optimizer.pt", weights_only=False)
        by_name = {"state": {_PREFIX + self.names[i]: s for i, s in saved["state"].items()},
                   "param_groups": [{**g, "params": [_PREFIX + self.names[i] for i in g["params"]]}
                                    for g in saved["param_groups"]]}
        set_optimizer_state_dict(self.policy, self.optimizer, by_name,
                                 options=StateDictOptions(full_state_dict=True))

    def update(self, batch: Any, step: int) -> dict[str, float]:
        from .trainer import _return_freed_memory, _update_policy

        stats = _update_policy(self.policy, self.reference, self.optimizer, batch, self.config, step=step,
                               packed=self.packed, dp=self.dp)
        _return_freed_memory()
        self.scheduler.step()
        stats["train/lr"] = self.scheduler.get_last_lr()[0]
        return stats

    def _full_model_state(self) -> dict[str, Any]:
        """The whole model on rank 0 (HF names), gathered from every rank's shards; ``{}`` elsewhere."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {name.removeprefix(_PREFIX): tensor for name, tensor in state.items()}

    @ray.method(num_returns=2)
    def gather_weights(self) -> tuple[list[tuple[str, Any]] | None, int]:
        """Rank 0: ``(HF name, tensor)`` of the whole policy and its size in bytes."""
        state = self._full_model_state()
        if self.rank != 0:
            return None, 0
        return list(state.items()), sum(t.numel() * t.element_size() for t in state.values())

    def save(self, run_dir: str, step: int, state: dict[str, Any], tokenizer_path: str) -> None:
        """Every rank gathers; rank 0 writes the checkpoint in the local engine's format."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        from .training.checkpoint import save_checkpoint
        from .models import load_tokenizer

        model_state = self._full_model_state()
        optimizer_state = get_optimizer_state_dict(
            self.policy, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return
        index = {name: i for i, name in enumerate(self.names)}
        by_index = {"state": {index[name.removeprefix(_PREFIX)]: s for name, s in optimizer_state["state"].items()},
                    "param_groups": [{**g, "params": [index[n.removeprefix(_PREFIX)] for n in g["params"]]}
                                     for g in optimizer_state["param_groups"]]}
        save_checkpoint(run_dir, step, model=self.hf_model, tokenizer=load_tokenizer(tokenizer_path),
                        optimizer=None, scheduler=self.scheduler, state=state,
                        config=self.config.model_dump(mode="json"), keep=self.config.checkpoint.keep,
                        model_state=model_state, optimizer_state=by_index)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class _SharedTool:
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
            from .tools import TransientToolError

            # transient: the tool manager retries it (max_retries) while Ray restarts the actor
            raise TransientToolError(f"the shared {self.name!r} tool's actor is unavailable "
                                     f"({type(exc).__name__}); Ray restarts it") from None


class _ToolActor:
    """Serves one env tool to every rollout worker (``ray.tool_actors``)."""

    def __init__(self, config_json: dict[str, Any], name: str):
        _quiet_worker(1)
        from .task import build_env

        config = RunConfig.model_validate(config_json)
        tools = {t.name: t for t in getattr(build_env(config), "tools", []) or []}
        if name not in tools:
            raise ConfigError([f"ray.tool_actors.names: the {config.env!r} env has no tool {name!r}"])
        self.tool = tools[name]

    def describe(self) -> tuple[str, str, dict[str, Any]]:
        return self.tool.name, self.tool.description, self.tool.parameters

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any]) -> Any:
        return await self.tool.call(arguments, ctx)


class _PooledReward:
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


class _JudgeActor:
    """Holds the judge-pool rewards (``ray.judge.rewards``), built once from their specs."""

    def __init__(self, config_json: dict[str, Any], threads: int):
        _quiet_worker(threads)
        import inspect

        from .plugins import get_component

        config = RunConfig.model_validate(config_json)
        specs = {s.name: s for s in [*config.rewards, *(config.eval.rewards or [])]}
        self.rewards = {}
        for name in config.ray.judge.rewards:
            reward = get_component("reward", name)(**specs[name].options)
            if "context" in inspect.signature(reward.score).parameters:
                raise ConfigError([f"ray.judge.rewards: {name!r} reads the env state or calls tools (its score "
                                   "takes a context), which live in the rollout workers; score it there"])
            self.rewards[name] = reward

    def ready(self) -> bool:
        return True

    async def score(self, name: str, trajectory: Any, sample: Any) -> Any:
        import inspect

        reward = self.rewards[name]
        if inspect.iscoroutinefunction(reward.score):
            return await reward.score(trajectory, sample)
        return await asyncio.get_running_loop().run_in_executor(None, reward.score, trajectory, sample)


class _RolloutWorker:
    """Runs the agent loop and the rewards on its share of the prompts, with its own backend."""

    def __init__(self, threads: int):
        _quiet_worker(threads)
        self.finished = 0  # rollout calls that returned

    def pid(self) -> int:
        return os.getpid()

    def rollouts_done(self) -> int:
        return self.finished

    async def start(self, config_json: dict[str, Any], model_path: str, tokenizer_path: str,
                    tools: dict[str, Any], judges: list[Any], weights: Any = None) -> None:
        from .models import load_tokenizer
        from .rollout import ChatTemplate
        from .task import build_task
        from .trainer import _LocalRollout, _make_backend

        config = RunConfig.model_validate(config_json)
        shared = {}
        for name, actor in tools.items():
            tool_name, description, parameters = await actor.describe.remote()
            shared[name] = _SharedTool(tool_name, description, parameters, actor)
        pooled = set(config.ray.judge.rewards)
        task = build_task(config, shared_tools=shared,
                           make_reward=lambda spec: _PooledReward(spec.name, judges) if spec.name in pooled else None)
        backend = _make_backend(config, model_path)
        if hasattr(backend, "start"):
            await backend.start()
        self.generation = _LocalRollout(task, backend, ChatTemplate(load_tokenizer(tokenizer_path)))
        if weights is not None:
            await backend.update_weights(weights)

    async def rollout(self, samples: Sequence[Any], rollout_config: Any, group_size: int,
                      rewards: str) -> tuple[list[Any], Any, dict[str, float]]:
        trajectories, scored, times = await self.generation.rollout(samples, rollout_config, group_size=group_size,
                                                                    rewards=rewards)
        for trajectory in trajectories:  # the env's live state stays here (connections, sandboxes)
            trajectory.env_state = None
        self.finished += 1
        return trajectories, scored, times

    async def update_weights(self, weights: list[tuple[str, Any]]) -> None:
        await self.generation.backend.update_weights(weights)

    async def close(self) -> None:
        generation = getattr(self, "generation", None)
        if generation is not None:
            await generation.backend.close()
            await generation.task.close_rewards()
            with contextlib.suppress(Exception):
                await generation.task.tool_manager.close()


# --------------------------------------------------------------------------- in the driver


def _merge_scored(parts: Sequence[Any]) -> Any:
    from collections import Counter

    from .rewards import ScoredBatch

    errors: Counter[str] = Counter()
    applied: Counter[str] = Counter()
    for part in parts:
        errors.update(part.errors)
        applied.update(part.applied)
    return ScoredBatch(totals=[t for p in parts for t in p.totals],
                       components=[c for p in parts for c in p.components],
                       correct=[c for p in parts for c in p.correct], errors=errors, applied=applied)


def _chunks(count: int, parts: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ``parts`` contiguous, near-equal chunks of ``count`` items (no empty ones)."""
    parts = max(1, min(parts, count))
    size, extra = divmod(count, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def _failure(where: str, exc: Any) -> RLFactoryError:
    """An exception raised inside an actor, for the driver: an RLFactoryError (a config
    problem found in the actor) as it is, anything else in one line naming where."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, RLFactoryError):
        return cause
    return RLFactoryError(f"{where}: {type(cause or exc).__name__}: {one_line(cause or exc)}",
                          hint="the actor's traceback is in the Ray logs (/tmp/ray/session_latest/logs); "
                               "set ray.worker_logs=true to see it here")


def _remote(cls: type) -> Any:
    """The Ray actor class of ``cls``. Made here, not with ``@ray.remote`` on the class: the
    module attribute must stay the class itself, so that cloudpickle sends it by reference
    (the module is importable in every worker) instead of by value with its globals."""
    return ray.remote(cls)


_JOIN_TIMEOUT_S = 10.0


def _unreachable(address: str, timeout: float = _JOIN_TIMEOUT_S) -> str | None:
    """Why nothing answers at a cluster address (``host:port``, ``ray://host:port``), or
    None when a TCP connection opens (or the address is ``auto``/``local``, Ray's own to
    resolve). Checked before ``ray.init``, which retries an address where nothing listens
    20 times (Ray 2.60: still retrying after 200 s, ~40 s an attempt even with
    ``RAY_gcs_server_request_timeout_seconds=5``; ~14 minutes in all at that rate)."""
    import socket

    target = address.removeprefix("ray://").rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return None  # "auto", "local" or a malformed address: ray.init says what it makes of it
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({type(exc).__name__}: {exc.strerror or exc})"


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}


class RayEngine:
    """The engine interface of ``trainer._LocalEngine`` (start, rollout, update,
    sync_weights, save, close) on Ray actors; see the module docstring."""

    def __init__(self, config: RunConfig, *, base_path: Path, checkpoint: Path | None, console: Any = None):
        self.config, self.base_path, self.checkpoint = config, Path(base_path), checkpoint
        self.model_path = checkpoint / "model" if checkpoint else self.base_path
        self.config_json = config.model_dump(mode="json")
        self.console = console
        self.started_ray = False
        self.placement_groups: list[Any] = []
        self.trainers: list[Any] = []
        self.rollout_workers: list[Any] = []
        self.rollout_bundles: list[tuple[Any, int]] = []
        self.tool_actors: dict[str, Any] = {}
        self.judges: list[Any] = []
        self.weights: Any = None  # ObjectRef of the latest synced weights
        self.restarts = 0  # rollout workers replaced, whole run
        self.restarts_left = config.ray.max_restarts  # this step's: reset by each rollout, spent by the push too

    # ---- cluster and placement

    def _say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text)
        else:
            print(text, flush=True)

    def _connect(self) -> None:
        if ray.is_initialized():
            return
        address = self.config.ray.address or os.environ.get("RAY_ADDRESS")
        quiet = {"include_dashboard": False, "log_to_driver": self.config.ray.worker_logs,
                 "configure_logging": True, "logging_level": "warning"}
        if address:
            hint = ("start it with `ray start --head` (see the README), or unset ray.address / RAY_ADDRESS "
                    "to start a local one")
            unreachable = _unreachable(address)
            if unreachable:
                raise RLFactoryError(f"cannot join the Ray cluster at {address}: {unreachable}", hint=hint)
            try:
                ray.init(address=address, **quiet)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise RLFactoryError(f"cannot join the Ray cluster at {address}: {one_line(exc)}", hint=hint) from exc
        else:
            ray.init(num_cpus=self.config.ray.num_cpus, num_gpus=self.config.ray.num_gpus, **quiet)
            self.started_ray = True

    def _demands(self) -> list[tuple[str, int, dict[str, float]]]:
        """``(role, bundles, bundle)`` of every placement group the run needs."""
        r = self.config.ray
        out = []
        if r.placement == "colocated":
            out.append(("trainer+rollout", max(r.trainer.workers, r.rollout.workers),
                        _bundle(r.trainer.cpus + r.rollout.cpus, r.trainer.gpus + r.rollout.gpus)))
        else:
            out.append(("trainer", r.trainer.workers, _bundle(r.trainer.cpus, r.trainer.gpus)))
            out.append(("rollout", r.rollout.workers, _bundle(r.rollout.cpus, r.rollout.gpus)))
        if r.judge.rewards:
            out.append(("judge", r.judge.workers, _bundle(r.judge.cpus, r.judge.gpus)))
        if r.tool_actors.names:
            out.append(("tool_actors", len(r.tool_actors.names), _bundle(r.tool_actors.cpus, 0)))
        return out

    def _check_resources(self) -> None:
        """Every role's request against the cluster's totals, all shortfalls in one error."""
        have = ray.cluster_resources()
        need: dict[str, float] = {}
        for _, count, bundle in self._demands():
            for key, value in bundle.items():
                need[key] = need.get(key, 0.0) + count * value
        short = [f"{key}: the roles need {value:g}, the cluster has {have.get(key, 0):g}"
                 for key, value in need.items() if value > have.get(key, 0) + 1e-9]
        if short:
            roles = "; ".join(f"{role} {count} x {bundle}" for role, count, bundle in self._demands())
            raise ConfigError([f"ray: {line}" for line in short],
                              hint=f"requested {roles}; lower ray.<role>.workers/cpus/gpus, add nodes, or for a "
                                   "local cluster raise ray.num_cpus / ray.num_gpus")

    def _placement_group(self, role: str, count: int, bundle: dict[str, float], strategy: str) -> Any:
        from ray.util.placement_group import placement_group, remove_placement_group

        group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
        self.placement_groups.append(group)
        try:
            ray.get(group.ready(), timeout=self.config.ray.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            self.placement_groups.remove(group)
            raise RLFactoryError(
                f"the Ray cluster could not place the {role} role ({count} x {bundle}) within "
                f"{self.config.ray.placement_timeout_s:g} s; available now: {ray.available_resources()}",
                hint="a bundle must fit on one node; free resources, lower ray.<role>.cpus/gpus, or "
                     "raise ray.placement_timeout_s") from None
        return group

    @staticmethod
    def _on(group: Any, index: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index,
                                                placement_group_capture_child_tasks=True)

    # ---- the engine interface

    async def start(self) -> dict[str, Any] | None:
        import json

        r = self.config.ray
        self._connect()
        self._check_resources()
        have = ray.cluster_resources()
        self._say(f"ray engine: {r.trainer.workers} trainer rank(s), {r.rollout.workers} rollout worker(s), "
                  f"placement {r.placement}; cluster: {have.get('CPU', 0):g} CPU, {have.get('GPU', 0):g} GPU, "
                  f"{len(ray.nodes())} node(s)")
        if r.placement == "colocated":
            _, count, bundle = self._demands()[0]
            shared = self._placement_group("trainer+rollout", count, bundle, "PACK")
            trainer_bundles = [(shared, i % count) for i in range(r.trainer.workers)]
            self.rollout_bundles = [(shared, i % count) for i in range(r.rollout.workers)]
        else:
            trainers = self._placement_group("trainer", r.trainer.workers, _bundle(r.trainer.cpus, r.trainer.gpus),
                                             "PACK")
            rollouts = self._placement_group("rollout", r.rollout.workers, _bundle(r.rollout.cpus, r.rollout.gpus),
                                             "SPREAD")
            trainer_bundles = [(trainers, i) for i in range(r.trainer.workers)]
            self.rollout_bundles = [(rollouts, i) for i in range(r.rollout.workers)]

        if r.tool_actors.names:
            group = self._placement_group("tool_actors", len(r.tool_actors.names), _bundle(r.tool_actors.cpus, 0),
                                          "SPREAD")
            for i, name in enumerate(r.tool_actors.names):
                self.tool_actors[name] = _remote(_ToolActor).options(
                    max_restarts=-1, num_cpus=r.tool_actors.cpus, max_concurrency=r.tool_actors.max_concurrency,
                    scheduling_strategy=self._on(group, i)).remote(self.config_json, name)
            await self._ready("tool actor", [a.describe.remote() for a in self.tool_actors.values()])
        if r.judge.rewards:
            group = self._placement_group("judge", r.judge.workers, _bundle(r.judge.cpus, r.judge.gpus), "SPREAD")
            self.judges = [_remote(_JudgeActor).options(max_restarts=-1, num_cpus=r.judge.cpus, num_gpus=r.judge.gpus, max_concurrency=1000,
                                               scheduling_strategy=self._on(group, i))
                           .remote(self.config_json, _threads(self.config, r.judge.cpus))
                           for i in range(r.judge.workers)]
            await self._ready("judge", [j.ready.remote() for j in self.judges])

        world = r.trainer.workers
        self.trainers = [_remote(_TrainerWorker).options(num_cpus=r.trainer.cpus, num_gpus=r.trainer.gpus,
                                                scheduling_strategy=self._on(group, index))
                         .remote(rank, world, _role_threads(self.config, "trainer"))
                         for rank, (group, index) in enumerate(trainer_bundles)]
        address = await self._ready("trainer", [self.trainers[0].rendezvous_address.remote()])
        await self._ready("trainer", [t.setup.remote(self.config_json, address[0], str(self.model_path),
                                                     str(self.base_path),
                                                     str(self.checkpoint) if self.checkpoint else None)
                                      for t in self.trainers])
        self.rollout_workers = [None] * r.rollout.workers
        await asyncio.gather(*(self._start_rollout_worker(i) for i in range(r.rollout.workers)))
        if self.checkpoint is None:
            return None
        return json.loads((self.checkpoint / "state.json").read_text(encoding="utf-8"))

    async def _ready(self, role: str, refs: list[Any]) -> list[Any]:
        """The results of a role's start-up calls; a config problem raised in an actor comes
        back as the ConfigError it is."""
        try:
            return await asyncio.gather(*refs)
        except ray.exceptions.RayTaskError as exc:
            raise _failure(f"the {role} role, starting", exc) from None
        except ray.exceptions.RayActorError as exc:
            raise RLFactoryError(f"a {role} actor died while starting: {one_line(exc)}",
                                 hint="check memory (each actor loads the model) and the Ray logs in "
                                      "/tmp/ray/session_latest/logs") from None

    async def _start_rollout_worker(self, index: int) -> Any:
        r = self.config.ray
        group, bundle = self.rollout_bundles[index]
        worker = _remote(_RolloutWorker).options(num_cpus=r.rollout.cpus, num_gpus=r.rollout.gpus,
                                        scheduling_strategy=self._on(group, bundle)).remote(
            _role_threads(self.config, "rollout"))
        self.rollout_workers[index] = worker
        await self._ready("rollout", [worker.start.remote(self.config_json, str(self.model_path),
                                                          str(self.base_path), self.tool_actors, self.judges,
                                                          self.weights)])
        return worker

    async def rollout(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                      rewards: str = "train") -> tuple[list[Any], Any, dict[str, float]]:
        """The prompts in contiguous chunks, one per rollout worker, each with the sampling
        seeds its trajectories have on the local engine; a chunk whose worker dies runs
        again on its replacement."""
        chunks = _chunks(len(samples), len(self.rollout_workers))
        self.restarts_left = self.config.ray.max_restarts

        async def run(index: int, start: int, end: int) -> tuple[list[Any], Any, dict[str, float]]:
            chunk_config = rollout_config.model_copy(deep=True)
            if chunk_config.sampling.seed is not None:
                chunk_config.sampling.seed += start * group_size
            while True:
                worker = self.rollout_workers[index]
                try:
                    return await worker.rollout.remote(list(samples[start:end]), chunk_config, group_size, rewards)
                except ray.exceptions.RayTaskError as exc:  # raised in the worker: not a lost worker
                    raise _failure(f"rollout worker {index}", exc) from None
                except ray.exceptions.RayActorError as exc:
                    self._spend_restart(index, exc)
                    self._say(f"rollout worker {index} died ({type(exc).__name__}); replacing it and running its "
                              f"{end - start} prompt(s) again")
                    with contextlib.suppress(Exception):
                        ray.kill(worker)
                    await self._start_rollout_worker(index)

        parts = await asyncio.gather(*(run(i, s, e) for i, (s, e) in enumerate(chunks)))
        trajectories = [t for part in parts for t in part[0]]
        times = {key: max(part[2].get(key, 0.0) for part in parts) for key in ("time/rollout", "time/reward")}
        times["ray/rollout_worker_restarts"] = float(self.restarts)
        return trajectories, _merge_scored([part[1] for part in parts]), times

    def _spend_restart(self, index: int, exc: Exception) -> None:
        """Count the replacement of dead rollout worker ``index`` against this step's
        ``ray.max_restarts`` (rollout and weight push together), or fail the step."""
        if self.restarts_left == 0:
            raise RLFactoryError(
                f"rollout worker {index} died and the {self.config.ray.max_restarts} replacement(s) a step that "
                f"ray.max_restarts allows are used up ({one_line(exc)})",
                hint="check the Ray logs (/tmp/ray/session_latest/logs) and memory; raise ray.max_restarts, or "
                     "resume with `rlf train --resume RUN_DIR`") from None
        self.restarts_left -= 1
        self.restarts += 1

    async def _trainer_call(self, what: str, refs: list[Any]) -> list[Any]:
        try:
            return await asyncio.gather(*refs)
        except ray.exceptions.RayTaskError as exc:
            raise _failure(f"the trainer group, during {what}", exc) from None
        except ray.exceptions.RayActorError as exc:
            raise RLFactoryError(f"a trainer rank died during {what} ({one_line(exc)}); its shards are lost",
                                 hint="resume from the last checkpoint with `rlf train --resume RUN_DIR` "
                                      "(engine ray or local)") from None

    async def update(self, batch: Any, step: int) -> dict[str, float]:
        batch_ref = ray.put(batch)
        stats = await self._trainer_call("the update", [t.update.remote(batch_ref, step) for t in self.trainers])
        return stats[0]

    async def sync_weights(self) -> dict[str, float]:
        """Rank 0 gathers the full weights; one object goes to every rollout worker."""
        t = time.perf_counter()
        refs = [t_.gather_weights.remote() for t_ in self.trainers]
        await self._trainer_call("the weight gather", [size for _, size in refs])
        gathered = time.perf_counter() - t
        weights, size_ref = refs[0]
        self.weights = weights
        size = await size_ref

        async def push(index: int, worker: Any) -> None:
            try:
                await worker.update_weights.remote(weights)
            except ray.exceptions.RayActorError as exc:
                # lost since its rollout: the replacement starts from these weights (self.weights)
                self._spend_restart(index, exc)
                self._say(f"rollout worker {index} died ({type(exc).__name__}); replacing it with the new weights")
                with contextlib.suppress(Exception):
                    ray.kill(worker)
                await self._start_rollout_worker(index)

        await asyncio.gather(*(push(i, w) for i, w in enumerate(self.rollout_workers)))
        total = time.perf_counter() - t
        mb = size / 2**20
        return {"weight_sync/mb": mb, "weight_sync/gather_s": gathered,
                "weight_sync/ms_per_mb": 1000 * total / max(mb, 1e-9)}

    def save(self, run_dir: Path, step: int, *, state: dict[str, Any], tokenizer: Any) -> None:
        refs = [t.save.remote(str(Path(run_dir).resolve()), step, state, str(self.base_path))
                for t in self.trainers]
        try:
            ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            raise RLFactoryError(f"a trainer rank died while saving step {step} ({one_line(exc)})",
                                 hint="resume from the last checkpoint with `rlf train --resume RUN_DIR`") from None

    async def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        if not ray.is_initialized():
            return
        closing = [w.close.remote() for w in self.rollout_workers if w is not None]
        closing += [t.close.remote() for t in self.trainers]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True), 60)
        for actor in [*self.rollout_workers, *self.trainers, *self.tool_actors.values(), *self.judges]:
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
        for group in self.placement_groups:
            with contextlib.suppress(Exception):
                remove_placement_group(group)
        self.placement_groups.clear()
        if self.started_ray:
            ray.shutdown()
