"""The ``{{ cookiecutter.__slug }}_length`` reward: full marks for a final answer within a word budget."""

from __future__ import annotations

from rlfactory_core import RewardOutput, Sample, Trajectory

__all__ = ["LengthReward"]


class LengthReward:
    """1.0 for a final answer of at most ``max_words`` words, falling linearly to 0.0 at
    twice the budget; 0.0 when the trajectory has no final answer or an empty one.

    Registered as a class: each run builds it with the reward's options from the config,
    here ``max_words`` (default 50). Components logged as metrics: ``words`` (the answer's
    length) and ``within_budget`` (1.0 or 0.0).
    """

    name = "{{ cookiecutter.__slug }}_length"
    description = "1 for a final answer of at most max_words words, falling linearly to 0 at twice the budget."

    def __init__(self, max_words: int = 50):
        if max_words < 1:
            raise ValueError(f"max_words must be at least 1, got {max_words}")
        self.max_words = max_words

    async def score(self, trajectory: Trajectory, sample: Sample) -> RewardOutput:
        words = len((trajectory.final_answer or "").split())
        within_budget = 0 < words <= self.max_words
        if words == 0:
            value = 0.0
        elif within_budget:
            value = 1.0
        else:
            value = max(0.0, 1.0 - (words - self.max_words) / self.max_words)
        return RewardOutput(value=value, components={"words": float(words), "within_budget": float(within_budget)})
