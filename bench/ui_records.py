"""`rlf ui` on a large run: listing and opening recorded trajectories of a run of 1,000 steps
and 100,000 trajectories, through the real app and through its reading layer.

The runs directory it measures (generated, or reused with ``--dir``) holds:

- ``big``: ``--steps`` (1,000) steps of a deepsearch-like run, every step recording
  ``--eval-per-step`` (84) eval trajectories (an eval at every step: the most files a run can
  have, the worst case for anything that reads every step) and ``--train-groups`` x
  ``--group-size`` (2 x 8 = 16, ``logging.record_train_groups``' default and deepsearch's
  group size) training trajectories: 100 per step, 100,000 in all, 2,000 Parquet files.
  Each trajectory is deepsearch-shaped: the chat-templated system prompt with Search-R1's
  instruction and two worked examples plus the question (~296 tokens with the embedded
  model's tokenizer), then 2 or 3 model turns (``<think>`` + ``<search>`` or ``<answer>``)
  with a 2-passage ``<information>`` observation after each search: ~440 tokens in all. The
  records are made by the real ``trajectory_records`` (real Trajectory and ScoredBatch
  objects, the real tokenizer's token ids and pieces) and written by the real
  ``write_records``. Plus ``metrics.jsonl`` (one line per step, ~80 keys), ``config.yaml``
  (the real deepsearch config), ``status.json`` (finished).
- ``small-0`` .. ``small-2``: 5 steps each of the same shape (the runs list shows them too).

Then it times, each through the app (FastAPI TestClient over ``create_app`` with a bearer
token) and directly through ``RunsData``:

- cold: the first request in a fresh process (its modules imported, the server up; the OS
  page cache is warm: the files were just written or read, and dropping it needs root), one
  process per operation and repeat;
- warm: the same request again in one process, after a first one (the caches filled).

The operations: the runs list, the run page, its metrics, a step's list, lists filtered over
every step, opening a trajectory, one sample at every step, full-text search (a query that
matches nothing, so every file is read, and a common word) and the exports (metrics as CSV;
a step's trajectories and one sample's at every step as JSONL, whole records). A
trajectory of a million tokens in the browser is ``bench/ui_long_trajectory.py``'s.

It prints a table (median and min-max of each) and how much CPU other processes took meanwhile
(on 2 cores, any makes the figures worse). Results: bench/README.md, "Issue 22".

    .venv/bin/python bench/ui_records.py                     # ~5 min: generate into a temp dir (1.5), measure, delete
    .venv/bin/python bench/ui_records.py --dir /tmp/uibench  # generate once, then reuse it
    .venv/bin/python bench/ui_records.py --dir /tmp/uibench --profile open   # cProfile one operation (RunsData)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ui_records_data import BIG, MARKER, describe, generate  # bench/: the script's own directory is on sys.path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0123456789abcdef"
PORT = 8765
# --------------------------------------------------------------------------- the operations


def middle(runs_dir: Path) -> int:
    """The step the operations open: 500 of 1,000."""
    return max(1, json.loads((runs_dir / MARKER).read_text())["steps"] // 2)


def operations(runs_dir: Path) -> dict[str, tuple[str, dict, str]]:
    """name -> (path, params, what it is); the same-sample id is eval trajectory 17's."""
    from rlfactory_core.records import RunRecords

    at, steps = middle(runs_dir), json.loads((runs_dir / MARKER).read_text())["steps"]
    sample = RunRecords(runs_dir / BIG).list("eval", at)[17]["sample_id"]
    return {
        "runs": ("/api/runs", {}, "runs list (1 big + 3 small runs)"),
        "run": (f"/api/runs/{BIG}", {}, "run page"),
        "metrics": (f"/api/runs/{BIG}/metrics", {}, f"metrics ({steps:,} lines)"),
        "step": (f"/api/runs/{BIG}/trajectories", {"kind": "eval", "step": at}, f"one step's list (eval step {at})"),
        "all_stop": (f"/api/runs/{BIG}/trajectories", {"kind": "eval", "stop_reason": "max_turns"},
                     "all eval steps, stop_reason=max_turns"),
        "all_prefetched": (f"/api/runs/{BIG}/trajectories", {"kind": "eval", "stop_reason": "max_turns"},
                           "the same, after the run page's prefetch"),
        "all_reward": (f"/api/runs/{BIG}/trajectories", {"kind": "train", "min_reward": 1.0},
                       "all train steps, min_reward=1"),
        "open": (f"/api/runs/{BIG}/trajectories/eval/{at}/17", {}, f"open one trajectory (eval {at}/17)"),
        "same": (f"/api/runs/{BIG}/same-sample", {"kind": "eval", "sample_id": sample},
                 "same sample at every eval step"),
        # search reads every step's conversations and tool calls: one that matches nowhere reads
        # them all; a common one stops collecting at 200 hits but counts every match
        "search_none": (f"/api/runs/{BIG}/search", {"q": "no-such-text-7f3a"}, "search, no match (every file)"),
        "search_common": (f"/api/runs/{BIG}/search", {"q": "Nairobi"}, "search, a common word (200 hits shown)"),
        "export_metrics": (f"/api/runs/{BIG}/export/metrics.csv", {}, f"export metrics as CSV ({steps:,} steps)"),
        "export_step": (f"/api/runs/{BIG}/export/trajectories.jsonl", {"kind": "eval", "step": at},
                        f"export one step's trajectories (eval {at}, whole records)"),
        "export_sample": (f"/api/runs/{BIG}/export/trajectories.jsonl", {"kind": "eval", "sample_id": sample},
                          "export one sample at every eval step (whole records)"),
    }


