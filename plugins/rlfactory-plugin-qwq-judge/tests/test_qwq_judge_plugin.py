"""The installed plugin is found through its entry point by the real plugin manager.

Needs the distribution installed (``pip install -e plugins/rlfactory-plugin-qwq-judge``;
``make install`` does it), as every plugin does to be found at all.
"""

from __future__ import annotations

import pytest

import rlfactory_qwq_judge
from rlfactory_core import ConfigError, UnknownComponentError, check_component, get_component
from rlfactory_core.testing import assert_discovered, components, installed_plugins
from rlfactory_qwq_judge import QwQJudgeReward

DIST = "rlfactory-plugin-qwq-judge"


@pytest.fixture
def fresh_plugins():
    """The real plugin manager, reloaded from the installed entry points, reset afterwards."""
    with installed_plugins() as pm:
        yield pm


def test_the_plugin_is_discovered_through_its_entry_point():
    # Strict mode, the plugin loaded alone: any import, hook or registration problem raises.
    assert assert_discovered(DIST, {"reward": ["qwq_judge"]}, plugin=rlfactory_qwq_judge).name == "qwq_judge"


def test_reward_is_registered_through_the_plugin_manager(fresh_plugins):
    component = components("reward")["qwq_judge"]
    assert (component.kind, component.plugin, component.obj) == ("reward", "qwq_judge", QwQJudgeReward)
    assert component.description
    assert get_component("reward", "qwq_judge") is QwQJudgeReward


def test_reward_is_absent_when_external_plugins_are_disabled():
    with installed_plugins(load=""), pytest.raises(UnknownComponentError, match="qwq_judge"):
        get_component("reward", "qwq_judge")


def test_reward_satisfies_the_interface():
    check_component("reward", QwQJudgeReward)


async def test_core_reward_layer_counts_an_unreadable_verdict_as_a_reward_error(
        fresh_plugins, scripted_server, requests_seen, make_trajectory):
    """Built from config by name, next to exact_match: a reply without a score is the
    judge's error, which the core's reward layer counts and replaces with the fallback."""
    rewards = pytest.importorskip("rlfactory_core.rewards", reason="the core's reward layer is not there")
    from rlfactory_core.testing import RewardSpec

    options = {"backend": "openai", "model": "judge", "base_url": scripted_server.base_url("/reply/unreadable/0")}
    layer = rewards.build_reward_layer([RewardSpec(name="exact_match"),
                                        RewardSpec(name="qwq_judge", weight=0.5, fallback=0.1, options=options)])
    trajectory = make_trajectory("Paris")
    try:
        batch = await layer.score([trajectory], [{"question": "Capital of France?", "answer": "Paris"}])
    finally:
        await layer.close()
    assert batch.errors["qwq_judge"] == 1
    assert batch.totals == [pytest.approx(1.0 + 0.5 * 0.1)]
    [error] = batch.reward_errors[0]
    assert error.startswith("qwq_judge: JudgeOutputError: no score found in the judge's reply: 'I cannot decide")
    assert len(requests_seen) == 1


def test_core_reward_layer_reports_bad_options_with_the_others(fresh_plugins):
    rewards = pytest.importorskip("rlfactory_core.rewards", reason="the core's reward layer is not there")
    from rlfactory_core.testing import RewardSpec

    with pytest.raises(ConfigError) as info:
        rewards.build_reward_layer([RewardSpec(name="qwq_judge", options={"backend": "openai", "model": "m"})])
    assert info.value.errors == [
        "rewards[0] (qwq_judge): base_url is required for backend openai: the server's API root such as "
        "http://127.0.0.1:8000/v1, got None"]
