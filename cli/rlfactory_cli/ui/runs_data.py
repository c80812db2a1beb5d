"""What the UI shows, read from the runs directory: runs, their metrics, their recorded
trajectories (:mod:`rlfactory_core.records`).

Reads are cached by each file's (mtime, size), so a live page that polls every few seconds
parses a growing ``metrics.jsonl`` (and builds its series) or a step's Parquet file once per
change, and listing a run's 100k recorded trajectories reads each step file's small scalar
columns once. Opening one trajectory reads its step's file alone. A file that cannot be read
gives an error for that part (``"error"`` in the answer), never an exception that takes the
page down. ``bench/ui_records.py`` measures all of it on a run of 1,000 steps and 100k
trajectories.
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from rlfactory_core._fs import write_text_atomic
from rlfactory_core.errors import RLFactoryError
from rlfactory_core.metrics import read_metrics
from rlfactory_core.records import RECORDS_DIR, RecordError, RunRecords, scalar_schema
from rlfactory_core.run_status import STATUS_FILE, RunStatus, read_status, still_exiting

from .compare import shared_prefix
from .security import PathRefused, run_dir_of

__all__ = ["RunsData", "json_safe", "HELD_OUT_KEYS"]

#: The held-out number a run is summed up by: accuracy when a reward judges it, else the mean reward.
HELD_OUT_KEYS = ("eval/reward/accuracy", "eval/reward/mean")
#: Where a run directory says it is one.
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "status.json")
#: Step files read side by side when a request reads many.
READ_THREADS = 8
#: Where the runs' tags are kept, in the runs directory (a dot file: not a run).
TAGS_FILE = ".rlf-ui-tags.json"
MAX_TAGS = 20
#: The trajectory list's columns it can be sorted by.
SORTABLE = ("step", "index", "sample_id", "group", "reward", "advantage", "num_turns", "stop_reason", "outcome")
#: Why a file of a run is not read: it leads out of the runs directory (README, `rlf ui`).
REFUSED = "a symlink out of the runs directory: not read"


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class _FileCache:
    """``load(path)`` once per (mtime, size) of the file."""

    def __init__(self, load: Callable[[Path], Any]):
        self.load, self.entries, self.lock = load, {}, threading.Lock()

    def __call__(self, path: Path) -> Any:
        key, hit = self._lookup(path)
        if hit is not _MISSING:
            return hit
        value = self.load(path)
        with self.lock:
            self.entries[path] = (key, value)
        return value


    def cached(self, path: Path) -> Any:
        """The value for the file as it is now if it is cached, else ``_MISSING``."""
        return self._lookup(path)[1]

    def _lookup(self, path: Path) -> tuple[tuple[int, int], Any]:
        stat = path.stat()
        key = (stat.st_mtime_ns, stat.st_size)
        with self.lock:
            hit = self.entries.get(path)
        return key, hit[1] if hit is not None and hit[0] == key else _MISSING


_MISSING = object()


def _yaml_file(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


class RunsData:
    """The runs under ``runs_dir`` (each a directory with a config, metrics or status)."""

    def __init__(self, runs_dir: str | Path,
                 controls: Callable[[str, Path, RunStatus], dict[str, Any]] | None = None):
        """``controls(name, run_dir, status)``: what the page shows and offers for a run (the
        launcher's: ``state``, ``message``, ``can_stop``, ``can_resume``), merged over its
        summary; without it, the status as it is, nothing offered."""
        self.runs_dir = Path(runs_dir).resolve()
        self.controls = controls
        self._tags_file = _FileCache(lambda path: json.loads(path.read_text(encoding="utf-8")))
        self._metrics = _FileCache(_metrics_file)
        self._series = _FileCache(self._series_of)
        self._series_json = _FileCache(lambda path: _json(self._series(path)))
        self._yaml = _FileCache(_yaml_file)
        self._listed = _FileCache(self._list_step)
        self._lock = threading.Lock()
        self._prefetches: dict[Path, Future[None]] = {}
        self._prefetched: dict[Path, dict[str, list[int]]] = {}  # each run's steps when it was last prefetched
        self._combined_tables: dict[tuple[Path, str], tuple[list[Any], Any]] = {}
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlf-ui-prefetch")

    # ------------------------------------------------------------------ runs

    def run_dir(self, name: str) -> Path:
        return run_dir_of(self.runs_dir, name)

    def inside(self, path: Path) -> bool:
        """Whether ``path``, symlinks followed, stays in the runs directory (a run unpacked
        from someone else's archive may link its files anywhere)."""
        try:
            return path.resolve().is_relative_to(self.runs_dir)
        except (OSError, RuntimeError):  # a symlink loop
            return False

    def readable(self, path: Path, errors: dict[str, str] | None = None, label: str | None = None) -> bool:
        """Whether ``path`` exists and may be read: one that leads out of the runs directory
        (a symlink, or inside a symlinked directory) is refused, whichever file it is, with
        :data:`REFUSED` under ``label`` (its name) in ``errors``."""
        if not os.path.lexists(path):
            return False
        if not self.inside(path):
            if errors is not None:
                errors[label or path.name] = REFUSED
            return False
        return path.exists()

    def _records(self, run_dir: Path, errors: dict[str, str]) -> RunRecords | None:
        """The run's recorded trajectories, None when its trajectories/ is refused."""
        records = RunRecords(run_dir)
        return records if self.readable(records.run_dir / RECORDS_DIR, errors) or \
            not os.path.lexists(records.run_dir / RECORDS_DIR) else None

    def _files(self, records: RunRecords | None, kind: str, errors: dict[str, str]) -> dict[int, Path]:
        """``records.files(kind)`` less the files that lead out of the runs directory (each
        named in ``errors`` as its step)."""
        if records is None:
            return {}
        # resolving each of a long run's thousand files cost ~40 ms a request: a plain file (no
        # symlink) in a directory that stays inside is inside, one lstat; the rest are resolved
        inside: dict[Path, bool] = {}
        files = {}
        for step, path in records.files(kind).items():
            if path.parent not in inside:
                inside[path.parent] = self.inside(path.parent)
            if (inside[path.parent] and not path.is_symlink()) or self.readable(path, errors, f"{kind} step {step}"):
                files[step] = path
        return files

    def runs(self) -> list[dict[str, Any]]:
        """Every run, newest first, with its status, env, model, steps and held-out number."""
        if not self.runs_dir.is_dir():
            return []
        found = [p for p in self.runs_dir.iterdir()
                 if p.is_dir() and not p.name.startswith(".") and any((p / m).exists() for m in RUN_MARKERS)
                 and self._openable(p.name)]
        runs = [self.summary(p) for p in found]
        return sorted(runs, key=lambda r: (r["started_at"] or 0, r["name"]), reverse=True)

    def _openable(self, name: str) -> bool:
        """Whether a run page can open ``name`` (listing one that cannot only leads to an error)."""
        try:
            self.run_dir(name)
        except PathRefused:
            return False
        return True

    def summary(self, run_dir: Path) -> dict[str, Any]:
        errors: dict[str, str] = {}
        status = read_status(run_dir) if self.readable(run_dir / STATUS_FILE, errors) or \
            not os.path.lexists(run_dir / STATUS_FILE) else RunStatus("unknown", message=f"{STATUS_FILE}: {REFUSED}")
        config = self._config(run_dir, errors)
        records = self._metric_records(run_dir, errors)
        held_out = None
        for record in reversed(records):
            value = next((record[k] for k in HELD_OUT_KEYS if isinstance(record.get(k), (int, float))), None)
            if value is not None:
                held_out = {"step": record.get("step"), "value": value,
                            "key": next(k for k in HELD_OUT_KEYS if k in record)}
                break
        started = status.started_at
        if started is None:
            marker = next((run_dir / m for m in RUN_MARKERS if (run_dir / m).exists()), run_dir)
            started = marker.stat().st_mtime
        last_step = max((r["step"] for r in records if isinstance(r.get("step"), int)), default=None)
        offered = self.controls(run_dir.name, run_dir, status) if self.controls else \
            {"can_stop": False, "can_resume": False}
        if offered.get("state") == "starting":
            errors = {}  # the files a run writes as it starts are not there yet: not errors
        return json_safe({
            "name": run_dir.name, "state": status.state, "message": status.message,
            "step": status.step if status.step is not None else last_step,
            "steps": status.steps if status.steps is not None else _get(config, "train", "steps"),
            "env": _get(config, "env"), "model": _get(config, "model", "name"), "engine": _get(config, "engine"),
            "seed": _get(config, "train", "seed"), "held_out": held_out, "started_at": started,
            "updated_at": status.updated_at, "pid": status.pid, "exiting": still_exiting(run_dir, status),
            "errors": errors, "tags": self.tags().get(run_dir.name, []), **offered,
        })

    def run(self, name: str) -> dict[str, Any]:
        """One run's page: its summary, config, plugin versions and what it recorded."""
        run_dir = self.run_dir(name)
        errors: dict[str, str] = {}
        summary = self.summary(run_dir)
        config = self._config(run_dir, errors)
        plugins = None
        if self.readable(run_dir / "plugins.yaml", errors):
            try:
                plugins = self._yaml(run_dir / "plugins.yaml")
            except Exception as exc:  # noqa: BLE001 - a damaged file is that part's error
                errors["plugins.yaml"] = _one_line(exc)
        records = self._records(run_dir, errors)
        recorded = {}
        try:
            recorded = {kind: list(self._files(records, kind, errors)) for kind in records.kinds()} if records else {}
        except OSError as exc:
            errors["trajectories"] = _one_line(exc)
        config_text = None
        if self.readable(run_dir / "config.yaml"):
            try:
                config_text = (run_dir / "config.yaml").read_text(encoding="utf-8", errors="replace")
            except OSError as exc:  # a directory by that name, unreadable
                errors["config.yaml"] = _one_line(exc)
        if summary.get("state") == "starting":
            errors = {}  # its files are being written
        return json_safe({**summary, "config": config, "config_text": config_text, "plugins": plugins,
                          "recorded": recorded, "errors": {**summary["errors"], **errors}})

    def metrics(self, name: str) -> dict[str, Any]:
        """Every numeric metric of the run as ``{key: [[step, value], ...]}`` (shared with the
        cache: not to be changed)."""
        run_dir, series, errors = self._metrics_of(name, self._series)
        return {"name": run_dir.name, "series": series or {}, "errors": errors}

    def metrics_json(self, name: str) -> bytes:
        """:meth:`metrics` as JSON, the series encoded once per change of the file (a run page
        asks every 3 s; 1,000 steps of ~80 keys are 1.8 MB of JSON, ~70 ms to encode)."""
        run_dir, series, errors = self._metrics_of(name, self._series_json)
        return b'{"name":%s,"series":%s,"errors":%s}' % (_json(run_dir.name), series or b"{}", _json(errors))

    def _metrics_of(self, name: str, cache: _FileCache) -> tuple[Path, Any, dict[str, str]]:
        run_dir = self.run_dir(name)
        errors: dict[str, str] = {}
        series = None
        path = run_dir / "metrics.jsonl"
        if self.readable(path, errors):
            try:
                series = cache(path)
            except (ValueError, OSError) as exc:
                errors["metrics.jsonl"] = _one_line(exc)
            else:
                self._metric_records(run_dir, errors)  # cached: only to name damaged lines
        return run_dir, series, errors

    def _series_of(self, path: Path) -> dict[str, list[list[float | None]]]:
        series: dict[str, list[list[float | None]]] = {}
        for record in self._metrics(path)[0]:
            step = record.get("step")
            if not isinstance(step, int):
                continue
            for key, value in record.items():
                # "time" (the record's wall clock) too: the plots' x axis by wall time reads it
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    series.setdefault(key, []).append([step, value if math.isfinite(value) else None])
        return series

    # ------------------------------------------------------------------ trajectories

    def trajectories(self, name: str, kind: str, *, step: int | None = None, min_reward: float | None = None,
                     max_reward: float | None = None, stop_reason: str | None = None,
                     tool_error: str | None = None, sample_id: str | None = None, outcome: str | None = None,
                     policy_version: int | None = None, sequences: int | None = None, sort: str | None = None,
                     descending: bool = False, offset: int = 0, limit: int = 100) -> dict[str, Any]:
        """The recorded trajectories of ``kind`` at ``step`` (every step when None) that pass
        the filters (``sequences``: made of that many token sequences), their scalar columns,
        ``limit`` of them from ``offset``; in step and index order, or by ``sort`` (one of
        :data:`SORTABLE`; rows without a value last)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        errors: dict[str, str] = {}
        records = self._records(self.run_dir(name), errors)
        files = self._files(records, kind, errors)
        steps = [step] if step is not None else list(files)
        if step is not None and step not in files:
            errors.setdefault(f"{kind} step {step}", f"no {kind} trajectories recorded at step {step}")
            steps = []
        tables = []
        for at, (table, error) in zip(steps, self._list_all([(files[s], kind, s) for s in steps])):
            if error:
                errors[f"{kind} step {at}"] = error
            else:
                tables.append(table)
        table = self._combined((self.run_dir(name), kind), tables) if step is None else \
            tables[0] if tables else scalar_schema().empty_table()
        keep = []  # boolean masks; a null (no reward, no stop reason) drops the row
        if min_reward is not None:
            keep.append(pc.greater_equal(table["reward"], pa.scalar(float(min_reward))))
        if max_reward is not None:
            keep.append(pc.less_equal(table["reward"], pa.scalar(float(max_reward))))
        if stop_reason:
            keep.append(pc.equal(table["stop_reason"], pa.scalar(stop_reason)))
        if outcome:  # a class, or a side: every class on it
            keep.append(pc.or_kleene(pc.equal(table["outcome"], pa.scalar(outcome)),
                                     pc.equal(table["outcome_side"], pa.scalar(outcome))))
        if tool_error:  # the rows whose list holds it
            kinds = table["tool_error_kinds"]
            rows = np.zeros(table.num_rows, dtype=bool)
            rows[pc.filter(pc.list_parent_indices(kinds), pc.equal(pc.list_flatten(kinds), pa.scalar(tool_error)))
                 .to_numpy()] = True
            keep.append(pa.array(rows))
        if sample_id:
            keep.append(pc.match_substring(table["sample_id"], sample_id))
        if policy_version is not None:  # the weights that sampled it (an asynchronous run's versions differ)
            keep.append(pc.equal(table["policy_version"], pa.scalar(int(policy_version), pa.int32())))
        if sequences is not None:  # a family that rewrote earlier turns made several
            keep.append(pc.equal(table["num_sequences"], pa.scalar(int(sequences), pa.int16())))
        kept = table.filter(functools.reduce(pc.and_kleene, keep)) if keep else table
        if sort is not None:
            if sort not in SORTABLE:
                raise RecordError(f"cannot sort by {sort!r}: sort by one of {', '.join(SORTABLE)}")
            order = "descending" if descending else "ascending"
            kept = kept.take(pc.sort_indices(kept, sort_keys=[(sort, order, "at_end"), ("step", "ascending"),
                                                              ("index", "ascending")]))
        facets = {"stop_reasons": sorted(str(v) for v in pc.unique(table["stop_reason"]).to_pylist() if v),
                  "outcomes": sorted(str(v) for v in pc.unique(table["outcome"]).to_pylist() if v)
                  + sorted(str(v) for v in pc.unique(table["outcome_side"]).to_pylist() if v),
                  "tool_errors": sorted(v for v in pc.unique(pc.list_flatten(table["tool_error_kinds"])).to_pylist()
                                        if v is not None),
                  "policy_versions": sorted(v for v in pc.unique(table["policy_version"]).to_pylist()
                                            if v is not None and v >= 0),
                  "sequence_counts": sorted(v for v in pc.unique(table["num_sequences"]).to_pylist() if v)}
        return json_safe({"kind": kind, "steps": list(files), "total": kept.num_rows, "offset": offset,
                          "rows": [_short(row) for row in kept.slice(offset, limit).to_pylist()], "facets": facets,
                          "errors": errors})

    def trajectory(self, name: str, kind: str, step: int, index: int) -> dict[str, Any]:
        """One whole trajectory record (NaN and infinities as they were read: see
        :meth:`trajectory_json`)."""
        return self.step_trajectories(name, kind, step, [index])[0]

    def step_trajectories(self, name: str, kind: str, step: int, indices: list[int]) -> list[dict[str, Any]]:
        """:meth:`trajectory` of each of ``indices`` at one step, its file read once."""
        records = self._readable_records(name)
        if not self.readable(records.path(kind, step)):  # this one file, not the run's thousand
            raise RecordError(f"{kind} step {step}: {REFUSED}")
        return records.trajectories(kind, step, indices)

    def trajectory_json(self, name: str, kind: str, step: int, index: int) -> bytes:
        """:meth:`trajectory` as JSON, by orjson (NaN and infinities as null): a 1M-token
        trajectory's ~50 MB of token arrays in 0.1 s, where the json module and a walk to
        replace NaN took 2 s (bench/ui_long_trajectory.py)."""
        import orjson

        return orjson.dumps(self.trajectory(name, kind, step, index))

    # ------------------------------------------------------------------ tags

    def tags(self) -> dict[str, list[str]]:
        """Every run's tags (``RUNS_DIR/.rlf-ui-tags.json``: ``{run: [tag, ...]}``); {} when there
        are none or the file is damaged (the next :meth:`set_tags` writes it whole again)."""
        path = self.runs_dir / TAGS_FILE
        try:
            tags = self._tags_file(path) if path.is_file() and not path.is_symlink() else {}
        except (OSError, ValueError):
            return {}
        return tags if isinstance(tags, dict) else {}

    def set_tags(self, name: str, tags: Any) -> list[str]:
        """Set ``name``'s tags (a list of up to 20 texts of 1-40 characters, no control
        characters; duplicates dropped); :class:`PathRefused` for an unknown run, ``ValueError``
        (one line) for bad tags."""
        run_dir = self.run_dir(name)
        if not isinstance(tags, list) or len(tags) > MAX_TAGS or not all(
                isinstance(t, str) and 0 < len(t.strip()) <= 40 and t.isprintable() for t in tags):
            raise ValueError(f"tags must be a list of at most {MAX_TAGS} texts of 1 to 40 printable characters")
        clean = list(dict.fromkeys(t.strip() for t in tags))
        with self._lock:
            every = {k: v for k, v in self.tags().items() if (self.runs_dir / k).exists()}
            if clean:
                every[run_dir.name] = clean
            else:
                every.pop(run_dir.name, None)
            write_text_atomic(self.runs_dir / TAGS_FILE, json.dumps(every, ensure_ascii=False, sort_keys=True))
        return clean

    def forget(self, name: str) -> None:
        """Drop what is cached of a run that is gone (deleted)."""
        with self._lock:
            self._prefetched = {k: v for k, v in self._prefetched.items() if k.name != name}
            self._combined_tables = {k: v for k, v in self._combined_tables.items() if k[0].name != name}

    def recorded_files(self, name: str, errors: dict[str, str]) -> dict[str, dict[int, Path]]:
        """Every kind's recorded step files that may be read (``{kind: {step: path}}``), the
        refused ones named in ``errors``."""
        records = self._records(self.run_dir(name), errors)
        return {kind: self._files(records, kind, errors) for kind in records.kinds()} if records else {}

    def _readable_records(self, name: str) -> RunRecords:
        """The run's records, :class:`RecordError` when its trajectories/ leads out of the runs directory."""
        records = self._records(self.run_dir(name), {})
        if records is None:
            raise RecordError(f"{RECORDS_DIR}: {REFUSED}")
        return records

    def same_sample(self, name: str, kind: str, sample_id: str) -> dict[str, Any]:
        """``sample_id``'s trajectories at every recorded step, whole but for their token arrays
        (``sequences`` is ``[]``: a trajectory opened alone has them): the conversations, without
        reading every step's tokens. For ``eval`` in the order the model went (the base model,
        after the warm-up from ``cold_start_eval``, each step), each with its ``phase``; for
        ``train``, the members of its group(s). The leading messages every trajectory shares (the
        system prompt, few-shot examples, the question) come once, as ``shared_messages`` (their
        number ``shared``), and each trajectory's ``messages`` start after them."""
        wanted, errors = [], {}
        records = self._records(self.run_dir(name), errors)
        kinds = [kind, "cold_start_eval"] if kind == "eval" else [kind]
        for each in kinds:
            files = self._files(records, each, errors)
            listed = self._list_all([(path, each, step) for step, path in files.items()])
            for step, (table, error) in zip(files, listed):
                if error:
                    errors[f"{each} step {step}"] = error
                    continue
                for index, sample in zip(table["index"].to_pylist(), table["sample_id"].to_pylist()):
                    if sample == sample_id:
                        wanted.append((each, step, index))
        # base (eval step 0), then the warm-up, then the steps: the order the model went
        wanted.sort(key=lambda at: (at[1] > 0, at[0] == "cold_start_eval", at[1], at[2]))
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
            found = list(pool.map(lambda at: {**records.trajectory(at[0], at[1], at[2], tokens=False), "kind": at[0]},
                                  wanted)) if records else []
        for trajectory in found:
            trajectory["phase"] = ("after the warm-up" if trajectory["kind"] == "cold_start_eval"
                                   else "base model" if kind == "eval" and trajectory["step"] == 0
                                   else f"step {trajectory['step']}")
        talks = [t for t in found if t.get("messages")]  # a run made before records has text only
        shared = shared_prefix([t["messages"] for t in talks])
        shared_messages = talks[0]["messages"][:shared] if talks else []
        for trajectory in talks:
            trajectory["messages"] = trajectory["messages"][shared:]
        steps = sorted({t["step"] for t in found})
        title = (f"{sample_id} at every evaluation" if kind == "eval"
                 else f"{sample_id} in {kind} step {steps[0]}'s group" if len(steps) == 1
                 else f"{sample_id} across {kind} steps")
        return json_safe({"sample_id": sample_id, "kind": kind, "title": title, "trajectories": found,
                          "shared": shared, "shared_messages": shared_messages, "errors": errors})

    def prefetch(self, name: str, steps: dict[str, list[int]] | None = None) -> Future[None]:
        """Read the run's step lists into the cache in the background (the run page asks for
        it, so that listing every step is a cache hit by the time the user does); the one
        already under way, if any. Nothing is read again while the run's steps stay the same
        (the page asks every 3 s): ``steps``, the run's ``{kind: steps}`` where the caller has
        them (:meth:`run`'s ``recorded``), spares even listing them."""
        run_dir = self.run_dir(name)
        with self._lock:
            running = self._prefetches.get(run_dir)
            if running is not None and not running.done():
                return running
            if steps is not None and self._prefetched.get(run_dir) == steps:
                done: Future[None] = Future()
                done.set_result(None)
                return done

            def work() -> None:
                try:
                    import pyarrow as pa

                    pa.scalar(0.0)  # the first one imports pandas where it is installed (0.2 s): not in a request
                    records = RunRecords(run_dir)
                    steps = {kind: list(records.files(kind)) for kind in records.kinds()}
                    if self._prefetched.get(run_dir) == steps:
                        return
                    for kind in steps:  # every step's list, combined, facets taken
                        self.trajectories(name, kind, limit=1)
                    self._prefetched[run_dir] = steps
                except Exception:  # noqa: BLE001 - a run removed meanwhile: the request that needs it says what
                    pass

            future = self._prefetches[run_dir] = self._background.submit(work)
            return future

    # ------------------------------------------------------------------ helpers

    def _list_step(self, path: Path) -> Any:
        run_dir = path.parents[2] if path.parent.parent.name == "trajectories" else path.parents[1]
        kind = path.parent.name if path.parent.parent.name == "trajectories" else (
            "cold_start_eval" if path.parent.name == "cold_start" else "eval")
        step = int(path.stem.split("-")[1])
        return RunRecords(run_dir).scalars(kind, step)

    def _try_list(self, path: Path, kind: str, step: int) -> tuple[Any, str | None]:
        """A step's scalar columns (an Arrow table), or why not."""
        try:
            return self._listed(path), None
        except (RecordError, OSError) as exc:
            return None, _one_line(exc)

    def _list_all(self, files: list[tuple[Path, str, int]]) -> list[tuple[Any, str | None]]:
        """:meth:`_try_list` of each (path, kind, step); the files not cached are read side by
        side (pyarrow reads without the GIL: ~1.7x on 2 cores)."""
        out: list[Any] = []
        for path, _, _ in files:
            try:
                hit = self._listed.cached(path)
            except OSError:
                hit = _MISSING  # _try_list says why
            out.append(_MISSING if hit is _MISSING else (hit, None))
        missing = [at for at, hit in enumerate(out) if hit is _MISSING]
        if len(missing) < 2:
            read = [self._try_list(*files[at]) for at in missing]
        else:
            with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
                read = list(pool.map(lambda at: self._try_list(*files[at]), missing))
        for at, result in zip(missing, read):
            out[at] = result
        return out

    def _combined(self, key: tuple[Path, str], tables: list[Any]) -> Any:
        """``tables`` as one table in one chunk (filters over 1,000 one-step chunks cost 5x
        more); built again when a step's table changes."""
        import pyarrow as pa

        with self._lock:
            hit = self._combined_tables.get(key)
        if hit is not None and len(hit[0]) == len(tables) and all(a is b for a, b in zip(hit[0], tables)):
            return hit[1]
        table = pa.concat_tables(tables).combine_chunks() if tables else scalar_schema().empty_table()
        with self._lock:
            self._combined_tables[key] = (tables, table)
        return table

    def _config(self, run_dir: Path, errors: dict[str, str]) -> dict[str, Any] | None:
        path = run_dir / "config.yaml"
        if not self.readable(path, errors):
            return None
        try:
            config = self._yaml(path)
        except Exception as exc:  # noqa: BLE001 - a damaged file is that part's error
            errors["config.yaml"] = _one_line(exc)
            return None
        if not isinstance(config, dict):
            errors["config.yaml"] = "not a mapping"
            return None
        return config

    def _metric_records(self, run_dir: Path, errors: dict[str, str]) -> list[dict[str, Any]]:
        path = run_dir / "metrics.jsonl"
        if not self.readable(path, errors):
            return []
        try:
            records, bad = self._metrics(path)
        except (ValueError, OSError) as exc:
            errors["metrics.jsonl"] = _one_line(exc)
            return []
        if bad:
            errors["metrics.jsonl"] = f"line(s) {', '.join(map(str, bad[:10]))} not JSON objects: skipped"
        return records


def _metrics_file(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """A run's metrics records, and the numbers of lines that are not JSON objects (skipped:
    one damaged line must not hide the rest of the run's curves)."""
    damaged: list[int] = []
    return read_metrics(path.parent, damaged=damaged), damaged


def _json(value: Any) -> bytes:
    """``value`` encoded as Starlette's JSONResponse encodes it."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _short(row: dict[str, Any]) -> dict[str, Any]:
    """A list row with its final answer cut (the list shows its start; a trajectory has it whole)."""
    answer = row.get("final_answer")
    if isinstance(answer, str) and len(answer) > 300:
        row["final_answer"] = answer[:300] + "…"
    return row


def _get(config: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(config, dict):
            return None
        config = config.get(key)
    return config


def _one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, RLFactoryError) else f"{type(exc).__name__}: {exc}"
    return (text.splitlines() or [""])[0][:300]
