"""How a trajectory ended, and whose failure it was: the policy's or the infrastructure's.

A timed-out search scored like a wrong answer teaches the policy that searching is bad and
skews its group's baseline. So every trajectory ends with exactly one **outcome**, computed
once by :func:`outcome_of`, and each outcome is on one **side**:

=========================== ================ =====================================================
outcome                     side             what happened
=========================== ================ =====================================================
``answered``                policy           the model gave a final answer (right or wrong)
``no_answer``               policy           it stopped without one
``max_turns``               policy           it used every turn (``rollout.max_turns``)
``token_budget``            policy           its context outgrew ``rollout.max_trajectory_tokens``
``malformed_call``          policy           a tool call the parser could not read
``unknown_tool``            policy           a call to a tool the env does not offer
``invalid_arguments``       policy           arguments the tool's schema or the tool rejected
``tool_error_caused_by_call`` policy         the tool ran and failed on what it was asked (an SQL
                                             error, a query over a limit, a missing file)
``tool_timeout``            infrastructure   the tool manager's ``timeout_s``: no answer in time
``tool_unavailable``        infrastructure   the service is down, the connection was lost, the
                                             server or its actor died, retries were exhausted
``tool_infra_error``        infrastructure   a tool said its service failed (not the call)
``backend_error``           infrastructure   the generation backend failed, aborted or was stopped
``env_error``               infrastructure   the env or its data failed (reset, step, rendering,
                                             a prompt longer than the budget before any turn)
``reward_error``            infrastructure   a reward raised (or its judge failed): the score is
                                             the fallback, not a verdict
=========================== ================ =====================================================

Precedence, for a trajectory with several signals (a timed-out search, then a right answer):
the infrastructure wins, because the model's later turns were conditioned on a result the
service corrupted: first how the episode stopped (``backend_error``, ``env_error``), then
``reward_error``, then the tool results' infrastructure failures (``tool_unavailable``, then
``tool_timeout``, then ``tool_infra_error``). With none, the policy's: a limit that ended it
(``token_budget``, ``max_turns``), else ``answered`` when it answered, else ``malformed_call``
when a call could not be parsed, else its first failed call's class, else ``no_answer``.

A tool result's side comes from its error kind (:data:`TOOL_ERROR_KINDS`), or from its
``infrastructure`` flag when the tool set it (``True``: the service failed; ``False``: the
call did). An exception the tool did not mark (``exception`` without ``transient``; every
tool that raises a plain exception) is the policy's by default: the model sees it as an
observation and most are its arguments' fault (a missing file, a bad path); pass
``unmarked_exception="infrastructure"`` for tools whose plain exceptions are outages.

**Handling** (the run's ``failures`` section, :class:`FailureHandling`), per class or per side:

- ``penalize``: train on it as scored (the default for the policy's classes);
- ``resample``: run that member of its group again, within the step, with a new seed, up to
  ``failures.max_resamples`` times, before the group joins the batch; one still failing then
  is masked (the default for the infrastructure's classes; :mod:`rlfactory_core.resampling`);
- ``mask``: out of the loss and out of its group's mean and std, so it moves no baseline;
  unlike ``grpo.overlong_filter``, which keeps its rows in the baseline;
- ``abort``: masked, and the run stops when the class ends more than ``failures.abort_share``
  of a step's trajectories (default 0.5): one line naming it, the last finished step saved;
  ``--resume`` continues once the service is back.

This module is a leaf: it imports nothing from the core, so every layer may read it, and it
is the one source of these vocabularies (tool error kinds, stop reasons, outcomes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import pydantic

__all__ = ["POLICY", "INFRASTRUCTURE", "Side", "Outcome", "OUTCOMES", "STOP_REASONS", "TOOL_ERROR_KINDS",
           "CALL_ERRORS", "LIMIT_STOPS", "ERROR_STOPS", "outcome_of", "side_of", "result_outcome", "outcome_metrics",
           "Handling", "HANDLINGS", "FailureHandling", "DEFAULT_ABORT_SHARE", "DEFAULT_MAX_RESAMPLES"]

Side = Literal["policy", "infrastructure"]
POLICY: Side = "policy"
INFRASTRUCTURE: Side = "infrastructure"


@dataclass(frozen=True)
class Outcome:
    """One outcome class: its name, side and what it means."""

    name: str
    side: Side
    description: str


OUTCOMES: dict[str, Outcome] = {o.name: o for o in (
    Outcome("answered", POLICY, "the model gave a final answer (right or wrong)"),
    Outcome("no_answer", POLICY, "the model stopped without a final answer"),
    Outcome("max_turns", POLICY, "the model used every turn"),
    Outcome("token_budget", POLICY, "the context outgrew the trajectory's token budget"),
    Outcome("malformed_call", POLICY, "a tool call the parser could not read"),
    Outcome("unknown_tool", POLICY, "a call to a tool the env does not offer"),
    Outcome("invalid_arguments", POLICY, "arguments the tool's schema or the tool rejected"),
    Outcome("tool_error_caused_by_call", POLICY, "the tool ran and failed on what it was asked"),
    Outcome("tool_timeout", INFRASTRUCTURE, "the tool did not answer within the tool manager's timeout"),
    Outcome("tool_unavailable", INFRASTRUCTURE, "the tool's service was down or died; retries exhausted"),
    Outcome("tool_infra_error", INFRASTRUCTURE, "the tool reported a failure of its service"),
    Outcome("backend_error", INFRASTRUCTURE, "the generation backend failed, aborted or was stopped"),
    Outcome("env_error", INFRASTRUCTURE, "the env or its data failed"),
    Outcome("reward_error", INFRASTRUCTURE, "a reward failed: the score is its fallback"),
)}

#: Every way a trajectory stops (``Trajectory.stop_reason``, :mod:`rlfactory_core.rollout.agent_loop`)
#: -> its outcome, or None where the rest of the trajectory decides (how it answered, its calls).
STOP_REASONS: dict[str, str | None] = {
    "no_tool_call": None,  # the model answered without a call (or wrote nothing the env took)
    "env_done": None,  # the env ended the episode
    "max_turns": "max_turns",
    "token_budget": "token_budget",
    "prompt_too_long": "env_error",  # the prompt alone is over the budget: the data's, before any turn
    "tool_error": None,  # rollout.on_tool_error=end: the failed call's class
    "aborted": "backend_error",
    "env_error": "env_error",
    "generation_error": "backend_error",
    "cancelled": "backend_error",  # the run stopped it; such a trajectory is never trained
}

#: Every ``ToolResult.error`` of the core (the tool manager's kinds and the parser's) -> the
#: outcome of a result that failed so, or None where the result decides (see :func:`result_outcome`).
TOOL_ERROR_KINDS: dict[str, str | None] = {
    "unknown_tool": "unknown_tool",
    "invalid_arguments": "invalid_arguments",
    "parse_error": "malformed_call",
    "timeout": "tool_timeout",
    "exception": None,  # transient (retries exhausted): unavailable; unmarked: see the docstring
    "tool_error": None,  # the tool's own failure (kind in metadata["tool_error"]): the call's unless marked
}

#: The failed calls that are the model's writing: it named no offered tool or gave arguments
#: the tool rejected (format rewards count these; timeouts and crashes are not the model's).
CALL_ERRORS = frozenset(kind for kind, outcome in TOOL_ERROR_KINDS.items()
                        if outcome in ("unknown_tool", "invalid_arguments"))
#: The stop reasons of a trajectory a limit ended before the model finished.
LIMIT_STOPS = frozenset(reason for reason, outcome in STOP_REASONS.items() if outcome in ("max_turns", "token_budget"))
#: The stop reasons of an episode that did not finish because something other than the model failed.
ERROR_STOPS = frozenset({"env_error", "generation_error"})

_INFRA_TOOL_ORDER = ("tool_unavailable", "tool_timeout", "tool_infra_error")
_STOP_ORDER = ("backend_error", "env_error")


def side_of(outcome: str) -> Side:
    """The side of ``outcome`` (a name of :data:`OUTCOMES`); ValueError for another name."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}: one of {', '.join(OUTCOMES)}")
    return OUTCOMES[outcome].side


