"""The GRPO training loop, top to bottom.

One training step:

0. **Cold start** (a new run with ``cold_start.source`` set, once, after the eval before
   training): a supervised warm-up on the model's own successful trajectories or the env's
   demonstrations (:mod:`rlfactory_core.training.cold_start`), the weights synced, and an eval
   of the warmed-up model alone (``cold_start/eval/*``), so what RL adds is seen.
1. **Prompts**: the next ``grpo.prompts_per_step`` samples of the training set, in an
   order fixed by ``train.seed`` and the position in the data (a reshuffle per epoch), so
   a resumed run sees exactly the samples the uninterrupted run would have seen.
2. **Rollout**: ``grpo.group_size`` trajectories per prompt, all at once, by the async
   agent loop (``rlfactory_core.rollout``): token-exact, with the sampler's logprobs.
   Sampling seeds are derived from ``train.seed`` and the step (reproducible, different
   every step).
3. **Rewards**: every configured reward scores every trajectory concurrently; the total is
   the weighted sum of those that apply (``rlfactory_core.rewards``). A reward that fails
   or times out on a trajectory gives it the reward's fallback value and is counted
   (``reward/errors``): one bad trajectory never ends the run. The step's batch is assembled
   from the finished groups (``rlfactory_core.training.assembly``): all of them, or with
   ``grpo.dynamic_sampling`` those whose rewards differ, the next prompts rolled out (steps
   1-3 again, a bounded number of times) until the batch is full. Options for trajectories a
   length limit cut off (``rlfactory_core.training.overlong``, DAPO): ``grpo.overlong_buffer``
   adds a soft length penalty to the training reward before the assembly;
   ``grpo.overlong_filter`` masks their loss when the batch is built (step 4).
4. **Advantages**: reward minus the group mean, scaled by ``grpo.advantage_norm``; per-turn
   rewards from the env are added on the tokens of their turn and the turns before it
   (``rlfactory_core.training.grpo`` has the formulas and the reasons).
5. **Old logprobs**: the trainer's own logprobs of the sampled tokens before any update.
   With one optimizer step per batch (``epochs = mini_batches = 1``, the default) the
   policy *is* the old policy, so they come from the same forward pass as the loss
   (detached) and the extra pass is skipped. The sampler's logprobs are only used to
   measure the train/inference mismatch (``train/sampler_*``) and, with ``grpo.tis_cap``,
   to weight tokens by a truncated importance ratio.
6. **Update**: ``grpo.epochs`` passes; each splits the batch into ``grpo.mini_batches``
   optimizer steps; each of those accumulates gradients over micro-batches of at most
   ``grpo.micro_batch_tokens`` tokens (trajectories sorted by length, so little padding,
   or packed without any; see Batching below). The loss normalisers are the mini-batch's,
   so accumulation does not change the objective. bf16 autocast, gradient clipping, AdamW,
   the LR schedule stepped per step. Only model tokens carry loss. With ``grpo.kl_coef > 0``
   a frozen reference model (or, with LoRA, the model with its adapters off) gives the KL
   term.
7. **Weight sync**: the new weights go to the generation backend in place (vLLM: loaded
   into the running engine; hf: copied between requests), no restart.
8. **Metrics** (JSONL, TensorBoard, W&B) and the live view; loud warnings when the model
   made no tool call in a step although tools were offered, or when every group's rewards
   were constant (nothing to learn).
9. **Eval** every ``eval.every`` steps on held-out samples (and before the first step and
   after the last), with sample trajectories written as text; **checkpoint** every
   ``checkpoint.every`` steps and at the end, atomically (``rlfactory_core.training.checkpoint``).

Where the pieces are: the loop below drives an engine (:mod:`rlfactory_core.engines`: the
local engine, everything in this process; or, with ``engine: ray``, rollout workers, an FSDP2
trainer group, a judge pool and tool actors on a Ray cluster). Both run the same functions
(the agent loop, :mod:`rlfactory_core.rewards`, :mod:`rlfactory_core.training`) and write
the same checkpoints. The task (env, parser, tools, rewards) is :mod:`rlfactory_core.task`,
the data and its order :mod:`rlfactory_core.data`, evaluation :mod:`rlfactory_core.evaluation`.

Interrupting (Ctrl-C, SIGTERM; ``rlfactory_core.stopping``): the run says at once what will
happen and stops within seconds. A step still in its rollout (or an eval) is dropped: the
rollouts in flight are cancelled, its data position is not advanced and nothing of it is
written, so a resumed run redoes exactly that step (the RNGs are saved as they were before
it). A step past its update is finished and saved. The last finished step is checkpointed;
a second Ctrl-C stops without saving. ``rlf train --resume RUN_DIR`` continues from the
newest checkpoint with the same data order. The engines' own output goes to the run's
``log.txt`` (``rlfactory_core.logs``, set up by the CLI). The run's ``status.json``
(:mod:`rlfactory_core.run_status`) says it is running, with a heartbeat and the last finished
step, then how it ended (finished, interrupted or failed); a run killed without a word is
told by its stale heartbeat.

Batching (:mod:`rlfactory_core.training.batch`): the rollout batch travels as a
``tensordict.TensorDict`` (one row per trajectory). Micro-batches are trajectories of similar
length; the vocabulary projection is applied only at the positions of sampled tokens.
``attn_implementation`` resolves to ``flash_attention_2`` on a GPU with ``flash-attn``
installed (the ``gpu`` extra), else SDPA. With flash-attention, micro-batches are packed
(``grpo.packing``): the trajectories are concatenated into one row with positions restarting
at each, so no padding is computed and transformers runs flash-attention's varlen kernel. With SDPA the same packed row works
(transformers builds a block-diagonal mask) and gives the same logprobs and gradients (tested),
but attention then costs the whole [T, T] square; on this CPU that was slower than padding
length-sorted micro-batches, so ``auto`` packs only with flash-attention.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import random
import signal
import time
from pathlib import Path
from typing import Any, Sequence

from .config import RunConfig
from .data import batch_indices, load_samples
from .engines import build_driver_task, make_engine, rollout_config_for
from .errors import ConfigError, Interrupted, RLFactoryError, one_line
from .evaluation import eval_summary, run_eval, tool_metrics
from .logs import LOG_FILE, log_to
from .metrics import LiveView, MetricsLogger, read_metrics
from .models import check_images, load_tokenizer, resolve_model
from .plugins import notify
from .preflight import raise_problems, run_problems
from .records import trajectory_records, write_records
from .rollout import rollout_metrics
from .run_status import StatusWriter, hold_run
from .runs import new_run_dir, write_run_files
from .stopping import PhaseDropped, RunStopper
from .training.assembly import BatchAssembler, group_filters
from .training.batch import build_batch
from .training.overlong import overlong_metrics, with_overlong_penalty
from .training.checkpoint import latest_checkpoint, rng_state, set_rng_state
from .training.logprobs import bf16_warning
from .training.policy import training_device
from .training.cold_start import collect_examples, example_batch

__all__ = ["train", "TrainingInterrupted"]


class TrainingInterrupted(Interrupted):
    """The run was stopped by SIGINT or SIGTERM (:mod:`rlfactory_core.stopping`); the message
    says which step is saved. ``exit_code`` is 128 + the signal's number, as a shell reports
    a process that the signal ended (130 for Ctrl-C)."""

    exit_code = 128 + signal.SIGINT


def train(config: RunConfig, *, resume: str | os.PathLike[str] | None = None, console: Any = None) -> Path:
    """Run training to ``config.train.steps``; return the run directory.

    Every problem :mod:`rlfactory_core.preflight` can see is raised first, together (one
    :class:`ConfigError`); then the task and the data are built and the model resolved;
    only then is the run announced on ``console`` and its directory written."""
    raise_problems(run_problems(config, purpose="train", resume=resume))
    return asyncio.run(_train(config, resume=Path(resume) if resume else None, console=console))


async def _train(config: RunConfig, *, resume: Path | None, console: Any) -> Path:
    import torch

    # ---- the task, the data and the model: every check that needs them, before the run is
    # announced or anything written (the config's own checks ran in train()).
    checkpoint = latest_checkpoint(resume) if resume is not None else None
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    random.seed(config.train.seed)
    torch.manual_seed(config.train.seed)
    task = build_driver_task(config)
    try:
        train_samples = load_samples(config, task.env, "train", config.data.train_size)
        eval_samples = load_samples(config, task.env, config.data.eval_split, config.data.eval_size)
        if not train_samples:
            raise ConfigError(["data: the training set is empty"])
        base_path = resolve_model(config.model.name)  # an embedded name is prepared (converted once) here
        tokenizer = load_tokenizer(base_path)
        processor = check_images(config, task.env, base_path)
    except BaseException:
        await task.close()  # an MCP env's servers, a judge's client
        raise

    # ---- the run directory (this process's alone: rlfactory_core.run_status.hold_run), the engine
    run_dir = resume if resume is not None else new_run_dir(config)
    try:
        lock = hold_run(run_dir)
    except BaseException:
        await task.close()
        raise
    with lock:
        return await _in_run_dir(config, task, run_dir, checkpoint, train_samples, eval_samples, base_path, tokenizer,
                                 processor, console)


async def _in_run_dir(config: RunConfig, task: Any, run_dir: Path, checkpoint: Path | None,
                      train_samples: Sequence[Any], eval_samples: Sequence[Any], base_path: Path, tokenizer: Any,
                      processor: Any, console: Any) -> Path:
    """Announced, logged and run in ``run_dir``, with its status kept."""
    _announce(console, config, run_dir, checkpoint)
    if (warning := bf16_warning(config.train.bf16, training_device(config))) is not None:
        _say(console, f"warning: {warning}")
    log_to(run_dir / LOG_FILE)  # the engines' output, captured by the CLI until now
    write_run_files(run_dir, config)
    saved = 0 if checkpoint is None else int(checkpoint.name.split("-")[1])
    status = StatusWriter(run_dir, steps=config.train.steps, step=saved).start()  # rlfactory_core.run_status
    try:
        await _run(config, task, run_dir, checkpoint, saved, train_samples, eval_samples, base_path, tokenizer,
                   processor, console, status)
    except (Interrupted, asyncio.CancelledError, KeyboardInterrupt) as exc:
        status.end("interrupted", str(exc))
        raise
    except BaseException as exc:
        status.end("failed", one_line(exc))
        raise
    status.end("finished")
    return run_dir


async def _run(config: RunConfig, task: Any, run_dir: Path, checkpoint: Path | None, saved: int,
               train_samples: Sequence[Any], eval_samples: Sequence[Any], base_path: Path, tokenizer: Any,
               processor: Any, console: Any, status: StatusWriter) -> None:
    """The run itself, in its directory: the engine started, the cold start, the steps."""
    engine = make_engine(config, task, tokenizer, base_path=base_path, checkpoint=checkpoint, processor=processor,
                         console=console)
    # From here on a stop request is answered (rlfactory_core.stopping): first the start.
    stop = RunStopper(functools.partial(_say, console)).install()
    try:
        resumed = await engine.start()
    except BaseException as exc:
        await _close(stop, engine, task, cancelled=isinstance(exc, asyncio.CancelledError))
        if stop.requested and isinstance(exc, asyncio.CancelledError):
            raise _interrupted(stop, run_dir, saved) from None
        raise
    state = {"position": 0} if resumed is None else {"position": resumed["position"]}
    start_step = 0 if resumed is None else int(resumed["step"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    logger = MetricsLogger(run_dir, tensorboard=config.logging.tensorboard,
                           wandb_project=config.logging.wandb_project, wandb_entity=config.logging.wandb_entity,
                           run_name=run_dir.name, config=config.model_dump(mode="json"),
                           resume_step=start_step if checkpoint else None)
    if resumed is not None and start_step > 0 and resumed.get("metrics") and not any(
            record.get("step") == start_step for record in read_metrics(run_dir)):
        logger.log(start_step, resumed["metrics"])  # killed between its checkpoint and its metrics line
    view = LiveView(config.train.steps, start_step=start_step, console=console,
                    enabled={"auto": None, "on": True, "off": False}[config.logging.live])
    step = finished_step = last_saved = start_step
    rng_before_step, last_metrics = None, {}
    notify("rlfactory_on_train_start", config=config)

    async def save(at_step: int, record: dict[str, Any] | None = None) -> None:
        nonlocal last_saved
        # The step's metrics go into its checkpoint too: a kill between the checkpoint and the
        # metrics line would otherwise lose them (the resumed run appends them, see below).
        saved_state = dict(state) if record is None else {**state, "metrics": record}
        # A vision-language model's processor saves its tokenizer and its image processor.
        cancelled = await _to_completion(engine.save(run_dir, at_step, state=saved_state,
                                                     tokenizer=processor or tokenizer))
        last_saved = at_step
        if cancelled:  # a second Ctrl-C arrived while it was written: stop now, without more saving
            raise asyncio.CancelledError

    async def evaluate(at_step: int) -> dict[str, float]:
        return await stop.droppable(run_eval(at_step, eval_samples, engine, config, run_dir / "samples", tokenizer,
                                             record_in=run_dir))

    try:
        with view:
            if start_step == 0:
                view.phase("eval")
                metrics = await evaluate(0)
                logger.log(0, metrics)
                view.message(f"eval before training: {eval_summary(metrics)}, "
                             f"tool calls/trajectory {metrics['eval/tools/calls_per_trajectory']:.2f}")
                if config.cold_start.source != "off":  # once, before step 1 (a resumed run's checkpoint has it)
                    view.phase("cold start")
                    metrics = await _cold_start(engine, task, config, train_samples, tokenizer, processor, stop,
                                                view)
                    if config.cold_start.eval and metrics["cold_start/examples"]:  # else: the model of step 0
                        view.phase("eval")
                        evaluated = await stop.droppable(run_eval(
                            0, eval_samples, engine, config, run_dir / "samples" / "cold_start", tokenizer,
                            record_in=run_dir, record_kind="cold_start_eval"))
                        metrics.update({f"cold_start/{key}": value for key, value in evaluated.items()})
                        view.message(f"eval after the cold start alone: {eval_summary(evaluated)}")
                    logger.log(0, metrics)
            for step in range(start_step + 1, config.train.steps + 1):
                if stop.requested:
                    raise PhaseDropped
                stop.at(step, finished=finished_step)
                # A dropped step leaves the RNGs as they were before it (its checkpoint says so).
                rng_before_step = rng_state()
                started = time.perf_counter()

                # 1-3. prompts, rollout, rewards, the groups the batch keeps (droppable: nothing of
                # the step is kept)
                view.phase("rollout")
                assembled, samples, times = await stop.droppable(
                    _rollout_batch(engine, config, step, train_samples, state["position"]))
                trajectories, scored = assembled.trajectories, assembled.scored

                # 4-6. advantages and the update (not droppable: half an update cannot be undone;
                # from here on a stop request finishes the step and saves it)
                rng_before_step = None
                view.phase("train")
                t = time.perf_counter()
                batch = build_batch(trajectories, scored.totals, config, pad_id, processor,
                                    reward_turn_rewards=scored.turn_rewards)
                # the first groups are recorded token by token; the update leaves their logprobs
                # before it in the batch (rlfactory_core.records)
                marks = [t.group < config.logging.record_train_groups for t in trajectories]
                recorded = [row for row, mark in enumerate(marks) if mark]
                if recorded:
                    batch["recorded"] = batch["lengths"].new_tensor(marks).bool()
                train_stats = await engine.update(batch, step)
                if recorded:
                    _record_train_rows(run_dir, step, trajectories, scored, samples, batch, recorded, tokenizer)
                advantages, batch_tokens = batch["sequence_advantages"], float(batch["attention_mask"].sum())
                del batch
                state["position"] += len(samples)  # every prompt rolled out, kept or not
                stop.updated()
                times["time/train"] = time.perf_counter() - t

                # 7. weight sync (not when stopping: no generation follows)
                sync_metrics: dict[str, float] = {}
                if not stop.requested:
                    view.phase("weight sync")
                    t = time.perf_counter()
                    sync_metrics = await engine.sync_weights()
                    times["time/weight_sync"] = time.perf_counter() - t

                # 8. metrics and warnings
                metrics = {**_step_metrics(config, trajectories, scored, advantages, times, batch_tokens),
                           **assembled.metrics, **train_stats, **sync_metrics}
                for warning in _step_warnings(config, task.offers_tools, step, metrics, scored.totals):
                    view.warn(warning)

                # 9. eval and checkpoint (when stopping: no eval, and the step is saved)
                if config.eval.every and step % config.eval.every == 0 or step == config.train.steps:
                    view.phase("eval")
                    t = time.perf_counter()
                    with contextlib.suppress(PhaseDropped):  # the step is finished without its eval
                        metrics.update(await evaluate(step))
                        times["time/eval"] = time.perf_counter() - t
                        view.message(f"eval at step {step}: {eval_summary(metrics)}")
                metrics["samples"] = [str(s.get("id", "")) if hasattr(s, "get") else "" for s in samples]
                if step % config.checkpoint.every == 0 or step == config.train.steps or stop.requested:
                    view.phase("checkpoint")
                    t = time.perf_counter()
                    await save(step, {**metrics, **times, "time/step": time.perf_counter() - started})
                    times["time/checkpoint"] = time.perf_counter() - t
                times["time/step"] = time.perf_counter() - started
                metrics.update(times)
                logger.log(step, metrics)
                view.update(step, metrics)
                finished_step = step
                status.step(step)
                last_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
                notify("rlfactory_on_train_step_end", step=step, metrics=dict(last_metrics))
    except (PhaseDropped, asyncio.CancelledError):
        if not stop.requested:  # cancelled by the caller, not by a signal
            raise
        _uncancel()
        # The model is that of the last finished step: a dropped step's update never ran.
        if not stop.hard and finished_step > last_saved:
            if rng_before_step is not None:
                set_rng_state(rng_before_step)
            with contextlib.suppress(asyncio.CancelledError):  # a second Ctrl-C: save() finished it first
                await save(finished_step)
            _uncancel()
        raise _interrupted(stop, run_dir, last_saved) from None
    finally:
        notify_end = functools.partial(notify, "rlfactory_on_train_end", step=finished_step, metrics=dict(last_metrics))
        await _close(stop, engine, task, before=lambda: (notify_end(), logger.close()))


# --------------------------------------------------------------------------- the step's batch and numbers


async def _rollout_batch(engine: Any, config: RunConfig, step: int, train_samples: Sequence[Any],
                         position: int) -> tuple[Any, list[Any], dict[str, float]]:
    """Step ``step``'s batch (:mod:`rlfactory_core.training.assembly`): ``prompts_per_step``
    prompts from data position ``position``, rolled out and scored; with
    ``grpo.dynamic_sampling``, the next prompts too, up to ``grpo.max_extra_rollouts`` more
    rollouts, until enough groups are informative. Also every sample rolled out (all of them
    advance the data position) and the phases' times, summed over the rollouts."""
    g = config.grpo
    assembler = BatchAssembler(g.prompts_per_step, group_filters(config))
    samples: list[Any] = []
    times: dict[str, float] = {}
    for attempt in range(1 + (g.max_extra_rollouts if g.dynamic_sampling else 0)):
        if not assembler.needed:
            break
        count = g.prompts_per_step if attempt == 0 else assembler.needed
        indices = batch_indices(len(train_samples), count, config.train.seed, position + len(samples),
                                shuffle=config.data.shuffle)
        batch_samples = [train_samples[i] for i in indices]
        result = await engine.rollout(batch_samples, rollout_config_for(config, step, attempt=attempt),
                                      group_size=g.group_size, rewards="train")
        assembler.add(result.trajectories, with_overlong_penalty(result.trajectories, result.scored, config))
        samples += batch_samples
        for key, value in result.times.items():  # times add up; counters (ray restarts) are the latest
            times[key] = times.get(key, 0.0) + value if key.startswith("time/") else value
    return assembler.assemble(), samples, times


