"""Built-in rule rewards."""

from __future__ import annotations

import re
import string

from ..hookspecs import hookimpl
from ..types import RewardOutput, Sample, Trajectory


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, squeeze spaces (the SQuAD / Search-R1 rule)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _as_number(text: str) -> float | None:
    try:
        return float(text.strip().replace(",", ""))
    except ValueError:
        return None


def _same_answer(answer: str, expected: str) -> bool:
    """Numbers compare as numbers (normalising would drop their sign and decimal point:
    "-12" is not "12", "1.5" is not "15"); everything else after :func:`normalize_answer`."""
    a, e = _as_number(answer), _as_number(expected)
    if a is not None and e is not None:
        return a == e
    return normalize_answer(answer) == normalize_answer(expected)


class ExactMatchReward:
    """1.0 when the trajectory's final answer equals one of the sample's answers after
    normalisation, else 0.0. The sample's ``answer`` (or ``answers``) may be a string or a
    list of accepted strings."""

    name = "exact_match"
    description = "1 if the final answer matches the sample's answer (normalised), else 0."

    def __init__(self, answer_key: str = "answer"):
        self.answer_key = answer_key

    async def score(self, trajectory: Trajectory, sample: Sample) -> RewardOutput:
        expected = sample.get(self.answer_key, sample.get("answers"))
        if expected is None:
            raise KeyError(f"sample has no {self.answer_key!r} key for the exact_match reward")
        accepted = [expected] if isinstance(expected, str) else list(expected)
        answer = trajectory.final_answer
        hit = answer is not None and any(_same_answer(answer, str(a)) for a in accepted)
        value = 1.0 if hit else 0.0
        return RewardOutput(value=value, components={"exact_match": value})


@hookimpl
def rlfactory_register_rewards(register):
    register(ExactMatchReward)
