"""The transformers backend: continuous batching on a plain Hugging Face causal LM.

This module is the front (the async API, request checks, weight checks) and the worker
thread's scheduling (admission, weight updates, failures, shutdown); the model side (the
running batch, prefill, decode, sampling) is :mod:`.hf_runner`.

Every trajectory of a rollout awaits :meth:`HFBackend.generate` from its own asyncio task.
The requests are served by one **worker thread** that owns the model; torch releases the
GIL while it computes, so the event loop stays free to run tools and parse turns while a
forward pass is under way. Results go back to the awaiting coroutine through
``loop.call_soon_threadsafe``.

Continuous batching
-------------------
The worker holds the *running batch*: the active rows, one key/value cache
(:class:`transformers.DynamicCache`) for all of them, and per row the number of cache
entries that are real tokens. Rows are **left-padded** to a common cache width, so every
row's tokens are contiguous and end in the last column: the next token of every row goes
in the same new column, and a row's padding is described by its count of real tokens
alone. Each model call gets a 2D attention mask built from those counts and explicit
``position_ids`` (the count of real tokens before each token), so padding changes neither
what a token attends to nor its rotary position. Between two decode steps the worker:

1. **admits** requests that arrived meanwhile (up to ``max_batch_size`` active rows): it
   prefills them together, left-padded among themselves, in a cache of their own, samples
   their first token, then merges that cache into the running one, left-padding the
   narrower of the two with masked zero columns;
2. runs **one decode step** for all rows (one token each) and samples per row;
3. **drops** finished rows (``batch_select_indices`` on the cache) and the leading columns
   that are padding for every row still running, so the width follows the longest live
   row rather than every row that ever ran.

A request that arrives while others decode therefore joins them at the next step instead
of waiting for the whole batch to finish. Since padding is masked and positions are
explicit, a row's tokens do not depend on which other rows share its batch (up to
floating-point reassociation in the batched matmuls). The cache is a config-less
``DynamicCache`` (plain full-attention layers), which is what makes the padding and
merging above legal; the backend serves attention-only decoder models (Llama, Qwen2/3,
Mistral, SmolLM ...), not models with recurrent / linear-attention layers.

Images
------
A vision-language model (LLaVA-style: ``pixel_values`` in, image tokens in the prompt
replaced by the image features) takes ``generate(..., images=[...])``: the images behind
the prompt's image tokens, in order (:mod:`~rlfactory_core.rollout.render` expands each image's placeholder to its
tokens). The backend runs them through the model's image processor; a prefill passes the
admitted rows' images concatenated in row order, which is the order of their image tokens
in the batch. Decode steps need none: the features are in the cache.

Sampling and logprobs
---------------------
Per row, in float32: temperature (``< 1e-5`` is greedy, vLLM's threshold; greedy is the
argmax of the raw logits, as ``model.generate(do_sample=False)``), then top-k, then top-p
(both as in vLLM and transformers), then a draw from a per-request ``torch.Generator``
when ``seed`` is set (so a seeded request does not depend on what else runs) or from the
backend's own generator otherwise. Logprobs follow :mod:`.base`: ``log_softmax`` of the
temperature-scaled, top-k/top-p-masked logits; the raw ``log_softmax`` when greedy.

Errors, weights, shutdown
-------------------------
A request that can never succeed (empty prompt, an id outside the vocabulary, prompt plus
``max_tokens`` longer than the context) raises :class:`~rlfactory_core.errors.ModelError`
in its own ``generate`` call before reaching the worker, so no other request sees it. An
exception inside the worker fails exactly the requests of the failed model call (the new
rows of a prefill, or the whole running batch for a decode step) with that exception; a
prefill of several requests that fails is first retried one request at a time, so a bad
request (images that do not match its image tokens) fails alone. The worker then carries
on with the next requests. A request whose awaiting task is cancelled
is dropped at the next step.

:meth:`HFBackend.update_weights` checks names and shapes at once (a bad update raises and
changes nothing), then stops admitting, lets the active rows finish, copies the tensors in
and resumes; requests queued meanwhile run on the new weights. :meth:`HFBackend.paused`
freezes the worker between two model calls for a block (an update that needs every core);
a weight update asked for meanwhile waits for the block's end.

:meth:`HFBackend.close` is idempotent. Requests still queued or running when it is called
**return** a :class:`~.base.Generation` with ``finish_reason="abort"`` (with the tokens
produced so far, if any) rather than raising, so an agent loop can treat shutdown like any
other ended turn; a weight update still waiting fails with
:class:`~rlfactory_core.errors.RLFactoryError`, and so do calls made after ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable, Sequence

import torch
from transformers import PreTrainedModel

from ...errors import ModelError, RLFactoryError, one_line
from .base import Generation, SamplingParams
from .hf_runner import Batch, BatchRunner, PrefillForwardError, Request, answer

__all__ = ["HFBackend"]

log = logging.getLogger("rlfactory.rollout.hf")


@dataclass(eq=False)
class _WeightUpdate:
    targets: list[tuple[torch.Tensor, torch.Tensor]]  # (model parameter/buffer, new value)
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    version: int | None = None  # None: one past the backend's current version


def _eos_ids(model: PreTrainedModel) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else [int(v) for v in value])
    return frozenset(ids)


# --------------------------------------------------------------------------- backend


class HFBackend:
    """Generation with a transformers causal LM, continuously batched in a worker thread.

    ``model``: a name or path for :func:`~rlfactory_core.models.load_model` (loaded with
    ``dtype`` onto ``device``: ``auto``, the default, is the GPU when there is one), or an
    already loaded ``PreTrainedModel``, used as it is where it is (``dtype`` and ``device``
    are then not applied). Either way the backend puts
    the model in eval mode and, from then on, owns it: weights change only through
    :meth:`update_weights`. End-of-sequence ids come from the model's generation config and
    config; no tokenizer is needed.

    ``max_batch_size``: the most rows decoding at once; more requests wait their turn.
    ``max_model_len``: the context length (default: ``config.max_position_embeddings``);
    a request whose prompt plus ``max_tokens`` exceeds it is refused.
    """

    name = "hf"

    def __init__(
        self,
        model: str | os.PathLike[str] | PreTrainedModel,
        *,
        dtype: torch.dtype | str | None = None,
        device: str | torch.device = "auto",
        max_batch_size: int = 32,
        max_model_len: int | None = None,
        processor: Any = None,
    ) -> None:
        if max_batch_size < 1:
            raise ModelError(f"max_batch_size must be >= 1, got {max_batch_size}", hint="use 1 or more rows")
        if max_model_len is not None and max_model_len < 2:
            raise ModelError(f"max_model_len must be >= 2, got {max_model_len}",
                             hint="leave it unset to use the model's max_position_embeddings")
        if isinstance(model, PreTrainedModel):
            self._model = model
        else:
            from ...models import load_model

            if str(device) == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self._model = load_model(model, dtype=dtype, device=device)
        self._model.eval()
        self._processor = processor  # loaded from the model's directory on first use with images
        self._processor_lock = threading.Lock()
        self._device = next(self._model.parameters()).device
        text_config = self._model.config.get_text_config()
        self._vocab_size = self._model.get_input_embeddings().num_embeddings
        self._max_model_len = max_model_len or getattr(text_config, "max_position_embeddings", None)
        self._eos_ids = _eos_ids(self._model)
        self._max_batch_size = max_batch_size
        self._weights = self._named_tensors(self._model)
        self._generator = torch.Generator(device=self._device)
        self._generator.seed()

        self._cond = threading.Condition()
        self._pending: deque[Request] = deque()  # guarded by _cond
        self._updates: deque[_WeightUpdate] = deque()  # guarded by _cond
        self._closing = False  # guarded by _cond
        self._pauses = 0  # guarded by _cond: paused() blocks open; the worker computes nothing while > 0
        self._computing = False  # guarded by _cond: the worker is in a model call or a weight copy
        self._batch: Batch | None = None  # worker thread only
        self._stats = {"prefills": 0, "decode_steps": 0, "joined_running": 0, "max_rows": 0, "weight_updates": 0}
        self._weight_version = 0  # guarded by _cond
        self._runner = BatchRunner(self._model, self._generator, self._stats)  # worker thread only
        self._thread = threading.Thread(target=self._serve, name="rlfactory-hf-backend", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API

    @property
    def model(self) -> PreTrainedModel:
        """The model being served (read it, do not change it: use :meth:`update_weights`)."""
        return self._model

    @property
    def max_model_len(self) -> int | None:
        return self._max_model_len

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_ids

    def stats(self) -> dict[str, int]:
        """Counters since start: ``prefills`` (admission rounds), ``decode_steps``,
        ``joined_running`` (rows admitted while others were decoding), ``max_rows``,
        ``weight_updates``."""
        return dict(self._stats)

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams,
                       images: Sequence[Any] = ()) -> Generation:
        """New tokens for ``prompt_ids`` (see :class:`~.base.Backend`); ``images``: the
        images behind the prompt's image tokens, in order (vision-language models only)."""
        prompt = self._check_request(prompt_ids, sampling)
        image_inputs = await asyncio.to_thread(self._image_inputs, prompt, images) if images else None
        loop = asyncio.get_running_loop()
        request = Request(
            prompt=prompt,
            sampling=sampling,
            stop_ids=self._eos_ids | frozenset(sampling.stop_token_ids),
            future=loop.create_future(),
            loop=loop,
            image_inputs=image_inputs,
        )
        if sampling.seed is not None:
            request.generator = torch.Generator(device=self._device)
            request.generator.manual_seed(sampling.seed)
        with self._cond:
            self._ensure_open()
            self._pending.append(request)
            self._cond.notify()
        return await request.future

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the model's weights are held in (pushes are compared in it)."""
        return self._model.dtype

    @property
    def weight_version(self) -> int:
        """The version of the weights new requests are sampled by (see :mod:`.base`)."""
        return self._weight_version

    @weight_version.setter
    def weight_version(self, version: int) -> None:
        with self._cond:
            self._weight_version = int(version)

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int | None = None) -> float:
        """Copy ``(name, tensor)`` pairs (HF checkpoint names) into the model, between
        requests: admission stops, active rows finish, the copy happens, admission resumes
        on weight version ``version`` (default: one past the current one). Names and shapes
        are checked first; on any problem nothing is changed. Returns the seconds admission
        was stopped (the running rows kept decoding for part of them)."""
        targets = self._check_weights(named_tensors)
        loop = asyncio.get_running_loop()
        update = _WeightUpdate(targets=targets, future=loop.create_future(), loop=loop, version=version)
        with self._cond:
            self._ensure_open()
            self._updates.append(update)
            held = time.perf_counter()
            self._cond.notify()
        await update.future
        return time.perf_counter() - held

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[float]:
        """Generation frozen for the block: the model call under way finishes, then the worker
        neither decodes, admits nor loads weights until the block ends; the running rows keep
        their cache and carry on after it (a seeded request samples what it would have). Yields
        the seconds the pause took to take effect. For a CPU that the update needs whole
        (``train.overlap_cores: take_turns``)."""
        started = time.perf_counter()
        with self._cond:
            self._ensure_open()
            self._pauses += 1
        try:
            await asyncio.to_thread(self._wait_for_the_model_call)
            yield time.perf_counter() - started
        finally:
            with self._cond:
                self._pauses -= 1
                self._cond.notify_all()

    def _wait_for_the_model_call(self) -> None:
        with self._cond:
            while self._computing and not self._closing:
                self._cond.wait()

    async def close(self) -> None:
        """Stop the worker; queued and running requests return ``finish_reason="abort"``.
        Idempotent."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        # Joining waits for at most the model call under way; off the loop, so it keeps running.
        await asyncio.to_thread(self._thread.join)
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ request checks

    def _ensure_open(self) -> None:
        if self._closing:
            raise RLFactoryError("the hf backend is closed", hint="create a new backend to generate again")

    def _check_request(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> list[int]:
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        try:
            prompt = [int(t) for t in prompt_ids]
        except (TypeError, ValueError) as exc:
            raise ModelError(f"prompt_ids must be a sequence of token ids: {exc}",
                             hint="pass the token ids of the rendered prompt") from None
        if not prompt:
            raise ModelError("empty prompt: there is nothing to continue",
                             hint="render at least one token (e.g. the chat template's start) before generating")
        bad = [t for t in prompt if not 0 <= t < self._vocab_size]
        if bad:
            # Checked here: an out-of-range id would fail the whole prefill batch (on CUDA,
            # the whole process).
            raise ModelError(f"prompt has {len(bad)} token id(s) outside the vocabulary [0, {self._vocab_size}), "
                             f"e.g. {bad[:3]}", hint="was the prompt tokenized with this model's tokenizer?")
        limit = self._max_model_len
        if limit is not None and len(prompt) + sampling.max_tokens > limit:
            raise ModelError(
                f"prompt of {len(prompt)} tokens plus max_tokens={sampling.max_tokens} exceeds the model's "
                f"context of {limit} tokens",
                hint="shorten the prompt, lower max_tokens, or raise max_model_len if the model supports it",
            )
        return prompt

    def _image_inputs(self, prompt: list[int], images: Sequence[Any]) -> dict[str, torch.Tensor]:
        """The model's inputs for the request's images, checked against its image tokens."""
        from ..render import image_inputs

        from ...models import load_processor, vision_problem

        problem = vision_problem(self._model.config)
        if problem is not None:
            raise ModelError(f"{len(images)} image(s) given, but {problem}",
                             hint="use a LLaVA model (CLIP vision tower), or leave images out")
        image_token = self._model.config.image_token_id
        if image_token not in prompt:
            raise ModelError(f"{len(images)} image(s) given, but the prompt has no image tokens",
                             hint="render the conversation with the model's processor (ChatTemplate(processor=...))")
        with self._processor_lock:  # requests arrive from many threads; load it once
            if self._processor is None:
                self._processor = load_processor(self._model.name_or_path)
                if self._processor is None:
                    raise ModelError(f"no image processor found for {self._model.name_or_path!r}",
                                     hint="save the model's processor with it (processor.save_pretrained), or pass "
                                          "processor= to the backend")
        try:
            inputs = image_inputs(self._processor, images)
        except ValueError as exc:
            raise ModelError(f"cannot read the request's images: {one_line(exc)}",
                             hint="pass PIL images or image file bytes") from None
        return {key: value.to(self._device, dtype=self._model.dtype if value.is_floating_point() else value.dtype)
                for key, value in inputs.items()}

    @staticmethod
    def _named_tensors(model: PreTrainedModel) -> dict[str, torch.Tensor]:
        # remove_duplicate=False: tied weights (lm_head.weight / embed_tokens.weight) are
        # reachable under every checkpoint name.
        named = dict(model.named_parameters(remove_duplicate=False))
        named.update(model.named_buffers(remove_duplicate=False))
        return named

    def _check_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        targets: list[tuple[torch.Tensor, torch.Tensor]] = []
        unknown: list[str] = []
        problems: list[str] = []
        for name, value in named_tensors:
            target = self._weights.get(name)
            if target is None:
                unknown.append(name)
            elif not isinstance(value, torch.Tensor):
                problems.append(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
            elif tuple(value.shape) != tuple(target.shape):
                problems.append(f"{name}: shape {tuple(value.shape)} does not match the model's {tuple(target.shape)}")
            else:
                targets.append((target, value))
        if unknown:
            known = ", ".join(itertools.islice(self._weights, 3))
            raise ModelError(
                f"update_weights: {len(unknown)} name(s) not in the model, e.g. {', '.join(map(repr, unknown[:3]))}",
                hint=f"use the model's Hugging Face checkpoint names (e.g. {known}); nothing was changed",
            )
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise ModelError(f"update_weights: {'; '.join(problems[:3])}{more}",
                             hint="the weights must come from the same architecture; nothing was changed")
        return targets

    # ------------------------------------------------------------------ worker thread

    def _serve(self) -> None:
        admitted: list[Request] = []  # taken from the queue, maybe not in the batch yet
        try:
            while True:
                with self._cond:
                    self._computing = False
                    self._cond.notify_all()  # a pause waiting for the model call under way
                    while not self._closing and (self._pauses or not self._has_work()):
                        self._cond.wait()
                    if self._closing:
                        break
                    self._computing = True
                    updates = self._take_updates()
                    admitted = [] if updates else self._take_admissions()
                if updates:
                    self._apply_updates(updates)
                    continue
                self._step(admitted)
        except BaseException as exc:  # a bug in the loop itself: nobody may be left waiting
            log.exception("hf backend worker crashed")
            with self._cond:
                self._closing = True
                self._computing = False
                self._cond.notify_all()  # a pause waiting for the model call that failed
            self._abort_all(error=RLFactoryError(f"the hf backend worker crashed: {exc!r}",
                                                 hint="RLFACTORY_DEBUG=1 shows the traceback"), admitted=admitted)
            return
        self._abort_all()

    def _has_work(self) -> bool:  # called with _cond held
        return self._batch is not None or bool(self._updates) or bool(self._pending)

    def _take_updates(self) -> list[_WeightUpdate]:  # called with _cond held
        if not self._updates or self._batch is not None:
            return []
        updates = list(self._updates)
        self._updates.clear()
        return updates

    def _take_admissions(self) -> list[Request]:  # called with _cond held
        if self._updates:  # draining for a weight update: hold new rows back
            return []
        room = self._max_batch_size - (len(self._batch) if self._batch is not None else 0)
        admitted = []
        while self._pending and len(admitted) < room:
            request = self._pending.popleft()
            if not request.abandoned():
                admitted.append(request)
        return admitted

    def _apply_updates(self, updates: list[_WeightUpdate]) -> None:
        for update in updates:
            if update.future.cancelled():
                continue
            try:
                with torch.no_grad():
                    for target, value in update.targets:
                        target.copy_(value)
            except Exception as exc:  # noqa: BLE001 - goes back to the caller of update_weights
                answer(update.loop, update.future, error=exc)
            else:
                self._stats["weight_updates"] += 1
                with self._cond:
                    self._weight_version = self._weight_version + 1 if update.version is None else update.version
                answer(update.loop, update.future)

    def _admit(self, admitted: list[Request]) -> None:
        """Prefill ``admitted`` and join them to the running batch. When a prefill of several
        requests fails, each is prefilled alone, so that one bad request (e.g. images that do
        not match its image tokens) fails by itself."""
        for request in admitted:  # no update applies until the batch has drained
            request.policy_version = self._weight_version
        try:
            joining = self._runner.prefill(admitted)
            if joining is not None and self._batch is not None:
                merged = self._runner.merge(self._batch, joining)
                self._stats["joined_running"] += len(joining)
                self._batch = merged
            elif joining is not None:
                self._batch = joining
        except PrefillForwardError as failed:  # nothing was sampled: the requests can be retried
            log.debug("prefill failed", exc_info=True)
            if len(admitted) > 1:
                for request in admitted:
                    self._admit([request])
                return
            answer(admitted[0].loop, admitted[0].future, error=failed.__cause__)
        except Exception as exc:  # noqa: BLE001 - fail the new requests; the running batch is intact
            log.debug("prefill failed", exc_info=True)
            for request in admitted:
                answer(request.loop, request.future, error=exc)

    @torch.inference_mode()  # prefills and decode steps: no autograd graph, no saved activations
    def _step(self, admitted: list[Request]) -> None:
        if admitted:
            self._admit(admitted)
        if self._batch is None:
            return
        self._stats["max_rows"] = max(self._stats["max_rows"], len(self._batch))
        try:
            self._batch = self._runner.decode(self._batch)
        except Exception as exc:  # noqa: BLE001 - the batch's cache is now unusable: fail its rows
            log.debug("decode step failed", exc_info=True)
            rows, self._batch = self._batch.rows, None
            for request in rows:
                answer(request.loop, request.future, error=exc)

    def _abort_all(self, error: BaseException | None = None, admitted: Sequence[Request] = ()) -> None:
        """Answer everyone still waiting (worker thread, after the loop has ended), the
        ``admitted`` requests of a step that crashed too (answering twice is harmless)."""
        with self._cond:
            pending, self._pending = list(self._pending), deque()
            updates, self._updates = list(self._updates), deque()
        rows = self._batch.rows if self._batch is not None else []
        self._batch = None
        for request in [*rows, *admitted, *pending]:
            if error is not None:
                answer(request.loop, request.future, error=error)
            else:
                answer(request.loop, request.future, request.generation(aborted=True))
        closed = error or RLFactoryError("the hf backend was closed before the weights were loaded",
                                         hint="close the backend only after update_weights returns")
        for update in updates:
            answer(update.loop, update.future, error=closed)
