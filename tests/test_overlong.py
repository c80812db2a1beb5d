"""Overlong trajectories (rlfactory_core.training.overlong): DAPO's overlong filtering and soft
overlong penalty, as pure functions against hand-computed values, in the agent loop's records,
in the batch, and through a whole run."""

import asyncio
import json
from collections import Counter

import pytest
import torch

from rlfactory_arithmetic import ArithmeticEnv
from rlfactory_core.config import ConfigError, load_config
from rlfactory_core.metrics import read_metrics
from rlfactory_core.models import load_tokenizer
from rlfactory_core.rewards import ScoredBatch
from rlfactory_core.training.batch import build_batch
from rlfactory_core.training.grpo import aggregate
from rlfactory_core.training.overlong import (
    cut_off,
    overlong_metrics,
    soft_overlong_penalty,
    trajectory_length,
    with_overlong_penalty,
)
from rlfactory_core.types import Segment, Trajectory


def trajectory(group: int, model_tokens: int, *, stop: str = "no_tool_call", last_turn_cut: bool = False,
               prompt: int = 4) -> Trajectory:
    t = Trajectory(sample_id=f"s{group}", prompt_ids=list(range(1, prompt + 1)), stop_reason=stop, group=group)
    t.segments.append(Segment("model", [7] * model_tokens, [-0.5] * model_tokens))
    t.metadata["last_turn_cut"] = last_turn_cut
    return t


def scored(totals: list[float]) -> ScoredBatch:
    return ScoredBatch(totals=list(totals), components=[{"r": t} for t in totals], correct=[None] * len(totals),
                       errors=Counter(), applied=Counter({"r": len(totals)}))


def test_soft_overlong_penalty_by_hand():
    # max 100 tokens, buffer 20: free up to 80, then linear to -1 at 100
    assert soft_overlong_penalty(50, 100, 20) == 0.0
    assert soft_overlong_penalty(80, 100, 20) == 0.0
    assert soft_overlong_penalty(85, 100, 20) == pytest.approx(-0.25)
    assert soft_overlong_penalty(90, 100, 20) == pytest.approx(-0.5)
    assert soft_overlong_penalty(100, 100, 20) == pytest.approx(-1.0)
    assert soft_overlong_penalty(130, 100, 20) == pytest.approx(-1.0)  # beyond the limit: the whole penalty
    assert soft_overlong_penalty(90, 100, 20, factor=0.4) == pytest.approx(-0.2)
    assert soft_overlong_penalty(10_000, 100, 0) == 0.0  # no buffer: off
    with pytest.raises(ValueError, match="buffer"):
        soft_overlong_penalty(90, 100, 200)


def test_a_trajectory_is_cut_off_when_a_limit_ended_it():
    assert not cut_off(trajectory(0, 5))
    assert not cut_off(trajectory(0, 5, stop="env_done"))
    assert cut_off(trajectory(0, 5, stop="token_budget"))
    assert cut_off(trajectory(0, 5, stop="max_turns"))
    assert cut_off(trajectory(0, 5, last_turn_cut=True))  # its answer was stopped mid-way
    assert trajectory_length(trajectory(0, 5, prompt=3)) == 8


def test_the_agent_loop_records_turns_stopped_at_max_tokens(default_model_dir):
    from rlfactory_core.default_plugins.tool_managers import ConcurrentToolManager
    from rlfactory_core.plugins import get_component
    from rlfactory_core.rollout import ChatTemplate, RolloutConfig, TemplateFamily, rollout
    from rlfactory_core.testing import ScriptedBackend

    tokenizer = load_tokenizer(default_model_dir)
    chat, parser = ChatTemplate(tokenizer), get_component("parser", "qwen3")
    config = RolloutConfig(max_turns=3, max_tokens_per_turn=12, max_trajectory_tokens=1024)

    def episode(script):
        env = ArithmeticEnv()
        manager = ConcurrentToolManager(env.tools, timeout_s=60.0)
        [t] = asyncio.run(rollout(env.dataset(1), env=env, family=TemplateFamily(chat, parser), tool_manager=manager,
                                  backend=ScriptedBackend(tokenizer, script), config=config))
        return t

    # a rambling answer, cut at 12 tokens: the episode ends on a cut turn
    rambling = episode(lambda text: "The answer is " + "very " * 40)
    assert rambling.metadata["cut_turns"] == 1 and rambling.metadata["last_turn_cut"] and cut_off(rambling)
    # a tool call cut mid-way (a parse error shown to the model), then a finished answer
    replies = iter(['<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + "1+" * 40 + '1"}}',
                    "The answer is 2."])
    recovered = episode(lambda text: next(replies))
    assert recovered.num_turns == 2, recovered.messages
    assert recovered.metadata["cut_turns"] == 1 and not recovered.metadata["last_turn_cut"]
    assert not cut_off(recovered)


