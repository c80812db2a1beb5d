"""The reward layer (rlfactory_core.rewards) and the built-in rule rewards, through the real
plugin manager; then all three kinds of reward in a real training step."""

import asyncio
import threading

import pytest

from rlfactory_core.config import load_config
from rlfactory_core.default_plugins.rewards import ExactMatchReward, FormatReward, TokenF1Reward, token_f1
from rlfactory_core.default_plugins.tool_managers import ConcurrentToolManager
from rlfactory_core.errors import ConfigError
from rlfactory_core.hookspecs import hookimpl
from rlfactory_core.plugins import get_component
from rlfactory_core.rewards import build_reward_layer
from rlfactory_core.testing import registered_plugin
from rlfactory_core.types import Message, RewardOutput, Segment, Trajectory


def trajectory(answer=None, turns=1, reply=None, **metadata):
    t = Trajectory(sample_id="s", prompt_ids=[1], final_answer=answer)
    for _ in range(turns):
        t.segments.append(Segment("model", [2], [-0.1]))
    t.messages = [Message("user", "q"), Message("assistant", reply if reply is not None else str(answer))]
    t.turn_rewards = [0.0] * turns
    t.metadata.update(metadata)
    return t


def specs(*rewards):
    """The config's rewards list, validated as a run's config would be."""
    return load_config([], [f"rewards={list(rewards)}"]).rewards


class Plugin:
    """Test rewards, registered like an installed plugin's."""

    def __init__(self, *classes):
        self.classes = classes

    @hookimpl
    def rlfactory_register_rewards(self, register):
        for cls in self.classes:
            register(cls)


class Length:
    name, description = "length", "answer length (sync, runs in a thread)"

    def score(self, trajectory, sample):
        return RewardOutput(value=float(len(trajectory.final_answer or "")), components={"chars": 1.0})


class OnlyMath:
    name, description = "only_math", "applies to math samples only"

    async def score(self, trajectory, sample):
        return 1.0 if sample.get("task") == "math" else None


class Broken:
    name, description = "broken", "fails in every way it can, by the sample's 'fail' key"

    async def score(self, trajectory, sample):
        kind = sample.get("fail")
        if kind == "raise":
            raise RuntimeError("judge exploded")
        if kind == "slow":
            await asyncio.sleep(30)
        if kind == "nan":
            return float("nan")
        if kind == "text":
            return "0.5"
        if kind == "component":
            return RewardOutput(value=1.0, components={"judge": "abc"})
        if kind == "nan_component":
            return RewardOutput(value=1.0, components={"judge": float("nan")})
        return 0.25


class Stepwise:
    name, description = "stepwise", "a process reward: 1 per model turn"

    async def score(self, trajectory, sample):
        return RewardOutput(value=0.0, turn_rewards=[1.0] * trajectory.num_turns)


async def test_rewards_compose_with_weights_and_skip_samples_they_do_not_apply_to():
    with registered_plugin(Plugin(Length, OnlyMath)):
        layer = build_reward_layer(specs({"name": "exact_match", "weight": 2.0}, {"name": "length", "weight": 0.5},
                                         {"name": "only_math"}))
        samples = [{"answer": "Paris", "task": "math"}, {"answer": "Rome"}, {"task": "chat"}]
        scored = await layer.score([trajectory("Paris"), trajectory("Oslo"), trajectory("hi")], samples)
    # 2 x exact match + 0.5 x length + only_math where it applies; exact_match skips the sample
    # without gold answers
    assert scored.totals == [2 * 1 + 0.5 * 5 + 1, 0.5 * 4, 0.5 * 2]
    assert scored.correct == [True, False, None]
    metrics = scored.metrics("reward")
    assert metrics["reward/exact_match"] == 0.5  # mean over the two samples it applied to
    assert metrics["reward/exact_match/applied"] == pytest.approx(2 / 3)
    assert metrics["reward/only_math"] == 1.0 and metrics["reward/only_math/applied"] == pytest.approx(1 / 3)
    assert metrics["reward/length"] == pytest.approx(11 / 3) and "reward/length/applied" not in metrics
    assert metrics["reward/length/chars"] == 1.0  # a component of a reward, under its name
    assert metrics["reward/accuracy"] == 0.5  # of the two trajectories a reward judged
    assert metrics["reward/errors"] == 0.0


