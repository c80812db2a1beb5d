"""Schedules side by side: ``train.mode=sync`` against ``one_step_off`` and ``async``, same engine, commit and
workload, with the bound overlap can reach computed from the sync arm before any tuning.

Each arm is a real ``rlf train`` process (the embedded default model, ``--steps`` steps of
``--prompts`` x ``--group`` trajectories, no dynamic sampling, so every step holds the same
groups). Throughput is counted over the steady steps (2 to N-1: step 1 has nothing to overlap,
step N ends with the final eval): trained samples, trained tokens and steps per minute.

**The bound** (``bound_from_sync``, from the sync arm's recorded phase times and the machine's
CPU use during them, measured from ``/proc/stat``): with the next rollout (``R``: rollout and
reward) beside the rest of the step (``T``: update, weight sync, eval, checkpoint), a step
takes at least ``max(R, T)``, and, the CPU work being the same, at least ``U x (R + T)`` where
``U`` is the share of the machine's cores the sync run kept busy (``U`` near 1: both phases
compute-bound on these cores, nothing to gain; a rollout waiting on a server leaves ``U``
low). The bound is ``sum(R + T) / sum(max(R, T, U x (R + T)))`` over the steady steps.

Workloads:

* ``compute``: arithmetic (the calculator tool, in process): both phases compute on the CPU.
* ``latency``: deepsearch against ``rlf retriever serve`` over HTTP (``HTTPRetriever``), behind
  a proxy that holds each request ``--latency`` seconds (uniform in the range): the rollout waits.

On the ray engine (``engine=ray`` among the overrides), ``auto`` keeps the default colocated
placement (the trainer rank and the rollout worker share the cores and take turns, each using
all of them: in sync one phase after the other, in the overlapping modes with generation
paused while the update computes), and ``separate`` sets ``ray.placement=separate`` (a core
each, both at once).

Core splits (``MODE:SPLIT[:ORDER]`` in ``--arms``; ``ORDER`` sets ``train.generation_order``,
e.g. ``async:auto:backend`` for the order left to vLLM): ``shared`` (every phase on every core: vLLM's worker
bound to all of them, torch's default threads for the update), ``split`` (vLLM's worker on the
first core, ``VLLM_CPU_OMP_THREADS_BIND``, the update on one thread, ``train.threads=1``), ``split_auto``
or ``take_turns`` (``train.overlap_cores``: the run splits the cores by itself,
:func:`rlfactory_core.engines.local.overlap_core_split`, or pauses generation while the update
computes, :func:`rlfactory_core.engines.local.takes_turns`), ``separate`` (the ray engine's
roles on cores of their own, above), or ``auto`` (nothing set: what a run does by itself).

    .venv/bin/python bench/async_modes.py --workload compute      # ~15 min on 2 cores
    .venv/bin/python bench/async_modes.py --workload latency      # ~15 min
    .venv/bin/python bench/async_modes.py --arms sync:shared one_step_off:shared async:shared async:split
    .venv/bin/python bench/async_modes.py --seeds 0 1 2     # every arm per seed, interleaved: the spread
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

WORKLOADS = {
    "compute": ["--env", "arithmetic", "env_options={questions_per_episode: 1}", "rollout.max_turns=3",
                "rollout.max_tokens_per_turn=48", "rollout.sampling.temperature=0.7", "train.lr=1e-5"],
    "latency": ["--env", "deepsearch", "cold_start.source=off", "grpo.dynamic_sampling=false"],
}


def bound_from_sync(records: list[dict[str, Any]], busy: float) -> dict[str, float]:
    """The overlap bound (see the module docstring) from the sync arm's steady steps and
    ``busy``, the share of the machine's cores in use while they ran."""
    rollout = [r["time/rollout"] + r.get("time/reward", 0.0) for r in records]
    rest = [r["time/step"] - x for r, x in zip(records, rollout)]
    total = sum(r["time/step"] for r in records)
    floor = sum(max(x, y, busy * (x + y)) for x, y in zip(rollout, rest))
    return {"rollout_s": sum(rollout) / len(records), "rest_s": sum(rest) / len(records), "busy": busy,
            "bound": total / floor, "bound_without_cpu": total / sum(max(x, y) for x, y in zip(rollout, rest))}


