"""The reward layer: every configured reward scores every trajectory of a step, concurrently.

A reward is a registered component (``rlfactory_register_rewards``): a class built with its
config ``options``, whose ``score(trajectory, sample)`` returns the trajectory's reward.
``score`` may be ``async def`` (judges, tool calls: awaited) or a plain function (rules,
CPU work: run in a thread, so the event loop keeps serving the other trajectories). A
``score`` that also takes a ``context`` parameter gets a :class:`RewardContext`: the env's
per-trajectory state and the env's tools, called through the run's tool manager with its
timeouts and limits (tool-verified rewards: execute the model's SQL, run its code).

What ``score`` may return:

* a number, or a :class:`~rlfactory_core.types.RewardOutput` (``value``, named
  ``components`` logged as metrics, ``correct`` for the accuracy metric, ``turn_rewards``
  per model turn);
* ``None``: the reward does not apply to this sample (multi-task data); it adds nothing to
  the total and is left out of its metric's mean.

Composition: a trajectory's total is the sum of ``weight x value`` over the rewards that
apply to it. Each reward's values are logged as ``reward/<name>`` (the mean over the
trajectories it applied to) and its components as ``reward/<name>/<component>``.
``reward/accuracy`` is the share of trajectories judged correct by the rewards that say so
(``RewardOutput.correct``, e.g. ``exact_match``); it is absent when no reward does.

Per-turn (process) rewards: ``RewardOutput.turn_rewards`` (one float per model turn, in
order) is weighted like the value and summed into :attr:`ScoredBatch.turn_rewards`; the
trainer adds them to the env's own per-turn rewards (``trajectory.turn_rewards``) and puts
each turn's reward on that turn's last token (:mod:`rlfactory_core.training.batch`), by the
turn boundaries the rollout recorded. The reward layer never changes a trajectory.

Failures: a reward that raises, returns something else, a non-finite number (as its value,
a turn reward or a component), or takes
longer than its ``timeout_s`` is a reward error: it scores the reward's ``fallback`` value
for that trajectory, is counted (``reward/errors``, ``reward/errors/<name>``) and written to
:attr:`ScoredBatch.reward_errors` (and the eval samples' ``reward_errors``), and the step goes on.

Outcomes: with the scores, each trajectory gets its one outcome (:mod:`rlfactory_core.outcomes`:
how it ended and whose failure it was, a reward error included) in :attr:`ScoredBatch.outcomes`.

Concurrency: each reward scores at most ``max_concurrency`` trajectories at a time (a judge
model's endpoint sets how many requests it takes; a rule needs no limit). A synchronous
reward that times out is abandoned, not stopped: its (daemon) thread runs to its end, and
the reward's pool gets one more thread, so hung calls never starve the later ones.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from .errors import ConfigError, RLFactoryError, one_line
from .interfaces import accepts, member
from .outcomes import POLICY, Side, outcome_of
from .outcomes import STOP_REASONS as OUTCOME_STOPS
from .threads import DaemonThreadPool
from .types import RewardOutput, Sample, ToolCall, ToolResult, Trajectory

__all__ = ["RewardContext", "RewardLayer", "ScoredBatch", "build_reward_layer"]

log = logging.getLogger(__name__)


@dataclass
class RewardContext:
    """What a reward's ``score(trajectory, sample, context)`` may use besides its arguments.

    ``state`` is the env's per-trajectory state (what ``env.reset`` returned, after the
    episode ended); ``tool_names`` the tools the env registered with the run's tool manager.
    """

    state: Any
    tool_names: frozenset[str]
    _tool_manager: Any = field(repr=False)
    _sample: Sample = field(repr=False)
    _trajectory: Trajectory = field(repr=False)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run the env's tool ``name`` with ``arguments`` through the run's tool manager
        (argument validation, timeouts, retries, caching as configured). Never raises: a
        failed call comes back with ``error`` set, as it would to the model."""
        results = await self._tool_manager.call(
            [ToolCall(name=name, arguments=arguments, id="reward")],
            {"sample": self._sample, "state": self.state, "trajectory": self._trajectory, "tool_names": None})
        return results[0]


