"""Reading scores out of judge replies: every rule, and replies that must not be read."""

from __future__ import annotations


import pytest

from rlfactory_core import RLFactoryError
from rlfactory_qwq_judge import JudgeOutputError, parse_verdict
from rlfactory_qwq_judge.verdict import strip_reasoning


@pytest.mark.parametrize("reply, expected", [
    # <score> tags: the requested format
    ("<score>0.8</score>", 0.8),
    ("<score>1</score>", 1.0),
    ("<score>0</score>", 0.0),
    ("<score>.5</score>", 0.5),
    ("<SCORE> 0.25 </Score>", 0.25),
    ("The answer matches.\n\n<score>\n1.0\n</score>\n", 1.0),
    ("<score>0.2</score> on reflection <score>0.9</score>", 0.9),  # the last one wins
    ("<score>8/10</score>", 0.8),
    ("<score>75%</score>", 0.75),
    ("<score>1.</score>", 1.0),
    ("<score>correct</score>", 1.0),
    ("<score>Incorrect</score>", 0.0),
    ("put it in <score>...</score>; here: <score>0.4</score>", 0.4),
    ("<score>0.4</score> and an echoed <score>X</score>", 0.4),  # unreadable tags are skipped
    ("The answer is right. <score>0.9", 0.9),  # cut off before </score>
    # clamped to [0, 1]
    ("<score>7</score>", 1.0),
    ("<score>-1</score>", 0.0),
    ("<score>+0.3</score>", 0.3),
    ("Score: 150%", 1.0),
    # reasoning is dropped; QwQ's template opens <think> in the prompt
    ("<think>Maybe <score>1</score>? No, London is wrong.</think>\n\n<score>0</score>", 0.0),
    ("The student says Paris, the reference says Paris.\n</think>\n\n<score>1</score>", 1.0),
    ("<think>a</think><think>b <score>0</score></think><score>0.6</score>", 0.6),
    ("<THINK>draft</THINK> Score: 3/10", 0.3),
    # labelled scores
    ("Score: 8/10", 0.8),
    ("score of 0.7", 0.7),
    ("Final score = 0.35", 0.35),
    ("Rating = 4 out of 5", 0.8),
    ("**Score:** 0.9", 0.9),
    ("Grade: 90%", 0.9),
    ("The score is 1", 1.0),
    ("score: 7/10 at first, but on reflection score: 2/10", 0.2),
    # bare fractions on a usual scale, percentages, lone numbers
    ("I would give it 7/10.", 0.7),
    ("3 out of 5", 0.6),
    ("45/100", 0.45),
    ("1/1", 1.0),
    ("About 85% right.", 0.85),
    ("0.7", 0.7),
    ("  1.  ", 1.0),
    ("0", 0.0),
    # verdict words
    ("Yes", 1.0),
    ("yes, the answer is the same city", 1.0),
    ("No.", 0.0),
    ("NO", 0.0),
    ("True", 1.0),
    ("false.", 0.0),
    ("Correct.", 1.0),
    ("**Incorrect**: the capital is Paris.", 0.0),
    ("Wrong", 0.0),
    ("Verdict: correct", 1.0),
    ("After checking, my judgement - WRONG", 0.0),
    ("The answer is correct.", 1.0),
    ("The answer is not correct.", 0.0),
    ("The student's answer isn't entirely correct.", 0.0),
    ("That is the wrong city.", 0.0),
    ("The correct answer is Paris, and the student wrote Paris, so it is correct.", 1.0),
    ("The correct answer is Paris but the student wrote London, so it is incorrect.", 0.0),
])
def test_reply_is_read(reply, expected):
    assert parse_verdict(reply) == pytest.approx(expected)


@pytest.mark.parametrize("reply, message", [
    ("", "empty"),
    ("   \n\t ", "empty"),
    ("I am not sure what to say.", "no score found"),
    ("<score></score>", "no score found"),
    ("<score>high</score>", "no score found"),
    ("<score>nan</score>", "no score found"),
    ("<score>inf</score>", "no score found"),
    ("<score>1e9</score>", "no score found"),
    ("score: N/A", "no score found"),
    ("The year is 2024.", "no score found"),  # a bare number outside [0, 1] is not a score
    ("2024", "no score found"),
    ("Meet on 3/10/2024", "no score found"),  # a date, not 3/10
    ("It needs 3/4 cup of flour", "no score found"),  # not a usual scale
    ("Correct answer: Paris", "no score found"),  # "correct" names the reference here
    ("It is correct in part but also incorrect", "ambiguous"),
    ("<think>The answer looks right, <score>1</score>", "never closed"),  # cut off thinking
    ("<think>", "never closed"),
    ("<think>all reasoning</think>", "no score found"),
    ("<think>all reasoning</think>   ", "no score found"),
    ("</think>", "no score found"),
    ("<score>0.9</score></think>", "no score found"),  # the tag was in the reasoning
    ("\x00\x01\x02 <scor e>1</score>", "no score found"),
])
def test_unreadable_reply_raises_a_clear_error(reply, message):
    with pytest.raises(JudgeOutputError, match=message) as info:
        parse_verdict(reply)
    error = info.value
    assert isinstance(error, RLFactoryError) and isinstance(error, ValueError)
    assert "\n" not in str(error)  # one line, whatever the reply held
    assert error.reply == reply
    assert error.hint


def test_error_quotes_only_the_start_of_a_long_reply():
    reply = "Let me think about this question carefully. " * 50
    with pytest.raises(JudgeOutputError) as info:
        parse_verdict(reply)
    message = info.value.message
    assert "Let me think about this question carefully." in message
    assert len(message) < 160
    assert message.count("carefully") <= 2
    assert info.value.reply == reply


@pytest.mark.parametrize("reply", [
    "<score>" * 100_000,
    "<score>" + "9" * 100_000,
    "<think>" + "x" * 200_000,
    "score " * 50_000,
    "1/" * 100_000,
    "not " * 100_000 + "correct",
    ("<score>" + " " * 63 + "</scor") * 10_000,
])
def test_hostile_replies_end_in_a_score_or_a_clear_error(reply):
    # Huge, repetitive replies: a pattern with catastrophic backtracking would hang here.
    try:
        value = parse_verdict(reply)
    except JudgeOutputError:
        pass
    else:
        assert 0.0 <= value <= 1.0


def test_strip_reasoning():
    assert strip_reasoning("<think>x</think>answer") == "answer"
    assert strip_reasoning("x</think>answer") == "answer"
    assert strip_reasoning("answer<think>x") == "answer"
    assert strip_reasoning("<think>x") is None
    assert strip_reasoning("plain") == "plain"
