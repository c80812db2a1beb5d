"""The phases of a training step: the units every schedule (:mod:`rlfactory_core.loops`) calls,
on an open :class:`~rlfactory_core.run.Run`. Each says whether a stop request may drop it.

* :func:`before_training`: the eval before the first step and the cold start (a new run only).
* :func:`rollout_phase` (droppable): the step's prompts rolled out, scored, the members that
  failed on the infrastructure's side run again (:mod:`rlfactory_core.resampling`), and
  assembled into the batch's groups (:mod:`rlfactory_core.training.assembly`).
* :func:`update_phase` (never dropped: half an update cannot be undone): the batch built and
  the engine's update; the first groups recorded token by token (:mod:`rlfactory_core.records`).
* :func:`sync_phase`: the new weights to the generation backend.
* :func:`end_step`: the step's metrics and warnings, its eval and checkpoint, then logged.

How a step's numbers are defined (rewards, advantages, the loss) is in ``docs/training.md``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from .config import RunConfig
from .data import indices_at, untrained_positions
from .engines import rollout_config_for
from .evaluation import eval_summary, tool_metrics
from .families import TEMPLATE
from .outcomes import INFRASTRUCTURE, outcome_metrics, side_of
from .records import trajectory_records, write_records
from .resampling import resample_rollout, selection_weights
from .rewards import ScoredBatch
from .rollout import rollout_metrics
from .run import Run, RunAborted
from .stopping import PhaseDropped
from .training.assembly import BatchAssembler, group_filters
from .training.batch import build_batch, trajectory_rows
from .training.cold_start import collect_examples, example_batch
from .training.overlong import overlong_metrics, with_overlong_penalty

__all__ = ["StepRollout", "StepUpdate", "before_training", "next_prompts", "attempt_size", "rollout_phase",
           "update_phase", "sync_phase", "end_step"]


@dataclass
class StepRollout:
    """A step's assembled groups (``assembled.trajectories``, ``assembled.scored``), every
    sample rolled out for it and its data positions (all trained once the update ran: kept
    or not) and the phases' times."""

    assembled: Any
    samples: list[Any]
    times: dict[str, float]
    positions: list[int]


@dataclass
class StepUpdate:
    """What the update leaves for the step's metrics."""

    stats: dict[str, float]
    advantages: Any  # [B] each trajectory's advantage
    batch_tokens: float


async def before_training(run: Run) -> None:
    """A new run's eval before training, then the cold start and its eval (once: a resumed
    run's checkpoint has it)."""
    if run.start_step != 0:
        return
    run.view.phase("eval")
    metrics = await run.evaluate(0, whole_splits=True)
    run.logger.log(0, metrics)
    run.view.message(f"eval before training: {eval_summary(metrics)}, "
                     f"tool calls/trajectory {metrics['eval/tools/calls_per_trajectory']:.2f}")
    if run.config.cold_start.source == "off":
        return
    run.view.phase("cold start")
    metrics = await _cold_start(run)
    if run.config.cold_start.eval and metrics["cold_start/examples"]:  # else: the model of step 0
        run.view.phase("eval")
        evaluated = await run.evaluate(0, "cold_start", kind="cold_start_eval", whole_splits=True)
        metrics.update({f"cold_start/{key}": value for key, value in evaluated.items()})
        run.view.message(f"eval after the cold start alone: {eval_summary(evaluated)}")
    run.logger.log(0, metrics)


def next_prompts(run: Run, start: int, count: int) -> tuple[list[int], list[Any]]:
    """The ``count`` data positions from ``start`` that no checkpoint counts as trained
    (``run.trained_ahead``), and their samples, in the order ``train.seed`` fixes."""
    positions = untrained_positions(start, count, run.trained_ahead)
    config = run.config
    indices = indices_at(len(run.train_samples), positions, config.train.seed, shuffle=config.data.shuffle)
    return positions, [run.train_samples[i] for i in indices]


def attempt_size(config: RunConfig, assembler: BatchAssembler, attempt: int) -> int:
    """How many prompts a step's rollout ``attempt`` (0, 1, ...) takes: ``prompts_per_step``
    first; with ``grpo.dynamic_sampling``, as many as the batch still needs, up to
    ``grpo.max_extra_rollouts`` more attempts; 0 when the step has its groups or its attempts."""
    g = config.grpo
    if not assembler.needed:
        return 0
    if attempt == 0:
        return g.prompts_per_step
    return assembler.needed if g.dynamic_sampling and attempt <= g.max_extra_rollouts else 0


