"""Synchronous GRPO: every step rolls out with the weights of the step before, then trains.

For each step ``k``:

1. the next ``grpo.prompts_per_step`` prompts (an order fixed by ``train.seed``), each rolled
   out ``grpo.group_size`` times by the current policy, scored, and kept as groups
   (``grpo.dynamic_sampling``: only informative ones, more prompts rolled out to fill the batch);
2. each trajectory's advantage is its reward minus its group's mean, scaled
   (``grpo.advantage_norm``), and the clipped policy loss (+ KL, entropy) is minimised over
   the model's tokens in ``grpo.epochs`` x ``grpo.mini_batches`` AdamW steps;
3. the new weights go to the generation backend, so step ``k + 1`` samples from them: every
   trained token is on-policy up to the sampler's numerics;
4. metrics, and every ``eval.every`` / ``checkpoint.every`` steps an eval and a checkpoint.

Departures from the paper's GRPO (all options, defaults in the config): DAPO's clip-higher,
token-mean aggregation, an optional truncated importance weight against the sampler. The
formulas and their reasons are in :mod:`rlfactory_core.training.grpo` and ``docs/training.md``.
"""

from __future__ import annotations

import time

from ..run import Run, step_started
from ..steps import end_step, rollout_phase, sync_phase, update_phase

__all__ = ["run_steps"]


async def run_steps(run: Run) -> None:
    """Steps ``run.start_step + 1`` to ``train.steps``, one after the other."""
    for step in range(run.start_step + 1, run.config.train.steps + 1):
        step_started(run, step)
        started = time.perf_counter()
        rollout = await run.stop.droppable(rollout_phase(run, step))  # a stop request drops the step here
        update = await update_phase(run, step, rollout)  # from here on the step is finished
        synced = await sync_phase(run, rollout.times)
        await end_step(run, step, rollout, update, synced, started)
