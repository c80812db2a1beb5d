"""Resampling: a group's members that failed on the infrastructure's side run again before the
group joins a batch.

A member whose outcome the run handles ``resample`` (:class:`~rlfactory_core.outcomes.FailureHandling`;
the default for the infrastructure's classes: a timed-out search, a service that was down) is
rolled out again, alone, on the same prompt, with a seed of its own, up to
``failures.max_resamples`` times; the first attempt that does not end in such a class takes its
place in the group (same group, same place). One that fails every time stays, masked (out of
the loss and of the group's baseline). So a group is trained as if the services had worked,
while a flaky service costs generation, not signal.

**When**: between a rollout and :class:`~rlfactory_core.training.assembly.BatchAssembler`, the one
place a batch is formed: the synchronous phases run every failed member of a rollout at once
(:func:`resample_rollout`); the asynchronous schedule runs a group's as soon as that group
finished (:func:`resample_group`), while the other groups still generate. Both on the current
weights, so a resampled member is never older than its chunk's admission allowed
(``train.max_staleness``).

**Seeds**: an attempt's seed comes from (``train.seed`` or ``rollout.sampling.seed``, the step,
the prompt's data position, the member, the attempt), never from which attempts finished first,
so a rerun of the run resamples the same trajectories.

**Lost, not failed**: a trajectory that never finished (its ray rollout worker died) has no
outcome to handle; the ray engine runs a dead worker's unfinished groups again on its
replacement with their own seeds (:mod:`rlfactory_core.engines.ray`), which gives the very
trajectories the run would have had, where a resample's new seed would give others. The two
meet in the group: a rerun group's members that fail on the service's side are resampled here
like any other.

**The selection it makes, undone** (``failures.resample_correction``, default ``importance``):
keeping only the attempts the services answered is a biased sample. With each call to a tool
failing with probability ``f``, a trajectory making ``k`` calls survives with probability
``(1 - f)^k``, so the kept members under-represent the trajectories that call tools most: at
50 % faults a deepsearch batch held 0.91-0.94 searches per trajectory at step 1 where the
no-fault runs' held 1.16-1.41 (bench/README.md, issue 39), and the policy learned to search less.
:func:`selection_weights` gives each trained trajectory the inverse of its survival
probability, ``prod over tools (1 - f_tool)^-k_tool``, with ``f_tool`` the share of that tool's
calls in the step's attempts (kept and replaced) that failed in a class the run leaves out
(resampled, masked or aborting; a class trained ``penalize`` selects nothing), and ``k_tool``
the trajectory's calls of it that did not; :func:`rlfactory_core.training.grpo.group_advantages`
weighs its group's mean and std by them and scales its advantage by its weight over the
group's mean weight (self-normalised, so a group's weights average 1 and none exceeds the group
size). A step without such a failure has no weights: the batch is exactly as before.

**What is kept**: each replaced attempt (:class:`Replaced`): the step's metrics count them
(``outcome/resampled/<class>``), and the recorded groups record them beside the trajectories
that replaced them (:mod:`rlfactory_core.records`, ``replaced``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from .config import RunConfig
from .engines import rollout_config_for
from .outcomes import INFRASTRUCTURE, result_outcome, side_of
from .rewards import ScoredBatch

__all__ = ["Replaced", "resample_seed", "resample_group", "resample_rollout", "selection_weights"]


@dataclass
class Replaced:
    """One attempt a resample replaced: its group and member, which attempt it was (0: the
    rollout's own), the trajectory and its one-row scores."""

    group: int
    member: int
    attempt: int
    trajectory: Any
    scored: ScoredBatch

    @property
    def outcome(self) -> str | None:
        return self.scored.outcomes[0] if self.scored.outcomes else None


def resample_seed(config: RunConfig, step: int, position: int, member: int, attempt: int) -> int:
    """The sampling seed of ``attempt`` (1, 2, ...) at the member ``member`` of the prompt at data
    ``position`` in step ``step`` (a 31-bit hash: no attempt's seed is another trajectory's
    ``seed + index`` by construction of a sum)."""
    base = config.rollout.sampling.seed if config.rollout.sampling.seed is not None else config.train.seed
    key = f"resample/{base}/{step}/{position}/{member}/{attempt}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little") & 0x7FFFFFFF