def _record_train_rows(run_dir: Path, step: int, trajectories: Sequence[Any], scored: Any, samples: Sequence[Any],
                       batch: Any, rows: list[int], tokenizer: Any) -> None:
    """The recorded groups of the step, token by token, with what the update saw
    (:mod:`rlfactory_core.records`); sampled by the weights of ``step - 1`` updates."""
    by_id = {str(s.get("id")): s for s in samples if hasattr(s, "get")}
    write_records(run_dir, "train", step, trajectory_records(
        trajectories, step=step, kind="train", scored=scored, tokenizer=tokenizer, policy_version=step - 1,
        row_samples=[by_id.get(str(t.sample_id)) for t in trajectories], rows=rows,
        advantages=batch["sequence_advantages"], token_advantages=batch["advantages"],
        trainer_logprobs=batch.get("trainer_logprobs", None)))


async def _cold_start(engine: Any, task: Any, config: RunConfig, train_samples: Sequence[Any], tokenizer: Any,
                      processor: Any, stop: Any, view: Any) -> dict[str, float]:
    """The cold start (:mod:`rlfactory_core.training.cold_start`): examples collected
    (droppable, as a rollout), the supervised warm-up on them, the weights synced; its
    ``cold_start/*`` metrics."""
    from .rollout import ChatTemplate

    chat = ChatTemplate(tokenizer, processor=processor)  # the rollout's rendering, for replayed demonstrations
    examples = await stop.droppable(collect_examples(
        engine, task, chat, config, train_samples, lambda attempt: rollout_config_for(config, 0, attempt=attempt)))
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
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    metrics.update(await engine.supervised_update(example_batch(examples.trajectories, pad_id)))
    metrics["time/cold_start_train"] = time.perf_counter() - t
    metrics.update(await engine.sync_weights())
    view.message(f"cold start: {len(examples.trajectories)} examples ({examples.sources.count('rejection')} own, "
                 f"{examples.sources.count('demonstrations')} demonstrations), loss "
                 f"{metrics['cold_start/loss_first_epoch']:.3f} -> {metrics['cold_start/loss_last_epoch']:.3f} "
                 f"(first and last pass), {metrics['time/cold_start_collect'] + metrics['time/cold_start_train']:.0f} s")
    return metrics


