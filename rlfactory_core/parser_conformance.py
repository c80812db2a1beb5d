"""The parser conformance suite: the bar every registered response parser is held to.

A parser reads whatever the policy writes, and a policy in training writes anything: the
same broken tag fifty thousand times, megabytes of reasoning, JSON nested past the
recursion limit. Parsing runs on the rollout's event loop, so one slow parse stalls every
trajectory. The checks below are the bar every registered parser is held to
(tests/test_parser_conformance.py runs them over all of them); a plugin author runs them
on their own parser with one call:

    from rlfactory_core.testing import check_parser_conformance

    def test_my_parser_meets_the_bar():
        check_parser_conformance(MyParser())

or one test per case: ``@pytest.mark.parametrize("case", PARSER_CORPUS, ids=str)`` and
``check_parser_case(MyParser(), case)``.

The names are re-exported by :mod:`rlfactory_core.testing`, where plugin tests import them.
"""

from __future__ import annotations

import json
import random
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .tools import MAX_ARGUMENT_DEPTH, arguments_problem
from .types import ParsedTurn, ParseError, ToolCall

__all__ = [
    "ParserCase",
    "PARSER_CORPUS",
    "ParserCost",
    "measure_parse",
    "check_parser_case",
    "check_parser_conformance",
    "markup_cases",
    "check_family_conformance",
    "MAX_ARGUMENT_DEPTH",
    "MAX_SNIPPET_CHARS",
    "DECODE_FACTOR",
]

#: Longest ``ParseError.snippet``: the snippet may be shown to the model.
MAX_SNIPPET_CHARS = 1000
#: Characters a parser may hand the JSON decoder per character of text.
DECODE_FACTOR = 4
#: Stack frames left free when the checks call ``parse``: a parser may not recurse once
#: per nesting level of its input (the JSON decoder's recursion counts against the same limit).
STACK_HEADROOM = 250
#: Characters of text a case is built at by default; checks also run at ``growth`` times that.
DEFAULT_CASE_SIZE = 8_000
_STEP_GROWTH_SLACK = 1.5
_MAX_LISTED = 5  # problems of one kind listed per case; the rest are counted


@dataclass(frozen=True)
class ParserCase:
    """One kind of hostile model text: ``build(size)`` returns about ``size`` characters of it,
    the same pattern at every size, so the cost of parsing it can be compared across sizes."""

    name: str
    build: Callable[[int], str]

    def __str__(self) -> str:
        return self.name


