"""``train.mode=async`` (rlfactory_core.loops.asynchronous over rlfactory_core.stream) on the
local engine: real runs with the hf backend. With ``max_staleness: 0`` it is the synchronous
schedule through its own code (here with dynamic sampling and tools, on a scripted policy;
the golden trace, tests/test_golden_trace.py, checks the updates to float32 bounds); with more,
the measured version of every trained token keeps within the bound, and every prompt is
trained once across a stop and a resume."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import time

import pytest
import torch

from rlfactory_core.config import load_config
from rlfactory_core.data import batch_indices
from rlfactory_core.metrics import read_metrics
from rlfactory_core.records import RunRecords
from rlfactory_core.testing import ScriptedBackend
from rlfactory_core.training.checkpoint import latest_checkpoint

from test_one_step_off import _expected_samples, _trained_versions

TINY = ["env=arithmetic", "backend=hf", "train.mode=async", "grpo.tis_cap=2.0", "grpo.prompts_per_step=2",
        "grpo.group_size=2", "data.eval_size=2", "eval.every=0", "rollout.max_turns=2", "rollout.max_tokens_per_turn=8",
        "logging.tensorboard=false", "logging.live=off", "logging.record_train_groups=2", "train.lr=1e-3"]


def _weights(run_dir):
    from safetensors.torch import load_file

    directory = latest_checkpoint(run_dir) / "model"
    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


class SeededPolicy(ScriptedBackend):
    """The calculator's caller: a tool call for the question, then, after its result, the
    answer, wrong for half the sampling seeds (so some groups are informative, some
    constant: dynamic sampling rolls out more); each reply waits a time drawn from its seed, so
    groups finish out of sample order."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, [])

    async def generate(self, prompt_ids, sampling, **options):
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=True)
        question = text.rsplit("What is ", 1)[1]
        expression = re.match(r"(\d+[-+*]\d+)\?", question).group(1)
        await asyncio.sleep((sampling.seed * 7919 % 5) * 0.01)
        if "<tool_call>" not in question and "calculator" not in question:
            reply = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + expression + '"}}\n</tool_call>'
        else:
            wrong = random.Random(sampling.seed).random() < 0.5
            reply = f"The answer is {eval(expression) + wrong}."  # noqa: S307
        self.script = [reply] * (len(self.prompts) + 1)
        return await super().generate(prompt_ids, sampling, **options)


def test_async_with_no_staleness_is_the_synchronous_run_with_tools_and_dynamic_sampling(tmp_path, tiny_model_dir):
    """Two turns a trajectory (the calculator, then the answer); dynamic sampling rolls out
    more prompts when a group is constant; groups finish out of order. The same batches, in
    sample order, the same updates, bit for bit."""
    from rlfactory_core.models import load_tokenizer
    from rlfactory_core.testing import scripted_backend, train

    settings = ["env=arithmetic", "backend=hf", "grpo.prompts_per_step=3", "grpo.group_size=3", "train.steps=3",
                "grpo.dynamic_sampling=true", "grpo.max_extra_rollouts=2", "rollout.max_turns=3",
                "rollout.max_tokens_per_turn=48", "data.eval_size=2", "eval.every=0", "train.bf16=false",
                "train.lr=1e-3", "logging.tensorboard=false", "logging.live=off", "logging.record_train_groups=3",
                f"model.name={tiny_model_dir}"]
    runs = {}
    for name, extra in (("sync", []), ("async", ["train.mode=async", "train.max_staleness=0"])):
        runs[name] = tmp_path / name
        with scripted_backend(lambda path: SeededPolicy(load_tokenizer(path))):
            train(load_config([], [*settings, *extra, f"run_dir={runs[name]}"]))
    metrics = {name: {r["step"]: r for r in read_metrics(run)} for name, run in runs.items()}
    for step in (1, 2, 3):
        sync, asynchronous = metrics["sync"][step], metrics["async"][step]
        assert sync["samples"] == asynchronous["samples"]
        for key in ("batch/groups_sampled", "batch/groups_kept", "batch/extra_rollouts", "rollout/tool_calls",
                    "reward/mean", "train/trained_tokens", "train/loss", "train/grad_norm"):
            assert sync[key] == asynchronous[key], (step, key)
        records = {name: RunRecords(run) for name, run in runs.items()}
        rows = records["sync"].list("train", step)
        assert [r["sample_id"] for r in rows] == [r["sample_id"] for r in records["async"].list("train", step)]
        for row in rows:
            a, b = (records[name].trajectory("train", step, row["index"]) for name in ("sync", "async"))
            assert a["sequences"][0]["token_ids"] == b["sequences"][0]["token_ids"]
            assert a["sequences"][0]["policy_version"] == b["sequences"][0]["policy_version"]
    # what the run is made of: tool calls, constant groups dropped and made up for
    assert all(metrics["sync"][step]["rollout/tool_calls"] > 0 for step in (1, 2, 3))
    assert sum(metrics["sync"][step]["batch/extra_rollouts"] for step in (1, 2, 3)) > 0
    sync_weights, async_weights = _weights(runs["sync"]), _weights(runs["async"])
    assert all(torch.equal(sync_weights[name], async_weights[name]) for name in sync_weights)


