"""The ``arithmetic`` env: its data, an episode through reset/step, and discovery through
its entry point by the real plugin manager.

Needs the distribution installed (``pip install -e contrib/rlfactory-plugin-arithmetic``;
``make install`` does it), as every plugin does to be found at all.
"""

from __future__ import annotations

import asyncio

import pytest

import rlfactory_arithmetic
from rlfactory_arithmetic import NO_TOOLS_PROMPT, SYSTEM_PROMPT, ArithmeticEnv
from rlfactory_core import (EnvStep, ParsedTurn, ToolCall, Trajectory, UnknownComponentError, check_component,
                            get_component)
from rlfactory_core.testing import assert_discovered, components, installed_plugins

DIST = "rlfactory-plugin-arithmetic"


@pytest.fixture
def fresh_plugins():
    """The real plugin manager, reloaded from the installed entry points, reset afterwards."""
    with installed_plugins() as pm:
        yield pm


def test_the_plugin_is_discovered_through_its_entry_point():
    # Strict mode, the plugin loaded alone: any import, hook or registration problem raises.
    info = assert_discovered(DIST, {"env": ["arithmetic"], "reward": ["arithmetic_verified"]},
                             plugin=rlfactory_arithmetic)
    assert info.name == "arithmetic"


def test_env_is_registered_through_the_plugin_manager(fresh_plugins):
    component = components("env")["arithmetic"]
    assert (component.kind, component.plugin, component.obj) == ("env", "arithmetic", ArithmeticEnv)
    assert component.description
    assert get_component("env", "arithmetic") is ArithmeticEnv


def test_env_is_absent_when_external_plugins_are_disabled():
    with installed_plugins(load=""):
        with pytest.raises(UnknownComponentError, match="arithmetic"):
            get_component("env", "arithmetic")
        assert "calculator" in components("tool")  # the tool is the core's, always there


def test_env_satisfies_the_interface(fresh_plugins):
    check_component("env", ArithmeticEnv)
    assert ArithmeticEnv().tools == [get_component("tool", "calculator")]
    assert ArithmeticEnv(use_tools=False).tools == []
    with pytest.raises(ValueError, match="questions_per_episode"):
        ArithmeticEnv(questions_per_episode=0)


def test_splits_are_disjoint_and_deterministic(fresh_plugins):
    env = ArithmeticEnv(questions_per_episode=3, seed=7)
    train, test = env.dataset(200, "train"), env.dataset(200, "test")
    assert train == ArithmeticEnv(questions_per_episode=3, seed=7).dataset(200, "train")
    assert train != ArithmeticEnv(questions_per_episode=3, seed=8).dataset(200, "train")
    assert env.dataset(5, "train") == train[:5]  # a smaller dataset is a prefix of a larger one
    train_questions = {q for row in train for q in row["questions"]}
    test_questions = {q for row in test for q in row["questions"]}
    assert train_questions and test_questions and not train_questions & test_questions
    assert len({row["id"] for row in train + test}) == 400
    row = test[0]
    assert len(row["questions"]) == len(row["answers"]) == 3 and row["answer"] == row["answers"][-1]
    with pytest.raises(ValueError, match="splits 'train' and 'test'"):
        env.dataset(1, "validation")


def test_an_episode_through_reset_and_step(fresh_plugins):
    env = get_component("env", "arithmetic")(questions_per_episode=2)
    [sample] = env.dataset(1, "test")
    first, second = sample["questions"]

    async def episode():
        reset = await env.reset(sample)
        [calculator] = reset.tools
        assert [m.role for m in reset.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
        assert reset.messages[0].content == SYSTEM_PROMPT and reset.messages[-1].content == first
        assert '"name": "calculator"' in reset.messages[2].content  # the few-shot tool call
        state = reset.state

        expression = first.removeprefix("What is ").removesuffix("?")
        call = ToolCall("calculator", {"expression": expression}, id="call_0")
        result = await calculator.call(call.arguments)
        assert result.content == sample["answers"][0]
        # A tool turn: nothing from the env, the rollout shows the tool results.
        assert await env.step(state, ParsedTurn(text="", tool_calls=[call]), [result]) == EnvStep()
        asked = await env.step(state, ParsedTurn(text="", content=f"It is {result.content}."), [])
        assert ([m.content for m in asked.observation], asked.done) == ([second], False)
        done = await env.step(state, ParsedTurn(text="", content=f"The answer is {sample['answer']}."), [])
        assert (done.done, done.final_answer) == (True, sample["answer"])
        await env.close(state)
        return done.final_answer

    final_answer = asyncio.run(episode())
    reward = get_component("reward", "exact_match")()
    scored = asyncio.run(reward.score(Trajectory(sample_id=sample["id"], prompt_ids=[], final_answer=final_answer), sample))
    assert scored.value == 1.0


def test_without_tools_the_few_shot_turns_answer_directly(fresh_plugins):
    env = ArithmeticEnv(use_tools=False)
    reset = asyncio.run(env.reset({"question": "What is 2+2?"}))
    assert reset.tools == [] and reset.messages[0].content == NO_TOOLS_PROMPT
    assert [m.content for m in reset.messages[1:]] == ["What is 12*7?", "84", "What is 3+5?", "8", "What is 2+2?"]
    with pytest.raises(ValueError, match="needs samples with 'questions'"):
        asyncio.run(env.reset({"prompt": "?"}))
