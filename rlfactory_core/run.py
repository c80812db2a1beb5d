"""A training run's life around its steps: prepared, opened in its directory, stopped, saved,
closed. The schedules (:mod:`rlfactory_core.loops`) run steps on an open :class:`Run`; this
module keeps the contract they rely on.

* :func:`prepare`: every check that needs the task, the data and the model, before the run is
  announced or anything written (the config's own checks ran first, in ``train``).
* :func:`opened`: the run directory held (one trainer per run:
  :func:`rlfactory_core.run_status.hold_run`), announced, logged, its ``status.json`` kept;
  the engine started; stop requests answered from then on (:mod:`rlfactory_core.stopping`).
* Stopping: a schedule marks where it is (``run.stop.at``; ``run.rng_before_step`` while the
  step's rollout can still be dropped) and raises :class:`~rlfactory_core.stopping.PhaseDropped`
  (or lets a cancellation through) when a phase is dropped. :func:`opened` then saves the
  last finished step, with the RNGs of before the dropped one, and ends the run with
  :class:`TrainingInterrupted`, whose message says what is saved and how to go on.
* Closing: however the run ends, the end hook and the metrics first, then the engine and the
  task (a stop request meanwhile is answered, not obeyed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Sequence

from .config import RunConfig
from .data import load_samples
from .engines import build_driver_task, make_engine
from .errors import ConfigError, Interrupted, RLFactoryError, one_line
from .eval_reuse import UntrainedEvals, reuse_enabled
from .evaluation import run_eval
from .families import TEMPLATE, choose_family, tokenizer_sha256, with_recorded_family
from .logs import LOG_FILE, log_to
from .metrics import LiveView, MetricsLogger, read_metrics
from .models import check_images, load_tokenizer, resolve_model
from .plugins import notify
from .records import RECORDS_DIR
from .run_status import StatusWriter, hold_run
from .runs import new_run_dir, write_run_files
from .stopping import PhaseDropped, RunStopper
from .training.checkpoint import latest_checkpoint, rng_state, set_rng_state
from .training.logprobs import bf16_warning
from .training.policy import training_device

__all__ = ["Run", "Prepared", "prepare", "opened", "step_started", "say", "TrainingInterrupted", "RunAborted"]


class TrainingInterrupted(Interrupted):
    """The run was stopped by SIGINT or SIGTERM (:mod:`rlfactory_core.stopping`); the message
    says which step is saved. ``exit_code`` is 128 + the signal's number, as a shell reports
    a process that the signal ended (130 for Ctrl-C)."""

    exit_code = 128 + signal.SIGINT


class RunAborted(RLFactoryError):
    """A step's failures crossed ``failures.abort_share`` for a class handled ``abort``
    (:mod:`rlfactory_core.outcomes`): the step was not trained, the last finished step is
    saved, and the run ends ``failed`` with this message."""


@dataclass
class Prepared:
    """What a run needs before its directory is written: the task, the data, the model."""

    config: RunConfig
    task: Any
    run_dir: Path | None  # the run resumed, else None (a new directory is made when it opens)
    checkpoint: Path | None
    train_samples: Sequence[Any]
    eval_samples: Sequence[Any]
    base_path: Path
    tokenizer: Any
    processor: Any
    family: Any  # the model family chosen (rlfactory_core.families.FamilyChoice)
    split_samples: dict[str, Sequence[Any]] = field(default_factory=dict)  # eval.splits, each whole


@dataclass
class Run:
    """An open run (see :func:`opened`): what every phase and schedule works with."""

    config: RunConfig
    task: Any
    run_dir: Path
    engine: Any
    stop: RunStopper
    logger: MetricsLogger
    view: LiveView
    tokenizer: Any
    processor: Any
    train_samples: Sequence[Any]
    eval_samples: Sequence[Any]
    position: int  # the data position: every prompt before it trained (rolled out for a trained step, kept or not)
    start_step: int  # the step the run (re)started after
    finished_step: int = 0
    last_saved: int = 0
    rng_before_step: Any = None  # the RNGs before the step in progress, while it can be dropped
    last_metrics: dict[str, float] = field(default_factory=dict)
    status: StatusWriter | None = None
    trained_ahead: set[int] = field(default_factory=set)  # positions past ``position`` already trained
    family: Any = None  # the model family chosen (rlfactory_core.families.FamilyChoice)
    split_samples: dict[str, Sequence[Any]] = field(default_factory=dict)  # eval.splits, each whole
    untrained_evals: Any = None  # rlfactory_core.eval_reuse.UntrainedEvals: a new run's with eval.reuse_untrained

    def mark_trained(self, positions: Sequence[int]) -> None:
        """The prompts at data ``positions`` are trained: ``position`` moves past every prompt
        trained so far (an asynchronous schedule trains a later prompt before an earlier one
        still in flight: it is kept in ``trained_ahead`` until the position passes it)."""
        self.trained_ahead.update(positions)
        while self.position in self.trained_ahead:
            self.trained_ahead.remove(self.position)
            self.position += 1

    @functools.cached_property
    def tokenizer_fingerprint(self) -> str:
        """:func:`~rlfactory_core.families.tokenizer_sha256` of the run's tokenizer, once."""
        return tokenizer_sha256(self.tokenizer)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    async def save(self, at_step: int, record: dict[str, Any] | None = None) -> None:
        """Checkpoint ``at_step``. The step's metrics go into the checkpoint too: a kill between
        the checkpoint and the metrics line would otherwise lose them (a resumed run appends
        them). A second Ctrl-C while it is written lets it finish, then stops."""
        state: dict[str, Any] = {"position": self.position}
        if self.family is not None:  # --resume and rlf eval render with the family it trained with
            state.update(family=self.family.name, tokenizer_sha256=self.tokenizer_fingerprint)
        if self.trained_ahead:
            state["trained_ahead"] = sorted(self.trained_ahead)
        if record is not None:
            state["metrics"] = record
        # A vision-language model's processor saves its tokenizer and its image processor.
        cancelled = await _to_completion(self.engine.save(self.run_dir, at_step, state=state,
                                                          tokenizer=self.processor or self.tokenizer))
        self.last_saved = at_step
        if cancelled:
            raise asyncio.CancelledError

    async def evaluate(self, at_step: int, samples_dir: str = "", kind: str = "eval", *,
                       whole_splits: bool = False) -> dict[str, float]:
        """An eval on the held-out samples (droppable: a stop request cancels it); with
        ``whole_splits``, each of ``eval.splits`` too, whole, its metrics under
        ``eval/<split>/`` (its samples in ``samples/[samples_dir/]<split>``, its records of
        kind ``<kind>-<split>``)."""
        directory = self.run_dir / "samples" / samples_dir if samples_dir else self.run_dir / "samples"
        reuse = self.untrained_evals if at_step == 0 and kind == "eval" else None
        metrics = await self._eval_once(at_step, self.eval_samples, directory, kind, reuse)
        for split, samples in self.split_samples.items() if whole_splits else ():
            self.view.message(f"eval on the {split} split ({len(samples)} samples)")
            evaluated = await self._eval_once(at_step, samples, directory / split, f"{kind}-{split}", reuse)
            metrics.update({f"eval/{split}/{key.removeprefix('eval/')}": value for key, value in evaluated.items()})
        return metrics

    async def _eval_once(self, at_step: int, samples: Sequence[Any], directory: Path, kind: str,
                         reuse: Any) -> dict[str, float]:
        """One eval of ``samples``; the untrained model's is reused when ``reuse`` (an
        :class:`~rlfactory_core.eval_reuse.UntrainedEvals`) has it, and kept for reuse otherwise."""
        key = reuse.key(kind, samples) if reuse is not None else None
        if key is not None and (found := reuse.load(key, self.run_dir)) is not None:
            metrics, origin = found
            self.view.message(f"eval before training ({kind}) reused from {origin.get('run_dir', '?')} "
                              f"({origin.get('time', '?')}: the same model files, samples, settings and code)")
            return metrics
        metrics = await self.stop.droppable(run_eval(at_step, samples, self.engine, self.config, directory,
                                                     self.tokenizer, record_in=self.run_dir, record_kind=kind))
        if key is not None:
            written = [directory / f"step-{at_step:06d}.jsonl",
                       self.run_dir / RECORDS_DIR / kind / f"step-{at_step:06d}.parquet"]
            reuse.store(key, self.run_dir, metrics, [path for path in written if path.is_file()])
        return metrics

    def finished(self, step: int, metrics: dict[str, Any]) -> None:
        """Step ``step`` is done: its metrics logged and shown, the status and the observers told."""
        self.logger.log(step, metrics)
        self.view.update(step, metrics)
        self.finished_step = step
        if self.status is not None:
            self.status.step(step)
        self.last_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        notify("rlfactory_on_train_step_end", step=step, metrics=dict(self.last_metrics))


