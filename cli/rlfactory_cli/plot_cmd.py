"""``rlf plot RUN_DIR``: a run's main curves in one PNG, for a paper or a README.

The numbers come from ``metrics.jsonl`` through :func:`rlfactory_core.metrics.read_metrics`,
so a run killed mid-write (a torn last line) still plots, and a damaged line before the last is
skipped and named on stderr (as `rlf ui` does); ``config.yaml`` only names the env
and model in the title. A panel is drawn only when the run logged its metrics, so the same
command works for a run with or without evaluation, a cold start, tools or a KL term.

Step 0 holds two evaluations when the run had a cold start: the base model's (``eval/...``)
and the warmed-up model's (``cold_start/eval/...``). RL starts from the warmed-up model, so
an eval curve starts at the cold-start star and the base model is a hollow marker beside it.

matplotlib (the ``ui`` extra) is imported inside the command, so ``rlf --help`` does not pay
for it, and its Agg canvas is used directly: no pyplot, no display, no global state.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rlfactory_core.errors import RLFactoryError
from rlfactory_core.metrics import METRICS_FILE, read_metrics

from .console import err, out

__all__ = ["plot", "plot_run", "panels_for", "series", "draw_figure"]

OUT_FILE = "curves.png"
PANEL_WIDTH = 4.0  # inches; the PNG is ncols * PANEL_WIDTH * dpi pixels wide
PANEL_HEIGHT = 3.0
TITLE_HEIGHT = 0.5
TITLE_SEPARATOR = "  |  "
# The phases of a step's wall time, bottom to top (time/step is their sum without eval and checkpoint).
TIME_PHASES = (("time/rollout", "rollout"), ("time/reward", "reward"), ("time/train", "train"),
               ("time/weight_sync", "weight sync"), ("time/eval", "eval"), ("time/checkpoint", "checkpoint"))
COLD_START_TIMES = ("time/cold_start_collect", "time/cold_start_train")
INSTALL_HINT = "pip install 'rlfactory[ui]'"


@dataclass(frozen=True)
class Panel:
    """One small chart: the metrics it draws (key, legend label); those not logged are left out."""

    title: str
    series: tuple[tuple[str, str], ...]
    share: bool = False  # values in [0, 1]: a fixed y-axis, so two runs' plots compare at a glance
    stacked: bool = False  # bars stacked per step (the step time by phase)
    annotate: bool = False  # write the eval values a reader quotes (base, start, end) beside their points


def plot(
    run_dir: Annotated[Path, typer.Argument(help="The run's directory (it holds metrics.jsonl).",
                                            show_default=False)],
    out_path: Annotated[Optional[Path], typer.Option("--out", help="The PNG to write (default: "
                                                                   f"RUN_DIR/{OUT_FILE}).")] = None,
    dpi: Annotated[int, typer.Option("--dpi", min=20, max=600, help="Resolution; 100 keeps a README image "
                                                                    "small, 200-300 suits a paper.")] = 100,
) -> None:
    """Draw a training run's main curves as one PNG (for a paper or a README); print its path."""
    written = plot_run(run_dir, out_path if out_path is not None else run_dir / OUT_FILE, dpi=dpi)
    out.print(str(written), markup=False, highlight=False, soft_wrap=True)


def plot_run(run_dir: Path, out_path: Path, *, dpi: int = 100) -> Path:
    """Check the run and the output path, draw the panels, write the PNG; return its path.

    Raises:
        RLFactoryError: no such directory, not a run, nothing to plot, an unwritable output,
            or matplotlib not installed.
    """
    records = _read_run(run_dir)
    config = _run_config(run_dir)
    panels = panels_for(records, _eval_split(config))
    if not panels:
        raise RLFactoryError(
            f"{run_dir / METRICS_FILE} has {len(records)} record(s) but no step with a metric rlf plot draws",
            hint="it draws eval/reward/*, reward/*, tools/*, train/* and time/*; a run shows them "
                 "once its first step or evaluation is done")
    _check_writable(out_path)
    figure = draw_figure(panels, records, title=_title(run_dir, config), dpi=dpi)
    _save(figure, out_path, dpi=dpi)
    return out_path


def _read_run(run_dir: Path) -> list[dict]:
    if not run_dir.exists():
        raise RLFactoryError(f"run directory not found: {run_dir}",
                             hint="give the directory of a run, e.g. runs/<env>-<date>-<time>")
    if not run_dir.is_dir():
        raise RLFactoryError(f"{run_dir} is not a directory", hint="give the directory of a run, not a file in it")
    if not (run_dir / METRICS_FILE).is_file():
        raise RLFactoryError(f"{run_dir} is not a run: it has no {METRICS_FILE}",
                             hint="give the directory `rlf train` wrote (runs/<env>-<date>-<time>)")
    damaged: list[int] = []
    try:
        records = read_metrics(run_dir, damaged=damaged)
    except OSError as exc:
        raise RLFactoryError(f"cannot read {run_dir / METRICS_FILE}: {exc.strerror or exc}",
                             hint="check the file's permissions") from None
    # as rlf ui does: one damaged line must not hide the rest of the run, but it is named
    for number in damaged:
        err.print(f"Warning: skipped line {number} of {run_dir / METRICS_FILE}: not a JSON object",
                  markup=False, highlight=False, soft_wrap=True)
    return records


