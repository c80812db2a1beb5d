"""Reading a score in [0, 1] out of a judge model's free-text reply.

Judge models do not always follow the requested format, and a reward that guesses wrong
trains the policy on noise, so the rules go from the most explicit form to the least and
stop at the first that gives a number; a reply that fits none (or that contradicts
itself) raises :class:`JudgeOutputError` instead of guessing.

1. Reasoning is dropped first: everything up to the last ``</think>`` (QwQ and other
   reasoning models think before they answer, and drafts of the verdict in the reasoning
   are not the verdict). A ``<think>`` that is never closed means the reply was cut off
   while thinking: there is no verdict.
2. ``<score>X</score>``: the last tag holding a readable score wins (a tag holding
   something else, e.g. the template's own ``<score>...</score>`` echoed back, is
   skipped). An unclosed ``<score>X`` at the very end (cut off) counts too.
3. A labelled score: ``Score: 8/10``, ``score of 0.7``, ``Rating = 4 out of 5``,
   ``Final grade: 80%``; the last one wins.
4. A bare fraction on a usual scale (``7/10``, ``3 out of 5``, ``45/100``, ``1/1``);
   fractions with other denominators are read as part of the answer (``3/4 cup``).
5. A percentage (``85%``).
6. A reply that is nothing but a number in [0, 1] (``0.8``).
7. Verdict words: a reply that starts with one (``Yes``, ``Incorrect, because ...``), a
   labelled one (``Verdict: correct``), or else every ``correct`` / ``incorrect`` /
   ``wrong`` in the text (``not correct`` counts as incorrect), which must all agree.

Every score is clamped to [0, 1] (``<score>7</score>`` is 1.0, ``-1`` is 0.0).
"""

from __future__ import annotations

import re

from rlfactory_core import RLFactoryError

__all__ = ["JudgeOutputError", "parse_verdict", "strip_reasoning"]

#: How much of a bad reply an error message quotes.
SNIPPET_CHARS = 80

_NUMBER = r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)"
_FLAGS = re.IGNORECASE

# The content is bounded so that a long reply full of unclosed tags stays linear to scan.
_SCORE_TAG = re.compile(r"<score>([^<]{0,64})</score>", _FLAGS)
_UNCLOSED_SCORE_AT_END = re.compile(r"<score>\s*(" + _NUMBER + r")\s*$", _FLAGS)
_ANY_SCORE_TAG = re.compile(r"</?score>", _FLAGS)

_NUMBER_ONLY = re.compile(r"\s*(" + _NUMBER + r")\s*")
_FRACTION_ONLY = re.compile(r"\s*(" + _NUMBER + r")\s*(?:/|out of)\s*(" + _NUMBER + r")\s*", _FLAGS)
_PERCENT_ONLY = re.compile(r"\s*(" + _NUMBER + r")\s*%\s*")

_LABELLED_SCORE = re.compile(
    r"\b(?:score|rating|grade)\b\*{0,2}\s*(?:is|of|:|=)?\s*\*{0,2}\s*"
    r"(" + _NUMBER + r"(?:\s*(?:/|out of)\s*" + _NUMBER + r")?\s*%?)",
    _FLAGS,
)
# Not after or before another digit, dot or slash: "3/10/2024" is a date, not 3/10.
_SCALE_FRACTION = re.compile(
    r"(?<![\w./])(\d+(?:\.\d+)?)\s*(?:/|out of)\s*(1|5|10|100)(?![\w/]|\.\d)", _FLAGS)
_PERCENT = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*%")

_POSITIVE = {"correct", "right", "yes", "true", "accurate"}
_NEGATIVE = {"incorrect", "wrong", "no", "false", "inaccurate"}
_VERDICT_WORD = r"(correct|incorrect|right|wrong|yes|no|true|false|accurate|inaccurate)"
# A reply that opens with a verdict: "Yes", "No", "Correct." or "**Incorrect**, because".
# Other than yes/no, the word must end its phrase: "Correct answer: Paris" is no verdict.
_LEADING_VERDICT = re.compile(
    r"^[\W_]*(?:(yes|no)\b|" + _VERDICT_WORD + r"(?=[ \t*_\"'`]*(?:[.,!;:)\]\n]|$)))", _FLAGS)
_LABELLED_VERDICT = re.compile(
    r"\b(?:verdict|judgement|judgment|decision|evaluation|assessment|conclusion)\b\*{0,2}\s*[:=-]\s*[\W_]*"
    + _VERDICT_WORD + r"\b",
    _FLAGS,
)
# "correct", "incorrect" and "wrong" anywhere in the text, with an optional negation
# before them ("is not correct", "isn't entirely correct"). "yes", "no" and "right" are too
# common in explanations ("no doubt", "right angle") to count there, and so is "correct"
# naming the reference ("the correct answer is Paris"). A conditional ("is correct if it
# means the same") is the instructions echoed back, not a verdict.
_FREE_VERDICT = re.compile(
    r"(?:\b(not|never|isn't|wasn't|aren't)\s+(?:(?:entirely|fully|completely|quite|exactly|totally)\s+)?)?"
    r"\b(correct(?!\s+(?:answer|response|solution|result|value|option|choice|one)s?\b)|incorrect|wrong)\b"
    r"(?![ \t]+(?:if|when|unless|only if|as long as)\b)",
    _FLAGS,
)