async def prepare(config: RunConfig, *, resume: Path | None) -> Prepared:
    """The task, the data and the model, each checked, before the run is announced."""
    import torch

    checkpoint = latest_checkpoint(resume) if resume is not None else None
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    random.seed(config.train.seed)
    torch.manual_seed(config.train.seed)
    task = build_driver_task(config)
    try:
        train_samples = load_samples(config, task.env, "train", config.data.train_size)
        eval_samples = load_samples(config, task.env, config.data.eval_split, config.data.eval_size)
        split_samples = {split: load_samples(config, task.env, split, None, files=False) for split in config.eval.splits}
        if not train_samples:
            raise ConfigError(["data: the training set is empty"])
        base_path = resolve_model(config.model.name)  # an embedded name is prepared (converted once) here
        tokenizer = load_tokenizer(base_path)
        processor = check_images(config, task.env, base_path)
        config = with_recorded_family(config, checkpoint, tokenizer)  # a resumed run renders as it trained
        family = choose_family(config, tokenizer, processor)
        if family.name != TEMPLATE and config.cold_start.source == "demonstrations":
            raise ConfigError([f"cold_start.source: demonstrations are written in a text tool-call format (the "
                               f"template family's); the {family.name} family writes its own; use "
                               f"cold_start.source=rejection, or model.family=template"])
    except BaseException:
        await task.close()  # an MCP env's servers, a judge's client
        raise
    return Prepared(config, task, resume, checkpoint, train_samples, eval_samples, base_path, tokenizer, processor,
                    family, split_samples)


