"""Learning under each schedule: held-out accuracy per step and per minute, ``train.mode=sync``
against ``async`` (and ``one_step_off`` when asked), several seeds per arm, beside the task's
degenerate baselines.

Each arm is a real ``rlf train`` process on the arithmetic curve's settings
(``bench/learning_curve.py``: the embedded SmolLM2-135M-Instruct, the calculator tool, 4
prompts x 8 trajectories, temperature 0.7, LR 1e-5, the same 64 held-out questions evaluated
at the training temperature every ``--eval-every`` steps). ``train.seed`` changes the data
order and the sampling; the model, the held-out set and the schedule's other settings stay.
Arms run interleaved (seed 0 of every mode, then seed 1, ...) so that a slower stretch of the
machine falls on every mode alike.

Per step: the mean held-out accuracy over seeds at each evaluated step, with its range over
seeds (the spread is max - min). Per minute: the clock starts when the step-0 evaluation is written
(model loading and the first evaluation are the same for every mode) and stops at each
evaluated step's record; the summary gives when each mode's mean curve first reaches sync's
final mean accuracy (interpolated between evaluations), as a share of sync's time to its
final step.

Baselines on the same held-out questions: the untrained model (the step-0 evaluation: this
task has no warm-up, so it is also the warm-up-alone score), the majority answer (the most
frequent answer of the training split given to every question), and tools off (the untrained
model answering without the calculator, ``env_options.use_tools=false``, via ``rlf eval``).

``--workload latency`` runs deepsearch where the rollout waits: RL from the base model
(``cold_start.source=off``) with dynamic sampling, its searches sent to ``rlf retriever serve``
behind a proxy that holds each one ``--latency`` seconds (``bench/async_modes.py``'s latency
workload), held-out exact match on the first ``--eval-size`` questions of the test split at
the env's greedy evaluation. Its baselines: the untrained model (step 0: no warm-up here; the
shipped recipe's demonstration warm-up alone is recorded in bench/README.md) and the training
split's majority answer; the env has no tools-off mode.

    .venv/bin/python bench/async_learning.py                         # sync vs async, 3 seeds, 8 steps: ~50 min on 2 cores
    .venv/bin/python bench/async_learning.py --seeds 0 --steps 4     # a quick check
    .venv/bin/python bench/async_learning.py --workload latency --steps 16 --eval-every 4 --eval-size 100 \
        --max-staleness 2 --work-dir DIR     # ~40 min a seed: run again with the same DIR to reuse finished runs
    ... --longer async=20    # async's arms run on to step 20: does it reach sync's final in <= 0.75 of its time?
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from async_modes import latency_retriever  # bench/: the script's own directory is on sys.path

from rlfactory_core.metrics import read_metrics

ACCURACY = "eval/reward/accuracy"  # the share of held-out answers judged right
ARITHMETIC = ["--env", "arithmetic", "env_options={questions_per_episode: 1}", "rollout.max_turns=3",
              "rollout.max_tokens_per_turn=48", "rollout.sampling.temperature=0.7", "eval.temperature=0.7",
              "grpo.prompts_per_step=4", "grpo.group_size=8", "train.lr=1e-5"]


# RL from the base model, where the rollout waits on its searches (the URL is added per run)
DEEPSEARCH = ["--env", "deepsearch", "cold_start.source=off", "grpo.dynamic_sampling=true"]


def workload_argv(args: argparse.Namespace) -> list[str]:
    if args.workload == "arithmetic":
        return ARITHMETIC
    return [*DEEPSEARCH, f"env_options={{retriever: http, url: '{args.retriever_url}'}}"]


def finished_evals(run_dir: Path, steps: int) -> bool:
    """Whether ``run_dir`` holds a run of ``steps`` steps that evaluated its last one (the
    other settings are not compared: reuse a work directory only with the same arguments)."""
    if not (run_dir / "metrics.jsonl").is_file():
        return False
    records = read_metrics(run_dir)
    return max(r["step"] for r in records) == steps and any(r["step"] == steps and ACCURACY in r for r in records)


def run_arm(mode: str, seed: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One ``rlf train`` run: its evaluations as ``(step, minutes since step 0's eval, accuracy)``."""
    steps = args.longer.get(mode, args.steps)
    run_dir = work / (f"{mode}-seed{seed}" if steps == args.steps else f"{mode}-{steps}steps-seed{seed}")
    overrides = [f"train.mode={mode}", f"train.steps={steps}", f"train.seed={seed}",
                 f"eval.every={args.eval_every}", f"data.eval_size={args.eval_size}",
                 f"checkpoint.every={steps}", "logging.live=off", "logging.tensorboard=false",
                 f"backend={args.backend}"]
    if mode == "async":  # stale tokens need the decoupled objective's weight (a preflight rule)
        overrides += ["grpo.tis_cap=2.0", f"train.max_staleness={args.max_staleness}"]
    argv = [sys.executable, "-m", "rlfactory_cli", "train", "--run-dir", str(run_dir), *workload_argv(args), *overrides,
            *args.overrides]
    if finished_evals(run_dir, steps):  # an interrupted bench, run again with its --work-dir
        print(f"  reusing the finished run in {run_dir}", flush=True)
    else:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{mode} seed {seed} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    records = read_metrics(run_dir)
    evals = [r for r in records if ACCURACY in r]
    if not evals or evals[0]["step"] != 0:
        raise RuntimeError(f"{mode} seed {seed}: no step-0 evaluation in {run_dir}")
    t0 = evals[0]["time"]
    return {"mode": mode, "seed": seed, "evals": [(r["step"], (r["time"] - t0) / 60, r[ACCURACY]) for r in evals],
            "stale": [r.get("train/stale_token_fraction", 0.0) for r in records if r["step"] >= 1]}


