"""Answer extraction from model text: the same results as the regular expressions it
replaces, without their quadratic time on unclosed tags."""

from __future__ import annotations

import random
import re

import pytest

from rlfactory_core.text import last_tag_content, tag_contents, without_reasoning

_PIECES = ["<answer>", "</answer>", "<think>", "</think>", "a", " b ", "\n", "<answer", "answer>", "<"]


def _texts(count: int):
    rng = random.Random(0)
    for _ in range(count):
        yield "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 12)))


def test_tag_contents_is_what_findall_gives():
    for text in _texts(3000):
        assert tag_contents(text) == re.findall(r"<answer>(.*?)</answer>", text, re.S), text


def test_without_reasoning_is_what_the_regex_gives_up_to_a_final_newline():
    for text in _texts(3000):
        expected = re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.S)
        assert without_reasoning(text) in (expected, expected.removesuffix("\n")), text


@pytest.mark.parametrize(("text", "answer"), [
    ("<answer> Lima </answer>", "Lima"),
    ("<answer>a</answer> then <answer> b </answer>", "b"),
    ("<think><answer>draft</answer></think><answer>final</answer>", "final"),
    ("<think>unclosed <answer>draft</answer>", ""),
    ("<answer>unclosed", ""),
    ("no tags", ""),
])
def test_last_tag_content(text, answer):
    assert last_tag_content(text) == answer


@pytest.mark.parametrize("unit", ["<answer>", "<think>", "<answer></think>", "</answer><answer>x"])
def test_megabytes_of_tags_are_read(unit):
    # "<answer>" * 20000 took 40 s with the regex; these finish in milliseconds. The sizes
    # are the check: a quadratic reading of 1 MB would not finish within the test timeout.
    text = unit * (1_000_000 // len(unit))
    assert isinstance(last_tag_content(text), str)
    assert len(tag_contents(text)) <= text.count("</answer>")