def direct(data, name: str, path: str, params: dict):
    """The RunsData call behind operation ``name``."""
    if name == "runs":
        return data.runs()
    if name == "run":
        return data.run(BIG)
    if name == "metrics":
        return data.metrics(BIG)
    if name in ("step", "all_stop", "all_prefetched", "all_reward"):
        kind = params["kind"]
        return data.trajectories(BIG, kind, **{k: v for k, v in params.items() if k != "kind"})
    if name == "open":
        kind, step, index = path.split("/")[-3:]
        return data.trajectory(BIG, kind, int(step), int(index))
    if name == "same":
        return data.same_sample(BIG, "eval", params["sample_id"])
    if name.startswith("search"):
        from rlfactory_cli.ui import search

        return search.search(data, BIG, params["q"])
    if name == "export_metrics":
        from rlfactory_cli.ui import export

        return export.metrics_csv(data, BIG)
    if name.startswith("export"):
        from rlfactory_cli.ui import export

        return b"".join(export.trajectories_jsonl(data, BIG, **params))
    raise ValueError(name)


def client_for(runs_dir: Path):
    from fastapi.testclient import TestClient

    from rlfactory_cli.ui.app import create_app

    app = create_app(runs_dir, token=TOKEN, port=PORT)
    return TestClient(app, base_url=f"http://127.0.0.1:{PORT}", headers={"Authorization": f"Bearer {TOKEN}"})


def timed(runs_dir: Path, name: str, via: str, repeats: int, ops=None, data=None, client=None) -> dict:
    """``repeats`` timings (ms) of operation ``name``; the first is the cold one when the
    caches are fresh."""
    from rlfactory_cli.ui.runs_data import RunsData

    path, params, _ = (ops or operations(runs_dir))[name]
    times, size = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        if via == "app":
            response = client.get(path, params=params)
            if response.status_code != 200:
                raise SystemExit(f"{path} {params}: HTTP {response.status_code} {response.text[:300]}")
            size = len(response.content)
        else:
            direct(data or RunsData(runs_dir), name, path, params)
        times.append((time.perf_counter() - start) * 1000)
    return {"times": times, "bytes": size}


