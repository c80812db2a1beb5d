"""Rollout benchmark: RLFactory's async agent loop vs the lockstep loop, side by side.

Both schedules run the same prompts, model, parser, tools and sampling, in the same
process, one after the other:

* **async** (ours, ``rlfactory_core.rollout.rollout``): every trajectory is its own task;
  while some wait for tools, the backend keeps generating for the others.
* **lockstep** (the Search-R1 / RL-Factory scheme): generate one turn for the whole batch,
  wait for the slowest sequence, run every tool call of the batch, wait for the slowest
  call, build the observations, and only then start the next turn.

The task is the ``arithmetic`` env (``contrib/rlfactory-plugin-arithmetic``) with several
questions per episode (a tool call and an answer for each, so several tool calls per
trajectory), sampled at temperature 0.7 (varied response lengths). Each tool call first
sleeps for a random, exponentially distributed latency (drawn from a seeded RNG keyed by
the call, so both schedules see the same latencies for the same calls).

The rollout batch (64 trajectories) is twice the engine's concurrency (32 sequences,
vLLM's ``max_num_seqs`` / hf's ``max_batch_size``), as in training, where a step's
prompts x group size exceed what the engine runs at once: the engine queues the rest, and
a trajectory waiting for a tool gives its place to a queued one. The latency's mean is
swept as a multiple of the generation time of one turn, measured in the same run: the
mean time of one ``generate`` request in a zero-latency async run of as many
trajectories as the engine runs at once (no queueing, so it is generation time only; the
run is also the warm-up). On a GPU generation is tens of times faster than here, so there
tools weigh several times more.

Printed for each point: wall time, trajectories/s and model tokens/s of both schedules,
async / lockstep speed-up, and async time / async time with zero-latency tools (how much
of the tool time the async loop hides; 1.00 = all of it). Then the vLLM and hf backends
on the same zero-latency work.

    .venv/bin/python bench/rollout.py                 # the full sweep (~10 minutes on 2 CPU cores)
    .venv/bin/python bench/rollout.py --quick         # a smaller run, to check it works
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from rlfactory_arithmetic import ArithmeticEnv
from rlfactory_core.default_plugins.tool_managers import ConcurrentToolManager
from rlfactory_core.models import DEFAULT_MODEL, load_tokenizer, prepare_model
from rlfactory_core.plugins import get_component
from rlfactory_core.rollout import ChatTemplate, RolloutConfig, TemplateFamily, make_backend, rollout
from rlfactory_core.rollout.family import parse_error_results, parse_turn
from rlfactory_core.types import Segment, ToolResult, Trajectory


class LatencyTool:
    """The calculator behind a random latency: exponential with mean ``mean_s``, drawn
    from an RNG seeded by (trajectory, call number, arguments), so both schedules wait
    the same time for the same call."""

    def __init__(self, tool: Any, mean_s: float, seed: int):
        self.tool, self.mean_s, self.seed = tool, mean_s, seed
        self.name, self.description, self.parameters = tool.name, tool.description, tool.parameters
        self.validate = tool.validate

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any] | None = None) -> ToolResult | str:
        trajectory = ctx["trajectory"]
        key = f"{self.seed}:{trajectory.sample_id}:{len(trajectory.tool_calls)}:{json.dumps(arguments, sort_keys=True)}"
        if self.mean_s > 0:
            await asyncio.sleep(random.Random(key).expovariate(1.0 / self.mean_s))
        return await self.tool.call(arguments, ctx)


class TimedBackend:
    """Measures the wall time of every ``generate`` request (one model turn)."""

    def __init__(self, backend: Any):
        self.backend, self.name, self.turn_times = backend, backend.name, []

    async def generate(self, prompt_ids, sampling):
        start = time.perf_counter()
        try:
            return await self.backend.generate(prompt_ids, sampling)
        finally:
            self.turn_times.append(time.perf_counter() - start)


@dataclass
class Result:
    seconds: float
    trajectories: int
    model_tokens: int
    tool_calls: int
    turns: int

    @property
    def trajectories_per_s(self) -> float:
        return self.trajectories / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.model_tokens / self.seconds


class _Lockstep:
    """Per-trajectory state of the lockstep loop (a stand-in for run_trajectory's locals)."""

    def __init__(self, key: str, sample: Any, state: Any, context: list[int], sampling: Any):
        # Trajectory i samples with seed + i in both schedules, so both do the same work.
        self.key, self.sample, self.state, self.context, self.sampling = key, sample, state, context, sampling
        self.trajectory = Trajectory(sample_id=key, prompt_ids=list(context))
        self.done = False
        self.before: list[int] = []  # the context the last turn was sampled after


async def lockstep_rollout(samples, *, env, family, tool_manager, backend, config: RolloutConfig) -> list:
    """The lockstep schedule, with the same ending rules as ``run_trajectory``."""
    rows = []
    for i, sample in enumerate(samples):
        reset = await env.reset(sample)
        _, prompt_ids = family.prompt(list(reset.messages), reset.tools)
        rows.append(_Lockstep(str(i), sample, reset.state, prompt_ids, config.sampling_params(i)))
    try:
        for turn_index in range(config.max_turns):
            active = [row for row in rows if not row.done]
            if not active:
                break
            # 1. one turn for the whole batch; the batch waits for its slowest sequence
            generations = await asyncio.gather(*(
                backend.generate(row.context, row.sampling.with_max_tokens(
                    min(row.sampling.max_tokens, config.max_trajectory_tokens - len(row.context))))
                for row in active))
            turns = []
            for row, generation in zip(active, generations):
                row.before = list(row.context)
                turn = parse_turn(family, generation.token_ids, row.before)
                row.context.extend(generation.token_ids)
                row.trajectory.segments.append(Segment("model", list(generation.token_ids), list(generation.logprobs)))
                row.trajectory.tool_calls.extend(turn.tool_calls)
                turns.append(turn)
            # 2. every tool call of the batch; the batch waits for its slowest call
            all_results = await asyncio.gather(*(
                tool_manager.call(turn.tool_calls, {"trajectory": row.trajectory, "sample": row.sample,
                                                    "state": row.state})
                if turn.tool_calls else _no_results()
                for row, turn in zip(active, turns)))
            # 3. env steps and observations, then the next turn
            for row, turn, results, generation in zip(active, turns, all_results, generations):
                row.trajectory.tool_results.extend(results)
                step = await env.step(row.state, turn, results)
                answered = not turn.tool_calls and not turn.errors
                if step.done or (answered and (config.stop_on_no_tool_call or not step.observation)) \
                        or turn_index + 1 == config.max_turns:
                    row.done = True
                    continue
                observation = [*family.tool_messages([*parse_error_results(turn), *results]), *step.observation]
                ids = family.observation_ids(generation.token_ids, row.before, observation)
                if len(row.context) + len(ids) >= config.max_trajectory_tokens:
                    row.done = True
                    continue
                row.context.extend(ids)
                row.trajectory.segments.append(Segment("observation", ids))
    finally:
        for row in rows:
            await env.close(row.state)
    return [row.trajectory for row in rows]


async def _no_results() -> list:
    return []


def _summary(trajectories, seconds: float) -> Result:
    return Result(
        seconds=seconds, trajectories=len(trajectories),
        model_tokens=sum(len(s.token_ids) for t in trajectories for s in t.segments if s.kind == "model"),
        tool_calls=sum(len(t.tool_calls) for t in trajectories),
        turns=sum(t.num_turns for t in trajectories),
    )


async def run_schedule(schedule: str, *, backend, chat, parser, samples, config, latency_s: float, seed: int) -> Result:
    env = ArithmeticEnv(questions_per_episode=len(samples[0]["questions"]))
    tool = LatencyTool(get_component("tool", "calculator"), latency_s, seed)
    env.tools = [tool]
    manager = ConcurrentToolManager([tool], timeout_s=600)
    if hasattr(backend.backend, "reset_prefix_cache"):
        # Both schedules produce the same tokens: without this, the second run would reuse
        # the KV blocks of the first.
        await backend.backend.reset_prefix_cache()
    start = time.perf_counter()
    # Both schedules name trajectory i "i", so the latency of a call is the same in both.
    keyed = [dict(sample, id=str(i)) for i, sample in enumerate(samples)]
    schedule_fn = rollout if schedule == "async" else lockstep_rollout
    trajectories = await schedule_fn(keyed, env=env, family=TemplateFamily(chat, parser), tool_manager=manager,
                                     backend=backend, config=config)
    return _summary(trajectories, time.perf_counter() - start)


def _mean_result(results: list[Result]) -> Result:
    first = results[0]
    return Result(seconds=statistics.mean(r.seconds for r in results), trajectories=first.trajectories,
                  model_tokens=first.model_tokens, tool_calls=first.tool_calls, turns=first.turns)


def _row(label: str, r: Result) -> str:
    return (f"  {label:<9} {r.seconds:7.1f} s  {r.trajectories_per_s:6.2f} traj/s  {r.tokens_per_s:7.1f} tok/s"
            f"  ({r.model_tokens} tokens, {r.turns} turns, {r.tool_calls} tool calls)")


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    model_dir = prepare_model(DEFAULT_MODEL)
    tokenizer = load_tokenizer(model_dir)
    chat = ChatTemplate(tokenizer)
    parser = get_component("parser", "qwen3")
    env = ArithmeticEnv(questions_per_episode=args.questions, seed=args.seed)
    samples = env.dataset(args.trajectories)
    config = RolloutConfig(max_turns=2 * args.questions, max_tokens_per_turn=args.max_tokens_per_turn,
                           max_trajectory_tokens=2048,
                           sampling={"temperature": args.temperature, "seed": args.seed})
    print(f"model {DEFAULT_MODEL}, {args.trajectories} trajectories x {args.questions} questions "
          f"(up to {config.max_turns} turns of <= {config.max_tokens_per_turn} tokens), "
          f"temperature {args.temperature}, "
          f"{os.cpu_count()} CPUs", flush=True)

    backends = {}
    for name in args.backends:
        start = time.perf_counter()
        capacity = {"vllm": {"max_num_seqs": args.engine_concurrency},
                    "hf": {"max_batch_size": args.engine_concurrency}}[name]
        backend = make_backend(name, str(model_dir), **capacity)
        if hasattr(backend, "start"):
            await backend.start()
        backends[name] = TimedBackend(backend)
        print(f"{name} backend ready in {time.perf_counter() - start:.1f} s "
              f"(runs {args.engine_concurrency} sequences at once)", flush=True)
    main_name = args.backends[0]
    backend = backends[main_name]

    # One turn's generation time, on as many trajectories as the engine runs at once (no
    # queueing, so the request time is generation time); also the warm-up.
    await run_schedule("async", backend=backend, chat=chat, parser=parser,
                       samples=samples[:args.engine_concurrency], config=config, latency_s=0.0, seed=args.seed)
    turn_s = statistics.mean(backend.turn_times)
    print(f"\n[{main_name}] one turn's generation time (mean generate request, zero-latency async run of "
          f"{min(args.engine_concurrency, len(samples))} trajectories): {turn_s:.2f} s", flush=True)
    baseline = await run_schedule("async", backend=backend, chat=chat, parser=parser, samples=samples,
                                  config=config, latency_s=0.0, seed=args.seed)
    print(f"\n[{main_name}] tool latency ~ Exponential(mean = m x turn time)")
    table = []
    for multiple in args.latency_multiples:
        latency = multiple * turn_s
        if multiple == 0:
            # Both schedules saturate the engine here, so they are close: measure twice, the
            # second time in the other order, and report the mean (and both runs).
            ours, theirs = [baseline], []
            theirs.append(await run_schedule("lockstep", backend=backend, chat=chat, parser=parser,
                                             samples=samples, config=config, latency_s=0.0, seed=args.seed))
            for _ in range(args.zero_latency_repeats - 1):
                theirs.append(await run_schedule("lockstep", backend=backend, chat=chat, parser=parser,
                                                 samples=samples, config=config, latency_s=0.0, seed=args.seed))
                ours.append(await run_schedule("async", backend=backend, chat=chat, parser=parser,
                                               samples=samples, config=config, latency_s=0.0, seed=args.seed))
            if len(ours) > 1:
                print("m = 0 runs: async " + ", ".join(f"{r.seconds:.1f}" for r in ours) +
                      " s; lockstep " + ", ".join(f"{r.seconds:.1f}" for r in theirs) + " s")
            ours, theirs = _mean_result(ours), _mean_result(theirs)
            baseline = ours
        else:
            ours = await run_schedule("async", backend=backend, chat=chat, parser=parser, samples=samples,
                                      config=config, latency_s=latency, seed=args.seed)
            theirs = await run_schedule("lockstep", backend=backend, chat=chat, parser=parser, samples=samples,
                                        config=config, latency_s=latency, seed=args.seed)
        speedup = ours.trajectories_per_s / theirs.trajectories_per_s
        hidden = ours.seconds / baseline.seconds
        table.append((multiple, latency, ours, theirs, speedup, hidden))
        print(f"m = {multiple:g} (mean latency {latency:.2f} s)")
        print(_row("async", ours))
        print(_row("lockstep", theirs))
        print(f"  async / lockstep speed: {speedup:.2f}x   async time / zero-latency async time: {hidden:.2f}",
              flush=True)

    if len(backends) > 1:
        subset = samples[:args.backend_trajectories]
        print(f"\nbackends on the same zero-latency work (async schedule, {len(subset)} trajectories):")
        results = {}
        for name, timed in backends.items():
            results[name] = await run_schedule("async", backend=timed, chat=chat, parser=parser, samples=subset,
                                               config=config, latency_s=0.0, seed=args.seed)
            print(_row(name, results[name]), flush=True)
        names = list(results)
        for other in names[1:]:
            print(f"  {names[0]} / {other} tokens/s: "
                  f"{results[names[0]].tokens_per_s / results[other].tokens_per_s:.2f}x")

    print("\nsummary (markdown):")
    print("| mean tool latency | async s | lockstep s | async / lockstep | async / zero-latency async |")
    print("|---|---|---|---|---|")
    for multiple, latency, ours, theirs, speedup, hidden in table:
        print(f"| {multiple:g} x turn ({latency:.2f} s) | {ours.seconds:.1f} | {theirs.seconds:.1f} | "
              f"{speedup:.2f}x | {hidden:.2f} |")
    for timed in backends.values():
        await timed.backend.close()
    print(f"\nwhole run: {time.perf_counter() - started:.0f} s")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=64, help="the rollout batch")
    parser.add_argument("--engine-concurrency", type=int, default=32,
                        help="sequences the backend runs at once (vLLM max_num_seqs, hf max_batch_size)")
    parser.add_argument("--questions", type=int, default=2, help="questions (tool calls) per trajectory")
    parser.add_argument("--max-tokens-per-turn", type=int, default=48)
    parser.add_argument("--latency-multiples", type=float, nargs="+", default=[0, 0.25, 1, 2])
    parser.add_argument("--backends", nargs="+", default=["vllm", "hf"], choices=["vllm", "hf"],
                        help="the first runs the sweep; all run the backend comparison")
    parser.add_argument("--zero-latency-repeats", type=int, default=2,
                        help="times the zero-latency point is measured (the mean is reported)")
    parser.add_argument("--backend-trajectories", type=int, default=16,
                        help="trajectories for the vllm vs hf comparison (hf is the slow one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--quick", action="store_true",
                        help="16 trajectories, engine concurrency 8, 2 questions, m in {0, 1}")
    args = parser.parse_args(argv)
    if args.quick:
        args.trajectories, args.questions, args.latency_multiples = 16, 2, [0, 1]
        args.engine_concurrency, args.zero_latency_repeats = 8, 1
        args.backend_trajectories = 8
    return args


if __name__ == "__main__":  # the guard vLLM's worker processes need
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    asyncio.run(main(parse_args(sys.argv[1:])))
