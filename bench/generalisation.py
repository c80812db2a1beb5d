"""The shipped recipe on the splits that test beyond its templates (issue 40): base model,
after the warm-up alone, after RL, per split, over seeds.

Each seed is one real ``rlf train --env ENV`` (the env's defaults, ``train.seed`` set) with
``eval.splits`` naming the env's generalisation splits, so every split is evaluated whole
before training (the base model), after the warm-up (the warm-up alone) and at the last step
(after RL), in the run itself. Finished runs in ``--work-dir`` are reused. Prints one table:
per split, the three scores as the mean and range over seeds, the RL phase's gain over the
warm-up alone, and the base model with its tools off (``rlf eval``, ``use_tools: false``)
beside them; the split's other degenerate baselines and the scripted solver's ceiling are
``bench/generalisation_baselines.py``'s. Then each seed's minutes.

    .venv/bin/python bench/generalisation.py --work-dir DIR --seeds 0 1 2                  # deepsearch
    .venv/bin/python bench/generalisation.py --env nl2sql --work-dir DIR --seeds 0 1 2     # or android

The env's defaults reuse the untrained model's eval (``eval.reuse_untrained``): the first seed
evaluates the base model on every split, the others copy it (the same model, samples and code).
    .venv/bin/python bench/generalisation.py --work-dir DIR --seeds 0 -- train.steps=4   # more overrides
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlfactory_core.metrics import read_metrics

SPLITS = {"deepsearch": ("test", "test_wordings", "test_composition", "test_counterfactual"),
          "nl2sql": ("test", "test_wordings", "test_skeletons"),
          "android": ("test", "test_layouts")}
#: The env option that turns its tools off (the tools-off baseline). An android agent acts only
#: through its tools: without them nothing happens (0.000, bench/android_baselines.py's "doing nothing").
TOOLS_OFF = {"deepsearch": "env_options={use_tools: false}", "nl2sql": "env_options={tools: false}"}
ACCURACY = "reward/accuracy"


def run_seed(env: str, seed: int, work: Path, overrides: list[str]) -> dict[str, Any]:
    run_dir = work / f"{env}-seed{seed}"
    extra = [s for s in SPLITS[env] if s != "test"]
    argv = [sys.executable, "-m", "rlfactory_cli", "train", "--env", env, "--run-dir", str(run_dir),
            f"train.seed={seed}", f"eval.splits=[{', '.join(extra)}]", "logging.live=off",
            "logging.tensorboard=false", *overrides]
    timing = run_dir / "bench-minutes.json"
    if not timing.is_file():
        print(f"{env} seed {seed} ...", flush=True)
        started = time.time()
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{env} seed {seed} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        timing.write_text(json.dumps({"minutes": (time.time() - started) / 60}))
    else:
        print(f"  reusing {run_dir}", flush=True)
    records = read_metrics(run_dir)
    base = next(r for r in records if r["step"] == 0 and not any(k.startswith("cold_start/") for k in r))
    warm = next((r for r in records if r["step"] == 0 and "cold_start/examples" in r), {})
    last = max((r for r in records if f"eval/{ACCURACY}" in r and r["step"] > 0), key=lambda r: r["step"])
    scores = {}
    for split in SPLITS[env]:
        key = f"eval/{ACCURACY}" if split == "test" else f"eval/{split}/{ACCURACY}"
        scores[split] = (base.get(key), warm.get(f"cold_start/{key}"), last.get(key))
    return {"seed": seed, "scores": scores, "minutes": json.loads(timing.read_text())["minutes"],
            "steps": last["step"]}


def tools_off(env: str, split: str, work: Path) -> float | None:
    """The base model with its tools off on the whole split (``rlf eval``, cached in ``work``);
    None for an env that cannot run without its tools."""
    if env not in TOOLS_OFF:
        return None
    report = work / (f"tools-off-{split}" if env == "deepsearch" else f"tools-off-{env}-{split}")
    if not (report / "report.json").is_file():
        print(f"{env} {split}, tools off ...", flush=True)
        argv = [sys.executable, "-m", "rlfactory_cli", "eval", "--env", env, "--model", "smollm2-135m-instruct",
                "--split", split, "--report", str(report), TOOLS_OFF[env]]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"tools-off eval of {split} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads((report / "report.json").read_text())["metrics"][f"eval/{ACCURACY}"]


def spread(values: list[float | None]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    mean = sum(present) / len(present)
    return f"{mean:.3f}" if len(present) == 1 else f"{mean:.3f} ({min(present):.3f}-{max(present):.3f})"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="deepsearch", choices=sorted(SPLITS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("overrides", nargs="*", help="more rlf train overrides, for every seed")
    args = parser.parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    off = {split: tools_off(args.env, split, args.work_dir) for split in SPLITS[args.env]}
    runs = [run_seed(args.env, seed, args.work_dir, args.overrides) for seed in args.seeds]
    print(f"\n`rlf train --env {args.env}` (its defaults{', ' + ' '.join(args.overrides) if args.overrides else ''}), "
          f"seeds {args.seeds}; each split whole; mean (range) over seeds\n")
    print("| split | base, tools off | base | warm-up alone | after RL | RL's gain over the warm-up |")
    print("|---|---|---|---|---|---|")
    for split in SPLITS[args.env]:
        base, warm, final = ([run["scores"][split][i] for run in runs] for i in range(3))
        gains = [f - w for f, w in zip(final, warm) if f is not None and w is not None]
        print(f"| `{split}` | {spread([off[split]])} | {spread(base)} | {spread(warm)} | {spread(final)} | {spread(gains)} |")
    for run in runs:
        print(f"  seed {run['seed']}: {run['steps']} steps, {run['minutes']:.1f} min")


if __name__ == "__main__":
    main(sys.argv[1:])