@pytest.mark.parametrize("staleness", [1, 2])
def test_no_trained_token_is_older_than_max_staleness(tmp_path, tiny_model_dir, staleness):
    from rlfactory_core.testing import train

    run_dir = tmp_path / "run"
    steps = 4
    train(load_config([], [*TINY, f"train.max_staleness={staleness}", f"train.steps={steps}",
                           f"model.name={tiny_model_dir}", f"run_dir={run_dir}"]))
    records = {r["step"]: r for r in read_metrics(run_dir)}
    # no dynamic sampling: the chunks take the prompts in order, each trained once
    assert [s for step in range(1, steps + 1) for s in records[step]["samples"]] == _expected_samples(run_dir, steps)
    for step in range(1, steps + 1):
        ages = [(step - 1) - v for v in _trained_versions(run_dir, step)]  # no cold start: V(step) = step - 1
        assert ages and 0 <= min(ages) and max(ages) <= staleness, (step, ages)
        stale = sum(1 for a in ages if a > 0) / len(ages)
        assert abs(records[step]["train/stale_token_fraction"] - stale) < 1e-6
        # nothing dropped for its age: the step trains every trajectory generated for it
        for what in ("tokens", "turns"):
            assert records[step][f"batch/trained_{what}_mean"] == records[step][f"batch/generated_{what}_mean"]
        histogram = {int(k.rsplit("_", 1)[1]): v for k, v in records[step].items() if k.startswith("staleness/tokens_")}
        assert abs(sum(histogram.values()) - 1) < 1e-6 and max(histogram) <= staleness
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert (state["step"], state["position"], state["policy_version"]) == (steps, 2 * steps, steps)
    assert "trained_ahead" not in state


