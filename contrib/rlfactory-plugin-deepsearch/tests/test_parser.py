"""The search_r1 parser: Search-R1's <search>/<information> tags as tool calls and results."""

import pytest

from rlfactory_core import Message, ParseError, ToolCall, ToolResult
from rlfactory_deepsearch import SearchTool
from rlfactory_deepsearch.parser import SearchR1Parser

parser = SearchR1Parser()


def test_a_search_is_a_call_of_the_search_tool_with_its_query():
    turn = parser.parse("I need the capital.\n<search> capital of Peru </search>")
    assert turn.tool_calls == [ToolCall("search", {"query": "capital of Peru"}, id="call_0")]
    assert turn.content == "I need the capital." and not turn.errors and turn.reasoning is None


def test_every_search_outside_reasoning_is_a_call_in_order():
    turn = parser.parse("<think>maybe <search>draft</search></think><search>a</search> and <search>b</search>")
    assert [c.arguments["query"] for c in turn.tool_calls] == ["a", "b"]
    assert [c.id for c in turn.tool_calls] == ["call_0", "call_1"]
    assert turn.reasoning == "maybe <search>draft</search>" and turn.content == "and"


def test_an_answer_is_content_not_a_call():
    turn = parser.parse("<answer> Lima </answer>")
    assert turn.tool_calls == [] and turn.errors == [] and turn.content == "<answer> Lima </answer>"


@pytest.mark.parametrize("text, message", [
    ("<search>capital of Peru", "<search> is not closed"),
    ("<search>  </search>", "the search is empty"),
])
def test_malformed_searches_are_parse_errors_that_tell_the_format(text, message):
    turn = parser.parse(text)
    assert turn.tool_calls == []
    [error] = turn.errors
    assert isinstance(error, ParseError) and error.message.startswith(message)
    assert "write <search> query </search>" in error.message


def test_a_long_blank_search_keeps_a_short_snippet():
    [error] = parser.parse("<search>" + " \n" * 100_000 + "</search>").errors
    assert error.message.startswith("the search is empty") and error.snippet == "<search> </search>"


def test_parsing_never_raises():
    assert parser.parse(None).errors and parser.parse(42).errors  # type: ignore[arg-type]


def test_results_come_back_as_information_blocks_in_one_user_turn():
    results = [ToolResult("search", 'Doc 1(Title: "Peru") Lima is the capital.'), ToolResult("search", "No passages found.")]
    assert parser.render_tool_results(results) == [Message("user", '<information>Doc 1(Title: "Peru") Lima is the '
                                                                   'capital.</information>\n<information>No passages '
                                                                   'found.</information>')]
    assert parser.render_tool_results([]) == []


def test_a_written_call_parses_back_to_itself():
    call = ToolCall("search", {"query": "Norway currency"})
    text = parser.format_tool_call(call)
    assert text == "<search> Norway currency </search>"
    assert parser.parse(text).tool_calls[0].arguments == call.arguments


def test_the_system_prompt_says_how_to_search_and_refuses_other_tools():
    search = SearchTool(batcher=None, topk=2)
    prompt = parser.render_system_prompt("Answer the question.", [search])
    assert prompt.startswith("Answer the question.\n\n") and "<search> and </search>" in prompt
    assert "<information> and </information>" in prompt
    assert parser.render_system_prompt("Answer.", []) == "Answer."

    class Calculator:
        name = "calculator"

    with pytest.raises(ValueError, match="can only call the 'search' tool.*calculator"):
        parser.render_system_prompt("Answer.", [search, Calculator()])
