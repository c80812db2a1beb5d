"""``rlf train`` and ``rlf eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from .console import out
from .quiet import engine_output_to_log, quiet_engines, set_verbose

__all__ = ["train", "eval_command", "quiet_engines"]


def _print_config_help() -> None:
    from rlfactory_core.config import PRESETS, describe

    table = Table(title="rlf train: config keys (set in a YAML file or as key=value)", show_lines=False)
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("default")
    table.add_column("meaning")
    for key, default, help_text in describe():
        table.add_row(key, default, help_text)
    out.print(table)
    out.print(f"presets (--preset NAME): {', '.join(PRESETS)}")


def train(
    overrides: Annotated[Optional[list[str]], typer.Argument(
        help="config overrides KEY=VALUE (dotted keys, YAML values), e.g. train.lr=2e-6 grpo.group_size=8",
        show_default=False)] = None,
    env: Annotated[Optional[str], typer.Option("--env", help="the env to train on (see `rlf envs list`)")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="policy: embedded name, directory or hub id")] = None,
    config: Annotated[Optional[list[Path]], typer.Option("--config", "-c", help="YAML config file (repeatable)")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="cpu-smoke or gpu")] = None,
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="where the run is written")] = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="continue the run in RUN_DIR")] = None,
    help_config: Annotated[bool, typer.Option("--help-config", help="list every config key and exit")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="show the engines' own output (vLLM, torch, "
                                                                    "...) in the terminal instead of the run's "
                                                                    "log.txt")] = False,
) -> None:
    """Train a policy with GRPO on an env's tool-use task."""
    if help_config:
        _print_config_help()
        return
    if verbose:
        set_verbose()
    with engine_output_to_log():
        _run_train(overrides, env=env, model=model, config=config, preset=preset, run_dir=run_dir, resume=resume)


def _run_train(overrides: list[str] | None, *, env: str | None, model: str | None, config: list[Path] | None,
               preset: str | None, run_dir: Path | None, resume: Path | None) -> None:
    from rlfactory_core.preflight import checked_config
    from rlfactory_core.trainer import train as run_training

    flags: dict[str, Any] = {}
    if env is not None:
        flags["env"] = env
    if model is not None:
        flags["model"] = {"name": model}
    if run_dir is not None:
        flags["run_dir"] = str(run_dir)
    # Every problem at once, before anything is announced or written (--resume's config.yaml included).
    cfg = checked_config(list(config or []), overrides or [], preset=preset, flags=flags, resume=resume)
    # The trainer announces the run once its task and data are built, just before writing its directory.
    run = run_training(cfg, resume=resume, console=out)
    out.print(f"[green]done[/]: run in {run} (metrics.jsonl, trajectories/, checkpoints/, samples/; "
              f"watch it with `rlf ui {run.parent}`)")


def eval_command(
    env: Annotated[str, typer.Option("--env", help="the env to evaluate on")],
    model: Annotated[str, typer.Option("--model", help="a model (name or directory) or a run directory")],
    split: Annotated[str, typer.Option("--split", help="the env's split (test, train, ...)")] = "test",
    size: Annotated[Optional[int], typer.Option("--size", min=1, help="evaluate the first N samples (default: the whole split; a generated dataset's own size)")] = None,
    config: Annotated[Optional[list[Path]], typer.Option("--config", "-c", help="YAML config file")] = None,
    report: Annotated[Optional[Path], typer.Option("--report", help="report directory (default: next to the "
                                                                     "run, or eval-<env>/)")] = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(help="config overrides KEY=VALUE",
                                                             show_default=False)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="show the engines' own output (vLLM, torch, "
                                                                    "...) in the terminal instead of the "
                                                                    "report's log.txt")] = False,
) -> None:
    """Evaluate a model or a training run on held-out samples: accuracy and tool use."""
    if verbose:
        set_verbose()
    from rlfactory_core.errors import Interrupted

    with engine_output_to_log():
        try:
            _run_eval(env=env, model=model, split=split, size=size, config=config, report=report,
                      overrides=overrides)
        except KeyboardInterrupt:
            # typer would turn it into a silent exit 130: say what happened, as rlf train does
            raise Interrupted("the evaluation was stopped before its end; no report was written") from None


def _run_eval(*, env: str, model: str, split: str, size: int | None, config: list[Path] | None, report: Path | None,
              overrides: list[str] | None) -> None:
    from rlfactory_core.logs import LOG_FILE, log_to
    from rlfactory_core.preflight import checked_config
    from rlfactory_core.evaluation import evaluate

    files = list(config or [])
    run_config = Path(model) / "config.yaml"
    if not files and run_config.is_file():  # a run directory: evaluate with its settings
        files = [run_config]
    if report is None:
        report = (Path(model) / "eval" / split) if run_config.is_file() else Path(f"eval-{env}-{split}")
    cfg = checked_config(files, overrides or [], flags={"env": env}, purpose="eval", model=model, split=split,
                         report_dir=report)
    result = evaluate(cfg, model, split=split, size=size, report_dir=report, console=out)
    log_to(report / LOG_FILE)
    metrics = result["metrics"]
    table = Table(title=f"rlf eval: {env} / {split} ({result['samples']} samples)")
    table.add_column("metric", style="cyan")
    table.add_column("value", justify="right")
    for key in ("eval/reward/accuracy", "eval/reward/mean", "eval/tools/calls_per_trajectory",
                "eval/tools/trajectories_with_calls", "eval/tools/error_rate", "eval/rollout/turns_mean",
                "eval/rollout/model_tokens_mean"):
        if key in metrics:
            table.add_row(key.removeprefix("eval/"), f"{metrics[key]:.3f}")
    for key, value in sorted(metrics.items()):
        if key.startswith(("eval/rollout/stop/", "eval/tools/error_rate/")):
            table.add_row(key.removeprefix("eval/"), f"{value:.3f}")
    out.print(table)
    out.print(f"report: {report / 'report.json'}")