@dataclass
class ScoredBatch:
    """Rewards of a batch of trajectories, in order."""

    totals: list[float]
    components: list[dict[str, float]]  # per trajectory: "<name>" and "<name>/<component>" values
    correct: list[bool | None]  # None: no reward said
    errors: Counter[str]  # reward name -> errors in this batch
    applied: Counter[str]  # reward name -> trajectories it applied to (did not return None)
    # per trajectory: the rewards' per-turn rewards, weighted and summed (one per model turn;
    # empty when no reward gave any), added to the env's own by the trainer
    turn_rewards: list[list[float]] = field(default_factory=list)
    # per trajectory: "<reward>: <why>" for each reward that failed on it (it scored its fallback)
    reward_errors: list[list[str]] = field(default_factory=list)
    # per trajectory: its outcome (rlfactory_core.outcomes); None where no reward layer scored it
    outcomes: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        # one entry per trajectory, whoever built the batch (an engine merging workers' parts)
        self.turn_rewards = self.turn_rewards or [[] for _ in self.totals]
        self.reward_errors = self.reward_errors or [[] for _ in self.totals]
        self.outcomes = self.outcomes or [None for _ in self.totals]
        if not len(self.totals) == len(self.turn_rewards) == len(self.reward_errors) == len(self.outcomes):
            raise ValueError(f"a ScoredBatch of {len(self.totals)} trajectories has {len(self.turn_rewards)} "
                             f"turn-reward rows, {len(self.reward_errors)} reward-error rows and "
                             f"{len(self.outcomes)} outcomes")

    @classmethod
    def concat(cls, parts: Sequence[ScoredBatch]) -> ScoredBatch:
        """The batches one after another (a ray engine's workers' chunks, a step's rollouts)."""
        errors: Counter[str] = Counter()
        applied: Counter[str] = Counter()
        for part in parts:
            errors.update(part.errors)
            applied.update(part.applied)
        return cls(totals=[t for p in parts for t in p.totals], components=[c for p in parts for c in p.components],
                   correct=[c for p in parts for c in p.correct], errors=errors, applied=applied,
                   turn_rewards=[r for p in parts for r in p.turn_rewards],
                   reward_errors=[e for p in parts for e in p.reward_errors],
                   outcomes=[o for p in parts for o in p.outcomes])

    def select(self, rows: Sequence[int]) -> ScoredBatch:
        """The batch of the trajectories ``rows``, in that order; ``errors`` and ``applied``
        counted over them."""
        errors: Counter[str] = Counter()
        for row in rows:  # "<name>: <why>"; a name may hold a colon itself (dist:reward)
            errors.update(name for error in self.reward_errors[row] for name in self.errors
                          if error.startswith(f"{name}: "))
        applied = Counter({name: 0 for name in self.applied})
        for row in rows:
            applied.update(key for key in self.components[row] if "/" not in key)
        return ScoredBatch(totals=[self.totals[r] for r in rows], components=[self.components[r] for r in rows],
                           correct=[self.correct[r] for r in rows], errors=errors, applied=applied,
                           turn_rewards=[self.turn_rewards[r] for r in rows],
                           reward_errors=[self.reward_errors[r] for r in rows],
                           outcomes=[self.outcomes[r] for r in rows])

    def metrics(self, prefix: str) -> dict[str, float]:
        """``<prefix>/mean``, ``/std``, ``/accuracy`` (when known), ``/errors``, each
        component's mean over the trajectories it applied to, and, for a reward that did not
        apply to every trajectory, ``<prefix>/<name>/applied`` (the share it applied to)."""
        n = len(self.totals)
        if n == 0:
            return {}
        mean = sum(self.totals) / n
        out = {f"{prefix}/mean": mean,
               f"{prefix}/std": math.sqrt(sum((t - mean) ** 2 for t in self.totals) / n),
               f"{prefix}/errors": float(sum(self.errors.values()))}
        judged = [c for c in self.correct if c is not None]
        if judged:
            out[f"{prefix}/accuracy"] = sum(judged) / len(judged)
        for name, count in self.errors.items():
            out[f"{prefix}/errors/{name}"] = float(count)
        for name, count in self.applied.items():
            if count < n:
                out[f"{prefix}/{name}/applied"] = count / n
        for key in sorted({k for c in self.components for k in c}):
            values = [c[key] for c in self.components if key in c]
            out[f"{prefix}/{key}"] = sum(values) / len(values)
        return out


@dataclass
class _Scorer:
    name: str
    weight: float
    reward: Any
    timeout_s: float | None
    fallback: float
    max_concurrency: int
    limit: asyncio.Semaphore
    wants_context: bool
    is_async: bool
    # Sync rewards get threads of their own, as many as they may run at once: the loop's
    # default pool has min(32, cores + 4) threads (6 here), too few for I/O-bound checks.
    # Daemon threads, so a hung reward cannot keep a finished run from exiting.
    threads: DaemonThreadPool | None = None
    hung: int = 0  # sync calls that timed out and whose threads still run


