"""The env ``arithmetic``: questions answered with the ``calculator`` tool.

A small, fully offline task for smoke-testing a setup end to end and for benchmarking
the rollout engine: every question needs one tool call, and an episode can ask several
questions in a row (each answer is followed by the next question), so trajectories have
many turns and tool calls of their own. Small models follow the tool-call format from
``few_shot`` example turns in the prompt (the embedded 135M model does).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, Sequence

from rlfactory_core import EnvReset, EnvStep, Message, ParsedTurn, Sample, ToolResult, get_component

SYSTEM_PROMPT = "You are a helpful assistant. Always call the calculator tool first, then answer."
NO_TOOLS_PROMPT = "You are a helpful assistant. Answer with the number only."
_FEW_SHOT = (("What is 12*7?", "12*7"), ("What is 3+5?", "3+5"))
_OPERATORS = ("+", "-", "*")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _split_of(a: int, op: str, b: int) -> str:
    """One question in five is held out for testing, decided by the question itself."""
    return "test" if (a * 131 + b * 7 + _OPERATORS.index(op)) % 5 == 0 else "train"


def _tool_call_text(expression: str) -> str:
    payload = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>\n{payload}\n</tool_call>"


class ArithmeticEnv:
    """Arithmetic questions answered with the ``calculator`` tool.

    :param questions_per_episode: questions asked one after another in one episode;
        after the model answers one (a turn without tool calls) the next is asked.
    :param few_shot: start the conversation with example turns showing the tool-call
        format (the Qwen3/Hermes format of the ``qwen3`` parser).
    :param seed: seed of :meth:`dataset`.
    :param use_tools: offer the calculator; without it the task is single-turn
        question answering (e.g. to compare with single-turn trainers in ``bench/``).

    Samples: ``{"id", "questions": [...], "answers": [...], "answer": <last answer>}``.
    The final answer is the last number in the model's answer to the last question
    (the whole answer when it has no number).
    """

    name = "arithmetic"
    description = "Offline arithmetic questions answered with the calculator tool (smoke tests, benchmarks)."

    def __init__(self, questions_per_episode: int = 1, few_shot: bool = True, seed: int = 0,
                 use_tools: bool = True):
        if questions_per_episode < 1:
            raise ValueError(f"questions_per_episode must be >= 1, got {questions_per_episode}")
        self.questions_per_episode = questions_per_episode
        self.few_shot = few_shot
        self.seed = seed
        self.use_tools = use_tools
        # The core's calculator by its qualified name: another plugin's tool named "calculator"
        # makes the plain name ambiguous, and this env means the core's.
        self.tools = [get_component("tool", "rlfactory:calculator")] if use_tools else []

    def data_fingerprint(self, samples: Sequence[Any]) -> str:
        """``""``: an episode reads its sample and the calculator, nothing else
        (``eval.reuse_untrained`` may reuse the untrained model's eval)."""
        return ""

    def dataset(self, size: int = 256, split: str = "train") -> list[dict[str, Any]]:
        """``size`` samples of ``split`` (``train`` or ``test``), the same for the same seed.
        The splits share no question: each ``a op b`` belongs to one split only."""
        if split not in ("train", "test"):
            raise ValueError(f"the arithmetic env has splits 'train' and 'test', not {split!r}")
        rng = random.Random(f"{self.seed}:{split}")
        rows = []
        for index in range(size):
            questions, answers = [], []
            while len(questions) < self.questions_per_episode:
                a, b, op = rng.randint(2, 99), rng.randint(2, 99), rng.choice(_OPERATORS)
                if _split_of(a, op, b) != split:
                    continue
                questions.append(f"What is {a}{op}{b}?")
                answers.append(str(eval(f"{a}{op}{b}")))  # noqa: S307 - two ints and an operator we chose
            rows.append({"id": f"arithmetic-{split}-{self.seed}-{index}", "questions": questions,
                         "answers": answers, "answer": answers[-1]})
        return rows

    async def reset(self, sample: Sample) -> EnvReset:
        questions = sample.get("questions") or ([sample["question"]] if "question" in sample else None)
        if not questions:
            raise ValueError(f"the arithmetic env needs samples with 'questions' (or 'question'), got keys {sorted(sample)}")
        messages = [Message(role="system", content=SYSTEM_PROMPT if self.use_tools else NO_TOOLS_PROMPT)]
        if self.few_shot:
            for question, expression in _FEW_SHOT:
                answer = _tool_call_text(expression) if self.use_tools else str(eval(expression))  # noqa: S307
                messages += [Message(role="user", content=question), Message(role="assistant", content=answer)]
        messages.append(Message(role="user", content=str(questions[0])))
        return EnvReset(messages=messages, tools=list(self.tools),
                        state={"questions": list(map(str, questions)), "asked": 1, "answers": []})

    async def step(self, state: Any, turn: ParsedTurn, results: Sequence[ToolResult]) -> EnvStep:
        if turn.tool_calls or turn.errors:
            return EnvStep()  # the rollout shows the tool results (or the parse errors)
        state["answers"].append(turn.content)
        if state["asked"] < len(state["questions"]):
            question = state["questions"][state["asked"]]
            state["asked"] += 1
            return EnvStep(observation=[Message(role="user", content=question)])
        numbers = _NUMBER.findall(turn.content)
        return EnvStep(done=True, final_answer=numbers[-1] if numbers else turn.content)

    async def close(self, state: Any) -> None:
        """Nothing to release: the calculator holds no resources."""
