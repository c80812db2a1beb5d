"""The installed plugin is found through its entry point by the real plugin manager.

Needs the distribution installed (``pip install -e plugins/rlfactory-plugin-qwq-judge``;
``make install`` does it), as every plugin does to be found at all.
"""

from __future__ import annotations

import importlib.metadata

import pytest

import rlfactory_qwq_judge
from rlfactory_core import plugins
from rlfactory_core.errors import ConfigError, UnknownComponentError
from rlfactory_core.interfaces import check_component
from rlfactory_qwq_judge import QwQJudgeReward

DIST = "rlfactory-plugin-qwq-judge"


@pytest.fixture
def fresh_plugins(monkeypatch):
    """The real plugin manager, reloaded from the installed entry points, reset afterwards."""
    monkeypatch.delenv(plugins.LOAD_ENV, raising=False)
    monkeypatch.delenv(plugins.STRICT_ENV, raising=False)
    plugins.reset_plugins()
    yield monkeypatch
    plugins.reset_plugins()


def test_distribution_declares_the_entry_point():
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{DIST} is not installed; run: pip install -e plugins/rlfactory-plugin-qwq-judge")
    [entry_point] = [ep for ep in dist.entry_points if ep.group == plugins.ENTRY_POINT_GROUP]
    assert (entry_point.name, entry_point.value) == ("qwq_judge", "rlfactory_qwq_judge")
    assert entry_point.load() is rlfactory_qwq_judge


@pytest.mark.parametrize("allowed", ["qwq_judge", DIST])
@pytest.mark.exercises_hook("rlfactory_register_rewards")
def test_reward_is_registered_through_the_plugin_manager(fresh_plugins, allowed):
    # Strict mode turns any import, hook or registration problem of a loaded plugin into an
    # exception; the allow-list keeps other installed plugins out of this test.
    fresh_plugins.setenv(plugins.STRICT_ENV, "1")
    fresh_plugins.setenv(plugins.LOAD_ENV, allowed)
    component = plugins.components("reward")["qwq_judge"]
    assert (component.kind, component.plugin, component.obj) == ("reward", "qwq_judge", QwQJudgeReward)
    assert component.description
    assert plugins.get_component("reward", "qwq_judge") is QwQJudgeReward
    [info] = [info for info in plugins.plugin_infos() if info.name == "qwq_judge"]
    assert info.status == "ok", info.problems
    assert (info.distribution, info.builtin) == (DIST, False)
    assert info.hooks == ["rlfactory_register_rewards"]
    assert info.components == {"reward": ["qwq_judge"]}


def test_reward_is_absent_when_external_plugins_are_disabled(fresh_plugins):
    fresh_plugins.setenv(plugins.LOAD_ENV, "")
    with pytest.raises(UnknownComponentError, match="qwq_judge"):
        plugins.get_component("reward", "qwq_judge")


def test_reward_satisfies_the_interface():
    check_component("reward", QwQJudgeReward)


@pytest.mark.exercises_hook("rlfactory_register_rewards")
async def test_core_reward_layer_counts_an_unreadable_verdict_as_a_reward_error(
        fresh_plugins, scripted_server, requests_seen, make_trajectory):
    """Built from config by name, next to exact_match: a reply without a score is the
    judge's error, which the core's reward layer counts and replaces with the fallback."""
    rewards = pytest.importorskip("rlfactory_core.rewards", reason="the core's reward layer is not there")
    from rlfactory_core.config import RewardSpec

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
    [error] = trajectory.metadata["reward_errors"]
    assert error.startswith("qwq_judge: JudgeOutputError: no score found in the judge's reply: 'I cannot decide")
    assert len(requests_seen) == 1


def test_core_reward_layer_reports_bad_options_with_the_others(fresh_plugins):
    rewards = pytest.importorskip("rlfactory_core.rewards", reason="the core's reward layer is not there")
    from rlfactory_core.config import RewardSpec

    with pytest.raises(ConfigError) as info:
        rewards.build_reward_layer([RewardSpec(name="qwq_judge", options={"backend": "openai", "model": "m"})])
    assert info.value.errors == [
        "rewards[0] (qwq_judge): base_url is required for backend openai: the server's API root such as "
        "http://127.0.0.1:8000/v1, got None"]
