"""What share of the weights a step changes in the sampler's dtype, and what a push of only
the changed tensors saves (``train.weight_push``, :mod:`rlfactory_core.training.weight_push`).

Each arm is a real ``rlf train`` run (the embedded SmolLM2-135M, the ``arithmetic`` env with
its calculator, vLLM, ``--steps`` steps of ``--prompts`` x ``--group``, dynamic sampling so
that every step has a gradient) with ``train.weight_push=changed`` or
``all``. The changed arms log, per push, ``weight_sync/changed_share`` (elements whose value
in the sampler's dtype changed, of all) and ``weight_sync/sent_share`` (bytes sent, of all);
every arm logs ``weight_sync/pause_s`` (generation held for the load) and ``time/weight_sync``
(the whole push: comparison, shard writing, load). The first push (after step 1) is reported
apart from the later ones: before it the sampler holds the loaded weights, and a LoRA run's
first merged weights differ from them only in the adapted modules too.

Arms: ``full`` (every weight trained, float32 sampler: the CPU default), ``full-bf16`` (the
sampler in bfloat16, as on a GPU: ``backend_options.dtype=bfloat16``), ``lora`` (adapters,
merged for the sampler), each as ``NAME:changed`` or ``NAME:all``.

    .venv/bin/python bench/weight_sync.py                 # 6 arms x 4 steps, ~8 min on 2 cores
    .venv/bin/python bench/weight_sync.py --arms lora:changed lora:all --steps 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ARMS = {
    "full": [],
    "full-bf16": ["backend_options={dtype: bfloat16}"],
    "lora": ["model.lora.enabled=true", "train.lr=1e-4"],
}


def run_arm(name: str, push: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    run_dir = work / f"{name}-{push}"
    overrides = [*ARMS[name], f"train.weight_push={push}", f"train.steps={args.steps}", f"train.seed={args.seed}",
                 f"grpo.prompts_per_step={args.prompts}", f"grpo.group_size={args.group}", "eval.every=0",
                 "data.eval_size=4", f"checkpoint.every={args.steps}", "logging.live=off",
                 "logging.tensorboard=false", "grpo.dynamic_sampling=true", *args.overrides]
    argv = [sys.executable, "-m", "rlfactory_cli", "train", "--env", "arithmetic", "--run-dir", str(run_dir),
            *overrides]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name}:{push} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    pushes = [r for r in records if r.get("step", 0) >= 1 and "time/weight_sync" in r]
    if any(r["train/grad_norm"] == 0 for r in pushes):  # nothing to change: the share would say nothing
        raise RuntimeError(f"{name}:{push}: a step had no gradient (every group's rewards equal); raise --prompts")
    return {"arm": f"{name}:{push}", "first": pushes[0], "later": pushes[1:]}


def mean(records: list[dict[str, Any]], key: str) -> str:
    values = [r[key] for r in records if key in r]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{statistics.mean(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=[f"{a}:{p}" for a in ARMS for p in ("changed", "all")])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("overrides", nargs="*", help="more config overrides for every arm")
    args = parser.parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="rlf-weight-sync-"))
    results = []
    for arm in args.arms:
        name, push = arm.split(":")
        print(f"running {arm} ...", flush=True)
        results.append(run_arm(name, push, args, work))
    print(f"\n{args.prompts} prompts x {args.group}, {args.steps} steps, seed {args.seed}; later pushes: mean "
          f"(min-max) over steps 2-{args.steps}")
    print("| arm | push | changed share | sent share | pause s | weight sync s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        for which, records in (("first", [r["first"]]), ("later", r["later"])):
            print(f"| {r['arm']} | {which} | {mean(records, 'weight_sync/changed_share')} | "
                  f"{mean(records, 'weight_sync/sent_share')} | {mean(records, 'weight_sync/pause_s')} | "
                  f"{mean(records, 'time/weight_sync')} |")
    print(f"\nruns in {work}")


if __name__ == "__main__":
    main(sys.argv[1:])