def result_outcome(result: Any, unmarked_exception: Side = POLICY) -> str | None:
    """The outcome class of one tool result (a :class:`~rlfactory_core.ToolResult`); None when
    it succeeded. A result's ``infrastructure`` flag, when set, decides the side."""
    if getattr(result, "error", None) is None:
        return None
    kind = result.error
    marked = getattr(result, "infrastructure", None)
    if marked is True:
        if kind == "timeout":
            return "tool_timeout"
        return "tool_unavailable" if getattr(result, "transient", False) else "tool_infra_error"
    if marked is False:
        return TOOL_ERROR_KINDS.get(kind) if kind in ("unknown_tool", "invalid_arguments", "parse_error") \
            else "tool_error_caused_by_call"
    if kind in TOOL_ERROR_KINDS and TOOL_ERROR_KINDS[kind] is not None:
        return TOOL_ERROR_KINDS[kind]
    if kind == "exception":
        if getattr(result, "transient", False):
            return "tool_unavailable"
        return "tool_error_caused_by_call" if unmarked_exception == POLICY else "tool_infra_error"
    return "tool_error_caused_by_call"  # tool_error, or a kind a plugin's tool manager invented


def outcome_of(trajectory: Any, *, reward_failed: bool = False, unmarked_exception: Side = POLICY) -> str:
    """The one outcome of a finished ``trajectory`` (a :class:`~rlfactory_core.Trajectory`),
    by the precedence in the module docstring. ``reward_failed``: a reward raised for it (its
    score is the fallback). An unknown stop reason is a ValueError: add it to :data:`STOP_REASONS`."""
    reason = trajectory.stop_reason
    if reason not in STOP_REASONS:
        raise ValueError(f"unknown stop reason {reason!r}: add it to rlfactory_core.outcomes.STOP_REASONS")
    by_stop = STOP_REASONS[reason]
    if by_stop in _STOP_ORDER:
        return by_stop
    if reward_failed:
        return "reward_error"
    failed = [o for o in (result_outcome(r, unmarked_exception) for r in trajectory.tool_results) if o]
    for infrastructure in _INFRA_TOOL_ORDER:
        if infrastructure in failed:
            return infrastructure
    if by_stop is not None:  # a limit
        return by_stop
    if trajectory.final_answer is not None:
        return "answered"
    if trajectory.metadata.get("parse_errors"):
        failed.insert(0, "malformed_call")
    return failed[0] if failed else "no_answer"