async def rollout_phase(run: Run, step: int, position: int | None = None) -> StepRollout:
    """Step ``step``'s batch: ``prompts_per_step`` prompts from the data ``position`` (default:
    the run's, every prompt of the trained steps; a schedule that rolls out ahead passes the
    position after the rollouts it has not trained yet), rolled out and scored, then more
    attempts while :func:`attempt_size` asks for them."""
    config, g = run.config, run.config.grpo
    if position is None:
        position = run.position
        run.view.phase("rollout")  # a rollout ahead runs behind the phase in progress
    assembler = BatchAssembler(g.prompts_per_step, group_filters(config), config.failures.masked)
    samples: list[Any] = []
    positions: list[int] = []
    times: dict[str, float] = {}
    attempt = 0
    while count := attempt_size(config, assembler, attempt):
        taken, batch_samples = next_prompts(run, positions[-1] + 1 if positions else position, count)
        positions += taken
        result = await run.engine.rollout(batch_samples, rollout_config_for(config, step, attempt=attempt),
                                          group_size=g.group_size, rewards="train", priority=step)
        t = time.perf_counter()
        trajectories, scored, replaced = await resample_rollout(run.engine, config, step, batch_samples, taken,
                                                                result.trajectories, result.scored)
        if replaced:
            times["time/resample"] = times.get("time/resample", 0.0) + time.perf_counter() - t
        assembler.add(trajectories, with_overlong_penalty(trajectories, scored, config), replaced)
        samples += batch_samples
        for key, value in result.times.items():  # times add up; counters (ray restarts) are the latest
            times[key] = times.get(key, 0.0) + value if key.startswith("time/") else value
        attempt += 1
    return StepRollout(assembler.assemble(), samples, times, positions)


async def update_phase(run: Run, step: int, rollout: StepRollout) -> StepUpdate:
    """Advantages and the update on the step's batch; the data position moves past every
    sample rolled out for it."""
    aborting = run.config.failures.aborting(rollout.assembled.scored.outcomes)
    if aborting:  # before anything of the step is trained or counted: a resume redoes it
        raise RunAborted(f"step {step} not trained: {aborting}",
                         hint="the service's failures are logged per trajectory (rlf ui, outcome filter); raise "
                              "failures.abort_share or handle the class with mask to train on")
    run.rng_before_step = None  # from here on a stop request finishes the step and saves it
    run.view.phase("train")
    t = time.perf_counter()
    config, trajectories, scored = run.config, rollout.assembled.trajectories, rollout.assembled.scored
    weights, weight_metrics = selection_weights(config, trajectories, rollout.assembled.replaced)
    batch = build_batch(trajectories, scored.totals, config, run.pad_id, run.processor,
                        reward_turn_rewards=scored.turn_rewards, policy_version=run.engine.policy_version,
                        masked=config.failures.masked(scored.outcomes), weights=weights)
    # the first groups are recorded token by token; the update leaves their logprobs before it
    # in the batch (rlfactory_core.records)
    marks = [t.group < config.logging.record_train_groups for t in trajectories]
    recorded = [row for row, mark in enumerate(marks) if mark]  # trajectories
    if recorded:
        batch["recorded"] = batch["lengths"].new_tensor([marks[i] for i in batch["trajectory"].tolist()]).bool()
    staleness = _staleness_metrics(batch)
    stats = {**await run.engine.update(batch, step), **staleness, **weight_metrics}
    if recorded:
        _record_train_rows(run, step, rollout, batch, recorded)
    first_rows = [rows[0] for rows in trajectory_rows(batch)]
    update = StepUpdate(stats, batch["sequence_advantages"][first_rows], float(batch["attention_mask"].sum()))
    del batch
    run.mark_trained(rollout.positions)  # every prompt rolled out for the step, kept or not
    run.stop.updated()
    rollout.times["time/train"] = time.perf_counter() - t
    return update


async def sync_phase(run: Run, times: dict[str, float]) -> dict[str, float]:
    """The new weights to the generation backend (not when stopping: no generation follows)."""
    if run.stop.requested:
        return {}
    run.view.phase("weight sync")
    t = time.perf_counter()
    metrics = await run.engine.sync_weights()
    times["time/weight_sync"] = time.perf_counter() - t
    return metrics


