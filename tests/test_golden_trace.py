"""A golden trace of a whole training run: the core's layout may change, its numbers may not.

A seeded 2-step arithmetic run on a tiny model with the hf backend, float32 throughout, with a
reward that varies with the sampled text (so advantages, the loss and the update are not
zero). The trace holds every trajectory's sampled token ids and reward, each step's metrics,
and, for every parameter tensor after each step, checksums of its update since the start and
of AdamW's two moments. It was first recorded before the core redesign (issue 20). Re-record
only for an intended change of behaviour: ``RLF_RECORD_GOLDEN=1 pytest tests/test_golden_trace.py``
(and say why in the commit).

What must match, and why the bounds are what they are
-----------------------------------------------------
Another CPU runs other float32 kernels (AVX2, AVX512, AMX; MKL's and oneDNN's blockings; one
thread or two): the same sums reduce in another order, and the last bits differ. The bounds
below follow from float32 arithmetic (unit roundoff ``u = 2**-24``), not from any machine's run.

* **Token ids: exact.** ``torch.multinomial`` picks a token by where its uniform draw falls
  among the cumulative probabilities; another kernel moves those boundaries by the
  probabilities' rounding drift, so a token changes only if a draw falls within that drift of
  a boundary: with the drift seen between kernels (about 1e-6 relative) about 4 chances in
  10^4 for the run's 192 draws, with the bound ``delta`` below at most 2%. Nothing looser than
  exact would still catch a changed token. Rewards are functions of the ids: exact too.
* **delta: the relative error of what the model computes.** Everything the update depends on
  passes through sums over the vocabulary (V terms: each token's softmax normaliser, the
  gradient of each hidden state through the tied embedding), the longest sums in the run. A
  float32 sum of ``n`` terms in any order stays within ``LAMBDA * sqrt(n) * u`` of the exact sum,
  relative to the sum of the terms' magnitudes, with probability at least
  ``1 - 2 exp(-LAMBDA**2 / 2)`` (Higham and Mary, "A new approach to probabilistic rounding
  error analysis", SISC 2019). ``LAMBDA = 4``: ``delta = LAMBDA * sqrt(V) * u`` (5.3e-5 for
  V = 49,152) bounds a logprob's, a gradient element's and the gradient norm's relative error;
  the clipped gradient AdamW sees (a gradient times a clip factor) is within ``2 delta``.
* **AdamW's moments** (per tensor: sum, sum of magnitudes, sum of squares, from the
  checkpoint's ``optimizer.pt``). ``m`` is a weighted sum of the clipped gradients, so
  ``|dm| <= 2 delta * C_T * sqrt(v)`` element by element, with ``C_T`` from Cauchy-Schwarz over
  AdamW's weights after ``T`` steps; ``v`` a weighted sum of their squares:
  ``|dv| <= ((1 + 2 delta)^2 - 1) v``.
* **The update ``W_T - W_0``** of each tensor (the same three checksums). Each element moves
  for two reasons. Rounding: the initial weights (torch's vectorised normal sampler) and each
  AdamW step end in a float32 rounding, and two kernels may land one ulp apart
  (``ulp(w) <= 2u|w|``): ``2u (T+1) |w|``. The gradient: AdamW's step ``lr * m^/(sqrt(v^)+eps)``
  moves by at most ``lr * 4 delta * c_s`` for a ``2 delta`` gradient error (``c_s``: the largest
  ``|m^|/sqrt(v^)`` after ``s`` steps, from the same Cauchy-Schwarz). A sum over a tensor's
  elements moves by at most the sum of their bounds (the rounding part is not random: one
  kernel's bias shows on every element, so no square root is taken).
* **Metrics**: from rewards (float64 arithmetic on exact values): 64 ulps of float64;
  advantages (a few float32 operations per group and batch): ``(3G + 2B + 8) u`` of the largest
  advantage; the model's (loss, KL, entropy, gradient norm): ``delta`` relative to the scale
  each is computed from (the loss: the largest advantage's ``|A| (1 + clip_high)`` terms, with
  logprobs of magnitude up to ``1 + ln V``); the clip fraction: one token either side of a
  clip boundary.

The bounds are computed in ``tests/float32_bounds.py`` (shared with the engines' parity tests).
Seven kernel settings on one machine (torch's AVX2/AVX512/scalar kernels, MKL's AVX2 and
portable paths, one and two threads) land at most 0.04 of the way to any bound; at step 1 the
three planted changes below go past their furthest bound 21x (a detached KL term, the
subtlest), 1,200x (another order of samples) and 7,700x (a reversed policy gradient).

What it guarantees: the same tokens, rewards and advantages, and every tensor's update and
optimizer state within float32's reach of the recorded ones: a wrong sign, a missing or
detached term, another order of samples or another learning rate moves some tensor's
checksums past its bound (``test_planted_changes_are_caught`` plants three and watches them
fail). What it does not guarantee: bit-identical weights on another CPU, or anything about
bf16 (``train.bf16`` is pinned off: bf16 autocast's rounding is a separate story), vLLM or
the ray engine (their parity with this path has tests of their own).
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from float32_bounds import U, compare_tensors, relative_error, tensor_stats
from rlfactory_core.hookspecs import hookimpl
from rlfactory_core.testing import registered_plugin

GOLDEN = Path(__file__).parent / "data" / "golden_trace.json"
FORMAT = 2
METRICS = ("reward/mean", "reward/std", "advantage/mean", "advantage/std", "advantage/max", "advantage/min",
           "train/loss", "train/grad_norm", "train/kl", "train/optimizer_steps", "train/entropy", "train/clip_fraction",
           "train/lr", "train/trained_tokens", "eval/reward/mean")
SETTINGS = [
    "env=arithmetic", "backend=hf", "train.steps=2", "train.seed=7", "train.lr=1e-3", "grpo.kl_coef=0.05",
    "grpo.mini_batches=2", "grpo.prompts_per_step=2", "grpo.group_size=3", "data.eval_size=2", "eval.every=0",
    "eval.save_samples=0", "checkpoint.every=1", "checkpoint.keep=5", "rollout.max_turns=1",
    "rollout.max_tokens_per_turn=12", "rollout.sampling.temperature=1.0", "logging.live=off",
    "logging.tensorboard=false",
    # float32 on every machine: train.bf16=auto picks bf16 autocast on an AMX CPU only
    "train.bf16=false",
    'rewards=[{"name": "golden_text_length"}]',
]

U64 = 2.0 ** -53  # float64's unit roundoff


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


# --------------------------------------------------------------------------- the trace


def _parameter_names(model_dir: Path) -> list[str]:
    """The names AdamW's state is indexed by (the trainer's own list, on a weightless copy)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlfactory_core.training.fsdp import trainable_names

    with torch.device("meta"):
        return trainable_names(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)))


