"""Ray engine benchmark: what placing the loop on Ray actors costs on one machine.

Three measurements, side by side in one run:

1. **Step time, local vs ray.** The same ``rlf train`` run (the ``arithmetic`` tool env, the
   embedded SmolLM2-135M-Instruct, the default backend, ``--prompts`` x ``--group``
   trajectories a step), once with ``engine=local`` and once with ``engine=ray`` (a local
   Ray cluster started by the run: one trainer rank and one rollout worker, colocated, each
   using the machine's CPUs in turn). Each run is a child process of this script. A step's
   time is ``time/step`` without its eval and checkpoint; the first step (warm-up) is
   dropped, the median of the rest is reported. Headline: ray / local.
2. **Weight sync per MB**, from the ray run: gather from the FSDP shards on rank 0, one
   object through the object store, load into the rollout worker's backend
   (``weight_sync/ms_per_mb``, ``weight_sync/mb``), against the local engine's in-process
   sync (``time/weight_sync``).
3. **Rollout throughput, 1 vs 2 rollout workers**, on a local Ray cluster of this machine:
   the same prompts (same seeds), one worker with all CPUs vs two workers with half each;
   model tokens per second of the whole rollout (generation, tools, rewards).

    .venv/bin/python bench/ray_engine.py          # ~12-15 minutes on this 2-core CPU machine
    .venv/bin/python bench/ray_engine.py --quick  # fewer steps and prompts (~6 minutes)

Both times are estimates: the measured run (bench/README.md) was not timed as a whole.

With 2 cores, any other process skews the numbers: run it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def train_run(args: argparse.Namespace, engine: str, run_dir: Path) -> list[dict]:
    overrides = ["engine=" + engine, f"train.steps={args.steps}", f"grpo.prompts_per_step={args.prompts}",
                 f"grpo.group_size={args.group}", "eval.every=0", "data.eval_size=4", "eval.save_samples=0",
                 f"checkpoint.every={args.steps}", "logging.live=off", "logging.tensorboard=false",
                 "rollout.max_turns=2", "rollout.max_tokens_per_turn=48", "rollout.sampling.temperature=0.7",
                 f"run_dir={run_dir}"]
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "rlfactory_cli", "train", "--env", "arithmetic", *overrides],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"the {engine} run failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    print(f"  {engine}: {args.steps} steps in {time.perf_counter() - started:.0f} s (with start-up)", flush=True)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if m.get("train/optimizer_steps")]


def step_times(steps: list[dict]) -> list[float]:
    return [m["time/step"] - m.get("time/eval", 0.0) - m.get("time/checkpoint", 0.0) for m in steps[1:]]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def rollout_throughput(args: argparse.Namespace, workers: int) -> tuple[float, int, float]:
    """``(tokens/s, model tokens, seconds)`` of one rollout batch over ``workers`` rollout workers."""
    from rlfactory_core.engines import rollout_config_for
    from rlfactory_core.task import build_task
    from rlfactory_core.config import load_config
    from rlfactory_core.models import resolve_model
    from rlfactory_core.engines.ray import RayEngine

    cpus = os.cpu_count() or 2
    config = load_config([], ["env=arithmetic", "engine=ray", "ray.placement=separate", "ray.trainer.cpus=0.01",
                              f"ray.rollout.workers={workers}", f"ray.rollout.cpus={cpus / workers - 0.01:.2f}",
                              "grpo.kl_coef=0", "rollout.max_turns=2", "rollout.max_tokens_per_turn=48",
                              "rollout.sampling.temperature=0.7", "rollout.sampling.seed=11"])
    task = build_task(config.model_copy(update={"engine": "local"}))
    samples = list(task.env.dataset(size=args.rollout_prompts, split="train"))
    engine = RayEngine(config, base_path=resolve_model(config.model.name), checkpoint=None)
    try:
        await engine.start()
        await engine.rollout(samples[:2], rollout_config_for(config, 0), group_size=1)  # warm-up
        started = time.perf_counter()
        trajectories, _, _ = await engine.rollout(samples, rollout_config_for(config, 1), group_size=args.group)
        seconds = time.perf_counter() - started
    finally:
        await engine.close()
    tokens = sum(len(s.token_ids) for t in trajectories for s in t.segments if s.kind == "model")
    return tokens / seconds, tokens, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and prompts, to check it works")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--rollout-prompts", type=int, default=16)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.prompts, args.group, args.rollout_prompts = 3, 2, 4, 8

    print(f"1. step time, local vs ray: arithmetic, {args.prompts} prompts x {args.group}, {args.steps} steps",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="rlf-bench-ray-") as tmp:
        local = train_run(args, "local", Path(tmp) / "local")
        remote = train_run(args, "ray", Path(tmp) / "ray")
    local_step, ray_step = median(step_times(local)), median(step_times(remote))
    phases = ["time/rollout", "time/reward", "time/train", "time/weight_sync"]
    print(f"\n| phase (median of steps 2..{args.steps}) | local s | ray s | ray / local |")
    print("|---|---|---|---|")
    for key in phases:
        a, b = median([m[key] for m in local[1:]]), median([m[key] for m in remote[1:]])
        print(f"| {key} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
    print(f"| **step** | {local_step:.2f} | {ray_step:.2f} | **{ray_step / local_step:.2f}x** |")

    mb = remote[-1]["weight_sync/mb"]
    ray_ms = median([m["weight_sync/ms_per_mb"] for m in remote[1:]])
    local_ms = 1000 * median([m["time/weight_sync"] for m in local[1:]]) / mb
    print(f"\n2. weight sync, {mb:.0f} MB of weights: ray {ray_ms:.2f} ms/MB "
          f"(gather {median([m['weight_sync/gather_s'] for m in remote[1:]]):.2f} s of it), "
          f"local {local_ms:.2f} ms/MB: ray / local {ray_ms / local_ms:.2f}x", flush=True)

    print(f"\n3. rollout throughput: {args.rollout_prompts} prompts x {args.group}, 1 vs 2 rollout workers",
          flush=True)
    one = asyncio.run(rollout_throughput(args, 1))
    two = asyncio.run(rollout_throughput(args, 2))
    print("| rollout workers | model tokens | s | tokens/s |")
    print("|---|---|---|---|")
    for workers, (rate, tokens, seconds) in ((1, one), (2, two)):
        print(f"| {workers} | {tokens} | {seconds:.1f} | {rate:.1f} |")
    print(f"2 workers / 1 worker: {two[0] / one[0]:.2f}x tokens/s")


if __name__ == "__main__":
    main()