@contextlib.asynccontextmanager
async def opened(prepared: Prepared, console: Any) -> AsyncIterator[Run]:
    """The run, open in its directory (see the module docstring); its status says how it ended."""
    config, task = prepared.config, prepared.task
    run_dir = prepared.run_dir if prepared.run_dir is not None else new_run_dir(config)
    try:
        lock = hold_run(run_dir)
    except BaseException:
        await task.close()
        raise
    with lock:
        _announce(console, config, run_dir, prepared.checkpoint, prepared.family)
        for warning in (bf16_warning(config.train.bf16, training_device(config)), _shared_cores_warning(config)):
            if warning is not None:
                say(console, f"warning: {warning}")
        log_to(run_dir / LOG_FILE)  # the engines' output, captured by the CLI until now
        write_run_files(run_dir, config)
        saved = 0 if prepared.checkpoint is None else int(prepared.checkpoint.name.split("-")[1])
        status = StatusWriter(run_dir, steps=config.train.steps, step=saved).start()  # rlfactory_core.run_status
        try:
            async with _started(prepared, run_dir, saved, console) as run:
                run.status = status
                yield run
        except (Interrupted, asyncio.CancelledError, KeyboardInterrupt) as exc:
            status.end("interrupted", str(exc))
            raise
        except BaseException as exc:
            status.end("failed", one_line(exc))
            raise
        status.end("finished")


@contextlib.asynccontextmanager
async def _started(prepared: Prepared, run_dir: Path, saved: int, console: Any) -> AsyncIterator[Run]:
    """The engine started and the run's logging open; a stop request saves the last finished step."""
    config, task = prepared.config, prepared.task
    try:
        engine = make_engine(config, task, prepared.tokenizer, base_path=prepared.base_path,
                             checkpoint=prepared.checkpoint, processor=prepared.processor, console=console)
    except BaseException:
        await task.close()
        raise
    # From here on a stop request is answered (rlfactory_core.stopping): first the start.
    stop = RunStopper(functools.partial(say, console)).install()
    try:
        resumed = await engine.start()
    except BaseException as exc:
        await _close(stop, engine, task, cancelled=isinstance(exc, asyncio.CancelledError))
        if stop.requested and isinstance(exc, asyncio.CancelledError):
            raise _interrupted(stop, run_dir, saved) from None
        raise
    logger: MetricsLogger | None = None
    run: Run | None = None
    try:
        start_step = 0 if resumed is None else int(resumed["step"])
        logger = MetricsLogger(run_dir, tensorboard=config.logging.tensorboard,
                               wandb_project=config.logging.wandb_project, wandb_entity=config.logging.wandb_entity,
                               run_name=run_dir.name, config=config.model_dump(mode="json"),
                               resume_step=start_step if prepared.checkpoint else None)
        if resumed is not None and start_step > 0 and resumed.get("metrics") and not any(
                record.get("step") == start_step for record in read_metrics(run_dir)):
            logger.log(start_step, resumed["metrics"])  # killed between its checkpoint and its metrics line
        view = LiveView(config.train.steps, start_step=start_step, console=console,
                        enabled={"auto": None, "on": True, "off": False}[config.logging.live])
        notify("rlfactory_on_train_start", config=config)
        run = Run(config, task, run_dir, engine, stop, logger, view, prepared.tokenizer, prepared.processor,
                  prepared.train_samples, prepared.eval_samples,
                  position=0 if resumed is None else resumed["position"], start_step=start_step,
                  finished_step=start_step, last_saved=start_step,
                  trained_ahead=set(() if resumed is None else resumed.get("trained_ahead", ())),
                  family=prepared.family, split_samples=prepared.split_samples,
                  untrained_evals=_untrained_evals(config, task, prepared.base_path, start_step))
        with view:
            yield run
    except RunAborted as exc:  # the step was not trained: its model is that of the last finished step
        if run is not None and run.finished_step > run.last_saved:
            if run.rng_before_step is not None:
                set_rng_state(run.rng_before_step)
            await run.save(run.finished_step)
        saved = saved if run is None else run.last_saved
        raise RunAborted(f"{exc.message}; " + (f"step {saved} is saved: once the service is back, continue with "
                                                f"`rlf train --resume {run_dir}`" if saved else
                                                "no step had finished, nothing to save"), exc.hint) from None
    except (PhaseDropped, asyncio.CancelledError):
        if not stop.requested:  # cancelled by the caller, not by a signal
            raise
        _uncancel()
        # The model is that of the last finished step: a dropped step's update never ran.
        if run is not None and not stop.hard and run.finished_step > run.last_saved:
            if run.rng_before_step is not None:
                set_rng_state(run.rng_before_step)
            with contextlib.suppress(asyncio.CancelledError):  # a second Ctrl-C: save() finished it first
                await run.save(run.finished_step)
            _uncancel()
        raise _interrupted(stop, run_dir, saved if run is None else run.last_saved) from None
    finally:
        def before() -> None:  # the end hook for a run whose start hook ran, then the metrics
            if run is not None:
                notify("rlfactory_on_train_end", step=run.finished_step, metrics=dict(run.last_metrics))
            if logger is not None:
                logger.close()

        await _close(stop, engine, task, before=before)


