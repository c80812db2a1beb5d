"""The engine protocol: what a run's schedule (:mod:`rlfactory_core.loops`, over the phases of
:mod:`rlfactory_core.steps`) asks of an engine.

An engine owns the policy, its optimizer and the generation backends, wherever they run:
:class:`~rlfactory_core.engines.local.LocalEngine` keeps everything in this process;
:class:`~rlfactory_core.engines.ray.RayEngine` places the same work on Ray actors. The loop
calls, per step: :meth:`Engine.rollout` (trajectories and their rewards; the asynchronous
schedule streams them, group by group, with :meth:`Engine.rollout_groups`), :meth:`Engine.update`
(the optimizer steps on the batch; before the first step, with ``cold_start``,
:meth:`Engine.supervised_update`), :meth:`Engine.sync_weights` (the new policy to the
generation backends), and sometimes :meth:`Engine.save` (a checkpoint). Every method is a
coroutine, so the loop can await an engine's work while it answers a stop request
(:mod:`rlfactory_core.stopping`) and, later, overlap rollout with training.

Policy versions: an engine numbers the trainer's weights, ``policy_version``: 0 for the base
model, one more after each :meth:`Engine.update` and :meth:`Engine.supervised_update`.
:meth:`Engine.sync_weights` gives the backends that version, so every sampled token carries
the version that sampled it (``Generation.policy_version``, ``Segment.policy_version``); a
checkpoint keeps it (``policy_version`` in its state), and a resumed run counts on from it.

An engine may run its work wherever it likes, with one rule: the update of a policy runs on
one dedicated thread for the whole run (per-thread malloc arenas once kept the gigabytes an
update frees in whichever thread pool worker ran it, growing a run by ~3 GB a step until it
was killed; tested by tests/test_engines.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, NamedTuple, Protocol, Sequence, runtime_checkable

from ..config import RunConfig

__all__ = ["Engine", "RolloutResult", "RolloutGroup", "rollout_config_for", "resumed_version"]


class RolloutResult(NamedTuple):
    """One rollout's output: the trajectories (``group_size`` per sample, in sample order),
    their scores (:class:`rlfactory_core.rewards.ScoredBatch`, one row per trajectory) and
    the phases' times (``time/rollout``, ``time/reward``, and engine extras)."""

    trajectories: list[Any]
    scored: Any
    times: dict[str, float]


class RolloutGroup(NamedTuple):
    """One sample's group from a streamed rollout (:meth:`Engine.rollout_groups`): ``index``,
    the sample's place in the samples asked for (each trajectory's ``group``), its
    ``group_size`` trajectories in order and their scores."""

    index: int
    trajectories: list[Any]
    scored: Any


def resumed_version(state: dict[str, Any] | None) -> int:
    """The policy version of a checkpoint's weights (see the module docstring): its
    ``policy_version``, or for a checkpoint written before versions were counted, its step
    (one update a step: one short for a run whose cold start trained, which such a checkpoint
    does not say)."""
    if state is None:
        return 0
    return int(state.get("policy_version", state.get("step", 0)))


@runtime_checkable
class Engine(Protocol):
    """Everything the training loop needs from an engine; all methods are coroutines."""

    policy_version: int

    async def start(self) -> dict[str, Any] | None:
        """Load the models and start the generation backends; return the resumed
        checkpoint's state (``step``, ``position``, ``policy_version``), or None for a new run."""

    async def rollout(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                      rewards: str = "train", priority: int | None = None) -> RolloutResult:
        """``group_size`` trajectories per sample, scored by the run's ``train`` or ``eval``
        rewards. Cancelling the call cancels the rollouts in flight. ``priority``: the step the
        rollout is for; where rollouts overlap, a backend may give older steps' turns the
        generation first (``train.generation_order``, :mod:`rlfactory_core.rollout.priority`);
        None: no order (the cold start, ``rlf eval``)."""

    def rollout_groups(self, samples: Sequence[Any], rollout_config: Any, *, group_size: int,
                       rewards: str = "train", priority: int | None = None) -> AsyncIterator[RolloutGroup]:
        """:meth:`rollout`, streamed: each sample's group, scored, as soon as it finished (in
        finish order; the same trajectories :meth:`rollout` gives). Closing the iterator
        cancels the rest; new weights may be synced while it runs."""

    async def update(self, batch: Any, step: int) -> dict[str, float]:
        """The optimizer steps on ``batch`` (:mod:`rlfactory_core.training.batch`) at
        ``step``; their statistics (``train/*``). When the batch has ``recorded`` rows, it
        is left with their ``trainer_logprobs`` before the update (what the run records)."""

    async def supervised_update(self, batch: Any) -> dict[str, float]:
        """The cold start's warm-up (:mod:`rlfactory_core.training.cold_start`): cross-entropy
        on ``batch``'s assistant tokens for ``cold_start.epochs`` passes, with an optimizer of
        its own at ``cold_start.lr``, on the update thread; its statistics (``cold_start/*``)."""

    async def sync_weights(self) -> dict[str, float]:
        """The updated policy to every generation backend; metrics (``weight_sync/*``:
        ``weight_sync/pause_s``, the longest any backend held new requests for it)."""

    async def save(self, run_dir: Path, step: int, *, state: dict[str, Any], tokenizer: Any) -> None:
        """A checkpoint of ``step`` in ``run_dir`` (:mod:`rlfactory_core.training.checkpoint`),
        with the loop's ``state`` (data position) and the tokenizer (or processor)."""

    async def close(self) -> None:
        """Release everything the engine started; safe to call after a failed start."""


def rollout_config_for(config: RunConfig, step: int, *, attempt: int = 0, temperature: float | None = None) -> Any:
    """The rollout settings of ``step``: sampling seeds derived from ``train.seed`` (or
    ``rollout.sampling.seed``), the step and the step's rollout ``attempt`` (dynamic sampling
    rolls out more than once), so every rollout samples differently and a rerun samples the
    same; ``temperature`` overrides the sampling temperature (evaluation)."""
    rollout = config.rollout.model_copy(deep=True)
    base = rollout.sampling.seed if rollout.sampling.seed is not None else config.train.seed * 1_000_003
    rollout.sampling.seed = base + step * 10_007 + attempt * 7_919_009
    if temperature is not None:
        rollout.sampling.temperature = temperature
    return rollout