async def test_sync_rewards_run_in_a_thread_without_blocking_the_loop():
    released = threading.Event()
    seen = {}

    class WaitsForTheLoop:  # sync: blocks its thread until an async reward has run
        name, description = "waits", "sync"

        def score(self, trajectory, sample):
            seen["thread"] = threading.get_ident()
            return 1.0 if released.wait(timeout=10) else 0.0

    class Releases:
        name, description = "releases", "async"

        async def score(self, trajectory, sample):
            await asyncio.sleep(0.05)
            released.set()
            return 0.0

    with registered_plugin(Plugin(WaitsForTheLoop, Releases)):
        layer = build_reward_layer(specs({"name": "waits"}, {"name": "releases"}))
        scored = await layer.score([trajectory("x")], [{}])
    assert scored.totals == [1.0]  # the loop ran the async reward while the sync one waited
    assert seen["thread"] != threading.get_ident()


async def test_each_reward_scores_at_most_max_concurrency_trajectories_at_once():
    running, peak = 0, 0

    class Counts:
        name, description = "counts", "records how many run at once"

        async def score(self, trajectory, sample):
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1
            return 1.0

    with registered_plugin(Plugin(Counts)):
        layer = build_reward_layer(specs({"name": "counts", "max_concurrency": 3}))
        scored = await layer.score([trajectory("x") for _ in range(10)], [{}] * 10)
    assert peak == 3 and scored.totals == [1.0] * 10


async def test_failing_slow_and_malformed_rewards_score_their_fallback_and_are_counted():
    with registered_plugin(Plugin(Broken)):
        layer = build_reward_layer(specs({"name": "broken", "timeout_s": 0.2, "fallback": -1.0},
                                         {"name": "exact_match"}))
        kinds = ["raise", "slow", "nan", "text", "component", "nan_component", None]
        trajectories = [trajectory("7") for _ in kinds]
        scored = await layer.score(trajectories, [{"fail": k, "answer": "7"} for k in kinds])
    assert scored.totals == [0.0] * 6 + [1.25]  # fallback -1 + exact match 1; the last is fine
    assert scored.errors == {"broken": 6}
    metrics = scored.metrics("reward")
    assert metrics["reward/errors"] == 6.0 and metrics["reward/errors/broken"] == 6.0
    assert "reward/broken/judge" not in metrics  # a refused output leaves no component behind
    reasons = [errors[0] for errors in scored.reward_errors[:6]]
    assert "judge exploded" in reasons[0]
    assert "timed out after 0.2 s" in reasons[1]
    assert "non-finite" in reasons[2]
    assert "returned str" in reasons[3] and "RewardOutput" in reasons[3]
    assert "component 'judge' is 'abc', not a finite number" in reasons[4]
    assert "component 'judge' is nan" in reasons[5]
    assert scored.reward_errors[6] == []
    assert all("reward_errors" not in t.metadata for t in trajectories)  # the trajectories are not changed


class Hangs:
    name, description = "hangs", "a sync reward whose first calls hang until released"
    release = threading.Event()

    def __init__(self):
        self.calls = 0

    def score(self, trajectory, sample):
        self.calls += 1
        if sample.get("hang"):
            self.release.wait(30)
        return 1.0


async def test_hung_sync_reward_calls_do_not_starve_the_later_ones():
    """A timed-out sync call keeps its thread (threads cannot be stopped); the next calls still
    get threads, so they score instead of queueing behind the hung ones until they time out."""
    with registered_plugin(Plugin(Hangs)):
        layer = build_reward_layer(specs({"name": "hangs", "max_concurrency": 2, "timeout_s": 0.3}))
        try:
            scored = await layer.score([trajectory("x") for _ in range(2)], [{"hang": True}] * 2)
            assert scored.errors == {"hangs": 2}
            scored = await layer.score([trajectory("x") for _ in range(6)], [{}] * 6)
            assert scored.errors == {} and scored.totals == [1.0] * 6
        finally:
            Hangs.release.set()
            await layer.close()


async def test_process_rewards_score_the_turns_they_name_without_changing_the_trajectory():
    with registered_plugin(Plugin(Stepwise)):
        layer = build_reward_layer(specs({"name": "stepwise", "weight": 0.5}))
        t = trajectory("x", turns=3)
        t.turn_rewards = [0.25, 0.0, 0.0]  # the env's own per-turn rewards
        scored = await layer.score([t, trajectory("y", turns=1)], [{}, {}])
    assert scored.turn_rewards == [[0.5, 0.5, 0.5], [0.5]]  # weighted; the trainer adds the env's
    assert t.turn_rewards == [0.25, 0.0, 0.0]