def step_started(run: Run, step: int) -> None:
    """A schedule starts step ``step``: a stop request now ends the run before it; a dropped
    step will leave the RNGs as they were before it (its checkpoint says so)."""
    if run.stop.requested:
        raise PhaseDropped
    run.stop.at(step, finished=run.finished_step)
    run.rng_before_step = rng_state()


def _untrained_evals(config: RunConfig, task: Any, base_path: Path, start_step: int) -> UntrainedEvals | None:
    """A new run's reused evals of its starting model (``eval.reuse_untrained``), else None."""
    if start_step != 0 or not config.eval.reuse_untrained or not reuse_enabled():
        return None
    return UntrainedEvals(config, task.env, base_path)


def _shared_cores_warning(config: RunConfig) -> str | None:
    """How an overlapping schedule shares a few CPU cores, everything in this process: in turns
    (:func:`rlfactory_core.engines.local.takes_turns`), split
    (:func:`rlfactory_core.engines.local.overlap_core_split`), or a warning that both phases
    run on the same cores (measured slower than sync where both compute: bench/README.md)."""
    from .engines.local import overlap_core_split, takes_turns

    if config.train.mode == "sync" or config.engine != "local" or training_device(config).type != "cpu":
        return None
    cores = len(os.sched_getaffinity(0))
    if takes_turns(config):
        return (f"train.mode={config.train.mode} on {cores} CPU core(s): generation pauses while the update "
                f"computes (train.overlap_cores=take_turns), so each phase has every core and only the rollout's "
                f"waits (tools, servers, judges) overlap the update; where both phases compute, overlap gains "
                f"nothing on a CPU (bench/README.md, async_modes)")
    split = overlap_core_split(config)
    if split is not None:
        return (f"train.mode={config.train.mode} on {sum(map(len, split))} CPU cores: vLLM's worker on "
                f"{_cores(split[0])}, the update on {_cores(split[1])}, so they overlap without oversubscribing "
                f"(set train.threads or VLLM_CPU_OMP_THREADS_BIND to choose); where both phases compute, "
                f"overlap gains nothing on a CPU (bench/README.md, async_modes)")
    if cores > 4:
        return None
    return (f"train.mode={config.train.mode} overlaps rollout and training, but both run on the same {cores} CPU "
            f"core(s) here; it pays off when the rollout waits (tools, servers, judges), and was slower than "
            f"train.mode=sync where both phases compute (bench/README.md, async_modes)")


def _cores(cpus: Sequence[int]) -> str:
    return f"core{'s' if len(cpus) > 1 else ''} {','.join(map(str, cpus))}"


def _announce(console: Any, config: RunConfig, run_dir: Path, checkpoint: Path | None, family: Any) -> None:
    if console is None:
        return
    from rich.markup import escape

    steps = f"{config.train.steps} step{'s' if config.train.steps != 1 else ''}"
    console.print(f"[bold]rlf train[/] env [cyan]{escape(config.env)}[/], model [cyan]{escape(config.model.name)}[/], "
                  f"{steps} of {config.grpo.prompts_per_step} prompts x {config.grpo.group_size}, run in [cyan]"
                  f"{escape(str(run_dir))}[/]" + (f" (resuming after {checkpoint.name})" if checkpoint is not None
                                                 else ""), highlight=False, soft_wrap=True)
    console.print(f"model family [cyan]{escape(family.describe())}[/]", highlight=False, soft_wrap=True)


def say(console: Any, text: str) -> None:
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
