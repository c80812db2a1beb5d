"""Training metrics: a JSONL file, TensorBoard, Weights & Biases, and a live terminal view.

:class:`MetricsLogger` writes what a run measures into its run directory::

    run_dir/metrics.jsonl    one JSON object a step: {"step": 3, "time": 1718000000.5, "reward/mean": 0.41, ...}
    run_dir/tensorboard/     TensorBoard event files (every finite numeric value, as a scalar)
    run_dir/wandb/           W&B's local files, when a W&B project is configured
    run_dir/wandb_id.txt     the W&B run id, so that a resumed run continues the same W&B run

``metrics.jsonl`` is the record that is always there and needs nothing to read
(:func:`read_metrics`). Each line is flushed and fsynced as it is written, so a crash loses
at most the line being written; a torn last line is skipped on reading and cut off when a
logger opens the file again. Values are numbers, strings or lists of them; a non-finite
float (a NaN loss is worth seeing) is written as ``null``. Keys keep their slashes
(``reward/mean``, ``time/rollout``, ``tools/errors/timeout``): TensorBoard and W&B group
charts by the part before the first slash.

Resuming from a checkpoint of step ``N`` (``resume_step=N``) drops the records of steps
after ``N`` from ``metrics.jsonl`` (they will run again, and a step must not appear twice)
and has TensorBoard purge its events of those steps.

:class:`LiveView` shows the run in a terminal: a progress bar over the steps, the current
phase, and a small table of the key numbers (:data:`VIEW_FIELDS`). Where the output is not
a terminal (CI logs, ``nohup``), it prints one plain line a step instead.

TensorBoard and W&B are imported only when used; a missing one is a :class:`ConfigError`
naming the config key that asked for it.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, Mapping

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ._fs import write_text_atomic
from .errors import ConfigError

__all__ = ["MetricsLogger", "read_metrics", "LiveView", "METRICS_FILE", "VIEW_FIELDS"]

METRICS_FILE = "metrics.jsonl"
_WANDB_ID_FILE = "wandb_id.txt"
_RESERVED = ("step", "time")  # the two keys every record gets from the logger itself

# The numbers LiveView shows: (label, metric key, format). Missing keys show as "-".
VIEW_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("reward", "reward/mean", "{:.3f}"),
    ("accuracy", "reward/accuracy", "{:.3f}"),
    ("loss", "train/loss", "{:.4f}"),
    ("kl", "train/kl", "{:.4f}"),
    ("entropy", "train/entropy", "{:.3f}"),
    ("clip fraction", "train/clip_fraction", "{:.3f}"),
    ("tool calls/traj", "tools/calls_per_trajectory", "{:.2f}"),
    ("tool error rate", "tools/error_rate", "{:.1%}"),
    ("step time", "time/step", "{:.1f} s"),
    ("rollout tokens/s", "throughput/rollout_tokens_per_s", "{:,.0f}"),
    ("train tokens/s", "throughput/train_tokens_per_s", "{:,.0f}"),
)

# The plain one-line-a-step form (no terminal): (label, metric key, format).
_PLAIN_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("reward", "reward/mean", "{:.2f}"),
    ("acc", "reward/accuracy", "{:.2f}"),
    ("loss", "train/loss", "{:.3f}"),
    ("kl", "train/kl", "{:.3f}"),
    ("tools/traj", "tools/calls_per_trajectory", "{:.1f}"),
)


class MetricsLogger:
    """Writes each step's metrics to ``run_dir/metrics.jsonl``, TensorBoard and W&B.

    Args:
        run_dir: the run's directory (created if missing).
        tensorboard: also write TensorBoard event files to ``run_dir/tensorboard``.
        wandb_project: the W&B project to log to; ``None`` means no W&B.
        wandb_entity: the W&B entity (user or team); ``None`` is W&B's default.
        run_name: the run's display name in W&B.
        config: the run's config, stored with the W&B run.
        resume_step: the step of the checkpoint the run resumes from; records of later
            steps are dropped (they will run again). ``None`` for a fresh run.

    Raises:
        ConfigError: TensorBoard or W&B was asked for and is not installed.
    """

    def __init__(self, run_dir: Path, *, tensorboard: bool = True, wandb_project: str | None = None,
                 wandb_entity: str | None = None, run_name: str | None = None,
                 config: dict | None = None, resume_step: int | None = None):
        # Check both optional packages before touching the run directory, and report both.
        errors: list[str] = []
        hints: list[str] = []
        summary_writer_cls = wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter as summary_writer_cls
            except ImportError:
                errors.append("logging.tensorboard: TensorBoard is not installed")
                hints.append("pip install tensorboard, or set logging.tensorboard=false")
        if wandb_project is not None:
            try:
                import wandb
            except ImportError:
                errors.append("logging.wandb_project: Weights & Biases is not installed")
                hints.append("pip install wandb, or set logging.wandb_project=null")
        if errors:
            raise ConfigError(errors, hint="; ".join(hints))

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._file = None
        self._tb = None
        self._wandb_run = None
        self._closed = False
        try:
            if resume_step is not None:
                _drop_after(self.path, resume_step)
            else:
                _repair_tail(self.path)
            self._file = open(self.path, "a", encoding="utf-8")
            if summary_writer_cls is not None:
                purge = None if resume_step is None else resume_step + 1
                self._tb = summary_writer_cls(log_dir=str(self.run_dir / "tensorboard"), purge_step=purge)
            if wandb is not None:
                self._wandb_run = wandb.init(
                    project=wandb_project, entity=wandb_entity, name=run_name, config=config,
                    dir=str(self.run_dir), resume="allow", id=self._wandb_id(),
                )
        except BaseException:
            self.close()
            raise

    def _wandb_id(self) -> str:
        """The run's W&B id: read from ``wandb_id.txt``, or made and stored there."""
        path = self.run_dir / _WANDB_ID_FILE
        if path.exists():
            run_id = path.read_text(encoding="utf-8").strip()
            if run_id:
                return run_id
        run_id = uuid.uuid4().hex[:12]
        write_text_atomic(path, run_id + "\n")
        return run_id

    @property
    def wandb_run(self) -> Any:
        """The W&B run object, or ``None`` without W&B."""
        return self._wandb_run

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record the metrics of ``step``.

        Appends ``{"step": step, "time": <unix time>, **metrics}`` to ``metrics.jsonl``
        (flushed and fsynced before returning) and sends every finite number (bools as
        0/1) to TensorBoard and W&B. Values must be numbers, strings, ``None`` or lists of
        them; numpy and torch scalars are turned into numbers. Non-finite floats are
        written as ``null`` and not sent to TensorBoard or W&B.

        Raises:
            ValueError: a key is ``step`` or ``time``, or the logger is closed.
            TypeError: a value is of another type.
        """
        if self._closed:
            raise ValueError("MetricsLogger is closed")
        step = int(step)
        record: dict[str, Any] = {"step": step, "time": time.time()}
        numeric: dict[str, float | int] = {}
        for key, value in metrics.items():
            if key in _RESERVED:
                raise ValueError(f"metric key {key!r} is reserved: the logger writes it itself")
            value = _json_value(key, value)
            record[key] = value
            if isinstance(value, (int, float)):  # None (non-finite) and lists stay out
                numeric[key] = int(value) if isinstance(value, bool) else value
        self._file.write(json.dumps(record, allow_nan=False, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()
        if self._wandb_run is not None:
            self._wandb_run.log(numeric, step=step)

    def close(self) -> None:
        """Close the JSONL file, TensorBoard's writer and the W&B run. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._file is not None:
                self._file.close()
            if self._tb is not None:
                self._tb.close()
        finally:
            if self._wandb_run is not None:
                self._wandb_run.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def read_metrics(run_dir: Path | str, *, damaged: list[int] | None = None) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``, in order (``[]`` when there is none).

    A last line that does not parse is skipped: a crash while it was written tore it. With
    ``damaged`` (a list), a line before the last that is not a JSON object is skipped too and
    its number appended there (a viewer shows the rest of the run).

    Raises:
        ValueError: without ``damaged``, a line before the last is not a JSON object.
    """
    return [record for _, record in _read_lines(Path(run_dir) / METRICS_FILE, damaged)]


class LiveView:
    """Training progress in the terminal, or one plain line a step where there is none.

    In a terminal (``with LiveView(...) as view:``), a ``rich`` live display shows a
    progress bar over the steps with the current phase, and a table of
    :data:`VIEW_FIELDS` from the last :meth:`update`. Otherwise :meth:`update` prints
    ``step 3/20  reward 0.41  acc 0.38  loss 0.012  kl 0.000  tools/traj 0.9  3.2 s/step``
    (with the keys present), :meth:`message` prints its text and :meth:`phase` does nothing.

    Args:
        total_steps: the number of the run's last step.
        start_step: the number of steps already done (a resumed run's checkpoint step).
        enabled: show the live display; ``None`` means when ``console`` is a terminal.
        console: where to draw; a new ``Console()`` (stdout) by default.
    """

    def __init__(self, total_steps: int, *, start_step: int = 0, enabled: bool | None = None,
                 console: Console | None = None):
        self.console = console if console is not None else Console()
        self.enabled = self.console.is_terminal if enabled is None else bool(enabled)
        self.total_steps = total_steps
        self.step = start_step
        self.metrics: dict[str, Any] = {}
        self._live: Live | None = None
        # Never started itself: it is drawn as part of this view's Live.
        self._progress = Progress(
            TextColumn("[bold]{task.description:<8}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("steps"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=self.console, auto_refresh=False,
        )
        self._task = self._progress.add_task("training", total=total_steps, completed=start_step)

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Show that ``step`` (counted from 1) finished, with its ``metrics``."""
        self.step = step
        self.metrics = dict(metrics)
        if not self.enabled:
            self.console.print(self._plain_line(), markup=False, highlight=False, soft_wrap=True)
            return
        self._progress.update(self._task, completed=step)
        self._refresh()

    def message(self, text: str) -> None:
        """Print a line (a warning, an eval result) above the live display."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def warn(self, text: str) -> None:
        """Print a warning line, styled to stand out from the progress lines."""
        from rich.text import Text

        self.console.print(Text.assemble(("warning: ", "bold yellow"), (text, "yellow")), soft_wrap=True)

    def phase(self, name: str) -> None:
        """Show the phase the step is in (``rollout``, ``train``, ``eval`` ...)."""
        if self.enabled:
            self._progress.update(self._task, description=name)
            self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.refresh()

    def _plain_line(self) -> str:
        parts = [f"step {self.step}/{self.total_steps}"]
        for label, key, fmt in _PLAIN_FIELDS:
            if key in self.metrics:
                parts.append(f"{label} {_format(self.metrics[key], fmt)}")
        if "time/step" in self.metrics:
            parts.append(f"{_format(self.metrics['time/step'], '{:.1f}')} s/step")
        return "  ".join(parts)

    def _table(self) -> Table:
        table = Table.grid(padding=(0, 2))
        for style in ("dim", "bold", "dim", "bold"):
            table.add_column(style=style, justify="right" if style == "bold" else "left")
        cells = [(label, _format(self.metrics[key], fmt) if key in self.metrics else "-")
                 for label, key, fmt in VIEW_FIELDS]
        for i in range(0, len(cells), 2):
            row = [text for cell in cells[i:i + 2] for text in cell]
            table.add_row(*row, *[""] * (4 - len(row)))
        return table

    def __rich__(self) -> Group:
        return Group(self._progress, self._table())

    def __enter__(self) -> LiveView:
        if self.enabled and self._live is None:
            from .logs import active_capture

            # Live would route sys.stdout / sys.stderr into the view; while they go to the
            # run's log (rlfactory_core.logs), third-party prints must stay there.
            routed = active_capture() is None
            self._live = Live(self, console=self.console, refresh_per_second=4, redirect_stdout=routed,
                              redirect_stderr=routed)
            self._live.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            live.refresh()
            live.stop()


def _format(value: Any, fmt: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "nan" if value is None else str(value)
    if not math.isfinite(value):
        return "nan"
    return fmt.format(value)


def _json_value(key: str, value: Any) -> Any:
    """``value`` as JSON can hold it: non-finite floats become ``None``, scalars numbers."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_json_value(key, item) for item in value]
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        return _json_value(key, value.item())  # a numpy scalar or a 0-d torch tensor
    raise TypeError(f"metric {key!r}: a {type(value).__name__} is not a number, string or list of them")


def _read_lines(path: Path, damaged: list[int] | None = None) -> list[tuple[str, dict]]:
    """``(raw line, record)`` for each record of a metrics file; a torn last line is skipped
    (and, with ``damaged``, every other bad line, numbered there)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    out: list[tuple[str, dict]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            if number == len(lines):  # the last line, with no newline after it: torn by a crash
                continue
            if damaged is not None:
                damaged.append(number)
                continue
            raise ValueError(f"{path}:{number}: not a JSON object: {line[:80]!r}")
        out.append((line, record))
    return out


def _drop_after(path: Path, step: int) -> None:
    """Rewrite ``path`` (atomically) without the records of steps after ``step``."""
    if not path.exists():
        return
    kept = [line for line, record in _read_lines(path)
            if not isinstance(record.get("step"), int) or record["step"] <= step]
    text = "".join(line + "\n" for line in kept)
    if text != path.read_text(encoding="utf-8", errors="replace"):
        write_text_atomic(path, text)


def _repair_tail(path: Path) -> None:
    """Make ``path`` end with a newline, so appended records start on a line of their own:
    a torn last line is cut off; a whole record missing only its newline gets it."""
    if not path.exists():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    start = data.rfind(b"\n") + 1
    try:
        whole = isinstance(json.loads(data[start:]), dict)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        whole = False
    with open(path, "r+b") as f:
        if whole:
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
        else:
            f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
