"""Every registered response parser meets the conformance bar of ``rlfactory_core.testing``,
and the bar itself catches the failures it is for (a check that passes everything proves
nothing): the quadratic decode of issue 19, quadratic Python work, recursion per nesting
level, deep arguments, wrong types, raising."""

from __future__ import annotations

import json
import re
import threading

import pytest

from rlfactory_core import plugins
from rlfactory_core.testing import (
    DECODE_FACTOR,
    MAX_ARGUMENT_DEPTH,
    PARSER_CORPUS,
    ParserCase,
    check_parser_case,
    check_parser_conformance,
    measure_parse,
)
from rlfactory_core.types import ParsedTurn, ParseError, ToolCall

_CALL = re.compile(r"<tool_call>")


def test_every_registered_parser_meets_the_bar(plugin_manager):
    parsers = {name: component.obj for name, component in plugins.components("parser").items()}
    # The shipped parsers must be among them, or this test would pass by checking nothing.
    assert {"qwen3", "search_r1", "pythonic"} <= set(parsers)
    failures = []
    for name, parser in sorted(parsers.items()):
        try:
            check_parser_conformance(parser)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)


class _Parser:
    """A parser that reads the body of each ``<tool_call>`` with ``read(text, body_start)``;
    the errors it turns into ``ParseError`` are ``catch``."""

    name = "test"

    def __init__(self, read, catch=(ValueError, RecursionError)):
        self.read, self.catch = read, catch

    def parse(self, text: str) -> ParsedTurn:
        turn = ParsedTurn(text=text, content="")
        for match in _CALL.finditer(text):
            try:
                value = self.read(text, match.end())
            except self.catch as exc:
                turn.errors.append(ParseError(str(exc)[:100]))
                continue
            if isinstance(value, dict) and isinstance(value.get("arguments"), dict):
                turn.tool_calls.append(ToolCall("f", value["arguments"], id=f"call_{len(turn.tool_calls)}"))
        return turn


def _case(name: str) -> ParserCase:
    return next(case for case in PARSER_CORPUS if case.name == name)


def _decode_to_the_end(text, start):
    # What qwen3 did before issue 19: a failing decode counts lines from the text's start.
    return json.JSONDecoder().raw_decode(text, start)[0]


def _decode_to_the_next_tag(text, start):
    end = text.find("<", start)
    return json.loads(text[start:end if end != -1 else len(text)])


def test_the_decoder_measure_sees_a_quadratic_decode():
    case = _case("unclosed_call_objects")
    _, cost = measure_parse(_Parser(_decode_to_the_end), case.build(8_000))
    # One decode call per block either way: the measure counts what each call is handed.
    assert cost.decoded_chars > 100 * DECODE_FACTOR * cost.chars
    with pytest.raises(AssertionError, match="handed the JSON decoder .* decode one block at a time"):
        check_parser_case(_Parser(_decode_to_the_end), case)
    check_parser_case(_Parser(_decode_to_the_next_tag), case)


def test_the_step_measure_sees_quadratic_python_work():
    def count_earlier_blocks(text, start):
        earlier = 0
        for _ in _CALL.finditer(text, 0, start):
            earlier += 1
        raise ValueError(f"block {earlier + 1} is broken")

    with pytest.raises(AssertionError, match="the work grows faster than the text"):
        # A small size: the point is the growth, and quadratic work under a tracer is slow.
        check_parser_case(_Parser(count_earlier_blocks), _case("unclosed_calls"), size=1_000)


def _descend(text, pos):
    # A recursive descent: one Python frame per nesting level.
    return [_descend(text, pos + 1)] if text.startswith("[", pos) else None


def test_recursion_per_nesting_level_fails_even_where_the_default_limit_would_hold():
    parser = _Parser(lambda text, start: _descend(text, text.index("[", start)), catch=(ValueError,))
    # 600 levels fit in Python's default recursion limit, not in the headroom the check leaves.
    with pytest.raises(AssertionError, match="parse raised RecursionError"):
        check_parser_case(parser, _case("deep_json_within_recursion_limit"))


def test_arguments_nested_deeper_than_the_bound_fail():
    deep = {"a": json.loads("[" * MAX_ARGUMENT_DEPTH + "]" * MAX_ARGUMENT_DEPTH)}
    with pytest.raises(AssertionError, match=f"nest more than {MAX_ARGUMENT_DEPTH} levels deep"):
        check_parser_case(_Parser(lambda text, start: {"arguments": deep}), _case("unclosed_calls"), size=1_000)
    shallow = {"a": json.loads("[" * (MAX_ARGUMENT_DEPTH - 1) + "]" * (MAX_ARGUMENT_DEPTH - 1))}
    check_parser_case(_Parser(lambda text, start: {"arguments": shallow}), _case("unclosed_calls"), size=1_000)


@pytest.mark.parametrize(("result", "message"), [
    (lambda text: "a string", "returned str, not a ParsedTurn"),
    (lambda text: ParsedTurn(text=text[:-1]), "ParsedTurn.text is not the text it was given"),
    (lambda text: ParsedTurn(text=text, content=text + text), "content is longer than the text"),
    (lambda text: ParsedTurn(text=text, tool_calls=[ToolCall("", {})]), "name is '', not a non-empty string"),
    (lambda text: ParsedTurn(text=text, tool_calls=[ToolCall("f", {}, "a"), ToolCall("g", {}, "a")]),
     "two tool calls have the id 'a'"),
    (lambda text: ParsedTurn(text=text, tool_calls=[ToolCall("f", {"x": float("nan")})]), "arguments are not JSON"),
    (lambda text: ParsedTurn(text=text, errors=[ParseError("bad", text)]), "snippet is not a string of at most"),
])
def test_wrong_results_are_named(result, message):
    class Wrong:
        name = "wrong"

        def parse(self, text):
            return result(text)

    with pytest.raises(AssertionError, match=re.escape(message)):
        check_parser_case(Wrong(), _case("unclosed_calls"))


def test_every_failing_case_is_listed():
    class Raises:
        name = "raises"

        def parse(self, text):
            raise ValueError("no")

    with pytest.raises(AssertionError) as info:
        check_parser_conformance(Raises())
    lines = str(info.value).splitlines()
    assert lines[0] == f"{len(PARSER_CORPUS)} conformance case(s) failed:"
    assert all("parse raised ValueError on" in line for line in lines[1:])


def test_a_parser_that_keeps_state_between_turns_fails():
    class Counting:
        name = "counting"
        turns = 0

        def parse(self, text):
            self.turns += 1
            return ParsedTurn(text=text, content=str(self.turns))

    with pytest.raises(AssertionError, match="same text twice gave different results"):
        check_parser_case(Counting(), _case("unclosed_calls"))


def test_json_decoded_by_other_threads_is_not_charged():
    class Spawning:
        name = "spawning"

        def parse(self, text):
            other = threading.Thread(target=json.loads, args=("[" + "1, " * 10_000 + "1]",))
            other.start()
            other.join()
            return ParsedTurn(text=text)

    _, cost = measure_parse(Spawning(), "text")
    assert cost.decoded_chars == 0