def _repeat(unit: str, prefix: str = "", suffix: str = "") -> Callable[[int], str]:
    return lambda size: prefix + unit * max(1, (size - len(prefix) - len(suffix)) // len(unit)) + suffix


def _call(arguments: str, name: str = '"f"') -> str:
    return f'<tool_call>{{"name": {name}, "arguments": {arguments}}}</tool_call>'


_OPEN_STRING_ARGUMENT = '<tool_call>{"name": "f", "arguments": {"q": "'


def _nested(size: int) -> str:
    levels = max(1, size // 7)
    return _call('{"a": ' * levels + "1" + "}" * levels)


# Pieces of the syntaxes model families use for calls and reasoning, so a parser for any of
# them meets its own tags broken in every way.
_FRAGMENTS = (
    "<tool_call>", "</tool_call>", "<tool_call>{", '{"name": "f", "arguments": {', '"}}', "<think>", "</think>",
    "<search>", "</search>", "<answer>", "</answer>", "<information>", "<tool_response>", "<function=f>",
    "</function>", "<|python_tag|>", "[TOOL_CALLS]", "```json\n", "\n```", '"', "\\", "{", "}", "[", "]",
    "\ud800", "\x00", "\x1b[31m", "\n", " ", "x", _call('{"q": "ok"}'), "<search> query </search>",
)



def _mixture(size: int) -> str:
    # The same seed at every size: the text at 8x starts with the text at 1x.
    rng = random.Random(0)
    pieces, length = [], 0
    while length < size:
        piece = rng.choice(_FRAGMENTS)
        piece = piece[: rng.randint(1, len(piece))] if rng.random() < 0.2 else piece
        pieces.append(piece)
        length += len(piece)
    return "".join(pieces)


_DEEP_ARRAYS = "[" * 600 + "]" * 600  # valid, and shallow enough for json's own recursion limit

#: The adversarial corpus: every check runs on every case.
PARSER_CORPUS: tuple[ParserCase, ...] = (
    ParserCase("unclosed_call_objects", _repeat("<tool_call>{")),
    ParserCase("unclosed_calls", _repeat("<tool_call>")),
    ParserCase("stray_close_tags", _repeat("</tool_call>")),
    ParserCase("unclosed_strings", _repeat('<tool_call>{"name": "')),
    ParserCase("broken_call_objects", _repeat('<tool_call>{"a" 1, }\n')),
    ParserCase("escaped_quotes", _repeat('<tool_call>{"a": "\\"')),
    ParserCase("tags_inside_strings", _repeat('</tool_call><tool_call>{"name": "', _OPEN_STRING_ARGUMENT)),
    ParserCase("unbalanced_tags", _repeat("<think><tool_call></think><search></tool_call><answer></think></search>")),
    ParserCase("long_unclosed_think", _repeat("x", "<think>")),
    ParserCase("repeated_think", _repeat("<think>")),
    ParserCase("repeated_think_close", _repeat("</think>")),
    ParserCase("calls_inside_think", _repeat("<think>a<tool_call>{</think><search>q</search>")),
    ParserCase("many_valid_calls", _repeat(_call('{"q": "a", "n": [1, 2.5, null, true]}') + "<search> q </search>")),
    ParserCase("huge_string_argument", _repeat("y", _OPEN_STRING_ARGUMENT, '"}}</tool_call>')),
    ParserCase("huge_json_object", lambda size: _call(
        "{" + ", ".join(f'"k{i}": {i}' for i in range(max(1, size // 11))) + "}")),
    ParserCase("deep_json", _nested),
    ParserCase("deep_json_unclosed", _repeat("[", "<tool_call>")),
    ParserCase("deep_json_within_recursion_limit", _repeat(_call(_DEEP_ARRAYS) + _call(json.dumps(_DEEP_ARRAYS)))),
    ParserCase("lone_surrogates", _repeat(_call('{"q": "\\ud800", "\\udfff": ["\\ud83d"]}', '"\\udc00"')
                                          + "\ud800<search>\udfff</search>")),
    ParserCase("nul_bytes", _repeat("\x00" + _call('{"\\u0000": "\x00"}', '"\\u0000"') + "<search>\x00</search>")),
    ParserCase("invalid_escapes", _repeat(_call('{"q": "\\x41 \\u12 \\"}') + "<search>\\</search>")),
    ParserCase("control_characters", _repeat(_call('{"q": "a\nb\tc\x1b"}', '"f\x01"') + "\x7f\x1b[31m\r")),
    ParserCase("bad_numbers", _repeat(_call('{"a": 1e999, "b": NaN, "c": -Infinity, "d": ' + "9" * 300 + "}"))),
    ParserCase("mixture", _mixture),
)


@dataclass
class ParserCost:
    """What parsing one text cost, in measures that do not depend on the machine.

    ``decoded_chars``: characters handed to ``json``'s decoder (``json.loads``,
    ``JSONDecoder.decode`` and ``raw_decode`` all count), the whole string each time: a
    failing decode counts lines from the start of what it was given, so the cost of one
    call hides there. ``steps``: lines of Python executed plus builtin functions called
    while parsing (the interpreter's own work). Neither sees work inside one regular
    expression or string search; the timings in ``bench/parsers.py`` do.
    """

    chars: int
    decoded_chars: int = 0
    steps: int = 0


def _stack_depth() -> int:
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return depth


def measure_parse(parser: Any, text: str) -> tuple[Any, ParserCost]:
    """``parser.parse(text)`` with :data:`STACK_HEADROOM` frames of stack to spare, and its cost.

    Raises what ``parse`` raises. It patches ``json.JSONDecoder.raw_decode`` for the
    duration of the call (counting only this thread's decodes) and sets this thread's trace
    and profile functions; two measurements must not overlap.
    """
    return _measured(lambda: parser.parse(text), len(text))


def _measured(parse: Callable[[], Any], chars: int) -> tuple[Any, ParserCost]:
    cost = ParserCost(chars=chars)
    original = json.JSONDecoder.raw_decode
    thread = threading.get_ident()

    def raw_decode(self: json.JSONDecoder, s: str, idx: int = 0) -> tuple[Any, int]:
        if threading.get_ident() == thread:
            cost.decoded_chars += len(s)
        return original(self, s, idx)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            cost.steps += 1

    def trace(frame: Any, event: str, arg: Any) -> Any:
        cost.steps += 1  # a line, or the call of a Python function
        return trace

    limit, previous_profile, previous_trace = sys.getrecursionlimit(), sys.getprofile(), sys.gettrace()
    json.JSONDecoder.raw_decode = raw_decode  # type: ignore[method-assign]
    sys.setrecursionlimit(min(limit, _stack_depth() + STACK_HEADROOM))
    sys.setprofile(profile)
    sys.settrace(trace)
    try:
        turn = parse()
    finally:
        sys.settrace(previous_trace)
        sys.setprofile(previous_profile)
        sys.setrecursionlimit(limit)
        json.JSONDecoder.raw_decode = original  # type: ignore[method-assign]
    return turn, cost


def _turn_problems(text: str, turn: Any) -> list[str]:
    """What is wrong with ``turn`` as the reading of ``text``: types, sizes, call ids."""
    if not isinstance(turn, ParsedTurn):
        return [f"returned {type(turn).__name__}, not a ParsedTurn"]
    problems = []
    if turn.text != text:
        problems.append("ParsedTurn.text is not the text it was given")
    for field_name, value, optional in (("content", turn.content, False), ("reasoning", turn.reasoning, True)):
        if value is None and optional:
            continue
        if not isinstance(value, str):
            problems.append(f"ParsedTurn.{field_name} is {type(value).__name__}, not str")
        elif len(value) > len(text):
            problems.append(f"ParsedTurn.{field_name} is longer than the text ({len(value)} > {len(text)} chars)")
    calls = turn.tool_calls if isinstance(turn.tool_calls, list) else None
    if calls is None:
        problems.append(f"ParsedTurn.tool_calls is {type(turn.tool_calls).__name__}, not a list")
    ids: set[str] = set()
    for call in calls or []:
        if not isinstance(call, ToolCall):
            problems.append(f"a tool call is {type(call).__name__}, not a ToolCall")
            continue
        if not isinstance(call.name, str) or not call.name:
            problems.append(f"a tool call's name is {call.name!r}, not a non-empty string")
        if not isinstance(call.id, str):
            problems.append(f"a tool call's id is {type(call.id).__name__}, not str")
        elif call.id in ids:
            problems.append(f"two tool calls have the id {call.id!r}")
        elif call.id:
            ids.add(call.id)
        problem = arguments_problem(call.arguments)
        if problem is not None:
            problems.append(f"tool call {call.name!r}: {problem}")
    errors = turn.errors if isinstance(turn.errors, list) else None
    if errors is None:
        problems.append(f"ParsedTurn.errors is {type(turn.errors).__name__}, not a list")
    for error in errors or []:
        if not isinstance(error, ParseError):
            problems.append(f"an error is {type(error).__name__}, not a ParseError")
        elif not isinstance(error.message, str) or not error.message:
            problems.append(f"a ParseError's message is {error.message!r}, not a non-empty string")
        elif not isinstance(error.snippet, str) or len(error.snippet) > MAX_SNIPPET_CHARS:
            length = len(error.snippet) if isinstance(error.snippet, str) else type(error.snippet).__name__
            problems.append(f"a ParseError's snippet is not a string of at most {MAX_SNIPPET_CHARS} chars ({length})")
    return problems


def _summarise(problems: Iterable[str]) -> list[str]:
    counts: dict[str, int] = {}
    for problem in problems:
        counts[problem] = counts.get(problem, 0) + 1
    lines = [f"{problem} (x{count})" if count > 1 else problem for problem, count in counts.items()]
    return lines[:_MAX_LISTED] + ([f"and {len(lines) - _MAX_LISTED} more"] if len(lines) > _MAX_LISTED else [])


def _case_problems(parser: Any, case: ParserCase, size: int, growth: int) -> list[str]:
    costs = []
    for n in (size, size * growth):
        text = case.build(n)
        try:
            turn, cost = measure_parse(parser, text)
        except Exception as exc:  # noqa: BLE001 - raising is what is being checked
            return [f"parse raised {type(exc).__name__} on {len(text)} chars: {str(exc)[:200]}"]
        problems = _summarise(_turn_problems(text, turn))
        if problems:
            return [f"on {len(text)} chars: {problem}" for problem in problems]
        if cost.decoded_chars > DECODE_FACTOR * len(text):
            return [f"handed the JSON decoder {cost.decoded_chars} chars for {len(text)} chars of text, more than "
                    f"{DECODE_FACTOR}x: decode one block at a time, never from a block to the end of the text"]
        if n == size and parser.parse(text) != turn:
            return ["parsing the same text twice gave different results: a parser must keep no state between turns"]
        costs.append(cost)
    small, large = costs
    if large.steps > growth * small.steps * _STEP_GROWTH_SLACK + 100:
        return [f"took {small.steps} steps on {small.chars} chars and {large.steps} on {large.chars} "
                f"({large.steps / max(small.steps, 1):.0f}x for {growth}x the text): the work grows faster than "
                f"the text"]
    return []


def check_parser_case(parser: Any, case: ParserCase, *, size: int = DEFAULT_CASE_SIZE, growth: int = 8) -> None:
    """Parse ``case`` at ``size`` and ``growth * size`` characters and check that ``parser``:

    * never raises, with only :data:`STACK_HEADROOM` frames of stack to spare (so it does
      not recurse per nesting level of the text);
    * returns the declared types: a ``ParsedTurn`` of the text it was given, ``content`` and
      ``reasoning`` no longer than it, ``ToolCall`` objects with non-empty names, distinct
      ids and JSON arguments (string keys, no NaN) nested at most :data:`MAX_ARGUMENT_DEPTH`
      levels, ``ParseError`` objects with a message and a snippet of at most
      :data:`MAX_SNIPPET_CHARS` characters;
    * gives the same result when parsing the same text again;
    * costs linear work: at most :data:`DECODE_FACTOR` characters handed to the JSON decoder
      per character of text, and interpreter steps that grow no faster than the text
      (see :class:`ParserCost`).

    :raises AssertionError: naming the parser, the case and what failed.
    """
    problems = _case_problems(parser, case, size, growth)
    if problems:
        label = getattr(parser, "name", None) or type(parser).__name__
        raise AssertionError(f"parser {label!r}, case {case.name!r}: " + "; ".join(problems))


def check_parser_conformance(parser: Any, *, size: int = DEFAULT_CASE_SIZE, growth: int = 8,
                             cases: Iterable[ParserCase] = PARSER_CORPUS) -> None:
    """Run :func:`check_parser_case` for every case of ``cases`` (default: :data:`PARSER_CORPUS`).

    :raises AssertionError: listing every case that failed, one line each.
    """
    failures = []
    for case in cases:
        try:
            check_parser_case(parser, case, size=size, growth=growth)
        except AssertionError as exc:
            failures.append(str(exc))
    if failures:
        raise AssertionError(f"{len(failures)} conformance case(s) failed:\n" + "\n".join(failures))


# --------------------------------------------------------------------------- model families


def markup_cases(tokenizer: Any) -> tuple[ParserCase, ...]:
    """Cases made of the vocabulary's own markup (every added token: Llama's ``<|python_tag|>``,
    harmony's ``<|call|>``, DeepSeek's tool-call tokens): repeated in order, each opened and
    never closed, and shuffled with JSON fragments, the text a family's id parser reads."""
    markup = [t.content for _, t in sorted((getattr(tokenizer, "added_tokens_decoder", None) or {}).items())]
    if not markup:
        return ()
    soup = "".join(markup[:256])

    def shuffled(size: int) -> str:
        rng = random.Random(0)
        pieces, length = [], 0
        while length < size:
            piece = rng.choice([*markup, *_FRAGMENTS, '{"name": "f", "arguments": {"q": 1}}', "functions.f"])
            pieces.append(piece)
            length += len(piece)
        return "".join(pieces)

    return (ParserCase("markup_in_order", _repeat(soup)),
            ParserCase("markup_each_repeated", lambda size: "".join(m * max(1, size // (len(m) * len(markup)))
                                                                    for m in markup)[:size]),
            ParserCase("markup_shuffled", shuffled))


def _family_case_problems(family: Any, tokenizer: Any, context: list[int], case: ParserCase, size: int,
                          growth: int) -> list[str]:
    costs = []
    for n in (size, size * growth):
        # what a model can write: ids, so text that UTF-8 cannot hold (a lone surrogate) is replaced
        text = case.build(n).encode("utf-8", "replace").decode("utf-8")
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        try:
            turn, cost = _measured(lambda: family.parse(ids, context), len(ids))
        except Exception as exc:  # noqa: BLE001 - raising is what is being checked
            return [f"parse raised {type(exc).__name__} on {len(ids)} ids: {str(exc)[:200]}"]
        problems = _summarise(_turn_problems(family.decode(ids), turn))
        if problems:
            return [f"on {len(ids)} ids: {problem}" for problem in problems]
        if cost.decoded_chars > DECODE_FACTOR * len(text):
            return [f"handed the JSON decoder {cost.decoded_chars} chars for {len(text)} chars of text, more than "
                    f"{DECODE_FACTOR}x"]
        costs.append(cost)
    small, large = costs
    ratio = large.chars / max(small.chars, 1)  # ids, not characters: tokenization is not exactly linear
    if large.steps > ratio * small.steps * _STEP_GROWTH_SLACK + 100:
        return [f"took {small.steps} steps on {small.chars} ids and {large.steps} on {large.chars} "
                f"({large.steps / max(small.steps, 1):.0f}x for {ratio:.1f}x the ids): the work grows faster than "
                f"the completion"]
    return []


def check_family_conformance(family: Any, tokenizer: Any, context_ids: Any = (), *, size: int = 2_000,
                             growth: int = 4, cases: Iterable[ParserCase] | None = None) -> None:
    """The parser bar (:func:`check_parser_case`) for a model family, which reads a turn
    from its ids: each case's text is tokenized as the model could have written it (special
    tokens included) and given to ``family.parse(ids, context_ids)``. Default cases: the
    text corpus (:data:`PARSER_CORPUS`) and :func:`markup_cases` of ``tokenizer``.
    ``ParsedTurn.text`` must be the ids' text (``family.decode``).

    :raises AssertionError: listing every case that failed, one line each.
    """
    context = list(context_ids)
    failures = []
    for case in (cases if cases is not None else (*PARSER_CORPUS, *markup_cases(tokenizer))):
        problems = _family_case_problems(family, tokenizer, context, case, size, growth)
        if problems:
            failures.append(f"family {getattr(family, 'name', type(family).__name__)!r}, case {case.name!r}: "
                            + "; ".join(problems))
    if failures:
        raise AssertionError(f"{len(failures)} conformance case(s) failed:\n" + "\n".join(failures))
