"""Unit tests of ``Qwen3Parser.parse``: one case of the format per test."""

from __future__ import annotations

import json

import pytest

from rlfactory_core import ParsedTurn, ToolCall
from rlfactory_core.testing import measure_parse
from rlfactory_plugin_qwen3 import Qwen3Parser, format_tool_call
from rlfactory_plugin_qwen3.parser import MAX_JSON_DEPTH

parser = Qwen3Parser()

HINT = 'write {"name": ..., "arguments": {...}}'


def call_text(name: str, arguments) -> str:
    """A call written the way Qwen3 writes it, independently of ``format_tool_call``."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


# --- well-formed turns ------------------------------------------------------------------


def test_plain_text_is_content():
    turn = parser.parse("  The answer is 42.\n")
    assert turn == ParsedTurn(text="  The answer is 42.\n", content="The answer is 42.")


def test_empty_text():
    assert parser.parse("") == ParsedTurn(text="", content="", reasoning=None, tool_calls=[], errors=[])


def test_whitespace_only_text():
    turn = parser.parse(" \n\t ")
    assert (turn.content, turn.tool_calls, turn.errors) == ("", [], [])


def test_single_call():
    text = "I'll look it up.\n" + call_text("search", {"query": "capital of France"})
    turn = parser.parse(text)
    assert turn.text == text
    assert turn.content == "I'll look it up."
    assert turn.reasoning is None
    assert turn.tool_calls == [ToolCall(name="search", arguments={"query": "capital of France"}, id="call_0")]
    assert turn.errors == []


def test_multiple_calls_keep_order_and_get_sequential_ids():
    text = (
        "First.\n" + call_text("a", {"x": 1}) + "\nthen\n" + call_text("b", {}) + "\n" + call_text("c", {"y": [1, 2]})
        + "\nDone."
    )
    turn = parser.parse(text)
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_0", "a", {"x": 1}),
        ("call_1", "b", {}),
        ("call_2", "c", {"y": [1, 2]}),
    ]
    assert turn.errors == []
    assert turn.content == "First.\n\nthen\n\n\nDone."


def test_compact_call_without_newlines():
    turn = parser.parse('<tool_call>{"name":"f","arguments":{"a":true}}</tool_call>')
    assert turn.tool_calls == [ToolCall(name="f", arguments={"a": True}, id="call_0")]
    assert turn.content == ""


def test_arguments_key_order_does_not_matter():
    turn = parser.parse('<tool_call>\n{"arguments": {"q": "x"}, "name": "search"}\n</tool_call>')
    assert turn.tool_calls == [ToolCall(name="search", arguments={"q": "x"}, id="call_0")]


def test_missing_arguments_mean_no_arguments():
    turn = parser.parse('<tool_call>\n{"name": "now"}\n</tool_call>')
    assert turn.tool_calls == [ToolCall(name="now", arguments={}, id="call_0")]
    assert turn.errors == []


def test_arguments_as_json_string_are_decoded():
    # Qwen models sometimes write the arguments OpenAI-style, as an encoded string.
    body = json.dumps({"name": "search", "arguments": json.dumps({"query": "q", "k": 3})})
    turn = parser.parse(f"<tool_call>\n{body}\n</tool_call>")
    assert turn.tool_calls == [ToolCall(name="search", arguments={"query": "q", "k": 3}, id="call_0")]
    assert turn.errors == []


def test_extra_keys_are_ignored():
    turn = parser.parse('<tool_call>\n{"name": "f", "arguments": {}, "id": "x1"}\n</tool_call>')
    assert turn.tool_calls == [ToolCall(name="f", arguments={}, id="call_0")]


def test_tags_inside_argument_strings_do_not_end_the_call():
    arguments = {"text": "a </tool_call> b <tool_call> c <think> d </think>", "n": 1}
    text = "Sure.\n" + call_text("echo", arguments) + "\nAfter."
    turn = parser.parse(text)
    assert turn.tool_calls == [ToolCall(name="echo", arguments=arguments, id="call_0")]
    assert turn.errors == []
    assert turn.content == "Sure.\n\nAfter."
    assert turn.reasoning is None


def test_unicode_names_arguments_and_content():
    arguments = {"город": "Москва", "emoji": "🌧️", "中文": ["北京", "上海"]}
    text = "Voilà — je cherche.\n" + call_text("météo", arguments)
    turn = parser.parse(text)
    assert turn.tool_calls == [ToolCall(name="météo", arguments=arguments, id="call_0")]
    assert turn.content == "Voilà — je cherche."


def test_escaped_unicode_in_json_is_decoded():
    turn = parser.parse('<tool_call>\n{"name": "f", "arguments": {"s": "\\u00e9\\ud83d\\ude00"}}\n</tool_call>')
    assert turn.tool_calls[0].arguments == {"s": "é😀"}


def test_format_tool_call_round_trip():
    call = ToolCall(name="lookup", arguments={"ids": [1, 2.5, None, True], "nested": {"k": "v"}})
    turn = parser.parse(format_tool_call(call))
    assert turn.tool_calls == [ToolCall(name="lookup", arguments=call.arguments, id="call_0")]


def test_text_is_kept_raw():
    text = "<think>\nx\n</think>\n\n" + call_text("f", {}) + "\n<|im_end|>"
    assert parser.parse(text).text == text


# --- reasoning -----------------------------------------------------------------------------


def test_think_block_is_reasoning():
    turn = parser.parse("<think>\nThe user asks for 2+2.\n</think>\n\nIt is 4.")
    assert turn.reasoning == "The user asks for 2+2."
    assert turn.content == "It is 4."
    assert turn.errors == []


def test_empty_think_block_gives_empty_reasoning():
    # What Qwen3 writes with enable_thinking=False.
    turn = parser.parse("<think>\n\n</think>\n\nHello!")
    assert turn.reasoning == ""
    assert turn.content == "Hello!"


def test_no_think_block_gives_no_reasoning():
    assert parser.parse("Hello").reasoning is None


def test_close_tag_without_open_tag_when_the_prompt_opened_the_block():
    text = "Let me think about the weather.\n</think>\n\n" + call_text("weather", {"city": "Oslo"})
    turn = parser.parse(text)
    assert turn.reasoning == "Let me think about the weather."
    assert turn.content == ""
    assert turn.tool_calls == [ToolCall(name="weather", arguments={"city": "Oslo"}, id="call_0")]
    assert turn.errors == []


def test_tool_calls_inside_reasoning_are_ignored():
    draft = call_text("draft", {"x": 1})
    turn = parser.parse(f"<think>\nmaybe {draft}\n</think>\n\n" + call_text("real", {}))
    assert [c.name for c in turn.tool_calls] == ["real"]
    assert turn.tool_calls[0].id == "call_0"
    assert "draft" in turn.reasoning
    assert turn.errors == []


def test_malformed_calls_inside_reasoning_are_not_errors():
    turn = parser.parse("<think>\n<tool_call>{oops</tool_call> and </tool_call>\n</think>\n\nOK")
    assert turn.errors == []
    assert turn.content == "OK"


def test_tool_calls_before_an_unopened_close_tag_are_reasoning():
    # With the block opened by the prompt, a call drafted while thinking stays reasoning,
    # and its calls, errors and numbering are dropped.
    text = call_text("draft", {}) + "\n<tool_call>{bad</tool_call>\n</think>\n\n" + "<tool_call>[1]</tool_call>"
    turn = parser.parse(text)
    assert turn.tool_calls == []
    assert [e.message.split(" must")[0] for e in turn.errors] == ["tool call 1"]
    assert "draft" in turn.reasoning


def test_unclosed_think_is_reasoning_and_an_error():
    text = "<think>\nStill thinking " + call_text("f", {}) + " and more"
    turn = parser.parse(text)
    assert turn.reasoning.startswith("Still thinking")
    assert turn.reasoning.endswith("and more")
    assert turn.tool_calls == []
    assert turn.content == ""
    assert len(turn.errors) == 1
    assert "<think> block is not closed" in turn.errors[0].message
    assert "</think>" in turn.errors[0].message
    assert turn.errors[0].snippet.startswith("<think>")


def test_content_before_an_unclosed_think_is_kept():
    turn = parser.parse("Answer: 3\n<think>wait")
    assert turn.content == "Answer: 3"
    assert turn.reasoning == "wait"
    assert len(turn.errors) == 1


def test_second_close_think_tag_is_an_error():
    turn = parser.parse("<think>a</think>b</think>c")
    assert turn.reasoning == "a"
    assert turn.content == "bc"
    assert len(turn.errors) == 1
    assert "</think> without a matching <think>" in turn.errors[0].message


def test_several_think_blocks_are_joined():
    turn = parser.parse("<think>one</think>mid<think> two </think>end")
    assert turn.reasoning == "one\n\ntwo"
    assert turn.content == "midend"


# --- malformed calls -----------------------------------------------------------------------


def test_invalid_json_is_an_error_with_position_and_hint():
    bad = '<tool_call>\n{"name": "search" "arguments": {}}\n</tool_call>'
    turn = parser.parse("Before " + call_text("ok", {}) + "\n" + bad + " after")
    assert [c.name for c in turn.tool_calls] == ["ok"]
    assert len(turn.errors) == 1
    error = turn.errors[0]
    assert error.message == (
        "tool call 2 is not valid JSON: Expecting ',' delimiter at char 18; " + HINT
    )
    assert error.snippet == bad
    assert turn.content == "Before \n after"  # the malformed block is removed too


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("{'name': 'f'}", "is not valid JSON: Expecting property name enclosed in double quotes at char 1"),
        ('{"name": "f", "arguments": {}} extra', "is not valid JSON: Extra data at char 31"),
        ('{"name": "f", "arguments": {"x": NaN}}', "is not valid JSON: NaN is not allowed in JSON"),
        ('{"name": "f", "arguments": {"x": 1e400}}', "is not valid JSON: the number 1e400 is too large"),
        ('{"name": "f", "arguments": {"s": "two\nlines"}}', "is not valid JSON: Invalid control character"),
        ("```json\n{\"name\": \"f\"}\n```", "is not valid JSON: Expecting value at char 0"),
        ("", "is empty"),
        ("   \n ", "is empty"),
        ("[1, 2]", "must be a JSON object, got an array"),
        ('"search"', "must be a JSON object, got a string"),
        ("3", "must be a JSON object, got a number"),
        ("null", "must be a JSON object, got null"),
        ('{"arguments": {}}', 'has no "name"'),
        ('{"name": 3, "arguments": {}}', 'the "name" of tool call 1 must be a string, got a number'),
        ('{"name": null, "arguments": {}}', 'has no "name"'),
        ('{"name": "", "arguments": {}}', 'the "name" of tool call 1 is empty'),
        ('{"name": "  ", "arguments": {}}', 'the "name" of tool call 1 is empty'),
    ],
)
def test_malformed_body_is_an_error(body, expected):
    text = f"<tool_call>\n{body}\n</tool_call>"
    turn = parser.parse(text)
    assert turn.tool_calls == []
    assert len(turn.errors) == 1, turn.errors
    assert expected in turn.errors[0].message
    assert turn.errors[0].snippet == text
    assert turn.content == ""


@pytest.mark.parametrize(
    ("arguments", "got"),
    [("[1, 2]", "an array"), ("42", "a number"), ("null", "null"), ("true", "a boolean"),
     ('"[1, 2]"', "an array"), ('"7"', "a number")],
)
def test_non_object_arguments_make_an_invalid_call(arguments, got):
    # the tool is named: the call stays, marked invalid (the tool manager answers invalid_arguments)
    turn = parser.parse(f'<tool_call>\n{{"name": "f", "arguments": {arguments}}}\n</tool_call>')
    assert not turn.errors and [(c.name, c.arguments) for c in turn.tool_calls] == [("f", {})]
    assert turn.tool_calls[0].invalid == f'the "arguments" of tool call 1 (f) must be a JSON object, got {got}; {HINT}'


def test_string_arguments_that_are_not_json_make_an_invalid_call():
    turn = parser.parse('<tool_call>\n{"name": "f", "arguments": "city=Paris"}\n</tool_call>')
    assert not turn.errors and [(c.name, c.arguments) for c in turn.tool_calls] == [("f", {})]
    message = turn.tool_calls[0].invalid
    assert message.startswith('the "arguments" of tool call 1 (f) are a string that is not valid JSON')
    assert "write the arguments as a JSON object" in message


def test_unclosed_call_at_the_end_is_an_error():
    # Typically a turn cut off by the token limit.
    text = 'Looking.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}'
    turn = parser.parse(text)
    assert turn.tool_calls == []
    assert len(turn.errors) == 1
    assert turn.errors[0].message == "tool call 1 is not closed: end it with </tool_call>"
    assert turn.errors[0].snippet == text[len("Looking.\n"):]
    assert turn.content == "Looking."


def test_unclosed_call_followed_by_another_call():
    text = '<tool_call>\n{"name": "a", "arguments": {\n' + call_text("b", {"k": 1})
    turn = parser.parse(text)
    assert turn.tool_calls == [ToolCall(name="b", arguments={"k": 1}, id="call_0")]
    assert [e.message for e in turn.errors] == ["tool call 1 is not closed: end it with </tool_call>"]


def test_call_interrupted_by_a_think_block():
    turn = parser.parse('<tool_call>\n{"name": "a"\n<think>hm</think>rest')
    assert turn.tool_calls == []
    assert turn.reasoning == "hm"
    assert turn.content == "rest"
    assert [e.message for e in turn.errors] == ["tool call 1 is not closed: end it with </tool_call>"]


def test_stray_close_tag_is_an_error_and_text_is_kept():
    text = 'Calling {"name": "f", "arguments": {}}\n</tool_call> done'
    turn = parser.parse(text)
    assert turn.tool_calls == []
    assert len(turn.errors) == 1
    assert turn.errors[0].message.startswith("found </tool_call> without a matching <tool_call>")
    assert turn.errors[0].snippet.endswith("</tool_call>")
    assert turn.content == 'Calling {"name": "f", "arguments": {}}\n done'


def test_valid_calls_survive_malformed_neighbours_and_numbering_counts_attempts():
    text = (
        call_text("one", {}) + "<tool_call>oops</tool_call>" + call_text("three", {"n": 3})
        + "<tool_call>[]</tool_call>"
    )
    turn = parser.parse(text)
    assert [(c.id, c.name) for c in turn.tool_calls] == [("call_0", "one"), ("call_1", "three")]
    assert [e.message.split(" is ")[0].split(" must ")[0] for e in turn.errors] == ["tool call 2", "tool call 4"]


def test_long_snippets_are_shortened():
    text = "<tool_call>\n{" + "x" * 1000 + "\n</tool_call>"
    error = parser.parse(text).errors[0]
    assert len(error.snippet) <= 200
    assert error.snippet.startswith("<tool_call>")


def test_deeply_nested_json_does_not_raise():
    turn = parser.parse("<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>")
    assert turn.tool_calls == []
    assert [e.message for e in turn.errors] == [
        f"tool call 1 is not valid JSON: it is nested more than {MAX_JSON_DEPTH} levels deep; {HINT}"]


@pytest.mark.parametrize("as_string", [False, True])
def test_json_nested_deeper_than_the_limit_is_refused_before_decoding(as_string):
    """Depths json itself accepts (600 < the recursion limit) would reach tools and break
    the recursive code after the parser; the limit holds for string-encoded arguments too."""
    def call(depth):
        arguments = json.dumps({"a": json.loads("[" * (depth - 1) + "]" * (depth - 1))})
        if as_string:
            return call_text("f", arguments)
        return f'<tool_call>{{"name": "f", "arguments": {arguments}}}</tool_call>'

    deepest = MAX_JSON_DEPTH if as_string else MAX_JSON_DEPTH - 1  # the call object is a level too
    assert len(parser.parse(call(deepest)).tool_calls) == 1
    for depth in (deepest + 1, 600):
        turn = parser.parse(call(depth))
        if as_string:  # the call object decodes, so the tool is known: an invalid call (invalid_arguments)
            assert not turn.errors and [c.arguments for c in turn.tool_calls] == [{}]
            assert f"nested more than {MAX_JSON_DEPTH} levels deep" in turn.tool_calls[0].invalid
        else:  # the call object itself is too deep: no tool can be read
            assert turn.tool_calls == []
            assert [f"nested more than {MAX_JSON_DEPTH} levels deep" in e.message for e in turn.errors] == [True]


@pytest.mark.parametrize("unit", [
    "<tool_call>{",  # the repro of issue 19: 3.8 s at 50,000 blocks when each decode ran to the end
    '<tool_call>{"a" 1, }\n',  # objects that close and fail to decode, one exception each
    '<tool_call>{"a" 1, }</tool_call>',
    '<tool_call>{"name": "f", "arguments": {"s": "</tool_call><tool_call>{',
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
])
def test_the_decoder_gets_only_each_blocks_own_text(unit):
    """The cost that made parsing quadratic was inside failing decodes: each counted lines
    from the start of all the text it was handed. Counting the characters handed to the
    decoder sees it; counting decode calls would not."""
    for blocks in (500, 4000):
        text = unit * blocks
        turn, cost = measure_parse(parser, text)
        assert cost.decoded_chars <= len(text)
        assert len(turn.errors) + len(turn.tool_calls) == text.count("<tool_call>")


def test_a_block_that_is_not_json_still_stops_at_its_own_close_tag():
    text = '<tool_call>{"name": "f" x}</tool_call> middle <tool_call>{"name": "g", "arguments": {}}</tool_call>'
    turn = parser.parse(text)
    assert [c.name for c in turn.tool_calls] == ["g"]
    assert [e.message.split(":")[0] for e in turn.errors] == ["tool call 1 is not valid JSON"]
    assert turn.content == "middle"


def test_unterminated_string_message_reads_well():
    [error] = parser.parse('<tool_call>{"name": "f</tool_call>').errors
    assert error.message.startswith("tool call 1 is not valid JSON: Unterminated string starting at char 9;")



def test_huge_integer_does_not_raise():
    turn = parser.parse('<tool_call>{"name": "f", "arguments": {"n": ' + "9" * 5000 + "}}</tool_call>")
    assert turn.tool_calls == []
    assert len(turn.errors) == 1


@pytest.mark.parametrize("value", [None, 42, b"<tool_call>"])
def test_non_text_input_does_not_raise(value):
    turn = parser.parse(value)  # type: ignore[arg-type]
    assert isinstance(turn, ParsedTurn)
    assert turn.tool_calls == []
    assert len(turn.errors) == 1