def test_the_penalty_is_added_to_the_training_reward_and_logged():
    config = load_config([], ["rollout.max_trajectory_tokens=100", "rollout.max_tokens_per_turn=50",
                              "grpo.overlong_buffer=20", "grpo.overlong_penalty=0.5"])
    batch = [trajectory(0, 50), trajectory(0, 86), trajectory(1, 200, stop="token_budget")]  # 54, 90, 204 tokens
    out = with_overlong_penalty(batch, scored([1.0, 1.0, 0.0]), config)
    assert out.totals == pytest.approx([1.0, 1.0 - 0.25, -0.5])
    assert [c["overlong_penalty"] for c in out.components] == pytest.approx([0.0, -0.25, -0.5])
    assert out.components[0]["r"] == 1.0 and out.applied["overlong_penalty"] == 3
    assert out.metrics("reward")["reward/overlong_penalty"] == pytest.approx(-0.25)
    off = load_config([], [])
    same = scored([1.0])
    assert with_overlong_penalty([trajectory(0, 5000)], same, off) is same  # off by default


def test_overlong_filtering_empties_the_loss_mask_of_cut_off_trajectories_only():
    rows = [trajectory(0, 6), trajectory(0, 6, stop="max_turns"), trajectory(1, 6, last_turn_cut=True),
            trajectory(1, 6)]
    rewards = [1.0, 0.0, 0.0, 1.0]
    plain = build_batch(rows, rewards, load_config([], []), pad_id=0)
    filtered = build_batch(rows, rewards, load_config([], ["grpo.overlong_filter=true"]), pad_id=0)
    assert filtered["loss_mask"].sum(-1).tolist() == [6, 0, 0, 6]
    assert plain["loss_mask"].sum(-1).tolist() == [6, 6, 6, 6]
    # the group baselines still see every reward: the kept trajectories' advantages are unchanged
    assert torch.equal(filtered["sequence_advantages"], plain["sequence_advantages"])
    assert torch.equal(filtered["advantages"][0], plain["advantages"][0])
    config = load_config([], ["grpo.overlong_filter=true"])
    assert overlong_metrics(rows, config) == {"rollout/cut_off": 0.5, "batch/overlong_filtered": 0.5}
    assert overlong_metrics(rows, load_config([], [])) == {"rollout/cut_off": 0.5}


def test_a_filtered_row_is_not_a_sequence_the_seq_mean_losses_average_over():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the third row was filtered
    assert aggregate(per_token, mask, "seq_mean_token_sum") == pytest.approx((6 + 4) / 2)
    assert aggregate(per_token, mask, "seq_mean_token_mean") == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "token_mean") == pytest.approx(10 / 4)


def test_a_buffer_as_long_as_the_trajectory_limit_is_a_config_error():
    with pytest.raises(ConfigError, match="overlong_buffer"):
        load_config([], ["rollout.max_trajectory_tokens=256", "rollout.max_tokens_per_turn=64",
                         "grpo.overlong_buffer=256"])
    with pytest.raises(ConfigError, match="overlong_penalty"):
        load_config([], ["grpo.overlong_penalty=-1"])


def test_a_run_with_both_options_filters_and_penalises_what_the_limit_cut(tmp_path, tiny_model_dir):
    """A whole run (local engine, real update of a tiny model) on a scripted policy that rambles
    past the per-turn limit on half of its answers: those are cut off, penalised, and masked."""
    from rlfactory_core.testing import ScriptedBackend, scripted_backend, train

    calls = iter(range(10_000))

    def policy(text):  # alternate: a short answer, then one the 24-token limit cuts
        return "The answer is 4." if next(calls) % 2 == 0 else "Let me think. " + "Hmm, " * 60

    run_dir = tmp_path / "run"
    config = load_config([], [
        "env=arithmetic", "backend=hf", f"model.name={tiny_model_dir}", f"run_dir={run_dir}", "train.steps=1",
        "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.overlong_filter=true", "grpo.overlong_buffer=200",
        "rollout.max_trajectory_tokens=400", "rollout.max_turns=1", "rollout.max_tokens_per_turn=24",
        "data.eval_size=2", "eval.every=0", "logging.live=off", "logging.tensorboard=false"])
    with scripted_backend(lambda path: ScriptedBackend(load_tokenizer(path), policy)):
        train(config)
    step = read_metrics(run_dir)[1]
    assert step["rollout/cut_off"] == 0.5 and step["batch/overlong_filtered"] == 0.5
    assert step["reward/overlong_penalty"] <= 0.0
    assert "eval/reward/overlong_penalty" not in step  # evaluation is not penalised
    # only the uncut half carried loss: 2 trajectories of the 4 sampled their tokens into the update
    tokens = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[1])["train/trained_tokens"]
    assert 0 < tokens <= 2 * 24
