"""Property-based tests: ``parse`` never raises, its result is always well formed, and
calls written with ``format_tool_call`` always read back exactly."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfactory_core import ParsedTurn, ParseError, ToolCall
from rlfactory_plugin_qwen3 import Qwen3Parser, format_tool_call

parser = Qwen3Parser()

# deadline=None: the first examples pay for imports and regex compilation.
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
arguments = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
names = st.text(min_size=1, max_size=30).filter(lambda name: name.strip() != "")
tool_calls = st.builds(ToolCall, name=names, arguments=arguments)


def check_well_formed(turn: ParsedTurn, text: str) -> None:
    """What every caller of ``parse`` relies on, whatever the text."""
    assert isinstance(turn, ParsedTurn)
    assert turn.text == text
    assert isinstance(turn.content, str)
    assert turn.content == turn.content.strip()
    assert turn.reasoning is None or isinstance(turn.reasoning, str)
    assert [call.id for call in turn.tool_calls] == [f"call_{i}" for i in range(len(turn.tool_calls))]
    for call in turn.tool_calls:
        assert isinstance(call, ToolCall)
        assert isinstance(call.name, str) and call.name.strip()
        assert isinstance(call.arguments, dict)
        # Every accepted call is valid JSON again and reads back unchanged.
        again = parser.parse(format_tool_call(call))
        assert again.tool_calls == [ToolCall(name=call.name, arguments=call.arguments, id="call_0")]
        assert again.errors == []
    for error in turn.errors:
        assert isinstance(error, ParseError)
        assert isinstance(error.message, str) and error.message
        assert isinstance(error.snippet, str) and len(error.snippet) <= 200


@SETTINGS
@given(st.text())
def test_parse_never_raises_on_any_text(text):
    check_well_formed(parser.parse(text), text)


@SETTINGS
@given(st.text(alphabet=st.characters(blacklist_characters="<")))
def test_text_without_tags_is_all_content(text):
    assert parser.parse(text) == ParsedTurn(text=text, content=text.strip())


fragments = st.one_of(
    st.sampled_from(TAGS + ["{", "}", "[", "]", '"name"', '"arguments"', '"search"', ":", ",", '"', "\\",
                            "\n", " ", "null", "{}", "<", ">", "/", "tool_call", "think"]),
    st.text(max_size=6),
    json_values.map(json.dumps),
    tool_calls.map(format_tool_call),
    st.dictionaries(st.sampled_from(["name", "arguments", "other"]), json_values, max_size=3).map(json.dumps),
)


@SETTINGS
@given(st.lists(fragments, max_size=25).map("".join))
def test_parse_never_raises_on_tag_and_json_fragments(text):
    check_well_formed(parser.parse(text), text)


EDIT_CHARS = st.sampled_from(list('<>/{}[]":,\\ \ntk_') + ["\x00", "é", "😀"]) | st.characters()


@st.composite
def mutated_calls(draw):
    """A rendered valid call (maybe with reasoning and content) after random edits."""
    text = format_tool_call(draw(tool_calls))
    if draw(st.booleans()):
        text = "<think>\nI should call a tool.\n</think>\n\n" + text
    if draw(st.booleans()):
        text += "\nDone."
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        at = draw(st.integers(min_value=0, max_value=len(text)))
        operation = draw(st.sampled_from(["insert", "delete", "replace"]))
        if operation == "insert":
            text = text[:at] + draw(EDIT_CHARS) + text[at:]
        elif operation == "delete":
            text = text[:at] + text[at + 1:]
        else:
            text = text[:at] + draw(EDIT_CHARS) + text[at + 1:]
    return text


@SETTINGS
@given(mutated_calls())
def test_parse_never_raises_on_mutated_calls(text):
    check_well_formed(parser.parse(text), text)


# Text between two calls; a think tag would (rightly) turn a call into reasoning, and an
# opening <tool_call> could start a third call.
between = st.one_of(st.text(), st.lists(fragments, max_size=10).map("".join)).filter(
    lambda text: not any(tag in text for tag in ("<think>", "</think>", "<tool_call>"))
)


@SETTINGS
@given(tool_calls, between, tool_calls)
def test_round_trip_of_two_calls_around_any_text(first, text, second):
    turn = parser.parse(format_tool_call(first) + text + format_tool_call(second))
    assert turn.tool_calls == [
        ToolCall(name=first.name, arguments=first.arguments, id="call_0"),
        ToolCall(name=second.name, arguments=second.arguments, id="call_1"),
    ]
    if "</tool_call>" not in text:
        assert turn.errors == []
        assert turn.content == text.strip()


@SETTINGS
@given(st.lists(tool_calls, min_size=1, max_size=5), st.text(alphabet=st.characters(blacklist_characters="<")))
def test_round_trip_after_reasoning(calls, reasoning):
    text = f"<think>\n{reasoning}\n</think>\n\n" + "\n".join(format_tool_call(c) for c in calls)
    turn = parser.parse(text)
    assert turn.reasoning == reasoning.strip()
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [(c.name, c.arguments) for c in calls]
    assert turn.errors == []
    assert turn.content == ""


@SETTINGS
@given(tool_calls)
def test_calls_written_as_encoded_strings_read_back(call):
    body = json.dumps({"name": call.name, "arguments": json.dumps(call.arguments)})
    turn = parser.parse(f"<tool_call>\n{body}\n</tool_call>")
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [(call.name, call.arguments)]

