"""Failure-aware training under injected faults (issue 39): does a flaky service teach the policy
the wrong lesson, and does the default handling (``failures.infrastructure=resample``) stop it?

Each arm is a real ``rlf train`` process: deepsearch, RL from the base model
(``cold_start.source=off``: the shipped recipe's gain is mostly its warm-up's, which would hide
what RL learns), its searches sent to ``rlf retriever serve`` over HTTP through a proxy that
injects faults **at the service**: with probability ``RATE`` a search request fails, one third
each as a 503 answer, a hang past the tool manager's ``timeout_s`` (a timeout) and a connection
dropped without an answer (a crash). The tool manager does not retry (``max_retries: 0``) and
the env sends every search alone (``max_batch: 1``), so ``RATE`` is the share of searches that
fail. Faults hit training only: the held-out evaluation runs afterwards, with ``rlf eval`` on
each checkpoint, against the healthy server (then the checkpoint is deleted; its report stays).

Arms (``--arms``): ``none`` (no faults), ``default:RATE`` (faults, the default handling: the
failed members run again, then masked, the survivors weighed to undo that selection),
``uncorrected:RATE`` (the same without the weights: ``failures.resample_correction=none``),
``retry:RATE`` (the default handling, and each call the service failed run again up to twice before
the model reads a result: ``rollout.infrastructure_retries=2``),
``penalize:RATE`` (faults, every class trained as scored: what every run did before outcomes). Seeds (``train.seed``: data order and sampling)
run interleaved, seed 0 of every arm first, so a slower stretch of the machine falls on every
arm alike.

Reported per arm (mean and range over seeds): held-out exact match and searches per held-out
question at each checkpoint; in training, searches per trajectory, the share of the trained
batch's searches that failed (``tools/error_rate``; for ``penalize`` about ``RATE`` while
failures stay independent, more when one failure holds up other searches, as a hung request
once did; for ``default`` lower, the failed members being replaced), the share of trajectories
the service failed (``outcome/infrastructure``, counted before the handling for resampled
members via ``outcome/resampled/*``), and ``advantage/on_infrastructure`` (the advantage the
steps gave trajectories the service failed: negative when they are trained on as wrong
answers). Baselines on the same held-out questions: the untrained model (step 0; no warm-up
here, so also the warm-up-alone score) and the training split's majority answer; the env has
no tools-off mode. A PNG puts the arms' curves side by side (``--png``), and ``rlf plot`` draws
each arm's seed-0 run.

    .venv/bin/python bench/fault_injection.py --work-dir DIR          # none, default:0.5, penalize:0.5; seed 0
    .venv/bin/python bench/fault_injection.py --seeds 0 1 2 --work-dir DIR   # finished runs in DIR are reused
    .venv/bin/python bench/fault_injection.py --arms none default:0.2 default:0.5 penalize:0.5 ...
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.server
import json
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from async_learning import majority_baseline  # bench/: the script's own directory is on sys.path
from async_modes import forward, retriever_server

from rlfactory_core.metrics import read_metrics

ACCURACY, SEARCHES = "eval/reward/accuracy", "eval/tools/calls_per_trajectory"
TOOL_TIMEOUT_S = 3.0  # the tool manager's timeout_s in every arm; a hang lasts longer
DEEPSEARCH = ["--env", "deepsearch", "cold_start.source=off"]


@contextlib.contextmanager
def faulty_proxy(upstream: str, rate: float, seed: int) -> Iterator[tuple[str, collections.Counter[str]]]:
    """A proxy in front of ``upstream`` that fails each request with probability ``rate`` (a
    503, a hang past the tool manager's timeout, or a dropped connection, in equal shares); yields
    its URL and the counter of what it did."""
    rng, lock, counts = random.Random(seed), threading.Lock(), collections.Counter()

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                fault = rng.choice(["503", "hang", "drop"]) if rng.random() < rate else "ok"
                counts[fault] += 1
            if fault == "503":
                self.send_error(503, "injected: service unavailable")
                return
            if fault == "hang":
                time.sleep(TOOL_TIMEOUT_S + 1.0)
            if fault == "drop":  # a crash: the connection closes with no answer
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            with contextlib.suppress(OSError):  # the client gave up on a hung request meanwhile
                forward(self, upstream, body)

        def log_message(self, *args: Any) -> None:
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    proxy.daemon_threads = True
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}/retrieve", counts
    finally:
        proxy.shutdown()


def env_options(url: str) -> str:
    return f"env_options={{retriever: http, url: '{url}', max_batch: 1}}"


def parse_arm(parser: argparse.ArgumentParser, arm: str) -> tuple[str, float]:
    handling, _, rate = arm.partition(":")
    if arm == "none":
        return "default", 0.0
    try:
        value = float(rate)
    except ValueError:
        value = -1.0
    if handling not in ("default", "uncorrected", "retry", "penalize") or not 0 < value <= 1:
        parser.error(f"--arms {arm}: give none, default:RATE, uncorrected:RATE, retry:RATE or penalize:RATE with "
                     "RATE in (0, 1]")
    return handling, value


def evaluate(model: str, report: Path, url: str, args: argparse.Namespace) -> dict[str, float]:
    """``rlf eval`` of ``model`` on the first ``--eval-size`` test questions, healthy service."""
    if not (report / "report.json").is_file():
        argv = [sys.executable, "-m", "rlfactory_cli", "eval", "--env", "deepsearch", "--model", model,
                "--size", str(args.eval_size), "--report", str(report), f"backend={args.backend}", env_options(url)]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"rlf eval of {model} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads((report / "report.json").read_text())["metrics"]


def run_arm(arm: str, handling: str, rate: float, seed: int, url: str, args: argparse.Namespace,
            work: Path) -> dict[str, Any]:
    """One ``rlf train`` run under faults, then ``rlf eval`` of each checkpoint."""
    run_dir = work / f"{arm.replace(':', '-')}-seed{seed}"
    overrides = [f"train.steps={args.steps}", f"train.seed={seed}", "eval.every=0", "data.eval_size=1",
                 f"checkpoint.every={args.eval_every}", "checkpoint.keep=100", "logging.live=off",
                 "logging.tensorboard=false", f"backend={args.backend}",
                 f"tool_manager.options={{max_retries: 0, timeout_s: {TOOL_TIMEOUT_S:g}}}"]
    if handling == "penalize":
        overrides.append("failures.infrastructure=penalize")
    if handling == "uncorrected":
        overrides.append("failures.resample_correction=none")
    if handling == "retry":
        overrides.append("rollout.infrastructure_retries=2")
    finished = (run_dir / "metrics.jsonl").is_file() and max(r["step"] for r in read_metrics(run_dir)) == args.steps
    faults: collections.Counter[str] = collections.Counter()
    if finished:
        print(f"  reusing the finished run in {run_dir}", flush=True)
    else:
        with faulty_proxy(url, rate, seed) as (proxy, faults):
            argv = [sys.executable, "-m", "rlfactory_cli", "train", "--run-dir", str(run_dir), *DEEPSEARCH,
                    env_options(proxy), *overrides, *args.overrides]
            started = time.time()
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{arm} seed {seed} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        (run_dir / "faults.json").write_text(json.dumps({"faults": dict(faults), "minutes": (time.time() - started) / 60}))
    # every training step, trained on or not (a step whose trajectories were all masked has no loss)
    steps = [r for r in read_metrics(run_dir) if r["step"] >= 1 and "reward/mean" in r]
    evals = {}
    for checkpoint in sorted((run_dir / "checkpoints").glob("step-*")):
        step = int(checkpoint.name.split("-")[1])
        evals[step] = evaluate(str(checkpoint), run_dir / f"eval-step-{step}", url, args)
        # ~0.9 GB each (weights and optimizer state): 2 per run, 27 runs filled this machine's disk
        shutil.rmtree(checkpoint)
    for report in sorted(run_dir.glob("eval-step-*/report.json")):  # evaluated before, checkpoint gone
        evals.setdefault(int(report.parent.name.rsplit("-", 1)[1]), json.loads(report.read_text())["metrics"])
    evals = dict(sorted(evals.items()))
    return {"arm": arm, "seed": seed, "steps": steps, "evals": evals,
            "faults": json.loads((run_dir / "faults.json").read_text())}


def per_step(run: dict[str, Any], key: str) -> list[float]:
    return [r.get(key, 0.0) for r in run["steps"]]


def resampled_share(record: dict[str, Any]) -> float:
    return sum(v for k, v in record.items() if k.startswith("outcome/resampled/"))


def spread(values: list[float]) -> str:
    mean = sum(values) / len(values)
    return f"{mean:.3f}" if len(values) == 1 else f"{mean:.3f} ({min(values):.3f}-{max(values):.3f})"


def draw(runs: dict[str, list[dict[str, Any]]], base: dict[str, float], png: Path) -> None:
    """The arms side by side: held-out exact match per checkpoint, searches per trajectory in
    training and held out, each arm's seed mean with its range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for arm, arm_runs in runs.items():
        steps = list(range(1, len(arm_runs[0]["steps"]) + 1))
        for ax, values in ((axes[1], [per_step(r, "tools/calls_per_trajectory") for r in arm_runs]),):
            mean = [sum(v[i] for v in values) / len(values) for i in range(len(steps))]
            line, = ax.plot(steps, mean, marker=".", label=arm)
            ax.fill_between(steps, [min(v[i] for v in values) for i in range(len(steps))],
                            [max(v[i] for v in values) for i in range(len(steps))], color=line.get_color(), alpha=0.15)
        for ax, key in ((axes[0], ACCURACY), (axes[2], SEARCHES)):
            evaluated = [0] + sorted(arm_runs[0]["evals"])
            values = [[base[key]] + [r["evals"][s][key] for s in evaluated[1:]] for r in arm_runs]
            mean = [sum(v[i] for v in values) / len(values) for i in range(len(evaluated))]
            line, = ax.plot(evaluated, mean, marker="o", label=arm)
            ax.fill_between(evaluated, [min(v[i] for v in values) for i in range(len(evaluated))],
                            [max(v[i] for v in values) for i in range(len(evaluated))], color=line.get_color(),
                            alpha=0.15)
    for ax, title in zip(axes, ("held-out exact match", "searches / trajectory (training)",
                                "searches / question (held out)")):
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # a flat line must look flat
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=["none", "default:0.5", "penalize:0.5"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=4, help="a checkpoint, evaluated afterwards, every N steps")
    parser.add_argument("--eval-size", type=int, default=100)
    parser.add_argument("--backend", default="vllm")
    parser.add_argument("--work-dir", type=Path, required=True, help="runs kept here; a rerun reuses finished ones")
    parser.add_argument("--png", type=Path, default=None, help="the side-by-side curves (default WORK_DIR/arms.png)")
    parser.add_argument("overrides", nargs="*", help="more rlf train overrides, for every arm")
    args = parser.parse_args(argv)
    arms = {arm: parse_arm(parser, arm) for arm in args.arms}
    args.work_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    with retriever_server() as url:
        base = evaluate("smollm2-135m-instruct", args.work_dir / "eval-untrained", url, args)
        for seed in args.seeds:
            for arm, (handling, rate) in arms.items():
                print(f"{arm}, seed {seed} ...", flush=True)
                runs[arm].append(run_arm(arm, handling, rate, seed, url, args, args.work_dir))
    answer, majority = majority_baseline("latency", args.eval_size)
    print(f"\ndeepsearch from the base model, {args.steps} steps, seeds {args.seeds}; held-out: the first "
          f"{args.eval_size} test questions, healthy service")
    print(f"baselines: untrained model {base[ACCURACY]:.3f} ({base[SEARCHES]:.2f} searches/question; also the "
          f"warm-up-alone score: no warm-up), majority answer ({answer!r}) {majority:.3f}\n")
    last = max(runs[args.arms[0]][0]["evals"])
    print(f"| arm | held-out step {last} | searches/question held out | searches/trajectory in training, last 2 "
          f"steps | searches failed, training | failed by the service, training | resampled / trajectory | advantage on "
          f"the service's failures, sum over steps |")
    print("|---|---|---|---|---|---|---|---|")
    for arm, arm_runs in runs.items():
        def over(fn):
            return spread([fn(r) for r in arm_runs])
        print(f"| {arm} | {over(lambda r: r['evals'][last][ACCURACY])} | {over(lambda r: r['evals'][last][SEARCHES])} "
              f"| {over(lambda r: sum(per_step(r, 'tools/calls_per_trajectory')[-2:]) / len(r['steps'][-2:]))} "
              f"| {over(lambda r: sum(per_step(r, 'tools/error_rate')) / len(r['steps']))} "
              f"| {over(lambda r: sum(per_step(r, 'outcome/infrastructure')) / len(r['steps']))} "
              f"| {over(lambda r: sum(resampled_share(s) for s in r['steps']) / len(r['steps']))} "
              f"| {over(lambda r: sum(per_step(r, 'advantage/on_infrastructure')))} |")
    print("\nper seed (held-out exact match by checkpoint; injected faults):")
    for arm, arm_runs in runs.items():
        for run in arm_runs:
            curve = ", ".join(f"{s}: {e[ACCURACY]:.2f}" for s, e in sorted(run["evals"].items()))
            print(f"  {arm} seed {run['seed']}: {curve}; {run['faults']['faults']}, "
                  f"{run['faults']['minutes']:.1f} min")
    png = args.png or args.work_dir / "arms.png"
    draw(runs, base, png)
    print(f"\ncurves: {png}")
    for arm in runs:  # each arm's seed-0 run, as rlf plot draws a run
        run_dir = args.work_dir / f"{arm.replace(':', '-')}-seed{args.seeds[0]}"
        subprocess.run([sys.executable, "-m", "rlfactory_cli", "plot", str(run_dir)], check=False)


if __name__ == "__main__":
    main(sys.argv[1:])
