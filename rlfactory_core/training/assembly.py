"""A step's batch, assembled from finished groups.

A rollout gives groups: the ``grpo.group_size`` trajectories of one prompt, told apart by
``Trajectory.group``. The batch a step trains on is assembled here, from the groups that
pass every filter; this is the one place that decides what a step learns from.

**Dynamic sampling** (DAPO; ``grpo.dynamic_sampling``): a group whose rewards are all equal
gives each of its trajectories advantage 0, so it carries no policy gradient and only dilutes
the batch. Such groups are dropped, and more prompts are rolled out (the next ones in the
data order) until the batch holds ``grpo.prompts_per_step`` groups or
``grpo.max_extra_rollouts`` extra rollouts were made; then the step trains on what it has.
When no group passes, it trains on the groups of its first rollout, as without the option
(the step still counts; its warning says why nothing was learned). The metrics say what
happened: ``batch/groups_sampled``, ``batch/groups_kept``, ``batch/extra_rollouts``.

**Length bias**: a filter can favour some lengths (an all-correct group is often a short
one; a schedule that dropped stale groups would drop the long ones, which take longest to
generate). ``batch/generated_tokens_mean`` / ``batch/trained_tokens_mean`` (model tokens per
trajectory) and ``batch/generated_turns_mean`` / ``batch/trained_turns_mean`` compare every
trajectory rolled out for the step with those it trains on.

A filter is a function of one group (its trajectories and their total rewards) that says
whether to keep it; more (a staleness bound) plug in here. Filters see the members that will
train: a failure the run masks (:mod:`rlfactory_core.outcomes`) is left out of what they see,
so a group whose rewards differ only by a timed-out member counts as uninformative.

**Resampled members** (:mod:`rlfactory_core.resampling`) arrive already in their groups; the
attempts they replaced come with them (``add(..., replaced=)``) and leave with the kept groups
(:attr:`Assembled.replaced`, renumbered as their groups): ``outcome/resampled/<class>`` counts
them, per trajectory of the batch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..config import RunConfig
from ..rewards import ScoredBatch

__all__ = ["GroupFilter", "informative", "group_filters", "BatchAssembler", "Assembled"]

#: Whether to keep one group: ``(its trajectories, their total rewards) -> bool``.
GroupFilter = Callable[[Sequence[Any], Sequence[float]], bool]


def informative(trajectories: Sequence[Any], totals: Sequence[float]) -> bool:
    """A group whose rewards differ: its advantages are not all zero."""
    return max(totals) > min(totals)


def group_filters(config: RunConfig) -> list[GroupFilter]:
    """The filters the config asks for (none by default)."""
    return [informative] if config.grpo.dynamic_sampling else []


@dataclass
class Assembled:
    """A step's batch: the kept groups' trajectories (groups renumbered 0, 1, ... in the
    order they were kept), their scores, the metrics of the assembly and the attempts the
    kept groups' resamples replaced (:class:`rlfactory_core.resampling.Replaced`)."""

    trajectories: list[Any]
    scored: ScoredBatch
    metrics: dict[str, float] = field(default_factory=dict)
    replaced: list[Any] = field(default_factory=list)


class BatchAssembler:
    """Collects the groups of a step's rollouts (:meth:`add`) until ``wanted`` of them passed
    every filter; :meth:`assemble` gives the batch."""

    def __init__(self, wanted: int, filters: Sequence[GroupFilter] = (),
                 masked: Callable[[Sequence[str | None]], list[bool]] | None = None):
        self.wanted, self.filters = wanted, list(filters)
        self.masked = masked  # outcomes -> which members are left out (the run's failures.masked)
        # each group: its members, their scores, the attempts its resamples replaced
        self._kept: list[tuple[list[Any], ScoredBatch, list[Any]]] = []
        self._first: list[tuple[list[Any], ScoredBatch, list[Any]]] = []  # the first rollout's groups: the fallback
        self.rollouts = 0
        self.sampled = 0
        self._generated: list[Any] = []  # every trajectory added, for the length-bias metrics

    @property
    def needed(self) -> int:
        """Groups still wanted."""
        return max(0, self.wanted - len(self._kept))

    def add(self, trajectories: Sequence[Any], scored: ScoredBatch, replaced: Sequence[Any] = ()) -> None:
        """One rollout's trajectories (with their ``group``) and scores, and the attempts its
        resamples replaced (each with its ``group``); the groups that pass every filter are
        kept, up to the number still wanted."""
        by_group: dict[Any, list[int]] = {}
        self._generated += [*trajectories, *(r.trajectory for r in replaced)]
        for row, trajectory in enumerate(trajectories):
            by_group.setdefault(trajectory.group, []).append(row)
        for name, rows in by_group.items():
            group = ([trajectories[r] for r in rows], scored.select(rows), [r for r in replaced if r.group == name])
            if self.rollouts == 0:
                self._first.append(group)
            self.sampled += 1
            if self.needed and self._passes(*group[:2]):
                self._kept.append(group)
        self.rollouts += 1

    def _passes(self, members: list[Any], scored: ScoredBatch) -> bool:
        """Whether every filter keeps the group, judged on the members that will train."""
        if not self.filters:
            return True
        left_out = self.masked(scored.outcomes) if self.masked is not None else [False] * len(members)
        training = [(m, total) for m, total, out in zip(members, scored.totals, left_out) if not out]
        if not training:
            return False
        return all(keep([m for m, _ in training], [t for _, t in training]) for keep in self.filters)

    def assemble(self) -> Assembled:
        groups = self._kept or self._first
        trajectories, replaced = [], []
        for number, (members, _, attempts) in enumerate(groups):
            for trajectory in members:
                trajectory.group = number
                trajectories.append(trajectory)
            for attempt in attempts:
                attempt.group = attempt.trajectory.group = number
                replaced.append(attempt)
        metrics = {"batch/groups_sampled": float(self.sampled), "batch/groups_kept": float(len(self._kept)),
                   "batch/extra_rollouts": float(max(0, self.rollouts - 1)),
                   **_lengths("generated", self._generated), **_lengths("trained", trajectories)}
        resampled = Counter(r.outcome for r in replaced if r.outcome is not None)
        metrics.update({f"outcome/resampled/{name}": count / max(len(trajectories), 1)
                        for name, count in sorted(resampled.items())})
        return Assembled(trajectories, ScoredBatch.concat([scored for _, scored, _ in groups]), metrics, replaced)


def _lengths(which: str, trajectories: Sequence[Any]) -> dict[str, float]:
    """Mean model tokens and turns per trajectory (``batch/<which>_tokens_mean``, ``..._turns_mean``)."""
    n = max(len(trajectories), 1)
    tokens = sum(len(s.token_ids) for t in trajectories for s in t.all_segments if s.kind == "model")
    return {f"batch/{which}_tokens_mean": tokens / n,
            f"batch/{which}_turns_mean": sum(t.num_turns for t in trajectories) / n}
