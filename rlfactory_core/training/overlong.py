"""Overlong trajectories (DAPO): what to do with an episode a length limit cut off.

A trajectory is **cut off** (:func:`cut_off`) when a limit, not the model or the env, ended
it before the model finished: its last model turn was stopped at ``max_tokens_per_turn``
(the generation's finish reason ``length``), the next turn or observation did not fit
``max_trajectory_tokens`` (stop reason ``token_budget``), or it used ``max_turns`` without
an answer (``max_turns``). A multi-turn episode can run out of turns as a single answer runs
out of tokens; either way its reward says little about the reasoning that was cut.

Two options of ``grpo``, off by default, each usable alone:

* **Overlong filtering** (``grpo.overlong_filter``): cut-off trajectories carry no loss
  (their loss mask is zeroed in :func:`rlfactory_core.training.batch.build_batch`), so a
  reasonable but long attempt is not pushed down for its length. Their rewards still count
  in their group's mean and std, so the group's other trajectories are judged against
  the whole group (as DAPO's token-level mask does).
* **Soft overlong penalty** (``grpo.overlong_buffer`` > 0, scaled by
  ``grpo.overlong_penalty``): a length-aware reward term (:func:`soft_overlong_penalty`),
  0 up to ``max_trajectory_tokens - buffer`` tokens, then falling linearly to
  ``-overlong_penalty`` at ``max_trajectory_tokens``, so the model learns to finish
  within budget before the hard limit cuts it. The length is the whole trajectory's
  (prompt, turns and observations), the quantity the hard limit ``max_trajectory_tokens``
  bounds; within a group the prompt is the same, so the advantages see only what the model
  added. It is added to the training reward before the batch is assembled (dynamic sampling
  sees it), logged as ``reward/overlong_penalty``; evaluation does not use it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from .. import outcomes
from ..config import RunConfig
from ..rewards import ScoredBatch

__all__ = ["LIMIT_STOPS", "cut_off", "trajectory_length", "soft_overlong_penalty", "with_overlong_penalty",
           "overlong_metrics"]

#: The stop reasons of a trajectory a limit ended (:mod:`rlfactory_core.outcomes`).
LIMIT_STOPS = outcomes.LIMIT_STOPS


def cut_off(trajectory: Any) -> bool:
    """Whether a limit ended ``trajectory`` before the model finished (module docstring)."""
    return trajectory.stop_reason in LIMIT_STOPS or bool(trajectory.metadata.get("last_turn_cut"))


def trajectory_length(trajectory: Any) -> int:
    """Tokens of the whole trajectory: prompt, every turn and observation."""
    return len(trajectory.prompt_ids) + sum(len(segment.token_ids) for segment in trajectory.segments)


def soft_overlong_penalty(length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment: 0 for ``length <= max_length - buffer``, then
    ``factor * (max_length - buffer - length) / buffer`` (linear, reaching ``-factor`` at
    ``max_length``), and ``-factor`` beyond it. ``buffer`` 0 gives 0 (off)."""
    if buffer <= 0:
        return 0.0
    if buffer > max_length:
        raise ValueError(f"the overlong buffer ({buffer}) is longer than the maximum length ({max_length})")
    excess = length - (max_length - buffer)
    if excess <= 0:
        return 0.0
    return -factor * min(excess, buffer) / buffer


def with_overlong_penalty(trajectories: Sequence[Any], scored: ScoredBatch, config: RunConfig) -> ScoredBatch:
    """``scored`` with the soft overlong penalty added to each trajectory's total and
    recorded as its ``overlong_penalty`` component; ``scored`` itself when the penalty is off."""
    g = config.grpo
    if g.overlong_buffer <= 0:
        return scored
    limit = config.rollout.max_trajectory_tokens
    penalties = [soft_overlong_penalty(trajectory_length(t), limit, g.overlong_buffer, g.overlong_penalty)
                 for t in trajectories]
    return ScoredBatch(
        totals=[total + penalty for total, penalty in zip(scored.totals, penalties)],
        components=[{**components, "overlong_penalty": penalty}
                    for components, penalty in zip(scored.components, penalties)],
        correct=list(scored.correct), errors=scored.errors,
        applied=scored.applied + Counter(overlong_penalty=len(penalties)),
        turn_rewards=scored.turn_rewards, reward_errors=scored.reward_errors, outcomes=scored.outcomes)


def overlong_metrics(trajectories: Sequence[Any], config: RunConfig) -> dict[str, float]:
    """``rollout/cut_off``: the share of trajectories a limit ended; with
    ``grpo.overlong_filter``, ``batch/overlong_filtered`` (the same share, their loss masked)."""
    if not trajectories:
        return {}
    share = sum(cut_off(t) for t in trajectories) / len(trajectories)
    metrics = {"rollout/cut_off": share}
    if config.grpo.overlong_filter:
        metrics["batch/overlong_filtered"] = share
    return metrics
