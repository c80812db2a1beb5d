"""Asynchronous GRPO: groups are generated continuously, and new weights reach the generation
backends while they generate.

For each step ``k``, as :mod:`.sync` does, but the rollouts are not a phase of the step: a
:class:`~rlfactory_core.stream.GroupStream` starts the chunks of later steps while this one
trains, as far ahead as ``train.max_staleness`` allows (a step's chunk starts once the
backends hold weights at most that many versions older than those it will be trained from),
and each step waits only for its own groups. Every group started is trained, in its step, in
sample order: nothing is dropped for its age, so long trajectories are not under-trained.
The loss is the decoupled objective (:func:`rlfactory_core.training.grpo.decoupled_policy_loss`;
``grpo.tis_cap`` is required when tokens can be stale). ``max_staleness: 0`` is the
synchronous schedule, through this loop.

Stopping and resuming: a stop drops the chunks in flight (never trained); the checkpoint's
data position and ``trained_ahead`` say which prompts were trained, so a resumed run rolls
out the others again, each prompt trained once.
"""

from __future__ import annotations

import time

from ..run import Run, step_started
from ..steps import end_step, sync_phase, update_phase
from ..stream import GroupStream

__all__ = ["run_steps"]


async def run_steps(run: Run) -> None:
    """Steps ``run.start_step + 1`` to ``train.steps``, their rollouts streamed ahead."""
    last = run.config.train.steps
    stream = GroupStream(run, run.start_step + 1, last, run.config.train.max_staleness)
    try:
        for step in range(run.start_step + 1, last + 1):
            step_started(run, step)
            started = time.perf_counter()
            run.view.phase("rollout")
            rollout = await run.stop.droppable(stream.batch(step))  # a stop request drops the step here
            rollout.times["time/rollout_wait"] = time.perf_counter() - started
            update = await update_phase(run, step, rollout)  # from here on the step is finished
            synced = await sync_phase(run, rollout.times)
            if "time/weight_sync" in rollout.times:  # not when stopping: no generation follows
                stream.synced_to(run.engine.policy_version)
            await end_step(run, step, rollout, update, synced, started)
    finally:
        await stream.close()  # stopping, failed or done: the chunks in flight are never trained
