"""The ``search_r1`` training reward: exact match plus small format terms.

The values are those of RL-Factory's Search-R1 reproduction (``envs/search.py``,
``_compute_score_with_rules``, format score 0.1 in training, 0 in validation), with
``f = format_score``:

* answer format ``a``: ``+f`` when the last turn's ``<answer>...</answer>`` tags are well
  formed, else ``-f``;
* tool-call format ``c``: with ``n`` tool calls written (parsed or not) of which ``v`` are
  valid (parsed, known tool, valid arguments): ``-f`` when ``n = 0``, else
  ``2 f v / n - f``, and ``0.5 f`` less when ``n > 2``;
* with ``s = a + c``: a correct answer (exact match against any gold answer, SQuAD
  normalisation) scores ``1 + 0.5 s``; a wrong one ``s``; no answer at all ``-f + 0.5 s``.

So the best score is 1.1 (right answer, good format, one or two valid searches); a wrong
answer scores at least -0.25 and no answer at least -0.225. Validation uses plain ``exact_match`` (0 or 1): the env's
``config_defaults`` set ``eval.rewards`` to it.

Deliberate differences from RL-Factory's code: its answer-tag check only tracked
``<tool_call>`` tags, so every answer passed it; here the tags of the last turn are checked
(exactly one non-empty pair, opened before closed, ``<think>`` aside). Tool calls are counted
from the parser's results (calls and parse errors) instead of re-parsing the text as JSON:
badly nested ``<tool_call>`` tags (RL-Factory's separate ``-0.5 f``) are parse errors here,
and a call of an unknown tool or with invalid arguments is invalid.
"""

from __future__ import annotations

from rlfactory_core import CALL_ERRORS, FormatReward, RewardOutput, Sample, Trajectory, gold_answers, same_answer

__all__ = ["SearchR1Reward"]

_INVALID_CALLS = CALL_ERRORS  # the model-side failures of a call (rlfactory_core.outcomes)


class SearchR1Reward:
    """Exact match plus RL-Factory's Search-R1 format terms (see the module docstring)."""

    name = "search_r1"
    description = "Search-R1 training reward: exact match (any gold answer) plus small answer/tool-call format terms."

    def __init__(self, format_score: float = 0.1, answer_key: str = "answer"):
        if not 0 <= format_score <= 0.5:
            raise ValueError(f"format_score must be in [0, 0.5] (RL-Factory uses 0.1), got {format_score}")
        self.format_score = format_score
        self.answer_key = answer_key
        self._tags = FormatReward(tool_calls=False)

    def _tool_call_term(self, trajectory: Trajectory) -> float:
        f = self.format_score
        parse_errors = int(trajectory.metadata.get("parse_errors", 0) or 0)
        written = len(trajectory.tool_calls) + parse_errors
        if written == 0:
            return -f
        errors = trajectory.metadata.get("tool_errors", {}) or {}
        invalid = parse_errors + sum(int(errors.get(kind, 0)) for kind in _INVALID_CALLS)
        term = 2 * f * (written - invalid) / written - f
        return term - 0.5 * f if written > 2 else term

    async def score(self, trajectory: Trajectory, sample: Sample) -> RewardOutput | None:
        accepted = gold_answers(sample, self.answer_key)
        if accepted is None:
            return None
        f = self.format_score
        answer_term = f if self._tags.answer_tags_ok(trajectory) else -f
        tool_term = self._tool_call_term(trajectory)
        format_total = answer_term + tool_term
        answer = trajectory.final_answer
        correct = bool(answer) and any(same_answer(answer, gold) for gold in accepted)
        if not answer:
            value = -f + 0.5 * format_total
        elif correct:
            value = 1.0 + 0.5 * format_total
        else:
            value = format_total
        return RewardOutput(value=value, correct=correct,
                            components={"exact_match": float(correct), "answer_format": answer_term,
                                        "tool_call_format": tool_term})
