"""The ``pythonic`` parser: calls written as Python calls on their own lines, the tools shown
as signatures. Read, written back, rendered, refused, held to the conformance bar, and
found through the real plugin manager."""

from __future__ import annotations

import pytest

from rlfactory_android import AndroidEnv, PythonicParser
from rlfactory_android.parser import MAX_CALL_CHARS, MAX_CALL_DEPTH, format_signature
from rlfactory_core import Message, ToolCall, ToolResult, get_component
from rlfactory_core.testing import check_parser_conformance

parser = PythonicParser()


def calls(text):
    return [(c.name, c.arguments) for c in parser.parse(text).tool_calls]


def test_a_call_is_a_line_that_holds_only_a_call_and_the_rest_is_text():
    turn = parser.parse('I will open it.\nopen_app(app="Settings")\n  tap(element=4)  \nDone.')
    assert [(c.name, c.arguments, c.id) for c in turn.tool_calls] == [
        ("open_app", {"app": "Settings"}, "call_0"), ("tap", {"element": 4}, "call_1")]
    assert turn.content == "I will open it.\nDone." and not turn.errors and turn.reasoning is None
    assert calls("Done.") == [] and parser.parse("Done.").content == "Done."
    # a call inside a sentence is text; Llama's list of calls is calls
    assert calls("then tap(element=4) it") == [] and calls("a." * 1900 + "f(x=1)") == []
    assert calls('[tap(element=4), press_key(key="back")]') == [("tap", {"element": 4}), ("press_key", {"key": "back"})]
    # reasoning is not read for calls
    turn = parser.parse("<think>tap(element=1)</think>\ntap(element=2)")
    assert calls(turn.text) == [("tap", {"element": 2})] and turn.reasoning == "tap(element=1)"


def test_values_are_literals_kept_as_json():
    assert calls('f(a="x", b=-2, c=2.5, d=True, e=None, g=[1, "y"], h={"k": [False]}, i=(1, 2))') == [
        ("f", {"a": "x", "b": -2, "c": 2.5, "d": True, "e": None, "g": [1, "y"], "h": {"k": [False]}, "i": [1, 2]})]
    assert calls("type_text(text='it\\'s\\n2')") == [("type_text", {"text": "it's\n2"})]


@pytest.mark.parametrize("text, message", [
    ("tap(4)", "tap: name every argument, e.g. tap(element=3), not by position"),
    ("tap(element=x)", "the value must be a literal"),
    ("tap(element=1e999)", "inf is not a finite number"),
    ("tap(element=-1e999)", "inf is not a finite number"),
    ("f(a={1: 2})", "dict keys must be strings"),
    ("f(a={1, 2})", "the value must be a literal"),
    ("f(**{'a': 1})", "write each argument as name=value"),
    ("tap(element=1, element=2)", "tap: the argument element is given twice"),
    ("f(a=b'x')", "the value must be a literal"),
    ("f(a=g(1))", "the value must be a literal"),
    ("f(a=" + "1+" * 1500 + "1)", "the value must be a literal"),
])
def test_a_named_call_with_unusable_arguments_is_kept_invalid(text, message):
    """The tool is named: the call stays, marked invalid, and the tool manager answers
    invalid_arguments without running it (the rule of every format)."""
    turn = parser.parse(f"Let me.\n{text}")
    assert not turn.errors and turn.content == "Let me."
    [call] = turn.tool_calls
    assert call.arguments == {} and message in call.invalid, call


@pytest.mark.parametrize("text, message", [
    ("tap(element=", "the call is not well-formed; write name(argument=value)"),
    ("tap(element=3) + 1", "this is not a tool call"),
    ("[tap(element=3), a.b.c(x=1)]", "this is not a tool call"),  # a tool's name is a plain name
    ("f(a=" + "-" * 3000 + "1)", "the call is not well-formed"),  # the compiler's own nesting limit
    ("f(a=" + "[" * (MAX_CALL_DEPTH + 1) + "]" * (MAX_CALL_DEPTH + 1) + ")", "nests brackets more than"),
    ("f(a=\"" + "y" * MAX_CALL_CHARS + "\")", "longer than"),
])
def test_what_is_not_a_call_is_a_parse_error_that_says_the_format(text, message):
    turn = parser.parse(f"Let me.\n{text}")
    assert not turn.tool_calls and turn.content == "Let me."
    assert len(turn.errors) == 1 and message in turn.errors[0].message, turn.errors
    assert len(turn.errors[0].snippet) <= 120


@pytest.mark.parametrize("arguments", [
    {"app": "Settings"}, {"element": 3}, {}, {"text": 'He said "hi"\n\\ \u00e9 \u4e2d'}, {"x": -1.5, "ok": False, "n": None},
    {"nested": {"a": [1, {"b": "c"}], "": []}},
])
def test_what_format_tool_call_writes_parses_back_to_the_same_call(arguments):
    call = ToolCall(name="type_text", arguments=arguments)
    written = parser.format_tool_call(call)
    assert "\n" not in written
    assert calls(written) == [("type_text", arguments)]


def test_the_system_prompt_lists_one_signature_per_tool_required_arguments_first():
    env = AndroidEnv(few_shot=False)
    prompt = parser.render_system_prompt("Operate the phone.", env.tools)
    lines = prompt.split("\n")
    assert lines[0] == "Operate the phone." and lines[2].startswith("To call a tool, write the call on a line")
    assert lines[3] == ("tap(element: int = None, x: int = None, y: int = None): Tap an element of the screen "
                        "(by its number) or a point (x, y).")
    assert 'swipe(direction: "up" | "down" | "left" | "right", element: int = None): ' in prompt
    assert "type_text(text: str, element: int = None): " in prompt
    assert len(lines) == 3 + len(env.tools)
    assert parser.render_system_prompt("Plain.", []) == "Plain."
    # an OpenAI-style schema dict works as well as a tool object
    schema = {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
        "type": "object", "properties": {"k": {"type": ["integer", "null"]}, "query": {"type": "string"}},
        "required": ["query"]}}}
    assert format_signature(schema) == "search(query: str, k: int | None = None): Search."


def test_results_come_back_as_one_user_turn_each_after_its_tool():
    rendered = parser.render_tool_results([ToolResult(name="tap", content="Tapped element 3."),
                                           ToolResult(name="wait", content="Error: too long", error="invalid_arguments")])
    assert rendered == [Message(role="user", content="tap returned:\nTapped element 3.\n\nwait returned:\nError: too long")]
    assert parser.render_tool_results([]) == []


def test_it_meets_the_parser_conformance_bar():
    check_parser_conformance(parser)
    assert parser.parse(None).errors  # not text: an error, not a raise


def test_registered_through_the_plugin_manager_and_writes_the_android_examples():
    assert isinstance(get_component("parser", "pythonic"), PythonicParser)
    env = AndroidEnv(parser="pythonic")
    example = env._example_messages()
    assert example[1] == Message(role="assistant", content='open_app(app="Settings")')
    assert example[2].content.startswith("open_app returned:\nOpened Settings.\nScreen: com.android.settings")