def _run_config(run_dir: Path) -> dict:
    """The run's config.yaml as a dict; ``{}`` when missing or unreadable (it only titles the plot)."""
    import yaml

    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def _title(run_dir: Path, config: dict) -> str:
    model = config.get("model")
    parts = [run_dir.resolve().name]
    if config.get("env"):
        parts.append(f"env {config['env']}")
    if isinstance(model, dict) and model.get("name"):
        parts.append(f"model {model['name']}")
    return TITLE_SEPARATOR.join(parts)


def _eval_split(config: dict) -> str | None:
    data = config.get("data")
    split = data.get("eval_split") if isinstance(data, dict) else None
    return split if isinstance(split, str) else None


# -- the numbers --------------------------------------------------------------------------------

def _number(value: Any) -> float | None:
    """A finite float, or None: NaN is logged as null, and lists (samples) and bools are not curves."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def series(records: list[dict], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``key``, by step; a record without an integer step is skipped, and
    a step logged twice keeps its last value."""
    points: dict[int, float] = {}
    for record in records:
        step, value = record.get("step"), _number(record.get(key))
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0 and value is not None:
            points[step] = value
    return sorted(points.items())


def panels_for(records: list[dict], eval_split: str | None = None) -> list[Panel]:
    """The panels this run has data for, in reading order; a series without a point is dropped."""
    held_out = f"eval ({eval_split})" if eval_split else "eval"
    accuracy = "eval/reward/accuracy" if series(records, "eval/reward/accuracy") else "eval/reward/mean"
    candidates = [
        Panel("held-out accuracy" if accuracy.endswith("accuracy") else "held-out reward",
              ((accuracy, held_out),), share=accuracy.endswith("accuracy"), annotate=True),
        Panel("training reward", (("reward/mean", "mean reward"), ("reward/accuracy", "accuracy"))),
        Panel("tool calls per trajectory", (("tools/calls_per_trajectory", "train"),
                                            ("eval/tools/calls_per_trajectory", held_out))),
        Panel("tool error rate", (("tools/error_rate", "train"), ("eval/tools/error_rate", held_out)), share=True),
        # the infrastructure's failures (timeouts, outages: rlfactory_core.outcomes), not the model's
        Panel("infrastructure failures", (("outcome/infrastructure", "train"),
                                          ("eval/outcome/infrastructure", held_out)), share=True),
        Panel("entropy", (("train/entropy", "policy entropy"),)),
        Panel("KL and clip fraction", (("train/kl", "KL to reference"), ("train/clip_fraction", "clip fraction"))),
        Panel("sampler vs trainer mismatch", (("train/sampler_logprob_diff", "|logp diff| per token"),
                                              ("train/sampler_kl", "sampler KL"))),
        Panel("step time by phase (s)", TIME_PHASES, stacked=True),
    ]
    panels = []
    for panel in candidates:
        kept = tuple((key, label) for key, label in panel.series if series(records, key))
        if kept:
            panels.append(Panel(panel.title, kept, panel.share, panel.stacked, panel.annotate))
    return panels


# -- the drawing --------------------------------------------------------------------------------

def _matplotlib():
    """matplotlib's Figure and Agg canvas, imported now; it must never write to the user's home."""
    if "MPLCONFIGDIR" not in os.environ:
        config_dir = tempfile.mkdtemp(prefix="rlf-matplotlib-")
        atexit.register(shutil.rmtree, config_dir, ignore_errors=True)
        os.environ["MPLCONFIGDIR"] = config_dir
    try:
        import matplotlib  # noqa: F401  (first, so that a missing package fails here)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise RLFactoryError(f"rlf plot needs matplotlib, which is not installed ({exc})",
                             hint=INSTALL_HINT) from None
    return Figure, FigureCanvasAgg, MaxNLocator


def _grid(count: int) -> tuple[int, int]:
    """(rows, columns): one row up to 4 panels, then rows of 3 or 4, whichever leaves fewer holes."""
    columns = count if count <= 4 else (3 if count in (5, 6, 9) else 4)
    return math.ceil(count / columns), columns


