"""The reward ``android_task``: did the episode reach the task's goal on the device?

The env reads the task's success check from the device when the episode ends (a setting's
value, a contact, a note, a field's text: :func:`rlfactory_android.checks.evaluate_check`),
before the device is released, and keeps the verdict in the episode's state. The check fails
on side effects too: a setting, contact or note the task does not ask about that changed
since the start (:mod:`rlfactory_android.checks`). This reward turns the verdict into the
score: ``success_value`` (1.0) when the check passed, ``failure_value`` (0.0) otherwise.
Components: ``success`` (1/0) and ``actions`` (the tool calls carried out, waits included;
refused calls and ones the device failed are not counted).
A check the device could not answer is a reward error (counted, the fallback value given).
A trajectory that is not an android episode gets ``None`` (the reward does not apply).
"""

from __future__ import annotations

from typing import Any

from rlfactory_core import RewardOutput

__all__ = ["AndroidTaskReward"]


class AndroidTaskReward:
    name = "android_task"
    description = "Android: 1 when the task's success check on the device state passed at the end, else 0."

    def __init__(self, success_value: float = 1.0, failure_value: float = 0.0):
        for key, value in (("success_value", success_value), ("failure_value", failure_value)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"android_task: {key} must be a number, got {value!r}")
        self.success_value, self.failure_value = float(success_value), float(failure_value)

    def score(self, trajectory: Any, sample: Any, context: Any) -> RewardOutput | None:
        state = context.state
        if not isinstance(state, dict) or "task" not in state or "success" not in state:
            return None
        if state.get("check_error"):
            raise RuntimeError(f"the success check of task {state['task'].id} could not be read: {state['check_error']}")
        if state["success"] is None:
            raise RuntimeError(f"the success check of task {state['task'].id} was not read (the episode was not closed)")
        success = bool(state["success"])
        return RewardOutput(value=self.success_value if success else self.failure_value,
                            components={"success": float(success), "actions": float(state["actions"])},
                            correct=success)