async def end_step(run: Run, step: int, rollout: StepRollout, update: StepUpdate, synced: dict[str, float],
                   started: float) -> None:
    """The step's metrics and warnings; its eval (every ``eval.every`` steps and the last) and
    checkpoint (every ``checkpoint.every`` steps, the last, and when stopping); then logged."""
    config, times = run.config, rollout.times
    assembled = rollout.assembled
    metrics = {**_step_metrics(config, assembled.trajectories, assembled.scored, update, times),
               **assembled.metrics, **update.stats, **synced}
    reader = (f"the {run.family.name} family's call parsing" if run.family is not None and run.family.name != TEMPLATE
              else f"the parser ({config.parser})")
    for kind, warning in _step_warnings(config, run.task.offers_tools, reader, step, metrics, assembled.scored.totals):
        run.view.warn(warning)
        metrics[f"warnings/{kind}"] = 1.0  # in the run's metrics too: `rlf ui` marks the step
    if config.eval.every and step % config.eval.every == 0 or step == config.train.steps:
        run.view.phase("eval")
        t = time.perf_counter()
        with contextlib.suppress(PhaseDropped):  # the step is finished without its eval
            metrics.update(await run.evaluate(step, whole_splits=step == config.train.steps))
            times["time/eval"] = time.perf_counter() - t
            run.view.message(f"eval at step {step}: {eval_summary(metrics)}")
    metrics["samples"] = [str(s.get("id", "")) if hasattr(s, "get") else "" for s in rollout.samples]
    if step % config.checkpoint.every == 0 or step == config.train.steps or run.stop.requested:
        run.view.phase("checkpoint")
        t = time.perf_counter()
        await run.save(step, {**metrics, **times, "time/step": time.perf_counter() - started})
        times["time/checkpoint"] = time.perf_counter() - t
    times["time/step"] = time.perf_counter() - started
    metrics.update(times)
    run.finished(step, metrics)


def _record_train_rows(run: Run, step: int, rollout: StepRollout, batch: Any, rows: list[int]) -> None:
    """The recorded groups of the step, token by token, with what the update saw
    (:mod:`rlfactory_core.records`), each model token with the weight version that sampled it."""
    trajectories = rollout.assembled.trajectories
    by_id = {str(s.get("id")): s for s in rollout.samples if hasattr(s, "get")}
    records = trajectory_records(
        trajectories, step=step, kind="train", scored=rollout.assembled.scored, tokenizer=run.tokenizer,
        row_samples=[by_id.get(str(t.sample_id)) for t in trajectories], rows=rows,
        batch_rows=trajectory_rows(batch), advantages=batch["sequence_advantages"],
        token_advantages=batch["advantages"], trainer_logprobs=batch.get("trainer_logprobs", None))
    # the attempts the recorded groups' resamples replaced, after them (rlfactory_core.resampling)
    replaced = [r for r in rollout.assembled.replaced if r.group < run.config.logging.record_train_groups]
    if replaced:
        records += trajectory_records(
            [r.trajectory for r in replaced], step=step, kind="train", tokenizer=run.tokenizer,
            scored=ScoredBatch.concat([r.scored for r in replaced]), replaced=True,
            row_samples=[by_id.get(str(r.trajectory.sample_id)) for r in replaced])
        for index, record in enumerate(records):
            record["index"] = index
    write_records(run.run_dir, "train", step, records)


def _staleness_metrics(batch: Any) -> dict[str, float]:
    """The trained tokens' ages in policy versions (``staleness``, :mod:`.training.batch`): the
    share of each age (``staleness/tokens_<age>``) and the oldest (``staleness/max``)."""
    if "staleness" not in batch.keys():
        return {}
    mask = batch["loss_mask"].bool()
    ages = batch["staleness"][mask]
    if not ages.numel():
        return {}
    counts = ages.bincount()
    metrics = {f"staleness/tokens_{age}": float(count) / ages.numel() for age, count in enumerate(counts.tolist())}
    metrics["staleness/max"] = float(ages.max())
    return metrics


