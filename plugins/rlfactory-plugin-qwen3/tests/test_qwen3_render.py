"""What the parser writes: the system prompt, tool results and tool calls.

The exact-text tests compare with Qwen3's chat template: the parts of it that concern tools
are reproduced below (reasoning handling left out) and rendered with Hugging Face's own
Jinja machinery, so ``tojson`` behaves as in ``apply_chat_template``. No model is loaded.
"""

from __future__ import annotations

import json

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from rlfactory_core import Message, ToolCall, ToolResult, function_tool
from rlfactory_plugin_qwen3 import Qwen3Parser, format_tool_call

# Qwen3's chat template, reduced to system prompt, tools, tool calls and tool messages.
QWEN3_TOOLS_TEMPLATE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant\n' + message.content }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if (loop.first and message.content) or (not loop.first) %}
                {{- '\n' }}
            {%- endif %}
            {%- set tool_call = tool_call.function %}
            {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' + tool_call.arguments | tojson + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
"""

# A ChatML template without tool support, like SmolLM2's.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
)

EXPECTED_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
EXPECTED_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def render(template: str, messages: list[dict], tools: list[dict] | None = None) -> str:
    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=template)
    return rendered[0]


def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the current weather in a city.

    Args:
        city: the city's name, e.g. "Zürich".
        unit: "celsius" or "fahrenheit".
    """
    return f"18 degrees in {city}"


def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


WEATHER = function_tool(get_weather)
WORDS = function_tool(word_count)


def schema(tool) -> dict:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}


# --- system prompt -------------------------------------------------------------------------


def test_system_prompt_with_a_real_tool_has_the_exact_tools_section():
    parser = Qwen3Parser()
    prompt = parser.render_system_prompt("You are a helpful assistant.", [WEATHER])
    line = (
        '{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.", '
        '"parameters": {"additionalProperties": false, "properties": {"city": {"description": "the city\'s name, '
        'e.g. \\"Zürich\\".", "type": "string"}, "unit": {"default": "celsius", "description": '
        '"\\"celsius\\" or \\"fahrenheit\\".", "type": "string"}}, "required": ["city"], "type": "object"}}}'
    )
    assert prompt == "You are a helpful assistant.\n\n" + EXPECTED_HEADER + line + EXPECTED_FOOTER
    assert json.loads(line) == schema(WEATHER)


def test_system_prompt_has_one_line_per_tool_in_order():
    prompt = Qwen3Parser().render_system_prompt("S", [WEATHER, WORDS])
    section = prompt[len("S\n\n" + EXPECTED_HEADER): -len(EXPECTED_FOOTER)]
    assert [json.loads(line) for line in section.split("\n")] == [schema(WEATHER), schema(WORDS)]


def test_system_prompt_matches_the_qwen3_template():
    # What the template renders with tools= must equal what it renders for a plain system
    # message holding our prompt: the model sees the same text either way.
    parser = Qwen3Parser()
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Oslo?"}]
    native = render(QWEN3_TOOLS_TEMPLATE, messages, tools=[schema(WEATHER), schema(WORDS)])
    ours = render(QWEN3_TOOLS_TEMPLATE, [
        {"role": "system", "content": parser.render_system_prompt("You are terse.", [WEATHER, WORDS])},
        messages[1],
    ])
    assert ours == native


def test_system_prompt_without_system_message_matches_the_qwen3_template():
    native = render(QWEN3_TOOLS_TEMPLATE, [{"role": "user", "content": "hi"}], tools=[schema(WEATHER)])
    ours = render(QWEN3_TOOLS_TEMPLATE, [
        {"role": "system", "content": Qwen3Parser().render_system_prompt("", [WEATHER])},
        {"role": "user", "content": "hi"},
    ])
    assert ours == native


@pytest.mark.parametrize("system_prompt", ["You are helpful.", "", "  spaced  \n"])
def test_system_prompt_without_tools_is_unchanged(system_prompt):
    assert Qwen3Parser().render_system_prompt(system_prompt, []) == system_prompt


def test_non_ascii_in_schemas_is_kept():
    tool = function_tool(get_weather, description="Météo — 天气")
    prompt = Qwen3Parser().render_system_prompt("", [tool])
    assert '"description": "Météo — 天气"' in prompt
    assert "\\u" not in prompt


def test_schema_dicts_are_accepted():
    openai_style = schema(WEATHER)
    bare = schema(WORDS)["function"]
    prompt = Qwen3Parser().render_system_prompt("S", [openai_style, bare])
    assert prompt == Qwen3Parser().render_system_prompt("S", [WEATHER, WORDS])


def test_unserialisable_schema_names_the_tool():
    class Odd:
        name = "odd"
        description = ""
        parameters = {"type": "object", "default": object()}

    with pytest.raises(TypeError, match="tool 'odd'"):
        Qwen3Parser().render_system_prompt("S", [Odd()])