async def test_a_tool_verified_reward_calls_the_envs_tools_through_the_tool_manager():
    from rlfactory_arithmetic import ArithmeticEnv

    env = ArithmeticEnv(questions_per_episode=2)
    manager = ConcurrentToolManager(env.tools)
    layer = build_reward_layer(specs({"name": "arithmetic_verified"}), manager)
    t = trajectory("12")
    t.env_state = {"questions": ["What is 3*4?", "What is 10-3?"], "answers": ["It is 12.", "8"]}
    unverifiable = trajectory("1")  # an episode that never started has no state: not applicable
    scored = await layer.score([t, unverifiable], [{}, {}])
    assert scored.totals == [0.5, 0.0] and scored.correct == [False, None]  # 3*4 right, 10-3 wrong
    assert scored.components[1] == {}
    assert manager.metrics()["tool_calls/calculator"] == 2  # the reward's calls went through the manager

    no_tools = build_reward_layer(specs({"name": "arithmetic_verified"}), ConcurrentToolManager([]))
    scored = await no_tools.score([t], [{}])
    assert scored.errors == {"arithmetic_verified": 1}
    assert "use_tools=true" in scored.reward_errors[0][0]


def test_reward_config_problems_are_all_reported_at_once():
    with pytest.raises(ConfigError) as info:
        build_reward_layer(specs({"name": "no_such_reward"}, {"name": "exact_match", "options": {"colour": "red"}},
                                 {"name": "format", "options": {"answer_tags": False, "tool_calls": False}}))
    problems = info.value.errors
    assert len(problems) == 3
    assert "no_such_reward" in problems[0] and "exact_match" in problems[0]  # lists what is registered
    assert "colour" in problems[1]
    assert "at least one check" in problems[2]


# --------------------------------------------------------------------------- rule rewards


async def test_exact_match_over_gold_answer_lists_and_keys():
    reward = ExactMatchReward()
    hit = await reward.score(trajectory("the Eiffel Tower."), {"golden_answers": ["Eiffel tower", "la tour"]})
    assert (hit.value, hit.correct) == (1.0, True)
    miss = await reward.score(trajectory(None), {"answers": "Paris"})
    assert (miss.value, miss.correct) == (0.0, False)
    assert await reward.score(trajectory("x"), {"question": "?"}) is None  # no gold answers: does not apply
    assert (await ExactMatchReward(answer_key="target").score(trajectory("4"), {"target": 4})).value == 1.0


@pytest.mark.parametrize("prediction, gold, expected", [
    ("the cat sat", "cat sat", 1.0),  # articles are dropped by normalisation
    ("cat sat on mat", "cat sat", 2 * (2 / 4) * 1.0 / (2 / 4 + 1.0)),  # precision 1/2, recall 1: F1 2/3
    ("dog", "cat", 0.0),
    ("New York City", "new york", 2 * (2 / 3) * 1.0 / (2 / 3 + 1.0)),  # 0.8
    ("", "", 1.0),
    ("a", "cat", 0.0),  # normalises to nothing
])
def test_token_f1_against_hand_computed_values(prediction, gold, expected):
    assert token_f1(prediction, gold) == pytest.approx(expected)


async def test_f1_reward_takes_the_best_gold_answer():
    reward = TokenF1Reward()
    output = await reward.score(trajectory("New York City"), {"answer": ["Boston", "new york"]})
    assert output.value == pytest.approx(0.8)
    assert (await reward.score(trajectory(None), {"answer": "x"})).value == 0.0


@pytest.mark.parametrize("reply, ok", [
    ("<answer>Paris</answer>", True),
    ("<think>maybe <answer>Rome</answer>?</think> so <answer> Paris </answer>", True),  # thinking aside
    ("Paris", False),  # no tags
    ("<answer></answer>", False),  # empty
    ("<answer>Paris</answer><answer>Rome</answer>", False),  # two answers
    ("</answer>Paris<answer>", False),  # closed before opened
    ("<answer>Paris", False),  # never closed
])
async def test_format_reward_checks_answer_tags(reply, ok):
    output = await FormatReward(tool_calls=False).score(trajectory("Paris", reply=reply), {})
    assert output.value == float(ok) and output.components == {"answer_tags": float(ok)}


