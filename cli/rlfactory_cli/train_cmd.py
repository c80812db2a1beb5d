"""``rlf train`` and ``rlf eval``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from .console import out

__all__ = ["train", "eval_command", "quiet_engines"]


def quiet_engines() -> None:
    """vLLM and transformers log every request at INFO; a training run shows its own progress."""
    if os.environ.get("RLFACTORY_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}:
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
) -> None:
    """Train a policy with GRPO on an env's tool-use task."""
    if help_config:
        _print_config_help()
        return
    quiet_engines()
    from rlfactory_core.config import load_config
    from rlfactory_core.trainer import train as run_training

    flags: dict[str, Any] = {}
    files = list(config or [])
    if env is not None:
        flags["env"] = env
    if model is not None:
        flags["model"] = {"name": model}
    if run_dir is not None:
        flags["run_dir"] = str(run_dir)
    if resume is not None:
        saved = resume / "config.yaml"
        if not saved.is_file():
            from rlfactory_core.errors import RLFactoryError

            raise RLFactoryError(f"{resume} is not a run directory (no config.yaml)",
                                 hint="pass the directory a previous `rlf train` wrote (runs/<env>-<time>)")
        # The saved config comes first; files, options and overrides adjust it (train.steps=100).
        files = [saved, *files]
        flags["run_dir"] = str(resume)
    cfg = load_config(files, overrides or [], preset=preset, flags=flags)
    out.print(f"[bold]rlf train[/] env [cyan]{cfg.env}[/], model [cyan]{cfg.model.name}[/], "
              f"{cfg.train.steps} steps of {cfg.grpo.prompts_per_step} prompts x {cfg.grpo.group_size}")
    run = run_training(cfg, resume=resume, console=out)
    out.print(f"[green]done[/]: run in {run} (metrics.jsonl, tensorboard/, checkpoints/, samples/)")


def eval_command(
    env: Annotated[str, typer.Option("--env", help="the env to evaluate on")],
    model: Annotated[str, typer.Option("--model", help="a model (name or directory) or a run directory")],
    split: Annotated[str, typer.Option("--split", help="the env's split (test, train, ...)")] = "test",
    size: Annotated[Optional[int], typer.Option("--size", help="evaluate the first N samples (default: the whole split; a generated dataset's own size)")] = None,
    config: Annotated[Optional[list[Path]], typer.Option("--config", "-c", help="YAML config file")] = None,
    report: Annotated[Optional[Path], typer.Option("--report", help="report directory (default: next to the "
                                                                     "run, or eval-<env>/)")] = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(help="config overrides KEY=VALUE",
                                                             show_default=False)] = None,
) -> None:
    """Evaluate a model or a training run on held-out samples: accuracy and tool use."""
    quiet_engines()
    from rlfactory_core.config import load_config
    from rlfactory_core.trainer import evaluate

    files = list(config or [])
    run_config = Path(model) / "config.yaml"
    if not files and run_config.is_file():  # a run directory: evaluate with its settings
        files = [run_config]
    cfg = load_config(files, overrides or [], flags={"env": env})
    if report is None:
        report = (Path(model) / "eval" / split) if run_config.is_file() else Path(f"eval-{env}-{split}")
    result = evaluate(cfg, model, split=split, size=size, report_dir=report, console=out)
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
