"""``train.mode=one_step_off`` (rlfactory_core.loops.one_step_off) on the local engine: real
runs on a tiny model with the hf backend. Step k+1 rolls out while step k trains; the
measured versions of every recorded token bound its age by one, the staleness metrics agree
with the records, every prompt is trained once (across a stop and a resume), and the
invalid combinations are preflight errors reported together."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from rlfactory_core.config import load_config
from rlfactory_core.data import batch_indices
from rlfactory_core.metrics import read_metrics
from rlfactory_core.records import RunRecords
from rlfactory_core.training.checkpoint import latest_checkpoint

RUN = ["env=arithmetic", "backend=hf", "train.mode=one_step_off", "grpo.prompts_per_step=2", "grpo.group_size=2",
       "data.eval_size=2", "eval.every=0", "rollout.max_turns=2", "rollout.max_tokens_per_turn=8",
       "logging.tensorboard=false", "logging.live=off", "logging.record_train_groups=2", "train.lr=1e-3"]


def _expected_samples(run_dir, steps: int) -> list[str]:
    import yaml
    from rlfactory_arithmetic import ArithmeticEnv

    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    ids = [s["id"] for s in ArithmeticEnv().dataset(split="train")]
    return [ids[i] for i in batch_indices(len(ids), 2 * steps, seed=saved["train"]["seed"], position=0)]


def _trained_versions(run_dir, step: int) -> list[int]:
    """The policy version that sampled each trained token of step ``step``'s recorded groups."""
    records = RunRecords(run_dir)
    versions = []
    for row in records.list("train", step):
        for sequence in records.trajectory("train", step, row["index"])["sequences"]:
            versions += [v for v, segment, mask in zip(sequence["policy_version"], sequence["segment"],
                                                       sequence["loss_mask"]) if segment == 1 and mask]
    return versions


def test_one_step_off_trains_every_prompt_once_with_tokens_at_most_one_version_old(tmp_path, tiny_model_dir, capsys):
    from rlfactory_core.testing import train

    run_dir = tmp_path / "run"
    steps = 3
    train(load_config([], [*RUN, f"train.steps={steps}", "eval.every=2", f"model.name={tiny_model_dir}",
                              f"run_dir={run_dir}"]))
    records = {r["step"]: r for r in read_metrics(run_dir)}
    assert sorted(records) == [0, 1, 2, 3]
    # on a CPU the user is told how the phases share the cores: the hf backend takes turns too
    assert "warning: train.mode=one_step_off on " in capsys.readouterr().err
    assert all(records[step]["time/pause_generation"] >= 0 for step in range(1, steps + 1))
    # the same prompts, in the same order, as a synchronous run: each trained once
    assert [s for step in range(1, steps + 1) for s in records[step]["samples"]] == _expected_samples(run_dir, steps)
    for step in range(1, steps + 1):
        trainer_version = step - 1  # no cold start: one update a step
        ages = [trainer_version - v for v in _trained_versions(run_dir, step)]
        assert ages and min(ages) >= 0 and max(ages) <= 1, (step, ages)
        # the metric is the records' (every group is recorded here)
        stale = sum(1 for a in ages if a > 0) / len(ages)
        assert abs(records[step]["train/stale_token_fraction"] - stale) < 1e-6
        assert records[step]["time/rollout_wait"] >= 0
    assert sum(_trained_versions(run_dir, 1)) == 0  # step 1 rolled out before any update
    # an eval during the rollout ahead is pinned to the weights of its step: no sync lands in it
    for step in (2, 3):
        assert {row["policy_version"] for row in RunRecords(run_dir).list("eval", step)} == {step}
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert (state["step"], state["position"], state["policy_version"]) == (3, 6, 3)