def _step_metrics(config: RunConfig, trajectories: Sequence[Any], scored: Any, advantages: Any,
                  times: dict[str, float], batch_tokens: float) -> dict[str, float]:
    """The step's rewards, advantages, rollout and tool statistics and throughputs."""
    metrics = scored.metrics("reward")
    groups: dict[int, list[float]] = {}
    for trajectory, total in zip(trajectories, scored.totals):
        groups.setdefault(trajectory.group, []).append(total)
    metrics["reward/constant_groups"] = sum(1 for grp in groups.values() if max(grp) == min(grp)) / len(groups)
    metrics.update({"advantage/mean": float(advantages.mean()), "advantage/std": float(advantages.std()),
                    "advantage/max": float(advantages.max()), "advantage/min": float(advantages.min())})
    rollout_stats = rollout_metrics(trajectories)
    metrics.update(rollout_stats)
    metrics.update(tool_metrics("tools", rollout_stats, trajectories))
    metrics.update(overlong_metrics(trajectories, config))
    n = len(trajectories)
    metrics["time/generation_per_trajectory"] = sum(t.metadata.get("generation_s", 0.0) for t in trajectories) / n
    metrics["time/tools_per_trajectory"] = sum(t.metadata.get("tool_s", 0.0) for t in trajectories) / n
    metrics["throughput/rollout_tokens_per_s"] = (
        metrics["rollout/model_tokens_mean"] * n / max(times["time/rollout"], 1e-9))
    metrics["throughput/train_tokens_per_s"] = batch_tokens * config.grpo.epochs / max(times["time/train"], 1e-9)
    return metrics