def _load_weights(directory: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def _tensors(checkpoint: Path, model_dir: Path, names: list[str]) -> dict:
    import torch

    initial, weights = _load_weights(model_dir), _load_weights(checkpoint / "model")
    state = torch.load(checkpoint / "optimizer.pt", weights_only=False)["state"]
    return {name: tensor_stats(weights[name], initial[name], state[i]["exp_avg"], state[i]["exp_avg_sq"])
            for i, name in enumerate(names)}


def _run(tmp_path: Path, model_dir: Path, schedule: tuple[str, ...] = ()) -> dict:
    """The trace of a run of SETTINGS; ``schedule``: overrides of ``train.mode`` that must
    give the same run (they are not part of the recorded settings)."""
    from rlfactory_core.config import load_config
    from rlfactory_core.testing import train

    run_dir = tmp_path / "run"
    config = load_config([], [*SETTINGS, *schedule, f"model.name={model_dir}", f"run_dir={run_dir}"])
    recorder = Recorder()
    with registered_plugin(recorder, "golden-recorder"):
        train(config)
    names = _parameter_names(model_dir)
    # eval trajectories come first (step 0's eval), then each step's; within a step the
    # order trajectories finish in is not part of the behaviour
    trajectories = sorted(recorder.trajectories, key=json.dumps)
    steps = {str(step): {"metrics": metrics,
                         "tensors": _tensors(run_dir / "checkpoints" / f"step-{step:06d}", model_dir, names)}
             for step, metrics in sorted(recorder.steps.items())}
    return {"format": FORMAT, "settings": SETTINGS,
            "vocab": json.loads((model_dir / "config.json").read_text())["vocab_size"],
            "adam": {"betas": list(config.train.betas), "weight_decay": config.train.weight_decay},
            "grpo": {"group_size": config.grpo.group_size, "prompts_per_step": config.grpo.prompts_per_step,
                     "clip_high": config.grpo.clip_high},
            "trajectories": trajectories, "steps": steps}


# --------------------------------------------------------------------------- the comparison


def metric_bounds(metrics: dict, trace: dict) -> dict[str, float]:
    """How far each recorded metric may be from the golden one (see the module docstring)."""
    delta, vocab = relative_error(trace["vocab"]), trace["vocab"]
    group, batch = trace["grpo"]["group_size"], trace["grpo"]["group_size"] * trace["grpo"]["prompts_per_step"]
    advantage_scale = max(abs(metrics["advantage/max"]), abs(metrics["advantage/min"]))
    logprob_scale = 1 + math.log(vocab)
    kl = abs(metrics.get("train/kl", 0.0))
    out = {key: 64 * U64 * abs(metrics[key]) for key in ("reward/mean", "reward/std", "eval/reward/mean")
           if key in metrics}
    out.update({key: (3 * group + 2 * batch + 8) * U * advantage_scale
                for key in ("advantage/mean", "advantage/std", "advantage/max", "advantage/min")})
    out.update({
        "train/loss": 2 * delta * logprob_scale * advantage_scale * (1 + trace["grpo"]["clip_high"]) + delta * kl,
        # k3(x) = e^x - x - 1 moves by |e^x - 1| |dx|, and |x| is about sqrt(2 k3) for small x
        "train/kl": 2 * math.sqrt(2 * kl) * 2 * delta * logprob_scale + delta * kl,
        "train/entropy": delta * abs(metrics["train/entropy"]),
        "train/grad_norm": delta * abs(metrics["train/grad_norm"]),
        "train/clip_fraction": 1.0 / max(1.0, metrics["train/trained_tokens"]),
        "train/lr": 0.0, "train/optimizer_steps": 0.0, "train/trained_tokens": 0.0,
    })
    return out


def compare(trace: dict, golden: dict) -> list[str]:
    """Every way ``trace`` is further from ``golden`` than float32 allows, one line each
    (``tokens``, ``metric`` or ``tensor`` first); empty when it matches."""
    problems = []
    if len(trace["trajectories"]) != len(golden["trajectories"]):
        problems.append(f"tokens: {len(trace['trajectories'])} trajectories, golden {len(golden['trajectories'])}")
    elif trace["trajectories"] != golden["trajectories"]:
        differing = sum(a != b for a, b in zip(trace["trajectories"], golden["trajectories"]))
        problems.append(f"tokens: {differing} of {len(golden['trajectories'])} trajectories' sampled ids differ")
    if sorted(trace["steps"]) != sorted(golden["steps"]):
        return [*problems, f"steps: {sorted(trace['steps'])} != golden {sorted(golden['steps'])}"]
    lrs: list[float] = []
    for step in sorted(golden["steps"], key=int):
        expected, got = golden["steps"][step], trace["steps"][step]
        bounds = metric_bounds(expected["metrics"], golden)
        if sorted(got["metrics"]) != sorted(expected["metrics"]):
            problems.append(f"metric step {step}: keys {sorted(got['metrics'])} != golden {sorted(expected['metrics'])}")
        for key, value in expected["metrics"].items():
            actual = got["metrics"].get(key)
            if actual is None or abs(actual - value) > bounds[key]:
                problems.append(f"metric step {step} {key}: {actual} vs golden {value} (bound {bounds[key]:.3g})")
        lrs += [expected["metrics"]["train/lr"]] * int(expected["metrics"]["train/optimizer_steps"])
        problems += compare_tensors(got["tensors"], expected["tensors"], lrs, label=f"step {step}",
                                    betas=golden["adam"]["betas"], weight_decay=golden["adam"]["weight_decay"],
                                    vocab=golden["vocab"])
    return problems


# --------------------------------------------------------------------------- the tests


def _report(problems: list[str], shown: int = 40) -> str:
    more = f"\n... and {len(problems) - shown} more" if len(problems) > shown else ""
    return f"{len(problems)} differences from the golden trace past float32's bounds:\n" + \
        "\n".join(problems[:shown]) + more


@pytest.fixture(scope="module")
def golden() -> dict:
    return _load_golden()


def _load_golden() -> dict:
    golden = json.loads(GOLDEN.read_text())
    assert golden.get("format") == FORMAT and golden.get("settings") == SETTINGS, \
        f"{GOLDEN} was recorded by another version of this test: re-record it (see the module docstring)"
    return golden


@pytest.mark.slow
# The asynchronous schedule with no staleness allowed must be the synchronous one, through its
# own code (rlfactory_core.stream): the same trajectories, the same updates.
@pytest.mark.parametrize("schedule", [(), ("train.mode=async", "train.max_staleness=0")], ids=["sync", "async-0"])
def test_a_seeded_run_reproduces_the_golden_trace(tmp_path, tiny_model_dir, schedule):
    trace = _run(tmp_path, tiny_model_dir, schedule)
    if os.environ.get("RLF_RECORD_GOLDEN") == "1" and not schedule:  # the tests after it read the new one
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(trace, indent=1) + "\n")
        pytest.skip("recorded the golden trace")
    golden = _load_golden()
    problems = compare(trace, golden)
    assert not problems, _report(problems)
    # the trace is not trivial: the update moved every tensor and the loss was not zero
    for step in golden["steps"].values():
        assert all(t["update"][1] > 0 for t in step["tensors"].values())
        assert abs(step["metrics"]["train/loss"]) > 0


