{% set kinds = cookiecutter.__kinds.split(",") %}
{% set slug = cookiecutter.__slug %}
"""Tests for {{ cookiecutter.__dist_name }}: RLFactory finds the installed plugin, and each
component works through RLFactory's real plugin manager, the way a training run uses it.

Run them with the package installed: ``pip install -e '.[test]' && pytest``.
"""

from __future__ import annotations

{% if "tool" in kinds or "reward" in kinds or "env" in kinds %}
import asyncio
{% endif %}
import json
import subprocess
import sys

import pytest

{% set type_names = [] %}
{% if "env" in kinds %}
{% set type_names = type_names + ["ParseError", "ParsedTurn", "ToolCall"] %}
{% endif %}
{% if "parser" in kinds %}
{% set type_names = type_names + ["ToolResult"] %}
{% endif %}
{% if "env" in kinds or "reward" in kinds %}
{% set type_names = type_names + ["Trajectory"] %}
{% endif %}
from rlfactory_core import {{ (type_names + ["get_component"]) | join(", ") }}
from rlfactory_core.testing import assert_discovered, installed_plugins

PLUGIN_NAME = "{{ cookiecutter.plugin_name }}"
EXPECTED_HOOKS = [
{% if "env" in kinds %}
    "rlfactory_register_envs",
{% endif %}
{% if "parser" in kinds %}
    "rlfactory_register_parsers",
{% endif %}
{% if "reward" in kinds %}
    "rlfactory_register_rewards",
{% endif %}
{% if "tool" in kinds %}
    "rlfactory_register_tools",
{% endif %}
]
EXPECTED_COMPONENTS = {
{% if "env" in kinds %}
    "env": ["{{ slug }}"],
{% endif %}
{% if "parser" in kinds %}
    "parser": ["{{ slug }}"],
{% endif %}
{% if "reward" in kinds %}
    "reward": ["{{ slug }}_length"],
{% endif %}
{% if "tool" in kinds %}
    "tool": ["{{ slug }}_word_count"],
{% endif %}
}


@pytest.fixture(autouse=True)
def fresh_plugins():
    """Load the installed plugins afresh for every test, and forget them afterwards."""
    with installed_plugins():
        yield


def test_plugin_is_discovered_through_its_entry_point():
    # Strict mode, the plugin loaded alone: any import, hook or registration problem raises.
    info = assert_discovered("{{ cookiecutter.__dist_name }}", EXPECTED_COMPONENTS, hooks=EXPECTED_HOOKS)
    assert info.name == PLUGIN_NAME