class RewardLayer:
    """The configured rewards of a run, scoring batches of trajectories (see the module
    docstring). Build it with :func:`build_reward_layer`; :meth:`close` it at the end."""

    def __init__(self, scorers: Sequence[_Scorer], tool_manager: Any = None, tool_exception_side: Side = POLICY):
        self._scorers = list(scorers)
        self._tool_manager = tool_manager
        self._tool_exception_side = tool_exception_side

    @property
    def names(self) -> list[str]:
        return [s.name for s in self._scorers]

    async def score(self, trajectories: Sequence[Trajectory], samples: Sequence[Sample]) -> ScoredBatch:
        """Score every trajectory (``samples[i]`` is trajectory ``i``'s sample) with every
        reward, all at once within each reward's concurrency limit. The trajectories are not
        changed: everything the rewards say is in the returned batch (per-turn rewards, reward
        errors and each trajectory's outcome too). Never raises for a failing reward."""
        errors: Counter[str] = Counter()
        batch = ScoredBatch(totals=[0.0] * len(trajectories), components=[{} for _ in trajectories],
                            correct=[None] * len(trajectories), errors=errors,
                            applied=Counter({s.name: 0 for s in self._scorers}),
                            turn_rewards=[[] for _ in trajectories], reward_errors=[[] for _ in trajectories])

        async def one(row: int, scorer: _Scorer) -> None:
            trajectory, sample = trajectories[row], samples[row]
            try:
                output = await self._call(scorer, trajectory, sample)
            except Exception as exc:  # noqa: BLE001 - one bad trajectory must not end the run
                errors[scorer.name] += 1
                reason = (f"timed out after {scorer.timeout_s:g} s" if isinstance(exc, TimeoutError)
                          else one_line(exc))
                batch.reward_errors[row].append(f"{scorer.name}: {reason}")
                output = RewardOutput(value=scorer.fallback)
            if output is None:  # does not apply to this sample
                return
            batch.applied[scorer.name] += 1
            components = batch.components[row]
            components[scorer.name] = output.value
            for key, value in output.components.items():
                if key != scorer.name:
                    components[f"{scorer.name}/{key}"] = float(value)
            batch.totals[row] += scorer.weight * output.value
            if output.correct is not None:
                batch.correct[row] = bool(output.correct) and batch.correct[row] is not False
            if output.turn_rewards:
                _add_turn_rewards(batch.turn_rewards[row], trajectory.num_turns,
                                  [scorer.weight * r for r in output.turn_rewards])

        await asyncio.gather(*(one(row, scorer) for scorer in self._scorers for row in range(len(trajectories))))
        batch.outcomes = [self._outcome(t, bool(failed)) for t, failed in zip(trajectories, batch.reward_errors)]
        return batch

    def _outcome(self, trajectory: Trajectory, reward_failed: bool) -> str | None:
        """The trajectory's outcome; None for one that never got a stop reason of the core
        (built by hand, or by a plugin's own loop): unclassified, never a failed step."""
        if trajectory.stop_reason not in OUTCOME_STOPS:
            if trajectory.stop_reason:
                log.warning("trajectory %s: stop reason %r is not one of the core's (%s): its outcome is not "
                            "classified", trajectory.sample_id, trajectory.stop_reason, ", ".join(OUTCOME_STOPS))
            return None
        return outcome_of(trajectory, reward_failed=reward_failed, unmarked_exception=self._tool_exception_side)

    async def _call(self, scorer: _Scorer, trajectory: Trajectory, sample: Sample) -> RewardOutput | None:
        kwargs = {}
        if scorer.wants_context:
            kwargs["context"] = RewardContext(
                state=trajectory.env_state, tool_names=frozenset(member("tool_manager", self._tool_manager, "tools")),
                _tool_manager=self._tool_manager, _sample=sample, _trajectory=trajectory)
        async with scorer.limit:
            if scorer.is_async:
                pending = scorer.reward.score(trajectory, sample, **kwargs)
            else:
                if scorer.threads is None:
                    scorer.threads = DaemonThreadPool(scorer.max_concurrency, f"reward-{scorer.name}")
                pending = asyncio.get_running_loop().run_in_executor(
                    scorer.threads, functools.partial(scorer.reward.score, trajectory, sample, **kwargs))
            try:
                result = await asyncio.wait_for(pending, scorer.timeout_s)
            except TimeoutError:
                if not scorer.is_async and scorer.threads is not None:
                    # A thread cannot be stopped: the timed-out call runs on and holds its thread.
                    # One more thread for the pool, so hung calls never starve the next ones.
                    scorer.threads.max_workers += 1
                    scorer.hung += 1
                    if scorer.hung in (1, 10, 100, 1000):
                        log.warning("the %r reward has %d call(s) that timed out and still run in their threads",
                                    scorer.name, scorer.hung)
                raise
        return _as_output(scorer.name, result)

    async def close(self) -> None:
        """Close the rewards that hold resources (a judge's backend). A reward whose
        ``close`` fails is logged; the others are still closed."""
        for scorer in self._scorers:
            if scorer.threads is not None:
                scorer.threads.shutdown(wait=False, cancel_futures=True)
                scorer.threads = None
            close = member("reward", scorer.reward, "close")
            if close is None:
                continue
            try:
                result = close()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # noqa: BLE001 - the run's results are already saved
                log.warning("closing the %r reward failed: %s", scorer.name, one_line(exc))