def _step_warnings(config: RunConfig, offers_tools: bool, step: int, metrics: dict[str, float],
                   totals: Sequence[float]) -> list[str]:
    """Loud warnings: no tool call although tools are offered; nothing to learn."""
    warnings = []
    if offers_tools and config.logging.no_tool_call_warning and metrics["rollout/tool_calls"] == 0:
        warnings.append(f"step {step}: the model made no tool call in {len(totals)} trajectories although the "
                        f"env offers tools; check the parser ({config.parser}) and the prompt, or add a format "
                        "reward / few-shot turns")
    if metrics["reward/constant_groups"] == 1.0:
        warnings.append(f"step {step}: every group's rewards are constant (all {totals[0]:g}): nothing to learn "
                        "from this step; make the task easier or the reward denser, or raise grpo.group_size")
    return warnings


# --------------------------------------------------------------------------- the run around the loop


def _announce(console: Any, config: RunConfig, run_dir: Path, checkpoint: Path | None) -> None:
    if console is None:
        return
    from rich.markup import escape

    steps = f"{config.train.steps} step{'s' if config.train.steps != 1 else ''}"
    console.print(f"[bold]rlf train[/] env [cyan]{escape(config.env)}[/], model [cyan]{escape(config.model.name)}[/], "
                  f"{steps} of {config.grpo.prompts_per_step} prompts x {config.grpo.group_size}, run in [cyan]"
                  f"{escape(str(run_dir))}[/]" + (f" (resuming after {checkpoint.name})" if checkpoint is not None
                                                 else ""), highlight=False, soft_wrap=True)