async def _cold_start(run: Run) -> dict[str, float]:
    """The cold start (:mod:`rlfactory_core.training.cold_start`): examples collected
    (droppable, as a rollout), the supervised warm-up on them, the weights synced; its
    ``cold_start/*`` metrics."""
    from .rollout import ChatTemplate

    config, view = run.config, run.view
    # the rollout's rendering, for replayed demonstrations (written in the template family's text formats)
    chat = ChatTemplate(run.tokenizer, processor=run.processor) if run.family is None or run.family.name == TEMPLATE \
        else None
    examples = await run.stop.droppable(collect_examples(
        run.engine, run.task, chat, config, run.train_samples,
        lambda attempt: rollout_config_for(config, 0, attempt=attempt)))
    metrics = examples.metrics()
    if not examples.trajectories:
        view.warn(f"cold start ({config.cold_start.source}): no successful trajectory or demonstration was found; "
                  "training starts from the base model")
        return metrics
    # the warm-up reports nothing until it ends, minutes later on a CPU: say what it is doing
    cold = config.cold_start
    steps = math.ceil(len(examples.trajectories) / cold.batch_size)
    view.message(f"cold start: {len(examples.trajectories)} examples ({metrics['cold_start/tokens']:.0f} tokens) "
                 f"collected in {metrics['time/cold_start_collect']:.0f} s; training "
                 f"{cold.epochs} x {steps} optimizer steps (passes x steps per pass)")
    t = time.perf_counter()
    metrics.update(await run.engine.supervised_update(example_batch(examples.trajectories, run.pad_id)))
    metrics["time/cold_start_train"] = time.perf_counter() - t
    metrics.update(await run.engine.sync_weights())
    view.message(f"cold start: {len(examples.trajectories)} examples ({examples.sources.count('rejection')} own, "
                 f"{examples.sources.count('demonstrations')} demonstrations), loss "
                 f"{metrics['cold_start/loss_first_epoch']:.3f} -> {metrics['cold_start/loss_last_epoch']:.3f} "
                 f"(first and last pass), {metrics['time/cold_start_collect'] + metrics['time/cold_start_train']:.0f} s")
    return metrics


def _step_metrics(config: RunConfig, trajectories: Sequence[Any], scored: Any, update: StepUpdate,
                  times: dict[str, float]) -> dict[str, float]:
    """The step's rewards, advantages, rollout and tool statistics and throughputs."""
    advantages = update.advantages
    metrics = scored.metrics("reward")
    metrics.update(outcome_metrics("outcome", scored.outcomes, scored.correct))
    masked = Counter(o for o, m in zip(scored.outcomes, config.failures.masked(scored.outcomes)) if m)
    metrics.update({f"outcome/masked/{name}": count / len(scored.outcomes) for name, count in sorted(masked.items())})
    groups: dict[int, list[float]] = {}
    for trajectory, total in zip(trajectories, scored.totals):
        groups.setdefault(trajectory.group, []).append(total)
    metrics["reward/constant_groups"] = sum(1 for grp in groups.values() if max(grp) == min(grp)) / len(groups)
    metrics.update({"advantage/mean": float(advantages.mean()), "advantage/std": float(advantages.std()),
                    "advantage/max": float(advantages.max()), "advantage/min": float(advantages.min())})
    # what the service's failures taught: negative when they are trained on as scored (0 masked)
    infrastructure = [row for row, o in enumerate(scored.outcomes) if o is not None and side_of(o) == INFRASTRUCTURE]
    if infrastructure:
        metrics["advantage/on_infrastructure"] = float(advantages[infrastructure].sum())
    rollout_stats = rollout_metrics(trajectories)
    metrics.update(rollout_stats)
    metrics.update(tool_metrics("tools", rollout_stats, trajectories))
    metrics.update(overlong_metrics(trajectories, config))
    n = len(trajectories)
    metrics["time/generation_per_trajectory"] = sum(t.metadata.get("generation_s", 0.0) for t in trajectories) / n
    metrics["time/tools_per_trajectory"] = sum(t.metadata.get("tool_s", 0.0) for t in trajectories) / n
    metrics["throughput/rollout_tokens_per_s"] = (
        metrics["rollout/model_tokens_mean"] * n / max(times["time/rollout"], 1e-9))
    metrics["throughput/train_tokens_per_s"] = update.batch_tokens * config.grpo.epochs / max(times["time/train"], 1e-9)
    return metrics


def _step_warnings(config: RunConfig, offers_tools: bool, reader: str, step: int, metrics: dict[str, float],
                   totals: Sequence[float]) -> list[tuple[str, str]]:
    """Loud warnings, ``(kind, message)``: no tool call although tools are offered
    (``no_tool_call``; ``reader``: what reads the calls from the model's turns); nothing to
    learn (``constant_rewards``)."""
    warnings = []
    if offers_tools and config.logging.no_tool_call_warning and metrics["rollout/tool_calls"] == 0:
        warnings.append(("no_tool_call", f"step {step}: the model made no tool call in {len(totals)} trajectories "
                         f"although the env offers tools; check {reader} and the prompt, or add a format "
                         "reward / few-shot turns"))
    if metrics["reward/constant_groups"] == 1.0:
        warnings.append(("constant_rewards", f"step {step}: every group's rewards are constant (all {totals[0]:g}): "
                         "nothing to learn from this step; make the task easier or the reward denser, or raise "
                         "grpo.group_size"))
    return warnings