# Planted bugs. Step 1's per-tensor checks must catch each: the first two leave the logged
# values of the loss as they were and change only the gradient, which is what the update shows.
def _detached_kl(monkeypatch):
    """The KL term in the loss but not in the gradient (a stray ``.detach()``)."""
    from rlfactory_core.training import grpo

    real = grpo.kl_penalty
    monkeypatch.setattr(grpo, "kl_penalty", lambda *args, **kwargs: real(*args, **kwargs).detach())


def _reversed_policy_gradient(monkeypatch):
    """The policy term's value as before, its gradient of the opposite sign."""
    from rlfactory_core.training import grpo

    real = grpo.policy_loss

    def policy_loss(*args, **kwargs):
        per_token, stats = real(*args, **kwargs)
        return 2 * per_token.detach() - per_token, stats

    monkeypatch.setattr(grpo, "policy_loss", policy_loss)


def _other_sample_order(monkeypatch):
    """Another order of the trajectories into mini-batches."""
    from rlfactory_core.training import update

    class Reversed(random.Random):
        def shuffle(self, x):
            super().shuffle(x)
            x.reverse()

    monkeypatch.setattr(update, "random", type("random", (), {"Random": Reversed}))


@pytest.mark.slow
@pytest.mark.parametrize("plant", [_detached_kl, _reversed_policy_gradient, _other_sample_order],
                         ids=["detached-kl", "reversed-policy-gradient", "other-sample-order"])
def test_planted_changes_are_caught(tmp_path, tiny_model_dir, golden, monkeypatch, plant):
    plant(monkeypatch)
    problems = compare(_run(tmp_path, tiny_model_dir), golden)
    step_one_tensors = [p for p in problems if p.startswith("tensor step 1 ")]
    assert step_one_tensors, f"the planted change went unnoticed by step 1's tensor checks: {problems}"


@pytest.mark.slow
def test_the_bounds_hold_for_other_kernels(tmp_path, tiny_model_dir, golden):
    """The run on torch's scalar kernels, one thread and MKL's portable code path (three other
    summation orders, what another CPU brings) still matches: the bounds are not this
    machine's."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    out = tmp_path / "trace.json"
    script = ("import json, sys, torch; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
              "import test_golden_trace as g; assert torch.backends.cpu.get_cpu_capability() == 'DEFAULT'; "
              "Path(sys.argv[3]).write_text(json.dumps(g._run(Path(sys.argv[4]), Path(sys.argv[2]))))")
    proc = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), str(tiny_model_dir), str(out),
                           str(tmp_path)], env=env, timeout=600, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    problems = compare(json.loads(out.read_text()), golden)
    assert not problems, _report(problems)
