"""Learning curves: GRPO with the embedded default model on a tool task, step by step.

``--env arithmetic`` (default) trains SmolLM2-135M-Instruct for ``--steps`` steps (4
prompts x 8 trajectories each, temperature 0.7, the calculator tool, exact-match reward) and
evaluates on the same 64 held-out samples every ``--eval-every`` steps, at the training
temperature: the longer version of ``tests/test_learning.py``.

``--env deepsearch`` runs exactly ``rlf train --env deepsearch`` (the env's own defaults:
4 prompts x 8, the search_r1 reward, greedy exact match on 100 test questions every 5 steps);
``--steps`` / ``--eval-every`` override those when given.

Prints the curve (train reward, held-out accuracy, tool use, step time) and a markdown table
for bench/README.md.

    .venv/bin/python bench/learning_curve.py                  # 20 steps, ~15 minutes on 2 CPU cores
    .venv/bin/python bench/learning_curve.py --steps 4 --eval-every 2   # a quick check
    .venv/bin/python bench/learning_curve.py --env deepsearch  # 20 steps, ~16 minutes
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from rlfactory_core.config import load_config
from rlfactory_core.metrics import read_metrics
from rlfactory_core.testing import train


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="arithmetic", choices=["arithmetic", "deepsearch"])
    parser.add_argument("--steps", type=int, default=None, help="default: 20 (the env's own for deepsearch)")
    parser.add_argument("--eval-every", type=int, default=None, help="default: 4 (the env's own for deepsearch)")
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--run-dir", default=None, help="keep the run here (default: a temporary directory)")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value (e.g. env_options=...)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="rlf-learning-")) / "run"
    common = [f"backend={args.backend}", "logging.live=off", f"run_dir={run_dir}", "eval.save_samples=8"]
    if args.env == "arithmetic":
        steps, every = args.steps or 20, args.eval_every or 4
        overrides = [
            "env_options={questions_per_episode: 1}",
            "rollout.max_turns=3", "rollout.max_tokens_per_turn=48", "rollout.sampling.temperature=0.7",
            "eval.temperature=0.7", "data.eval_size=64", f"eval.every={every}",
            "grpo.prompts_per_step=4", "grpo.group_size=8", "train.lr=1e-5", f"train.steps={steps}",
            f"checkpoint.every={steps}"]
    else:
        overrides = [f"train.steps={args.steps}"] * bool(args.steps) + [f"eval.every={args.eval_every}"] * bool(
            args.eval_every)
    config = load_config([], [*common, *overrides, *args.overrides], flags={"env": args.env})
    started = time.perf_counter()
    train(config)
    minutes = (time.perf_counter() - started) / 60
    records = read_metrics(run_dir)
    print(f"\nrun: {run_dir} ({minutes:.1f} min)")
    print("| step | train reward | held-out accuracy | held-out tool calls / trajectory | step time s |")
    print("|---|---|---|---|---|")
    for r in records:
        held_out = f"{r['eval/reward/accuracy']:.3f}" if "eval/reward/accuracy" in r else ""
        tools = f"{r['eval/tools/calls_per_trajectory']:.2f}" if "eval/tools/calls_per_trajectory" in r else ""
        reward = f"{r['reward/mean']:.3f}" if "reward/mean" in r else ""
        step_time = f"{r['time/step']:.1f}" if "time/step" in r else ""
        print(f"| {r['step']} | {reward} | {held_out} | {tools} | {step_time} |")


if __name__ == "__main__":  # the guard vLLM's worker processes need
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    main(sys.argv[1:])