# --- tool calls ----------------------------------------------------------------------------


@pytest.mark.parametrize("arguments", [{}, {"city": "Zürich", "days": [1, 2]}, {"q": 'say "hi"\n', "x": None}])
def test_format_tool_call_matches_the_qwen3_template(arguments):
    call = ToolCall(name="get_weather", arguments=arguments, id="call_0")
    message = Message(role="assistant", content="", tool_calls=[call]).to_dict()
    rendered = render(QWEN3_TOOLS_TEMPLATE, [message])
    assert rendered == "<|im_start|>assistant\n" + format_tool_call(call) + "<|im_end|>\n"
    assert format_tool_call(call) == (
        '<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(arguments, ensure_ascii=False)
        + "}\n</tool_call>"
    )


def test_format_tool_call_is_also_a_parser_method():
    call = ToolCall(name="f", arguments={"a": 1})
    assert Qwen3Parser().format_tool_call(call) == format_tool_call(call)


def test_rendered_assistant_turn_parses_back():
    calls = [ToolCall(name="a", arguments={"x": 1}, id="call_0"), ToolCall(name="b", arguments={}, id="call_1")]
    message = Message(role="assistant", content="Two calls.", tool_calls=calls).to_dict()
    rendered = render(QWEN3_TOOLS_TEMPLATE, [message])
    text = rendered.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
    turn = Qwen3Parser().parse(text)
    assert turn.tool_calls == calls
    assert turn.content == "Two calls."


# --- tool results --------------------------------------------------------------------------

RESULTS = [
    ToolResult(name="get_weather", content="18 degrees, sunny", call_id="call_0"),
    ToolResult(name="word_count", content="unknown tool 'word_count'; available: get_weather",
               call_id="call_1", error="unknown tool"),
    ToolResult(name="get_weather", content="Zürich: 12 °C\nwindy", call_id="call_2"),
]


def test_results_are_one_user_message_of_tool_response_blocks():
    messages = Qwen3Parser().render_tool_results(RESULTS)
    assert messages == [Message(role="user", content=(
        "<tool_response>\n18 degrees, sunny\n</tool_response>\n"
        "<tool_response>\nunknown tool 'word_count'; available: get_weather\n</tool_response>\n"
        "<tool_response>\nZürich: 12 °C\nwindy\n</tool_response>"
    ))]


def test_single_result():
    messages = Qwen3Parser().render_tool_results(RESULTS[:1])
    assert messages == [Message(role="user", content="<tool_response>\n18 degrees, sunny\n</tool_response>")]


def test_no_results_no_messages():
    assert Qwen3Parser().render_tool_results([]) == []
    assert Qwen3Parser(tool_role="tool").render_tool_results([]) == []


def test_user_role_results_render_like_qwen3_tool_messages():
    # Qwen3's template turns consecutive tool messages into one user turn; our user message
    # must give the same text, through Qwen3's template and through a template with no
    # tool role at all.
    call = ToolCall(name="get_weather", arguments={"city": "Oslo"}, id="call_0")
    before = [{"role": "user", "content": "Weather?"},
              Message(role="assistant", content="", tool_calls=[call]).to_dict()]
    native = render(QWEN3_TOOLS_TEMPLATE, before + [
        Message(role="tool", content=r.content, name=r.name, tool_call_id=r.call_id).to_dict() for r in RESULTS])
    ours = [m.to_dict() for m in Qwen3Parser().render_tool_results(RESULTS)]
    assert render(QWEN3_TOOLS_TEMPLATE, before + ours) == native
    tool_turn = native[native.rindex("<|im_start|>user"):]
    assert render(CHATML_TEMPLATE, ours) == tool_turn


def test_tool_role_gives_one_tool_message_per_result():
    messages = Qwen3Parser(tool_role="tool").render_tool_results(RESULTS)
    assert messages == [
        Message(role="tool", content=r.content, name=r.name, tool_call_id=r.call_id) for r in RESULTS
    ]


def test_tool_role_messages_render_through_the_qwen3_template():
    ours = [m.to_dict() for m in Qwen3Parser(tool_role="tool").render_tool_results(RESULTS)]
    default = [m.to_dict() for m in Qwen3Parser().render_tool_results(RESULTS)]
    assert render(QWEN3_TOOLS_TEMPLATE, ours) == render(QWEN3_TOOLS_TEMPLATE, default)


def test_tool_role_without_call_id():
    [message] = Qwen3Parser(tool_role="tool").render_tool_results([ToolResult(name="f", content="ok")])
    assert message.tool_call_id is None
    assert message.to_dict() == {"role": "tool", "content": "ok", "name": "f"}


def test_invalid_tool_role():
    with pytest.raises(ValueError, match="tool_role"):
        Qwen3Parser(tool_role="function")  # type: ignore[arg-type]
