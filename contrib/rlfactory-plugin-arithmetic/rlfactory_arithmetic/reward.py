"""The reward ``arithmetic_verified``: each answer checked by running the calculator tool.

A tool-verified reward: instead of trusting the dataset's gold answers, it recomputes
every question of the episode with the env's ``calculator`` tool (through the run's tool
manager, so with its timeouts and argument validation) and compares the model's answers
with the tool's results. It reads the questions and the model's answers from the env's
per-trajectory state.
"""

from __future__ import annotations

import re
from typing import Any

from rlfactory_core import RewardOutput, Sample, Trajectory

__all__ = ["ArithmeticVerifiedReward"]

_QUESTION = re.compile(r"What is\s+(-?\d+\s*[-+*]\s*-?\d+)\s*\?")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class ArithmeticVerifiedReward:
    """The share of the episode's questions whose answer equals the calculator's result.

    Needs the ``arithmetic`` env with its tool (``use_tools=true``): the calculator is
    called through the run's tool manager. An answer's value is the last number in it.
    ``correct`` (for ``reward/accuracy``) when every answer is right."""

    name = "arithmetic_verified"
    description = "Share of the episode's answers that match the calculator's result for the question."

    async def score(self, trajectory: Trajectory, sample: Sample, context: Any) -> RewardOutput | None:
        state = context.state
        if not isinstance(state, dict) or "questions" not in state:
            return None  # not an arithmetic episode, or it ended before reset finished
        if "calculator" not in context.tool_names:
            raise LookupError("the env offers no 'calculator' tool to verify with; "
                              "set env_options.use_tools=true")
        right = 0
        for question, answer in zip(state["questions"], state["answers"]):
            match = _QUESTION.search(question)
            if match is None:
                raise ValueError(f"cannot read an expression from the question {question!r}")
            result = await context.call_tool("calculator", {"expression": match.group(1)})
            if result.error:
                raise RuntimeError(f"the calculator failed on {match.group(1)!r}: {result.content}")
            numbers = _NUMBER.findall(answer)
            right += bool(numbers) and float(numbers[-1]) == float(result.content)
        total = len(state["questions"])
        return RewardOutput(value=right / total, correct=right == total)