def test_a_stop_drops_the_chunks_in_flight_and_a_resume_trains_each_prompt_once(tmp_path, tiny_model_dir,
                                                                                  monkeypatch):
    from rlfactory_core.engines import local as local_engine
    from rlfactory_core.testing import TrainingInterrupted, train
    from rlfactory_core.training.update import update_policy

    calls = []

    def interrupted_update(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # step 2's update: steps 3 and 4 are rolling out ahead
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        return update_policy(*args, **kwargs)

    run_dir = tmp_path / "run"
    config = load_config([], [*TINY, "train.max_staleness=2", "train.steps=5", "checkpoint.every=1000",
                              f"model.name={tiny_model_dir}", f"run_dir={run_dir}"])
    monkeypatch.setattr(local_engine, "update_policy", interrupted_update)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(config)
    assert stopped.value.message.startswith("step 2 is saved")
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert (state["step"], state["position"]) == (2, 4)  # the prompts in flight are not counted
    monkeypatch.setattr(local_engine, "update_policy", update_policy)
    train(config.model_copy(update={"run_dir": str(run_dir)}), resume=run_dir)
    records = {r["step"]: r for r in read_metrics(run_dir)}
    assert sorted(records) == [0, 1, 2, 3, 4, 5]
    assert [s for step in range(1, 6) for s in records[step]["samples"]] == _expected_samples(run_dir, 5)


def test_the_data_position_passes_prompts_only_once_all_before_them_are_trained():
    """A dynamic-sampling attempt of step k takes prompts after step k+1's first chunk: when
    the run stops with step k+1 untrained, the checkpoint keeps the data position before it
    and the prompts trained past it."""
    from rlfactory_core.data import indices_at, untrained_positions
    from rlfactory_core.run import Run

    run = Run.__new__(Run)
    run.position, run.trained_ahead = 0, set()
    run.mark_trained([0, 1, 4, 5])  # step 1: its first chunk (0, 1), then an attempt (4, 5); 2, 3 in flight
    assert (run.position, run.trained_ahead) == (2, {4, 5})
    run.mark_trained([2, 3])
    assert (run.position, run.trained_ahead) == (6, set())
    assert untrained_positions(2, 4, {4, 5}) == [2, 3, 6, 7]
    assert indices_at(10, [2, 3, 6, 7], seed=0) == batch_indices(10, 2, 0, 2) + batch_indices(10, 2, 0, 6)
    assert indices_at(10, list(range(2, 14)), seed=0) == batch_indices(10, 12, 0, 2)  # across an epoch


def test_every_schedule_sizes_a_steps_attempts_by_one_rule():
    """``steps.attempt_size``, which the synchronous rollout and the async stream both follow:
    the batch's prompts first, then what the batch still needs, ``max_extra_rollouts`` times."""
    from rlfactory_core.steps import attempt_size
    from rlfactory_core.training.assembly import BatchAssembler

    on = load_config([], ["grpo.prompts_per_step=4", "grpo.dynamic_sampling=true", "grpo.max_extra_rollouts=2"])
    off = load_config([], ["grpo.prompts_per_step=4", "grpo.dynamic_sampling=false"])
    full, short = BatchAssembler(0), BatchAssembler(3)
    assert [attempt_size(on, short, a) for a in range(4)] == [4, 3, 3, 0]
    assert [attempt_size(off, short, a) for a in range(3)] == [4, 0, 0]
    assert [attempt_size(on, full, a) for a in range(3)] == [0, 0, 0]


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "async"])
def test_a_resumed_run_in_any_mode_skips_the_prompts_its_checkpoint_trained_ahead(tmp_path, tiny_model_dir, mode):
    """A checkpoint with ``trained_ahead`` (an async run stopped with a later prompt trained
    before an earlier one), resumed in any mode: the untrained prompt is rolled out, the
    trained one is not trained twice."""
    from rlfactory_core.testing import train

    run_dir = tmp_path / "run"
    config = load_config([], [*TINY, "train.max_staleness=1", "train.steps=1", f"model.name={tiny_model_dir}",
                              f"run_dir={run_dir}"])
    train(config)
    state_file = latest_checkpoint(run_dir) / "state.json"
    state = json.loads(state_file.read_text())
    assert state["position"] == 2
    state["trained_ahead"] = [3]  # as if position 3 had been trained with step 1, position 2 not
    state_file.write_text(json.dumps(state))
    resumed = config.model_copy(deep=True)
    resumed.train.mode, resumed.train.steps = mode, 3
    train(resumed, resume=run_dir)
    trained = [s for r in read_metrics(run_dir) if r["step"] >= 1 for s in r["samples"]]
    ids = _expected_samples(run_dir, 4)  # the data order, positions 0-7
    assert trained == ids[0:2] + [ids[2], ids[4], ids[5], ids[6]]  # position 3 skipped, none twice
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert (state["position"], state.get("trained_ahead")) == (7, None)


def test_async_needs_a_cap_when_tokens_can_be_stale():
    from rlfactory_core.preflight import preflight

    _, problems = preflight(overrides=["train.mode=async"])
    assert any(p.startswith("grpo.tis_cap: train.mode=async trains tokens up to") for p in problems)
    _, problems = preflight(overrides=["train.mode=async", "train.max_staleness=0"])
    assert not any(p.startswith("grpo.tis_cap") for p in problems)
    _, problems = preflight(overrides=["train.mode=async", "grpo.tis_cap=2", "engine=ray"])
    assert not problems  # colocated roles take turns


