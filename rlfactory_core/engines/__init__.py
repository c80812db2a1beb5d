"""Engines: where the policy, its optimizer and the generation backends live.

* :mod:`.base`: the :class:`~.base.Engine` protocol the training loop drives (all methods
  async) and the per-step rollout settings.
* :mod:`.local`: :class:`~.local.LocalEngine`, everything in this process; its rollout half,
  :class:`~.local.LocalRollout`, also serves ``rlf eval`` and the ray engine's rollout workers.
* :mod:`.ray`: :class:`~.ray.RayEngine`, the same work on Ray actors (imported only with
  ``engine: ray``).

:func:`make_engine` picks one from the config; :func:`build_driver_task` builds the task of
the process that runs the loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..task import Task, build_task
from .base import Engine, RolloutResult, rollout_config_for

__all__ = ["Engine", "RolloutResult", "rollout_config_for", "make_engine", "build_driver_task"]


def build_driver_task(config: RunConfig) -> Task:
    """The task of the process that runs the training loop: it gives the data and checks the
    config. With the ray engine the rollout workers score, so the judge pool's rewards (a
    judge model) are not built here."""
    if config.engine != "ray" or not config.ray.judge.rewards:
        return build_task(config)
    from .ray.actors import PooledReward  # a stand-in with no pool here: it says where it is scored

    pooled = set(config.ray.judge.rewards)
    return build_task(config, make_reward=lambda spec: PooledReward(spec.name, []) if spec.name in pooled else None)


def make_engine(config: RunConfig, task: Task, tokenizer: Any, *, base_path: Path, checkpoint: Path | None,
                processor: Any = None, console: Any = None) -> Engine:
    """The engine ``config.engine`` names, not started: ``local`` (in this process, with
    ``task``) or ``ray`` (its workers build their own tasks)."""
    if config.engine == "ray":
        from .ray import RayEngine

        return RayEngine(config, base_path=base_path, checkpoint=checkpoint, console=console)
    from .local import LocalEngine

    return LocalEngine(config, task, tokenizer, base_path=base_path, checkpoint=checkpoint, processor=processor)