class CpuSampler:
    """The machine's busy CPU time, sampled from ``/proc/stat`` every ``period`` seconds."""

    def __init__(self, period: float = 0.25):
        self.period, self.samples = period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _read() -> tuple[float, float]:
        fields = [float(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), *self._read()))
            time.sleep(self.period)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def busy(self, start: float, end: float) -> float:
        """The share of all cores busy between ``start`` and ``end`` (epoch seconds)."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return float("nan")
        (_, busy0, all0), (_, busy1, all1) = inside[0], inside[-1]
        return (busy1 - busy0) / max(all1 - all0, 1e-9)


def forward(handler: http.server.BaseHTTPRequestHandler, upstream: str, body: bytes) -> None:
    """A proxy's answer to a POST: ``body`` sent to ``upstream``, its JSON answer sent back."""
    request = urllib.request.Request(upstream, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        data = response.read()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextlib.contextmanager
def retriever_server() -> Iterator[str]:
    """``rlf retriever serve`` (BM25 on the deepsearch corpus); yields its ``/retrieve`` URL."""
    server = subprocess.Popen([sys.executable, "-m", "rlfactory_cli", "retriever", "serve", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = server.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"rlf retriever serve did not start (said {url!r})")
        yield url
    finally:
        server.terminate()
        server.wait(30)


@contextlib.contextmanager
def latency_retriever(latency: tuple[float, float], seed: int = 0) -> Iterator[str]:
    """``rlf retriever serve`` (BM25 on the deepsearch corpus) behind a proxy that holds every
    request for a time drawn from ``latency``; yields the proxy's ``/retrieve`` URL."""
    with retriever_server() as upstream:
        rng, lock = random.Random(seed), threading.Lock()

        class Proxy(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    delay = rng.uniform(*latency)
                time.sleep(delay)
                forward(self, upstream, body)

            def log_message(self, *args: Any) -> None:
                pass

        proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{proxy.server_address[1]}/retrieve"
        finally:
            proxy.shutdown()


def run_arm(mode: str, split: str, order: str, seed: int, args: argparse.Namespace, extra: list[str], work: Path,
            sampler: CpuSampler) -> dict[str, Any]:
    """One ``rlf train`` run; its steady steps' records and throughputs."""
    run_dir = work / f"{mode}-{split}-{order}-seed{seed}"
    env = dict(os.environ)
    overrides = [f"train.mode={mode}", f"train.steps={args.steps}", f"train.seed={seed}",
                 f"grpo.prompts_per_step={args.prompts}", f"grpo.group_size={args.group}", "eval.every=0",
                 f"data.eval_size={args.eval_size}", f"checkpoint.every={args.steps}", "logging.live=off",
                 "logging.tensorboard=false", f"backend={args.backend}"]
    if mode == "async":  # stale tokens need the decoupled objective's weight (a preflight rule)
        overrides += ["grpo.tis_cap=2.0", f"train.max_staleness={args.max_staleness}"]
    if order != "auto":
        overrides.append(f"train.generation_order={order}")
    if split == "separate":  # the ray engine's roles each on their own cores
        overrides.append("ray.placement=separate")
    elif split == "split":
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0"
        overrides.append("train.threads=1")
    elif split in ("split_auto", "take_turns"):  # train.overlap_cores, the run's own way to share them
        overrides.append(f"train.overlap_cores={split.replace('_auto', '')}")
    elif split == "shared":  # every core for each phase (for overlapping modes, the user's choice over the auto split)
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    argv = [sys.executable, "-m", "rlfactory_cli", "train", "--run-dir", str(run_dir), *extra, *overrides]
    started = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{mode}/{split} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in records if r["step"] >= 1}
    steady = [steps[k] for k in range(2, args.steps)]
    window = steps[args.steps - 1]["time"] - steps[1]["time"]
    minutes = window / 60
    samples = len(steady) * args.prompts * args.group
    return {"mode": mode, "split": split if order == "auto" else f"{split}, order {order}", "seed": seed, "records": steady, "wall_s": time.time() - started,
            "busy": sampler.busy(steps[1]["time"], steps[args.steps - 1]["time"]),
            "steps_per_min": len(steady) / minutes, "samples_per_min": samples / minutes,
            "tokens_per_min": sum(r["train/trained_tokens"] for r in steady) / minutes,
            "rollout_wait_s": sum(r.get("time/rollout_wait", r["time/rollout"]) for r in steady) / len(steady),
            "stale_fraction": sum(r.get("train/stale_token_fraction", 0.0) for r in steady) / len(steady),
            # what the steps trained, per trajectory: an arm that under-trains long trajectories shows here
            "tokens_per_traj": sum(r["batch/trained_tokens_mean"] for r in steady) / len(steady),
            "turns_per_traj": sum(r["batch/trained_turns_mean"] for r in steady) / len(steady)}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="compute")
    parser.add_argument("--arms", nargs="+", default=["sync:auto", "one_step_off:auto", "async:auto"],
                        help="MODE:SPLIT[:ORDER], the first a sync arm (the baseline and the bound's source); "
                             "ORDER: train.generation_order (default auto)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--eval-size", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="train.seed of each run; the arms run interleaved, seed by seed")
    parser.add_argument("--max-staleness", type=int, default=1, help="the async arms' train.max_staleness")
    parser.add_argument("--backend", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--latency", type=float, nargs=2, default=(0.5, 1.0), metavar=("MIN", "MAX"))
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("overrides", nargs="*", help="more config overrides for every arm")
    args = parser.parse_args(argv)
    if args.steps < 4:
        parser.error("--steps must be at least 4 (the steady steps are 2 to N-1)")
    arms = [(*arm.split(":"), "auto")[:3] for arm in args.arms]
    if arms[0][0] != "sync":
        parser.error("the first arm must be a sync arm: the baseline and the bound come from it")
    splits = {"auto", "shared", "split", "split_auto", "take_turns", "separate"}
    for mode, split, _ in arms:
        if split not in splits:
            parser.error(f"--arms: {mode}:{split}: the cores are one of {', '.join(sorted(splits))}")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="rlf-async-modes-"))
    by_seed: dict[int, list[dict[str, Any]]] = {}
    with CpuSampler() as sampler, contextlib.ExitStack() as stack:
        extra = list(WORKLOADS[args.workload])
        if args.workload == "latency":
            url = stack.enter_context(latency_retriever(tuple(args.latency), args.seeds[0]))
            extra.append(f"env_options={{retriever: http, url: '{url}'}}")
        for seed in args.seeds:
            for mode, split, order in arms:
                print(f"running {mode} ({split}, order {order}), seed {seed} ...", flush=True)
                by_seed.setdefault(seed, []).append(run_arm(mode, split, order, seed, args,
                                                            [*extra, *args.overrides], work, sampler))
    print(f"\nworkload {args.workload}, backend {args.backend}, {args.prompts} prompts x {args.group}, steady steps "
          f"2-{args.steps - 1}; nproc {os.cpu_count()}")
    ratios: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for seed, results in by_seed.items():
        base = results[0]
        bound = bound_from_sync(base["records"], base["busy"])
        print(f"\nseed {seed}: sync phases: rollout {bound['rollout_s']:.1f} s, the rest {bound['rest_s']:.1f} s a "
              f"step; cores busy {bound['busy']:.2f}; bound {bound['bound']:.2f}x (without the CPU limit "
              f"{bound['bound_without_cpu']:.2f}x)")
        print("| mode | cores | steps/min | samples/min | tokens/min | vs sync (samples) | of the bound | "
              "rollout wait s/step | stale tokens | cores busy | trained tokens/traj | turns/traj |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in results:
            ratio = r["samples_per_min"] / base["samples_per_min"]
            ratios.setdefault((r["mode"], r["split"]), []).append((ratio, ratio / bound["bound"]))
            print(f"| {r['mode']} | {r['split']} | {r['steps_per_min']:.2f} | {r['samples_per_min']:.1f} | "
                  f"{r['tokens_per_min']:.0f} | {ratio:.2f}x | {ratio / bound['bound']:.2f} | "
                  f"{r['rollout_wait_s']:.1f} | {r['stale_fraction']:.2f} | {r['busy']:.2f} | "
                  f"{r['tokens_per_traj']:.0f} | {r['turns_per_traj']:.2f} |")
    if len(by_seed) > 1:
        print(f"\nover seeds {', '.join(map(str, by_seed))}: mean (min-max), each run against its seed's sync run")
        print("| mode | cores | vs sync (samples) | of the bound |\n|---|---|---|---|")
        for (mode, split), values in ratios.items():
            vs, of = [v for v, _ in values], [o for _, o in values]
            print(f"| {mode} | {split} | {sum(vs) / len(vs):.2f}x ({min(vs):.2f}-{max(vs):.2f}) | "
                  f"{sum(of) / len(of):.2f} ({min(of):.2f}-{max(of):.2f}) |")
    print(f"\nruns in {work}")


if __name__ == "__main__":
    main(sys.argv[1:])