async def resample_group(engine: Any, config: RunConfig, step: int, sample: Any, position: int,
                         trajectories: list[Any], scored: ScoredBatch) -> tuple[list[Any], ScoredBatch, list[Replaced]]:
    """One group (``trajectories`` of ``sample``, at data ``position``, with their ``scored``
    rows) with each member handled ``resample`` run again (module docstring); the group, its
    scores and the attempts replaced. A group without such a member comes back as it was."""
    failures = config.failures
    redo = [member for member, again in enumerate(failures.resampled(scored.outcomes)) if again]
    if not redo or not failures.max_resamples:
        return trajectories, scored, []
    group = trajectories[0].group

    async def member_again(member: int) -> tuple[Any, ScoredBatch, list[Replaced]]:
        trajectory, row = trajectories[member], scored.select([member])
        replaced = []
        for attempt in range(1, failures.max_resamples + 1):
            rollout_config = rollout_config_for(config, step)
            rollout_config.sampling.seed = resample_seed(config, step, position, member, attempt)
            result = await engine.rollout([sample], rollout_config, group_size=1, rewards="train", priority=step)
            replaced.append(Replaced(group, member, attempt - 1, trajectory, row))
            trajectory, row = result.trajectories[0], result.scored
            trajectory.group = group
            trajectory.metadata["attempt"] = attempt
            if not failures.resampled(row.outcomes)[0]:
                break
        return trajectory, row, replaced

    again = dict(zip(redo, await asyncio.gather(*(member_again(member) for member in redo))))
    members = [again[m][0] if m in again else t for m, t in enumerate(trajectories)]
    rows = ScoredBatch.concat([again[m][1] if m in again else scored.select([m]) for m in range(len(trajectories))])
    return members, rows, [r for m in redo for r in again[m][2]]


async def resample_rollout(engine: Any, config: RunConfig, step: int, samples: Sequence[Any],
                           positions: Sequence[int], trajectories: list[Any],
                           scored: ScoredBatch) -> tuple[list[Any], ScoredBatch, list[Replaced]]:
    """:func:`resample_group` on every group of one rollout of ``samples`` (at data
    ``positions``; trajectory ``group`` ``g`` is ``samples[g]``'s), all at once; the rollout's
    trajectories in their order, their scores, and every attempt replaced."""
    if not any(config.failures.resampled(scored.outcomes)) or not config.failures.max_resamples:
        return trajectories, scored, []
    by_group: dict[int, list[int]] = {}
    for row, trajectory in enumerate(trajectories):
        by_group.setdefault(trajectory.group, []).append(row)
    done = await asyncio.gather(*(
        resample_group(engine, config, step, samples[g], positions[g], [trajectories[r] for r in rows],
                       scored.select(rows)) for g, rows in by_group.items()))
    return ([t for members, _, _ in done for t in members], ScoredBatch.concat([rows for _, rows, _ in done]),
            [r for _, _, replaced in done for r in replaced])


def selection_weights(config: RunConfig, trajectories: Sequence[Any],
                      replaced: Sequence[Replaced] = ()) -> tuple[list[float] | None, dict[str, float]]:
    """Per trained trajectory, the importance weight that undoes leaving out the attempts whose
    tool calls failed on the infrastructure's side (module docstring), and the metrics
    (``failures/call_failure_rate``: the step's share of such calls; ``failures/weight_max``:
    the largest weight over its group's mean). ``(None, {})`` when nothing was left out for a
    failed call, or with ``failures.resample_correction: none``."""
    if config.failures.resample_correction == "none":
        return None, {}
    side = config.rollout.tool_exception_side

    def left_out(result: Any) -> bool:
        outcome = result_outcome(result, side)
        return (outcome is not None and side_of(outcome) == INFRASTRUCTURE
                and config.failures.of(outcome) != "penalize")

    calls, failed = Counter(), Counter()
    for trajectory in [*trajectories, *(r.trajectory for r in replaced)]:
        for result in trajectory.tool_results:
            calls[result.name] += 1
            failed[result.name] += left_out(result)
    if not sum(failed.values()):
        return None, {}
    metrics = {"failures/call_failure_rate": sum(failed.values()) / sum(calls.values())}
    survival = {name: 1 - failed[name] / calls[name] for name in calls}
    weights = []
    for trajectory in trajectories:
        weight = 1.0
        for result in trajectory.tool_results:
            if not left_out(result) and survival[result.name] > 0:
                weight /= survival[result.name]
        weights.append(weight)
    by_group: dict[Any, list[float]] = {}
    for trajectory, weight in zip(trajectories, weights):
        by_group.setdefault(trajectory.group, []).append(weight)
    metrics["failures/weight_max"] = max(max(w) * len(w) / sum(w) for w in by_group.values())
    return weights, metrics