def test_a_stop_drops_the_rollout_ahead_and_a_resume_trains_its_prompts_once(tmp_path, tiny_model_dir, monkeypatch):
    # Ctrl-C while step 1 trains, step 2 rolling out ahead: step 1 is finished and saved, the
    # rollout ahead dropped; its prompts are step 2's again on resume.
    from rlfactory_core.engines import local as local_engine
    from rlfactory_core.testing import TrainingInterrupted, train
    from rlfactory_core.training.update import update_policy

    def interrupted_update(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the main thread takes the signal while the update runs (the outcome is the same if not)
        return update_policy(*args, **kwargs)

    run_dir = tmp_path / "run"
    config = load_config([], [*RUN, "train.steps=3", "checkpoint.every=1000", f"model.name={tiny_model_dir}",
                              f"run_dir={run_dir}"])
    monkeypatch.setattr(local_engine, "update_policy", interrupted_update)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(config)
    assert stopped.value.message.startswith("step 1 is saved")
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert (state["step"], state["position"]) == (1, 2)  # the prompts of the rollout ahead are not counted
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1]

    monkeypatch.setattr(local_engine, "update_policy", update_policy)
    train(config.model_copy(update={"run_dir": str(run_dir)}), resume=run_dir)
    records = {r["step"]: r for r in read_metrics(run_dir)}
    assert sorted(records) == [0, 1, 2, 3]
    assert [s for step in (1, 2, 3) for s in records[step]["samples"]] == _expected_samples(run_dir, 3)
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert (state["step"], state["position"], state["policy_version"]) == (3, 6, 3)


def test_schedule_combinations_that_cannot_work_are_reported_together():
    from rlfactory_core.preflight import preflight

    _, problems = preflight(overrides=["train.mode=one_step_off", "train.max_staleness=0", "engine=ray",
                                       "train.overlap_cores=split", "train.steps=0"])
    assert any(p.startswith("train.max_staleness: 0 allows no token older") for p in problems)
    assert any(p.startswith("train.overlap_cores: split is the local engine's") and "ray.placement=separate" in p
               for p in problems)
    assert any("train.steps" in p for p in problems)  # the schema's own error, in the same report
    for placement in ("colocated", "separate"):  # colocated roles take turns, separate ones run at once
        _, problems = preflight(overrides=["train.mode=one_step_off", "engine=ray", f"ray.placement={placement}"])
        assert not [p for p in problems if p.startswith(("train.", "ray."))], placement
    _, problems = preflight(overrides=["train.mode=overlapped"])
    assert any(p.startswith("train.mode") for p in problems)


def test_an_overlapping_schedule_takes_turns_on_the_cpu_or_splits_its_cores(monkeypatch):
    import torch

    from rlfactory_core.engines.local import overlap_core_split, takes_turns
    from rlfactory_core.run import _shared_cores_warning

    base = ["train.mode=async", "grpo.tis_cap=2", "backend=vllm", "train.device=cpu"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert takes_turns(load_config([], base))  # the default: auto = take_turns
    assert overlap_core_split(load_config([], base)) is None
    assert takes_turns(load_config([], [*base, "backend=hf"]))  # its generation thread cannot be given cores
    for overrides in (["train.mode=sync"], ["train.overlap_cores=split"]):
        assert not takes_turns(load_config([], [*base, *overrides])), overrides
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not takes_turns(load_config([], base))

    cores = sorted(os.sched_getaffinity(0))
    overlapping = load_config([], [*base, "train.overlap_cores=split"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    expected = (cores[:len(cores) // 2], cores[len(cores) // 2:]) if len(cores) >= 2 else None
    assert overlap_core_split(overlapping) == expected
    # nothing to split, or the user chose
    for overrides in (["train.mode=sync"], ["backend=hf"], ["train.threads=1"]):
        changed = load_config([], [*base, "train.overlap_cores=split", *overrides])
        assert overlap_core_split(changed) is None, overrides
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert overlap_core_split(overlapping) is None
    # what the run says: turns, a split, or (a binding of the user's, hf asked to split) both on every core
    assert "(train.overlap_cores=take_turns)" in _shared_cores_warning(load_config([], base))
    for overrides in (["train.overlap_cores=split"], ["train.overlap_cores=split", "backend=hf"]):
        warning = _shared_cores_warning(load_config([], [*base, *overrides]))
        if len(cores) <= 4:
            assert "but both run on the same" in warning, overrides
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    if len(cores) >= 2:
        assert "vLLM's worker on core" in _shared_cores_warning(overlapping)
