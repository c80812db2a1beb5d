"""A step's batch from finished groups (rlfactory_core.training.assembly): dynamic sampling."""

import json
from collections import Counter

import pytest

from rlfactory_core.config import load_config
from rlfactory_core.hookspecs import hookimpl
from rlfactory_core.metrics import read_metrics
from rlfactory_core.rewards import ScoredBatch
from rlfactory_core.testing import registered_plugin, train
from rlfactory_core.training.assembly import BatchAssembler, group_filters, informative
from rlfactory_core.types import Trajectory


def rollout(groups: list[list[float]], tag: str):
    """Trajectories of ``len(groups)`` groups with the given totals, and their scores."""
    trajectories, totals = [], []
    for group, rewards in enumerate(groups):
        for k, total in enumerate(rewards):
            trajectories.append(Trajectory(sample_id=f"{tag}{group}.{k}", prompt_ids=[1], group=group))
            totals.append(total)
    scored = ScoredBatch(totals=totals, components=[{"r": t} for t in totals], correct=[None] * len(totals),
                         errors=Counter(), applied=Counter({"r": len(totals)}))
    return trajectories, scored


# the trajectories of rollout() have no segments: nothing written, no turn
LENGTHS = {"batch/generated_tokens_mean": 0.0, "batch/trained_tokens_mean": 0.0, "batch/generated_turns_mean": 0.0,
           "batch/trained_turns_mean": 0.0}


def test_length_bias_metrics_compare_what_was_generated_with_what_is_trained():
    from rlfactory_core.types import Segment

    trajectories, scored = rollout([[1.0, 1.0], [0.0, 1.0]], "a")
    for t, tokens in zip(trajectories, (2, 2, 6, 10)):  # the constant group (dropped) is the short one
        t.segments = [Segment("model", [5] * tokens, [-0.1] * tokens)]
    assembler = BatchAssembler(1, [informative])
    assembler.add(trajectories, scored)
    metrics = assembler.assemble().metrics
    assert metrics["batch/generated_tokens_mean"] == 5.0 and metrics["batch/trained_tokens_mean"] == 8.0
    assert metrics["batch/generated_turns_mean"] == metrics["batch/trained_turns_mean"]


def test_without_filters_every_group_is_kept_in_order():
    assembler = BatchAssembler(2)
    assembler.add(*rollout([[1.0, 1.0], [0.0, 1.0]], "a"))
    assert assembler.needed == 0
    batch = assembler.assemble()
    assert [t.sample_id for t in batch.trajectories] == ["a0.0", "a0.1", "a1.0", "a1.1"]
    assert [t.group for t in batch.trajectories] == [0, 0, 1, 1]
    assert batch.scored.totals == [1.0, 1.0, 0.0, 1.0]
    assert batch.metrics == {"batch/groups_sampled": 2.0, "batch/groups_kept": 2.0, "batch/extra_rollouts": 0.0,
                             **LENGTHS}


def test_groups_without_a_reward_difference_are_dropped_and_the_batch_is_filled_from_more_rollouts():
    assembler = BatchAssembler(2, [informative])
    assembler.add(*rollout([[1.0, 1.0], [0.0, 1.0]], "a"))  # a0: constant, dropped
    assert assembler.needed == 1
    assembler.add(*rollout([[0.0, 0.0], [2.0, 0.5], [1.0, 0.0]], "b"))  # b1 fills it; b2 is not needed
    batch = assembler.assemble()
    assert [t.sample_id for t in batch.trajectories] == ["a1.0", "a1.1", "b1.0", "b1.1"]
    assert [t.group for t in batch.trajectories] == [0, 0, 1, 1]  # renumbered: no clash between rollouts
    assert batch.scored.totals == [0.0, 1.0, 2.0, 0.5]
    assert batch.scored.components == [{"r": 0.0}, {"r": 1.0}, {"r": 2.0}, {"r": 0.5}]
    assert batch.metrics == {"batch/groups_sampled": 5.0, "batch/groups_kept": 2.0, "batch/extra_rollouts": 1.0,
                             **LENGTHS}