def draw_figure(panels: list[Panel], records: list[dict], *, title: str, dpi: int = 100):
    """A matplotlib Figure of ``panels`` on an Agg canvas, ``PANEL_WIDTH`` x ``PANEL_HEIGHT`` inches
    a panel plus a title band: its size in pixels is fixed by the panel count and ``dpi``."""
    Figure, FigureCanvasAgg, MaxNLocator = _matplotlib()
    rows, columns = _grid(len(panels))
    figure = Figure(figsize=(columns * PANEL_WIDTH, rows * PANEL_HEIGHT + TITLE_HEIGHT), dpi=dpi,
                    layout="constrained")
    FigureCanvasAgg(figure)
    if len(title) > columns * PANEL_WIDTH * 10:  # ~10 characters an inch at 12 pt: one part a line
        title = title.replace(TITLE_SEPARATOR, "\n")
    figure.suptitle(title, fontsize=12)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    first, last = _step_range(panels, records)
    pad = max(0.5, (last - first) * 0.03)  # half a bar, or room for the markers at the ends
    for ax, panel in zip(axes, panels):
        if panel.stacked:
            _draw_stacked(ax, panel, records)
        else:
            _draw_lines(ax, panel, records)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlim(first - pad, last + pad)  # the same steps under each other in every panel
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if ax.get_xlabel() == "":
            ax.set_xlabel("step", fontsize=8)
        if panel.share:
            ax.set_ylim(-0.03, 1.03)
        if not panel.stacked:
            ax.legend(fontsize=7, loc="best")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return figure


def _step_range(panels: list[Panel], records: list[dict]) -> tuple[int, int]:
    steps = [step for panel in panels for key, _ in panel.series for step, _ in series(records, key)]
    return min(steps), max(steps)


def _draw_lines(ax, panel: Panel, records: list[dict]) -> None:
    for key, label in panel.series:
        points = series(records, key)
        cold = series(records, f"cold_start/{key}") if key.startswith("eval/") else []
        base = None
        if cold and points and points[0][0] == 0:  # RL started from the warmed-up model, not the base
            base = points.pop(0)
        if cold:
            points.insert(0, cold[-1])
        eval_like = key.startswith("eval/")
        marker = "o" if eval_like or len(points) <= 30 else None
        (line,) = ax.plot([s for s, _ in points], [v for _, v in points], marker=marker,
                          markersize=5 if eval_like else 3, linewidth=1.5, label=label)
        if base is not None:
            ax.plot([base[0]], [base[1]], marker="o", markersize=6, linestyle="none", markerfacecolor="none",
                    color="gray", label="base model")
        if cold:
            ax.plot([0], [cold[-1][1]], marker="*", markersize=12, linestyle="none", color=line.get_color(),
                    label="after cold start")
        if panel.annotate and eval_like:
            _label_values(ax, points, base)


def _label_values(ax, points: list[tuple[int, float]], base: tuple[int, float] | None) -> None:
    """Write the base model's value and the curve's first and last: the numbers a reader quotes.
    The first ones go right of their point and the last left of it, so all stay inside the axes."""
    for step, value in ([base] if base else []) + points[:1]:
        ax.annotate(f"{value:.3f}", (step, value), textcoords="offset points", xytext=(6, -3), fontsize=7)
    if len(points) > 1:
        step, value = points[-1]
        ax.annotate(f"{value:.3f}", (step, value), textcoords="offset points", xytext=(-6, 6), ha="right",
                    fontsize=7)


def _draw_stacked(ax, panel: Panel, records: list[dict]) -> None:
    by_phase = [(label, dict(series(records, key))) for key, label in panel.series]
    steps = sorted({step for _, values in by_phase for step in values})
    bottom = [0.0] * len(steps)
    for label, values in by_phase:
        heights = [values.get(step, 0.0) for step in steps]
        ax.bar(steps, heights, bottom=bottom, width=0.8 if len(steps) <= 50 else 1.0, linewidth=0, label=label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylim(0, max(bottom) * 1.4 or 1.0)  # room above the bars for the legend
    ax.legend(fontsize=7, loc="upper left", ncols=3, columnspacing=0.8, handlelength=1.2)
    cold_start = sum(value for key in COLD_START_TIMES for _, value in series(records, key))
    if cold_start:  # minutes of it beside seconds of a step: said, not drawn
        ax.set_xlabel(f"step (cold start before step 1: {cold_start:.0f} s)", fontsize=8)


def _check_writable(path: Path) -> None:
    """Fail before drawing, with the reason, where the PNG cannot go."""
    if path.is_dir():
        raise RLFactoryError(f"cannot write {path}: it is a directory", hint="give --out a file name, e.g. curves.png")
    parent = path.parent
    if not parent.is_dir():
        raise RLFactoryError(f"cannot write {path}: the directory {parent} does not exist",
                             hint="create it, or give --out a path in an existing directory")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise RLFactoryError(f"cannot write {path}: permission denied", hint="give --out a path you can write")


def _save(figure, path: Path, *, dpi: int) -> None:
    """Write through a temporary file beside ``path``: a failed write leaves no half PNG behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        figure.savefig(tmp, format="png", dpi=dpi)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RLFactoryError(f"cannot write {path}: {exc.strerror or exc}",
                             hint="give --out a path you can write") from None
