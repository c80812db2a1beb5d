"""The cold start: a short supervised warm-up before the first GRPO step (``cold_start.*``).

GRPO learns only from groups whose rewards differ. Where the base model almost never
succeeds (the embedded model on nl2sql or android), every group is constant and a run teaches
nothing. The cold start first trains the policy, with plain cross-entropy, on successful
trajectories of the training split:

* ``rejection``: the model's own: training prompts rolled out (``grpo.group_size`` each,
  through the engine's ``rollout``, at most ``cold_start.max_rollouts`` trajectories), keeping
  at most one trajectory per prompt that the training rewards call correct
  (``ScoredBatch.correct``);
* ``demonstrations``: the env's (the optional env member ``demonstration(sample, parser)``,
  e.g. nl2sql's gold query run with ``run_query``, then the answer). The env gives the
  assistant turns as text; they are *replayed through the agent loop*
  (:func:`rlfactory_core.rollout.run_trajectory` with a backend that "generates" them), so
  the tools really run, each observation is rendered by the same code a rollout uses, and the
  trajectory is token-exact by construction: its ids are exactly what the policy would see
  had it written those turns. A demonstration is kept only when the training rewards call it
  correct, so a gold answer that fails in this env (a query refused by the sandbox) teaches
  nothing wrong;
* ``auto``: rejection first, then demonstrations for the samples it found nothing for, up to
  ``cold_start.examples``.

Examples come from the training split in an order of their own (seeded by ``train.seed``),
and do not advance the run's data position. The batch is the rollout batch's tensors
(:func:`rlfactory_core.training.batch.to_tensordict`): ``loss_mask`` is 1 on the tokens of
the assistant's turns (their end-of-turn token included) and 0 on the prompt and on every
observation, so only what the model would write is trained. :func:`supervised_update` runs
``cold_start.epochs`` passes of optimizer steps of ``cold_start.batch_size`` examples (token
mean over the step's assistant tokens, micro-batched by ``grpo.micro_batch_tokens``) with an
AdamW of its own at ``cold_start.lr`` (the GRPO optimizer's moments are not touched), on the
engine's training thread, in one process or on every rank of a trainer group. The trainer
then syncs the weights and evaluates, so the accuracy after the warm-up alone is logged
(``cold_start/eval/*``) before reinforcement learning starts. A resumed run skips it: its
checkpoint holds the warmed-up policy.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..config import RunConfig
from ..interfaces import member
from ..errors import one_line
from .batch import micro_batches, rows_of, to_tensordict
from .logprobs import common_prefix_length, token_logprobs
from .update import SINGLE_PROCESS, DataParallel, shares_prompts

__all__ = ["ColdStartExamples", "cold_start_order", "rejection_examples", "demonstration_examples",
           "collect_examples", "example_batch", "warm_up_optimizer", "supervised_update", "ReplayBackend"]

log = logging.getLogger(__name__)

_DEMONSTRATIONS_AT_ONCE = 16  # replays in flight together (their tools run concurrently)


@dataclass
class ColdStartExamples:
    """The warm-up's trajectories and where they came from."""

    trajectories: list[Any] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # "rejection" or "demonstrations", per trajectory
    rollouts: int = 0  # trajectories rolled out by rejection sampling
    demonstrations_tried: int = 0  # demonstrations replayed
    demonstrations_failed: int = 0  # of those, not called correct by the rewards (or no demonstration given)
    seconds: float = 0.0

    def add(self, trajectories: Sequence[Any], source: str) -> None:
        self.trajectories += list(trajectories)
        self.sources += [source] * len(trajectories)

    def metrics(self) -> dict[str, float]:
        """``cold_start/examples``, ``.../examples/<source>``, ``.../rollouts``,
        ``.../demonstrations_tried|failed``, ``.../assistant_tokens``, ``.../tokens``."""
        counts = Counter(self.sources)
        assistant = sum(len(s.token_ids) for t in self.trajectories for s in t.segments if s.loss_mask)
        total = sum(len(t.prompt_ids) + sum(len(s.token_ids) for s in t.segments) for t in self.trajectories)
        return {"cold_start/examples": float(len(self.trajectories)),
                "cold_start/examples/rejection": float(counts["rejection"]),
                "cold_start/examples/demonstrations": float(counts["demonstrations"]),
                "cold_start/rollouts": float(self.rollouts),
                "cold_start/demonstrations_tried": float(self.demonstrations_tried),
                "cold_start/demonstrations_failed": float(self.demonstrations_failed),
                "cold_start/assistant_tokens": float(assistant), "cold_start/tokens": float(total),
                "time/cold_start_collect": self.seconds}


