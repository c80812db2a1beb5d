"""Evaluation: held-out samples rolled out greedily (or at ``eval.temperature``) and scored.

:func:`run_eval` runs during training (before the first step, every ``eval.every`` steps and
after the last) on any engine; :func:`evaluate` is ``rlf eval``: one model (a name, a
directory, a run's newest checkpoint) on a split, in this process, with a report and sample
trajectories written as text.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Sequence

from .config import RunConfig
from .data import load_samples
from .engines.base import rollout_config_for
from .engines.local import LocalRollout
from .families import with_recorded_family
from .outcomes import outcome_metrics
from .task import build_task

__all__ = ["evaluate", "run_eval", "accuracy_by_kind", "tool_metrics", "eval_summary"]


def evaluate(config: RunConfig, model: str, *, split: str = "test", size: int | None = None,
             report_dir: str | os.PathLike[str] | None = None, console: Any = None) -> dict[str, Any]:
    """Evaluate ``model`` (a model name, a directory, or a run directory: its newest
    checkpoint) on ``split`` (all of it, or its first ``size`` samples); write ``report.json``
    and sample trajectories into ``report_dir`` (when given); return the report. Checked
    first like :func:`train`."""
    from .preflight import raise_problems, run_problems

    raise_problems(run_problems(config, purpose="eval", model=model, split=split, report_dir=report_dir))
    return asyncio.run(_evaluate(config, model, split=split, size=size,
                                 report_dir=Path(report_dir) if report_dir else None, console=console))


async def _evaluate(config: RunConfig, model: str, *, split: str, size: int | None, report_dir: Path | None,
                    console: Any) -> dict[str, Any]:
    from .models import check_images, load_tokenizer
    from .preflight import resolve_eval_model

    # a run's newest checkpoint, a checkpoint, an embedded name (prepared), a directory or a hub id
    path = resolve_eval_model(model)
    # a checkpoint is evaluated with the family it was trained with (rlfactory_core.families)
    config = with_recorded_family(config, Path(path).parent if (Path(path).parent / "state.json").is_file() else None)
    task = build_task(config)
    try:
        # The whole split unless a size is given: `rlf eval` reports on the split, not on the
        # data.eval_size subset that periodic evaluation during training uses.
        samples = load_samples(config, task.env, split, size)
        tokenizer = load_tokenizer(path)
        processor = check_images(config, task.env, path, training=False)
        generation = await LocalRollout.open(config, task, path, tokenizer, processor)
    except BaseException:
        await task.close()
        raise
    try:
        metrics = await run_eval(0, samples, generation, config, report_dir / "samples" if report_dir else None,
                                 tokenizer)
    finally:
        await generation.close()
    report = {"model": str(path), "env": config.env, "split": split, "samples": len(samples),
              "family": getattr(generation.family, "name", None), "metrics": metrics}
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "report.json").write_text(json.dumps(report, indent=2))
    return report


async def run_eval(step: int, samples: Sequence[Any], engine: Any, config: RunConfig, out_dir: Path | None,
                   tokenizer: Any, *, record_in: Path | None = None, record_kind: str = "eval") -> dict[str, float]:
    """``eval/*`` metrics of one greedy pass over ``samples`` (``engine``: anything with the
    engine protocol's ``rollout``); the first ``eval.save_samples`` trajectories are written
    to ``out_dir/step-<step>.jsonl``; with ``record_in`` (a run directory) and
    ``logging.record_eval``, every trajectory is recorded token by token there
    (:mod:`rlfactory_core.records`, kind ``record_kind``)."""
    from .rollout import rollout_metrics

    trajectories, scored, _ = await engine.rollout(
        samples, rollout_config_for(config, -1, temperature=config.eval.temperature), group_size=1, rewards="eval",
        priority=step)  # the trainer waits for it: before the rollouts of later steps
    metrics = scored.metrics("eval/reward")
    metrics.update(outcome_metrics("eval/outcome", scored.outcomes, scored.correct))
    rollout_stats = rollout_metrics(trajectories)
    metrics.update(tool_metrics("eval/tools", rollout_stats, trajectories))
    metrics.update({k.replace("rollout/", "eval/rollout/"): v for k, v in rollout_stats.items()})
    metrics.update(accuracy_by_kind("eval/reward/accuracy", trajectories, samples, scored.correct))
    if record_in is not None and config.logging.record_eval:
        from .records import trajectory_records, write_records

        write_records(record_in, record_kind, step, trajectory_records(
            trajectories, step=step, kind=record_kind, scored=scored, tokenizer=tokenizer,
            row_samples=[samples[t.group] if t.group is not None else None for t in trajectories]))
    if out_dir is not None and config.eval.save_samples:
        _save_samples(out_dir / f"step-{step:06d}.jsonl", trajectories[:config.eval.save_samples],
                      samples, scored, tokenizer)
    return metrics


def _save_samples(path: Path, trajectories: Sequence[Any], samples: Sequence[Any], scored: Any,
                  tokenizer: Any) -> None:
    """Trajectories as readable text: the whole conversation as the model saw it, with
    each reward's score and any reward errors."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row, trajectory in enumerate(trajectories):
            sample = samples[trajectory.group]
            ids = list(trajectory.prompt_ids) + [i for s in trajectory.segments for i in s.token_ids]
            f.write(json.dumps({
                "sample_id": trajectory.sample_id, "reward": scored.totals[row], "rewards": scored.components[row],
                "reward_errors": scored.reward_errors[row],
                "final_answer": trajectory.final_answer,
                "expected": sample.get("answer", sample.get("answers")) if hasattr(sample, "get") else None,
                "stop_reason": trajectory.stop_reason, "turns": trajectory.num_turns,
                "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in trajectory.tool_calls],
                "text": tokenizer.decode(ids),
            }, ensure_ascii=False) + "\n")


def accuracy_by_kind(prefix: str, trajectories: Sequence[Any], samples: Sequence[Any],
                     correct: Sequence[bool | None]) -> dict[str, float]:
    """``<prefix>/kind/<kind>``: the accuracy per question kind, for samples that name their
    ``kind`` (a string: the deepsearch questions' ``region``, ``currency_via_capital``, ...);
    trajectories whose correctness no reward judged are left out."""
    judged: dict[str, list[bool]] = {}
    for trajectory, is_correct in zip(trajectories, correct):
        sample = samples[trajectory.group]
        kind = sample.get("kind") if hasattr(sample, "get") else None
        if isinstance(kind, str) and kind and is_correct is not None:
            judged.setdefault(kind, []).append(bool(is_correct))
    return {f"{prefix}/kind/{kind}": sum(marks) / len(marks) for kind, marks in sorted(judged.items())}


def tool_metrics(prefix: str, rollout: dict[str, float], trajectories: Sequence[Any]) -> dict[str, float]:
    """Per-trajectory and per-call rates from :func:`~rlfactory_core.rollout.rollout_metrics`."""
    n = max(rollout["rollout/trajectories"], 1.0)
    calls = rollout.get("rollout/tool_calls", 0.0)
    metrics = {
        f"{prefix}/calls_per_trajectory": calls / n,
        f"{prefix}/trajectories_with_calls": sum(1 for t in trajectories if t.tool_calls) / n,
        f"{prefix}/error_rate": rollout.get("rollout/tool_errors", 0.0) / calls if calls else 0.0,
        f"{prefix}/parse_errors_per_trajectory": rollout.get("rollout/parse_errors", 0.0) / n,
    }
    for key, count in rollout.items():
        if key.startswith("rollout/tool_errors/"):
            metrics[f"{prefix}/error_rate/{key.rsplit('/', 1)[1]}"] = count / calls if calls else 0.0
    return metrics


def eval_summary(metrics: dict[str, Any]) -> str:
    """``reward R, accuracy A``; no accuracy when no reward judges correctness."""
    text = f"reward {metrics['eval/reward/mean']:.3f}"
    if "eval/reward/accuracy" in metrics:
        text += f", accuracy {metrics['eval/reward/accuracy']:.3f}"
    return text
