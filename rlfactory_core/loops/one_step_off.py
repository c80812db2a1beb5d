"""One step off the policy: step ``k + 1`` rolls out while step ``k`` trains.

For each step ``k``, as :mod:`.sync` does, with one difference in order: as soon as step
``k``'s rollout is in, step ``k + 1``'s starts (from the prompts after it), and step ``k``'s
update, weight sync, eval and checkpoint run while it generates. So step ``k + 1`` samples
from the weights of step ``k - 1`` until the sync of step ``k`` lands (a turn in flight ends
on the old weights, the next uses the new: each token carries the version that sampled it),
and every trained token is at most one version older than the trainer's weights
(``train.max_staleness`` >= 1). The loss is the decoupled objective
(:func:`rlfactory_core.training.grpo.decoupled_policy_loss`; ``grpo.tis_cap`` corrects the age).

Stopping and resuming: the rollout ahead is dropped by a stop request (it is never trained);
the checkpoint's data position counts trained prompts only, so a resumed run rolls those
prompts out again, with the saved weights. Every prompt is trained once, none twice.
"""

from __future__ import annotations

import asyncio
import time

from ..run import Run, step_started
from ..steps import StepRollout, end_step, rollout_phase, sync_phase, update_phase

__all__ = ["run_steps"]


async def run_steps(run: Run) -> None:
    """Steps ``run.start_step + 1`` to ``train.steps``, each rolled out during the one before."""
    last = run.config.train.steps
    ahead: asyncio.Task[StepRollout] | None = None
    try:
        for step in range(run.start_step + 1, last + 1):
            if ahead is None:  # the first step, or a resumed run's: nothing rolled out yet
                ahead = asyncio.ensure_future(rollout_phase(run, step))
            step_started(run, step)
            started = time.perf_counter()
            run.view.phase("rollout")
            rollout = await run.stop.droppable(ahead)  # a stop request drops the step here
            rollout.times["time/rollout_wait"] = time.perf_counter() - started
            ahead = None
            if step < last:  # from the prompts after this step's
                ahead = asyncio.ensure_future(rollout_phase(run, step + 1, rollout.positions[-1] + 1))
            update = await update_phase(run, step, rollout)  # from here on the step is finished
            synced = await sync_phase(run, rollout.times)
            await end_step(run, step, rollout, update, synced, started)
    finally:
        if ahead is not None:  # stopping, or failed: the rollout ahead is never trained
            ahead.cancel()
            await asyncio.gather(ahead, return_exceptions=True)
