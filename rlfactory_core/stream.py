"""The asynchronous schedule's rollouts (:mod:`rlfactory_core.loops.asynchronous`): groups
generated continuously, each step's batch assembled from its finished groups, no token older
than ``train.max_staleness`` versions.

**Chunks.** A chunk is one streamed rollout (:meth:`Engine.rollout_groups`) of consecutive
prompts for one step: ``grpo.prompts_per_step`` of them (attempt 0), then, with
``grpo.dynamic_sampling``, as many as the step still needs (attempts 1 to
``grpo.max_extra_rollouts``), by the synchronous rollout's rule
(:func:`rlfactory_core.steps.attempt_size`), each seeded as the synchronous rollout of that
step and attempt (:func:`rollout_config_for`). A chunk's groups stream in as they finish;
each one's members that failed on the infrastructure's side run again at once
(:mod:`rlfactory_core.resampling`); when the last is in, they go to the step's :class:`~rlfactory_core.training.assembly.BatchAssembler`
in sample order, so batches are ordered by sample, not by finish time, and hold the groups a
synchronous step would.

**Admission.** Step ``k`` trains on the weights of version ``V(k)`` (one more each step). A
chunk of step ``k`` starts only once the generation backends hold version ``V(k) -
max_staleness`` or newer; versions only go up while it generates, so every token it samples
is at most ``max_staleness`` versions old when trained. Nothing is dropped for its age: every
group started is trained in its step (no bias against long trajectories), and the steps run
oldest first. ``max_staleness: 0`` lets a step's rollout start only after the previous step's
weights are synced: the synchronous schedule, through this code.

**Data.** Chunks take prompts in issue order from the run's data position. A step's prompts
are trained when its update runs (:meth:`Run.mark_trained`); a stop drops the chunks in
flight, and their prompts, not trained, are rolled out again on resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from .engines import rollout_config_for
from .resampling import resample_group
from .rewards import ScoredBatch
from .run import Run
from .steps import StepRollout, attempt_size, next_prompts
from .training.assembly import BatchAssembler, group_filters
from .training.overlong import with_overlong_penalty

__all__ = ["GroupStream"]


@dataclass
class _Step:
    """One step's rollouts so far."""

    assembler: BatchAssembler
    samples: list[Any] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    attempts: int = 0  # chunks started
    running: int = 0  # chunks in flight
    times: dict[str, float] = field(default_factory=dict)


class GroupStream:
    """The chunks of steps ``first`` to ``last`` of ``run`` (see the module docstring)."""

    def __init__(self, run: Run, first: int, last: int, max_staleness: int):
        self.run, self.first, self.last, self.max_staleness = run, first, last, max_staleness
        self.first_version = run.engine.policy_version  # V(first): the weights step ``first`` trains
        self.synced = run.engine.policy_version  # the version the generation backends hold
        self.cursor = run.position  # the next data position to roll out (past run.trained_ahead's)
        self.steps: dict[int, _Step] = {}
        self.next_step = first  # the next step whose first chunk has not started
        self.tasks: set[asyncio.Task[None]] = set()
        self.changed = asyncio.Event()
        self.failure: BaseException | None = None

    async def batch(self, step: int) -> StepRollout:
        """Step ``step``'s rollout, when all its chunks are in (the steps are taken in order)."""
        while True:
            if self.failure is not None:
                raise self.failure
            self._admit()
            state = self.steps.get(step)
            if state is not None and state.attempts and not state.running and not self._wants_more(state):
                del self.steps[step]
                return StepRollout(state.assembler.assemble(), state.samples, state.times, state.positions)
            self.changed.clear()
            await self.changed.wait()

    def synced_to(self, version: int) -> None:
        """The generation backends hold weights ``version`` now: more chunks may start."""
        self.synced = version
        self.changed.set()

    async def close(self) -> None:
        """Cancel the chunks in flight (their prompts are not trained)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    # -- admission ---------------------------------------------------------------------------

    def _admit(self) -> None:
        """Start every chunk admission allows: a dynamic-sampling attempt of a step that needs
        one, then the first chunks of the next steps."""
        for step, state in sorted(self.steps.items()):
            if not state.running and (count := self._wants_more(state)) and self._admitted(step):
                self._start(step, state, count)
        while self.next_step <= self.last and self._admitted(self.next_step):
            config = self.run.config
            state = self.steps[self.next_step] = _Step(BatchAssembler(config.grpo.prompts_per_step,
                                                                      group_filters(config), config.failures.masked))
            self._start(self.next_step, state, self.run.config.grpo.prompts_per_step)
            self.next_step += 1

    def _admitted(self, step: int) -> bool:
        return self.synced >= self.first_version + (step - self.first) - self.max_staleness

    def _wants_more(self, state: _Step) -> int:
        """The prompts of the step's next attempt (0: none) once its first has started."""
        return attempt_size(self.run.config, state.assembler, state.attempts) if state.attempts else 0

    def _start(self, step: int, state: _Step, count: int) -> None:
        positions, samples = next_prompts(self.run, self.cursor, count)
        self.cursor = positions[-1] + 1
        state.samples += samples
        state.positions += positions
        attempt, state.attempts, state.running = state.attempts, state.attempts + 1, state.running + 1
        task = asyncio.ensure_future(self._chunk(step, state, samples, positions, attempt))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _chunk(self, step: int, state: _Step, samples: list[Any], positions: list[int],
                     attempt: int) -> None:
        config = self.run.config
        started = time.perf_counter()
        resampling: list[asyncio.Future[Any]] = []  # each finished group, its failed members run again
        try:
            stream = self.run.engine.rollout_groups(samples, rollout_config_for(config, step, attempt=attempt),
                                                    group_size=config.grpo.group_size, rewards="train",
                                                    priority=step)
            async with contextlib.aclosing(stream):  # cancelled: the trajectories in flight are, too
                async for group in stream:
                    resampling.append(asyncio.ensure_future(self._resampled(step, group, samples, positions)))
                groups = await asyncio.gather(*resampling)
            groups.sort(key=lambda group: group[0])  # sample order, as a synchronous rollout gives them
            trajectories = [trajectory for _, members, _, _ in groups for trajectory in members]
            scored = ScoredBatch.concat([rows for _, _, rows, _ in groups])
            state.assembler.add(trajectories, with_overlong_penalty(trajectories, scored, config),
                                [r for _, _, _, replaced in groups for r in replaced])
            state.times["time/rollout"] = state.times.get("time/rollout", 0.0) + time.perf_counter() - started
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the step waiting for it raises it
            self.failure = exc
        finally:
            for task in resampling:
                task.cancel()
            await asyncio.gather(*resampling, return_exceptions=True)
            state.running -= 1
            self.changed.set()

    async def _resampled(self, step: int, group: Any, samples: list[Any],
                         positions: list[int]) -> tuple[int, list[Any], ScoredBatch, list[Any]]:
        """A finished group with its failed members run again (:func:`resample_group`)."""
        members, rows, replaced = await resample_group(self.run.engine, self.run.config, step, samples[group.index],
                                                       positions[group.index], group.trajectories, group.scored)
        return group.index, members, rows, replaced

