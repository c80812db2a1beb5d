"""``rlf train``: GRPO on the task's rewards, a schedule of steps on an open run.

1. :func:`train` raises every problem :mod:`rlfactory_core.preflight` can see, together;
2. :func:`rlfactory_core.run.prepare` builds the task, the data and the model, each checked,
   before anything is written;
3. :func:`rlfactory_core.run.opened` opens the run in its directory (announced, logged, its
   status kept, the engine started, stop requests answered, closed however it ends);
4. :func:`rlfactory_core.steps.before_training` evaluates the base model and runs the cold
   start; the schedule (:mod:`rlfactory_core.loops`, ``train.mode``) runs the steps to
   ``train.steps``: each a rollout, an update, a weight sync, then metrics, eval and checkpoint
   (``sync``: one after the other; ``one_step_off``: the next step's rollout during the update;
   ``async``: groups streamed continuously, up to ``train.max_staleness`` versions ahead).

What a step does and why (the algorithm, its options, batching, stopping and resuming) is in
``docs/training.md``; the phases in :mod:`rlfactory_core.steps`, the formulas in
:mod:`rlfactory_core.training.grpo`.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from .config import RunConfig
from .loops import asynchronous, one_step_off, sync
from .preflight import raise_problems, run_problems
from .run import TrainingInterrupted, opened, prepare
from .steps import before_training

__all__ = ["train", "TrainingInterrupted"]

#: ``train.mode`` -> its schedule (:mod:`rlfactory_core.loops`).
SCHEDULES = {"sync": sync.run_steps, "one_step_off": one_step_off.run_steps, "async": asynchronous.run_steps}


def train(config: RunConfig, *, resume: str | os.PathLike[str] | None = None, console: Any = None) -> Path:
    """Run training to ``config.train.steps``; return the run directory.

    Every problem :mod:`rlfactory_core.preflight` can see is raised first, together (one
    :class:`ConfigError`); then the task and the data are built and the model resolved;
    only then is the run announced on ``console`` and its directory written."""
    raise_problems(run_problems(config, purpose="train", resume=resume))
    return asyncio.run(_train(config, resume=Path(resume) if resume else None, console=console))


async def _train(config: RunConfig, *, resume: Path | None, console: Any) -> Path:
    prepared = await prepare(config, resume=resume)
    async with opened(prepared, console) as run:
        await before_training(run)
        await SCHEDULES[config.train.mode](run)
    return run.run_dir
