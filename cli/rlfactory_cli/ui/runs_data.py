"""What the UI shows, read from the runs directory: runs, their metrics, their recorded
trajectories (:mod:`rlfactory_core.records`).

Reads are cached by each file's (mtime, size), so a live page that polls every few seconds
parses a growing ``metrics.jsonl`` or a step's Parquet file once per change, and listing a
run's 100k recorded trajectories reads each step file's small scalar columns once. A file that
cannot be read gives an error for that part (``"error"`` in the answer), never an exception
that takes the page down.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from rlfactory_core.errors import RLFactoryError
from rlfactory_core.metrics import read_metrics
from rlfactory_core.records import RecordError, RunRecords
from rlfactory_core.run_status import read_status

from .security import run_dir_of

__all__ = ["RunsData", "json_safe", "HELD_OUT_KEYS"]

#: The held-out number a run is summed up by: accuracy when a reward judges it, else the mean reward.
HELD_OUT_KEYS = ("eval/reward/accuracy", "eval/reward/mean")
#: Where a run directory says it is one.
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "status.json")


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
        stat = path.stat()
        key = (stat.st_mtime_ns, stat.st_size)
        with self.lock:
            hit = self.entries.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = self.load(path)
        with self.lock:
            self.entries[path] = (key, value)
        return value


def _yaml_file(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


class RunsData:
    """The runs under ``runs_dir`` (each a directory with a config, metrics or status)."""

    def __init__(self, runs_dir: str | Path):
        self.runs_dir = Path(runs_dir).resolve()
        self._metrics = _FileCache(lambda path: read_metrics(path.parent))
        self._yaml = _FileCache(_yaml_file)
        self._listed = _FileCache(self._list_step)

    # ------------------------------------------------------------------ runs

    def run_dir(self, name: str) -> Path:
        return run_dir_of(self.runs_dir, name)

    def runs(self) -> list[dict[str, Any]]:
        """Every run, newest first, with its status, env, model, steps and held-out number."""
        if not self.runs_dir.is_dir():
            return []
        found = [p for p in self.runs_dir.iterdir()
                 if p.is_dir() and not p.name.startswith(".") and any((p / m).exists() for m in RUN_MARKERS)]
        runs = [self.summary(p) for p in found]
        return sorted(runs, key=lambda r: (r["started_at"] or 0, r["name"]), reverse=True)

    def summary(self, run_dir: Path) -> dict[str, Any]:
        status = read_status(run_dir)
        errors: dict[str, str] = {}
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
        return json_safe({
            "name": run_dir.name, "state": status.state, "message": status.message,
            "step": status.step if status.step is not None else last_step,
            "steps": status.steps if status.steps is not None else _get(config, "train", "steps"),
            "env": _get(config, "env"), "model": _get(config, "model", "name"), "engine": _get(config, "engine"),
            "seed": _get(config, "train", "seed"), "held_out": held_out, "started_at": started,
            "updated_at": status.updated_at, "pid": status.pid, "errors": errors,
        })

    def run(self, name: str) -> dict[str, Any]:
        """One run's page: its summary, config, plugin versions and what it recorded."""
        run_dir = self.run_dir(name)
        errors: dict[str, str] = {}
        summary = self.summary(run_dir)
        config = self._config(run_dir, errors)
        plugins = None
        if (run_dir / "plugins.yaml").exists():
            try:
                plugins = self._yaml(run_dir / "plugins.yaml")
            except Exception as exc:  # noqa: BLE001 - a damaged file is that part's error
                errors["plugins.yaml"] = _one_line(exc)
        records = RunRecords(run_dir)
        recorded = {}
        try:
            recorded = {kind: records.steps(kind) for kind in records.kinds()}
        except OSError as exc:
            errors["trajectories"] = _one_line(exc)
        config_text = None
        if (run_dir / "config.yaml").exists():
            config_text = (run_dir / "config.yaml").read_text(encoding="utf-8", errors="replace")
        return json_safe({**summary, "config": config, "config_text": config_text, "plugins": plugins,
                          "recorded": recorded, "errors": {**summary["errors"], **errors}})

    def metrics(self, name: str) -> dict[str, Any]:
        """Every numeric metric of the run as ``{key: [[step, value], ...]}``."""
        run_dir = self.run_dir(name)
        errors: dict[str, str] = {}
        series: dict[str, list[list[float]]] = {}
        for record in self._metric_records(run_dir, errors):
            step = record.get("step")
            if not isinstance(step, int):
                continue
            for key, value in record.items():
                if key not in ("step", "time") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    series.setdefault(key, []).append([step, value])
        return json_safe({"name": run_dir.name, "series": series, "errors": errors})

    # ------------------------------------------------------------------ trajectories

    def trajectories(self, name: str, kind: str, *, step: int | None = None, min_reward: float | None = None,
                     max_reward: float | None = None, stop_reason: str | None = None,
                     tool_error: str | None = None, sample_id: str | None = None, offset: int = 0,
                     limit: int = 100) -> dict[str, Any]:
        """The recorded trajectories of ``kind`` at ``step`` (every step when None) that pass
        the filters: their scalar columns, ``limit`` of them from ``offset``."""
        records = RunRecords(self.run_dir(name))
        files = records.files(kind)
        steps = [step] if step is not None else list(files)
        errors: dict[str, str] = {}
        if step is not None and step not in files:
            errors[f"{kind} step {step}"] = f"no {kind} trajectories recorded at step {step}"
            steps = []
        rows: list[dict[str, Any]] = []
        with ThreadPoolExecutor(max_workers=8) as pool:
            listed = list(pool.map(lambda s: self._try_list(files[s], kind, s), steps))
        for at, (part, error) in zip(steps, listed):
            if error:
                errors[f"{kind} step {at}"] = error
            rows.extend(part)

        def keep(row: dict[str, Any]) -> bool:
            reward = row.get("reward")
            if min_reward is not None and (reward is None or reward < min_reward):
                return False
            if max_reward is not None and (reward is None or reward > max_reward):
                return False
            if stop_reason and row.get("stop_reason") != stop_reason:
                return False
            if tool_error and tool_error not in (row.get("tool_error_kinds") or ()):
                return False
            return not sample_id or sample_id in str(row.get("sample_id", ""))

        kept = [row for row in rows if keep(row)]
        facets = {"stop_reasons": sorted({str(r.get("stop_reason")) for r in rows if r.get("stop_reason")}),
                  "tool_errors": sorted({k for r in rows for k in r.get("tool_error_kinds") or ()})}
        return json_safe({"kind": kind, "steps": list(files), "total": len(kept), "offset": offset,
                          "rows": kept[offset:offset + limit], "facets": facets, "errors": errors})

    def trajectory(self, name: str, kind: str, step: int, index: int) -> dict[str, Any]:
        return json_safe(RunRecords(self.run_dir(name)).trajectory(kind, step, index))

    def same_sample(self, name: str, kind: str, sample_id: str) -> dict[str, Any]:
        """``sample_id``'s trajectories at every recorded step (the same eval question across
        checkpoints), whole."""
        records = RunRecords(self.run_dir(name))
        found, errors = [], {}
        for step, path in records.files(kind).items():
            part, error = self._try_list(path, kind, step)
            if error:
                errors[f"{kind} step {step}"] = error
            for row in part:
                if row.get("sample_id") == sample_id:
                    found.append(records.trajectory(kind, step, row["index"]))
        return json_safe({"sample_id": sample_id, "kind": kind, "trajectories": found, "errors": errors})

    # ------------------------------------------------------------------ helpers

    def _list_step(self, path: Path) -> list[dict[str, Any]]:
        run_dir = path.parents[2] if path.parent.parent.name == "trajectories" else path.parents[1]
        kind = path.parent.name if path.parent.parent.name == "trajectories" else (
            "cold_start_eval" if path.parent.name == "cold_start" else "eval")
        step = int(path.stem.split("-")[1])
        return RunRecords(run_dir).list(kind, step)

    def _try_list(self, path: Path, kind: str, step: int) -> tuple[list[dict[str, Any]], str | None]:
        try:
            return self._listed(path), None
        except (RecordError, OSError) as exc:
            return [], _one_line(exc)

    def _config(self, run_dir: Path, errors: dict[str, str]) -> dict[str, Any] | None:
        path = run_dir / "config.yaml"
        if not path.exists():
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
        if not path.exists():
            return []
        try:
            return self._metrics(path)
        except (ValueError, OSError) as exc:
            errors["metrics.jsonl"] = _one_line(exc)
            return []


def _get(config: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(config, dict):
            return None
        config = config.get(key)
    return config


def _one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, RLFactoryError) else f"{type(exc).__name__}: {exc}"
    return (text.splitlines() or [""])[0][:300]