def parse_longer(parser: argparse.ArgumentParser, pairs: list[str], modes: list[str], steps: int) -> dict[str, int]:
    """``--longer MODE=STEPS ...`` as ``{mode: steps}``; a malformed pair is a usage error."""
    longer = {}
    for pair in pairs:
        mode, _, value = pair.partition("=")
        if mode not in modes[1:] or not value.isdigit() or int(value) <= steps:
            parser.error(f"--longer {pair}: give MODE=STEPS with MODE one of --modes after the baseline "
                         f"({', '.join(modes[1:])}) and STEPS above --steps ({steps})")
        longer[mode] = int(value)
    return longer


def time_to_reach(curve: list[tuple[int, float, float]], target: float) -> float | None:
    """Minutes at which a ``(step, minutes, accuracy)`` curve first reaches ``target``, linear
    between evaluations; None when it never does."""
    if curve and curve[0][2] >= target:
        return curve[0][1]
    for (_, t_a, a), (_, t_b, b) in zip(curve, curve[1:]):
        if b >= target:  # a < target <= b: the first crossing
            return t_a + (t_b - t_a) * (target - a) / (b - a)
    return None


def mean_curve(runs: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """The seeds' mean ``(step, minutes, accuracy)`` at each evaluated step."""
    by_step: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
    for run in runs:
        for step, minutes, accuracy in run["evals"]:
            by_step[step].append((minutes, accuracy))
    return [(step, sum(m for m, _ in v) / len(v), sum(a for _, a in v) / len(v)) for step, v in sorted(by_step.items())]


def majority_baseline(workload: str, eval_size: int) -> tuple[str, float]:
    """The training split's most frequent answer and its accuracy on the held-out questions."""
    if workload == "arithmetic":
        from rlfactory_arithmetic.env import ArithmeticEnv

        env = ArithmeticEnv(questions_per_episode=1)
        answer, _ = collections.Counter(r["answer"] for r in env.dataset(split="train")).most_common(1)[0]
        held_out = env.dataset(size=eval_size, split="test")
        return answer, sum(r["answer"] == answer for r in held_out) / len(held_out)
    from rlfactory_core import normalize_answer
    from rlfactory_deepsearch.env import DeepSearchEnv

    env = DeepSearchEnv()
    answer, _ = collections.Counter(normalize_answer(r["answer"]) for r in env.dataset(split="train")).most_common(1)[0]
    held_out = env.dataset(size=eval_size, split="test")
    right = sum(answer in {normalize_answer(a) for a in r["golden_answers"]} for r in held_out)
    return answer, right / len(held_out)


def tools_off_baseline(args: argparse.Namespace, work: Path) -> float:
    """The untrained model's held-out accuracy without the calculator (``rlf eval``)."""
    report = work / "tools-off"
    argv = [sys.executable, "-m", "rlfactory_cli", "eval", "--env", "arithmetic", "--model", "smollm2-135m-instruct",
            "--size", str(args.eval_size), "--report", str(report), f"backend={args.backend}",
            "env_options={questions_per_episode: 1, use_tools: false}", "eval.temperature=0.7",
            "rollout.max_turns=3", "rollout.max_tokens_per_turn=48"]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the tools-off eval failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    report_json = json.loads((report / "report.json").read_text())
    return report_json["metrics"]["eval/reward/accuracy"]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["sync", "async"], help="the first is the baseline")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--eval-size", type=int, default=64)
    parser.add_argument("--max-staleness", type=int, default=1, help="the async arms' train.max_staleness")
    parser.add_argument("--backend", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--workload", choices=["arithmetic", "latency"], default="arithmetic")
    parser.add_argument("--latency", type=float, nargs=2, default=(8.0, 12.0), metavar=("MIN", "MAX"),
                        help="seconds each search of the latency workload is held")
    parser.add_argument("--longer", nargs="+", default=[], metavar="MODE=STEPS",
                        help="run MODE's arms to STEPS steps (> --steps): its curve past --steps counts per minute "
                             "only, e.g. async=20 to see whether it reaches sync's final within 0.75 of sync's time")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("overrides", nargs="*", help="more config overrides for every arm")
    args = parser.parse_args(argv)
    args.longer = parse_longer(parser, args.longer, args.modes, args.steps)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="rlf-async-learning-"))
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
    with contextlib.ExitStack() as stack:
        if args.workload == "latency":
            args.retriever_url = stack.enter_context(latency_retriever(tuple(args.latency)))
        for seed in args.seeds:
            for mode in args.modes:
                print(f"running {mode}, seed {seed} ...", flush=True)
                run = run_arm(mode, seed, args, work)
                runs[mode].append(run)
                print("  " + ", ".join(f"step {s}: {a:.3f} at {m:.1f} min" for s, m, a in run["evals"]), flush=True)
    print("baselines ...", flush=True)
    majority, majority_accuracy = majority_baseline(args.workload, args.eval_size)
    tools_off = tools_off_baseline(args, work) if args.workload == "arithmetic" else None

    what = ("arithmetic" if args.workload == "arithmetic" else
            f"deepsearch from the base model, searches held {args.latency[0]:g}-{args.latency[1]:g} s")
    print(f"\n{what}, backend {args.backend}, {args.steps} steps of 4 prompts x 8, eval every {args.eval_every} "
          f"on {args.eval_size} held-out questions; seeds {args.seeds}; nproc {os.cpu_count()}")
    steps = [s for s, _, _ in runs[args.modes[0]][0]["evals"]]
    print("| mode | " + " | ".join(f"step {s}" for s in steps) + " | minutes to last step | stale tokens |")
    print("|---|" + "---|" * (len(steps) + 2))
    for mode, mode_runs in runs.items():
        cells = []
        for i, _ in enumerate(steps):
            values = [run["evals"][i][2] for run in mode_runs]
            cells.append(f"{sum(values) / len(values):.3f} ({min(values):.3f}-{max(values):.3f})")
        minutes = [run["evals"][len(steps) - 1][1] for run in mode_runs]
        stale = [sum(run["stale"]) / max(len(run["stale"]), 1) for run in mode_runs]
        print(f"| {mode} | " + " | ".join(cells) + f" | {sum(minutes) / len(minutes):.1f} "
              f"({min(minutes):.1f}-{max(minutes):.1f}) | {sum(stale) / len(stale):.2f} |")
    base = mean_curve(runs[args.modes[0]])
    target, base_minutes = base[-1][2], base[-1][1]
    print(f"\nsync's final mean accuracy {target:.3f}, reached at {base_minutes:.1f} min (its last step):")
    for mode, mode_runs in runs.items():
        curve = mean_curve(mode_runs)  # past --steps too (--longer): the per-minute question
        reached = time_to_reach(curve, target)
        last = len(steps) - 1  # per step: at the baseline's last evaluated step
        finals = [r["evals"][last][2] for r in mode_runs]
        share = f"{reached:.1f} min = {reached / base_minutes:.2f} of sync's" if reached is not None else "not reached"
        longer = (f"; its {curve[-1][0]} steps end at {curve[-1][2]:.3f}, {curve[-1][1]:.1f} min"
                  if curve[-1][0] != steps[-1] else "")
        print(f"- {mode}: step {steps[-1]} {curve[last][2]:.3f} (seed spread {max(finals) - min(finals):.3f}; "
              f"{curve[last][2] - target:+.3f} vs sync){longer}; sync's final accuracy {share}")
    print(f"\nbaselines: untrained (step 0 = warm-up alone) {base[0][2]:.3f}; majority answer {majority!r} "
          f"{majority_accuracy:.3f}" + (f"; tools off {tools_off:.3f}" if tools_off is not None else ""))
    print(f"runs in {work}")


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    main(sys.argv[1:])
