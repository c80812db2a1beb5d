"""A golden trace of a whole training run: the core's layout may change, its numbers may not.

A seeded 2-step arithmetic run on a tiny model with the hf backend, with a reward that
varies with the sampled text (so advantages, the loss and the update are not zero). The
trace holds every trajectory's sampled token ids and reward, the step's advantage
statistics, loss, gradient norm and entropy, and a checksum of the weights after each
step. It was recorded before the core redesign (issue 20); the test replays the run and
must match: the token ids exactly, the numbers within 1e-6 (relative, where floating point
allows).

Re-record only for an intended change of behaviour: ``RLF_RECORD_GOLDEN=1 pytest
tests/test_golden_trace.py`` (and say why in the commit).
"""

import json
import math
import os
from pathlib import Path

import pytest

from rlfactory_core.hookspecs import hookimpl
from rlfactory_core.testing import registered_plugin

GOLDEN = Path(__file__).parent / "data" / "golden_trace.json"
METRICS = ("reward/mean", "reward/std", "advantage/mean", "advantage/std", "advantage/max", "advantage/min",
           "train/loss", "train/grad_norm", "train/kl", "train/optimizer_steps", "train/entropy", "train/clip_fraction", "train/lr",
           "eval/reward/mean")


class TextLengthReward:
    """A reward every random model earns some of: the answer's length, in a small range."""

    name = "golden_text_length"
    description = "(len(final text) % 7) / 6"

    def score(self, trajectory, sample):
        text = "".join(str(i) for segment in trajectory.segments if segment.kind == "model"
                       for i in segment.token_ids)
        return (len(text) % 7) / 6


class Recorder:
    def __init__(self):
        self.trajectories = []
        self.steps = {}

    @hookimpl
    def rlfactory_register_rewards(self, register):
        register(TextLengthReward)

    @hookimpl
    def rlfactory_on_trajectory_end(self, trajectory, sample):
        model_ids = [list(s.token_ids) for s in trajectory.segments if s.kind == "model"]
        self.trajectories.append([str(trajectory.sample_id), list(trajectory.prompt_ids), model_ids])

    @hookimpl
    def rlfactory_on_train_step_end(self, step, metrics):
        self.steps[step] = {key: metrics[key] for key in METRICS if key in metrics}


def _weights_checksum(model_dir: Path) -> list[float]:
    from safetensors.torch import load_file

    total, absolute, squares = 0.0, 0.0, 0.0
    for path in sorted(model_dir.glob("*.safetensors")):
        for name, tensor in sorted(load_file(str(path)).items()):
            t = tensor.double()
            total += float(t.sum())
            absolute += float(t.abs().sum())
            squares += float((t * t).sum())
    return [total, absolute, squares]


def _run(tmp_path: Path, model_dir: Path) -> dict:
    from rlfactory_core.config import load_config
    from rlfactory_core.testing import train

    run_dir = tmp_path / "run"
    config = load_config([], [
        "env=arithmetic", "backend=hf", f"model.name={model_dir}", f"run_dir={run_dir}", "train.steps=2",
        "train.seed=7", "train.lr=1e-3", "grpo.kl_coef=0.05", "grpo.mini_batches=2", "grpo.prompts_per_step=2", "grpo.group_size=3", "data.eval_size=2",
        "eval.every=0", "eval.save_samples=0", "checkpoint.every=1", "checkpoint.keep=5", "rollout.max_turns=1",
        "rollout.max_tokens_per_turn=12", "rollout.sampling.temperature=1.0", "logging.live=off",
        "logging.tensorboard=false",
        # float32 on every machine: train.bf16=auto would pick bf16 autocast on an AMX CPU and
        # float32 on others, and the two give different numbers.
        "train.bf16=false",
        'rewards=[{"name": "golden_text_length"}]',
    ])
    recorder = Recorder()
    with registered_plugin(recorder, "golden-recorder"):
        train(config)
    # eval trajectories come first (step 0's eval), then each step's; within a step the
    # order trajectories finish in is not part of the behaviour
    trajectories = sorted(recorder.trajectories, key=json.dumps)
    steps = {str(step): {**metrics, "weights": _weights_checksum(run_dir / "checkpoints" / f"step-{step:06d}" / "model")}
             for step, metrics in sorted(recorder.steps.items())}
    return {"trajectories": trajectories, "steps": steps}


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


@pytest.mark.slow
def test_a_seeded_run_reproduces_the_golden_trace(tmp_path, tiny_model_dir):
    trace = _run(tmp_path, tiny_model_dir)
    if os.environ.get("RLF_RECORD_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(trace, indent=1) + "\n")
        pytest.skip("recorded the golden trace")
    golden = json.loads(GOLDEN.read_text())
    assert trace["trajectories"] == golden["trajectories"], "the sampled token ids differ from the golden trace"
    assert sorted(trace["steps"]) == sorted(golden["steps"])
    problems = []
    for step, expected in golden["steps"].items():
        got = trace["steps"][step]
        assert sorted(got) == sorted(expected), step
        for key, value in expected.items():
            values = value if isinstance(value, list) else [value]
            actual = got[key] if isinstance(got[key], list) else [got[key]]
            if not all(_close(a, b) for a, b in zip(actual, values)):
                problems.append(f"step {step} {key}: {actual} != golden {values}")
    assert not problems, "\n".join(problems)
    # the trace is not trivial: the update moved the weights and the loss was not zero
    assert golden["steps"]["1"]["weights"] != golden["steps"]["2"]["weights"]
    assert any(abs(s["train/loss"]) > 0 for s in golden["steps"].values())
