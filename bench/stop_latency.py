"""How long `rlf train` takes to answer and to obey Ctrl-C while a rollout hangs.

A run of the arithmetic env (a temporary plugin, ``stalling``, whose step-2 episodes hang in
``env.step`` for an hour, as a tool or a phone that never answers would) gets SIGINT once every
one of them hangs; printed: the seconds until the "stopping:" line, until the process exits,
and its exit code. Before the fix the rollout was awaited to its end (here: an hour).

    .venv/bin/python bench/stop_latency.py                   # hf backend, a tiny random model
    .venv/bin/python bench/stop_latency.py --backend vllm    # vLLM (its start takes a while)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLUGIN = '''
import asyncio
from rlfactory_arithmetic import ArithmeticEnv
from rlfactory_core import hookimpl


class StallingEnv(ArithmeticEnv):
    name = "stalling"
    description = "The arithmetic env, hanging in env.step after stall_after episodes (bench)."

    def __init__(self, marker: str, stall_after: int = -1, **options):
        super().__init__(**options)
        self.marker, self.stall_after, self.episodes = marker, stall_after, 0

    async def reset(self, sample):
        self.episodes += 1
        reset = await super().reset(sample)
        reset.state["stalls"] = 0 <= self.stall_after < self.episodes
        return reset

    async def step(self, state, turn, results):
        if state["stalls"]:
            with open(self.marker, "a") as f:
                f.write("x\\n")
            await asyncio.sleep(3600)
        return await super().step(state, turn, results)


@hookimpl
def rlfactory_register_envs(register):
    register(StallingEnv)
'''


def tiny_model(directory: Path) -> Path:
    """A tiny Llama with heads of 32 (vLLM's CPU attention takes no smaller) and the
    default model's tokenizer."""
    from rlfactory_core.models import DEFAULT_MODEL, prepare_model
    from rlfactory_core.testing import build_tiny_model

    return build_tiny_model(directory, prepare_model(DEFAULT_MODEL), hidden_size=64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (x2 trajectories each)")
    args = parser.parse_args()
    from rlfactory_core.testing import write_distribution

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        site = write_distribution(root / "site", "rlf-bench-stalling", "stalling", "rlf_bench_stalling", PLUGIN)
        model = tiny_model(root / "model")
        marker = root / "stalled"
        hanging = args.prompts * 2
        argv = [sys.executable, "-m", "rlfactory_cli", "train", "--env", "stalling", "--model", str(model),
                "--run-dir", str(root / "run"), f"env_options.marker={marker}",
                f"env_options.stall_after={2 + hanging}", f"backend={args.backend}", "train.steps=2",
                f"grpo.prompts_per_step={args.prompts}", "grpo.group_size=2", "data.eval_size=2", "eval.every=0",
                "rollout.max_turns=2", "rollout.max_tokens_per_turn=16", "logging.live=off",
                "logging.tensorboard=false"]
        output = root / "output.txt"
        with open(output, "w") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                       env={**os.environ, "PYTHONPATH": str(site)})
        try:
            while (not marker.exists() or len(marker.read_text().split()) < hanging) and process.poll() is None:
                time.sleep(0.05)
            sent = time.perf_counter()
            process.send_signal(signal.SIGINT)
            answered = None
            while process.poll() is None:
                if answered is None and "stopping:" in output.read_text():
                    answered = time.perf_counter() - sent
                time.sleep(0.01)
            exited = time.perf_counter() - sent
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        text = output.read_text()
        if answered is None and "stopping:" in text:
            answered = exited
        print(f"backend {args.backend}, {hanging} hanging trajectories: 'stopping:' after "
              f"{answered if answered is None else round(answered, 2)} s, exit after {exited:.2f} s, "
              f"exit code {process.returncode}")
        print(text.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
