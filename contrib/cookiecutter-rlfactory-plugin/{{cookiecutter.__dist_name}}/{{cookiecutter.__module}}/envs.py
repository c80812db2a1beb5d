"""The ``{{ cookiecutter.__slug }}`` env: count the words of a short text with a tool, then answer.

An episode: the model sees a system prompt and a question about a text, and may call the
``{{ cookiecutter.__slug }}_word_count`` tool. The rollout runs the calls and shows the model their
results (rendered by the parser); the env decides whether the episode goes on. The first
turn without tool calls ends it, and that turn's text is the final answer. A turn whose
tool calls could not be parsed gets a feedback message instead, so the model can fix them.

What a training run reads from an env: ``tools`` (the tools the model may call: the run's
tool manager serves these), ``dataset(size, split)`` (its samples; ``rlf train`` asks for
``train`` and evaluates on ``test``), and ``reset`` / ``step`` / ``close`` for each episode.
Each sample's ``answer`` key is what RLFactory's built-in ``exact_match`` reward (the
default) compares the final answer with. With your own data in JSONL files
(``data.train_file=...``, ``data.eval_file=...``), each line is a sample like these.
"""

from __future__ import annotations

import random
import zlib
from typing import Any, Sequence

from rlfactory_core import EnvReset, EnvStep, Message, ParsedTurn, Sample, ToolResult, function_tool

from .tools import {{ cookiecutter.__slug }}_word_count

__all__ = ["WordCountEnv", "WORDS", "SPLITS"]

SYSTEM_PROMPT = (
    "You answer questions about texts. Use the tools you are given to be exact, "
    "then reply with the answer alone, without a tool call."
)

#: The words the sample texts are made of.
WORDS: tuple[str, ...] = (
    "tools", "turn", "guesses", "into", "facts", "reward", "what", "works", "and", "train", "on", "it",
    "again", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "models", "learn", "by", "doing",
)
SPLITS = ("train", "test")


def _split_of(text: str) -> str:
    """One text in five is held out for testing, decided by the text itself: the splits
    never share a text, whatever their sizes."""
    return "test" if zlib.crc32(text.encode()) % 5 == 0 else "train"


class WordCountEnv:
    """Asks how many words a text has and offers the word-count tool to find out.

    Registered as a class: each run builds it with the env options from the config, here
    ``max_turns`` (default 4), after which the episode ends even if the model keeps calling
    tools (then without a final answer), and ``seed`` (default 0), which picks the samples.
    Per-trajectory state is a plain dict returned by :meth:`reset` and passed back to
    :meth:`step` and :meth:`close`.
    """

    name = "{{ cookiecutter.__slug }}"
    description = "Count the words of a short text with the {{ cookiecutter.__slug }}_word_count tool, then answer with the number."

    def __init__(self, max_turns: int = 4, seed: int = 0):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.max_turns = max_turns
        self.seed = seed
        self.tools = [function_tool({{ cookiecutter.__slug }}_word_count)]

    def dataset(self, size: int = 64, split: str = "train") -> list[dict[str, str]]:
        """``size`` samples of ``split`` (``train`` or ``test``): texts of 3 to 12 words, the
        same ones for the same ``seed``, with an ``id``, the ``text`` and the ``answer``."""
        if split not in SPLITS:
            raise ValueError(f"the {self.name} env has the splits {', '.join(SPLITS)}, not {split!r}")
        rng = random.Random(f"{self.seed}:{split}")
        samples = []
        while len(samples) < size:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
            if _split_of(text) == split:
                samples.append({"id": f"{self.name}-{split}-{self.seed}-{len(samples)}", "text": text,
                                "answer": str(len(text.split()))})
        return samples

    async def reset(self, sample: Sample) -> EnvReset:
        """Open an episode: the system prompt, the question about ``sample["text"]``, the tool."""
        if "text" not in sample:
            raise ValueError(f"the {self.name} env needs samples with a 'text' key, got keys {sorted(sample)}")
        question = f"How many words are in this text?\n\n{sample['text']}"
        return EnvReset(
            messages=[Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=question)],
            tools=list(self.tools),
            state={"sample_id": str(sample.get("id", "")), "turns": 0},
        )

    async def step(self, state: dict[str, Any], turn: ParsedTurn, results: Sequence[ToolResult]) -> EnvStep:
        """Go on while the model calls tools (or wrote calls that could not be parsed); a turn
        without either is the answer and ends the episode."""
        state["turns"] += 1
        out_of_turns = state["turns"] >= self.max_turns
        if turn.errors:
            problems = "; ".join(error.message for error in turn.errors)
            feedback = Message(
                role="user",
                content=f"Some tool calls could not be read ({problems}). Fix them, or reply with the answer alone.",
            )
            return EnvStep(observation=[feedback], done=out_of_turns)
        if turn.tool_calls:
            return EnvStep(done=out_of_turns)
        return EnvStep(done=True, final_answer=turn.content.strip())

    async def close(self, state: dict[str, Any]) -> None:
        """Nothing to release: the state is a plain dict. An env that starts a sandbox, a
        database or a browser per episode frees it here; ``close`` runs even after errors."""