class JudgeOutputError(RLFactoryError, ValueError):
    """The judge's reply holds no readable score. ``reply`` is the whole reply."""

    def __init__(self, message: str, reply: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.reply = reply


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """The start of ``text`` on one line, for an error message."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def strip_reasoning(text: str) -> str | None:
    """``text`` without its ``<think>`` reasoning: what follows the last ``</think>``
    (also when the opening tag was in the prompt, as QwQ's chat template writes it).
    ``None`` when a ``<think>`` is never closed and nothing precedes it (cut off while
    reasoning)."""
    lowered = text.lower()
    end = lowered.rfind("</think>")
    if end != -1:
        return text[end + len("</think>"):]
    start = lowered.find("<think>")
    if start != -1:
        before = text[:start]
        return before if before.strip() else None
    return text


def _read_number(text: str) -> float | None:
    """A score written as a number, a fraction or a percentage, and nothing else."""
    if m := _NUMBER_ONLY.fullmatch(text):
        return float(m.group(1))
    if m := _FRACTION_ONLY.fullmatch(text):
        denominator = float(m.group(2))
        return float(m.group(1)) / denominator if denominator > 0 else None
    if m := _PERCENT_ONLY.fullmatch(text):
        return float(m.group(1)) / 100
    return None


def _word_value(word: str) -> float:
    return 1.0 if word.lower() in _POSITIVE else 0.0


def _read_tag_content(text: str) -> float | None:
    """A ``<score>`` tag's content: a number, a fraction, a percentage or one verdict word."""
    content = text.strip().rstrip(".").strip()
    value = _read_number(content)
    if value is not None:
        return value
    if re.fullmatch(_VERDICT_WORD, content, _FLAGS):
        return _word_value(content)
    return None


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))


def _verdict_from_words(text: str, reply: str) -> float | None:
    if m := _LEADING_VERDICT.match(text):
        return _word_value(m.group(1) or m.group(2))
    labelled = list(_LABELLED_VERDICT.finditer(text))
    if labelled:
        return _word_value(labelled[-1].group(1))
    values = set()
    for m in _FREE_VERDICT.finditer(text):
        value = _word_value(m.group(2))
        values.add(1.0 - value if m.group(1) else value)
    if len(values) > 1:
        raise JudgeOutputError(
            f"the judge's reply is ambiguous (it calls the answer both correct and incorrect): {snippet(reply)!r}",
            reply=reply,
            hint="ask for the verdict in <score>...</score> tags (prompt_template)",
        )
    return values.pop() if values else None


def parse_verdict(reply: str) -> float:
    """The score in [0, 1] that ``reply`` gives (the rules are in the module docstring).

    Raises :class:`JudgeOutputError`, quoting the start of the reply, when the reply is
    empty, was cut off while reasoning, holds no score, or contradicts itself.
    """
    if not reply or not reply.strip():
        raise JudgeOutputError("the judge's reply is empty", reply=reply or "",
                               hint="check that the judge model follows prompt_template, and max_tokens")
    text = strip_reasoning(reply)
    if text is None:
        raise JudgeOutputError(
            f"the judge's reasoning (<think>) was never closed, so it gave no verdict: {snippet(reply)!r}",
            reply=reply,
            hint="raise max_tokens so the judge can finish thinking",
        )

    for m in reversed(list(_SCORE_TAG.finditer(text))):
        value = _read_tag_content(m.group(1))
        if value is not None:
            return _clamp(value)
    if m := _UNCLOSED_SCORE_AT_END.search(text):
        return _clamp(float(m.group(1)))

    untagged = _ANY_SCORE_TAG.sub(" ", text)
    for m in reversed(list(_LABELLED_SCORE.finditer(untagged))):
        value = _read_number(m.group(1))
        if value is not None:
            return _clamp(value)
    for m in reversed(list(_SCALE_FRACTION.finditer(untagged))):
        numerator, denominator = float(m.group(1)), float(m.group(2))
        if numerator <= denominator:
            return numerator / denominator
    for m in reversed(list(_PERCENT.finditer(untagged))):
        value = float(m.group(1))
        if value <= 100:
            return value / 100
    bare = untagged.strip().rstrip(".").strip()
    if (m := _NUMBER_ONLY.fullmatch(bare)) and 0 <= float(m.group(1)) <= 1:
        # Only on the score's own scale: a bare "2024" is an answer repeated, not a score.
        return float(m.group(1))

    value = _verdict_from_words(untagged, reply)
    if value is not None:
        return value
    raise JudgeOutputError(
        f"no score found in the judge's reply: {snippet(reply)!r}",
        reply=reply,
        hint="the reply should end with <score>X</score>, X in [0, 1]; check prompt_template and max_tokens",
    )
