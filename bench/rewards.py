"""Reward scoring: the reward layer (concurrent) against scoring one trajectory at a time.

A step's trajectories are scored by a slow reward (``--latency`` seconds a trajectory, the
time a judge model or a tool check takes), once through ``rlfactory_core.rewards`` (every
trajectory at once, within the reward's ``max_concurrency``) and once sequentially (await
each score in turn: what a loop over the batch does). Two slow rewards are measured: an
``async`` one (``asyncio.sleep``: a judge request, a tool call) and a synchronous one
(``time.sleep``: a blocking client or a subprocess, which the layer runs in its own
threads). ``exact_match`` runs next to them, so the batch is composed as in a real run.
Prints each time and the sequential / concurrent ratio.

    .venv/bin/python bench/rewards.py                   # 64 trajectories, 0.2 s each (~30 s)
    .venv/bin/python bench/rewards.py --trajectories 256 --max-concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import time

from rlfactory_core.config import load_config
from rlfactory_core.hookspecs import hookimpl
from rlfactory_core.rewards import build_reward_layer
from rlfactory_core.testing import registered_plugin
from rlfactory_core.types import RewardOutput, Trajectory

LATENCY = 0.2


class SlowAsync:
    name, description = "slow_async", "waits like a judge request"

    async def score(self, trajectory, sample):
        await asyncio.sleep(LATENCY)
        return RewardOutput(value=1.0)


class SlowSync:
    name, description = "slow_sync", "blocks like a synchronous client"

    def score(self, trajectory, sample):
        time.sleep(LATENCY)
        return 1.0


class _Plugin:
    @hookimpl
    def rlfactory_register_rewards(self, register):
        register(SlowAsync)
        register(SlowSync)


async def _sequential(layer, trajectories, samples) -> float:
    start = time.perf_counter()
    for trajectory, sample in zip(trajectories, samples):
        await layer.score([trajectory], [sample])
    return time.perf_counter() - start


async def _concurrent(layer, trajectories, samples) -> float:
    start = time.perf_counter()
    await layer.score(trajectories, samples)
    return time.perf_counter() - start


async def main(args: argparse.Namespace) -> None:
    global LATENCY
    LATENCY = args.latency
    trajectories = [Trajectory(sample_id=str(i), prompt_ids=[], final_answer=str(i)) for i in range(args.trajectories)]
    samples = [{"answer": str(i)} for i in range(args.trajectories)]
    print(f"{args.trajectories} trajectories, {args.latency} s per score, "
          f"max_concurrency {args.max_concurrency}")
    with registered_plugin(_Plugin(), "bench-rewards"):
        for name in ("slow_async", "slow_sync"):
            config = load_config([], [f"rewards=[{{name: {name}, max_concurrency: {args.max_concurrency}}}, "
                                      "{name: exact_match}]"])
            layer = build_reward_layer(config.rewards)
            try:
                concurrent = await _concurrent(layer, trajectories, samples)
                sequential = await _sequential(layer, trajectories, samples)
            finally:
                await layer.close()
            print(f"{name:>10}: sequential {sequential:6.2f} s   concurrent {concurrent:5.2f} s   "
                  f"sequential / concurrent = {sequential / concurrent:5.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--max-concurrency", type=int, default=64)
    asyncio.run(main(parser.parse_args()))