def outcome_metrics(prefix: str, outcomes: Sequence[str | None],
                    correct: Sequence[bool | None] = ()) -> dict[str, float]:
    """``<prefix>/<class>``: the share of the classified trajectories that ended in each class
    present; ``<prefix>/infrastructure``: the share on the infrastructure's side (0.0 included,
    so a plot has its line); with ``correct`` (a reward's verdict per trajectory),
    ``<prefix>/accuracy_policy_only``: the accuracy over the policy's outcomes alone (what the
    model achieved where the services worked). Empty when none is classified."""
    known = [o for o in outcomes if o is not None]
    if not known:
        return {}
    metrics = {f"{prefix}/{name}": count / len(known) for name, count in sorted(Counter(known).items())}
    metrics[f"{prefix}/infrastructure"] = sum(OUTCOMES[o].side == INFRASTRUCTURE for o in known) / len(known)
    judged = [c for o, c in zip(outcomes, correct) if o is not None and OUTCOMES[o].side == POLICY and c is not None]
    if judged:
        metrics[f"{prefix}/accuracy_policy_only"] = sum(judged) / len(judged)
    return metrics


Handling = Literal["penalize", "resample", "mask", "abort"]
HANDLINGS: tuple[str, ...] = ("penalize", "resample", "mask", "abort")
#: ``failures.abort_share``'s default: a class with ``abort`` stops the run when it ends more
#: than half of a step's trajectories
DEFAULT_ABORT_SHARE = 0.5
#: ``failures.max_resamples``'s default: a failed member runs again at most twice a step
DEFAULT_MAX_RESAMPLES = 2