def cold_start_order(num_samples: int, seed: int) -> list[int]:
    """The order the cold start visits the training samples in: fixed by ``seed``, its own
    (the first GRPO steps' prompts are not simply the warm-up's)."""
    order = list(range(num_samples))
    random.Random(f"{seed}:cold_start").shuffle(order)
    return order


# --------------------------------------------------------------------------- rejection sampling


async def rejection_examples(engine: Any, samples: Sequence[Any], config: RunConfig,
                             rollout_config: Callable[[int], Any], want: int) -> tuple[list[Any], list[int], int]:
    """The model's own correct trajectories: ``samples`` rolled out in rounds of
    ``grpo.prompts_per_step`` prompts x ``grpo.group_size`` (``rollout_config(round)`` gives
    each round's settings: its own seeds) until ``want`` are kept or
    ``cold_start.max_rollouts`` trajectories are spent; at most one per prompt, the first
    the training rewards call correct. Returns the trajectories, the indices (into
    ``samples``) of the prompts they answer, and the trajectories rolled out."""
    group, per_round = config.grpo.group_size, config.grpo.prompts_per_step
    budget = config.cold_start.max_rollouts
    kept: list[Any] = []
    kept_rows: list[int] = []
    rolled = position = 0
    for attempt in range(len(samples)):
        if len(kept) >= want or position >= len(samples) or budget - rolled < group:
            break
        count = min(per_round, (budget - rolled) // group, len(samples) - position)
        batch = list(samples[position:position + count])
        result = await engine.rollout(batch, rollout_config(attempt), group_size=group, rewards="train")
        rolled += len(result.trajectories)
        found: dict[int, Any] = {}
        for trajectory, correct in zip(result.trajectories, result.scored.correct):
            if correct is True and trajectory.group not in found:
                found[trajectory.group] = trajectory
        for index in sorted(found)[:want - len(kept)]:
            kept.append(found[index])
            kept_rows.append(position + index)
        position += count
    return kept, kept_rows, rolled


# --------------------------------------------------------------------------- demonstrations


class ReplayBackend:
    """A generation backend that "generates" given assistant turns, one per call: each is
    tokenized as text the model wrote (special tokens recognised) and ended with the chat
    template's end-of-turn token, as a model's turn ends. A call after the last turn
    generates only that token (an empty turn). Logprobs are 0 (unused by the warm-up)."""

    name = "replay"

    def __init__(self, chat: Any, turns: Sequence[str]):
        self.chat, self.turns, self.calls = chat, list(turns), 0
        end = chat.turn_end_id if chat.turn_end_id is not None else chat.tokenizer.eos_token_id
        self.end_ids = [] if end is None else [int(end)]

    async def generate(self, prompt_ids: Sequence[int], sampling: Any, **_: Any) -> Any:
        from ..rollout import Generation

        text = self.turns[self.calls] if self.calls < len(self.turns) else ""
        self.calls += 1
        ids = self.chat.encode(text) + self.end_ids
        if len(ids) > sampling.max_tokens:  # as a real backend: cut at the request's limit
            ids = ids[:sampling.max_tokens]
            return Generation(ids, [0.0] * len(ids), "length")
        return Generation(ids, [0.0] * len(ids), "stop")


#: What :func:`demonstration_examples` records for a sample whose ``env.demonstration`` raised.
_FAILED = object()


async def demonstration_examples(task: Any, chat: Any, samples: Sequence[Any], config: RunConfig,
                                 want: int) -> tuple[list[Any], list[int], int, int]:
    """Up to ``want`` demonstrations of ``samples`` (in order), each replayed through the
    agent loop (:class:`ReplayBackend`) with the run's env, parser, tool manager and rollout
    settings, scored by the training rewards and kept when they call it correct. Returns the
    trajectories, the indices of their samples, the demonstrations replayed and how many of
    them were not kept."""
    from ..rollout import TemplateFamily, run_trajectory

    demonstrate = member("env", task.env, "demonstration")
    if demonstrate is None:
        return [], [], 0, 0
    kept: list[Any] = []
    rows: list[int] = []
    tried = failed = 0
    errors: list[str] = []

    async def replay(row: int) -> Any:
        try:
            turns = await demonstrate(samples[row], task.parser)
        except Exception as exc:  # noqa: BLE001 - one sample's failure (a plugin bug, a retriever down) is skipped
            errors.append(f"sample {row}: {one_line(exc)}")
            return _FAILED
        if not turns:
            return None
        trajectory = await run_trajectory(samples[row], env=task.env, family=TemplateFamily(chat, task.parser),
                                          tool_manager=task.tool_manager, backend=ReplayBackend(chat, turns),
                                          config=config.rollout, index=row)
        trajectory.group = row
        return trajectory

    position = 0
    while len(kept) < want and position < len(samples):
        chunk = list(range(position, min(len(samples), position + _DEMONSTRATIONS_AT_ONCE)))
        position = chunk[-1] + 1
        results = list(zip(chunk, await asyncio.gather(*(replay(r) for r in chunk))))
        broken = sum(1 for _, t in results if t is _FAILED)
        replayed = [(row, t) for row, t in results if t is not None and t is not _FAILED]
        tried += len(replayed) + broken
        failed += broken
        if not replayed:
            continue
        scored = await task.rewards.score([t for _, t in replayed], [samples[row] for row, _ in replayed])
        for (row, trajectory), correct in zip(replayed, scored.correct):
            if correct is True and len(kept) < want:
                kept.append(trajectory)
                rows.append(row)
            elif correct is not True:
                failed += 1
    if errors:
        log.warning("cold start: env.demonstration raised for %d sample(s), which were skipped; the first: %s",
                    len(errors), errors[0])
    return kept, rows, tried, failed


async def collect_examples(engine: Any, task: Any, chat: Any, config: RunConfig, train_samples: Sequence[Any],
                           rollout_config: Callable[[int], Any]) -> ColdStartExamples:
    """The warm-up's examples by ``cold_start.source`` (see the module docstring), at most
    ``cold_start.examples``, at most one per training sample. ``chat`` is the template that
    replays demonstrations; None (a family with its own tool-call format) takes none."""
    cold = config.cold_start
    started = time.perf_counter()
    samples = [train_samples[i] for i in cold_start_order(len(train_samples), config.train.seed)]
    out = ColdStartExamples()
    covered: set[int] = set()
    if cold.source in ("rejection", "auto"):
        trajectories, rows, out.rollouts = await rejection_examples(engine, samples, config, rollout_config,
                                                                    cold.examples)
        out.add(trajectories, "rejection")
        covered.update(rows)
    missing = cold.examples - len(out.trajectories)
    if cold.source in ("demonstrations", "auto") and missing > 0 and chat is not None:
        rest = [i for i in range(len(samples)) if i not in covered]
        trajectories, _, out.demonstrations_tried, out.demonstrations_failed = await demonstration_examples(
            task, chat, [samples[i] for i in rest], config, missing)
        out.add(trajectories, "demonstrations")
    out.seconds = time.perf_counter() - started
    return out


def example_batch(trajectories: Sequence[Any], pad_token_id: int) -> Any:
    """The examples as a TensorDict (``input_ids``, ``attention_mask``, ``loss_mask``: 1 on
    the assistant's tokens only, ``lengths``; ``[B, L]`` / ``[B]``)."""
    td = to_tensordict(trajectories, pad_token_id=pad_token_id)
    del td["logprobs"], td["versions"]  # the sampler's: a warm-up has no use for them
    return td


# --------------------------------------------------------------------------- the update


def warm_up_optimizer(model: Any, config: RunConfig) -> Any:
    """The warm-up's own AdamW at ``cold_start.lr`` (the run's betas and weight decay)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=config.cold_start.lr, betas=tuple(config.train.betas),
                             weight_decay=config.train.weight_decay)


def supervised_update(model: Any, optimizer: Any, batch: Any, config: RunConfig, *, packed: bool = False,
                      dp: DataParallel = SINGLE_PROCESS) -> dict[str, float]:
    """``cold_start.epochs`` passes of cross-entropy on ``batch``'s assistant tokens
    (:func:`example_batch`): optimizer steps of ``cold_start.batch_size`` examples (shuffled
    per pass, seeded by ``train.seed``), the loss the token mean over the step's assistant
    tokens, gradients accumulated over micro-batches of ``grpo.micro_batch_tokens``,
    clipped at ``train.max_grad_norm``. ``dp``: one rank of a trainer group (every rank
    holds the whole batch and back-propagates its share; the group's gradients are summed),
    as :func:`rlfactory_core.training.update.update_policy`.

    Statistics: ``cold_start/loss_start`` (the first step's loss, before any update),
    ``cold_start/loss_first_epoch`` and ``cold_start/loss_last_epoch`` (token means over
    each pass, taken as it trains), ``cold_start/grad_norm`` (mean), ``cold_start/optimizer_steps``,
    ``cold_start/trained_tokens`` (assistant tokens over all passes)."""
    import torch

    cold = config.cold_start
    rows = list(range(batch.batch_size[0]))
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    shuffler = random.Random(f"{config.train.seed}:cold_start:update")
    epoch_losses: list[float] = []
    loss_start = None
    grad_norms: list[float] = []
    trained = 0.0
    shared = shares_prompts(config, batch, packed, model)
    for _epoch in range(cold.epochs):
        order = list(rows)
        shuffler.shuffle(order)
        nll_sum = tokens_sum = 0.0
        for start in range(0, len(order), cold.batch_size):
            mini = order[start:start + cold.batch_size]
            num_tokens = float(batch["loss_mask"][mini].sum())
            if num_tokens == 0:
                continue
            optimizer.zero_grad(set_to_none=True)
            step_nll = 0.0
            # rows of different samples still share the system prompt (instruction, tools, worked
            # examples): planned as computed once per micro-batch, so more rows fit in one
            prefix = common_prefix_length(batch["input_ids"][mini], batch["attention_mask"][mini]) if shared else 0
            for micro_rows, real in dp.rounds(micro_batches(mini, batch["lengths"], config.grpo.micro_batch_tokens,
                                                            packed, common_prefix=prefix)):
                micro = rows_of(batch, micro_rows).to(device)
                logprobs, _ = token_logprobs(model, micro, bf16=config.train.bf16, entropy=False, packed=packed,
                                             shared_prefix=shared)
                nll = -(logprobs * micro["loss_mask"]).sum()
                if not real:  # padding for the collectives: no gradient, no statistics
                    (nll * 0.0).backward()
                    continue
                (nll / num_tokens).backward()
                step_nll += float(nll.detach())
            grad_norm = torch.nn.utils.clip_grad_norm_(params, config.train.max_grad_norm or float("inf"))
            if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
                grad_norm = grad_norm.full_tensor()
            optimizer.step()
            grad_norms.append(float(grad_norm))
            step_nll = _sum_over_ranks(step_nll, dp, device)
            if loss_start is None:
                loss_start = step_nll / num_tokens
            nll_sum += step_nll
            tokens_sum += num_tokens
        epoch_losses.append(nll_sum / max(tokens_sum, 1.0))
        trained += tokens_sum
    optimizer.zero_grad(set_to_none=True)
    return {"cold_start/loss_start": float(loss_start if loss_start is not None else math.nan),
            "cold_start/loss_first_epoch": epoch_losses[0], "cold_start/loss_last_epoch": epoch_losses[-1],
            "cold_start/grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
            "cold_start/optimizer_steps": float(len(grad_norms)), "cold_start/trained_tokens": trained}


def _sum_over_ranks(value: float, dp: DataParallel, device: Any) -> float:
    """``value`` summed over the ranks of a trainer group (each has its share of the micro-batches)."""
    if not dp.distributed:
        return value
    import torch
    import torch.distributed as dist

    total = torch.tensor([value], dtype=torch.float64, device=device)  # NCCL reduces on the GPU
    dist.all_reduce(total)
    return float(total[0])
