"""The ray engine's driver side: the cluster, placement, and the engine protocol's methods
sending work to the actors (:mod:`.actors`). See :mod:`rlfactory_core.engines.ray`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any, AsyncIterator, Sequence

import ray

from ...config import RunConfig
from ...errors import ConfigError, RLFactoryError, one_line
from ..base import RolloutGroup, RolloutResult, resumed_version
from .actors import JudgeActor, RolloutWorker, ToolActor, TrainerWorker, role_threads, threads_for

__all__ = ["RayEngine", "chunks", "remote"]


def chunks(count: int, parts: int) -> list[tuple[int, int]]:
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


def remote(cls: type) -> Any:
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
    """The engine protocol (:class:`rlfactory_core.engines.base.Engine`) on Ray actors; see
    :mod:`rlfactory_core.engines.ray`."""

    def __init__(self, config: RunConfig, *, base_path: Path, checkpoint: Path | None, console: Any = None):
        self.config, self.base_path, self.checkpoint = config, Path(base_path), checkpoint
        self.model_path = checkpoint / "model" if checkpoint else self.base_path
        self.config_json = config.model_dump(mode="json")
        self.console = console
        self.started_ray = False
        self.placement_groups: list[Any] = []
        self.trainers: list[Any] = []
        self.rollout_workers: list[Any] = []  # each published once started (a replacement too)
        self.started_from: list[Any] = []  # the weights (self.weights then) each worker started from
        self.replacing: list[asyncio.Lock] = []  # one replacement of a dead worker at a time, per index
        self.rollout_bundles: list[tuple[Any, int]] = []
        self.tool_actors: dict[str, Any] = {}
        self.judges: list[Any] = []
        self.weights: Any = None  # ObjectRef of the latest synced weights
        self.policy_version = 0  # of the trainer's weights (engines.base); set by start
        self.synced_version: int | None = None  # of self.weights (before the first sync: the loaded weights')
        self.restarts = 0  # rollout workers replaced, whole run
        self._next_worker = 0  # where a rollout of fewer prompts than workers starts (a resample's one)
        # this step's: the rollouts and pushes between two updates (an asynchronous schedule's
        # chunks overlap, so the window is the step's, not one rollout call's); reset by each update
        self.restarts_left = config.ray.max_restarts

    # ---- cluster and placement

    def _say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text)
        else:
            print(text, flush=True)

    def _connect(self) -> None:
        if ray.is_initialized():
            return
        with _python_signal_handlers():
            self._init_ray()

    def _init_ray(self) -> None:
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
            # Ray nices its workers to 15 to keep its own daemons responsive; in a cluster started
            # for this run the workers are the training, and at nice 15 any other busy process on
            # the machine takes their cores (a warm-up on two ranks beside two busy loops: 40 s
            # at nice 0, over 600 s at 15; bench/README.md "make test").
            ray.init(num_cpus=self.config.ray.num_cpus, num_gpus=self.config.ray.num_gpus,
                     _system_config={"worker_niceness": 0}, **quiet)
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

    def _check_resources(self, have: dict[str, float], where: str = "the cluster", *,
                         known: tuple[str, ...] | None = None) -> None:
        """Every role's request against ``have`` (a cluster's totals; only the ``known``
        resources when given), all shortfalls in one error."""
        need: dict[str, float] = {}
        for _, count, bundle in self._demands():
            for key, value in bundle.items():
                if known is None or key in known:
                    need[key] = need.get(key, 0.0) + count * value
        short = [f"{key}: the roles need {value:g}, {where} has {have.get(key, 0):g}"
                 for key, value in need.items() if value > have.get(key, 0) + 1e-9]
        if short:
            roles = "; ".join(f"{role} {count} x {bundle}" for role, count, bundle in self._demands())
            raise ConfigError([f"ray: {line}" for line in short],
                              hint=f"requested {roles}; lower ray.<role>.workers/cpus/gpus, add nodes, or for a "
                                   "local cluster raise ray.num_cpus / ray.num_gpus")

    def _local_cluster_resources(self) -> dict[str, float]:
        """The resources a local cluster started for this run is known to have before it
        starts: those the config pins (``ray.num_cpus``, ``ray.num_gpus``). What Ray would
        detect itself (cgroup quotas, GPUs) is checked once it runs."""
        r = self.config.ray
        pinned = {"CPU": r.num_cpus, "GPU": r.num_gpus}
        return {key: float(value) for key, value in pinned.items() if value is not None}

    async def _placement_group(self, role: str, count: int, bundle: dict[str, float], strategy: str) -> Any:
        from ray.util.placement_group import placement_group, remove_placement_group

        group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
        self.placement_groups.append(group)
        try:  # awaited, not ray.get: a stop request during a long wait cancels it
            await asyncio.wait_for(group.ready(), timeout=self.config.ray.placement_timeout_s)
        except TimeoutError:
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
        if not (self.config.ray.address or os.environ.get("RAY_ADDRESS")) and not ray.is_initialized():
            # A cluster this run would start: what the config pins is known before starting it.
            pinned = self._local_cluster_resources()
            self._check_resources(pinned, "the local cluster this run would start", known=tuple(pinned))
        self._connect()
        have = ray.cluster_resources()
        self._check_resources(have)
        turns = " (generation pauses while the ranks update)" if self.takes_turns() else ""
        self._say(f"ray engine: {r.trainer.workers} trainer rank(s), {r.rollout.workers} rollout worker(s), "
                  f"placement {r.placement}{turns}; cluster: {have.get('CPU', 0):g} CPU, {have.get('GPU', 0):g} GPU, "
                  f"{len(ray.nodes())} node(s)")
        if r.placement == "colocated":
            _, count, bundle = self._demands()[0]
            shared = await self._placement_group("trainer+rollout", count, bundle, "PACK")
            trainer_bundles = [(shared, i % count) for i in range(r.trainer.workers)]
            self.rollout_bundles = [(shared, i % count) for i in range(r.rollout.workers)]
        else:
            trainers = await self._placement_group("trainer", r.trainer.workers,
                                                   _bundle(r.trainer.cpus, r.trainer.gpus), "PACK")
            rollouts = await self._placement_group("rollout", r.rollout.workers,
                                                   _bundle(r.rollout.cpus, r.rollout.gpus), "SPREAD")
            trainer_bundles = [(trainers, i) for i in range(r.trainer.workers)]
            self.rollout_bundles = [(rollouts, i) for i in range(r.rollout.workers)]

        if r.tool_actors.names:
            group = await self._placement_group("tool_actors", len(r.tool_actors.names),
                                                _bundle(r.tool_actors.cpus, 0), "SPREAD")
            for i, name in enumerate(r.tool_actors.names):
                self.tool_actors[name] = remote(ToolActor).options(
                    max_restarts=-1, num_cpus=r.tool_actors.cpus, max_concurrency=r.tool_actors.max_concurrency,
                    scheduling_strategy=self._on(group, i)).remote(self.config_json, name)
            await self._ready("tool actor", [a.describe.remote() for a in self.tool_actors.values()])
        if r.judge.rewards:
            group = await self._placement_group("judge", r.judge.workers, _bundle(r.judge.cpus, r.judge.gpus), "SPREAD")
            self.judges = [remote(JudgeActor).options(max_restarts=-1, num_cpus=r.judge.cpus, num_gpus=r.judge.gpus,
                                                      max_concurrency=1000, scheduling_strategy=self._on(group, i))
                           .remote(self.config_json, threads_for(self.config, r.judge.cpus))
                           for i in range(r.judge.workers)]
            await self._ready("judge", [j.ready.remote() for j in self.judges])

        world = r.trainer.workers
        self.trainers = [remote(TrainerWorker).options(num_cpus=r.trainer.cpus, num_gpus=r.trainer.gpus,
                                                scheduling_strategy=self._on(group, index))
                         .remote(rank, world, role_threads(self.config, "trainer"))
                         for rank, (group, index) in enumerate(trainer_bundles)]
        address = await self._ready("trainer", [self.trainers[0].rendezvous_address.remote()])
        await self._ready("trainer", [t.setup.remote(self.config_json, address[0], str(self.model_path),
                                                     str(self.base_path),
                                                     str(self.checkpoint) if self.checkpoint else None)
                                      for t in self.trainers])
        state = None
        if self.checkpoint is not None:
            state = json.loads((self.checkpoint / "state.json").read_text(encoding="utf-8"))
        # the workers load the checkpoint's (or the base) weights: that version, until the first sync
        self.policy_version = self.synced_version = resumed_version(state)
        self.rollout_workers = [None] * r.rollout.workers
        self.started_from = [None] * r.rollout.workers
        self.replacing = [asyncio.Lock() for _ in range(r.rollout.workers)]
        await asyncio.gather(*(self._start_rollout_worker(i) for i in range(r.rollout.workers)))
        return state

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
        worker = remote(RolloutWorker).options(num_cpus=r.rollout.cpus, num_gpus=r.rollout.gpus,
                                        scheduling_strategy=self._on(group, bundle)).remote(
            role_threads(self.config, "rollout"))
        weights = self.weights
        await self._ready("rollout", [worker.start.remote(self.config_json, str(self.model_path),
                                                          str(self.base_path), self.tool_actors, self.judges,
                                                          weights, self.synced_version)])
        # published only now: a call meanwhile reaches the dead worker and waits for this one
        self.rollout_workers[index], self.started_from[index] = worker, weights
        return worker

    async def rollout(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                      rewards: str = "train", priority: int | None = None) -> RolloutResult:
        """The prompts in contiguous chunks, one per rollout worker, each with the sampling
        seeds its trajectories have on the local engine; a chunk whose worker dies runs
        again on its replacement."""
        spans = chunks(len(samples), len(self.rollout_workers))

        async def run(index: int, start: int, end: int) -> tuple[list[Any], Any, dict[str, float]]:
            chunk_config = rollout_config.model_copy(deep=True)
            if chunk_config.sampling.seed is not None:
                chunk_config.sampling.seed += start * group_size
            while True:
                worker = self.rollout_workers[index]
                try:
                    return await worker.rollout.remote(list(samples[start:end]), chunk_config, group_size, rewards,
                                                       priority)
                except ray.exceptions.RayTaskError as exc:  # raised in the worker: not a lost worker
                    raise _failure(f"rollout worker {index}", exc) from None
                except ray.exceptions.RayActorError as exc:
                    await self._replace_rollout_worker(index, worker, exc, f"running its {end - start} prompt(s) again")

        parts = await asyncio.gather(*(run(w, s, e) for w, (s, e) in zip(self._workers_for(spans), spans)))
        for (start, _), part in zip(spans, parts):
            for trajectory in part[0]:  # a worker numbers the groups of its chunk from 0
                trajectory.group += start
        trajectories = [t for part in parts for t in part[0]]
        times = {key: max(part[2].get(key, 0.0) for part in parts) for key in ("time/rollout", "time/reward")}
        times["ray/rollout_worker_restarts"] = float(self.restarts)
        from ...rewards import ScoredBatch

        return RolloutResult(trajectories, ScoredBatch.concat([part[1] for part in parts]), times)

    async def rollout_groups(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                             rewards: str = "train", priority: int | None = None) -> AsyncIterator[RolloutGroup]:
        """:meth:`rollout`'s chunks, each worker streaming its groups back as they finish
        (a Ray streaming generator), so the trajectories are :meth:`rollout`'s. A worker that
        dies is replaced and runs its chunk again; the groups it had sent are not sent twice."""
        spans = chunks(len(samples), len(self.rollout_workers))
        out: asyncio.Queue[Any] = asyncio.Queue()

        async def stream(index: int, start: int, end: int) -> None:
            chunk_config = rollout_config.model_copy(deep=True)
            if chunk_config.sampling.seed is not None:
                chunk_config.sampling.seed += start * group_size
            sent: set[int] = set()
            while True:
                worker = self.rollout_workers[index]
                generator = worker.rollout_groups.options(num_returns="streaming").remote(
                    list(samples[start:end]), chunk_config, group_size, rewards, priority)
                try:
                    async for ref in generator:
                        local, trajectories, scored = await ref
                        if local not in sent:
                            sent.add(local)
                            for trajectory in trajectories:  # a worker numbers its chunk's groups from 0
                                trajectory.group = start + local
                            await out.put(RolloutGroup(start + local, trajectories, scored))
                    return
                except ray.exceptions.RayTaskError as exc:
                    raise _failure(f"rollout worker {index}", exc) from None
                except ray.exceptions.RayActorError as exc:
                    await self._replace_rollout_worker(
                        index, worker, exc, f"running its {end - start} prompt(s) again (the {len(sent)} group(s) "
                                            f"it had sent are not sent twice)")
                finally:
                    with contextlib.suppress(Exception):
                        ray.cancel(generator)

        async def all_streams() -> None:
            try:
                await asyncio.gather(*(stream(w, s, e) for w, (s, e) in zip(self._workers_for(spans), spans)))
            except BaseException as exc:
                await out.put(exc)
                raise
            await out.put(None)

        feeder = asyncio.ensure_future(all_streams())
        try:
            while (item := await out.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)

    def _workers_for(self, spans: list[tuple[int, int]]) -> list[int]:
        """The rollout workers of a rollout's chunks: all of them from worker 0; a rollout of
        fewer chunks than workers (the concurrent one-prompt rollouts of
        :mod:`rlfactory_core.resampling`) goes round, so such rollouts spread over the workers.
        The seeds are the chunks', not the workers': any worker samples the same tokens."""
        count = len(self.rollout_workers)
        if len(spans) >= count:
            return list(range(len(spans)))
        first, self._next_worker = self._next_worker, (self._next_worker + len(spans)) % count
        return [(first + i) % count for i in range(len(spans))]

    async def _replace_rollout_worker(self, index: int, worker: Any, exc: Exception, then: str) -> None:
        """Dead rollout worker ``index`` replaced (counted against ``ray.max_restarts``), saying
        so. Every call that found ``worker`` dead comes here (the overlapping chunks of an
        asynchronous schedule, a weight push): the first replaces it, the others wait for that
        replacement, so one death costs one restart and one bundle."""
        async with self.replacing[index]:
            if self.rollout_workers[index] is not worker:  # replaced meanwhile
                return
            self._spend_restart(index, exc)
            self._say(f"rollout worker {index} died ({type(exc).__name__}); replacing it and {then}")
            with contextlib.suppress(Exception):
                ray.kill(worker)
            await self._start_rollout_worker(index)

    def _spend_restart(self, index: int, exc: Exception) -> None:
        """Count the replacement of dead rollout worker ``index`` against this step's
        ``ray.max_restarts`` (every rollout and weight push since the last update), or fail the step."""
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

    def takes_turns(self) -> bool:
        """Colocated ranks and rollout workers in an overlapping schedule: generation pauses
        while the ranks update (in ``sync`` nothing generates then)."""
        return self.config.ray.placement == "colocated" and self.config.train.mode != "sync"

    @contextlib.asynccontextmanager
    async def _generation_paused(self) -> AsyncIterator[float | None]:
        """Every rollout worker's generation frozen for the block, its requests kept, when
        :meth:`takes_turns`; yields the longest any took to pause (None: none paused). A worker
        found dead is left to the rollout's replacement (which starts unpaused); any other
        failure is raised, after the block's own."""
        if not self.takes_turns():
            yield None
            return
        workers = list(self.rollout_workers)

        async def resume() -> list[Any]:  # also after a pause cut short: a late one undoes itself
            return await asyncio.gather(*(w.resume_generation.remote() for w in workers), return_exceptions=True)

        try:
            paused = await asyncio.gather(*(w.pause_generation.remote() for w in workers), return_exceptions=True)
            self._raise_unless_dead("pausing its generation for the update", paused)
            seconds = [float(s) for s in paused if isinstance(s, (int, float))]
            yield max(seconds) if seconds else None
        except BaseException:
            await resume()  # the block's error is the one to see
            raise
        self._raise_unless_dead("resuming its generation after the update", await resume())

    @staticmethod
    def _raise_unless_dead(what: str, answers: list[Any]) -> None:
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, ray.exceptions.RayActorError):
                if isinstance(answer, ray.exceptions.RayTaskError):
                    raise _failure(f"a rollout worker, {what}", answer) from answer
                raise answer

    async def update(self, batch: Any, step: int) -> dict[str, float]:
        batch_ref = ray.put(batch)
        async with self._generation_paused() as pausing_s:
            results = await self._trainer_call("the update",
                                               [t.update.remote(batch_ref, step) for t in self.trainers])
        stats, trainer_logprobs = results[0]
        if pausing_s is not None:  # what taking turns cost the update: waiting for generation to pause
            stats["time/pause_generation"] = pausing_s
        if trainer_logprobs is not None:  # the engine protocol: as the local engine's update leaves it
            batch["trainer_logprobs"] = trainer_logprobs
        self.policy_version += 1
        self.restarts_left = self.config.ray.max_restarts  # a new step's window
        return stats

    async def supervised_update(self, batch: Any) -> dict[str, float]:
        batch_ref = ray.put(batch)
        stats = await self._trainer_call("the cold start",
                                         [t.supervised_update.remote(batch_ref) for t in self.trainers])
        self.policy_version += 1
        return stats[0]

    async def sync_weights(self) -> dict[str, float]:
        """Rank 0 gathers the full weights; one object goes to every rollout worker."""
        t = time.perf_counter()
        refs = [t_.gather_weights.remote() for t_ in self.trainers]
        await self._trainer_call("the weight gather", [size for _, size in refs])
        gathered = time.perf_counter() - t
        weights, size_ref = refs[0]
        self.weights, self.synced_version = weights, self.policy_version
        size = await size_ref

        pauses: list[float] = []

        version = self.synced_version

        async def push(index: int) -> None:
            while True:
                worker = self.rollout_workers[index]
                try:
                    pause = await worker.update_weights.remote(weights, version)
                    if pause is not None:
                        pauses.append(float(pause))
                    return
                except ray.exceptions.RayActorError as exc:  # lost since its rollout
                    await self._replace_rollout_worker(index, worker, exc, "giving it the new weights")
                if self.started_from[index] is weights:  # the replacement started from these weights
                    return

        await asyncio.gather(*(push(i) for i in range(len(self.rollout_workers))))
        total = time.perf_counter() - t
        mb = size / 2**20
        metrics = {"weight_sync/mb": mb, "weight_sync/gather_s": gathered,
                   "weight_sync/ms_per_mb": 1000 * total / max(mb, 1e-9)}
        if pauses:  # the longest any worker's generation was held (a replaced worker's start is not a pause)
            metrics["weight_sync/pause_s"] = max(pauses)
        return metrics

    async def save(self, run_dir: Path, step: int, *, state: dict[str, Any], tokenizer: Any) -> None:
        state = {**state, "policy_version": self.policy_version}
        refs = [t.save.remote(str(Path(run_dir).resolve()), step, state, str(self.base_path))
                for t in self.trainers]
        try:
            await asyncio.gather(*refs)
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


@contextlib.contextmanager
def _python_signal_handlers() -> Any:
    """Keep Python's SIGTERM/SIGINT handlers across ``ray.init``: Ray's core installs a fatal
    handler for SIGTERM in the driver ("*** SIGTERM received"), so `rlf ui`'s Stop (a SIGTERM)
    killed a ray run unsaved instead of reaching rlfactory_core.stopping's handler."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            if handler is not None:  # None: set outside Python, nothing of ours to put back
                signal.signal(sig, handler)