def _as_output(name: str, result: Any) -> RewardOutput | None:
    if result is None:
        return None
    if isinstance(result, RewardOutput):
        output = result
    elif isinstance(result, (int, float)) and not isinstance(result, bool):
        output = RewardOutput(value=float(result))
    else:
        raise TypeError(f"the {name!r} reward returned {type(result).__name__}; "
                        "return a number, a RewardOutput or None")
    try:
        output.value = float(output.value)
    except (TypeError, ValueError):
        raise TypeError(f"the {name!r} reward's value is {type(output.value).__name__}, not a number") from None
    if not math.isfinite(output.value):
        raise ValueError(f"the {name!r} reward returned a non-finite value ({output.value})")
    if output.turn_rewards and not all(math.isfinite(float(r)) for r in output.turn_rewards):
        raise ValueError(f"the {name!r} reward returned a non-finite turn reward")
    if not isinstance(output.components, dict):
        raise TypeError(f"the {name!r} reward's components are {type(output.components).__name__}, "
                        "not a dict of name -> number")
    components = {}
    for key, value in output.components.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value):  # bools count as 0/1
            raise ValueError(f"the {name!r} reward's component {key!r} is {value!r}, not a finite number")
        components[str(key)] = float(value)
    output.components = components
    return output


def _add_turn_rewards(total: list[float], turns: int, rewards: Sequence[float]) -> None:
    """Add per-model-turn ``rewards`` to ``total`` (grown to the trajectory's ``turns``);
    rewards past its last model turn are dropped."""
    while len(total) < turns:
        total.append(0.0)
    for i, reward in enumerate(rewards[:turns]):
        total[i] += float(reward)


def build_reward_layer(specs: Sequence[Any], tool_manager: Any = None, *, make_reward: Any = None,
                       tool_exception_side: Side = POLICY) -> RewardLayer:
    """The reward layer of ``specs`` (the config's ``rewards`` list: name, weight,
    options, timeout_s, fallback, max_concurrency). Every problem (an unknown reward,
    options a reward does not take, a reward that fails to start) is reported at once.

    ``make_reward(spec)``, when given, may return the object that scores ``spec`` instead
    of the registered class built with its options (the ray engine's judge pool stand-in);
    ``None`` builds the registered one. ``tool_exception_side``: the side of a plain
    exception a tool raised (``rollout.tool_exception_side``; :mod:`rlfactory_core.outcomes`)."""
    from .plugins import get_component

    scorers, problems = [], []
    for i, spec in enumerate(specs):
        try:
            reward = make_reward(spec) if make_reward is not None else None
            if reward is None:
                reward = get_component("reward", spec.name)(**spec.options)
        except ConfigError as exc:
            problems.extend(f"rewards[{i}] ({spec.name}): {p}" for p in exc.errors)
            continue
        except RLFactoryError as exc:  # an unknown reward: its message lists the registered ones
            problems.append(f"rewards[{i}]: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - any constructor failure is a config problem here
            problems.append(f"rewards[{i}] ({spec.name}): its options were refused: {one_line(exc)}")
            continue
        wants_context = accepts("reward", reward.score, "context")
        scorers.append(_Scorer(name=spec.name, weight=spec.weight, reward=reward, timeout_s=spec.timeout_s,
                               fallback=spec.fallback, max_concurrency=spec.max_concurrency,
                               limit=asyncio.Semaphore(spec.max_concurrency),
                               wants_context=wants_context,
                               is_async=inspect.iscoroutinefunction(reward.score)))
    if problems:
        raise ConfigError(problems)
    return RewardLayer(scorers, tool_manager, tool_exception_side)
