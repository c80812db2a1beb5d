"""The model side of the transformers backend (used by :mod:`.hf` from its worker thread
only): the :class:`Request` rows, the left-padded running :class:`Batch` on one
``DynamicCache``, and :class:`BatchRunner`, which prefills new rows, merges them into the
running batch, decodes one token for every row, and answers and drops finished rows.
:func:`sample` draws each row's token (temperature, top-k, top-p, the request's own
generator when seeded). :mod:`.hf`'s docstring has the design ("Continuous batching",
"Sampling and logprobs"); the scheduling around it (admission, weight updates, failures,
shutdown) is there too.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from .base import GREEDY_TEMPERATURE, Generation, SamplingParams

__all__ = ["Request", "Batch", "BatchRunner", "PrefillForwardError", "answer", "sample", "mask_top_k_top_p",
           "attention_kernels"]


@dataclass(eq=False)
class Request:
    """One ``generate`` call: what to do, where to answer, and what it produced so far."""

    prompt: list[int]
    sampling: SamplingParams
    stop_ids: frozenset[int]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    generator: torch.Generator | None = None
    image_inputs: dict[str, torch.Tensor] | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_version: int = 0  # set when the request joins the batch: no update applies while it runs

    def abandoned(self) -> bool:
        # Read from the worker thread: a benign race, at worst the row runs one more step.
        return self.future.cancelled()

    def append(self, token: int, logprob: float) -> bool:
        """Record one sampled token; whether the request is finished."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        return token in self.stop_ids or len(self.token_ids) >= self.sampling.max_tokens

    def generation(self, aborted: bool = False) -> Generation:
        if aborted:
            reason = "abort"
        elif self.token_ids and self.token_ids[-1] in self.stop_ids:
            reason = "stop"
        else:
            reason = "length"
        return Generation(token_ids=list(self.token_ids), logprobs=list(self.logprobs), finish_reason=reason,
                          policy_version=self.policy_version)


@dataclass(eq=False)
class Batch:
    """Rows decoding together: one cache, left-padded to ``width`` columns."""

    rows: list[Request]
    cache: DynamicCache
    seen: torch.Tensor  # (rows,) long: real tokens in the cache per row; the rest is padding
    width: int  # cache columns

    def __len__(self) -> int:
        return len(self.rows)


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    """Complete ``future`` unless its awaiting task gave up on it (runs on its loop)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def answer(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any = None,
           error: BaseException | None = None) -> None:
    """Hand a result or an error to a coroutine waiting on another thread's event loop."""
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # its event loop is closed: nobody is waiting any more
        pass


class PrefillForwardError(Exception):
    """A prefill's model call failed (the cause is chained); nothing was sampled, so the
    requests can be retried."""