class ShortOrLong(ScriptedBackend):
    """Half the trajectories (by seed) answer at once, one turn; the others call the calculator
    first, two turns and several times the tokens, and their answer waits (up to a second and
    a half) for the next weight push: a push lands inside every long trajectory of a step
    rolled out ahead, whatever the machine's speed."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, [])

    async def generate(self, prompt_ids, sampling, **options):
        question = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=True).rsplit("What is ", 1)[1]
        expression = re.match(r"(\d+[-+*]\d+)\?", question).group(1)
        long = random.Random(sampling.seed).random() < 0.5
        if long and "calculator" in question:  # the answer turn
            version = self.weight_version
            for _ in range(75):
                if self.weight_version != version:
                    break
                await asyncio.sleep(0.02)
        if long and "calculator" not in question:
            reply = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + expression + '"}}\n</tool_call>'
        else:
            reply = f"The answer is {eval(expression)}."  # noqa: S307
        self.script = [reply] * (len(self.prompts) + 1)
        return await super().generate(prompt_ids, sampling, **options)


def test_the_length_metrics_flag_a_schedule_that_drops_groups_a_push_landed_in(tmp_path, tiny_model_dir,
                                                                                monkeypatch):
    """A test-only arm: an abort-at-push rule (drop every group a weight push landed in) drops
    the long trajectories most, and ``batch/trained_*`` falls below ``batch/generated_*``
    (our schedule trains every group it generated, and they agree: the staleness test)."""
    from rlfactory_core import stream
    from rlfactory_core.models import load_tokenizer
    from rlfactory_core.testing import scripted_backend, train

    def one_version_each(trajectories, totals):
        return all(len({s.policy_version for s in t.segments if s.kind == "model"}) == 1 for t in trajectories)

    settings = [*TINY, "train.max_staleness=2", "train.steps=6", "grpo.prompts_per_step=4",
                "rollout.max_tokens_per_turn=48", f"model.name={tiny_model_dir}"]
    # the filter replaces dynamic sampling's (the rewards never vary here); its extra rollouts
    # make up for the groups dropped, as a schedule that drops would
    monkeypatch.setattr(stream, "group_filters", lambda config: [one_version_each])
    with scripted_backend(lambda path: ShortOrLong(load_tokenizer(path))):
        train(load_config([], [*settings, "grpo.dynamic_sampling=true", "grpo.max_extra_rollouts=2",
                               f"run_dir={tmp_path / 'drop'}"]))
    drop = [r for r in read_metrics(tmp_path / "drop") if r["step"] >= 1]
    assert sum(r["batch/groups_kept"] for r in drop) < sum(r["batch/groups_sampled"] for r in drop)
    biased = [r for r in drop if r["batch/trained_turns_mean"] < 0.95 * r["batch/generated_turns_mean"]]
    assert biased, [(r["batch/trained_turns_mean"], r["batch/generated_turns_mean"]) for r in drop]
    assert all(r["batch/trained_tokens_mean"] < r["batch/generated_tokens_mean"] for r in biased)


_KILLED_AT_THIRD_UPDATE = """
import os, signal, sys
from rlfactory_core.config import load_config
from rlfactory_core.engines import local
from rlfactory_core.testing import train

real, calls = local.update_policy, []

def update_then_die(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:  # step 3's update, steps 4 and 5 rolling out ahead: no chance to save anything
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)

local.update_policy = update_then_die
train(load_config([], sys.argv[1:]))
"""


def test_a_run_killed_outright_resumes_from_its_checkpoint_training_each_prompt_once(tmp_path, tiny_model_dir):
    """SIGKILL (no handler runs, nothing is saved) in the middle of an async run with steps in
    flight: the resume starts at the last checkpoint, whose data position counts only trained
    prompts, and the run's log holds every step once with each prompt trained once."""
    import subprocess
    import sys

    from rlfactory_core.testing import train

    run_dir = tmp_path / "run"
    overrides = [*TINY, "train.max_staleness=2", "train.steps=5", "checkpoint.every=1", f"model.name={tiny_model_dir}",
                 f"run_dir={run_dir}"]
    killed = subprocess.run([sys.executable, "-c", _KILLED_AT_THIRD_UPDATE, *overrides], capture_output=True,
                            text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert (state["step"], state["position"]) == (2, 4)
    train(load_config([], overrides), resume=run_dir)
    records = [r for r in read_metrics(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [s for r in records for s in r["samples"]] == _expected_samples(run_dir, 5)
    stored = RunRecords(run_dir)  # the trajectories recorded: each step's once, none from the killed step
    assert all(sorted(r["sample_id"] for r in stored.list("train", record["step"])) ==
               sorted(record["samples"] * 2) for record in records)


@pytest.mark.skipif(torch.cuda.is_available(), reason="take_turns is the CPU's default")
def test_async_on_vllm_pauses_generation_for_each_update_and_keeps_the_bound(tmp_path, default_model_dir, capsys):
    """``train.overlap_cores: take_turns`` (the default on a CPU): every update runs with
    generation paused (its requests kept: the chunks ahead resume after it, then a push drains
    them), and the run trains every prompt once within the staleness bound, as with the hf
    backend."""
    pytest.importorskip("vllm")
    from rlfactory_core.testing import build_tiny_model, train

    model = build_tiny_model(tmp_path / "model", default_model_dir, hidden_size=64)
    run_dir, steps = tmp_path / "run", 3
    train(load_config([], [*TINY, "backend=vllm", "backend_options={kv_cache_gib: 0.25, max_model_len: 1024}",
                           "train.max_staleness=2", f"train.steps={steps}", f"model.name={model}",
                           f"run_dir={run_dir}"]))
    assert "generation pauses while the update computes (train.overlap_cores=take_turns)" in capsys.readouterr().err
    records = {r["step"]: r for r in read_metrics(run_dir)}
    assert [s for step in range(1, steps + 1) for s in records[step]["samples"]] == _expected_samples(run_dir, steps)
    for step in range(1, steps + 1):
        assert records[step]["time/pause_generation"] >= 0
        ages = [(step - 1) - v for v in _trained_versions(run_dir, step)]
        assert ages and 0 <= min(ages) and max(ages) <= 2, (step, ages)