def probe(runs_dir: Path, name: str, via: str) -> None:
    """One cold request in this (fresh) process; prints its time as JSON."""
    import pyarrow.compute  # noqa: F401 - the server has imported them by its first request too
    import pyarrow.parquet  # noqa: F401
    import yaml  # noqa: F401

    from rlfactory_cli.ui.runs_data import RunsData

    ops = operations(runs_dir)  # reads step 500's list: a fresh RunsData below has not
    prefetch = None
    if via == "app":
        with client_for(runs_dir) as client:
            client.get("/api/new-run/form/none-such")  # the app's first request (routing, middleware) warm
            if name == "all_prefetched":  # the run page, then what the user does next once its prefetch is done
                start = time.perf_counter()
                client.get(f"/api/runs/{BIG}")
                client.app.state.data.prefetch(BIG).result()
                prefetch = (time.perf_counter() - start) * 1000
            result = timed(runs_dir, name, via, 1, ops, client=client)
    else:
        data = RunsData(runs_dir)
        if name == "all_prefetched":
            start = time.perf_counter()
            data.prefetch(BIG).result()
            prefetch = (time.perf_counter() - start) * 1000
        result = timed(runs_dir, name, via, 1, ops, data=data)
    print(json.dumps({**result, "prefetch": prefetch}))


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (/proc/stat; 0 where there is none)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and its finished children (the cold probes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def spread(times: list[float]) -> str:
    return f"{statistics.median(times):.1f} ({min(times):.1f}-{max(times):.1f})"


def measure(runs_dir: Path, args) -> None:
    from rlfactory_cli.ui.runs_data import RunsData

    ops = operations(runs_dir)
    names = [n for n in ops if not args.only or n in args.only]
    rows = []
    busy, own, start = machine_busy_s(), own_cpu_s(), time.perf_counter()
    for name in names:
        cold, prefetches = {}, []
        for via in ("app", "data"):
            times, size = [], 0
            for _ in range(args.cold_repeats):
                out = subprocess.run([sys.executable, __file__, "--dir", str(runs_dir), "--probe", name, via],
                                     capture_output=True, text=True, cwd=ROOT)
                if out.returncode:
                    raise SystemExit(out.stderr[-2000:])
                result = json.loads(out.stdout.strip().splitlines()[-1])
                times += result["times"]
                size = result["bytes"] or size
                if result["prefetch"] is not None:
                    prefetches.append(result["prefetch"])
            cold[via] = (times, size)
        warm = {}
        with client_for(runs_dir) as client:
            timed(runs_dir, name, "app", 1, ops, client=client)
            if name == "run" and hasattr(client.app.state.data, "prefetch"):  # (none before issue 22's bench)
                client.app.state.data.prefetch(BIG).result()  # the run page's, done before timing it again
            warm["app"] = timed(runs_dir, name, "app", args.warm_repeats, ops, client=client)
        data = RunsData(runs_dir)
        timed(runs_dir, name, "data", 1, ops, data=data)
        warm["data"] = timed(runs_dir, name, "data", args.warm_repeats, ops, data=data)
        row = (ops[name][2], spread(cold["app"][0]), spread(warm["app"]["times"]), spread(cold["data"][0]),
               spread(warm["data"]["times"]), f"{cold['app'][1] / 1000:.0f}")
        rows.append(row)
        print(f"  {name}: app cold {row[1]} warm {row[2]}; RunsData cold {row[3]} warm {row[4]}; "
              f"{row[5]} kB" + (f"; the prefetch took {spread(prefetches)} ms" if prefetches else ""), flush=True)
    others = max(0.0, machine_busy_s() - busy - (own_cpu_s() - own)) / ((time.perf_counter() - start) * os.cpu_count())
    print(f"\nms, median (min-max); cold: {args.cold_repeats} fresh processes each, warm: "
          f"{args.warm_repeats} repeats after a first request; other processes used {others:.0%} of the "
          f"{os.cpu_count()} CPUs meanwhile\n")
    print("| operation | app cold | app warm | RunsData cold | RunsData warm | response kB |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def profile(runs_dir: Path, name: str, warm: bool) -> None:
    """cProfile of operation ``name`` through RunsData, in this process (the app runs its
    routes in another thread, which cProfile does not see)."""
    import cProfile
    import pstats

    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from rlfactory_cli.ui.runs_data import RunsData

    ops = operations(runs_dir)
    data = RunsData(runs_dir)
    if warm:
        timed(runs_dir, name, "data", 1, ops, data=data)
    profiler = cProfile.Profile()
    profiler.enable()
    result = timed(runs_dir, name, "data", 1, ops, data=data)
    profiler.disable()
    print(f"{name} ({'warm' if warm else 'cold'}): {result['times'][0]:.1f} ms")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, help="runs directory: generated there if it holds none, else reused")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--eval-per-step", type=int, default=84)
    parser.add_argument("--train-groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1,
                        help="processes generating the run (2 were no faster on 2 cores: 8.5 against 9.4 steps/s)")
    parser.add_argument("--cold-repeats", type=int, default=5)
    parser.add_argument("--warm-repeats", type=int, default=10)
    parser.add_argument("--only", nargs="*", help="operations to measure (default: all)")
    parser.add_argument("--profile", help="cProfile one operation through RunsData (cold, then warm)")
    parser.add_argument("--probe", nargs=2, metavar=("OPERATION", "VIA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "cli")]
    if args.probe:
        probe(args.dir, *args.probe)
        return
    temp = None
    runs_dir = args.dir
    if runs_dir is None:
        temp = tempfile.mkdtemp(prefix="ui-records-")
        runs_dir = Path(temp)
    try:
        if (runs_dir / MARKER).exists():
            shape = json.loads((runs_dir / MARKER).read_text())
            print(f"reusing {runs_dir}: {shape}")
        else:
            shape = generate(runs_dir, args)
            print(f"generated in {shape['generated_s']} s")
        about = describe(runs_dir)
        total = about["eval"]["bytes"] + about["train"]["bytes"]
        print(f"{BIG}: eval {about['eval']['rows']} trajectories in {about['eval']['files']} files, train "
              f"{about['train']['rows']} in {about['train']['files']}; {total / 1e6:.1f} MB of Parquet "
              f"({about['eval']['bytes'] / about['eval']['files'] / 1e3:.0f} kB per eval file, "
              f"{about['train']['bytes'] / about['train']['files'] / 1e3:.0f} kB per train file); "
              f"{about['tokens_mean']:.0f} tokens and {about['turns_mean']:.2f} turns per trajectory; metrics.jsonl "
              f"{about['metrics_bytes'] / 1e6:.1f} MB, {about['metrics_keys']} keys a line")
        if args.profile:
            profile(runs_dir, args.profile, warm=False)
            profile(runs_dir, args.profile, warm=True)
            return
        measure(runs_dir, args)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