def test_plugin_is_listed_with_its_hooks_and_components():
    result = subprocess.run(
        [sys.executable, "-m", "rlfactory_cli", "plugins", "list", "--json"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    listed = {info["name"]: info for info in json.loads(result.stdout)}
    assert PLUGIN_NAME in listed, f"plugin {PLUGIN_NAME!r} not listed; is it installed (pip install -e .)?"
    info = listed[PLUGIN_NAME]
    assert info["status"] == "ok", info["problems"]
    assert sorted(info["hooks"]) == EXPECTED_HOOKS
    assert info["components"] == EXPECTED_COMPONENTS
{% if "tool" in kinds %}


def test_word_count_tool_counts_words():
    tool = get_component("tool", "{{ slug }}_word_count")
    result = asyncio.run(tool.call({"text": "three  small\nwords"}))
    assert result.content == "3"
    assert tool.parameters["required"] == ["text"]


def test_word_count_tool_rejects_invalid_arguments():
    tool = get_component("tool", "{{ slug }}_word_count")
    with pytest.raises(ValueError, match="text"):  # the tool manager turns this into an error observation
        asyncio.run(tool.call({"words": "no such argument"}))
{% endif %}
{% if "reward" in kinds %}


@pytest.mark.parametrize(
    ("final_answer", "expected"),
    [
        ("a short answer", 1.0),
        ("word " * 10, 1.0),  # exactly the budget
        ("word " * 15, 0.5),  # half-way to twice the budget
        ("word " * 25, 0.0),
        ("", 0.0),
        (None, 0.0),  # the episode ended without an answer
    ],
)
def test_length_reward_scores_the_final_answer(final_answer, expected):
    reward = get_component("reward", "{{ slug }}_length")(max_words=10)
    trajectory = Trajectory(sample_id="test", prompt_ids=[], final_answer=final_answer)
    output = asyncio.run(reward.score(trajectory, {"id": "test"}))
    assert output.value == pytest.approx(expected)
    assert output.components["within_budget"] == (1.0 if expected == 1.0 else 0.0)


def test_length_reward_rejects_an_empty_budget():
    with pytest.raises(ValueError, match="max_words"):
        get_component("reward", "{{ slug }}_length")(max_words=0)
{% endif %}
{% if "env" in kinds %}


def test_env_runs_an_episode_from_its_dataset():
    env = get_component("env", "{{ slug }}")()
    sample = env.dataset(1)[0]

    async def episode():
        reset = await env.reset(sample)
        try:
            assert [message.role for message in reset.messages] == ["system", "user"]
            assert sample["text"] in reset.messages[1].content
            # the tools a run's tool manager serves are the env's `tools`: offer those
            assert [tool.name for tool in reset.tools] == [tool.name for tool in env.tools] == ["{{ slug }}_word_count"]

            call = ToolCall(name="{{ slug }}_word_count", arguments={"text": sample["text"]}, id="call_0")
            result = await reset.tools[0].call(call.arguments)
            step = await env.step(reset.state, ParsedTurn(text="(tool call)", tool_calls=[call]), [result])
            assert not step.done and step.observation == []

            answer = ParsedTurn(text=result.content, content=result.content)
            step = await env.step(reset.state, answer, [])
            assert step.done
            return step.final_answer
        finally:
            await env.close(reset.state)

    final_answer = asyncio.run(episode())
    assert final_answer == sample["answer"]
    # RLFactory's built-in exact_match reward scores the env's samples as they are.
    exact_match = get_component("reward", "exact_match")()
    trajectory = Trajectory(sample_id=sample["id"], prompt_ids=[], final_answer=final_answer)
    assert asyncio.run(exact_match.score(trajectory, sample)).value == 1.0


def test_env_answers_in_its_dataset_are_right():
    env = get_component("env", "{{ slug }}")()
    for sample in env.dataset(32, "train") + env.dataset(32, "test"):
        assert sample["answer"] == str(len(sample["text"].split())), sample["id"]


def test_env_splits_are_fixed_and_share_no_text():
    """`rlf train` trains on `dataset(size, "train")` and evaluates on `dataset(size, "test")`."""
    env = get_component("env", "{{ slug }}")()
    train, test = env.dataset(200, "train"), env.dataset(50, "test")
    assert len(train) == 200 and len(test) == 50
    assert not {s["text"] for s in train} & {s["text"] for s in test}
    assert env.dataset(200, "train") == train  # the same samples every time
    assert get_component("env", "{{ slug }}")(seed=1).dataset(200, "train") != train
    with pytest.raises(ValueError, match="validation"):
        env.dataset(4, "validation")


def test_env_gives_feedback_on_unreadable_calls_and_stops_at_max_turns():
    env = get_component("env", "{{ slug }}")(max_turns=2)
    sample = env.dataset(1)[0]
    call = ToolCall(name="{{ slug }}_word_count", arguments={"text": sample["text"]})

    async def episode():
        reset = await env.reset(sample)
        try:
            garbled = ParsedTurn(text="{oops", errors=[ParseError(message="not valid JSON", snippet="{oops")])
            first = await env.step(reset.state, garbled, [])
            second = await env.step(reset.state, ParsedTurn(text="(tool call)", tool_calls=[call]), [])
            return first, second
        finally:
            await env.close(reset.state)

    first, second = asyncio.run(episode())
    assert not first.done and "not valid JSON" in first.observation[0].content
    assert second.done and second.final_answer is None
{% endif %}
{% if "parser" in kinds %}


def test_parser_reads_content_calls_and_errors():
    parser = get_component("parser", "{{ slug }}")
    turn = parser.parse(
        'Let me count.\n'
        '{"tool": "word_count", "arguments": {"text": "to be or not to be"}}\n'
        '{"tool": "word_count", "arguments": '
    )
    assert turn.content == "Let me count."
    assert [(call.name, call.arguments, call.id) for call in turn.tool_calls] == [
        ("word_count", {"text": "to be or not to be"}, "call_0")
    ]
    assert len(turn.errors) == 1 and "JSON" in turn.errors[0].message


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "{",
        "{not json",
        '{"tool": 3}',
        '{"tool": "x", "arguments": ' + "[" * 100_000,  # deep nesting: RecursionError inside json
        '{"tool": "x", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
)
def test_parser_never_raises(text):
    parser = get_component("parser", "{{ slug }}")
    turn = parser.parse(text)
    assert turn.text == text and turn.tool_calls == []


def test_a_named_call_with_unusable_arguments_is_kept_invalid():
    # the tool manager answers it with an invalid_arguments error, without running the tool
    turn = get_component("parser", "{{ slug }}").parse('{"tool": "x", "arguments": [1]}')
    assert not turn.errors and [(c.name, c.arguments) for c in turn.tool_calls] == [("x", {})]
    assert "must be a JSON object" in turn.tool_calls[0].invalid


def test_parser_round_trips_what_its_prompt_asks_for():
    from rlfactory_core import function_tool

    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    parser = get_component("parser", "{{ slug }}")
    prompt = parser.render_system_prompt("Be brief.", [function_tool(shout)])
    assert prompt.startswith("Be brief.") and '"name": "shout"' in prompt
    assert parser.render_system_prompt("Be brief.", []) == "Be brief."

    turn = parser.parse(json.dumps({"tool": "shout", "arguments": {"text": "hi"}}))
    assert turn.content == "" and turn.tool_calls[0].name == "shout"
    messages = parser.render_tool_results([ToolResult(name="shout", content="HI", call_id=turn.tool_calls[0].id)])
    assert [(m.role, m.content, m.tool_call_id) for m in messages] == [("tool", "HI", "call_0")]
{% endif %}