def _say(console: Any, text: str) -> None:
    """A line for the user at once (a stop request's answer), above the live view."""
    from rich.text import Text

    if console is None:
        from rich.console import Console

        console = Console(stderr=True)
    console.print(Text(text, style="bold yellow"), soft_wrap=True)


async def _close(stop: Any, engine: Any, task: Any, *, cancelled: bool = False, before: Any = None) -> None:
    """The run's end, however it ends: ``before`` (the end hook, the metrics), then the engine
    and the task. A stop request meanwhile is answered, not obeyed: vLLM's shutdown takes
    seconds, and cutting it short leaves tool servers unclosed."""
    stop.closing()
    if cancelled and stop.requested:
        _uncancel()
    try:
        if before is not None:
            before()
        await engine.close()
        await task.close()
    finally:
        stop.remove()


async def _to_completion(work: Any) -> bool:
    """Await ``work`` to its end even when this task is cancelled meanwhile; whether it was.
    A checkpoint being written is finished first (:mod:`rlfactory_core.stopping`): the engines
    write it on a thread or on actors, which a cancelled await would leave writing while the
    process exits."""
    pending = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            await asyncio.shield(pending)
            return cancelled
        except asyncio.CancelledError:
            if pending.cancelled():
                raise
            cancelled = True


def _interrupted(stop: Any, run_dir: Path, saved: int) -> TrainingInterrupted:
    """The error that ends a stopped run: what was saved, how to go on, the exit code of the signal."""
    resume = f"; continue with `rlf train --resume {run_dir}`"
    if stop.hard:
        message = "without saving: " + (f"the newest checkpoint is step {saved}{resume}" if saved
                                        else "the run has no checkpoint")
    elif saved:
        message = f"step {saved} is saved{resume}"
    else:
        message = "no step had finished, nothing to save"
    error = TrainingInterrupted(message)
    error.exit_code = 128 + int(stop.signum or signal.SIGINT)
    return error


def _uncancel() -> None:
    """Forget the cancellation a stop request caused, so the clean-up's own timeouts and
    task groups work as usual."""
    task = asyncio.current_task()
    while task is not None and task.cancelling():
        task.uncancel()