def test_the_filters_judge_a_group_by_the_members_that_will_train():
    """A group whose rewards differ only because a member timed out (its 0 is no verdict, and
    it is masked) has nothing to learn: dynamic sampling drops it; a group left with two
    different rewards after the mask is kept."""
    trajectories, scored = rollout([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]], "a")
    scored.outcomes = ["answered", "tool_timeout", "answered", "answered", "tool_timeout", "answered"]
    masked = load_config([], []).failures.masked
    assembler = BatchAssembler(2, [informative], masked)
    assembler.add(trajectories, scored)
    assert assembler.needed == 1  # group a0 is (1, 1) once the timeout is left out: dropped
    batch = assembler.assemble()
    # the masked member stays in the batch (no loss, no baseline), for its records
    assert [t.sample_id for t in batch.trajectories] == ["a1.0", "a1.1", "a1.2"]
    everything = BatchAssembler(2, [informative])  # without the run's mask: as before
    everything.add(*rollout([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]], "a"))
    assert everything.needed == 0


def test_when_no_group_is_informative_the_first_rollout_is_trained_on_as_without_the_filter():
    assembler = BatchAssembler(2, [informative])
    assembler.add(*rollout([[1.0, 1.0], [0.0, 0.0]], "a"))
    assembler.add(*rollout([[3.0, 3.0], [2.0, 2.0]], "b"))
    batch = assembler.assemble()
    assert [t.sample_id for t in batch.trajectories] == ["a0.0", "a0.1", "a1.0", "a1.1"]
    assert batch.metrics["batch/groups_kept"] == 0.0 and batch.metrics["batch/groups_sampled"] == 4.0


def test_scored_rows_keep_their_errors_and_applied_counts_when_selected_and_joined():
    scored = ScoredBatch(totals=[1.0, 0.0, 0.5], components=[{"dist:judge": 1.0}, {}, {"dist:judge": 0.5}],
                         correct=[True, None, False], errors=Counter({"dist:judge": 1}),
                         applied=Counter({"dist:judge": 2}), reward_errors=[[], ["dist:judge: timed out"], []])
    one = scored.select([1])
    assert one.errors == {"dist:judge": 1} and one.applied == {"dist:judge": 0}  # a qualified name, colon and all
    both = ScoredBatch.concat([scored.select([0]), scored.select([2])])
    assert both.totals == [1.0, 0.5] and both.correct == [True, False] and both.applied == {"dist:judge": 2}
    assert both.errors == {} and both.reward_errors == [[], []] and both.turn_rewards == [[], []]


def test_the_filter_is_on_only_with_dynamic_sampling():
    assert group_filters(load_config([], [])) == []
    assert group_filters(load_config([], ["grpo.dynamic_sampling=true"])) == [informative]


class EvenSamplesScoreNothing:
    """Rewards that differ only for some prompts: the arithmetic samples with an odd number."""

    name = "odd_samples_only"
    description = "0 for even-numbered samples; the answer's length for odd ones"

    def score(self, trajectory, sample):
        if int(str(sample["id"]).rsplit("-", 1)[-1]) % 2 == 0:
            return 0.0
        return float(sum(len(s.token_ids) for s in trajectory.segments if s.kind == "model") % 5)


class Registers:
    @hookimpl
    def rlfactory_register_rewards(self, register):
        register(EvenSamplesScoreNothing)


@pytest.mark.slow
def test_a_run_with_dynamic_sampling_trains_on_informative_groups_and_advances_past_every_prompt(
        tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    config = load_config([], [
        "env=arithmetic", "backend=hf", f"model.name={tiny_model_dir}", f"run_dir={run_dir}", "train.steps=2",
        "grpo.prompts_per_step=2", "grpo.group_size=3", "grpo.dynamic_sampling=true", "grpo.max_extra_rollouts=3",
        "data.eval_size=2", "eval.every=0", "rollout.max_turns=1", "rollout.max_tokens_per_turn=12",
        "rollout.sampling.temperature=1.0", "logging.live=off", "logging.tensorboard=false",
        'rewards=[{"name": "odd_samples_only"}]'])
    with registered_plugin(Registers()):
        train(config)
    records = read_metrics(run_dir)[1:]
    position = 0
    for record in records:
        sampled, kept = record["batch/groups_sampled"], record["batch/groups_kept"]
        assert sampled == len(record["samples"]) and kept <= 2 and sampled <= 2 + 3 * 2
        assert record["batch/extra_rollouts"] <= 3
        position += len(record["samples"])
        if kept == 2:  # the batch holds informative groups only
            assert record["reward/constant_groups"] == 0.0
    assert any(r["batch/groups_sampled"] > r["batch/groups_kept"] for r in records)  # even prompts were dropped
    saved = json.loads((run_dir / "checkpoints" / "step-000002" / "state.json").read_text())
    assert saved["position"] == position  # every prompt rolled out moves the data on, kept or not
