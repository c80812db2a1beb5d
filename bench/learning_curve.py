"""Learning curve: GRPO on the arithmetic tool task with the embedded default model.

Trains SmolLM2-135M-Instruct for ``--steps`` steps (4 prompts x 8 trajectories each,
temperature 0.7, the calculator tool, exact-match reward) and evaluates on the same 64
held-out samples every ``--eval-every`` steps, at the training temperature. Prints the
curve (train reward, held-out accuracy, tool use, step time) and a markdown table for
bench/README.md. This is the longer version of ``tests/test_learning.py``.

    .venv/bin/python bench/learning_curve.py                  # 20 steps, ~15 minutes on 2 CPU cores
    .venv/bin/python bench/learning_curve.py --steps 4 --eval-every 2   # a quick check
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
from rlfactory_core.trainer import train


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--run-dir", default=None, help="keep the run here (default: a temporary directory)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="rlf-learning-")) / "run"
    config = load_config([], [
        f"backend={args.backend}", "env_options={questions_per_episode: 1}",
        "rollout.max_turns=3", "rollout.max_tokens_per_turn=48", "rollout.sampling.temperature=0.7",
        "eval.temperature=0.7", "data.eval_size=64", f"eval.every={args.eval_every}", "eval.save_samples=8",
        "grpo.prompts_per_step=4", "grpo.group_size=8", "train.lr=1e-5", f"train.steps={args.steps}",
        f"checkpoint.every={args.steps}", "logging.live=off", f"run_dir={run_dir}",
    ])
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