def _left_pad_columns(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _cache_from(layers: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    # ``ddp_cache_data`` is DynamicCache's constructor from per-layer (keys, values); without
    # a config every layer is a plain full-attention DynamicLayer (see :mod:`.hf`'s docstring).
    return DynamicCache(ddp_cache_data=list(layers))


def _concat_image_inputs(parts: Sequence[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor] | None:
    """The rows' image inputs as one batch, in row order (the order of their image tokens)."""
    present = [p for p in parts if p]
    if not present:
        return None
    return {key: torch.cat([p[key] for p in present]) for key in present[0]}


def _padding_mask(seen: torch.Tensor, width: int) -> torch.Tensor:
    """(rows, width) bool: True on each row's last ``seen`` columns (its real tokens)."""
    columns = torch.arange(width, device=seen.device)
    return columns[None, :] >= (width - seen)[:, None]


# --------------------------------------------------------------------------- sampling


def mask_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set to ``-inf`` the logits outside each row's top-k, then outside its top-p nucleus.

    ``top_k``: (rows,) long, the vocabulary size where off; ``top_p``: (rows,) float, 1 where
    off. Ties with the k-th logit are kept; a token is dropped by top-p when the tokens
    ranked above it already hold ``top_p`` of the mass (transformers' and vLLM's rules).
    """
    vocab = logits.shape[-1]
    use_k = top_k < vocab
    use_p = top_p < 1
    if not bool(use_k.any() or use_p.any()):
        return logits
    ranked, order = logits.sort(dim=-1, descending=True)
    if bool(use_k.any()):
        kth = ranked.gather(1, (top_k.clamp(max=vocab) - 1)[:, None])
        kth = torch.where(use_k[:, None], kth, torch.full_like(kth, float("-inf")))
        logits = logits.masked_fill(logits < kth, float("-inf"))
        ranked = ranked.masked_fill(ranked < kth, float("-inf"))
    if bool(use_p.any()):
        probs = ranked.softmax(dim=-1)
        mass_above = probs.cumsum(dim=-1) - probs
        drop_ranked = (mass_above >= top_p[:, None]) & use_p[:, None]
        drop = torch.zeros_like(drop_ranked).scatter(1, order, drop_ranked)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, rows: Sequence[Request], generator: torch.Generator) -> tuple[list[int], list[float]]:
    """One token and its logprob per row, from that row's (rows, vocab) float32 logits."""
    count, vocab = logits.shape
    device = logits.device
    temperature = torch.tensor([r.sampling.temperature for r in rows], dtype=torch.float32, device=device)
    greedy = temperature < GREEDY_TEMPERATURE
    tokens = torch.empty(count, dtype=torch.long, device=device)
    logprobs = torch.empty(count, dtype=torch.float32, device=device)

    if bool(greedy.any()):
        index = greedy.nonzero().squeeze(1)
        raw = logits[index]
        chosen = raw.argmax(dim=-1)
        tokens[index] = chosen
        logprobs[index] = raw.log_softmax(dim=-1).gather(1, chosen[:, None]).squeeze(1)

    if not bool(greedy.all()):
        index = (~greedy).nonzero().squeeze(1)
        picked = [rows[i] for i in index.tolist()]
        top_k = torch.tensor([r.sampling.top_k if r.sampling.top_k > 0 else vocab for r in picked], device=device)
        top_p = torch.tensor([r.sampling.top_p for r in picked], dtype=torch.float32, device=device)
        scaled = mask_top_k_top_p(logits[index] / temperature[index, None], top_k, top_p)
        row_logprobs = scaled.log_softmax(dim=-1)
        probs = row_logprobs.exp()
        chosen = torch.empty(len(picked), dtype=torch.long, device=device)
        unseeded = [j for j, r in enumerate(picked) if r.generator is None]
        if unseeded:
            chosen[unseeded] = torch.multinomial(probs[unseeded], 1, generator=generator).squeeze(1)
        for j, request in enumerate(picked):
            if request.generator is not None:  # alone, so the draw depends on this request only
                chosen[j] = torch.multinomial(probs[j], 1, generator=request.generator)[0]
        tokens[index] = chosen
        logprobs[index] = row_logprobs.gather(1, chosen[:, None]).squeeze(1)

    return tokens.tolist(), logprobs.tolist()


# --------------------------------------------------------------------------- the runner


def attention_kernels(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The SDPA kernels the backend's model calls may use: on CUDA every one but cuDNN's,
    which builds a graph per query/key shape, and a decode step's key length grows by one
    each step. Measured on an H100 (torch 2.11, SmolLM2-135M's shape in bf16, batch 1):
    a decode step took 77.7 ms with cuDNN's kernel and 33.8 ms without (bench/README.md,
    "GPU check"). The flags are process-wide while the context lasts: a trainer computing
    meanwhile in another thread skips cuDNN too, and two backends in one process can restore
    each other's saved flags out of order; either changes speed, never numbers."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class BatchRunner:
    """Prefills, decodes and compacts :class:`Batch` es on ``model`` (one thread only).

    ``generator`` draws the tokens of unseeded requests; ``stats`` is the backend's counter
    dict, of which the runner counts ``prefills`` and ``decode_steps``. Finished rows are
    answered (through :func:`answer`) as soon as their last token is sampled.
    """

    def __init__(self, model: PreTrainedModel, generator: torch.Generator, stats: dict[str, int]) -> None:
        self._model = model
        self._device = next(model.parameters()).device
        self._generator = generator
        self._stats = stats

    def prefill(self, requests: list[Request]) -> Batch | None:
        """Run the new prompts, sample their first token; the rows still going, or None.
        Raises :class:`PrefillForwardError` when the model call fails."""
        self._stats["prefills"] += 1
        width = max(len(r.prompt) for r in requests)
        device = self._device
        seen = torch.tensor([len(r.prompt) for r in requests], device=device)
        input_ids = torch.zeros((len(requests), width), dtype=torch.long, device=device)
        for i, request in enumerate(requests):
            input_ids[i, width - len(request.prompt):] = torch.tensor(request.prompt, device=device)
        mask = _padding_mask(seen, width)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache()
        try:
            logits = self._forward_last_logits(input_ids, mask.long(), positions, cache,
                                               _concat_image_inputs([r.image_inputs for r in requests]))
        except Exception as exc:  # noqa: BLE001 - the caller retries the requests one by one
            raise PrefillForwardError() from exc
        batch = Batch(rows=list(requests), cache=cache, seen=seen, width=width)
        return self._record(batch, logits)

    def decode(self, batch: Batch) -> Batch | None:
        """One token for every row of ``batch``; the rows still going, or None. On an
        exception ``batch``'s cache is unusable."""
        device = self._device
        input_ids = torch.tensor([[r.token_ids[-1]] for r in batch.rows], device=device)
        positions = batch.seen[:, None]
        mask = _padding_mask(batch.seen + 1, batch.width + 1)
        logits = self._forward_last_logits(input_ids, mask.long(), positions, batch.cache)
        self._stats["decode_steps"] += 1
        batch.seen = batch.seen + 1
        batch.width += 1
        return self._record(batch, logits)

    @staticmethod
    def merge(running: Batch, joining: Batch) -> Batch:
        """One batch of ``running``'s rows then ``joining``'s, the narrower cache left-padded."""
        width = max(running.width, joining.width)
        layers = [
            (torch.cat([_left_pad_columns(k1, width, 2), _left_pad_columns(k2, width, 2)]),
             torch.cat([_left_pad_columns(v1, width, 2), _left_pad_columns(v2, width, 2)]))
            for (k1, v1, *_), (k2, v2, *_) in zip(running.cache, joining.cache)
        ]
        return Batch(rows=running.rows + joining.rows, cache=_cache_from(layers),
                     seen=torch.cat([running.seen, joining.seen]), width=width)

    def _forward_last_logits(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                             cache: DynamicCache, image_inputs: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        with attention_kernels(self._device):
            output = self._model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                                 past_key_values=cache, use_cache=True, logits_to_keep=1, **(image_inputs or {}))
        return output.logits[:, -1, :].float()

    def _record(self, batch: Batch, logits: torch.Tensor) -> Batch | None:
        """Sample each row's next token, answer finished rows; the rest, compacted, or None."""
        tokens, logprobs = sample(logits, batch.rows, self._generator)
        keep = []
        for i, (request, token, logprob) in enumerate(zip(batch.rows, tokens, logprobs)):
            if request.append(token, logprob):
                answer(request.loop, request.future, request.generation())
            elif not request.abandoned():
                keep.append(i)
        if not keep:
            return None
        if len(keep) == len(batch):
            return batch
        index = torch.tensor(keep, device=self._device)
        batch.rows = [batch.rows[i] for i in keep]
        batch.seen = batch.seen[index]
        batch.cache.batch_select_indices(index)
        # Columns that are padding for every remaining row only cost memory and time.
        unused = batch.width - int(batch.seen.max())
        if unused > 0:
            batch.cache = _cache_from((k[:, :, unused:], v[:, :, unused:]) for k, v, *_ in batch.cache)
            batch.width -= unused
        return batch