async def test_format_reward_checks_tool_calls():
    reward = FormatReward()
    clean = trajectory("x", reply="<answer>x</answer>", parse_errors=0, tool_errors={"timeout": 2})
    assert (await reward.score(clean, {})).value == 1.0  # a slow tool is not the model's format error
    bad_call = trajectory("x", reply="<answer>x</answer>", parse_errors=0, tool_errors={"invalid_arguments": 1})
    output = await reward.score(bad_call, {})
    assert output.value == 0.5 and output.components == {"answer_tags": 1.0, "tool_calls": 0.0}
    unparsed = trajectory("x", reply="no tags", parse_errors=1)
    assert (await reward.score(unparsed, {})).value == 0.0


def test_rule_rewards_are_registered():
    for name in ("exact_match", "f1", "format", "arithmetic_verified"):
        assert get_component("reward", name).name == name


# --------------------------------------------------------------------------- in a training step


@pytest.mark.slow
def test_rule_judge_and_tool_verified_rewards_run_in_a_training_step(tmp_path, tiny_model_dir):
    """One real step scored by a rule, the judge plugin (the default model as an in-process
    judge on the hf backend) and a tool-verified reward, each logged. The judge gets the
    plugin's few-shot yes/no prompt, which the 135M model answers with a verdict word (it
    ignores the default prompt's <score> request): the judge must really score, not only
    fail into its fallback. The policy's turns are scripted (an answer every time, sampled or
    greedy) and its update runs on the tiny model: the rewards' plumbing through a run is
    the point, not what the policy writes."""
    import json
    from pathlib import Path

    rlfactory_qwq_judge = pytest.importorskip("rlfactory_qwq_judge")
    from rlfactory_core.metrics import read_metrics
    from rlfactory_core.models import load_tokenizer
    from rlfactory_core.rollout import make_backend
    from rlfactory_core.testing import ScriptedBackend, scripted_backend, train

    def backend_for(path):  # the run builds two: the policy's (scripted) and the judge's (real)
        if Path(path).resolve() == Path(tiny_model_dir).resolve():
            return ScriptedBackend(load_tokenizer(path), lambda text: "The answer is 42.")
        return make_backend("hf", path)

    run_dir = tmp_path / "run"
    judge = {"backend": "hf", "model": "smollm2-135m-instruct", "max_tokens": 4,
             "prompt_template": rlfactory_qwq_judge.FEW_SHOT_YES_NO_TEMPLATE}
    rewards = [{"name": "exact_match"}, {"name": "format", "weight": 0.1, "options": {"answer_tags": False}},
               {"name": "arithmetic_verified", "weight": 0.5},
               {"name": "qwq_judge", "weight": 0.5, "max_concurrency": 4, "options": judge}]
    config = load_config([], [
        "backend=hf", f"model.name={tiny_model_dir}", "grpo.prompts_per_step=2", "grpo.group_size=2",
        "data.eval_size=2", "eval.every=1",
        "eval.save_samples=2", "rollout.max_turns=2", "rollout.max_tokens_per_turn=40",
        "logging.live=off", "logging.tensorboard=false", "train.steps=1", f"run_dir={run_dir}",
        f"rewards={json.dumps(rewards)}"])  # JSON is YAML: the multi-line template as it is
    with scripted_backend(backend_for):
        train(config)
    step = read_metrics(run_dir)[1]
    for name in ("exact_match", "format", "arithmetic_verified", "qwq_judge"):
        assert f"reward/{name}" in step, name
        assert f"eval/reward/{name}" in step, name
    assert "reward/format/tool_calls" in step
    assert step["reward/errors"] == step.get("reward/errors/qwq_judge", 0.0)  # only the judge may fail
    # The judge scored: fewer errors than the step's 4 trajectories, and its components (which
    # a trajectory gets only from a score, not from the fallback) show a judged answer.
    for prefix, trajectories in (("reward", 4), ("eval/reward", 2)):
        assert step.get(f"{prefix}/errors/qwq_judge", 0.0) < trajectories, prefix
        assert step[f"{prefix}/qwq_judge/no_answer"] < 1.0, prefix
    weights = {"exact_match": 1.0, "format": 0.1, "arithmetic_verified": 0.5, "qwq_judge": 0.5}
    total = sum(w * step[f"reward/{n}"] for n, w in weights.items())
    assert step["reward/mean"] == pytest.approx(total)  # every reward applied to every trajectory
