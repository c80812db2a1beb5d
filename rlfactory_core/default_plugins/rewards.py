"""Built-in rule rewards."""

from __future__ import annotations

import re
import string
from collections import Counter

from ..hookspecs import hookimpl
from ..outcomes import CALL_ERRORS
from ..types import RewardOutput, Sample, Trajectory

__all__ = ["ExactMatchReward", "TokenF1Reward", "FormatReward", "normalize_answer", "same_answer", "gold_answers",
           "token_f1"]


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


def same_answer(answer: str, expected: str) -> bool:
    """Numbers compare as numbers (normalising would drop their sign and decimal point:
    "-12" is not "12", "1.5" is not "15"); everything else after :func:`normalize_answer`."""
    a, e = _as_number(answer), _as_number(expected)
    if a is not None and e is not None:
        return a == e
    return normalize_answer(answer) == normalize_answer(expected)


def gold_answers(sample: Sample, answer_key: str = "answer") -> list[str] | None:
    """The sample's accepted answers, from ``sample[answer_key]``, ``answers`` and
    ``golden_answers`` (Search-R1 / FlashRAG data) together: each a string or a list
    (aliases). None when it has none."""
    accepted: list[str] = []
    for key in dict.fromkeys((answer_key, "answers", "golden_answers")):
        value = sample.get(key) if hasattr(sample, "get") else None
        if value is None:
            continue
        for answer in [value] if isinstance(value, (str, int, float)) else value:
            if str(answer) not in accepted:
                accepted.append(str(answer))
    return accepted or None


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD's token F1 between normalised ``prediction`` and ``gold``."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if not predicted or not expected:
        return float(predicted == expected)
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


class ExactMatchReward:
    """1.0 when the trajectory's final answer equals one of the sample's gold answers after
    SQuAD normalisation (numbers compare as numbers), else 0.0; it also marks the answer
    correct or not (``reward/accuracy``). Gold answers: those of ``sample[answer_key]``,
    ``answers`` and ``golden_answers`` together (:func:`gold_answers`), each a string or a
    list. A sample with none: the reward does not apply (None)."""

    name = "exact_match"
    description = "1 if the final answer matches one of the sample's answers (SQuAD-normalised), else 0."

    def __init__(self, answer_key: str = "answer"):
        self.answer_key = answer_key

    async def score(self, trajectory: Trajectory, sample: Sample) -> RewardOutput | None:
        accepted = gold_answers(sample, self.answer_key)
        if accepted is None:
            return None
        answer = trajectory.final_answer
        hit = answer is not None and any(same_answer(answer, a) for a in accepted)
        value = 1.0 if hit else 0.0
        return RewardOutput(value=value, correct=hit)


class TokenF1Reward:
    """The best SQuAD token F1 between the final answer and any gold answer (partial credit
    for partly right answers). Gold answers as for ``exact_match``."""

    name = "f1"
    description = "SQuAD token F1 of the final answer against the best-matching gold answer (0..1)."

    def __init__(self, answer_key: str = "answer"):
        self.answer_key = answer_key

    async def score(self, trajectory: Trajectory, sample: Sample) -> RewardOutput | None:
        accepted = gold_answers(sample, self.answer_key)
        if accepted is None:
            return None
        answer = trajectory.final_answer
        return RewardOutput(value=max(token_f1(answer, a) for a in accepted) if answer is not None else 0.0)


_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
# the model-side failures of a tool call; timeouts and exceptions are the tool's
_CALL_FORMAT_ERRORS = CALL_ERRORS


class FormatReward:
    """Whether the trajectory is well formed, as the mean of two checks (each logged as a
    component, 1 or 0):

    * ``answer_tags``: the last model turn (its ``<think>`` block aside) holds exactly one
      ``<TAG>...</TAG>`` pair (``tag`` option, default ``answer``), opened before it is
      closed, with a non-empty answer inside;
    * ``tool_calls``: every tool call of the trajectory parsed, named a tool the env offers
      and had valid arguments (a trajectory without calls passes).

    Turn a check off with ``answer_tags=false`` or ``tool_calls=false``."""

    name = "format"
    description = "1 when the answer sits in one well-formed <answer> tag pair and every tool call was valid."

    def __init__(self, tag: str = "answer", answer_tags: bool = True, tool_calls: bool = True):
        if not (answer_tags or tool_calls):
            raise ValueError("the format reward needs at least one check: answer_tags or tool_calls")
        if not re.fullmatch(r"[A-Za-z_][\w.-]*", tag):
            raise ValueError(f"tag must be a tag name like 'answer', got {tag!r}")
        self.tag, self.answer_tags, self.tool_calls = tag, answer_tags, tool_calls

    def answer_tags_ok(self, trajectory: Trajectory) -> bool:
        """Whether the last model turn holds one well-formed, non-empty answer tag pair."""
        replies = [m.content for m in trajectory.messages if m.role == "assistant"]
        # without a model turn the last assistant message would be a few-shot example's
        if not trajectory.num_turns or not replies or not isinstance(replies[-1], str):
            return False
        text = _THINK.sub("", replies[-1])
        opened, closed = f"<{self.tag}>", f"</{self.tag}>"
        if text.count(opened) != 1 or text.count(closed) != 1:
            return False
        start, end = text.index(opened), text.index(closed)
        return start < end and bool(text[start + len(opened):end].strip())

    @staticmethod
    def _tool_calls_ok(trajectory: Trajectory) -> bool:
        if trajectory.metadata.get("parse_errors", 0):
            return False
        errors = trajectory.metadata.get("tool_errors", {}) or {}
        return not any(errors.get(kind, 0) for kind in _CALL_FORMAT_ERRORS)

    async def score(self, trajectory: Trajectory, sample: Sample) -> RewardOutput:
        checks = {}
        if self.answer_tags:
            checks["answer_tags"] = float(self.answer_tags_ok(trajectory))
        if self.tool_calls:
            checks["tool_calls"] = float(self._tool_calls_ok(trajectory))
        return RewardOutput(value=sum(checks.values()) / len(checks), components=checks)


@hookimpl
def rlfactory_register_rewards(register):
    register(ExactMatchReward)
    register(TokenF1Reward)
    register(FormatReward)