class FailureHandling(pydantic.BaseModel):
    """The ``failures`` section of a run's config: how each outcome class trains (module
    docstring). Unknown keys are errors."""

    model_config = pydantic.ConfigDict(extra="forbid")

    policy: Handling = pydantic.Field("penalize", description="the policy's classes: train on them as scored")
    infrastructure: Handling = pydantic.Field(
        "resample", description="the infrastructure's classes: run that member again with a new seed (masked when "
                                "every attempt failed)")
    classes: dict[str, Handling] = pydantic.Field(
        default_factory=dict, description="per class, over its side's handling (e.g. {tool_timeout: abort})")
    abort_share: float = pydantic.Field(
        DEFAULT_ABORT_SHARE, gt=0, le=1,
        description="a class handled 'abort' stops the run when it ends more than this share of a step")
    resample_correction: Literal["importance", "none"] = pydantic.Field(
        "importance", description="undo the bias of training only on the attempts the services answered: weigh each "
                                  "trajectory by the inverse of its calls' survival (rlfactory_core.resampling); "
                                  "none trains the survivors as they are")
    max_resamples: int = pydantic.Field(
        DEFAULT_MAX_RESAMPLES, ge=0, le=100,
        description="how many times a step runs a member handled 'resample' again before masking it (0: mask)")

    @pydantic.field_validator("classes", mode="before")
    @classmethod
    def _known_classes(cls, classes: Any) -> Any:
        """Every unknown class and every unknown handling at once (as one message)."""
        if not isinstance(classes, dict):
            return classes  # pydantic says it is not a mapping
        problems = [f"unknown outcome class {name!r}" for name in classes if name not in OUTCOMES]
        problems += [f"{name!r}: unknown handling {how!r}" for name, how in classes.items()
                     if how not in HANDLINGS]
        if problems:
            raise ValueError(f"{'; '.join(problems)} (classes: {', '.join(OUTCOMES)}; handlings: "
                             f"{', '.join(HANDLINGS)})")
        return classes

    def of(self, outcome: str | None) -> Handling:
        """How ``outcome`` trains; an unclassified trajectory (None) is trained as scored."""
        if outcome is None:
            return "penalize"
        return self.classes.get(outcome) or (self.policy if OUTCOMES[outcome].side == POLICY else self.infrastructure)

    def masked(self, outcomes: Sequence[str | None]) -> list[bool]:
        """Per trajectory: whether it is left out of the loss and of its group's baseline (a
        class handled ``resample`` still in a batch used up its attempts)."""
        return [self.of(o) in ("resample", "mask", "abort") for o in outcomes]

    def resampled(self, outcomes: Sequence[str | None]) -> list[bool]:
        """Per trajectory: whether its member is to run again (its class is handled ``resample``)."""
        return [self.of(o) == "resample" for o in outcomes]

    def aborting(self, outcomes: Sequence[str | None]) -> str | None:
        """The class handled ``abort`` whose share of ``outcomes`` (a step's) is over
        ``abort_share`` (the largest such), as one line for the user; None when none is."""
        if not outcomes:
            return None
        over = [(count / len(outcomes), name) for name, count in Counter(o for o in outcomes if o).items()
                if self.of(name) == "abort" and count / len(outcomes) > self.abort_share]
        if not over:
            return None
        share, name = max(over)
        return (f"{share:.0%} of the step's trajectories ended in {name} ({OUTCOMES[name].description}), over "
                f"failures.abort_share {self.abort_share:g}")
